"""CPU offloading tier benchmarks (prefixcache.CpuOffloadManager, vLLM's
CPUOffloadingManager): Rust core vs the plain-Python reference.

One request stream as vLLM's OffloadingConnector drives the tier: 400 requests of 128
blocks (a shared 64-block prefix out of 8, then 64 unique blocks) over a tier of 4096
chunks, so stores evict from the start; per request: set key positions, prefix lookup,
load the hit (prepare + complete), offer the prompt for storing (prepare + complete),
finish. LRU and ARC. The same stream through the range calls the simulator uses
(``set_request_keys`` once, then ``*_range`` calls naming block slices: no Python object
per key after the first call) times the core alone (the reference has no range calls),
also with LRU behind a store threshold of 2 (``lru:2``: the offer tracker).

``pytest benches/bench_offload.py`` times them with pytest-benchmark;
``python benches/bench_offload.py`` prints per-request figures and the core/reference
ratio measured side by side in one run (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest

from prefixcache import CpuOffloadManager
from prefixcache.reference import offload as ref

N_REQUESTS = 400
N_REF_REQUESTS = 100
BLOCKS = 128
SHARED = 64
CHUNKS = 4096


def workload(n: int = N_REQUESTS) -> list[list[bytes]]:
    def h(*parts: int) -> bytes:
        return hashlib.sha256(repr(parts).encode()).digest()

    return [
        [h(i % 8, b) for b in range(SHARED)] + [h(8, i, b) for b in range(BLOCKS - SHARED)]
        for i in range(n)
    ]


def stream(m: Any, reqs: list[list[bytes]]) -> None:
    ends = [16 * (j + 1) for j in range(BLOCKS)]
    for i, keys in enumerate(reqs):
        m.on_new_request(i)
        m.set_offload_key_positions(i, keys, ends)
        n = m.lookup_prefix(keys) or 0
        if n:
            m.prepare_load(i, keys[:n])
            m.complete_load(i, keys[:n])
        out = m.prepare_store(i, keys[n:])
        if out is not None and out.keys_to_store:
            m.complete_store(i, out.keys_to_store)
        m.on_request_finished(i)


def stream_range(m: Any, reqs: list[list[bytes]]) -> None:
    for i, keys in enumerate(reqs):
        m.on_new_request(i)
        m.set_request_keys(i, keys, 16)
        n = m.lookup_prefix_range(i, 0, BLOCKS) or 0
        if n:
            m.prepare_load_range(i, 0, n)
            m.complete_load_range(i, 0, n)
        m.prepare_store_range(i, n, BLOCKS, True)
        m.on_request_finished(i)


def make(kind: str, policy: str) -> Any:
    """A tier of ``CHUNKS`` chunks; ``policy`` is "lru", "arc" or "lru:K" (store
    threshold K)."""
    cls = CpuOffloadManager if kind == "core" else ref.CpuOffloadManager
    name, _, k = policy.partition(":")
    return cls(CHUNKS, cache_policy=name, store_threshold=int(k or 1))


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("kind", ["core", "reference"])
def test_offload_stream(benchmark: Any, kind: str, policy: str) -> None:
    reqs = workload(N_REQUESTS if kind == "core" else N_REF_REQUESTS)
    benchmark.pedantic(
        lambda m: stream(m, reqs), setup=lambda: ((make(kind, policy),), {}), rounds=3
    )


@pytest.mark.parametrize("policy", ["lru", "arc", "lru:2"])
def test_offload_stream_range(benchmark: Any, policy: str) -> None:
    reqs = workload(N_REQUESTS)
    benchmark.pedantic(
        lambda m: stream_range(m, reqs), setup=lambda: ((make("core", policy),), {}), rounds=3
    )


def main() -> None:
    for policy in ("lru", "arc"):
        per = {}
        for kind, n in (("core", N_REQUESTS), ("reference", N_REF_REQUESTS)):
            reqs = workload(n)
            best = min(_timed(make(kind, policy), reqs) for _ in range(3))
            per[kind] = best / n
        print(
            f"{policy}: core {per['core'] * 1e6:.0f} us/request, reference "
            f"{per['reference'] * 1e6:.0f} us/request ({per['reference'] / per['core']:.1f}x)"
        )
    for policy in ("lru", "arc", "lru:2"):
        reqs = workload(N_REQUESTS)
        best = min(_timed(make("core", policy), reqs, stream_range) for _ in range(3))
        print(f"{policy}: core, range calls {best / N_REQUESTS * 1e6:.0f} us/request")


def _timed(m: Any, reqs: list[list[bytes]], run: Any = stream) -> float:
    t = time.perf_counter()
    run(m, reqs)
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
