"""Trace reading and ``trace-stats`` on the shipped sample (600 Mooncake requests,
12.3M prompt tokens): plain and gzip-compressed reading, and the statistics with both
hit-rate ceilings, computed on the hash ids (Mooncake) and on the tokens (the generic
path every other trace takes: the Rust radix tree and chained block hashes)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from prefixcache.sim.trace_stats import trace_stats
from prefixcache.sim.traces import read_trace

SAMPLE = Path(__file__).parents[1] / "examples" / "mooncake_sample.jsonl"


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_read_sample(benchmark: Any, kind: str, tmp_path: Path) -> None:
    benchmark.group = "trace: read the 600-request Mooncake sample"
    path = SAMPLE
    if kind == "gzip":
        path = tmp_path / "sample.jsonl.gz"
        path.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    tr = benchmark(read_trace, path)
    assert len(tr) == 600


@pytest.mark.parametrize("path", ["hash ids", "tokens"])
def test_trace_stats_sample(benchmark: Any, path: str) -> None:
    benchmark.group = "trace-stats: the 600-request Mooncake sample, 512-token blocks"
    tr = read_trace(SAMPLE)
    reqs = tr.requests if not benchmark.disabled else tr.requests[:60]
    ids = tr.hash_ids[: len(reqs)] if path == "hash ids" and tr.hash_ids else None
    st = benchmark.pedantic(
        trace_stats,
        (reqs, 512, ids),
        rounds=1 if benchmark.disabled or path == "tokens" else 5,
        iterations=1,
    )
    assert 0 < st["block_hit_rate_ceiling"] <= st["hit_rate_ceiling"]


def test_expand_sample_prompts(benchmark: Any) -> None:
    """Every prompt of the sample expanded from its hash ids to tokens (what a replay
    does once per request and policy)."""
    benchmark.group = "trace: expand the sample's 600 prompts from hash ids"
    reqs = read_trace(SAMPLE).requests

    def expand() -> int:
        return sum(len(r.prompt) for r in reqs)

    assert benchmark(expand) == sum(r.prompt_len for r in reqs)
