"""BlockPool / KVCacheManager API details: event formats, input containers, stats, threads."""

from __future__ import annotations

import array
import threading

import numpy as np
import pytest

from prefixcache import (
    AllBlocksCleared,
    BlockHasher,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVCacheManager,
)
from prefixcache.errors import InvalidInputError, InvalidTypeError


def test_event_hash_formats_agree() -> None:
    """u64 events carry the last 8 bytes (big-endian) of the hashes that bytes events carry."""
    seen = {}
    for fmt in ("u64", "bytes"):
        m = KVCacheManager(4, block_size=4, enable_kv_cache_events=True, event_hash_format=fmt)
        m.admit(1, list(range(9)))
        m.finish(1)
        m.admit(2, list(range(100, 109)))  # reuses and evicts the first request's blocks
        m.free(2)
        assert m.reset_prefix_cache()
        seen[fmt] = m.take_events()
    for a, b in zip(seen["u64"], seen["bytes"], strict=True):
        assert type(a) is type(b)
        if isinstance(a, BlockStored | BlockRemoved):
            assert a.block_hashes == [int.from_bytes(h[-8:], "big") for h in b.block_hashes]
    kinds = [type(e) for e in seen["u64"]]
    assert kinds == [BlockStored, BlockRemoved, BlockRemoved, BlockStored, AllBlocksCleared]
    first = seen["bytes"][0]
    assert isinstance(first, BlockStored)
    assert first.token_ids == list(range(8)) and first.parent_block_hash is None
    assert first.kv_cache_spec_kind == "full_attention" and first.extra_keys == [None, None]


def test_hashes_match_block_hasher() -> None:
    toks = np.arange(50, dtype=np.int64)
    m = KVCacheManager(16, block_size=16, hash_algo="sha256_cbor")
    m.add_request(7, toks)
    assert m.block_hashes(7) == BlockHasher(16, "sha256_cbor").hash_blocks(toks)
    m.append_tokens(7, array.array("I", range(14)))
    assert m.block_hashes(7) == BlockHasher(16, "sha256_cbor").hash_blocks(
        np.concatenate([toks, np.arange(14)])
    )


def test_containers_and_stats() -> None:
    m = KVCacheManager(32, block_size=4)
    for rid, toks in enumerate(
        [np.arange(9, dtype=np.uint32), list(range(9)), array.array("q", range(9))]
    ):
        got = m.admit(rid, toks, 3)
        assert got is not None
        hit, ids = got
        assert ids.dtype == np.int64 and len(ids) == 3
        assert hit == (0 if rid == 0 else 8)
    assert m.stats == {
        "requests": 3,
        "queries": 27,
        "hits": 16,
        "preempted_requests": 0,
        "preempted_queries": 0,
        "preempted_hits": 0,
        "reset": False,
    }
    assert m.take_stats()["requests"] == 3 and m.stats["requests"] == 0
    p = BlockPool(8)
    ids = p.get_new_blocks(3)
    p.free_blocks(ids[::-1])  # a strided numpy view
    assert p.free_block_ids().tolist() == [3, 2, 1, 4, 5, 6, 7]


def test_concurrent_admissions_keep_invariants() -> None:
    m = KVCacheManager(512, block_size=16)
    system = list(range(2048))
    errors: list[BaseException] = []

    def worker(base: int) -> None:
        try:
            for i in range(20):
                rid = base * 1000 + i
                if m.admit(rid, system + [base, i] * 20, 8) is not None:
                    m.finish(rid, [1, 2, 3])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(b,)) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    m.check_invariants()
    assert len(m) == 0 and m.num_free_blocks == 511
    assert m.stats["requests"] == 80 and m.stats["hits"] >= 2048 * 70


def test_eviction_counter_and_touched_blocks() -> None:
    from prefixcache import BlockPool, KVCacheManager
    from prefixcache.events import BlockRemoved

    p = BlockPool(8, enable_kv_cache_events=True)
    assert (p.num_evicted_blocks, p.num_touched_blocks) == (0, 1)  # the null block
    ids = p.get_new_blocks(4).tolist()
    p.cache_full_blocks(ids, [bytes([i]) * 32 for i in range(4)], 0, 4, 16)
    p.free_blocks(ids[::-1])
    assert p.num_touched_blocks == 5
    p.evict_blocks([ids[0]])  # an explicit removal is not an eviction
    p.take_events()
    p.get_new_blocks(7)  # 3 never-used blocks first, then the 4 freed: 3 cached ones
    removed = [e for e in p.take_events() if isinstance(e, BlockRemoved)]
    assert p.num_evicted_blocks == 3 == sum(len(e.block_hashes) for e in removed)
    assert p.num_touched_blocks == 8
    m = KVCacheManager(9, block_size=4)
    for rid in range(3):
        m.admit(rid, list(range(100 * rid, 100 * rid + 17)))
        m.finish(rid)
    assert m.num_evicted_blocks > 0 and m.num_touched_blocks == 9


def test_batch_calls_take_every_request_id_a_request_can_have() -> None:
    """Request ids are ints in [0, 2**64) in every call: extend, decode_steps and
    max_decode_steps take ids past int64 (given as ints or a uint64 array) as admit does,
    and refuse ids outside the range as request_id does."""
    big = [2**63, 2**64 - 1]
    m = KVCacheManager(16, block_size=2)
    for rid in big:
        assert m.admit(rid, [1, 2, 3]) is not None
        m.queue_tokens(rid, [4, 5, 6])
    assert m.max_decode_steps(big, 4) == 4
    assert m.max_decode_steps(np.array(big, dtype=np.uint64), 4) == 4
    ev, _ = m.extend(big, [7, 8], [1, 1])
    assert ev.tolist() == [0, 0]
    ev, _ = m.decode_steps(tuple(big), 2)
    assert ev.tolist() == [0, 0]
    assert [m.num_tokens(r) for r in big] == [6, 6]
    before = [m.block_ids(r).tolist() for r in big], m.num_free_blocks
    # The conversion layer's messages for a sequence's items (as for token ids).
    for bad, exc, msg in [
        (
            [2**64],
            InvalidInputError,
            f"request_ids[0] = {2**64} is out of range: it must be in [0, 2**64)",
        ),
        ([0, -1], InvalidInputError, "request_ids[1] = -1 must be >= 0"),
        ([1.0], InvalidTypeError, "request_ids[0] must be an int, got float"),
    ]:
        with pytest.raises(exc) as e:
            m.max_decode_steps(bad, 1)
        assert str(e.value) == msg
    assert ([m.block_ids(r).tolist() for r in big], m.num_free_blocks) == before


def test_a_hit_on_a_never_used_block_takes_it_out_of_the_free_queue() -> None:
    """allocate_slots touches the hit blocks it is given, as vLLM's manager does: a
    block the pool never handed out leaves the free queue and is not handed out again
    as a new block (it was, held twice with one reference)."""
    from prefixcache.reference import blocks as ref

    for m in (KVCacheManager(4, block_size=1), ref.KVCacheManager(4, block_size=1)):
        m.add_request(0, [2])
        new = m.allocate_slots(0, 0, 1, [3], 1)
        assert list(new) == [1]
        assert list(m.block_ids(0)) == [3, 1]
        assert [m.ref_cnt(b) for b in range(4)] == [0, 1, 0, 1]
        assert list(m.free_block_ids()) == [2]
        if isinstance(m, KVCacheManager):
            m.check_invariants()
        m.free(0)
        assert list(m.free_block_ids()) == [1, 3, 2]
