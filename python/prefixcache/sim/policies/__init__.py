"""Cache policies behind one protocol, so one scheduler can drive every cache.

A scheduler talks to a policy only through :class:`CachePolicy`:

- ``admit(rid, prompt, reserve, extra_key, cache_salt)``: look up the prompt's cached
  prefix (reuse capped at ``len(prompt) - 1``), take KV for the rest of the prompt plus
  ``reserve`` output tokens (evicting cached tokens when short), return the hit in tokens,
  or ``None`` when the KV budget is still short (nothing held for the request then).
- ``on_prefill_done(rid)``: the prompt's KV exists now (the tree inserts the prompt).
- ``append(rid, tokens)``: the request computes KV for these further tokens (decode);
  take KV for them; False (nothing changed) when short.
- ``finish(rid, tail)``: the request ends; ``tail`` are tokens whose KV exists beyond the
  prompt and the appended tokens (the slot model reserves all output at admission and
  passes it here). Cache what the engine caches and release the rest.
- ``stats()``: evicted tokens, evictions (nodes or blocks), usage.

Adapters: :class:`RadixPolicy` (SGLang's RadixCache, any page size, any cache class with
its API - the Rust core or the plain-Python reference) and :class:`BlocksPolicy` (vLLM v1's
KVCacheManager). Capacity is given in tokens and is the same physical budget for every
policy: the tree gets ``capacity`` KV slots, the block manager ``capacity // block_size``
usable blocks plus vLLM's null block.
"""

from __future__ import annotations

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies.base import CachePolicy, PolicyStats
from prefixcache.sim.policies.lab import LabPolicy, make_lab_policy
from prefixcache.sim.policies.sglang import RadixPolicy, SlotBudget
from prefixcache.sim.policies.trtllm import TrtllmPolicy, parse_trtllm_name
from prefixcache.sim.policies.vllm import BlocksPolicy, blocks_available

__all__ = [
    "POLICY_NAMES",
    "BlocksPolicy",
    "CachePolicy",
    "LabPolicy",
    "PolicyStats",
    "RadixPolicy",
    "SlotBudget",
    "TrtllmPolicy",
    "blocks_available",
    "make_policy",
]

POLICY_NAMES = ("radix", "radix-page16", "vllm-blocks")


def make_policy(
    name: str, capacity: int, *, eviction_policy: str = "lru", hash_algo: str = "sha256"
) -> CachePolicy:
    """Build a policy by name: radix, radix-page<N>, vllm-blocks, vllm-blocks<N>, trtllm,
    trtllm<N>, trtllm-nopartial or trtllm-nopartial<N> (trtllm.py)."""
    if name == "radix":
        return RadixPolicy(capacity, eviction_policy=eviction_policy)
    if name.startswith("radix-page") and name[len("radix-page") :].isdigit():
        page = int(name[len("radix-page") :])
        return RadixPolicy(capacity, page_size=page, eviction_policy=eviction_policy, name=name)
    if name == "vllm-blocks" or (
        name.startswith("vllm-blocks") and name[len("vllm-blocks") :].isdigit()
    ):
        bs = int(name[len("vllm-blocks") :] or 16)
        return BlocksPolicy(capacity, block_size=bs, hash_algo=hash_algo, name=name)
    trt = parse_trtllm_name(name)
    if trt is not None:
        return TrtllmPolicy(capacity, tokens_per_block=trt[0], partial_reuse=trt[1], name=name)
    lab = make_lab_policy(name, capacity)  # not engine rules: policies/lab.py
    if lab is not None:
        return lab
    raise InvalidInputError(
        f"unknown policy {name!r}; expected radix, radix-page<N>, vllm-blocks, "
        "vllm-blocks<N>, trtllm[<N>], trtllm-nopartial[<N>] or a lab policy (opt, "
        "lab-lru, lab-slru, lab-session, lab-2q, lab-density, lab-lfu, lab-cost, "
        "tree-trim; optionally -admit<k> and @<block>)"
    )
