"""BlockTrie API: argument checking (errors leave the trie unchanged), events, retention,
store rules."""

from __future__ import annotations

import numpy as np
import pytest

from prefixcache import (
    BlockTrie,
    InvalidInputError,
    InvalidTypeError,
    OutOfBlocksError,
    TrieBlockRemoved,
    TrieBlockStored,
    UnknownRequestError,
)
from prefixcache.reference.trie import BlockTrie as RefTrie
from prefixcache.reference.trie import chain_hash


def test_defaults_and_properties() -> None:
    t = BlockTrie(10)
    assert (t.num_blocks, t.tokens_per_block, t.num_free_blocks, t.num_cached_blocks) == (
        10,
        64,
        10,
        0,
    )
    assert t.enable_partial_reuse and t.copy_on_partial_reuse
    assert t.clock == 0 and t.num_requests == 0
    assert set(t.stats) >= {"partial_hits", "copies", "copied_tokens", "matched_tokens"}


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"priority": 101}, InvalidInputError),
        ({"priority": -1}, InvalidInputError),
        ({"priority": 1.5}, InvalidTypeError),
        ({"retention": -1}, InvalidInputError),
        ({"reserve_tokens": -3}, InvalidInputError),
        ({"lora_id": -1}, InvalidInputError),
        ({"mm_items": [(b"h", 5, 10)]}, InvalidInputError),
        ({"mm_items": [(b"h", 0, 0)]}, InvalidInputError),
        ({"mm_items": [(1.0, 0, 1)]}, InvalidTypeError),
        ({"mm_items": [(b"h", 0)]}, InvalidTypeError),
    ],
)
def test_bad_claim_arguments_raise_and_change_nothing(kwargs: dict, exc: type) -> None:
    t = BlockTrie(8, 4)
    before = (t.dump(), t.stats, t.clock)
    with pytest.raises(exc):
        t.claim(1, [1, 2, 3, 4, 5, 6], **kwargs)
    assert (t.dump(), t.stats, t.clock) == before
    t.check_invariants()


def test_bad_tokens_and_request_ids() -> None:
    t = BlockTrie(8, 4)
    with pytest.raises(InvalidInputError):
        t.claim(1, [])
    with pytest.raises(InvalidInputError):
        t.claim(1, [-1, 2])
    with pytest.raises(InvalidTypeError):
        t.claim(1, np.array([1.0, 2.0]))
    with pytest.raises(InvalidInputError):
        t.claim(-1, [1, 2])
    with pytest.raises(UnknownRequestError):
        t.release(5)
    with pytest.raises(UnknownRequestError):
        t.store(5, [1, 2])
    t.claim(1, np.arange(6, dtype=np.int32))
    with pytest.raises(InvalidInputError):
        t.claim(1, [1, 2])  # already holds blocks
    with pytest.raises(InvalidInputError):
        t.store(1, [0, 1, 9])  # disagrees with the claimed prompt
    assert t.store(1, [0, 1, 2]) == 1  # a prefix is fine: block 0 under the key [0, 1]
    with pytest.raises(InvalidInputError):
        t.store(1, list(range(6)) + list(range(20)))  # more blocks than held
    with pytest.raises(InvalidInputError):
        BlockTrie(0)
    with pytest.raises(InvalidInputError):
        BlockTrie(4, 0)


def test_out_of_blocks_leaves_the_trie_unchanged() -> None:
    t = BlockTrie(4, 4)
    t.claim(1, list(range(9)))  # 3 blocks
    before = (t.dump(), t.stats, t.clock)
    with pytest.raises(OutOfBlocksError):
        t.claim(2, list(range(100, 109)))
    with pytest.raises(OutOfBlocksError):
        t.extend(1, 100)
    assert (t.dump(), t.stats, t.clock) == before


@pytest.mark.parametrize("impl", [BlockTrie, RefTrie])
def test_events_name_blocks_by_id_and_chained_hash(impl: type) -> None:
    t = impl(8, 4)
    p = list(range(10))
    c = t.claim(1, p, lora_id=7, cache_salt="s")
    assert t.store(1, p) == 3
    (ev,) = t.take_events()
    assert isinstance(ev, TrieBlockStored)
    assert ev.block_ids == c.block_ids
    assert ev.parent_block_hash is None and ev.lora_id == 7 and ev.block_size == 4
    assert ev.token_ids == p[:9]
    h0 = chain_hash(None, ((7, "s"), (), (0, 1, 2, 3)))
    h1 = chain_hash(h0, ((7, "s"), (), (4, 5, 6, 7)))
    assert ev.block_hashes[:2] == [h0, h1]
    # The non-full last block grows at the next store: removed and stored again.
    t.extend(1, 14)
    assert t.store(1, [*p, 10, 11, 12]) == 1
    removed, stored = t.take_events()
    assert isinstance(removed, TrieBlockRemoved) and removed.block_ids == [c.block_ids[2]]
    assert stored.block_ids == [c.block_ids[2]] and stored.parent_block_hash == h1
    t.release(1)
    assert t.take_events() == []


@pytest.mark.parametrize("impl", [BlockTrie, RefTrie])
def test_events_can_be_turned_off(impl: type) -> None:
    # A trie whose events nobody takes records none (they would pile up otherwise), and
    # behaves the same.
    on, off = impl(4, 4), impl(4, 4, enable_events=False)
    for t in (on, off):
        for rid in range(6):  # more blocks than the trie has: evictions too
            p = list(range(100 * rid, 100 * rid + 9))
            t.claim(rid, p)
            t.store(rid, p)
            t.release(rid)
    assert off.take_events() == []
    assert len(on.take_events()) > 6
    assert on.dump() == off.dump() and on.stats == off.stats


@pytest.mark.parametrize("impl", [BlockTrie, RefTrie])
def test_compact_events_drop_only_the_token_ids(impl: type) -> None:
    import dataclasses

    full, compact = impl(4, 4, host_blocks=2), impl(4, 4, host_blocks=2)
    for t in (full, compact):
        for rid in range(6):
            p = list(range(100 * (rid % 3), 100 * (rid % 3) + 9))
            t.claim(rid, p)
            t.store(rid, p)
            t.release(rid)
    a, b = full.take_events(), compact.take_events(compact=True)
    assert any(isinstance(e, TrieBlockStored) for e in a)
    assert b == [
        dataclasses.replace(e, token_ids=None) if isinstance(e, TrieBlockStored) else e for e in a
    ]


@pytest.mark.parametrize("impl", [BlockTrie, RefTrie])
def test_retention_drops_to_the_default_priority(impl: type) -> None:
    t = impl(4, 2)
    c = t.claim(1, [1, 2, 3], priority=90, retention=3)
    t.store(1, [1, 2, 3])
    t.release(1)
    assert t.dump()[c.block_ids[0]]["priority"] == 90
    t.advance_clock(2)
    assert t.dump()[c.block_ids[0]]["priority"] == 90
    t.advance_clock(1)
    assert t.dump()[c.block_ids[0]]["priority"] == 35
    # Reusing with a new priority replaces it.
    t.claim(2, [1, 2, 3], priority=5)
    assert t.dump()[c.block_ids[0]]["priority"] == 5


@pytest.mark.parametrize("impl", [BlockTrie, RefTrie])
def test_a_cached_parent_is_not_evicted_before_its_children(impl: type) -> None:
    """Leaves only: a low-priority parent waits for its higher-priority child (TensorRT-LLM
    would evict the parent and free the child with it; see docs/TRTLLM.md)."""
    t = impl(4, 2)
    p = [1, 2, 3, 4, 5]  # keys [1,2] [3,4]; 3 context blocks
    a = t.claim(1, p, priority=80)
    t.store(1, p)
    t.release(1)
    t.claim(2, [1, 2, 9], priority=10)  # reuses [1,2], now priority 10
    t.release(2)
    c = t.claim(3, [50, 51, 52, 53, 54, 55, 56])  # needs 4 blocks: evicts everything
    order = c.block_ids
    assert order.index(a.block_ids[1]) < order.index(a.block_ids[0])


def test_stats_count_partial_hits_and_copies() -> None:
    t = BlockTrie(16, 4)
    p = list(range(12))
    t.claim(1, p)
    t.store(1, p)
    t.claim(2, [0, 1, 2, 3, 4, 5, 50, 51, 52])
    s = t.stats
    assert (s["partial_hits"], s["partial_tokens"], s["copies"], s["copied_tokens"]) == (1, 2, 1, 2)
    assert s["matched_tokens"] == 6 and s["reused_blocks"] == 1


def test_the_clock_saturates_and_retention_still_expires() -> None:
    """A claim ticks the clock; at 2**64 - 1 it stays there (as advance_clock does) rather
    than wrapping to 0, where a retention expiry would never come."""
    t = BlockTrie(4, 2)
    t.advance_clock(2**63 - 1)
    t.advance_clock(2**63 - 1)
    t.claim(1, [1, 2, 3], priority=80, retention=5)
    t.store(1, [1, 2, 3])
    t.release(1)
    t.claim(2, [7, 7, 7])
    assert t.clock == 2**64 - 1
    t.advance_clock(10)
    assert t.dump()[0]["priority"] == 35


def test_tokens_per_block_below_one_is_named() -> None:
    for bad in (0, -2):
        with pytest.raises(InvalidInputError, match=f"tokens_per_block must be >= 1, got {bad}"):
            BlockTrie(4, tokens_per_block=bad)
