"""What every simulator policy shares: the protocol a scheduler drives and the counters
a policy keeps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from prefixcache.sim.requests import RequestId, TokenArray

IndexArray = npt.NDArray[np.int64]
# A running request's output tokens (``outputs(rid)``), read by a policy when it needs the
# tokens a decode step fed (to hash the blocks they fill, or to cache them at finish).
OutputsOf = Callable[[int], TokenArray]

__all__ = ["CachePolicy", "IndexArray", "OutputsOf", "PolicyStats", "max_k"]


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
    # Policy-specific counters reported beside the common ones (trtllm: partial_hits,
    # partial_tokens, copies, copied_tokens).
    extra: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
