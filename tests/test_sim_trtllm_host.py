"""The simulator's trtllm policies with TensorRT-LLM's host tier (docs/TRTLLM.md,
docs/SIMULATOR.md "Offload"): no tier is today's policy exactly, a tier raises the hit
rate of a workload that overflows the GPU, a minimum priority above the blocks' disables
it, the core and the plain-Python reference replay it identically, and the command line
reports it end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from prefixcache.errors import InvalidInputError
from prefixcache.reference.trie import BlockTrie as RefTrie
from prefixcache.sim.cli import main
from prefixcache.sim.policies import check_sizes, make_policy
from prefixcache.sim.policies.trtllm import TrtllmPolicy, parse_trtllm_offload
from prefixcache.sim.replay import RUN_FIELDS, replay, summarize
from prefixcache.sim.workloads import study_workload

GPU = 8_000  # workload F's prompts overflow 8k tokens of GPU memory
HOST = 32_000


def _outcome(res: Any) -> tuple[Any, ...]:
    summary = {k: v for k, v in res.summary().items() if k not in RUN_FIELDS}
    return (summary, [r.hit_tokens for r in res.records], dataclasses.asdict(res.stats))


def test_no_tier_is_todays_policy() -> None:
    reqs = study_workload("F", 0).requests
    base = replay(reqs, [TrtllmPolicy(GPU)])[0]
    zero = replay(reqs, [TrtllmPolicy(GPU, cpu_capacity=0, offload="host:50")])[0]
    assert _outcome(base) == _outcome(zero)


def test_a_host_tier_raises_the_hit_rate_and_a_high_minimum_priority_disables_it() -> None:
    reqs = study_workload("F", 0).requests
    plain, host, high = replay(
        reqs,
        [
            TrtllmPolicy(GPU, name="plain"),
            TrtllmPolicy(GPU, cpu_capacity=HOST, name="host"),
            # Blocks are claimed at the default priority 35: nothing is offloaded at 36.
            TrtllmPolicy(GPU, cpu_capacity=HOST, offload="host:36", name="high"),
        ],
        check=True,
    )
    assert host.stats.host_hit_tokens > 0
    assert summarize(host)["hit_tokens"] > summarize(plain)["hit_tokens"]
    assert host.stats.stored_tokens > 0 and host.stats.peak_host_tokens <= HOST
    assert [r.hit_tokens for r in high.records] == [r.hit_tokens for r in plain.records]
    assert (high.stats.host_hit_tokens, high.stats.stored_tokens) == (0, 0)
    assert high.stats.evicted_tokens == plain.stats.evicted_tokens
    # Offloaded blocks left the GPU: they count as evicted there and as stored.
    assert host.stats.evicted_tokens >= host.stats.stored_tokens


@pytest.mark.parametrize("offload", ["host", "host:0"])
def test_core_equals_reference_trie_through_the_scheduler(offload: str) -> None:
    reqs = study_workload("F", 0).requests[:120]
    core = TrtllmPolicy(GPU, cpu_capacity=HOST // 4, offload=offload, name="core")
    ref = TrtllmPolicy(GPU, cpu_capacity=HOST // 4, offload=offload, trie_cls=RefTrie, name="ref")
    a, b = replay(reqs, [core, ref], check=True)
    assert [r.hit_tokens for r in a.records] == [r.hit_tokens for r in b.records]
    assert dataclasses.asdict(a.stats) | {"name": 0} == dataclasses.asdict(b.stats) | {"name": 0}
    assert core.trie.stats == ref.trie.stats
    assert core.trie.host_stats() == ref.trie.host_stats()
    assert core.trie.host_stats()["onboarded_blocks"] > 0
    assert core.trie.host_stats()["host_evicted_blocks"] > 0


def test_time_model_loads_host_hits() -> None:
    reqs = study_workload("F", 0).requests
    (res,) = replay(reqs, [TrtllmPolicy(GPU, cpu_capacity=HOST)], model="time", check=True)
    s = summarize(res)
    assert s["host_hit_tokens"] > 0 and s["loaded_tokens"] > 0
    assert s["gpu_hit_tokens"] + s["loaded_tokens"] == s["hit_tokens"]


def test_make_policy_gives_trtllm_its_tier() -> None:
    pol = make_policy("trtllm16", 6400, cpu_capacity=640, offload="host:40")
    assert isinstance(pol, TrtllmPolicy)
    assert (pol.cpu_capacity, pol.host_blocks, pol.offload) == (640, 40, "host:40")
    assert (pol.trie.host_blocks, pol.trie.secondary_offload_min_priority) == (40, 40)
    pol = make_policy("trtllm-nopartial", 6400, cpu_capacity=640)
    assert (pol.trie.host_blocks, pol.trie.secondary_offload_min_priority) == (10, 30)


def test_bad_tier_arguments() -> None:
    assert [parse_trtllm_offload(x) for x in (None, "host", "host:0", "host:100")] == [
        30,
        30,
        0,
        100,
    ]
    for bad in ("host:101", "host:", "host:07", "lru", "host:x"):
        with pytest.raises(InvalidInputError, match="offload must be host"):
            TrtllmPolicy(6400, cpu_capacity=640, offload=bad)
    with pytest.raises(InvalidInputError, match=r"^trtllm: cpu_capacity 63 is less than one 64-"):
        TrtllmPolicy(6400, cpu_capacity=63)
    # The same check before the capacity is known names the policy too.
    with pytest.raises(InvalidInputError, match=r"^trtllm16: cpu_capacity 8 is less than one 16-"):
        check_sizes("trtllm16", None, 8)
    with pytest.raises(InvalidInputError, match="cpu_capacity must be an int >= 0"):
        TrtllmPolicy(6400, cpu_capacity=-1)


def test_cli_replay_reports_the_trtllm_host_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js = tmp_path / "r.json"
    argv = ["replay", "workload:F", "--policies", "trtllm", "trtllm16", "--capacity", "8k"]
    argv += ["--model", "time", "--cpu-capacity", "32k", "--offload", "trtllm16=host:0"]
    assert main([*argv, "--jobs", "1", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "host tier" in out and "not worth" in out
    d = json.loads(js.read_text())
    by_name = {s["policy"]: s for s in d["summaries"]}
    for name, offload in (("trtllm", None), ("trtllm16", "host:0")):
        s = by_name[name]
        assert (s["cpu_capacity"], s["offload"]) == (32_000, offload)
        assert s["host_hit_tokens"] > 0 and s["stored_tokens"] > 0
        assert s["gpu_hit_tokens"] + s["loaded_tokens"] == s["hit_tokens"]
        recs = d["records"][name]
        assert sum(r["host_hit_tokens"] for r in recs if not r["rejected"]) == s["host_hit_tokens"]
