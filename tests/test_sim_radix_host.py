"""The simulator's radix policy with SGLang's HiCache host tier (docs/SIMULATOR.md,
"Offload"): no tier is today's policy exactly, the tier's replay checks its invariants
after every step, and the core and the plain-Python reference replay it identically."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from prefixcache.errors import InvalidInputError
from prefixcache.reference.radix import RadixCache as ReferenceRadix
from prefixcache.sim.policies.sglang import RADIX_OFFLOADS, RadixPolicy
from prefixcache.sim.replay import RUN_FIELDS, replay
from prefixcache.sim.traces import read_trace

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mooncake_sample.jsonl"


def _requests(n: int) -> list[Any]:
    return list(read_trace(SAMPLE).requests)[:n]


def _outcome(res: Any) -> tuple[Any, ...]:
    summary = {k: v for k, v in res.summary().items() if k not in RUN_FIELDS}
    return (summary, dataclasses.asdict(res.stats))


@pytest.mark.parametrize("page_size", [1, 16])
def test_no_tier_is_todays_policy(page_size: int) -> None:
    reqs = _requests(300)
    base = replay(reqs, [RadixPolicy(200_000, page_size=page_size)])[0]
    zero = replay(
        reqs, [RadixPolicy(200_000, page_size=page_size, cpu_capacity=0, offload="write-back")]
    )[0]
    assert _outcome(base) == _outcome(zero)
    assert zero.stats.cpu_capacity == 0 and zero.stats.host_hit_tokens == 0


@pytest.mark.parametrize("offload", [None, *RADIX_OFFLOADS])
def test_tier_replay_keeps_its_invariants_and_reuses_host_tokens(offload: str | None) -> None:
    reqs = _requests(400)
    pol = RadixPolicy(100_000, cpu_capacity=400_000, offload=offload)
    res = replay(reqs, [pol], check=True)[0]
    base = replay(reqs, [RadixPolicy(100_000)])[0]
    st = res.stats
    assert st.cpu_capacity == 400_000
    assert 0 < st.host_hit_tokens <= res.summary()["hit_tokens"]
    assert 0 < st.peak_host_tokens <= 400_000 and st.stored_tokens > 0
    assert res.summary()["hit_tokens"] > base.summary()["hit_tokens"]
    assert pol.offload == (offload or "write-through")
    # host_hit(rid) is the host part of the last admit's reuse
    assert sum(pol.host_hit(i) for i in range(len(reqs))) == st.host_hit_tokens
    assert pol.host_hit(10**6) == 0


@pytest.mark.parametrize("offload", RADIX_OFFLOADS)
def test_core_and_reference_replay_the_tier_identically(offload: str) -> None:
    reqs = _requests(120)
    core = RadixPolicy(30_000, page_size=16, cpu_capacity=60_000, offload=offload)
    ref = RadixPolicy(
        30_000, page_size=16, cpu_capacity=60_000, offload=offload, cache_cls=ReferenceRadix
    )
    a, b = replay(reqs, [core, ref], check=True)
    assert _outcome(a) == _outcome(b)
    assert a.stats.host_hit_tokens > 0


class _CountedRadix(RadixPolicy):
    """Counts the nodes each eviction takes off the GPU from the per-node host dump."""

    device_nodes_evicted = 0

    def _evict(self, n: int) -> int:
        def on_device() -> int:
            return sum(not host_only for _, host_only in self.tree.host_dump())

        before = on_device()
        freed = super()._evict(n)
        self.device_nodes_evicted += before - on_device()
        return freed


@pytest.mark.parametrize("offload", RADIX_OFFLOADS)
@pytest.mark.parametrize("cache_cls", [None, ReferenceRadix])
def test_evictions_count_the_nodes_that_left_the_gpu(offload: str, cache_cls: Any) -> None:
    """A demoted leaf (backed up, kept host-only) is an eviction as a deleted one is: the
    count matches the host dump's, and it is not zero when every victim stays in the tree."""
    extra = {} if cache_cls is None else {"cache_cls": cache_cls}
    pol = _CountedRadix(30_000, page_size=16, cpu_capacity=60_000, offload=offload, **extra)
    res = replay(_requests(120), [pol], check=True)[0]
    assert res.stats.evicted_tokens > 0
    assert res.stats.evictions == pol.device_nodes_evicted > 0


def test_bad_tier_arguments() -> None:
    with pytest.raises(InvalidInputError, match="offload"):
        RadixPolicy(1000, cpu_capacity=10, offload="host")
    with pytest.raises(InvalidInputError, match="cpu_capacity"):
        RadixPolicy(1000, cpu_capacity=-1)


@pytest.mark.skipif(not os.environ.get("PREFIXCACHE_TRACES"), reason="PREFIXCACHE_TRACES unset")
def test_conversation_trace_with_a_host_tier() -> None:
    path = Path(os.environ["PREFIXCACHE_TRACES"]) / "mooncake_conversation.jsonl"
    reqs = list(read_trace(path).requests)[:1500]
    res = replay(reqs, [RadixPolicy(3_000_000, cpu_capacity=12_000_000)], check=True)[0]
    assert res.stats.host_hit_tokens > 0


def test_make_policy_gives_radix_its_tier() -> None:
    from prefixcache.sim.policies import make_policy

    pol = make_policy("radix-page16", 100_000, cpu_capacity=50_000, offload="write-back")
    assert isinstance(pol, RadixPolicy)
    assert (pol.cpu_capacity, pol.offload, pol.tree.write_policy) == (
        50_000,
        "write-back",
        "write_back",
    )
