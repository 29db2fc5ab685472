"""The ``prefixcache`` command: compare, replay, sweep, trace-stats.

See docs/SIMULATOR.md. Every number printed can also be written as JSON (``--json``) and
CSV (``--csv``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from prefixcache.errors import PrefixCacheError
from prefixcache.sim.fleet_cli import add_fleet_args, fleet_replay_command, fleet_sweep_command
from prefixcache.sim.policies import POLICY_NAMES
from prefixcache.sim.replay import ReplayResult, hit_difference, make_scheduler, replay, summarize
from prefixcache.sim.report import (
    comparison_table,
    difference_table,
    latency_table,
    progress_bars,
    sweep_table,
    trace_stats,
    trace_stats_table,
    write_csv,
    write_json,
    write_sweep_plot,
)
from prefixcache.sim.requests import Request
from prefixcache.sim.scheduler import PrefillCost
from prefixcache.sim.traces import Trace, read_trace
from prefixcache.sim.workloads import STUDY_WORKLOADS, study_workload

__all__ = ["main"]


def _capacity(text: str) -> int:
    t = text.strip().lower().replace("_", "")
    mult = 1
    if t and t[-1] in "km":
        mult = 1024 if t[-1] == "k" else 1024 * 1024
        t = t[:-1]
    try:
        v = int(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad capacity {text!r}: an integer number of tokens (suffix k or M allowed)"
        ) from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"capacity must be >= 0, got {text!r}")
    return v


def _jobs(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be an integer >= 1, got {text!r}")
    return v


def _capacities(text: str) -> list[int]:
    return [_capacity(x) for x in text.split(",") if x.strip()]


def _policies(values: Sequence[str]) -> list[str]:
    out = [p.strip() for v in values for p in v.split(",") if p.strip()]
    return out or list(POLICY_NAMES)


def _add_common(p: argparse.ArgumentParser, *, capacity: bool = True) -> None:
    p.add_argument("--policies", nargs="+", default=[], metavar="NAME",
                   help="policies, space or comma separated: radix, radix-page<N>, "
                   "vllm-blocks, vllm-blocks<N>, trtllm[<N>], trtllm-nopartial[<N>] "
                   "(default: {})".format(", ".join(POLICY_NAMES)))
    if capacity:
        p.add_argument("--capacity", type=_capacity, default=None,
                       help="KV budget in tokens, the same for every policy "
                       "(default: the workload's own; traces: unlimited)")
    p.add_argument("--eviction", default="lru",
                   help="radix eviction policy: lru, lfu, fifo, mru, filo, priority, slru")
    p.add_argument("--hash-algo", default="sha256",
                   help="vLLM block hash: sha256, sha256_cbor, xxhash, xxhash_cbor")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")
    p.add_argument("--csv", metavar="PATH", help="write the summary rows as CSV")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_model(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scheduler")
    g.add_argument("--model", choices=("slots", "time"), default="slots",
                   help="slots: the A-F study's model; time: continuous batching on a clock")
    g.add_argument("--max-running", type=int, default=None,
                   help="requests holding KV at once (default 8 slots, 256 time)")
    g.add_argument("--no-preemption", action="store_true",
                   help="time model: reserve each request's output KV at admission "
                   "instead of preempting when KV runs out mid-decode")
    d = PrefillCost()
    g.add_argument("--prefill-base-ms", type=float, default=d.base_ms)
    g.add_argument("--prefill-ms-per-token", type=float, default=d.per_token_ms,
                   help="prefill time per uncached token")
    g.add_argument("--prefill-attention-ms", type=float, default=d.attention_ms,
                   help="quadratic attention term: ms per (query, key) pair")
    g.add_argument("--decode-step-ms", type=float, default=d.decode_step_ms)


def _add_jobs(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                   help=f"worker processes running {what} in parallel, one process per "
                   "replay (default: the number of cores; 1 runs them one after the other "
                   "in this process)")


def _add_trace(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="a trace file (Mooncake or token JSONL), or workload:A..F")
    p.add_argument("--format", choices=("auto", "mooncake", "tokens"), default="auto")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip malformed lines (counted) instead of stopping at the first")
    p.add_argument("--seed", type=int, default=0, help="seed of a built-in workload")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="prefixcache",
        description="Replay the same requests through several engines' prefix caches and "
        "compare the prefill tokens they save.",
    )
    sub = ap.add_subparsers(dest="command")

    c = sub.add_parser("compare", help="the A-F study table on built-in workloads A-F")
    c.add_argument("--workload", default="all",
                   help="A..F, a comma list, or all (default)")
    c.add_argument("--seed", type=int, default=0)
    _add_common(c)
    _add_model(c)

    r = sub.add_parser("replay", help="replay a trace through the policies")
    _add_trace(r)
    _add_common(r)
    _add_model(r)
    r.add_argument("--records-csv", metavar="PATH", help="write one row per request and policy")
    _add_jobs(r, "policies")
    add_fleet_args(r)

    s = sub.add_parser("sweep", help="hit rate vs KV capacity, one curve per policy")
    _add_trace(s)
    s.add_argument("--capacities", type=_capacities, required=True,
                   help="comma separated token budgets, e.g. 64k,256k,1M")
    s.add_argument("--plot", metavar="PNG", help="write the plot (matplotlib)")
    _add_jobs(s, "capacities and policies")
    _add_common(s, capacity=False)
    _add_model(s)
    add_fleet_args(s, sweep=True)

    t = sub.add_parser("trace-stats", help="sizes and prefix sharing of a trace")
    _add_trace(t)
    t.add_argument("--block-size", type=int, default=None,
                   help="block size of the reuse ceiling (default 512 Mooncake, 16 else)")
    t.add_argument("--json", metavar="PATH")
    t.add_argument("--csv", metavar="PATH")
    return ap


def _load(args: argparse.Namespace, console: Console) -> tuple[str, Trace]:
    spec: str = args.trace
    if spec.startswith("workload:"):
        w = study_workload(spec.split(":", 1)[1], args.seed)
        if getattr(args, "capacity", None) is None and "capacity" in args:
            args.capacity = w.capacity  # a built-in workload runs at its own budget
        return f"workload {w.name}", Trace(spec, "workload", list(w.requests))
    tr = read_trace(spec, fmt=args.format, skip_bad_lines=args.skip_bad_lines)
    if tr.skipped:
        console.print(f"[yellow]skipped {tr.skipped} malformed line(s) of {spec}: lines "
                      f"{', '.join(map(str, tr.skipped_lines[:10]))}"
                      f"{' ...' if tr.skipped > 10 else ''}[/yellow]")
    return spec, tr


def _scheduler(args: argparse.Namespace) -> Any:
    cost = PrefillCost(args.prefill_base_ms, args.prefill_ms_per_token,
                       args.prefill_attention_ms, args.decode_step_ms)
    return make_scheduler(args.model, max_running=args.max_running, cost=cost,
                          preemption=not args.no_preemption)


def _run(args: argparse.Namespace, requests: Sequence[Request], capacity: int | None,
         console: Console, err: Console) -> list[ReplayResult]:
    with progress_bars(err, enabled=not args.quiet) as bars:
        return replay(requests, _policies(args.policies), capacity,
                      scheduler=_scheduler(args), eviction_policy=args.eviction,
                      hash_algo=args.hash_algo, progress=bars)


def _spec(args: argparse.Namespace) -> Any:
    from prefixcache.sim.sweep import SweepSpec

    return SweepSpec(
        trace=args.trace, fmt=args.format, skip_bad_lines=args.skip_bad_lines, seed=args.seed,
        policies=_policies(args.policies), eviction_policy=args.eviction,
        hash_algo=args.hash_algo, model=args.model, max_running=args.max_running,
        cost=PrefillCost(args.prefill_base_ms, args.prefill_ms_per_token,
                         args.prefill_attention_ms, args.decode_step_ms),
        preemption=not args.no_preemption,
    )


def _sweep_runs(args: argparse.Namespace, requests: Sequence[Request], caps: Sequence[int],
                err: Console) -> list[dict[str, Any]]:
    """Every (capacity, policy) of the sweep, in that order, as summaries."""
    from prefixcache.sim.sweep import run_sweep

    with progress_bars(err, enabled=not args.quiet) as bars:
        return run_sweep(_spec(args), requests, caps, jobs=args.jobs, progress=bars)


def _replay_runs(args: argparse.Namespace, requests: Sequence[Request],
                 err: Console) -> list[ReplayResult]:
    """Every policy at ``args.capacity``, in worker processes unless ``--jobs 1``."""
    from prefixcache.sim.sweep import run_pairs

    pairs = [(args.capacity, p) for p in _policies(args.policies)]
    with progress_bars(err, enabled=not args.quiet) as bars:
        return run_pairs(_spec(args), requests, pairs, jobs=args.jobs, progress=bars)


def _diffs(results: Sequence[ReplayResult]) -> list[dict[str, Any]]:
    return [hit_difference(results[i], results[j])
            for i in range(len(results)) for j in range(i + 1, len(results))]


def cmd_compare(args: argparse.Namespace, console: Console, err: Console) -> int:
    names = list(STUDY_WORKLOADS) if args.workload.lower() == "all" else [
        w.strip().upper() for w in args.workload.split(",") if w.strip()]
    out: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for name in names:
        w = study_workload(name, args.seed)
        cap = args.capacity if args.capacity is not None else w.capacity
        results = _run(args, w.requests, cap, console, err)
        sums = [summarize(r) for r in results]
        diffs = _diffs(results)
        cap_text = "unlimited" if cap is None else f"{cap:,} tokens"
        console.print(comparison_table(
            f"workload {w.name}: {w.description} (KV {cap_text}, model {args.model})", sums))
        if args.model == "time":
            console.print(latency_table(f"workload {w.name}: time model", sums))
        if diffs:
            console.print(difference_table(f"workload {w.name}: per-request hit tokens, a - b",
                                           diffs))
        out.append({"workload": w.name, "description": w.description,
                    "capacity": sums[0]["capacity"], "summaries": sums, "differences": diffs})
        rows += [{"workload": w.name, **s} for s in sums]
    if args.json:
        write_json(args.json, {"command": "compare", "seed": args.seed, "workloads": out})
    if args.csv:
        write_csv(args.csv, rows)
    return 0


def cmd_replay(args: argparse.Namespace, console: Console, err: Console) -> int:
    label, tr = _load(args, console)
    if args.instances is not None:
        return fleet_replay_command(args, label, tr, console, err)
    reqs = tr.requests
    results = _replay_runs(args, reqs, err)
    sums = [summarize(r) for r in results]
    diffs = _diffs(results)
    cap_text = "unlimited" if args.capacity is None else f"{args.capacity:,} tokens"
    console.print(comparison_table(f"{label}: {len(reqs):,} requests (KV {cap_text}, "
                                   f"model {args.model})", sums))
    if args.model == "time":
        console.print(latency_table("time model", sums))
    if diffs:
        console.print(difference_table("per-request hit tokens, a - b", diffs))
    if args.json:
        write_json(args.json, {
            "command": "replay", "trace": label, "skipped_lines": tr.skipped,
            "summaries": sums, "differences": diffs,
            "records": {r.policy: [x.to_dict() for x in r.records] for r in results},
        })
    if args.csv:
        write_csv(args.csv, sums)
    if args.records_csv:
        write_csv(args.records_csv,
                  [{"policy": r.policy, **x.to_dict()} for r in results for x in r.records])
    return 0


def cmd_sweep(args: argparse.Namespace, console: Console, err: Console) -> int:
    label, tr = _load(args, console)
    if args.instances is not None:
        return fleet_sweep_command(args, label, tr, console, err)
    reqs = tr.requests
    caps: list[int] = args.capacities
    if not caps:
        raise PrefixCacheError("--capacities is empty")
    rates: dict[str, list[float]] = {}
    all_sums = _sweep_runs(args, reqs, caps, err)
    for s in all_sums:
        rates.setdefault(s["policy"], []).append(float(s["hit_rate"]))
    console.print(sweep_table(caps, rates))
    if args.plot:
        write_sweep_plot(args.plot, caps, rates,
                         f"{Path(label).name} ({len(reqs):,} requests, model {args.model})")
        console.print(f"plot written to {args.plot}")
    if args.json:
        write_json(args.json, {"command": "sweep", "trace": label, "capacities": caps,
                               "hit_rate": rates, "summaries": all_sums})
    if args.csv:
        write_csv(args.csv, all_sums)
    return 0


def cmd_trace_stats(args: argparse.Namespace, console: Console, err: Console) -> int:
    label, tr = _load(args, console)
    bs = args.block_size or (512 if tr.format == "mooncake" else 16)
    st = {"skipped_lines": tr.skipped, **trace_stats(tr.requests, bs, tr.hash_ids)}
    console.print(trace_stats_table(f"{label} ({tr.format})", st))
    if args.json:
        write_json(args.json, {"command": "trace-stats", "trace": label, **st})
    if args.csv:
        write_csv(args.csv, [{"trace": label, **st}])
    return 0


COMMANDS = {"compare": cmd_compare, "replay": cmd_replay, "sweep": cmd_sweep,
            "trace-stats": cmd_trace_stats}


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["compare", *argv]  # the default command
    args = ap.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 120)
    err = Console(stderr=True)
    try:
        return COMMANDS[args.command](args, console, err)
    except (PrefixCacheError, OSError) as e:
        err.print(f"[red]error:[/red] {e}")
        return 2
    except KeyboardInterrupt:
        # Files are written only once everything ran: nothing partial was left behind.
        err.print(f"interrupted: {args.command} stopped, no output files written")
        return 130


if __name__ == "__main__":
    sys.exit(main())
