"""The vllm-blocks policy with vLLM's CPU offloading tier in the simulator."""

from __future__ import annotations

import pytest

from prefixcache.sim.policies.vllm import BlocksPolicy
from prefixcache.sim.replay import replay
from prefixcache.sim.workloads import study_workload


def _run(cpu: int, offload: str | None = None, model: str = "time") -> tuple[list, object]:
    reqs = study_workload("F").requests
    pol = BlocksPolicy(4000, cpu_capacity=cpu, offload=offload)
    (res,) = replay(reqs, [pol], model=model, check=True)
    return [(r.hit_tokens, r.evicted_tokens) for r in res.records], res.stats


@pytest.mark.parametrize("model", ["slots", "time"])
def test_no_tier_is_todays_policy(model: str) -> None:
    reqs = study_workload("F").requests
    (plain,) = replay(reqs, ["vllm-blocks"], 4000, model=model)
    got, stats = _run(0, model=model)
    assert got == [(r.hit_tokens, r.evicted_tokens) for r in plain.records]
    assert stats.to_dict() == plain.stats.to_dict()  # type: ignore[attr-defined]
    assert stats.host_hit_tokens == stats.stored_tokens == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("offload", ["lru", "arc", "lru:2", "arc:2"])
def test_tier_adds_host_hits(offload: str) -> None:
    base, _ = _run(0)
    got, stats = _run(40_000, offload)
    s = stats.to_dict()  # type: ignore[attr-defined]
    assert s["cpu_capacity"] == 40_000
    assert s["stored_tokens"] > 0 and s["peak_host_tokens"] <= 40_000
    assert s["host_hit_tokens"] > 0
    assert sum(h for h, _ in got) > sum(h for h, _ in base)


def test_small_tier_evicts() -> None:
    _, stats = _run(2000, "lru")
    s = stats.to_dict()  # type: ignore[attr-defined]
    assert s["host_evicted_tokens"] > 0 and s["peak_host_tokens"] <= 2000
