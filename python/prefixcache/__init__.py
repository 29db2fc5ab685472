"""prefixcache: the KV prefix caches of LLM engines, exact and fast.

- ``RadixCache``: SGLang's token-level radix tree.
- ``BlockPool`` / ``BlockHasher`` / ``KVCacheManager``: vLLM v1's chained block hashes and
  block pool.
"""

from __future__ import annotations

from prefixcache import _core
from prefixcache._core import (
    BlockHasher,
    InsertResult,
    MatchResult,
    Node,
    RadixCache,
    hash_block_tokens,
)
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
from prefixcache.extra_keys import LoRAKey, MultiModalItem, block_extra_keys

__version__: str = _core.__version__

__all__ = [
    "BlockHasher",
    "BlockStateError",
    "InsertResult",
    "InvalidInputError",
    "InvalidTypeError",
    "LoRAKey",
    "LockRefError",
    "MatchResult",
    "MultiModalItem",
    "Node",
    "OutOfBlocksError",
    "PrefixCacheError",
    "RadixCache",
    "StaleHandleError",
    "UnknownRequestError",
    "UnsupportedHashInputError",
    "__version__",
    "block_extra_keys",
    "hash_block_tokens",
]
