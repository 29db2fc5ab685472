"""BlockTrie: lookup with and without partial matching at 10, 100 and 10k children of one
node, and a claim/store/release request cycle on a shared-prefix workload, for the Rust
core and the plain-Python reference side by side.

Children are distinct 64-token blocks over a 4-token alphabet, so thousands of them share
their first tokens: an index on the first token alone would not help; the core's ordered
index finds the longest common prefix in O(log n). The reference scans every child, as
TensorRT-LLM's C++ ``findMatchingBlock`` does (its Python v2 manager gives up at 32).

``per_call_us`` in extra_info is the time of one call (pass time / calls).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

from benches.workloads import record_per_call as record
from benches.workloads import shared_prefix_prompts
from prefixcache import BlockTrie
from prefixcache.reference.trie import BlockTrie as ReferenceTrie

TPB = 64
IMPLS = {"core": BlockTrie, "reference": ReferenceTrie}
ROUNDS = {"core": 10, "reference": 1}
FANOUT = [10, 100, 10_000]


@cache
def children(n: int) -> list[list[int]]:
    rng = np.random.default_rng(n)
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    while len(out) < n:
        c = rng.integers(0, 4, TPB).tolist()
        if tuple(c) not in seen:
            seen.add(tuple(c))
            out.append(c)
    return out


@cache
def built(impl: str, n: int, partial: bool) -> Any:
    """A trie whose root has `n` cached, unreferenced children."""
    t = IMPLS[impl](2 * n + 8, TPB, partial, True)
    if impl == "reference":
        # The reference allocates by scanning every block (O(n) per block), so building
        # 10k children through claims would take minutes: file them directly.
        for i, c in enumerate(children(n)):
            t._attach(i, None, ((None, None), (), tuple(c)))
    else:
        for i, c in enumerate(children(n)):
            t.claim(i, [*c, 0])
            t.complete(i)
            t.store(i, [*c, 0])
        for i in range(n):
            t.release(i)
    assert t.num_cached_blocks == n
    return t


def queries(n: int, count: int) -> list[np.ndarray]:
    """Prompts sharing 1..63 tokens with some child, then diverging: an exact miss."""
    rng = np.random.default_rng(n + 1)
    kids = children(n)
    out = []
    for _ in range(count):
        base = kids[int(rng.integers(n))]
        k = int(rng.integers(1, TPB))
        tail = [5] * (TPB - k)
        out.append(np.array([*base[:k], *tail, 0], dtype=np.uint32))
    return out


@pytest.mark.parametrize("partial", [True, False], ids=["partial", "exact-only"])
@pytest.mark.parametrize("n", FANOUT)
@pytest.mark.parametrize("impl", ["core", "reference"])
def test_lookup(benchmark: Any, impl: str, n: int, partial: bool) -> None:
    benchmark.group = f"trie lookup, {n} children, {'partial' if partial else 'exact only'}"
    t = built(impl, n, partial)
    calls = 2000 if impl == "core" else (20 if n >= 10_000 and partial else 200)
    qs = queries(n, calls)

    def run() -> int:
        return sum(t.lookup(q).num_matched_tokens for q in qs)

    matched = benchmark.pedantic(run, rounds=ROUNDS[impl])
    assert (matched > 0) == partial
    record(benchmark, calls)


PROMPTS = shared_prefix_prompts(n=400, system_len=2048, unique_len=256)


def request_cycle(t: Any) -> None:
    """claim + complete + store + release of every prompt, one after the other."""
    for i, p in enumerate(PROMPTS):
        t.claim(i, p)
        t.complete(i)
        t.store(i, p)
        t.release(i)


@pytest.mark.parametrize("impl", ["core", "reference"])
def test_request_cycle(benchmark: Any, impl: str) -> None:
    """claim + complete + store + release for 400 prompts of 2304 tokens (8 shared 2048-token
    system prompts): 36 blocks per request, 32 reused."""
    benchmark.group = "trie request cycle (400 x 2304 tokens, 64-token blocks)"
    benchmark.pedantic(
        request_cycle, setup=lambda: ((IMPLS[impl](4096, TPB),), {}), rounds=ROUNDS[impl]
    )
    record(benchmark, len(PROMPTS))


@pytest.mark.parametrize("host_blocks", [0, 4096])
def test_request_cycle_small_gpu(benchmark: Any, host_blocks: int) -> None:
    """The same cycle on 64 GPU blocks (one request's 36 and little more), without and with
    a host tier of 4096 blocks: with it, each request offloads the blocks it displaces and
    onboards its system prompt's 32 blocks from host memory (core only)."""
    benchmark.group = "trie request cycle, 64 GPU blocks, host tier (core)"

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (BlockTrie(64, TPB, host_blocks=host_blocks),), {}

    benchmark.pedantic(request_cycle, setup=setup, rounds=ROUNDS["core"])
    record(benchmark, len(PROMPTS))
