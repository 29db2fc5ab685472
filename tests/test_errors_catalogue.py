"""The bad-input catalogue: every misuse the public API can receive, the exception it
raises, and a check that the object it was called on is unchanged afterwards.

``CATALOGUE`` is the single source of docs/ERRORS.md: ``python tests/test_errors_catalogue.py``
regenerates the document and ``test_errors_md_is_generated_from_the_catalogue`` fails when
the two differ, so they cannot drift.

Each row names a section (the class or function), the misuse, the call as shown in the
document, the call itself (a function of the section's world: an object built in a known
state), the exception class and a fragment of its message. For every row the test builds
the world, snapshots its observable state, makes the call, checks the exception and the
message, and checks the snapshot again.
"""

from __future__ import annotations

import array
import contextlib
import io
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefixcache import (
    BlockHasher,
    BlockPool,
    BlockTrie,
    CpuOffloadManager,
    KVCacheManager,
    KvIndex,
    RadixCache,
    hash_block_tokens,
)
from prefixcache.errors import (
    BlockStateError,
    InvalidEventError,
    InvalidInputError,
    InvalidTypeError,
    LockRefError,
    OutOfBlocksError,
    StaleHandleError,
    UnknownRequestError,
    UnknownWorkerError,
    UnsupportedHashInputError,
)
from prefixcache.sim.cli import main as cli_main
from prefixcache.sim.requests import Request
from prefixcache.sim.traces import TraceFormatError, read_mooncake, read_token_jsonl

ERRORS_MD = Path(__file__).resolve().parent.parent / "docs" / "ERRORS.md"


class _LyingInterface:
    """An object whose ``__array_interface__`` names an address nobody can read."""

    def __init__(self) -> None:
        self.__array_interface__ = {"shape": (4,), "typestr": "<i8", "data": (1, 0), "version": 3}


class CliExit(Exception):
    """The CLI stopped with exit status 2; the message is what it wrote to stderr."""


# ---- worlds: an object in a known state and a snapshot of everything observable ----


class World:
    obj: Any = None

    def state(self) -> Any:
        return None


class RadixWorld(World):
    def __init__(self) -> None:
        c = self.obj = RadixCache(1, "lru")
        self.evicted = c.insert([7, 7], extra_key="gone").node
        self.locked = c.insert([1, 2, 3, 4, 5, 6]).node
        c.inc_lock_ref(self.locked)
        self.unlocked = c.insert([10, 11, 12]).node
        c.evict(1)
        self.foreign = RadixCache().insert([1, 2]).node
        reset = RadixCache()
        self.before_reset = reset.insert([1]).node
        reset.reset()

    def state(self) -> Any:
        c = self.obj
        return (
            c.dump(),
            c.evictable_size(),
            c.protected_size(),
            c.total_size(),
            c.num_nodes,
            c.clock,
        )


class PoolWorld(World):
    """8 blocks: 1 and 2 held and cached, 3 held uncached, 4..7 free; the null block 0."""

    def __init__(self) -> None:
        p = self.obj = BlockPool(8)
        ids = p.get_new_blocks(3)
        p.cache_full_blocks(ids[:2], [b"h" * 32, b"i" * 32], 0, 2, 16)
        self.held = [int(x) for x in ids]

    def state(self) -> Any:
        p = self.obj
        return (
            p.num_free_blocks,
            p.free_block_ids().tolist(),
            [(p.ref_cnt(i), p.block_hash(i)) for i in range(p.num_blocks)],
        )


class ManagerWorld(World):
    """16 blocks of 4 tokens; request 1 admitted with 10 tokens, request 2 added only."""

    def __init__(self) -> None:
        m = self.obj = KVCacheManager(16, block_size=4)
        m.admit(1, list(range(10)))
        m.add_request(2, list(range(100, 110)))

    def state(self) -> Any:
        m = self.obj
        reqs = [
            (
                r,
                m.block_ids(r).tolist(),
                m.num_tokens(r),
                m.num_computed_tokens(r),
                m.block_hashes(r),
            )
            for r in (1, 2)
        ]
        return (
            m.num_free_blocks,
            m.free_block_ids().tolist(),
            dict(m.stats),
            len(m),
            reqs,
            [(m.ref_cnt(i), m.block_hash(i)) for i in range(m.num_blocks)],
        )


class OffloadWorld(World):
    """A CPU tier of 2 chunks: key 1 stored, key 2 being stored."""

    def __init__(self) -> None:
        m = self.obj = CpuOffloadManager(2, enable_events=True)
        m.complete_store(0, m.prepare_store(0, [b"\x01" * 8]).keys_to_store)  # type: ignore[union-attr]
        m.prepare_store(0, [b"\x02" * 8])

    def state(self) -> Any:
        m = self.obj
        return (
            m.num_stored,
            m.num_idle,
            m.num_write_pending,
            m.num_free_chunks,
            [m.lookup(bytes([i]) * 8) for i in range(1, 4)],
        )


class HasherWorld(World):
    def __init__(self) -> None:
        self.obj = BlockHasher(4, "sha256", seed="s")

    def state(self) -> Any:
        h = self.obj
        return (h.none_hash, h.block_size, h.algo, h.seed, h.hash_blocks([1, 2, 3, 4]))


class TrieWorld(World):
    """16 blocks of 4 tokens; request 1 claimed (10 tokens) and completed."""

    def __init__(self) -> None:
        t = self.obj = BlockTrie(16, tokens_per_block=4)
        t.claim(1, list(range(10)))
        t.complete(1)

    def state(self) -> Any:
        t = self.obj
        return (
            t.dump(),
            t.num_free_blocks,
            t.num_cached_blocks,
            t.num_requests,
            t.clock,
            dict(t.stats),
            t.request_blocks(1),
        )


class KvIndexWorld(World):
    """Worker "a" holds hashes 1 and 2 (batch 0 applied); "b" holds 1 on CPU."""

    def __init__(self) -> None:
        ix = self.obj = KvIndex(ttl=10.0)
        ix.apply_frames(
            "a",
            kv_frames(0, [{"type": "BlockStored", "block_hashes": [1, 2], "block_size": 4}]),
            now=0.0,
        )
        ix.apply(
            "b",
            [{"type": "BlockStored", "block_hashes": [1], "block_size": 4, "medium": "CPU"}],
            now=0.0,
        )

    def state(self) -> Any:
        ix = self.obj
        # The rejected-batch counters ("errors", "last_error") are meant to change.
        keep = ("next_seq", "max_seen_seq", "stale", "batches", "block_events", "num_held")
        return (
            ix.workers(),
            ix.media,
            ix.num_hashes,
            [
                (ix.cached_hashes(w), {k: ix.status(w, now=0.0)[k] for k in keep})
                for w in ix.workers()
            ],
        )


class SelfIndex:
    """An object whose ``__index__`` returns itself, not an int."""

    def __index__(self) -> Any:
        return self


def kv_frames(seq: int, events: Any, seq_bytes: int = 8) -> list[bytes]:
    import msgpack

    return [b"kv@a@m", seq.to_bytes(seq_bytes, "big"), msgpack.packb([1.0, events, 0])]


def kv(
    misuse: str,
    call: str,
    exc: type[BaseException],
    fragment: str,
    run: Callable[[KvIndexWorld], Any],
) -> Row:
    return Row("KvIndex", misuse, call, run, exc, fragment)


class FileWorld(World):
    """A temporary directory for trace files (readers hold no state)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def trace(self, text: str) -> Path:
        path = self.tmp / "trace.jsonl"
        path.write_text(text)
        return path


def cli(argv: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli_main(argv)
        except SystemExit as e:
            code = e.code  # argparse
    if code == 2:
        raise CliExit(" ".join(err.getvalue().split()))
    raise AssertionError(f"exit status {code!r}, expected 2: {err.getvalue()}")


WORLDS: dict[str, Callable[[Path], World]] = {
    "RadixCache": lambda _: RadixWorld(),
    "BlockPool": lambda _: PoolWorld(),
    "KVCacheManager": lambda _: ManagerWorld(),
    "CpuOffloadManager": lambda _: OffloadWorld(),
    "BlockHasher / hash_block_tokens": lambda _: HasherWorld(),
    "BlockTrie": lambda _: TrieWorld(),
    "KvIndex": lambda _: KvIndexWorld(),
    "trace readers": FileWorld,
    "simulator Request": lambda _: World(),
    "CLI": FileWorld,
}


@dataclass(frozen=True)
class Row:
    section: str
    misuse: str
    call: str
    run: Callable[[Any], Any]
    exc: type[BaseException]
    fragment: str


def radix(
    misuse: str,
    call: str,
    exc: type[BaseException],
    fragment: str,
    run: Callable[[RadixWorld], Any],
) -> Row:
    return Row("RadixCache", misuse, call, run, exc, fragment)


def pool(
    misuse: str, call: str, exc: type[BaseException], fragment: str, run: Callable[[PoolWorld], Any]
) -> Row:
    return Row("BlockPool", misuse, call, run, exc, fragment)


def mgr(
    misuse: str,
    call: str,
    exc: type[BaseException],
    fragment: str,
    run: Callable[[ManagerWorld], Any],
) -> Row:
    return Row("KVCacheManager", misuse, call, run, exc, fragment)


def offload(
    misuse: str,
    call: str,
    exc: type[BaseException],
    fragment: str,
    run: Callable[[OffloadWorld], Any],
) -> Row:
    return Row("CpuOffloadManager", misuse, call, run, exc, fragment)


def hasher(
    misuse: str,
    call: str,
    exc: type[BaseException],
    fragment: str,
    run: Callable[[HasherWorld], Any],
) -> Row:
    return Row("BlockHasher / hash_block_tokens", misuse, call, run, exc, fragment)


def trie(
    misuse: str, call: str, exc: type[BaseException], fragment: str, run: Callable[[TrieWorld], Any]
) -> Row:
    return Row("BlockTrie", misuse, call, run, exc, fragment)


def trace(
    misuse: str,
    text: str,
    exc: type[BaseException],
    fragment: str,
    reader: Callable[[Path], Any] = read_token_jsonl,
) -> Row:
    name = getattr(reader, "__name__", "read")
    return Row(
        "trace readers",
        misuse,
        f"{name}(file: {text.strip()!r})",
        lambda w: reader(w.trace(text)),
        exc,
        fragment,
    )


def request(misuse: str, call: str, exc: type[BaseException], fragment: str, **kw: Any) -> Row:
    def run(w: World) -> Any:
        return Request(0, np.arange(4, dtype=np.uint32), lambda: np.zeros(0, np.uint32), **kw)

    return Row("simulator Request", misuse, call, run, exc, fragment)


def cmd(misuse: str, argv: list[str], fragment: str) -> Row:
    return Row(
        "CLI", misuse, "prefixcache " + " ".join(argv), lambda w: cli(argv), CliExit, fragment
    )


H32 = b"h" * 32
TIER_RUN = ["replay", "workload:A", "--policies", "vllm-blocks", "--cpu-capacity", "1k"]

CATALOGUE: list[Row] = [
    # ---------------- RadixCache ----------------
    radix(
        "page size zero",
        "RadixCache(0)",
        InvalidInputError,
        "page_size must be >= 1",
        lambda w: RadixCache(0),
    ),
    radix(
        "page size of wrong type",
        "RadixCache(1.5)",
        InvalidTypeError,
        "page_size must be an int",
        lambda w: RadixCache(1.5),
    ),
    radix(
        "unknown eviction policy",
        'RadixCache(1, "xyz")',
        InvalidInputError,
        "unknown eviction policy",
        lambda w: RadixCache(1, "xyz"),
    ),
    radix(
        "unknown host write policy",
        'RadixCache(1, "lru", host_capacity=8, write_policy="write_around")',
        InvalidInputError,
        "unknown write policy",
        lambda w: RadixCache(1, "lru", host_capacity=8, write_policy="write_around"),
    ),
    radix(
        "host write policy of wrong type",
        'RadixCache(1, "lru", host_capacity=8, write_policy=1)',
        InvalidTypeError,
        "write_policy must be a str",
        lambda w: RadixCache(1, "lru", host_capacity=8, write_policy=1),
    ),
    radix(
        "negative host capacity",
        'RadixCache(1, "lru", host_capacity=-1)',
        InvalidInputError,
        "host_capacity must be >= 0",
        lambda w: RadixCache(1, "lru", host_capacity=-1),
    ),
    radix(
        "host events without a host tier",
        'RadixCache(1, "lru", host_events=True)',
        InvalidInputError,
        "host_events needs a host tier",
        lambda w: RadixCache(1, "lru", host_events=True),
    ),
    radix(
        "host_events not a bool",
        'RadixCache(1, "lru", host_capacity=8, host_events="yes")',
        InvalidTypeError,
        "host_events must be a bool, got str",
        lambda w: RadixCache(1, "lru", host_capacity=8, host_events="yes"),
    ),
    radix(
        "take_host_events nonzero not a bool",
        "take_host_events(nonzero=1)",
        InvalidTypeError,
        "nonzero must be a bool, got int",
        lambda w: w.obj.take_host_events(nonzero=1),
    ),
    radix(
        "load_back values of the wrong length",
        "load_back(node, [1])",
        InvalidInputError,
        "load_back: values has length 1",
        lambda w: w.obj.load_back(w.unlocked, [1]),
    ),
    radix(
        "negative host eviction",
        "evict_host(-1)",
        InvalidInputError,
        "num_tokens must be >= 0",
        lambda w: w.obj.evict_host(-1),
    ),
    radix(
        "negative token id",
        "insert([1, -1])",
        InvalidInputError,
        "tokens[1] = -1 is out of range",
        lambda w: w.obj.insert([1, -1]),
    ),
    radix(
        "token id 2**32",
        "match_prefix([2**32])",
        InvalidInputError,
        "tokens[0] = 4294967296 is out of range",
        lambda w: w.obj.match_prefix([2**32]),
    ),
    radix(
        "token id 2**64",
        "insert([2**64])",
        InvalidInputError,
        "is out of range",
        lambda w: w.obj.insert([2**64]),
    ),
    radix(
        "float token",
        "insert([1, 2.0])",
        InvalidTypeError,
        "tokens[1] must be an int, got float",
        lambda w: w.obj.insert([1, 2.0]),
    ),
    radix(
        "bool token", "insert([True])", InvalidTypeError, "got bool", lambda w: w.obj.insert([True])
    ),
    radix(
        "None as tokens",
        "match_prefix(None)",
        InvalidTypeError,
        "not NoneType",
        lambda w: w.obj.match_prefix(None),
    ),
    radix(
        "str as tokens", 'insert("123")', InvalidTypeError, "not str", lambda w: w.obj.insert("123")
    ),
    radix(
        "float64 array",
        "insert(np.array([1.0]))",
        InvalidTypeError,
        "dtype float64",
        lambda w: w.obj.insert(np.array([1.0])),
    ),
    radix(
        "float16 array",
        "insert(np.array([1], float16))",
        InvalidTypeError,
        "dtype float16",
        lambda w: w.obj.insert(np.array([1], dtype=np.float16)),
    ),
    radix(
        "bool array",
        "insert(np.array([True]))",
        InvalidTypeError,
        "dtype bool",
        lambda w: w.obj.insert(np.array([True])),
    ),
    radix(
        "object array",
        "insert(np.array([1], object))",
        InvalidTypeError,
        "dtype object",
        lambda w: w.obj.insert(np.array([1], dtype=object)),
    ),
    radix(
        "2-D array",
        "insert(np.zeros((2, 2), int64))",
        InvalidInputError,
        "1-dimensional",
        lambda w: w.obj.insert(np.zeros((2, 2), dtype=np.int64)),
    ),
    radix(
        "negative int32 in a strided array",
        "insert(np.array([1, 0, -5, 0], int32)[::2])",
        InvalidInputError,
        "tokens[1] = -5",
        lambda w: w.obj.insert(np.array([1, 0, -5, 0], dtype=np.int32)[::2]),
    ),
    radix(
        "values of another length",
        "insert([1, 2, 3], values=[1, 2])",
        InvalidInputError,
        "values has length 2 but tokens has length 3",
        lambda w: w.obj.insert([1, 2, 3], values=[1, 2]),
    ),
    radix(
        "value beyond int64",
        "insert([1], values=[2**63])",
        InvalidInputError,
        "does not fit in int64",
        lambda w: w.obj.insert([1], values=[2**63]),
    ),
    radix(
        "float values",
        "insert([1], values=np.array([0.5]))",
        InvalidTypeError,
        "values must hold integers",
        lambda w: w.obj.insert([1], values=np.array([0.5])),
    ),
    radix(
        "negative inserted_len",
        "insert([1, 2], inserted_len=-1)",
        InvalidInputError,
        "inserted_len must be >= 0",
        lambda w: w.obj.insert([1, 2], inserted_len=-1),
    ),
    radix(
        "float priority",
        "insert([1], priority=0.5)",
        InvalidTypeError,
        "priority must be an int",
        lambda w: w.obj.insert([1], priority=0.5),
    ),
    radix(
        "namespace of wrong type",
        "insert([1], extra_key=3)",
        InvalidTypeError,
        "extra_key must be a str or None, got int",
        lambda w: w.obj.insert([1], extra_key=3),
    ),
    radix(
        "negative eviction count",
        "evict(-1)",
        InvalidInputError,
        "num_tokens must be >= 0",
        lambda w: w.obj.evict(-1),
    ),
    radix(
        "float eviction count",
        "evict(1.0)",
        InvalidTypeError,
        "num_tokens must be an int",
        lambda w: w.obj.evict(1.0),
    ),
    radix(
        "negative eviction count (count only)",
        "evict_count(-1)",
        InvalidInputError,
        "num_tokens must be >= 0",
        lambda w: w.obj.evict_count(-1),
    ),
    radix(
        "float eviction count (count only)",
        "evict_count(1.0)",
        InvalidTypeError,
        "num_tokens must be an int",
        lambda w: w.obj.evict_count(1.0),
    ),
    radix(
        "evicted node handle",
        "inc_lock_ref(evicted)",
        StaleHandleError,
        "evicted",
        lambda w: w.obj.inc_lock_ref(w.evicted),
    ),
    radix(
        "handle of another cache",
        "dec_lock_ref(foreign)",
        StaleHandleError,
        "another",
        lambda w: w.obj.dec_lock_ref(w.foreign),
    ),
    radix(
        "handle from before reset()",
        "path_indices(old)",
        StaleHandleError,
        "reset",
        lambda w: w.obj.path_indices(w.before_reset),
    ),
    radix(
        "not a handle",
        "node_info(3)",
        InvalidTypeError,
        "must be a prefixcache Node handle",
        lambda w: w.obj.node_info(3),
    ),
    radix(
        "double unlock (lock count below zero)",
        "dec_lock_ref(unlocked)",
        LockRefError,
        "would make a lock count negative",
        lambda w: w.obj.dec_lock_ref(w.unlocked),
    ),
    radix(
        "set as tokens",
        "insert({1, 2})",
        InvalidTypeError,
        "not set",
        lambda w: w.obj.insert({1, 2}),
    ),
    radix(
        "2-D memoryview",
        "insert(memoryview(np.zeros((2, 2), int64)))",
        InvalidInputError,
        "1-dimensional",
        lambda w: w.obj.insert(memoryview(np.zeros((2, 2), np.int64))),
    ),
    radix(
        "float array.array",
        'insert(array("d", [1.0]))',
        InvalidTypeError,
        "tokens[0] must be an int, got float",
        lambda w: w.obj.insert(array.array("d", [1.0])),
    ),
    radix(
        "__array_interface__ pointing at unreadable memory",
        'insert(obj)  # obj.__array_interface__["data"] == (1, False)',
        InvalidInputError,
        "tokens: its __array_interface__ or DLPack tensor points at memory this process "
        "cannot read",
        lambda w: w.obj.insert(_LyingInterface()),
    ),
    radix(
        "int beyond 2**127",
        "insert([1], priority=2**127)",
        InvalidInputError,
        "priority must be an int in [-2**63, 2**63)",
        lambda w: w.obj.insert([1], priority=2**127),
    ),
    radix(
        "priority beyond int64 (never clamped)",
        "insert([1], priority=2**64)",
        InvalidInputError,
        "priority must be an int in [-2**63, 2**63), got 18446744073709551616",
        lambda w: w.obj.insert([1], priority=2**64),
    ),
    radix(
        "page size beyond int64",
        "RadixCache(2**64)",
        InvalidInputError,
        "page_size must be an int in [1, 2**63)",
        lambda w: RadixCache(2**64),
    ),
    radix(
        "inserted_len beyond int64",
        "insert([1], inserted_len=2**100)",
        InvalidInputError,
        "inserted_len must be an int in [0, 2**63)",
        lambda w: w.obj.insert([1], inserted_len=2**100),
    ),
    radix(
        "eviction count beyond int64",
        "evict(10**30)",
        InvalidInputError,
        "num_tokens must be an int in [0, 2**63)",
        lambda w: w.obj.evict(10**30),
    ),
    radix(
        "salt with a lone surrogate",
        'insert([1], cache_salt="\\ud800")',
        InvalidInputError,
        "cache_salt is not valid text",
        lambda w: w.obj.insert([1], cache_salt="\ud800"),
    ),
    radix(
        "namespace with a lone surrogate",
        'match_prefix([1], extra_key="\\ud800")',
        InvalidInputError,
        "extra_key is not valid text",
        lambda w: w.obj.match_prefix([1], extra_key="\ud800"),
    ),
    # ---------------- BlockPool ----------------
    pool("no blocks", "BlockPool(0)", InvalidInputError, "num_blocks", lambda w: BlockPool(0)),
    pool(
        "enable_caching not a bool",
        "BlockPool(8, enable_caching=1)",
        InvalidTypeError,
        "enable_caching must be a bool, got int",
        lambda w: BlockPool(8, enable_caching=1),
    ),
    pool(
        "negative block count",
        "BlockPool(-3)",
        InvalidInputError,
        "num_blocks",
        lambda w: BlockPool(-3),
    ),
    pool(
        "unknown event hash format",
        'BlockPool(8, event_hash_format="hex")',
        InvalidInputError,
        "event_hash_format",
        lambda w: BlockPool(8, event_hash_format="hex"),
    ),
    pool(
        "capacity exhausted",
        "get_new_blocks(5)",
        OutOfBlocksError,
        "cannot get 5 blocks: only 4 free",
        lambda w: w.obj.get_new_blocks(5),
    ),
    pool(
        "huge count (was a capacity-overflow panic)",
        "get_new_blocks(2**62)",
        OutOfBlocksError,
        "only 4 free",
        lambda w: w.obj.get_new_blocks(2**62),
    ),
    pool(
        "count beyond int64",
        "get_new_blocks(2**64)",
        InvalidInputError,
        "num_blocks must be an int in [0, 2**63)",
        lambda w: w.obj.get_new_blocks(2**64),
    ),
    pool(
        "negative count",
        "get_new_blocks(-1)",
        InvalidInputError,
        "num_blocks must be >= 0",
        lambda w: w.obj.get_new_blocks(-1),
    ),
    pool(
        "double free",
        "free_blocks([3, 3])",
        BlockStateError,
        "cannot free block 3: it has no reference left",
        lambda w: w.obj.free_blocks([3, 3]),
    ),
    pool(
        "free of a free block",
        "free_blocks([5])",
        BlockStateError,
        "cannot free block 5: it has no reference left",
        lambda w: w.obj.free_blocks([5]),
    ),
    pool(
        "free of the null block",
        "free_blocks([0])",
        BlockStateError,
        "null",
        lambda w: w.obj.free_blocks([0]),
    ),
    pool("touch the null block", "touch([0])", BlockStateError, "null", lambda w: w.obj.touch([0])),
    pool(
        "block id out of range",
        "free_blocks([8])",
        InvalidInputError,
        "block id 8 is out of range",
        lambda w: w.obj.free_blocks([8]),
    ),
    pool(
        "negative block id",
        "touch([-1])",
        InvalidInputError,
        "block_ids[0] = -1 is out of range",
        lambda w: w.obj.touch([-1]),
    ),
    pool(
        "float block ids",
        "touch(np.array([1.0]))",
        InvalidTypeError,
        "dtype float64",
        lambda w: w.obj.touch(np.array([1.0])),
    ),
    pool(
        "hash of another length",
        "cache_full_blocks([3], [b'x' * 16], 0, 1, 16)",
        InvalidInputError,
        "block hash has 16 bytes but this pool holds 32-byte hashes",
        lambda w: w.obj.cache_full_blocks([3], [b"x" * 16], 0, 1, 16),
    ),
    pool(
        "hashes not iterable",
        "cache_full_blocks([3], 5, 0, 1, 16)",
        InvalidTypeError,
        "block_hashes must be an iterable of block hashes, got int",
        lambda w: w.obj.cache_full_blocks([3], 5, 0, 1, 16),
    ),
    pool(
        "hash longer than 32 bytes",
        "cache_full_blocks([3], [b'x' * 33], 0, 1, 16)",
        InvalidInputError,
        "block_hashes[0] has 33 bytes",
        lambda w: w.obj.cache_full_blocks([3], [b"x" * 33], 0, 1, 16),
    ),
    pool(
        "empty hash",
        "get_cached_block(b'')",
        InvalidInputError,
        "block_hash has 0 bytes",
        lambda w: w.obj.get_cached_block(b""),
    ),
    pool(
        "hash of wrong type",
        "get_cached_block('h')",
        InvalidTypeError,
        "block_hash must be bytes, not str",
        lambda w: w.obj.get_cached_block("h"),
    ),
    pool(
        "caching an already cached block",
        "cache_full_blocks([1], [H32], 0, 1, 16)",
        BlockStateError,
        "block 1 is already cached",
        lambda w: w.obj.cache_full_blocks([1], [H32], 0, 1, 16),
    ),
    pool(
        "caching a free block",
        "cache_full_blocks([5], [H32], 0, 1, 16)",
        BlockStateError,
        "block 5 is free",
        lambda w: w.obj.cache_full_blocks([5], [H32], 0, 1, 16),
    ),
    pool(
        "num_full_blocks beyond the hashes",
        "cache_full_blocks([3], [H32], 0, 2, 16)",
        InvalidInputError,
        "num_full_blocks = 2 exceeds",
        lambda w: w.obj.cache_full_blocks([3], [H32], 0, 2, 16),
    ),
    pool(
        "ref_cnt of an unknown block",
        "ref_cnt(99)",
        InvalidInputError,
        "block id 99 is out of range",
        lambda w: w.obj.ref_cnt(99),
    ),
    pool(
        "2-D memoryview of block ids",
        "touch(memoryview(np.ones((2, 2), int64)))",
        InvalidInputError,
        "1-dimensional",
        lambda w: w.obj.touch(memoryview(np.ones((2, 2), np.int64))),
    ),
    pool(
        "set of block ids",
        "free_blocks({1, 2})",
        InvalidTypeError,
        "not set",
        lambda w: w.obj.free_blocks({1, 2}),
    ),
    # ---------------- CpuOffloadManager ----------------
    offload(
        "unknown cache policy",
        'CpuOffloadManager(2, cache_policy="fifo")',
        InvalidInputError,
        "cache_policy must be lru or arc",
        lambda w: CpuOffloadManager(2, cache_policy="fifo"),
    ),
    offload(
        "enable_events not a bool",
        'CpuOffloadManager(2, enable_events="yes")',
        InvalidTypeError,
        "enable_events must be a bool, got str",
        lambda w: CpuOffloadManager(2, enable_events="yes"),
    ),
    offload(
        "store threshold zero",
        "CpuOffloadManager(2, store_threshold=0)",
        InvalidInputError,
        "store_threshold",
        lambda w: CpuOffloadManager(2, store_threshold=0),
    ),
    offload(
        "key not bytes",
        'prepare_store(0, ["ab"])',
        InvalidTypeError,
        "keys[0] must be bytes",
        lambda w: w.obj.prepare_store(0, ["ab"]),
    ),
    offload(
        "key of 33 bytes",
        'lookup(b"x" * 33)',
        InvalidInputError,
        "a block hash has 1 to 32 bytes",
        lambda w: w.obj.lookup(b"x" * 33),
    ),
    offload(
        "empty key",
        'lookup(b"")',
        InvalidInputError,
        "is empty",
        lambda w: w.obj.lookup(b""),
    ),
    offload(
        "keys not a list",
        'touch(0, b"ab")',
        InvalidTypeError,
        "keys must be a list or tuple of bytes",
        lambda w: w.obj.touch(0, b"ab"),
    ),
    offload(
        "repeated key in a store",
        "prepare_store(0, [k, k])",
        InvalidInputError,
        "prepare_store keys must be distinct",
        lambda w: w.obj.prepare_store(0, [b"\x03" * 8, b"\x03" * 8]),
    ),
    offload(
        "load of a key being stored",
        "prepare_load(0, [k2])",
        BlockStateError,
        "is not stored and ready to load",
        lambda w: w.obj.prepare_load(0, [b"\x01" * 8, b"\x02" * 8]),
    ),
    offload(
        "load completed twice",
        "complete_load(0, [k1])",
        BlockStateError,
        "has no load in flight",
        lambda w: w.obj.complete_load(0, [b"\x01" * 8]),
    ),
    offload(
        "positions of another length",
        "set_offload_key_positions(0, [k1], [16, 32])",
        InvalidInputError,
        "1 keys but 2 end_tokens",
        lambda w: w.obj.set_offload_key_positions(0, [b"\x01" * 8], [16, 32]),
    ),
    offload(
        "negative position",
        "set_offload_key_positions(0, [k1], [-1])",
        InvalidInputError,
        "must be >= 0",
        lambda w: w.obj.set_offload_key_positions(0, [b"\x01" * 8], [-1]),
    ),
    offload(
        "manager not a KVCacheManager",
        "set_request_keys_from(BlockPool(4), 0)",
        InvalidTypeError,
        "manager must be a KVCacheManager, got BlockPool",
        lambda w: w.obj.set_request_keys_from(BlockPool(4), 0),
    ),
    # ---------------- KVCacheManager ----------------
    mgr(
        "block size zero",
        "KVCacheManager(16, block_size=0)",
        InvalidInputError,
        "block_size",
        lambda w: KVCacheManager(16, block_size=0),
    ),
    mgr(
        "enable_kv_cache_events not a bool",
        'KVCacheManager(16, enable_kv_cache_events="yes")',
        InvalidTypeError,
        "enable_kv_cache_events must be a bool, got str",
        lambda w: KVCacheManager(16, enable_kv_cache_events="yes"),
    ),
    mgr(
        "take_events compact not a bool",
        "take_events(compact=0)",
        InvalidTypeError,
        "compact must be a bool, got int",
        lambda w: w.obj.take_events(compact=0),
    ),
    mgr(
        "unknown hash algorithm",
        'KVCacheManager(16, hash_algo="md5")',
        InvalidInputError,
        "md5",
        lambda w: KVCacheManager(16, hash_algo="md5"),
    ),
    mgr(
        "sliding window below 2",
        "KVCacheManager(16, sliding_window=1)",
        InvalidInputError,
        "sliding_window",
        lambda w: KVCacheManager(16, sliding_window=1),
    ),
    mgr("unknown request id", "free(99)", UnknownRequestError, "99", lambda w: w.obj.free(99)),
    mgr(
        "extend a request that holds no slots",
        "extend([1, 2], [5, 6], [1, 1])",
        InvalidInputError,
        "request 2 holds no slots",
        lambda w: w.obj.extend([1, 2], [5, 6], [1, 1]),
    ),
    mgr(
        "extend by 0 tokens",
        "extend([1], [], [0])",
        InvalidInputError,
        "at least 1 token, got 0",
        lambda w: w.obj.extend([1], [], [0]),
    ),
    mgr(
        "extend: counts do not add up to the tokens",
        "extend([1, 1], [5, 6], [1, 2])",
        InvalidInputError,
        "the items extend by 3 tokens but 2 were given",
        lambda w: w.obj.extend([1, 1], [5, 6], [1, 2]),
    ),
    mgr(
        "extend: request_ids and counts of different lengths",
        "extend([1, 1], [5], [1])",
        InvalidInputError,
        "request_ids has 2 items but counts has 1",
        lambda w: w.obj.extend([1, 1], [5], [1]),
    ),
    mgr(
        "extend an unknown request",
        "extend([99], [5], [1])",
        UnknownRequestError,
        "99",
        lambda w: w.obj.extend([99], [5], [1]),
    ),
    mgr(
        "unknown request id (lookup)",
        "get_computed_blocks(99)",
        UnknownRequestError,
        "99",
        lambda w: w.obj.get_computed_blocks(99),
    ),
    mgr(
        "negative request id",
        "free(-1)",
        InvalidInputError,
        "request_id must be an int in [0, 2**64), got -1",
        lambda w: w.obj.free(-1),
    ),
    mgr(
        "request id 2**64",
        "block_ids(2**64)",
        InvalidInputError,
        "request_id must be an int in [0, 2**64)",
        lambda w: w.obj.block_ids(2**64),
    ),
    mgr(
        "request id of wrong type",
        'free("1")',
        InvalidTypeError,
        "request_id must be an int, got str",
        lambda w: w.obj.free("1"),
    ),
    mgr(
        "duplicate request id",
        "add_request(1, [1, 2])",
        InvalidInputError,
        "request id 1 is already known",
        lambda w: w.obj.add_request(1, [1, 2]),
    ),
    mgr(
        "negative token",
        "append_tokens(1, [-1])",
        InvalidInputError,
        "tokens[0] = -1",
        lambda w: w.obj.append_tokens(1, [-1]),
    ),
    mgr(
        "float tokens",
        "add_request(3, np.array([1.5]))",
        InvalidTypeError,
        "dtype float64",
        lambda w: w.obj.add_request(3, np.array([1.5])),
    ),
    mgr(
        "negative num_new_tokens",
        "allocate_slots(2, -1)",
        InvalidInputError,
        "num_new_tokens must be >= 0",
        lambda w: w.obj.allocate_slots(2, -1),
    ),
    mgr(
        "hit blocks after the first allocation",
        "allocate_slots(1, 0, 4, [1])",
        InvalidInputError,
        "already holds slots",
        lambda w: w.obj.allocate_slots(1, 0, 4, [1]),
    ),
    mgr(
        "extra keys of an unhashable kind",
        "add_request(3, [1]*8, extra_keys=[(1.5,)])",
        UnsupportedHashInputError,
        "extra_keys[0][0]: unsupported type float",
        lambda w: w.obj.add_request(3, [1] * 8, extra_keys=[(1.5,)]),
    ),
    mgr(
        "extra keys not a tuple",
        "add_request(3, [1]*8, extra_keys=[[1]])",
        UnsupportedHashInputError,
        "must be None or a tuple, not list",
        lambda w: w.obj.add_request(3, [1] * 8, extra_keys=[[1]]),
    ),
    mgr(
        "block id out of range",
        "ref_cnt(16)",
        InvalidInputError,
        "block id 16 is out of range",
        lambda w: w.obj.ref_cnt(16),
    ),
    mgr(
        "lora name with a lone surrogate",
        'add_request(3, [1], lora_name="\\ud800")',
        InvalidInputError,
        "lora_name is not valid text",
        lambda w: w.obj.add_request(3, [1], lora_name="\ud800"),
    ),
    mgr(
        "seed with a lone surrogate",
        'KVCacheManager(4, seed="\\ud800")',
        InvalidInputError,
        "seed is not valid text",
        lambda w: KVCacheManager(4, seed="\ud800"),
    ),
    # ---------------- BlockHasher / hash_block_tokens ----------------
    hasher(
        "block size zero",
        "BlockHasher(0)",
        InvalidInputError,
        "block_size",
        lambda w: BlockHasher(0),
    ),
    hasher(
        "unknown algorithm",
        'BlockHasher(4, "md5")',
        InvalidInputError,
        "md5",
        lambda w: BlockHasher(4, "md5"),
    ),
    hasher(
        "block of the wrong length",
        "hash_block(None, [1, 2, 3])",
        InvalidInputError,
        "a block holds exactly 4 tokens, got 3",
        lambda w: w.obj.hash_block(None, [1, 2, 3]),
    ),
    hasher(
        "parent of wrong length",
        "hash_block(b'x' * 33, [1, 2, 3, 4])",
        InvalidInputError,
        "parent hash has 33 bytes",
        lambda w: w.obj.hash_block(b"x" * 33, [1, 2, 3, 4]),
    ),
    hasher(
        "parent of wrong type",
        "hash_block('p', [1, 2, 3, 4])",
        InvalidTypeError,
        "parent must be bytes or None, not str",
        lambda w: w.obj.hash_block("p", [1, 2, 3, 4]),
    ),
    hasher(
        "too few extra keys",
        "hash_blocks([1]*8, extra_keys=[None])",
        InvalidInputError,
        "extra_keys has 1 entries but there are 2 full blocks",
        lambda w: w.obj.hash_blocks([1] * 8, extra_keys=[None]),
    ),
    hasher(
        "float extra key",
        "hash_block(None, [1, 2, 3, 4], (1.5,))",
        UnsupportedHashInputError,
        "unsupported type float",
        lambda w: w.obj.hash_block(None, [1, 2, 3, 4], (1.5,)),
    ),
    hasher(
        "NaN extra key",
        "hash_block(None, [1, 2, 3, 4], (nan,))",
        UnsupportedHashInputError,
        "unsupported type float",
        lambda w: w.obj.hash_block(None, [1, 2, 3, 4], (math.nan,)),
    ),
    hasher(
        "dict extra key",
        "hash_block(None, [1, 2, 3, 4], ({},))",
        UnsupportedHashInputError,
        "unsupported type dict",
        lambda w: w.obj.hash_block(None, [1, 2, 3, 4], ({},)),
    ),
    hasher(
        "extra keys nested too deep",
        "hash_block(None, [1]*4, ((((...)))))",
        UnsupportedHashInputError,
        "extra_keys[0][0][0]",
        lambda w: w.obj.hash_block(None, [1, 2, 3, 4], nested(10_000)),
    ),
    hasher(
        "negative token",
        "hash_blocks([1, -2, 3, 4])",
        InvalidInputError,
        "tokens[1] = -2",
        lambda w: w.obj.hash_blocks([1, -2, 3, 4]),
    ),
    hasher(
        "unknown algorithm (function)",
        'hash_block_tokens("md5", None, [1])',
        InvalidInputError,
        "md5",
        lambda w: hash_block_tokens("md5", None, [1]),
    ),
    hasher(
        "str tokens (function)",
        'hash_block_tokens("sha256", None, "ab")',
        InvalidTypeError,
        "not str",
        lambda w: hash_block_tokens("sha256", None, "ab"),
    ),
    hasher(
        "seed with a lone surrogate",
        'BlockHasher(4, seed="\\ud800")',
        InvalidInputError,
        "seed is not valid text",
        lambda w: BlockHasher(4, seed="\ud800"),
    ),
    hasher(
        "algorithm name with a lone surrogate",
        'BlockHasher(4, "\\ud800")',
        InvalidInputError,
        "algo is not valid text",
        lambda w: BlockHasher(4, "\ud800"),
    ),
    # ---------------- BlockTrie ----------------
    trie("no blocks", "BlockTrie(0)", InvalidInputError, "num_blocks", lambda w: BlockTrie(0)),
    trie(
        "enable_partial_reuse not a bool",
        "BlockTrie(16, enable_partial_reuse=None)",
        InvalidTypeError,
        "enable_partial_reuse must be a bool, got NoneType",
        lambda w: BlockTrie(16, enable_partial_reuse=None),
    ),
    trie(
        "take_events compact not a bool",
        'take_events(compact="yes")',
        InvalidTypeError,
        "compact must be a bool, got str",
        lambda w: w.obj.take_events(compact="yes"),
    ),
    trie(
        "tokens_per_block zero",
        "BlockTrie(16, tokens_per_block=0)",
        InvalidInputError,
        "tokens_per_block",
        lambda w: BlockTrie(16, tokens_per_block=0),
    ),
    trie(
        "negative host tier",
        "BlockTrie(16, host_blocks=-1)",
        InvalidInputError,
        "host_blocks must be >= 0",
        lambda w: BlockTrie(16, host_blocks=-1),
    ),
    trie(
        "host tier beyond the block ids",
        "BlockTrie(16, host_blocks=2**32)",
        InvalidInputError,
        "num_blocks + host_blocks must be < 2**32 - 1",
        lambda w: BlockTrie(16, host_blocks=2**32),
    ),
    trie(
        "offload priority above the maximum",
        "BlockTrie(16, host_blocks=4, secondary_offload_min_priority=101)",
        InvalidInputError,
        "secondary_offload_min_priority must be an int in [0, 100], got 101",
        lambda w: BlockTrie(16, host_blocks=4, secondary_offload_min_priority=101),
    ),
    trie(
        "unknown request id", "release(99)", UnknownRequestError, "99", lambda w: w.obj.release(99)
    ),
    trie(
        "duplicate request id",
        "claim(1, [1, 2])",
        InvalidInputError,
        "request 1 already holds blocks",
        lambda w: w.obj.claim(1, [1, 2]),
    ),
    trie(
        "negative request id",
        "complete(-1)",
        InvalidInputError,
        "request_id must be an int in [0, 2**64), got -1",
        lambda w: w.obj.complete(-1),
    ),
    trie(
        "capacity exhausted",
        "claim(2, range(100))",
        OutOfBlocksError,
        "cannot get 25 blocks",
        lambda w: w.obj.claim(2, list(range(100))),
    ),
    trie(
        "empty prompt",
        "claim(2, [])",
        InvalidInputError,
        "tokens must not be empty",
        lambda w: w.obj.claim(2, []),
    ),
    trie(
        "negative token",
        "lookup([1, -1])",
        InvalidInputError,
        "tokens[1] = -1",
        lambda w: w.obj.lookup([1, -1]),
    ),
    trie(
        "store more tokens than the request has",
        "store(1, range(50))",
        InvalidInputError,
        "call extend first",
        lambda w: w.obj.store(1, list(range(50))),
    ),
    trie(
        "negative extend",
        "extend(1, -1)",
        InvalidInputError,
        "num_tokens must be >= 0",
        lambda w: w.obj.extend(1, -1),
    ),
    trie(
        "negative clock advance",
        "advance_clock(-1)",
        InvalidInputError,
        "ticks must be >= 0",
        lambda w: w.obj.advance_clock(-1),
    ),
    trie(
        "malformed multimodal item",
        "lookup([1, 2], mm_items=[(1,)])",
        InvalidTypeError,
        "mm_items[0] must be a (hash: bytes | str, start: int, length: int) tuple",
        lambda w: w.obj.lookup([1, 2], mm_items=[(1,)]),
    ),
    trie(
        "request id 2**64",
        "release(2**64)",
        InvalidInputError,
        "request_id must be an int in [0, 2**64)",
        lambda w: w.obj.release(2**64),
    ),
    trie(
        "priority above the maximum",
        "claim(2, [1, 2], priority=101)",
        InvalidInputError,
        "priority must be an int in [0, 100], got 101",
        lambda w: w.obj.claim(2, [1, 2], priority=101),
    ),
    trie(
        "retention beyond int64",
        "claim(2, [1, 2], retention=2**100)",
        InvalidInputError,
        "retention must be an int in [0, 2**63)",
        lambda w: w.obj.claim(2, [1, 2], retention=2**100),
    ),
    trie(
        "multimodal hash with a lone surrogate",
        'lookup([1, 2], mm_items=[("\\ud800", 0, 1)])',
        InvalidInputError,
        "mm_items[0] hash is not valid text",
        lambda w: w.obj.lookup([1, 2], mm_items=[("\ud800", 0, 1)]),
    ),
    trie(
        "multimodal items not a sequence",
        "lookup([1, 2], mm_items=5)",
        InvalidTypeError,
        "mm_items must be None or a sequence of (hash, start, length) tuples, got int",
        lambda w: w.obj.lookup([1, 2], mm_items=5),
    ),
    trie(
        "salt with a lone surrogate",
        'lookup([1, 2], cache_salt="\\ud800")',
        InvalidInputError,
        "cache_salt is not valid text",
        lambda w: w.obj.lookup([1, 2], cache_salt="\ud800"),
    ),
    # ---------------- KvIndex ----------------
    kv(
        "ttl zero",
        "KvIndex(ttl=0)",
        InvalidInputError,
        "ttl must be a positive",
        lambda w: KvIndex(ttl=0),
    ),
    kv(
        "ttl not a number",
        'KvIndex(ttl="10")',
        InvalidTypeError,
        "ttl must be None or a number of seconds, got str",
        lambda w: KvIndex(ttl="10"),
    ),
    kv(
        "include_unhealthy not a bool",
        'top_k([1], 2, include_unhealthy="yes")',
        InvalidTypeError,
        "include_unhealthy must be a bool, got str",
        lambda w: w.obj.top_k([1], 2, include_unhealthy="yes"),
    ),
    kv(
        "hash width outside 8..32",
        "KvIndex(hash_bytes=7)",
        InvalidInputError,
        "hash_bytes must be between 8 and 32",
        lambda w: KvIndex(hash_bytes=7),
    ),
    kv(
        "message of two frames",
        "apply_frames(w, [seq, payload])",
        InvalidEventError,
        "3 frames (topic, seq, payload), got 2",
        lambda w: w.obj.apply_frames("a", kv_frames(1, [])[1:]),
    ),
    kv(
        "sequence frame of 4 bytes",
        "apply_frames(w, [topic, seq (4 bytes), payload])",
        InvalidEventError,
        "sequence frame has 4 bytes",
        lambda w: w.obj.apply_frames("a", kv_frames(1, [], seq_bytes=4)),
    ),
    kv(
        "truncated msgpack",
        "apply_frames(w, [topic, seq, payload[:-1]])",
        InvalidEventError,
        "truncated",
        lambda w: w.obj.apply_frames(
            "a",
            [
                *kv_frames(1, [])[:2],
                kv_frames(1, [{"type": "BlockStored", "block_hashes": [3], "block_size": 4}])[2][
                    :-1
                ],
            ],
        ),
    ),
    kv(
        "unknown event tag",
        'apply_frames(w, [..., [ts, [{"type": "Zap"}], 0]])',
        InvalidEventError,
        "unknown event type",
        lambda w: w.obj.apply_frames(
            "a",
            kv_frames(
                1, [{"type": "BlockStored", "block_hashes": [3], "block_size": 4}, {"type": "Zap"}]
            ),
        ),
    ),
    kv(
        "block hash as str",
        "apply_frames(w, [..., block_hashes=['7']])",
        InvalidEventError,
        "a block hash must be an int or bytes, got str",
        lambda w: w.obj.apply_frames(
            "a", kv_frames(1, [{"type": "BlockRemoved", "block_hashes": ["7"]}])
        ),
    ),
    kv(
        "block hash of 7 bytes",
        "apply_frames(w, [..., block_hashes=[b'1234567']])",
        InvalidEventError,
        "a block hash of 7 bytes, expected 32",
        lambda w: w.obj.apply_frames(
            "a", kv_frames(1, [{"type": "BlockRemoved", "block_hashes": [b"1234567"]}])
        ),
    ),
    kv(
        "negative block hash",
        "apply_frames(w, [..., block_hashes=[-1]])",
        InvalidEventError,
        "is out of range",
        lambda w: w.obj.apply_frames(
            "a", kv_frames(1, [{"type": "BlockRemoved", "block_hashes": [-1]}])
        ),
    ),
    kv(
        "block_size negative",
        "apply(w, [BlockStored(block_size=-1)])",
        InvalidEventError,
        "block_size must be in [0, 2**32)",
        lambda w: w.obj.apply(
            "a", [{"type": "BlockStored", "block_hashes": [3], "block_size": -1}]
        ),
    ),
    kv(
        "missing block_hashes",
        'apply(w, [{"type": "BlockRemoved"}])',
        InvalidEventError,
        "BlockRemoved without block_hashes",
        lambda w: w.obj.apply("a", [{"type": "BlockRemoved"}]),
    ),
    kv(
        "lora_id as str",
        "apply(w, [BlockStored(lora_id='x')])",
        InvalidEventError,
        "lora_id must be an int or None, got str",
        lambda w: w.obj.apply(
            "a", [{"type": "BlockStored", "block_hashes": [3], "block_size": 4, "lora_id": "x"}]
        ),
    ),
    kv(
        "event of an unknown class",
        "apply(w, [object()])",
        InvalidEventError,
        "unknown event type",
        lambda w: w.obj.apply("a", [object()]),
    ),
    kv(
        "negative sequence number",
        "apply(w, [], seq=-1)",
        InvalidInputError,
        "seq must be >= 0",
        lambda w: w.obj.apply("a", [], seq=-1),
    ),
    kv(
        "sequence number as a float",
        "apply(w, [], seq=1.5)",
        InvalidTypeError,
        "seq must be an int, got float",
        lambda w: w.obj.apply("a", [], seq=1.5),
    ),
    kv(
        "resync point beyond 2**63",
        "reset_worker(w, 2**63)",
        InvalidInputError,
        "next_seq must be an int in [0, 2**63)",
        lambda w: w.obj.reset_worker("a", 2**63),
    ),
    kv(
        "time not a number",
        'apply(w, [], now="x")',
        InvalidTypeError,
        "now must be a number, got str",
        lambda w: w.obj.apply("a", [], now="x"),
    ),
    kv(
        "time not finite",
        'longest_prefix([1], now=float("inf"))',
        InvalidInputError,
        "now must be a finite time, got inf",
        lambda w: w.obj.longest_prefix([1], now=float("inf")),
    ),
    kv(
        "query hashes as a 2-D array",
        "longest_prefix(np.array([[1, 2]], dtype=np.uint64))",
        InvalidInputError,
        "hashes: a numpy array must be 1-D, got shape (1, 2)",
        lambda w: w.obj.longest_prefix(np.array([[1, 2]], dtype=np.uint64)),
    ),
    kv(
        "query hashes as a float array",
        "longest_prefix(np.array([1.0]))",
        InvalidTypeError,
        "hashes: a numpy array must have an integer dtype, got float64",
        lambda w: w.obj.longest_prefix(np.array([1.0])),
    ),
    kv(
        "query hashes as a set",
        "longest_prefix({1, 2})",
        InvalidTypeError,
        "hashes must be a sequence of block hashes, got set",
        lambda w: w.obj.longest_prefix({1, 2}),
    ),
    kv(
        "time as a bool",
        "longest_prefix([1], now=True)",
        InvalidTypeError,
        "now must be a number, got bool",
        lambda w: w.obj.longest_prefix([1], now=True),
    ),
    kv(
        "time beyond a float",
        'status("a", now=10**400)',
        InvalidInputError,
        "now must be a finite time",
        lambda w: w.obj.status("a", now=10**400),
    ),
    kv(
        "medium weight as a bool",
        'top_k([1], weights={"GPU": True})',
        InvalidTypeError,
        'weights["GPU"] must be a number, got bool',
        lambda w: w.obj.top_k([1], weights={"GPU": True}),
    ),
    kv(
        "negative k",
        "top_k([1], k=-1)",
        InvalidInputError,
        "k must be >= 0, got -1",
        lambda w: w.obj.top_k([1], k=-1),
    ),
    kv(
        "query hash 2**64",
        "longest_prefix([2**64])",
        InvalidInputError,
        "out of range",
        lambda w: w.obj.longest_prefix([2**64]),
    ),
    kv(
        "query by tokens without a hasher",
        "longest_prefix(tokens=[1, 2])",
        InvalidInputError,
        "give either hashes, or tokens together with a hasher",
        lambda w: w.obj.longest_prefix(tokens=[1, 2]),
    ),
    kv(
        "negative medium weight",
        'longest_prefix([1], weights={"CPU": -1})',
        InvalidInputError,
        "must be a finite number >= 0",
        lambda w: w.obj.longest_prefix([1], weights={"CPU": -1}),
    ),
    kv(
        "unknown worker",
        'remove_worker("zz")',
        UnknownWorkerError,
        'unknown worker "zz"',
        lambda w: w.obj.remove_worker("zz"),
    ),
    kv(
        "status of an unknown worker",
        'status("zz")',
        UnknownWorkerError,
        "unknown worker",
        lambda w: w.obj.status("zz"),
    ),
    kv(
        "block hash as bool",
        "apply(w, [BlockStored(block_hashes=[True])])",
        InvalidEventError,
        "a block hash must be an int or bytes, got bool",
        lambda w: w.obj.apply(
            "a", [{"type": "BlockStored", "block_hashes": [True], "block_size": 4}]
        ),
    ),
    kv(
        "query hash whose __index__ returns itself",
        "longest_prefix([x])",
        InvalidInputError,
        "a block hash must be an int or bytes, got SelfIndex",
        lambda w: w.obj.longest_prefix([SelfIndex()]),
    ),
    kv(
        "worker name with a lone surrogate",
        'add_worker("\\ud800")',
        InvalidInputError,
        "worker is not valid text",
        lambda w: w.obj.add_worker("\ud800"),
    ),
    kv(
        "medium weight named with a lone surrogate",
        'longest_prefix([1], weights={"\\ud800": 1.0})',
        InvalidInputError,
        "weights: a medium name is not valid text",
        lambda w: w.obj.longest_prefix([1], weights={"\ud800": 1.0}),
    ),
    # ---------------- trace readers ----------------
    trace("not JSON", '{"id": 1,\n', TraceFormatError, ":1: not valid JSON"),
    trace(
        "not an object (line 2)",
        '{"id": 1, "arrival": 0, "prompt": [1], "output_len": 1}\n[1, 2]\n',
        TraceFormatError,
        ":2: expected a JSON object",
    ),
    trace(
        "missing prompt",
        '{"id": 1, "arrival": 0, "output_len": 1}\n',
        TraceFormatError,
        ":1: missing field 'prompt'",
    ),
    trace(
        "negative token",
        '{"id": 1, "arrival": 0, "prompt": [-1], "output_len": 1}\n',
        TraceFormatError,
        ":1: field 'prompt'[0] = -1",
    ),
    trace(
        "output beyond 2**40 tokens",
        '{"id": 1, "arrival": 0, "prompt": [1], "output_len": 100000000000000}\n',
        TraceFormatError,
        ":1: field 'output_len' must be <= 1,099,511,627,776",
    ),
    trace(
        "token 2**32",
        '{"id": 1, "arrival": 0, "prompt": [4294967296], "output_len": 1}\n',
        TraceFormatError,
        "is not a token id",
    ),
    trace(
        "float token",
        '{"id": 1, "arrival": 0, "prompt": [1.5], "output_len": 1}\n',
        TraceFormatError,
        "is not an integer",
    ),
    trace(
        "both output and output_len",
        '{"id": 1, "arrival": 0, "prompt": [1], "output": [2], "output_len": 1}\n',
        TraceFormatError,
        "exactly one of 'output' and 'output_len'",
    ),
    trace(
        "negative arrival",
        '{"id": 1, "arrival": -1, "prompt": [1], "output_len": 1}\n',
        TraceFormatError,
        "'arrival'",
    ),
    trace(
        "NaN arrival",
        '{"id": 1, "arrival": NaN, "prompt": [1], "output_len": 1}\n',
        TraceFormatError,
        "'arrival'",
    ),
    trace(
        "arrival past the limit",
        '{"id": 1, "arrival": 1e11, "prompt": [1], "output_len": 1}\n',
        TraceFormatError,
        "field 'arrival' must be <= 1e+10",
    ),
    trace(
        "Mooncake timestamp past the limit",
        '{"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n',
        TraceFormatError,
        "field 'timestamp' must be <= 1e+13",
        read_mooncake,
    ),
    trace(
        "duplicate id",
        '{"id": 1, "arrival": 0, "prompt": [1], "output_len": 1}\n'
        '{"id": 1, "arrival": 0, "prompt": [1], "output_len": 1}\n',
        TraceFormatError,
        ":2: duplicate id",
    ),
    trace(
        "unknown field",
        '{"id": 1, "arrival": 0, "prompt": [1], "output_len": 1, "x": 0}\n',
        TraceFormatError,
        "unknown field",
    ),
    trace(
        "Mooncake: missing hash_ids",
        '{"timestamp": 0, "input_length": 10, "output_length": 1}\n',
        TraceFormatError,
        ":1:",
        reader=read_mooncake,
    ),
    trace(
        "Mooncake: negative hash id",
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}\n',
        TraceFormatError,
        "'hash_ids' must hold integers",
        reader=read_mooncake,
    ),
    trace(
        "lone surrogate in cache_salt",
        '{"id": 1, "arrival": 0, "prompt": [1], "output_len": 1, "cache_salt": "\\ud800"}\n',
        TraceFormatError,
        "not valid Unicode",
    ),
    trace(
        "Mooncake: negative input_length",
        '{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": [1]}\n',
        TraceFormatError,
        "'input_length' must be >= ",
        reader=read_mooncake,
    ),
    # ---------------- simulator Request ----------------
    request(
        "negative length of a lazy output",
        "Request(0, prompt, lambda: ..., output_len=-5)",
        InvalidInputError,
        "output_len must be >= 0, got -5",
        output_len=-5,
    ),
    request(
        "float length of a lazy output",
        "Request(0, prompt, lambda: ..., output_len=2.5)",
        InvalidTypeError,
        "output_len must be an int, got float",
        output_len=2.5,
    ),
    request(
        "negative prompt length",
        "Request(0, prompt, lambda: ..., prompt_len=-1, output_len=1)",
        InvalidInputError,
        "prompt_len must be >= 0, got -1",
        prompt_len=-1,
        output_len=1,
    ),
    # ---------------- CLI ----------------
    cmd("unknown command", ["frobnicate"], "invalid choice"),
    cmd("unknown option", ["replay", "workload:A", "--bogus"], "unrecognized arguments"),
    cmd("bad capacity", ["replay", "workload:A", "--capacity", "lots"], "bad capacity"),
    cmd("negative capacity", ["replay", "workload:A", "--capacity", "-5"], "capacity"),
    cmd("unknown policy", ["replay", "workload:A", "--policies", "nope"], "nope"),
    cmd("missing trace file", ["replay", "/nonexistent/trace.jsonl"], "error"),
    cmd("unknown workload", ["replay", "workload:Z"], "Z"),
    cmd("sweep without capacities", ["sweep", "workload:A"], "--capacities"),
    cmd("non-integer seed", ["compare", "--seed", "x"], "--seed"),
    cmd("zero capacity", ["replay", "workload:A", "--capacity", "0"], "at least 1 token"),
    cmd("capacity in bytes", ["replay", "workload:A", "--capacity", "3MB"], "not bytes"),
    cmd("zero max-running", ["compare", "--max-running", "0"], "--max-running"),
    cmd(
        "max-running in the sequence model",
        ["replay", "workload:A", "--model", "sequence", "--max-running", "4"],
        "--max-running applies to --model slots and time, not sequence",
    ),
    cmd(
        "a time-model flag in another model",
        ["replay", "workload:A", "--no-preemption"],
        "--no-preemption applies to --model time only, not slots",
    ),
    cmd(
        "a model other than time in a fleet replay",
        ["replay", "workload:F", "--instances", "2", "--capacity", "16k", "--model", "slots"],
        "--model slots does not apply: a fleet replay runs the time model",
    ),
    cmd("negative block size", ["trace-stats", "workload:A", "--block-size=-5"], "--block-size"),
    cmd(
        "capacity above the largest",
        ["replay", "workload:A", "--capacity", "1e16"],
        "at most 1e+15 tokens",
    ),
    cmd(
        "capacity with a huge exponent",
        ["replay", "workload:A", "--capacity", "1e999999999"],
        "too long a number",
    ),
    cmd(
        "capacity beyond a block pool",
        ["replay", "workload:A", "--capacity", "1e14", "--policies", "vllm-blocks"],
        "capacity of 100000000000000 tokens (6250000000000 blocks of 16): num_blocks must be",
    ),
    cmd(
        "a capacity given twice",
        ["sweep", "workload:A", "--capacities", "1k,1000"],
        "(1000 tokens) is given twice",
    ),
    cmd(
        "an empty capacity in a list",
        ["sweep", "workload:A", "--capacities", "1k,,2k"],
        "an empty item",
    ),
    cmd(
        "an empty offload item",
        [*TIER_RUN, "--offload", "lru,"],
        "an empty item",
    ),
    cmd(
        "an empty policy in a list",
        ["replay", "workload:A", "--policies", "radix,,vllm-blocks"],
        "an empty item",
    ),
    cmd(
        "capacity too long a number",
        ["replay", "workload:A", "--capacity", "1" * 101],
        "too long a number",
    ),
    cmd(
        "policy given twice",
        ["replay", "workload:A", "--policies", "radix,radix"],
        "radix is given twice",
    ),
    cmd(
        "negative prefill cost",
        ["compare", "--prefill-ms-per-token", "-1000"],
        "number of ms in [0, 1e+09]",
    ),
    cmd("NaN decode step", ["compare", "--decode-step-ms", "nan"], "number of ms in"),
    cmd(
        "decode step that overflows the clock",
        ["compare", "--decode-step-ms", "1e308"],
        "number of ms in [0, 1e+09]",
    ),
    cmd(
        "a decode step of zero (the clock would not advance)",
        ["replay", "workload:A", "--model", "time", "--decode-step-ms", "0"],
        "number of ms in (0, 1e+09]",
    ),
    cmd(
        "output directory missing", ["compare", "--json", "/nonexistent/out.json"], "does not exist"
    ),
    cmd(
        "--format for a built-in workload",
        ["replay", "workload:D", "--format", "mooncake"],
        "applies to trace files",
    ),
    cmd(
        "fleet of zero instances",
        ["replay", "workload:F", "--instances", "0"],
        "instance counts must be >= 1",
    ),
    cmd(
        "unknown router",
        ["replay", "workload:F", "--instances", "2", "--router", "fastest"],
        "unknown router 'fastest'",
    ),
    cmd(
        "fleet with two policies",
        ["replay", "workload:F", "--instances", "2", "--policies", "radix,vllm-blocks"],
        "one policy",
    ),
    cmd(
        "an empty trace of a given format",
        ["replay", "/dev/null", "--format", "tokens"],
        "/dev/null: the trace is empty",
    ),
    cmd(
        "fleet of the offline optimum",
        ["replay", "workload:F", "--instances", "2", "--capacity", "16k", "--policies", "opt"],
        "a fleet replay cannot run opt",
    ),
    cmd(
        "event loss above 1",
        [
            "replay",
            "workload:F",
            "--instances",
            "2",
            "--router",
            "cache-aware",
            "--event-loss",
            "2",
        ],
        "event loss must be in [0, 1]",
    ),
    cmd(
        "cache-aware router on instances without KV events",
        [
            "replay",
            "workload:F",
            "--instances",
            "2",
            "--policies",
            "lab-lru",
            "--router",
            "cache-aware",
        ],
        "does not publish KV events",
    ),
    cmd(
        "fleet replay without a capacity",
        ["replay", "workload:F", "--instances", "2", "--capacity", "x"],
        "bad capacity",
    ),
    cmd(
        "--offload without a host tier",
        ["replay", "workload:F", "--offload", "lru"],
        "needs a host tier: --cpu-capacity > 0",
    ),
    cmd(
        "an offload policy another engine's",
        ["replay", "workload:F", "--cpu-capacity", "1M", "--offload", "lru"],
        "'lru' does not apply to radix",
    ),
    cmd(
        "--offload for a policy not in the run",
        ["replay", "workload:F", "--cpu-capacity", "1M", "--offload", "trtllm=host"],
        "'trtllm' is not a policy of this run",
    ),
    cmd(
        "a trie host tier smaller than one block",
        ["replay", "workload:F", "--cpu-capacity", "10", "--policies", "trtllm"],
        "trtllm: cpu_capacity 10 is less than one 64-token block",
    ),
    cmd(
        "a host tier for a policy without one",
        ["replay", "workload:F", "--cpu-capacity", "1M", "--policies", "lab-lru"],
        "'lab-lru' has no host tier",
    ),
    cmd(
        "both host capacity forms",
        [
            "sweep",
            "workload:F",
            "--capacities",
            "16k",
            "--cpu-capacity",
            "1M",
            "--cpu-capacities",
            "0,1M",
        ],
        "--cpu-capacity or --cpu-capacities, not both",
    ),
    cmd(
        "a zero host bandwidth",
        ["replay", "workload:F", "--host-bandwidth", "0"],
        "expected a bandwidth in GB/s > 0",
    ),
    cmd(
        "a router list naming no router",
        ["replay", "workload:F", "--capacity", "16k", "--instances", "2", "--router", ","],
        "--router ',' names no router",
    ),
    cmd(
        "a block size beyond 2**20",
        ["trace-stats", "workload:A", "--block-size", "9223372036854775807"],
        "expected a block size of at most 2**20",
    ),
    cmd(
        "a fleet flag without --instances",
        ["replay", "workload:F", "--router", "cache-aware"],
        "--router applies to a fleet replay only (--instances N)",
    ),
    cmd(
        "a router flag no listed router reads",
        ["replay", "workload:F", "--instances", "2", "--event-delay", "500"],
        "--event-delay applies to the cache-aware routers only, not round-robin",
    ),
    cmd(
        "a router named twice",
        ["replay", "workload:F", "--instances", "2", "--router", "random,random"],
        "router random given twice",
    ),
    cmd(
        "an option a fleet has no use for",
        ["replay", "workload:F", "--instances", "2", "--jobs", "2"],
        "--jobs does not apply to a fleet replay",
    ),
    cmd(
        "a fleet ceiling past a block pool",
        ["replay", "workload:F", "--instances", "2", "--capacity", "4e10"],
        "the ceiling run (N x --capacity, N x --cpu-capacity)",
    ),
    cmd(
        "a load cost flag without a host tier",
        ["replay", "workload:F", "--model", "time", "--kv-model", "llama-3.1-70b"],
        "--kv-model applies to --model time with a host tier",
    ),
]


def nested(depth: int) -> Any:
    key: Any = (1,)
    for _ in range(depth):
        key = (key,)
    return key


def row_id(row: Row) -> str:
    return f"{row.section.split()[0]}: {row.misuse}"


@pytest.mark.parametrize("row", CATALOGUE, ids=[row_id(r) for r in CATALOGUE])
def test_catalogue_row(row: Row, tmp_path: Path) -> None:
    world = WORLDS[row.section](tmp_path)
    before = world.state()
    with pytest.raises(BaseException) as info:
        row.run(world)
    err = info.value
    assert type(err).__name__ != "PanicException", f"a Rust panic reached Python: {err}"
    assert isinstance(err, row.exc), f"{type(err).__name__}: {err}"
    assert row.fragment in str(err), str(err)
    assert world.state() == before, "a failed call changed the object"


def test_catalogue_ids_are_unique() -> None:
    ids = [row_id(r) for r in CATALOGUE]
    assert len(ids) == len(set(ids))


def exception_name(row: Row) -> str:
    return "exit status 2" if row.exc is CliExit else row.exc.__name__


def render() -> str:
    out = [
        "# Errors: the bad-input catalogue",
        "",
        "Every misuse of the public API that prefixcache knows about, and what it raises.",
        "Generated from `CATALOGUE` in `tests/test_errors_catalogue.py` (run",
        "`python tests/test_errors_catalogue.py` after editing it); the test suite walks",
        "every row, checks the exception class and message, and checks that the object the",
        "call was made on is unchanged (`dump()`, sizes, free block ids, reference counts,",
        "stats, requests). All classes are in `prefixcache.errors` and derive from",
        "`PrefixCacheError` and from the builtin named in their docstring; a plain",
        "`TypeError` comes from Python's own argument parsing (wrong type for a typed",
        "parameter). `TraceFormatError` (`prefixcache.sim.traces`) is an `InvalidInputError`",
        "whose message starts with `path:line:`. The CLI prints one `error: ...` line on",
        "stderr and exits with status 2.",
        "",
        "One contract for every class (`rust/prefixcache-py/src/convert.rs`):",
        "",
        "- Integer arguments are ints (or objects with `__index__`, e.g. numpy integers);",
        "  floats and bools raise `InvalidTypeError`. Each argument has a range (counts and",
        "  sizes `[0, 2**63)`, request ids `[0, 2**64)` in every class, priorities and",
        "  other signed values `[-2**63, 2**63)`, block and group ids `[0, 2**32)`); a value",
        "  outside it, however large, raises `InvalidInputError` naming the argument and the",
        "  range. Nothing is clamped (`evict(10**30)` raises: evict `total_size()` instead).",
        "- Token ids and KV indices are read from lists, tuples, `array.array`, numpy",
        "  arrays (any integer dtype, alignment, byte order, stride), `memoryview`, objects",
        "  with `__array_interface__` or `__dlpack__` (CPU), other sequences, or a",
        "  `TokenBuffer`; every form gives what the equivalent list gives. Sets, dicts, str",
        "  and bytes raise `InvalidTypeError`; arrays that are not 1-dimensional raise",
        "  `InvalidInputError`. The memory an `__array_interface__` or a `__dlpack__`",
        "  method describes is copied through the kernel before it is read: a pointer,",
        "  length or stride that leaves the memory the process can read raises",
        "  `InvalidInputError` instead of crashing the process.",
        "- A str argument with lone surrogates (not encodable as UTF-8) raises",
        "  `InvalidInputError` (hashed extra keys: `UnsupportedHashInputError`).",
        "",
        "No Rust panic reaches Python: `tests/test_no_panic.py` calls every public",
        "function and method of `prefixcache._core` with hostile arguments and checks that",
        "every failure is a `PrefixCacheError` or a `TypeError`.",
        "",
    ]
    sections = list(dict.fromkeys(r.section for r in CATALOGUE))
    for section in sections:
        out += [
            f"## {section}",
            "",
            "| misuse | call | raises | message contains |",
            "|---|---|---|---|",
        ]
        for r in CATALOGUE:
            if r.section == section:
                call = r.call.replace("|", "\\|")
                frag = f"`{r.fragment}`" if r.fragment else ""
                out.append(f"| {r.misuse} | `{call}` | `{exception_name(r)}` | {frag} |")
        out.append("")
    out.append(f"{len(CATALOGUE)} rows.")
    return "\n".join(out) + "\n"


def test_errors_md_is_generated_from_the_catalogue() -> None:
    assert ERRORS_MD.read_text() == render(), (
        "docs/ERRORS.md is stale: run python tests/test_errors_catalogue.py"
    )


if __name__ == "__main__":
    ERRORS_MD.write_text(render())
    print(f"wrote {ERRORS_MD} ({len(CATALOGUE)} rows)", file=sys.stderr)
