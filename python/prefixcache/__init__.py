"""prefixcache: the KV prefix caches of LLM engines, exact and fast.

- ``RadixCache``: SGLang's token-level radix tree.
- ``BlockPool`` / ``BlockHasher`` / ``KVCacheManager``: vLLM v1's chained block hashes and
  block pool; ``CpuOffloadManager``: vLLM's CPU offloading tier behind it.
- ``BlockTrie``: TensorRT-LLM's per-block trie with partial reuse and priority-LRU eviction.
- ``KvIndex``: the fleet index (which worker holds a prefix), fed by engines' KV events;
  Redis backend and ZMQ subscriber in ``prefixcache.fleet``.
"""

from __future__ import annotations

from prefixcache import _core
from prefixcache._core import (
    BlockHasher,
    BlockPool,
    BlockTrie,
    Claim,
    CpuOffloadManager,
    FleetMatch,
    InsertResult,
    KVCacheManager,
    KvIndex,
    Lookup,
    MatchResult,
    Node,
    OffloadingEvent,
    PrepareStoreOutput,
    RadixCache,
    TokenBuffer,
    hash_block_tokens,
)
from prefixcache.errors import (
    BlockStateError,
    InvalidEventError,
    InvalidInputError,
    InvalidTypeError,
    LockRefError,
    OutOfBlocksError,
    PrefixCacheError,
    StaleHandleError,
    UnknownRequestError,
    UnknownWorkerError,
    UnsupportedHashInputError,
)
from prefixcache.events import AllBlocksCleared, BlockRemoved, BlockStored
from prefixcache.extra_keys import LoRAKey, MultiModalItem, block_extra_keys
from prefixcache.trie_events import TrieBlockMoved, TrieBlockRemoved, TrieBlockStored

__version__: str = _core.__version__

__all__ = [
    "AllBlocksCleared",
    "BlockHasher",
    "BlockPool",
    "BlockRemoved",
    "BlockStateError",
    "BlockStored",
    "BlockTrie",
    "Claim",
    "CpuOffloadManager",
    "FleetMatch",
    "InsertResult",
    "InvalidEventError",
    "InvalidInputError",
    "InvalidTypeError",
    "KVCacheManager",
    "KvIndex",
    "LoRAKey",
    "LockRefError",
    "Lookup",
    "MatchResult",
    "MultiModalItem",
    "Node",
    "OffloadingEvent",
    "OutOfBlocksError",
    "PrefixCacheError",
    "PrepareStoreOutput",
    "RadixCache",
    "StaleHandleError",
    "TokenBuffer",
    "TrieBlockMoved",
    "TrieBlockRemoved",
    "TrieBlockStored",
    "UnknownRequestError",
    "UnknownWorkerError",
    "UnsupportedHashInputError",
    "__version__",
    "block_extra_keys",
    "hash_block_tokens",
]
