"""How far each policy is from the offline optimum: the share of the LRU -> OPT gap it
closes (docs/LAB.md).

For a run that includes ``opt`` (or ``opt@N``), every policy's hit rate is shown next to
opt's, and ``gap closed = (hit rate - LRU's) / (opt's - LRU's)``: 0 is no better than
recency, 1 is the optimum, negative is worse than recency. LRU is the lab's LRU at opt's
block size (``lab-lru`` / ``lab-lru@N``) when the run has it, else vLLM's LRU free queue
at that block size (``vllm-blocks<N>``), else ``vllm-blocks``, else ``radix`` when its
eviction rule (``--eviction``) is LRU. Names are matched by what they mean, not how they
are spelled: ``opt``, ``opt@16`` and ``lab-opt`` are the same optimum, ``lab-lru``,
``lab-lru@16`` the same LRU (``tree-trim`` is ``lab-lru@1``), ``vllm-blocks16`` is
``vllm-blocks``; an admission filter (``-admit<k>``) makes another policy.

Hit rates are over the prompt tokens of the requests a policy served, so two rates
compare only when the policies served the same requests (in the sequence model the lab
policies serve a prompt larger than the budget, the engine policies reject it). A
request is rejected when it never fits, even alone, which depends on its size alone, so
two policies that rejected as many requests rejected the same ones. The gap closed is
given only for a policy that rejected as many requests as opt (and with a baseline that
did too); otherwise it is NaN (shown as ``-``) and the row's ``rejected`` says why. It is
NaN in every row too when opt is not ahead of the LRU: no gap to close (a budget that
holds every reuse, where the two tie; or the slot and time models, where opt is no bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies import offload_family, policy_block_size
from prefixcache.sim.policies.lab import parse_lab_name
from prefixcache.sim.report import plain_table

__all__ = ["gap_rows", "gap_table"]


def _lab(name: str, rule: str) -> int | None:
    """The block size of ``name`` when it is the lab's ``rule`` without an admission
    filter, else None."""
    try:
        spec = parse_lab_name(name)
    except InvalidInputError:
        return None
    if spec is None or spec["rule"] != rule or spec["admit_after"] != 1:
        return None
    return int(spec["block_size"])


def _baseline(names: Sequence[str], block: int, eviction: str) -> str | None:
    tiers = (
        [n for n in names if _lab(n, "lru") == block],
        [n for n in names if offload_family(n) == "vllm-blocks" and policy_block_size(n) == block],
        [n for n in names if n in ("vllm-blocks", "vllm-blocks16")],
        [n for n in names if n == "radix" and eviction == "lru"],
    )
    return next((found[0] for found in tiers if found), None)


def gap_rows(summaries: Sequence[dict[str, Any]], eviction: str = "lru") -> list[dict[str, Any]]:
    """One row per policy: hit rate, opt's, LRU's, and the share of the gap closed.
    Empty when the run has no ``opt``. ``eviction`` is the radix policies' rule
    (``--eviction``): ``radix`` is a baseline only when it is ``lru``."""
    rates = {s["policy"]: float(s["hit_rate"]) for s in summaries}
    rejected = {s["policy"]: int(s.get("rejected", 0)) for s in summaries}
    opts = [n for n in rates if _lab(n, "opt") is not None]
    if not opts:
        return []
    opt = opts[0]
    same = [n for n in rates if rejected[n] == rejected[opt]]  # the requests opt served
    base = _baseline(same, _lab(opt, "opt") or 16, eviction)
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
    t = plain_table(title)
    opt_rejected = next((r.get("rejected", 0) for r in rows if r["policy"] == r["opt"]), 0)
    for c in ("policy", "hit rate", "opt", "LRU", "gap closed"):
        t.add_column(c, justify="left" if c == "policy" else "right", no_wrap=True)
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
