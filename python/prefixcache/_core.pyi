"""Type stubs of the compiled module ``prefixcache._core`` (checked by mypy.stubtest).

Token ids are ints in ``[0, 2**32)`` and KV indices ints in the int64 range, given in any
form of ``_Tokens`` (docs/API.md, "Input forms"); every form gives what the equivalent
list gives. Bad input raises an exception from ``prefixcache.errors`` and changes nothing
(docs/ERRORS.md).
"""

import array
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, final, overload

import numpy as np
import numpy.typing as npt

from prefixcache.trie_events import TrieBlockMoved, TrieBlockRemoved, TrieBlockStored

__version__: str
__all__ = [
    "BlockHasher",
    "BlockPool",
    "BlockTrie",
    "Claim",
    "CpuOffloadManager",
    "FleetMatch",
    "InsertResult",
    "KVCacheManager",
    "KvIndex",
    "LabCache",
    "Lookup",
    "MatchResult",
    "Node",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "RadixCache",
    "TokenBuffer",
    "__version__",
    "decode_kv_events",
    "decode_kv_frames",
    "expand_block_ids",
    "fleet_bitmap_walk",
    "fleet_flag_arg",
    "fleet_hash_bytes_arg",
    "fleet_k_arg",
    "fleet_medium_arg",
    "fleet_now_arg",
    "fleet_request_hashes",
    "fleet_seq_arg",
    "fleet_ttl_arg",
    "fleet_weights_arg",
    "fleet_worker_arg",
    "hash_block_tokens",
    "lab_block_keys",
]

@final
class TokenBuffer:
    """A growable buffer of token ids, converted once and accepted as-is by every method
    that takes tokens (no conversion per call). A call sees the tokens as they were when
    it started; appends meanwhile (other threads) do not change what it reads."""

    def __new__(cls, tokens: _Tokens | None = None) -> TokenBuffer:
        """A buffer holding ``tokens`` (any accepted form; empty by default)."""
    def append(self, token: int) -> None:
        """Appends one token id (an int in ``[0, 2**32)``)."""
    def extend(self, tokens: _Tokens) -> None:
        """Appends token ids given in any accepted form."""
    def truncate(self, length: int) -> None:
        """Keeps the first ``length`` tokens (no-op when it holds fewer)."""
    def clear(self) -> None:
        """Removes every token."""
    def __len__(self) -> int:
        """The number of tokens."""
    @overload
    def __getitem__(self, key: int, /) -> int:
        """The token at ``key`` (negative indices count from the end)."""
    @overload
    def __getitem__(self, key: slice, /) -> TokenBuffer:
        """A new buffer of the tokens the slice names."""
    def __eq__(self, other: object, /) -> bool:
        """Whether ``other`` is a ``TokenBuffer`` holding the same tokens."""
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
    ) -> npt.NDArray[Any]:
        """numpy's array protocol: the tokens as a new uint32 array (``np.asarray(buf)``);
        ``copy=False`` raises ValueError (the tokens are always copied)."""
    def __reduce__(self) -> tuple[type[TokenBuffer], tuple[npt.NDArray[np.uint32]]]:
        """Pickles as its tokens."""
    def tolist(self) -> list[int]:
        """The tokens as a list of ints."""
    def numpy(self) -> npt.NDArray[np.uint32]:
        """The tokens as a new uint32 numpy array (a copy)."""

class _ArrayInterface(Protocol):
    """A CPU array exposing numpy's ``__array_interface__``."""

    @property
    def __array_interface__(self) -> dict[str, Any]: ...

class _DLPack(Protocol):
    """A tensor exposing ``__dlpack__`` (torch, jax, numpy, ...); read when on the CPU."""

    def __dlpack__(self) -> object: ...

_Tokens = (
    list[int]
    | tuple[int, ...]
    | range
    | TokenBuffer
    | array.array[int]
    | memoryview
    | npt.NDArray[np.integer[Any]]
    | _ArrayInterface
    | _DLPack
)
_Values = _Tokens
_Ids = _Tokens
_I64Array = npt.NDArray[np.int64]

# ----- SGLang radix tree ---------------------------------------------------------------

@final
class Node:
    """A handle to a tree node; stale (raises) once the node is evicted or the tree reset."""

    def __eq__(self, value: object, /) -> bool:
        """Whether both handles name the same node."""
    def __hash__(self) -> int:
        """A hash consistent with ``==``."""

@final
class MatchResult:
    """The result of ``RadixCache.match_prefix``."""

    @property
    def length(self) -> int:
        """Tokens matched on the device (page-aligned)."""
    @property
    def node(self) -> Node:
        """The last device node of the matched path (lock it while the request runs)."""
    @property
    def host_hit_length(self) -> int:
        """Matched tokens after ``length`` held only in host memory (0 without a host
        tier): what ``RadixCache.load_back(last_host_node)`` would load."""
    @property
    def last_host_node(self) -> Node:
        """The last node of the whole match, host part included (``node`` when
        ``host_hit_length`` is 0)."""
    @property
    def indices(self) -> _I64Array:
        """The KV indices of the matched prefix, built on first access (read it while the
        node lives)."""

@final
class InsertResult:
    """The result of ``RadixCache.insert``."""

    @property
    def prefix_len(self) -> int:
        """Tokens that were already cached: the caller frees its own duplicate indices."""
    @property
    def node(self) -> Node:
        """The last node of the inserted key's path."""

@final
class RadixCache:
    """SGLang 0.5.23's RadixCache: a token-level radix tree of KV indices."""

    def __new__(
        cls,
        page_size: int | None = None,
        eviction_policy: str = "lru",
        host_capacity: int = 0,
        write_policy: str = "write_through",
        host_events: bool = False,
    ) -> RadixCache:
        """A tree with pages of ``page_size`` tokens (default 1) and an eviction policy
        (lru, lfu, fifo, mru, filo, priority, slru). ``host_capacity`` > 0 puts SGLang's
        HiCache host tier of that many tokens behind it, with ``write_policy``
        write_through, write_through_selective or write_back (SEMANTICS.md 1.9).
        ``host_events`` (needs a host tier) keeps each host copy's values, for
        ``take_host_events``."""
    @property
    def host_capacity(self) -> int:
        """Host memory behind the device, in tokens (0: no host tier)."""
    @property
    def write_policy(self) -> str | None:
        """When nodes are copied to host memory (None without a host tier)."""
    def host_size(self) -> int:
        """Tokens in host memory (backed-up nodes, on the device or host-only)."""
    @property
    def num_host_only_nodes(self) -> int:
        """Host-only nodes: backed up, their device KV evicted (0 without a host tier)."""
    def host_stats(self) -> dict[str, int]:
        """Host tier counters in tokens: stored_tokens, host_evicted_tokens,
        loaded_tokens, peak_host_tokens."""
    def host_state(self, node: Node) -> tuple[bool, bool]:
        """``(backed_up, host_only)`` of ``node``: has a host copy; has no device KV."""
    def host_dump(self) -> list[tuple[bool, bool]]:
        """``(backed_up, host_only)`` of every non-root node, in ``dump()`` order."""
    def load_back(self, node: Node, values: _Values | None = None) -> int:
        """Loads the host-only nodes on the path to ``node`` back to the device with KV
        indices ``values`` (default: the tokens), all or nothing; returns the tokens
        loaded. The caller makes room on the device first."""
    def evict_host(self, num_tokens: int) -> int:
        """Evicts host-only leaves until at least ``num_tokens`` host tokens are freed (or
        none is left); returns the host tokens freed."""
    @property
    def host_events(self) -> bool:
        """Whether the host copies' values are kept (``host_events=True``)."""
    def take_host_events(self, nonzero: bool = False) -> tuple[_I64Array, _I64Array]:
        """``(stored, dropped)``: the values of the host copies made and of those dropped
        since the last call, in order, each copy's values as its node had them when it
        was copied (a load back gives the device fresh values, the copy keeps its own; a
        split copy is reported in its parts). A copy made and dropped within the period
        is in both. ``reset()`` drops the copies unreported. Empty without
        ``host_events``. ``nonzero``: without the values that are 0 (for a caller that
        labels only some tokens)."""
    def host_values_dump(self) -> list[_I64Array]:
        """The values of every non-root node's host copy, in ``dump()`` order (empty for
        a node without one, or without ``host_events``)."""
    @property
    def page_size(self) -> int:
        """Tokens per page."""
    @property
    def eviction_policy(self) -> str:
        """The eviction policy's name."""
    @property
    def clock(self) -> int:
        """The logical clock: advanced by one by every ``match_prefix`` and ``insert``."""
    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, the root excluded."""
    @property
    def root(self) -> Node:
        """The root node."""
    def match_prefix(
        self, tokens: _Tokens, extra_key: str | None = None, cache_salt: str | None = None
    ) -> MatchResult:
        """The longest cached prefix of ``tokens`` in the namespace (page-aligned); may
        split a node."""
    def insert(
        self,
        tokens: _Tokens,
        values: _Values | None = None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        priority: int | None = None,
        inserted_len: int | None = None,
    ) -> InsertResult:
        """Inserts ``tokens`` with KV indices ``values`` (default: the tokens). Existing
        values are never replaced; ``prefix_len`` says how many tokens were cached on the
        device (host-only nodes on the path take the inserted values)."""
    def inc_lock_ref(self, node: Node) -> int:
        """Locks the path from ``node`` to the root; returns the evictable-size change."""
    def dec_lock_ref(self, node: Node) -> int:
        """Unlocks the path from ``node`` to the root; returns the evictable-size change."""
    def evict(self, num_tokens: int) -> _I64Array:
        """Evicts whole leaves until at least ``num_tokens`` are freed (or nothing is
        evictable); returns the freed KV indices in eviction order. With a host tier a
        backed-up leaf stays in the tree, host-only."""
    def evict_count(self, num_tokens: int) -> int:
        """Evicts exactly as ``evict`` does (the same leaves, in the same order) but
        returns only the number of tokens freed: no array of indices is built."""
    def evictable_size(self) -> int:
        """Device tokens in unlocked nodes."""
    def protected_size(self) -> int:
        """Device tokens in locked nodes."""
    def total_size(self) -> int:
        """Device tokens in the tree."""
    def path_indices(self, node: Node) -> _I64Array:
        """The KV indices on the path from the root to ``node``."""
    def parent(self, node: Node) -> Node | None:
        """The parent of ``node`` (None for the root)."""
    def node_info(self, node: Node) -> dict[str, Any]:
        """Fields of one node: length, lock_ref, hit_count, priority, last_access_time,
        creation_time, num_children, is_root, extra_key, cache_salt."""
    def dump(self) -> list[dict[str, Any]]:
        """Every non-root node, depth first, children ordered by (namespace, tokens)."""
    def check_invariants(self) -> None:
        """Checks every structural invariant; raises AssertionError on a violation."""
    def reset(self) -> None:
        """Empties the tree; every node handle issued before becomes stale."""
    def pretty_print(self) -> str:
        """A human-readable rendering of the tree."""

# ----- TensorRT-LLM block trie ---------------------------------------------------------

_MmItems = Sequence[tuple[bytes | str, int, int]]

@final
class Claim:
    """The result of ``BlockTrie.claim``."""

    @property
    def block_ids(self) -> list[int]:
        """The request's blocks: reused, taken over or fresh, then reserve blocks."""
    @property
    def num_matched_tokens(self) -> int:
        """Tokens whose KV is reused (full blocks plus the partial block's tokens)."""
    @property
    def num_reused_blocks(self) -> int:
        """Full blocks reused by exact key."""
    @property
    def partial(self) -> bool:
        """Whether the last block was reused partially."""
    @property
    def partial_tokens(self) -> int:
        """Tokens reused from the partially matched block."""
    @property
    def partial_kind(self) -> str | None:
        """How the partial block was reused: 'taken_over', 'copied', or None."""
    @property
    def partial_block(self) -> int | None:
        """The partially matched block (the copy source when copied), or None."""
    @property
    def copies(self) -> list[tuple[int, int, int]]:
        """``(src, dst, num_tokens)`` copies to perform before ``complete``."""
    @property
    def num_host_blocks(self) -> int:
        """Matched blocks that were in host memory (onboarded, or a copy's host
        source)."""
    @property
    def num_host_tokens(self) -> int:
        """Of ``num_matched_tokens``, those read from host memory."""

@final
class Lookup:
    """The result of ``BlockTrie.lookup``: what ``claim`` would reuse."""

    @property
    def num_matched_tokens(self) -> int:
        """Tokens whose KV would be reused."""
    @property
    def num_reused_blocks(self) -> int:
        """Full blocks that would be reused by exact key."""
    @property
    def partial(self) -> bool:
        """Whether the last block would be reused partially."""
    @property
    def partial_tokens(self) -> int:
        """Tokens that would be reused from the partially matched block."""
    @property
    def partial_kind(self) -> str | None:
        """How the partial block would be reused: 'taken_over', 'copied', or None."""
    @property
    def partial_block(self) -> int | None:
        """The block id a partial match would come from, or None."""
    @property
    def num_host_blocks(self) -> int:
        """Matched blocks in host memory (a claim would load them)."""
    @property
    def num_host_tokens(self) -> int:
        """Of ``num_matched_tokens``, those in host memory."""

@final
class BlockTrie:
    """TensorRT-LLM's KV block reuse: a per-block trie keyed by (LoRA id, tokens,
    multimodal keys, cache salt), partial reuse of the last block, priority-LRU eviction.
    Request ids are ints in [0, 2**64)."""

    def __new__(
        cls,
        num_blocks: int,
        tokens_per_block: int | None = None,
        enable_partial_reuse: bool = True,
        copy_on_partial_reuse: bool = True,
        host_blocks: int = 0,
        secondary_offload_min_priority: int = 30,
        enable_events: bool = True,
    ) -> BlockTrie:
        """A trie over ``num_blocks`` GPU blocks of ``tokens_per_block`` tokens (default
        64). ``host_blocks`` > 0 puts TensorRT-LLM's secondary (host) tier of that many
        blocks behind it: a GPU victim of priority >= ``secondary_offload_min_priority``
        (0..100) holding a cached block is offloaded there and a later match loads it back
        (docs/TRTLLM.md). ``enable_events=False`` records no KV events (``take_events``
        stays empty): a caller that never takes them saves their memory. Memory follows
        the blocks in use or cached: a block takes memory when first handed out, so a
        large ``num_blocks`` costs nothing up front."""
    @property
    def num_blocks(self) -> int:
        """GPU blocks (the primary pool)."""
    @property
    def host_blocks(self) -> int:
        """Blocks of host memory behind the GPU (0: no host tier)."""
    @property
    def secondary_offload_min_priority(self) -> int | None:
        """The lowest priority a GPU victim is offloaded at (None without a host tier)."""
    @property
    def num_host_cached_blocks(self) -> int:
        """Cached blocks in host memory."""
    @property
    def num_host_cached_tokens(self) -> int:
        """Tokens in the keys of the cached blocks in host memory."""
    def host_stats(self) -> dict[str, int]:
        """Host tier counters: offloaded_blocks, stored_tokens, onboarded_blocks,
        loaded_tokens, host_evicted_blocks, host_evicted_tokens, peak_host_tokens."""
    def host_dump(self) -> list[bool]:
        """Per block id (GPU and host blocks, as ``dump()``): whether it is in host
        memory."""
    @property
    def tokens_per_block(self) -> int:
        """Tokens per block."""
    @property
    def enable_partial_reuse(self) -> bool:
        """Whether the last block may be reused partially."""
    @property
    def copy_on_partial_reuse(self) -> bool:
        """Whether a partially reused block in use is copied (else it is not reused)."""
    @property
    def num_free_blocks(self) -> int:
        """Unreferenced GPU blocks, cached or not: what ``claim`` can allocate."""
    @property
    def num_cached_blocks(self) -> int:
        """Blocks cached in the trie on the GPU."""
    @property
    def num_cached_tokens(self) -> int:
        """Tokens in the keys of the cached GPU blocks."""
    @property
    def num_tokens_left_gpu(self) -> int:
        """Tokens of cached blocks that left the GPU since construction: evicted, or
        offloaded to host memory (``stats["evicted_tokens"] +
        host_stats()["stored_tokens"]``)."""
    @property
    def num_requests(self) -> int:
        """Requests holding blocks."""
    @property
    def clock(self) -> int:
        """The logical clock: +1 per claim, +ticks per ``advance_clock``."""
    @property
    def stats(self) -> dict[str, int]:
        """Counters since construction (claims, matched tokens, evictions, ...)."""
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
    ) -> Claim:
        """Phase one: looks up ``tokens`` and takes references on everything reused,
        atomically; copies keep their sources referenced until ``complete``."""
    def lookup(
        self,
        tokens: _Tokens,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_items: _MmItems | None = None,
    ) -> Lookup:
        """What ``claim`` would reuse for ``tokens``, without claiming anything."""
    def complete(self, request_id: int) -> int:
        """Phase two: the request's copies are done; releases their sources."""
    def store(self, request_id: int, tokens: _Tokens) -> int:
        """Caches the request's blocks under the keys of ``tokens``; returns how many
        blocks were newly cached."""
    def extend(self, request_id: int, num_tokens: int) -> list[int]:
        """Grows the request to ``ceil(num_tokens / tokens_per_block)`` blocks; returns
        the new block ids."""
    def release(self, request_id: int) -> None:
        """Drops the request's references."""
    def advance_clock(self, ticks: int) -> None:
        """Advances the logical clock; expired retention drops to the default priority."""
    def request_blocks(self, request_id: int) -> list[int]:
        """The blocks a request holds, in order."""
    def take_events(
        self, compact: bool = False
    ) -> list[TrieBlockStored | TrieBlockRemoved | TrieBlockMoved]:
        """The KV events since the last call (with a host tier, ``TrieBlockMoved`` when a
        cached block moves between GPU and host memory); ``compact``: ``TrieBlockStored``
        without its token ids (None)."""
    def dump(self) -> list[dict[str, Any]]:
        """Every block by id (GPU and host blocks): block_id, cached, parent, tokens,
        lora_id, cache_salt, mm_keys, ref_cnt, priority."""
    def check_invariants(self) -> None:
        """Checks every structural invariant; raises AssertionError on a violation."""

# ----- vLLM block hashes, block pool, KV-cache manager ---------------------------------

_ExtraKey = str | bytes | int | bool | None | tuple[Any, ...]
_BlockKeys = tuple[_ExtraKey, ...] | None

@final
class BlockHasher:
    """vLLM v1's chained block hashes for one algorithm, block size and NONE_HASH seed.

    SHA-256 hashes of blocks without extra keys (up to 16 tokens) go through a table of
    recent hashes that each hashing thread keeps (576 KB, from its first such hash): a
    block hashed before (a shared prefix) costs a lookup instead of SHA-256, with the
    same result."""

    def __new__(
        cls, block_size: int = 16, algo: str = "sha256", seed: str | None = None
    ) -> BlockHasher:
        """A hasher (algo: sha256, sha256_cbor, xxhash, xxhash_cbor, xxh3_64); seed None
        = ``PYTHONHASHSEED`` when set, else "vllm-none-hash"."""
    @property
    def none_hash(self) -> bytes:
        """NONE_HASH: the parent of the first block."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def algo(self) -> str:
        """The hash algorithm's name."""
    @property
    def seed(self) -> str:
        """The NONE_HASH seed."""
    def hash_blocks(
        self,
        tokens: _Tokens,
        extra_keys: Sequence[_BlockKeys] | None = None,
        parent: bytes | None = None,
    ) -> list[bytes]:
        """Hashes of the full blocks of ``tokens`` (a partial tail is not hashed);
        ``parent`` None or b"" = NONE_HASH."""
    def hash_block(
        self, parent: bytes | None, tokens: _Tokens, extra_keys: _BlockKeys = None
    ) -> bytes:
        """The hash of one full block (exactly ``block_size`` tokens)."""

def hash_block_tokens(
    algo: str,
    parent: bytes | None,
    tokens: _Tokens,
    extra_keys: _BlockKeys = None,
    seed: str | None = None,
) -> bytes:
    """vLLM's ``hash_block_tokens`` for any token count; parent None or b"" = NONE_HASH."""

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
    ) -> BlockPool:
        """A pool of ``num_blocks`` blocks (block 0 reserved); events report hashes as
        'u64' (vLLM's default) or 'bytes'."""
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue."""
    @property
    def num_evicted_blocks(self) -> int:
        """Cached blocks whose hash was dropped because the block was reused."""
    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash now: what the prefix cache holds."""
    @property
    def num_touched_blocks(self) -> int:
        """Blocks ever handed out or hit; memory follows this, not num_blocks."""
    @property
    def usage(self) -> float:
        """``1 - free / (num_blocks - 1)``."""
    @property
    def enable_caching(self) -> bool:
        """Whether full blocks are cached by hash."""
    def get_new_blocks(self, num_blocks: int) -> _I64Array:
        """Pops blocks from the head of the free queue, each with ``ref_cnt = 1``."""
    def touch(self, block_ids: _Ids) -> None:
        """``ref_cnt += 1``; a block at 0 leaves the free queue."""
    def free_blocks(self, block_ids: _Ids) -> None:
        """``ref_cnt -= 1`` in eviction order; blocks reaching 0 return to the queue."""
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
    ) -> None:
        """Registers ``block_ids[num_cached:num_full]`` under their hashes (vLLM's
        ``cache_full_blocks``) and emits one ``BlockStored``."""
    def get_cached_block(
        self, block_hash: bytes, group_ids: Sequence[int] = ...
    ) -> list[int] | None:
        """The cached block of each group for ``block_hash``, None on any miss."""
    def evict_blocks(self, block_ids: _Ids) -> None:
        """Drops the cached hashes of free blocks (vLLM's ``evict_blocks``)."""
    def reset_prefix_cache(self) -> bool:
        """Forgets every cached hash when no block is in use; False otherwise."""
    def take_events(self) -> list[_Event]:
        """The KV events since the last call."""
    def ref_cnt(self, block_id: int) -> int:
        """The reference count of a block."""
    def block_hash(self, block_id: int) -> bytes | None:
        """The hash a block is cached under, or None."""
    def free_block_ids(self) -> _I64Array:
        """The free queue, head first."""
    def check_invariants(self) -> None:
        """Raises AssertionError if an internal invariant is broken."""

@final
class PrepareStoreOutput:
    """vLLM's ``PrepareStoreOutput``: the keys to write now (in offer order), the host
    chunk id each gets, and the keys evicted to make room (in eviction order)."""

    @property
    def keys_to_store(self) -> list[bytes]: ...
    @property
    def chunk_ids(self) -> list[int]: ...
    @property
    def evicted_keys(self) -> list[bytes]: ...

@final
class OffloadingEvent:
    """vLLM's ``OffloadingEvent``: keys stored (``removed`` False) or removed from the
    host tier; ``medium`` is "CPU"; ``metadata_only``: a failed store released them."""

    @property
    def keys(self) -> list[bytes]: ...
    @property
    def removed(self) -> bool: ...
    @property
    def medium(self) -> str: ...
    @property
    def metadata_only(self) -> bool: ...

@final
class CpuOffloadManager:
    """vLLM 0.33's ``CPUOffloadingManager``: ``num_chunks`` host slots behind the GPU
    block pool, LRU or ARC eviction, a store admitted once its key was offered
    ``store_threshold`` times (docs/SEMANTICS.md section 2.4). Keys are block hashes
    (bytes, 1 to 32); a request id (int in [0, 2**64)) names vLLM's per-request context
    (key positions, accesses)."""

    def __new__(
        cls,
        num_chunks: int,
        cache_policy: str = "lru",
        store_threshold: int = 1,
        max_tracker_size: int = 64000,
        enable_events: bool = False,
    ) -> CpuOffloadManager: ...
    @property
    def num_chunks(self) -> int: ...
    @property
    def cache_policy(self) -> str: ...
    @property
    def store_threshold(self) -> int: ...
    @property
    def max_tracker_size(self) -> int: ...
    @property
    def num_stored(self) -> int:
        """Chunks held (stored or being stored)."""
    @property
    def num_free_chunks(self) -> int: ...
    @property
    def num_idle(self) -> int:
        """Stored chunks no load reads (evictable)."""
    @property
    def num_write_pending(self) -> int:
        """Chunks whose store is in flight (not loadable yet)."""
    @property
    def num_tracked(self) -> int:
        """Keys the store-threshold tracker counts (0 with threshold 1)."""
    @property
    def num_stored_total(self) -> int:
        """Chunks prepared for storing since construction."""
    @property
    def num_evicted_total(self) -> int:
        """Chunks evicted since construction."""
    def on_new_request(self, request_id: int) -> None:
        """Open the request's context (vLLM's ``on_new_request``)."""
    def set_offload_key_positions(
        self, request_id: int, keys: list[bytes] | tuple[bytes, ...], end_tokens: _Ids
    ) -> None:
        """Each key's end token in the request (vLLM's
        ``ReqContext.set_offload_key_position``): orders the request's accesses."""
    def set_request_keys(
        self, request_id: int, keys: list[bytes] | tuple[bytes, ...], tokens_per_key: int
    ) -> None:
        """The request's keys in block order, key i ending at token
        ``(i + 1) * tokens_per_key`` (the connector's offload keys): the ``*_range``
        calls name slices of them."""
    def set_request_keys_from(self, manager: KVCacheManager, request_id: int) -> None:
        """``set_request_keys`` with the full blocks' hashes and the block size of a
        KVCacheManager's request (no Python object per block). UnknownRequestError when
        the manager has no such request."""
    def lookup_prefix_range(self, request_id: int, start: int, stop: int) -> int | None:
        """``lookup_prefix`` over the request's keys ``start:stop``."""
    def prepare_load_range(self, request_id: int, start: int, stop: int) -> int:
        """``prepare_load`` of the request's keys ``start:stop``; how many were pinned."""
    def complete_load_range(self, request_id: int, start: int, stop: int) -> None:
        """``complete_load`` of the request's keys ``start:stop``."""
    def prepare_store_range(
        self, request_id: int, start: int, stop: int, complete: bool = False
    ) -> tuple[int, int] | None:
        """``prepare_store`` of the request's keys ``start:stop``: (how many keys were
        stored, how many evicted), or None when eviction cannot free enough; with
        ``complete`` the stored keys' ``complete_store`` follows at once."""
    def lookup(self, key: bytes) -> str:
        """ "HIT" (stored, loadable), "HIT_PENDING" (being stored) or "MISS"."""
    def lookup_prefix(self, keys: list[bytes] | tuple[bytes, ...]) -> int | None:
        """The connector's prefix lookup: how many leading keys are stored; None when one
        of them is still being stored (the lookup defers)."""
    def prepare_load(self, request_id: int, keys: list[bytes] | tuple[bytes, ...]) -> list[int]:
        """Pin stored, ready keys for a load (not evictable until ``complete_load``);
        returns their chunk ids. BlockStateError (nothing changed) when one is not, or
        when a chunk would count more than 2**31 - 1 loads in flight."""
    def touch(self, request_id: int, keys: list[bytes] | tuple[bytes, ...]) -> None:
        """Mark keys recently used (vLLM's ``touch``)."""
    def complete_load(self, request_id: int, keys: list[bytes] | tuple[bytes, ...]) -> None:
        """Unpin keys of a finished load. BlockStateError (nothing changed) when a key
        has no load in flight."""
    def prepare_store(
        self, request_id: int, keys: list[bytes] | tuple[bytes, ...]
    ) -> PrepareStoreOutput | None:
        """Offer distinct keys for storing: which to write now, their chunk ids, the keys
        evicted for them; None when eviction cannot free enough (nothing stored)."""
    def complete_store(
        self, request_id: int, keys: list[bytes] | tuple[bytes, ...], success: bool = True
    ) -> None:
        """Finish a store: the keys become loadable, or with ``success=False`` are dropped."""
    def on_request_finished(self, request_id: int) -> None:
        """Apply the request's accesses to the policy and drop its context."""
    def reset_cache(self) -> None:
        """Drop every chunk (vLLM's ``reset_cache``)."""
    def take_events(self) -> list[OffloadingEvent]:
        """The events since the last call, in order (needs ``enable_events=True``)."""
    def take_kv_events(self, event_hash_format: str = "u64", compact: bool = False) -> list[_Event]:
        """The events since the last call as the KV events vLLM's OffloadingConnector
        publishes for them (medium "CPU": one BlockStored per stored key, hash only;
        one BlockRemoved per eviction); ``compact`` merges runs of removals (and gives u64
        hashes as a uint64 array, as ``KVCacheManager.take_events``)."""
    def check_invariants(self) -> None:
        """Raise AssertionError if an internal invariant is broken (for tests)."""

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
    ) -> KVCacheManager:
        """A manager over a pool of ``num_blocks`` blocks of ``block_size`` tokens."""
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def sliding_window(self) -> int | None:
        """The sliding window in tokens, None for full attention."""
    @property
    def enable_caching(self) -> bool:
        """Whether prefix caching is on."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue."""
    @property
    def num_evicted_blocks(self) -> int:
        """Cached blocks whose hash was dropped because the block was reused."""
    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash now: what the prefix cache holds."""
    @property
    def num_touched_blocks(self) -> int:
        """Blocks ever handed out or hit; memory follows this, not num_blocks."""
    @property
    def usage(self) -> float:
        """``1 - free / (num_blocks - 1)``."""
    @property
    def stats(self) -> dict[str, int | bool]:
        """Prefix-cache stats (vLLM's PrefixCacheStats fields) since construction or the
        last ``take_stats()``, which resets them."""
    def take_stats(self) -> dict[str, int | bool]:
        """The stats since the last call, resetting them."""
    def add_request(
        self,
        request_id: int,
        prompt_tokens: _Tokens,
        extra_keys: Sequence[_BlockKeys] | None = None,
        default_extra_keys: _BlockKeys = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None:
        """Registers a request and hashes its full prompt blocks."""
    def append_tokens(self, request_id: int, tokens: _Tokens) -> None:
        """Appends tokens (decode output) to a request, hashing blocks that became full."""
    def get_computed_blocks(self, request_id: int) -> tuple[_I64Array, int]:
        """(hit block ids, hit length in tokens); null blocks mark skipped window blocks."""
    def allocate_slots(
        self,
        request_id: int,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: _Ids | None = None,
        num_lookahead_tokens: int = 0,
    ) -> _I64Array | None:
        """vLLM's ``allocate_slots``: the NEW block ids, or None when the pool is short
        (nothing changes then)."""
    def free(self, request_id: int) -> None:
        """Frees the request's blocks (they stay cached) and forgets the request."""
    def preempt(self, request_id: int) -> None:
        """Frees the request's blocks and keeps it for a later re-admission."""
    def admit(
        self,
        request_id: int,
        prompt_tokens: _Tokens,
        num_lookahead_tokens: int = 0,
        extra_keys: Sequence[_BlockKeys] | None = None,
        default_extra_keys: _BlockKeys = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> tuple[int, _I64Array] | None:
        """add_request + get_computed_blocks + allocate_slots: (hit tokens, the request's
        block ids), or None (request forgotten) when the pool is short."""
    def finish(self, request_id: int, output_tokens: _Tokens | None = None) -> bool:
        """append_tokens(output) + allocate_slots + free; False when the output did not
        fit (nothing of it cached). The request is freed either way."""
    def extend(self, request_ids: _Ids, tokens: _Tokens, counts: _Ids) -> tuple[_I64Array, int]:
        """append_tokens + allocate_slots for several running requests in one call (decode
        steps): request_ids[j] takes the next counts[j] of tokens. Stops at the first
        request the pool cannot take (which changes nothing). (blocks each applied item
        evicted, as an int64 array as long as the items applied; the most cached blocks
        before the first item or after any applied one)."""
    def queue_tokens(self, request_id: int, tokens: _Tokens) -> None:
        """Queues tokens the request appends over its next decode steps
        (``decode_steps``), after any already queued: a simulator that knows a request's
        output hands it over once. The queue lives as long as the request."""
    def num_queued_tokens(self, request_id: int) -> int:
        """The request's queued tokens not yet fed by ``decode_steps``."""
    def decode_steps(self, request_ids: _Ids, num_steps: int) -> tuple[_I64Array, int]:
        """``num_steps`` decode steps of each request, in order: its next ``num_steps``
        queued tokens appended and computed, as ``extend`` does with them. Stops at the
        first request the pool cannot take, which changes nothing (its tokens stay
        queued). Returns (blocks each applied request evicted, int64 array; the most
        blocks the prefix cache held before the first or after any applied request).
        ``InvalidInputError`` (nothing changed) for ``num_steps < 1``, an id given twice,
        a request without slots or with fewer queued tokens than ``num_steps``."""
    def max_decode_steps(self, request_ids: _Ids, max_steps: int) -> int:
        """The most decode steps (at most ``max_steps``) every request can take together
        with the pool's free blocks: the largest ``k`` for which the new blocks they need
        to hold ``k`` more tokens each fit. Exact for full attention; a lower bound with a
        sliding window, which releases blocks as it moves."""
    def block_ids(self, request_id: int) -> _I64Array:
        """The request's blocks."""
    def num_tokens(self, request_id: int) -> int:
        """The request's tokens (prompt and appended output)."""
    def num_computed_tokens(self, request_id: int) -> int:
        """The request's computed tokens."""
    def block_hashes(self, request_id: int) -> list[bytes]:
        """The hashes of the request's full blocks."""
    def __contains__(self, key: int, /) -> bool:
        """Whether a request id is registered."""
    def __len__(self) -> int:
        """Registered requests."""
    def reset_prefix_cache(self) -> bool:
        """Forgets every cached hash when no block is in use; False otherwise."""
    def evict_blocks(self, block_ids: _Ids) -> None:
        """Drops the cached hashes of free blocks."""
    def take_events(self, compact: bool = False) -> list[_Event]:
        """The KV events since the last call, as vLLM publishes them. ``compact``: each
        ``BlockStored`` carries ``token_ids=None``, runs of ``BlockRemoved`` are merged
        into one event and u64 hashes come as a uint64 array (the same index state; what a
        router's fleet index needs)."""
    def free_block_ids(self) -> _I64Array:
        """The free queue, head first."""
    def ref_cnt(self, block_id: int) -> int:
        """The reference count of a block."""
    def block_hash(self, block_id: int) -> bytes | None:
        """The hash a block is cached under, or None."""
    def check_invariants(self) -> None:
        """Raises AssertionError if an internal invariant is broken."""

_KvOp = tuple[str, str | None, list[int]]
_Hashes = Sequence[int] | Sequence[bytes] | npt.NDArray[np.integer[Any]] | Any

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

    def __new__(cls, ttl: float | None = None, hash_bytes: int | None = None) -> KvIndex:
        """An empty index; ``ttl`` seconds of silence expire a worker (None: never),
        ``hash_bytes`` the width of byte-string hashes (default 32)."""
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
        """Every worker's longest held prefix of a request (its block hashes: ints or
        digests in a list or tuple, or a 1-D array of any integer dtype; or its tokens and a
        ``BlockHasher``), per medium and on any medium."""
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

# The argument conversions of ``KvIndex``, for the Redis backend (the same rules and
# errors for both backends; conversion only).

def fleet_worker_arg(worker: object) -> str:
    """``worker`` as ``KvIndex`` takes it: a str of valid text."""

def fleet_medium_arg(medium: object) -> str | None:
    """``medium`` as ``KvIndex`` takes it: None or a str of valid text."""

def fleet_seq_arg(seq: object, what: str | None = None) -> int | None:
    """A sequence number argument named ``what`` (``seq`` when None): None or an int in
    ``[0, 2**63)``."""

def fleet_now_arg(now: object = None) -> float:
    """``now``: a finite number of seconds; the clock for None."""

def fleet_ttl_arg(ttl: float | None = None) -> float | None:
    """``ttl``: None or a positive finite number of seconds."""

def fleet_hash_bytes_arg(hash_bytes: object) -> int:
    """``hash_bytes``: an int from 8 to 32."""

def fleet_request_hashes(
    hash_bytes: object,
    hashes: object = None,
    tokens: object = None,
    hasher: object = None,
) -> list[int]:
    """A request's block hashes as ``KvIndex`` queries take them (``hashes``, or ``tokens``
    with a ``BlockHasher``), as index keys (ints < 2**64)."""

def fleet_weights_arg(weights: object = None) -> list[tuple[str, float]] | None:
    """``weights``: None, or a dict of medium name -> finite weight >= 0, as pairs."""

def fleet_k_arg(k: object = None) -> int:
    """The ``k`` of ``top_k``: an int >= 0; 1 for None."""

def fleet_flag_arg(obj: object, what: str) -> bool:
    """A bool argument named ``what`` (e.g. ``include_unhealthy``)."""

_U64Array = npt.NDArray[np.uint64]

def lab_block_keys(tokens: _Tokens, block_size: int, seed: int | None = None) -> _U64Array:
    """The chained 64-bit keys of the full blocks of ``tokens`` (uint32), from namespace
    ``seed`` (lab caches only; not vLLM's hashes)."""

def expand_block_ids(block_ids: _Tokens, tokens_per_id: int, length: int) -> npt.NDArray[np.uint32]:
    """The first ``length`` tokens of the prompt made of blocks ``block_ids`` (a trace
    naming prompts by block ids, as Mooncake's ``hash_ids``): block ``b`` stands for the
    tokens ``b * tokens_per_id .. (b + 1) * tokens_per_id - 1``; fewer tokens when the
    blocks hold fewer than ``length``. ``InvalidInputError`` when a used block's tokens
    exceed 2**32 - 1 or ``tokens_per_id`` is 0."""

@final
class LabCache:
    """The simulator lab's prefix-closed block cache (not an engine rule): eviction
    ``rule`` lru, opt, slru, session, 2q, density, lfu or cost; a block is kept at release
    only once brought ``admit_after`` times; ``overcommit`` = the request-sequence model
    (take a request's blocks over budget, evict back down at release). docs/LAB.md."""

    def __new__(
        cls,
        capacity: int,
        rule: str = "lru",
        admit_after: int | None = None,
        overcommit: bool = False,
        protected: float = 0.8,
        depth_cost: float = 0.0,
        min_hit: float = 0.25,
    ) -> LabCache:
        """A cache of ``capacity`` blocks; ``protected`` is the protected share of slru / 2q,
        ``depth_cost`` how much dearer deeper blocks are for ``cost``, ``min_hit`` the
        density floor of ``density``."""
    @property
    def capacity(self) -> int:
        """The budget in blocks."""
    @property
    def num_free(self) -> int:
        """Blocks neither cached nor held (negative while overcommitted)."""
    @property
    def num_used(self) -> int:
        """Blocks in use: cached plus held by requests."""
    @property
    def num_evicted(self) -> int:
        """Cached blocks evicted so far."""
    @property
    def num_evictable(self) -> int:
        """Cached blocks no request holds (what eviction can free)."""
    def set_overcommit(self, on: bool) -> None:
        """Switches the request-sequence model on or off. Off while over the budget:
        cached blocks are evicted down to it; ``BlockStateError`` (nothing changed) when
        running requests hold more blocks than the budget."""
    def set_future(
        self, keys: _U64Array, offsets: _U64Array, hittable: npt.NDArray[np.uint32]
    ) -> None:
        """The future for ``opt``: every request's keys back to back."""
    def lookup(self, keys: _U64Array, hittable: int) -> int:
        """Cached leading blocks of ``keys`` (at most ``hittable``); changes nothing."""
    def acquire(self, rid: int, keys: _U64Array, hittable: int, total: int) -> int | None:
        """Hit in blocks, or None (nothing changed) when the budget is short. ``keys``
        chain as ``lab_block_keys`` makes them: a cached key must be cached as the child
        of the key before it (``InvalidInputError`` otherwise)."""
    def grow(self, rid: int, keys: _U64Array, total: int) -> bool:
        """Request ``rid`` now needs ``total`` blocks (its full ones keyed by ``keys``);
        False (nothing changed) when the budget is short."""
    def release(self, rid: int) -> None:
        """The request ends: its blocks are cached (admission permitting) or freed."""
    def stats(self) -> dict[str, int]:
        """Counters: evicted, not_admitted, cached, used, hit_blocks (blocks)."""
    def check_invariants(self) -> None:
        """Full consistency check (tests); raises AssertionError."""
