"""BlockTrie (Rust core) against the plain-Python reference on random operation sequences:
every result, error class, event, counter and block must agree, and the core's invariants
must hold after every step."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache import BlockTrie, PrefixCacheError
from prefixcache.reference.trie import BlockTrie as RefTrie

CLAIM_FIELDS = (
    "block_ids",
    "num_matched_tokens",
    "num_reused_blocks",
    "partial",
    "partial_tokens",
    "partial_kind",
    "partial_block",
    "copies",
)
LOOKUP_FIELDS = CLAIM_FIELDS[1:-1]

tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=16)
rid_st = st.integers(0, 5)

op_st = st.one_of(
    st.tuples(
        st.just("claim"),
        rid_st,
        tokens_st,
        st.sampled_from([None, 1]),
        st.sampled_from([None, "s"]),
        st.sampled_from([None, [(b"img", 1, 2)]]),
        st.sampled_from([None, 10, 35, 80]),
        st.sampled_from([None, 2]),
        st.integers(0, 5),
    ),
    st.tuples(st.just("store"), rid_st, st.lists(st.integers(0, 2), max_size=6)),
    st.tuples(st.just("store_prefix"), rid_st, st.integers(0, 16)),
    st.tuples(st.just("extend"), rid_st, st.integers(0, 24)),
    st.tuples(st.just("complete"), rid_st),
    st.tuples(st.just("release"), rid_st),
    st.tuples(st.just("lookup"), tokens_st, st.sampled_from([None, 1])),
    st.tuples(st.just("tick"), st.integers(0, 3)),
)


def run(impl: Any, op: tuple[Any, ...], prompts: dict[int, list[int]]) -> Any:
    kind = op[0]
    if kind == "claim":
        _, rid, toks, lora, salt, mm, pr, ret, reserve = op
        mm = mm if mm is None or len(toks) >= 3 else None
        c = impl.claim(
            rid,
            toks,
            lora_id=lora,
            cache_salt=salt,
            mm_items=mm,
            priority=pr,
            retention=ret,
            reserve_tokens=reserve,
        )
        return tuple(getattr(c, f) for f in CLAIM_FIELDS)
    if kind == "store":
        _, rid, more = op
        base = prompts.get(rid, [0])
        return impl.store(rid, base + more)
    if kind == "store_prefix":
        _, rid, k = op
        return impl.store(rid, prompts.get(rid, [0])[:k])
    if kind == "extend":
        return impl.extend(op[1], op[2])
    if kind == "complete":
        return impl.complete(op[1])
    if kind == "release":
        return impl.release(op[1])
    if kind == "lookup":
        lk = impl.lookup(op[1], lora_id=op[2])
        return tuple(getattr(lk, f) for f in LOOKUP_FIELDS)
    impl.advance_clock(op[1])
    return None


def outcome(impl: Any, op: tuple[Any, ...], prompts: dict[int, list[int]]) -> Any:
    try:
        return ("ok", run(impl, op, prompts))
    except PrefixCacheError as e:
        return ("err", type(e).__name__)


def state(impl: Any) -> Any:
    return (
        impl.num_free_blocks,
        impl.num_cached_blocks,
        impl.num_cached_tokens,
        impl.num_requests,
        impl.clock,
        impl.stats,
        impl.take_events(),
        impl.dump(),
    )


@settings(max_examples=250, deadline=None)
@given(
    ops=st.lists(op_st, min_size=1, max_size=40),
    num_blocks=st.integers(4, 14),
    tpb=st.sampled_from([1, 2, 3, 4]),
    partial=st.booleans(),
    copy=st.booleans(),
)
def test_core_equals_reference(
    ops: list[tuple[Any, ...]], num_blocks: int, tpb: int, partial: bool, copy: bool
) -> None:
    core = BlockTrie(num_blocks, tpb, partial, copy)
    ref = RefTrie(num_blocks, tpb, partial, copy)
    prompts: dict[int, list[int]] = {}
    for op in ops:
        a = outcome(core, op, prompts)
        b = outcome(ref, op, prompts)
        assert a == b, op
        if a[0] == "ok":
            if op[0] == "claim":
                prompts[op[1]] = list(op[2])
            elif op[0] == "store":
                prompts[op[1]] = prompts.get(op[1], [0]) + list(op[2])
            elif op[0] == "release":
                prompts.pop(op[1], None)
        core.check_invariants()
        assert state(core) == state(ref), op


def test_shared_prefix_workload_equals_reference() -> None:
    """A longer, realistic run: requests sharing system prompts, partial last blocks,
    decode growth and eviction under pressure."""
    import random

    rng = random.Random(7)
    core = BlockTrie(120, 16)
    ref = RefTrie(120, 16)
    systems = [[rng.randrange(1000) for _ in range(rng.randrange(20, 90))] for _ in range(4)]
    live: list[int] = []
    for rid in range(300):
        prompt = rng.choice(systems) + [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
        out = [rng.randrange(1000) for _ in range(rng.randrange(1, 30))]
        while True:
            try:
                a = core.claim(rid, prompt, reserve_tokens=len(out))
            except PrefixCacheError:
                old = live.pop(0)
                core.release(old)
                ref.release(old)
                continue
            b = ref.claim(rid, prompt, reserve_tokens=len(out))
            break
        assert tuple(getattr(a, f) for f in CLAIM_FIELDS) == tuple(
            getattr(b, f) for f in CLAIM_FIELDS
        )
        for impl in (core, ref):
            impl.complete(rid)
            impl.store(rid, prompt)
            impl.store(rid, prompt + out)
        live.append(rid)
        if len(live) > 4:
            old = live.pop(0)
            core.release(old)
            ref.release(old)
        core.check_invariants()
        assert state(core) == state(ref)
    assert core.stats["partial_hits"] > 0
    assert core.stats["evicted_blocks"] > 0
