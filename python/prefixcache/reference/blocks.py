"""vLLM v1's block pool, free queue and request-level manager in plain Python.

The executable specification of ``prefixcache.BlockPool`` and ``prefixcache.KVCacheManager``
(same API, lists instead of numpy arrays). Written for clarity, not speed; the structure
follows vLLM 0.33's ``block_pool.py``, ``kv_cache_manager.py`` and
``single_type_kv_cache_manager.py`` for one KV-cache group (SEMANTICS.md section 2).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixcache.errors import (
    BlockStateError,
    InvalidInputError,
    InvalidTypeError,
    OutOfBlocksError,
    PrefixCacheError,
    UnknownRequestError,
)
from prefixcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    external_hash,
)
from prefixcache.reference.hashing import (
    block_keys_arg,
    check_algo,
    extra_keys_arg,
    hash_object,
    none_hash,
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
    u32_list,
    u64_list,
)

NULL_BLOCK = 0

ExtraKeys = tuple[Any, ...] | None

# The largest pool: block ids are u32, with room for the core's sentinels.
MAX_NUM_BLOCKS = 2**32 - 4


def _num_blocks_arg(num_blocks: object) -> int:
    """A pool's ``num_blocks``: an int in ``[1, 2**32 - 4]``."""
    n = size_arg(num_blocks, "num_blocks")
    if not 1 <= n <= MAX_NUM_BLOCKS:
        raise InvalidInputError(f"num_blocks must be in [1, {MAX_NUM_BLOCKS}], got {n}")
    return n


def _event_hash_format_arg(fmt: object) -> str:
    """``event_hash_format``: "u64" or "bytes"."""
    fmt = str_arg(fmt, "event_hash_format")
    if fmt not in ("u64", "bytes"):
        raise InvalidInputError(f"event_hash_format must be 'u64' or 'bytes', got {fmt!r}")
    return fmt


def _block_hashes_arg(obj: object) -> list[bytes]:
    """``block_hashes``: an iterable of block hashes, each bytes of 1 to 32 bytes."""
    try:
        it = iter(obj)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidTypeError(
            f"block_hashes must be an iterable of block hashes, got {type(obj).__name__}"
        ) from None
    out = []
    for i, h in enumerate(it):
        if not isinstance(h, bytes):
            raise InvalidTypeError(f"block_hashes[{i}] must be bytes, not {type(h).__name__}")
        if not 1 <= len(h) <= 32:
            raise InvalidInputError(
                f"block_hashes[{i}] has {len(h)} bytes: a block hash has 1 to 32 bytes"
            )
        out.append(h)
    return out


def _block_id_arg(block_id: object) -> int:
    return int_arg(block_id, "block_id", 0, 0xFFFF_FFFF)


class FreeQueue:
    """Free block ids in eviction order (head = next reused)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self._q: OrderedDict[int, None] = OrderedDict((i, None) for i in ids)

    def __len__(self) -> int:
        return len(self._q)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._q

    def popleft(self) -> int:
        return self._q.popitem(last=False)[0]

    def remove(self, block_id: int) -> None:
        del self._q[block_id]

    def append(self, block_id: int) -> None:
        self._q[block_id] = None

    def prepend_n(self, ids: Sequence[int]) -> None:
        for block_id in reversed(ids):
            self._q[block_id] = None
            self._q.move_to_end(block_id, last=False)

    def ids(self) -> list[int]:
        return list(self._q)


def untag_extra_keys(keys: ExtraKeys) -> ExtraKeys:
    """vLLM's ``to_event_extra_keys`` for one block."""
    if keys is None:
        return None
    return tuple(
        (k[1:] if k[0] == "mm" else k[1]) if isinstance(k, tuple) and len(k) >= 2 else k
        for k in keys
    )


class BlockPool:
    """Same behaviour and API as ``prefixcache.BlockPool``."""

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        enable_kv_cache_events: bool = False,
        event_hash_format: str = "u64",
    ) -> None:
        # Read in argument order, as the core reads them: the first bad one is named.
        num_blocks = _num_blocks_arg(num_blocks)
        enable_caching = flag_arg(enable_caching, "enable_caching")
        enable_kv_cache_events = flag_arg(enable_kv_cache_events, "enable_kv_cache_events")
        event_hash_format = _event_hash_format_arg(event_hash_format)
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.events_enabled = enable_kv_cache_events
        self.fmt = event_hash_format
        self.ref = [0] * num_blocks
        self.key: list[tuple[bytes, int] | None] = [None] * num_blocks
        self.free = FreeQueue(range(1, num_blocks))  # block 0 is the null block
        # (hash, group) -> {block id: None}, in insertion order; lookups take the first.
        self.cached: dict[tuple[bytes, int], dict[int, None]] = {}
        self.hash_len: int | None = None
        self.events: list[KVCacheEvent] = []
        # Cached blocks whose hash was dropped because the block was reused.
        self.num_evicted_blocks = 0

    # -- inspection ------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash now."""
        return sum(len(ids) for ids in self.cached.values())

    @property
    def usage(self) -> float:
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - len(self.free) / usable

    def free_block_ids(self) -> list[int]:
        return self.free.ids()

    def _check_id(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise InvalidInputError(f"block id {block_id} is out of range")

    def ref_cnt(self, block_id: int) -> int:
        block_id = _block_id_arg(block_id)
        self._check_id(block_id)
        return self.ref[block_id]

    def block_hash(self, block_id: int) -> bytes | None:
        block_id = _block_id_arg(block_id)
        self._check_id(block_id)
        key = self.key[block_id]
        return None if key is None else key[0]

    def _check_hash(self, h: bytes) -> None:
        if not isinstance(h, bytes) or not 1 <= len(h) <= 32:
            raise InvalidInputError("a block hash is 1 to 32 bytes")
        if self.hash_len is not None and len(h) != self.hash_len:
            raise InvalidInputError(f"{len(h)}-byte hash in a pool of {self.hash_len}-byte hashes")

    def _ext(self, h: bytes) -> int | bytes:
        return external_hash(h, self.fmt)

    # -- operations -------------------------------------------------------------------
    def lookup(self, h: bytes, group: int = 0) -> int | None:
        blocks = self.cached.get((h, group))
        return next(iter(blocks)) if blocks else None

    def get_cached_block(
        self, block_hash: bytes, group_ids: Sequence[int] = (0,)
    ) -> list[int] | None:
        # Read in argument order, as the core reads them: the first bad one is named.
        if not isinstance(block_hash, bytes):
            raise InvalidTypeError(f"block_hash must be bytes, not {type(block_hash).__name__}")
        if not 1 <= len(block_hash) <= 32:
            raise InvalidInputError(
                f"block_hash has {len(block_hash)} bytes: a block hash has 1 to 32 bytes"
            )
        group_ids = u32_list(group_ids, "group_ids")
        self._check_hash(block_hash)
        out = []
        for g in group_ids:
            b = self.lookup(block_hash, g)
            if b is None:
                return None
            out.append(b)
        return out

    def _evict_hash(self, block_id: int) -> None:
        key = self.key[block_id]
        if key is None:
            return
        self.key[block_id] = None
        blocks = self.cached[key]
        del blocks[block_id]
        if not blocks:
            del self.cached[key]
        if self.events_enabled:
            self.events.append(BlockRemoved([self._ext(key[0])], "GPU", key[1]))

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        n = size_arg(num_blocks, "num_blocks")
        if n > len(self.free):
            raise OutOfBlocksError(f"cannot get {n} blocks: only {len(self.free)} free")
        out = []
        for _ in range(n):
            b = self.free.popleft()
            if self.enable_caching and self.key[b] is not None:
                self.num_evicted_blocks += 1
                self._evict_hash(b)
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, block_ids: Sequence[int]) -> None:
        block_ids = u32_list(block_ids, "block_ids")
        for b in block_ids:
            self._check_id(b)
            if b == NULL_BLOCK:
                raise BlockStateError("cannot touch the null block")
        for b in block_ids:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        block_ids = u32_list(block_ids, "block_ids")
        need: dict[int, int] = {}
        for b in block_ids:
            self._check_id(b)
            if b == NULL_BLOCK:
                raise BlockStateError("cannot free the null block")
            need[b] = need.get(b, 0) + 1
            if need[b] > self.ref[b]:
                raise BlockStateError(f"cannot free block {b}: no reference left")
        self._release(block_ids)

    def _release(self, block_ids: Sequence[int]) -> None:
        """vLLM's free_blocks (null blocks skipped)."""
        first, last = [], []
        for b in block_ids:
            if b == NULL_BLOCK:
                continue
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.key[b] is None or not self.enable_caching:
                    first.append(b)
                else:
                    last.append(b)
        self.free.prepend_n(first)
        for b in last:
            self.free.append(b)

    def cache_full_blocks(
        self,
        block_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int = 0,
        token_ids: Sequence[int] | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
        extra_keys: Sequence[ExtraKeys] | None = None,
    ) -> None:
        # Read in argument order, as the core reads them: the first bad one is named.
        block_ids = u32_list(block_ids, "block_ids")
        block_hashes = _block_hashes_arg(block_hashes)
        num_cached_blocks = size_arg(num_cached_blocks, "num_cached_blocks")
        num_full_blocks = size_arg(num_full_blocks, "num_full_blocks")
        block_size = int_arg(block_size, "block_size", 1, SIZE_MAX)
        group_id = int_arg(group_id, "group_id", 0, 0xFFFF_FFFF)
        token_ids = None if token_ids is None else token_list(token_ids, "token_ids")
        lora_id = opt_int_arg(lora_id, "lora_id")
        lora_name = opt_str_arg(lora_name, "lora_name")
        extra_keys = extra_keys_arg(extra_keys)
        self._cache_full_blocks(
            block_ids,
            block_hashes,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            group_id,
            token_ids,
            lora_id,
            lora_name,
            extra_keys,
        )

    def _cache_full_blocks(
        self,
        block_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int = 0,
        token_ids: Sequence[int] | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
        extra_keys: Sequence[ExtraKeys] | None = None,
        default_extra_keys: ExtraKeys = None,
        spec: tuple[str, int | None] | None = None,
    ) -> None:
        """``cache_full_blocks`` of arguments already read (the manager's own lists)."""
        lo, hi = num_cached_blocks, num_full_blocks
        if lo >= hi:
            return
        if not self.enable_caching:
            raise InvalidInputError("caching is disabled")
        if hi > len(block_ids) or hi > len(block_hashes):
            raise InvalidInputError("num_full_blocks exceeds the blocks or hashes given")
        if token_ids is not None and len(token_ids) < hi * block_size:
            raise InvalidInputError("token_ids too short")
        lens = {len(h) for h in block_hashes[max(lo - 1, 0) : hi]}
        for h in block_hashes[max(lo - 1, 0) : hi]:
            self._check_hash(h)
        if len(lens) > 1:
            raise InvalidInputError("block hashes of different lengths")
        new = list(block_ids[lo:hi])
        real = [b for b in new if b != NULL_BLOCK]
        for b in new:
            self._check_id(b)
        for b in real:
            if self.key[b] is not None or self.ref[b] == 0 or real.count(b) > 1:
                raise BlockStateError(f"block {b} cannot be cached")
        self.hash_len = lens.pop()
        stored, keys = [], []
        for i, b in enumerate(new, start=lo):
            if b == NULL_BLOCK:
                continue
            key = (block_hashes[i], group_id)
            self.key[b] = key
            self.cached.setdefault(key, {})[b] = None
            stored.append(self._ext(block_hashes[i]))
            ek = (
                extra_keys[i]
                if extra_keys is not None and i < len(extra_keys)
                else default_extra_keys
            )
            keys.append(untag_extra_keys(ek))
        if self.events_enabled:
            parent = self._ext(block_hashes[lo - 1]) if lo > 0 else None
            toks = (
                []
                if token_ids is None
                else [int(t) for t in token_ids[lo * block_size : hi * block_size]]
            )
            self.events.append(
                BlockStored(
                    stored,
                    parent,
                    toks,
                    block_size,
                    lora_id,
                    "GPU",
                    lora_name,
                    keys or None,
                    group_id,
                    None if spec is None else spec[0],
                    None if spec is None else spec[1],
                )
            )

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        block_ids = u32_list(block_ids, "block_ids")
        for b in block_ids:
            self._check_id(b)
        for b in block_ids:
            self._evict_hash(b)

    def reset_prefix_cache(self) -> bool:
        if len(self.free) != self.num_blocks - 1:
            return False
        self.cached.clear()
        self.key = [None] * self.num_blocks
        if self.events_enabled:
            self.events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVCacheEvent]:
        events, self.events = self.events, []
        return events


@dataclass
class _Request:
    tokens: list[int]
    num_prompt_tokens: int
    extra_keys: list[ExtraKeys]
    default_extra_keys: ExtraKeys
    lora_id: int | None
    lora_name: str | None
    block_hashes: list[bytes] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_cached_blocks: int | None = None  # vLLM's num_cached_block entry
    admitted: bool = False
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    queued: list[int] = field(default_factory=list)  # tokens for decode_steps
    queued_fed: int = 0  # how many of them were fed

    def keys(self, i: int) -> ExtraKeys:
        return self.extra_keys[i] if i < len(self.extra_keys) else self.default_extra_keys


def _request_ids(request_ids: Sequence[int]) -> list[int]:
    """Request ids of a batch call, each an int in [0, 2**64) as the core reads them."""
    return [int_arg(i, f"request_ids[{j}]", 0, U64_MAX) for j, i in enumerate(request_ids)]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Same behaviour and API as ``prefixcache.KVCacheManager``."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        hash_algo: str = "sha256",
        enable_caching: bool = True,
        sliding_window: int | None = None,
        enable_kv_cache_events: bool = False,
        seed: str | None = None,
        event_hash_format: str = "u64",
    ) -> None:
        # Read in argument order, as the core reads them: the first bad one is named.
        num_blocks = _num_blocks_arg(num_blocks)
        block_size = int_arg(block_size, "block_size", 1, SIZE_MAX)
        hash_algo = check_algo(str_arg(hash_algo, "hash_algo"))
        enable_caching = flag_arg(enable_caching, "enable_caching")
        sliding_window = opt_int_arg(sliding_window, "sliding_window", 0, SIZE_MAX)
        if sliding_window is not None and sliding_window < 2:
            raise InvalidInputError(f"sliding_window must be >= 2 tokens, got {sliding_window}")
        enable_kv_cache_events = flag_arg(enable_kv_cache_events, "enable_kv_cache_events")
        seed = opt_str_arg(seed, "seed")
        event_hash_format = _event_hash_format_arg(event_hash_format)

        self.pool = BlockPool(num_blocks, enable_caching, enable_kv_cache_events, event_hash_format)
        self.block_size = block_size
        self.algo = hash_algo
        self.none_hash = none_hash(hash_algo, seed)
        self.sliding_window = sliding_window
        self.enable_caching = enable_caching
        self.requests: dict[int, _Request] = {}
        self._stats = self._zero_stats()

    @staticmethod
    def _zero_stats() -> dict[str, int | bool]:
        keys = (
            "requests",
            "queries",
            "hits",
            "preempted_requests",
            "preempted_queries",
            "preempted_hits",
        )
        d: dict[str, int | bool] = dict.fromkeys(keys, 0)
        d["reset"] = False
        return d

    # -- inspection -------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, int | bool]:
        return dict(self._stats)

    def take_stats(self) -> dict[str, int | bool]:
        s, self._stats = self._stats, self._zero_stats()
        return s

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_evicted_blocks(self) -> int:
        return self.pool.num_evicted_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.pool.num_cached_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def free_block_ids(self) -> list[int]:
        return self.pool.free_block_ids()

    def ref_cnt(self, block_id: int) -> int:
        return self.pool.ref_cnt(block_id)

    def block_hash(self, block_id: int) -> bytes | None:
        return self.pool.block_hash(block_id)

    def take_events(self, compact: bool = False) -> list[KVCacheEvent]:
        """The KV events since the last call; ``compact``: without token ids, with runs of
        removals (same group and medium) merged, and u64 hashes as uint64 arrays."""
        compact = flag_arg(compact, "compact")
        events = self.pool.take_events()
        if not compact:
            return events
        merged: list[KVCacheEvent] = []
        for e in events:
            last = merged[-1] if merged else None
            if (
                isinstance(e, BlockRemoved)
                and isinstance(last, BlockRemoved)
                and (last.group_idx, last.medium) == (e.group_idx, e.medium)
            ):
                hashes = [*last.block_hashes, *e.block_hashes]
                merged[-1] = dataclasses.replace(last, block_hashes=hashes)
            else:
                merged.append(e)

        def packed(hashes: Any) -> Any:
            if self.pool.fmt == "u64":
                return np.array(hashes, dtype=np.uint64)
            return hashes

        out: list[KVCacheEvent] = []
        for e in merged:
            if isinstance(e, BlockStored):
                e = dataclasses.replace(e, block_hashes=packed(e.block_hashes), token_ids=None)
            elif isinstance(e, BlockRemoved):
                e = dataclasses.replace(e, block_hashes=packed(e.block_hashes))
            out.append(e)
        return out

    def _req(self, request_id: int) -> _Request:
        request_id = request_id_arg(request_id)  # the core's contract: an int in [0, 2**64)
        if request_id not in self.requests:
            raise UnknownRequestError(f"unknown request id {request_id}")
        return self.requests[request_id]

    def block_ids(self, request_id: int) -> list[int]:
        return list(self._req(request_id).blocks)

    def num_tokens(self, request_id: int) -> int:
        return len(self._req(request_id).tokens)

    def num_computed_tokens(self, request_id: int) -> int:
        return self._req(request_id).num_computed_tokens

    def block_hashes(self, request_id: int) -> list[bytes]:
        return list(self._req(request_id).block_hashes)

    def __contains__(self, request_id: object) -> bool:
        try:
            rid = request_id_arg(request_id)
        except PrefixCacheError:  # not a request id: no request has it
            return False
        return rid in self.requests

    def __len__(self) -> int:
        return len(self.requests)

    # -- requests ---------------------------------------------------------------------
    def _hash_new_blocks(self, req: _Request) -> list[bytes]:
        bs = self.block_size
        out: list[bytes] = []
        parent = req.block_hashes[-1] if req.block_hashes else self.none_hash
        for i in range(len(req.block_hashes), len(req.tokens) // bs):
            parent = hash_object(
                self.algo, (parent, tuple(req.tokens[i * bs : (i + 1) * bs]), req.keys(i))
            )
            out.append(parent)
        return out

    def add_request(
        self,
        request_id: int,
        prompt_tokens: Sequence[int],
        extra_keys: Sequence[ExtraKeys] | None = None,
        default_extra_keys: ExtraKeys = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None:
        # Read in argument order, as the core reads them: the first bad one is named.
        request_id = request_id_arg(request_id)
        prompt_tokens = token_list(prompt_tokens, "prompt_tokens")
        extra_keys = extra_keys_arg(extra_keys)
        default_extra_keys = block_keys_arg(default_extra_keys, "default_extra_keys")
        lora_id = opt_int_arg(lora_id, "lora_id")
        lora_name = opt_str_arg(lora_name, "lora_name")
        if request_id in self.requests:
            raise InvalidInputError(f"request id {request_id} is already known")
        if len(prompt_tokens) == 0:
            raise InvalidInputError("empty prompt")
        toks = prompt_tokens  # a new list of ints (token_list)
        req = _Request(
            toks, len(toks), list(extra_keys or []), default_extra_keys, lora_id, lora_name
        )
        if self.enable_caching:
            req.block_hashes = self._hash_new_blocks(req)
        self.requests[request_id] = req

    def append_tokens(self, request_id: int, tokens: Sequence[int]) -> None:
        request_id = request_id_arg(request_id)
        tokens = token_list(tokens, "tokens")
        req = self._req(request_id)
        req.tokens.extend(tokens)
        if self.enable_caching:
            req.block_hashes.extend(self._hash_new_blocks(req))

    def _skipped_tokens(self, num_computed_tokens: int) -> int:
        if self.sliding_window is None:
            return 0
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def get_computed_blocks(self, request_id: int) -> tuple[list[int], int]:
        req = self._req(request_id)
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        n = min((len(req.tokens) - 1) // bs, len(req.block_hashes))
        if self.sliding_window is None:
            hit: list[int] = []
            for h in req.block_hashes[:n]:
                b = self.pool.lookup(h)
                if b is None:
                    break
                hit.append(b)
            return hit, len(hit) * bs
        need = _cdiv(self.sliding_window - 1, bs)
        blocks = [NULL_BLOCK] * n
        run = 0
        for i in range(n - 1, -1, -1):
            b = self.pool.lookup(req.block_hashes[i])
            if b is None:
                run = 0
                continue
            blocks[i] = b
            run += 1
            if run >= need:
                del blocks[i + run :]
                return blocks, len(blocks) * bs
        del blocks[run:]
        return blocks, len(blocks) * bs

    def _remove_skipped_blocks(self, req: _Request, num_computed_tokens: int) -> None:
        skipped = self._skipped_tokens(num_computed_tokens)
        if skipped <= 0:
            return
        freed = []
        for i in range(min(skipped // self.block_size, len(req.blocks)) - 1, -1, -1):
            if req.blocks[i] == NULL_BLOCK:
                break
            freed.append(req.blocks[i])
            req.blocks[i] = NULL_BLOCK
        self.pool._release(freed)

    def _num_blocks_to_allocate(
        self, req: _Request, num_tokens: int, hit: list[int], total: int
    ) -> int:
        bs = self.block_size
        required = _cdiv(num_tokens, bs)
        if req.num_cached_blocks is not None:
            return max(required - len(req.blocks), 0)
        skipped = self._skipped_tokens(total) // bs
        new = max(required - max(skipped, len(hit) + len(req.blocks)), 0)
        rest = hit[max(0, skipped - len(req.blocks)) :]
        return new + sum(1 for b in rest if b != NULL_BLOCK and self.pool.ref[b] == 0)

    def allocate_slots(
        self,
        request_id: int,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[int] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        # Read in argument order, as the core reads them: the first bad one is named.
        request_id = request_id_arg(request_id)
        num_new_tokens = size_arg(num_new_tokens, "num_new_tokens")
        num_new_computed_tokens = size_arg(num_new_computed_tokens, "num_new_computed_tokens")
        hit = (
            []
            if new_computed_blocks is None
            else u32_list(new_computed_blocks, "new_computed_blocks")
        )
        num_lookahead_tokens = size_arg(num_lookahead_tokens, "num_lookahead_tokens")
        req = self._req(request_id)
        bs = self.block_size
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise InvalidInputError("num_new_tokens must be > 0")
        if hit and req.admitted:
            raise InvalidInputError("hits can only be adopted at admission")
        if num_new_computed_tokens != len(hit) * bs:
            raise InvalidInputError(
                "num_new_computed_tokens != len(new_computed_blocks) * block_size"
            )
        if req.num_computed_tokens + num_new_computed_tokens > len(req.tokens):
            raise InvalidInputError("hit exceeds the request's tokens")
        for b in hit:
            self.pool._check_id(b)
        if not self.enable_caching and any(b != NULL_BLOCK for b in hit):
            raise InvalidInputError("caching disabled")

        total = req.num_computed_tokens + num_new_computed_tokens
        need_slots = total + num_new_tokens + num_lookahead_tokens
        first_admission = not req.admitted
        self._remove_skipped_blocks(req, total)
        if self._num_blocks_to_allocate(req, need_slots, hit, total) > self.pool.num_free_blocks:
            return None
        if hit and req.num_cached_blocks is None:
            skipped = self._skipped_tokens(total) // bs
            rest = hit[skipped:]
            for b in rest:
                if b != NULL_BLOCK:
                    if self.pool.ref[b] == 0:
                        self.pool.free.remove(b)
                    self.pool.ref[b] += 1
            req.blocks.extend([NULL_BLOCK] * skipped + rest)
            req.num_cached_blocks = len(req.blocks)
        n_new = _cdiv(need_slots, bs) - len(req.blocks)
        new_blocks = self.pool.get_new_blocks(n_new) if n_new > 0 else []
        req.blocks.extend(new_blocks)
        if self.enable_caching:
            self._cache_blocks(req, min(total + num_new_tokens, len(req.tokens)))
        req.num_computed_tokens = min(total + num_new_tokens, len(req.tokens))
        req.admitted = True
        if first_admission and self.enable_caching:
            pre = "preempted_" if req.num_preemptions > 0 else ""
            self._stats[pre + "requests"] += 1
            self._stats[pre + "queries"] += len(req.tokens)
            self._stats[pre + "hits"] += num_new_computed_tokens
        return new_blocks

    def _cache_blocks(self, req: _Request, num_tokens: int) -> None:
        bs = self.block_size
        num_cached = req.num_cached_blocks or 0
        num_full = min(num_tokens, len(req.block_hashes) * bs) // bs
        if num_cached >= num_full:
            return
        spec = (
            ("full_attention", None)
            if self.sliding_window is None
            else ("sliding_window", self.sliding_window)
        )
        self.pool._cache_full_blocks(
            req.blocks,
            req.block_hashes,
            num_cached,
            num_full,
            bs,
            0,
            req.tokens,
            req.lora_id,
            req.lora_name,
            req.extra_keys,
            req.default_extra_keys,
            spec,
        )
        req.num_cached_blocks = num_full

    def _release(self, req: _Request) -> None:
        blocks = req.blocks
        while blocks and blocks[0] == NULL_BLOCK:
            blocks = blocks[1:]
        self.pool._release(list(reversed(blocks)))
        req.blocks = []
        req.num_cached_blocks = None
        req.admitted = False

    def free(self, request_id: int) -> None:
        self._release(self._req(request_id))
        del self.requests[request_id_arg(request_id)]

    def preempt(self, request_id: int) -> None:
        req = self._req(request_id)
        self._release(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1

    def reset_prefix_cache(self) -> bool:
        if not self.pool.reset_prefix_cache():
            return False
        self._stats["reset"] = True
        return True

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        self.pool.evict_blocks(block_ids)

    # -- convenience ------------------------------------------------------------------
    def admit(
        self,
        request_id: int,
        prompt_tokens: Sequence[int],
        num_lookahead_tokens: int = 0,
        extra_keys: Sequence[ExtraKeys] | None = None,
        default_extra_keys: ExtraKeys = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> tuple[int, list[int]] | None:
        # Read in argument order, as the core reads them: the first bad one is named.
        request_id = request_id_arg(request_id)
        prompt_tokens = token_list(prompt_tokens, "prompt_tokens")
        num_lookahead_tokens = size_arg(num_lookahead_tokens, "num_lookahead_tokens")
        extra_keys = extra_keys_arg(extra_keys)
        default_extra_keys = block_keys_arg(default_extra_keys, "default_extra_keys")
        lora_id = opt_int_arg(lora_id, "lora_id")
        lora_name = opt_str_arg(lora_name, "lora_name")
        self.add_request(
            request_id, prompt_tokens, extra_keys, default_extra_keys, lora_id, lora_name
        )
        hit, n_hit = self.get_computed_blocks(request_id)
        try:
            got = self.allocate_slots(
                request_id, len(prompt_tokens) - n_hit, n_hit, hit, num_lookahead_tokens
            )
        except Exception:
            del self.requests[request_id]
            raise
        if got is None:
            del self.requests[request_id]
            return None
        return n_hit, self.block_ids(request_id)

    def extend(
        self, request_ids: Sequence[int], tokens: Sequence[int], counts: Sequence[int]
    ) -> tuple[list[int], int]:
        ids = _request_ids(request_ids)
        tokens = token_list(tokens, "tokens")
        ns = u64_list(counts, "counts")
        if len(ids) != len(ns):
            raise InvalidInputError(f"request_ids has {len(ids)} items but counts has {len(ns)}")
        for i, n in zip(ids, ns, strict=True):
            if not self._req(i).admitted:
                raise InvalidInputError(f"request {i} holds no slots: admit or allocate it first")
            if n < 1:
                raise InvalidInputError(
                    f"request {i}: each item extends by at least 1 token, got {n}"
                )
        if sum(ns) != len(tokens):
            raise InvalidInputError(
                f"the items extend by {sum(ns)} tokens but {len(tokens)} were given"
            )
        evicted: list[int] = []
        peak = self.num_cached_blocks
        at = 0
        for i, n in zip(ids, ns, strict=True):
            req = self.requests[i]
            before = self.num_evicted_blocks
            n_tokens, n_hashes = len(req.tokens), len(req.block_hashes)
            self.append_tokens(i, tokens[at : at + n])
            at += n
            if self.allocate_slots(i, n) is None:
                del req.tokens[n_tokens:]
                del req.block_hashes[n_hashes:]
                break
            evicted.append(self.num_evicted_blocks - before)
            peak = max(peak, self.num_cached_blocks)
        return evicted, peak

    def queue_tokens(self, request_id: int, tokens: Sequence[int]) -> None:
        request_id = request_id_arg(request_id)
        tokens = token_list(tokens, "tokens")
        self._req(request_id).queued.extend(tokens)

    def num_queued_tokens(self, request_id: int) -> int:
        req = self._req(request_id)
        return len(req.queued) - req.queued_fed

    def decode_steps(self, request_ids: Sequence[int], num_steps: int) -> tuple[list[int], int]:
        ids = _request_ids(request_ids)
        k = int_arg(num_steps, "num_steps", 1, SIZE_MAX)
        seen: set[int] = set()
        for i in ids:
            req = self._req(i)
            if not req.admitted:
                raise InvalidInputError(f"request {i} holds no slots: admit or allocate it first")
            if len(req.queued) - req.queued_fed < k:
                raise InvalidInputError(f"request {i} has fewer queued tokens than {k} steps")
            if i in seen:
                raise InvalidInputError(f"request {i} is given twice")
            seen.add(i)
        evicted: list[int] = []
        peak = self.num_cached_blocks
        for i in ids:
            req = self.requests[i]
            at = req.queued_fed
            got, _ = self.extend([i], req.queued[at : at + k], [k])
            if not got:
                break
            req.queued_fed += k
            evicted.append(got[0])
            peak = max(peak, self.num_cached_blocks)
        return evicted, peak

    def max_decode_steps(self, request_ids: Sequence[int], max_steps: int) -> int:
        ids = _request_ids(request_ids)
        max_steps = size_arg(max_steps, "max_steps")
        reqs = [self._req(i) for i in ids]
        bs, free = self.block_size, self.num_free_blocks

        def needed(k: int) -> int:
            return sum(max(0, _cdiv(len(r.tokens) + k, bs) - len(r.blocks)) for r in reqs)

        if not reqs:
            return int(max_steps)
        best = 0
        for k in range(int(max_steps) + 1):
            if needed(k) > free:
                break
            best = k
        return best

    def finish(self, request_id: int, output_tokens: Sequence[int] | None = None) -> bool:
        request_id = request_id_arg(request_id)
        if output_tokens is not None:
            output_tokens = token_list(output_tokens, "output_tokens")
        self._req(request_id)
        ok = True
        if output_tokens is not None and len(output_tokens) > 0:
            self.append_tokens(request_id, output_tokens)
            ok = self.allocate_slots(request_id, len(output_tokens)) is not None
        self.free(request_id)
        return ok
