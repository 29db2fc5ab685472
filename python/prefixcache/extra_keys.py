"""Per-block extra hash keys, built as vLLM's ``generate_block_hash_extra_keys`` does.

A block's extra keys are ``None`` (nothing applies) or a tuple, in this order:

1. the LoRA adapter: ``("lora", name, path)``;
2. each multimodal item overlapping the block: ``("mm", identifier, offset - block_start)``
   (negative when the item started in an earlier block);
3. the cache salt, on block 0 only and only when non-empty: ``("cache_salt", salt)``;
4. the prompt embeddings of the block: ``("prompt_embeds", sha256(block_embeds_bytes))``.

This is the tagged layout of SEMANTICS.md section 2.1 and of the vLLM 0.33.0 vectors in
``tests/data/vllm_block_hashes.json``. Some vLLM releases put the bare values instead
(``name``, ``(identifier, offset)``, ``salt``, ``digest``): pass ``layout="untagged"``.

The tags are string literals, so CPython interns them; when one block holds two
multimodal items, the second ``"mm"`` is the same object and pickles as a memo reference.
The Rust encoder assumes exactly that (see ``prefixcache_core::hash::pickle``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Layout = Literal["tagged", "untagged"]
BlockKeys = tuple[Any, ...] | None


@dataclass(frozen=True)
class LoRAKey:
    """The LoRA adapter of a request."""

    name: str
    path: str = ""


@dataclass(frozen=True)
class MultiModalItem:
    """One multimodal input: ``length`` placeholder tokens starting at prompt ``offset``."""

    identifier: str
    offset: int
    length: int


def _check_items(items: Sequence[MultiModalItem]) -> None:
    end = 0
    for i, item in enumerate(items):
        if item.offset < 0 or item.length < 1:
            raise ValueError(f"mm_items[{i}] needs offset >= 0 and length >= 1, got {item}")
        if item.offset < end:
            raise ValueError(f"mm_items must be sorted by offset and not overlap (item {i})")
        end = item.offset + item.length


def embeds_digest(embeds: npt.NDArray[Any], start: int, end: int) -> bytes:
    """SHA-256 of the raw bytes of rows ``[start, end)`` of a (tokens, hidden) array."""
    return hashlib.sha256(np.ascontiguousarray(embeds[start:end]).tobytes()).digest()


def block_extra_keys(
    num_tokens: int,
    block_size: int,
    *,
    lora: LoRAKey | None = None,
    mm_items: Sequence[MultiModalItem] = (),
    cache_salt: str | None = None,
    prompt_embeds: npt.NDArray[Any] | None = None,
    layout: Layout = "tagged",
) -> list[BlockKeys]:
    """The extra keys of every full block of a ``num_tokens``-token request.

    ``mm_items`` must be sorted by offset and not overlap (as vLLM assumes);
    ``prompt_embeds`` has one row per prompt token; a block hashes the rows it covers
    (as vLLM slices ``prompt_embeds[start:end]``). The result has one entry per full block.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if layout not in ("tagged", "untagged"):
        raise ValueError(f"layout must be 'tagged' or 'untagged', got {layout!r}")
    _check_items(mm_items)
    tagged = layout == "tagged"
    out: list[BlockKeys] = []
    for start in range(0, num_tokens - block_size + 1, block_size):
        end = start + block_size
        keys: list[Any] = []
        if lora is not None:
            keys.append(("lora", lora.name, lora.path) if tagged else lora.name)
        for item in mm_items:
            if item.offset < end and start < item.offset + item.length:
                rel = item.offset - start
                keys.append(("mm", item.identifier, rel) if tagged else (item.identifier, rel))
        if start == 0 and cache_salt:
            keys.append(("cache_salt", cache_salt) if tagged else cache_salt)
        if prompt_embeds is not None:
            digest = embeds_digest(prompt_embeds, start, end)
            keys.append(("prompt_embeds", digest) if tagged else digest)
        out.append(tuple(keys) if keys else None)
    return out


__all__ = ["BlockKeys", "Layout", "LoRAKey", "MultiModalItem", "block_extra_keys", "embeds_digest"]
