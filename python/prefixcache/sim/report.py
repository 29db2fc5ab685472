"""Reports: rich terminal tables, CSV files, the sweep plot, trace statistics (JSON files:
:mod:`prefixcache.sim.json_report`)."""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from prefixcache.sim.json_report import clean
from prefixcache.sim.output_files import write_text
from prefixcache.sim.replay import ProgressFactory
from prefixcache.sim.requests import RecordColumns, record_fields

__all__ = [
    "comparison_table",
    "difference_table",
    "grid_tables",
    "host_tier_tables",
    "latency_table",
    "partial_reuse_table",
    "progress_bars",
    "short_tokens",
    "sweep_table",
    "trace_stats_table",
    "write_csv",
    "write_grid_plot",
    "write_sweep_plot",
]


def _fmt(v: Any) -> str:
    """One number format everywhere: thousands separators, no exponents; floats to about
    three or four significant digits (NaN: "-")."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _pct(v: float) -> str:
    return f"{100.0 * v:.2f}%"


def plain_table(title: str) -> Table:
    """A table whose title lines are not wrapped to its own width (up to 80 columns)."""
    width = min(max((len(line) for line in title.splitlines()), default=0), 80)
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        min_width=width,
    )


def _policy_column(t: Table, header: str = "policy") -> None:
    t.add_column(header, justify="left", no_wrap=True)


# Tables fit 80 columns: the per-policy counts shared by every row (requests, prompt
# tokens) go in the title, long headers wrap onto two lines, and what does not fit (the
# mean difference, the trie's partial-reuse counters) has its own table or is in --json.


def comparison_table(title: str, summaries: Sequence[dict[str, Any]]) -> Table:
    """One row per policy: hits, hit rate, evictions (``rejected`` when any request was)."""
    t = plain_table(title)
    _policy_column(t)
    cols = [
        ("hit\ntokens", "hit_tokens"),
        ("hit\nrate", "hit_rate"),
        ("evicted\ntokens", "evicted_tokens"),
        ("evictions", "evictions"),
    ]
    if any(s.get("cpu_capacity") for s in summaries):
        # A host tier: the hit rate split into GPU and host; the token counts (hits,
        # evicted) move to the host tier's tables, so that the table fits 80 columns.
        cols[0:3] = [
            ("hit\nrate", "hit_rate"),
            ("GPU\nrate", "gpu_hit_rate"),
            ("host\nrate", "host_hit_rate"),
        ]
    if any(s.get("rejected") for s in summaries):
        cols.append(("rejected", "rejected"))
    for label, _ in cols:
        t.add_column(label, justify="right", no_wrap=True)
    for s in summaries:
        row = [str(s["policy"])]
        for _, key in cols:
            v = s.get(key)
            if key in ("gpu_hit_rate", "host_hit_rate") and "cpu_capacity" not in s:
                row.append(_pct(float(s["hit_rate"])) if key == "gpu_hit_rate" else "-")
            elif key.endswith("hit_rate"):
                row.append(_pct(float(v or 0.0)))
            elif key == "evictions":
                row.append(f"{_fmt(v)} {s['eviction_unit']}")
            else:
                row.append(_fmt(v))
        t.add_row(*row)
    return t


_HOST_REUSE = (
    ("GPU hit\ntokens", "gpu_hit_tokens"),
    ("host hit\ntokens", "host_hit_tokens"),
    ("loaded\ntokens", "loaded_tokens"),
    ("not worth\nloading", "host_unloaded_tokens"),
)
_HOST_MEMORY = (
    ("GPU\nevicted", "evicted_tokens"),
    ("stored\ntokens", "stored_tokens"),
    ("host\nevicted", "host_evicted_tokens"),
    ("peak host\ntokens", "peak_host_tokens"),
)


def host_tier_tables(summaries: Sequence[dict[str, Any]]) -> list[Table]:
    """The second tier's counters, for the policies that have one (docs/SIMULATOR.md,
    "Offload"): the reuse (GPU hits, host hits, loaded, not worth loading) and the memory
    (GPU evicted, stored, host evicted, peak host); none when no policy has a tier."""
    rows = [s for s in summaries if s.get("cpu_capacity")]
    if not rows:
        return []
    caps = {int(s["cpu_capacity"]) for s in rows}
    memory: tuple[tuple[str, str], ...] = _HOST_MEMORY
    if len(caps) == 1:
        where = f"host capacity {caps.pop():,} tokens"
    else:
        where = "host capacity per policy"
        memory = (("host\ncapacity", "cpu_capacity"), *_HOST_MEMORY)
    out = []
    for title, cols in (
        (f"host tier: reuse, tokens ({where})", _HOST_REUSE),
        ("host tier: GPU and host memory, tokens", memory),
    ):
        t = plain_table(title)
        _policy_column(t)
        for label, _ in cols:
            t.add_column(label, justify="right", no_wrap=True)
        for s in rows:
            t.add_row(str(s["policy"]), *(_fmt(s.get(k)) for _, k in cols))
        out.append(t)
    return out


def _grid(
    capacities: Sequence[int],
    cpu_capacities: Sequence[int],
    summaries: Sequence[dict[str, Any]],
    policy: str,
    key: str,
) -> list[list[float]]:
    """``key`` of ``policy`` over the grid: rows GPU capacities, columns host capacities."""
    at = {
        (int(s["capacity"]), int(s.get("cpu_capacity", 0))): s
        for s in summaries
        if s["policy"] == policy
    }
    out = []
    for c in capacities:
        row = []
        for h in cpu_capacities:
            v = at[(c, h)].get(key)
            row.append(math.nan if v is None else float(v))
        out.append(row)
    return out


def _grid_policies(summaries: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(s["policy"]) for s in summaries))


def grid_tables(
    capacities: Sequence[int],
    cpu_capacities: Sequence[int],
    summaries: Sequence[dict[str, Any]],
    model: str,
) -> list[Table]:
    """One table per policy and figure over the GPU x host grid: the hit rate, and under
    the time model the TTFT p50 (rows: GPU capacity, columns: host capacity)."""
    figures = [("hit rate", "hit_rate")]
    if model == "time":
        figures.append(("TTFT p50 (s)", "ttft_p50"))
    out = []
    for pol in _grid_policies(summaries):
        for what, key in figures:
            t = plain_table(f"{pol}: {what}, GPU (rows) x host (columns) capacity, tokens")
            t.add_column("GPU \\ host", justify="right", no_wrap=True)
            for h in cpu_capacities:
                t.add_column(short_tokens(h) if h else "0", justify="right", no_wrap=True)
            grid = _grid(capacities, cpu_capacities, summaries, pol, key)
            for c, row in zip(capacities, grid, strict=True):
                cells = [_pct(v) if key == "hit_rate" else _fmt(v) for v in row]
                t.add_row(short_tokens(c), *cells)
            out.append(t)
    return out


def partial_reuse_table(title: str, summaries: Sequence[dict[str, Any]]) -> Table | None:
    """The TensorRT-LLM trie's partial-block reuse, for the policies that report it."""
    rows = [s for s in summaries if "partial_hits" in s]
    if not rows:
        return None
    t = plain_table(title)
    _policy_column(t)
    for label in ("partial\nhits", "partial\ntokens", "copies", "copied\ntokens"):
        t.add_column(label, justify="right", no_wrap=True)
    for s in rows:
        t.add_row(
            str(s["policy"]),
            *(
                _fmt(s.get(k))
                for k in ("partial_hits", "partial_tokens", "copies", "copied_tokens")
            ),
        )
    return t


def latency_table(title: str, summaries: Sequence[dict[str, Any]]) -> Table:
    """Time model: preemptions, recomputation and the estimated TTFT per policy."""
    t = plain_table(title)
    _policy_column(t)
    cols = [
        ("pre-\nempted", "preemptions"),
        ("recomputed\ntokens", "recomputed_tokens"),
        ("TTFT p50\n(s)", "ttft_p50"),
        ("p90\n(s)", "ttft_p90"),
        ("p99\n(s)", "ttft_p99"),
        ("makespan\n(s)", "makespan"),
    ]
    for label, _ in cols:
        t.add_column(label, justify="right", no_wrap=True)
    for s in summaries:
        t.add_row(str(s["policy"]), *(_fmt(s.get(key)) for _, key in cols))
    return t


def difference_table(title: str, diffs: Sequence[dict[str, Any]]) -> Table:
    """Per-request hit difference between pairs of policies: how many requests each side
    hits more, the total, min and max (the equal count and the mean are in --json)."""
    t = plain_table(title)
    _policy_column(t, "a - b")
    for label in ("a\nmore", "b\nmore", "total", "min", "max"):
        t.add_column(label, justify="right", no_wrap=True)
    for d in diffs:
        t.add_row(
            f"{d['a']} - {d['b']}",
            _fmt(d["a_more"]),
            _fmt(d["b_more"]),
            f"{d['total_diff']:+,}",
            f"{d['min_diff']:+,}",
            f"{d['max_diff']:+,}",
        )
    return t


def sweep_table(
    capacities: Sequence[int], rows: dict[str, list[float]], cpu_capacity: int = 0
) -> Table:
    """Hit rate per capacity (rows) and policy (columns; names wrap at their hyphens);
    the title names the host tier behind each capacity, if any."""
    host = f", host tier {short_tokens(cpu_capacity)} tokens" if cpu_capacity else ""
    t = plain_table(f"hit rate vs KV capacity{host}")
    t.add_column("capacity\n(tokens)", justify="right", no_wrap=True)
    for name in rows:
        t.add_column(name.replace("-", "-\n"), justify="right", no_wrap=True)
    for i, c in enumerate(capacities):
        t.add_row(f"{c:,}", *(_pct(rows[name][i]) for name in rows))
    return t


def short_tokens(n: int) -> str:
    """A token count as the CLI accepts it: 256k, 1.5M (decimal) or 256Ki, 1Mi (binary)
    when that is exact, else the plain number."""
    for units, base in (
        ((("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)), 10),
        ((("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)), 2),
    ):
        for suffix, size in units:
            if n >= size and (n * 10) % size == 0 and (base == 10 or n % size == 0):
                # Exact: at most one decimal, and never an exponent (format "g" keeps six
                # significant digits: 123,456,700 would read 123457k, 10**9 + 1000 1e+06k).
                tenths = n * 10 // size
                whole, frac = divmod(tenths, 10)
                return f"{whole}.{frac}{suffix}" if frac else f"{whole}{suffix}"
    return f"{n:,}"


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_DASHES = ("-", "--", "-.", ":")


def write_sweep_plot(
    path: str | Path, capacities: Sequence[int], rows: dict[str, list[float]], title: str
) -> None:
    """Hit rate vs KV capacity, one curve per policy (matplotlib, no display needed).
    Each curve has its own marker and line style, later curves are drawn thinner and
    hollow so that equal rates (radix under radix-page16) stay visible; the x ticks are
    the swept capacities."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    n = len(rows)
    for i, (name, rates) in enumerate(rows.items()):
        ax.plot(
            capacities,
            [100.0 * r for r in rates],
            label=name,
            marker=_MARKERS[i % len(_MARKERS)],
            linestyle=_DASHES[i % len(_DASHES)],
            linewidth=1.2 + 1.2 * (n - 1 - i) / max(n - 1, 1),
            markersize=5 + 4 * (n - 1 - i) / max(n - 1, 1),
            markerfacecolor="none" if i else None,
            zorder=2 + i,
        )
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(list(capacities)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(list(capacities), [short_tokens(c) for c in capacities])
    ax.set_xlabel("KV capacity (tokens)")
    ax.set_ylabel("prompt tokens hit (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_grid_plot(
    path: str | Path,
    capacities: Sequence[int],
    cpu_capacities: Sequence[int],
    summaries: Sequence[dict[str, Any]],
    title: str,
) -> None:
    """Heatmaps of the GPU x host grid, one row of panels per policy: the hit rate, and
    the TTFT p50 when the summaries have one (time model). Each cell is labelled with
    its value; rows are GPU capacities, columns host capacities."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    policies = _grid_policies(summaries)
    figures = [("hit rate (%)", "hit_rate", "viridis")]
    if any(s.get("ttft_p50") is not None for s in summaries):
        figures.append(("TTFT p50 (s)", "ttft_p50", "magma_r"))
    nrow, ncol = len(policies), len(figures)
    fig, axes = plt.subplots(
        nrow,
        ncol,
        # Each row of panels: its grid (at least as tall as the y label's two lines),
        # then its title, tick labels and x label.
        figsize=(
            1.0 + 0.9 * len(cpu_capacities) * ncol + 1.6 * ncol,
            0.6 + (max(0.6 * len(capacities), 1.0) + 0.9) * nrow,
        ),
        squeeze=False,
    )
    for i, pol in enumerate(policies):
        for j, (what, key, cmap) in enumerate(figures):
            ax = axes[i][j]
            grid = np.array(_grid(capacities, cpu_capacities, summaries, pol, key))
            if key == "hit_rate":
                grid = 100.0 * grid
            finite = grid[np.isfinite(grid)]
            norm = None
            if key != "hit_rate" and finite.size and 0 < 10 * finite.min() < finite.max():
                norm = LogNorm(finite.min(), finite.max())  # TTFTs over decades: log scale
            im = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto", origin="lower")
            fig.colorbar(im, ax=ax)
            ax.set_xticks(
                range(len(cpu_capacities)), [short_tokens(h) if h else "0" for h in cpu_capacities]
            )
            ax.set_yticks(range(len(capacities)), [short_tokens(c) for c in capacities])
            ax.set_xlabel("host capacity (tokens)")
            ax.set_ylabel("GPU capacity\n(tokens)")
            ax.set_title(f"{pol}: {what}", fontsize=10)
            for (r, c), v in np.ndenumerate(grid):
                if math.isfinite(v):
                    # white text on the dark end of the colour map
                    shade = im.norm(v)
                    dark = shade < 0.5 if cmap == "viridis" else shade > 0.5
                    ax.text(
                        c,
                        r,
                        f"{v:.1f}" if key == "hit_rate" else f"{v:.3g}",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if dark else "black",
                    )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    """Rows of flat dicts; the header is the union of keys in first-seen order (written by
    :func:`write_text`)."""
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    for r in rows:
        w.writerow({k: clean(v) for k, v in r.items()})
    write_text(path, f.getvalue())


# -- --records-csv -----------------------------------------------------------------------
_CSV_SPECIAL = frozenset(',"\r\n')


def _csv_value(v: Any) -> str:
    """One value as :func:`write_csv` writes it (cleaned, quoted where needed)."""
    if type(v) is str and _CSV_SPECIAL.isdisjoint(v):
        return v
    f = io.StringIO(newline="")
    csv.writer(f).writerow([clean(v), ""])  # a second field: an empty one is not quoted
    return f.getvalue()[: -len(",\r\n")]


def _csv_column(values: list[Any], json_text: list[str]) -> list[str]:
    """A record column as :func:`write_csv` writes it, from its JSON text where the two
    agree: ints, and finite floats (NaN and infinities: null in JSON, empty here)."""
    kinds = set(map(type, values))
    if kinds <= {int}:
        return json_text
    if kinds <= {float}:
        return ["" if t == "null" else t for t in json_text]
    if kinds <= {bool}:
        return ["True" if v else "False" for v in values]
    return [_csv_value(v) for v in values]


def record_csv_header(host_tier: bool) -> str:
    """The ``--records-csv`` header: the policy, then the record's fields."""
    return ",".join(("policy", *record_fields(host_tier))) + "\r\n"


def record_csv_rows(
    policy: str, records: RecordColumns, host_tier: bool, json_texts: dict[str, list[str]]
) -> str:
    """One replay's ``--records-csv`` rows (after the header), the text :func:`write_csv`
    writes for ``{"policy": policy, **r.to_dict(host_tier)}`` per record, made from the
    columns and their JSON text (:func:`prefixcache.sim.json_report.record_texts`)."""
    n = len(records)
    if not n:
        return ""
    names = record_fields(host_tier)
    columns = [[_csv_value(policy)] * n]
    columns += [_csv_column(records.column(k), json_texts[k]) for k in names]
    return "\r\n".join(map(",".join, zip(*columns, strict=True))) + "\r\n"


@contextmanager
def progress_bars(
    console: Console, enabled: bool = True, delay: float = 1.0
) -> Iterator[ProgressFactory | None]:
    """A factory of per-policy progress bars (rich, on ``console``), shown only once the
    work has run for ``delay`` seconds, so quick commands print nothing extra."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
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


_PERCENT_STATS = ("hit_rate_ceiling", "block_hit_rate_ceiling", "hash_id_repeat_share")


def trace_stats_table(title: str, stats: dict[str, Any]) -> Table:
    t = plain_table(title)
    t.add_column("statistic")
    t.add_column("value", justify="right")
    for k, v in stats.items():
        t.add_row(k, _pct(v) if k in _PERCENT_STATS else _fmt(v))
    return t
