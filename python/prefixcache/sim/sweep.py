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
the parent through a queue, batched per 64 requests. Each worker sends its result (or
its exception) back on a pipe of its own; one that ends without sending anything
(killed by a signal: the out-of-memory killer) raises :class:`WorkerDiedError` in the
parent, which ends the other workers first.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import queue
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixcache.errors import PrefixCacheError
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
    "WorkerDiedError",
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


class WorkerDiedError(PrefixCacheError, RuntimeError):
    """A worker process ended without handing back its replay's result (killed by a
    signal, e.g. the kernel's out-of-memory killer, or exited on its own)."""


def _describe(task: Task) -> str:
    cap, cpu, policy = task
    if cap is None:
        return f"{policy} at unlimited KV" + (f" + {cpu:,} host" if cpu else "")
    return f"{policy} at " + _label(cap, cpu, policy).rsplit(": ", 1)[0]


def _child(
    spec: SweepSpec, key: int, task: Task, report: bool, records: bool, q: Any, conn: Any
) -> None:
    """A worker process: one replay, its result (or its exception) sent back on ``conn``."""
    global _worker_requests, _worker_queue
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _worker_queue = q
    msg: tuple[bool, Any]
    try:
        if _worker_requests is None:  # spawned, not forked: read the trace again
            _worker_requests = load_requests(spec)
        msg = (True, _work(spec, key, task, report, records))
    except BaseException as e:  # handed to the parent, raised there
        msg = (False, e)
    try:
        conn.send(msg)
    except Exception as e:  # an exception that cannot be pickled
        conn.send((False, RuntimeError(f"{type(msg[1]).__name__}: {msg[1]} ({e})")))
    conn.close()


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
    ctx: Any = mp.get_context("fork" if "fork" in methods else "spawn")
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
    # Each worker sends its result on a pipe of its own; the parent waits on those pipes
    # and on the processes themselves, so a worker that dies without a result (the
    # out-of-memory killer) stops the run instead of leaving it waiting.
    order = longest_first(tasks)
    running: dict[int, tuple[Any, Any]] = {}  # key -> (process, receiving end)
    results: dict[int, ReplayResult] = {}
    counted = [0] * len(tasks)
    started = 0

    def start(key: int) -> None:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_child,
            args=(spec, key, tasks[key], progress is not None, records, q, send),
            daemon=True,
        )
        # SIGINT stays blocked until the worker ignores it: Ctrl-C is the parent's alone.
        blocked = hasattr(signal, "pthread_sigmask")
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            proc.start()
            send.close()
            running[key] = (proc, recv)  # before a Ctrl-C held back here is raised
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def drain() -> None:
        while True:
            try:
                key, count = q.get_nowait()
            except queue.Empty:
                return
            b = bar(key)
            if b is not None and key not in results:
                b.advance(count)
                counted[key] += count

    def finish(key: int) -> None:
        proc, recv = running.pop(key)
        try:
            ok, value = recv.recv()
        except EOFError:  # the worker ended before sending anything
            proc.join()
            raise WorkerDiedError(_died(tasks[key], proc.exitcode)) from None
        finally:
            recv.close()
        while proc.is_alive():  # its last progress counts may wait for room in the queue
            drain()
            proc.join(0.05)
        if not ok:
            raise value  # a worker's exception, raised here
        drain()  # counts still in the queue may arrive after the result does
        results[key] = value
        b = bar(key)
        if b is not None:
            b.advance(n - counted[key])
            b.done()

    try:
        while len(results) < len(tasks):
            while started < len(order) and len(running) < jobs:
                start(order[started])
                started += 1
            waits = {id(r): k for k, (_, r) in running.items()}
            waits.update({id(p.sentinel): k for k, (p, _) in running.items()})
            handles = [r for _, r in running.values()] + [p.sentinel for p, _ in running.values()]
            ready = mp_connection.wait(handles, timeout=0.1)
            drain()
            arrived = sorted({waits[id(h)] for h in ready})
            for key in arrived:
                # A result that was sent is read even when its process has ended since.
                finish(key)
            # The next replays start before this process works on the results that
            # arrived (on_result: writing records out), which then overlaps them.
            while started < len(order) and len(running) < jobs:
                start(order[started])
                started += 1
            if on_result is not None:
                for key in arrived:
                    on_result(key, results[key])
        out = [results[key] for key in range(len(tasks))]
    except BaseException:
        for proc, _ in running.values():
            proc.terminate()
        for proc, _ in running.values():
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        raise
    finally:
        for _, recv in running.values():
            recv.close()
        q.close()
        q.join_thread()
        _worker_requests = None
    return out


def _died(task: Task, exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
        if -exitcode == getattr(signal, "SIGKILL", None):
            how += " (the out-of-memory killer?)"
    else:
        how = f"exit status {exitcode}"
    return f"the worker process replaying {_describe(task)} died: {how}"
