"""Bad input to BlockPool / KVCacheManager: a clear exception, and nothing changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import prefixcache
from prefixcache import (
    BlockPool,
    BlockStateError,
    InvalidInputError,
    InvalidTypeError,
    KVCacheManager,
    OutOfBlocksError,
    UnknownRequestError,
    UnsupportedHashInputError,
)
from prefixcache.reference import blocks as ref

H = b"\x07" * 32


def snapshot(x: Any) -> Any:
    ids = range(x.num_blocks)
    return (
        list(x.free_block_ids()),
        [x.ref_cnt(b) for b in ids],
        [x.block_hash(b) for b in ids],
        x.num_free_blocks,
    )


def unchanged(
    x: Any, exc: type[Exception], fn: Callable[[], Any], match: str | None = None
) -> None:
    before = snapshot(x)
    with pytest.raises(exc, match=match):
        fn()
    assert snapshot(x) == before
    x.check_invariants()


@pytest.fixture(params=["core", "ref"])
def pool(request: pytest.FixtureRequest) -> Any:
    impl = BlockPool if request.param == "core" else ref.BlockPool
    p = impl(6, enable_kv_cache_events=True)
    ids = p.get_new_blocks(2)
    p.cache_full_blocks(ids, [H], 0, 1, 4)
    p.take_events()
    if request.param == "ref":
        p.check_invariants = lambda: None
    return p


def test_pool_errors(pool: Any) -> None:
    unchanged(pool, OutOfBlocksError, lambda: pool.get_new_blocks(4))
    unchanged(pool, BlockStateError, lambda: pool.touch([1, 0]))
    unchanged(pool, BlockStateError, lambda: pool.free_blocks([1, 3]))  # 3 is free
    unchanged(pool, BlockStateError, lambda: pool.free_blocks([1, 1]))  # double free
    unchanged(pool, BlockStateError, lambda: pool.free_blocks([0]))
    unchanged(pool, InvalidInputError, lambda: pool.free_blocks([1, 6]))
    unchanged(pool, InvalidInputError, lambda: pool.touch([99]))
    unchanged(pool, InvalidInputError, lambda: pool.get_cached_block(b"\x01" * 33))
    unchanged(pool, InvalidInputError, lambda: pool.get_cached_block(b"\x01" * 16))
    unchanged(
        pool, InvalidInputError, lambda: pool.cache_full_blocks([1, 2], [H, b"x" * 16], 1, 2, 4)
    )
    unchanged(pool, BlockStateError, lambda: pool.cache_full_blocks([1, 2], [H, H], 0, 2, 4))
    unchanged(pool, BlockStateError, lambda: pool.cache_full_blocks([3], [H], 0, 1, 4))  # free
    unchanged(pool, InvalidInputError, lambda: pool.cache_full_blocks([2], [H], 0, 2, 4))
    unchanged(pool, InvalidInputError, lambda: pool.evict_blocks([1, 7]))
    assert not pool.reset_prefix_cache()
    assert pool.take_events() == []


def test_core_pool_type_errors() -> None:
    p = BlockPool(4)
    unchanged(p, InvalidTypeError, lambda: p.free_blocks("ab"))
    unchanged(p, InvalidTypeError, lambda: p.touch([1.5]))
    unchanged(p, InvalidInputError, lambda: p.touch([-1]))
    unchanged(p, InvalidInputError, lambda: p.get_new_blocks(-1))
    unchanged(p, InvalidTypeError, lambda: p.get_cached_block("abc"))  # type: ignore[arg-type]
    unchanged(p, InvalidTypeError, lambda: p.cache_full_blocks([1], ["h"], 0, 1, 4))  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        BlockPool(0)
    with pytest.raises(InvalidInputError):
        BlockPool(4, event_hash_format="hex")


def test_pool_error_classes_are_builtin_friendly() -> None:
    p = BlockPool(2)
    with pytest.raises(ValueError):
        p.touch([0])
    with pytest.raises(RuntimeError):
        p.get_new_blocks(2)
    with pytest.raises(KeyError):
        KVCacheManager(4).free(3)


@pytest.fixture(params=["core", "ref"])
def mgr(request: pytest.FixtureRequest) -> Any:
    impl = KVCacheManager if request.param == "core" else ref.KVCacheManager
    m = impl(8, block_size=4, enable_kv_cache_events=True)
    assert m.admit(1, list(range(10)), 2) is not None
    if request.param == "ref":
        m.check_invariants = lambda: None
    return m


def test_manager_errors(mgr: Any) -> None:
    for method, args in [
        ("free", (9,)),
        ("preempt", (9,)),
        ("append_tokens", (9, [1])),
        ("get_computed_blocks", (9,)),
        ("allocate_slots", (9, 1)),
        ("block_ids", (9,)),
        ("num_tokens", (9,)),
        ("finish", (9, [1])),
        ("queue_tokens", (9, [1])),
        ("num_queued_tokens", (9,)),
        ("decode_steps", ([9], 1)),
        ("max_decode_steps", ([1, 9], 1)),
    ]:
        unchanged(mgr, UnknownRequestError, lambda m=method, a=args: getattr(mgr, m)(*a))
    unchanged(mgr, InvalidInputError, lambda: mgr.add_request(1, [1, 2]))  # known id
    unchanged(mgr, InvalidInputError, lambda: mgr.add_request(2, []))
    unchanged(mgr, InvalidInputError, lambda: mgr.allocate_slots(1, 0))
    unchanged(mgr, InvalidInputError, lambda: mgr.allocate_slots(1, 1, 4, [1]))  # running
    mgr.add_request(3, list(range(10)))
    unchanged(mgr, InvalidInputError, lambda: mgr.allocate_slots(3, 2, 4, [1, 2]))  # 8 != 4
    unchanged(mgr, InvalidInputError, lambda: mgr.allocate_slots(3, 2, 4, [99]))
    unchanged(mgr, InvalidInputError, lambda: mgr.evict_blocks([8]))
    # Decode steps: too few queued tokens, a repeated id, a request without slots.
    mgr.queue_tokens(1, [7, 8])
    unchanged(mgr, InvalidInputError, lambda: mgr.decode_steps([1], 3))
    unchanged(mgr, InvalidInputError, lambda: mgr.decode_steps([1, 1], 1))
    mgr.queue_tokens(3, [7])
    unchanged(mgr, InvalidInputError, lambda: mgr.decode_steps([1, 3], 1))
    assert mgr.num_queued_tokens(1) == 2 and mgr.num_tokens(1) == 10
    assert mgr.admit(4, list(range(100, 140))) is None  # pool too small: forgotten again
    assert 4 not in mgr
    assert not mgr.reset_prefix_cache()


def test_core_manager_argument_errors() -> None:
    m = KVCacheManager(8, block_size=4)
    with pytest.raises(InvalidInputError):
        KVCacheManager(8, sliding_window=1)
    with pytest.raises(InvalidInputError):
        KVCacheManager(8, block_size=0)
    with pytest.raises(prefixcache.PrefixCacheError):
        KVCacheManager(8, hash_algo="md5")
    unchanged(m, InvalidTypeError, lambda: m.add_request(1, "abc"))
    unchanged(m, InvalidInputError, lambda: m.add_request(1, [1, -2]))
    unchanged(m, UnsupportedHashInputError, lambda: m.add_request(1, [1] * 8, [([1],)]))
    unchanged(m, InvalidInputError, lambda: m.add_request(-1, [1]))
    unchanged(m, InvalidInputError, lambda: m.add_request(2**64, [1]))
    unchanged(m, InvalidTypeError, lambda: m.add_request("r1", [1]))
    unchanged(m, InvalidTypeError, lambda: m.free(True))
    assert -1 not in m and "r1" not in m
    assert len(m) == 0
    m.add_request(1, np.arange(9, dtype=np.int32))
    unchanged(m, InvalidInputError, lambda: m.allocate_slots(1, -1))
    unchanged(m, InvalidInputError, lambda: m.allocate_slots(1, 1, 0, None, -1))
    unchanged(m, UnsupportedHashInputError, lambda: m.add_request(5, [1] * 4, [{1: 2}]))
    assert m.num_tokens(1) == 9
    m.allocate_slots(1, 9)
    m.queue_tokens(1, [5, 6])
    unchanged(m, InvalidInputError, lambda: m.decode_steps([1], 0))
    unchanged(m, InvalidTypeError, lambda: m.decode_steps([1], 1.0))
    unchanged(m, InvalidInputError, lambda: m.decode_steps([-1], 1))
    unchanged(m, InvalidTypeError, lambda: m.max_decode_steps([1], "2"))
    unchanged(m, InvalidInputError, lambda: m.max_decode_steps([1], -1))
    unchanged(m, InvalidInputError, lambda: m.queue_tokens(1, [1, -2]))
    assert m.num_queued_tokens(1) == 2
