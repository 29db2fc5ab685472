"""Scale and memory: a RadixCache holding 10 million cached tokens and a block pool /
KV-cache manager with 1,000,000 blocks.

Radix workload (realistic shape, generated up front so that only the tree is measured):
32 shared system prompts of 1-4k tokens; sessions of 1-8 turns on one of them, each turn
extending the previous prompt by 100-600 user tokens and leaving 50-400 output tokens;
15% of the sessions branch from a turn boundary of an earlier session. Every turn is
`match_prefix(prompt)` then `insert(prompt + output)`, as a scheduler does on finish.

Figures reported:
- bytes per cached token: RSS delta (``/proc/self/statm``) of filling the tree, divided by
  ``total_size()``;
- match_prefix / insert latency on the full tree vs a small tree of the same shape
  (``SMALL_TOKENS``), on 2000 probes each: matches of existing conversation prompts (a
  first pass, a second pass, and per token with each prompt repeated so that its path is
  in cache: the algorithm without the memory hierarchy), inserts of
  new turns branching off existing ones;
- blocks: RSS delta per block of a pool whose blocks are all cached (32-byte hashes, or
  8-byte ones with ``--hash8``) and free, get/free and lookup latency at 1M blocks vs 1536.

Sizes: ``PREFIXCACHE_SCALE=full`` (or running the benchmarks with timing on) fills 10M
tokens and 1M blocks; otherwise (``pytest benches --benchmark-disable``, CI) 200k tokens
and 20k blocks, so that every code path still runs in seconds. The figures in
docs/BENCHMARKS.md come from ``python benches/bench_scale.py`` (always full size, one
process per structure so that the RSS deltas do not mix).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from prefixcache import BlockPool, KVCacheManager, RadixCache

FULL_TOKENS = 10_000_000
SMALL_TOKENS = 200_000
FULL_BLOCKS = 1_000_000
SMALL_BLOCKS = 20_000
PROBES = 2000
VOCAB = 32_000
BLOCK = 16

U32 = npt.NDArray[np.uint32]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Conversations:
    """Session token arrays and the (session, prompt end, turn end) of every turn."""

    sessions: list[U32] = field(default_factory=list)
    turns: list[tuple[int, int, int]] = field(default_factory=list)
    boundaries: list[list[int]] = field(default_factory=list)
    unique_tokens: int = 0


def conversations(target_tokens: int, seed: int = 0) -> Conversations:
    """Sessions until about `target_tokens` distinct tokens would be cached."""
    rng = np.random.default_rng(seed)
    systems = [
        rng.integers(0, VOCAB, int(rng.integers(1024, 4097)), dtype=np.uint32) for _ in range(32)
    ]
    conv = Conversations(unique_tokens=sum(len(s) for s in systems))
    while conv.unique_tokens < target_tokens:
        if conv.sessions and rng.random() < 0.15:
            parent = int(rng.integers(len(conv.sessions)))
            cut = conv.boundaries[parent][int(rng.integers(len(conv.boundaries[parent])))]
            head = conv.sessions[parent][:cut]
        else:
            head = systems[int(rng.integers(len(systems)))]
        parts = [head]
        ends: list[int] = []
        turn_ends: list[tuple[int, int]] = []
        length = len(head)
        for _ in range(int(rng.integers(1, 9))):
            user = int(rng.integers(100, 601))
            out = int(rng.integers(50, 401))
            parts.append(rng.integers(0, VOCAB, user + out, dtype=np.uint32))
            turn_ends.append((length + user, length + user + out))
            length += user + out
            ends.append(length)
            conv.unique_tokens += user + out
        sid = len(conv.sessions)
        conv.sessions.append(np.concatenate(parts))
        conv.boundaries.append(ends)
        conv.turns.extend((sid, p, e) for p, e in turn_ends)
    return conv


def fill(cache: RadixCache, conv: Conversations) -> None:
    for sid, prompt_end, turn_end in conv.turns:
        s = conv.sessions[sid]
        cache.match_prefix(s[:prompt_end])
        cache.insert(s[:turn_end])


def probes(conv: Conversations, seed: int = 1) -> tuple[list[U32], list[U32]]:
    """Existing turn prompts to match; new turns (existing prompt + 256 new tokens) to insert."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(conv.turns), size=PROBES)
    matches, inserts = [], []
    for k, i in enumerate(picks):
        sid, prompt_end, turn_end = conv.turns[int(i)]
        matches.append(conv.sessions[sid][:prompt_end])
        fresh = np.arange(256, dtype=np.uint32) + np.uint32(VOCAB + 256 * k)
        inserts.append(np.concatenate([conv.sessions[sid][:turn_end], fresh]))
    return matches, inserts


def per_call_us(fn: Any, items: list[Any]) -> float:
    t0 = time.perf_counter()
    for x in items:
        fn(x)
    return (time.perf_counter() - t0) / len(items) * 1e6


def hot_ns_per_token(cache: RadixCache, items: list[U32]) -> float:
    """Each of 50 prompts matched 100 times in a row (its path in cache): the cost of the
    algorithm without the memory hierarchy, per matched token."""
    total = 0.0
    for p in items[:50]:
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(100):
                cache.match_prefix(p)
            best = min(best, (time.perf_counter() - t0) / 100)
        total += best
    return total / sum(len(p) for p in items[:50]) * 1e9


def best_of(rounds: int, fn: Any) -> float:
    return min(fn() for _ in range(rounds))


def radix_figures(target_tokens: int) -> dict[str, float]:
    conv = conversations(target_tokens)
    matches, inserts = probes(conv)
    gc.collect()
    before = rss_bytes()
    cache = RadixCache()
    t0 = time.perf_counter()
    fill(cache, conv)
    fill_s = time.perf_counter() - t0
    gc.collect()
    delta = rss_bytes() - before
    size = cache.total_size()
    match_first_us = per_call_us(cache.match_prefix, matches)  # tree and probes cold
    match_us = per_call_us(cache.match_prefix, matches)
    match_hot_ns = hot_ns_per_token(cache, matches)
    insert_us = per_call_us(cache.insert, inserts)
    return {
        "cached_tokens": size,
        "nodes": cache.num_nodes,
        "sessions": len(conv.sessions),
        "turns": len(conv.turns),
        "fill_s": fill_s,
        "rss_delta_bytes": delta,
        "bytes_per_token": delta / size,
        "match_first_pass_us": match_first_us,
        "match_us": match_us,
        "match_hot_ns_per_token": match_hot_ns,
        "match_ns_per_token": match_us * 1e3 / float(np.mean([len(m) for m in matches])),
        "insert_us": insert_us,
        "probe_tokens": float(np.mean([len(m) for m in matches])),
    }


def block_hash(i: int, nbytes: int = 32) -> bytes:
    return i.to_bytes(nbytes, "big")


def pool_figures(num_blocks: int, hash_bytes: int = 32) -> dict[str, float]:
    """A pool with every block cached and free (the steady state of a warm server), with
    ``hash_bytes``-byte hashes."""
    gc.collect()
    before = rss_bytes()
    pool = BlockPool(num_blocks + 1)
    chunk = 4096
    done = 0
    while done < num_blocks:
        n = min(chunk, num_blocks - done)
        ids = pool.get_new_blocks(n)
        hashes = [block_hash(done + j, hash_bytes) for j in range(n)]
        pool.cache_full_blocks(ids, hashes, 0, n, BLOCK)
        pool.free_blocks(ids)
        done += n
    gc.collect()
    delta = rss_bytes() - before
    rng = np.random.default_rng(2)
    keys = [block_hash(int(i), hash_bytes) for i in rng.integers(num_blocks, size=PROBES)]
    assert all(pool.get_cached_block(k) is not None for k in keys)
    lookup_us = best_of(3, lambda: per_call_us(pool.get_cached_block, keys))

    def get_free() -> float:
        t0 = time.perf_counter()
        for _ in range(PROBES):
            pool.free_blocks(pool.get_new_blocks(16))
        return (time.perf_counter() - t0) / PROBES * 1e6

    get_free_us = best_of(3, get_free)
    return {
        "blocks": num_blocks,
        "rss_delta_bytes": delta,
        "bytes_per_block": delta / num_blocks,
        "lookup_us": lookup_us,
        "get16_free_us": get_free_us,
    }


def manager_figures(num_blocks: int, hash_bytes: int = 32) -> dict[str, float]:
    """A manager filled by requests of 2304 tokens (8 shared 2048-token system prompts +
    256 unique) until every block has been cached once, then the per-request cost of
    admit + finish (hash, lookup, allocate, cache, free) on that pool. Block hashes:
    sha256 (32 bytes), or xxh3_64 when ``hash_bytes`` is 8."""
    systems = [np.arange(2048, dtype=np.uint32) + np.uint32(100_000 * k) for k in range(8)]

    def prompt(i: int) -> U32:
        unique = np.arange(256, dtype=np.uint32) + np.uint32(10_000_000 + 256 * i)
        return np.concatenate([systems[i % 8], unique])

    gc.collect()
    before = rss_bytes()
    algo = "xxh3_64" if hash_bytes == 8 else "sha256"
    mgr = KVCacheManager(num_blocks + 1, block_size=BLOCK, hash_algo=algo)
    i = filled = 0
    filler = np.arange(BLOCK * 4096, dtype=np.uint32)
    while filled < num_blocks:
        n = min(4096, num_blocks - filled)
        assert mgr.admit(i, filler[: n * BLOCK] + np.uint32(BLOCK * 4096 * (i + 1))) is not None
        mgr.finish(i)
        filled += n
        i += 1
    gc.collect()
    delta = rss_bytes() - before
    passes = iter(range(3))

    def stream() -> float:
        base = next(passes) * PROBES  # fresh unique tokens every pass
        t0 = time.perf_counter()
        for k in range(base, base + PROBES):
            rid = 10**9 + k
            mgr.admit(rid, prompt(k))
            mgr.finish(rid)
        return (time.perf_counter() - t0) / PROBES * 1e6

    request_us = best_of(3, stream)
    return {
        "blocks": num_blocks,
        "rss_delta_bytes": delta,
        "bytes_per_block": delta / num_blocks,
        "admit_finish_us": request_us,
    }


def branchy_figures(num_keys: int) -> dict[str, float]:
    """A branchy tree: random 12-token keys over a 3-token alphabet (~1.3 tokens a node);
    the RSS delta per node and per cached token.

    Each key's buffer is exported once before the baseline: numpy keeps a description of
    an array's buffer (~80 bytes) from its first export until the array dies, which would
    otherwise count as ~57 bytes a node in a tree the keys do not belong to."""
    rng = np.random.default_rng(0)
    keys = list(rng.integers(0, 3, (num_keys, 12)).astype(np.uint32))
    for k in keys:
        memoryview(k).release()
    cache = RadixCache()
    before = rss_bytes()
    for k in keys:
        cache.insert(k)
    delta = rss_bytes() - before
    nodes, tokens = cache.num_nodes, cache.total_size()
    return {
        "nodes": nodes,
        "tokens_per_node": tokens / nodes,
        "rss_delta_bytes": delta,
        "bytes_per_node": delta / nodes,
        "bytes_per_token": delta / tokens,
    }


def full_scale(benchmark: Any) -> bool:
    env = os.environ.get("PREFIXCACHE_SCALE", "")
    return env == "full" or (env != "small" and not benchmark.disabled)


def report(benchmark: Any, figures: dict[str, float]) -> None:
    benchmark.extra_info.update(figures)
    print(figures)


def test_radix_scale(benchmark: Any) -> None:
    benchmark.group = "scale: radix tree"
    size = FULL_TOKENS if full_scale(benchmark) else SMALL_TOKENS
    figures = benchmark.pedantic(radix_figures, args=(size,), rounds=1, iterations=1)
    assert figures["cached_tokens"] >= size // 2
    report(benchmark, figures)


def test_pool_scale(benchmark: Any) -> None:
    benchmark.group = "scale: block pool"
    n = FULL_BLOCKS if full_scale(benchmark) else SMALL_BLOCKS
    figures = benchmark.pedantic(pool_figures, args=(n,), rounds=1, iterations=1)
    report(benchmark, figures)


def test_manager_scale(benchmark: Any) -> None:
    benchmark.group = "scale: kv-cache manager"
    n = FULL_BLOCKS if full_scale(benchmark) else SMALL_BLOCKS
    figures = benchmark.pedantic(manager_figures, args=(n,), rounds=1, iterations=1)
    report(benchmark, figures)


def main(argv: list[str]) -> None:
    """``python benches/bench_scale.py [radix|pool|manager|branchy] [--small] [--hash8]``:
    one structure per process (RSS deltas stay separate), full size vs small size of the
    same shape; ``--hash8``: the pool and manager with 8-byte block hashes (xxh3_64)
    instead of 32-byte ones (sha256)."""
    what = argv[0] if argv else "radix"
    hash_bytes = 8 if "--hash8" in argv else 32
    fn = {
        "radix": radix_figures,
        "pool": lambda n: pool_figures(n, hash_bytes),
        "manager": lambda n: manager_figures(n, hash_bytes),
        "branchy": branchy_figures,
    }[what]
    big = {"radix": FULL_TOKENS, "pool": FULL_BLOCKS, "manager": FULL_BLOCKS, "branchy": 200_000}[
        what
    ]
    small = {"radix": SMALL_TOKENS, "pool": 1536, "manager": 1536, "branchy": 5_000}[what]
    small_fig = fn(small)
    big_fig = fn(big) if "--small" not in argv else small_fig
    for k in big_fig:
        ratio = big_fig[k] / small_fig[k] if small_fig[k] else float("nan")
        print(
            f"{k:>20}: small {small_fig[k]:>14.3f}  full {big_fig[k]:>14.3f}"
            f"  full/small {ratio:.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
