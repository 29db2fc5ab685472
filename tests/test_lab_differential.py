"""LabCache (Rust core) against a plain-Python model (tests/lab_model.py) on random
operation sequences, for every eviction rule, with and without the admission filter and
overcommit: every result, error class, counter and cached key must agree, and the core's
invariants must hold after every step. Slots freed by eviction, by admission or by
release are reused, so a stamp a rule reads (last use, hits, priority, next use, seen
count, use class) that survived in a reused slot would show."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lab_model import LabModel

from prefixcache._core import LabCache
from prefixcache.errors import PrefixCacheError

RULES = ["lru", "opt", "slru", "session", "2q", "density", "lfu", "cost"]

path_st = st.lists(st.integers(0, 1), min_size=0, max_size=5)
rid_st = st.integers(0, 7)

op_st = st.one_of(
    st.tuples(st.just("acquire"), rid_st, path_st, st.integers(0, 7), st.integers(0, 2)),
    # A whole request: acquire, grow, release.
    st.tuples(
        st.just("cycle"),
        rid_st,
        path_st,
        st.integers(0, 7),
        st.integers(0, 2),
        st.lists(st.integers(0, 1), max_size=3),
    ),
    st.tuples(
        st.just("cycle"),
        rid_st,
        path_st,
        st.integers(0, 7),
        st.integers(0, 2),
        st.lists(st.integers(0, 1), max_size=3),
    ),
    st.tuples(st.just("grow"), rid_st, st.lists(st.integers(0, 1), max_size=3), st.integers(0, 3)),
    st.tuples(st.just("release"), rid_st),
    st.tuples(st.just("release"), rid_st),
    st.tuples(st.just("skip"), rid_st, path_st),
    st.tuples(st.just("overcommit"), st.booleans()),
)


class Keys:
    """Chained keys: a token path's key, the same for both sides (keys of unrelated
    paths are spread over the whole u64 range, as lab_block_keys' are)."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}

    def of(self, path: list[int]) -> list[int]:
        out = []
        for i in range(len(path)):
            p = tuple(path[: i + 1])
            if p not in self.ids:
                self.ids[p] = (len(self.ids) + 1) * 0x9E3779B97F4A7C15 % 2**64
            out.append(self.ids[p])
        return out


def run(impl: Any, op: tuple[Any, ...], keys: Keys, paths: dict[int, list[int]]) -> Any:
    kind = op[0]

    def arr(ks: list[int]) -> Any:
        return ks if isinstance(impl, LabModel) else np.array(ks, dtype=np.uint64)

    if kind == "acquire":
        _, rid, path, hittable, anon = op
        ks = keys.of(path)
        return impl.acquire(rid, arr(ks), min(hittable, len(ks)), len(ks) + anon)
    if kind == "cycle":
        _, rid, path, hittable, anon, more = op
        ks = keys.of(path)
        hit = impl.acquire(rid, arr(ks), min(hittable, len(ks)), len(ks) + anon)
        if hit is None:
            return None
        grown = keys.of(path + more)[len(path) :]
        ok = impl.grow(rid, arr(grown), len(path) + len(more))
        impl.release(rid)
        return (hit, ok)
    if kind == "skip":
        # Keys of a path without its first block: a cached one is out of its chain.
        _, rid, path = op
        ks = keys.of(path)[1:]
        return impl.acquire(rid, arr(ks), len(ks), len(ks))
    if kind == "grow":
        _, rid, more, anon = op
        base = paths.get(rid, [])
        ks = keys.of(base + more)[len(base) :]
        return impl.grow(rid, arr(ks), len(base) + len(ks) + anon)
    if kind == "release":
        return impl.release(op[1])
    return impl.set_overcommit(op[1])


def outcome(impl: Any, op: tuple[Any, ...], keys: Keys, paths: dict[int, list[int]]) -> Any:
    try:
        return ("ok", run(impl, op, keys, paths))
    except PrefixCacheError as e:
        return ("err", type(e).__name__)


def state(impl: Any, keys: Keys) -> Any:
    every = list(keys.ids.values())
    if isinstance(impl, LabModel):
        cached = [impl.lookup([k], 1) for k in every]
    else:
        cached = [impl.lookup(np.array([k], dtype=np.uint64), 1) for k in every]
    return (impl.num_free, impl.stats(), cached)


def future_arrays(reqs: list[tuple[list[int], int]]) -> tuple[Any, Any, Any]:
    flat = [k for ks, _ in reqs for k in ks]
    offsets = np.cumsum([0] + [len(ks) for ks, _ in reqs]).astype(np.uint64)
    hittable = np.array([h for _, h in reqs], dtype=np.uint32)
    return np.array(flat, dtype=np.uint64), offsets, hittable


def check_run(
    rule: str,
    ops: list[tuple[Any, ...]],
    capacity: int,
    admit_after: int | None,
    overcommit: bool,
    protected: float,
    depth_cost: float,
    future: list[tuple[list[int], int]],
) -> None:
    args = (capacity, rule, admit_after, overcommit, protected, depth_cost)
    core, model = LabCache(*args), LabModel(*args)
    keys = Keys()
    if rule == "opt":
        reqs = [(keys.of(p), min(h, len(p))) for p, h in future]
        core.set_future(*future_arrays(reqs))
        model.set_future(reqs)
    paths: dict[int, list[int]] = {}
    for op in ops:
        a = outcome(core, op, keys, paths)
        b = outcome(model, op, keys, paths)
        assert a == b, op
        if a == ("ok", True) and op[0] == "grow":
            paths[op[1]] = paths.get(op[1], []) + list(op[2])
        elif a[0] == "ok" and a[1] is not None and op[0] in ("acquire", "skip"):
            paths[op[1]] = list(op[2])
        elif a[0] == "ok" and op[0] == "release":
            paths.pop(op[1], None)
        core.check_invariants()
        assert state(core, keys) == state(model, keys), op


@settings(max_examples=300, deadline=None)
@given(
    rule=st.sampled_from(RULES),
    ops=st.lists(op_st, min_size=1, max_size=40),
    capacity=st.integers(1, 8),
    admit_after=st.sampled_from([None, 2, 3]),
    overcommit=st.booleans(),
    protected=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    depth_cost=st.sampled_from([0.0, 0.5]),
    future=st.lists(st.tuples(path_st, st.integers(0, 5)), max_size=8),
)
def test_core_equals_the_model(
    rule: str,
    ops: list[tuple[Any, ...]],
    capacity: int,
    admit_after: int | None,
    overcommit: bool,
    protected: float,
    depth_cost: float,
    future: list[tuple[list[int], int]],
) -> None:
    check_run(rule, ops, capacity, admit_after, overcommit, protected, depth_cost, future)


def random_ops(rng: random.Random, n: int, width: int = 2, deep: int = 5) -> list[tuple[Any, ...]]:
    """Mostly whole requests over a few shared paths (hits, evictions, slot reuse)."""

    def path(k: int) -> list[int]:
        return [rng.randint(0, width - 1) for _ in range(rng.randint(0, k))]

    ops: list[tuple[Any, ...]] = []
    for _ in range(n):
        x, rid = rng.random(), rng.randint(0, 7)
        if x < 0.5:
            ops.append(("cycle", rid, path(deep), 7, rng.randint(0, 2), path(min(deep, 3))))
        elif x < 0.7:
            ops.append(("acquire", rid, path(deep), rng.choice([7, 7, 1]), rng.randint(0, 2)))
        elif x < 0.8:
            ops.append(("grow", rid, path(3), rng.randint(0, 2)))
        elif x < 0.97:
            ops.append(("release", rid))
        elif x < 0.99:
            ops.append(("skip", rid, path(5)))
        else:
            ops.append(("overcommit", rng.random() < 0.5))
    return ops


@pytest.mark.parametrize("rule", RULES)
def test_seeded_runs_equal_the_model(rule: str) -> None:
    rng = random.Random(RULES.index(rule))
    # Short runs over small budgets, and long ones over large budgets: density learns
    # from its 128th request on and samples 64 of more candidates.
    for n in [50] * 150 + [600] * 4:
        short = n == 50
        width, deep = (2, 5) if short else (200, 1)
        capacity = rng.randint(1, 8) if short else rng.randint(80, 160)
        future = [
            ([rng.randint(0, 1) for _ in range(rng.randint(0, 5))], rng.randint(0, 5))
            for _ in range(rng.randint(0, 10))
        ]
        check_run(
            rule,
            random_ops(rng, n, width, deep),
            capacity,
            rng.choice([None, None, 2, 3]),
            rng.random() < 0.3,
            rng.choice([0.0, 0.3, 0.5, 0.8, 1.0]),
            rng.choice([0.0, 0.5]),
            future,
        )
