"""No Rust panic reaches Python: every public function and method of ``prefixcache._core``
is called with hostile arguments (huge and negative ints, 2**64, NaN, empty / 2-D /
non-contiguous arrays, float16 / bool / object / str dtypes, None, nested lists, bytes of
odd lengths, very long strings, handles of other objects) and every failure must be a
``PrefixCacheError`` or a ``TypeError`` from Python's own argument parsing.

``pyo3_runtime.PanicException`` derives from ``BaseException``, so the calls catch
``BaseException`` and check the type. Calls that succeed are fine (hostile but legal
input); the object is then checked with ``check_invariants()``.
"""

from __future__ import annotations

import array
import inspect
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from prefixcache import _core
from prefixcache.errors import PrefixCacheError


class SelfIndex:
    """``__index__`` returns the object itself, not an int."""

    def __index__(self) -> Any:
        return self


HOSTILE: list[Any] = [
    SelfIndex(),
    [SelfIndex()],
    "\ud800",
    2**64,
    2**63,
    2**63 - 1,
    2**62,
    2**32,
    2**31,
    -1,
    -(2**63),
    -(2**63) - 1,
    10**30,
    0,
    1,
    math.nan,
    math.inf,
    -0.0,
    1.5,
    True,
    None,
    "",
    "x" * 100_000,
    "lru\x00",
    b"",
    b"abc",
    b"x" * 33,
    bytearray(b"ab"),
    [],
    [[1, 2], [3]],
    [1, None],
    [2**64],
    (1, (2, (3,))),
    {},
    {1: 2},
    object(),
    np.array([], dtype=np.uint32),
    np.zeros((2, 2), dtype=np.int64),
    np.arange(10, dtype=np.int64)[::2],
    np.arange(10, dtype=np.int32)[::-1],
    np.array([1, -1], dtype=np.int32)[::-1],
    np.array([2**64 - 1], dtype=np.uint64),
    np.array([1.0], dtype=np.float16),
    np.array([True]),
    np.array([1], dtype=object),
    np.array(["1"]),
    np.array(3, dtype=np.int64),
    np.float64("nan"),
    np.int64(-5),
    np.uint64(2**64 - 1),
    array.array("b", [-1]),
    array.array("d", [1.0]),
    memoryview(b"abcd"),
    range(5),
    iter([1, 2]),
]


# Classes whose bad arguments all raise a PrefixCacheError: a bare TypeError from them
# must be Python's own complaint about the number or names of the arguments.
STRICT = ("CpuOffloadManager", "BlockTrie", "BlockPool", "KvIndex")
ARGUMENT_COUNT = re.compile(
    r"positional argument|keyword argument|missing|takes|expected \d+ argument"
)


def allowed(err: BaseException, where: str) -> bool:
    if isinstance(err, TypeError) and not isinstance(err, PrefixCacheError):
        return not where.startswith(STRICT) or bool(ARGUMENT_COUNT.search(str(err)))
    return isinstance(err, PrefixCacheError)


def instances() -> Iterator[tuple[str, Callable[[], Any]]]:
    """Each public class in a few valid states (a fresh object per call sequence)."""

    def radix() -> Any:
        c = _core.RadixCache(2, "slru")
        n = c.insert(np.arange(12, dtype=np.uint32)).node
        c.inc_lock_ref(n)
        c.insert([5, 6, 7, 8])
        return c

    def pool() -> Any:
        p = _core.BlockPool(8, enable_kv_cache_events=True)
        ids = p.get_new_blocks(3)
        p.cache_full_blocks(ids[:2], [b"a" * 32, b"b" * 32], 0, 2, 4)
        return p

    def manager() -> Any:
        m = _core.KVCacheManager(16, block_size=4, sliding_window=8, enable_kv_cache_events=True)
        m.admit(1, list(range(10)))
        m.add_request(2, list(range(5)))
        return m

    def trie() -> Any:
        t = _core.BlockTrie(16, tokens_per_block=4)
        t.claim(1, list(range(10)))
        t.complete(1)
        return t

    def kv_index() -> Any:
        ix = _core.KvIndex(ttl=10.0)
        ix.apply("a", [{"type": "BlockStored", "block_hashes": [1, 2], "block_size": 4}], seq=0)
        ix.apply(
            "b", [{"type": "BlockStored", "block_hashes": [1], "block_size": 4, "medium": "CPU"}]
        )
        return ix

    yield "RadixCache", radix
    yield "KvIndex", kv_index
    yield "BlockPool", pool
    yield "KVCacheManager", manager
    yield "BlockTrie", trie
    yield "BlockHasher", lambda: _core.BlockHasher(4, "xxhash_cbor")

    def lab() -> Any:
        c = _core.LabCache(8, "opt")
        c.set_future(
            np.array([1, 2], dtype=np.uint64),
            np.array([0, 2], dtype=np.uint64),
            np.array([1], dtype=np.uint32),
        )
        c.acquire(0, np.array([1, 2], dtype=np.uint64), 1, 3)
        return c

    yield "LabCache", lab

    def offload(policy: str) -> Callable[[], Any]:
        def make() -> Any:
            m = _core.CpuOffloadManager(3, policy, store_threshold=1, enable_events=True)
            m.set_request_keys(2, [b"\x01" * 8, b"\x02" * 8, b"\x01" * 8], 16)
            m.prepare_store(1, [b"\x01" * 8])
            m.complete_store(1, [b"\x01" * 8])
            m.prepare_store(1, [b"\x03" * 8])
            m.prepare_load(1, [b"\x01" * 8])
            return m

        return make

    yield "CpuOffloadManager", offload("lru")
    yield "CpuOffloadManager-arc", offload("arc")


def methods(obj: Any) -> list[str]:
    names = [n for n in dir(obj) if not n.startswith("_") or n in ("__contains__",)]
    return [n for n in names if callable(getattr(obj, n))]


def argument_lists() -> Iterator[tuple[Any, ...]]:
    """Each hostile value alone, in every position after a plausible first argument, and
    filling every position."""
    for h in HOSTILE:
        yield (h,)
        yield (h, h)
        yield (h, h, h, h)
        yield (1, h)
        yield (np.arange(8, dtype=np.uint32), h)
        yield (1, np.arange(8, dtype=np.uint32), h)
        yield (None, h)
        yield (h, [1, 2, 3, 4])
        yield ([0, 1], [b"c" * 32, b"d" * 32], 0, h, 4)


def call(fn: Callable[..., Any], args: tuple[Any, ...], where: str = "") -> str | None:
    """None when the call returned or raised an allowed error, else a description."""
    try:
        fn(*args)
    except BaseException as err:  # PanicException is a BaseException
        if type(err).__name__ == "PanicException" or not allowed(err, where):
            return f"{type(err).__name__}: {str(err)[:200]} <- {args!r:.200}"
    return None


@pytest.mark.parametrize(("name", "make"), list(instances()), ids=[n for n, _ in instances()])
def test_methods_with_hostile_arguments(name: str, make: Callable[[], Any]) -> None:
    bad: list[str] = []
    for method in methods(make()):
        obj = make()
        other = make()  # handles and states of another object
        extra: list[tuple[Any, ...]] = []
        if name == "RadixCache":
            foreign = other.insert([9, 9]).node
            extra = [(foreign,), (obj.root,), (foreign, foreign)]
        for args in [*argument_lists(), *extra]:
            problem = call(getattr(obj, method), args, f"{name}.{method}")
            if problem:
                bad.append(f"{name}.{method}: {problem}")
        if hasattr(obj, "check_invariants"):  # also fails if a panic poisoned the lock
            problem = call(obj.check_invariants, (), f"{name}.check_invariants")
            if problem:
                bad.append(f"{name}.check_invariants after {method}: {problem}")
    assert not bad, "\n".join(bad[:40])


# A plausible value per parameter name, so that each parameter can be made hostile alone
# while the others are valid (the call then gets past their checks).
PLAUSIBLE: dict[str, Any] = {
    "block_hash": b"a" * 32,
    "block_hashes": [b"c" * 32, b"d" * 32],
    "block_id": 1,
    "block_ids": [1, 2],
    "block_size": 4,
    "cache_salt": "s",
    "default_extra_keys": None,
    "extra_key": "k",
    "extra_keys": None,
    "group_id": 0,
    "group_ids": [0],
    "inserted_len": 2,
    "lora_id": 1,
    "lora_name": "l",
    "mm_items": None,
    "new_computed_blocks": None,
    "num_blocks": 1,
    "num_cached_blocks": 0,
    "num_full_blocks": 1,
    "num_lookahead_tokens": 1,
    "num_new_computed_tokens": 0,
    "num_new_tokens": 1,
    "num_tokens": 4,
    "output_tokens": np.arange(4, dtype=np.uint32),
    "parent": None,
    "priority": 1,
    "prompt_tokens": np.arange(9, dtype=np.uint32),
    "request_id": 2,
    "reserve_tokens": 4,
    "retention": 1,
    "ticks": 1,
    "token_ids": np.arange(8, dtype=np.uint32),
    "tokens": np.arange(9, dtype=np.uint32),
    "values": np.arange(9, dtype=np.int64),
    # KvIndex
    "worker": "a",
    "events": [],
    "seq": 5,
    "now": 1.0,
    "hashes": [1, 2],
    "k": 2,
    "hasher": None,
    "weights": None,
    "include_unhealthy": False,
    "medium": None,
    "next_seq": 1,
    "frames": [b"t", (1).to_bytes(8, "big"), b"\x93\x01\x90\x00"],
    "rid": 1,
    "keys": np.array([1, 5], dtype=np.uint64),
    "total": 2,
    "on": True,
    # CpuOffloadManager
    "key": b"\x01" * 8,
    "end_tokens": [16],
    "tokens_per_key": 16,
    "start": 0,
    "stop": 2,
    "complete": True,
    "success": True,
    "event_hash_format": "u64",
    "compact": False,
}

# Plausible values of one class where they differ from another's of the same name.
PLAUSIBLE_OF: dict[str, dict[str, Any]] = {
    "CpuOffloadManager": {"keys": [b"\x01" * 8]},
}


def plausible(name: str, param: str) -> Any:
    if param == "manager":
        m = _core.KVCacheManager(16, block_size=4)
        m.add_request(2, list(range(9)))
        return m
    return PLAUSIBLE_OF.get(name.split("-")[0], {}).get(param, PLAUSIBLE[param])


@pytest.mark.parametrize(("name", "make"), list(instances()), ids=[n for n, _ in instances()])
def test_each_parameter_hostile_alone(name: str, make: Callable[[], Any]) -> None:
    bad: list[str] = []
    tested: list[str] = []
    for method in methods(make()):
        obj = make()
        try:
            params = list(inspect.signature(getattr(obj, method)).parameters)
        except (TypeError, ValueError):
            continue
        if not params or any(p not in PLAUSIBLE and p != "manager" for p in params):
            continue
        tested.append(method)
        for i, param in enumerate(params):
            for h in HOSTILE:
                kwargs = {p: plausible(name, p) for p in params}
                kwargs[param] = h
                if name == "RadixCache" and "node" in kwargs and i != params.index("node"):
                    continue
                problem = call(
                    lambda kw=kwargs, o=obj, m=method: getattr(o, m)(**kw), (), f"{name}.{method}"
                )
                if problem:
                    bad.append(f"{name}.{method}({param}=...): {problem}")
        problem = (
            call(obj.check_invariants, (), f"{name}.check_invariants")
            if hasattr(obj, "check_invariants")
            else None
        )
        if problem:
            bad.append(f"{name}.check_invariants after {method}: {problem}")
    assert tested, "no method had only known parameter names"
    assert not bad, "\n".join(bad[:40])


CONSTRUCTORS = [
    "RadixCache",
    "BlockPool",
    "KVCacheManager",
    "BlockTrie",
    "BlockHasher",
    "KvIndex",
    "LabCache",
    "CpuOffloadManager",
]


@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_constructors_with_hostile_arguments(name: str) -> None:
    cls = getattr(_core, name)
    bad = []
    for h in HOSTILE:
        for args in [(h,), (4, h), (4, h, h), (h, h, h, h, h)]:
            if (
                name in ("BlockPool", "KVCacheManager", "BlockTrie")
                and args[0] is h
                and (
                    isinstance(h, int | np.integer)
                    and not isinstance(h, bool)
                    and 2**20 < h < 2**63
                )
            ):
                continue  # a legal but huge pool: allocation, not validation
            problem = call(cls, args, name)
            if problem:
                bad.append(f"{name}: {problem}")
    assert not bad, "\n".join(bad[:40])


def test_functions_with_hostile_arguments() -> None:
    fns = [
        getattr(_core, n)
        for n in dir(_core)
        if not n.startswith("_") and inspect.isbuiltin(getattr(_core, n))
    ]
    assert fns, "no public functions found"
    bad = []
    for fn in fns:
        for args in argument_lists():
            for full in (args, ("sha256", *args), ("xxh3_64", None, *args)):
                problem = call(fn, full)
                if problem:
                    bad.append(f"{fn.__name__}: {problem}")
    assert not bad, "\n".join(bad[:40])


def test_result_objects_are_inert() -> None:
    """Results and handles cannot be built from Python."""
    c = _core.RadixCache()
    r = c.match_prefix([1, 2])
    for cls in (type(r), type(r.node), _core.InsertResult, _core.Claim, _core.Lookup):
        problem = call(cls, ())
        assert problem is None, problem
