"""Lab policies: eviction and admission rules that are *not* engine rules.

The engine adapters (``sglang.py``, ``vllm.py``, ``trtllm.py``) reproduce what the
engines do. The policies here run the lab cache of the Rust core
(``prefixcache._core.LabCache``, ``rust/prefixcache-core/src/lab/``): a prefix-closed
block cache (a cached block's parent is always cached; only childless blocks are evicted,
deepest first on ties) whose eviction rule and admission filter can be chosen, and the
offline optimum (Belady), which under the request-sequence model bounds every lab policy
of its block size that served the same requests. docs/LAB.md describes each one.

Names (``make_lab_policy``), each optionally followed by ``@N`` for N tokens per block
(default 16, as ``vllm-blocks``; ``@1`` is a token-level tree):

| name | rule |
|---|---|
| ``opt`` | Belady: evict the block whose next hittable use is farthest in the future |
| ``lab-lru`` | least recently used (the block pool and tree rules, trimmed to tails) |
| ``lab-slru`` | segmented LRU: blocks hit once are protected (80% of the budget) |
| ``lab-lfu`` | fewest hits per token, then least recent (SGLang's size-aware proposal) |
| ``lab-cost`` | GreedyDual-Size-Frequency with deeper blocks dearer to recompute (the
  time model's default prefill cost) |
| ``tree-trim`` | ``lab-lru@1``: the radix tree's LRU evicting only the tail tokens it needs |
| ``...-admit<k>`` | any of the above caching a block only once it was brought k times |
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies.base import (
    IndexArray,
    OutputsOf,
    PolicyStats,
    grow_each,
    max_block_growth,
)
from prefixcache.sim.requests import Request, RequestId, TokenArray, namespace_seed

__all__ = ["LAB_RULES", "LabPolicy", "make_lab_policy", "parse_lab_name"]

LAB_RULES = ("lru", "slru", "session", "2q", "density", "lfu", "cost", "opt")
_NAME = re.compile(
    r"^(?:(opt)|lab-(lru|slru|session|2q|density|lfu|cost|opt)|(tree-trim))"
    r"(?:-admit([0-9]+))?(?:@([0-9]+))?$"
)
_EMPTY_KEYS: npt.NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)


def parse_lab_name(name: str) -> dict[str, Any] | None:
    """The rule, admission threshold and block size a lab policy name stands for, or
    None when ``name`` is not a lab policy."""
    m = _NAME.match(name)
    if m is None:
        return None
    rule = m.group(1) or m.group(2) or "lru"
    block = int(m.group(5)) if m.group(5) else (1 if m.group(3) else 16)
    admit = int(m.group(4)) if m.group(4) else 1
    if block < 1 or admit < 1:
        raise InvalidInputError(f"{name!r}: block size and admission count must be >= 1")
    return {"rule": rule, "admit_after": admit, "block_size": block}


def make_lab_policy(name: str, capacity: int, **kw: Any) -> LabPolicy | None:
    spec = parse_lab_name(name)
    if spec is None:
        return None
    return LabPolicy(capacity, name=name, **spec, **kw)


class _Held:
    __slots__ = ("allocated", "anonymous", "known", "last_key", "pending", "seed")

    def __init__(
        self, seed: int, last_key: int, pending: TokenArray, known: int, allocated: int
    ) -> None:
        self.seed = seed
        self.last_key = last_key  # key of the last full block (the seed if none)
        self.pending = pending  # tokens after the last full block
        self.known = known  # tokens whose KV the request holds
        self.allocated = allocated  # tokens of KV reserved
        self.anonymous = 0  # blocks held without a key (a partial tail, reserved output)


class LabPolicy:
    """A lab rule behind the simulator's policy protocol (see the module docstring).

    Capacity is in tokens, ``capacity // block_size`` blocks, as the block manager.
    Lifecycle as the block manager's: at admission the longest cached run of full blocks
    within ``len(prompt) - 1`` tokens is hit, the rest of the prompt plus ``reserve``
    tokens is allocated (the full prompt blocks are keyed and cached from then on), blocks
    computed while decoding are keyed as they fill, and at finish the admission filter
    decides which released blocks stay cached. Request ids must be ints; for ``opt`` they
    are the requests' indices in the list given to :meth:`prepare` (the schedulers pass
    exactly that).
    """

    eviction_unit = "blocks"

    def __init__(
        self,
        capacity: int,
        *,
        rule: str = "lru",
        admit_after: int = 1,
        block_size: int = 16,
        name: str | None = None,
        protected: float = 0.8,
        depth_cost: float | None = None,
        min_hit: float = 0.25,
    ) -> None:
        from prefixcache._core import LabCache

        if block_size < 1:
            raise InvalidInputError(f"block_size must be >= 1, got {block_size}")
        self.name = name or f"lab-{rule}"
        self.capacity = capacity
        self.block_size = block_size
        self.rule = rule
        self.blocks = capacity // block_size
        if depth_cost is None:
            # The time model's prefill cost: a token at depth p costs per_token_ms +
            # attention_ms * p, so a block of B tokens at block depth d costs, relative
            # to a block at depth 0, 1 + (attention_ms / per_token_ms) * B * (d + 1/2).
            # The defaults of sim.scheduler.PrefillCost (attention 1e-7 ms per pair, 0.01
            # ms per token; not imported: policies sit below the scheduler).
            depth_cost = 1e-7 / 0.01 * block_size
        self.cache = LabCache(self.blocks, rule, admit_after, False, protected, depth_cost, min_hit)
        self.held: dict[RequestId, _Held] = {}
        self._peak_used = 0  # blocks held by requests (keyed or not)
        self._peak_cached = 0  # blocks holding a key (in use or evictable)
        self._anonymous = 0  # blocks requests hold without a key, all requests
        self._prepared = False

    # -- the future (opt) and the request-sequence model --------------------------------
    def prepare(self, requests: Sequence[Request], *, outputs: bool = True) -> None:
        """Hand the request sequence over; only ``opt`` reads it (its future).
        ``outputs=False``: the model never caches outputs (``--model sequence``), so the
        future is the prompts' blocks alone and no output is built."""
        if self.rule != "opt":
            return
        from prefixcache._core import lab_block_keys

        bs = self.block_size
        # Every request's keys go straight into one array (sized from the lengths), which
        # is dropped once the future is built: admissions hash their prompts again
        # (cheap) rather than hold a key per block of the whole sequence.
        with_output = [outputs and r.output_len > 0 for r in requests]
        lengths = [
            (r.prompt_len + (r.output_len if w else 0)) // bs
            for r, w in zip(requests, with_output, strict=True)
        ]
        offsets = np.zeros(len(requests) + 1, dtype=np.uint64)
        np.cumsum(lengths, out=offsets[1:])
        hittable = np.zeros(len(requests), dtype=np.uint32)
        flat = np.empty(int(offsets[-1]), dtype=np.uint64)
        for i, r in enumerate(requests):
            toks = np.concatenate([r.prompt, r.output]) if with_output[i] else r.prompt
            k = lab_block_keys(
                np.ascontiguousarray(toks, dtype=np.uint32),
                bs,
                namespace_seed(r.extra_key, r.cache_salt),
            )
            flat[int(offsets[i]) : int(offsets[i + 1])] = k
            hittable[i] = (r.prompt_len - 1) // bs
        self.cache.set_future(flat, offsets, hittable)
        self._prepared = True

    def set_sequence_model(self) -> None:
        """Request-sequence model: take a request's blocks over the budget, then evict
        back down to it after the request (so the rule may drop the new blocks too)."""
        self.cache.set_overcommit(True)

    # -- the policy protocol ----------------------------------------------------------
    def _note_usage(self) -> None:
        # num_used = keyed blocks (cached, in use or not) + anonymous blocks requests hold.
        used = int(self.cache.num_used)
        self._peak_used = max(self._peak_used, used - int(self.cache.num_evictable))
        self._peak_cached = max(self._peak_cached, used - self._anonymous)

    def _set_anonymous(self, h: _Held, blocks: int, keyed: int) -> None:
        self._anonymous += blocks - keyed - h.anonymous
        h.anonymous = blocks - keyed

    def admit(
        self,
        rid: RequestId,
        prompt: TokenArray,
        reserve: int,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        from prefixcache._core import lab_block_keys

        if rid in self.held:
            raise InvalidInputError(f"request {rid!r} is already admitted")
        if self.rule == "opt" and not self._prepared:
            raise InvalidInputError("opt needs the request sequence: call prepare(requests)")
        bs = self.block_size
        prompt = np.ascontiguousarray(prompt, dtype=np.uint32)
        seed = namespace_seed(extra_key, cache_salt)
        n = len(prompt)
        keys = lab_block_keys(prompt, bs, seed)
        total = -(-(n + reserve) // bs)
        got = self.cache.acquire(int(rid), keys, (n - 1) // bs, total)
        if got is None:
            return None
        nfull = len(keys)
        h = self.held[rid] = _Held(
            seed, int(keys[-1]) if nfull else seed, prompt[nfull * bs :], n, n + reserve
        )
        self._set_anonymous(h, total, nfull)
        self._note_usage()
        return int(got) * bs

    def host_hit(self, rid: RequestId) -> int:
        return 0

    def on_prefill_done(self, rid: RequestId) -> None:
        return None

    def _grow(self, rid: RequestId, tokens: TokenArray) -> bool:
        from prefixcache._core import lab_block_keys

        h = self.held[rid]
        bs = self.block_size
        pending = np.concatenate([h.pending, np.asarray(tokens, dtype=np.uint32)])
        nfull = len(pending) // bs
        keys = lab_block_keys(pending[: nfull * bs], bs, h.last_key) if nfull else _EMPTY_KEYS
        known = h.known + len(tokens)
        allocated = max(h.allocated, known)
        # Blocks held: every block up to the allocation (keyed or not).
        blocks = -(-allocated // bs)
        if not self.cache.grow(int(rid), keys, blocks):
            return False
        self._set_anonymous(h, blocks, known // bs)
        if nfull:
            h.last_key = int(keys[-1])
        h.pending = pending[nfull * bs :]
        h.known, h.allocated = known, allocated
        self._note_usage()
        return True

    def append(self, rid: RequestId, tokens: TokenArray) -> bool:
        return self._grow(rid, tokens)

    def finish(self, rid: RequestId, tail: TokenArray) -> None:
        h = self.held[rid]
        if h.known + len(tail) > h.allocated:
            raise InvalidInputError(f"request {rid!r}: {len(tail)} more tokens exceed its KV")
        if len(tail) and not self._grow(rid, tail):  # pragma: no cover - reserved
            raise AssertionError(f"{self.name}: reserved output did not fit")
        self.cache.release(int(rid))
        self._set_anonymous(h, 0, 0)
        del self.held[rid]
        self._note_usage()

    def grow(
        self,
        rids: IndexArray,
        k: int,
        fed_from: IndexArray,
        outputs: OutputsOf,
    ) -> IndexArray | None:
        return grow_each(self.name, rids, k, fed_from, outputs, self._grow, self.evicted_tokens)

    def max_uniform_growth(
        self,
        rids: Sequence[RequestId] | IndexArray,
        limit: int | None = None,
    ) -> int:
        if not len(rids):
            return 0
        ids = rids.tolist() if isinstance(rids, np.ndarray) else rids
        have = np.array([self.held[r].allocated for r in ids], dtype=np.int64)
        known = np.array([self.held[r].known for r in ids], dtype=np.int64)
        avail = max(0, int(self.cache.num_free)) + int(self.cache.num_evictable)
        return max_block_growth(have, known, self.block_size, avail, limit)

    def evicted_tokens(self) -> int:
        return int(self.cache.num_evicted) * self.block_size

    def stats(self) -> PolicyStats:
        s = self.cache.stats()
        ev = int(s["evicted"])
        return PolicyStats(
            self.name,
            self.capacity,
            self.eviction_unit,
            ev * self.block_size,
            ev,
            int(s["cached"]) * self.block_size,
            self._peak_used * self.block_size,
            self._peak_cached * self.block_size,
            extra={"not_admitted_blocks": int(s["not_admitted"])},
        )

    def check(self) -> None:
        self.cache.check_invariants()
