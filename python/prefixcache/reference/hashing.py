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

from prefixcache.errors import InvalidInputError, InvalidTypeError, UnsupportedHashInputError
from prefixcache.reference.int_args import int_arg, opt_str_arg, str_arg, token_list

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


# Tuples nested deeper than this are refused as extra keys (as the core refuses them).
MAX_KEY_DEPTH = 64


def _check_key_value(obj: object, at: str, depth: int) -> None:
    """One extra-key value: None, bool, int, str, bytes or a tuple of them (exact types,
    as the core reads them); anything else raises ``UnsupportedHashInputError``."""
    if obj is None or type(obj) in (bool, int, bytes):
        return
    if type(obj) is str:
        try:
            obj.encode()
        except UnicodeEncodeError:
            raise UnsupportedHashInputError(
                f"{at}: str with lone surrogates cannot be hashed (not valid UTF-8)"
            ) from None
        return
    if type(obj) is tuple:
        if depth >= MAX_KEY_DEPTH:
            raise UnsupportedHashInputError(f"{at}: tuples nested more than {MAX_KEY_DEPTH} deep")
        for i, item in enumerate(obj):
            _check_key_value(item, f"{at}[{i}]", depth + 1)
        return
    raise UnsupportedHashInputError(
        f"{at}: unsupported type {type(obj).__name__} (extra keys hold None, bool, int, str, "
        "bytes and tuples of them; lists must be converted to tuples)"
    )


def block_keys_arg(obj: object, at: str) -> tuple[Any, ...] | None:
    """One block's extra keys: None or a tuple of key values."""
    if obj is None:
        return None
    if type(obj) is not tuple:
        raise UnsupportedHashInputError(
            f"{at}: a block's extra keys must be None or a tuple, not {type(obj).__name__}"
        )
    _check_key_value(obj, at, 0)
    return obj


def extra_keys_arg(obj: object) -> list[tuple[Any, ...] | None] | None:
    """Per-block extra keys: None, or a list / tuple with one entry per block."""
    if obj is None:
        return None
    if not isinstance(obj, (list, tuple)):
        raise InvalidTypeError(
            f"extra_keys must be None or a list with one entry per block, not {type(obj).__name__}"
        )
    return [block_keys_arg(k, f"extra_keys[{i}]") for i, k in enumerate(obj)]


def _parent_arg(parent: object) -> bytes | None:
    """``parent``: None, or bytes of at most 32 bytes (empty: NONE_HASH)."""
    if parent is None:
        return None
    if not isinstance(parent, bytes):
        raise InvalidTypeError(f"parent must be bytes or None, not {type(parent).__name__}")
    if len(parent) > 32:
        raise InvalidInputError(f"parent hash has {len(parent)} bytes (at most 32)")
    return parent


def hash_block_tokens(
    algo: str,
    parent: bytes | None,
    tokens: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    seed: str | None = None,
) -> bytes:
    """vLLM's ``hash_block_tokens``: ``H((parent or NONE_HASH, tuple(tokens), extra_keys))``.

    The arguments are read as the core reads them, in order: the first bad one is named."""
    algo = check_algo(str_arg(algo, "algo"))
    parent = _parent_arg(parent)
    tokens = token_list(tokens, "tokens")
    extra_keys = block_keys_arg(extra_keys, "extra_keys")
    seed = opt_str_arg(seed, "seed")
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
    algo = check_algo(str_arg(algo, "algo"))
    block_size = int_arg(block_size, "block_size", 1)
    toks = token_list(tokens, "tokens")
    keys = extra_keys_arg(extra_keys)
    parent = _parent_arg(parent)
    seed = opt_str_arg(seed, "seed")
    n_full = len(toks) // block_size
    if keys is not None and len(keys) < n_full:
        raise InvalidInputError(
            f"extra_keys has {len(keys)} entries but there are {n_full} full blocks "
            f"({len(toks)} tokens, block_size {block_size})"
        )
    out: list[bytes] = []
    prev = parent if parent else none_hash(algo, seed)
    for i in range(n_full):
        block_keys = None if keys is None else keys[i]
        block = tuple(toks[i * block_size : (i + 1) * block_size])
        prev = hash_object(algo, (prev, block, block_keys))
        out.append(prev)
    return out
