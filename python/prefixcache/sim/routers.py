"""Routers of the fleet replay: which instance serves the next request.

A router sees the fleet through :class:`FleetView` only: the instances' load (the
queued and running tokens each holds, what a router tracks from its own dispatches) and,
for the cache-aware routers, a fleet index (``prefixcache.KvIndex``) fed by nothing but
the KV events the instances publish (docs/FLEET_REPLAY.md).

- ``round-robin``: instances in turn.
- ``least-loaded``: the fewest queued + running tokens (ties: the next in turn).
- ``random``: uniform, seeded.
- ``cache-aware``: the lowest cost ``overlap_weight * prefill_blocks + load_blocks``,
  where ``prefill_blocks`` are the request's blocks the instance does not hold (its
  longest held prefix, from the index) and ``load_blocks`` the instance's queued + running
  tokens in blocks: the cost NVIDIA Dynamo's KV router minimises (``logit =
  kv_overlap_score_weight * potential_prefill_blocks + potential_active_blocks``, weight 1
  by default). Ties go to the least loaded, then a seeded draw.
- ``sticky-<router>``: a session's later turns go to the instance that served its first
  turn (session affinity); first turns and requests without a session use ``<router>``.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Sequence
from typing import Protocol

from prefixcache.errors import InvalidInputError
from prefixcache.sim.requests import Request, RequestId

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

    def held_blocks(self, req: Request, now: float) -> tuple[Sequence[int], int]:
        """Per instance the longest prefix of ``req`` it holds, in blocks, as the fleet
        index knows it from the published KV events; and the block size."""
        ...


class Router(Protocol):
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


class CacheAwareRouter:
    """Lowest ``overlap_weight * prefill_blocks + load_weight * load_blocks`` (see the
    module docstring); the held prefix comes from the fleet index only."""

    name = "cache-aware"

    def __init__(
        self, overlap_weight: float = 1.0, load_weight: float = 1.0, seed: int = 0
    ) -> None:
        if overlap_weight < 0 or load_weight < 0:
            raise InvalidInputError("router weights must be >= 0")
        self.overlap_weight = overlap_weight
        self.load_weight = load_weight
        self._rng = _random.Random(seed)

    def choose(self, req: Request, now: float, fleet: FleetView) -> int:
        held, bs = fleet.held_blocks(req, now)
        load = fleet.load_tokens()
        blocks = -(-req.prompt_len // bs)
        costs = [
            self.overlap_weight * (blocks - h) + self.load_weight * (ld / bs)
            for h, ld in zip(held, load, strict=True)
        ]
        low = min(costs)
        tied = [k for k, c in enumerate(costs) if c <= low + 1e-9]
        if len(tied) > 1:
            least = min(load[k] for k in tied)
            tied = [k for k in tied if load[k] == least]
        return tied[0] if len(tied) == 1 else tied[self._rng.randrange(len(tied))]


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
            return self._home[s]
        k = self.base.choose(req, now, fleet)
        if s is not None:
            self._home[s] = k
        return k


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
