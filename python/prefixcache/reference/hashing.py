"""vLLM v1 chained block hashes in plain Python: the executable specification.

Block i hashes ``(parent, tuple(block_i_tokens), extra_keys_i)`` with the parent of block 0
being ``NONE_HASH = H(seed)`` (the seed hashed as a ``str``). ``H`` is one of:

- ``sha256``: SHA-256 of ``pickle.dumps(obj, protocol=5)`` (vLLM's default);
- ``sha256_cbor``: SHA-256 of ``cbor2.dumps(obj, canonical=True)``;
- ``xxhash`` / ``xxhash_cbor``: XXH3-128 (16 bytes, big-endian) of the same bytes;
- ``xxh3_64``: prefixcache's own, XXH3-64 (8 bytes, big-endian) of the CBOR bytes.

``cbor2`` and ``xxhash`` are imported only when an algorithm needs them.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from prefixcache.errors import InvalidInputError

ALGORITHMS: tuple[str, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "xxh3_64")
DEFAULT_SEED = "vllm-none-hash"


def default_seed() -> str:
    """``PYTHONHASHSEED`` when set, else ``"vllm-none-hash"`` (for every algorithm)."""
    return os.environ.get("PYTHONHASHSEED", DEFAULT_SEED)


def _pickle(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _cbor(obj: Any) -> bytes:
    import cbor2

    data: bytes = cbor2.dumps(obj, canonical=True)
    return data


def _xxh3_128(data: bytes) -> bytes:
    import xxhash

    return xxhash.xxh3_128_digest(data)


def _xxh3_64(data: bytes) -> bytes:
    import xxhash

    return xxhash.xxh3_64_digest(data)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


_PARTS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], bytes]]] = {
    "sha256": (_pickle, _sha256),
    "sha256_cbor": (_cbor, _sha256),
    "xxhash": (_pickle, _xxh3_128),
    "xxhash_cbor": (_cbor, _xxh3_128),
    "xxh3_64": (_cbor, _xxh3_64),
}


def encode(algo: str, obj: Any) -> bytes:
    """The bytes ``algo`` hashes for ``obj`` (pickle protocol 5 or canonical CBOR)."""
    return _PARTS[algo][0](obj)


def check_algo(algo: str) -> str:
    """``algo`` when it is one of :data:`ALGORITHMS`; else ``InvalidInputError``, as the
    core raises it (a ``ValueError`` too)."""
    if algo not in _PARTS:
        raise InvalidInputError(f"unknown hash algorithm {algo!r}: expected one of {ALGORITHMS}")
    return algo


def hash_object(algo: str, obj: Any) -> bytes:
    """``H(obj)`` for one of :data:`ALGORITHMS`."""
    enc, digest = _PARTS[check_algo(algo)]
    return digest(enc(obj))


def none_hash(algo: str, seed: str | None = None) -> bytes:
    """NONE_HASH: ``H(seed)``, the parent of every first block."""
    return hash_object(algo, default_seed() if seed is None else seed)


def hash_block_tokens(
    algo: str,
    parent: bytes | None,
    tokens: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    seed: str | None = None,
) -> bytes:
    """vLLM's ``hash_block_tokens``: ``H((parent or NONE_HASH, tuple(tokens), extra_keys))``."""
    if not parent:
        parent = none_hash(algo, seed)
    return hash_object(algo, (parent, tuple(int(t) for t in tokens), extra_keys))


def hash_blocks(
    algo: str,
    block_size: int,
    tokens: Sequence[int],
    extra_keys: Sequence[tuple[Any, ...] | None] | None = None,
    parent: bytes | None = None,
    seed: str | None = None,
) -> list[bytes]:
    """The chained hashes of the full blocks of ``tokens`` (a partial tail is not hashed).

    ``extra_keys`` holds one entry per block (``None`` or a tuple); entries past the last
    full block are ignored.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n_full = len(tokens) // block_size
    if extra_keys is not None and len(extra_keys) < n_full:
        raise ValueError(f"extra_keys has {len(extra_keys)} entries, {n_full} full blocks")
    toks = [int(t) for t in tokens]
    out: list[bytes] = []
    prev = parent if parent else none_hash(algo, seed)
    for i in range(n_full):
        keys = None if extra_keys is None else extra_keys[i]
        block = tuple(toks[i * block_size : (i + 1) * block_size])
        prev = hash_object(algo, (prev, block, keys))
        out.append(prev)
    return out
