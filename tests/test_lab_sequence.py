"""The request-sequence model, the lab policies behind the policy protocol, the gap
report and the atlas."""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from prefixcache._core import LabCache
from prefixcache.errors import BlockStateError, InvalidInputError, UnknownRequestError
from prefixcache.sim.cli import main
from prefixcache.sim.gap import gap_rows
from prefixcache.sim.policies import make_policy
from prefixcache.sim.replay import replay, summarize
from prefixcache.sim.traces import read_trace
from prefixcache.sim.workloads import study_workload


def write_mooncake(path: Path, n: int, seed: int) -> list[dict[str, object]]:
    """A small Mooncake-format trace: sessions that grow, shared roots, one-offs."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    sessions: list[list[int]] = []
    next_id = 100
    for i in range(n):
        if sessions and rng.random() < 0.6:
            ids = rng.choice(sessions)
            ids += list(range(next_id, next_id + rng.randint(1, 3)))
            next_id += 3
        else:
            ids = [rng.randint(0, 2), *range(next_id, next_id + rng.randint(1, 4))]
            next_id += 4
            sessions.append(ids)
        length = 512 * (len(ids) - 1) + rng.choice([1, 200, 512])
        rows.append(
            {"timestamp": i * 10, "input_length": length, "output_length": 5, "hash_ids": list(ids)}
        )
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return rows


def reference_lru(rows: list[dict[str, object]], cap_blocks: int) -> int:
    """The Mooncake paper's method, plainly: look up the prefix, insert every full block,
    evict least recent down to the budget (a request's tail before its root)."""
    cache: OrderedDict[tuple[int, ...], None] = OrderedDict()
    hit_tokens = 0
    for r in rows:
        ids = list(r["hash_ids"])  # type: ignore[call-overload]
        n = int(r["input_length"])  # type: ignore[call-overload]
        keys = [tuple(ids[: i + 1]) for i in range(n // 512)]
        hit = 0
        while hit < (n - 1) // 512 and keys[hit] in cache:
            hit += 1
        hit_tokens += 512 * hit
        for k in reversed(keys):
            cache[k] = None
            cache.move_to_end(k)
        while len(cache) > cap_blocks:
            cache.popitem(last=False)
    return hit_tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cap_blocks", [2, 5, 12])
def test_sequence_model_is_the_papers_method(tmp_path: Path, seed: int, cap_blocks: int) -> None:
    rows = write_mooncake(tmp_path / "t.jsonl", 60, seed)
    reqs = read_trace(tmp_path / "t.jsonl").requests
    res = replay(
        reqs,
        ["lab-lru@512", "vllm-blocks512", "opt@512"],
        cap_blocks * 512,
        model="sequence",
        check=True,
    )
    got = {r.policy: summarize(r)["hit_tokens"] for r in res}
    assert got["lab-lru@512"] == reference_lru(rows, cap_blocks)
    assert got["opt@512"] >= got["lab-lru@512"]
    assert got["opt@512"] >= got["vllm-blocks512"]


@pytest.mark.parametrize("model", ["slots", "time", "sequence"])
@pytest.mark.parametrize("workload", ["E", "F"])
def test_lab_policies_keep_invariants_under_every_model(model: str, workload: str) -> None:
    w = study_workload(workload, 1)
    names = ["lab-lru", "lab-2q", "lab-density-admit2", "lab-session", "tree-trim", "opt"]
    res = replay(w.requests, names, w.capacity, model=model, check=True)
    rates = {r.policy: summarize(r)["hit_rate"] for r in res}
    if model == "sequence":  # exact optimum there
        assert all(rates["opt"] >= v for v in rates.values())


def test_opt_without_the_future_is_refused() -> None:
    pol = make_policy("opt", 1024)
    with pytest.raises(InvalidInputError, match="prepare"):
        pol.admit(0, np.arange(40, dtype=np.uint32), 0)


def test_lab_cache_errors_leave_it_unchanged() -> None:
    with pytest.raises(InvalidInputError, match="unknown lab eviction rule"):
        LabCache(4, "mru")
    c = LabCache(4)
    keys = np.array([1, 2], dtype=np.uint64)
    assert c.acquire(0, keys, 2, 2) == 0
    with pytest.raises(InvalidInputError, match="already holds"):
        c.acquire(0, keys, 2, 2)
    with pytest.raises(InvalidInputError, match="bracket"):
        c.acquire(1, keys, 3, 2)
    with pytest.raises(UnknownRequestError):
        c.release(9)
    assert c.num_used == 2
    c.check_invariants()


def test_lab_cache_overcommit_off_gets_back_under_the_budget() -> None:
    # Turning the request-sequence model off while over the budget used to leave the cache
    # over it, failing its own invariants: it now evicts down to the budget, or refuses
    # (nothing changed) when running requests hold more than the budget themselves.
    c = LabCache(3, overcommit=True)
    c.acquire(0, np.array([1, 2], dtype=np.uint64), 2, 2)
    c.release(0)
    c.acquire(1, np.array([5, 6], dtype=np.uint64), 2, 2)
    assert c.num_free == -1
    c.set_overcommit(False)
    assert c.num_free == 0
    c.check_invariants()
    big = LabCache(2, overcommit=True)
    big.acquire(0, np.array([1, 2, 3], dtype=np.uint64), 3, 3)
    with pytest.raises(BlockStateError, match="running requests hold 3 blocks"):
        big.set_overcommit(False)
    assert big.num_free == -1
    big.check_invariants()


def test_unknown_lab_name_is_an_error() -> None:
    with pytest.raises(InvalidInputError, match="lab policy"):
        make_policy("lab-mru", 1024)


def test_gap_closed() -> None:
    sums = [
        {"policy": "lab-lru", "hit_rate": 0.2},
        {"policy": "opt", "hit_rate": 0.5},
        {"policy": "x", "hit_rate": 0.3},
    ]
    rows = {r["policy"]: r for r in gap_rows(sums)}
    assert rows["x"]["gap_closed"] == pytest.approx(1 / 3)
    assert rows["opt"]["gap_closed"] == pytest.approx(1.0)
    assert gap_rows(sums[:1]) == []
    # No gap to close: opt tied with the LRU, or behind it (slot and time models).
    for opt_rate in (0.2, 0.1):
        sums[1]["hit_rate"] = opt_rate
        assert all(math.isnan(r["gap_closed"]) for r in gap_rows(sums))


def test_cli_replay_sequence_reports_the_gap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_mooncake(tmp_path / "t.jsonl", 40, 3)
    out = tmp_path / "o.json"
    assert (
        main(
            [
                "replay",
                str(tmp_path / "t.jsonl"),
                "--model",
                "sequence",
                "--capacity",
                "3k",
                "--policies",
                "lab-lru,opt,lab-2q",
                "--quiet",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert "gap closed" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert {g["policy"] for g in data["gap"]} == {"lab-lru", "opt", "lab-2q"}


def test_atlas_writes_tables_and_curves(tmp_path: Path) -> None:
    from prefixcache.sim.atlas import AtlasConfig, run_atlas

    traces = tmp_path / "traces"
    traces.mkdir()
    write_mooncake(traces / "small.jsonl", 30, 4)
    cfg = AtlasConfig(
        trace_policies=["vllm-blocks", "lab-lru", "lab-2q", "opt"],
        trace_capacities=[2048, 4096],
        goal_capacity=4096,
        workload_policies=["radix", "lab-lru", "opt"],
        workload_capacities=[16384],
        workload_models=["sequence"],
    )
    out = run_atlas(traces, tmp_path / "docs" / "ATLAS.md", cfg)
    text = out.read_text()
    assert "small.jsonl - model `sequence`" in text and "small.jsonl - model `time`" in text
    assert "workload F - model `sequence`" in text
    assert (tmp_path / "docs" / "atlas" / "small_sequence.png").stat().st_size > 0
    assert json.loads((tmp_path / "docs" / "atlas" / "atlas.json").read_text())["panels"]


def test_atlas_budgets_are_labelled_as_the_command_line_reads_them(tmp_path: Path) -> None:
    from prefixcache.sim.atlas import AtlasConfig, _cap, run_atlas
    from prefixcache.sim.cli import parse_capacity

    for c in (2048, 4096, 3 * 2**20, 25 * 2**20, 8 * 2**10, 1500):
        assert parse_capacity(_cap(c).replace(",", "")) == c
    cfg = AtlasConfig(
        trace_policies=["lab-lru", "opt"],
        workload_policies=["lab-lru"],
        workload_capacities=[16384],
        workload_models=["sequence"],
    )
    text = run_atlas(None, tmp_path / "ATLAS.md", cfg).read_text()
    assert "| policy | 16Ki |" in text


def test_an_interrupted_atlas_leaves_the_last_report_as_it_was(tmp_path: Path) -> None:
    from prefixcache.sim.atlas import AtlasConfig, run_atlas

    out = tmp_path / "ATLAS.md"
    out.write_text("the last report\n")
    cfg = AtlasConfig(
        workload_policies=["lab-lru"], workload_capacities=[16384], workload_models=["sequence"]
    )
    panels = []

    def log(line: str) -> None:
        panels.append(line)
        if len(panels) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_atlas(None, out, cfg, log=log)
    assert out.read_text() == "the last report\n"
    assert list((tmp_path / "atlas").iterdir()) == []


def test_atlas_refuses_an_unwritable_report_before_running(tmp_path: Path) -> None:
    from prefixcache.errors import InvalidInputError
    from prefixcache.sim.atlas import run_atlas

    ran = []
    (tmp_path / "dir.md").mkdir()
    with pytest.raises(InvalidInputError, match="is a directory"):
        run_atlas(None, tmp_path / "dir.md", log=ran.append)
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidInputError, match="is not a folder"):
        run_atlas(tmp_path / "file", tmp_path / "ATLAS.md", log=ran.append)
    assert ran == []


def test_opt_builds_no_output_where_the_model_caches_none() -> None:
    """``--model sequence`` never caches outputs: opt's future is the prompts alone, so a
    huge lazy output is never built (it would take 4 bytes a token)."""
    from prefixcache.sim.requests import Request

    def never() -> np.ndarray:
        raise AssertionError("the output was built")

    prompt = np.arange(40, dtype=np.uint32)
    reqs = [Request(i, prompt, never, output_len=4_000_000_000) for i in range(3)]
    seq, lru = replay(reqs, ["opt", "lab-lru"], 64, model="sequence")
    assert [r.hit_tokens for r in seq.records] == [0, 32, 32]
    assert [r.hit_tokens for r in seq.records] == [r.hit_tokens for r in lru.records]


def test_a_policy_that_served_other_requests_gets_no_share_of_the_gap() -> None:
    """In the sequence model the lab policies serve a prompt larger than the cache (the
    paper's method: taken over budget, evicted after) while the engine policies reject
    it; their hit rates are then over different requests, and the gap is not given."""
    from prefixcache.sim.requests import Request

    prompts = [np.arange(32), np.arange(1000, 1200), np.arange(32)]
    reqs = [Request(i, p.astype(np.uint32), np.zeros(1, np.uint32)) for i, p in enumerate(prompts)]
    sums = [
        summarize(r) for r in replay(reqs, ["lab-lru", "opt", "vllm-blocks"], 64, model="sequence")
    ]
    by = {s["policy"]: s for s in sums}
    assert by["opt"]["rejected"] == by["lab-lru"]["rejected"] == 0
    assert by["vllm-blocks"]["rejected"] == 1
    # Over its fewer requests the engine's rate is higher than the optimum's ...
    assert by["vllm-blocks"]["hit_rate"] > by["opt"]["hit_rate"]
    rows = {r["policy"]: r for r in gap_rows(sums)}
    # ... so it is not compared with it.
    assert math.isnan(rows["vllm-blocks"]["gap_closed"]) and rows["vllm-blocks"]["rejected"] == 1
    assert rows["opt"]["gap_closed"] == 1.0 or math.isnan(rows["opt"]["gap_closed"])


def test_the_gap_is_given_only_for_policies_serving_opts_requests() -> None:
    def row(policy: str, rate: float, rejected: int) -> dict[str, object]:
        return {"policy": policy, "hit_rate": rate, "rejected": rejected}

    rows = {
        r["policy"]: r
        for r in gap_rows(
            [row("lab-lru", 0.2, 1), row("opt", 0.4, 1), row("radix", 0.5, 0), row("x", 0.3, 1)]
        )
    }
    assert rows["x"]["gap_closed"] == pytest.approx(0.5)
    assert math.isnan(rows["radix"]["gap_closed"]) and rows["radix"]["rejected"] == 0
    # A baseline that served other requests is no baseline.
    rows = {r["policy"]: r for r in gap_rows([row("lab-lru", 0.2, 0), row("opt", 0.4, 1)])}
    assert rows["lab-lru"]["lru"] is None and math.isnan(rows["opt"]["gap_closed"])


def test_sweep_notes_the_rejected_requests_next_to_the_rates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [list(range(32)), list(range(1000, 1200)), list(range(32))]
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": i, "arrival": 0, "prompt": p, "output_len": 1}) + "\n"
            for i, p in enumerate(rows)
        )
    )
    argv = ["sweep", str(path), "--model", "sequence", "--capacities", "64", "--quiet"]
    assert main([*argv, "--policies", "lab-lru,opt,vllm-blocks", "--jobs", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not in the hit rate: vllm-blocks 1 at 64" in out
    assert "vllm-blocks (1 rejected)" in out


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_radix_is_the_lru_baseline_only_under_lru_eviction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """``--eviction`` changes radix's rule: under mru it is no LRU to measure the gap from."""
    out = tmp_path / "o.json"
    where = ["--workload", "D", "--capacity", "20k"]
    if command == "sweep":
        where = ["workload:D", "--capacities", "20k"]
    argv = [command, *where, "--model", "sequence", "--policies", "radix,opt", "--quiet"]
    assert main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    gap = data["workloads"][0]["gap"] if command == "compare" else data["gap"]
    assert {g["lru"] for g in gap} == {"radix"}
    assert main([*argv, "--eviction", "mru", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    gap = data["workloads"][0]["gap"] if command == "compare" else data["gap"]
    assert {g["lru"] for g in gap} == {None}
    assert all(g["gap_closed"] is None for g in gap)
    assert "(radix)" not in capsys.readouterr().out.split("gap closed")[-1]


@pytest.mark.parametrize(
    ("names", "opt", "lru"),
    [
        (["lab-lru", "opt@16"], "opt@16", "lab-lru"),
        (["lab-lru@16", "opt"], "opt", "lab-lru@16"),
        (["lab-lru", "lab-opt"], "lab-opt", "lab-lru"),
        (["tree-trim", "opt@1"], "opt@1", "tree-trim"),
        (["lab-lru-admit2", "vllm-blocks16", "opt-admit2", "opt"], "opt", "vllm-blocks16"),
        (["lab-lru@1", "radix", "opt@32"], "opt@32", "radix"),
        (["radix", "vllm-blocks", "vllm-blocks512", "opt@512"], "opt@512", "vllm-blocks512"),
    ],
)
def test_the_gap_matches_names_by_what_they_mean(names: list[str], opt: str, lru: str) -> None:
    rows = gap_rows([{"policy": n, "hit_rate": 0.1 * (i + 1)} for i, n in enumerate(names)])
    assert {r["opt"] for r in rows} == {opt} and {r["lru"] for r in rows} == {lru}
