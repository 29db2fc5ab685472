"""Every case of the vLLM 0.33.0 vectors must match byte for byte (core and reference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefixcache import BlockHasher, hash_block_tokens
from prefixcache.reference import hashing as ref

VECTORS = json.loads((Path(__file__).parent / "data" / "vllm_block_hashes.json").read_text())
CASES: list[dict[str, Any]] = VECTORS["cases"]


def to_python(value: Any) -> Any:
    """JSON -> the Python value vLLM hashed: lists are tuples, {"bytes": hex} is bytes."""
    if isinstance(value, list):
        return tuple(to_python(v) for v in value)
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes"])
    return value


def case_id(case: dict[str, Any]) -> str:
    return f"{case['algo']}-seed{case['pythonhashseed']}-{case['name']}"


def block_keys(case: dict[str, Any]) -> list[Any]:
    return [None if e is None else to_python(e) for e in case["extra_keys"]]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_core_matches_vllm(case: dict[str, Any]) -> None:
    hasher = BlockHasher(case["block_size"], case["algo"], case["none_hash_seed"])
    assert hasher.none_hash.hex() == case["none_hash"]
    got = hasher.hash_blocks(case["tokens"], block_keys(case))
    assert [h.hex() for h in got] == case["block_hashes"]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_block_by_block_matches_vllm(case: dict[str, Any]) -> None:
    hasher = BlockHasher(case["block_size"], case["algo"], case["none_hash_seed"])
    bs = case["block_size"]
    parent: bytes | None = None
    for i, expect in enumerate(case["block_hashes"]):
        keys = block_keys(case)[i]
        block = case["tokens"][i * bs : (i + 1) * bs]
        h = hasher.hash_block(parent, block, keys)
        h2 = hash_block_tokens(case["algo"], parent, block, keys, seed=case["none_hash_seed"])
        assert h.hex() == h2.hex() == expect
        parent = h


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_reference_matches_vllm(case: dict[str, Any]) -> None:
    seed = case["none_hash_seed"]
    assert ref.none_hash(case["algo"], seed).hex() == case["none_hash"]
    got = ref.hash_blocks(
        case["algo"], case["block_size"], case["tokens"], block_keys(case), seed=seed
    )
    assert [h.hex() for h in got] == case["block_hashes"]


def test_default_seed_follows_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    by_seed = {(c["algo"], c["none_hash_seed"]): c["none_hash"] for c in CASES}
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert BlockHasher(16, "sha256").seed == "vllm-none-hash"
    assert BlockHasher(16, "sha256").none_hash.hex() == by_seed[("sha256", "vllm-none-hash")]
    monkeypatch.setenv("PYTHONHASHSEED", "12345")
    for algo in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
        hasher = BlockHasher(16, algo)
        assert hasher.seed == "12345"
        assert hasher.none_hash.hex() == by_seed[(algo, "12345")]
