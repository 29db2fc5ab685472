"""The GPU x host capacity tables of docs/SIMULATOR.md ("Offload"): runs the grid on the
Mooncake conversation and synthetic traces for vllm-blocks and radix under the time model
and prints markdown tables of the hit rate and the TTFT p50 / p99 (rows: GPU capacity,
columns: host capacity; 0 = no host tier).

    python tools/offload_tables.py mooncake_conversation.jsonl mooncake_synthetic.jsonl \\
        [--capacities 1M,4M,16M] [--cpu-capacities 0,4M,16M,64M] [--policies vllm-blocks,radix]
        [--jobs N] [--json out.json]

Each cell is one replay, the one ``prefixcache replay TRACE --model time --capacity C
--cpu-capacity H --policies P`` runs; all of them run in worker processes (``--jobs``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixcache.sim.cli import parse_capacity
from prefixcache.sim.json_report import write_json
from prefixcache.sim.report import short_tokens
from prefixcache.sim.sweep import SweepSpec, load_requests, run_grid

POLICIES = "vllm-blocks,radix"


def _caps(text: str, zero: bool) -> list[int]:
    out = []
    for x in text.split(","):
        x = x.strip()
        if x:
            out.append(0 if zero and x == "0" else parse_capacity(x))
    return out


def _cell(s: dict[str, Any], key: str) -> str:
    v = s.get(key)
    if v is None:
        return "-"
    if key == "hit_rate":
        return f"{100.0 * float(v):.2f}%"
    return f"{float(v):.3g}"


def markdown_tables(
    name: str,
    policies: Sequence[str],
    capacities: Sequence[int],
    cpu_capacities: Sequence[int],
    sums: Sequence[dict[str, Any]],
) -> str:
    """Per policy: a hit-rate table and a TTFT p50 / p99 table, GPU rows x host columns."""
    at = {(s["policy"], s["capacity"], s["cpu_capacity"]): s for s in sums}
    head = "| GPU \\ host | " + " | ".join(short_tokens(h) if h else "0" for h in cpu_capacities)
    rule = "|---|" + "---:|" * len(cpu_capacities)
    out = [f"#### {name}", ""]
    for pol in policies:
        for title, cell in (
            ("hit rate", lambda s: _cell(s, "hit_rate")),
            (
                "TTFT p50 / p99 (s)",
                lambda s: f"{_cell(s, 'ttft_p50')} / {_cell(s, 'ttft_p99')}",
            ),
        ):
            out += [f"{pol}: {title}", "", head + " |", rule]
            for c in capacities:
                row = [cell(at[(pol, c, h)]) for h in cpu_capacities]
                out.append(f"| {short_tokens(c)} | " + " | ".join(row) + " |")
            out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("conversation", help="mooncake_conversation.jsonl")
    ap.add_argument("synthetic", help="mooncake_synthetic.jsonl")
    ap.add_argument("--capacities", default="1M,4M,16M", help="GPU KV capacities, tokens")
    ap.add_argument(
        "--cpu-capacities", default="0,4M,16M,64M", help="host tier capacities, tokens (0: none)"
    )
    ap.add_argument("--policies", default=POLICIES, help=f"comma separated (default {POLICIES})")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    ap.add_argument("--json", default=None, help="also write every summary as JSON")
    args = ap.parse_args(argv)
    caps = _caps(args.capacities, zero=False)
    cpus = _caps(args.cpu_capacities, zero=True)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    everything: dict[str, Any] = {"capacities": caps, "cpu_capacities": cpus, "traces": {}}
    for path in (args.conversation, args.synthetic):
        spec = SweepSpec(trace=path, policies=policies, model="time")
        reqs = load_requests(spec)
        t0 = time.perf_counter()
        sums = run_grid(spec, reqs, caps, cpus, jobs=args.jobs)
        print(
            f"{Path(path).name}: {len(sums)} replays in {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
        print(markdown_tables(Path(path).stem, policies, caps, cpus, sums))
        everything["traces"][Path(path).name] = sums
    if args.json:
        write_json(args.json, everything)
    return 0


if __name__ == "__main__":
    sys.exit(main())
