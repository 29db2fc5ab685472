"""Sizes a user controls never abort the process: under a 3 GB address-space limit (or a
tighter one), huge pools are created cheaply (memory follows the blocks in use) or raise
MemoryError, and the object stays usable. Each case runs in a subprocess (the limit is
per process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("resource")

PRELUDE = textwrap.dedent(
    """
    import resource
    import prefixcache as pc
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    def oom(f):
        try:
            f()
        except MemoryError as e:
            assert "cannot allocate memory" in str(e), e
            return True
        return False
    """
)

CASES = {
    "BlockPool": """
        p = pc.BlockPool(4_294_967_292)
        assert p.num_free_blocks == 4_294_967_291 and p.num_touched_blocks == 1
        assert oom(lambda: p.get_new_blocks(2_000_000_000))
        assert p.num_free_blocks == 4_294_967_291
        assert p.get_new_blocks(3).tolist() == [1, 2, 3]
        assert oom(p.free_block_ids)  # 4,294,967,288 ids: 17 GB as uint32
        assert p.num_free_blocks == 4_294_967_288
        assert oom(lambda: p.touch([4_000_000_000]))  # gives storage to every id below
        assert p.ref_cnt(4_000_000_000) == 0
        p.check_invariants()
    """,
    "KVCacheManager": """
        m = pc.KVCacheManager(10**9, block_size=16)
        assert m.num_free_blocks == 10**9 - 1
        m.add_request(1, list(range(100)))
        assert oom(lambda: m.allocate_slots(1, 16 * 300_000_000))
        assert m.allocate_slots(1, 100) is not None
        assert oom(m.free_block_ids)  # 999,999,992 ids: 4 GB as uint32
        assert m.num_free_blocks == 10**9 - 8
        m.check_invariants()
    """,
    "CpuOffloadManager": """
        # The store's lists and tables (~250 bytes a key) past the allocator's reserved
        # arena (1 GiB), which the address-space limit does not see.
        n = 5_000_000
        keys = [i.to_bytes(8, "little") for i in range(n)]
        tier = pc.CpuOffloadManager(n, enable_events=True)
        tier.set_request_keys(1, keys, 16)
        with open("/proc/self/status") as f:
            vm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), hard))
        assert oom(lambda: tier.prepare_store_range(1, 0, n, True))
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        assert tier.num_stored == 0 and tier.num_stored_total == 0 and tier.take_events() == []
        tier.check_invariants()
        assert tier.prepare_store_range(1, 0, 1000, True) == (1000, 0)
        assert tier.lookup_prefix(keys[:1001]) == 1000
        tier.on_request_finished(1)
        tier.check_invariants()
    """,
    "RadixCache host copies": """
        import numpy as np
        x = np.arange(1, 100_000_001, dtype=np.uint32)
        kw = dict(host_capacity=10**12, host_events=True)
        c = pc.RadixCache(1, "lru", write_policy="write_through", **kw)
        c.insert(x[:1000])
        assert c.take_host_events()[0].tolist() == list(range(1, 1001))
        # Copies of 100M values to host memory (with their events, 1.6 GB) do not fit:
        # the insert changes nothing.
        assert oom(lambda: c.insert(x))
        assert (c.total_size(), c.host_size(), c.num_nodes) == (1000, 1000, 1)
        assert [len(e) for e in c.take_host_events()] == [0, 0]
        c.check_invariants()
        c.insert(x[:2000])
        assert (c.total_size(), c.host_size(), c.num_nodes) == (2000, 2000, 2)
    """,
    "RadixCache write-back copy": """
        import numpy as np
        # write_back copies a node as it leaves the device: without memory for the copy
        # of a 50M-token node (400 MB, 64 MB left), the eviction stops before it.
        b = pc.RadixCache(
            1, "lru", host_capacity=10**12, write_policy="write_back", host_events=True
        )
        b.insert(np.arange(1, 50_000_001, dtype=np.uint32))
        vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize"))
        resource.setrlimit(resource.RLIMIT_AS, ((vm << 10) + (64 << 20),) * 2)
        assert len(b.evict(10)) == 0
        assert (b.total_size(), b.host_size(), b.evictable_size()) == (50_000_000, 0, 50_000_000)
        b.check_invariants()
        assert b.evict_count(10) == 0  # the same stop, counted
    """,
    "KvIndex": """
        import numpy as np
        n = 40_000_000  # a table past the allocator's reserved arena (1 GiB)
        ix = pc.KvIndex()
        stored = lambda hs: {"type": "BlockStored", "block_hashes": hs, "block_size": 16}
        assert ix.apply("w", [stored([1, 2, 3])], seq=0) == "applied"
        big = [stored(np.arange(10, 10 + n, dtype=np.uint64))]
        with open("/proc/self/status") as f:
            vm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (vm + (100 << 20), hard))  # not the table
        assert oom(lambda: ix.apply("w", big, seq=1))
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        ix.check_invariants()
        st = ix.status("w")
        # The worker's holdings were dropped; it expects the next batch.
        assert (st["num_held"], st["errors"], st["next_seq"]) == (0, 1, 2), st
        assert ix.apply("w", [stored([7, 8])], seq=2) == "applied"
        assert ix.cached_hashes("w") == [7, 8] and ix.num_hashes == 2
    """,
    "LabCache": """
        # A request of 20M new blocks: the cache's per-block arrays are reserved before
        # anything changes (MemoryError, state unchanged); they grew infallibly (abort).
        import numpy as np
        from prefixcache._core import LabCache
        n = 20_000_000
        keys = np.arange(1, n + 1, dtype=np.uint64)
        for rule in ["lru", "opt", "2q", "slru", "density", "cost"]:
            c = LabCache(10**12, rule, overcommit=True)
            if rule == "opt":
                c.set_future(keys[:4], np.array([0, 4], dtype=np.uint64),
                             np.array([4], dtype=np.uint32))
            assert c.acquire(0, keys[:3], 3, 3) == 0
            c.release(0)
            with open("/proc/self/status") as f:
                vm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), hard))
            assert oom(lambda: c.acquire(1, keys, n, n)), rule
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
            assert (c.num_used, c.num_evictable, c.lookup(keys[:4], 4)) == (3, 3, 3), rule
            c.check_invariants()
            assert c.acquire(1, keys[:10], 10, 10) == 3
            c.release(1)
            c.check_invariants()
    """,
    "KvIndex frames": """
        import struct
        # 10 MB claiming 10M events: memory follows the bytes, not the header's count.
        n = 10_000_000
        payload = b"\\x92\\x00\\xdd" + struct.pack(">I", n) + b"\\xc0" * n
        with open("/proc/self/status") as f:
            vm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), 3 << 30))
        ix = pc.KvIndex()
        try:
            ix.apply_frames("w", [b"", bytes(8), payload])
        except pc.errors.InvalidEventError as e:
            assert "an event must be a map or an array" in str(e), e
        else:
            raise AssertionError("accepted")
    """,
    "KvIndex names": """
        # Names and event strings of a caller's size are read in place or copied
        # fallibly: a 1.5 GB str (past the allocator's 1 GiB reserved arena) aborts nothing.
        ix = pc.KvIndex()
        ix.add_worker("w")
        big = "x" * (1500 << 20)
        with open("/proc/self/status") as f:
            vm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + (200 << 20), 3 << 30))
        assert ix.cached_hashes("w", medium=big) == []
        try:
            ix.status(big)
        except pc.errors.UnknownWorkerError as e:
            assert len(str(e)) < 1000, len(str(e))
        else:
            raise AssertionError("a worker named big")
        ev = {"type": "BlockStored", "block_hashes": [1], "block_size": 16, "lora_name": big}
        assert oom(lambda: ix.apply("w", [ev]))
        st = ix.status("w")
        assert (st["errors"], st["num_held"], ix.num_hashes) == (0, 0, 0), st
    """,
    "a sequence longer than memory": """
        # range(2**40) as tokens: 4 TiB of token ids. The conversion takes the room the
        # sequence says it needs at once and fails there; it grew the list item by item
        # (to the address-space limit here, 20 s a call; without a limit, until the
        # out-of-memory killer ended the process).
        calls = [
            lambda: pc.TokenBuffer(range(2**40)),
            lambda: pc.RadixCache().match_prefix(range(2**40)),
            lambda: pc.KVCacheManager(8).add_request(1, range(2**40)),
            lambda: pc.BlockTrie(8, 2).lookup(range(2**40)),
            lambda: pc.BlockPool(8).touch(range(1, 2**40)),
        ]
        for f in calls:
            try:
                f()
            except MemoryError as e:
                assert "cannot allocate" in str(e), e
            else:
                raise AssertionError("converted 2**40 items")
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert peak_kib < 512 * 1024, peak_kib
    """,
    "BlockTrie": """
        # Blocks take memory when first handed out: the largest trie is free to make.
        t = pc.BlockTrie(4_294_967_294, 4)
        assert t.num_free_blocks == 4_294_967_294
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        h = pc.BlockTrie(2_000_000_000, 4, host_blocks=2_000_000_000)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024
        # A claim or an extension the memory cannot hold fails before changing anything.
        assert oom(lambda: t.claim(1, [1, 2, 3], reserve_tokens=4 * 10**9))
        assert t.num_free_blocks == 4_294_967_294 and t.num_requests == 0
        t.claim(1, list(range(9)))
        assert oom(lambda: t.extend(1, 4 * 10**9))
        assert t.request_blocks(1) == [0, 1, 2]
        t.check_invariants()
        h.claim(1, list(range(9)))
        h.check_invariants()
    """,
    "BlockTrie dumps": """
        # dump() and host_dump() list every block id: for the largest trie that is more
        # than any memory, refused before anything is built (it aborted the process).
        t = pc.BlockTrie(4_294_967_294, 4)
        t.claim(1, list(range(9)))
        assert oom(t.host_dump) and oom(t.dump)
        assert t.request_blocks(1) == [0, 1, 2] and t.num_free_blocks == 4_294_967_291
        t.check_invariants()
        assert len(pc.BlockTrie(3, 4).dump()) == len(pc.BlockTrie(3, 4).host_dump()) == 3
    """,
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_huge_sizes_raise_memory_error_or_work(kind: str) -> None:
    script = PRELUDE + textwrap.dedent(CASES[kind]) + "\nprint('ok')\n"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])
