"""The simulator's second-tier plumbing (docs/SIMULATOR.md, "Offload"): the command line's
flags and their checks, the host load time model, the report, the GPU x host grid sweep.

The engines' host tiers are not needed here: two test doubles with a tier of known
behaviour stand in for them (``ScriptedTier``: hits given per request; ``HalfOnHost``: a
real policy whose every hit is declared half from host memory).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefixcache.sim.cli as cli
import prefixcache.sim.replay as replay_mod
from prefixcache.errors import InvalidInputError
from prefixcache.sim.cli import main
from prefixcache.sim.policies import (
    PolicyStats,
    blocks_available,
    check_offload,
    check_tier,
    make_policy,
)
from prefixcache.sim.replay import RUN_FIELDS, replay, summarize
from prefixcache.sim.requests import Request
from prefixcache.sim.scheduler import KV_MODELS, KvModel, PrefillCost, TimeScheduler
from prefixcache.sim.sweep import SweepSpec, run_grid, run_pairs

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "mooncake_sample.jsonl"
POLICIES = ["radix", "radix-page16"] + (["vllm-blocks"] if blocks_available() else [])


# -- test doubles ------------------------------------------------------------------------
class ScriptedTier:
    """A cache with a host tier whose hits are given per request: ``admit(rid)`` returns
    ``hits[rid]`` of which ``hosts[rid]`` come from host memory. Requests must have one
    output token (the prefill samples it and they finish: no decode)."""

    def __init__(self, hits: dict[int, int], hosts: dict[int, int], cpu_capacity: int) -> None:
        self.name = "scripted"
        self.capacity = 10**9
        self.hits, self.hosts, self.cpu = hits, hosts, cpu_capacity
        self.last = 0

    def admit(self, rid: int, prompt: Any, reserve: int, extra_key: Any = None, salt: Any = None):
        self.last = self.hosts.get(rid, 0)
        return self.hits.get(rid, 0)

    def host_hit(self, rid: int) -> int:
        return self.last

    def on_prefill_done(self, rid: int) -> None:
        pass

    def finish(self, rid: int, tail: Any) -> None:
        pass

    def evicted_tokens(self) -> int:
        return 0

    def max_uniform_growth(self, rids: Any, limit: int | None = None) -> int:
        raise AssertionError("no decode in these tests")

    def stats(self) -> PolicyStats:
        return PolicyStats(
            self.name,
            self.capacity,
            "blocks",
            cpu_capacity=self.cpu,
            stored_tokens=7,
            host_evicted_tokens=5,
            peak_host_tokens=3,
        )

    def check(self) -> None:
        pass


class HalfOnHost:
    """A real policy (``inner``) given a pretend host tier: of each admission's hit, the
    last ``hit // 2`` tokens are declared loaded from host memory."""

    def __init__(self, inner: Any, cpu_capacity: int) -> None:
        self.inner = inner
        self.cpu = cpu_capacity
        self.last = 0
        self.total = 0

    def admit(self, rid: int, *args: Any) -> int | None:
        hit = self.inner.admit(rid, *args)
        self.last = 0 if hit is None else hit // 2
        self.total += self.last
        return hit  # type: ignore[no-any-return]

    def host_hit(self, rid: int) -> int:
        return self.last

    def stats(self) -> PolicyStats:
        st: PolicyStats = self.inner.stats()
        st.cpu_capacity = self.cpu
        st.host_hit_tokens = self.total
        return st

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def half_on_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Policies built by name with cpu_capacity > 0 get the ``HalfOnHost`` tier (in this
    process and in forked sweep workers), and the command line accepts them."""
    real = make_policy

    def fake(name: str, capacity: int, **kw: Any) -> Any:
        cpu = kw.pop("cpu_capacity", 0)
        kw.pop("offload", None)
        pol = real(name, capacity, **kw)
        return HalfOnHost(pol, cpu) if cpu else pol

    monkeypatch.setattr(replay_mod, "make_policy", fake)
    monkeypatch.setattr(cli, "check_tier", lambda *a, **k: None)


@pytest.fixture
def small_sample(tmp_path: Path) -> Path:
    """The first 200 requests of the Mooncake sample."""
    p = tmp_path / "small.jsonl"
    p.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:200]))
    return p


def one_token_requests(prompts: list[int]) -> list[Request]:
    """Requests far apart in time (each prefilled alone), one output token each."""
    return [
        Request(i, np.arange(p, dtype=np.uint32), np.zeros(1, dtype=np.uint32), arrival=100.0 * i)
        for i, p in enumerate(prompts)
    ]


# -- KV bytes and the load cost -----------------------------------------------------------
def test_kv_bytes_per_token_of_the_table() -> None:
    b = {k: m.bytes_per_token for k, m in KV_MODELS.items()}
    assert b["llama-3.1-8b"] == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert b["llama-3.1-70b"] == 2 * 80 * 8 * 128 * 2 == 320 * 1024
    assert b["qwen2.5-7b"] == 2 * 28 * 4 * 128 * 2 == 56 * 1024
    assert b["qwen3-32b"] == 2 * 64 * 8 * 128 * 2 == 256 * 1024
    assert b["deepseek-v3"] == 61 * (512 + 64) * 2 == 70272  # MLA: one latent vector
    assert KvModel("x", 10, 4, 64, "fp8").bytes_per_token == 2 * 10 * 4 * 64
    assert KvModel("x", 10, 4, 64, "fp32").bytes_per_token == 2 * 10 * 4 * 64 * 4
    with pytest.raises(InvalidInputError, match="dtype"):
        KvModel("x", 1, 1, 1, "int3")
    with pytest.raises(InvalidInputError, match="kv_heads 1"):
        KvModel("x", 1, 2, 1, mla=True)


def test_load_and_recompute_cost() -> None:
    c = PrefillCost()  # llama-3.1-8b at 25 GB/s
    assert c.load_ms(1000) == pytest.approx(1000 * 131072 / 25e9 * 1e3)  # 5.24288 ms
    c = PrefillCost(5.0, 0.5, 0.0, 20.0, kv_bytes_per_token=250_000.0, host_gb_per_s=1.0)
    assert c.load_ms(100) == 25.0  # 100 x 250 kB at 1 GB/s
    assert c.recompute_ms(300, 100) == 50.0 == c.prefill_ms(1000, 300) - c.prefill_ms(1000, 400)
    assert c.host_load_ms(300, 100) == 25.0
    tie = PrefillCost(5.0, 0.5, 0.0, 20.0, kv_bytes_per_token=500_000.0, host_gb_per_s=1.0)
    assert tie.load_ms(100) == tie.recompute_ms(0, 100) == 50.0
    assert tie.host_load_ms(0, 100) is None  # as fast as recomputing: recompute
    q = PrefillCost(0.0, 0.0, 1e-3, 20.0, kv_bytes_per_token=1e6, host_gb_per_s=1.0)
    # attention only: recomputing tokens [g, g + h) costs 1e-3 * ((g + h)^2 - g^2) / 2 ms
    assert q.recompute_ms(1000, 100) == pytest.approx(1e-3 * (1100**2 - 1000**2) / 2)
    with pytest.raises(InvalidInputError, match="host_gb_per_s"):
        PrefillCost(host_gb_per_s=0.0)


# -- the time model with a host tier ------------------------------------------------------
COST = PrefillCost(5.0, 0.01, 1e-6, 20.0, kv_bytes_per_token=1000.0, host_gb_per_s=1.0)
# load 0.001 ms/token (beats recomputing, >= 0.01 ms/token)
SLOW = PrefillCost(5.0, 0.01, 1e-6, 20.0, kv_bytes_per_token=1e6, host_gb_per_s=1.0)
# load 1 ms/token (recomputing is faster)


def test_time_model_charges_the_load_when_it_beats_recomputing() -> None:
    reqs = one_token_requests([1000, 2000, 500])
    pol = ScriptedTier({0: 0, 1: 1500, 2: 400}, {1: 600, 2: 400}, cpu_capacity=10_000)
    (res,) = replay(reqs, [pol], scheduler=TimeScheduler(cost=COST))
    r0, r1, r2 = res.records
    assert r0.ttft == pytest.approx(COST.prefill_ms(1000, 0) / 1e3)
    load1 = 600 * 1000 / 1e6  # ms
    assert r1.ttft == pytest.approx((COST.prefill_ms(2000, 1500) + load1) / 1e3)
    assert (r1.hit_tokens, r1.host_hit_tokens, r1.loaded_tokens) == (1500, 600, 600)
    assert r1.load_time == pytest.approx(load1 / 1e3)
    assert r2.ttft == pytest.approx((COST.prefill_ms(500, 400) + 0.4) / 1e3)
    s = summarize(res)
    assert s["hit_tokens"] == 1900
    assert (s["gpu_hit_tokens"], s["host_hit_tokens"], s["loaded_tokens"]) == (900, 1000, 1000)
    assert s["host_unloaded_tokens"] == 0
    assert s["gpu_hit_rate"] == pytest.approx(900 / 3500)
    assert s["host_hit_rate"] == pytest.approx(1000 / 3500)
    assert s["hit_rate"] == pytest.approx(s["gpu_hit_rate"] + s["host_hit_rate"])
    assert (s["stored_tokens"], s["host_evicted_tokens"], s["peak_host_tokens"]) == (7, 5, 3)
    assert s["cpu_capacity"] == 10_000
    assert s["load_seconds"] == pytest.approx((load1 + 0.4) / 1e3)


def test_time_model_recomputes_a_host_hit_not_worth_loading() -> None:
    reqs = one_token_requests([1000, 2000])
    pol = ScriptedTier({1: 1500}, {1: 600}, cpu_capacity=10_000)
    (res,) = replay(reqs, [pol], scheduler=TimeScheduler(cost=SLOW))
    r1 = res.records[1]
    # 600 ms to load vs ~6 + 1.3 ms to recompute: the 600 tokens are prefilled again
    assert r1.ttft == pytest.approx(SLOW.prefill_ms(2000, 900) / 1e3)
    assert (r1.hit_tokens, r1.host_hit_tokens, r1.loaded_tokens, r1.load_time) == (
        900,
        600,
        0,
        0.0,
    )
    s = summarize(res)
    assert (s["hit_tokens"], s["gpu_hit_tokens"], s["loaded_tokens"]) == (900, 900, 0)
    assert s["host_unloaded_tokens"] == 600
    assert s["host_hit_rate"] == 0.0


def test_loads_of_one_batch_add_up() -> None:
    # Both arrive at 0 and are prefilled in one batch: its time is both prefills and
    # both loads, and both requests see the end of the batch as their first token.
    reqs = [
        Request(i, np.arange(p, dtype=np.uint32), np.zeros(1, dtype=np.uint32))
        for i, p in enumerate([1000, 800])
    ]
    pol = ScriptedTier({0: 500, 1: 800 - 1}, {0: 200, 1: 300}, cpu_capacity=1)
    (res,) = replay(reqs, [pol], scheduler=TimeScheduler(cost=COST))
    batch = COST.prefill_ms(1000, 500) + COST.prefill_ms(800, 799) + (200 + 300) * 1e-3
    assert [r.ttft for r in res.records] == pytest.approx([batch / 1e3] * 2)


def test_clockless_models_count_every_host_hit_as_loaded() -> None:
    reqs = one_token_requests([1000, 2000])
    for model in ("slots", "sequence"):
        pol = ScriptedTier({1: 1500}, {1: 600}, cpu_capacity=1)
        (res,) = replay(reqs, [pol], model=model)
        r1 = res.records[1]
        assert (r1.hit_tokens, r1.host_hit_tokens, r1.loaded_tokens) == (1500, 600, 600)
        assert summarize(res)["host_unloaded_tokens"] == 0


# -- the protocol --------------------------------------------------------------------------
def test_policies_without_a_tier_report_no_host_hit() -> None:
    names = [*POLICIES, "lab-lru", "trtllm"]
    reqs = one_token_requests([300, 400])
    for name in names:
        pol = make_policy(name, 10_000)
        pol.admit(0, reqs[0].prompt, 0)
        assert pol.host_hit(0) == 0
        st = pol.stats()
        assert (st.cpu_capacity, st.host_hit_tokens, st.stored_tokens) == (0, 0, 0)
        assert (st.host_evicted_tokens, st.peak_host_tokens) == (0, 0)


def test_offload_names_per_family() -> None:
    for pol, ok in [
        ("vllm-blocks", ["lru", "arc", "lru:2", "arc:10"]),
        ("vllm-blocks32", ["lru"]),
        ("radix", ["write-through", "write-through-selective", "write-back"]),
        ("radix-page16", ["write-back"]),
        ("trtllm", ["host", "host:0", "host:35", "host:100"]),
        ("trtllm-nopartial", ["host:50"]),
    ]:
        for name in [None, *ok]:
            check_offload(pol, name)
    for pol, bad in [
        ("vllm-blocks", ["lru:0", "arc:", "write-back", "LRU"]),
        ("radix", ["lru", "write-through:2"]),
        ("trtllm", ["host:101", "host:-1", "lru"]),
    ]:
        for name in bad:
            with pytest.raises(InvalidInputError, match="does not apply"):
                check_offload(pol, name)
    with pytest.raises(InvalidInputError, match="no host tier"):
        check_offload("lab-lru", None)
    with pytest.raises(InvalidInputError, match="needs a host tier"):
        check_tier("radix", 0, "write-back")
    with pytest.raises(InvalidInputError, match="no host tier"):
        make_policy("opt", 1000, cpu_capacity=1000)
    with pytest.raises(InvalidInputError, match="cpu_capacity"):
        make_policy("radix", 1000, cpu_capacity=-1)


# -- the command line ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--offload", "lru"], "--offload lru needs a host tier"),
        (["--cpu-capacity", "1M", "--policies", "lab-lru"], "'lab-lru' has no host tier"),
        (["--cpu-capacity", "1M", "--offload", "lru"], "'lru' does not apply to radix"),
        (
            ["--cpu-capacity", "1M", "--policies", "vllm-blocks", "--offload", "arc:0"],
            "'arc:0' does not apply to vllm-blocks",
        ),
        (["--cpu-capacity", "1M", "--offload", "foo=lru"], "'foo' is not a policy of this run"),
        (
            ["--cpu-capacity", "1M", "--offload", "radix=write-back,radix=write-back"],
            "radix given twice",
        ),
        (["--cpu-capacity", "1M", "--offload", "radix=write-back,lru"], "is not POLICY=NAME"),
        (["--cpu-capacity", "1M", "--offload", "lru,arc"], "one name for every policy"),
        (["--cpu-capacity", "-3"], "bad capacity"),
        (["--cpu-capacity", "2kB"], "counts tokens, not bytes"),
        (["--kv-model", "gpt-5"], "invalid choice"),
        (["--kv-dtype", "int4"], "invalid choice"),
        (["--host-bandwidth", "0"], "GB/s > 0"),
        (["--kv-mla", "--kv-heads", "2"], "kv_heads 1"),
        (["--kv-layers", "0"], "whole number >= 1"),
        (["--cpu-capacity", "1M", "--kv-layers", "1" + "0" * 310], "KV bytes per token"),
    ],
)
def test_replay_rejects_bad_tier_flags_before_running(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(SAMPLE), "--quiet", "--model", "time", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert message in " ".join(err.split())


@pytest.mark.parametrize("text", ["0", "0k", "0.0", "0_000", "0Mi", "0e3", ".0", "0.0e6"])
def test_a_host_capacity_of_zero_in_any_capacity_form_is_no_tier(text: str) -> None:
    # "the same forms as --capacity; 0 is no tier": 0e3 and .0 were refused as capacities
    # under one token (with the advice to leave --capacity out).
    ap = cli.build_parser()
    args = ap.parse_args(["replay", str(SAMPLE), "--cpu-capacity", text])
    assert args.cpu_capacity == 0
    argv = ["sweep", str(SAMPLE), "--capacities", "1M", "--cpu-capacities", f"{text},1e6"]
    assert ap.parse_args(argv).cpu_capacities == [0, 1_000_000]


@pytest.mark.parametrize(("text", "message"), [("0.5", "not a whole number"), ("-0", "bad")])
def test_a_host_capacity_is_still_a_whole_number_of_tokens(
    text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(SAMPLE), f"--cpu-capacity={text}", "--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_sweep_rejects_both_host_capacity_forms(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", str(SAMPLE), "--capacities", "1M", "--cpu-capacity", "1M"]
    assert main([*argv, "--cpu-capacities", "0,1M"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main([*argv[:4], "--cpu-capacities", "0,1M", "--instances", "2"]) == 2
    assert "fleet sweep" in capsys.readouterr().err


def test_kv_flags_set_the_load_cost() -> None:
    ap = cli.build_parser()

    def cost(*flags: str) -> PrefillCost:
        args = ap.parse_args(
            ["replay", str(SAMPLE), "--model", "time", "--cpu-capacity", "1M", *flags]
        )
        cli._check_args(args)
        c: PrefillCost = args.cost
        return c

    assert cost().kv_bytes_per_token == 131072 and cost().host_gb_per_s == 25.0
    assert cost("--kv-model", "qwen3-32b").kv_bytes_per_token == 262144
    assert cost("--kv-model", "llama-3.1-70b", "--kv-dtype", "fp8").kv_bytes_per_token == 163840
    assert cost("--kv-model", "deepseek-v3").kv_bytes_per_token == 70272
    custom = ("--kv-layers", "4", "--kv-heads", "2", "--head-dim", "64", "--kv-dtype", "fp32")
    assert cost(*custom).kv_bytes_per_token == 2 * 4 * 2 * 64 * 4
    assert cost("--kv-mla", "--head-dim", "576", "--kv-layers", "61").kv_bytes_per_token == 70272
    assert cost("--host-bandwidth", "64").host_gb_per_s == 64.0


def _strip_timing(d: dict[str, Any]) -> dict[str, Any]:
    for s in d["summaries"]:
        for k in RUN_FIELDS:
            s.pop(k)
    return d


# The keys of a summary and of a record without a second tier (no host-tier fields).
PLAIN_SUMMARY_KEYS = [
    "policy", "model", "capacity", "requests", "rejected", "prompt_tokens", "hit_tokens",
    "hit_rate", "evicted_tokens", "evictions", "eviction_unit", "peak_used_tokens",
    "peak_cached_tokens", "peak_rss_bytes", "start_rss_bytes", "seconds", "preemptions",
    "recompute_hit_tokens", "recomputed_tokens", "ttft_p50", "ttft_p90", "ttft_p99", "makespan",
]  # fmt: skip
PLAIN_RECORD_KEYS = [
    "id", "session", "turn", "prompt_tokens", "output_tokens", "hit_tokens", "evicted_tokens",
    "rejected", "arrival", "first_token", "finished", "ttft", "preemptions",
    "recompute_hit_tokens", "recomputed_tokens",
]  # fmt: skip


def test_no_host_tier_gives_the_results_of_before(tmp_path: Path, small_sample: Path) -> None:
    out = {}
    for tag, extra in [("none", []), ("zero", ["--cpu-capacity", "0"])]:
        js = tmp_path / f"{tag}.json"
        argv = ["replay", str(small_sample), "--capacity", "1M", "--model", "time", "--quiet"]
        assert main([*argv, "--jobs", "1", "--json", str(js), *extra]) == 0
        out[tag] = _strip_timing(json.loads(js.read_text()))
    assert out["none"] == out["zero"]
    s = json.loads((tmp_path / "zero.json").read_text())
    for x in s["summaries"]:
        assert list(x) == PLAIN_SUMMARY_KEYS
    for recs in s["records"].values():
        assert list(recs[0]) == PLAIN_RECORD_KEYS


def test_replay_reports_the_host_tier(
    tmp_path: Path, half_on_host: None, capsys: pytest.CaptureFixture[str]
) -> None:
    js, rc = tmp_path / "r.json", tmp_path / "records.csv"
    argv = ["replay", str(SAMPLE), "--capacity", "1M", "--model", "time", "--quiet"]
    argv += ["--jobs", "1", "--cpu-capacity", "4M", "--json", str(js), "--records-csv", str(rc)]
    assert main([*argv, "--policies", "radix"]) == 0
    out = capsys.readouterr().out
    assert "GPU" in out and "host" in out and "not worth" in out
    d = json.loads(js.read_text())
    (s,) = d["summaries"]
    assert s["cpu_capacity"] == 4_000_000
    assert s["gpu_hit_tokens"] + s["loaded_tokens"] == s["hit_tokens"]
    assert s["host_hit_tokens"] == s["loaded_tokens"] + s["host_unloaded_tokens"]
    recs = d["records"]["radix"]
    assert sum(r["host_hit_tokens"] for r in recs if not r["rejected"]) == s["host_hit_tokens"]
    assert "loaded_tokens" in rc.read_text().splitlines()[0]


def test_time_model_with_half_the_hits_on_host() -> None:
    # The default cost (llama-3.1-8b over 25 GB/s) loads 5.2 us/token and recomputes
    # >= 10 us/token: every host hit is loaded, the hit rate is that of the GPU policy.
    reqs = one_token_requests([3000, 3000, 3000])
    base = replay(reqs, ["radix"], 10_000, model="time")[0]
    inner = make_policy("radix", 10_000)
    (res,) = replay(reqs, [HalfOnHost(inner, 1000)], model="time")
    assert [r.hit_tokens for r in res.records] == [r.hit_tokens for r in base.records]
    assert [r.loaded_tokens for r in res.records] == [r.hit_tokens // 2 for r in base.records]
    c = PrefillCost()
    for a, b in zip(res.records, base.records, strict=True):
        assert a.ttft == pytest.approx(b.ttft + c.load_ms(b.hit_tokens // 2) / 1e3)


# -- the GPU x host grid ------------------------------------------------------------------
def test_grid_is_every_cell_of_individual_replays(half_on_host: None) -> None:
    from prefixcache.sim.traces import read_trace

    reqs = read_trace(str(SAMPLE)).requests[:150]
    spec = SweepSpec(trace=str(SAMPLE), policies=("radix", "radix-page16"), model="time")
    caps, cpus = [200_000, 800_000], [0, 500_000, 2_000_000]
    grid = run_grid(spec, reqs, caps, cpus, jobs=2)
    assert len(grid) == len(caps) * len(cpus) * 2
    assert [(g["capacity"], g["cpu_capacity"], g["policy"]) for g in grid] == [
        (c, h, p) for c in caps for h in cpus for p in ("radix", "radix-page16")
    ]
    for g in grid:
        one = replay(
            reqs,
            [g["policy"]],
            g["capacity"],
            model="time",
            cpu_capacity=g["cpu_capacity"],
        )[0]
        want = {**summarize(one), "cpu_capacity": g["cpu_capacity"]}
        for k in RUN_FIELDS:
            want.pop(k)
        assert {k: v for k, v in g.items() if k not in RUN_FIELDS} == want
    # cpu 0 is the plain replay, as run_pairs gives it
    plain = run_pairs(spec, reqs, [(200_000, "radix")], jobs=1)[0]
    assert grid[0]["hit_rate"] == summarize(plain)["hit_rate"]
    assert "host_hit_tokens" not in grid[0] and "host_hit_tokens" in grid[2]


def test_grid_sweep_command_writes_tables_json_csv_and_heatmap(
    tmp_path: Path, small_sample: Path, half_on_host: None, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    js, cs, png = tmp_path / "g.json", tmp_path / "g.csv", tmp_path / "g.png"
    argv = ["sweep", str(small_sample), "--capacities", "256k,1M", "--cpu-capacities", "0,2M"]
    argv += ["--policies", "radix,radix-page16", "--model", "time", "--quiet", "--jobs", "1"]
    argv += ["--json", str(js), "--csv", str(cs), "--plot", str(png)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "radix: hit rate" in out and "radix-page16: TTFT p50" in out
    d = json.loads(js.read_text())
    assert d["capacities"] == [256_000, 1_000_000] and d["cpu_capacities"] == [0, 2_000_000]
    assert len(d["summaries"]) == 2 * 2 * 2
    assert len(cs.read_text().splitlines()) == 1 + 8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("num_caps", "num_policies", "ttft"), [(1, 3, False), (2, 2, False), (2, 5, True)]
)
def test_grid_heatmap_labels_neither_overlap_nor_leave_the_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, num_caps: int, num_policies: int, ttft: bool
) -> None:
    """Every panel's y label fits beside its own row of panels: none runs into another's
    or is cut off at the figure's edge, however few GPU capacities a row has."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from prefixcache.sim.report import write_grid_plot

    labels: list[Any] = []
    save = matplotlib.figure.Figure.savefig

    def savefig(fig: Any, *args: Any, **kwargs: Any) -> None:
        save(fig, *args, **kwargs)
        r = fig.canvas.get_renderer()
        labels.extend(ax.yaxis.label.get_window_extent(r) for ax in fig.axes if ax.get_ylabel())
        labels.append(fig.bbox)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    caps, cpus = [8000 * (i + 1) for i in range(num_caps)], [0, 6400, 12_800]
    sums = [
        {"policy": f"p{k}", "capacity": c, "cpu_capacity": h, "hit_rate": 0.1 * k}
        | ({"ttft_p50": 0.5} if ttft else {})
        for k in range(num_policies)
        for c in caps
        for h in cpus
    ]
    write_grid_plot(tmp_path / "g.png", caps, cpus, sums, "grid")
    *boxes, fig = labels
    assert len(boxes) == num_policies * (2 if ttft else 1)
    for i, a in enumerate(boxes):
        assert a.y0 >= 0 and a.y1 <= fig.height, (i, a)
        assert not any(a.overlaps(b) for b in boxes[i + 1 :]), i


@pytest.mark.parametrize(("cpu", "title"), [([], ""), (["--cpu-capacity", "2M"], "2M")])
def test_sweep_titles_name_the_host_tier(
    cpu: list[str],
    title: str,
    small_sample: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A 1-D sweep with a host tier says so in its table's and plot's titles (the hit
    rates would otherwise read as a run without one)."""
    import prefixcache.sim.cli as cli_mod

    titles: list[str] = []
    monkeypatch.setattr(cli_mod, "write_sweep_plot", lambda _p, _c, _r, t: titles.append(t))
    argv = ["sweep", str(small_sample), "--capacities", "256k", "--policies", "radix"]
    assert main([*argv, *cpu, "--quiet", "--jobs", "1", "--plot", "x.png"]) == 0
    out = capsys.readouterr().out
    named = f"host tier {title} tokens"
    assert ("hit rate vs KV capacity, " + named in out) == bool(title)
    assert len(titles) == 1 and (named in titles[0]) == bool(title), titles


def test_fleet_gives_every_instance_its_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefixcache.sim.fleet as fleet_mod

    built: list[tuple[int, str | None]] = []
    real = make_policy

    def fake(name: str, capacity: int, **kw: Any) -> Any:
        cpu, off = kw.pop("cpu_capacity", 0), kw.pop("offload", None)
        built.append((cpu, off))
        return HalfOnHost(real(name, capacity, **kw), cpu)

    monkeypatch.setattr(fleet_mod, "make_policy", fake)
    monkeypatch.setattr(replay_mod, "make_policy", fake)
    reqs = one_token_requests([2000, 2000, 2000, 2000])
    res = fleet_mod.fleet_replay(
        reqs, "radix", 10_000, 2, "round-robin", cpu_capacity=5000, offload="write-back",
        ceiling=True,
    )  # fmt: skip
    assert built == [(5000, "write-back")] * 2 + [(10_000, "write-back")]  # + the ceiling
    s = fleet_mod.summarize_fleet(res)
    assert s["cpu_capacity"] == 5000
    assert s["loaded_tokens"] == s["host_hit_tokens"] == sum(r.hit_tokens // 2 for r in res.records)


@pytest.mark.parametrize(
    ("name", "offload"), [("vllm-blocks", "arc:2"), ("radix", "write-back"), ("trtllm", "host:40")]
)
@pytest.mark.parametrize("model", ["slots", "time"])
def test_a_built_policy_reports_the_tier_policy_it_runs(
    name: str, offload: str, model: str
) -> None:
    # A policy given built reported offload null ("the default") whatever it ran.
    if name == "vllm-blocks" and not blocks_available():
        pytest.skip("this build has no vllm-blocks")
    reqs = one_token_requests([1000, 1000])
    built = make_policy(name, 10_000, cpu_capacity=5000, offload=offload)
    (res,) = replay(reqs, [built], model=model)
    (by_name,) = replay(reqs, [name], 10_000, model=model, cpu_capacity=5000, offload=offload)
    assert res.offload == by_name.offload == offload
    assert summarize(res)["offload"] == summarize(by_name)["offload"] == offload


def test_tables_show_the_host_columns_only_with_a_tier() -> None:
    from rich.console import Console

    from prefixcache.sim.report import comparison_table, host_tier_tables

    def text(table: Any) -> str:
        c = Console(width=80, record=True)
        c.print(table)
        return c.export_text()

    reqs = one_token_requests([1000, 2000])
    plain = summarize(replay(reqs, ["radix"], 10_000)[0])
    tiered = summarize(replay(reqs, [ScriptedTier({1: 1500}, {1: 600}, 1)])[0])
    assert "GPU" not in text(comparison_table("t", [plain]))
    assert host_tier_tables([plain]) == []
    both = text(comparison_table("t", [plain, tiered]))
    assert "GPU" in both and "host" in both
    assert "not worth" in text(host_tier_tables([plain, tiered])[0])
    # Rows as wide as the Mooncake conversation trace's (145M prompt tokens, every one
    # evicted in 16-token blocks) and a rejected column still fit 80 columns, uncut.
    big = {k: (v * 10**5 if isinstance(v, int) else v) for k, v in tiered.items()}
    big.update(policy="radix-page16", rejected=1234, hit_rate=1.0, cpu_capacity=64 * 10**9)
    big.update(evicted_tokens=145_000_000, evictions=9_062_500, eviction_unit="blocks")
    for t in [comparison_table("t", [plain, big]), *host_tier_tables([big])]:
        out = text(t)
        assert "\u2026" not in out and max(map(len, out.splitlines())) <= 80, out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # Each refused by one policy only when it was built: after the others ran.
        (
            "replay --capacity 16k --policies radix,vllm-blocks --cpu-capacity 8 --jobs 1",
            "vllm-blocks: cpu_capacity 8 is less than one 16-token block",
        ),
        (
            "sweep --capacities 16k --cpu-capacities 0,32 --policies radix,trtllm --jobs 1",
            "trtllm: cpu_capacity 32 is less than one 64-token block",
        ),
        # Each policy names itself: here the one of 64-token blocks, not trtllm16.
        (
            "replay --capacity 16k --policies trtllm16,trtllm --cpu-capacity 32 --jobs 1",
            "trtllm: cpu_capacity 32 is less than one 64-token block",
        ),
        (
            "sweep --capacities 16k,10 --policies radix,trtllm --jobs 1",
            "trtllm: capacity 10 is less than one 64-token block",
        ),
        (
            "replay --capacity 1e14 --policies radix,trtllm --jobs 1",
            "num_blocks must be in [1, 2**32 - 1)",
        ),
        # A fleet's ceiling (one instance of N x the capacity) once the fleet had run.
        (
            "replay --instances 2 --capacity 4e10",
            "the ceiling run (N x --capacity, N x --cpu-capacity): vllm-blocks with a "
            "capacity of 80000000000 tokens",
        ),
        (
            "sweep --instances 1,3 --capacities 1M --policies trtllm --cpu-capacity 1e11",
            "num_blocks + host_blocks must be < 2**32 - 1",
        ),
    ],
)
def test_sizes_a_policy_refuses_stop_the_command_before_anything_runs(
    tmp_path: Path, argv: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "not-read.jsonl"  # refused before the trace is opened
    command, *rest = argv.split()
    assert main([command, str(missing), *rest, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # A trace without --capacity runs at an unlimited budget (every token of every
        # request), known once the trace is read: trtllm's tier was refused only when its
        # replay started, after radix had run.
        (
            f"replay {SAMPLE} --policies radix,trtllm --cpu-capacity 1e15 --jobs 1",
            "trtllm with a capacity of 12337728 tokens",
        ),
        # A built-in workload's own budget (F: 24,576 tokens).
        (
            "replay workload:F --policies radix,trtllm1 --cpu-capacity 5G --jobs 1",
            "trtllm1 with a capacity of 24576 tokens",
        ),
        # compare: every workload's budget, before the first workload runs.
        (
            "compare --workload A,F --policies radix,trtllm1 --cpu-capacity 4294967000",
            "num_blocks + host_blocks must be < 2**32 - 1",
        ),
    ],
)
def test_sizes_refused_at_the_budget_of_the_requests_stop_the_command_before_any_replay(
    argv: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import prefixcache.sim.sweep as sweep_mod

    ran: list[object] = []

    def recording(requests: Any, policies: Any, *args: Any, **kw: Any) -> Any:
        ran.append(policies)
        return replay(requests, policies, *args, **kw)

    monkeypatch.setattr(cli, "replay", recording)
    monkeypatch.setattr(sweep_mod, "replay", recording)
    assert main([*argv.split(), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert ran == []


@pytest.mark.parametrize(
    ("capacity", "cpu"),
    [(63, 0), (64, 0), (64, 63), (64, 64), (640, 6400), (2**32 * 64, 0), (2**31 * 64, 2**31 * 64)],
)
@pytest.mark.parametrize("name", ["trtllm", "trtllm-nopartial16"])
def test_check_sizes_refuses_what_the_trie_refuses(name: str, capacity: int, cpu: int) -> None:
    from prefixcache.sim.policies import check_sizes, make_policy

    try:
        make_policy(name, capacity, cpu_capacity=cpu)
    except InvalidInputError as e:
        with pytest.raises(InvalidInputError) as got:
            check_sizes(name, capacity, cpu)
        assert str(got.value) == str(e)
    else:
        check_sizes(name, capacity, cpu)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # The load's cost flags were taken and ignored where no load is ever charged.
        ("--kv-model llama-3.1-70b", "--kv-model applies to --model time with a host tier"),
        ("--cpu-capacity 1M --host-bandwidth 8", "not --model slots"),
        ("--model sequence --cpu-capacity 1M --kv-dtype fp8", "not --model sequence"),
        ("--model time --kv-mla", "--kv-mla applies to --model time with a host tier"),
        ("--model time --host-bandwidth 8", "--host-bandwidth applies to --model time with a"),
        ("--instances 2 --capacity 16k --kv-layers 80", "not without a tier"),
    ],
)
def test_load_cost_flags_need_the_time_model_and_a_tier(
    tmp_path: Path, argv: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "not-read.jsonl"  # refused before the trace is opened
    assert main(["replay", str(missing), *argv.split(), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
