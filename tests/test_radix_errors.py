"""Bad input on both RadixCache implementations: the right exception class, a message that
names the problem, and a cache left exactly as it was (dump, sizes, clock)."""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import prefixcache
from prefixcache.errors import (
    InvalidInputError,
    InvalidTypeError,
    LockRefError,
    PrefixCacheError,
    StaleHandleError,
)
from prefixcache.reference import radix as reference

IMPLS: dict[str, Any] = {"reference": reference.RadixCache}
if hasattr(prefixcache, "RadixCache"):
    IMPLS["core"] = prefixcache.RadixCache


@pytest.fixture(params=sorted(IMPLS))
def impl(request: pytest.FixtureRequest) -> Any:
    return IMPLS[request.param]


class World:
    """A populated cache with handles in every state."""

    def __init__(self, cls: Any, page_size: int = 1) -> None:
        self.cache = c = cls(page_size, "lru")
        p = page_size
        self.evicted = c.insert([7] * (2 * p), extra_key="gone").node  # the LRU leaf
        self.locked = c.insert(list(range(0, 6 * p))).node  # locked leaf
        c.inc_lock_ref(self.locked)
        self.unlocked = c.insert(list(range(100, 104 * p))).node  # unlocked leaf
        # a locked node whose child is unlocked: lock the split point, not the tail
        c.insert(list(range(200, 200 + 6 * p)))
        self.split_parent = c.match_prefix(list(range(200, 200 + 3 * p))).node
        c.inc_lock_ref(self.split_parent)
        self.tail = c.match_prefix(list(range(200, 200 + 6 * p))).node
        c.insert([8] * (2 * p), extra_key="stay")
        assert c.evict(1).tolist() == [7] * (2 * p)
        other = cls(page_size, "lru")
        self.foreign = other.insert([1, 2, 3] * p).node
        self.other = other

    def state(self) -> tuple[Any, ...]:
        c = self.cache
        return (
            c.dump(),
            c.evictable_size(),
            c.protected_size(),
            c.total_size(),
            c.num_nodes,
            c.clock,
        )


def expect(
    world: World, action: Callable[[Any], Any], exc: type[BaseException], fragment: str
) -> None:
    before = world.state()
    with pytest.raises(exc) as info:
        action(world.cache)
    assert fragment in str(info.value), str(info.value)
    assert world.state() == before, "a failed call changed the cache"


# ---- constructor ----
@pytest.mark.parametrize(
    ("args", "exc", "fragment"),
    [
        ((0,), InvalidInputError, "page_size must be >= 1, got 0"),
        ((-3,), InvalidInputError, "page_size must be >= 1, got -3"),
        ((1.5,), InvalidTypeError, "page_size must be an int"),
        ((True,), InvalidTypeError, "page_size must be an int, got bool"),
        ((1, "xyz"), InvalidInputError, "unknown eviction policy"),
        ((1, ""), InvalidInputError, "unknown eviction policy"),
        (
            (1, "tlru"),
            InvalidInputError,
            "expected one of lru, lfu, fifo, mru, filo, priority, slru",
        ),
    ],
)
def test_constructor_errors(
    impl: Any, args: tuple[Any, ...], exc: type[BaseException], fragment: str
) -> None:
    with pytest.raises(exc) as info:
        impl(*args)
    assert fragment in str(info.value)


def test_policy_names_are_case_insensitive(impl: Any) -> None:
    assert impl(4, "LRU").eviction_policy == "lru"
    assert impl(4, "Slru").page_size == 4


# ---- token ids ----
BAD_TOKENS: list[tuple[str, Any, type[BaseException], str]] = [
    ("negative", [1, 2, 3, -1], InvalidInputError, "tokens[3] = -1 is out of range"),
    ("2**32", [2**32], InvalidInputError, "tokens[0] = 4294967296 is out of range"),
    ("huge", [5, 10**30], InvalidInputError, "tokens[1] = 1000000000000000000000000000000"),
    ("np int64 negative", np.array([4, -7]), InvalidInputError, "tokens[1] = -7"),
    ("np int32 negative", np.array([-1], dtype=np.int32), InvalidInputError, "tokens[0] = -1"),
    ("np uint64 big", np.array([0, 2**40], dtype=np.uint64), InvalidInputError, "tokens[1] = "),
    ("array('q') negative", array.array("q", [3, -2]), InvalidInputError, "tokens[1] = -2"),
    ("2-D array", np.zeros((2, 2), dtype=np.int64), InvalidInputError, "1-dimensional"),
    ("float in list", [1, 2.0], InvalidTypeError, "tokens[1] must be an int, got float"),
    ("bool in list", [True], InvalidTypeError, "tokens[0] must be an int, got bool"),
    ("None in list", [1, None], InvalidTypeError, "tokens[1] must be an int, got NoneType"),
    ("float array", np.array([1.0, 2.0]), InvalidTypeError, "dtype float64"),
    ("bool array", np.array([True, False]), InvalidTypeError, "dtype bool"),
    ("array('d')", array.array("d", [1.0]), InvalidTypeError, "tokens[0] must be an int"),
    ("str", "123", InvalidTypeError, "not str"),
    ("bytes", b"123", InvalidTypeError, "not bytes"),
    ("None", None, InvalidTypeError, "not NoneType"),
    ("int", 7, InvalidTypeError, "not int"),
]


@pytest.mark.parametrize(
    ("tokens", "exc", "fragment"), [c[1:] for c in BAD_TOKENS], ids=[c[0] for c in BAD_TOKENS]
)
@pytest.mark.parametrize("op", ["match_prefix", "insert"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_bad_tokens(
    impl: Any, page_size: int, op: str, tokens: Any, exc: type[BaseException], fragment: str
) -> None:
    world = World(impl, page_size)
    expect(world, lambda c: getattr(c, op)(tokens), exc, fragment)


def test_first_bad_item_decides(impl: Any) -> None:
    world = World(impl)
    expect(world, lambda c: c.match_prefix([-1, 1.5]), InvalidInputError, "tokens[0] = -1")
    expect(world, lambda c: c.match_prefix([1.5, -1]), InvalidTypeError, "tokens[0]")


# ---- values and the other insert arguments ----
BAD_INSERTS: list[tuple[str, dict[str, Any], type[BaseException], str]] = [
    (
        "values too short",
        {"tokens": [1, 2, 3], "values": [1, 2]},
        InvalidInputError,
        "values has length 2 but tokens has length 3",
    ),
    (
        "values too long",
        {"tokens": [1], "values": np.arange(2)},
        InvalidInputError,
        "values has length 2 but tokens has length 1",
    ),
    # page 4 truncates both to 4, but the lengths are checked before truncation
    (
        "values length before truncation",
        {"tokens": list(range(5)), "values": list(range(4))},
        InvalidInputError,
        "values has length 4 but tokens has length 5",
    ),
    (
        "values beyond int64",
        {"tokens": [1, 2], "values": [0, 2**63]},
        InvalidInputError,
        "values[1] = 9223372036854775808 does not fit in int64",
    ),
    (
        "values uint64 beyond int64",
        {"tokens": [1], "values": np.array([2**63], dtype=np.uint64)},
        InvalidInputError,
        "values[0] = 9223372036854775808 does not fit in int64",
    ),
    (
        "values float",
        {"tokens": [1], "values": [0.5]},
        InvalidTypeError,
        "values[0] must be an int, got float",
    ),
    (
        "values float array",
        {"tokens": [1], "values": np.array([0.5])},
        InvalidTypeError,
        "values must hold integers",
    ),
    ("values str", {"tokens": [1], "values": "1"}, InvalidTypeError, "not str"),
    (
        "negative inserted_len",
        {"tokens": [1, 2], "inserted_len": -1},
        InvalidInputError,
        "inserted_len must be >= 0, got -1",
    ),
    (
        "float inserted_len",
        {"tokens": [1, 2], "inserted_len": 1.0},
        InvalidTypeError,
        "inserted_len must be an int",
    ),
    (
        "float priority",
        {"tokens": [1, 2], "priority": 0.5},
        InvalidTypeError,
        "priority must be an int",
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "exc", "fragment"), [c[1:] for c in BAD_INSERTS], ids=[c[0] for c in BAD_INSERTS]
)
@pytest.mark.parametrize("page_size", [1, 4])
def test_bad_insert_arguments(
    impl: Any, page_size: int, kwargs: dict[str, Any], exc: type[BaseException], fragment: str
) -> None:
    world = World(impl, page_size)
    expect(world, lambda c: c.insert(**kwargs), exc, fragment)


def test_namespace_of_wrong_type(impl: Any) -> None:
    world = World(impl)
    # the core's argument parser raises a plain TypeError here; both are TypeErrors
    expect(world, lambda c: c.insert([1], extra_key=3), TypeError, "")
    expect(world, lambda c: c.match_prefix([1], cache_salt=b"x"), TypeError, "")


# ---- evict ----
@pytest.mark.parametrize(
    ("n", "exc", "fragment"),
    [
        (-1, InvalidInputError, "num_tokens must be >= 0, got -1"),
        (-(10**30), InvalidInputError, "num_tokens must be >= 0"),
        (1.0, InvalidTypeError, "num_tokens must be an int, got float"),
        ("3", InvalidTypeError, "num_tokens must be an int, got str"),
    ],
)
def test_bad_evict(impl: Any, n: Any, exc: type[BaseException], fragment: str) -> None:
    expect(World(impl), lambda c: c.evict(n), exc, fragment)


def test_evict_zero_frees_nothing(impl: Any) -> None:
    world = World(impl)
    before = world.state()
    freed = world.cache.evict(0)
    assert freed.dtype == np.int64 and len(freed) == 0
    assert world.state() == before


# ---- handles ----
HANDLE_OPS = ["inc_lock_ref", "dec_lock_ref", "path_indices", "node_info"]


@pytest.mark.parametrize("op", HANDLE_OPS)
def test_evicted_handle_is_stale(impl: Any, op: str) -> None:
    world = World(impl)
    expect(world, lambda c: getattr(c, op)(world.evicted), StaleHandleError, "evicted")


@pytest.mark.parametrize("op", HANDLE_OPS)
def test_foreign_handle_is_stale(impl: Any, op: str) -> None:
    world = World(impl)
    expect(world, lambda c: getattr(c, op)(world.foreign), StaleHandleError, "")


@pytest.mark.parametrize("op", HANDLE_OPS)
@pytest.mark.parametrize("which", ["locked", "unlocked", "root"])
def test_handle_from_before_reset_is_stale(impl: Any, op: str, which: str) -> None:
    world = World(impl)
    old = world.cache.root if which == "root" else getattr(world, which)
    world.cache.reset()
    world.cache.insert([1, 2, 3])
    expect(world, lambda c: getattr(c, op)(old), StaleHandleError, "")


@pytest.mark.parametrize("op", HANDLE_OPS)
def test_handle_of_wrong_type(impl: Any, op: str) -> None:
    expect(World(impl), lambda c: getattr(c, op)(5), TypeError, "")


def test_unlock_an_unlocked_node(impl: Any) -> None:
    world = World(impl)
    expect(world, lambda c: c.dec_lock_ref(world.unlocked), LockRefError, "")


def test_unlock_twice(impl: Any) -> None:
    world = World(impl)
    assert world.cache.dec_lock_ref(world.locked) > 0
    expect(world, lambda c: c.dec_lock_ref(world.locked), LockRefError, "")


def test_unlock_an_ancestor_locked_only_through_a_descendant(impl: Any) -> None:
    """The locked leaf's parent holds no lock of its own: unlocking it would break the
    lock invariant and leave the leaf's owner unable to unlock."""
    world = World(impl)
    c = world.cache
    ancestor = c.match_prefix(list(range(3))).node  # splits the locked leaf
    assert c.node_info(ancestor)["lock_ref"] == 1
    expect(world, lambda c: c.dec_lock_ref(ancestor), LockRefError, "only through its descendants")
    if hasattr(c, "check_invariants"):
        c.check_invariants()
    assert c.dec_lock_ref(world.locked) > 0  # the owner still can
    assert c.evictable_size() == c.total_size() - c.node_info(world.split_parent)["length"]


def test_unlock_below_a_locked_ancestor_changes_nothing(impl: Any) -> None:
    """The tail is unlocked but its parent is locked: nothing on the path may move."""
    world = World(impl)
    assert world.cache.node_info(world.split_parent)["lock_ref"] == 1
    assert world.cache.node_info(world.tail)["lock_ref"] == 0
    expect(world, lambda c: c.dec_lock_ref(world.tail), LockRefError, "")


def test_root_locks_are_no_ops(impl: Any) -> None:
    world = World(impl)
    before = world.state()
    assert world.cache.inc_lock_ref(world.cache.root) == 0
    assert world.cache.dec_lock_ref(world.cache.root) == 0
    assert world.cache.dec_lock_ref(world.cache.root) == 0
    assert world.state() == before


def test_every_error_is_a_prefixcache_error(impl: Any) -> None:
    world = World(impl)
    for action in (
        lambda c: c.evict(-1),
        lambda c: c.match_prefix([-1]),
        lambda c: c.match_prefix([0.5]),
        lambda c: c.node_info(world.evicted),
        lambda c: c.dec_lock_ref(world.unlocked),
    ):
        with pytest.raises(PrefixCacheError):
            action(world.cache)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: type(c)(eviction_policy=3),
        lambda c: c.match_prefix([1], extra_key=5),
        lambda c: c.insert([1], cache_salt=b"x"),
        lambda c: c.inc_lock_ref("not a node"),
        lambda c: c.path_indices(None),
    ],
)
def test_core_wrong_argument_types_raise_invalid_type_error(call: Any) -> None:
    from prefixcache import InvalidTypeError, RadixCache

    cache = RadixCache()
    cache.insert([1, 2, 3])
    before = cache.dump()
    with pytest.raises(InvalidTypeError):
        call(cache)
    assert cache.dump() == before
