"""prefixcache: the KV prefix caches of LLM engines, exact and fast.

- ``RadixCache``: SGLang's token-level radix tree.
- ``BlockPool`` / ``BlockHasher`` / ``KVCacheManager``: vLLM v1's chained block hashes and
  block pool; ``CpuOffloadManager``: vLLM's CPU offloading tier behind it.
- ``BlockTrie``: TensorRT-LLM's per-block trie with partial reuse and priority-LRU eviction.
- ``KvIndex``: the fleet index (which worker holds a prefix), fed by engines' KV events;
  Redis backend and ZMQ subscriber in ``prefixcache.fleet``.
"""

from __future__ import annotations

import importlib

# `typing.TYPE_CHECKING` without importing `typing` (a few ms of startup); type checkers
# read the block below as theirs.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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

    __version__: str

# Each name's module, imported on first use: `import prefixcache` costs nothing until a
# name is used, so the command line can take over Ctrl-C before numpy and the core load.
_HOME = {
    **dict.fromkeys(
        [
            "BlockHasher",
            "BlockPool",
            "BlockTrie",
            "Claim",
            "CpuOffloadManager",
            "FleetMatch",
            "InsertResult",
            "KVCacheManager",
            "KvIndex",
            "Lookup",
            "MatchResult",
            "Node",
            "OffloadingEvent",
            "PrepareStoreOutput",
            "RadixCache",
            "TokenBuffer",
            "hash_block_tokens",
            "__version__",
        ],
        "prefixcache._core",
    ),
    **dict.fromkeys(
        [
            "BlockStateError",
            "InvalidEventError",
            "InvalidInputError",
            "InvalidTypeError",
            "LockRefError",
            "OutOfBlocksError",
            "PrefixCacheError",
            "StaleHandleError",
            "UnknownRequestError",
            "UnknownWorkerError",
            "UnsupportedHashInputError",
        ],
        "prefixcache.errors",
    ),
    **dict.fromkeys(["AllBlocksCleared", "BlockRemoved", "BlockStored"], "prefixcache.events"),
    **dict.fromkeys(["LoRAKey", "MultiModalItem", "block_extra_keys"], "prefixcache.extra_keys"),
    **dict.fromkeys(
        ["TrieBlockMoved", "TrieBlockRemoved", "TrieBlockStored"], "prefixcache.trie_events"
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'prefixcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


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
