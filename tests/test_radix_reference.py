"""Hand-written cases for the plain-Python reference RadixCache (the executable spec).
The expected values were read off SGLang 0.5.23 (and checked against it with
tools/check_radix_against_sglang.py)."""

from __future__ import annotations

import array
from typing import Any

import numpy as np
import pytest
from radix_ops import check_invariants

from prefixcache.reference.radix import RadixCache


def keys(c: RadixCache) -> list[tuple[int, list[int]]]:
    return [(r["depth"], r["key"]) for r in c.dump()]


def test_empty_cache() -> None:
    c = RadixCache()
    assert (c.page_size, c.eviction_policy, c.clock, c.num_nodes) == (1, "lru", 0, 0)
    assert (c.evictable_size(), c.protected_size(), c.total_size()) == (0, 0, 0)
    m = c.match_prefix([1, 2, 3])
    assert m.length == 0 and m.indices.dtype == np.int64 and len(m.indices) == 0
    assert m.node == c.root
    info = c.node_info(c.root)
    assert info["is_root"] and info["lock_ref"] == 1 and info["length"] == 0
    assert c.dump() == []
    assert c.evict(10).tolist() == []


def test_insert_then_match_splits() -> None:
    c = RadixCache()
    r = c.insert([1, 2, 3, 4], [10, 11, 12, 13])
    assert r.prefix_len == 0 and c.node_info(r.node)["length"] == 4
    m = c.match_prefix([1, 2, 9])
    assert m.length == 2 and m.indices.tolist() == [10, 11]
    assert keys(c) == [(1, [1, 2]), (2, [3, 4])]  # match split the leaf
    assert c.path_indices(m.node).tolist() == [10, 11]
    # the old handle keeps the lower half and its full path
    assert c.node_info(r.node)["length"] == 2
    assert c.path_indices(r.node).tolist() == [10, 11, 12, 13]
    assert c.total_size() == c.evictable_size() == 4
    check_invariants(c)


def test_insert_reports_prefix_and_keeps_existing_values() -> None:
    c = RadixCache()
    c.insert([1, 2, 3], [10, 11, 12])
    r = c.insert([1, 2, 3, 4, 5], [90, 91, 92, 93, 94])
    assert r.prefix_len == 3
    assert c.path_indices(r.node).tolist() == [10, 11, 12, 93, 94]
    r = c.insert([1, 2, 7], [80, 81, 82])
    assert r.prefix_len == 2
    assert keys(c) == [(1, [1, 2]), (2, [3]), (3, [4, 5]), (2, [7])]
    assert c.insert([1, 2], [0, 0]).prefix_len == 2  # fully cached: no new node
    assert c.num_nodes == 4
    check_invariants(c)


def test_default_values_are_the_tokens() -> None:
    c = RadixCache()
    c.insert(np.array([5, 6, 7], dtype=np.uint32))
    assert c.match_prefix(array.array("i", [5, 6, 7])).indices.tolist() == [5, 6, 7]


def test_page_alignment() -> None:
    c = RadixCache(page_size=4)
    r = c.insert(list(range(10)))  # truncated to 8 tokens
    assert c.total_size() == 8 and c.node_info(r.node)["length"] == 8
    assert c.match_prefix(list(range(7))).length == 4  # the query is truncated to 4
    assert c.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).length == 4  # split rounds down
    assert keys(c) == [(1, [0, 1, 2, 3]), (2, [4, 5, 6, 7])]
    assert c.insert([1, 2, 3]).node == c.root  # nothing left after truncation
    assert c.insert([0, 1, 2, 9, 9, 9, 9, 9]).prefix_len == 0  # first page differs
    check_invariants(c, unique_values=False)


def test_clock_ticks_once_per_call() -> None:
    c = RadixCache()
    c.insert([1, 2, 3])
    c.match_prefix([])
    c.insert([])
    assert c.clock == 3
    c.evict(1)
    c.inc_lock_ref(c.root)
    c.reset()
    assert c.clock == 3


def test_times_and_split_inheritance() -> None:
    c = RadixCache()
    r = c.insert([1, 2, 3, 4])  # t=1
    c.match_prefix([9])  # t=2, touches only the root
    assert c.node_info(c.root)["last_access_time"] == 2
    m = c.match_prefix([1, 2])  # t=3 splits
    top, tail = c.node_info(m.node), c.node_info(r.node)
    assert (top["creation_time"], top["last_access_time"]) == (1, 3)  # inherited creation
    assert (tail["creation_time"], tail["last_access_time"]) == (1, 3)  # touched by the walk
    assert top["hit_count"] == tail["hit_count"] == 1


def test_hit_count_and_inserted_len() -> None:
    c = RadixCache()
    a = c.insert([1, 2, 3, 4]).node
    assert c.node_info(a)["hit_count"] == 1  # a new leaf counts its insert
    c.insert([1, 2, 3, 4])
    assert c.node_info(a)["hit_count"] == 2
    c.match_prefix([1, 2, 3, 4])
    assert c.node_info(a)["hit_count"] == 2  # match never counts
    # the request already inserted 4 tokens: re-inserting them (and more) counts only the tail
    b = c.insert([1, 2, 3, 4, 5, 6], inserted_len=4).node
    assert c.node_info(a)["hit_count"] == 2 and c.node_info(b)["hit_count"] == 1
    # fully inside inserted_len: a new leaf gets no hit either
    d = c.insert([7, 8], inserted_len=2).node
    assert c.node_info(d)["hit_count"] == 0
    # after a split the upper (new) node counts the hit, the lower half keeps its count
    e = c.insert([1, 2, 9]).node
    upper = c.match_prefix([1, 2]).node
    assert c.node_info(upper)["hit_count"] == 3 and c.node_info(a)["hit_count"] == 2
    assert c.node_info(e)["hit_count"] == 1


def test_priority_propagates_up_with_max() -> None:
    c = RadixCache(eviction_policy="priority")
    a = c.insert([1, 2, 3], priority=5).node
    b = c.insert([1, 2, 4], priority=1).node
    top = c.match_prefix([1, 2]).node
    assert [c.node_info(n)["priority"] for n in (top, a, b)] == [5, 5, 1]
    c.insert([1, 2, 3], priority=9)
    assert [c.node_info(n)["priority"] for n in (top, a, b)] == [9, 9, 1]
    c.insert([1, 2], priority=-4)  # lower priorities never lower it
    assert c.node_info(top)["priority"] == 9


def test_eviction_frees_whole_leaves_and_cascades() -> None:
    c = RadixCache()
    c.insert([1, 2, 3, 4], [10, 11, 12, 13])
    c.insert([1, 2, 5], [20, 21, 22])
    c.insert([7], [70])
    # leaves: [3,4] (t=2 via the split walk), [5] (t=2), [7] (t=3)
    assert c.evict(1).tolist() == [12, 13]  # whole leaf, overshoots
    assert c.evict(2).tolist() == [22, 10, 11]  # then its parent became a leaf
    assert c.evict(100).tolist() == [70]
    assert c.total_size() == 0 and c.num_nodes == 0


def test_locked_nodes_are_not_evicted_and_sizes_move() -> None:
    c = RadixCache()
    a = c.insert([1, 2, 3, 4]).node
    c.insert([1, 2, 9])
    assert c.inc_lock_ref(a) == -4  # [1,2] and [3,4] become protected
    assert (c.evictable_size(), c.protected_size()) == (1, 4)
    assert c.inc_lock_ref(a) == 0  # already protected
    assert c.evict(100).tolist() == [9]
    assert c.total_size() == 4
    assert c.dec_lock_ref(a) == 0
    assert c.dec_lock_ref(a) == 4
    assert (c.evictable_size(), c.protected_size()) == (4, 0)
    assert c.evict(1).tolist() == [3, 4]  # the leaf alone covers 1 token
    check_invariants(c, unique_values=False)


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        # leaves: A=[1..] created t1 touched t5 (hit 2); B=[2..] t2 (prio 7); C=[3..] t3 touched t4
        ("lru", ["B", "C", "A"]),
        ("mru", ["A", "C", "B"]),
        ("fifo", ["A", "B", "C"]),
        ("filo", ["C", "B", "A"]),
        ("lfu", ["B", "C", "A"]),
        ("slru", ["B", "C", "A"]),
        ("priority", ["C", "A", "B"]),
    ],
)
def test_policy_orders(policy: str, order: list[str]) -> None:
    c = RadixCache(eviction_policy=policy)
    c.insert([1, 1], [1, 1])  # A, t1, hit 1
    c.insert([2, 2], [2, 2], priority=7)  # B, t2
    c.insert([3, 3], [3, 3])  # C, t3
    c.match_prefix([3, 3])  # C touched t4
    c.insert([1, 1], [9, 9])  # A touched t5, hit 2 (slru protected)
    assert c.evict(2).tolist() == [ord(order[0]) - ord("A") + 1] * 2
    assert c.evict(2).tolist() == [ord(order[1]) - ord("A") + 1] * 2
    assert c.evict(2).tolist() == [ord(order[2]) - ord("A") + 1] * 2


def test_lfu_counts_before_recency() -> None:
    c = RadixCache(eviction_policy="lfu")
    c.insert([1])
    c.insert([1])
    c.insert([1])  # hit 3, last touched at t3
    c.insert([2])  # hit 1, t4: more recent, fewer hits
    assert c.evict(1).tolist() == [2]


@pytest.mark.parametrize(
    ("policy", "first"), [("lru", [12]), ("mru", [22]), ("lfu", [12]), ("slru", [12])]
)
def test_tie_between_split_tail_and_new_leaf(policy: str, first: list[int]) -> None:
    """One insert splits [1,2,3] and adds [4] beside the tail [3]: both carry the same
    logical time. SGLang (checked) evicts the tail first under lru and the new leaf first
    under mru."""
    c = RadixCache(eviction_policy=policy)
    c.insert([1, 2, 3], [10, 11, 12])
    c.insert([1, 2, 4], [20, 21, 22])
    assert c.evict(1).tolist() == first


def test_namespaces_are_isolated() -> None:
    c = RadixCache()
    c.insert([1, 2, 3], [1, 2, 3])
    c.insert([1, 2, 3], [4, 5, 6], extra_key="ab", cache_salt="c")
    assert c.match_prefix([1, 2, 3], extra_key="a", cache_salt="bc").length == 0
    assert c.match_prefix([1, 2, 3], extra_key="abc").length == 0
    assert c.match_prefix([1, 2, 3], extra_key="ab", cache_salt="c").indices.tolist() == [4, 5, 6]
    assert c.match_prefix([1, 2, 3], extra_key="").length == 0  # "" is not None
    assert c.match_prefix([1, 2, 3], cache_salt="").indices.tolist() == [1, 2, 3]  # "" is None
    r = c.insert([1, 2, 3], [7, 8, 9], extra_key="a", cache_salt="bc")
    assert r.prefix_len == 0
    assert c.node_info(r.node)["extra_key"] == "a" and c.node_info(r.node)["cache_salt"] == "bc"
    # canonical order: no namespace first, then by extra_key, cache_salt
    assert [(x["extra_key"], x["cache_salt"]) for x in c.dump()] == [
        (None, None),
        ("a", "bc"),
        ("ab", "c"),
    ]
    check_invariants(c, unique_values=False)


def test_reset_empties_and_keeps_the_clock() -> None:
    c = RadixCache()
    c.insert([1, 2])
    c.reset()
    assert c.dump() == [] and c.total_size() == 0 and c.num_nodes == 0 and c.clock == 1
    assert c.node_info(c.root)["is_root"]


def test_pretty_print_is_text() -> None:
    c = RadixCache()
    c.insert([1, 2, 3])
    c.insert([1, 2, 4], extra_key="x")
    text = c.pretty_print()
    assert "#tokens: 6" in text and "[1, 2, 3]" in text


def _chain(cache: Any, depth: int) -> None:
    """A chain of ``depth`` nodes: one insert, then matches that split it from the end."""
    key = np.arange(depth, dtype=np.uint32)
    cache.insert(key)
    for i in range(depth - 1, 0, -1):
        cache.match_prefix(key[:i])


def test_deep_trees_dump_and_print_without_recursion_in_linear_space() -> None:
    """A chain deeper than Python's recursion limit: the reference dumps it (iteratively)
    as the core does, and both print it in space linear in its nodes (past 32 levels the
    depth is written, not drawn)."""
    from prefixcache import RadixCache as Core

    depth = 3000
    ref, core = RadixCache(1, host_capacity=10_000), Core(1, host_capacity=10_000)
    for c in (ref, core):
        _chain(c, depth)
    assert ref.dump() == core.dump()
    assert ref.host_dump() == core.host_dump() and len(ref.host_values_dump()) == depth
    for c in (ref, core):
        text = c.pretty_print()
        assert len(text) < 200 * depth
        assert f"({depth}) " in text.splitlines()[-2 if c is ref else -1]


def test_parent_as_the_core() -> None:
    from prefixcache import RadixCache as Core

    for c in (RadixCache(), Core()):
        node = c.insert([1, 2, 3]).node
        c.match_prefix([1, 2])
        parent = c.parent(node)
        assert parent is not None and c.parent(parent) == c.root and c.parent(c.root) is None
