"""Scheduler and replay accounting: cases where the simulator broke its documented model
(docs/SIMULATOR.md, "Scheduler models" and "Policies"), and invariants over random
workloads in every model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixcache.errors import PrefixCacheError
from prefixcache.sim.policies import TrtllmPolicy, blocks_available, make_policy, offload_family
from prefixcache.sim.replay import make_scheduler, replay, summarize
from prefixcache.sim.requests import MAX_ARRIVAL_SECONDS, Request
from prefixcache.sim.scheduler import PrefillCost, SlotScheduler, TimeScheduler
from prefixcache.sim.sequence import SequenceScheduler
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


ENGINE_POLICIES = ["radix", "radix-page4", "trtllm4", "trtllm-nopartial4", "lab-lru@4"] + (
    ["vllm-blocks4"] if HAVE_BLOCKS else []
)


@pytest.mark.parametrize("cpu", [0, 64])
@pytest.mark.parametrize("name", ENGINE_POLICIES)
def test_an_admission_that_cannot_fit_evicts_nothing(name: str, cpu: int) -> None:
    """``admit`` -> None leaves the cache as it was: SGLang's PrefillAdder refuses a
    request needing more than the free plus evictable KV before allocating anything, as
    vLLM's allocate_slots does. The radix adapter evicted every evictable token first,
    so a request waiting for KV in the time model flushed the tree at every retry."""
    if cpu and offload_family(name) is None:
        pytest.skip("no host tier")
    hits = []
    for fail in (False, True):
        p = make_policy(name, 100, cpu_capacity=cpu)
        assert p.admit(0, _tokens(1, 40), 0) == 0  # running: 40 held
        p.on_prefill_done(0)
        assert p.admit(1, _tokens(1000, 40), 0) == 0  # cached, evictable
        p.on_prefill_done(1)
        p.finish(1, _tokens(0, 0))
        if fail:
            before = p.evicted_tokens()
            assert p.admit(2, _tokens(5000, 80), 0) is None  # 80 > 20 free + 40 evictable
            assert p.evicted_tokens() == before
            p.check()
        hits.append(p.admit(3, _tokens(1000, 41), 0))  # request 1's prompt
    assert hits[0] == hits[1] and hits[0] >= 36


@pytest.mark.parametrize("model", ["slots", "time", "sequence"])
def test_a_rejected_request_leaves_the_cache_as_it_was(model: str) -> None:
    """A request larger than the whole budget is rejected: the radix adapter evicted every
    evictable token before finding out, so the next request missed a prefix every other
    engine kept (and, in the time model, a request waiting for KV flushed the tree at
    every retry)."""
    shared = _tokens(1, 40)
    reqs = [
        Request(0, shared, _tokens(20_000, 3)),
        Request(1, _tokens(500, 250), _tokens(40_000, 2)),  # never fits in 200
        Request(2, np.concatenate([shared, _tokens(900, 5)]), _tokens(50_000, 2)),
    ]
    # (the lab policies serve it in the sequence model: docs/LAB.md)
    names = [n for n in ENGINE_POLICIES if model != "sequence" or not n.startswith("lab")]
    for res in replay(reqs, names, 200, model=model, check=True):
        r = res.records
        assert [x.rejected for x in r] == [False, True, False]
        assert r[1].evicted_tokens == 0 and res.stats.evicted_tokens == 0, res.policy
        assert r[2].hit_tokens >= 36, res.policy


# -- invariants over random workloads, every model, policy family and host tier ---------

TIERED = {"radix": "write-through", "radix-page4": "write-back", "trtllm4": "host"}
if HAVE_BLOCKS:
    TIERED["vllm-blocks4"] = "lru"


def _random_workload(data: st.DataObject) -> list[Request]:
    """Sessions whose turns extend the previous turn's prompt and output, and unrelated
    requests sharing a system prompt, arriving in bursts."""
    system = _tokens(1, data.draw(st.integers(0, 12)))
    history: dict[int, np.ndarray] = {}
    reqs = []
    for i in range(data.draw(st.integers(1, 14))):
        s = data.draw(st.sampled_from([None, 0, 1, 2]))
        base = history.get(s, system) if s is not None else system
        prompt = np.concatenate([base, _tokens(1000 * (i + 1), data.draw(st.integers(1, 20)))])
        out = _tokens(1_000_000 + 1000 * i, data.draw(st.integers(0, 15)))
        if s is not None:
            history[s] = np.concatenate([prompt, out])
        arrival = 0.05 * data.draw(st.integers(0, 6))
        reqs.append(Request(i, prompt, out, session=s, arrival=arrival))
    return reqs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_accounting_invariants_in_every_model(data: st.DataObject) -> None:
    reqs = _random_workload(data)
    cap = data.draw(st.sampled_from([8, 24, 48, 96, 400]))
    cpu = data.draw(st.sampled_from([0, 32, 128]))
    model = data.draw(st.sampled_from(["slots", "time", "time-no-preemption", "sequence"]))
    running = data.draw(st.integers(1, 4))
    cost = PrefillCost()
    sched = {
        "slots": lambda: SlotScheduler(running),
        "time": lambda: TimeScheduler(running, cost),
        "time-no-preemption": lambda: TimeScheduler(running, cost, preemption=False),
        "sequence": SequenceScheduler,
    }[model]()
    names = list(TIERED) if cpu else [*ENGINE_POLICIES, "opt@4"]
    for name in names:
        (res,) = replay(
            reqs,
            [name],
            cap,
            scheduler=sched,
            check=True,
            cpu_capacity=cpu,
            offload=TIERED.get(name) if cpu else None,
        )
        recs, st_ = res.records, res.stats
        # every eviction is charged to the request that made room
        assert sum(r.evicted_tokens for r in recs) == st_.evicted_tokens, name
        if model != "sequence":  # (the lab policies overcommit there: docs/LAB.md)
            assert st_.peak_used_tokens <= cap and st_.peak_cached_tokens <= cap, name
        finished_at: dict[object, float] = {}
        for r, q in zip(recs, reqs, strict=True):
            assert r.prompt_tokens == q.prompt_len and r.output_tokens == q.output_len
            if r.rejected:
                continue
            assert 0 <= r.loaded_tokens <= r.host_hit_tokens <= q.prompt_len - 1, name
            assert r.loaded_tokens <= r.hit_tokens <= q.prompt_len - 1, name
            if not model.startswith("time"):
                continue
            assert r.arrival >= q.arrival and r.ttft == r.first_token - r.arrival
            own = cost.prefill_ms(q.prompt_len, r.hit_tokens) / 1000 + r.load_time
            assert r.ttft >= own - 1e-9 and r.finished >= r.first_token, name
            assert (r.preemptions > 0) == (r.recomputed_tokens > 0), name
            if q.session is not None:  # a turn starts after the previous one finished
                assert r.first_token > finished_at.get(q.session, -1.0), name
                finished_at[q.session] = r.finished
        s = summarize(res)
        assert s["requests"] == len(reqs) and 0 <= s["hit_rate"] < 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_core_and_reference_trie_replay_identically(data: st.DataObject) -> None:
    """TrtllmPolicy over the Rust trie and over the plain-Python reference, host tier
    included, under both clocked and unclocked models."""
    from prefixcache.reference.trie import BlockTrie as RefTrie

    reqs = _random_workload(data)
    cap = data.draw(st.sampled_from([8, 24, 48, 96]))
    cpu = data.draw(st.sampled_from([0, 32]))
    model = data.draw(st.sampled_from(["slots", "time"]))
    tier = {"cpu_capacity": cpu, "offload": "host"} if cpu else {}
    a = TrtllmPolicy(cap, tokens_per_block=4, **tier)  # type: ignore[arg-type]
    b = TrtllmPolicy(cap, tokens_per_block=4, trie_cls=RefTrie, **tier)  # type: ignore[arg-type]
    ra, rb = replay(reqs, [a, b], model=model, check=True)
    assert [repr(r) for r in ra.records] == [repr(r) for r in rb.records]
    assert ra.stats == rb.stats


def test_a_zero_decode_step_is_refused_as_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """--decode-step-ms 0 passed the flag's [0, 1e9] check and was refused later in the
    API's terms ("decode_step_ms must be > 0"); the flag now names itself and its range."""
    from prefixcache.sim.cli import main

    argv = ["replay", "workload:A", "--model", "time", "--decode-step-ms", "0", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--decode-step-ms" in err[0] and "(0, 1e+09]" in err[0], err
    assert main(["replay", "workload:A", "--model", "time", "--decode-step-ms", "0.5"]) == 0


@pytest.mark.parametrize("bad", ["8", 2.5, True, None])
def test_scheduler_arguments_of_the_wrong_type_are_refused(bad: object) -> None:
    """SlotScheduler("8") failed at its first comparison with a bare TypeError, and 2.5
    or True ran as a bound on the running requests."""
    for make in (SlotScheduler, TimeScheduler):
        with pytest.raises(PrefixCacheError, match="max_running"):
            make(bad)  # type: ignore[arg-type]
    if not isinstance(bad, bool):
        with pytest.raises(PrefixCacheError, match="preemption"):
            TimeScheduler(4, preemption=bad)  # type: ignore[arg-type]
    if bad is not None:  # (None: the default cost)
        with pytest.raises(PrefixCacheError, match="cost"):
            TimeScheduler(4, cost=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tokens", "error"),
    [
        (np.array([1, -1, 3]), "token ids"),
        (np.array([1.0, 2.5]), "integers"),
        (np.array([1, 2**32]), "token ids"),
        (np.array([[1, 2]]), "one-dimensional"),
        (["a", "b"], "integers"),
    ],
)
def test_token_ids_are_checked_once_for_every_policy(tokens: object, error: str) -> None:
    """The engine adapters refused a negative or fractional token id when the request
    reached them, the lab policies cast it to uint32 (-1 became 4294967295) and replayed.
    A Request checks its tokens itself, and reading them gives uint32 as documented."""
    for prompt, output in ((tokens, _tokens(9, 2)), (_tokens(1, 3), tokens)):
        with pytest.raises(PrefixCacheError, match=error):
            Request(0, prompt, output)  # type: ignore[arg-type]
    r = Request(0, [5, 6, 7], np.array([8, 9], dtype=np.int64))  # type: ignore[arg-type]
    assert r.prompt.dtype == np.uint32 and r.output.dtype == np.uint32
    assert r.prompt.tolist() == [5, 6, 7] and (r.prompt_len, r.output_len) == (3, 2)


def test_a_lazy_prompt_or_output_must_have_the_length_it_declared() -> None:
    """A lazy prompt producing 10 tokens for a declared prompt_len of 5 was replayed as
    is: hits of up to 9 tokens over a 5-token prompt (a hit rate above what the prompt
    allows), and vllm-blocks failed mid-decode on a lazy output shorter than declared
    ("0 queued tokens, fewer than the 4 steps")."""
    lying = Request(0, lambda: _tokens(1, 10), lambda: _tokens(100, 3), prompt_len=5, output_len=8)
    with pytest.raises(PrefixCacheError, match="prompt_len 5"):
        lying.prompt  # noqa: B018
    with pytest.raises(PrefixCacheError, match="output_len 8"):
        lying.output  # noqa: B018
    reqs = [lying, Request(1, _tokens(1, 12), _tokens(200, 4))]
    with pytest.raises(PrefixCacheError, match="prompt_len 5"):
        replay(reqs, ["radix"], 1000)
    ok = Request(0, lambda: [1, 2, 3], lambda: _tokens(7, 2), prompt_len=3, output_len=2)
    assert ok.prompt.dtype == np.uint32 and ok.output_head(1).tolist() == [7]


@pytest.mark.skipif(not HAVE_BLOCKS, reason="KVCacheManager not built")
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reference_block_manager_with_a_cpu_tier_replays_as_the_core(data: st.DataObject) -> None:
    """BlocksPolicy(manager_cls=<reference KVCacheManager>, cpu_capacity=...) failed at
    its first admission ("'KVCacheManager' object is not an instance of
    'KVCacheManager'": the tier read the keys from the core manager only)."""
    from prefixcache.reference.blocks import KVCacheManager as RefManager
    from prefixcache.sim.policies import BlocksPolicy

    reqs = _random_workload(data)
    cap = data.draw(st.sampled_from([16, 32, 64, 128]))
    model = data.draw(st.sampled_from(["slots", "time"]))
    offload = data.draw(st.sampled_from(["lru", "arc", "lru:2"]))
    a = BlocksPolicy(cap, block_size=4, cpu_capacity=32, offload=offload)
    b = BlocksPolicy(cap, block_size=4, cpu_capacity=32, offload=offload, manager_cls=RefManager)
    ra, rb = replay(reqs, [a, b], model=model, check=True)
    assert [repr(r) for r in ra.records] == [repr(r) for r in rb.records]
    assert ra.stats == rb.stats


def test_arguments_a_model_does_not_take_are_refused() -> None:
    reqs = shared_prefix_workload(num_groups=1, prompts_per_group=2).requests
    with pytest.raises(PrefixCacheError, match="max_running applies"):
        make_scheduler("sequence", max_running=4)
    for model in ("slots", "sequence"):
        with pytest.raises(PrefixCacheError, match="preemption=False applies"):
            make_scheduler(model, preemption=False)
    with pytest.raises(PrefixCacheError, match="runs the slots model"):
        replay(reqs, ["radix"], 1000, model="time", scheduler=SlotScheduler())
    with pytest.raises(PrefixCacheError, match="capacity must be an int"):
        replay(reqs, ["radix"], 2500.5)  # type: ignore[arg-type]
    # The same scheduler named twice, or a numpy int capacity, is fine.
    (r,) = replay(reqs, ["radix"], np.int64(4000), model="time", scheduler=TimeScheduler())
    assert r.capacity == 4000
