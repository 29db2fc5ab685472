"""Memory follows what is cached: namespaces, salts and multimodal hashes are dropped with
their last holder (and on reset), so a stream of requests with distinct salts leaves no
memory behind. Measured as resident memory in a fresh subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc, os, sys
    import prefixcache as pc

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    kind, n = sys.argv[1], int(sys.argv[2])
    tokens = list(range(1, 10))
    if kind == "radix":
        c = pc.RadixCache()
        def step(i):
            c.insert(tokens, cache_salt=f"salt-{i}", extra_key=f"key-{i}")
            c.match_prefix(tokens, cache_salt=f"other-{i}")
            if i % 64 == 63:
                c.evict(10**9)
            if i % 5000 == 4999:
                c.reset()
    else:
        t = pc.BlockTrie(64, 4)
        def step(i):
            t.claim(i, tokens, cache_salt=f"salt-{i}", mm_items=[(f"img-{i}", 1, 3)])
            t.store(i, tokens)
            t.release(i)
            t.take_events()
    for i in range(n // 10):  # warm-up: allocator pools, tables at their working size
        step(i)
    gc.collect()
    before = rss()
    for i in range(n // 10, n):
        step(i)
    gc.collect()
    print(rss() - before)
    """
)


def grown(kind: str, n: int) -> int:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind, str(n)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return int(r.stdout.strip().splitlines()[-1])


def test_radix_namespaces_do_not_accumulate() -> None:
    # Keeping them cost ~26 MB here (~140 bytes per namespace); now flat.
    assert grown("radix", 200_000) < 4 << 20


def test_trie_salts_and_multimodal_hashes_do_not_accumulate() -> None:
    # Keeping them cost ~21 MB here (~120 bytes per request); now flat.
    assert grown("trie", 200_000) < 4 << 20


TRIE_CHAINS = textwrap.dedent(
    """
    import gc, os
    import numpy as np
    import prefixcache as pc

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    gc.collect()
    before = rss()
    # A budget far beyond what gets cached: a block takes memory when first handed out.
    t = pc.BlockTrie(10**8, 64, enable_events=False)
    made = rss() - before
    # 1,000 distinct prompts of 50 blocks each: chains below the root, one child a block.
    for i in range(1000):
        prompt = np.arange(i * 3201, (i + 1) * 3201, dtype=np.uint32)
        t.claim(i, prompt)
        t.store(i, prompt)
        t.release(i)
    gc.collect()
    print(made, rss() - before, t.num_cached_tokens)
    """
)


def test_trie_memory_follows_its_cached_tokens() -> None:
    r = subprocess.run(
        [sys.executable, "-c", TRIE_CHAINS],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    made, grew, cached = map(int, r.stdout.split())
    assert cached == 1000 * 3200
    # Blocks made up front cost ~230 bytes each (23 GB here); now nothing.
    assert made < 8 << 20, made
    # A chain's block held a hash map, a B-tree leaf for eleven entries and a copy of its
    # tokens for its one child: ~22 bytes per cached token here; now ~7 (tokens are 4).
    assert grew / cached < 12, grew / cached
