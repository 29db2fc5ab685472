"""What every simulator policy shares: the protocol a scheduler drives and the counters
a policy keeps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError
from prefixcache.sim.requests import RequestId, TokenArray

IndexArray = npt.NDArray[np.int64]
# A running request's output tokens (``outputs(rid)``), read by a policy when it needs the
# tokens a decode step fed (to hash the blocks they fill, or to cache them at finish).
OutputsOf = Callable[[int], TokenArray]

__all__ = [
    "CachePolicy",
    "IndexArray",
    "OutputsOf",
    "PolicyStats",
    "grow_each",
    "grow_slots",
    "max_block_growth",
    "max_k",
]


@dataclass
class PolicyStats:
    """Counters a policy keeps over a replay."""

    name: str
    capacity: int  # tokens
    eviction_unit: str  # "nodes" or "blocks"
    evicted_tokens: int = 0
    evictions: int = 0  # nodes or blocks evicted
    cached_tokens: int = 0  # tokens held by the cache at the end
    # The same two maxima for every policy (docs/SIMULATOR.md, "Memory"): KV held by
    # admitted requests (what the cache cannot evict: blocks x block size for the block
    # policies), and tokens the cache holds (reusable content, in use or evictable).
    peak_used_tokens: int = 0
    peak_cached_tokens: int = 0
    # Second tier (host memory behind the GPU; 0 without one, docs/SIMULATOR.md "Offload").
    cpu_capacity: int = 0  # tokens
    # Prompt tokens reused from the host tier (loaded), at every admission: a preempted
    # request's re-admission counts again (the summaries' `host_hit_tokens` count each
    # request's first admission, from its record).
    host_hit_tokens: int = 0
    stored_tokens: int = 0  # tokens written to the host tier
    host_evicted_tokens: int = 0  # tokens dropped from the host tier
    peak_host_tokens: int = 0  # most tokens the host tier held at once
    # Policy-specific counters reported beside the common ones (trtllm: partial_hits,
    # partial_tokens, copies, copied_tokens).
    extra: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def note_host_tier(
        self, cpu_capacity: int, host_hit_tokens: int, counters: dict[str, int]
    ) -> None:
        """The second tier's figures, from a cache's host counters (``host_stats()`` of
        the radix tree and the block trie: stored, host-evicted and peak host tokens)."""
        self.cpu_capacity = cpu_capacity
        self.host_hit_tokens = host_hit_tokens
        self.stored_tokens = int(counters["stored_tokens"])
        self.host_evicted_tokens = int(counters["host_evicted_tokens"])
        self.peak_host_tokens = int(counters["peak_host_tokens"])


class CachePolicy(Protocol):
    """What a scheduler needs from a prefix cache (docs/SIMULATOR.md, "Policies").

    ``max_uniform_growth(rids, limit)``: the most decode steps every request in ``rids``
    can still take (capped at ``limit``).

    ``grow(rids, k, fed_from, outputs)``: one decode stretch of ``k`` steps for every
    request in ``rids`` (ints, in running order), each feeding the tokens
    ``outputs(rid)[fed_from[j] : fed_from[j] + k]`` and taking KV for them; the scheduler
    calls it with ``k <= max_uniform_growth(rids)``. Returns the tokens evicted for each
    request (aligned with ``rids``), or None when nothing was evicted. A request's
    stretches are contiguous in its output; ``finish`` caches them.
    """

    name: str
    capacity: int

    def admit(
        self,
        rid: RequestId,
        prompt: TokenArray,
        reserve: int,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int | None: ...

    def host_hit(self, rid: RequestId) -> int: ...

    def on_prefill_done(self, rid: RequestId) -> None: ...

    def grow(
        self,
        rids: IndexArray,
        k: int,
        fed_from: IndexArray,
        outputs: OutputsOf,
    ) -> IndexArray | None: ...

    def finish(self, rid: RequestId, tail: TokenArray) -> None: ...

    def max_uniform_growth(
        self,
        rids: Sequence[RequestId] | IndexArray,
        limit: int | None = None,
    ) -> int: ...

    def evicted_tokens(self) -> int: ...

    def stats(self) -> PolicyStats: ...

    def check(self) -> None: ...


def max_k(needed: Callable[[int], int], available: int, limit: int | None = None) -> int:
    """The largest k >= 0 with needed(k) <= available (needed is non-decreasing, and
    grows by at least 1 per step once k passes every request's reserve), at most
    ``limit`` when given (then one evaluation when the limit fits)."""
    if limit is not None and needed(limit) <= available:
        return limit
    lo, hi = 0, 1
    while needed(hi) <= available:
        lo, hi = hi, hi * 2
        if limit is not None and hi >= limit:
            hi = limit  # needed(limit) > available
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if needed(mid) <= available:
            lo = mid
        else:
            hi = mid
    return lo


def grow_each(
    name: str,
    rids: IndexArray,
    k: int,
    fed_from: IndexArray,
    outputs: OutputsOf,
    append: Callable[[int, TokenArray], bool],
    evicted_tokens: Callable[[], int],
) -> IndexArray | None:
    """``CachePolicy.grow`` for a cache that takes decode tokens one request at a time:
    ``append(rid, tokens)`` for every request, the tokens evicted for each counted with
    ``evicted_tokens()`` around the call (None when nothing was evicted)."""
    evicted = None
    for j, rid in enumerate(rids.tolist()):
        before = evicted_tokens()
        lo = int(fed_from[j])
        if not append(rid, outputs(rid)[lo : lo + k]):
            raise AssertionError(f"{name}: growth of {k} promised but refused")
        ev = evicted_tokens() - before
        if ev:
            if evicted is None:
                evicted = np.zeros(len(rids), dtype=np.int64)
            evicted[j] = ev
    return evicted


def grow_slots(owner: object, rid: object, names: Sequence[str]) -> int:
    """Checks a request id (an int >= 0: per-request counters are numpy arrays indexed by
    it) and grows ``owner``'s int64 arrays ``names`` to hold it. Returns the index."""
    if isinstance(rid, bool) or not isinstance(rid, int | np.integer) or rid < 0:
        raise InvalidInputError(f"request ids must be ints >= 0, got {rid!r}")
    i = int(rid)
    have = len(getattr(owner, names[0]))
    if i >= have:
        size = max(i + 1, 2 * have, 64)
        for name in names:
            old = getattr(owner, name)
            new = np.zeros(size, dtype=np.int64)
            new[: len(old)] = old
            setattr(owner, name, new)
    return i


def max_block_growth(
    have: IndexArray, known: IndexArray, block_size: int, available: int, limit: int | None
) -> int:
    """``max_uniform_growth`` of a block cache: the most decode steps every request can
    take when request j holds KV for ``have[j]`` tokens and knows ``known[j]``, and
    ``available`` blocks can still be taken (capped at ``limit``)."""
    bs = block_size
    held_blocks = (have + bs - 1) // bs

    def blocks_needed(k: int) -> int:
        return int(((np.maximum(have, known + k) + bs - 1) // bs - held_blocks).sum())

    return max_k(blocks_needed, available, limit)
