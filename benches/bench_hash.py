"""vLLM block hashing: the chained hashes of one 32768-token prompt (2048 blocks of 16
tokens, token ids uniform below 151,936 as Qwen's vocabulary), for every algorithm, Rust
core (``BlockHasher.hash_blocks``) vs the plain-Python reference (pickle/cbor2 + hashlib/
xxhash), side by side. ``ns_per_block`` in extra_info is the best pass time / 2048.

The core hashes a prompt it has not seen in each pass (every block computed);
``test_hash_blocks_again`` hashes the same prompt each pass, its blocks coming from the
thread's table of recent SHA-256 hashes. A second group hashes blocks carrying extra keys
(LoRA + cache salt + two multimodal items), which take the general encoder instead of the
fast path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from prefixcache import BlockHasher, LoRAKey, MultiModalItem, block_extra_keys
from prefixcache.reference import hashing as ref

BLOCK = 16
TOKENS = np.random.default_rng(0).integers(0, 151_936, size=32_768).astype(np.uint32)
TOKEN_LIST = TOKENS.tolist()
N_BLOCKS = len(TOKENS) // BLOCK
ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "xxh3_64"]
ROUNDS = {"core": 50, "reference": 5}
EXTRA = block_extra_keys(
    len(TOKENS),
    BLOCK,
    lora=LoRAKey("sql-adapter", "/adapters/sql"),
    mm_items=[MultiModalItem("img-" + "ab" * 16, 5, 600), MultiModalItem("img-2", 610, 40)],
    cache_salt="tenant-a",
)


def record(benchmark: Any) -> None:
    if benchmark.stats is not None:
        benchmark.extra_info["ns_per_block"] = benchmark.stats.stats.min / N_BLOCKS * 1e9


def run(impl: str, algo: str, extra: list[Any] | None) -> Any:
    if impl == "core":
        hasher = BlockHasher(BLOCK, algo, "vllm-none-hash")
        return lambda: hasher.hash_blocks(TOKENS, extra)
    return lambda: ref.hash_blocks(algo, BLOCK, TOKEN_LIST, extra, seed="vllm-none-hash")


def fresh_prompts() -> Any:
    """Setup of a core pass: a prompt no earlier pass hashed (TOKENS with its first
    token changed, so every block's parent differs)."""
    serial = iter(range(1, 1 << 30))

    def setup() -> Any:
        prompt = TOKENS.copy()
        prompt[0] = 151_936 + next(serial)
        return (prompt,), {}

    return setup


@pytest.mark.parametrize("impl", ["core", "reference"])
@pytest.mark.parametrize("algo", ALGOS)
def test_hash_blocks(benchmark: Any, algo: str, impl: str) -> None:
    benchmark.group = f"hash 32k-token prompt, {algo}"
    if impl == "core":
        hasher = BlockHasher(BLOCK, algo, "vllm-none-hash")
        result = benchmark.pedantic(
            hasher.hash_blocks, setup=fresh_prompts(), rounds=ROUNDS[impl], warmup_rounds=1
        )
    else:
        result = benchmark.pedantic(run(impl, algo, None), rounds=ROUNDS[impl], warmup_rounds=1)
    assert len(result) == N_BLOCKS
    record(benchmark)


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_hash_blocks_again(benchmark: Any, algo: str) -> None:
    benchmark.group = f"hash 32k-token prompt, {algo}"
    result = benchmark.pedantic(run("core", algo, None), rounds=ROUNDS["core"], warmup_rounds=2)
    assert len(result) == N_BLOCKS
    record(benchmark)


@pytest.mark.parametrize("impl", ["core", "reference"])
@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_hash_blocks_with_extra_keys(benchmark: Any, algo: str, impl: str) -> None:
    benchmark.group = f"hash 32k-token prompt with extra keys, {algo}"
    result = benchmark.pedantic(run(impl, algo, EXTRA), rounds=ROUNDS[impl], warmup_rounds=1)
    assert len(result) == N_BLOCKS
    record(benchmark)
