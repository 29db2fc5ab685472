"""Simulator benchmarks: the whole Mooncake conversation trace through radix,
radix-page16 and vllm-blocks (slot and time models, 1M and 3M-token KV; a sweep of six
capacities in worker processes), ``prefixcache compare --workload all``, and one A-F
workload replayed with the Rust tree versus the plain-Python reference tree.

The trace is read from the folder named by ``PREFIXCACHE_TRACES``
(``mooncake_conversation.jsonl``); without it those benchmarks are skipped. With
``--benchmark-disable`` (CI) each runs once on a cut-down input so the suite stays
quick; ``pytest benches/bench_replay.py --benchmark-only`` runs the full sizes.
"""

from __future__ import annotations

import io
import os
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from prefixcache.sim.cli import main
from prefixcache.sim.policies import RadixPolicy, blocks_available
from prefixcache.sim.replay import replay, summarize
from prefixcache.sim.sweep import SweepSpec, run_sweep
from prefixcache.sim.traces import read_trace
from prefixcache.sim.workloads import study_workload

TRACE = Path(os.environ.get("PREFIXCACHE_TRACES", "")) / "mooncake_conversation.jsonl"
HAVE_TRACE = bool(os.environ.get("PREFIXCACHE_TRACES")) and TRACE.exists()
POLICIES = ["radix", "radix-page16"] + (["vllm-blocks"] if blocks_available() else [])
SWEEP = [1 << 18, 1 << 20, 3_000_000, 1 << 22, 1 << 24, 1 << 26]


@pytest.mark.skipif(
    not HAVE_TRACE,
    reason="PREFIXCACHE_TRACES is not set (the directory of "
    "mooncake_conversation.jsonl, see examples/README.md)",
)
@pytest.mark.parametrize(
    ("model", "capacity"), [("slots", 1 << 20), ("slots", 3_000_000), ("time", 3_000_000)]
)
def test_mooncake_conversation_all_policies(benchmark: Any, model: str, capacity: int) -> None:
    benchmark.group = (
        f"replay: Mooncake conversation, 3 policies, {model} model, {capacity:,}-token KV"
    )
    reqs = read_trace(TRACE).requests
    if benchmark.disabled:
        reqs = reqs[:500]
    results = benchmark.pedantic(
        lambda: replay(reqs, POLICIES, capacity, model=model), rounds=1, iterations=1
    )
    for r in results:
        s = summarize(r)
        benchmark.extra_info[f"{r.policy}_s"] = round(r.seconds, 3)
        benchmark.extra_info[f"{r.policy}_hit_rate"] = round(s["hit_rate"], 4)
        benchmark.extra_info[f"{r.policy}_peak_rss_mib"] = s["peak_rss_bytes"] >> 20
    assert len(results) == len(POLICIES)


@pytest.mark.skipif(
    not HAVE_TRACE or not blocks_available(),
    reason="PREFIXCACHE_TRACES is not set (the directory of "
    "mooncake_conversation.jsonl, see examples/README.md)",
)
@pytest.mark.parametrize("hash_algo", ["sha256", "xxh3_64"])
def test_mooncake_conversation_vllm_blocks_by_hash(benchmark: Any, hash_algo: str) -> None:
    """vllm-blocks alone, time model, 3M tokens: vLLM's sha256 against the 64-bit hash
    the command line uses by default (identical results, docs/SIMULATOR.md)."""
    benchmark.group = "replay: Mooncake conversation, vllm-blocks, time model, 3M-token KV"
    reqs = read_trace(TRACE).requests
    if benchmark.disabled:
        reqs = reqs[:500]
    results = benchmark.pedantic(
        lambda: replay(reqs, ["vllm-blocks"], 3_000_000, model="time", hash_algo=hash_algo),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info["wall_s"] = round(results[0].seconds, 3)
    benchmark.extra_info["hit_tokens"] = sum(r.hit_tokens for r in results[0].records)


@pytest.mark.skipif(
    not HAVE_TRACE,
    reason="PREFIXCACHE_TRACES is not set (the directory of "
    "mooncake_conversation.jsonl, see examples/README.md)",
)
def test_mooncake_conversation_sweep_in_workers(benchmark: Any) -> None:
    benchmark.group = "sweep: Mooncake conversation, 6 capacities x 3 policies, --jobs cores"
    spec = SweepSpec(str(TRACE), policies=POLICIES)
    reqs = read_trace(TRACE).requests
    caps = SWEEP
    if benchmark.disabled:
        reqs, caps = reqs[:300], caps[:2]
    sums = benchmark.pedantic(lambda: run_sweep(spec, reqs, caps), rounds=1, iterations=1)
    assert len(sums) == len(caps) * len(POLICIES)


def test_compare_all(benchmark: Any) -> None:
    benchmark.group = "prefixcache compare --workload all"

    def run() -> None:
        with redirect_stdout(io.StringIO()):
            assert main(["compare", "--workload", "all", "--quiet"]) == 0

    benchmark.pedantic(run, rounds=1 if benchmark.disabled else 3, iterations=1)


@pytest.mark.parametrize("impl", ["core", "reference"])
def test_study_workload_f_core_vs_reference(benchmark: Any, impl: str) -> None:
    benchmark.group = "replay: workload F, radix, slot model"
    from prefixcache.reference.radix import RadixCache as Reference

    w = study_workload("F", 0)
    cls = None if impl == "core" else Reference

    def run() -> Any:
        return replay(w.requests, [RadixPolicy(w.capacity or 0, cache_cls=cls)])

    benchmark.pedantic(
        run, rounds=1 if benchmark.disabled or impl == "reference" else 5, iterations=1
    )


@pytest.mark.skipif(not blocks_available(), reason="KVCacheManager not built")
@pytest.mark.parametrize("impl", ["core", "reference"])
def test_study_workload_f_blocks_core_vs_reference(benchmark: Any, impl: str) -> None:
    benchmark.group = "replay: workload F, vllm-blocks, slot model"
    from prefixcache.reference.blocks import KVCacheManager as Reference
    from prefixcache.sim.policies import BlocksPolicy

    w = study_workload("F", 0)
    cls = None if impl == "core" else Reference

    def run() -> Any:
        return replay(w.requests, [BlocksPolicy(w.capacity or 0, manager_cls=cls)])

    benchmark.pedantic(
        run, rounds=1 if benchmark.disabled or impl == "reference" else 5, iterations=1
    )


def _time_model_records(n: int) -> list[Any]:
    """Records as a time-model replay leaves them: counts, times, a few unset (NaN)."""
    from prefixcache.sim.requests import RequestRecord

    out = []
    for i in range(n):
        r = RequestRecord(i, None, 0, 6000 + i % 997, 300 + i % 89, arrival=i * 0.037)
        r.hit_tokens, r.evicted_tokens = (i * 7919) % 6000, (i * 104729) % 20000
        if i % 50:
            r.first_token = r.arrival + 0.5 + (i % 13) / 7
            r.finished = r.first_token + 3.25 + (i % 11) / 3
            r.ttft = r.first_token - r.arrival
        out.append(r)
    return out


@pytest.mark.parametrize("path", ["record_lines", "to_dict"])
def test_replay_json_records(benchmark: Any, path: str, tmp_path: Path) -> None:
    """One policy's per-request records of a 12,031-request replay written as ``--json``
    writes them (`record_lines`), against the general encoder on their dicts."""
    from prefixcache.sim.json_report import record_lines, write_json

    benchmark.group = "replay --json: 12,031 per-request records of one policy"
    recs = _time_model_records(300 if benchmark.disabled else 12_031)
    out = tmp_path / "records.json"

    def run() -> None:
        if path == "record_lines":
            write_json(out, {"records": {"radix": record_lines(recs)}})
        else:
            write_json(out, {"records": {"radix": [r.to_dict() for r in recs]}})

    benchmark.pedantic(run, rounds=1 if benchmark.disabled else 7, iterations=1)
    assert out.read_text().count('{"id": ') == len(recs)
