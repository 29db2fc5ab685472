"""Replays of (capacity, policy) pairs in parallel worker processes (``replay --jobs``,
``sweep --jobs``).

Each pair is one independent replay (a fresh cache, the same scheduler), so running them
in worker processes gives exactly the results a serial run gives; they are returned in
(capacity, policy) order whatever order they finish in, though they start longest first
(:func:`longest_first`: the pool-based policies and the larger capacities; so the last
replays running are short ones and neither worker idles long at the end). Every pair
gets a fresh worker process, so its ``peak_rss_bytes`` is its own (the interpreter and
the trace included). Workers get the requests by ``fork`` where the platform has it
(nothing is copied until touched) and read the trace again otherwise. Progress reaches
the parent through a queue, batched per 64 requests.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixcache.sim.replay import (
    ProgressFactory,
    ReplayResult,
    make_scheduler,
    replay,
    summarize,
)
from prefixcache.sim.requests import Request
from prefixcache.sim.scheduler import PrefillCost

__all__ = [
    "OnResult",
    "SweepSpec",
    "default_jobs",
    "load_requests",
    "longest_first",
    "run_grid",
    "run_pairs",
    "run_sweep",
]


@dataclass(frozen=True)
class SweepSpec:
    """What every replay of a sweep shares (all picklable, for spawned workers)."""

    trace: str  # a trace path or workload:A..F
    fmt: str = "auto"
    skip_bad_lines: bool = False
    seed: int = 0
    policies: Sequence[str] = ("radix", "radix-page16", "vllm-blocks")
    eviction_policy: str = "lru"
    hash_algo: str = "sha256"
    model: str = "slots"
    max_running: int | None = None
    cost: PrefillCost | None = None
    preemption: bool = True
    cpu_capacity: int = 0  # tokens of host memory per replay (run_grid sweeps it instead)
    offload: str | Mapping[str, str] | None = None  # one name, or per policy name


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def load_requests(spec: SweepSpec) -> list[Request]:
    from prefixcache.sim.traces import read_trace
    from prefixcache.sim.workloads import study_workload

    if spec.trace.startswith("workload:"):
        return list(study_workload(spec.trace.split(":", 1)[1], spec.seed).requests)
    return read_trace(spec.trace, fmt=spec.fmt, skip_bad_lines=spec.skip_bad_lines).requests


# One replay: (GPU capacity, host capacity, policy).
Task = tuple[int | None, int, str]
# Called with each replay's index and result as it arrives (run_pairs).
OnResult = Callable[[int, ReplayResult], None]


# Relative cost of a replay by policy family (time model, whole Mooncake conversation
# trace: a vllm-blocks replay takes about twice a radix one; docs/BENCHMARKS.md).
_FAMILY_COST = (("vllm-blocks", 2), ("trtllm", 2))


def longest_first(tasks: Sequence[Task]) -> list[int]:
    """Indices of ``tasks`` in the order to start them: the costlier policy families
    first, then larger GPU and host capacities (None: unlimited), then as given."""

    def cost(key: int) -> tuple[int, float, int]:
        cap, cpu, policy = tasks[key]
        family = next((c for prefix, c in _FAMILY_COST if policy.startswith(prefix)), 1)
        return (-family, -(math.inf if cap is None else cap), -cpu)

    return sorted(range(len(tasks)), key=cost)


def _label(cap: int, cpu: int, policy: str) -> str:
    return f"{cap:,} tokens: {policy}" if not cpu else f"{cap:,} + {cpu:,} host: {policy}"


def _one(
    spec: SweepSpec,
    requests: Sequence[Request],
    task: Task,
    progress: ProgressFactory | None,
    label: bool,
) -> ReplayResult:
    cap, cpu, policy = task
    sched = make_scheduler(
        spec.model, max_running=spec.max_running, cost=spec.cost, preemption=spec.preemption
    )
    labelled = progress
    if progress is not None and label and cap is not None:
        labelled = lambda name, total: progress(_label(cap, cpu, name), total)  # noqa: E731
    return replay(
        requests,
        [policy],
        cap,
        scheduler=sched,
        eviction_policy=spec.eviction_policy,
        hash_algo=spec.hash_algo,
        progress=labelled,
        cpu_capacity=cpu,
        offload=spec.offload,
    )[0]


# -- worker processes -------------------------------------------------------------------
_worker_requests: Sequence[Request] | None = None
_worker_queue: Any = None


def _init_worker(spec: SweepSpec, q: Any) -> None:
    global _worker_requests, _worker_queue
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    _worker_queue = q
    if _worker_requests is None:  # spawned, not forked: read the trace again
        _worker_requests = load_requests(spec)


class _QueueTask:
    def __init__(self, key: int) -> None:
        self.key = key
        self.pending = 0

    def advance(self, n: int) -> None:
        self.pending += n
        if self.pending >= 64:
            _worker_queue.put((self.key, self.pending))
            self.pending = 0

    def done(self) -> None:
        _worker_queue.put((self.key, self.pending))
        self.pending = 0


def _work(spec: SweepSpec, key: int, task: Task, report: bool, records: bool) -> ReplayResult:
    if _worker_requests is None:  # pragma: no cover - set by the initializer
        raise RuntimeError("sweep worker without requests")
    progress = (lambda name, total: _QueueTask(key)) if report else None
    if report:
        _worker_queue.put((key, 0))  # the bar appears as the replay starts
    res = _one(spec, _worker_requests, task, progress, False)
    if not records:  # the caller wants the summary only: do not ship the records back
        res.summary_only = summarize(res)
        res.records = []
    return res


def run_sweep(
    spec: SweepSpec,
    requests: Sequence[Request],
    capacities: Sequence[int],
    *,
    jobs: int | None = None,
    progress: ProgressFactory | None = None,
) -> list[dict[str, Any]]:
    """Summaries of every (capacity, policy) pair, capacity-major, as a serial run."""
    pairs = [(cap, pol) for cap in capacities for pol in spec.policies]
    results = run_pairs(
        spec, requests, pairs, jobs=jobs, progress=progress, records=False, label=True
    )
    return [r.summary_only or summarize(r) for r in results]


def run_grid(
    spec: SweepSpec,
    requests: Sequence[Request],
    capacities: Sequence[int],
    cpu_capacities: Sequence[int],
    *,
    jobs: int | None = None,
    progress: ProgressFactory | None = None,
) -> list[dict[str, Any]]:
    """The GPU x host capacity grid: summaries of every (capacity, cpu capacity, policy),
    in that order (capacity-major), each with its ``cpu_capacity`` (0 included)."""
    tasks: list[Task] = [
        (cap, cpu, pol) for cap in capacities for cpu in cpu_capacities for pol in spec.policies
    ]
    results = _run_tasks(
        spec, requests, tasks, jobs=jobs, progress=progress, records=False, label=True
    )
    out = []
    for (_, cpu, _), r in zip(tasks, results, strict=True):
        s = r.summary_only or summarize(r)
        out.append({**s, "cpu_capacity": cpu})
    return out


def run_pairs(
    spec: SweepSpec,
    requests: Sequence[Request],
    pairs: Sequence[tuple[int | None, str]],
    *,
    jobs: int | None = None,
    progress: ProgressFactory | None = None,
    records: bool = True,
    label: bool = False,
    on_result: OnResult | None = None,
) -> list[ReplayResult]:
    """Replay every (capacity, policy) pair, up to ``jobs`` at once in worker processes
    (1: one after the other in this process). ``records=False`` drops the per-request
    records (``ReplayResult.summary_only`` holds the summary); ``label`` names each
    progress bar after its capacity. Every replay has ``spec.cpu_capacity`` of host
    memory. ``on_result(i, result)`` is called in this process as each pair's result
    arrives (``i``: its index in ``pairs``), while later ones may still run: work on one
    result (writing its records out) then overlaps the replays still running."""
    tasks: list[Task] = [(cap, spec.cpu_capacity, pol) for cap, pol in pairs]
    return _run_tasks(
        spec,
        requests,
        tasks,
        jobs=jobs,
        progress=progress,
        records=records,
        label=label,
        on_result=on_result,
    )


def _run_tasks(
    spec: SweepSpec,
    requests: Sequence[Request],
    tasks: Sequence[Task],
    *,
    jobs: int | None,
    progress: ProgressFactory | None,
    records: bool,
    label: bool,
    on_result: OnResult | None = None,
) -> list[ReplayResult]:
    global _worker_requests
    jobs = min(jobs or default_jobs(), len(tasks))
    if jobs <= 1:
        out = []
        for key, task in enumerate(tasks):
            res = _one(spec, requests, task, progress, label)
            if not records:
                res.summary_only = summarize(res)
                res.records = []
            if on_result is not None:
                on_result(key, res)
            out.append(res)
        return out
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else "spawn")
    q = ctx.Queue()
    _worker_requests = requests if ctx.get_start_method() == "fork" else None
    n = len(requests)
    bars: list[Any] = [None] * len(tasks)  # a bar appears when its replay starts

    def bar(key: int) -> Any:
        if bars[key] is None and progress is not None:
            cap, cpu, pol = tasks[key]
            bars[key] = progress(_label(cap, cpu, pol) if label and cap is not None else pol, n)
        return bars[key]

    # One process per replay: each pair's peak RSS is its own. The longest replays go
    # first, so the last ones to finish are short and no worker idles long at the end.
    pool = ctx.Pool(jobs, initializer=_init_worker, initargs=(spec, q), maxtasksperchild=1)

    def wake(key: int) -> Callable[[object], None]:
        # Run by the pool's result thread as a replay ends: a zero count on the progress
        # queue wakes the loop below at once (it would otherwise see the result only
        # when its next 0.1 s wait on the queue ends).
        return lambda _: q.put((key, 0))

    try:
        submitted = {
            key: pool.apply_async(
                _work,
                (spec, key, tasks[key], progress is not None, records),
                callback=wake(key),
                error_callback=wake(key),
            )
            for key in longest_first(tasks)
        }
        pending = [submitted[key] for key in range(len(tasks))]
        finished = [False] * len(tasks)
        counted = [0] * len(tasks)
        while not all(finished):
            try:
                key, count = q.get(timeout=0.1)
                b = bar(key)
                if b is not None and not finished[key]:
                    b.advance(count)
                    counted[key] += count
            except queue.Empty:
                pass
            for key, r in enumerate(pending):
                if not finished[key] and r.ready():
                    res = r.get()  # raises a worker's exception here
                    finished[key] = True
                    b = bar(key)
                    if b is not None:
                        # Counts still in the queue may arrive after the result does.
                        b.advance(n - counted[key])
                        b.done()
                    if on_result is not None:
                        on_result(key, res)
        out = [r.get() for r in pending]
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        _worker_requests = None
    return out
