"""Thread safety of the core classes shared between Python threads.

Every class keeps its core structure behind a mutex; short calls run with the GIL held,
long ones (long keys, large evictions, dump, hashing of long prompts) with the GIL
released (docs/ARCHITECTURE.md, "Concurrency"). These tests run 8 threads on one object:

* free-running: the threads call the object concurrently with no Python lock; afterwards
  every invariant holds and the totals that do not depend on the interleaving agree with
  the operation logs (logical clock = number of match/insert calls; every KV index the
  threads created is in exactly one of: the tree, an evict() result, a duplicate returned
  via prefix_len; every manager block is free once every request is freed);
* recorded: each call is made under a Python lock that records the order in which the
  calls ran (thread, op index); the calls still run with the GIL released and other
  threads keep running Python code in between. Replaying the same per-thread logs serially
  in the recorded order on a fresh object must reproduce every result and the final state
  exactly. Only this order is comparable: results (match lengths, evicted indices, cache
  hits, block ids) depend on the interleaving, so a free-running run can only be checked
  by the order-independent totals above.

Plus: a long core call lets another Python thread run (the GIL is released), and error
paths raised from GIL-released calls do not deadlock against GIL-holding callers.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefixcache import (
    BlockHasher,
    BlockPool,
    BlockTrie,
    KVCacheManager,
    RadixCache,
)
from prefixcache.errors import (
    InvalidInputError,
    OutOfBlocksError,
    PrefixCacheError,
    StaleHandleError,
    UnknownRequestError,
)

THREADS = 8
JOIN_TIMEOUT = 60.0  # a deadlock detector only: a healthy run takes a few seconds

Op = tuple[Any, ...]


def run_threads(
    target: Callable[[int], None], n: int = THREADS, switch_interval: float = 1e-5
) -> None:
    """Runs target(0..n-1) in n threads started together; re-raises the first error and
    fails if a thread does not finish (a deadlock). A short switch interval makes the
    threads interleave often."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)

    def body(t: int) -> None:
        try:
            barrier.wait()
            target(t)
        except BaseException as e:  # reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,), daemon=True) for t in range(n)]
    for th in threads:
        th.start()
    try:
        for th in threads:
            th.join(JOIN_TIMEOUT)
    finally:
        sys.setswitchinterval(old)
    assert not any(th.is_alive() for th in threads), "threads did not finish: deadlock"
    if errors:
        raise errors[0]


class Recorder:
    """Serializes calls and records the order they ran in: (thread, op index)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order: list[tuple[int, int]] = []

    @contextmanager
    def step(self, t: int, i: int) -> Iterator[None]:
        with self.lock:
            self.order.append((t, i))
            yield


def guard(rec: Recorder | None, t: int, i: int) -> AbstractContextManager[None]:
    return rec.step(t, i) if rec is not None else nullcontext()


# ---------------------------------------------------------------------------------------
# RadixCache

SYSTEMS = [[1000 * s + j for j in range(20 + 40 * s)] for s in range(6)]
LONG_SYSTEM = [7_000_000 + j for j in range(66_000)]  # past the GIL-release thresholds
VALUE_STRIDE = 10**9  # thread t's KV indices are t * VALUE_STRIDE + a counter


def radix_log(t: int, n: int) -> list[Op]:
    rng = random.Random(1000 + t)
    ops: list[Op] = []
    for _ in range(n):
        if rng.random() < 0.04:  # past the threshold: runs with the GIL released
            base = LONG_SYSTEM[: rng.randrange(65_600, len(LONG_SYSTEM) + 1)]
        else:
            base = rng.choice(SYSTEMS)
            base = base[: rng.randrange(1, len(base) + 1)]
        key = base + [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        r = rng.random()
        if r < 0.35:
            ops.append(("insert", key, rng.random() < 0.5))
        elif r < 0.6:
            ops.append(("match", key, rng.random() < 0.5))
        elif r < 0.75:
            ops.append(("lock", key))
        elif r < 0.9:
            ops.append(("unlock", rng.randrange(1 << 30)))
        else:
            ops.append(("evict", rng.choice([1, 10, 100, 3000, 20_000])))
    ops.append(("release",))  # unlock everything still held
    return ops


@dataclass
class RadixThread:
    """One thread's bookkeeping: its locked nodes and where its KV indices went."""

    t: int
    next_value: int = 0
    held: list[Any] = field(default_factory=list)
    created: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    clock_calls: int = 0

    def values(self, n: int) -> np.ndarray:
        start = self.t * VALUE_STRIDE + self.next_value
        self.next_value += n
        v = np.arange(start, start + n, dtype=np.int64)
        self.created.extend(v.tolist())
        return v


def radix_apply(c: RadixCache, s: RadixThread, op: Op) -> Any:
    """Applies one op; returns a comparable result. Raises only on an unexpected error."""
    kind = op[0]
    if kind == "insert":
        key = np.array(op[1], dtype=np.uint32) if op[2] else op[1]
        v = s.values(len(op[1]))
        s.clock_calls += 1
        r = c.insert(key, v)
        s.duplicates.extend(v[: r.prefix_len].tolist())
        return ("insert", r.prefix_len)
    if kind == "match":
        key = np.array(op[1], dtype=np.uint32) if op[2] else op[1]
        s.clock_calls += 1
        return ("match", c.match_prefix(key).length)
    if kind == "lock":
        s.clock_calls += 1
        m = c.match_prefix(op[1])
        if m.length == 0:
            return ("lock", 0)
        try:
            delta = c.inc_lock_ref(m.node)
        except StaleHandleError:  # evicted by another thread between match and lock
            return ("lock", "stale")
        s.held.append(m.node)
        # Locked: the lazy indices are the matched prefix's, whatever other threads do.
        idx = m.indices
        assert len(idx) == m.length
        return ("lock", m.length, delta, idx.tolist())
    if kind == "unlock":
        if not s.held:
            return ("unlock", None)
        node = s.held.pop(op[1] % len(s.held))
        return ("unlock", c.dec_lock_ref(node))
    if kind == "release":
        deltas = [c.dec_lock_ref(node) for node in s.held]
        s.held.clear()
        return ("release", deltas)
    if kind == "evict":
        freed = c.evict(op[1]).tolist()
        s.evicted.extend(freed)
        return ("evict", freed)
    raise AssertionError(op)


def radix_run(logs: list[list[Op]], rec: Recorder | None) -> tuple[RadixCache, list[Any]]:
    c = RadixCache()
    states = [RadixThread(t) for t in range(len(logs))]
    results: list[list[Any]] = [[None] * len(log) for log in logs]

    def body(t: int) -> None:
        s = states[t]
        for i, op in enumerate(logs[t]):
            with guard(rec, t, i):
                results[t][i] = radix_apply(c, s, op)

    run_threads(body, len(logs))
    return c, [states, results]


def check_radix_totals(c: RadixCache, states: list[RadixThread]) -> None:
    c.check_invariants()
    assert c.protected_size() == 0
    assert c.evictable_size() == c.total_size()
    assert c.clock == sum(s.clock_calls for s in states)
    in_tree = [x for d in c.dump() for x in d["value"]]
    assert len(in_tree) == c.total_size()
    created = [x for s in states for x in s.created]
    placed = in_tree + [x for s in states for x in s.evicted + s.duplicates]
    # Every index the threads created is in exactly one place: none leaked, none twice.
    assert len(placed) == len(set(placed))
    assert sorted(placed) == sorted(created)


def test_radix_cache_free_running_threads_keep_every_index() -> None:
    logs = [radix_log(t, 500) for t in range(THREADS)]
    c, (states, _) = radix_run(logs, None)
    check_radix_totals(c, states)
    assert any(s.evicted for s in states) and any(s.duplicates for s in states)
    c.evict(1 << 62)
    assert c.total_size() == 0
    c.check_invariants()


def test_radix_cache_recorded_interleaving_replays_exactly() -> None:
    logs = [radix_log(t, 300) for t in range(THREADS)]
    rec = Recorder()
    c, (states, results) = radix_run(logs, rec)
    check_radix_totals(c, states)

    replay = RadixCache()
    rstates = [RadixThread(t) for t in range(THREADS)]
    for t, i in rec.order:
        assert radix_apply(replay, rstates[t], logs[t][i]) == results[t][i], (t, i)
    assert replay.dump() == c.dump()
    assert replay.clock == c.clock


# ---------------------------------------------------------------------------------------
# KVCacheManager

BLOCK = 16
PROMPTS = [[50_000 * p + j for j in range(40 + 90 * p)] for p in range(5)]  # up to 400
LONG_PROMPT = [9_000_000 + j for j in range(1100)]  # hashed with the GIL released


def manager_log(t: int, n: int) -> list[Op]:
    rng = random.Random(2000 + t)
    ops: list[Op] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            base = LONG_PROMPT if rng.random() < 0.1 else rng.choice(PROMPTS)
            prompt = base[: rng.randrange(1, len(base) + 1)] + [
                rng.randrange(3) for _ in range(rng.randrange(0, 20))
            ]
            ops.append(("admit", prompt, rng.random() < 0.5))
        elif r < 0.7:
            ops.append(
                (
                    "append",
                    rng.randrange(1 << 30),
                    [rng.randrange(9) for _ in range(rng.choice([1, 1, 5, 40]))],
                )
            )
        elif r < 0.85:
            ops.append(("free", rng.randrange(1 << 30)))
        else:
            ops.append(
                (
                    "finish",
                    rng.randrange(1 << 30),
                    [rng.randrange(9) for _ in range(rng.randrange(0, 30))],
                )
            )
    ops.append(("release",))  # free every live request
    return ops


@dataclass
class ManagerThread:
    t: int
    live: list[int] = field(default_factory=list)
    admitted: int = 0
    queries: int = 0
    hits: int = 0


def manager_apply(m: KVCacheManager, s: ManagerThread, i: int, op: Op) -> Any:
    kind = op[0]
    if kind == "admit":
        rid = s.t * 1_000_000 + i
        prompt = np.array(op[1], dtype=np.uint32) if op[2] else op[1]
        got = m.admit(rid, prompt)
        if got is None:
            assert rid not in m
            return ("admit", None)
        s.live.append(rid)
        s.admitted += 1
        s.queries += len(op[1])
        s.hits += got[0]
        return ("admit", got[0], got[1].tolist())
    if kind == "release":
        for rid in s.live:
            m.free(rid)
        n, s.live = len(s.live), []
        return ("release", n)
    if not s.live:
        return (kind, None)
    rid = s.live[op[1] % len(s.live)]
    if kind == "append":
        m.append_tokens(rid, op[2])
        got = m.allocate_slots(rid, len(op[2]))
        return ("append", None if got is None else got.tolist())
    s.live.remove(rid)
    if kind == "free":
        m.free(rid)
        return ("free",)
    return ("finish", m.finish(rid, op[2]))


def manager_run(
    logs: list[list[Op]], rec: Recorder | None
) -> tuple[KVCacheManager, list[ManagerThread], list[list[Any]]]:
    m = KVCacheManager(160, BLOCK, hash_algo="xxh3_64")
    states = [ManagerThread(t) for t in range(len(logs))]
    results: list[list[Any]] = [[None] * len(log) for log in logs]

    def body(t: int) -> None:
        s = states[t]
        for i, op in enumerate(logs[t]):
            with guard(rec, t, i):
                results[t][i] = manager_apply(m, s, i, op)

    run_threads(body, len(logs))
    return m, states, results


def check_manager_totals(m: KVCacheManager, states: list[ManagerThread]) -> None:
    m.check_invariants()
    assert len(m) == 0
    # Every block is back: free exactly once (null block 0 excluded), no ref left.
    free = m.free_block_ids().tolist()
    assert sorted(free) == list(range(1, m.num_blocks))
    assert m.num_free_blocks == m.num_blocks - 1
    assert all(m.ref_cnt(b) == 0 for b in free)
    # Admissions are counted once each, whatever the order they happened in.
    stats = m.stats
    assert stats["requests"] == sum(s.admitted for s in states)
    assert stats["queries"] == sum(s.queries for s in states)
    assert stats["hits"] == sum(s.hits for s in states)


def test_manager_free_running_threads_return_every_block() -> None:
    logs = [manager_log(t, 600) for t in range(THREADS)]
    m, states, results = manager_run(logs, None)
    check_manager_totals(m, states)
    flat = [r for rs in results for r in rs]
    assert any(r[0] == "admit" and r[1] is None for r in flat)  # the pool ran short
    assert m.stats["hits"] > 0


def test_manager_recorded_interleaving_replays_exactly() -> None:
    logs = [manager_log(t, 300) for t in range(THREADS)]
    rec = Recorder()
    m, states, results = manager_run(logs, rec)
    check_manager_totals(m, states)

    replay = KVCacheManager(160, BLOCK, hash_algo="xxh3_64")
    rstates = [ManagerThread(t) for t in range(THREADS)]
    for t, i in rec.order:
        assert manager_apply(replay, rstates[t], i, logs[t][i]) == results[t][i], (t, i)
    assert replay.stats == m.stats
    assert replay.free_block_ids().tolist() == m.free_block_ids().tolist()


# ---------------------------------------------------------------------------------------
# BlockPool, BlockHasher, BlockTrie (briefly)


def test_block_pool_never_hands_one_block_to_two_threads() -> None:
    pool = BlockPool(300)
    owned: set[int] = set()
    lock = threading.Lock()

    def body(t: int) -> None:
        rng = random.Random(t)
        mine: list[list[int]] = []
        for _ in range(300):
            if mine and rng.random() < 0.5:
                ids = mine.pop(rng.randrange(len(mine)))
                with lock:
                    owned.difference_update(ids)
                pool.free_blocks(ids)
                continue
            try:
                ids = pool.get_new_blocks(rng.choice([1, 3, 8, 40])).tolist()
            except OutOfBlocksError:
                continue
            with lock:
                assert owned.isdisjoint(ids)
                owned.update(ids)
            mine.append(ids)
        for ids in mine:
            with lock:
                owned.difference_update(ids)
            pool.free_blocks(ids)

    run_threads(body)
    pool.check_invariants()
    assert pool.num_free_blocks == 299
    assert sorted(pool.free_block_ids().tolist()) == list(range(1, 300))


def test_block_hasher_gives_the_same_hashes_from_many_threads() -> None:
    h = BlockHasher(16, "sha256", seed="s")
    rng = random.Random(5)
    inputs = [
        np.array([rng.randrange(50_000) for _ in range(n)], dtype=np.uint32)
        for n in (40, 700, 3000)
    ]
    expected = [h.hash_blocks(x) for x in inputs]
    got: list[list[list[bytes]]] = [[] for _ in range(THREADS)]

    def body(t: int) -> None:
        for k in range(30):
            got[t].append(h.hash_blocks(inputs[(t + k) % len(inputs)]))

    run_threads(body)
    for t in range(THREADS):
        for k, hs in enumerate(got[t]):
            assert hs == expected[(t + k) % len(inputs)]


def test_block_trie_mixed_threads_release_everything() -> None:
    trie = BlockTrie(120, 8)

    def body(t: int) -> None:
        rng = random.Random(t)
        for r in range(120):
            rid = t * 10_000 + r
            prompt = SYSTEMS[rng.randrange(3)][:60] + [rng.randrange(5) for _ in range(9)]
            try:
                trie.claim(rid, prompt, reserve_tokens=8)
            except OutOfBlocksError:
                continue
            trie.complete(rid)
            trie.store(rid, prompt)
            if rng.random() < 0.2:
                trie.advance_clock(1)
            trie.release(rid)

    run_threads(body)
    trie.check_invariants()
    assert trie.num_requests == 0 and trie.num_free_blocks == trie.num_blocks


# ---------------------------------------------------------------------------------------
# The GIL is released during long calls


def progress_during(call: Callable[[], object]) -> float:
    """Iterations per second a pure-Python counting thread makes while `call` runs."""
    count = 0
    stop = False
    started = threading.Event()

    def counter() -> None:
        nonlocal count
        started.set()
        while not stop:
            count += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    th = threading.Thread(target=counter, daemon=True)
    try:
        th.start()
        started.wait()
        before, t0 = count, time.perf_counter()
        call()
        after, t1 = count, time.perf_counter()
    finally:
        stop = True
        th.join(JOIN_TIMEOUT)
        sys.setswitchinterval(old)
    return (after - before) / max(t1 - t0, 1e-9)


def gil_holding_call() -> None:
    """A C-level loop that keeps the GIL for its whole duration (the baseline)."""
    sum(range(5_000_000))


def filled_cache() -> RadixCache:
    c = RadixCache()
    rng = np.random.default_rng(0)
    for key in rng.integers(0, 1 << 31, (40_000, 24)).astype(np.uint32):
        c.insert(key)  # 40k leaves: evicting them all is one long call (~50 ms)
    return c


def test_long_core_calls_let_other_python_threads_run() -> None:
    """Progress rates of a counting thread: during a GIL-holding call it only moves at
    the call's edges; during a call that released the GIL it runs alongside. Best of a
    few trials (the 2-core machine is shared), compared as a ratio with a wide margin."""
    h = BlockHasher(16, "sha256")
    big = np.arange(1_200_000, dtype=np.uint32)  # one hash_blocks call, GIL released

    held = max(progress_during(gil_holding_call) for _ in range(3))
    hashing = max(progress_during(lambda: h.hash_blocks(big)) for _ in range(4))
    evicting = 0.0
    for _ in range(3):
        c = filled_cache()
        evicting = max(evicting, progress_during(lambda c=c: c.evict(1 << 40)))
        assert c.total_size() == 0
    assert hashing > 3 * held, (hashing, held)
    assert evicting > 3 * held, (evicting, held)


# ---------------------------------------------------------------------------------------
# Errors raised from GIL-released calls do not deadlock (regression)


def hammer_error_paths() -> None:
    """Errors from calls that run with the GIL released (duplicate request ids with long
    prompts, stale handles, long keys with bad arguments) are raised while other threads
    hammer the same objects with GIL-holding calls. A binding that built the Python
    exception while still holding the core lock would wait for the GIL inside the lock
    while a GIL-holding thread waits for the lock: run_threads would time out. The
    default switch interval (5 ms) keeps each GIL holder running long enough to reach the
    lock while an erroring thread waits for the GIL. (Run in a child process by the test:
    a thread that deadlocks holding the GIL would hang the test process itself.)"""
    m = KVCacheManager(400, BLOCK, hash_algo="xxh3_64")
    c = RadixCache()
    foreign = RadixCache().insert([1, 2, 3]).node  # a handle from another tree: stale
    long_key = np.arange(20_000, dtype=np.uint32)
    long_prompt = long_key[:1500]  # hashed with the GIL released (any threshold <= 1500)
    m.add_request(1, long_prompt)

    def body(t: int) -> None:
        rng = random.Random(t)
        for k in range(300):
            if t % 2 == 0:  # error paths, long (GIL released) and short
                with pytest.raises(InvalidInputError):
                    m.add_request(1, long_prompt)  # duplicate id, long prompt
                with pytest.raises(InvalidInputError):
                    m.admit(1, long_prompt)
                with pytest.raises(UnknownRequestError):
                    m.free(10**12 + k)
                with pytest.raises(InvalidInputError):
                    c.insert(long_key, np.arange(5, dtype=np.int64))  # length mismatch
                with pytest.raises(StaleHandleError):
                    c.inc_lock_ref(foreign)
                with pytest.raises(StaleHandleError):
                    c.path_indices(foreign)  # runs with the GIL released
            else:  # normal paths, GIL held and released
                rid = 1000 * t + k
                if m.admit(rid, PROMPTS[rng.randrange(5)]) is not None:
                    m.free(rid)
                for _ in range(20):  # short calls that take the lock with the GIL held
                    _ = m.num_free_blocks, len(m), c.total_size(), c.evictable_size()
                c.insert(long_key[: rng.randrange(1, 20_000)])
                c.match_prefix(long_key)
                c.evict(rng.choice([1, 5000]))

    run_threads(body, switch_interval=0.005)
    m.check_invariants()
    c.check_invariants()
    assert len(m) == 1


def test_error_paths_under_contention_do_not_deadlock() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        f"import faulthandler; faulthandler.dump_traceback_later({JOIN_TIMEOUT!r}, exit=True); "
        "import test_threads; test_threads.hammer_error_paths()"
    )
    try:
        run = subprocess.run(
            [sys.executable, "-c", code, str(Path(__file__).parent)],
            capture_output=True,
            text=True,
            timeout=JOIN_TIMEOUT + 30,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError("deadlock: the child process did not finish") from e
    assert run.returncode == 0, run.stdout + run.stderr


def test_errors_still_map_to_their_classes_from_released_calls() -> None:
    m = KVCacheManager(50, BLOCK)
    m.add_request(7, LONG_PROMPT)
    with pytest.raises(InvalidInputError, match="already known"):
        m.add_request(7, LONG_PROMPT)
    c = RadixCache()
    r = c.insert(np.arange(20_000, dtype=np.uint32))
    c.evict(1 << 40)
    with pytest.raises(StaleHandleError):
        c.inc_lock_ref(r.node)
    with pytest.raises(PrefixCacheError):
        c.path_indices(r.node)
