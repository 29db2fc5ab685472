"""Schedulers and policy adapters: model rules, invariants, an exact-hit oracle."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies import RadixPolicy, SlotBudget, blocks_available, make_policy
from prefixcache.sim.replay import default_capacity, replay, summarize
from prefixcache.sim.requests import Request, TokenArray
from prefixcache.sim.scheduler import PrefillCost, SlotScheduler, TimeScheduler
from prefixcache.sim.workloads import study_workload

HAVE_BLOCKS = blocks_available()
POLICIES = ["radix", "radix-page16", "radix-page4"] + (["vllm-blocks"] if HAVE_BLOCKS else [])

try:
    from prefixcache.reference.radix import RadixCache as RefRadix
except ImportError:  # the reference lands on its own branch
    RefRadix = None


class Spy:
    """Wraps a policy and records the order of lifecycle calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.capacity = inner.capacity
        self.events: list[tuple[str, object]] = []
        self.running: set[object] = set()
        self.max_running = 0

    def admit(self, rid: object, prompt: TokenArray, reserve: int, *a: Any) -> int | None:
        hit = self.inner.admit(rid, prompt, reserve, *a)
        if hit is not None:
            assert 0 <= hit <= len(prompt) - 1
            self.events.append(("admit", rid))
            self.running.add(rid)
            self.max_running = max(self.max_running, len(self.running))
        return hit

    def on_prefill_done(self, rid: object) -> None:
        self.inner.on_prefill_done(rid)

    def finish(self, rid: object, output: TokenArray) -> None:
        self.inner.finish(rid, output)
        self.events.append(("finish", rid))
        self.running.discard(rid)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("policy", POLICIES)
def test_slot_model_rules(policy: str) -> None:
    w = study_workload("F", 3)
    spy = Spy(make_policy(policy, w.capacity or 0))
    SlotScheduler(8).run(w.requests, spy, check=True)  # type: ignore[arg-type]
    assert spy.max_running == 8 and not spy.running
    admits = [r for e, r in spy.events if e == "admit"]
    finishes = [r for e, r in spy.events if e == "finish"]
    assert admits == list(range(len(w.requests))) and finishes == admits  # FIFO finish
    done: set[object] = set()
    last_turn: dict[object, int] = {}
    for e, rid in spy.events:
        req = w.requests[int(rid)]  # type: ignore[call-overload]
        if e == "admit" and req.session in last_turn:
            assert last_turn[req.session] in done  # previous turn finished first
        if e == "admit":
            last_turn[req.session] = int(rid)  # type: ignore[call-overload]
        else:
            done.add(rid)
    spy.check()
    s = spy.stats()
    assert s.peak_used_tokens <= w.capacity  # type: ignore[operator]


def test_request_too_big_for_the_budget_is_rejected_not_dropped() -> None:
    reqs = [
        Request(
            i,
            np.arange(10 * i + 1, 10 * i + 11, dtype=np.uint32),
            np.arange(1000 + 10 * i, 1000 + 10 * i + n, dtype=np.uint32),
        )
        for i, n in enumerate([5, 500, 5])
    ]
    for model in ("slots", "time"):
        res = replay(reqs, ["radix"], 100, model=model, check=True)[0]
        assert [r.rejected for r in res.records] == [False, True, False]
        assert summarize(res)["rejected"] == 1


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    m = min(a.size, b.size)
    neq = np.flatnonzero(a[:m] != b[:m])
    return int(neq[0]) if neq.size else m


def _oracle_hits(reqs: Sequence[Request], page: int) -> list[int]:
    """Unlimited KV, outputs never shared: hit = best earlier prompt overlap, capped, paged."""
    out = []
    for i, r in enumerate(reqs):
        best = max((_lcp(r.prompt, reqs[j].prompt) for j in range(i)), default=0)
        out.append(min(best, r.prompt_len - 1) // page * page)
    return out


def _tree_workload(data: st.DataObject, n: int) -> list[Request]:
    """Prompts built from a few shared pieces, so they overlap at every granularity."""
    pieces = [
        np.arange(100 * k + 1, 100 * k + 1 + length, dtype=np.uint32)
        for k, length in enumerate(data.draw(st.lists(st.integers(1, 40), min_size=3, max_size=6)))
    ]
    reqs = []
    for i in range(n):
        parts = data.draw(st.lists(st.integers(0, len(pieces) - 1), min_size=1, max_size=4))
        prompt = np.concatenate([pieces[p] for p in parts])
        out_len = data.draw(st.integers(0, 30))
        reqs.append(
            Request(
                i, prompt, np.arange(10_000 + 100 * i, 10_000 + 100 * i + out_len, dtype=np.uint32)
            )
        )
    return reqs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_unlimited_hits_equal_the_oracle(data: st.DataObject) -> None:
    reqs = _tree_workload(data, data.draw(st.integers(1, 25)))
    res = {r.policy: r for r in replay(reqs, POLICIES, None, check=True)}
    for name, page in [("radix", 1), ("radix-page16", 16), ("radix-page4", 4), ("vllm-blocks", 16)]:
        if name in res:
            assert [r.hit_tokens for r in res[name].records] == _oracle_hits(reqs, page), name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_invariants_hold_under_pressure(data: st.DataObject) -> None:
    reqs = _tree_workload(data, data.draw(st.integers(1, 30)))
    for i, r in enumerate(reqs):
        r.arrival = 0.01 * i * data.draw(st.integers(0, 3))
        r.session = data.draw(st.sampled_from([None, "a", "b"]))
    need = max(r.prompt_len + r.output_len for r in reqs)
    cap = data.draw(st.integers(max(1, need // 2), 2 * need + 64))
    model = data.draw(st.sampled_from(["slots", "time"]))
    sched = (
        SlotScheduler(data.draw(st.integers(1, 4)))
        if model == "slots"
        else TimeScheduler(
            data.draw(st.integers(1, 6)),
            PrefillCost(1.0, 0.01, 1e-5, 2.0),
            preemption=data.draw(st.booleans()),
        )
    )
    for res in replay(reqs, POLICIES, cap, scheduler=sched, check=True):
        for rec, req in zip(res.records, reqs, strict=True):
            if rec.rejected:  # it cannot fit even alone (slots: at admission; time: decoding)
                assert req.prompt_len + req.output_len + 16 > cap
                continue
            assert 0 <= rec.hit_tokens <= req.prompt_len - 1
            if model == "time":
                assert rec.first_token >= rec.arrival and rec.finished >= rec.first_token


def test_time_model_ttft_is_the_prefill_cost() -> None:
    cost = PrefillCost(base_ms=10.0, per_token_ms=0.5, attention_ms=0.001, decode_step_ms=4.0)
    shared = np.arange(1, 101, dtype=np.uint32)
    reqs = [
        Request("a", shared, np.arange(500, 510, dtype=np.uint32), arrival=1.0),
        Request(
            "b",
            np.concatenate([shared, np.arange(200, 220, dtype=np.uint32)]),
            np.arange(600, 603, dtype=np.uint32),
            arrival=5.0,
        ),
    ]
    res = replay(reqs, ["radix"], None, scheduler=TimeScheduler(4, cost))[0]
    a, b = res.records
    assert a.hit_tokens == 0 and b.hit_tokens == 100
    assert a.ttft == pytest.approx((10 + 0.5 * 100 + 0.001 * 100 * 100 / 2) / 1000)
    # a: first token at prefill end, then 9 more decode steps
    assert a.finished == pytest.approx(1.0 + a.ttft + 9 * 0.004)
    b_cost = 10 + 0.5 * 20 + 0.001 * (120 * 120 - 100 * 100) / 2
    assert b.ttft == pytest.approx(b_cost / 1000)
    s = summarize(res)
    assert s["ttft_p50"] == pytest.approx(np.percentile([a.ttft, b.ttft], 50))


def test_time_model_queues_and_preempts_under_tight_memory() -> None:
    w = study_workload("F", 1)
    cap = 6000
    sched = TimeScheduler(16, PrefillCost())
    for res in replay(w.requests, POLICIES, cap, scheduler=sched, check=True):
        s = summarize(res)
        assert s["rejected"] == 0
        assert all(not math.isnan(r.finished) for r in res.records)
        assert s["preemptions"] > 0 and s["recomputed_tokens"] > 0
        assert s["peak_used_tokens"] <= cap


def test_time_model_without_preemption_reserves_the_output() -> None:
    w = study_workload("F", 1)
    cap = 6000
    for preemption in (True, False):
        sched = TimeScheduler(16, PrefillCost(), preemption=preemption)
        for res in replay(w.requests, POLICIES, cap, scheduler=sched, check=True):
            s = summarize(res)
            assert s["rejected"] == 0 and s["peak_used_tokens"] <= cap
            assert all(not math.isnan(r.finished) for r in res.records)
            assert (s["preemptions"] > 0) == preemption
            if not preemption:
                assert s["recomputed_tokens"] == 0


def test_time_model_respects_session_order() -> None:
    w = study_workload("D", 0)
    res = replay(w.requests, ["radix"], None, model="time")[0]
    prev: dict[object, float] = {}
    for rec in res.records:
        if rec.session in prev:
            assert rec.first_token > prev[rec.session]
        prev[rec.session] = rec.finished


@pytest.mark.skipif(RefRadix is None, reason="reference radix not merged yet")
@pytest.mark.parametrize("workload", ["A", "C", "D", "F"])
@pytest.mark.parametrize("page", [1, 16])
def test_core_and_reference_tree_replay_identically(workload: str, page: int) -> None:
    w = study_workload(workload, 4)
    reqs = list(w.requests)[:120]
    cap = w.capacity or default_capacity(reqs)
    for model in ("slots", "time"):
        core = RadixPolicy(cap, page_size=page)
        ref = RadixPolicy(cap, page_size=page, cache_cls=RefRadix)
        a, b = replay(reqs, [core, ref], model=model, check=True)
        assert [repr(r) for r in a.records] == [repr(r) for r in b.records]
        assert a.stats == b.stats


def test_slot_budget() -> None:
    p = SlotBudget(5)
    p.take(3)
    assert p.free == 2
    with pytest.raises(InvalidInputError):
        p.take(3)
    assert p.free == 2  # unchanged by the refused request
    p.give(3)
    assert p.free == 5
    with pytest.raises(InvalidInputError):
        p.give(1)
    with pytest.raises(InvalidInputError):
        SlotBudget(-1)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidInputError, match="unknown policy"):
        make_policy("lru-magic", 10)
    with pytest.raises(InvalidInputError):
        SlotScheduler(0)
    with pytest.raises(InvalidInputError, match="unknown scheduler"):
        replay([], ["radix"], 10, model="fast")
    with pytest.raises(InvalidInputError, match="no policies"):
        replay([], [], 10)


@pytest.mark.skipif(not HAVE_BLOCKS, reason="KVCacheManager not built yet")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_block_eviction_tracking_equals_block_removed_events(data: st.DataObject) -> None:
    from prefixcache.sim.policies import BlocksPolicy

    reqs = _tree_workload(data, data.draw(st.integers(1, 30)))
    need = max(r.prompt_len + r.output_len for r in reqs)
    cap = data.draw(st.integers(need + 16, 3 * need + 64))
    bs = data.draw(st.sampled_from([1, 4, 16]))
    model = data.draw(st.sampled_from(["slots", "time"]))
    sched = (
        SlotScheduler(data.draw(st.integers(1, 4)))
        if model == "slots"
        else TimeScheduler(data.draw(st.integers(1, 6)), preemption=data.draw(st.booleans()))
    )
    tracked = BlocksPolicy(cap, block_size=bs)
    events = BlocksPolicy(cap, block_size=bs, count_evictions="events")
    a, b = replay(reqs, [tracked, events], scheduler=sched, check=True)
    assert a.stats.evictions == b.stats.evictions
    # The counter mode samples the cached blocks only around calls that can evict; the
    # events mode after every call: the same peak.
    assert a.stats.peak_cached_tokens == b.stats.peak_cached_tokens
    assert a.stats.cached_tokens == b.stats.cached_tokens
    assert [r.hit_tokens for r in a.records] == [r.hit_tokens for r in b.records]


@pytest.mark.skipif(not HAVE_BLOCKS, reason="KVCacheManager not built yet")
@pytest.mark.parametrize("workload", ["E", "F"])
def test_block_eviction_tracking_on_the_tight_workloads(workload: str) -> None:
    from prefixcache.sim.policies import BlocksPolicy

    w = study_workload(workload, 0)
    for model in ("slots", "time"):
        cap = w.capacity or 0
        a, b = replay(
            w.requests,
            [BlocksPolicy(cap), BlocksPolicy(cap, count_evictions="events")],
            model=model,
        )
        assert a.stats.evictions == b.stats.evictions > 0
        assert a.stats.peak_cached_tokens == b.stats.peak_cached_tokens


@pytest.mark.parametrize("policy", POLICIES)
def test_namespaces_never_share(policy: str) -> None:
    prompt = np.arange(1, 65, dtype=np.uint32)
    out = np.zeros(0, dtype=np.uint32)
    spaces = [
        (None, None),
        ("lora-a", None),
        (None, "salt"),
        ("lora-a", "salt"),
        (None, None),
        ("lora-a", "salt"),
        ("lora-b", None),
    ]
    reqs = [Request(i, prompt, out, extra_key=k, cache_salt=s) for i, (k, s) in enumerate(spaces)]
    res = replay(reqs, [policy], None, check=True)[0]
    page = 4 if policy == "radix-page4" else 16 if policy != "radix" else 1
    again = 63 // page * page
    assert [r.hit_tokens for r in res.records] == [0, 0, 0, 0, again, again, 0]


@pytest.mark.skipif(not HAVE_BLOCKS, reason="KVCacheManager not built yet")
@pytest.mark.parametrize("workload", ["C", "F"])
def test_core_and_reference_block_manager_replay_identically(workload: str) -> None:
    from prefixcache.reference.blocks import KVCacheManager as RefManager
    from prefixcache.sim.policies import BlocksPolicy

    w = study_workload(workload, 2)
    reqs = list(w.requests)[:100]
    cap = w.capacity or default_capacity(reqs)
    for model in ("slots", "time"):
        core = BlocksPolicy(cap)
        ref = BlocksPolicy(cap, manager_cls=RefManager)
        a, b = replay(reqs, [core, ref], model=model, check=True)
        assert [repr(r) for r in a.records] == [repr(r) for r in b.records]
        assert a.stats == b.stats


@pytest.mark.skipif(not HAVE_BLOCKS, reason="KVCacheManager not built yet")
@pytest.mark.parametrize("model", ["slots", "time"])
def test_block_hash_algorithms_replay_identically(model: str) -> None:
    """The block hash only names blocks: every algorithm (the simulator's default
    xxh3_64, vLLM's sha256 ...) gives the same replay, barring a collision."""
    from prefixcache.sim.policies import BlocksPolicy

    w = study_workload("F", 0)
    cap = w.capacity or 0
    runs = replay(
        w.requests,
        [BlocksPolicy(cap, hash_algo=a) for a in ("sha256", "xxh3_64", "xxhash_cbor")],
        model=model,
        check=True,
    )
    first = runs[0]
    for r in runs[1:]:
        assert r.stats.evictions == first.stats.evictions > 0
        assert r.stats.peak_cached_tokens == first.stats.peak_cached_tokens
        assert [x.hit_tokens for x in r.records] == [x.hit_tokens for x in first.records]


@pytest.mark.parametrize("instances", [None, 2])
def test_a_turn_arriving_before_the_previous_one_waits_for_it(instances: int | None) -> None:
    """Turns are a session's requests in trace order: turn 1 arriving at 0 s, before its
    turn 0 (at 10 s), starts once turn 0 finished, and reuses it, as in the other models."""
    from prefixcache.sim.fleet import fleet_replay
    from prefixcache.sim.requests import Request

    out = np.zeros(3, dtype=np.uint32) + 7
    reqs = [
        Request("a", np.arange(40, dtype=np.uint32), out, session="s", turn=0, arrival=10.0),
        Request("b", np.arange(50, dtype=np.uint32), out, session="s", turn=1, arrival=0.0),
    ]
    if instances is None:
        (res,) = replay(reqs, ["radix"], 10_000, model="time")
        a, b = res.records
        assert a.hit_tokens == 0 and b.hit_tokens == 40
    else:
        a, b = fleet_replay(reqs, "radix", 10_000, instances).records
    assert a.finished is not None and b.arrival >= a.finished >= 10.0


def test_time_model_queues_in_arrival_order_behind_a_long_decode_run() -> None:
    """One seat: request 0 decodes from ~0 s to ~2 s in one run. Request 2 arrives at
    1 s, during that run; request 1, the next turn of request 0's session, enters the
    queue when request 0 finishes (~2 s). FIFO serves request 2 first; the run going
    past request 2's arrival queued it behind request 1."""
    t = np.arange
    reqs = [
        Request(
            0,
            t(0, 100, dtype=np.uint32),
            t(2**31, 2**31 + 100, dtype=np.uint32),
            session="s",
            arrival=0.0,
        ),
        Request(
            1,
            t(5000, 5100, dtype=np.uint32),
            t(2**31 + 200, 2**31 + 210, dtype=np.uint32),
            session="s",
            arrival=0.5,
        ),
        Request(
            2,
            t(9000, 9100, dtype=np.uint32),
            t(2**31 + 400, 2**31 + 410, dtype=np.uint32),
            arrival=1.0,
        ),
    ]
    res = replay(reqs, ["radix"], 100_000, scheduler=TimeScheduler(max_running=1))[0]
    r0, r1, r2 = res.records
    assert r1.arrival == pytest.approx(r0.finished)  # released at the finish
    assert r2.first_token < r1.first_token
