"""The atlas: reference curves of hit rate against KV budget (``prefixcache atlas``).

For every trace in a folder (``*.jsonl``; the folder is the command's argument or the
``PREFIXCACHE_TRACES`` environment variable) and every built-in workload A-F, it replays
the engine rules, the lab policies and the offline optimum ``opt`` at a range of budgets
under the request-sequence model (and, at the goal budget, the time model for traces and
the slot model for workloads), and writes ``docs/ATLAS.md`` with one table and one PNG
curve per source and model, the share of the LRU -> OPT gap each policy closes, and
``docs/atlas/atlas.json`` with every number. One command regenerates all of it:

    prefixcache atlas TRACE_DIR            # or PREFIXCACHE_TRACES=DIR prefixcache atlas
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixcache.errors import InvalidInputError
from prefixcache.sim.gap import gap_rows
from prefixcache.sim.output_files import check_writable, write_text
from prefixcache.sim.replay import make_scheduler, replay, summarize
from prefixcache.sim.requests import Request
from prefixcache.sim.traces import read_trace
from prefixcache.sim.workloads import STUDY_WORKLOADS, study_workload

__all__ = ["AtlasConfig", "run_atlas"]

K = 1024
M = 1024 * 1024

LAB_POLICIES = [
    "lab-lru",
    "lab-2q",
    "lab-lru-admit2",
    "lab-cost-admit2",
    "lab-density-admit2",
    "lab-slru",
    "opt",
]


@dataclass
class AtlasConfig:
    trace_policies: list[str] = field(default_factory=lambda: ["vllm-blocks", *LAB_POLICIES])
    trace_capacities: list[int] = field(default_factory=lambda: [1 * M, 3 * M, 25 * M])
    time_policies: list[str] = field(
        default_factory=lambda: [
            "vllm-blocks",
            "lab-lru",
            "lab-2q",
            "lab-lru-admit2",
            "lab-cost-admit2",
            "opt",
        ]
    )
    goal_capacity: int = 3 * M
    trace_models: list[str] = field(default_factory=lambda: ["sequence", "time"])
    workload_policies: list[str] = field(
        default_factory=lambda: [
            "radix",
            "radix-page16",
            "vllm-blocks",
            "trtllm",
            "tree-trim",
            *LAB_POLICIES,
        ]
    )
    workload_capacities: list[int] = field(default_factory=lambda: [8 * K, 16 * K, 24 * K, 32 * K])
    workload_models: list[str] = field(default_factory=lambda: ["sequence", "slots"])


@dataclass
class Panel:
    source: str
    model: str
    capacities: list[int]
    summaries: list[list[dict[str, Any]]]  # per capacity, per policy

    def rates(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for sums in self.summaries:
            for s in sums:
                out.setdefault(s["policy"], []).append(float(s["hit_rate"]))
        return out


def _cap(c: int) -> str:
    """A budget as the command line reads it back: binary suffixes (``3Mi`` = 3 * 2**20)."""
    if c % M == 0:
        return f"{c // M}Mi"
    if c % K == 0:
        return f"{c // K}Ki"
    return f"{c:,}"


def _run_panel(
    source: str,
    requests: Sequence[Request],
    model: str,
    policies: list[str],
    capacities: list[int],
    log: Callable[[str], None],
) -> Panel:
    sums = []
    for cap in capacities:
        t0 = time.perf_counter()
        res = replay(requests, policies, cap, scheduler=make_scheduler(model))
        sums.append([summarize(r) for r in res])
        log(f"{source} / {model} / {_cap(cap)}: {time.perf_counter() - t0:.1f} s")
    return Panel(source, model, capacities, sums)


def _plot(panel: Panel, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, rates in panel.rates().items():
        style: dict[str, Any] = {"color": "black", "linewidth": 2.5} if name == "opt" else {}
        ls = "--" if not name.startswith(("lab-", "opt", "tree-")) else "-"
        ax.plot(
            panel.capacities,
            [100 * r for r in rates],
            marker="o",
            linestyle=ls,
            label=name,
            **style,
        )
    ax.set_xscale("log")
    ax.set_xlabel("KV budget (tokens)")
    ax.set_ylabel("prompt tokens hit (%)")
    ax.set_title(f"{panel.source}, model {panel.model}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def _panel_md(panel: Panel, img: str) -> list[str]:
    rates = panel.rates()
    caps = panel.capacities
    lines = [
        f"### {panel.source} - model `{panel.model}`",
        "",
        f"![{panel.source}]({img})",
        "",
        "| policy | " + " | ".join(_cap(c) for c in caps) + " |",
        "|---|" + "---:|" * len(caps),
    ]
    for name, rs in rates.items():
        lines.append(f"| {name} | " + " | ".join(f"{100 * r:.2f}%" for r in rs) + " |")
    lines.append("")
    gl = ["| policy | " + " | ".join(_cap(c) for c in caps) + " |", "|---|" + "---:|" * len(caps)]
    per_cap = [{g["policy"]: g for g in gap_rows(s)} for s in panel.summaries]
    if any(not math.isnan(g["gap_closed"]) for pc in per_cap for g in pc.values()):
        base = next((g["lru"] for pc in per_cap for g in pc.values()), None)
        lines.append(f"Share of the LRU -> OPT gap closed (LRU = `{base}`):")
        lines.append("")
        for name in rates:
            cells = []
            for pc in per_cap:
                g = pc.get(name)
                v = math.nan if g is None else g["gap_closed"]
                cells.append("-" if math.isnan(v) else f"{100 * v:+.1f}%")
            gl.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += gl
        lines.append("")
    return lines


def _goal_md(panels: list[Panel], goal: int) -> list[str]:
    rows = [
        "| trace | model | LRU | OPT | best online policy | its hit rate | gap closed |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for p in panels:
        if goal not in p.capacities:
            continue
        gaps = gap_rows(p.summaries[p.capacities.index(goal)])
        online = [
            g for g in gaps if not g["policy"].startswith("opt") and not math.isnan(g["gap_closed"])
        ]
        if not online:
            continue
        best = max(online, key=lambda g: g["gap_closed"])
        rows.append(
            f"| {p.source} | {p.model} | {100 * best['lru_hit_rate']:.2f}% "
            f"| {100 * best['opt_hit_rate']:.2f}% | `{best['policy']}` "
            f"| {100 * best['hit_rate']:.2f}% | {100 * best['gap_closed']:+.1f}% |"
        )
    return rows


def run_atlas(
    trace_dir: str | Path | None,
    out: str | Path = "docs/ATLAS.md",
    config: AtlasConfig | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> Path:
    """Replay everything and write the atlas (see the module docstring)."""
    cfg = config or AtlasConfig()
    folder = trace_dir or os.environ.get("PREFIXCACHE_TRACES")
    traces: list[Path] = []
    if folder:
        d = Path(folder)
        if not d.is_dir():
            what = "is not a folder" if d.exists() else "does not exist"
            raise InvalidInputError(f"trace folder {str(d)!r} {what}")
        traces = sorted(d.glob("*.jsonl"))
    out = Path(out)
    _check_out(out)
    t_start = time.perf_counter()
    trace_panels: list[Panel] = []
    wl_panels: list[Panel] = []
    for tp in traces:
        reqs = read_trace(tp).requests
        for model in cfg.trace_models:
            seq = model == "sequence"
            caps = cfg.trace_capacities if seq else [cfg.goal_capacity]
            pols = cfg.trace_policies if seq else cfg.time_policies
            trace_panels.append(_run_panel(tp.name, reqs, model, pols, caps, log))
    for name in STUDY_WORKLOADS:
        w = study_workload(name, 0)
        for model in cfg.workload_models:
            wl_panels.append(
                _run_panel(
                    f"workload {name}",
                    w.requests,
                    model,
                    cfg.workload_policies,
                    cfg.workload_capacities,
                    log,
                )
            )
    # Once everything ran (an interrupted run leaves the last report as it was).
    _write(out, traces, trace_panels, wl_panels, cfg, time.perf_counter() - t_start)
    return out


def _check_out(out: Path) -> None:
    """Fail before the run on a report, or an ``atlas/`` folder beside it, that cannot
    be written."""
    img_dir = out.parent / "atlas"
    try:
        if out.is_dir():
            raise IsADirectoryError(f"{out}: is a directory")
        img_dir.mkdir(parents=True, exist_ok=True)
        check_writable(out)
        check_writable(img_dir / "atlas.json")
    except OSError as e:
        raise InvalidInputError(f"atlas report: {e}") from None


def _write(
    out: Path,
    traces: list[Path],
    trace_panels: list[Panel],
    wl_panels: list[Panel],
    cfg: AtlasConfig,
    elapsed: float,
) -> None:
    from prefixcache.sim.json_report import write_json

    md = [
        "# Atlas: hit rate against KV budget",
        "",
        "Generated by `prefixcache atlas DIR` (python/prefixcache/sim/atlas.py); do not "
        "edit by hand. Policies: engine rules (`radix`, `radix-page16`, `vllm-blocks`, "
        "`trtllm`) and the lab's (docs/LAB.md), all at the same KV budget in tokens; "
        "`opt` is the offline optimum among prefix-closed caches under the sequence "
        "model; under the slot and time models it is a strong reference, not a bound "
        "(docs/LAB.md). Budgets are in "
        "binary units, as the command line reads them (`3Mi` = 3 x 2^20 tokens). Models: "
        "docs/SIMULATOR.md and docs/LAB.md. Every number is in "
        "[atlas/atlas.json](atlas/atlas.json).",
        "",
        f"Traces: {', '.join(t.name for t in traces) or 'none given'}; workloads A-F "
        f"(seed 0). Run time {elapsed / 60:.1f} min on {platform.machine()} "
        f"({os.cpu_count()} cores, shared).",
        "",
    ]
    if trace_panels:
        md += [
            f"## The goal budget: {_cap(cfg.goal_capacity)} tokens",
            "",
            *_goal_md(trace_panels, cfg.goal_capacity),
            "",
        ]
    md += ["## Traces", ""]
    blobs: list[dict[str, Any]] = []
    # The curves are drawn under temporary names first, and every file is put in place
    # only once all are drawn.
    drawn: list[tuple[Path, Path]] = []
    try:
        for i, p in enumerate(trace_panels + wl_panels):
            if i == len(trace_panels):
                md += ["## Built-in workloads", ""]
            img = f"atlas/{p.source.replace(' ', '_').replace('.jsonl', '')}_{p.model}.png"
            final = out.parent / img
            tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
            drawn.append((tmp, final))
            _plot(p, tmp)
            md += _panel_md(p, img)
            blobs.append(
                {
                    "source": p.source,
                    "model": p.model,
                    "capacities": p.capacities,
                    "summaries": p.summaries,
                }
            )
        write_text(out, "\n".join(md) + "\n")
        write_json(out.parent / "atlas" / "atlas.json", {"panels": blobs})
        for tmp, final in drawn:
            os.replace(tmp, final)
    finally:
        for tmp, _ in drawn:
            with contextlib.suppress(OSError):
                tmp.unlink()
