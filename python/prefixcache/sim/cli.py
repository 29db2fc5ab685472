"""The ``prefixcache`` command: compare, replay, sweep, trace-stats.

See docs/SIMULATOR.md. Every number printed can also be written as JSON (``--json``) and
CSV (``--csv``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, cast

from rich.console import Console
from rich.markup import escape

from prefixcache import __version__
from prefixcache.errors import PrefixCacheError
from prefixcache.sim.fleet_cli import (
    add_fleet_args,
    check_fleet_args,
    fleet_replay_command,
    fleet_sweep_command,
    seed_arg,
)
from prefixcache.sim.gap import gap_rows, gap_table
from prefixcache.sim.json_report import JsonLines, record_lines, record_texts, write_json
from prefixcache.sim.output_files import check_writable, write_pieces
from prefixcache.sim.policies import (
    POLICY_NAMES,
    check_offload,
    check_sizes,
    check_tier,
    policy_block_size,
)
from prefixcache.sim.replay import (
    ReplayResult,
    default_capacity,
    hit_difference,
    make_scheduler,
    offload_for,
    replay,
    summarize,
)
from prefixcache.sim.report import (
    comparison_table,
    difference_table,
    grid_tables,
    host_tier_tables,
    latency_table,
    partial_reuse_table,
    progress_bars,
    record_csv_header,
    record_csv_rows,
    short_tokens,
    sweep_table,
    trace_stats_table,
    write_csv,
    write_grid_plot,
    write_sweep_plot,
)
from prefixcache.sim.requests import Request, record_fields
from prefixcache.sim.scheduler import (
    DEFAULT_KV_MODEL,
    KV_DTYPE_BYTES,
    KV_MODELS,
    KvModel,
    PrefillCost,
)
from prefixcache.sim.traces import Trace, read_trace

if TYPE_CHECKING:
    from prefixcache.sim.sweep import OnResult

__all__ = ["build_parser", "main", "parse_capacity"]


_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_CAPACITY_RE = re.compile(
    r"(?P<num>[0-9][0-9_]*(\.[0-9]*)?([e][+-]?[0-9]+)?|\.[0-9]+)"
    r"(?P<unit>[kmgt]i?)?(?P<bytes>i?b)?"
)
# The largest capacity taken (tokens), and the bound on its text (characters of the number,
# and its exponent) that keeps parsing fast.
MAX_CAPACITY = 10**15
MAX_CAPACITY_TEXT = 100
CAPACITY_HELP = (
    "tokens: 3000000, 3e6, 3M or 1.5G (decimal: k=10^3, M=10^6, G=10^9, T=10^12) "
    "or 3Mi (binary: Ki=2^10, Mi=2^20, Gi=2^30, Ti=2^40)"
)


def parse_capacity(text: str) -> int:
    """A KV capacity in tokens: a number with an optional decimal (k, M, G, T) or binary
    (Ki, Mi, Gi, Ti) suffix, case-insensitive; it must come to a whole number >= 1."""
    value = _tokens(text)
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"capacity must be at least 1 token, got {text!r} (leave --capacity out for an "
            "unlimited one)"
        )
    return value


def _tokens(text: str) -> int:
    """:func:`parse_capacity` of ``text``, 0 included."""
    t = text.strip().lower().replace("_", "")
    m = _CAPACITY_RE.fullmatch(t)
    if m is not None and m.group("bytes"):
        raise argparse.ArgumentTypeError(
            f"bad capacity {text!r}: a capacity counts tokens, not bytes (drop the B)"
        )
    if m is None:
        raise argparse.ArgumentTypeError(
            f"bad capacity {text!r}: expected a number of tokens such as 3000000, 3e6, 1.5M or 3Mi"
        )
    unit = m.group("unit") or ""
    mult = _BINARY[unit] if unit.endswith("i") else _DECIMAL[unit]
    num = m.group("num")
    # Bounded before the exact arithmetic, which builds 10**exponent: no whole number of
    # at most 1e15 tokens needs a longer text or a larger exponent.
    if len(num) > MAX_CAPACITY_TEXT or abs(int(num.partition("e")[2] or 0)) > MAX_CAPACITY_TEXT:
        raise argparse.ArgumentTypeError(
            f"bad capacity {text!r}: too long a number (at most {MAX_CAPACITY:.0e} tokens)"
        )
    value = Fraction(num) * mult
    if value > MAX_CAPACITY:
        raise argparse.ArgumentTypeError(
            f"bad capacity {text!r}: at most {MAX_CAPACITY:.0e} tokens"
        )
    if value.denominator != 1:
        raise argparse.ArgumentTypeError(
            f"bad capacity {text!r}: {float(value):g} is not a whole number of tokens"
        )
    return int(value)


def _cpu_capacity(text: str) -> int:
    """A host tier capacity in tokens: as --capacity, or 0 (in any of its forms: 0, 0k,
    0e3, .0) for no tier."""
    return _tokens(text)


def _capacity_list(text: str, parse: Callable[[str], int], what: str, example: str) -> list[int]:
    """Comma-separated capacities: none empty, none twice (an empty item or a repeat is
    a typo, and a grid with a repeated column is one)."""
    items = text.split(",")
    if not any(x.strip() for x in items):
        raise argparse.ArgumentTypeError(f"give at least one {what}, e.g. {example}")
    if not all(x.strip() for x in items):
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}")
    caps = [parse(x) for x in items]
    for i, c in enumerate(caps):
        if c in caps[:i]:
            raise argparse.ArgumentTypeError(f"{items[i].strip()!r} ({c} tokens) is given twice")
    return caps


def _cpu_capacities(text: str) -> list[int]:
    return _capacity_list(text, _cpu_capacity, "host capacity", "0,1M,4M")


def _gb_per_s(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a bandwidth in GB/s > 0, got {text!r}")
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
    return _capacity_list(text, parse_capacity, "capacity", "256k,1M")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return v


def _block_size(text: str) -> int:
    """A block size in tokens, 1 to 2**20 (a block larger than any prompt holds none)."""
    v = _positive_int(text)
    if v > 2**20:
        raise argparse.ArgumentTypeError(f"expected a block size of at most 2**20, got {text!r}")
    return v


# The largest cost-model figure taken (ms): larger ones overflow the simulated clock.
MAX_MILLISECONDS = 1e9


def _milliseconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0 <= v <= MAX_MILLISECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a number of ms in [0, {MAX_MILLISECONDS:.0e}], got {text!r}"
        )
    return v


def _step_milliseconds(text: str) -> float:
    """A decode step: a number of ms in (0, MAX_MILLISECONDS] (the clock must advance)."""
    v = _milliseconds(text)
    if v == 0:
        raise argparse.ArgumentTypeError(
            f"expected a number of ms in (0, {MAX_MILLISECONDS:.0e}], got {text!r}"
        )
    return v


def _policies(values: Sequence[str]) -> list[str]:
    out = [p.strip() for v in values for p in v.split(",")]
    if not any(out):  # none given (or only commas): the default policies
        return list(POLICY_NAMES)
    if not all(out):
        raise _UsageError(f"--policies {' '.join(values)}: an empty item")
    for i, p in enumerate(out):
        if p in out[:i]:
            raise _UsageError(f"--policies: {p} is given twice")
    return out


class _UsageError(Exception):
    """A bad command line: printed as one ``error:`` line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message, "help")


EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "xxh3_64")


def _add_common(p: argparse.ArgumentParser, *, capacity: bool = True) -> None:
    p.add_argument(
        "--policies",
        nargs="+",
        default=[],
        metavar="NAME",
        help="policies, space or comma separated: radix, radix-page<N>, "
        "vllm-blocks, vllm-blocks<N>, trtllm[<N>], trtllm-nopartial[<N>], "
        "lab policies: opt, lab-lru, lab-2q, ... (docs/LAB.md) "
        "(default: {})".format(", ".join(POLICY_NAMES)),
    )
    if capacity:
        p.add_argument(
            "--capacity",
            type=parse_capacity,
            default=None,
            metavar="TOKENS",
            help=f"KV budget, the same for every policy, in {CAPACITY_HELP} "
            "(default: the workload's own; traces: unlimited)",
        )
    p.add_argument(
        "--eviction",
        default="lru",
        choices=EVICTION_POLICIES,
        help="radix eviction policy (default lru)",
    )
    p.add_argument(
        "--hash-algo",
        default="xxh3_64",
        choices=HASH_ALGOS,
        help="block hash of the vLLM policies: vLLM's sha256, sha256_cbor, xxhash, "
        "xxhash_cbor, or xxh3_64 (default: 64-bit, fastest, same results barring a "
        "collision; docs/SIMULATOR.md)",
    )
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")
    p.add_argument("--csv", metavar="PATH", help="write the summary rows as CSV")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_model(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scheduler")
    g.add_argument(
        "--model",
        choices=("slots", "time", "sequence"),
        default=None,  # slots; None tells a fleet replay that none was given
        help="slots (default): the A-F study's model; time: continuous batching on a "
        "clock; sequence: one request at a time in trace order (docs/LAB.md)",
    )
    g.add_argument(
        "--max-running",
        type=_positive_int,
        default=None,
        metavar="N",
        help="slots and time models: requests holding KV at once, >= 1 (default 8 slots, 256 time)",
    )
    g.add_argument(
        "--no-preemption",
        action="store_true",
        help="time model: reserve each request's output KV at admission "
        "instead of preempting when KV runs out mid-decode",
    )
    d = PrefillCost()
    g.add_argument(
        "--prefill-base-ms",
        type=_milliseconds,
        default=None,  # d.base_ms; None: not given (a time model flag)
        metavar="MS",
        help=f"time model: fixed cost of a prefill (default {d.base_ms})",
    )
    g.add_argument(
        "--prefill-ms-per-token",
        type=_milliseconds,
        default=None,  # d.per_token_ms; None: not given (a time model flag)
        metavar="MS",
        help=f"per uncached token (default {d.per_token_ms})",
    )
    g.add_argument(
        "--prefill-attention-ms",
        type=_milliseconds,
        default=None,  # d.attention_ms; None: not given (a time model flag)
        metavar="MS",
        help=f"per (query, key) pair, the quadratic term (default {d.attention_ms})",
    )
    g.add_argument(
        "--decode-step-ms",
        type=_step_milliseconds,
        default=None,  # d.decode_step_ms; None: not given (a time model flag)
        metavar="MS",
        help=f"time model: one decode step (default {d.decode_step_ms})",
    )


def _add_offload(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    g = p.add_argument_group("host tier (a second KV tier in host memory; docs/SIMULATOR.md)")
    g.add_argument(
        "--cpu-capacity",
        type=_cpu_capacity,
        default=None,
        metavar="TOKENS",
        help=f"host memory behind each policy's GPU cache, in {CAPACITY_HELP} "
        "(default 0: no host tier)",
    )
    if sweep:
        g.add_argument(
            "--cpu-capacities",
            type=_cpu_capacities,
            default=None,
            metavar="LIST",
            help="comma-separated host capacities (0 = none): sweep the GPU x host grid",
        )
    g.add_argument(
        "--offload",
        default=None,
        metavar="NAME|POLICY=NAME,..",
        help="the host tier's policy, one name for every policy or POLICY=NAME pairs: "
        "vllm-blocks lru (default) or arc, optionally :K (store after K hits); radix "
        "write-through (default), write-through-selective or write-back; trtllm host, "
        "optionally :P (minimum priority)",
    )
    kv = ", ".join(KV_MODELS)
    g.add_argument(
        "--kv-model",
        choices=tuple(KV_MODELS),
        default=None,
        metavar="NAME",
        help=f"time model: the KV bytes per token of a model: {kv} (default {DEFAULT_KV_MODEL}); "
        "the flags below change one field of it",
    )
    g.add_argument("--kv-layers", type=_positive_int, default=None, metavar="N", help="layers")
    g.add_argument(
        "--kv-heads", type=_positive_int, default=None, metavar="N", help="KV heads (GQA groups)"
    )
    g.add_argument("--head-dim", type=_positive_int, default=None, metavar="N", help="head size")
    g.add_argument(
        "--kv-dtype", choices=tuple(KV_DTYPE_BYTES), default=None, help="KV cache element type"
    )
    g.add_argument(
        "--kv-mla",
        action="store_true",
        help="one latent vector per token and layer (multi-head latent attention): "
        "--head-dim is its width, --kv-heads 1",
    )
    g.add_argument(
        "--host-bandwidth",
        type=_gb_per_s,
        default=None,  # PrefillCost().host_gb_per_s; None: not given
        metavar="GB/s",
        help="time model: host -> GPU copy rate of a load, 10^9 bytes/s (default "
        f"{PrefillCost().host_gb_per_s:g}, PCIe 4.0 x16)",
    )


def _add_jobs(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help=f"worker processes running {what} in parallel, one process per "
        "replay (default: the cores this process may run on; 1 runs them one after the other "
        "in this process)",
    )


def _add_trace(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "trace",
        help="a trace file (Mooncake or token JSONL; may be gzip, zstd, "
        "bzip2 or xz compressed), or workload:A..F",
    )
    p.add_argument(
        "--format",
        choices=("auto", "mooncake", "tokens"),
        default="auto",
        help="trace file format (default: detected from the first line)",
    )
    p.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip malformed lines (counted) instead of stopping at the first",
    )
    p.add_argument(
        "--seed", type=seed_arg, default=0, help="random seed of a built-in workload (default 0)"
    )


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="prefixcache",
        description="Replay the same requests through several engines' prefix caches and "
        "compare the prefill tokens they save. Start with: prefixcache compare",
        epilog="docs/SIMULATOR.md describes every command, model and format.",
    )
    ap.add_argument("--version", action="version", version=f"prefixcache {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("compare", help="the A-F study table on built-in workloads A-F")
    c.add_argument("--workload", default="all", help="A..F, a comma list, or all (default)")
    c.add_argument(
        "--seed", type=seed_arg, default=0, help="random seed of the workloads (default 0)"
    )
    _add_common(c)
    _add_model(c)
    _add_offload(c)

    r = sub.add_parser("replay", help="replay a trace through the policies")
    _add_trace(r)
    _add_common(r)
    _add_model(r)
    _add_offload(r)
    r.add_argument("--records-csv", metavar="PATH", help="write one row per request and policy")
    _add_jobs(r, "policies")
    add_fleet_args(r)

    s = sub.add_parser("sweep", help="hit rate vs KV capacity, one curve per policy")
    _add_trace(s)
    s.add_argument(
        "--capacities",
        type=_capacities,
        required=True,
        metavar="LIST",
        help="comma-separated token budgets (k, M, G decimal; Ki, Mi, Gi binary), e.g. 64k,256k,1M",
    )
    s.add_argument(
        "--plot",
        metavar="PNG",
        help="write the plot (PNG, SVG or PDF by the name's suffix; needs "
        "matplotlib: pip install 'prefixcache[plot]')",
    )
    _add_jobs(s, "capacities and policies")
    _add_common(s, capacity=False)
    _add_model(s)
    _add_offload(s, sweep=True)
    add_fleet_args(s, sweep=True)

    t = sub.add_parser("trace-stats", help="sizes, arrival span and hit-rate ceilings of a trace")
    _add_trace(t)
    t.add_argument(
        "--block-size",
        type=_block_size,
        default=None,
        metavar="TOKENS",
        help="block size of the block ceiling, 1 to 2**20 (default 512 Mooncake, 16 else)",
    )
    t.add_argument("--json", metavar="PATH", help="write every number as JSON")
    t.add_argument("--csv", metavar="PATH", help="write the row as CSV")
    t.add_argument(
        "--quiet",
        action="store_true",
        help="accepted for symmetry: trace-stats shows no progress bars",
    )
    a = sub.add_parser("atlas", help="reference curves of every policy and opt (docs/ATLAS.md)")
    a.add_argument(
        "trace_dir",
        nargs="?",
        default=None,
        help="folder of *.jsonl traces (default: $PREFIXCACHE_TRACES; none: "
        "built-in workloads only)",
    )
    a.add_argument(
        "--out",
        default="docs/ATLAS.md",
        help="the report (default docs/ATLAS.md, under the current directory; PNGs and "
        "JSON go to an atlas/ folder beside it)",
    )
    return ap


def _check_output(path: str | None, option: str) -> None:
    """Fail before the run, not after it, on a path that cannot be written."""
    if path is None:
        return
    if not path:
        raise _UsageError(f"{option}: an empty path")
    if path == "-":  # not read as standard output, which the tables go to
        raise _UsageError(
            f"{option} -: give a file name (or /dev/stdout to write to standard output)"
        )
    try:
        check_writable(path)
    except OSError as e:
        raise _UsageError(f"{option} {e}") from None


def _check_plot(path: str | None) -> None:
    if path is None:
        return
    _check_output(path, "--plot")
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise _UsageError("--plot needs matplotlib: pip install 'prefixcache[plot]'") from None
    suffix = Path(path).suffix.lower().lstrip(".")
    kinds = FigureCanvasBase.get_supported_filetypes()
    if suffix not in kinds:
        raise _UsageError(
            f"--plot {path}: unknown image type {suffix!r}; use one of "
            + ", ".join(f".{k}" for k in sorted(kinds))
        )


def _check_distinct_outputs(args: argparse.Namespace) -> None:
    """Two outputs naming one regular file would leave only the last one written."""
    seen: dict[Path, str] = {}
    for option in ("json", "csv", "records_csv", "plot"):
        path = getattr(args, option, None)
        if path is None:
            continue
        p = Path(path)
        if p.exists() and not p.is_file():  # /dev/stdout, a pipe: written in turn
            continue
        key = p.resolve()
        flag = "--" + option.replace("_", "-")
        if key in seen:
            raise _UsageError(f"{seen[key]} and {flag} name the same file {path}")
        seen[key] = flag


def _check_args(args: argparse.Namespace) -> None:
    for option in ("json", "csv", "records_csv"):
        _check_output(getattr(args, option, None), "--" + option.replace("_", "-"))
    _check_plot(getattr(args, "plot", None))
    _check_distinct_outputs(args)
    spec = getattr(args, "trace", None)
    if spec is not None and spec.startswith("workload:") and args.format != "auto":
        raise _UsageError(
            f"--format {args.format} applies to trace files, not to the built-in {spec}"
        )
    if "model" in args:
        _check_model_args(args)
    if "instances" in args:
        check_fleet_args(args)
    if "cpu_capacity" in args:
        _check_tier_args(args)
    if getattr(args, "workload", None) is not None:
        from prefixcache.sim.workloads import STUDY_WORKLOADS

        names = _workload_names(args.workload)
        bad = [n for n in names if n not in STUDY_WORKLOADS]
        if bad or not names:
            raise _UsageError(
                f"--workload {args.workload!r}: expected A..F, a comma list of them, or all"
            )
        # As every other list of the command line: each item once, no empty item.
        if "" in (w.strip() for w in args.workload.split(",")):
            raise _UsageError(f"--workload {args.workload!r}: an empty item")
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise _UsageError(f"--workload {args.workload!r}: {twice} is given twice")


_TIME_FLAGS = (
    ("--no-preemption", "no_preemption"),
    ("--prefill-base-ms", "prefill_base_ms"),
    ("--prefill-ms-per-token", "prefill_ms_per_token"),
    ("--prefill-attention-ms", "prefill_attention_ms"),
    ("--decode-step-ms", "decode_step_ms"),
)


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def _check_model_args(args: argparse.Namespace) -> None:
    """Refuse the scheduler flags the chosen model has no use for (as --offload without
    a host tier is refused), then settle ``args.model``."""
    fleet = getattr(args, "instances", None) is not None
    if fleet and args.model not in (None, "time"):
        raise _UsageError(
            f"--model {args.model} does not apply: a fleet replay runs the time model"
        )
    model = "time" if fleet else args.model or "slots"
    if model != "time":
        for flag, attr in _TIME_FLAGS:
            value = getattr(args, attr)
            if value is not None and value is not False:  # given (0 ms included)
                raise _UsageError(f"{flag} applies to --model time only, not {model}")
    if model == "sequence" and args.max_running is not None:
        raise _UsageError("--max-running applies to --model slots and time, not sequence")
    args.model = model


def _kv_model(args: argparse.Namespace) -> KvModel:
    """--kv-model (default llama-3.1-8b), with the fields the other --kv flags give."""
    base = KV_MODELS[args.kv_model or DEFAULT_KV_MODEL]
    given = ("kv_layers", "kv_heads", "head_dim", "kv_dtype", "kv_mla")
    if not any(getattr(args, k) for k in given):
        return base
    mla = base.mla or args.kv_mla
    return KvModel(
        "custom",
        args.kv_layers or base.layers,
        args.kv_heads or (1 if mla else base.kv_heads),
        args.head_dim or base.head_dim,
        args.kv_dtype or base.dtype,
        mla,
    )


def _offload_map(text: str, policies: Sequence[str]) -> dict[str, str]:
    """--offload: one name for every policy, or POLICY=NAME pairs, comma separated."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise _UsageError("--offload: give a tier policy name or POLICY=NAME pairs")
    if not all(items):
        raise _UsageError(f"--offload {text}: an empty item")
    if not any("=" in x for x in items):
        if len(items) > 1:
            raise _UsageError(f"--offload {text}: one name for every policy, or POLICY=NAME pairs")
        return dict.fromkeys(policies, items[0])
    out: dict[str, str] = {}
    for x in items:
        pol, eq, name = (v.strip() for v in x.partition("="))
        if not eq or not pol or not name:
            raise _UsageError(f"--offload {text}: {x!r} is not POLICY=NAME")
        if pol not in policies:
            raise _UsageError(
                f"--offload {text}: {pol!r} is not a policy of this run ({', '.join(policies)})"
            )
        if pol in out:
            raise _UsageError(f"--offload {text}: {pol} given twice")
        out[pol] = name
    return out


def _check_tier_args(args: argparse.Namespace) -> None:
    """--cpu-capacity / --cpu-capacities / --offload and the KV size flags, before
    anything runs; sets ``args.cost`` and ``args.offload_map``."""
    grid = getattr(args, "cpu_capacities", None)
    if grid is not None and args.cpu_capacity is not None:
        raise _UsageError("give --cpu-capacity or --cpu-capacities, not both")
    if grid is not None and getattr(args, "instances", None) is not None:
        raise _UsageError("a fleet sweep takes one --cpu-capacity, not --cpu-capacities")
    cpus = grid if grid is not None else [args.cpu_capacity or 0]
    if getattr(args, "instances", None) is not None:
        from prefixcache.sim.fleet_cli import fleet_policy

        policies = [fleet_policy(args)]
    else:
        policies = _policies(args.policies)
    args.offload_map = None
    if args.offload is not None:
        if not any(cpus):
            raise _UsageError(f"--offload {args.offload} needs a host tier: --cpu-capacity > 0")
        args.offload_map = _offload_map(args.offload, policies)
    if any(cpus):
        for p in policies:  # the names first, then whether this build has the tier
            off = offload_for(p, args.offload_map)
            try:
                check_offload(p, off)
            except PrefixCacheError as e:
                opt = "--cpu-capacity" if off is None else "--offload"
                hint = ""
                if off is not None and "=" not in args.offload and len(policies) > 1:
                    hint = " (policies of different engines: give POLICY=NAME pairs)"
                raise _UsageError(f"{opt}: {e}{hint}") from None
        for p in policies:
            try:
                check_tier(p, max(cpus), offload_for(p, args.offload_map))
            except PrefixCacheError as e:
                raise _UsageError(f"--cpu-capacity: {e}") from None
    _check_sizes(args, policies, cpus)
    try:
        kv = _kv_model(args)
    except PrefixCacheError as e:
        raise _UsageError(f"--kv-model / --kv-* flags: {e}") from None
    if kv.bytes_per_token > MAX_KV_BYTES_PER_TOKEN:  # float() of it would overflow
        raise _UsageError(
            "--kv-model / --kv-* flags: the KV bytes per token they give exceed "
            f"{MAX_KV_BYTES_PER_TOKEN:.0e}"
        )
    # They size and time a host load, which only the time model charges, with a tier.
    for flag, attr in _LOAD_FLAGS:
        if _given_flag(getattr(args, attr)) and (args.model != "time" or not any(cpus)):
            raise _UsageError(
                f"{flag} applies to --model time with a host tier (--cpu-capacity > 0), not "
                + (f"--model {args.model}" if args.model != "time" else "without a tier")
            )
    d = PrefillCost()
    args.cost = PrefillCost(
        _given(args.prefill_base_ms, d.base_ms),
        _given(args.prefill_ms_per_token, d.per_token_ms),
        _given(args.prefill_attention_ms, d.attention_ms),
        _given(args.decode_step_ms, d.decode_step_ms),
        float(kv.bytes_per_token),
        _given(args.host_bandwidth, d.host_gb_per_s),
    )


# The largest KV size per token taken (bytes): far past any model, and a float.
MAX_KV_BYTES_PER_TOKEN = 1e18


# The flags of a host load's cost (bytes per token, bandwidth).
_LOAD_FLAGS = (
    ("--kv-model", "kv_model"),
    ("--kv-layers", "kv_layers"),
    ("--kv-heads", "kv_heads"),
    ("--head-dim", "head_dim"),
    ("--kv-dtype", "kv_dtype"),
    ("--kv-mla", "kv_mla"),
    ("--host-bandwidth", "host_bandwidth"),
)


def _given_flag(value: object) -> bool:
    return value is not None and value is not False


def _check_sizes(
    args: argparse.Namespace,
    policies: Sequence[str],
    cpus: Sequence[int],
    requests: Sequence[Request] | None = None,
    capacity: int | None = None,
) -> None:
    """Every (policy, capacity, host capacity) the command will build, before anything
    runs: a size one policy refuses (its pool or host tier under one block, or past what
    its core addresses) stopped the command only once the runs before it had run (a
    fleet's ceiling, N x the capacity, once the fleet had run). With ``requests``, the
    capacity is ``capacity``, and an unlimited one (None) is the one a replay of them
    gives each policy."""
    caps: list[int | None] = (
        [capacity]
        if requests is not None
        else list(getattr(args, "capacities", None) or [args.capacity])
    )
    sizes = [(c, h, "") for c in caps for h in cpus]
    fleet = getattr(args, "instances", None)
    if fleet is not None and not args.no_ceiling:
        ceiling = "the ceiling run (N x --capacity, N x --cpu-capacity): "
        sizes += [
            (None if c is None else c * n, h * n, ceiling)
            for c in caps
            for h in cpus
            for n in fleet
        ]
    for p in policies:
        for cap, cpu, what in sizes:
            if cap is None and requests is not None:
                cap = default_capacity(requests, policy_block_size(p))
            try:
                check_sizes(p, cap, cpu)
            except PrefixCacheError as e:
                raise _UsageError(f"{what}{e}") from None


def _check_budget_sizes(
    args: argparse.Namespace, requests: Sequence[Request], capacity: int | None
) -> None:
    """:func:`_check_sizes` at the capacity a replay of ``requests`` runs at, once they
    are known and before any replay: without ``--capacity`` a built-in workload runs at
    its own budget and a trace at an unlimited one that depends on its requests, so a
    size refused there (a trie's host tier past what it addresses) stopped the command
    only once the policies before it had run."""
    if getattr(args, "instances", None) is not None:
        from prefixcache.sim.fleet_cli import fleet_policy

        policies = [fleet_policy(args)]
    else:
        policies = _policies(args.policies)
    _check_sizes(args, policies, [args.cpu_capacity or 0], requests, capacity)


def _workload_names(text: str) -> list[str]:
    if text.strip().lower() == "all":
        from prefixcache.sim.workloads import STUDY_WORKLOADS

        return list(STUDY_WORKLOADS)
    return [w.strip().upper() for w in text.split(",") if w.strip()]


def _load(args: argparse.Namespace, console: Console) -> tuple[str, Trace]:
    spec: str = args.trace
    if spec.startswith("workload:"):
        from prefixcache.sim.workloads import study_workload

        w = study_workload(spec.split(":", 1)[1], args.seed)
        if getattr(args, "capacity", None) is None and "capacity" in args:
            args.capacity = w.capacity  # a built-in workload runs at its own budget
        return f"workload {w.name}", Trace(spec, "workload", list(w.requests))
    tr = read_trace(spec, fmt=args.format, skip_bad_lines=args.skip_bad_lines)
    label = _printable_path(spec)
    if tr.skipped:
        console.print(
            f"[yellow]skipped {tr.skipped} malformed line(s) of {escape(label)}: lines "
            f"{', '.join(map(str, tr.skipped_lines[:10]))}"
            f"{' ...' if tr.skipped > 10 else ''}[/yellow]"
        )
    return label, tr


def _printable_path(path: str) -> str:
    """``path`` as text any terminal, CSV or JSON file takes: a file name that is not
    UTF-8 (legal on POSIX; Python holds its bytes as lone surrogates) shows its bytes as
    ``\\xNN`` escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _scheduler(args: argparse.Namespace) -> Any:
    return make_scheduler(
        args.model, max_running=args.max_running, cost=args.cost, preemption=not args.no_preemption
    )


def _run(
    args: argparse.Namespace,
    requests: Sequence[Request],
    capacity: int | None,
    console: Console,
    err: Console,
) -> list[ReplayResult]:
    with progress_bars(err, enabled=not args.quiet) as bars:
        return replay(
            requests,
            _policies(args.policies),
            capacity,
            scheduler=_scheduler(args),
            eviction_policy=args.eviction,
            hash_algo=args.hash_algo,
            progress=bars,
            cpu_capacity=args.cpu_capacity or 0,
            offload=args.offload_map,
        )


def _spec(args: argparse.Namespace) -> Any:
    from prefixcache.sim.sweep import SweepSpec

    return SweepSpec(
        trace=args.trace,
        fmt=args.format,
        skip_bad_lines=args.skip_bad_lines,
        seed=args.seed,
        policies=_policies(args.policies),
        eviction_policy=args.eviction,
        hash_algo=args.hash_algo,
        model=args.model,
        max_running=args.max_running,
        cost=args.cost,
        preemption=not args.no_preemption,
        cpu_capacity=args.cpu_capacity or 0,
        offload=args.offload_map,
    )


def _sweep_runs(
    args: argparse.Namespace, requests: Sequence[Request], caps: Sequence[int], err: Console
) -> list[dict[str, Any]]:
    """Every (capacity, policy) of the sweep, in that order, as summaries."""
    from prefixcache.sim.sweep import run_sweep

    with progress_bars(err, enabled=not args.quiet) as bars:
        return run_sweep(_spec(args), requests, caps, jobs=args.jobs, progress=bars)


def _replay_runs(
    args: argparse.Namespace,
    requests: Sequence[Request],
    err: Console,
    on_result: OnResult | None = None,
) -> list[ReplayResult]:
    """Every policy at ``args.capacity``, in worker processes unless ``--jobs 1``."""
    from prefixcache.sim.sweep import run_pairs

    pairs = [(args.capacity, p) for p in _policies(args.policies)]
    with progress_bars(err, enabled=not args.quiet) as bars:
        return run_pairs(
            _spec(args), requests, pairs, jobs=args.jobs, progress=bars, on_result=on_result
        )


def _diffs(results: Sequence[ReplayResult]) -> list[dict[str, Any]]:
    return [
        hit_difference(results[i], results[j])
        for i in range(len(results))
        for j in range(i + 1, len(results))
    ]


def _show(console: Console, table: Any) -> None:
    console.print(table)
    console.print()


def _print_results(
    console: Console,
    heading: str,
    requests: Sequence[Request],
    capacity: int | None,
    model: str,
    sums: Sequence[dict[str, Any]],
    diffs: Sequence[dict[str, Any]],
    eviction: str,
) -> None:
    cap_text = "unlimited" if capacity is None else f"{capacity:,} tokens"
    prompt = sum(r.prompt_len for r in requests)
    _show(
        console,
        comparison_table(
            f"{escape(heading)}\n{len(requests):,} requests, {prompt:,} prompt tokens, "
            f"KV {cap_text}, "
            f"model {model}",
            sums,
        ),
    )
    rejected = {str(x["policy"]): int(x["rejected"]) for x in sums if x.get("rejected")}
    if rejected:
        worst = max(rejected.values())
        console.print(
            f"[yellow]note: up to {worst:,} of {len(requests):,} requests never fit "
            f"in KV {cap_text}, even alone: rejected, not served, not in the hit "
            "rate[/yellow]"
        )
        console.print()
    for t in host_tier_tables(sums):
        _show(console, t)
    partial = partial_reuse_table("trie: partial reuse of the last block", sums)
    if partial is not None:
        _show(console, partial)
    if model == "time":
        _show(console, latency_table("time model: preemption and estimated latency", sums))
    if diffs:
        _show(console, difference_table("per-request hit tokens, a - b", diffs))
    gap = gap_rows(sums, eviction)
    if gap:
        _show(console, gap_table("share of the LRU -> OPT gap closed", gap))


def cmd_compare(args: argparse.Namespace, console: Console, err: Console) -> int:
    from prefixcache.sim.workloads import study_workload

    workloads = [study_workload(name, args.seed) for name in _workload_names(args.workload)]
    for w in workloads:
        _check_budget_sizes(
            args, w.requests, w.capacity if args.capacity is None else args.capacity
        )
    out: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for w in workloads:
        cap = args.capacity if args.capacity is not None else w.capacity
        results = _run(args, w.requests, cap, console, err)
        sums = [summarize(r) for r in results]
        diffs = _diffs(results)
        _print_results(
            console,
            f"workload {w.name}: {w.description}",
            w.requests,
            cap,
            args.model,
            sums,
            diffs,
            args.eviction,
        )
        out.append(
            {
                "workload": w.name,
                "description": w.description,
                # None: unlimited (each summary has the budget its policy ran at).
                "capacity": cap,
                "summaries": sums,
                "differences": diffs,
                "gap": gap_rows(sums, args.eviction),
            }
        )
        rows += [{"workload": w.name, **s} for s in sums]
    if args.json:
        write_json(args.json, {"command": "compare", "seed": args.seed, "workloads": out})
    if args.csv:
        write_csv(args.csv, rows)
    return 0


def cmd_replay(args: argparse.Namespace, console: Console, err: Console) -> int:
    label, tr = _load(args, console)
    _check_budget_sizes(args, tr.requests, args.capacity)
    if args.instances is not None:
        return fleet_replay_command(args, label, tr, console, err)
    reqs = tr.requests
    # The records' JSON text (and CSV rows) are made as each replay ends, while the others
    # still run; the CSV rows share the JSON text of the columns where the two agree.
    record_json: dict[int, JsonLines] = {}
    record_csv: dict[int, str] = {}

    def encode_records(i: int, r: ReplayResult) -> None:
        host_tier = r.stats.cpu_capacity > 0
        texts = record_texts(r.columns, host_tier)
        if args.json:
            record_json[i] = record_lines(r.columns, host_tier, texts)
        if args.records_csv:
            record_csv[i] = record_csv_rows(r.policy, r.columns, host_tier, texts)

    encode = encode_records if args.json or args.records_csv else None
    results = _replay_runs(args, reqs, err, encode)
    sums = [summarize(r) for r in results]
    diffs = _diffs(results)
    _print_results(console, label, reqs, args.capacity, args.model, sums, diffs, args.eviction)
    if args.json:
        write_json(
            args.json,
            {
                "command": "replay",
                "trace": label,
                "skipped_lines": tr.skipped,
                "summaries": sums,
                "differences": diffs,
                "gap": gap_rows(sums, args.eviction),
                "records": {r.policy: record_json[i] for i, r in enumerate(results)},
            },
        )
    if args.csv:
        write_csv(args.csv, sums)
    if args.records_csv:
        tiers = {r.stats.cpu_capacity > 0 for r in results}
        if len(tiers) == 1 and any(record_csv.values()):
            header = record_csv_header(tiers.pop())
            write_pieces(args.records_csv, [header, *(record_csv[i] for i in range(len(results)))])
        else:  # no rows, or policies with and without a host tier: fields differ
            write_csv(args.records_csv, [row for r in results for row in _record_rows(r)])
    return 0


def _record_rows(res: ReplayResult) -> list[dict[str, Any]]:
    """The ``--records-csv`` rows of one replay: its policy, then each record's fields
    (:meth:`RequestRecord.to_dict`)."""
    names = ("policy", *record_fields(host_tier=res.stats.cpu_capacity > 0))
    c = res.columns
    columns = [[res.policy] * len(c), *(c.column(k) for k in names[1:])]
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def cmd_sweep(args: argparse.Namespace, console: Console, err: Console) -> int:
    label, tr = _load(args, console)
    if args.instances is not None:
        return fleet_sweep_command(args, label, tr, console, err)
    reqs = tr.requests
    caps: list[int] = args.capacities
    if args.cpu_capacities is not None:
        return _grid_sweep(args, label, tr, console, err)
    rates: dict[str, list[float]] = {}
    all_sums = _sweep_runs(args, reqs, caps, err)
    for s in all_sums:
        rates.setdefault(s["policy"], []).append(float(s["hit_rate"]))
    _show(console, sweep_table(caps, rates, args.cpu_capacity or 0))
    rejected = [s for s in all_sums if s.get("rejected")]
    if rejected:
        console.print(
            "[yellow]note: requests that never fit, even alone: rejected, not served, not "
            "in the hit rate: "
            + ", ".join(
                f"{escape(str(s['policy']))} {int(s['rejected']):,} at {int(s['capacity']):,}"
                for s in rejected
            )
            + "[/yellow]"
        )
        console.print()
    gaps: list[dict[str, Any]] = []
    for cap in caps:
        rows = gap_rows([s for s in all_sums if s["capacity"] == cap], args.eviction)
        gaps += [{"capacity": cap, **g} for g in rows]
        if rows:
            _show(console, gap_table(f"share of the LRU -> OPT gap closed at {cap:,} tokens", rows))
    return _sweep_outputs(
        args,
        console,
        label,
        reqs,
        lambda path, title: write_sweep_plot(path, caps, rates, title),
        {
            "skipped_lines": tr.skipped,
            "capacities": caps,
            "hit_rate": rates,
            "summaries": all_sums,
            "gap": gaps,
        },
        all_sums,
    )


def _sweep_outputs(
    args: argparse.Namespace,
    console: Console,
    label: str,
    reqs: Sequence[Request],
    plot: Callable[[str, str], None],
    fields: dict[str, Any],
    sums: list[dict[str, Any]],
) -> int:
    """What every sweep writes: ``--plot`` (``plot(path, title)``), ``--json`` (``fields``
    after the command and the trace) and ``--csv`` (``sums``)."""
    if args.plot:
        name = Path(label).name.replace("$", r"\$")  # a plain $, not matplotlib's math
        # A 1-D sweep's host tier is the same behind every capacity: the title says it.
        cpu = 0 if getattr(args, "cpu_capacities", None) is not None else args.cpu_capacity or 0
        host = f", host tier {short_tokens(cpu)} tokens" if cpu else ""
        plot(args.plot, f"{name} ({len(reqs):,} requests, model {args.model}{host})")
        console.print(f"plot written to {args.plot}")
    if args.json:
        write_json(args.json, {"command": "sweep", "trace": label, **fields})
    if args.csv:
        write_csv(args.csv, sums)
    return 0


def _grid_sweep(
    args: argparse.Namespace,
    label: str,
    tr: Trace,
    console: Console,
    err: Console,
) -> int:
    """``sweep --capacities .. --cpu-capacities ..``: the GPU x host capacity grid."""
    reqs = tr.requests
    from prefixcache.sim.sweep import run_grid

    caps: list[int] = args.capacities
    cpus: list[int] = args.cpu_capacities
    with progress_bars(err, enabled=not args.quiet) as bars:
        sums = run_grid(_spec(args), reqs, caps, cpus, jobs=args.jobs, progress=bars)
    for t in grid_tables(caps, cpus, sums, args.model):
        _show(console, t)
    return _sweep_outputs(
        args,
        console,
        label,
        reqs,
        lambda path, title: write_grid_plot(path, caps, cpus, sums, title),
        {
            "skipped_lines": tr.skipped,
            "capacities": caps,
            "cpu_capacities": cpus,
            "summaries": sums,
        },
        sums,
    )


def cmd_trace_stats(args: argparse.Namespace, console: Console, err: Console) -> int:
    from prefixcache.sim.trace_stats import trace_stats

    label, tr = _load(args, console)
    bs = (
        args.block_size if args.block_size is not None else (512 if tr.format == "mooncake" else 16)
    )
    st = {"skipped_lines": tr.skipped, **trace_stats(tr.requests, bs, tr.hash_ids)}
    _show(console, trace_stats_table(f"{escape(label)} ({tr.format})", st))
    if args.json:
        write_json(args.json, {"command": "trace-stats", "trace": label, **st})
    if args.csv:
        write_csv(args.csv, [{"trace": label, **st}])
    return 0


def cmd_atlas(args: argparse.Namespace, console: Console, err: Console) -> int:
    from prefixcache.sim.atlas import run_atlas

    out = run_atlas(args.trace_dir, args.out, log=lambda s: err.print(s))
    console.print(f"atlas written to {out}")
    return 0


COMMANDS = {
    "compare": cmd_compare,
    "replay": cmd_replay,
    "sweep": cmd_sweep,
    "trace-stats": cmd_trace_stats,
    "atlas": cmd_atlas,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 done, 2 an error, 1 out of memory
    or a worker process killed, 130 interrupted; each but 0 printed as one line on
    stderr)."""
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    err = Console(stderr=True, highlight=False)
    if not argv:
        ap.print_help()
        return 0
    try:
        if argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
            raise _UsageError(
                f"give a command before the options, e.g. prefixcache compare "
                f"{' '.join(argv)} (see prefixcache --help)"
            )
        args = ap.parse_args(argv)
        if args.command is None:
            raise _UsageError(
                "give a command: compare, replay, sweep or trace-stats (see prefixcache --help)"
            )
        _check_args(args)
        console = Console(file=cast(IO[str], _PipeSafe(sys.stdout)), highlight=False)
        return COMMANDS[args.command](args, console, err)
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    except (_UsageError, PrefixCacheError, OSError) as e:
        text = _one_line(e)
        from prefixcache.sim.sweep import WorkerDiedError

        if isinstance(e, WorkerDiedError):
            # A worker killed mid-run (the out-of-memory killer): the command line was
            # fine, so exit status 1 as for MemoryError; no output files were written.
            err.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)
            return 1
        if isinstance(e, _UsageError) and e.args[1:] == ("help",):
            command = argv[0] if argv[0] in COMMANDS else None
            text += f" (see prefixcache {command + ' ' if command else ''}--help)"
        err.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)
        return 2
    except MemoryError as e:
        # A workload too large for this machine (in a worker too): one line, no output
        # files, exit status 1 (the command line was fine).
        text = f"out of memory: {_one_line(e)}"
        err.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        # Files are written only once everything ran: nothing partial was left behind.
        # `args` is unset when Ctrl-C came while the arguments were read.
        command = argv[0] if argv[0] in COMMANDS else "prefixcache"
        err.print(f"interrupted: {command} stopped, no output files written")
        return 130


class _PipeSafe:
    """stdout that stops writing when the reader goes away (``prefixcache ... | head``):
    the command still runs to the end and writes its --json / --csv files."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.closed_by_reader = True
        # No second BrokenPipeError when the interpreter flushes stdout at exit.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())

    def isatty(self) -> bool:
        return bool(self.stream.isatty())

    def fileno(self) -> int:
        return int(self.stream.fileno())


def _one_line(e: BaseException) -> str:
    text = str(e.args[0]) if isinstance(e, _UsageError) else str(e) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.filename}: {e.strerror}"
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
