"""BlockHasher / hash_block_tokens: properties, bad input, and the extra-key helpers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefixcache import (
    BlockHasher,
    InvalidInputError,
    InvalidTypeError,
    LoRAKey,
    MultiModalItem,
    UnsupportedHashInputError,
    block_extra_keys,
    hash_block_tokens,
)
from prefixcache.reference import hashing as ref

VECTORS = json.loads((Path(__file__).parent / "data" / "vllm_block_hashes.json").read_text())


def test_properties() -> None:
    h = BlockHasher(4, "xxhash_cbor", "7")
    assert (h.block_size, h.algo, h.seed) == (4, "xxhash_cbor", "7")
    assert h.none_hash == ref.none_hash("xxhash_cbor", "7") and len(h.none_hash) == 16
    assert len(BlockHasher(4, "xxh3_64", "7").none_hash) == 8
    assert "xxhash_cbor" in repr(h)
    d = BlockHasher()
    assert (d.block_size, d.algo) == (16, "sha256")


def test_partial_tail_is_not_hashed_and_parent_none_is_none_hash() -> None:
    h = BlockHasher(4, "sha256", "s")
    assert h.hash_blocks([1, 2, 3]) == []
    full = h.hash_blocks(list(range(11)))
    assert len(full) == 2
    assert full[0] == h.hash_block(None, [0, 1, 2, 3]) == h.hash_block(h.none_hash, [0, 1, 2, 3])


def test_xxh3_64_is_xxh3_64_of_the_cbor_stream() -> None:
    import cbor2
    import xxhash

    h = BlockHasher(2, "xxh3_64", "s")
    nh = xxhash.xxh3_64_digest(cbor2.dumps("s", canonical=True))
    assert h.none_hash == nh
    stream = cbor2.dumps((nh, (5, 70000), None), canonical=True)
    assert h.hash_blocks([5, 70000]) == [xxhash.xxh3_64_digest(stream)]


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"block_size": 0}, InvalidInputError),
        ({"block_size": -3}, InvalidInputError),
        ({"algo": "md5"}, InvalidInputError),
        ({"algo": "SHA256"}, InvalidInputError),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        BlockHasher(**kwargs)


def test_bad_parent() -> None:
    h = BlockHasher(2, "sha256", "s")
    with pytest.raises(InvalidInputError, match="16 bytes"):
        h.hash_block(b"\0" * 16, [1, 2])
    with pytest.raises(InvalidInputError, match="33 bytes"):
        h.hash_blocks([1, 2], None, b"\0" * 33)
    with pytest.raises(InvalidTypeError, match="str"):
        h.hash_block("ab", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        hash_block_tokens("xxhash", b"\0" * 32, [1])
    with pytest.raises(InvalidInputError):
        hash_block_tokens("nope", None, [1])


def test_bad_tokens() -> None:
    h = BlockHasher(2, "sha256", "s")
    with pytest.raises(InvalidInputError, match=r"tokens\[1\]"):
        h.hash_blocks([1, -1])
    with pytest.raises(InvalidInputError):
        h.hash_blocks([1, 2**32])
    with pytest.raises(InvalidTypeError):
        h.hash_blocks([1.0, 2.0])
    with pytest.raises(InvalidTypeError):
        h.hash_blocks(np.zeros(4, dtype=np.float32))
    with pytest.raises(InvalidInputError, match="exactly 2 tokens"):
        h.hash_block(None, [1, 2, 3])


@pytest.mark.parametrize(
    ("keys", "where"),
    [
        ((["lora", "a"],), r"extra_keys\[0\]: unsupported type list"),
        ((1.5,), r"extra_keys\[0\]: unsupported type float"),
        (({"a": 1},), r"extra_keys\[0\]: unsupported type dict"),
        ((("mm", "x", 1.0),), r"extra_keys\[0\]\[2\]: unsupported type float"),
        ((bytearray(b"x"),), "bytearray"),
        ((np.int64(3),), "int64"),
        (("\ud800",), "surrogates"),
    ],
)
def test_unsupported_key_values(keys: tuple[Any, ...], where: str) -> None:
    h = BlockHasher(2, "sha256", "s")
    with pytest.raises(UnsupportedHashInputError, match=where):
        h.hash_block(None, [1, 2], keys)
    with pytest.raises(UnsupportedHashInputError):
        hash_block_tokens("sha256_cbor", None, [1, 2], keys)


def test_unsupported_per_block_entries() -> None:
    h = BlockHasher(2, "sha256", "s")
    with pytest.raises(UnsupportedHashInputError, match=r"extra_keys\[1\].*list"):
        h.hash_blocks([1, 2, 3, 4], [None, ["lora", "a", "/p"]])  # type: ignore[list-item]
    with pytest.raises(UnsupportedHashInputError, match=r"extra_keys\[0\]\[0\].*float"):
        h.hash_blocks([1, 2, 3, 4], [(0.5,), None])  # type: ignore[list-item]
    with pytest.raises(InvalidTypeError):
        h.hash_blocks([1, 2], "abc")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="2 full blocks"):
        h.hash_blocks([1, 2, 3, 4], [None])
    deep: Any = ()
    for _ in range(100):
        deep = (deep,)
    with pytest.raises(UnsupportedHashInputError, match="nested"):
        h.hash_block(None, [1, 2], (deep,))


def test_extra_entries_past_the_full_blocks_are_ignored() -> None:
    h = BlockHasher(2, "sha256", "s")
    assert h.hash_blocks([1, 2, 3], [None, ("x",)]) == h.hash_blocks([1, 2, 3])


def test_big_ints_and_bools() -> None:
    for algo in ref.ALGORITHMS:
        keys = (2**100, -(2**100), True, False, None, 2**63, -(2**63) - 1)
        got = hash_block_tokens(algo, None, [1], keys, seed="s")
        assert got == ref.hash_block_tokens(algo, None, [1], keys, seed="s")


# ---- extra-key helpers --------------------------------------------------------------------


def vector_keys(name: str) -> list[Any]:
    case = next(c for c in VECTORS["cases"] if c["name"] == name)

    def conv(v: Any) -> Any:
        if isinstance(v, list):
            return tuple(conv(x) for x in v)
        return bytes.fromhex(v["bytes"]) if isinstance(v, dict) else v

    return [None if e is None else conv(e) for e in case["extra_keys"]]


def test_helpers_rebuild_the_vector_keys() -> None:
    item = MultiModalItem("img-abababababababababababababababab", offset=3, length=20)
    assert block_extra_keys(48, 16, mm_items=[item]) == vector_keys("multimodal")
    assert block_extra_keys(48, 16, cache_salt="tenant-a") == vector_keys("cache_salt_first_block")
    lora = LoRAKey("sql-adapter", "/adapters/sql")
    assert block_extra_keys(48, 16, lora=lora) == vector_keys("lora_every_block")
    both = block_extra_keys(32, 16, lora=LoRAKey("a", "/p"), cache_salt="s")
    assert both == vector_keys("lora_and_salt")


def test_helper_order_and_layouts() -> None:
    embeds = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    items = [MultiModalItem("i1", 1, 2), MultiModalItem("i2", 3, 3)]
    keys = block_extra_keys(
        9, 4, lora=LoRAKey("l", "/l"), mm_items=items, cache_salt="s", prompt_embeds=embeds
    )
    d0 = hashlib.sha256(embeds[0:4].tobytes()).digest()
    d1 = hashlib.sha256(embeds[4:8].tobytes()).digest()
    assert keys == [
        (("lora", "l", "/l"), ("mm", "i1", 1), ("mm", "i2", 3), ("cache_salt", "s"),
         ("prompt_embeds", d0)),
        (("lora", "l", "/l"), ("mm", "i2", -1), ("prompt_embeds", d1)),
    ]  # fmt: skip
    bare = block_extra_keys(8, 4, lora=LoRAKey("l"), mm_items=items, layout="untagged")
    assert bare == [("l", ("i1", 1), ("i2", 3)), ("l", ("i2", -1))]
    assert block_extra_keys(8, 4, cache_salt="") == [None, None]
    # the keys hash identically through the core and the reference (repeated "mm" tag)
    h = BlockHasher(4, "sha256", "s")
    assert h.hash_blocks(list(range(9)), keys) == ref.hash_blocks(
        "sha256", 4, list(range(9)), keys, seed="s"
    )


def test_helper_rejects_bad_items() -> None:
    with pytest.raises(ValueError, match="sorted"):
        block_extra_keys(8, 4, mm_items=[MultiModalItem("a", 4, 2), MultiModalItem("b", 0, 2)])
    with pytest.raises(ValueError, match="length"):
        block_extra_keys(8, 4, mm_items=[MultiModalItem("a", 0, 0)])
    with pytest.raises(ValueError, match="block_size"):
        block_extra_keys(8, 0)


def test_token_containers_and_threads() -> None:
    import array
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 2**32, size=8192 + 5, dtype=np.uint64)
    h = BlockHasher(16, "sha256_cbor", "s")
    expect = ref.hash_blocks("sha256_cbor", 16, tokens.tolist(), seed="s")
    assert h.hash_blocks(tokens) == expect  # int64/uint64 arrays are widened
    assert h.hash_blocks(tokens.astype(np.uint32)) == expect
    assert h.hash_blocks(array.array("I", tokens.tolist())) == expect
    assert h.hash_blocks(tokens.tolist()) == expect
    # hashing with the GIL released from several threads gives the same chains
    arrays = [rng.integers(0, 150_000, size=20_000).astype(np.uint32) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(h.hash_blocks, arrays * 2))
    assert got == [h.hash_blocks(a) for a in arrays * 2]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: BlockHasher(16, "bad", seed=5), InvalidInputError, "unknown hash"),
        (lambda: BlockHasher(16, 5, seed=5), InvalidTypeError, "algo must be"),
        (
            lambda: hash_block_tokens("bad", None, [1], seed=5),
            InvalidInputError,
            "unknown hash",
        ),
        (
            lambda: hash_block_tokens("sha256", 5, [1], seed=5),
            InvalidTypeError,
            "parent",
        ),
        (
            lambda: hash_block_tokens("sha256", None, "x", seed=5),
            InvalidTypeError,
            "tokens",
        ),
        (
            lambda: hash_block_tokens("sha256", None, [1], 5, seed=5),
            UnsupportedHashInputError,
            "extra_keys",
        ),
    ],
    ids=["hasher algo", "hasher algo type", "algo", "parent", "tokens", "extra_keys"],
)
def test_the_first_bad_argument_is_named(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    """Arguments are read in order: the algorithm's name is checked as it is read, and
    the parent, tokens and extra keys before the later seed (they were read after it)."""
    with pytest.raises(error, match=message):
        call()


def test_an_unknown_algorithm_is_the_same_error_in_the_reference() -> None:
    """One error contract: the reference raises the core's class for an unknown
    algorithm (it raised a plain ValueError)."""
    for f in (hash_block_tokens, ref.hash_block_tokens):
        with pytest.raises(InvalidInputError, match="unknown hash algorithm"):
            f("md5", None, [1])
    with pytest.raises(InvalidInputError, match="unknown hash algorithm"):
        ref.hash_blocks("md5", 1, [1])


def _outcome(f: Callable[[], object]) -> tuple[str, type[BaseException] | None, str]:
    """The outcome with the argument the message starts with (the one named)."""
    try:
        f()
    except Exception as e:
        return ("raised", type(e), str(e).split(" ")[0].split("[")[0].rstrip(":"))
    return ("ok", None, "")


HASH_BLOCK_TOKENS_BAD: list[tuple[str, tuple[Any, ...]]] = [
    ("algo int", (5, None, [1])),
    ("algo unknown", ("md5", None, [1])),
    ("parent str", ("sha256", "x", [1])),
    ("parent 33 bytes", ("sha256", b"x" * 33, [1])),
    ("tokens str", ("sha256", None, "x")),
    ("tokens -1", ("sha256", None, [-1])),
    ("tokens float", ("sha256", None, [1.0])),
    ("extra_keys list", ("sha256", None, [1], [1])),
    ("extra_keys float", ("sha256", None, [1], (1.0,))),
    ("seed int", ("sha256", None, [1], None, 5)),
    ("bad algo, bad seed", ("md5", None, [1], None, 5)),
    ("bad parent, bad tokens", ("sha256", "x", "y")),
    ("bad tokens, bad extra_keys", ("sha256", None, "x", [1])),
]


@pytest.mark.parametrize(
    "args", [c[1] for c in HASH_BLOCK_TOKENS_BAD], ids=[c[0] for c in HASH_BLOCK_TOKENS_BAD]
)
def test_reference_hash_block_tokens_refuses_as_the_core(args: tuple[Any, ...]) -> None:
    """The reference reads the arguments as the core does, in order, with the core's
    classes (a str parent, a negative or float token, a list of extra keys and an int
    seed were hashed)."""
    core = _outcome(lambda: hash_block_tokens(*args))
    assert core[0] == "raised"
    assert _outcome(lambda: ref.hash_block_tokens(*args)) == core


HASH_BLOCKS_BAD: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("block_size 0", (0, [1]), {}),
    ("tokens str", (1, "x"), {}),
    ("extra_keys str", (1, [1]), {"extra_keys": "x"}),
    ("extra_keys short", (1, [1, 2]), {"extra_keys": [None]}),
    ("parent str", (1, [1]), {"parent": "x"}),
    ("seed int", (1, [1]), {"seed": 5}),
    ("bad tokens, bad parent", (1, "x"), {"parent": "x"}),
]


@pytest.mark.parametrize(
    ("args", "kwargs"), [c[1:] for c in HASH_BLOCKS_BAD], ids=[c[0] for c in HASH_BLOCKS_BAD]
)
def test_reference_hash_blocks_refuses_as_the_core(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``hash_blocks(algo, block_size, tokens, ...)`` against ``BlockHasher(block_size,
    algo, seed).hash_blocks(tokens, extra_keys, parent)``: the same class for the same
    argument (a block size below 1 was a plain ValueError)."""
    block_size, tokens = args
    seed = kwargs.get("seed")

    def core() -> object:
        h = BlockHasher(block_size, "sha256", seed=seed)
        return h.hash_blocks(tokens, kwargs.get("extra_keys"), kwargs.get("parent"))

    want = _outcome(core)
    assert want[0] == "raised"
    assert _outcome(lambda: ref.hash_blocks("sha256", *args, **kwargs))[:2] == want[:2]
