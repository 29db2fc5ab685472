"""Block pool / KV-cache manager benchmarks: Rust core vs the plain-Python reference.

- get_new_blocks / free_blocks cycles on a pool;
- the longest-hit lookup of a 2048-block prompt (block size 16);
- a request stream: 2000 prompts of 2304 tokens (8 shared 2048-token system prompts + 256
  unique tokens each, 144 blocks of 16), per request (a) hashing (sha256, in
  add_request) and (b) lookup + allocate + free, called from Python.

``pytest benches/bench_blocks.py`` times them with pytest-benchmark;
``python benches/bench_blocks.py`` prints per-request figures and core/reference ratios
measured side by side in one run (the figures in docs/BENCHMARKS.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from prefixcache import BlockPool, KVCacheManager
from prefixcache.reference import blocks as ref

BLOCK = 16
N_SYSTEM = 8
SYSTEM_TOKENS = 2048
UNIQUE_TOKENS = 256
N_REQUESTS = 2000
N_REF_REQUESTS = 200  # the reference is slow: it runs a prefix of the stream
POOL_BLOCKS = 1536  # 1024 system-prompt blocks + 32 requests: unique blocks get evicted early


def workload(n: int = N_REQUESTS) -> list[np.ndarray]:
    """Request i: system prompt i % 8 (2048 tokens) + 256 unique tokens."""
    systems = [np.arange(SYSTEM_TOKENS, dtype=np.uint32) + 100_000 * k for k in range(N_SYSTEM)]
    out = []
    for i in range(n):
        unique = np.arange(UNIQUE_TOKENS, dtype=np.uint32) + 10_000_000 + UNIQUE_TOKENS * i
        out.append(np.concatenate([systems[i % N_SYSTEM], unique]))
    return out


Impl = Any  # prefixcache.KVCacheManager or the reference one


def make_manager(kind: str) -> Impl:
    impl = KVCacheManager if kind == "core" else ref.KVCacheManager
    return impl(POOL_BLOCKS, block_size=BLOCK, hash_algo="sha256")


def prompts_for(kind: str, prompts: list[np.ndarray]) -> list[Any]:
    return prompts if kind == "core" else [p.tolist() for p in prompts]


def stream_hash(m: Impl, prompts: list[Any]) -> None:
    for i, p in enumerate(prompts):
        m.add_request(i, p)


def stream_lookup_allocate_free(m: Impl, prompts: list[Any]) -> None:
    for i, p in enumerate(prompts):
        blocks, hit = m.get_computed_blocks(i)
        m.allocate_slots(i, len(p) - hit, hit, blocks)
        m.free(i)


def admit_finish(m: Impl, prompts: list[Any]) -> None:
    """The simulator's path: hashing, lookup, allocation and free in two calls."""
    for i, p in enumerate(prompts):
        m.admit(i, p)
        m.finish(i)


def get_free_cycles(pool: Any, cycles: int = 1000, n: int = 16) -> None:
    for _ in range(cycles):
        pool.free_blocks(pool.get_new_blocks(n))


def long_prompt_manager(kind: str) -> tuple[Impl, int]:
    """A manager whose cache holds a 2048-block prompt; request 1 repeats it."""
    n_blocks = 2048
    tokens = np.arange(n_blocks * BLOCK + 1, dtype=np.uint32)
    toks: Any = tokens if kind == "core" else tokens.tolist()
    m = (KVCacheManager if kind == "core" else ref.KVCacheManager)(n_blocks + 64, block_size=BLOCK)
    m.admit(0, toks)
    m.free(0)
    m.add_request(1, toks)
    return m, n_blocks


# ------------------------------------------------------------------ pytest-benchmark
KINDS = ["core", "ref"]


@pytest.mark.parametrize("kind", KINDS)
def test_get_free_cycles(benchmark: Any, kind: str) -> None:
    pool = (BlockPool if kind == "core" else ref.BlockPool)(POOL_BLOCKS)
    benchmark(get_free_cycles, pool, 100)
    assert pool.num_free_blocks == POOL_BLOCKS - 1


@pytest.mark.parametrize("kind", KINDS)
def test_longest_hit_2048_blocks(benchmark: Any, kind: str) -> None:
    m, n_blocks = long_prompt_manager(kind)
    blocks, hit = benchmark(m.get_computed_blocks, 1)
    assert hit == n_blocks * BLOCK and len(blocks) == n_blocks


@pytest.mark.parametrize("kind", KINDS)
def test_stream_hash(benchmark: Any, kind: str) -> None:
    prompts = prompts_for(kind, workload(N_REQUESTS if kind == "core" else N_REF_REQUESTS))
    benchmark.pedantic(
        stream_hash, setup=lambda: ((make_manager(kind), prompts), {}), rounds=3, iterations=1
    )


@pytest.mark.parametrize("kind", KINDS)
def test_stream_admit_finish(benchmark: Any, kind: str) -> None:
    prompts = prompts_for(kind, workload(N_REQUESTS if kind == "core" else N_REF_REQUESTS))
    benchmark.pedantic(
        admit_finish, setup=lambda: ((make_manager(kind), prompts), {}), rounds=3, iterations=1
    )


@pytest.mark.parametrize("kind", KINDS)
def test_stream_lookup_allocate_free(benchmark: Any, kind: str) -> None:
    prompts = prompts_for(kind, workload(N_REQUESTS if kind == "core" else N_REF_REQUESTS))

    def setup() -> tuple[tuple[Impl, list[Any]], dict[str, Any]]:
        m = make_manager(kind)
        stream_hash(m, prompts)
        return (m, prompts), {}

    benchmark.pedantic(stream_lookup_allocate_free, setup=setup, rounds=3, iterations=1)


DECODE_REQUESTS = 64
DECODE_STEPS = 32


def decode_manager() -> tuple[Impl, list[np.ndarray]]:
    """64 running requests (a 100-token prompt each) in a pool they fill exactly within
    the 32 decode steps, after 64 finished requests left their prompts cached (so later
    steps evict those); and each request's 32 blocks of output."""
    m = KVCacheManager(DECODE_REQUESTS * 39 + 1, block_size=BLOCK, hash_algo="xxh3_64")
    for i in range(DECODE_REQUESTS):
        m.admit(DECODE_REQUESTS + i, np.arange(100, dtype=np.uint32) + 1000 * i + 500_000)
        m.free(DECODE_REQUESTS + i)
    for i in range(DECODE_REQUESTS):
        m.admit(i, np.arange(100, dtype=np.uint32) + 1000 * i)
    outs = [
        np.arange(BLOCK * DECODE_STEPS, dtype=np.uint32) + (1 << 31) + i * BLOCK * DECODE_STEPS
        for i in range(DECODE_REQUESTS)
    ]
    return m, outs


def decode_pairs(m: Impl, outs: list[np.ndarray]) -> None:
    """Each decode step hands every request a block of output: one append_tokens +
    allocate_slots pair per request (what the simulator did before ``extend``)."""
    for s in range(DECODE_STEPS):
        for i, o in enumerate(outs):
            m.append_tokens(i, o[s * BLOCK : (s + 1) * BLOCK])
            m.allocate_slots(i, BLOCK)


def decode_extend(m: Impl, outs: list[np.ndarray]) -> None:
    """The same steps, one ``KVCacheManager.extend`` call each."""
    ids = np.arange(DECODE_REQUESTS, dtype=np.int64)
    counts = np.full(DECODE_REQUESTS, BLOCK, dtype=np.int64)
    for s in range(DECODE_STEPS):
        toks = np.concatenate([o[s * BLOCK : (s + 1) * BLOCK] for o in outs])
        got, _ = m.extend(ids, toks, counts)
        assert len(got) == DECODE_REQUESTS
    assert m.num_evicted_blocks > 0


def decode_queued(m: Impl, outs: list[np.ndarray]) -> None:
    """The same steps from the requests' queued outputs: ``queue_tokens`` once per
    request, then one ``KVCacheManager.decode_steps`` call per step (no tokens passed)."""
    for i, o in enumerate(outs):
        m.queue_tokens(i, o)
    ids = np.arange(DECODE_REQUESTS, dtype=np.int64)
    for _ in range(DECODE_STEPS):
        got, _ = m.decode_steps(ids, BLOCK)
        assert len(got) == DECODE_REQUESTS
    assert m.num_evicted_blocks > 0


DECODE_RUNS = {"pairs": decode_pairs, "extend": decode_extend, "queued": decode_queued}


@pytest.mark.parametrize("how", list(DECODE_RUNS))
def test_decode_steps(benchmark: Any, how: str) -> None:
    run = DECODE_RUNS[how]
    benchmark.pedantic(run, setup=lambda: (decode_manager(), {}), rounds=5, iterations=1)


# ------------------------------------------------------------------ side-by-side report
def best_of(
    fn: Callable[[], Any], setup: Callable[[], Any] | None = None, repeat: int = 5
) -> float:
    best = float("inf")
    for _ in range(repeat):
        arg = setup() if setup else None
        t0 = time.perf_counter()
        fn() if arg is None else fn(*arg)
        best = min(best, time.perf_counter() - t0)
    return best


def interleaved(m: Impl, prompts: list[Any]) -> tuple[float, float]:
    """Per request, as a scheduler runs it: add (hash), then look up + allocate + free;
    each phase timed with perf_counter_ns (seconds spent in hashing, in the rest)."""
    clock = time.perf_counter_ns
    t_hash = t_rest = 0
    for i, p in enumerate(prompts):
        t0 = clock()
        m.add_request(i, p)
        t1 = clock()
        blocks, hit = m.get_computed_blocks(i)
        m.allocate_slots(i, len(p) - hit, hit, blocks)
        m.free(i)
        t2 = clock()
        t_hash += t1 - t0
        t_rest += t2 - t1
    return t_hash / 1e9, t_rest / 1e9


def stream_times(kind: str, n: int, rounds: int = 9) -> tuple[float, float, float]:
    """us/request of (hashing, lookup + allocate + free, admit + finish) on n requests,
    best of `rounds` fresh managers each."""
    prompts = prompts_for(kind, workload(n))
    best_hash = best_rest = float("inf")
    for _ in range(rounds):
        h, r = interleaved(make_manager(kind), prompts)
        best_hash, best_rest = min(best_hash, h), min(best_rest, r)
    t_af = best_of(admit_finish, lambda: (make_manager(kind), prompts), rounds)
    return best_hash / n * 1e6, best_rest / n * 1e6, t_af / n * 1e6


def report() -> None:
    """Core and reference on the same operations; the stream ratio compares both on the
    first 200 requests, and the core's figure is also given over all 2000. Each request
    runs add -> lookup -> allocate -> free before the next one (caches as in a scheduler)."""
    rows: list[tuple[str, float | None, float, float, str]] = []

    pools = {k: (BlockPool if k == "core" else ref.BlockPool)(POOL_BLOCKS) for k in KINDS}
    t = {k: best_of(lambda k=k: get_free_cycles(pools[k], 1000)) / 1000 * 1e6 for k in KINDS}
    rows.append(("get_new_blocks(16) + free_blocks cycle", None, t["core"], t["ref"], "us/cycle"))

    t = {}
    for k in KINDS:
        m, _ = long_prompt_manager(k)
        t[k] = best_of(lambda m=m: m.get_computed_blocks(1)) * 1e6
    rows.append(("longest hit, 2048-block prompt", None, t["core"], t["ref"], "us/lookup"))

    full = stream_times("core", N_REQUESTS)
    core = stream_times("core", N_REF_REQUESTS)
    refs = stream_times("ref", N_REF_REQUESTS)
    names = (
        "stream: hashing (sha256, add_request)",
        "stream: lookup + allocate + free",
        "stream: admit + finish (one call each)",
    )
    for i, name in enumerate(names):
        rows.append((name, full[i], core[i], refs[i], "us/request"))

    print(f"{'benchmark':<40} {'core 2000':>9} {'core 200':>9} {'ref 200':>9} {'ratio':>7}  unit")
    for name, f, c, r, unit in rows:
        fs = "" if f is None else f"{f:.2f}"
        print(f"{name:<40} {fs:>9} {c:>9.2f} {r:>9.2f} {r / c:>6.1f}x  {unit}")


if __name__ == "__main__":
    report()
