"""The HiCache host tier of RadixCache (SEMANTICS.md 1.9): a hand case per rule, run on the
core and on the plain-Python reference, and the core against the reference on random
operation sequences with the invariants checked after every step."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from radix_ops import Lockstep, Op, op_sequences

import prefixcache
from prefixcache.errors import InvalidInputError, InvalidTypeError, PrefixCacheError
from prefixcache.reference import radix as reference

Core: Any = getattr(prefixcache, "RadixCache", None)
IMPLS = [pytest.param(reference.RadixCache, id="reference")]
if Core is not None:
    IMPLS.append(pytest.param(Core, id="core"))

WRITE_POLICIES = ["write_through", "write_through_selective", "write_back"]
PHASES = [p for p in Phase if os.environ.get("RADIX_SHRINK") == "1" or p is not Phase.shrink]
EXAMPLES = int(os.environ.get("RADIX_EXAMPLES", "30"))


def make(impl: Any, host: int, write: str = "write_through", page: int = 1, policy: str = "lru"):  # type: ignore[no-untyped-def]
    return impl(page, policy, host_capacity=host, write_policy=write)


def arr(xs: list[int]) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


# ---- hand cases, one per rule ----------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_write_through_backs_up_every_inserted_node(impl: Any) -> None:
    c = make(impl, 100)
    c.insert([1, 2, 3], arr([10, 11, 12]))
    c.insert([1, 2, 4], arr([20, 21, 22]))
    assert c.host_dump() == [(True, False), (True, False), (True, False)]
    assert c.host_size() == 4
    assert c.host_stats()["stored_tokens"] == 4


@pytest.mark.parametrize("impl", IMPLS)
def test_write_through_selective_waits_for_the_second_hit(impl: Any) -> None:
    c = make(impl, 100, "write_through_selective")
    c.insert([1, 2, 3], arr([10, 11, 12]))
    assert c.host_size() == 0
    c.insert([1, 2, 3, 4], arr([10, 11, 12, 13]))  # [1,2,3] counted again: hit count 2
    assert c.host_dump() == [(True, False), (False, False)]
    assert c.host_size() == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_selective_backup_chains_unbacked_ancestors(impl: Any) -> None:
    c = make(impl, 100, "write_through_selective")
    c.insert([1, 2], arr([1, 2]))
    c.insert([1, 2, 3, 4], arr([1, 2, 3, 4]), inserted_len=2)  # [1,2] not counted again
    c.insert([1, 2, 3, 4], arr([1, 2, 3, 4]), inserted_len=2)  # [3,4] reaches 2
    assert c.host_dump() == [(True, False), (True, False)]  # the parent went first


@pytest.mark.parametrize("impl", IMPLS)
def test_write_back_backs_up_on_device_eviction(impl: Any) -> None:
    c = make(impl, 100, "write_back")
    c.insert([1, 2, 3], arr([10, 11, 12]))
    assert c.host_size() == 0
    assert c.evict(3).tolist() == [10, 11, 12]
    assert c.host_dump() == [(True, True)]
    assert (c.total_size(), c.host_size(), c.num_nodes) == (0, 3, 1)
    assert c.node_info(c.root)["hit_count"] == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_write_back_counts_no_hits(impl: Any) -> None:
    c = make(impl, 100, "write_back")
    c.insert([1, 2])
    c.insert([1, 2])
    assert [r["hit_count"] for r in c.dump()] == [0]


@pytest.mark.parametrize("impl", IMPLS)
def test_device_eviction_keeps_backed_nodes_and_match_reports_the_host_part(impl: Any) -> None:
    c = make(impl, 100)
    c.insert([1, 2, 3], arr([10, 11, 12]))
    c.insert([1, 2, 3, 4, 5], arr([10, 11, 12, 13, 14]))
    freed = c.evict(2)
    assert freed.tolist() == [13, 14]
    assert c.num_nodes == 2 and c.total_size() == 3
    m = c.match_prefix([1, 2, 3, 4, 5, 6])
    assert (m.length, m.host_hit_length) == (3, 2)
    assert m.indices.tolist() == [10, 11, 12]
    assert c.host_state(m.node) == (True, False)
    assert c.host_state(m.last_host_node) == (True, True)
    assert c.dump()[1]["value"] == []
    with pytest.raises(InvalidInputError):
        c.path_indices(m.last_host_node)


@pytest.mark.parametrize("impl", IMPLS)
def test_match_splits_a_host_only_node(impl: Any) -> None:
    c = make(impl, 100)
    c.insert([1, 2, 3, 4], arr([10, 11, 12, 13]))
    c.evict(4)
    m = c.match_prefix([1, 2, 9])
    assert (m.length, m.host_hit_length) == (0, 2)
    assert c.host_dump() == [(True, True), (True, True)]
    assert c.host_size() == 4


@pytest.mark.parametrize("impl", IMPLS)
def test_load_back_restores_the_host_tail(impl: Any) -> None:
    c = make(impl, 100)
    c.insert([1, 2, 3, 4], arr([10, 11, 12, 13]))
    c.insert([1, 2, 3, 4, 5, 6], arr([10, 11, 12, 13, 14, 15]))
    c.evict(6)
    assert c.total_size() == 0
    m = c.match_prefix([1, 2, 3, 4, 5, 6])
    assert (m.length, m.host_hit_length) == (0, 6)
    c.inc_lock_ref(m.last_host_node)  # locks protect the path during the load
    assert c.protected_size() == 0
    assert c.load_back(m.last_host_node, arr([50, 51, 52, 53, 54, 55])) == 6
    assert c.protected_size() == 6 and c.evictable_size() == 0
    assert c.path_indices(m.last_host_node).tolist() == [50, 51, 52, 53, 54, 55]
    assert c.host_dump() == [(True, False), (True, False)]
    assert c.host_stats()["loaded_tokens"] == 6
    c.dec_lock_ref(m.last_host_node)
    m2 = c.match_prefix([1, 2, 3, 4, 5, 6])
    assert (m2.length, m2.host_hit_length) == (6, 0)
    assert m2.last_host_node == m2.node


@pytest.mark.parametrize("impl", IMPLS)
def test_load_back_checks_its_values_and_changes_nothing(impl: Any) -> None:
    c = make(impl, 100)
    c.insert([1, 2, 3], arr([10, 11, 12]))
    c.evict(3)
    m = c.match_prefix([1, 2, 3])
    before = (c.dump(), c.host_dump(), c.host_size())
    with pytest.raises(InvalidInputError, match="load_back"):
        c.load_back(m.last_host_node, arr([1, 2]))
    assert (c.dump(), c.host_dump(), c.host_size()) == before
    assert c.load_back(m.node) == 0  # the root: nothing host-only on its path
    assert c.load_back(m.last_host_node) == 3  # default values: the tokens
    assert c.path_indices(m.last_host_node).tolist() == [1, 2, 3]


@pytest.mark.parametrize("impl", IMPLS)
def test_insert_over_host_only_nodes_adopts_the_new_values(impl: Any) -> None:
    c = make(impl, 100)
    c.insert([1, 2], arr([10, 11]))
    c.insert([1, 2, 3, 4], arr([10, 11, 12, 13]))
    c.evict(2)
    r = c.insert([1, 2, 3, 4, 5], arr([20, 21, 22, 23, 24]))
    assert r.prefix_len == 2  # only the device part was cached: [3,4] took 22, 23
    assert c.path_indices(r.node).tolist() == [10, 11, 22, 23, 24]
    assert c.host_dump() == [(True, False), (True, False), (True, False)]
    assert c.host_size() == 5


@pytest.mark.parametrize("impl", IMPLS)
def test_host_eviction_is_lru_over_host_only_leaves(impl: Any) -> None:
    c = make(impl, 6)
    c.insert([1, 1, 1], arr([1, 2, 3]))
    c.insert([2, 2, 2], arr([4, 5, 6]))
    c.evict(6)  # both host-only, host full
    c.match_prefix([1, 1, 1])  # [1,1,1] is now the more recent
    c.insert([3, 3, 3], arr([7, 8, 9]))  # write-through needs 3: evicts [2,2,2]
    assert [r["key"] for r in c.dump()] == [[1, 1, 1], [3, 3, 3]]
    assert c.host_dump() == [(True, True), (True, False)]
    st_ = c.host_stats()
    assert (st_["host_evicted_tokens"], st_["peak_host_tokens"], c.host_size()) == (3, 6, 6)


@pytest.mark.parametrize("impl", IMPLS)
def test_host_eviction_never_drops_device_nodes_or_locked_nodes(impl: Any) -> None:
    c = make(impl, 6)
    c.insert([1, 1, 1], arr([1, 2, 3]))
    c.insert([2, 2, 2], arr([4, 5, 6]))
    c.evict(3)  # [1,1,1] host-only, [2,2,2] on the device and on host
    m = c.match_prefix([1, 1, 1])
    c.inc_lock_ref(m.last_host_node)
    assert c.evict_host(100) == 0
    c.dec_lock_ref(m.last_host_node)
    assert c.evict_host(1) == 3
    assert [r["key"] for r in c.dump()] == [[2, 2, 2]]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_backup_that_does_not_fit_is_skipped_and_the_node_deleted_later(impl: Any) -> None:
    c = make(impl, 2)
    c.insert([1, 2, 3], arr([1, 2, 3]))
    assert c.host_dump() == [(False, False)] and c.host_size() == 0
    c.evict(3)
    assert c.num_nodes == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_a_backup_chain_stops_at_the_first_node_that_does_not_fit(impl: Any) -> None:
    c = make(impl, 100, "write_through_selective")
    c.insert([1, 2], arr([1, 2]))
    c.insert([1, 2, 3], arr([1, 2, 3]), inserted_len=2)
    c.insert([1, 2, 3], arr([1, 2, 3]), inserted_len=2)  # [3] reaches 2: [1,2] goes first
    assert c.host_dump() == [(True, False), (True, False)]
    c2 = make(impl, 1, "write_through_selective")  # room for [3] only
    c2.insert([1, 2], arr([1, 2]))
    c2.insert([1, 2, 3], arr([1, 2, 3]), inserted_len=2)
    c2.insert([1, 2, 3], arr([1, 2, 3]), inserted_len=2)
    assert c2.host_dump() == [(False, False), (False, False)]  # [1,2] does not fit: stop


@pytest.mark.parametrize("impl", IMPLS)
def test_write_back_backup_makes_room_by_host_eviction_or_deletes(impl: Any) -> None:
    c = make(impl, 3, "write_back")
    c.insert([1, 2, 3], arr([1, 2, 3]))
    c.insert([1, 2, 3, 4], arr([1, 2, 3, 4]))
    c.evict(1)  # [4] backed up and host-only
    assert c.host_dump() == [(False, False), (True, True)]
    c.evict(3)  # [1,2,3] needs 3: host eviction drops [4] first
    assert c.host_dump() == [(True, True)] and c.host_size() == 3
    c.insert([7, 7, 7, 7], arr([7, 7, 7, 7]))
    c.evict(4)  # 4 tokens never fit in 3: [1,2,3] evicted from host, [7,7,7,7] deleted
    assert c.num_nodes == 0 and c.host_size() == 0
    assert c.host_stats()["host_evicted_tokens"] == 4


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_arguments(impl: Any) -> None:
    with pytest.raises(InvalidInputError, match="write policy"):
        make(impl, 10, "write_around")
    with pytest.raises(InvalidTypeError, match="write_policy"):
        impl(1, "lru", host_capacity=10, write_policy=3)
    with pytest.raises(PrefixCacheError, match="host_capacity"):
        impl(1, "lru", host_capacity=-1)
    with pytest.raises(InvalidInputError, match="num_tokens"):
        make(impl, 10).evict_host(-1)
    c = make(impl, 0)
    assert (c.host_capacity, c.write_policy, c.host_size()) == (0, None, 0)
    assert make(impl, 5, "write-back").write_policy == "write_back"


def _events(c: Any) -> tuple[list[int], list[int]]:
    stored, dropped = c.take_host_events()
    return list(stored), list(dropped)


@pytest.mark.parametrize("impl", IMPLS)
def test_host_events_report_copies_made_and_dropped(impl: Any) -> None:
    c = impl(1, "lru", host_capacity=8, write_policy="write_through", host_events=True)
    assert c.host_events
    c.insert([1, 2, 3, 4], arr([10, 11, 12, 13]))
    assert _events(c) == ([10, 11, 12, 13], [])
    assert _events(c) == ([], [])
    c.insert([1, 2, 7], arr([20, 21, 22]))  # splits [1..4]: its copy splits too
    assert _events(c) == ([22], [])
    assert [list(v) for v in c.host_values_dump()] == [[10, 11], [12, 13], [22]]
    c.evict(3)  # demotes [3, 4] and [7]
    m = c.match_prefix([1, 2, 3, 4])
    c.load_back(m.last_host_node, arr([30, 31]))  # fresh device values, the copy stays
    assert _events(c) == ([], [])
    assert c.path_indices(m.last_host_node).tolist() == [10, 11, 30, 31]
    assert [list(v) for v in c.host_values_dump()] == [[10, 11], [12, 13], [22]]
    assert c.evict_host(1) == 1
    assert _events(c) == ([], [22])
    c.evict(4)
    c.insert([5, 6, 7, 8, 9], arr([40, 41, 42, 43, 44]))  # evicts host leaf [3, 4] for room
    assert _events(c) == ([40, 41, 42, 43, 44], [12, 13])
    c.reset()  # drops everything unreported
    assert _events(c) == ([], []) and c.host_values_dump() == []


@pytest.mark.parametrize("impl", IMPLS)
def test_host_events_keep_sparse_labels_through_splits(impl: Any) -> None:
    # Mostly zeros, as a publisher's block labels: the copy splits and drops exactly.
    c = impl(1, "lru", host_capacity=16, write_policy="write_through", host_events=True)
    labels = [0, 0, 0, 5, 0, 0, 0, 9]
    c.insert(list(range(1, 9)), arr(labels))
    assert _events(c) == (labels, [])
    c.match_prefix([1, 2])  # splits after 2
    c.insert([1, 2, 3, 4, 5, 6, 70], arr([0] * 7))  # splits after 6
    assert [list(v) for v in c.host_values_dump()] == [
        [0, 0],
        [0, 5, 0, 0],
        [0, 9],
        [0],
    ]
    c.evict(16)
    assert c.evict_host(16) == 9
    stored, dropped = _events(c)
    assert stored == [0] and sorted(dropped) == sorted([*labels, 0])
    c.insert([1, 2, 3, 4], arr([0, 3, 0, 4]))
    c.evict(4)
    c.evict_host(4)
    assert [list(a) for a in c.take_host_events(nonzero=True)] == [[3, 4], [3, 4]]


@pytest.mark.parametrize("impl", IMPLS)
def test_host_events_under_write_back_copy_the_freed_values(impl: Any) -> None:
    c = impl(1, "lru", host_capacity=4, write_policy="write_back", host_events=True)
    c.insert([1, 2, 3], arr([10, 11, 12]))
    assert _events(c) == ([], [])
    assert c.evict(3).tolist() == [10, 11, 12]
    assert _events(c) == ([10, 11, 12], [])
    c.insert([4, 5, 6, 7, 8], arr([20, 21, 22, 23, 24]))
    c.evict(5)  # too long for host memory: drops [1, 2, 3] trying, then deletes the leaf
    assert _events(c) == ([], [10, 11, 12])


@pytest.mark.parametrize("impl", IMPLS)
def test_host_events_off_or_refused(impl: Any) -> None:
    c = make(impl, 8)
    assert not c.host_events
    c.insert([1, 2], arr([10, 11]))
    assert _events(c) == ([], [])
    assert [list(v) for v in c.host_values_dump()] == [[]]
    with pytest.raises(InvalidInputError, match="host_events needs a host tier"):
        impl(1, "lru", host_events=True)


# ---- differential: core vs reference -----------------------------------------------------


@st.composite
def host_sequences(draw: st.DrawFn, page_size: int) -> list[Op]:
    ops = draw(op_sequences(page_size, namespaces=False))
    for _ in range(draw(st.integers(0, 8))):
        extra: Op = (
            ("load", draw(st.integers(0, 1000)))
            if draw(st.booleans())
            else ("evict_host", draw(st.integers(0, 4 * page_size)))
        )
        ops.insert(draw(st.integers(0, len(ops))), extra)
    return ops


class HostLockstep(Lockstep):
    def apply(self, op: Op) -> None:
        kind = op[0]
        if kind == "match":
            self.steps += 1
            _, tokens, (ek, salt) = op
            res = self._each(lambda _i, c: c.match_prefix(tokens, extra_key=ek, cache_salt=salt))
            assert all(s == "ok" for s, _ in res), res
            self._same("match length", [r.length for _, r in res])
            self._same("match host", [r.host_hit_length for _, r in res])
            self._same("match indices", [r.indices for _, r in res])
            self._remember([r.node for _, r in res])
            self._remember([r.last_host_node for _, r in res])
            self.check()
        elif kind == "load":
            self.steps += 1
            h = self._handle(op[1])
            if h is not None:
                nodes = self.handles[h]
                n = host_tail_len(nodes[-1])  # the last cache is the reference
                values = np.arange(self.next_value, self.next_value + n, dtype=np.int64)
                self.next_value += n
                res = self._each(lambda i, c: c.load_back(nodes[i], values))
                self._same("load_back", res)
            self.check()
        elif kind == "evict_host":
            self.steps += 1
            self._same("evict_host", self._each(lambda _i, c: c.evict_host(op[1])))
            self.check()
        else:
            super().apply(op)

    def check(self) -> None:
        dumps = [check_host_invariants(c) for c in self.caches]
        self._same("dump", dumps)
        self._same("host dump", [c.host_dump() for c in self.caches])
        self._same(
            "sizes",
            [
                (
                    c.evictable_size(),
                    c.protected_size(),
                    c.total_size(),
                    c.num_nodes,
                    c.num_host_only_nodes,
                    c.clock,
                )
                for c in self.caches
            ],
        )
        self._same("host", [(c.host_size(), c.host_stats()) for c in self.caches])
        self._same("host values", [[list(v) for v in c.host_values_dump()] for c in self.caches])
        # The copies made and dropped since the last step (order within a step is free).
        taken = [c.take_host_events() for c in self.caches]
        self._same("host events", [(sorted(s), sorted(d)) for s, d in taken])


def host_tail_len(node: Any) -> int:
    """Host-only tokens on the path to a reference node (0 for a stale one)."""
    n = 0
    while node is not None and node.evicted and not node.removed:
        n += len(node.key)
        node = node.parent
    return n


def check_host_invariants(cache: Any) -> list[dict[str, Any]]:
    """The tree's invariants with a host tier; returns the dump."""
    if hasattr(cache, "check_invariants"):
        cache.check_invariants()
    dump: list[dict[str, Any]] = cache.dump()
    host = cache.host_dump()
    assert len(host) == len(dump) == cache.num_nodes
    device = [r for r, (_, ev) in zip(dump, host, strict=True) if not ev]
    assert cache.total_size() == sum(len(r["key"]) for r in device)
    assert cache.evictable_size() == sum(len(r["key"]) for r in device if r["lock_ref"] == 0)
    assert cache.host_size() == sum(
        len(r["key"]) for r, (b, _) in zip(dump, host, strict=True) if b
    )
    assert cache.host_size() <= cache.host_capacity
    values = [v for r in device for v in r["value"]]
    assert len(values) == len(set(values)), "a KV index is cached twice"
    evicted_depth: int | None = None  # inside a host-only subtree below this depth
    for r, (backed, evicted) in zip(dump, host, strict=True):
        if evicted_depth is not None and r["depth"] <= evicted_depth:
            evicted_depth = None
        if evicted:
            assert backed, "a host-only node without a host copy"
            assert r["value"] == []
            if evicted_depth is None:
                evicted_depth = r["depth"]
        else:
            assert evicted_depth is None, "a device node under a host-only node"
            assert len(r["value"]) == len(r["key"])
    return dump


@pytest.mark.skipif(Core is None, reason="prefixcache.RadixCache (the core) not built")
@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("write", WRITE_POLICIES)
@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"])
def test_core_matches_reference_with_a_host_tier(policy: str, write: str, page_size: int) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=PHASES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(ops=host_sequences(page_size), host=st.integers(1, 12), events=st.booleans())
    def check(ops: list[Op], host: int, events: bool) -> None:
        cap = host * page_size
        kw: dict[str, Any] = {"host_capacity": cap, "write_policy": write, "host_events": events}
        step = HostLockstep(
            [Core(page_size, policy, **kw), reference.RadixCache(page_size, policy, **kw)]
        )
        step.check()
        for i, op in enumerate(ops):
            try:
                step.apply(op)
            except AssertionError as e:
                raise AssertionError(f"step {i} {op!r}: {e}") from e

    check()
