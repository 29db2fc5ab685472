"""How far each policy is from the offline optimum: the share of the LRU -> OPT gap it
closes (docs/LAB.md).

For a run that includes ``opt`` (or ``opt@N``), every policy's hit rate is shown next to
opt's, and ``gap closed = (hit rate - LRU's) / (opt's - LRU's)``: 0 is no better than
recency, 1 is the optimum, negative is worse than recency. LRU is the lab's LRU at opt's
block size (``lab-lru`` / ``lab-lru@N``) when the run has it, else ``vllm-blocks`` (vLLM's
LRU free queue), else ``radix``.

Hit rates are over the prompt tokens of the requests a policy served, so two rates
compare only when the policies served the same requests (in the sequence model the lab
policies serve a prompt larger than the budget, the engine policies reject it). A
request is rejected when it never fits, even alone, which depends on its size alone, so
two policies that rejected as many requests rejected the same ones. The gap closed is
given only for a policy that rejected as many requests as opt (and with a baseline that
did too); otherwise it is NaN (shown as ``-``) and the row's ``rejected`` says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.table import Table

__all__ = ["gap_rows", "gap_table"]


def _baseline(names: set[str], opt: str) -> str | None:
    suffix = opt[len("opt") :]
    for cand in (f"lab-lru{suffix}", "vllm-blocks", "radix"):
        if cand in names:
            return cand
    return None


def gap_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy: hit rate, opt's, LRU's, and the share of the gap closed.
    Empty when the run has no ``opt``."""
    rates = {s["policy"]: float(s["hit_rate"]) for s in summaries}
    rejected = {s["policy"]: int(s.get("rejected", 0)) for s in summaries}
    opts = [n for n in rates if n == "opt" or n.startswith("opt@")]
    if not opts:
        return []
    opt = opts[0]
    same = {n for n in rates if rejected[n] == rejected[opt]}  # the requests opt served
    base = _baseline(same, opt)
    o = rates[opt]
    lru = rates[base] if base is not None else math.nan
    rows = []
    for name, r in rates.items():
        span = o - lru
        comparable = base is not None and span > 0 and name in same
        closed = (r - lru) / span if comparable else math.nan
        rows.append(
            {
                "policy": name,
                "hit_rate": r,
                "rejected": rejected[name],
                "opt": opt,
                "opt_hit_rate": o,
                "lru": base,
                "lru_hit_rate": lru,
                "gap_closed": closed,
            }
        )
    return rows


def gap_table(title: str, rows: Sequence[dict[str, Any]]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    opt_rejected = next((r.get("rejected", 0) for r in rows if r["policy"] == r["opt"]), 0)
    for c in ("policy", "hit rate", "opt", "LRU", "gap closed"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    for r in rows:
        closed = r["gap_closed"]
        differs = r.get("rejected", 0) != opt_rejected
        t.add_row(
            r["policy"] + (f" ({r['rejected']:,} rejected)" if differs else ""),
            f"{100 * r['hit_rate']:.2f}%",
            f"{100 * r['opt_hit_rate']:.2f}%",
            "-" if r["lru"] is None else f"{100 * r['lru_hit_rate']:.2f}% ({r['lru']})",
            "-" if math.isnan(closed) else f"{100 * closed:+.1f}%",
        )
    return t
