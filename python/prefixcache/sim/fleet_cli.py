"""``prefixcache replay --instances N`` and ``prefixcache sweep --instances 1,2,4``: the
fleet replay on the command line (docs/FLEET_REPLAY.md). ``cli.py`` adds these options and
hands over when ``--instances`` is given."""

from __future__ import annotations

import argparse
import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefixcache.errors import InvalidInputError
from prefixcache.sim.json_report import write_json
from prefixcache.sim.policies import offload_family
from prefixcache.sim.policies.lab import parse_lab_name
from prefixcache.sim.report import _fmt, plain_table, progress_bars, short_tokens, write_csv
from prefixcache.sim.routers import ROUTER_NAMES
from prefixcache.sim.scheduler import PrefillCost, TimeScheduler
from prefixcache.sim.traces import Trace

__all__ = [
    "add_fleet_args",
    "check_fleet_args",
    "fleet_policy",
    "fleet_replay_command",
    "fleet_sweep_command",
    "seed_arg",
]


def _instances_list(text: str) -> list[int]:
    """Comma-separated instance counts: whole numbers >= 1, none empty, none twice (as
    --capacities: an empty item or a repeat is a typo)."""
    items = text.split(",")
    if not all(x.strip() for x in items):
        if not any(x.strip() for x in items):
            raise argparse.ArgumentTypeError(f"instance counts must be >= 1, got {text!r}")
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}")
    try:
        out = [int(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad instance count {text!r}: integers separated by commas"
        ) from None
    if min(out) < 1:
        raise argparse.ArgumentTypeError(f"instance counts must be >= 1, got {text!r}")
    for i, n in enumerate(out):
        if n in out[:i]:
            raise argparse.ArgumentTypeError(f"{n} instances given twice in {text!r}")
    return out


def _router_list(text: str) -> list[str]:
    """Comma-separated router names: each known, none empty, none twice."""
    items = [r.strip() for r in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"--router {text!r} names no router")
    if not all(items):
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}")
    for i, name in enumerate(items):
        base = name.removeprefix("sticky-")
        if base not in ROUTER_NAMES:
            raise argparse.ArgumentTypeError(
                f"unknown router {name!r}; expected {', '.join(ROUTER_NAMES)} "
                "(each also as sticky-<name>)"
            )
        if name in items[:i]:
            raise argparse.ArgumentTypeError(f"router {name} given twice in {text!r}")
    return items


def _float_arg(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _finite_at_least_zero(text: str, expected: str) -> float:
    """``text`` as a finite float >= 0, else the argparse error ``expected``, got text."""
    v = _float_arg(text)
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}")
    return v


def _event_delay_ms(text: str) -> float:
    return _finite_at_least_zero(text, "expected a delay in milliseconds, a finite number >= 0")


def _probability(text: str) -> float:
    v = _float_arg(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"event loss must be in [0, 1], got {text!r}")
    return v


def _weight(text: str) -> float:
    return _finite_at_least_zero(text, "overlap weight must be a finite number >= 0")


def seed_arg(text: str) -> int:
    """A random seed on the command line (``--seed``, ``--router-seed``): a whole number
    in [0, 2**64)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v < 2**64:
        raise argparse.ArgumentTypeError(f"expected a whole number in [0, 2**64), got {text!r}")
    return v


def add_fleet_args(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    g = p.add_argument_group("fleet (several instances behind a router; time model)")
    if sweep:
        g.add_argument(
            "--instances",
            type=_instances_list,
            default=None,
            metavar="N,N,..",
            help="sweep the fleet size (--capacities are then per instance) of one "
            "--policies policy (default vllm-blocks)",
        )
    else:
        g.add_argument(
            "--instances",
            type=_instances_list,
            default=None,
            metavar="N",
            help="replay on N instances of one --policies policy (default vllm-blocks), "
            "--capacity each",
        )
    g.add_argument(
        "--router",
        type=_router_list,
        default=None,  # round-robin; None: not given
        help=f"{', '.join(ROUTER_NAMES)}, or sticky-<router> (session "
        "affinity); comma separated to compare several (default round-robin)",
    )
    g.add_argument(
        "--event-delay",
        type=_event_delay_ms,
        default=None,  # 0; None: not given
        metavar="MS",
        help="cache-aware routers: the KV events reach the index MS late (default 0)",
    )
    g.add_argument(
        "--event-loss",
        type=_probability,
        default=None,  # 0; None: not given
        metavar="P",
        help="cache-aware routers: each event batch is lost with probability P (default 0)",
    )
    g.add_argument(
        "--overlap-weight",
        type=_weight,
        default=None,  # 1; None: not given
        metavar="W",
        help="cache-aware cost: weight of the blocks to prefill against the running "
        "blocks (Dynamo's kv_overlap_score_weight; default 1)",
    )
    g.add_argument(
        "--router-seed",
        type=seed_arg,
        default=None,  # 0; None: not given
        metavar="SEED",
        help="random seed of the random router, ties and event losses (default 0)",
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


# The fleet flags (none applies without --instances), and those only the cache-aware
# routers read.
_FLEET_FLAGS = (
    ("--router", "router"),
    ("--event-delay", "event_delay"),
    ("--event-loss", "event_loss"),
    ("--overlap-weight", "overlap_weight"),
    ("--router-seed", "router_seed"),
    ("--no-ceiling", "no_ceiling"),
)
_CACHE_AWARE_FLAGS = (
    ("--event-delay", "event_delay"),
    ("--event-loss", "event_loss"),
    ("--overlap-weight", "overlap_weight"),
)
# Options of replay / sweep a fleet has no use for, and why.
_NOT_IN_A_FLEET = (
    ("--records-csv", "records_csv", "a fleet replay writes no per-request records"),
    ("--plot", "plot", "a fleet sweep draws no plot"),
    ("--jobs", "jobs", "a fleet's instances run in one process"),
)


def _given(value: object) -> bool:
    return value is not None and value is not False


def check_fleet_args(args: argparse.Namespace) -> None:
    """Refuse, before anything runs, a fleet flag without --instances, and with it an
    option the fleet has no use for, a router the policy cannot feed (the cache-aware
    routers read KV events) and a router flag none of the routers reads; then settle
    ``args.routers`` and the router flags' defaults."""
    if args.instances is None:
        for flag, attr in _FLEET_FLAGS:
            if _given(getattr(args, attr, None)):
                raise InvalidInputError(f"{flag} applies to a fleet replay only (--instances N)")
        return
    if args.command == "replay" and len(args.instances) != 1:
        raise InvalidInputError("replay takes one --instances count; sweep takes a list")
    for flag, attr, why in _NOT_IN_A_FLEET:
        if _given(getattr(args, attr, None)):
            raise InvalidInputError(f"{flag} does not apply to a fleet replay: {why}")
    routers: list[str] = args.router or ["round-robin"]
    bases = {r.removeprefix("sticky-") for r in routers}
    policy = fleet_policy(args)
    lab = parse_lab_name(policy) is not None  # (an unknown name: refused as the run starts)
    if "cache-aware" in bases and lab and offload_family(policy) is None:
        raise InvalidInputError(
            f"policy {policy!r} does not publish KV events; the cache-aware routers need "
            "radix, radix-page<N>, vllm-blocks[<N>] or trtllm[-nopartial][<N>]"
        )
    if "cache-aware" not in bases:
        for flag, attr in _CACHE_AWARE_FLAGS:
            if _given(getattr(args, attr)):
                raise InvalidInputError(
                    f"{flag} applies to the cache-aware routers only, not {', '.join(routers)}"
                )
    if _given(args.router_seed) and not bases & {"random", "cache-aware"}:
        raise InvalidInputError(
            "--router-seed applies to the random and cache-aware routers only, not "
            + ", ".join(routers)
        )
    if (
        args.command == "replay"
        and args.capacity is None
        and not args.trace.startswith("workload:")
    ):
        # (a built-in workload brings its own budget, known once it is built)
        raise InvalidInputError("a fleet replay needs --capacity (KV tokens per instance)")
    args.routers = routers
    args.event_delay = args.event_delay or 0.0
    args.event_loss = args.event_loss or 0.0
    args.overlap_weight = 1.0 if args.overlap_weight is None else args.overlap_weight
    args.router_seed = args.router_seed or 0


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
    from prefixcache.sim.fleet import fleet_replay, summarize_fleet

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
    return _fmt(float(v))  # the replay tables' format: no exponent, NaN as "-"


def _table(title: str, labels: tuple[str, ...], sweep: bool = False) -> Table:
    """A table whose rows lead with the router and fleet size, and in a sweep with the
    capacity per instance (its rows differ in all three)."""
    t = plain_table(title)
    if sweep:
        t.add_column("capacity\nper inst.", justify="right", no_wrap=True)
    for label in labels:
        t.add_column(label, justify="left" if label == "router" else "right", no_wrap=True)
    return t


def _lead(s: dict[str, Any], sweep: bool) -> list[str]:
    """A row's leading cells: [capacity per instance,] router, fleet size."""
    cap = [short_tokens(int(s["capacity"]))] if sweep else []
    return [*cap, s["router"], f"{s['instances']:,}"]


def fleet_table(title: str, sums: list[dict[str, Any]], sweep: bool = False) -> Table:
    """Reuse per router and fleet size (fits 80 columns; the latency is latency_table)."""
    t = _table(
        title,
        (
            "router",
            "N",
            "hit\nrate",
            "imbal-\nance",
            "re-\njected",
            "pre-\nempted",
            "ceiling\nhit rate",
        ),
        sweep,
    )
    for s in sums:
        c = s.get("ceiling")
        t.add_row(
            *_lead(s, sweep),
            _pct(s["hit_rate"]),
            f"{s['imbalance']:.3f}",
            f"{s['rejected']:,}",
            f"{s['preemptions']:,}",
            _pct(c["hit_rate"]) if c else "-",
        )
    return t


def latency_table(title: str, sums: list[dict[str, Any]], sweep: bool = False) -> Table:
    """TTFT percentiles per router and fleet size, the ceiling's p99 and the wall time."""
    t = _table(
        title,
        ("router", "N", "TTFT p50\n(s)", "p90\n(s)", "p99\n(s)", "ceiling\np99 (s)", "wall s"),
        sweep,
    )
    for s in sums:
        c = s.get("ceiling")
        t.add_row(
            *_lead(s, sweep),
            _s(s["ttft_p50"]),
            _s(s["ttft_p90"]),
            _s(s["ttft_p99"]),
            _s(c["ttft_p99"]) if c else "-",
            _s(s["seconds"]),
        )
    return t


def instance_table(title: str, s: dict[str, Any]) -> Table:
    """Per instance: requests, prompt tokens, hit rate, peak KV and evicted tokens (the
    hit tokens are in --json: seven columns of a large trace's counts pass 80 columns)."""
    t = _table(
        title,
        (
            "inst",
            "requests",
            "prompt\ntokens",
            "hit\nrate",
            "peak KV\ntokens",
            "evicted\ntokens",
        ),
    )
    for p in s["per_instance"]:
        t.add_row(
            str(p["instance"]),
            f"{p['requests']:,}",
            f"{p['prompt_tokens']:,}",
            _pct(p["hit_rate"]),
            f"{p['peak_kv_tokens']:,}",
            f"{p['evicted_tokens']:,}",
        )
    return t


def host_table(title: str, sums: list[dict[str, Any]], sweep: bool = False) -> Table:
    """The host tier of a fleet (every instance has one): the hit rate split into GPU
    hits and loaded host hits (they add up to the hit rate), the host hits not worth
    loading and the host evictions (stores and peaks: --json)."""
    labels = ("router", "N", "GPU\nhit", "host\nhit", "not loaded\ntokens", "host evicted\ntokens")
    t = _table(title, labels, sweep)
    for s in sums:
        t.add_row(
            *_lead(s, sweep),
            _pct(s["gpu_hit_rate"]),
            _pct(s["host_hit_rate"]),
            f"{s['host_unloaded_tokens']:,}",
            f"{s['host_evicted_tokens']:,}",
        )
    return t


def _print_fleet(
    console: Console, title: str, sums: list[dict[str, Any]], sweep: bool = False
) -> None:
    for table in (
        fleet_table(title, sums, sweep),
        latency_table("time model: estimated latency", sums, sweep),
    ):
        console.print(table)
        console.print()
    if sums[0].get("cpu_capacity"):
        off = sums[0]["offload"] or "default"
        console.print(
            host_table(
                f"host tier: {sums[0]['cpu_capacity']:,} tokens per instance ({off})", sums, sweep
            )
        )
        console.print()
    rejected = [s for s in sums if s["rejected"]]
    if rejected:
        worst = max(s["rejected"] for s in rejected)
        console.print(
            f"[yellow]note: up to {worst:,} of {sums[0]['requests']:,} requests never fit "
            "in one instance's KV, even alone: rejected, not served, not in the hit "
            "rate[/yellow]"
        )


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
    n = args.instances[0]
    routers: list[str] = args.routers
    sums = [
        _run(args, tr, n, r, args.capacity, err, ceiling=not args.no_ceiling and i == 0)
        for i, r in enumerate(routers)
    ]
    if len(sums) > 1 and sums[0].get("ceiling"):
        for s in sums[1:]:
            s["ceiling"] = sums[0]["ceiling"]
    _print_fleet(
        console,
        f"{escape(label)}: {len(tr.requests):,} requests on {n} x {sums[0]['policy']} "
        f"({args.capacity:,} tokens each; time model)",
        sums,
    )
    for s in sums:
        console.print(instance_table(f"{s['router']}: per instance", s))
        console.print()
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
    routers: list[str] = args.routers
    sums = []
    for cap in args.capacities:
        for n in args.instances:
            # The ceiling (one instance of n x cap) is the same for every router: run once.
            row = [
                _run(args, tr, n, r, cap, err, ceiling=not args.no_ceiling and j == 0)
                for j, r in enumerate(routers)
            ]
            for s in row[1:]:
                if row[0].get("ceiling"):
                    s["ceiling"] = row[0]["ceiling"]
            sums += row
    caps = ", ".join(f"{c:,}" for c in args.capacities)
    _print_fleet(
        console,
        f"{escape(label)}: {len(tr.requests):,} requests, fleet size sweep "
        f"({caps} tokens per instance; time model)",
        sums,
        sweep=True,
    )
    if args.json:
        write_json(
            args.json,
            {"command": "sweep", "trace": label, "skipped_lines": tr.skipped, "fleet": sums},
        )
    if args.csv:
        write_csv(args.csv, _csv_rows(sums))
    return 0
