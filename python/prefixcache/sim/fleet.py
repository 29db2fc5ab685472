"""Fleet replay: N instances behind a router, on one simulated clock.

Each instance is a full cache policy with its own KV budget under the time model
(:class:`prefixcache.sim.scheduler.TimeInstance`, the same code that
:meth:`TimeScheduler.run` drives for one instance, so a fleet of one equals the
single-instance replay). Requests reach the router at their trace times (a session's next
turn when its previous turn finished); the router picks an instance
(:mod:`prefixcache.sim.routers`). The cache-aware routers see the instances only through
the KV events they publish: every batch an instance's policy emits during an iteration is
stamped with the iteration's start (vLLM publishes the events of a scheduler step when it
schedules), delivered to a :class:`prefixcache.KvIndex` ``event_delay`` seconds later,
and with probability ``event_loss`` lost on the way (the index then sees a sequence gap
and resynchronises the worker from scratch, as a subscriber without a replay buffer
does). docs/FLEET_REPLAY.md describes the model and its limits.
"""

from __future__ import annotations

import math
import random as _random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies import (
    BlocksPolicy,
    CachePolicy,
    PolicyStats,
    RadixPolicy,
    TrtllmPolicy,
    make_policy,
)
from prefixcache.sim.policies.tree_events import TreeBlockEvents, TrieEventKeys
from prefixcache.sim.replay import ProgressFactory, ReplayResult, replay, summarize
from prefixcache.sim.requests import Request, RequestRecord, TokenArray, new_record
from prefixcache.sim.routers import (
    RandomRouter,
    RoundRobinRouter,
    Router,
    StickyRouter,
    make_router,
    needs_events,
)
from prefixcache.sim.scheduler import (
    SessionGate,
    TimeInstance,
    TimeScheduler,
    output_lengths,
)

__all__ = ["FleetResult", "fleet_replay", "summarize_fleet"]


@dataclass
class EventCounters:
    batches: int = 0  # event batches the instances published
    events: int = 0  # events in them
    delivered: int = 0  # batches the index applied
    lost: int = 0  # batches lost on the way
    resyncs: int = 0  # workers reset after a sequence gap
    in_flight: int = 0  # batches still on the way when the replay ended


@dataclass
class FleetResult:
    policy: str
    router: str
    instances: int
    capacity: int  # per instance, tokens
    records: list[RequestRecord]
    served_by: list[int]  # instance of each request (-1: never routed)
    stats: list[PolicyStats]  # per instance
    seconds: float
    event_delay: float = 0.0
    event_loss: float = 0.0
    events: EventCounters = field(default_factory=EventCounters)
    ceiling: ReplayResult | None = None  # one instance with N x the capacity
    offload: str | None = None  # the host tier's policy as asked (None: the default)

    def summary(self) -> dict[str, Any]:
        return summarize_fleet(self)


class _EventPath:
    """The KV events on their way from the instances to the router's fleet index.

    The router keys a request's blocks as the instances' events do: a block pool's
    events carry vLLM's chained block hashes (``BlockHasher``, the instances' algorithm),
    a tree's and a trie's the chained keys of ``tree_events.py``."""

    def __init__(
        self, sample: CachePolicy, n: int, hash_algo: str, delay: float, loss: float, seed: int
    ) -> None:
        from prefixcache import BlockHasher, KvIndex

        self.index = KvIndex()
        self.workers = [f"instance-{k}" for k in range(n)]
        for w in self.workers:
            self.index.add_worker(w, now=0.0)
        self.tree_keys: TreeBlockEvents | TrieEventKeys | None = None
        if isinstance(sample, BlocksPolicy):
            self.block_size = sample.block_size
        elif isinstance(sample, RadixPolicy | TrtllmPolicy) and sample.events is not None:
            self.tree_keys = sample.events
            self.block_size = sample.events.block_size
        else:  # pragma: no cover - make_policy(publish_events=True) refuses the others
            raise InvalidInputError(f"policy {sample.name!r} does not publish KV events")
        self.hasher = BlockHasher(self.block_size, hash_algo)
        self.delay = delay
        self.loss = loss
        # Its own stream: the cache-aware router's tie draws use `seed` itself, and the same
        # seed in both made every loss decision repeat a tie draw.
        self._rng = _random.Random(f"event-loss:{seed}")
        self._queue: deque[tuple[float, int, list[Any]]] = deque()
        self._seq = [0] * n  # next sequence number per publisher
        self.counters = EventCounters()

    def publish(self, k: int, stamp: float, events: list[Any]) -> None:
        if events:
            self.counters.batches += 1
            self.counters.events += len(events)
            self._queue.append((stamp + self.delay, k, events))

    def deliver(self, now: float) -> None:
        q, ix, c = self._queue, self.index, self.counters
        while q and q[0][0] <= now:
            at, k, events = q.popleft()
            seq = self._seq[k]
            self._seq[k] = seq + 1
            if self.loss and self._rng.random() < self.loss:
                c.lost += 1
                continue
            w = self.workers[k]
            if ix.apply(w, events, seq=seq, now=at) == "gap":
                # Batches were lost and no replay can fill them: start the worker afresh
                # from this batch (it forgets everything it knew of the worker).
                ix.reset_worker(w, next_seq=seq)
                ix.apply(w, events, seq=seq, now=at)
                c.resyncs += 1
            c.delivered += 1

    def held(self, req: Request, now: float, prompt: TokenArray) -> list[int]:
        if self.tree_keys is not None:
            keys = self.tree_keys.keys(prompt, req.extra_key, req.cache_salt)
            m = self.index.longest_prefix(keys, now=now)
        elif req.extra_key is None and not req.cache_salt:
            m = self.index.longest_prefix(tokens=prompt, hasher=self.hasher, now=now)
        else:
            m = self.index.longest_prefix(self._namespaced_hashes(req, prompt), now=now)
        return [int(m.blocks(w)) for w in self.workers]

    def _namespaced_hashes(self, req: Request, prompt: TokenArray) -> list[int]:
        """The request's block hashes with its namespace keyed in as the instances key it
        (vLLM's layout: the extra key as a LoRA name on every block, the salt on block 0)."""
        from prefixcache.events import external_hash

        base: tuple[Any, ...] = (("lora", req.extra_key, ""),) if req.extra_key is not None else ()
        n = req.prompt_len // self.block_size
        keys: list[tuple[Any, ...] | None] = [base or None] * n
        if req.cache_salt and n:
            keys[0] = (*base, ("cache_salt", req.cache_salt))
        digests = self.hasher.hash_blocks(prompt, extra_keys=keys)
        return [int(external_hash(d)) for d in digests]


class _Fleet:
    """The router's view of the fleet (routers.FleetView)."""

    def __init__(
        self,
        insts: list[TimeInstance],
        path: _EventPath | None,
        collect: Callable[[], None],
        records: list[RequestRecord],
    ) -> None:
        self.insts = insts
        self.path = path
        self._collect = collect
        self._records = records

    @property
    def size(self) -> int:
        return len(self.insts)

    def load_tokens(self) -> list[int]:
        return [i.load_tokens for i in self.insts]

    def held_blocks(
        self, req: Request, now: float, prompt: TokenArray | None = None
    ) -> tuple[Sequence[int], int]:
        if self.path is None:
            raise InvalidInputError("this router needs the instances' KV events")
        self._collect()
        self.path.deliver(now)
        tokens = req.prompt if prompt is None else prompt
        return self.path.held(req, now, tokens), self.path.block_size

    def first_token(self, index: int) -> float:
        return self._records[index].first_token


def fleet_replay(
    requests: Sequence[Request],
    policy: str,
    capacity: int,
    instances: int,
    router: str | Router = "round-robin",
    *,
    scheduler: TimeScheduler | None = None,
    eviction_policy: str = "lru",
    hash_algo: str = "sha256",
    event_delay: float = 0.0,
    event_loss: float = 0.0,
    seed: int = 0,
    overlap_weight: float = 1.0,
    ceiling: bool = False,
    progress: ProgressFactory | None = None,
    check: bool = False,
    cpu_capacity: int = 0,
    offload: str | None = None,
) -> FleetResult:
    """Replay ``requests`` on ``instances`` instances of ``policy`` (``capacity`` tokens of
    KV each) behind ``router`` under the time model (``scheduler``, default
    ``TimeScheduler()``).

    ``event_delay`` (seconds) and ``event_loss`` (probability per batch) shape the KV
    event stream the cache-aware routers read; ``seed`` seeds the random router, the
    cache-aware tie-break and the losses. ``ceiling`` also replays the trace on one
    instance with ``instances x capacity`` (``FleetResult.ceiling``). ``cpu_capacity``
    and ``offload`` give every instance a host tier of its own (docs/SIMULATOR.md,
    "Offload"; the ceiling gets ``instances x cpu_capacity``).
    """
    if instances < 1:
        raise InvalidInputError(f"instances must be >= 1, got {instances}")
    if capacity < 0:
        raise InvalidInputError(f"capacity must be >= 0, got {capacity}")
    if event_delay < 0 or not math.isfinite(event_delay):
        raise InvalidInputError(f"event delay must be a finite number >= 0, got {event_delay}")
    if not 0.0 <= event_loss <= 1.0:
        raise InvalidInputError(f"event loss must be in [0, 1], got {event_loss}")
    sched = scheduler or TimeScheduler()
    rt = (
        make_router(router, seed=seed, overlap_weight=overlap_weight)
        if isinstance(router, str)
        else router
    )
    events = needs_events(rt)
    pols = [
        make_policy(
            policy,
            capacity,
            eviction_policy=eviction_policy,
            hash_algo=hash_algo,
            cpu_capacity=cpu_capacity,
            offload=offload,
            publish_events=events,
        )
        for _ in range(instances)
    ]
    n = len(requests)
    records = [new_record(r) for r in requests]
    served_by = [-1] * n
    task = progress(f"{pols[0].name} x{instances} {rt.name}", n) if progress is not None else None
    tick = task.advance if task is not None else None
    path = None
    if events:
        path = _EventPath(pols[0], instances, hash_algo, event_delay, event_loss, seed)
    out_len = output_lengths(requests)
    insts = [sched.instance(p, records, out_len, progress=tick, check=check) for p in pols]

    def collect() -> None:
        if path is not None:
            for k, p in enumerate(pols):
                path.publish(k, insts[k].event_time, p.take_events())  # type: ignore[attr-defined]

    view = _Fleet(insts, path, collect, records)
    gate = SessionGate(requests)
    routed = getattr(rt, "routed", None)
    finished = getattr(rt, "finished", None)

    def route(i: int, req: Request, at: float) -> None:
        k = rt.choose(req, at, view)
        if not 0 <= k < instances:
            raise InvalidInputError(f"router {rt.name} chose instance {k} of {instances}")
        served_by[i] = k
        if routed is not None:
            routed(i, req, k, at)
        insts[k].submit(i, req, at)

    def on_done(i: int, t: float) -> None:
        if finished is not None:
            finished(i, served_by[i], t)
        gate.release(i, t, route)

    # A router that reads the instances (their load, their caches through the events)
    # reads them as of each arrival: a decode run ends there, even on an instance that
    # could admit nothing then (it would otherwise run on to its next finish, and the
    # router would see that instance's load and cache as they will be at its end). The
    # run's hits, evictions and times are unchanged; only a decode-time eviction may be
    # charged to another running request (a shorter stretch shares them differently).
    base = rt.base if isinstance(rt, StickyRouter) else rt
    looks = not isinstance(base, RoundRobinRouter | RandomRouter)
    for inst in insts:
        inst.on_done = on_done
        inst.stop_at_arrivals = looks
    order = sorted(range(n), key=lambda i: requests[i].arrival)  # stable
    pos = 0
    t0 = time.perf_counter()
    while True:
        a = requests[order[pos]].arrival if pos < n else math.inf
        k, tk = 0, insts[0].next_time()
        for j in range(1, instances):
            tj = insts[j].next_time()
            if tj < tk:
                k, tk = j, tj
        if tk < a:
            insts[k].step(a if pos < n else None)
            if path is not None:
                ev = pols[k].take_events()  # type: ignore[attr-defined]
                path.publish(k, insts[k].event_time, ev)
            continue
        if pos >= n:
            break
        i = order[pos]
        pos += 1
        gate.arrive(i, a, route)
    gate.check_drained()
    if task is not None:
        task.done()
    if path is not None:
        path.counters.in_flight = len(path._queue)
    dt = time.perf_counter() - t0
    res = FleetResult(
        pols[0].name,
        rt.name,
        instances,
        capacity,
        records,
        served_by,
        [p.stats() for p in pols],
        dt,
        event_delay,
        event_loss,
        path.counters if path is not None else EventCounters(),
        offload=offload if cpu_capacity else None,
    )
    if ceiling:
        res.ceiling = replay(
            requests,
            [policy],
            capacity * instances,
            scheduler=sched,
            eviction_policy=eviction_policy,
            hash_algo=hash_algo,
            progress=progress,
            cpu_capacity=cpu_capacity * instances,
            offload=offload,
        )[0]
    return res


def _percentile(values: list[float], q: float) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return float(np.percentile(vals, q)) if vals else math.nan


def summarize_fleet(res: FleetResult) -> dict[str, Any]:
    """Fleet totals, per-instance rows, imbalance, TTFT percentiles and the ceiling."""
    recs = res.records
    per: list[dict[str, Any]] = []
    for k in range(res.instances):
        mine = [r for r, s in zip(recs, res.served_by, strict=True) if s == k and not r.rejected]
        prompt = sum(r.prompt_tokens for r in mine)
        hit = sum(r.hit_tokens for r in mine)
        per.append(
            {
                "instance": k,
                "requests": len(mine),
                "prompt_tokens": prompt,
                "hit_tokens": hit,
                "hit_rate": hit / prompt if prompt else 0.0,
                "peak_kv_tokens": res.stats[k].peak_used_tokens,
                "evicted_tokens": res.stats[k].evicted_tokens,
                "preemptions": sum(r.preemptions for r in mine),
            }
        )
        if res.stats[k].cpu_capacity:  # the instance's host tier
            per[-1].update(
                host_hit_tokens=sum(r.host_hit_tokens for r in mine),
                loaded_tokens=sum(r.loaded_tokens for r in mine),
                stored_tokens=res.stats[k].stored_tokens,
                host_evicted_tokens=res.stats[k].host_evicted_tokens,
                peak_host_tokens=res.stats[k].peak_host_tokens,
            )
    served = [r for r in recs if not r.rejected]
    prompt = sum(r.prompt_tokens for r in served)
    hit = sum(r.hit_tokens for r in served)
    loads = [p["prompt_tokens"] for p in per]
    mean = sum(loads) / len(loads)
    ttft = [r.ttft for r in served]
    out: dict[str, Any] = {
        "policy": res.policy,
        "router": res.router,
        "instances": res.instances,
        "capacity": res.capacity,
        "requests": len(recs),
        "rejected": len(recs) - len(served),
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "hit_rate": hit / prompt if prompt else 0.0,
        "imbalance": max(loads) / mean if mean else 1.0,
        "preemptions": sum(r.preemptions for r in recs),
        "ttft_p50": _percentile(ttft, 50),
        "ttft_p90": _percentile(ttft, 90),
        "ttft_p99": _percentile(ttft, 99),
        "makespan": max((r.finished for r in served if not math.isnan(r.finished)), default=0.0),
        "event_delay": res.event_delay,
        "event_loss": res.event_loss,
        "events": vars(res.events).copy(),
        "seconds": res.seconds,
        "per_instance": per,
    }
    if any(st.cpu_capacity for st in res.stats):  # a host tier per instance
        # The keys of a single replay's summary (replay.host_tier_summary), over the fleet;
        # the peak of host tokens is per instance (per_instance).
        host = sum(r.host_hit_tokens for r in served)
        loaded = sum(r.loaded_tokens for r in served)
        out.update(
            cpu_capacity=res.stats[0].cpu_capacity,
            offload=res.offload,
            gpu_hit_tokens=hit - loaded,
            host_hit_tokens=host,
            loaded_tokens=loaded,
            host_unloaded_tokens=host - loaded,
            gpu_hit_rate=(hit - loaded) / prompt if prompt else 0.0,
            host_hit_rate=loaded / prompt if prompt else 0.0,
            load_seconds=sum(r.load_time for r in served),
            stored_tokens=sum(st.stored_tokens for st in res.stats),
            host_evicted_tokens=sum(st.host_evicted_tokens for st in res.stats),
        )
    if res.ceiling is not None:
        c = summarize(res.ceiling)
        out["ceiling"] = {
            key: c[key]
            for key in (
                "capacity",
                "rejected",  # its hit rate is over the requests it served, as the fleet's
                "hit_tokens",
                "hit_rate",
                "ttft_p50",
                "ttft_p90",
                "ttft_p99",
                "peak_used_tokens",
                "seconds",
            )
        }
    return out
