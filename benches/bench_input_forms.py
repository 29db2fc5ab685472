"""Every input form a caller holds tokens in, on the radix workload (2000 prompts of 2304
tokens, benches/workloads.py): RadixCache insert and match_prefix, BlockHasher sha256
hashes of a 144-block prompt, KVCacheManager admit + finish. Forms: list, tuple,
array('q'), int64 numpy, uint32 numpy, torch int64 (when torch is installed) and
TokenBuffer. ``per_call_us`` in extra_info is the best pass time / calls; the side by
side with SGLang and vLLM is tools/bench_against_sglang.py (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pytest

from benches.workloads import record_per_call as record
from benches.workloads import shared_prefix_prompts
from prefixcache import BlockHasher, KVCacheManager, RadixCache, TokenBuffer

PROMPTS = shared_prefix_prompts()
HASHED = 500  # prompts hashed per pass


def _forms() -> dict[str, list[Any]]:
    lists = [p.tolist() for p in PROMPTS]
    out: dict[str, list[Any]] = {
        "list": lists,
        "tuple": [tuple(x) for x in lists],  # the same int objects
        "array_q": [array("q", p.astype(np.int64).tobytes()) for p in PROMPTS],
        "numpy_int64": [p.astype(np.int64) for p in PROMPTS],
        "numpy_uint32": list(PROMPTS),
        "TokenBuffer": [TokenBuffer(p) for p in PROMPTS],
    }
    try:
        import torch  # type: ignore[import-not-found]

        out["torch_int64"] = [torch.from_numpy(p.astype(np.int64)) for p in PROMPTS]
    except ImportError:
        pass
    return out


FORMS = _forms()


@pytest.mark.parametrize("form", list(FORMS))
def test_radix_insert(benchmark: Any, form: str) -> None:
    benchmark.group = "radix insert by input form (values in the same form)"
    xs = FORMS[form]

    def run(cache: RadixCache) -> None:
        for x in xs:
            cache.insert(x, values=x)

    benchmark.pedantic(run, setup=lambda: ((RadixCache(),), {}), rounds=5)
    record(benchmark, len(xs))


@pytest.mark.parametrize("form", ["list", "numpy_int64"])
def test_radix_insert_kv_indices(benchmark: Any, form: str) -> None:
    """Values as a scheduler holds them: KV indices apart from the tokens (another list,
    or an int64 array), not the token object given twice."""
    benchmark.group = "radix insert, KV indices apart from the tokens"
    xs = FORMS[form]
    kv = [(p.astype(np.int64) + 7) for p in PROMPTS]
    vs = [v.tolist() for v in kv] if form == "list" else kv

    def run(cache: RadixCache) -> None:
        for x, v in zip(xs, vs, strict=True):
            cache.insert(x, values=v)

    benchmark.pedantic(run, setup=lambda: ((RadixCache(),), {}), rounds=5)
    record(benchmark, len(xs))


@pytest.mark.parametrize("form", list(FORMS))
def test_radix_match(benchmark: Any, form: str) -> None:
    benchmark.group = "radix match_prefix by input form"
    xs = FORMS[form]
    cache = RadixCache()
    for x in xs:
        cache.insert(x)

    def run() -> int:
        return sum(cache.match_prefix(x).length for x in xs)

    assert benchmark.pedantic(run, rounds=5) == len(xs) * 2304
    record(benchmark, len(xs))


@pytest.mark.parametrize("form", list(FORMS))
def test_sha256_block_hashes(benchmark: Any, form: str) -> None:
    benchmark.group = "sha256 block hashes of a 144-block prompt by input form"
    xs = FORMS[form][:HASHED]
    hasher = BlockHasher(16, "sha256")

    def run() -> int:
        return sum(len(hasher.hash_blocks(x)) for x in xs)

    assert benchmark.pedantic(run, rounds=5) == HASHED * 144
    record(benchmark, HASHED)


@pytest.mark.parametrize("form", list(FORMS))
def test_admit_finish(benchmark: Any, form: str) -> None:
    benchmark.group = "KVCacheManager admit + finish by input form"
    xs = FORMS[form]

    def run(mgr: KVCacheManager) -> None:
        for i, x in enumerate(xs):
            mgr.admit(i, x)
            mgr.finish(i)

    benchmark.pedantic(
        run, setup=lambda: ((KVCacheManager(num_blocks=40_000, block_size=16),), {}), rounds=3
    )
    record(benchmark, len(xs))
