"""prefixcache: the KV prefix caches of LLM engines, exact and fast.

- ``RadixCache``: SGLang's token-level radix tree.
- ``BlockPool`` / ``BlockHasher`` / ``KVCacheManager``: vLLM v1's chained block hashes and
  block pool.
"""

from __future__ import annotations

from prefixcache import _core
from prefixcache._core import InsertResult, MatchResult, Node, RadixCache
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

__version__: str = _core.__version__

__all__ = [
    "BlockStateError",
    "InsertResult",
    "InvalidInputError",
    "InvalidTypeError",
    "LockRefError",
    "MatchResult",
    "Node",
    "OutOfBlocksError",
    "PrefixCacheError",
    "RadixCache",
    "StaleHandleError",
    "UnknownRequestError",
    "UnsupportedHashInputError",
    "__version__",
]
