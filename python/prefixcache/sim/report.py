"""Reports: rich terminal tables, JSON / CSV files, the sweep plot, trace statistics."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from prefixcache.sim.replay import ProgressFactory
from prefixcache.sim.requests import Request

__all__ = [
    "comparison_table",
    "difference_table",
    "latency_table",
    "progress_bars",
    "sweep_table",
    "trace_stats",
    "trace_stats_table",
    "write_csv",
    "write_json",
    "write_sweep_plot",
]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _pct(v: float) -> str:
    return f"{100.0 * v:.2f}%"


def comparison_table(title: str, summaries: Sequence[dict[str, Any]]) -> Table:
    """One row per policy: the A-F study's columns."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    cols = [
        ("policy", "policy"), ("requests", "requests"), ("prompt tok", "prompt_tokens"),
        ("hit tok", "hit_tokens"), ("hit rate", "hit_rate"),
        ("evicted tok", "evicted_tokens"), ("evictions", "evictions"),
    ]
    if any(s.get("rejected") for s in summaries):
        cols.append(("rejected", "rejected"))
    if any("partial_hits" in s for s in summaries):
        cols += [("partial hits", "partial_hits"), ("copies", "copies")]
    for label, _ in cols:
        t.add_column(label, justify="left" if label == "policy" else "right",
                     no_wrap=label == "policy")
    for s in summaries:
        row = []
        for _, key in cols:
            v = s.get(key)
            if key == "hit_rate":
                row.append(_pct(float(v or 0.0)))
            elif key == "evictions":
                row.append(f"{_fmt(v)} {s['eviction_unit']}")
            else:
                row.append("-" if v is None else _fmt(v))
        t.add_row(*row)
    return t


def latency_table(title: str, summaries: Sequence[dict[str, Any]]) -> Table:
    """Time model: preemptions, recomputation and the estimated TTFT per policy."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    cols = [("policy", "policy"), ("preemptions", "preemptions"),
            ("recomputed tok", "recomputed_tokens"), ("TTFT p50 s", "ttft_p50"),
            ("p90 s", "ttft_p90"), ("p99 s", "ttft_p99"), ("makespan s", "makespan")]
    for label, _ in cols:
        t.add_column(label, justify="left" if label == "policy" else "right",
                     no_wrap=label == "policy")
    for s in summaries:
        t.add_row(*(_fmt(s.get(key)) for _, key in cols))
    return t


def difference_table(title: str, diffs: Sequence[dict[str, Any]]) -> Table:
    """Per-request hit difference between pairs of policies."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for label in ("a", "b", "requests", "a more", "equal", "b more", "total", "mean",
                  "min", "max"):
        t.add_column(label, justify="left" if label in "ab" else "right", no_wrap=True)
    for d in diffs:
        t.add_row(
            d["a"], d["b"], _fmt(d["requests"]), _fmt(d["a_more"]), _fmt(d["equal"]),
            _fmt(d["b_more"]), f"{d['total_diff']:+,}", f"{d['mean_diff']:+.2f}",
            f"{d['min_diff']:+,}", f"{d['max_diff']:+,}",
        )
    return t


def sweep_table(capacities: Sequence[int], rows: dict[str, list[float]]) -> Table:
    t = Table(title="hit rate vs KV capacity (tokens)", title_justify="left",
              box=box.SIMPLE_HEAD)
    t.add_column("capacity", justify="right")
    for name in rows:
        t.add_column(name, justify="right")
    for i, c in enumerate(capacities):
        t.add_row(f"{c:,}", *(_pct(rows[name][i]) for name in rows))
    return t


def write_sweep_plot(path: str | Path, capacities: Sequence[int],
                     rows: dict[str, list[float]], title: str) -> None:
    """Hit rate vs KV capacity, one curve per policy (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rates in rows.items():
        ax.plot(capacities, [100.0 * r for r in rates], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("KV capacity (tokens)")
    ax.set_ylabel("prompt tokens hit (%)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN -> None, numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def write_json(path: str | Path, data: Any) -> None:
    Path(path).write_text(json.dumps(_clean(data), indent=2) + "\n", encoding="utf-8")


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    """Rows of flat dicts; the header is the union of keys in first-seen order."""
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: _clean(v) for k, v in r.items()})


@contextmanager
def progress_bars(console: Console, enabled: bool = True,
                  delay: float = 1.0) -> Iterator[ProgressFactory | None]:
    """A factory of per-policy progress bars (rich, on ``console``), shown only once the
    work has run for ``delay`` seconds, so quick commands print nothing extra."""
    if not enabled:
        yield None
        return
    prog = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=console, transient=True,
    )
    t0 = time.monotonic()
    shown = [False]

    def start_if_slow() -> None:
        if not shown[0] and time.monotonic() - t0 >= delay:
            shown[0] = True
            prog.start()

    class Task:
        """Updates are batched (rich redraws on its own clock); ``done`` flushes the
        rest, so the bar reaches its total, and stops the task's timer."""

        def __init__(self, name: str, total: int) -> None:
            self.id = prog.add_task(name, total=total)
            self.pending = 0

        def advance(self, n: int) -> None:
            self.pending += n
            if self.pending >= 64:
                prog.advance(self.id, self.pending)
                self.pending = 0
                start_if_slow()

        def done(self) -> None:
            total = prog.tasks[self.id].total
            prog.update(self.id, completed=total)
            self.pending = 0
            prog.stop_task(self.id)
            start_if_slow()
            if shown[0]:
                prog.refresh()

    def factory(name: str, total: int) -> Task:
        return Task(name, total)

    factory.progress = prog  # type: ignore[attr-defined]  # for tests and callers

    try:
        yield factory
    finally:
        if shown[0]:
            prog.stop()


def trace_stats(requests: Sequence[Request], block_size: int = 512,
                hash_ids: Sequence[np.ndarray] | None = None) -> dict[str, Any]:
    """Sizes, arrival span and the prefix-sharing ceiling of a request list.

    ``block_reuse_ceiling``: the share of full ``block_size`` prompt blocks (chained by
    prefix, so a block counts only with all blocks before it) already seen earlier in the
    list - the hit rate of an infinite block cache at that granularity. With Mooncake
    ``hash_ids`` also the trace's own block-id figures (every id, the partial last block
    included, as the trace README counts them).
    """
    n = len(requests)
    plen = np.array([r.prompt_len for r in requests], dtype=np.int64)
    olen = np.array([r.output_len for r in requests], dtype=np.int64)
    arr = np.array([r.arrival for r in requests], dtype=np.float64)
    seen: set[bytes] = set()
    refs = repeats = 0
    for r in requests:
        p = r.prompt
        nfull = len(p) // block_size
        if nfull == 0:
            continue
        # A block is identified by the whole prefix up to its end: hash the chain.
        blocks = p[: nfull * block_size].reshape(nfull, block_size)
        parent = b""
        for row in blocks:
            key = hashlib.blake2b(parent + row.tobytes(), digest_size=16).digest()
            refs += 1
            if key in seen:
                repeats += 1
            else:
                seen.add(key)
            parent = key
    sessions = {r.session for r in requests if r.session is not None}
    extra: dict[str, Any] = {}
    if hash_ids is not None:
        ids = np.concatenate(hash_ids) if hash_ids else np.zeros(0, dtype=np.uint32)
        distinct = int(np.unique(ids).size)
        extra = {
            "hash_id_refs": int(ids.size),
            "distinct_hash_ids": distinct,
            "hash_id_repeat_share": (ids.size - distinct) / ids.size if ids.size else 0.0,
        }

    def q(a: np.ndarray, p: float) -> float:
        return float(np.percentile(a, p)) if a.size else 0.0

    return {
        "requests": n,
        "sessions": len(sessions),
        "prompt_tokens": int(plen.sum()),
        "output_tokens": int(olen.sum()),
        "prompt_mean": float(plen.mean()) if n else 0.0,
        "prompt_p50": q(plen, 50),
        "prompt_p99": q(plen, 99),
        "prompt_max": int(plen.max()) if n else 0,
        "output_mean": float(olen.mean()) if n else 0.0,
        "output_p50": q(olen, 50),
        "output_p99": q(olen, 99),
        "arrival_first_s": float(arr.min()) if n else 0.0,
        "arrival_last_s": float(arr.max()) if n else 0.0,
        "request_rate_per_s": (n / float(arr.max() - arr.min())) if n > 1 and arr.max() > arr.min()
        else math.nan,
        "block_size": block_size,
        "full_block_refs": refs,
        "distinct_blocks": len(seen),
        "block_reuse_ceiling": repeats / refs if refs else 0.0,
        **extra,
    }


def trace_stats_table(title: str, stats: dict[str, Any]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, min_width=len(title))
    t.add_column("statistic")
    t.add_column("value", justify="right")
    for k, v in stats.items():
        t.add_row(k, _pct(v) if k in ("block_reuse_ceiling", "hash_id_repeat_share")
                  else _fmt(v))
    return t
