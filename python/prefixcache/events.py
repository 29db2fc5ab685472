"""KV-cache events of the vLLM block pool and its CPU offloading tier, with vLLM's field
names (``vllm/distributed/kv_events.py``); ``medium`` says which ("GPU" or "CPU").

Block hashes are reported as vLLM does by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``):
the last 8 bytes of the hash read big-endian, as an int. With
``event_hash_format="bytes"`` they are the raw hash bytes instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"  # vLLM's CPU offloading tier (prefixcache.CpuOffloadManager)

ExternalBlockHash = int | bytes
# ``take_events(compact=True)`` gives u64 hashes as one uint64 numpy array per event.
ExternalBlockHashes = list[ExternalBlockHash] | npt.NDArray[np.uint64]


@dataclass(frozen=True)
class BlockStored:
    """Full blocks entered the prefix cache (one event per caching step)."""

    block_hashes: ExternalBlockHashes
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int] | None  # None: KVCacheManager.take_events(compact=True)
    block_size: int
    lora_id: int | None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    extra_keys: list[tuple[object, ...] | None] | None = None
    group_idx: int | None = 0
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """A cached block's hash left the prefix cache (one event per hash)."""

    block_hashes: ExternalBlockHashes
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = 0


@dataclass(frozen=True)
class AllBlocksCleared:
    """The prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


def external_hash(digest: bytes, fmt: str = "u64") -> ExternalBlockHash:
    """vLLM's external form of a block hash: the last 8 bytes big-endian ("u64") or bytes."""
    if fmt == "bytes":
        return bytes(digest)
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "ExternalBlockHash",
    "ExternalBlockHashes",
    "KVCacheEvent",
    "external_hash",
]
