"""Scheduler and replay accounting: cases where the simulator broke its documented model
(docs/SIMULATOR.md, "Scheduler models" and "Policies"), and invariants over random
workloads in every model."""

from __future__ import annotations

import numpy as np
import pytest

from prefixcache.sim.policies import blocks_available
from prefixcache.sim.replay import replay, summarize
from prefixcache.sim.requests import Request

HAVE_BLOCKS = blocks_available()


def _tokens(lo: int, n: int) -> np.ndarray:
    return np.arange(lo, lo + n, dtype=np.uint32)


BIG_BLOCKS = ["trtllm", "trtllm-nopartial", "radix-page64", "lab-lru@64"] + (
    ["vllm-blocks64"] if HAVE_BLOCKS else []
)


@pytest.mark.parametrize("model", ["slots", "time", "sequence"])
def test_unlimited_capacity_evicts_nothing_whatever_the_block_size(model: str) -> None:
    """Without a capacity every token of every request fits (SIMULATOR.md, "Capacity"):
    short requests each take a whole 64-token block, which a budget padded for 16-token
    blocks did not hold (trtllm evicted, and the time model queued)."""
    reqs = [Request(i, _tokens(10 * i + 1, 3), _tokens(100_000 + 10 * i, 2)) for i in range(40)]
    for res in replay(reqs, BIG_BLOCKS, model=model, check=True):
        s = summarize(res)
        assert (s["policy"], s["evicted_tokens"], s["rejected"]) == (res.policy, 0, 0)
        if model == "time":  # nothing waits for KV: every request is prefilled at once
            assert len({r.first_token for r in res.records}) == 1
