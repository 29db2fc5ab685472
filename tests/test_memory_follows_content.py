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
