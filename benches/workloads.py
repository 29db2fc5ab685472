"""Benchmark inputs, prepared once (numpy arrays) so that only the cache is timed, and the
per-call figure every pass benchmark records."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

U32 = npt.NDArray[np.uint32]


def shared_prefix_prompts(
    n: int = 2000, n_system: int = 8, system_len: int = 2048, unique_len: int = 256, seed: int = 0
) -> list[U32]:
    """`n` prompts of `system_len + unique_len` tokens: one of `n_system` shared system
    prompts followed by tokens unique to the prompt (the issue's radix workload)."""
    rng = np.random.default_rng(seed)
    systems = [
        rng.integers(0, 32000, system_len, dtype=np.uint32) + np.uint32(k * 100_000)
        for k in range(n_system)
    ]
    prompts = []
    for i in range(n):
        unique = np.arange(unique_len, dtype=np.uint32) + np.uint32(1_000_000 + i * unique_len)
        prompts.append(np.concatenate([systems[i % n_system], unique]))
    return prompts


def record_per_call(benchmark: Any, calls: int) -> None:
    """Store the best pass time / ``calls`` as ``per_call_us`` in the benchmark's
    extra_info (nothing when benchmarks are disabled)."""
    if benchmark.stats is not None:
        benchmark.extra_info["per_call_us"] = benchmark.stats.stats.min / calls * 1e6
