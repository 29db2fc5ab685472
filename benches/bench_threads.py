"""What releasing the GIL costs, and what the calls around the thresholds cost.

The bindings run a call with the GIL released only when it is long enough
(docs/ARCHITECTURE.md, "Concurrency"). These pairs isolate the price:

- `RadixCache.evict(k)` on an empty tree: identical core work (nothing to evict); from
  k = 1024 the call releases the GIL;
- `match_prefix` of a cached key just below / at the 65536-token threshold: the second
  also copies the key out of its numpy array;
- `hash_blocks` (sha256 and xxh3_64, block size 16) just below / at 1024 tokens;
- 8 threads matching short keys on one RadixCache against one thread doing the same
  number of calls (lock contention: waiting is done with the GIL released).

``pytest benches/bench_threads.py`` times them with pytest-benchmark;
``python benches/bench_threads.py`` prints the figures recorded in docs/BENCHMARKS.md
("Threads and the GIL").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from prefixcache import BlockHasher, RadixCache

RADIX_KEY_THRESHOLD = 65536
EVICT_THRESHOLD = 1024
HASH_THRESHOLD = 1024


def cached(length: int) -> tuple[RadixCache, np.ndarray]:
    c = RadixCache()
    key = np.arange(length, dtype=np.uint32)
    c.insert(key)
    return c, key


@pytest.mark.parametrize("k", [EVICT_THRESHOLD - 1, EVICT_THRESHOLD])
def test_evict_nothing(benchmark, k: int) -> None:  # type: ignore[no-untyped-def]
    c = RadixCache()
    benchmark(c.evict, k)


@pytest.mark.parametrize("n", [RADIX_KEY_THRESHOLD - 1, RADIX_KEY_THRESHOLD])
def test_match_around_threshold(benchmark, n: int) -> None:  # type: ignore[no-untyped-def]
    c, key = cached(n)
    assert benchmark(c.match_prefix, key).length == n


@pytest.mark.parametrize("n", [HASH_THRESHOLD - 16, HASH_THRESHOLD])
def test_hash_around_threshold(benchmark, n: int) -> None:  # type: ignore[no-untyped-def]
    h = BlockHasher(16, "sha256")
    benchmark(h.hash_blocks, np.arange(n, dtype=np.uint32))


def per_call_ns(f: Callable[[], object], n: int, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e9


def contended_matches(threads: int, calls: int) -> float:
    """Wall time per call of `calls` short matches spread over `threads` threads."""
    c, key = cached(64)
    barrier = threading.Barrier(threads + 1)

    def body() -> None:
        barrier.wait()
        for _ in range(calls // threads):
            c.match_prefix(key)

    ts = [threading.Thread(target=body) for _ in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return (time.perf_counter() - t0) / calls * 1e9


def main() -> None:
    empty = RadixCache()
    below = per_call_ns(lambda: empty.evict(EVICT_THRESHOLD - 1), 200_000)
    above = per_call_ns(lambda: empty.evict(EVICT_THRESHOLD), 200_000)
    print(
        f"evict(k) on an empty tree: GIL held {below:.0f} ns, released {above:.0f} ns "
        f"(release + retake: {above - below:.0f} ns)"
    )
    for n in (16, 256, 2304, RADIX_KEY_THRESHOLD - 1, RADIX_KEY_THRESHOLD, 262144):
        c, key = cached(n)
        ns = per_call_ns(lambda c=c, key=key: c.match_prefix(key), 5_000)
        print(f"match_prefix, {n:6d}-token cached key: {ns:8.0f} ns")
    for algo in ("sha256", "xxh3_64"):
        h = BlockHasher(16, algo)
        for n in (HASH_THRESHOLD - 16, HASH_THRESHOLD, 4096):
            x = np.arange(n, dtype=np.uint32)
            ns = per_call_ns(lambda h=h, x=x: h.hash_blocks(x), 2_000)
            print(f"hash_blocks {algo:8s} {n:5d} tokens: {ns:8.0f} ns")
    one = min(contended_matches(1, 200_000) for _ in range(3))
    eight = min(contended_matches(8, 200_000) for _ in range(3))
    print(
        f"64-token match_prefix, 200k calls: 1 thread {one:.0f} ns/call, "
        f"8 threads {eight:.0f} ns/call"
    )


if __name__ == "__main__":
    main()
