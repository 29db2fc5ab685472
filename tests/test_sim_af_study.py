"""The A-F study's findings (SEMANTICS.md section 5) as acceptance tests.

Each check compares the token-level tree (``radix``) with vLLM's block rules
(``vllm-blocks``) per request, under the slot model. The page-16 tree must equal the block
rules exactly on A, C and D, so every check is also run against ``radix-page16``.
"""

from __future__ import annotations

import pytest

from prefixcache.sim.policies import blocks_available
from prefixcache.sim.replay import ReplayResult, replay, summarize
from prefixcache.sim.workloads import study_workload

HAVE_BLOCKS = blocks_available()
needs_blocks = pytest.mark.skipif(not HAVE_BLOCKS, reason="KVCacheManager not built yet")

SEEDS = [0, 1, 2]
BLOCKISH = ["radix-page16", pytest.param("vllm-blocks", marks=needs_blocks)]


def run(workload: str, seed: int, *policies: str) -> dict[str, ReplayResult]:
    w = study_workload(workload, seed)
    return {r.policy: r for r in replay(w.requests, list(policies), w.capacity, check=True)}


def hits(res: ReplayResult) -> list[int]:
    return [r.hit_tokens for r in res.records]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("blocks", BLOCKISH)
def test_a_tree_hits_8_more_per_request_after_the_first(seed: int, blocks: str) -> None:
    res = run("A", seed, "radix", blocks)
    tree, blk = hits(res["radix"]), hits(res[blocks])
    assert tree[0] == blk[0] == 0
    assert tree[1:] == [1000] * 255
    assert blk[1:] == [992] * 255
    assert sum(tree) - sum(blk) == 2040


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("blocks", BLOCKISH)
def test_b_identical_hits(seed: int, blocks: str) -> None:
    res = run("B", seed, "radix", blocks)
    assert hits(res["radix"]) == hits(res[blocks])
    assert hits(res["radix"])[1:] == [1008] * 255


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("blocks", BLOCKISH)
def test_c_blocks_hit_nothing_tree_hits_12(seed: int, blocks: str) -> None:
    res = run("C", seed, "radix", blocks)
    assert hits(res[blocks]) == [0] * 256
    assert hits(res["radix"]) == [0] + [12] * 255


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("workload", ["A", "C", "D"])
@needs_blocks
def test_page16_tree_equals_blocks_exactly(seed: int, workload: str) -> None:
    res = run(workload, seed, "radix-page16", "vllm-blocks")
    assert hits(res["radix-page16"]) == hits(res["vllm-blocks"])
    a, b = summarize(res["radix-page16"]), summarize(res["vllm-blocks"])
    assert a["evicted_tokens"] == b["evicted_tokens"] == 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("blocks", BLOCKISH)
def test_d_tree_ahead_by_a_fraction_of_a_point(seed: int, blocks: str) -> None:
    res = run("D", seed, "radix", blocks)
    tree, blk = summarize(res["radix"]), summarize(res[blocks])
    assert tree["prompt_tokens"] == blk["prompt_tokens"]
    lead = 100.0 * (tree["hit_rate"] - blk["hit_rate"])
    assert 0.3 <= lead <= 1.0, lead
    # Per request the tree never hits less without eviction, and at most 15 more
    # (the tail of the previous turn that does not fill a 16-token block).
    diff = [a - b for a, b in zip(hits(res["radix"]), hits(res[blocks]), strict=True)]
    assert min(diff) >= 0 and max(diff) <= 15


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("blocks", [pytest.param("vllm-blocks", marks=needs_blocks)])
def test_f_tree_evicts_more_tokens_than_blocks(seed: int, blocks: str) -> None:
    res = run("F", seed, "radix", blocks)
    tree, blk = summarize(res["radix"]), summarize(res[blocks])
    assert tree["evicted_tokens"] > blk["evicted_tokens"] > 0


@pytest.mark.parametrize("workload", ["A", "B", "C", "D", "E", "F"])
def test_replays_are_deterministic(workload: str) -> None:
    policies = ["radix", "radix-page16"] + (["vllm-blocks"] if HAVE_BLOCKS else [])
    first = run(workload, 7, *policies)
    second = run(workload, 7, *policies)
    for name in policies:
        assert [repr(r) for r in first[name].records] == [repr(r) for r in second[name].records]
        assert first[name].stats == second[name].stats


def test_e_and_f_evict_under_their_budgets() -> None:
    for name in ["E", "F"]:
        s = summarize(run(name, 0, "radix")["radix"])
        assert s["evicted_tokens"] > 0
        assert s["peak_used_tokens"] <= s["capacity"]


@pytest.mark.parametrize("workload", ["D", "F"])
def test_time_model_replays_are_deterministic(workload: str) -> None:
    policies = ["radix", "radix-page16"] + (["vllm-blocks"] if HAVE_BLOCKS else [])
    w = study_workload(workload, 5)
    a = replay(w.requests, policies, 6000, model="time")
    b = replay(w.requests, policies, 6000, model="time")
    for x, y in zip(a, b, strict=True):
        assert [repr(r) for r in x.records] == [repr(r) for r in y.records]
        assert x.stats == y.stats
