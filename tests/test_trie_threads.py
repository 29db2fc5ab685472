"""Two-phase claim under concurrency: several Python threads claim, complete, store and
release on one BlockTrie (the core runs with the GIL released, its state behind a lock).
Nothing may be lost, double-counted or evicted while referenced."""

from __future__ import annotations

import random
import threading

import pytest

from prefixcache import BlockTrie, OutOfBlocksError

TPB = 8
SYSTEMS = [[1000 * s + i for i in range(37)] for s in range(3)]


def worker(t: BlockTrie, wid: int, rounds: int, errors: list[BaseException]) -> None:
    rng = random.Random(wid)
    try:
        for r in range(rounds):
            rid = wid * 1_000_000 + r
            prompt = rng.choice(SYSTEMS) + [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
            try:
                c = t.claim(rid, prompt, reserve_tokens=8, priority=rng.choice([None, 20, 60]))
            except OutOfBlocksError:
                continue
            # Phase one is done: every block the claim returned, and every copy source,
            # is referenced and cannot be evicted or taken over by another thread.
            held = t.request_blocks(rid)
            assert held == c.block_ids
            for src, dst, n in c.copies:
                assert dst in c.block_ids and src not in c.block_ids and 0 < n <= TPB
            assert len(set(c.block_ids)) == len(c.block_ids)
            assert t.complete(rid) == len(c.copies)
            t.store(rid, prompt)
            out = [rng.randrange(5) for _ in range(rng.randrange(0, 8))]
            t.store(rid, prompt + out)
            t.release(rid)
    except BaseException as e:  # reported to the main thread
        errors.append(e)


def test_concurrent_claims_keep_the_trie_consistent() -> None:
    t = BlockTrie(96, TPB)
    errors: list[BaseException] = []
    threads = [threading.Thread(target=worker, args=(t, w, 150, errors)) for w in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    t.check_invariants()
    assert t.num_requests == 0
    assert t.num_free_blocks == t.num_blocks
    s = t.stats
    assert s["claims"] > 0 and s["matched_tokens"] > 0


def test_blocks_held_across_threads_are_never_handed_out_twice() -> None:
    """Threads hold their claims while others claim: no block may be in two requests'
    lists unless it is a shared (reused) block."""
    t = BlockTrie(400, TPB)
    barrier = threading.Barrier(4)
    results: dict[int, tuple[list[int], int]] = {}
    lock = threading.Lock()

    def hold(wid: int) -> None:
        rng = random.Random(wid)
        prompt = SYSTEMS[0] + [rng.randrange(100) for _ in range(30)]
        barrier.wait()
        for r in range(20):
            rid = wid * 100 + r
            c = t.claim(rid, prompt, reserve_tokens=TPB)
            with lock:
                results[rid] = (c.block_ids, c.num_reused_blocks)
            t.complete(rid)
            t.store(rid, prompt)

    threads = [threading.Thread(target=hold, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t.check_invariants()
    owners: dict[int, int] = {}
    for blocks, reused in results.values():
        for b in blocks[reused:]:  # blocks not reused by exact key are private
            owners[b] = owners.get(b, 0) + 1
    assert all(v == 1 for v in owners.values())
    for rid in results:
        t.release(rid)
    t.check_invariants()
    assert t.num_free_blocks == t.num_blocks


def test_copy_source_stays_pinned_until_complete() -> None:
    t = BlockTrie(6, 4)
    p = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # blocks [1-4] [5-8] [9]
    a = t.claim(1, p)
    t.store(1, p)
    c = t.claim(2, [1, 2, 3, 4, 5, 6, 0, 0, 0])  # partial on block [5-8], held: copy
    (src, dst, n) = c.copies[0]
    assert dst == c.block_ids[1]
    assert (src, n) == (a.block_ids[1], 2)
    t.release(1)  # the source's only other holder leaves
    # Pinned: the source is neither free nor evictable, so the pool is short by one.
    assert t.num_free_blocks == 6 - 3 - 1
    with pytest.raises(OutOfBlocksError):
        t.claim(3, list(range(100, 112)))
    assert src in [d["block_id"] for d in t.dump() if d["cached"]]
    assert t.complete(2) == 1
    assert t.num_free_blocks == 6 - 3
    t.release(2)
    t.check_invariants()


def race_for_one_leaf() -> list[str | None]:
    t = BlockTrie(64, 4)
    p = [1, 2, 3, 4, 5, 6, 7]  # keys [1-4] [5, 6]: block 1 is a non-full leaf
    t.claim(0, p)
    t.store(0, p)
    t.release(0)
    barrier = threading.Barrier(8)
    kinds: list[str | None] = []
    lock = threading.Lock()

    def race(rid: int) -> None:
        barrier.wait()
        c = t.claim(rid, [1, 2, 3, 4, 5, 9, 9, 9])
        with lock:
            kinds.append(c.partial_kind)

    threads = [threading.Thread(target=race, args=(r,)) for r in range(1, 9)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t.check_invariants()
    return kinds


def test_a_free_leaf_is_taken_over_by_exactly_one_of_many_racing_claims() -> None:
    """Lookup and reference are one step: of 8 threads racing for one unreferenced
    partial leaf, exactly one takes it over; the others find it gone (no partial hit)."""
    for _ in range(20):
        kinds = race_for_one_leaf()
        assert kinds.count("taken_over") == 1
        assert kinds.count(None) == 7
