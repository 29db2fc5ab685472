"""Operation sequences on a RadixCache (hypothesis strategy), a runner that applies them to
several implementations in lockstep, and the invariant checker.

An operation is plain data so the same sequence can drive the core and the reference:
  ("insert", tokens, ns, priority, inserted_len)  values come from a fresh counter
  ("match", tokens, ns)
  ("lock", h) / ("unlock", h) / ("info", h)        h indexes the remembered handles
  ("evict", k) / ("evict_count", k)                 evict_count: the count only
  ("reset",)
"""

from __future__ import annotations

import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from prefixcache.errors import LockRefError, PrefixCacheError, StaleHandleError

NAMESPACES: list[tuple[str | None, str | None]] = [
    (None, None),
    ("a", None),
    ("", None),
    (None, "s"),
    (None, ""),
    ("ab", "c"),
    ("a", "bc"),
]
PRIORITIES = [-2, 0, 0, 1, 3]

Op = tuple[Any, ...]


def as_container(tokens: list[int], k: int) -> Any:
    """The same token ids in one of the accepted containers (chosen by k)."""
    kinds = [
        lambda: tokens,
        lambda: np.array(tokens, dtype=np.uint32),
        lambda: np.array(tokens, dtype=np.int64),
        lambda: np.array(tokens + tokens, dtype=np.uint32)[::2],  # not contiguous
        lambda: array.array("Q", tokens),
        lambda: tuple(tokens),
    ]
    return kinds[k % len(kinds)]()


KINDS = ["insert"] * 4 + ["match"] * 3 + ["evict"] * 2 + ["evict_count", "lock", "unlock", "info"]


@st.composite
def op_sequences(
    draw: st.DrawFn, page_size: int, max_ops: int = 40, namespaces: bool = True
) -> list[Op]:
    """A sequence of operations whose token lists share prefixes often (built from a small
    pool of chunks whose lengths are not multiples of the page size)."""
    alphabet = st.sampled_from([0, 1, 2**31, 2**32 - 1])  # the extremes of the token range
    chunk = st.lists(alphabet, min_size=1, max_size=2 * page_size + 1)
    pool = draw(st.lists(chunk, min_size=2, max_size=4))
    tokens = st.builds(
        lambda parts, tail: [t for p in parts for t in p] + tail,
        st.lists(st.sampled_from(pool), min_size=1, max_size=4),
        st.lists(alphabet, max_size=page_size + 1),
    ) | st.lists(alphabet, max_size=3 * page_size)
    default_ns = st.just(NAMESPACES[0])
    ns = default_ns | st.sampled_from(NAMESPACES) if namespaces else default_ns
    ops: list[Op] = []
    for _ in range(draw(st.integers(max_ops // 2, max_ops))):
        kind = draw(st.sampled_from(KINDS))
        if kind == "insert":
            inserted_len = draw(st.just(0) | st.integers(0, 6 * page_size))
            ops.append(
                (kind, draw(tokens), draw(ns), draw(st.sampled_from(PRIORITIES)), inserted_len)
            )
        elif kind == "match":
            ops.append((kind, draw(tokens), draw(ns)))
        elif kind in ("evict", "evict_count"):
            ops.append((kind, draw(st.integers(0, 4 * page_size) | st.just(10**6))))
        else:
            ops.append((kind, draw(st.integers(0, 1_000))))
    if draw(st.integers(0, 9)) == 0 and ops:  # reset rarely
        ops.insert(draw(st.integers(0, len(ops))), ("reset",))
    return ops


def check_invariants(cache: Any, unique_values: bool = True) -> list[dict[str, Any]]:
    """Assert the structural invariants of a RadixCache; returns its dump()."""
    dump: list[dict[str, Any]] = cache.dump()
    page = cache.page_size
    total = cache.total_size()
    assert cache.evictable_size() + cache.protected_size() == total, "sizes do not add up"
    assert total == sum(len(r["key"]) for r in dump), "total_size is not the dumped tokens"
    assert cache.num_nodes == len(dump), "num_nodes is not the dumped nodes"
    assert cache.evictable_size() == sum(len(r["key"]) for r in dump if r["lock_ref"] == 0), (
        "evictable_size is not the unlocked tokens"
    )
    assert cache.protected_size() == sum(len(r["key"]) for r in dump if r["lock_ref"] > 0), (
        "protected_size is not the locked tokens"
    )
    if unique_values:
        counts = Counter(v for r in dump for v in r["value"])
        assert not counts or max(counts.values()) == 1, "a KV index is cached twice"
    stack: list[dict[str, Any]] = []  # ancestors of the current record
    siblings: list[set[Any]] = [set()]
    for r in dump:
        assert r["lock_ref"] >= 0, r
        assert len(r["key"]) > 0 and len(r["key"]) % page == 0, "node key not page aligned"
        assert len(r["key"]) == len(r["value"]), r
        assert r["hit_count"] >= 0, r
        assert r["creation_time"] <= r["last_access_time"] <= cache.clock, r
        depth = r["depth"] - 1  # the root's children have depth 1
        assert 0 <= depth <= len(stack), "dump depth jumps"
        del stack[depth:]
        del siblings[depth + 1 :]
        ns = (r["extra_key"], r["cache_salt"])
        assert r["cache_salt"] != "", r
        if stack:
            parent = stack[-1]
            assert (parent["extra_key"], parent["cache_salt"]) == ns, "namespace changes on a path"
            assert parent["lock_ref"] >= r["lock_ref"], "a lock does not cover the ancestors"
        first = (ns, tuple(r["key"][:page]))
        assert first not in siblings[depth], "two children share their first page"
        siblings[depth].add(first)
        stack.append(r)
        siblings.append(set())
    return dump


@dataclass
class Lockstep:
    """Applies operations to several caches and checks that they agree after each step."""

    caches: list[Any]
    unique_values: bool = True
    next_value: int = 1_000_000
    steps: int = 0
    handles: list[list[Any]] = field(default_factory=list)  # per step: one handle per cache
    locked: list[int] = field(default_factory=list)  # indexes into handles

    def _each(self, f: Any) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for i, c in enumerate(self.caches):
            try:
                out.append(("ok", f(i, c)))
            except PrefixCacheError as e:
                out.append((type(e).__name__, None))
        return out

    def _same(self, what: str, results: list[Any]) -> None:
        first = results[0]
        for r in results[1:]:
            assert _eq(first, r), f"{what}: {first!r} != {r!r}"

    def _remember(self, nodes: list[Any]) -> None:
        self.handles.append(nodes)

    def _handle(self, h: int) -> int | None:
        return h % len(self.handles) if self.handles else None

    def apply(self, op: Op) -> None:
        kind = op[0]
        self.steps += 1
        if kind == "insert":
            _, token_list, (ek, salt), priority, inserted_len = op
            tokens = as_container(token_list, self.steps)
            values: Any = np.arange(
                self.next_value, self.next_value + len(token_list), dtype=np.int64
            )
            if self.steps % 3 == 0:
                values = values.tolist()
            self.next_value += len(token_list)
            res = self._each(
                lambda _i, c: c.insert(
                    tokens,
                    values,
                    extra_key=ek,
                    cache_salt=salt,
                    priority=priority,
                    inserted_len=inserted_len,
                )
            )
            assert all(s == "ok" for s, _ in res), res
            self._same("insert prefix_len", [r.prefix_len for _, r in res])
            self._remember([r.node for _, r in res])
        elif kind == "match":
            _, token_list, (ek, salt) = op
            tokens = as_container(token_list, self.steps)
            res = self._each(lambda _i, c: c.match_prefix(tokens, extra_key=ek, cache_salt=salt))
            assert all(s == "ok" for s, _ in res), res
            self._same("match length", [r.length for _, r in res])
            self._same("match indices", [r.indices for _, r in res])
            for _, r in res:
                assert len(r.indices) == r.length and r.indices.dtype == np.int64
            self._remember([r.node for _, r in res])
        elif kind in ("lock", "unlock", "info"):
            h = self._handle(op[1])
            if kind == "unlock" and self.locked:
                h = self.locked[op[1] % len(self.locked)]
            if h is None:
                return
            nodes = self.handles[h]
            if kind == "info":
                # handles compare equal exactly when they name the same tree node
                same = [
                    [nodes[i] == other[i] for other in self.handles]
                    for i in range(len(self.caches))
                ]
                self._same("handle equality", same)
                for i in range(len(self.caches)):
                    assert all(
                        hash(nodes[i]) == hash(other[i])
                        for other, eq in zip(self.handles, same[i], strict=True)
                        if eq
                    )
                res = self._each(lambda i, c: (c.node_info(nodes[i]), c.path_indices(nodes[i])))
                self._same("info status", [s for s, _ in res])
                if res[0][0] == "ok":
                    self._same("node_info", [r[0] for _, r in res])
                    self._same("path_indices", [r[1] for _, r in res])
                return
            method = "inc_lock_ref" if kind == "lock" else "dec_lock_ref"
            res = self._each(lambda i, c: getattr(c, method)(nodes[i]))
            self._same(f"{method} status", [s for s, _ in res])
            self._same(f"{method} delta", [r for _, r in res])
            status = res[0][0]
            assert status in ("ok", StaleHandleError.__name__, LockRefError.__name__), status
            if status == "ok":
                if kind == "lock":
                    self.locked.append(h)
                elif h in self.locked:
                    self.locked.remove(h)
        elif kind == "evict":
            k = op[1]
            res = self._each(lambda _i, c: c.evict(k))
            assert all(s == "ok" for s, _ in res), res
            freed = [r for _, r in res]
            self._same("evicted indices", freed)
            assert freed[0].dtype == np.int64
            if len(freed[0]) < k:  # ran out of candidates: everything left is locked
                for c in self.caches:
                    assert c.evictable_size() == 0
        elif kind == "evict_count":
            # The same leaves as evict(k) (the dumps are compared after every step); only
            # their number comes back.
            k = op[1]
            before = [c.total_size() for c in self.caches]
            res = self._each(lambda _i, c: c.evict_count(k))
            assert all(s == "ok" for s, _ in res), res
            counts = [r for _, r in res]
            self._same("evicted count", counts)
            for c, b, n in zip(self.caches, before, counts, strict=True):
                assert type(n) is int and n == b - c.total_size()
            if counts[0] < k:
                for c in self.caches:
                    assert c.evictable_size() == 0
        elif kind == "reset":
            for c in self.caches:
                c.reset()
            self.handles.clear()
            self.locked.clear()
        else:
            raise AssertionError(f"unknown op {op!r}")
        self.check()

    def check(self) -> None:
        dumps = [check_invariants(c, self.unique_values) for c in self.caches]
        self._same("dump", dumps)
        self._same(
            "sizes",
            [
                (c.evictable_size(), c.protected_size(), c.total_size(), c.num_nodes, c.clock)
                for c in self.caches
            ],
        )
        self._same("root info", [c.node_info(c.root) for c in self.caches])
        for c in self.caches:
            text = c.pretty_print()
            assert isinstance(text, str) and text


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)
    return bool(a == b)
