"""The prefixcache command: every subcommand, its JSON/CSV output, and its errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from prefixcache.sim.cli import main
from prefixcache.sim.policies import blocks_available
from prefixcache.sim.replay import replay, summarize
from prefixcache.sim.workloads import study_workload

POLICIES = ["radix", "radix-page16"] + (["vllm-blocks"] if blocks_available() else [])


def mooncake_file(tmp_path: Path) -> Path:
    lines = [
        {"timestamp": 0, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 3]},
        {"timestamp": 100, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 4]},
        {"timestamp": 900, "input_length": 700, "output_length": 5, "hash_ids": [1, 5]},
        {"timestamp": 1000, "input_length": 1025, "output_length": 7, "hash_ids": [1, 2, 6]},
    ]
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_compare_prints_and_writes_the_same_numbers(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    js, cs = tmp_path / "c.json", tmp_path / "c.csv"
    assert main(["compare", "--workload", "A,C", "--quiet", "--policies", *POLICIES,
                 "--json", str(js), "--csv", str(cs)]) == 0
    out = capsys.readouterr().out
    data = json.loads(js.read_text())
    assert [w["workload"] for w in data["workloads"]] == ["A", "C"]
    w = study_workload("A", 0)
    direct = [summarize(r) for r in replay(w.requests, POLICIES, None)]
    got = data["workloads"][0]["summaries"]
    for a, b in zip(got, direct, strict=True):
        for k in ("policy", "prompt_tokens", "hit_tokens", "evicted_tokens", "evictions"):
            assert a[k] == b[k]
        assert f"{a['hit_tokens']:,}" in out
    diff = data["workloads"][0]["differences"][0]
    assert (diff["a"], diff["b"], diff["total_diff"]) == ("radix", "radix-page16", 2040)
    rows = list(csv.DictReader(cs.open()))
    assert len(rows) == 2 * len(POLICIES) and rows[0]["workload"] == "A"


def test_compare_capacity_override_and_time_model(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    js = tmp_path / "t.json"
    assert main(["compare", "--workload", "F", "--capacity", "8k", "--model", "time",
                 "--policies", "radix,radix-page16", "--quiet", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "TTFT p50" in out and "8,192 tokens" in out
    s = json.loads(js.read_text())["workloads"][0]["summaries"][0]
    assert s["capacity"] == 8192 and s["ttft_p50"] > 0 and s["evicted_tokens"] > 0


def test_replay_sweep_and_stats_on_a_mooncake_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    trace = mooncake_file(tmp_path)
    js, rec = tmp_path / "r.json", tmp_path / "rec.csv"
    assert main(["replay", str(trace), "--quiet", "--policies", *POLICIES, "--json", str(js),
                 "--records-csv", str(rec)]) == 0
    data = json.loads(js.read_text())
    radix = data["summaries"][0]
    # request 2 reuses blocks 1-2 (1024 tokens), 3 reuses block 1, 4 reuses blocks 1-2
    assert radix["hit_tokens"] == 1024 + 512 + 1024
    assert len(data["records"]["radix"]) == 4
    assert len(list(csv.DictReader(rec.open()))) == 4 * len(POLICIES)

    png, sj = tmp_path / "s.png", tmp_path / "s.json"
    assert main(["sweep", str(trace), "--capacities", "1500,4096,100000", "--plot", str(png),
                 "--quiet", "--policies", *POLICIES, "--json", str(sj)]) == 0
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    rates = json.loads(sj.read_text())["hit_rate"]
    assert set(rates) == set(POLICIES) and all(len(v) == 3 for v in rates.values())
    assert rates["radix"][2] == pytest.approx((1024 + 512 + 1024) / 4325)

    tj = tmp_path / "t.json"
    assert main(["trace-stats", str(trace), "--json", str(tj)]) == 0
    st = json.loads(tj.read_text())
    assert st["requests"] == 4 and st["hash_id_refs"] == 11 and st["distinct_hash_ids"] == 6
    assert "hit_rate_ceiling" in capsys.readouterr().out


def test_bad_trace_line_is_reported_with_its_number(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    trace = mooncake_file(tmp_path)
    trace.write_text(trace.read_text() + '{"timestamp": 5, "input_length": 3}\n')
    assert main(["replay", str(trace), "--quiet", "--policies", "radix"]) == 2
    assert f"{trace}:5:" in capsys.readouterr().err
    js = tmp_path / "ok.json"
    assert main(["replay", str(trace), "--quiet", "--policies", "radix", "--skip-bad-lines",
                 "--json", str(js)]) == 0
    assert "skipped 1 malformed line" in capsys.readouterr().out
    assert json.loads(js.read_text())["skipped_lines"] == 1


def test_builtin_workload_as_trace_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "workload:C", "--quiet", "--policies", "radix"]) == 0
    assert "3,060" in capsys.readouterr().out
    assert main(["replay", "workload:Z", "--quiet"]) == 2
    assert main(["replay", "/no/such/file.jsonl", "--quiet"]) == 2
    assert main(["compare", "--workload", "A", "--policies", "nope", "--quiet"]) == 2
    with pytest.raises(SystemExit):
        main(["compare", "--capacity", "lots"])
