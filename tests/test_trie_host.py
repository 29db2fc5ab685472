"""BlockTrie's host tier (TensorRT-LLM's secondary level, docs/TRTLLM.md): the Rust core
against the plain-Python reference on random operation sequences (every result, error,
event, counter and block, GPU and host), and scenarios through the Python API."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_trie_differential import CLAIM_FIELDS, LOOKUP_FIELDS, op_st, outcome, state

from prefixcache import BlockTrie, PrefixCacheError, TrieBlockMoved, TrieBlockRemoved
from prefixcache.errors import InvalidInputError, InvalidTypeError
from prefixcache.reference.trie import BlockTrie as RefTrie

HOST_CLAIM_FIELDS = (*CLAIM_FIELDS, "num_host_blocks", "num_host_tokens")
HOST_LOOKUP_FIELDS = (*LOOKUP_FIELDS, "num_host_blocks", "num_host_tokens")


def host_state(impl: Any) -> Any:
    left = impl.stats["evicted_tokens"] + impl.host_stats()["stored_tokens"]
    assert impl.num_tokens_left_gpu == left
    return (
        impl.num_tokens_left_gpu,
        impl.host_blocks,
        impl.secondary_offload_min_priority,
        impl.num_host_cached_blocks,
        impl.num_host_cached_tokens,
        impl.host_stats(),
        impl.host_dump(),
    )


# A request's whole life in one step (claim, complete, store, release), so that blocks
# are cached and freed often enough for the small pools to offload, onboard and evict.
# Prompts share a few prefixes, so that offloaded blocks are matched again.
PREFIXES = ([0, 1, 2, 0, 1, 2], [1, 1, 1, 1], [2, 0, 2, 0, 2, 0, 2], [0, 1, 2, 2])
cycle_st = st.tuples(
    st.just("cycle"),
    st.integers(6, 9),
    st.tuples(
        st.sampled_from(PREFIXES), st.integers(1, 7), st.lists(st.integers(0, 2), max_size=4)
    ).map(lambda t: t[0][: t[1]] + t[2]),
    st.sampled_from([None, 10, 35, 80]),
    st.sampled_from([None, 2]),
)
host_op_st = st.one_of(cycle_st, cycle_st, op_st)


def host_outcome(impl: Any, op: tuple[Any, ...], prompts: dict[int, list[int]]) -> Any:
    """``outcome`` plus the host fields of a claim or lookup, and the cycle step."""
    if op[0] == "lookup":
        lk = impl.lookup(op[1], lora_id=op[2])
        return ("ok", tuple(getattr(lk, f) for f in HOST_LOOKUP_FIELDS))
    if op[0] == "cycle":
        _, rid, toks, pr, ret = op
        try:
            c = impl.claim(rid, toks, priority=pr, retention=ret)
        except PrefixCacheError as e:
            return ("err", type(e).__name__)
        impl.complete(rid)
        impl.store(rid, toks)
        impl.release(rid)
        return ("ok", tuple(getattr(c, f) for f in HOST_CLAIM_FIELDS))
    return outcome(impl, op, prompts)


def step_both(
    core: BlockTrie, ref: RefTrie, op: tuple[Any, ...], prompts: dict[int, list[int]], seed: int
) -> None:
    """Applies `op` to both tries: the same outcome, the same state, the core's invariants
    hold; `prompts` follows each request's tokens."""
    a, b = host_outcome(core, op, prompts), host_outcome(ref, op, prompts)
    assert a == b, (seed, op)
    if a[0] == "ok" and op[0] == "claim":
        prompts[op[1]] = list(op[2])
    elif a[0] == "ok" and op[0] == "store":
        prompts[op[1]] = prompts.get(op[1], [0]) + list(op[2])
    elif a[0] == "ok" and op[0] == "release":
        prompts.pop(op[1], None)
    core.check_invariants()
    assert host_state(core) == host_state(ref), (seed, op)
    assert state(core) == state(ref), (seed, op)


@settings(max_examples=250, deadline=None)
@given(
    ops=st.lists(host_op_st, min_size=5, max_size=50),
    num_blocks=st.integers(4, 8),
    host=st.integers(0, 6),
    min_priority=st.sampled_from([0, 30, 35, 50, 100]),
    tpb=st.sampled_from([2, 3]),
    partial=st.booleans(),
    copy=st.booleans(),
)
def test_core_equals_reference_with_a_host_tier(
    ops: list[tuple[Any, ...]],
    num_blocks: int,
    host: int,
    min_priority: int,
    tpb: int,
    partial: bool,
    copy: bool,
) -> None:
    core = BlockTrie(num_blocks, tpb, partial, copy, host, min_priority)
    ref = RefTrie(num_blocks, tpb, partial, copy, host, min_priority)
    prompts: dict[int, list[int]] = {}
    for op in ops:
        if op[0] == "claim":
            a, b = outcome(core, op, prompts), outcome(ref, op, prompts)
            assert a == b, op
            if a[0] == "ok":
                # The host fields of the claim just made: the loaded counter moved by them.
                assert core.host_stats()["loaded_tokens"] == ref.host_stats()["loaded_tokens"]
                prompts[op[1]] = list(op[2])
        else:
            a = host_outcome(core, op, prompts)
            b = host_outcome(ref, op, prompts)
            assert a == b, op
            if a[0] == "ok" and op[0] == "store":
                prompts[op[1]] = prompts.get(op[1], [0]) + list(op[2])
            elif a[0] == "ok" and op[0] == "release":
                prompts.pop(op[1], None)
        core.check_invariants()
        assert host_state(core) == host_state(ref), op
        assert state(core) == state(ref), op


def test_seeded_random_runs_with_a_host_tier_equal_the_reference() -> None:
    """Longer random runs than hypothesis tends to draw: every run offloads; the set of
    runs onboards, copies from host and evicts from host memory."""
    import random

    seen = dict.fromkeys(("offloaded_blocks", "onboarded_blocks", "host_evicted_blocks"), 0)
    for seed in range(120):
        rng = random.Random(seed)
        args = (rng.randint(4, 8), rng.choice([2, 3]), rng.random() < 0.8, rng.random() < 0.8)
        host, min_pr = rng.randint(1, 6), rng.choice([0, 30, 50])
        core = BlockTrie(*args, host_blocks=host, secondary_offload_min_priority=min_pr)
        ref = RefTrie(*args, host_blocks=host, secondary_offload_min_priority=min_pr)
        prompts: dict[int, list[int]] = {}
        for _ in range(60):
            p = rng.choice(PREFIXES)[: rng.randint(1, 7)]
            p = p + [rng.randrange(3) for _ in range(rng.randint(0, 4))]
            r = rng.random()
            if r < 0.6:
                op: tuple[Any, ...] = ("cycle", rng.randint(6, 9), p, rng.choice([None, 35, 80]), 2)
            elif r < 0.75:
                op = ("claim", rng.randint(0, 2), p, None, None, None, None, None, 0)
            elif r < 0.85:
                op = ("release", rng.randint(0, 2))
            elif r < 0.95:
                op = ("store", rng.randint(0, 2), [])
            else:
                op = ("tick", rng.randint(0, 3))
            step_both(core, ref, op, prompts, seed)
        for k in seen:
            seen[k] += core.host_stats()[k] > 0
    assert min(seen.values()) > 0, seen


def test_seeded_runs_with_a_wide_host_range_and_every_priority_equal_the_reference() -> None:
    """Host ranges up to 30 blocks, so never-used host blocks (made on first use, ranked
    at the default priority by id) compete with freed ones of every priority (0, just
    below and above the default, 100), minimum offload priorities at the default and
    just above it, retention, LoRA, salts, multimodal items, extend and complete."""
    import random

    seen = dict.fromkeys(("offloaded_blocks", "onboarded_blocks", "host_evicted_blocks"), 0)
    mm_choices = [None, [(b"img", 1, 2)], [(b"a", 0, 1), (b"a", 2, 1)], [(b"b", 0, 3)]]
    for seed in range(300):
        rng = random.Random(1000 + seed)
        args = (rng.randint(2, 8), rng.choice([1, 2, 3]), rng.random() < 0.8, rng.random() < 0.6)
        host, min_pr = rng.randint(1, 30), rng.choice([0, 30, 35, 36, 100])
        core = BlockTrie(*args, host_blocks=host, secondary_offload_min_priority=min_pr)
        ref = RefTrie(*args, host_blocks=host, secondary_offload_min_priority=min_pr)
        prompts: dict[int, list[int]] = {}
        for _ in range(80):
            p = rng.choice(PREFIXES)[: rng.randint(1, 7)]
            p = p + [rng.randrange(3) for _ in range(rng.randint(0, 4))]
            r = rng.random()
            pr = rng.choice([None, 0, 10, 34, 35, 36, 100])
            ret = rng.choice([None, 1, 3])
            rid = rng.randint(0, 2)
            op: tuple[Any, ...]
            if r < 0.55:
                op = ("cycle", rng.randint(6, 9), p, pr, ret)
            elif r < 0.7:
                lora, salt = rng.choice([None, 1]), rng.choice([None, "s", "t"])
                mm = rng.choice(mm_choices) if len(p) >= 3 else None
                op = ("claim", rid, p, lora, salt, mm, pr, ret, rng.randint(0, 3))
            elif r < 0.8:
                op = ("release", rid)
            elif r < 0.87:
                op = ("store", rid, [rng.randrange(3) for _ in range(rng.randint(0, 3))])
            elif r < 0.92:
                op = ("extend", rid, rng.randint(0, 20))
            elif r < 0.95:
                op = ("complete", rid)
            else:
                op = ("tick", rng.randint(0, 3))
            step_both(core, ref, op, prompts, seed)
        for k in seen:
            seen[k] += core.host_stats()[k] > 0
    assert min(seen.values()) > 0, seen


def test_a_shared_prefix_workload_with_a_host_tier_equals_the_reference() -> None:
    """Requests sharing system prompts on a GPU pool too small for them: blocks are
    offloaded, onboarded, copied from host and evicted from host memory."""
    import random

    rng = random.Random(11)
    core = BlockTrie(60, 16, host_blocks=40)
    ref = RefTrie(60, 16, host_blocks=40)
    systems = [[rng.randrange(1000) for _ in range(rng.randrange(20, 90))] for _ in range(6)]
    live: list[int] = []
    for rid in range(300):
        prompt = rng.choice(systems) + [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
        out = [rng.randrange(1000) for _ in range(rng.randrange(1, 30))]
        pr = rng.choice([None, 10, 80])
        while True:
            try:
                a = core.claim(rid, prompt, reserve_tokens=len(out), priority=pr)
            except InvalidInputError:
                raise
            except Exception:
                old = live.pop(0)
                core.release(old)
                ref.release(old)
                continue
            b = ref.claim(rid, prompt, reserve_tokens=len(out), priority=pr)
            break
        assert tuple(getattr(a, f) for f in HOST_CLAIM_FIELDS) == tuple(
            getattr(b, f) for f in HOST_CLAIM_FIELDS
        )
        for impl in (core, ref):
            impl.complete(rid)
            impl.store(rid, prompt)
            impl.store(rid, prompt + out)
        live.append(rid)
        if len(live) > 3:
            old = live.pop(0)
            core.release(old)
            ref.release(old)
        core.check_invariants()
        assert host_state(core) == host_state(ref)
        assert state(core) == state(ref)
    hs = core.host_stats()
    assert hs["offloaded_blocks"] > 0
    assert hs["onboarded_blocks"] > 0
    assert hs["host_evicted_blocks"] > 0
    assert core.stats["evicted_blocks"] > 0  # priority 10 is below the minimum 30


def test_offload_and_onboard_through_the_api() -> None:
    t = BlockTrie(2, 2, host_blocks=4)
    assert (t.num_blocks, t.host_blocks, t.secondary_offload_min_priority) == (2, 4, 30)
    assert t.host_dump() == [False, False, True, True, True, True]
    for rid, prompt in ((1, [1, 2, 3]), (2, [7, 8, 9])):
        t.claim(rid, prompt)
        t.store(rid, prompt)
        t.release(rid)
    ev = t.take_events()
    assert [e for e in ev if isinstance(e, TrieBlockMoved)] == [
        TrieBlockMoved([0], [ev[0].block_hashes[0]], "CPU")
    ]
    assert (t.num_cached_blocks, t.num_host_cached_blocks, t.num_host_cached_tokens) == (1, 1, 2)
    lk = t.lookup([1, 2, 3])
    assert (lk.num_matched_tokens, lk.num_host_blocks, lk.num_host_tokens) == (2, 1, 2)
    c = t.claim(3, [1, 2, 3])
    assert (c.num_host_blocks, c.num_host_tokens) == (1, 2)
    moves = [(e.block_ids, e.medium) for e in t.take_events() if isinstance(e, TrieBlockMoved)]
    assert moves == [([0], "GPU"), ([1], "CPU")]
    assert t.host_stats() == {
        "offloaded_blocks": 2,
        "stored_tokens": 4,
        "onboarded_blocks": 1,
        "loaded_tokens": 2,
        "host_evicted_blocks": 0,
        "host_evicted_tokens": 0,
        "peak_host_tokens": 2,
    }
    t.check_invariants()


def test_a_minimum_priority_above_the_blocks_disables_offload() -> None:
    t = BlockTrie(2, 2, host_blocks=4, secondary_offload_min_priority=36)
    for rid, prompt in ((1, [1, 2, 3]), (2, [7, 8, 9])):
        t.claim(rid, prompt)  # priority 35
        t.store(rid, prompt)
        t.release(rid)
    ev = t.take_events()
    assert not any(isinstance(e, TrieBlockMoved) for e in ev)
    assert [e.block_ids for e in ev if isinstance(e, TrieBlockRemoved)] == [[0]]
    assert t.lookup([1, 2, 3]).num_matched_tokens == 0
    assert set(t.host_stats().values()) == {0}


def test_without_a_host_tier_nothing_changes() -> None:
    t = BlockTrie(4, 2)
    assert (t.host_blocks, t.secondary_offload_min_priority) == (0, None)
    assert t.host_dump() == [False] * 4
    assert len(t.dump()) == 4
    assert set(t.host_stats().values()) == {0}


@pytest.mark.parametrize(
    ("kwargs", "exc", "fragment"),
    [
        ({"host_blocks": -1}, InvalidInputError, "host_blocks must be >= 0"),
        ({"host_blocks": "4"}, InvalidTypeError, "host_blocks must be an int"),
        ({"secondary_offload_min_priority": 101}, InvalidInputError, "[0, 100]"),
        ({"secondary_offload_min_priority": -1}, InvalidInputError, "[0, 100]"),
        ({"secondary_offload_min_priority": 1.5}, InvalidTypeError, "must be an int"),
        ({"host_blocks": 2**32}, InvalidInputError, "num_blocks + host_blocks"),
    ],
)
def test_bad_host_tier_arguments(kwargs: dict[str, Any], exc: type, fragment: str) -> None:
    with pytest.raises(exc, match=re.escape(fragment)):
        BlockTrie(4, 2, **kwargs)


def test_a_host_subtree_deeper_than_the_recursion_limit_leaves_with_its_root() -> None:
    """A cached GPU block whose host descendants form a chain of 1500 blocks is evicted with
    them: the reference walks that subtree without recursion and agrees with the core."""
    depth = 1500
    impls = [cls(depth + 3, 1, host_blocks=depth) for cls in (BlockTrie, RefTrie)]
    for t in impls:
        t.claim(1, [7, 7], priority=10)
        t.complete(1)
        t.store(1, [7, 7])
        t.release(1)
        chain = [7, *range(100, 100 + depth), 1]
        t.claim(2, chain)
        t.complete(2)
        t.store(2, chain)
        t.release(2)
        t.claim(3, list(range(10_000, 10_000 + depth + 3)))
    core, ref = impls
    assert state(core) == state(ref) and host_state(core) == host_state(ref)
    assert core.host_stats()["host_evicted_blocks"] == depth
