"""Fleet replay benchmarks: 4 instances behind round robin and the cache-aware router
(KV events into the fleet index), on a synthetic shared-prefix workload and, when
``PREFIXCACHE_TRACES`` names the folder holding the Mooncake traces, on the whole
conversation trace at 4 x 3,000,000 tokens (the fleet compared with NVIDIA Dynamo's
replay in docs/FLEET_REPLAY.md).

With ``--benchmark-disable`` (CI) each runs once on a cut-down input.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from prefixcache.sim.fleet import fleet_replay
from prefixcache.sim.scheduler import TimeScheduler
from prefixcache.sim.workloads import shared_prefix_workload

TRACES = os.environ.get("PREFIXCACHE_TRACES")


@pytest.mark.parametrize("router", ["round-robin", "cache-aware"])
def test_fleet_shared_prefix(benchmark: Any, router: str) -> None:
    benchmark.group = "fleet replay: 16 groups x 64 prompts, 4 x vllm-blocks"
    n = 8 if benchmark.disabled else 64
    w = shared_prefix_workload(
        num_groups=16, prompts_per_group=n, seed=0, request_rate=40.0, shuffle=True
    )
    sched = TimeScheduler(max_running=64)
    res = benchmark.pedantic(
        lambda: fleet_replay(w.requests, "vllm-blocks", 1 << 15, 4, router, scheduler=sched),
        rounds=1 if benchmark.disabled else 3,
        iterations=1,
    )
    s = res.summary()
    benchmark.extra_info["hit_rate"] = round(s["hit_rate"], 4)
    benchmark.extra_info["requests"] = s["requests"]


@pytest.mark.skipif(not TRACES, reason="PREFIXCACHE_TRACES is not set")
@pytest.mark.parametrize("router", ["round-robin", "cache-aware"])
def test_fleet_mooncake_conversation(benchmark: Any, router: str) -> None:
    from prefixcache.sim.traces import read_trace

    benchmark.group = "fleet replay: Mooncake conversation, 4 x 3,000,000 tokens"
    reqs = read_trace(str(Path(str(TRACES)) / "mooncake_conversation.jsonl")).requests
    if benchmark.disabled:
        reqs = reqs[:500]
    res = benchmark.pedantic(
        lambda: fleet_replay(reqs, "vllm-blocks", 3_000_000, 4, router), rounds=1, iterations=1
    )
    benchmark.extra_info["hit_rate"] = round(res.summary()["hit_rate"], 4)
    benchmark.extra_info["seconds"] = round(res.seconds, 2)
