"""RadixCache: insert, match_prefix and evict-all on the issue's workload - 2000 prompts
of 2304 tokens (8 shared 2048-token system prompts + 256 unique tokens) - for the Rust
core and the plain-Python reference side by side.

Each benchmark times a whole pass over the 2000 prompts; ``per_call_us`` in extra_info
is the time of one call (pass time / 2000). Inputs are numpy arrays built beforehand.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benches.workloads import record_per_call as record
from benches.workloads import shared_prefix_prompts
from prefixcache import RadixCache
from prefixcache.reference.radix import RadixCache as ReferenceRadixCache

PROMPTS = shared_prefix_prompts()
IMPLS = {"core": RadixCache, "reference": ReferenceRadixCache}
ROUNDS = {"core": 10, "reference": 1}


def filled(impl: str) -> Any:
    cache = IMPLS[impl]()
    for p in PROMPTS:
        cache.insert(p)
    return cache


@pytest.mark.parametrize("impl", ["core", "reference"])
def test_insert(benchmark: Any, impl: str) -> None:
    benchmark.group = "radix insert (2000 x 2304 tokens)"

    def run(cache: Any) -> None:
        for p in PROMPTS:
            cache.insert(p)

    benchmark.pedantic(run, setup=lambda: ((IMPLS[impl](),), {}), rounds=ROUNDS[impl])
    record(benchmark, len(PROMPTS))


@pytest.mark.parametrize("impl", ["core", "reference"])
def test_match_prefix(benchmark: Any, impl: str) -> None:
    benchmark.group = "radix match_prefix (2000 x 2304 tokens)"
    cache = filled(impl)

    def run() -> int:
        return sum(cache.match_prefix(p).length for p in PROMPTS)

    total = benchmark.pedantic(run, rounds=ROUNDS[impl])
    assert total == len(PROMPTS) * 2304
    record(benchmark, len(PROMPTS))


@pytest.mark.parametrize("impl", ["core", "reference"])
def test_match_prefix_with_indices(benchmark: Any, impl: str) -> None:
    benchmark.group = "radix match_prefix + indices (2000 x 2304 tokens)"
    cache = filled(impl)

    def run() -> int:
        return sum(int(cache.match_prefix(p).indices[-1]) for p in PROMPTS)

    benchmark.pedantic(run, rounds=ROUNDS[impl])
    record(benchmark, len(PROMPTS))


@pytest.mark.parametrize("method", ["evict", "evict_count"])
@pytest.mark.parametrize("impl", ["core", "reference"])
def test_evict_all(benchmark: Any, impl: str, method: str) -> None:
    """``evict`` returns the freed indices, ``evict_count`` only their number."""
    benchmark.group = "radix evict-all (2000 leaves, 528k tokens)"
    freed: list[int] = []

    def run(cache: Any) -> None:
        if method == "evict":
            freed.append(len(cache.evict(10**12)))
        else:
            freed.append(cache.evict_count(10**12))

    benchmark.pedantic(run, setup=lambda: ((filled(impl),), {}), rounds=ROUNDS[impl])
    assert freed[-1] == 8 * 2048 + 2000 * 256
    record(benchmark, 1)


@pytest.mark.parametrize("leaves", [1_000, 50_000])
def test_evict_one_leaf_scales_with_log_leaves(benchmark: Any, leaves: int) -> None:
    """evict(16) on a tree of `leaves` 16-token leaves under a shared 64-token prefix:
    O(log L) per call with the incremental candidate set (SGLang rebuilds a heap of all
    L leaves per call: users report 70 ms at 41k leaves)."""
    benchmark.group = "radix evict one leaf"
    cache = RadixCache()
    prefix = np.arange(64, dtype=np.uint32)
    tails = np.arange(leaves * 16, dtype=np.uint32).reshape(leaves, 16) + np.uint32(10_000)
    for t in tails:
        cache.insert(np.concatenate([prefix, t]))
    calls = min(leaves - 1, 2_000)

    def run() -> None:
        for _ in range(calls):
            cache.evict(16)

    benchmark.pedantic(run, rounds=1)
    assert cache.num_nodes == leaves - calls + 1
    record(benchmark, calls)
