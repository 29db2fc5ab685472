"""Soak test: every public call on every class from 8 threads, for a long time.

Local tool, not part of the tests or CI (it runs for minutes to hours):

    python tools/soak.py --ops 10000000 --threads 8

One shared object of each class (RadixCache, BlockPool, KVCacheManager, BlockTrie,
BlockHasher); each thread draws calls at random over all of them, with its own request
ids and blocks, and hands the hostile ones (double frees, stale handles, unknown ids,
exhausted pools) to the library on purpose: a PrefixCacheError is an expected answer,
any other exception (or a crash, a hang) is a failure. Meanwhile:

- every `--check-every` operations (per thread) a thread runs check_invariants() on
  every object (the calls are linearizable, so the check sees a consistent state);
- one call in ~2000 resets an object (RadixCache.reset, reset_prefix_cache) while the
  other threads keep working on it;
- resident memory is sampled every `--sample-seconds` and printed; after the warm-up it
  must stay flat (the script fails when the last sample exceeds the one at 25% of the run
  by more than `--rss-slack-mb`);
- at half way the main thread forks (with the other threads inside calls): the child
  uses every object (each works, or raises RuntimeError because a thread was inside a
  call on it at the fork), builds new ones, and must exit within 60 s.

Prints operations per second, RSS samples and the fork outcome; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import threading
import time
import warnings
from typing import Any

import numpy as np

import prefixcache as pc
from prefixcache.errors import PrefixCacheError


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Objects:
    def __init__(self) -> None:
        self.radix = pc.RadixCache(1, "lru")
        self.pool = pc.BlockPool(4096, enable_caching=True, enable_kv_cache_events=True)
        self.manager = pc.KVCacheManager(4096, block_size=16, enable_kv_cache_events=True)
        self.trie = pc.BlockTrie(2048, 16)
        self.hasher = pc.BlockHasher(16, "sha256")

    def all(self) -> list[Any]:
        return [self.radix, self.pool, self.manager, self.trie]


class Worker:
    """One thread's calls; state it owns: its pool blocks, manager and trie request ids."""

    def __init__(self, objs: Objects, index: int, seed: int) -> None:
        self.o = objs
        self.rng = random.Random(seed)
        self.index = index
        self.next_id = index << 40
        self.blocks: list[int] = []
        self.requests: list[int] = []  # manager
        self.claims: list[int] = []  # trie
        self.nodes: list[Any] = []  # radix handles (locked or not)
        self.expected = 0  # PrefixCacheErrors seen (hostile calls)

    def tokens(self, n: int) -> np.ndarray:
        # A small alphabet of shared prefixes so that things are hit and split.
        base = self.rng.randrange(8) * 1000
        head = np.arange(base, base + self.rng.randrange(0, n + 1), dtype=np.uint32)
        tail = np.array([self.rng.randrange(50_000) for _ in range(n - len(head))], dtype=np.uint32)
        return np.concatenate([head, tail])

    def rid(self) -> int:
        self.next_id += 1
        return self.next_id

    # ---- RadixCache -------------------------------------------------------------------
    def radix(self) -> None:
        c, r = self.o.radix, self.rng.random()
        salt = f"s{self.rng.randrange(100_000)}" if self.rng.random() < 0.3 else None
        if r < 0.3:
            m = c.match_prefix(self.tokens(64), cache_salt=salt)
            if self.rng.random() < 0.3:
                m.indices  # noqa: B018 - built lazily, may be stale: StaleHandleError
        elif r < 0.6:
            res = c.insert(
                self.tokens(64),
                cache_salt=salt,
                extra_key=self.rng.choice([None, "lora-a", "lora-b"]),
            )
            if self.rng.random() < 0.5:
                c.inc_lock_ref(res.node)
                self.nodes.append(res.node)
        elif r < 0.75 and self.nodes:
            c.dec_lock_ref(self.nodes.pop(self.rng.randrange(len(self.nodes))))
        elif r < 0.85:
            c.evict(self.rng.randrange(200))
        elif r < 0.95:
            self.rng.choice([c.evictable_size, c.protected_size, c.total_size])()
            if self.nodes:
                n = self.rng.choice(self.nodes)
                self.rng.choice([c.path_indices, c.node_info, c.parent])(n)
        elif r < 0.9995:
            c.dump() if self.rng.random() < 0.01 else c.pretty_print()[:10]
        else:
            c.reset()
            self.nodes.clear()  # stale now: they would raise StaleHandleError

    # ---- BlockPool --------------------------------------------------------------------
    def pool(self) -> None:
        p, r = self.o.pool, self.rng.random()
        if r < 0.3:
            ids = p.get_new_blocks(self.rng.randrange(1, 8)).tolist()
            self.blocks.extend(ids)
            if self.rng.random() < 0.5:
                hashes = [self.rng.randbytes(32) for _ in ids]
                p.cache_full_blocks(ids, hashes, 0, len(ids), 16)
        elif r < 0.55 and self.blocks:
            k = self.rng.randrange(1, len(self.blocks) + 1)
            p.free_blocks(self.blocks[-k:][::-1])
            del self.blocks[-k:]
        elif r < 0.65:
            h = self.rng.randbytes(32)
            p.get_cached_block(h, [0])
        elif r < 0.75 and self.blocks:
            b = self.rng.choice(self.blocks)
            p.touch([b])
            self.blocks.append(b)
        elif r < 0.8:
            # Errors: the null block, an id out of range, an own block freed twice.
            bad = self.rng.choice([0, 4096 + self.rng.randrange(100)])
            p.free_blocks(
                [bad]
                if not self.blocks
                else [self.blocks[-1], self.blocks[-1]]
                if self.blocks.count(self.blocks[-1]) == 1
                else [bad]
            )
        elif r < 0.9:
            p.take_events()
            self.rng.choice(
                [lambda: p.num_free_blocks, lambda: p.usage, lambda: p.num_evicted_blocks]
            )()
        elif r < 0.9995:
            b = self.rng.randrange(4096)
            p.ref_cnt(b), p.block_hash(b)
            if self.rng.random() < 0.01:
                p.evict_blocks([b])
                p.free_block_ids()
        else:
            p.reset_prefix_cache()

    # ---- KVCacheManager ---------------------------------------------------------------
    def manager(self) -> None:
        m, r = self.o.manager, self.rng.random()
        if r < 0.35 or not self.requests:
            rid = self.rid()
            if m.admit(rid, self.tokens(200), num_lookahead_tokens=16) is not None:
                self.requests.append(rid)
            else:
                m.free(rid)
        elif r < 0.55:
            rid = self.rng.choice(self.requests)
            m.append_tokens(rid, self.tokens(self.rng.randrange(1, 40)))
            if m.allocate_slots(rid, 40) is None:
                m.preempt(rid)  # stays known to the manager until freed
        elif r < 0.8:
            rid = self.requests.pop(self.rng.randrange(len(self.requests)))
            m.finish(rid, self.tokens(8))
        elif r < 0.95:
            rid = self.rng.choice(self.requests)
            m.block_ids(rid), m.num_tokens(rid), m.block_hashes(rid)[:1]
            m.take_events(), m.take_stats()
            rid in m, len(m)
        elif r < 0.9995:
            m.ref_cnt(self.rng.randrange(4096))
            m.free(self.rng.randrange(1 << 50))  # unknown: an error
        else:
            m.reset_prefix_cache()

    # ---- BlockTrie --------------------------------------------------------------------
    def trie(self) -> None:
        t, r = self.o.trie, self.rng.random()
        salt = f"s{self.rng.randrange(100_000)}" if self.rng.random() < 0.3 else None
        mm = [(self.rng.randbytes(8), 0, 4)] if self.rng.random() < 0.2 else None
        if r < 0.35 or not self.claims:
            rid, toks = self.rid(), self.tokens(100)
            t.claim(
                rid, toks, cache_salt=salt, mm_items=mm, priority=self.rng.choice([None, 10, 80])
            )
            self.claims.append(rid)
            t.complete(rid)
            t.store(rid, toks)
        elif r < 0.7:
            rid = self.claims.pop(self.rng.randrange(len(self.claims)))
            t.release(rid)
        elif r < 0.8:
            t.lookup(self.tokens(100), cache_salt=salt)
        elif r < 0.9:
            rid = self.rng.choice(self.claims)
            t.extend(rid, 200)
            t.request_blocks(rid)
        else:
            t.take_events(), t.stats
            t.advance_clock(1)
            t.release(self.rng.randrange(1 << 50))  # unknown: an error

    def hasher(self) -> None:
        h = self.o.hasher
        toks = self.tokens(64)
        hashes = h.hash_blocks(toks)
        h.hash_block(hashes[0] if hashes else None, toks[:16])

    def step(self) -> None:
        op = self.rng.choice([self.radix, self.pool, self.manager, self.trie, self.hasher])
        try:
            op()
        except PrefixCacheError:
            self.expected += 1

    def cleanup(self) -> None:
        """Give back everything this thread holds (so the final state can be checked)."""
        for b in reversed(self.blocks):
            self.o.pool.free_blocks([b])
        for rid in self.requests:
            self.o.manager.free(rid)
        for rid in self.claims:
            self.o.trie.release(rid)
        for n in self.nodes:
            with contextlib.suppress(PrefixCacheError):  # stale after a reset
                self.o.radix.dec_lock_ref(n)


def fork_probe(objs: Objects) -> str:
    """Fork while the workers run; the child uses every object. Returns the outcome."""
    warnings.simplefilter("ignore", DeprecationWarning)
    pid = os.fork()
    if pid == 0:
        usable = unusable = 0
        for obj in objs.all():
            try:
                obj.check_invariants()
                usable += 1
            except RuntimeError as e:
                unusable += "forked" in str(e)
        Objects().radix.insert([1, 2, 3])
        os._exit(10 * usable + unusable)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code < 0 or code % 10 + code // 10 != 4:
                return f"FAILED (child exit code {code})"
            return f"ok: {code // 10} objects usable, {code % 10} in use at the fork"
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "FAILED (child hung)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=10_000_000, help="operations in total")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument(
        "--check-every",
        type=int,
        default=20_000,
        help="operations per thread between invariant checks",
    )
    ap.add_argument("--sample-seconds", type=float, default=10.0)
    ap.add_argument("--rss-slack-mb", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=0, help="random seed")
    args = ap.parse_args()

    objs = Objects()
    per_thread = args.ops // args.threads
    done = [0] * args.threads
    failures: list[str] = []
    workers = [Worker(objs, i, args.seed * 1000 + i) for i in range(args.threads)]

    def run(i: int) -> None:
        w = workers[i]
        try:
            for k in range(per_thread):
                w.step()
                done[i] = k + 1
                if (k + 1) % args.check_every == 0:
                    for obj in objs.all():
                        obj.check_invariants()
        except Exception as e:
            failures.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    samples: list[tuple[int, float]] = []
    fork_outcome = "not run"
    next_sample = 0.0
    while any(t.is_alive() for t in threads):
        ops = sum(done)
        now = time.monotonic() - t0
        if now >= next_sample:
            samples.append((ops, rss_mb()))
            print(
                f"{now:8.1f} s  {ops:>11,} ops  {ops / max(now, 1e-9):>9,.0f} ops/s  "
                f"RSS {samples[-1][1]:7.1f} MB",
                flush=True,
            )
            next_sample += args.sample_seconds
        if fork_outcome == "not run" and ops >= args.ops // 2:
            fork_outcome = fork_probe(objs)
            print(f"fork at {ops:,} ops: {fork_outcome}", flush=True)
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    ops = sum(done)
    samples.append((ops, rss_mb()))
    for w in workers:
        w.cleanup()
    for obj in objs.all():
        obj.check_invariants()
    if objs.pool.num_free_blocks != objs.pool.num_blocks - 1:
        failures.append("pool: blocks still referenced after every thread freed its own")
    if objs.trie.num_requests or len(objs.manager):
        failures.append(
            f"requests left after cleanup: trie {objs.trie.num_requests}, "
            f"manager {len(objs.manager)}"
        )
    warm = next((rss for n, rss in samples if n >= ops // 4), samples[0][1])
    grown = samples[-1][1] - warm
    print(
        f"\n{ops:,} operations in {elapsed:.1f} s ({ops / elapsed:,.0f} ops/s) on "
        f"{args.threads} threads; {sum(w.expected for w in workers):,} expected errors"
    )
    print(
        f"RSS: {samples[0][1]:.1f} MB at start, {warm:.1f} MB at 25%, "
        f"{samples[-1][1]:.1f} MB at the end ({grown:+.1f} MB after warm-up)"
    )
    print(f"fork: {fork_outcome}")
    if grown > args.rss_slack_mb:
        failures.append(f"RSS grew {grown:.1f} MB after the warm-up")
    if fork_outcome.startswith("FAILED"):
        failures.append(f"fork: {fork_outcome}")
    for f in failures:
        print("FAILURE:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
