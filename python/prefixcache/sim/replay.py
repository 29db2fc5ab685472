"""Replay: run the same requests through several policies under the same scheduler.

:func:`replay` returns a :class:`ReplayResult` per policy: per-request records (hit
tokens, prompt tokens, evicted tokens, TTFT estimate) plus the policy's counters and a
summary. :func:`hit_difference` compares two policies request by request.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import compress
from typing import Any, Protocol

import numpy as np

from prefixcache.errors import InvalidInputError, InvalidTypeError
from prefixcache.sim.memory import peak_rss_bytes, reset_peak_rss, rss_bytes
from prefixcache.sim.policies import CachePolicy, PolicyStats, make_policy, policy_block_size
from prefixcache.sim.requests import RecordColumns, Request, RequestRecord
from prefixcache.sim.scheduler import PrefillCost, SlotScheduler, TimeScheduler
from prefixcache.sim.sequence import SequenceScheduler

__all__ = [
    "RUN_FIELDS",
    "ProgressFactory",
    "ProgressTask",
    "ReplayResult",
    "default_capacity",
    "hit_difference",
    "host_tier_summary",
    "make_scheduler",
    "offload_for",
    "replay",
    "summarize",
]

Scheduler = SlotScheduler | TimeScheduler | SequenceScheduler


class ProgressTask(Protocol):
    """One policy's progress: ``advance(n)`` as requests complete, ``done()`` at the end
    (the bar shows every request and its timer stops)."""

    def advance(self, n: int) -> None: ...

    def done(self) -> None: ...


ProgressFactory = Callable[[str, int], ProgressTask]  # (label, number of requests)


class ReplayResult:
    """One policy's replay: its per-request records, counters and wall time.

    The records are held as :class:`RecordColumns` (``columns``); ``records`` builds the
    :class:`RequestRecord` list from them on first use (a replay that is only summarised
    and written out never makes one object per request). Once built, the list is what
    the result holds: changes to its records show in ``columns`` and the summary, as
    they would in a result made from records. ``records`` may be assigned a list (or
    columns) to replace them.
    """

    __slots__ = (
        "_columns",
        "_records",
        "capacity",
        "model",
        "offload",
        "peak_rss_bytes",
        "policy",
        "seconds",
        "start_rss_bytes",
        "stats",
        "summary_only",
    )

    def __init__(
        self,
        policy: str,
        model: str,
        capacity: int,
        records: Sequence[RequestRecord] | RecordColumns,
        stats: PolicyStats,
        seconds: float,  # wall time of the replay
        peak_rss_bytes: int = 0,  # the process's peak resident memory during the replay
        summary_only: dict[str, Any] | None = None,  # the summary, when records were dropped
        offload: str | None = None,  # the host tier's policy as asked (None: the default)
        start_rss_bytes: int = 0,  # the process's resident memory when the replay began
    ) -> None:
        self.policy = policy
        self.model = model
        self.capacity = capacity
        self._columns: RecordColumns | None = None
        self._records: list[RequestRecord] | None = None
        self.records = records
        self.stats = stats
        self.seconds = seconds
        self.peak_rss_bytes = peak_rss_bytes
        self.summary_only = summary_only
        self.offload = offload
        self.start_rss_bytes = start_rss_bytes

    @property
    def records(self) -> list[RequestRecord]:
        """One record per request, in request order (built from the columns once)."""
        if self._records is None:
            assert self._columns is not None
            self._records = self._columns.records()
            self._columns = None  # the list is the truth from now on
        return self._records

    @records.setter
    def records(self, value: Sequence[RequestRecord] | RecordColumns) -> None:
        if isinstance(value, RecordColumns):
            self._columns, self._records = value, None
        else:  # a list is held as given, as the result held it before columns
            self._columns, self._records = None, value if isinstance(value, list) else list(value)

    @property
    def columns(self) -> RecordColumns:
        """The records as columns (taken from the record list when one was built)."""
        if self._columns is not None:
            return self._columns
        assert self._records is not None
        return RecordColumns.from_records(self._records)

    def summary(self) -> dict[str, Any]:
        return summarize(self)

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.policy,
            self.model,
            self.capacity,
            self.columns,
            self.stats,
            self.seconds,
            self.peak_rss_bytes,
            self.summary_only,
            self.offload,
            self.start_rss_bytes,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReplayResult):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> tuple[Any, ...]:
        return self._fields()  # the columns: what a worker process sends back

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        ReplayResult.__init__(self, *state)

    def __repr__(self) -> str:
        return (
            f"ReplayResult(policy={self.policy!r}, model={self.model!r}, "
            f"capacity={self.capacity!r}, records=<{len(self.columns)} records>, "
            f"stats={self.stats!r}, seconds={self.seconds!r}, "
            f"peak_rss_bytes={self.peak_rss_bytes!r}, summary_only={self.summary_only!r}, "
            f"offload={self.offload!r}, start_rss_bytes={self.start_rss_bytes!r})"
        )


def default_capacity(requests: Sequence[Request], block_size: int = 16) -> int:
    """A KV budget nothing is ever evicted from: every token of every request, padded
    with a block per request (``block_size`` tokens, at least 16): each request's KV,
    prompt and output, fits in its own blocks, partial last block included."""
    block_size = max(16, block_size)
    total = sum(r.prompt_len + r.output_len for r in requests)
    pad = block_size * (len(requests) + 1)
    return (total + pad + block_size - 1) // block_size * block_size


def make_scheduler(
    model: str,
    *,
    max_running: int | None = None,
    cost: PrefillCost | None = None,
    preemption: bool = True,
) -> Scheduler:
    """The scheduler of ``model`` (slots, time or sequence; docs/SIMULATOR.md). ``cost``
    is the time model's; ``max_running`` applies to slots and time, ``preemption=False``
    to time only: given to a model without it, InvalidInputError, as the command line."""
    if model == "sequence" and max_running is not None:
        raise InvalidInputError("max_running applies to the slots and time models, not sequence")
    if model in ("slots", "sequence") and preemption is False:
        raise InvalidInputError(f"preemption=False applies to the time model only, not {model}")
    if model == "slots":
        return SlotScheduler(8 if max_running is None else max_running)
    if model == "time":
        return TimeScheduler(256 if max_running is None else max_running, cost, preemption)
    if model == "sequence":
        return SequenceScheduler()
    raise InvalidInputError(f"unknown scheduler model {model!r}; expected slots, time or sequence")


_COLLECT_MIN_REQUESTS = 1000

Offload = str | Mapping[str, str] | None


def offload_for(policy: str, offload: Offload) -> str | None:
    """The host tier policy of ``policy``: ``offload`` itself when a name, its entry when a
    mapping of policy names (None when absent: the policy's default)."""
    if offload is None or isinstance(offload, str):
        return offload
    return offload.get(policy)


def replay(
    requests: Sequence[Request],
    policies: Sequence[str | CachePolicy],
    capacity: int | None = None,
    *,
    model: str | None = None,
    scheduler: Scheduler | None = None,
    eviction_policy: str = "lru",
    hash_algo: str = "sha256",
    progress: ProgressFactory | None = None,
    check: bool = False,
    cpu_capacity: int = 0,
    offload: Offload = None,
) -> list[ReplayResult]:
    """Run ``requests`` through each policy (names or built policies) with one scheduler.

    ``capacity`` in tokens (None: :func:`default_capacity` for the policy's block size,
    nothing evicted) is used for policies given by name, and so are ``cpu_capacity``
    (tokens of host memory behind the GPU, 0: none) and ``offload`` (the host tier's
    policy: one name for every policy, or a mapping from policy names;
    docs/SIMULATOR.md, "Offload"). ``check`` verifies the policy's invariants after
    every step. The scheduler is ``scheduler``, else :func:`make_scheduler` of ``model``
    (default slots); both given, they must agree.
    """
    if not policies:
        raise InvalidInputError("no policies given")
    if capacity is not None and (
        isinstance(capacity, bool) or not isinstance(capacity, int | np.integer)
    ):
        raise InvalidTypeError(f"capacity must be an int of tokens or None, got {capacity!r}")
    cap = 0 if capacity is None else int(capacity)
    if cap < 0:
        raise InvalidInputError(f"capacity must be >= 0, got {cap}")
    if scheduler is not None and model is not None and model != scheduler.model:
        raise InvalidInputError(
            f"model={model!r} but the scheduler given runs the {scheduler.model} model"
        )
    sched = scheduler or make_scheduler(model or "slots")
    results = []
    for i, p in enumerate(policies):
        if i and len(requests) >= _COLLECT_MIN_REQUESTS:
            # The previous policy's cache is gone before this one's peak starts. A full
            # collection costs ~0.1 s in a big heap: only worth it for runs that long.
            gc.collect()
        reset_peak_rss()
        start_rss = rss_bytes()
        off = offload_for(p, offload) if isinstance(p, str) and cpu_capacity else None
        if isinstance(p, str) and capacity is None:  # unlimited: whatever its block size
            cap = default_capacity(requests, policy_block_size(p))
        pol = (
            make_policy(
                p,
                cap,
                eviction_policy=eviction_policy,
                hash_algo=hash_algo,
                cpu_capacity=cpu_capacity,
                offload=off,
            )
            if isinstance(p, str)
            else p
        )
        if not isinstance(p, str):  # built: the tier policy it was built with
            off = getattr(pol, "offload", None)
        task = progress(pol.name, len(requests)) if progress is not None else None
        t0 = time.perf_counter()
        prepare = getattr(pol, "prepare", None)  # a policy that reads the future (opt)
        if prepare is not None:  # outputs are never cached in the sequence model
            prepare(requests, outputs=sched.model != "sequence")
        records = sched.run_columns(
            requests, pol, task.advance if task is not None else None, check
        )
        dt = time.perf_counter() - t0
        if task is not None:
            task.done()
        results.append(
            ReplayResult(
                pol.name,
                sched.model,
                pol.capacity,
                records,
                pol.stats(),
                dt,
                peak_rss_bytes(),
                offload=off,
                start_rss_bytes=start_rss,
            )
        )
        del pol
    return results


def _percentile(values: list[float], q: float) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return float(np.percentile(vals, q)) if vals else math.nan


# The summary fields that depend on the run (the machine, the process), not on the
# trace and the policy: two runs of the same replay agree on everything else.
RUN_FIELDS = ("seconds", "peak_rss_bytes", "start_rss_bytes")


def summarize(res: ReplayResult) -> dict[str, Any]:
    if res.summary_only is not None:  # the records were dropped after summarising
        return dict(res.summary_only)
    c = res.columns
    n = len(c)
    served = [not r for r in c.rejected]  # one flag per request
    every = all(served)
    prompt = sum(c.prompt_tokens if every else compress(c.prompt_tokens, served))
    hit = sum(c.hit_tokens if every else compress(c.hit_tokens, served))
    s = res.stats
    out: dict[str, Any] = {
        "policy": res.policy,
        "model": res.model,
        "capacity": res.capacity,
        "requests": n,
        "rejected": n - sum(served),
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "hit_rate": hit / prompt if prompt else 0.0,
        "evicted_tokens": s.evicted_tokens,
        "evictions": s.evictions,
        "eviction_unit": s.eviction_unit,
        "peak_used_tokens": s.peak_used_tokens,
        "peak_cached_tokens": s.peak_cached_tokens,
        "peak_rss_bytes": res.peak_rss_bytes,
        "start_rss_bytes": res.start_rss_bytes,
        "seconds": res.seconds,
        **s.extra,
    }
    if s.cpu_capacity:
        out.update(_host_tier_summary(res, c, served, prompt))
    if res.model == "time":
        ttft = list(compress(c.ttft, served))
        finished = [f for f in compress(c.finished, served) if not math.isnan(f)]
        out.update(
            preemptions=sum(c.preemptions),
            recompute_hit_tokens=sum(c.recompute_hit_tokens),
            recomputed_tokens=sum(c.recomputed_tokens),
            ttft_p50=_percentile(ttft, 50),
            ttft_p90=_percentile(ttft, 90),
            ttft_p99=_percentile(ttft, 99),
            makespan=max(finished, default=0.0),
        )
    return out


def host_tier_summary(
    res: ReplayResult, served: Sequence[RequestRecord], prompt: int
) -> dict[str, Any]:
    """The second tier's part of a summary (docs/SIMULATOR.md, "Offload"): the reuse split
    into GPU hits and loaded host hits (``hit_tokens`` is their sum), the host hits left
    to recomputation, and the tier's own counters."""
    return _host_tier_summary(res, RecordColumns.from_records(served), None, prompt)


def _host_tier_summary(
    res: ReplayResult, c: RecordColumns, served: list[bool] | None, prompt: int
) -> dict[str, Any]:
    """:func:`host_tier_summary` of the records ``c`` whose ``served`` flag is set (None:
    every one)."""

    def total(values: list[Any]) -> Any:
        return sum(values if served is None else compress(values, served))

    s = res.stats
    hit = total(c.hit_tokens)
    host = total(c.host_hit_tokens)
    loaded = total(c.loaded_tokens)
    return {
        "cpu_capacity": s.cpu_capacity,
        "offload": res.offload,
        "gpu_hit_tokens": hit - loaded,
        "host_hit_tokens": host,
        "loaded_tokens": loaded,
        "host_unloaded_tokens": host - loaded,  # host hits not worth loading: recomputed
        "gpu_hit_rate": (hit - loaded) / prompt if prompt else 0.0,
        "host_hit_rate": loaded / prompt if prompt else 0.0,
        "load_seconds": total(c.load_time),
        "stored_tokens": s.stored_tokens,
        "host_evicted_tokens": s.host_evicted_tokens,
        "peak_host_tokens": s.peak_host_tokens,
    }


def hit_difference(a: ReplayResult, b: ReplayResult) -> dict[str, Any]:
    """Per-request hit tokens of ``a`` minus ``b`` (requests served by both)."""
    ca, cb = a.columns, b.columns
    if len(ca) != len(cb):
        raise InvalidInputError("the two results replayed different request lists")
    d = np.array(
        [
            ha - hb
            for ha, hb, ra, rb in zip(
                ca.hit_tokens, cb.hit_tokens, ca.rejected, cb.rejected, strict=True
            )
            if not (ra or rb)
        ],
        dtype=np.int64,
    )
    n = int(d.size)
    return {
        "a": a.policy,
        "b": b.policy,
        "requests": n,
        "a_more": int((d > 0).sum()),
        "equal": int((d == 0).sum()),
        "b_more": int((d < 0).sum()),
        "total_diff": int(d.sum()),
        "mean_diff": float(d.mean()) if n else 0.0,
        "min_diff": int(d.min()) if n else 0,
        "max_diff": int(d.max()) if n else 0,
    }
