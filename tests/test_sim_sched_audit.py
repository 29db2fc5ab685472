"""Scheduler and replay accounting: cases where the simulator broke its documented model
(docs/SIMULATOR.md, "Scheduler models" and "Policies"), and invariants over random
workloads in every model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefixcache.errors import PrefixCacheError
from prefixcache.sim.policies import blocks_available
from prefixcache.sim.replay import replay, summarize
from prefixcache.sim.requests import MAX_ARRIVAL_SECONDS, Request
from prefixcache.sim.workloads import shared_prefix_workload

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


@pytest.mark.parametrize("arrival", [math.inf, -math.inf, math.nan, -1.0, 1e300, "1", True])
def test_an_arrival_the_clock_cannot_take_is_refused_up_front(arrival: object) -> None:
    """The time model's clock starts at 0 s and counts in floats: a request arriving at
    inf or NaN crashed the replay (OverflowError, ValueError), one at -1 s was served as
    if it had arrived at 0 with a TTFT 1 s too long, one at 1e300 s had a TTFT of 0.
    The trace readers refuse them; a Request built in Python now does too, whether the
    arrival is given or set later."""
    with pytest.raises(PrefixCacheError, match="arrival"):
        Request(0, _tokens(1, 3), _tokens(9, 2), arrival=arrival)  # type: ignore[arg-type]
    r = Request(0, _tokens(1, 3), _tokens(9, 2))
    with pytest.raises(PrefixCacheError, match="arrival"):
        r.arrival = arrival  # type: ignore[assignment]
    assert r.arrival == 0.0
    r.arrival = MAX_ARRIVAL_SECONDS  # the trace readers' bound, and ints, are taken
    r.arrival = 3
    assert r.arrival == 3.0 and isinstance(r.arrival, float)
    with pytest.raises(PrefixCacheError, match="request_rate"):
        shared_prefix_workload(prompts_per_group=3, request_rate=math.nan)
