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


def _manager_world() -> Any:
    m = KVCacheManager(16, block_size=2, enable_kv_cache_events=True)
    m.admit(1, [1, 2, 3])
    m.queue_tokens(1, [4, 5])
    m.take_events()
    return m


def _manager_state(m: Any) -> Any:
    return (
        snapshot(m),
        len(m),
        m.stats,
        m.num_tokens(1),
        m.num_queued_tokens(1),
        list(m.block_ids(1)),
    )


MANAGER_FIRST_BAD: list[tuple[str, Callable[[Any], object], type[Exception], str]] = [
    ("add_request", lambda m: m.add_request(-1, [1], lora_name=5), InvalidInputError, "request_id"),
    (
        "add_request",
        lambda m: m.add_request(3, "x", lora_name=5),
        InvalidTypeError,
        "prompt_tokens",
    ),
    (
        "add_request",
        lambda m: m.add_request(3, [1], extra_keys=5, lora_name=5),
        InvalidTypeError,
        "extra_keys",
    ),
    (
        "add_request",
        lambda m: m.add_request(3, [1], default_extra_keys=[1], lora_name=5),
        UnsupportedHashInputError,
        "default_extra_keys",
    ),
    (
        "add_request",
        lambda m: m.add_request(3, [1], lora_id="x", lora_name=5),
        InvalidTypeError,
        "lora_id",
    ),
    ("allocate_slots", lambda m: m.allocate_slots(-1, -1), InvalidInputError, "request_id"),
    ("allocate_slots", lambda m: m.allocate_slots("1", 1.0), InvalidTypeError, "request_id"),
    ("admit", lambda m: m.admit(-1, [1], lora_name=5), InvalidInputError, "request_id"),
    ("admit", lambda m: m.admit(3, "x", lora_name=5), InvalidTypeError, "prompt_tokens"),
    (
        "admit",
        lambda m: m.admit(3, [1], -1, extra_keys=5),
        InvalidInputError,
        "num_lookahead_tokens",
    ),
    (
        "admit",
        lambda m: m.admit(3, [1], extra_keys=5, lora_id="x", lora_name=5),
        InvalidTypeError,
        "extra_keys",
    ),
    ("extend", lambda m: m.extend([1], "x", "y"), InvalidTypeError, "tokens must be"),
    ("extend", lambda m: m.extend([1], "x", [1, 2]), InvalidTypeError, "tokens must be"),
    ("decode_steps", lambda m: m.decode_steps([-1], 0), InvalidInputError, r"request_ids\[0\]"),
    ("decode_steps", lambda m: m.decode_steps("x", 0), InvalidTypeError, "request_ids"),
    (
        "max_decode_steps",
        lambda m: m.max_decode_steps([-1], -1),
        InvalidInputError,
        r"request_ids\[0\]",
    ),
]


@pytest.mark.parametrize(
    ("label", "call", "error", "message"),
    MANAGER_FIRST_BAD,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(MANAGER_FIRST_BAD)],
)
def test_manager_names_the_first_bad_argument(
    label: str, call: Callable[[Any], object], error: type[Exception], message: str
) -> None:
    """Arguments are read in order: of two bad ones, the first is named (the request id,
    the tokens and the extra keys were read after the later ``from_py_with`` arguments),
    and the manager is unchanged."""
    m = _manager_world()
    before = _manager_state(m)
    with pytest.raises(error, match=message):
        call(m)
    assert _manager_state(m) == before
    assert m.take_events() == []
    m.check_invariants()


MANAGER_CTOR_FIRST_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"hash_algo": "bad", "enable_caching": 1}, InvalidInputError, "unknown hash algorithm"),
    ({"hash_algo": "bad", "event_hash_format": "x"}, InvalidInputError, "unknown hash algorithm"),
    ({"hash_algo": 5}, InvalidTypeError, "hash_algo must be a str"),
    ({"sliding_window": 1, "seed": 5}, InvalidInputError, "sliding_window"),
    ({"sliding_window": 1, "event_hash_format": "x"}, InvalidInputError, "sliding_window"),
    ({"num_blocks": 0, "enable_caching": 1}, InvalidInputError, "num_blocks"),
    ({"num_blocks": 0, "sliding_window": 1}, InvalidInputError, "num_blocks"),
    ({"num_blocks": 2**32, "hash_algo": "bad"}, InvalidInputError, "num_blocks"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), MANAGER_CTOR_FIRST_BAD)
def test_manager_constructor_names_the_first_bad_argument(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    """The hash algorithm's name, the window, the pool size and the event hash format
    are checked as each argument is read: an unknown algorithm is named before a bad
    later flag (it was checked after every argument was read)."""
    kwargs = {"num_blocks": 8, **kwargs}
    with pytest.raises(error, match=message):
        KVCacheManager(**kwargs)


POOL_FIRST_BAD: list[tuple[str, Callable[[Any], object], type[Exception], str]] = [
    (
        "cache_full_blocks",
        lambda p: p.cache_full_blocks("x", [], -1, 0, 1),
        InvalidTypeError,
        "block_ids",
    ),
    (
        "cache_full_blocks",
        lambda p: p.cache_full_blocks([1], "x", -1, 0, 1),
        InvalidTypeError,
        "block_hashes",
    ),
    (
        "cache_full_blocks",
        lambda p: p.cache_full_blocks([1], [5], 0, 1, 1, extra_keys=5),
        InvalidTypeError,
        r"block_hashes\[0\]",
    ),
    (
        "cache_full_blocks",
        lambda p: p.cache_full_blocks([1], [H], 0, 1, 1, token_ids="x", lora_id="y"),
        InvalidTypeError,
        "token_ids",
    ),
    ("get_cached_block", lambda p: p.get_cached_block("x", "y"), InvalidTypeError, "block_hash"),
]


@pytest.mark.parametrize(
    ("label", "call", "error", "message"),
    POOL_FIRST_BAD,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(POOL_FIRST_BAD)],
)
def test_pool_names_the_first_bad_argument(
    label: str, call: Callable[[Any], object], error: type[Exception], message: str
) -> None:
    p = BlockPool(6, enable_kv_cache_events=True)
    p.get_new_blocks(2)
    before = snapshot(p)
    with pytest.raises(error, match=message):
        call(p)
    assert snapshot(p) == before
    assert p.take_events() == []
    p.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_blocks": 0, "enable_caching": 1}, InvalidInputError, "num_blocks"),
        ({"num_blocks": 0, "event_hash_format": "x"}, InvalidInputError, "num_blocks"),
        ({"num_blocks": 2**32, "enable_kv_cache_events": 1}, InvalidInputError, "num_blocks"),
    ],
)
def test_pool_constructor_names_the_first_bad_argument(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        BlockPool(**kwargs)


class _Index:
    """An int-like argument that records when it is read."""

    def __init__(self, seen: list[str], name: str, value: int) -> None:
        self.seen, self.name, self.value = seen, name, value

    def __index__(self) -> int:
        self.seen.append(self.name)
        return self.value


def test_manager_reads_its_arguments_in_order() -> None:
    """A request id's ``__index__`` runs before a later argument is read."""
    seen: list[str] = []
    m = KVCacheManager(16, block_size=2)
    m.add_request(_Index(seen, "add", 1), [1, 2, 3], lora_id=_Index(seen, "lora_id", 7))  # type: ignore[arg-type]
    m.allocate_slots(_Index(seen, "rid", 1), _Index(seen, "new", 3), _Index(seen, "hit", 0))  # type: ignore[arg-type]
    got = m.admit(_Index(seen, "admit", 2), [1, 2, 3], _Index(seen, "lookahead", 0))  # type: ignore[arg-type]
    assert got is not None
    assert seen == ["add", "lora_id", "rid", "new", "hit", "admit", "lookahead"]
