"""Lab benchmarks: the lab cache's acquire + release per request (lru and opt), and the
sequence-model replay of a Mooncake trace with lab-lru against opt (opt must stay within
3x of LRU: docs/LAB.md). The trace comes from ``$PREFIXCACHE_TRACES``
(``mooncake_synthetic.jsonl``); without it the built-in workload D stands in.

With ``--benchmark-disable`` (CI) each runs once on a cut-down input.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache._core import LabCache, lab_block_keys
from prefixcache.sim.replay import replay
from prefixcache.sim.requests import Request
from prefixcache.sim.traces import read_trace
from prefixcache.sim.workloads import study_workload


def _requests(limit: int | None) -> list[Request]:
    folder = os.environ.get("PREFIXCACHE_TRACES")
    path = Path(folder) / "mooncake_synthetic.jsonl" if folder else None
    if path is not None and path.exists():
        reqs = read_trace(path).requests
    else:
        reqs = list(study_workload("D", 0).requests)
    return reqs[:limit] if limit else reqs


def test_lab_cache_acquire_release(benchmark: Any) -> None:
    benchmark.group = "lab: LabCache acquire + release, 1,000 requests of 64 blocks"
    rng = np.random.default_rng(0)
    roots = [rng.integers(0, 2**31, 4096, dtype=np.uint32) for _ in range(50)]
    keys = []
    for i in range(1000):
        toks = np.concatenate(
            [roots[i % 50][: 16 * 32], rng.integers(0, 2**31, 16 * 32, dtype=np.uint32)]
        )
        keys.append(lab_block_keys(toks, 16))
    n = 100 if benchmark.disabled else 1000

    def run() -> None:
        c = LabCache(8192)
        for i in range(n):
            k = keys[i]
            c.acquire(i, k, len(k) - 1, len(k))
            c.release(i)

    benchmark(run)


def test_sequence_replay_lru_vs_opt(benchmark: Any) -> None:
    benchmark.group = "lab: sequence model, lab-lru vs opt, 3M tokens"
    reqs = _requests(300 if benchmark.disabled else None)

    def run() -> list[Any]:
        return replay(reqs, ["lab-lru", "opt"], 3 << 20, model="sequence")

    res = benchmark.pedantic(run, rounds=1, iterations=1)
    for r in res:
        benchmark.extra_info[f"{r.policy}_s"] = round(r.seconds, 3)
    benchmark.extra_info["opt_over_lru"] = round(res[1].seconds / res[0].seconds, 2)
