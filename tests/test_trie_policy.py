"""The ``trtllm`` / ``trtllm-nopartial`` simulator policies (TensorRT-LLM's block trie) on
the A-F workloads: partial reuse of the last block, and the core against the reference
trie through the whole scheduler."""

from __future__ import annotations

import pytest

from prefixcache.reference.trie import BlockTrie as RefTrie
from prefixcache.sim.policies.trtllm import TrtllmPolicy, parse_trtllm_name
from prefixcache.sim.replay import ReplayResult, replay, summarize
from prefixcache.sim.workloads import study_workload


def run(
    workload: str, seed: int, *policies: object, check: bool = False
) -> dict[str, ReplayResult]:
    """Replay; ``check`` runs every policy's full invariant check after every step."""
    w = study_workload(workload, seed)
    return {r.policy: r for r in replay(w.requests, list(policies), w.capacity, check=check)}


def hits(res: ReplayResult) -> list[int]:
    return [r.hit_tokens for r in res.records]


def test_policy_names() -> None:
    assert parse_trtllm_name("trtllm") == (64, True)
    assert parse_trtllm_name("trtllm16") == (16, True)
    assert parse_trtllm_name("trtllm-nopartial") == (64, False)
    assert parse_trtllm_name("trtllm-nopartial32") == (32, False)
    assert parse_trtllm_name("trtllm0") is None
    assert parse_trtllm_name("trtllm-x") is None


@pytest.mark.parametrize("seed", [0])
def test_a_partial_reuse_recovers_the_tail_of_the_system_prompt(seed: int) -> None:
    res = run("A", seed, "radix", "trtllm", "trtllm16", "trtllm-nopartial", "trtllm-nopartial16")
    assert hits(res["trtllm"]) == hits(res["radix"]) == [0] + [1000] * 255
    assert hits(res["trtllm16"]) == [0] + [1000] * 255
    # Without partial reuse only whole blocks: 15 x 64 and 62 x 16 tokens.
    assert hits(res["trtllm-nopartial"]) == [0] + [960] * 255
    assert hits(res["trtllm-nopartial16"]) == [0] + [992] * 255
    s = summarize(res["trtllm"])
    assert s["partial_hits"] == 255 and s["partial_tokens"] == 255 * 40
    # Partial matches of a tail block some running request holds are copied.
    assert 1 <= s["copies"] <= 255 and s["copied_tokens"] == 40 * s["copies"]


@pytest.mark.parametrize("seed", [0, 1])
def test_c_partial_reuse_hits_the_12_token_prefix(seed: int) -> None:
    res = run("C", seed, "radix", "trtllm16", "trtllm-nopartial16", check=True)
    assert hits(res["trtllm16"]) == hits(res["radix"]) == [0] + [12] * 255
    assert hits(res["trtllm-nopartial16"]) == [0] * 256
    assert summarize(res["trtllm16"])["partial_hits"] == 255


@pytest.mark.parametrize("workload", ["A", "C", "D"])
def test_nopartial_equals_page16_tree_on_aligned_hits(workload: str) -> None:
    """Without partial reuse and without eviction the trie hits whole blocks only, like
    the page-16 tree; it may miss one more block on D, where the tree caches the last
    output token's KV and TensorRT-LLM (len - 1 tokens) does not."""
    res = run(workload, 0, "radix-page16", "trtllm-nopartial16")
    diff = [
        a - b
        for a, b in zip(hits(res["radix-page16"]), hits(res["trtllm-nopartial16"]), strict=True)
    ]
    if workload == "D":
        assert set(diff) <= {0, 16}
    else:
        assert diff == [0] * len(diff)


@pytest.mark.parametrize("workload", ["E", "F"])
def test_core_equals_reference_trie_through_the_scheduler(workload: str) -> None:
    w = study_workload(workload, 0)
    core = TrtllmPolicy(w.capacity, name="core")
    ref = TrtllmPolicy(w.capacity, trie_cls=RefTrie, name="ref")
    a, b = replay(w.requests, [core, ref], w.capacity, check=True)
    assert hits(a) == hits(b)
    sa, sb = summarize(a), summarize(b)
    assert (sa["evicted_tokens"], sa["evictions"]) == (sb["evicted_tokens"], sb["evictions"])
    assert sa["evicted_tokens"] > 0
    assert core.trie.stats == ref.trie.stats
