"""prefixcache: the KV prefix caches of LLM engines, exact and fast.

- ``RadixCache``: SGLang's token-level radix tree.
- ``BlockPool`` / ``BlockHasher`` / ``KVCacheManager``: vLLM v1's chained block hashes and
  block pool.
- ``BlockTrie``: TensorRT-LLM's per-block trie with partial reuse and priority-LRU eviction.
"""

from __future__ import annotations

from prefixcache import _core
from prefixcache._core import BlockTrie, Claim, InsertResult, Lookup, MatchResult, Node, RadixCache
from prefixcache.errors import (
    BlockStateError,
    InvalidInputError,
    InvalidTypeError,
    LockRefError,
    OutOfBlocksError,
    PrefixCacheError,
    StaleHandleError,
    UnknownRequestError,
    UnsupportedHashInputError,
)
from prefixcache.trie_events import TrieBlockRemoved, TrieBlockStored

__version__: str = _core.__version__

__all__ = [
    "BlockStateError",
    "BlockTrie",
    "Claim",
    "InsertResult",
    "InvalidInputError",
    "InvalidTypeError",
    "LockRefError",
    "Lookup",
    "MatchResult",
    "Node",
    "OutOfBlocksError",
    "PrefixCacheError",
    "RadixCache",
    "StaleHandleError",
    "TrieBlockRemoved",
    "TrieBlockStored",
    "UnknownRequestError",
    "UnsupportedHashInputError",
    "__version__",
]
