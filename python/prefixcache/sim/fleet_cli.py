"""``prefixcache replay --instances N`` and ``prefixcache sweep --instances 1,2,4``: the
fleet replay on the command line (docs/FLEET_REPLAY.md). ``cli.py`` adds these options and
hands over when ``--instances`` is given."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefixcache.errors import InvalidInputError
from prefixcache.sim.fleet import fleet_replay, summarize_fleet
from prefixcache.sim.json_report import write_json
from prefixcache.sim.policies.lab import parse_lab_name
from prefixcache.sim.report import plain_table, progress_bars, short_tokens, write_csv
from prefixcache.sim.routers import ROUTER_NAMES
from prefixcache.sim.scheduler import PrefillCost, TimeScheduler
from prefixcache.sim.traces import Trace

__all__ = ["add_fleet_args", "fleet_policy", "fleet_replay_command", "fleet_sweep_command"]


def _instances_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad instance count {text!r}: integers separated by commas"
        ) from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"instance counts must be >= 1, got {text!r}")
    return out


def add_fleet_args(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    g = p.add_argument_group("fleet (several instances behind a router; time model)")
    if sweep:
        g.add_argument(
            "--instances",
            type=_instances_list,
            default=None,
            metavar="N,N,..",
            help="sweep the fleet size (--capacities are then per instance)",
        )
    else:
        g.add_argument(
            "--instances",
            type=_instances_list,
            default=None,
            metavar="N",
            help="replay on N instances of the policy, --capacity each",
        )
    g.add_argument(
        "--router",
        default="round-robin",
        help=f"{', '.join(ROUTER_NAMES)}, or sticky-<router> (session "
        "affinity); comma separated to compare several",
    )
    g.add_argument(
        "--event-delay",
        type=float,
        default=0.0,
        metavar="MS",
        help="cache-aware routers: the KV events reach the index MS late",
    )
    g.add_argument(
        "--event-loss",
        type=float,
        default=0.0,
        metavar="P",
        help="cache-aware routers: each event batch is lost with probability P",
    )
    g.add_argument(
        "--overlap-weight",
        type=float,
        default=1.0,
        metavar="W",
        help="cache-aware cost: weight of the blocks to prefill against the running "
        "blocks (Dynamo's kv_overlap_score_weight; default 1)",
    )
    g.add_argument(
        "--router-seed",
        type=int,
        default=0,
        metavar="SEED",
        help="seed of the random router, ties and event losses",
    )
    g.add_argument(
        "--no-ceiling",
        action="store_true",
        help="skip the reference run on one instance with N x the capacity",
    )


def _time_scheduler(args: argparse.Namespace) -> TimeScheduler:
    cost: PrefillCost = args.cost  # built by the command line's checks
    return TimeScheduler(args.max_running or 256, cost, not args.no_preemption)


def fleet_policy(args: argparse.Namespace) -> str:
    """The one policy of a fleet replay (default vllm-blocks)."""
    names = [p.strip() for v in args.policies for p in v.split(",") if p.strip()]
    if len(names) > 1:
        raise InvalidInputError("a fleet replay runs one policy: give one --policies name")
    name = names[0] if names else "vllm-blocks"
    lab = parse_lab_name(name)
    if lab is not None and lab["rule"] == "opt":
        raise InvalidInputError(
            f"a fleet replay cannot run {name}: the offline optimum needs each instance's "
            "future requests, which the router decides only as they arrive; replay it "
            "without --instances"
        )
    return name


def _routers(args: argparse.Namespace) -> list[str]:
    names = [r.strip() for r in args.router.split(",") if r.strip()]
    if not names:
        raise InvalidInputError(f"--router {args.router!r} names no router")
    return names


def _run(
    args: argparse.Namespace,
    tr: Trace,
    n: int,
    router: str,
    capacity: int | None,
    err: Console,
    ceiling: bool,
) -> dict[str, Any]:
    if capacity is None:
        raise InvalidInputError("a fleet replay needs --capacity (KV tokens per instance)")
    with progress_bars(err, enabled=not args.quiet) as bars:
        res = fleet_replay(
            tr.requests,
            fleet_policy(args),
            capacity,
            n,
            router,
            scheduler=_time_scheduler(args),
            eviction_policy=args.eviction,
            hash_algo=args.hash_algo,
            event_delay=args.event_delay / 1000.0,
            event_loss=args.event_loss,
            seed=args.router_seed,
            overlap_weight=args.overlap_weight,
            ceiling=ceiling,
            progress=bars,
            cpu_capacity=args.cpu_capacity or 0,
            offload=(args.offload_map or {}).get(fleet_policy(args)),
        )
    return summarize_fleet(res)


def _pct(v: float) -> str:
    return f"{100.0 * v:.2f}%"


def _s(v: float) -> str:
    return f"{v:.4g}"


def _capacity_column(t: Table, sweep: bool) -> None:
    """The sweep's rows differ in capacity and fleet size: both lead the row."""
    if sweep:
        t.add_column("capacity\nper inst.", justify="right", no_wrap=True)
    t.add_column("router", justify="left", no_wrap=True)
    t.add_column("N", justify="right", no_wrap=True)


def _row_head(s: dict[str, Any], sweep: bool) -> list[str]:
    head = [short_tokens(int(s["capacity"]))] if sweep else []
    return [*head, s["router"], str(s["instances"])]


def fleet_tables(title: str, sums: list[dict[str, Any]], *, sweep: bool = False) -> list[Table]:
    """The fleet's results in two tables that fit 80 columns: routing (hit rate, load
    imbalance, preemptions, replay time) and latency (TTFT percentiles against the
    ceiling, one instance with the whole fleet's KV). A sweep's rows lead with the
    capacity per instance."""
    routing = plain_table(title)
    _capacity_column(routing, sweep)
    for label in ("hit\nrate", "imbalance", "preempted", "wall s"):
        routing.add_column(label, justify="right", no_wrap=True)
    latency = plain_table("fleet: estimated latency, and the ceiling (one instance, all KV)")
    _capacity_column(latency, sweep)
    for label in ("TTFT p50\n(s)", "p90\n(s)", "p99\n(s)", "ceiling\nhit rate", "ceiling\np99 (s)"):
        latency.add_column(label, justify="right", no_wrap=True)
    for s in sums:
        c = s.get("ceiling")
        head = _row_head(s, sweep)
        routing.add_row(
            *head,
            _pct(s["hit_rate"]),
            f"{s['imbalance']:.3f}",
            f"{s['preemptions']:,}",
            f"{s['seconds']:.2f}",
        )
        latency.add_row(
            *head,
            _s(s["ttft_p50"]),
            _s(s["ttft_p90"]),
            _s(s["ttft_p99"]),
            _pct(c["hit_rate"]) if c else "-",
            _s(c["ttft_p99"]) if c else "-",
        )
    return [routing, latency]


def instance_table(title: str, s: dict[str, Any]) -> Table:
    t = plain_table(title)
    for label in (
        "instance",
        "requests",
        "prompt\ntokens",
        "hit\ntokens",
        "hit\nrate",
        "peak KV\ntokens",
        "evicted\ntokens",
    ):
        t.add_column(label, justify="right", no_wrap=True)
    for p in s["per_instance"]:
        t.add_row(
            str(p["instance"]),
            f"{p['requests']:,}",
            f"{p['prompt_tokens']:,}",
            f"{p['hit_tokens']:,}",
            _pct(p["hit_rate"]),
            f"{p['peak_kv_tokens']:,}",
            f"{p['evicted_tokens']:,}",
        )
    return t


def _show(console: Console, tables: list[Table]) -> None:
    for t in tables:
        console.print(t)
        console.print()


def _csv_rows(sums: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for s in sums:
        flat = {k: v for k, v in s.items() if k not in ("per_instance", "events", "ceiling")}
        if s.get("ceiling"):
            flat.update({f"ceiling_{k}": v for k, v in s["ceiling"].items()})
        rows.append(flat)
    return rows


def fleet_replay_command(
    args: argparse.Namespace, label: str, tr: Trace, console: Console, err: Console
) -> int:
    if len(args.instances) != 1:
        raise InvalidInputError("replay takes one --instances count; sweep takes a list")
    n = args.instances[0]
    routers = _routers(args)
    sums = [
        _run(args, tr, n, r, args.capacity, err, ceiling=not args.no_ceiling and i == 0)
        for i, r in enumerate(routers)
    ]
    if len(sums) > 1 and sums[0].get("ceiling"):
        for s in sums[1:]:
            s["ceiling"] = sums[0]["ceiling"]
    title = (
        f"{escape(label)}: {len(tr.requests):,} requests on {n} x {sums[0]['policy']} "
        f"({args.capacity:,} tokens each; time model)"
    )
    _show(console, fleet_tables(title, sums))
    _show(console, [instance_table(f"{s['router']}: per instance", s) for s in sums])
    if args.json:
        write_json(
            args.json,
            {"command": "replay", "trace": label, "skipped_lines": tr.skipped, "fleet": sums},
        )
    if args.csv:
        write_csv(args.csv, _csv_rows(sums))
    return 0


def fleet_sweep_command(
    args: argparse.Namespace, label: str, tr: Trace, console: Console, err: Console
) -> int:
    routers = _routers(args)
    sums = [
        _run(args, tr, n, r, cap, err, ceiling=not args.no_ceiling and j == 0)
        for cap in args.capacities
        for n in args.instances
        for j, r in enumerate(routers)
    ]
    # One ceiling per capacity and fleet size, computed with its first router.
    for i in range(0, len(sums), len(routers)):
        for s in sums[i + 1 : i + len(routers)]:
            s["ceiling"] = sums[i].get("ceiling")
    title = (
        f"{escape(label)}: {len(tr.requests):,} requests, fleet sweep on "
        f"{sums[0]['policy']} (time model)"
    )
    _show(console, fleet_tables(title, sums, sweep=True))
    if args.json:
        write_json(
            args.json,
            {"command": "sweep", "trace": label, "skipped_lines": tr.skipped, "fleet": sums},
        )
    if args.csv:
        write_csv(args.csv, _csv_rows(sums))
    return 0
