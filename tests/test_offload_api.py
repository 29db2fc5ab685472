"""CpuOffloadManager's API: errors leave the state unchanged, the KV events it publishes
carry medium "CPU", and a fleet index fed a pool's and its tier's events keeps holders per
medium."""

from __future__ import annotations

import numpy as np
import pytest

import prefixcache
from prefixcache import BlockRemoved, BlockStored, CpuOffloadManager, KvIndex
from prefixcache.sim.policies.vllm import BlocksPolicy, parse_offload


def k(i: int) -> bytes:
    return i.to_bytes(8, "big")


def test_bad_arguments_raise_and_change_nothing() -> None:
    m = CpuOffloadManager(2, enable_events=True)
    out = m.prepare_store(0, [k(1)])
    assert out is not None and out.keys_to_store == [k(1)] and out.chunk_ids == [0]
    with pytest.raises(prefixcache.InvalidInputError, match="cache_policy"):
        CpuOffloadManager(2, cache_policy="fifo")
    with pytest.raises(prefixcache.InvalidInputError, match="store_threshold"):
        CpuOffloadManager(2, store_threshold=0)
    with pytest.raises(prefixcache.InvalidTypeError, match=r"keys\[0\] must be bytes"):
        m.prepare_store(0, ["ab"])
    with pytest.raises(prefixcache.InvalidInputError, match="1 to 32 bytes"):
        m.lookup(b"x" * 33)
    with pytest.raises(prefixcache.InvalidInputError, match="distinct"):
        m.prepare_store(0, [k(2), k(2)])
    with pytest.raises(prefixcache.BlockStateError, match="not stored and ready"):
        m.prepare_load(0, [k(1)])  # still being stored
    with pytest.raises(prefixcache.BlockStateError, match="no load in flight"):
        m.complete_load(0, [k(1)])
    with pytest.raises(prefixcache.InvalidInputError, match="request_id"):
        m.on_new_request(-1)
    with pytest.raises(prefixcache.InvalidInputError, match="end_tokens"):
        m.set_offload_key_positions(0, [k(1)], [16, 32])
    m.check_invariants()
    assert (m.num_stored, m.num_write_pending, m.num_free_chunks) == (1, 1, 1)
    m.complete_store(0, [k(1)])
    assert m.lookup(k(1)) == "HIT" and m.lookup(k(2)) == "MISS"
    assert m.prepare_load(1, [k(1)]) == [0]


def test_a_failed_complete_load_releases_no_load() -> None:
    """complete_load releases one load per listed key (a key listed twice, two loads)
    and, when one of them has none in flight, raises having released none."""
    m = CpuOffloadManager(4)
    out = m.prepare_store(0, [k(1), k(2)])
    assert out is not None
    m.complete_store(0, out.keys_to_store)
    m.prepare_load(1, [k(1)])
    m.prepare_load(2, [k(1)])  # k(1): two loads in flight, k(2): none
    idle = m.num_idle
    with pytest.raises(prefixcache.BlockStateError, match="no load in flight"):
        m.complete_load(1, [k(1), k(2)])
    with pytest.raises(prefixcache.BlockStateError, match="no load in flight"):
        m.complete_load(1, [k(1), k(1), k(1)])
    m.check_invariants()
    assert m.num_idle == idle
    m.complete_load(1, [k(1), k(1)])
    assert m.num_idle == idle + 1
    with pytest.raises(prefixcache.BlockStateError, match="no load in flight"):
        m.complete_load(1, [k(1)])
    m.check_invariants()


def test_kv_events_carry_the_cpu_medium() -> None:
    m = CpuOffloadManager(1, enable_events=True)
    m.complete_store(0, m.prepare_store(0, [k(1)]).keys_to_store)  # type: ignore[union-attr]
    m.complete_store(1, m.prepare_store(1, [k(2)]).keys_to_store)  # type: ignore[union-attr]
    evs = m.take_kv_events()
    assert [type(e) for e in evs] == [BlockStored, BlockRemoved, BlockStored]
    assert all(e.medium == "CPU" for e in evs)
    assert evs[0].block_hashes == [1] and evs[1].block_hashes == [1]
    assert evs[0].block_size == 0 and evs[0].parent_block_hash is None
    assert m.take_kv_events() == []


def test_fleet_index_sees_gpu_and_cpu_holders() -> None:
    """A pool of 4 blocks with an 8-block CPU tier: the second prompt evicts the first
    from the GPU, but its blocks stay on the CPU tier, and the index says so."""
    pol = BlocksPolicy(4 * 16, cpu_capacity=8 * 16, publish_events=True)
    a = np.arange(3 * 16 + 1, dtype=np.uint32)
    b = np.arange(1000, 1000 + 3 * 16 + 1, dtype=np.uint32)
    for rid, p in enumerate((a, b)):
        assert pol.admit(rid, p, 0) is not None
        pol.on_prefill_done(rid)
        pol.finish(rid, np.zeros(0, dtype=np.uint32))
    evs = pol.take_events()
    assert {e.medium for e in evs} == {"GPU", "CPU"}
    ix = KvIndex()
    ix.apply("w", evs)
    ha = [int.from_bytes(h[-8:], "big") for h in prefixcache.BlockHasher().hash_blocks(a)]
    m = ix.longest_prefix(ha[:3])
    assert (m.blocks("w", "CPU"), m.blocks("w")) == (3, 3)
    assert m.blocks("w", "GPU") < 3
    ix.check_invariants()
    # Admitted again: the GPU lost some of it, the CPU tier supplies the rest.
    hit = pol.admit(2, a, 0)
    assert hit == 48 and pol.host_hit(2) > 0
    pol.check()


def test_parse_offload() -> None:
    assert parse_offload(None) == ("lru", 1)
    assert parse_offload("arc:2") == ("arc", 2)
    assert parse_offload("lru:4294967295") == ("lru", 2**32 - 1)
    for bad in ("fifo", "lru:0", "lru:x", "arc:", "lru:\u00b2", "lru:\u0661", "lru:4294967296"):
        with pytest.raises(prefixcache.InvalidInputError, match="offload"):
            parse_offload(bad)
    with pytest.raises(prefixcache.InvalidInputError, match="less than one 16-token block"):
        BlocksPolicy(1024, cpu_capacity=15)


def test_lru_ties_fall_to_the_key_bytes_as_python_orders_them() -> None:
    """Equal ranks (equal positions of one request) are ordered by key as Python orders
    bytes, whatever their lengths: b"\x01\x01\x01" < b"\x04"."""
    from prefixcache.reference.offload import CpuOffloadManager as Reference

    for a, b in ((b"\x01" * 3, b"\x04"), (b"\x04", b"\x01" * 3), (b"\x01", b"\x01\x00")):
        evicted = []
        for cls in (CpuOffloadManager, Reference):
            m = cls(2)
            m.set_offload_key_positions(0, [a, b], [16, 16])
            m.prepare_store(0, [a, b])
            m.complete_store(0, [a, b])
            evicted.append(m.prepare_store(1, [b"\x07"]).evicted_keys)
        assert evicted[0] == evicted[1] == [min(a, b)]


def test_end_tokens_past_int64_are_refused() -> None:
    keys = [bytes([i]) * 8 for i in range(1, 5)]
    m = CpuOffloadManager(3)
    m.set_request_keys(0, keys[:3], 2**61)  # the last end token, 3 * 2**61, fits
    with pytest.raises(prefixcache.InvalidInputError, match="must fit in int64"):
        m.set_request_keys(1, keys, 2**62)  # 4 * 2**62 = 2**64: past 2**63 - 1
    with pytest.raises(prefixcache.InvalidInputError, match="must fit in int64"):
        m.set_request_keys(1, keys[:2], 2**62)  # 2**63
    assert m.lookup_prefix_range(1, 0, 4) == 0  # request 1 got no keys


def test_result_classes_are_exported_as_docs_api_says() -> None:
    """docs/API.md: everything it describes is exported from ``prefixcache``, the
    tier's results included (they were reachable only through ``prefixcache._core``)."""
    from prefixcache import OffloadingEvent, PrepareStoreOutput

    assert {"OffloadingEvent", "PrepareStoreOutput"} <= set(prefixcache.__all__)
    tier = CpuOffloadManager(2, enable_events=True)
    tier.on_new_request(1)
    out = tier.prepare_store(1, [b"k" * 8])
    assert isinstance(out, PrepareStoreOutput)
    tier.complete_store(1, [b"k" * 8])
    events = tier.take_events()
    assert events and all(isinstance(e, OffloadingEvent) for e in events)


def test_a_manager_argument_of_another_type_is_refused_and_changes_nothing() -> None:
    """set_request_keys_from takes a KVCacheManager; anything else raises
    InvalidTypeError naming the type, and the tier is as before: a twin tier that never
    saw the refused calls answers the same calls the same way afterwards."""
    mgr = prefixcache.KVCacheManager(16, block_size=4)
    mgr.add_request(0, list(range(12)))
    tiers = [CpuOffloadManager(4, enable_events=True) for _ in range(2)]
    for t in tiers:
        t.set_request_keys_from(mgr, 0)
        assert t.prepare_store_range(0, 0, 2, True) == (2, 0)
        t.take_events()
    refused, twin = tiers
    for bad, name in [
        (1, "int"),
        (None, "NoneType"),
        (prefixcache.BlockPool(4), "BlockPool"),
        (refused, "CpuOffloadManager"),
        ("mgr", "str"),
    ]:
        with pytest.raises(
            prefixcache.InvalidTypeError, match=f"manager must be a KVCacheManager, got {name}"
        ):
            refused.set_request_keys_from(bad, 0)  # type: ignore[arg-type]
    for t in tiers:
        t.check_invariants()
    assert [(t.num_stored, t.num_idle, t.num_free_chunks) for t in tiers] == [(2, 2, 2)] * 2
    assert refused.take_events() == twin.take_events() == []
    got = [
        (
            t.lookup_prefix_range(0, 0, 3),
            t.prepare_store_range(0, 0, 3, True),
            t.lookup_prefix_range(0, 0, 3),
            [(e.keys, e.removed) for e in t.take_events()],
        )
        for t in tiers
    ]
    assert got[0] == got[1]
    assert got[0][2] == 3  # the request's keys are still the manager's three blocks


def test_a_repeated_key_in_a_store_is_named() -> None:
    """A store refused for a repeated key says which key, by name or through the
    request's block order."""
    m = CpuOffloadManager(4)
    with pytest.raises(prefixcache.InvalidInputError, match=f"key {k(2).hex()} is offered twice"):
        m.prepare_store(0, [k(1), k(2), k(3), k(2)])
    m.set_request_keys(0, [k(1), k(5), k(1)], 16)
    with pytest.raises(
        prefixcache.InvalidInputError,
        match=f"key {k(1).hex()} is named twice by the request's keys in the range",
    ):
        m.prepare_store_range(0, 0, 3)
    assert m.prepare_store_range(0, 0, 2) == (2, 0)
    assert m.num_stored == 2


def test_result_reprs_show_counts_as_counts() -> None:
    """A result's key lists are shown by their size, marked as such: ``keys_to_store=1``
    read as a value the attribute does not hold."""
    tier = CpuOffloadManager(2, enable_events=True)
    out = tier.prepare_store(0, [k(1), k(2)])
    assert out is not None
    assert repr(out) == (
        "PrepareStoreOutput(keys_to_store=<2 keys>, chunk_ids=[0, 1], evicted_keys=<0 keys>)"
    )
    tier.complete_store(0, [k(1), k(2)])
    (event,) = tier.take_events()
    assert repr(event) == (
        "OffloadingEvent(keys=<2 keys>, medium='CPU', removed=False, metadata_only=False)"
    )


@pytest.mark.parametrize(
    ("call", "args", "error", "message"),
    [
        ("complete_store", (-1, [k(1)], 1), prefixcache.InvalidInputError, "request_id"),
        ("complete_store", (0, "keys", None), prefixcache.InvalidTypeError, "keys must be"),
        ("complete_store", (0, [b""], 1), prefixcache.InvalidInputError, r"keys\[0\]"),
        (
            "set_offload_key_positions",
            (-1, [k(1)], [-1]),
            prefixcache.InvalidInputError,
            "request_id",
        ),
        ("set_offload_key_positions", (0, [1], [-1]), prefixcache.InvalidTypeError, r"keys\[0\]"),
        ("prepare_store", (2**64, ["x"]), prefixcache.InvalidInputError, "request_id"),
        ("touch", (True, [1]), prefixcache.InvalidTypeError, "request_id"),
    ],
)
def test_the_first_bad_argument_is_named_as_the_reference_names_it(
    call: str, args: tuple[object, ...], error: type[Exception], message: str
) -> None:
    """Arguments are read in order: of several bad ones, the first is named, by the core
    as by the reference (``success`` was read before ``request_id`` and ``keys``)."""
    from prefixcache.reference import offload as ref

    for m in (CpuOffloadManager(2), ref.CpuOffloadManager(2)):
        with pytest.raises(error, match=message):
            getattr(m, call)(*args)


@pytest.mark.parametrize(
    ("call", "args", "message"),
    [
        ("set_request_keys", (-1, [k(1)], 0), "request_id"),
        ("set_request_keys", (0, "keys", 0), "keys must be"),
        ("lookup_prefix_range", (-1, 0, -1), "request_id"),
        ("prepare_load_range", (-1, "0", 1), "request_id"),
        ("complete_load_range", (0, -1, "1"), "start"),
        ("prepare_store_range", (-1, 0, 1, 1), "request_id"),
        ("prepare_store_range", (0, 0, -1, 1), "stop"),
    ],
)
def test_range_calls_name_their_first_bad_argument(
    call: str, args: tuple[object, ...], message: str
) -> None:
    m = CpuOffloadManager(2)
    with pytest.raises(prefixcache.PrefixCacheError, match=message):
        getattr(m, call)(*args)


def test_arguments_are_read_in_order() -> None:
    """A request id's ``__index__`` runs before a later argument is read: an int-like
    ``start`` that records when it is read sees the request id read already."""
    seen: list[str] = []

    class Index:
        def __init__(self, name: str, value: int) -> None:
            self.name, self.value = name, value

        def __index__(self) -> int:
            seen.append(self.name)
            return self.value

    m = CpuOffloadManager(2)
    m.set_request_keys(Index("request_id", 0), [k(1), k(2)], Index("tokens_per_key", 16))  # type: ignore[arg-type]
    assert m.prepare_store_range(Index("rid", 0), Index("start", 0), Index("stop", 2), True) == (  # type: ignore[arg-type]
        2,
        0,
    )
    m.complete_store(Index("store", 0), [k(1)], True)  # type: ignore[arg-type]
    assert seen == ["request_id", "tokens_per_key", "rid", "start", "stop", "store"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"cache_policy": "fifo", "store_threshold": 0},
            prefixcache.InvalidInputError,
            "cache_policy",
        ),
        (
            {"cache_policy": "fifo", "enable_events": 1},
            prefixcache.InvalidInputError,
            "cache_policy",
        ),
        (
            {"cache_policy": "fifo", "max_tracker_size": -1},
            prefixcache.InvalidInputError,
            "cache_policy",
        ),
        ({"cache_policy": 1, "store_threshold": 0}, prefixcache.InvalidTypeError, "cache_policy"),
        (
            {"store_threshold": 0, "enable_events": 1},
            prefixcache.InvalidInputError,
            "store_threshold",
        ),
    ],
)
def test_the_constructor_names_its_first_bad_argument(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    """An unknown cache_policy is named before a bad later argument (its name was checked
    after every argument was read), by the core as by the reference."""
    from prefixcache.reference import offload as ref

    for cls in (CpuOffloadManager, ref.CpuOffloadManager):
        with pytest.raises(error, match=message):
            cls(2, **kwargs)  # type: ignore[arg-type]


def test_a_load_past_a_chunks_count_is_refused_by_the_reference_as_by_the_core() -> None:
    """A chunk counts at most 2**31 - 1 loads in flight (the core's count is an int32,
    which wrapped to a negative count, read as a store in flight): one more is refused,
    nothing changed. The core's side is a Rust test (reaching the bound takes 2**31
    loads); the reference is set near it directly."""
    from prefixcache.reference import offload as ref

    m = ref.CpuOffloadManager(4, enable_events=True)
    out = m.prepare_store(0, [k(1), k(2)])
    assert out is not None
    m.complete_store(0, out.keys_to_store)
    chunk = m.policy.get(k(1))
    assert chunk is not None
    chunk.ref_cnt = ref.MAX_LOADS - 2
    m.num_idle -= 1
    m.policy.mark_busy(k(1))
    assert m.prepare_load(1, [k(1), k(2), k(1)]) == [0, 1, 0]  # the bound, exactly
    before = (chunk.ref_cnt, m.num_idle, m.policy.get(k(2)).ref_cnt)  # type: ignore[union-attr]
    for keys in ([k(2), k(1)], [k(1)]):
        with pytest.raises(
            prefixcache.BlockStateError, match=r"a chunk counts at most 2\*\*31 - 1"
        ):
            m.prepare_load(1, keys)
        assert (chunk.ref_cnt, m.num_idle, m.policy.get(k(2)).ref_cnt) == before  # type: ignore[union-attr]
    m.check_invariants()
    assert m.lookup(k(1)) == "HIT"


def test_take_kv_events_names_an_unknown_format_before_a_bad_compact() -> None:
    """event_hash_format is checked as it is read: before compact, and before any event
    is taken (the events stay for the next call)."""
    tier = CpuOffloadManager(2, enable_events=True)
    tier.prepare_store(0, [k(1)])
    tier.complete_store(0, [k(1)])
    with pytest.raises(prefixcache.InvalidInputError, match="event_hash_format must be"):
        tier.take_kv_events("hex", 1)  # type: ignore[arg-type]
    with pytest.raises(prefixcache.InvalidTypeError, match="compact must be a bool"):
        tier.take_kv_events("u64", 1)  # type: ignore[arg-type]
    (event,) = tier.take_kv_events("bytes")
    assert event.block_hashes == [k(1)] and event.medium == "CPU"
