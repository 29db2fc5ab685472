"""KV-cache events of the block trie (``BlockTrie.take_events``), shaped like the block
pool's: blocks entering the trie (one event per ``store`` that cached blocks) and leaving
it (one event per block: evicted for reuse, taken over by a partial match, or re-filed).
With a host tier, a cached block moving between GPU and host memory is one
``TrieBlockMoved`` per block (TensorRT-LLM's ``cacheLevelUpdated``): blocks are stored on
the GPU, so a consumer knows each block's medium from the moves since.

Blocks are named by their block id and a chained 64-bit content hash (FNV-1a over the
parent hash and the block key; ``prefixcache.reference.trie.chain_hash`` spells it out).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrieBlockStored:
    """Blocks were cached under their keys (in chain order)."""

    block_ids: list[int]
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int] | None  # None: BlockTrie.take_events(compact=True)
    block_size: int
    lora_id: int | None


@dataclass(frozen=True)
class TrieBlockRemoved:
    """A block left the trie."""

    block_ids: list[int]
    block_hashes: list[int]


@dataclass(frozen=True)
class TrieBlockMoved:
    """Cached blocks stay in the trie; their KV is now on ``medium`` ("GPU" or "CPU")."""

    block_ids: list[int]
    block_hashes: list[int]
    medium: str


TrieEvent = TrieBlockStored | TrieBlockRemoved | TrieBlockMoved

__all__ = ["TrieBlockMoved", "TrieBlockRemoved", "TrieBlockStored", "TrieEvent"]
