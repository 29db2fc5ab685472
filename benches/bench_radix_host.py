"""RadixCache with SGLang's HiCache host tier: the tier's hot operations on the
shared-prefix workload of bench_radix.py (2000 prompts of 2304 tokens), core only, each
beside the same operation without a tier.

- insert: write-through backs up every new node (a host copy per insert);
- evict-all: every leaf demoted to host-only (kept in the tree) instead of deleted;
- match + load_back: a match whose unique tail is host-only, then its load back;
- host eviction: host-only leaves deleted in LRU order;
- with ``host_events`` (the copies' values kept and reported, as a publisher of KV events
  uses them): insert with one nonzero label per 16 tokens and ``take_host_events`` after
  each call, host eviction and its report.

``per_call_us`` in extra_info is the time of one call (pass time / 2000).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benches.workloads import record_per_call as record
from benches.workloads import shared_prefix_prompts
from prefixcache import RadixCache

PROMPTS = shared_prefix_prompts()
TOKENS = sum(len(p) for p in PROMPTS)
ROUNDS = 10


def _labels(n: int, first: int) -> Any:
    """A publisher's values: an id at every 16th token, 0 elsewhere."""
    v = np.zeros(n, dtype=np.int64)
    v[15::16] = np.arange(first, first + n // 16)
    return v


LABELS = [_labels(len(p), 1 + i * 1000) for i, p in enumerate(PROMPTS)]


def make(tier: bool, events: bool = False) -> Any:
    if tier:
        return RadixCache(host_capacity=TOKENS, write_policy="write_through", host_events=events)
    return RadixCache()


def filled(tier: bool) -> Any:
    cache = make(tier)
    for p in PROMPTS:
        cache.insert(p)
    return cache


@pytest.mark.parametrize("tier", [False, True], ids=["no-tier", "host-tier"])
def test_insert(benchmark: Any, tier: bool) -> None:
    benchmark.group = "radix host tier: insert (2000 x 2304 tokens)"

    def run(cache: Any) -> None:
        for p in PROMPTS:
            cache.insert(p)

    benchmark.pedantic(run, setup=lambda: ((make(tier),), {}), rounds=ROUNDS)
    record(benchmark, len(PROMPTS))


@pytest.mark.parametrize("events", [False, True], ids=["host-tier", "host-events"])
def test_insert_labelled(benchmark: Any, events: bool) -> None:
    benchmark.group = "radix host tier: labelled insert + take_host_events (2000 x 2304)"

    def run(cache: Any) -> int:
        n = 0
        for p, v in zip(PROMPTS, LABELS, strict=True):
            cache.insert(p, v)
            n += len(cache.take_host_events(nonzero=True)[0])
        return n

    reported = benchmark.pedantic(run, setup=lambda: ((make(True, events),), {}), rounds=ROUNDS)
    assert (reported > 0) == events
    record(benchmark, len(PROMPTS))


@pytest.mark.parametrize("tier", [False, True], ids=["no-tier", "host-tier"])
def test_evict_all(benchmark: Any, tier: bool) -> None:
    benchmark.group = "radix host tier: evict everything (2000 leaves)"

    def run(cache: Any) -> int:
        return len(cache.evict(TOKENS))

    freed = benchmark.pedantic(run, setup=lambda: ((filled(tier),), {}), rounds=ROUNDS)
    assert freed > 0
    record(benchmark, len(PROMPTS))


def test_match_and_load_back(benchmark: Any) -> None:
    benchmark.group = "radix host tier: match + load_back (2000 x 256 host tokens)"

    def setup() -> tuple[tuple[Any], dict[str, Any]]:
        cache = filled(True)
        cache.evict(len(PROMPTS) * 256)  # the unique tails: host-only now
        return (cache,), {}

    def run(cache: Any) -> int:
        loaded = 0
        for p in PROMPTS:
            m = cache.match_prefix(p)
            loaded += cache.load_back(m.last_host_node)
        return loaded

    loaded = benchmark.pedantic(run, setup=setup, rounds=ROUNDS)
    assert loaded >= len(PROMPTS) * 256  # whole leaves: a few more than the tails
    record(benchmark, len(PROMPTS))


@pytest.mark.parametrize("events", [False, True], ids=["host-tier", "host-events"])
def test_evict_host(benchmark: Any, events: bool) -> None:
    benchmark.group = "radix host tier: host eviction (2000 host-only leaves)"

    def setup() -> tuple[tuple[Any], dict[str, Any]]:
        cache = make(True, events)
        for p, v in zip(PROMPTS, LABELS, strict=True):
            cache.insert(p, v)
        cache.evict(len(PROMPTS) * 256)
        cache.take_host_events(nonzero=True)
        return (cache,), {}

    def run(cache: Any) -> int:
        freed = int(cache.evict_host(len(PROMPTS) * 256))
        cache.take_host_events(nonzero=True)
        return freed

    freed = benchmark.pedantic(run, setup=setup, rounds=ROUNDS)
    assert freed >= len(PROMPTS) * 256
    record(benchmark, len(PROMPTS))
