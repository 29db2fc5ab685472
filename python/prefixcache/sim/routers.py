"""Routers of the fleet replay: which instance serves the next request.

A router sees the fleet through :class:`FleetView` only: the instances' load (the
queued and running tokens each holds, what a router tracks from its own dispatches) and,
for the cache-aware routers, a fleet index (``prefixcache.KvIndex``) fed by nothing but
the KV events the instances publish (docs/FLEET_REPLAY.md).

- ``round-robin``: instances in turn.
- ``least-loaded``: the fewest queued + running tokens (ties: the next in turn).
- ``random``: uniform, seeded.
- ``cache-aware``: NVIDIA Dynamo's KV router cost, lowest wins: ``overlap_weight *
  prefill_blocks + decode_blocks`` (weight 1 by default, as Dynamo's). ``prefill_blocks``
  = (prompt tokens still to prefill on the instance + this request's tokens beyond the
  prefix the instance holds) / block size, the held prefix read from the fleet index;
  ``decode_blocks`` = distinct blocks of the requests the router sent there and that are
  still running, plus this request's blocks not among them. Like Dynamo's router it
  keeps that bookkeeping itself, from its own dispatches, first tokens and completions
  (never by reading an instance). Ties go to the least loaded, then a seeded draw.
- ``sticky-<router>``: a session's later turns go to the instance that served its first
  turn (session affinity); first turns and requests without a session use ``<router>``.
"""

from __future__ import annotations

import heapq
import math
import random as _random
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies.tree_events import removed_event, stored_event
from prefixcache.sim.requests import Request, RequestId, TokenArray, namespace_seed

__all__ = [
    "ROUTER_NAMES",
    "CacheAwareRouter",
    "FleetView",
    "LeastLoadedRouter",
    "RandomRouter",
    "RoundRobinRouter",
    "Router",
    "StickyRouter",
    "make_router",
]

ROUTER_NAMES = ("round-robin", "least-loaded", "random", "cache-aware")


class FleetView(Protocol):
    """What a router may read of the fleet when it routes a request at ``now``."""

    @property
    def size(self) -> int: ...

    def load_tokens(self) -> Sequence[int]:
        """Queued + running tokens (prompt + generated) per instance."""
        ...

    def held_blocks(
        self, req: Request, now: float, prompt: TokenArray | None = None
    ) -> tuple[Sequence[int], int]:
        """Per instance the longest prefix of ``req`` it holds, in blocks, as the fleet
        index knows it from the published KV events; and the block size. ``prompt``:
        ``req.prompt`` when the caller has it already (a trace's prompts are expanded on
        each access)."""
        ...

    def first_token(self, index: int) -> float:
        """When request ``index`` got its first token (NaN: not yet): what a router
        sees of a request it dispatched, as the first streamed token."""
        ...


class Router(Protocol):
    """Picks the instance of each request. A router may also define
    ``routed(index, req, instance, now)`` and ``finished(index, instance, t)``: the fleet
    calls them when it dispatches request ``index`` (``req``) to ``instance`` and when
    that request completes at ``t`` (which may be later than the router's clock: the
    router must not act on it before ``t``)."""

    name: str

    def choose(self, req: Request, now: float, fleet: FleetView) -> int: ...


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: Request, now: float, fleet: FleetView) -> int:
        k = self._next % fleet.size
        self._next = k + 1
        return k


def _argmin_from(values: Sequence[float], start: int) -> int:
    """Index of the smallest value; ties go to the first at or after ``start`` (cyclic)."""
    n = len(values)
    best = start % n
    for j in range(1, n):
        k = (start + j) % n
        if values[k] < values[best]:
            best = k
    return best


class LeastLoadedRouter:
    name = "least-loaded"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: Request, now: float, fleet: FleetView) -> int:
        k = _argmin_from(fleet.load_tokens(), self._next)
        self._next = k + 1
        return k


class RandomRouter:
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = _random.Random(seed)

    def choose(self, req: Request, now: float, fleet: FleetView) -> int:
        return self._rng.randrange(fleet.size)


BlockKeys = npt.NDArray[np.uint64]


class _ActiveBlocks:
    """The router's own view of each instance's running requests (Dynamo's
    ``ActiveSequences``): the distinct blocks of the requests it dispatched there and
    that have not completed, and the prompt tokens still to prefill.

    Blocks are the router's chained 64-bit keys of a request's full prompt blocks
    (``lab_block_keys``, seeded by the request's namespace). Since a key stands for its
    whole prefix, the blocks an instance's running requests share with a new one are a
    prefix of the new one's, so a fleet index over the running requests
    (``KvIndex``, one copy per request holding a block) gives the new blocks as the
    request's length minus its longest held prefix; after a completion the instance's
    distinct blocks are what the index still holds for it."""

    def __init__(self, n: int, block_size: int) -> None:
        from prefixcache import KvIndex

        self.block_size = block_size
        self.index = KvIndex()
        self.names = [f"instance-{k}" for k in range(n)]
        for w in self.names:
            self.index.add_worker(w, now=0.0)
        self.blocks = [0] * n  # distinct running blocks per instance
        self.prefill = [0] * n  # prompt tokens still to prefill per instance
        self.unprefilled: list[dict[int, int]] = [{} for _ in range(n)]  # index -> tokens
        self.running: dict[int, tuple[int, BlockKeys]] = {}  # index -> (instance, keys)
        self.done: list[tuple[float, int]] = []  # heap of (t, index): completions to apply

    def keys(self, req: Request, prompt: TokenArray) -> BlockKeys:
        from prefixcache._core import lab_block_keys

        seed = namespace_seed(req.extra_key, req.cache_salt)
        return lab_block_keys(prompt, self.block_size, seed)

    def held(self, keys: BlockKeys) -> list[int]:
        """Per instance the longest prefix of ``keys`` its running requests hold."""
        m = self.index.longest_prefix(keys, now=0.0)
        return [int(m.blocks(w)) for w in self.names]

    def catch_up(self, now: float, fleet: FleetView) -> None:
        """Apply the completions and first tokens the router has seen by ``now``."""
        while self.done and self.done[0][0] <= now:
            _, i = heapq.heappop(self.done)
            self._remove(i)
        for k, pend in enumerate(self.unprefilled):
            if pend:
                for i in [i for i in pend if fleet.first_token(i) <= now]:
                    self.prefill[k] -= pend.pop(i)

    def add(self, i: int, k: int, keys: BlockKeys, new_blocks: int, prefill: int) -> None:
        self.index.apply(self.names[k], [stored_event(keys, self.block_size)], now=0.0)
        self.blocks[k] += new_blocks
        self.prefill[k] += prefill
        self.unprefilled[k][i] = prefill
        self.running[i] = (k, keys)

    def _remove(self, i: int) -> None:
        k, keys = self.running.pop(i)
        self.prefill[k] -= self.unprefilled[k].pop(i, 0)
        w = self.names[k]
        self.index.apply(w, [removed_event(keys)], now=0.0)
        self.blocks[k] = int(self.index.status(w, now=0.0)["num_held"])


class CacheAwareRouter:
    """NVIDIA Dynamo's KV router cost (see the module docstring): the lowest
    ``overlap_weight * prefill_blocks + decode_blocks``; the held prefix comes from the
    fleet index only, the running requests from the router's own dispatches."""

    name = "cache-aware"

    def __init__(self, overlap_weight: float = 1.0, seed: int = 0) -> None:
        if not overlap_weight >= 0 or math.isinf(overlap_weight):
            raise InvalidInputError(
                f"overlap weight must be a finite number >= 0, got {overlap_weight}"
            )
        self.overlap_weight = overlap_weight
        self._rng = _random.Random(seed)
        self._active: _ActiveBlocks | None = None
        # What choose() computed for the request it just placed, reused by routed().
        self._chosen: tuple[Request, BlockKeys, list[int], list[int]] | None = None

    def costs(self, req: Request, now: float, fleet: FleetView) -> list[float]:
        """Every instance's cost for ``req`` at ``now`` (lower is better)."""
        prompt = req.prompt
        held, bs = fleet.held_blocks(req, now, prompt)
        act = self._active
        if act is None or act.block_size != bs or len(act.names) != fleet.size:
            act = self._active = _ActiveBlocks(fleet.size, bs)
        act.catch_up(now, fleet)
        keys = act.keys(req, prompt)
        n = len(keys)
        shared = act.held(keys)
        prefill = [max(0, req.prompt_len - h * bs) for h in held]
        self._chosen = (req, keys, [n - s for s in shared], prefill)
        w = self.overlap_weight
        return [
            w * (act.prefill[k] + prefill[k]) / bs + act.blocks[k] + n - shared[k]
            for k in range(fleet.size)
        ]

    def choose(self, req: Request, now: float, fleet: FleetView) -> int:
        costs = self.costs(req, now, fleet)
        low = min(costs)
        tied = [k for k, c in enumerate(costs) if c <= low + 1e-9]
        if len(tied) > 1:
            load = fleet.load_tokens()
            least = min(load[k] for k in tied)
            tied = [k for k in tied if load[k] == least]
        return tied[0] if len(tied) == 1 else tied[self._rng.randrange(len(tied))]

    def routed(self, index: int, req: Request, instance: int, now: float) -> None:
        if self._active is None or self._chosen is None or self._chosen[0] is not req:
            raise InvalidInputError("cache-aware: routed() without choose() for that request")
        _, keys, new_blocks, prefill = self._chosen
        self._chosen = None
        self._active.add(index, instance, keys, new_blocks[instance], prefill[instance])

    def finished(self, index: int, instance: int, t: float) -> None:
        if self._active is not None and index in self._active.running:
            heapq.heappush(self._active.done, (t, index))


class StickyRouter:
    """Session affinity over ``base``: a session's turns after the first go where the
    first went."""

    def __init__(self, base: Router) -> None:
        self.base = base
        self.name = f"sticky-{base.name}"
        self._home: dict[RequestId, int] = {}

    def choose(self, req: Request, now: float, fleet: FleetView) -> int:
        s = req.session
        if s is not None and s in self._home:
            if isinstance(self.base, CacheAwareRouter):
                # Its bookkeeping must still see the request running where it goes.
                self.base.costs(req, now, fleet)
            return self._home[s]
        k = self.base.choose(req, now, fleet)
        if s is not None:
            self._home[s] = k
        return k

    def routed(self, index: int, req: Request, instance: int, now: float) -> None:
        hook = getattr(self.base, "routed", None)
        if hook is not None:
            hook(index, req, instance, now)

    def finished(self, index: int, instance: int, t: float) -> None:
        hook = getattr(self.base, "finished", None)
        if hook is not None:
            hook(index, instance, t)


_BASES: dict[str, Callable[[int, float], Router]] = {
    "round-robin": lambda seed, w: RoundRobinRouter(),
    "least-loaded": lambda seed, w: LeastLoadedRouter(),
    "random": lambda seed, w: RandomRouter(seed),
    "cache-aware": lambda seed, w: CacheAwareRouter(overlap_weight=w, seed=seed),
}


def make_router(name: str, *, seed: int = 0, overlap_weight: float = 1.0) -> Router:
    """A router by name: round-robin, least-loaded, random, cache-aware, or any of them
    prefixed with ``sticky-``."""
    base = name[len("sticky-") :] if name.startswith("sticky-") else name
    if base not in _BASES:
        raise InvalidInputError(
            f"unknown router {name!r}; expected {', '.join(ROUTER_NAMES)} "
            "(each also as sticky-<name>)"
        )
    r = _BASES[base](seed, overlap_weight)
    return StickyRouter(r) if base != name else r


def needs_events(router: Router) -> bool:
    """Whether the router reads the fleet index (the instances must publish events)."""
    r = router.base if isinstance(router, StickyRouter) else router
    return isinstance(r, CacheAwareRouter)
