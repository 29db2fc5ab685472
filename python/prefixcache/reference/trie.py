"""Plain-Python reference of TensorRT-LLM's block reuse (SEMANTICS.md section 3): the
executable specification that ``prefixcache.BlockTrie`` (the Rust core) is tested against.

Read off TensorRT-LLM (``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``,
``evictionPolicy.cpp``); docs/TRTLLM.md lists where prefixcache differs. In short:

- Block key = (LoRA id, cache salt, multimodal keys, tokens). Blocks match only when all
  non-token parts are equal; multimodal blocks never match partially.
- A prompt of n tokens takes ceil(n / tokens_per_block) context blocks; its first n - 1
  tokens are cut into keys (the last key possibly shorter).
- claim walks the trie from the root: a full block with the exact key is reused and the
  walk goes on. Otherwise the walk ends with a *partial* match when either a non-full
  block has the exact key (TensorRT-LLM treats that as partial too) or, with partial
  reuse enabled and no multimodal key, a child shares a token prefix: the longest common
  prefix wins, ties go to the smallest token sequence. Without copy-on-partial-reuse only
  unreferenced leaves are candidates of that prefix search. The matched block is taken
  over (it leaves the trie) when it is an unreferenced leaf, else copied into a fresh block
  and pinned until ``complete``.
- Fresh blocks are the first evictable block in (priority, release sequence, id) order;
  evictable = unreferenced and childless. Evicting a cached block removes it from the trie.
- Retention: a block freed with a duration and a non-default priority drops to priority 35
  (at the back of the queue) once the logical clock reaches release time + duration.
- store files the request's blocks under their keys from the root, stopping at the first
  key held by another block; its tokens must extend, or be a prefix of, what the request
  claimed or stored.
- Host tier (``host_blocks`` > 0; TensorRT-LLM's secondary level): blocks keep their ids
  and a ``host`` flag says which memory holds them; ``num_blocks`` are on the GPU and
  ``host_blocks`` in host memory at any time (host blocks start as ids ``num_blocks..``).
  GPU-evictable = unreferenced without GPU children; host-evictable = unreferenced and
  childless. A cached GPU victim of priority >= ``secondary_offload_min_priority`` is
  offloaded when a host block is evictable: it moves to host memory (keeping its priority,
  losing its retention, back of the queue) and the first host-evictable block (leaving the
  trie if cached) becomes the GPU block handed out. Otherwise a cached victim leaves the
  trie with its host descendants, children first. A claim onboards the host blocks it
  matched in block order: a GPU block taken as for an allocation swaps in and becomes an
  empty host block at the default priority, back of the queue.

Everything is a dict or a list scan: short and obviously correct, not fast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixcache.errors import (
    InvalidInputError,
    InvalidTypeError,
    OutOfBlocksError,
    UnknownRequestError,
)
from prefixcache.reference.int_args import (
    SIZE_MAX,
    U64_MAX,
    flag_arg,
    int_arg,
    opt_int_arg,
    opt_str_arg,
    request_id_arg,
    size_arg,
    str_arg,
    token_list,
)
from prefixcache.trie_events import TrieBlockMoved, TrieBlockRemoved, TrieBlockStored

DEFAULT_PRIORITY = 35
MAX_PRIORITY = 100
U32_MAX = 2**32 - 1
DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY = 30
STAT_NAMES = (
    "claims",
    "query_tokens",
    "matched_tokens",
    "reused_blocks",
    "partial_hits",
    "partial_tokens",
    "taken_over_blocks",
    "copies",
    "copied_tokens",
    "allocated_blocks",
    "evicted_blocks",
    "evicted_tokens",
    "stored_blocks",
)
HOST_STAT_NAMES = (
    "offloaded_blocks",
    "stored_tokens",
    "onboarded_blocks",
    "loaded_tokens",
    "host_evicted_blocks",
    "host_evicted_tokens",
    "peak_host_tokens",
)

Scope = tuple[int | None, str | None]
MmKey = tuple[bytes, int]
Key = tuple[Scope, tuple[MmKey, ...], tuple[int, ...]]

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


def _fnv(h: int, data: bytes) -> int:
    for x in data:
        h = ((h ^ x) * FNV_PRIME) & MASK64
    return h


def chain_hash(parent: int | None, key: Key) -> int:
    """The 64-bit block hash reported in events: FNV-1a over the parent hash (0 for a
    first block), the LoRA id, the salt, the multimodal keys and the tokens."""
    (lora, salt), mm, tokens = key
    h = _fnv(FNV_OFFSET, (parent or 0).to_bytes(8, "little"))
    h = _fnv(h, b"\0" if lora is None else b"\1" + lora.to_bytes(8, "little"))
    if salt is None:
        h = _fnv(h, b"\0")
    else:
        sb = salt.encode()
        h = _fnv(h, b"\1" + len(sb).to_bytes(4, "little") + sb)
    h = _fnv(h, len(mm).to_bytes(4, "little"))
    for hb, off in mm:
        h = _fnv(h, len(hb).to_bytes(4, "little") + hb + off.to_bytes(8, "little", signed=True))
    h = _fnv(h, len(tokens).to_bytes(4, "little"))
    for t in tokens:
        h = _fnv(h, t.to_bytes(4, "little"))
    return h


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class _Block:
    key: Key | None = None
    parent: int | None = None  # None: root (or not cached)
    children: dict[Key, int] = field(default_factory=dict)
    ref_cnt: int = 0
    priority: int = DEFAULT_PRIORITY
    duration: int | None = None
    expiry: int | None = None
    seq: int = 0
    hash: int = 0
    host: bool = False


@dataclass
class _Request:
    blocks: list[int]
    pins: list[int]
    tokens: list[int]
    scope: Scope
    mm: list[tuple[bytes, int, int]]


@dataclass(frozen=True)
class Claim:
    block_ids: list[int]
    num_matched_tokens: int
    num_reused_blocks: int
    partial: bool
    partial_tokens: int
    partial_kind: str | None
    partial_block: int | None
    copies: list[tuple[int, int, int]]
    num_host_blocks: int = 0
    num_host_tokens: int = 0


@dataclass(frozen=True)
class Lookup:
    num_matched_tokens: int
    num_reused_blocks: int
    partial: bool
    partial_tokens: int
    partial_kind: str | None
    partial_block: int | None
    num_host_blocks: int = 0
    num_host_tokens: int = 0


def _mm_items(items: Any) -> list[tuple[bytes, int, int]]:
    """The mm_items argument as the core reads it: None or any iterable of (hash: bytes |
    str, start, length) tuples."""
    out: list[tuple[bytes, int, int]] = []
    try:
        it = iter(() if items is None else items)
    except TypeError:
        raise InvalidTypeError(
            "mm_items must be None or a sequence of (hash, start, length) tuples, "
            f"got {type(items).__name__}"
        ) from None
    for i, item in enumerate(it):
        bad = f"mm_items[{i}] must be a (hash: bytes | str, start: int, length: int) tuple"
        if not isinstance(item, tuple) or len(item) != 3:
            raise InvalidTypeError(bad)
        h, start, length = item
        if isinstance(h, bytes):
            hb = bytes(h)
        elif isinstance(h, str):
            hb = str_arg(h, f"mm_items[{i}] hash").encode()
        else:
            raise InvalidTypeError(bad)
        start = size_arg(start, f"mm_items[{i}] start")
        out.append((hb, start, size_arg(length, f"mm_items[{i}] length")))
    return out


def _check_mm_items(mm: list[tuple[bytes, int, int]], n: int) -> None:
    for i, (_, start, length) in enumerate(mm):
        if length == 0 or start + length > n:
            raise InvalidInputError(f"mm_items[{i}] is empty or outside the prompt")


def _lora_id(v: object) -> int | None:
    return opt_int_arg(v, "lora_id", 0, SIZE_MAX)


class BlockTrie:
    """Same API as ``prefixcache.BlockTrie``."""

    def __init__(
        self,
        num_blocks: int,
        tokens_per_block: int | None = None,
        enable_partial_reuse: bool = True,
        copy_on_partial_reuse: bool = True,
        host_blocks: int | None = None,
        secondary_offload_min_priority: int | None = None,
        enable_events: bool = True,
    ) -> None:
        # In argument order, as the core reads them: the first bad one is named.
        num_blocks = size_arg(num_blocks, "num_blocks")
        if not 1 <= num_blocks < U32_MAX:  # block ids are u32 in the core
            raise InvalidInputError(f"num_blocks must be in [1, 2**32 - 1), got {num_blocks}")
        tpb = 64 if tokens_per_block is None else int_arg(tokens_per_block, "tokens_per_block", 1)
        enable_partial_reuse = flag_arg(enable_partial_reuse, "enable_partial_reuse")
        copy_on_partial_reuse = flag_arg(copy_on_partial_reuse, "copy_on_partial_reuse")
        host = 0 if host_blocks is None else size_arg(host_blocks, "host_blocks")
        min_pr = (
            DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY
            if secondary_offload_min_priority is None
            else int_arg(
                secondary_offload_min_priority, "secondary_offload_min_priority", 0, MAX_PRIORITY
            )
        )
        enable_events = flag_arg(enable_events, "enable_events")
        if num_blocks + host >= U32_MAX:  # block ids are u32 in the core
            raise InvalidInputError(
                f"num_blocks + host_blocks must be < 2**32 - 1, got {num_blocks} + {host}"
            )
        self.num_blocks = num_blocks
        self.host_blocks = host
        self._min_priority = min_pr
        self.tokens_per_block = tpb
        self.enable_partial_reuse = enable_partial_reuse
        self.copy_on_partial_reuse = copy_on_partial_reuse
        total = num_blocks + host
        self.blocks = [_Block(seq=i, host=i >= num_blocks) for i in range(total)]
        self.root_children: dict[Key, int] = {}
        self.requests: dict[int, _Request] = {}
        self.clock = 0
        self._seq = total
        self.events: list[Any] = []
        self.enable_events = enable_events
        self._stats = dict.fromkeys(STAT_NAMES, 0)
        self._host_stats = dict.fromkeys(HOST_STAT_NAMES, 0)

    # ----- inspection -------------------------------------------------------------------
    @property
    def secondary_offload_min_priority(self) -> int | None:
        return self._min_priority if self.host_blocks else None

    @property
    def num_free_blocks(self) -> int:
        return sum(b.ref_cnt == 0 and not b.host for b in self.blocks)

    @property
    def num_cached_blocks(self) -> int:
        return sum(b.key is not None and not b.host for b in self.blocks)

    @property
    def num_cached_tokens(self) -> int:
        return sum(len(b.key[2]) for b in self.blocks if b.key is not None and not b.host)

    @property
    def num_host_cached_blocks(self) -> int:
        return sum(b.key is not None and b.host for b in self.blocks)

    @property
    def num_host_cached_tokens(self) -> int:
        return sum(len(b.key[2]) for b in self.blocks if b.key is not None and b.host)

    def host_stats(self) -> dict[str, int]:
        return dict(self._host_stats)

    def host_dump(self) -> list[bool]:
        return [b.host for b in self.blocks]

    @property
    def num_tokens_left_gpu(self) -> int:
        return self._stats["evicted_tokens"] + self._host_stats["stored_tokens"]

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def take_events(self, compact: bool = False) -> list[Any]:
        compact = flag_arg(compact, "compact")
        ev, self.events = self.events, []
        if compact:
            ev = [
                dataclasses.replace(e, token_ids=None) if isinstance(e, TrieBlockStored) else e
                for e in ev
            ]
        return ev

    def _emit(self, event: Any) -> None:
        if self.enable_events:
            self.events.append(event)

    def request_blocks(self, request_id: int) -> list[int]:
        return list(self._request(request_id_arg(request_id)).blocks)

    def dump(self) -> list[dict[str, Any]]:
        out = []
        for i, b in enumerate(self.blocks):
            k = b.key
            out.append(
                {
                    "block_id": i,
                    "cached": k is not None,
                    "parent": b.parent if k is not None else None,
                    "tokens": list(k[2]) if k else [],
                    "lora_id": k[0][0] if k else None,
                    "cache_salt": k[0][1] if k else None,
                    "mm_keys": list(k[1]) if k else [],
                    "ref_cnt": b.ref_cnt,
                    "priority": b.priority,
                }
            )
        return out

    def check_invariants(self) -> None:
        return None

    # ----- keys -------------------------------------------------------------------------
    def _keys(self, tokens: list[int], scope: Scope, mm: list[tuple[bytes, int, int]]) -> list[Key]:
        tpb = self.tokens_per_block
        usable = tokens[: max(len(tokens) - 1, 0)]
        keys = []
        for b0 in range(0, len(usable), tpb):
            chunk = tuple(usable[b0 : b0 + tpb])
            b1 = b0 + len(chunk)
            mmk = tuple((h, s - b0) for h, s, n in mm if s < b1 and s + n > b0)
            keys.append((scope, mmk, chunk))
        return keys

    def _children(self, parent: int | None) -> dict[Key, int]:
        return self.root_children if parent is None else self.blocks[parent].children

    def _full(self, key: Key) -> bool:
        return len(key[2]) == self.tokens_per_block

    def _unref_leaf(self, b: int) -> bool:
        return self.blocks[b].ref_cnt == 0 and not self.blocks[b].children

    # ----- lookup -----------------------------------------------------------------------
    def _best_partial(self, parent: int | None, key: Key) -> tuple[int, int] | None:
        best: tuple[int, tuple[int, ...], int] | None = None  # (lcp, tokens, block)
        for k, c in self._children(parent).items():
            if k[0] != key[0] or k[1]:
                continue
            if not self.copy_on_partial_reuse and not self._unref_leaf(c):
                continue
            n = _lcp(k[2], key[2])
            if n == 0:
                continue
            if best is None or n > best[0] or (n == best[0] and k[2] < best[1]):
                best = (n, k[2], c)
        return None if best is None else (best[2], best[0])

    def _plan(
        self, keys: list[Key], n_ctx: int
    ) -> tuple[list[tuple[str, int, int]], int, int, int, int]:
        steps: list[tuple[str, int, int]] = []
        matched = reused = host_blocks = host_tokens = 0
        cur: int | None = None
        walking = True
        for i in range(n_ctx):
            key = keys[i] if i < len(keys) else None
            if not walking or key is None:
                steps.append(("fresh", -1, 0))
                walking = False
                continue
            walking = False
            found = self._children(cur).get(key)
            hit: tuple[int, int] | None = None
            if found is not None and self._full(key):
                steps.append(("reuse", found, 0))
                matched += len(key[2])
                reused += 1
                if self.blocks[found].host:
                    host_blocks += 1
                    host_tokens += len(key[2])
                cur, walking = found, True
                continue
            if found is not None:
                hit = (found, len(key[2]))
            elif self.enable_partial_reuse and not key[1]:
                hit = self._best_partial(cur, key)
            if hit is None:
                steps.append(("fresh", -1, 0))
            else:
                b, n = hit
                matched += n
                if self.blocks[b].host:
                    host_blocks += 1
                    host_tokens += n
                steps.append(("takeover" if self._unref_leaf(b) else "copy", b, n))
        return steps, matched, reused, host_blocks, host_tokens

    @staticmethod
    def _partial(steps: list[tuple[str, int, int]]) -> tuple[bool, int, str | None, int | None]:
        for kind, b, n in steps:
            if kind in ("takeover", "copy"):
                return True, n, "taken_over" if kind == "takeover" else "copied", b
        return False, 0, None, None

    def lookup(
        self,
        tokens: Any,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_items: Any = None,
    ) -> Lookup:
        toks = token_list(tokens)
        lora_id = _lora_id(lora_id)
        cache_salt = opt_str_arg(cache_salt, "cache_salt")
        mm = _mm_items(mm_items)
        _check_mm_items(mm, len(toks))
        keys = self._keys(toks, (lora_id, cache_salt), mm)
        n_ctx = _ceil_div(len(toks), self.tokens_per_block)
        steps, matched, reused, hb, ht = self._plan(keys, n_ctx)
        p, pt, pk, pb = self._partial(steps)
        return Lookup(matched, reused, p, pt, pk, pb, hb, ht)

    # ----- references -------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _ref_inc(self, b: int) -> None:
        blk = self.blocks[b]
        if blk.ref_cnt == 0:
            blk.expiry = None
        blk.ref_cnt += 1

    def _ref_dec(self, b: int) -> None:
        blk = self.blocks[b]
        blk.ref_cnt -= 1
        if blk.ref_cnt == 0:
            blk.seq = self._next_seq()
            if blk.duration is not None and blk.priority != DEFAULT_PRIORITY:
                blk.expiry = min(self.clock + blk.duration, U64_MAX)

    def _refresh(self) -> None:
        expired = sorted(
            (b.expiry, i)
            for i, b in enumerate(self.blocks)
            if b.expiry is not None and b.expiry <= self.clock
        )
        for _, i in expired:
            blk = self.blocks[i]
            blk.expiry = None
            if blk.ref_cnt == 0:
                blk.priority = DEFAULT_PRIORITY
                blk.seq = self._next_seq()

    def _detach(self, b: int) -> None:
        blk = self.blocks[b]
        if blk.key is None:
            return
        del self._children(blk.parent)[blk.key]
        self._emit(TrieBlockRemoved([b], [blk.hash]))
        blk.key, blk.parent, blk.hash = None, None, 0

    def _gpu_children(self, b: int) -> int:
        return sum(not self.blocks[c].host for c in self.blocks[b].children.values())

    def _victim(self) -> int:
        """The first evictable GPU block, made a free GPU block outside the trie: a cached
        victim is offloaded (another block takes its place) or leaves the trie with its
        host descendants."""
        v = min(
            (blk.priority, blk.seq, i)
            for i, blk in enumerate(self.blocks)
            if not blk.host and blk.ref_cnt == 0 and self._gpu_children(i) == 0
        )[2]
        blk = self.blocks[v]
        blk.expiry = None
        if blk.key is None:
            return v
        hosts = [
            (h.priority, h.seq, i)
            for i, h in enumerate(self.blocks)
            if h.host and h.ref_cnt == 0 and not h.children
        ]
        if self.host_blocks and blk.priority >= self._min_priority and hosts:
            h = min(hosts)[2]
            hb = self.blocks[h]
            hb.expiry = None
            blk.host, blk.duration, blk.seq = True, None, self._next_seq()
            self._host_stats["offloaded_blocks"] += 1
            self._host_stats["stored_tokens"] += len(blk.key[2])
            self._emit(TrieBlockMoved([v], [blk.hash], "CPU"))
            if hb.key is not None:
                self._host_stats["host_evicted_blocks"] += 1
                self._host_stats["host_evicted_tokens"] += len(hb.key[2])
                self._detach(h)
            hb.host = False
            peak = self._host_stats["peak_host_tokens"]
            self._host_stats["peak_host_tokens"] = max(peak, self.num_host_cached_tokens)
            return h
        # Post-order over the host subtree, children in id order.
        order: list[int] = []
        stack: list[tuple[int, bool]] = [(v, False)]
        while stack:  # iterative: a host chain may be deeper than the recursion limit
            b, done = stack.pop()
            if done:
                order.append(b)
                continue
            stack.append((b, True))
            stack.extend((c, False) for c in sorted(self.blocks[b].children.values(), reverse=True))
        for b in order:
            key = self.blocks[b].key
            n = len(key[2]) if key is not None else 0
            if b == v:
                self._stats["evicted_blocks"] += 1
                self._stats["evicted_tokens"] += n
            else:
                self._host_stats["host_evicted_blocks"] += 1
                self._host_stats["host_evicted_tokens"] += n
            self._detach(b)
        return v

    def _onboard(self, b: int) -> None:
        g = self._victim()
        gb = self.blocks[g]
        gb.host, gb.priority, gb.duration, gb.seq = True, DEFAULT_PRIORITY, None, self._next_seq()
        blk = self.blocks[b]
        blk.host = False
        self._host_stats["onboarded_blocks"] += 1
        if blk.key is not None:
            self._emit(TrieBlockMoved([b], [blk.hash], "GPU"))

    def _alloc(self, priority: int, duration: int | None) -> int:
        b = self._victim()
        blk = self.blocks[b]
        blk.ref_cnt, blk.priority, blk.duration = 1, priority, duration
        self._stats["allocated_blocks"] += 1
        return b

    # ----- requests ---------------------------------------------------------------------
    def claim(
        self,
        request_id: int,
        tokens: Any,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_items: Any = None,
        priority: int | None = None,
        retention: int | None = None,
        reserve_tokens: int | None = None,
    ) -> Claim:
        # In argument order, as the core reads them: the first bad one is named.
        request_id = request_id_arg(request_id)
        toks = token_list(tokens)
        lora_id = _lora_id(lora_id)
        cache_salt = opt_str_arg(cache_salt, "cache_salt")
        mm = _mm_items(mm_items)
        priority = opt_int_arg(priority, "priority", 0, MAX_PRIORITY)
        retention = opt_int_arg(retention, "retention", 0, SIZE_MAX)
        reserve = 0 if reserve_tokens is None else size_arg(reserve_tokens, "reserve_tokens")
        if request_id in self.requests:
            raise InvalidInputError(f"request {request_id} already holds blocks")
        if not toks:
            raise InvalidInputError("tokens must not be empty")
        _check_mm_items(mm, len(toks))
        tpb = self.tokens_per_block
        scope: Scope = (lora_id, cache_salt)
        keys = self._keys(toks, scope, mm)
        n_ctx = _ceil_div(len(toks), tpb)
        n_total = _ceil_div(len(toks) + reserve, tpb)
        steps, matched, reused, host_blocks, host_tokens = self._plan(keys, n_ctx)
        fresh = n_total - n_ctx
        leaving = 0
        for kind, b, _ in steps:
            if kind != "fresh" and self.blocks[b].host:
                fresh += kind != "copy"  # onboarded: takes a GPU block
            elif kind != "fresh":
                leaving += self.blocks[b].ref_cnt == 0
            if kind in ("copy", "fresh"):
                fresh += 1
        if fresh + leaving > self.num_free_blocks:
            raise OutOfBlocksError(f"cannot get {fresh} blocks")

        self.clock = min(self.clock + 1, U64_MAX)  # saturates, as in the core
        self._refresh()
        pins = []
        for kind, b, _ in steps:
            if kind in ("reuse", "takeover"):
                self._ref_inc(b)
                if priority is not None:
                    self.blocks[b].priority = priority
                self.blocks[b].duration = retention
                if kind == "takeover":
                    self._detach(b)
                    self._stats["taken_over_blocks"] += 1
            elif kind == "copy":
                self._ref_inc(b)
                pins.append(b)
        block_ids, copies = [], []
        for kind, b, n in steps:
            if kind == "copy":
                dst = self._alloc(self.blocks[b].priority, self.blocks[b].duration)
                copies.append((b, dst, n))
                self._stats["copies"] += 1
                self._stats["copied_tokens"] += n
                block_ids.append(dst)
            elif kind == "fresh":
                pr = DEFAULT_PRIORITY if priority is None else priority
                block_ids.append(self._alloc(pr, retention))
            else:
                if self.blocks[b].host:
                    self._onboard(b)
                block_ids.append(b)
        for _ in range(n_ctx, n_total):
            block_ids.append(self._alloc(DEFAULT_PRIORITY, None))
        p, pt, pk, pb = self._partial(steps)
        s = self._stats
        s["claims"] += 1
        s["query_tokens"] += len(toks)
        s["matched_tokens"] += matched
        s["reused_blocks"] += reused
        if p:
            s["partial_hits"] += 1
            s["partial_tokens"] += pt
        self._host_stats["loaded_tokens"] += host_tokens
        self.requests[request_id] = _Request(list(block_ids), pins, toks, scope, mm)
        return Claim(block_ids, matched, reused, p, pt, pk, pb, copies, host_blocks, host_tokens)

    def _request(self, request_id: int) -> _Request:
        r = self.requests.get(request_id)
        if r is None:
            raise UnknownRequestError(f"unknown request {request_id}")
        return r

    def complete(self, request_id: int) -> int:
        r = self._request(request_id_arg(request_id))
        pins, r.pins = r.pins, []
        for b in pins:
            self._ref_dec(b)
        return len(pins)

    def extend(self, request_id: int, num_tokens: int) -> list[int]:
        request_id = request_id_arg(request_id)
        num_tokens = size_arg(num_tokens, "num_tokens")
        r = self._request(request_id)
        need = max(_ceil_div(num_tokens, self.tokens_per_block) - len(r.blocks), 0)
        if need > self.num_free_blocks:
            raise OutOfBlocksError(f"cannot get {need} blocks")
        new = [self._alloc(DEFAULT_PRIORITY, None) for _ in range(need)]
        r.blocks.extend(new)
        return new

    def _attach(self, b: int, parent: int | None, key: Key) -> None:
        parent_hash = None if parent is None else self.blocks[parent].hash
        blk = self.blocks[b]
        blk.key, blk.parent, blk.hash = key, parent, chain_hash(parent_hash, key)
        self._children(parent)[key] = b

    def store(self, request_id: int, tokens: Any) -> int:
        request_id = request_id_arg(request_id)
        toks = token_list(tokens)
        r = self._request(request_id)
        common = min(len(toks), len(r.tokens))
        if toks[:common] != r.tokens[:common]:
            raise InvalidInputError("tokens must agree with the tokens claimed or stored before")
        keys = self._keys(toks, r.scope, r.mm)
        if len(keys) > len(r.blocks):
            raise InvalidInputError("the request holds too few blocks: call extend first")
        cur: int | None = None
        new: list[int] = []
        for key, b in zip(keys, r.blocks, strict=False):
            blk = self.blocks[b]
            if blk.key is not None:
                if blk.parent != cur:
                    break
                if blk.key == key:
                    cur = b
                    continue
                if self._full(blk.key) or blk.children or key in self._children(cur):
                    break
                self._detach(b)
            elif key in self._children(cur):
                break
            self._attach(b, cur, key)
            new.append(b)
            cur = b
        if len(toks) > len(r.tokens):
            r.tokens = toks
        if new:
            first_parent = self.blocks[new[0]].parent
            parent_hash = None if first_parent is None else self.blocks[first_parent].hash
            token_ids = [t for b in new for t in self.blocks[b].key[2]]  # type: ignore[index]
            lora = self.blocks[new[0]].key[0][0]  # type: ignore[index]
            self._emit(
                TrieBlockStored(
                    list(new),
                    [self.blocks[b].hash for b in new],
                    parent_hash,
                    token_ids,
                    self.tokens_per_block,
                    lora,
                )
            )
            self._stats["stored_blocks"] += len(new)
        return len(new)

    def release(self, request_id: int) -> None:
        request_id = request_id_arg(request_id)
        r = self._request(request_id)
        del self.requests[request_id]
        for b in r.pins:
            self._ref_dec(b)
        for b in reversed(r.blocks):
            self._ref_dec(b)

    def advance_clock(self, ticks: int) -> None:
        ticks = int_arg(ticks, "ticks", 0, SIZE_MAX)
        self.clock = min(self.clock + ticks, U64_MAX)  # saturates, as in the core
        self._refresh()
