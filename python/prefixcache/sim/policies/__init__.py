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

import inspect
import re
from typing import Any

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies.base import CachePolicy, PolicyStats
from prefixcache.sim.policies.lab import LabPolicy, make_lab_policy, parse_lab_name
from prefixcache.sim.policies.sglang import RadixPolicy, SlotBudget
from prefixcache.sim.policies.trtllm import TrtllmPolicy, parse_trtllm_name
from prefixcache.sim.policies.vllm import BlocksPolicy, blocks_available

__all__ = [
    "OFFLOAD_NAMES",
    "POLICY_NAMES",
    "BlocksPolicy",
    "CachePolicy",
    "LabPolicy",
    "PolicyStats",
    "RadixPolicy",
    "SlotBudget",
    "TrtllmPolicy",
    "blocks_available",
    "check_offload",
    "check_sizes",
    "check_tier",
    "make_policy",
    "offload_family",
    "policy_block_size",
]

POLICY_NAMES = ("radix", "radix-page16", "vllm-blocks")


# The second tier's policies per engine family (docs/SIMULATOR.md, "Offload"): the names,
# the first being the default, and the pattern of a name with its optional parameter.
OFFLOAD_NAMES: dict[str, tuple[str, ...]] = {
    "vllm-blocks": ("lru", "arc"),  # optional ":K", a store threshold >= 1
    "radix": ("write-through", "write-through-selective", "write-back"),
    "trtllm": ("host",),  # optional ":P", a minimum priority in 0..100
}
_OFFLOAD_FORMS = {
    "vllm-blocks": (re.compile(r"(lru|arc)(:[1-9][0-9]*)?"), "lru or arc, optionally :K (K >= 1)"),
    "radix": (
        re.compile(r"write-through|write-through-selective|write-back"),
        "write-through, write-through-selective or write-back",
    ),
    "trtllm": (
        re.compile(r"host(:(100|[1-9]?[0-9]))?"),
        "host, optionally :P (a priority in 0..100)",
    ),
}


def _decimal(s: str) -> bool:
    """Whether ``s`` is a number in ASCII digits (``str.isdigit`` also takes other
    scripts' digits and superscripts, which ``int`` reads differently or not at all)."""
    return s.isascii() and s.isdigit()


def offload_family(name: str) -> str | None:
    """The engine family whose host tier a policy name has (``vllm-blocks``, ``radix`` or
    ``trtllm``), or None for a policy without one (the lab policies)."""
    if name == "radix" or (name.startswith("radix-page") and _decimal(name[len("radix-page") :])):
        return "radix"
    if name == "vllm-blocks" or (
        name.startswith("vllm-blocks") and _decimal(name[len("vllm-blocks") :])
    ):
        return "vllm-blocks"
    if parse_trtllm_name(name) is not None:
        return "trtllm"
    return None


def policy_block_size(name: str) -> int:
    """The tokens per block (or page) of a policy name, 1 for a token-level tree; 1 also
    for a name no policy has (``make_policy`` refuses it)."""
    if name.startswith("radix-page") and _decimal(name[len("radix-page") :]):
        return int(name[len("radix-page") :])
    if name.startswith("vllm-blocks") and _decimal(name[len("vllm-blocks") :] or "16"):
        return int(name[len("vllm-blocks") :] or 16)
    trt = parse_trtllm_name(name)
    if trt is not None:
        return trt[0]
    try:
        lab = parse_lab_name(name)
    except InvalidInputError:
        return 1
    return int(lab["block_size"]) if lab is not None else 1


def check_offload(policy: str, offload: str | None) -> None:
    """Raise InvalidInputError unless ``policy`` has a host tier and ``offload`` (None: the
    default) names one of its tier policies."""
    family = offload_family(policy)
    if family is None:
        raise InvalidInputError(
            f"policy {policy!r} has no host tier (the second tier exists for radix, "
            "radix-page<N>, vllm-blocks[<N>] and trtllm[-nopartial][<N>])"
        )
    if offload is None:
        return
    form, expected = _OFFLOAD_FORMS[family]
    if form.fullmatch(offload) is None:
        raise InvalidInputError(
            f"offload policy {offload!r} does not apply to {policy}: expected {expected}"
        )


_TIER_CLASSES: dict[str, type] = {
    "radix": RadixPolicy,
    "vllm-blocks": BlocksPolicy,
    "trtllm": TrtllmPolicy,
}


def check_tier(policy: str, cpu_capacity: int, offload: str | None = None) -> None:
    """Raise InvalidInputError unless ``policy`` can be built with ``cpu_capacity`` tokens
    of host memory (0: no tier, then ``offload`` must be None) and tier policy
    ``offload``; builds nothing."""
    if isinstance(cpu_capacity, bool) or not isinstance(cpu_capacity, int) or cpu_capacity < 0:
        raise InvalidInputError(f"cpu_capacity must be an int >= 0, got {cpu_capacity!r}")
    if cpu_capacity == 0:
        if offload is not None:
            raise InvalidInputError(f"offload {offload!r} needs a host tier (cpu_capacity > 0)")
        return
    check_offload(policy, offload)
    cls = _TIER_CLASSES[offload_family(policy) or ""]
    if "cpu_capacity" not in inspect.signature(cls).parameters:
        raise InvalidInputError(
            f"policy {policy!r}: this build has no host tier for {cls.__name__}"
        )


def check_sizes(policy: str, capacity: int | None, cpu_capacity: int = 0) -> None:
    """Raise InvalidInputError unless ``policy`` can be built with ``capacity`` tokens of KV
    (None: unlimited) and ``cpu_capacity`` tokens of host memory: a block cache's pool and
    host tier hold at least one block and at most what its core addresses. Run before a
    replay so that a size refused by one policy (or at one capacity of a sweep) stops the
    command before the others run. Builds the block pool (its blocks are made as handed
    out), not the trie (it allocates its blocks up front)."""
    family = offload_family(policy)
    if family == "vllm-blocks":
        bs = int(policy[len("vllm-blocks") :] or 16)
        if 0 < cpu_capacity < bs:
            raise InvalidInputError(
                f"{policy}: cpu_capacity {cpu_capacity} is less than one {bs}-token block"
            )
        if capacity is not None and blocks_available():
            BlocksPolicy(capacity, block_size=bs, name=policy, cpu_capacity=cpu_capacity)
    elif family == "trtllm":
        trt = parse_trtllm_name(policy)
        assert trt is not None
        if capacity is not None:
            TrtllmPolicy.check_sizes(capacity, trt[0], cpu_capacity, policy)
        elif 0 < cpu_capacity < trt[0]:
            raise InvalidInputError(
                f"{policy}: cpu_capacity {cpu_capacity} is less than one {trt[0]}-token block"
            )


def _with_tier(policy: str, cpu_capacity: int, offload: str | None) -> dict[str, Any]:
    """The constructor keywords of the host tier: none without one (cpu_capacity 0)."""
    check_tier(policy, cpu_capacity, offload)
    return {"cpu_capacity": cpu_capacity, "offload": offload} if cpu_capacity else {}


def make_policy(
    name: str,
    capacity: int,
    *,
    eviction_policy: str = "lru",
    hash_algo: str = "sha256",
    cpu_capacity: int = 0,
    offload: str | None = None,
    publish_events: bool = False,
) -> CachePolicy:
    """Build a policy by name: radix, radix-page<N>, vllm-blocks, vllm-blocks<N>, trtllm,
    trtllm<N>, trtllm-nopartial or trtllm-nopartial<N> (trtllm.py).

    ``cpu_capacity`` (tokens of host memory, 0 = none) and ``offload`` (the tier's policy,
    None = the family's default; :data:`OFFLOAD_NAMES`) give the policy a second tier; the
    constructors get them as keywords only when ``cpu_capacity > 0``. ``publish_events``
    builds it publishing its KV events (``take_events``) for a router's fleet index:
    every engine policy can, the lab policies cannot."""
    if name == "radix":
        tier = _with_tier(name, cpu_capacity, offload)
        return RadixPolicy(
            capacity, eviction_policy=eviction_policy, publish_events=publish_events, **tier
        )
    if name.startswith("radix-page") and _decimal(name[len("radix-page") :]):
        page = int(name[len("radix-page") :])
        tier = _with_tier(name, cpu_capacity, offload)
        return RadixPolicy(
            capacity,
            page_size=page,
            eviction_policy=eviction_policy,
            name=name,
            **tier,
            publish_events=publish_events,
        )
    if name == "vllm-blocks" or (
        name.startswith("vllm-blocks") and _decimal(name[len("vllm-blocks") :])
    ):
        bs = int(name[len("vllm-blocks") :] or 16)
        tier = _with_tier(name, cpu_capacity, offload)
        return BlocksPolicy(
            capacity,
            block_size=bs,
            hash_algo=hash_algo,
            name=name,
            publish_events=publish_events,
            **tier,
        )
    trt = parse_trtllm_name(name)
    if trt is not None:
        tier = _with_tier(name, cpu_capacity, offload)
        return TrtllmPolicy(
            capacity,
            tokens_per_block=trt[0],
            partial_reuse=trt[1],
            name=name,
            publish_events=publish_events,
            **tier,
        )
    if publish_events:
        raise InvalidInputError(
            f"policy {name!r} does not publish KV events; the cache-aware routers need "
            "radix, radix-page<N>, vllm-blocks[<N>] or trtllm[-nopartial][<N>]"
        )
    lab = make_lab_policy(name, capacity)  # not engine rules: policies/lab.py
    if lab is not None:
        check_tier(name, cpu_capacity, offload)  # the lab policies have no host tier
        return lab
    raise InvalidInputError(
        f"unknown policy {name!r}; expected radix, radix-page<N>, vllm-blocks, "
        "vllm-blocks<N>, trtllm[<N>], trtllm-nopartial[<N>] or a lab policy (opt, "
        "lab-lru, lab-slru, lab-session, lab-2q, lab-density, lab-lfu, lab-cost, "
        "tree-trim; optionally -admit<k> and @<block>)"
    )
