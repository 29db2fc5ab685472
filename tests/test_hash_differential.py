"""The Rust encoders against the real thing: ``pickle.dumps(obj, protocol=5)``,
``cbor2.dumps(obj, canonical=True)``, hashlib and the xxhash package.

Object identity: pickle memoises by identity, so the Python objects built here follow the
identity model the core assumes (tags interned, CPython's singleton strings/bytes shared,
every other str/bytes/tuple a fresh object). See ``prefixcache_core::hash::pickle``.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

import cbor2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache import BlockHasher, hash_block_tokens
from prefixcache.reference import hashing as ref

ALGOS = list(ref.ALGORITHMS)
TAGS = ("lora", "mm", "cache_salt", "prompt_embeds")
DIGEST_LEN = {"sha256": 32, "sha256_cbor": 32, "xxhash": 16, "xxhash_cbor": 16, "xxh3_64": 8}


def fresh(value: Any) -> Any:
    """A Python object equal to ``value`` whose identities follow the core's model."""
    if isinstance(value, str):
        if value in TAGS:
            return sys.intern(value)
        return value.encode("utf-8").decode("utf-8")  # new object unless a singleton
    if isinstance(value, bytes):
        return bytes.fromhex(value.hex())  # new object unless b"" / one byte (singletons)
    if isinstance(value, tuple):
        return tuple(fresh(v) for v in value)
    return value


texts = st.one_of(
    st.sampled_from([*TAGS, "", "a", "é", "中", "img-0", "/adapters/sql"]),
    st.text(max_size=20),
    st.text(min_size=250, max_size=300),
)
blobs = st.one_of(
    st.binary(max_size=3), st.binary(max_size=40), st.binary(min_size=250, max_size=300)
)
ints = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(),
    st.sampled_from([0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1]),
    st.sampled_from([2**63, -(2**63), 2**64 - 1, 2**64, -(2**64), -(2**64) - 1]),
    st.sampled_from([2**2100, -(2**2100), -(2**2047), 2**2047]),
)
atoms = st.one_of(st.none(), st.booleans(), ints, texts, blobs)
values = st.recursive(atoms, lambda inner: st.lists(inner, max_size=5).map(tuple), max_leaves=12)
key_tuples = st.lists(values, max_size=5).map(tuple)
tokens_st = st.lists(
    st.one_of(st.integers(0, 300), st.integers(0, 70000), st.integers(0, 2**32 - 1)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    algo=st.sampled_from(ALGOS),
    parent_seed=st.binary(min_size=32, max_size=32),
    tokens=tokens_st,
    keys=st.one_of(st.none(), key_tuples),
)
def test_hash_block_tokens_matches_reference(
    algo: str, parent_seed: bytes, tokens: list[int], keys: tuple[Any, ...] | None
) -> None:
    parent = parent_seed[: DIGEST_LEN[algo]]
    obj_keys = fresh(keys)
    expect = ref.hash_object(algo, (fresh(parent), tuple(tokens), obj_keys))
    assert hash_block_tokens(algo, parent, tokens, obj_keys, seed="s") == expect


POOL = [*TAGS, "", "a", "é", "ÿ", "Ā", "中", "ab", b"", b"\x00", b"\xff", b"ab", 0, None, ()]
repeats = st.recursive(
    st.sampled_from(POOL), lambda inner: st.lists(inner, max_size=6).map(tuple), max_leaves=16
)


@settings(max_examples=300, deadline=None)
@given(algo=st.sampled_from(["sha256", "xxhash"]), keys=st.lists(repeats, max_size=6).map(tuple))
def test_memo_of_repeated_values_matches_pickle(algo: str, keys: tuple[Any, ...]) -> None:
    """Equal values repeated in one key: BINGET exactly where CPython shares the object."""
    parent = bytes(DIGEST_LEN[algo])
    obj_keys = fresh(keys)
    expect = ref.hash_object(algo, (fresh(parent), (7,), obj_keys))
    assert hash_block_tokens(algo, parent, [7], obj_keys) == expect


@settings(max_examples=100, deadline=None)
@given(algo=st.sampled_from(ALGOS), seed=st.text(max_size=300))
def test_none_hash_matches_reference(algo: str, seed: str) -> None:
    assert BlockHasher(4, algo, seed).none_hash == ref.none_hash(algo, seed)


@settings(max_examples=150, deadline=None)
@given(
    algo=st.sampled_from(ALGOS),
    block_size=st.integers(1, 70),
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=300),
    keys=st.lists(st.one_of(st.none(), key_tuples), max_size=12),
    data=st.data(),
)
def test_hash_blocks_matches_reference(
    algo: str, block_size: int, tokens: list[int], keys: list[Any], data: st.DataObject
) -> None:
    n_full = len(tokens) // block_size
    extra: list[Any] | None = None
    if data.draw(st.booleans()):
        extra = [fresh(keys[i]) if i < len(keys) else None for i in range(n_full)]
    expect = ref.hash_blocks(algo, block_size, tokens, extra, seed="x")
    hasher = BlockHasher(block_size, algo, "x")
    assert hasher.hash_blocks(tokens, extra) == expect
    assert hasher.hash_blocks(np.array(tokens, dtype=np.uint32), extra) == expect
    if expect:  # chaining from a given parent continues the chain
        rest = ref.hash_blocks(algo, block_size, tokens[block_size:], None, parent=expect[0])
        assert hasher.hash_blocks(tokens[block_size:], None, expect[0]) == rest


@settings(max_examples=100, deadline=None)
@given(
    pieces=st.lists(
        st.lists(st.integers(0, 70000), min_size=1, max_size=40), min_size=1, max_size=4
    ),
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=10),
    block_size=st.sampled_from([1, 2, 3, 16, 17]),
)
def test_prompts_sharing_prefixes_hash_as_the_reference(
    pieces: list[list[int]], prompts: list[list[int]], block_size: int
) -> None:
    """Prompts built from a few shared pieces, each hashed three times with both SHA-256
    encodings, from the default parent and from a given one: repeated blocks are served
    from the thread's table of recent SHA-256 hashes (all of them, or a fixed sample
    while the table's recent lookups hit rarely), and every chain still equals the
    reference."""
    for algo in ("sha256", "sha256_cbor"):
        hasher = BlockHasher(block_size, algo, "x")
        parent = ref.hash_blocks("sha256", 1, [7], None, seed="p")[0]  # one parent, both encodings
        for prompt in prompts:
            tokens = [t for k in prompt for t in pieces[k % len(pieces)]]
            expect = ref.hash_blocks(algo, block_size, tokens, None, seed="x")
            from_parent = ref.hash_blocks(algo, block_size, tokens, None, parent=parent)
            for _ in range(3):
                assert hasher.hash_blocks(tokens) == expect
                assert hasher.hash_blocks(tokens, None, parent) == from_parent


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_pickle_frames_of_large_objects(algo: str, seed: int) -> None:
    """Streams over 64 KiB: frame boundaries and large str/bytes written outside frames."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(9000, 30000))
    tokens = [int(x) for x in rng.choice([200, 60000, 2**31 - 5, 2**32 - 1], size=n)]
    tokens = [int(rng.integers(0, t + 1)) for t in tokens]
    big = int(rng.integers(65530, 65545))
    keys = fresh(
        (
            "x" * big,
            bytes(big + 1),
            ("mm", "é" * int(rng.integers(30000, 40000)), 3),
            "mm",
            "y" * int(rng.integers(0, 70000)),
        )[: int(rng.integers(0, 6))]
    )
    parent = bytes(range(DIGEST_LEN[algo]))
    for k in (None, keys):
        expect = ref.hash_object(algo, (fresh(parent), tuple(tokens), k))
        assert hash_block_tokens(algo, parent, tokens, k) == expect


def test_repeated_tags_are_memo_references() -> None:
    """Two multimodal items in one block: the second "mm" is a BINGET, as in CPython."""
    keys = (("mm", fresh("img-a"), 0), ("mm", fresh("img-b"), 8), ("cache_salt", "s"), "s")
    stream = pickle.dumps((b"\0" * 32, (1, 2), keys), protocol=5)
    assert stream.count(b"\x8c\x02mm") == 1 and b"h" in stream
    assert hash_block_tokens("sha256", b"\0" * 32, [1, 2], keys) == ref.hash_object(
        "sha256", (b"\0" * 32, (1, 2), keys)
    )


def test_cbor_reference_is_canonical_cbor2() -> None:
    obj = (b"\1" * 16, (1, 2**32 - 1), (("lora", "a", "/p"), -(2**70), True))
    assert ref.encode("xxhash_cbor", obj) == cbor2.dumps(obj, canonical=True)
