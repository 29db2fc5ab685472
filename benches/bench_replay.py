"""Simulator benchmarks: the whole Mooncake conversation trace through radix,
radix-page16 and vllm-blocks at one capacity, ``prefixcache compare --workload all``, and
one A-F workload replayed with the Rust tree versus the plain-Python reference tree.

With ``--benchmark-disable`` (CI) each runs once on a cut-down input so the suite stays
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
from prefixcache.sim.replay import replay
from prefixcache.sim.traces import read_trace
from prefixcache.sim.workloads import study_workload

# The full trace is not in the repository: PREFIXCACHE_TRACES names its directory
# (examples/README.md); without it the benchmark is skipped.
TRACE = Path(os.environ.get("PREFIXCACHE_TRACES") or "/nonexistent") / \
    "mooncake_conversation.jsonl"
POLICIES = ["radix", "radix-page16"] + (["vllm-blocks"] if blocks_available() else [])
CAPACITY = 1 << 20  # tokens: about 87 average conversation prompts


@pytest.mark.skipif(not TRACE.exists(), reason="PREFIXCACHE_TRACES is not set (the directory of "
                    "mooncake_conversation.jsonl, see examples/README.md)")
def test_mooncake_conversation_all_policies(benchmark: Any) -> None:
    benchmark.group = "replay: Mooncake conversation, 3 policies, 1M-token KV"
    reqs = read_trace(TRACE).requests
    if benchmark.disabled:
        reqs = reqs[:500]
    results = benchmark.pedantic(lambda: replay(reqs, POLICIES, CAPACITY), rounds=1,
                                 iterations=1)
    for r in results:
        benchmark.extra_info[f"{r.policy}_s"] = round(r.seconds, 3)
        benchmark.extra_info[f"{r.policy}_hit_rate"] = round(
            sum(x.hit_tokens for x in r.records) / sum(x.prompt_tokens for x in r.records), 4)
    assert len(results) == len(POLICIES)


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

    benchmark.pedantic(run, rounds=1 if benchmark.disabled or impl == "reference" else 5,
                       iterations=1)


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

    benchmark.pedantic(run, rounds=1 if benchmark.disabled or impl == "reference" else 5,
                       iterations=1)
