"""Type stubs of the compiled module ``prefixcache._core`` (checked by mypy.stubtest)."""

from collections.abc import Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

from prefixcache.trie_events import TrieBlockRemoved, TrieBlockStored

__version__: str
__all__ = [
    "BlockHasher",
    "BlockPool",
    "BlockTrie",
    "Claim",
    "FleetMatch",
    "InsertResult",
    "KVCacheManager",
    "KvIndex",
    "Lookup",
    "MatchResult",
    "Node",
    "RadixCache",
    "__version__",
    "decode_kv_events",
    "decode_kv_frames",
    "fleet_bitmap_walk",
    "hash_block_tokens",
]

_Tokens = Sequence[int] | npt.NDArray[np.integer[Any]] | Any
_Values = Sequence[int] | npt.NDArray[np.integer[Any]] | Any
_I64Array = npt.NDArray[np.int64]

@final
class Node:
    """A handle to a tree node; stale (raises) once the node is evicted or the tree reset."""

    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class MatchResult:
    @property
    def length(self) -> int: ...
    @property
    def node(self) -> Node: ...
    @property
    def indices(self) -> _I64Array: ...

@final
class InsertResult:
    @property
    def prefix_len(self) -> int: ...
    @property
    def node(self) -> Node: ...

@final
class RadixCache:
    def __new__(cls, page_size: int | None = None, eviction_policy: str = "lru") -> RadixCache: ...
    @property
    def page_size(self) -> int: ...
    @property
    def eviction_policy(self) -> str: ...
    @property
    def clock(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def root(self) -> Node: ...
    def match_prefix(
        self, tokens: _Tokens, extra_key: str | None = None, cache_salt: str | None = None
    ) -> MatchResult: ...
    def insert(
        self,
        tokens: _Tokens,
        values: _Values | None = None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        priority: int | None = None,
        inserted_len: int | None = None,
    ) -> InsertResult: ...
    def inc_lock_ref(self, node: Node) -> int: ...
    def dec_lock_ref(self, node: Node) -> int: ...
    def evict(self, num_tokens: int) -> _I64Array: ...
    def evictable_size(self) -> int: ...
    def protected_size(self) -> int: ...
    def total_size(self) -> int: ...
    def path_indices(self, node: Node) -> _I64Array: ...
    def parent(self, node: Node) -> Node | None: ...
    def node_info(self, node: Node) -> dict[str, Any]: ...
    def dump(self) -> list[dict[str, Any]]: ...
    def check_invariants(self) -> None: ...
    def reset(self) -> None: ...
    def pretty_print(self) -> str: ...

# ----- TensorRT-LLM block trie ---------------------------------------------------------

_MmItems = Sequence[tuple[bytes | str, int, int]]

@final
class Claim:
    @property
    def block_ids(self) -> list[int]: ...
    @property
    def num_matched_tokens(self) -> int: ...
    @property
    def num_reused_blocks(self) -> int: ...
    @property
    def partial(self) -> bool: ...
    @property
    def partial_tokens(self) -> int: ...
    @property
    def partial_kind(self) -> str | None: ...
    @property
    def partial_block(self) -> int | None: ...
    @property
    def copies(self) -> list[tuple[int, int, int]]: ...

@final
class Lookup:
    @property
    def num_matched_tokens(self) -> int: ...
    @property
    def num_reused_blocks(self) -> int: ...
    @property
    def partial(self) -> bool: ...
    @property
    def partial_tokens(self) -> int: ...
    @property
    def partial_kind(self) -> str | None: ...
    @property
    def partial_block(self) -> int | None: ...

@final
class BlockTrie:
    def __new__(
        cls,
        num_blocks: int,
        tokens_per_block: int | None = None,
        enable_partial_reuse: bool = True,
        copy_on_partial_reuse: bool = True,
    ) -> BlockTrie: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def tokens_per_block(self) -> int: ...
    @property
    def enable_partial_reuse(self) -> bool: ...
    @property
    def copy_on_partial_reuse(self) -> bool: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_cached_blocks(self) -> int: ...
    @property
    def num_cached_tokens(self) -> int: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def clock(self) -> int: ...
    @property
    def stats(self) -> dict[str, int]: ...
    def claim(
        self,
        request_id: int,
        tokens: _Tokens,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_items: _MmItems | None = None,
        priority: int | None = None,
        retention: int | None = None,
        reserve_tokens: int | None = None,
    ) -> Claim: ...
    def lookup(
        self,
        tokens: _Tokens,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_items: _MmItems | None = None,
    ) -> Lookup: ...
    def complete(self, request_id: int) -> int: ...
    def store(self, request_id: int, tokens: _Tokens) -> int: ...
    def extend(self, request_id: int, num_tokens: int) -> list[int]: ...
    def release(self, request_id: int) -> None: ...
    def advance_clock(self, ticks: int) -> None: ...
    def request_blocks(self, request_id: int) -> list[int]: ...
    def take_events(self) -> list[TrieBlockStored | TrieBlockRemoved]: ...
    def dump(self) -> list[dict[str, Any]]: ...
    def check_invariants(self) -> None: ...

_ExtraKey = str | bytes | int | bool | None | tuple[Any, ...]
_BlockKeys = tuple[_ExtraKey, ...] | None

@final
class BlockHasher:
    """vLLM v1's chained block hashes for one algorithm, block size and NONE_HASH seed."""

    def __new__(
        cls, block_size: int = 16, algo: str = "sha256", seed: str | None = None
    ) -> BlockHasher: ...
    @property
    def none_hash(self) -> bytes: ...
    @property
    def block_size(self) -> int: ...
    @property
    def algo(self) -> str: ...
    @property
    def seed(self) -> str: ...
    def hash_blocks(
        self,
        tokens: _Tokens,
        extra_keys: Sequence[_BlockKeys] | None = None,
        parent: bytes | None = None,
    ) -> list[bytes]: ...
    def hash_block(
        self, parent: bytes | None, tokens: _Tokens, extra_keys: _BlockKeys = None
    ) -> bytes: ...

def hash_block_tokens(
    algo: str,
    parent: bytes | None,
    tokens: _Tokens,
    extra_keys: _BlockKeys = None,
    seed: str | None = None,
) -> bytes: ...

_Ids = Sequence[int] | npt.NDArray[np.integer[Any]] | Any
_Event = Any  # prefixcache.events.BlockStored | BlockRemoved | AllBlocksCleared

@final
class BlockPool:
    """vLLM v1's block pool: block 0 is the null block, an LRU free queue, and a
    prefix-cache table from (hash, group) to blocks."""

    def __new__(
        cls,
        num_blocks: int,
        enable_caching: bool = True,
        enable_kv_cache_events: bool = False,
        event_hash_format: str = "u64",
    ) -> BlockPool: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def usage(self) -> float: ...
    @property
    def enable_caching(self) -> bool: ...
    def get_new_blocks(self, num_blocks: int) -> _I64Array: ...
    def touch(self, block_ids: _Ids) -> None: ...
    def free_blocks(self, block_ids: _Ids) -> None: ...
    def cache_full_blocks(
        self,
        block_ids: _Ids,
        block_hashes: Sequence[bytes],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int = 0,
        token_ids: _Tokens | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
        extra_keys: Sequence[_BlockKeys] | None = None,
    ) -> None: ...
    def get_cached_block(
        self, block_hash: bytes, group_ids: Sequence[int] = ...
    ) -> list[int] | None: ...
    def evict_blocks(self, block_ids: _Ids) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def take_events(self) -> list[_Event]: ...
    def ref_cnt(self, block_id: int) -> int: ...
    def block_hash(self, block_id: int) -> bytes | None: ...
    def free_block_ids(self) -> _I64Array: ...
    def check_invariants(self) -> None: ...

@final
class KVCacheManager:
    """vLLM v1's request-level KV-cache manager over one block pool (one KV-cache group,
    full attention or sliding window). Request ids are ints in [0, 2**64)."""

    def __new__(
        cls,
        num_blocks: int,
        block_size: int = 16,
        hash_algo: str = "sha256",
        enable_caching: bool = True,
        sliding_window: int | None = None,
        enable_kv_cache_events: bool = False,
        seed: str | None = None,
        event_hash_format: str = "u64",
    ) -> KVCacheManager: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def sliding_window(self) -> int | None: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def usage(self) -> float: ...
    @property
    def stats(self) -> dict[str, int | bool]: ...
    def take_stats(self) -> dict[str, int | bool]: ...
    def add_request(
        self,
        request_id: int,
        prompt_tokens: _Tokens,
        extra_keys: Sequence[_BlockKeys] | None = None,
        default_extra_keys: _BlockKeys = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None: ...
    def append_tokens(self, request_id: int, tokens: _Tokens) -> None: ...
    def get_computed_blocks(self, request_id: int) -> tuple[_I64Array, int]: ...
    def allocate_slots(
        self,
        request_id: int,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: _Ids | None = None,
        num_lookahead_tokens: int = 0,
    ) -> _I64Array | None: ...
    def free(self, request_id: int) -> None: ...
    def preempt(self, request_id: int) -> None: ...
    def admit(
        self,
        request_id: int,
        prompt_tokens: _Tokens,
        num_lookahead_tokens: int = 0,
        extra_keys: Sequence[_BlockKeys] | None = None,
        default_extra_keys: _BlockKeys = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> tuple[int, _I64Array] | None: ...
    def finish(self, request_id: int, output_tokens: _Tokens | None = None) -> bool: ...
    def block_ids(self, request_id: int) -> _I64Array: ...
    def num_tokens(self, request_id: int) -> int: ...
    def num_computed_tokens(self, request_id: int) -> int: ...
    def block_hashes(self, request_id: int) -> list[bytes]: ...
    def __contains__(self, key: int, /) -> bool: ...
    def __len__(self) -> int: ...
    def reset_prefix_cache(self) -> bool: ...
    def evict_blocks(self, block_ids: _Ids) -> None: ...
    def take_events(self, compact: bool = False) -> list[_Event]:
        """The KV events since the last call, as vLLM publishes them. ``compact``: each
        ``BlockStored`` carries ``token_ids=None`` and runs of ``BlockRemoved`` are merged
        into one event (the same index state; what a router's fleet index needs)."""
        ...
    def free_block_ids(self) -> _I64Array: ...
    def ref_cnt(self, block_id: int) -> int: ...
    def block_hash(self, block_id: int) -> bytes | None: ...
    def check_invariants(self) -> None: ...

_KvOp = tuple[str, str | None, list[int]]
_Hashes = Sequence[int] | Sequence[bytes] | npt.NDArray[np.uint64] | npt.NDArray[np.int64] | Any

@final
class FleetMatch:
    """Each worker's longest held prefix of one request (in blocks), per medium and on any
    medium, its score and its health (``KvIndex.longest_prefix``)."""

    @property
    def num_blocks(self) -> int:
        """Number of blocks in the request."""
    @property
    def media(self) -> list[str]:
        """The media known to the index when the query ran."""
    @property
    def workers(self) -> list[str]:
        """Worker names, in the index's slot order."""
    def blocks(self, worker: str, medium: str | None = None) -> int:
        """Longest prefix ``worker`` holds on ``medium``, or with every block on some medium."""
    def score(self, worker: str) -> float:
        """Sum over the any-medium prefix of the best medium weight per block."""
    def stale(self, worker: str) -> bool:
        """Batches are missing: the worker's entry may be out of date."""
    def expired(self, worker: str) -> bool:
        """The worker has been silent for longer than the index's TTL."""
    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{worker: {"blocks", "media": {medium: blocks}, "score", "stale", "expired"}}``."""
    def __len__(self) -> int: ...

@final
class KvIndex:
    """The fleet index, embedded: which workers hold which block hashes, per medium, fed
    by vLLM / SGLang KV events (docs/FLEET.md). Thread-safe."""

    def __new__(cls, ttl: float | None = None, hash_bytes: int | None = None) -> KvIndex: ...
    @property
    def ttl(self) -> float | None:
        """Seconds of silence after which a worker counts as expired (None: never)."""
    @property
    def hash_bytes(self) -> int:
        """Width of byte-string hashes (32 sha256, 16 xxhash); ints are always accepted."""
    @property
    def num_hashes(self) -> int:
        """Distinct hashes held by at least one worker."""
    @property
    def media(self) -> list[str]:
        """Media seen so far, in the order they were first seen."""
    def workers(self) -> list[str]:
        """Worker names, in slot order."""
    def add_worker(self, worker: str, now: float | None = None) -> None:
        """Adds a worker (no-op when known); ``now`` (default ``time.time()``) starts its TTL."""
    def remove_worker(self, worker: str) -> None:
        """Removes a worker and everything it holds (``UnknownWorkerError`` if unknown)."""
    def reset_worker(self, worker: str, next_seq: int | None = None) -> None:
        """Forgets what ``worker`` holds and expects sequence number ``next_seq`` (default 0)
        next."""
    def apply(
        self, worker: str, events: Any, seq: int | None = None, now: float | None = None
    ) -> str:
        """Applies event objects (``prefixcache.events``, vLLM's classes, or "type"-tagged
        dicts); returns "applied", "duplicate" or "gap"."""
    def apply_frames(self, worker: str, frames: Sequence[bytes], now: float | None = None) -> str:
        """Applies one ZMQ message ``[topic, seq (8 bytes big-endian), msgpack payload]``."""
    def longest_prefix(
        self,
        hashes: _Hashes = None,
        *,
        tokens: _Tokens | None = None,
        hasher: BlockHasher | None = None,
        weights: dict[str, float] | None = None,
        now: float | None = None,
    ) -> FleetMatch:
        """Every worker's longest held prefix of a request (its block hashes, or its tokens
        and a ``BlockHasher``), per medium and on any medium."""
    def top_k(
        self,
        hashes: _Hashes = None,
        k: int | None = None,
        *,
        tokens: _Tokens | None = None,
        hasher: BlockHasher | None = None,
        weights: dict[str, float] | None = None,
        now: float | None = None,
        include_unhealthy: bool = False,
    ) -> list[tuple[str, float, int]]:
        """The ``k`` (default 1) best workers as ``(worker, score, blocks)``, best first;
        stale and expired workers are left out unless ``include_unhealthy``."""
    def status(self, worker: str, now: float | None = None) -> dict[str, Any]:
        """Sequence state, health and counters of one worker."""
    def cached_hashes(self, worker: str, medium: str | None = None) -> list[int]:
        """The hashes ``worker`` holds (on ``medium``, or on any medium), sorted."""
    def prune_expired(self, now: float | None = None) -> list[str]:
        """Removes the workers silent for longer than the TTL; returns their names."""
    def check_invariants(self) -> None:
        """Full consistency check (tests); raises AssertionError."""

def decode_kv_frames(
    frames: Sequence[bytes], hash_bytes: int | None = None
) -> tuple[int, float, int | None, list[_KvOp]]:
    """``(seq, ts, dp_rank, ops)`` of one ZMQ message; ops are ``(kind, medium, hashes)``
    with kind "stored", "removed" or "cleared"."""

def decode_kv_events(events: Any, hash_bytes: int | None = None) -> list[_KvOp]:
    """Event objects as ``(kind, medium, hashes)`` ops (the conversion ``KvIndex.apply`` uses)."""

def fleet_bitmap_walk(
    rows: list[bytes | None],
    num_media: int,
    slots: Sequence[int],
    weights: Sequence[float] | None = None,
) -> tuple[list[int], list[int], list[float]]:
    """The longest-prefix walk over Redis holder bitmaps (``SETBIT`` layout):
    ``rows[m * n + i]`` is block ``i`` on medium ``m``; per worker of ``slots``: blocks,
    per-medium blocks (flattened, ``worker * num_media + medium``), scores."""
