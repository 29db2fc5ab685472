"""Differential tests: prefixcache.BlockPool / KVCacheManager (Rust core) against the
plain-Python reference (prefixcache.reference.blocks) on random operation streams.

After every step the two must agree on results, block ids, free-queue order, events and
stats, and both must satisfy the pool invariants.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prefixcache
from prefixcache.reference import blocks as ref

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def norm(x: Any) -> Any:
    """numpy arrays -> lists, recursively in tuples."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, tuple):
        return tuple(norm(v) for v in x)
    return x


def both(core: Any, r: Any, method: str, *args: Any) -> Any:
    """Call the same method on both; same result or same exception class."""
    outcomes = []
    for obj in (core, r):
        try:
            outcomes.append(("ok", norm(getattr(obj, method)(*args))))
        except prefixcache.PrefixCacheError as e:
            outcomes.append(("err", type(e).__name__))
    assert outcomes[0] == outcomes[1], (method, args, outcomes)
    return outcomes[0][1] if outcomes[0][0] == "ok" else None


def ref_pool_invariants(p: ref.BlockPool) -> None:
    assert ref.NULL_BLOCK not in p.free
    for b in range(1, p.num_blocks):
        assert (b in p.free) == (p.ref[b] == 0), b
        if p.key[b] is not None:
            assert b in p.cached[p.key[b]]
    for key, ids in p.cached.items():
        assert ids
        for b in ids:
            assert p.key[b] == key


def check_same_pool(core: Any, r: ref.BlockPool | ref.KVCacheManager) -> None:
    pool = r.pool if isinstance(r, ref.KVCacheManager) else r
    assert core.free_block_ids().tolist() == r.free_block_ids()
    assert core.num_free_blocks == r.num_free_blocks
    assert core.usage == r.usage
    assert core.take_events() == r.take_events()
    core.check_invariants()
    ref_pool_invariants(pool)
    for b in range(pool.num_blocks):
        assert core.ref_cnt(b) == pool.ref[b]
        assert core.block_hash(b) == pool.block_hash(b)


# ---------------------------------------------------------------------------- pool
HASHES = [bytes([i]) * 32 for i in range(1, 9)]


@SETTINGS
@given(st.data(), st.integers(1, 12), st.booleans())
def test_pool_random_ops(data: st.DataObject, num_blocks: int, caching: bool) -> None:
    fmt = data.draw(st.sampled_from(["u64", "bytes"]))
    core = prefixcache.BlockPool(num_blocks, caching, True, event_hash_format=fmt)
    r = ref.BlockPool(num_blocks, caching, True, event_hash_format=fmt)
    ids_st = st.lists(st.integers(0, num_blocks), max_size=6)
    held: list[int] = []
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(
            st.sampled_from(["get", "touch", "free", "cache", "evict", "reset", "lookup"])
        )
        if op == "get":
            n = data.draw(st.integers(0, num_blocks))
            got = both(core, r, "get_new_blocks", n)
            held.extend(got or [])
        elif op == "touch":
            ids = data.draw(ids_st)
            both(core, r, "touch", ids)
        elif op == "free":
            ids = data.draw(st.lists(st.sampled_from(held), max_size=5) if held else ids_st)
            ids += data.draw(ids_st.filter(lambda x: len(x) <= 1))
            both(core, r, "free_blocks", ids)
        elif op == "cache":
            ids = data.draw(st.lists(st.sampled_from(held), max_size=4) if held else ids_st)
            hashes = data.draw(
                st.lists(st.sampled_from(HASHES), min_size=len(ids), max_size=len(ids))
            )
            lo = data.draw(st.integers(0, len(ids)))
            hi = data.draw(st.integers(0, len(ids)))
            toks = list(range(hi * 2))
            both(core, r, "cache_full_blocks", ids, hashes, lo, hi, 2, 0, toks, 7, "l")
        elif op == "evict":
            ids = data.draw(ids_st)
            both(core, r, "evict_blocks", ids)
        elif op == "reset":
            both(core, r, "reset_prefix_cache")
        else:
            h = data.draw(st.sampled_from(HASHES))
            groups = data.draw(st.sampled_from([[0], [0, 1], []]))
            both(core, r, "get_cached_block", h, groups)
        check_same_pool(core, r)


def test_checked_free_order_example() -> None:
    """Blocks [1 full, 2 full, 3 partial] freed (reverse order) leave [3, 4, 5, ..., 2, 1]."""
    for impl in (prefixcache.KVCacheManager, ref.KVCacheManager):
        m = impl(8, block_size=16)
        got = m.admit(1, list(range(40)))
        assert got is not None and norm(got) == (0, [1, 2, 3])
        m.free(1)
        assert norm(m.free_block_ids()) == [3, 4, 5, 6, 7, 2, 1]


# ------------------------------------------------------------------------- manager
def prompt_strategy(block_size: int) -> st.SearchStrategy[list[int]]:
    prefixes = [list(range(1000 * k, 1000 * k + 3 * block_size + 1)) for k in range(1, 4)]
    return st.builds(
        lambda p, n, suffix: p[:n] + suffix,
        st.sampled_from(prefixes),
        st.integers(0, 3 * block_size + 1),
        st.lists(st.integers(0, 50), max_size=2 * block_size),
    ).filter(bool)


def check_same_manager(core: Any, r: ref.KVCacheManager, ids: set[int]) -> None:
    check_same_pool(core, r)
    assert core.stats == r.stats
    assert len(core) == len(r)
    for rid in ids:
        assert core.block_ids(rid).tolist() == r.block_ids(rid)
        assert core.num_computed_tokens(rid) == r.num_computed_tokens(rid)
        assert core.num_tokens(rid) == r.num_tokens(rid)
        assert core.block_hashes(rid) == r.block_hashes(rid)


@SETTINGS
@given(
    st.data(),
    st.sampled_from([1, 2, 4, 16]),
    st.integers(2, 40),
    st.one_of(st.none(), st.integers(2, 40)),
    st.booleans(),
)
def test_manager_random_streams(
    data: st.DataObject, block_size: int, num_blocks: int, window: int | None, caching: bool
) -> None:
    kw = dict(
        block_size=block_size,
        enable_caching=caching or data.draw(st.booleans()),
        sliding_window=window,
        enable_kv_cache_events=True,
    )
    core = prefixcache.KVCacheManager(num_blocks, **kw)
    r = ref.KVCacheManager(num_blocks, **kw)
    prompts = prompt_strategy(block_size)
    known: set[int] = set()
    next_id = 0
    for _ in range(data.draw(st.integers(1, 25))):
        live = sorted(known)
        ops = ["admit", "add"] + (
            ["step", "decode", "extend", "free", "preempt", "finish", "queue", "steps", "fit"]
            if live
            else []
        )
        op = data.draw(st.sampled_from([*ops, "reset", "evict"]))
        if op in ("admit", "add"):
            rid, next_id = next_id, next_id + 1
            p = data.draw(prompts)
            look = data.draw(st.integers(0, 2 * block_size))
            if op == "admit":
                got = both(core, r, "admit", rid, p, look)
                if got is not None:
                    known.add(rid)
            else:
                both(core, r, "add_request", rid, p)
                known.add(rid)
                hit = both(core, r, "get_computed_blocks", rid)
                assert hit is not None
                blocks, n_hit = hit
                chunk = data.draw(st.integers(0, len(p) - n_hit))
                both(core, r, "allocate_slots", rid, chunk, n_hit, blocks, look)
        elif op == "step":
            rid = data.draw(st.sampled_from(live))
            left = r.num_tokens(rid) - r.num_computed_tokens(rid)
            n = data.draw(st.integers(0, left + 1))
            look = data.draw(st.integers(0, block_size))
            if not r.requests[rid].admitted:
                hit = both(core, r, "get_computed_blocks", rid)
                assert hit is not None
                blocks, n_hit = hit
                both(core, r, "allocate_slots", rid, n, n_hit, blocks, look)
            else:
                both(core, r, "allocate_slots", rid, n, 0, None, look)
        elif op == "decode":
            rid = data.draw(st.sampled_from(live))
            toks = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=block_size + 1))
            both(core, r, "append_tokens", rid, toks)
            if r.requests[rid].admitted:
                both(core, r, "allocate_slots", rid, len(toks))
        elif op == "extend":
            # Several decode hand-overs in one call (0 tokens and requests without slots
            # are errors; a request the pool cannot take ends the call).
            rids = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=3))
            ns = [data.draw(st.integers(0, block_size + 1)) for _ in rids]
            toks = data.draw(st.lists(st.integers(0, 50), min_size=sum(ns), max_size=sum(ns)))
            both(core, r, "extend", rids, toks, ns)
        elif op == "queue":
            rid = data.draw(st.sampled_from(live))
            toks = data.draw(st.lists(st.integers(0, 50), max_size=2 * block_size + 2))
            both(core, r, "queue_tokens", rid, toks)
            assert core.num_queued_tokens(rid) == r.num_queued_tokens(rid)
        elif op == "steps":
            # Decode steps from the queued tokens (too few queued, a repeated id, a request
            # without slots or k = 0 are errors; a request the pool cannot take ends it).
            unique = data.draw(st.sampled_from([True, True, True, False]))
            rids = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=3, unique=unique))
            for i in rids:
                more = data.draw(st.lists(st.integers(0, 50), max_size=block_size + 1))
                both(core, r, "queue_tokens", i, more)
            most = min(r.num_queued_tokens(i) for i in rids)
            k = data.draw(st.one_of(st.integers(1, max(1, most)), st.integers(0, most + 1)))
            both(core, r, "decode_steps", rids, k)
        elif op == "fit":
            rids = data.draw(st.lists(st.sampled_from(live), max_size=3, unique=True))
            both(core, r, "max_decode_steps", rids, data.draw(st.integers(0, 3 * block_size)))
        elif op == "free":
            rid = data.draw(st.sampled_from(live))
            both(core, r, "free", rid)
            known.discard(rid)
        elif op == "finish":
            rid = data.draw(st.sampled_from(live))
            toks = data.draw(st.lists(st.integers(0, 50), max_size=2 * block_size))
            both(core, r, "finish", rid, toks)
            known.discard(rid)
        elif op == "preempt":
            rid = data.draw(st.sampled_from(live))
            both(core, r, "preempt", rid)
        elif op == "reset":
            both(core, r, "reset_prefix_cache")
        else:
            ids = data.draw(st.lists(st.integers(0, num_blocks - 1), max_size=3))
            both(core, r, "evict_blocks", ids)
        check_same_manager(core, r, known)
    assert core.take_stats() == r.take_stats()
    assert core.stats == r.stats


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_extra_keys_and_lora_events(data: st.DataObject) -> None:
    keys = st.one_of(
        st.none(),
        st.just((("mm", "img0", 3),)),
        st.just((("cache_salt", "s"),)),
        st.just((("lora", "ad", "/p"), ("mm", "x", 0))),
    )
    extra = data.draw(st.lists(keys, max_size=4))
    default = data.draw(st.sampled_from([None, (("lora", "ad", "/p"),)]))
    prompt = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=20))
    kw = dict(block_size=4, enable_kv_cache_events=True)
    core = prefixcache.KVCacheManager(16, **kw)
    r = ref.KVCacheManager(16, **kw)
    for rid in (1, 2):
        args = (rid, prompt, 8, extra, default, 3, "ad")
        both(core, r, "admit", *args)
        both(core, r, "finish", rid, [7, 7, 7, 7, 7])
        check_same_manager(core, r, set())
