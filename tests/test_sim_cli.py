"""The prefixcache command: every subcommand, its JSON/CSV output, and its errors."""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefixcache.sim.cli import main, parse_capacity
from prefixcache.sim.policies import blocks_available
from prefixcache.sim.replay import replay, summarize
from prefixcache.sim.report import short_tokens
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


def test_compare_of_an_unlimited_workload_gives_each_policy_its_own_budget(
    tmp_path: Path,
) -> None:
    js = tmp_path / "c.json"
    args = ["compare", "--workload", "A", "--quiet", "--policies", "radix", "trtllm"]
    assert main([*args, "--json", str(js)]) == 0
    (w,) = json.loads(js.read_text())["workloads"]
    radix, trtllm = w["summaries"]
    # Every request fits in its own blocks: 64-token ones for the trie.
    assert w["capacity"] is None and trtllm["capacity"] > radix["capacity"]
    assert radix["evicted_tokens"] == trtllm["evicted_tokens"] == 0


def test_compare_prints_and_writes_the_same_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js, cs = tmp_path / "c.json", tmp_path / "c.csv"
    assert (
        main(
            [
                "compare",
                "--workload",
                "A,C",
                "--quiet",
                "--policies",
                *POLICIES,
                "--json",
                str(js),
                "--csv",
                str(cs),
            ]
        )
        == 0
    )
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
    # A and C run unlimited: no budget of their own.
    assert [w["capacity"] for w in data["workloads"]] == [None, None]
    diff = data["workloads"][0]["differences"][0]
    assert (diff["a"], diff["b"], diff["total_diff"]) == ("radix", "radix-page16", 2040)
    rows = list(csv.DictReader(cs.open()))
    assert len(rows) == 2 * len(POLICIES) and rows[0]["workload"] == "A"


def test_compare_capacity_override_and_time_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js = tmp_path / "t.json"
    assert (
        main(
            [
                "compare",
                "--workload",
                "F",
                "--capacity",
                "8Ki",
                "--model",
                "time",
                "--policies",
                "radix,radix-page16",
                "--quiet",
                "--json",
                str(js),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "TTFT p50" in out and "8,192 tokens" in out
    s = json.loads(js.read_text())["workloads"][0]["summaries"][0]
    assert s["capacity"] == 8192 and s["ttft_p50"] > 0 and s["evicted_tokens"] > 0


def test_replay_sweep_and_stats_on_a_mooncake_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = mooncake_file(tmp_path)
    js, rec = tmp_path / "r.json", tmp_path / "rec.csv"
    assert (
        main(
            [
                "replay",
                str(trace),
                "--quiet",
                "--policies",
                *POLICIES,
                "--json",
                str(js),
                "--records-csv",
                str(rec),
            ]
        )
        == 0
    )
    data = json.loads(js.read_text())
    radix = data["summaries"][0]
    # request 2 reuses blocks 1-2 (1024 tokens), 3 reuses block 1, 4 reuses blocks 1-2
    assert radix["hit_tokens"] == 1024 + 512 + 1024
    assert len(data["records"]["radix"]) == 4
    assert len(list(csv.DictReader(rec.open()))) == 4 * len(POLICIES)

    png, sj = tmp_path / "s.png", tmp_path / "s.json"
    assert (
        main(
            [
                "sweep",
                str(trace),
                "--capacities",
                "1500,4096,100000",
                "--plot",
                str(png),
                "--quiet",
                "--policies",
                *POLICIES,
                "--json",
                str(sj),
            ]
        )
        == 0
    )
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    rates = json.loads(sj.read_text())["hit_rate"]
    assert set(rates) == set(POLICIES) and all(len(v) == 3 for v in rates.values())
    assert rates["radix"][2] == pytest.approx((1024 + 512 + 1024) / 4325)

    tj = tmp_path / "t.json"
    assert main(["trace-stats", str(trace), "--json", str(tj)]) == 0
    st = json.loads(tj.read_text())
    assert st["requests"] == 4 and st["hash_id_refs"] == 11 and st["distinct_hash_ids"] == 6
    assert "hit_rate_ceiling" in capsys.readouterr().out


def test_bad_trace_line_is_reported_with_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = mooncake_file(tmp_path)
    trace.write_text(trace.read_text() + '{"timestamp": 5, "input_length": 3}\n')
    assert main(["replay", str(trace), "--quiet", "--policies", "radix"]) == 2
    assert f"{trace}:5:" in capsys.readouterr().err
    js = tmp_path / "ok.json"
    assert (
        main(
            [
                "replay",
                str(trace),
                "--quiet",
                "--policies",
                "radix",
                "--skip-bad-lines",
                "--json",
                str(js),
            ]
        )
        == 0
    )
    assert "skipped 1 malformed line" in capsys.readouterr().out
    assert json.loads(js.read_text())["skipped_lines"] == 1


def test_builtin_workload_as_trace_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "workload:C", "--quiet", "--policies", "radix"]) == 0
    assert "3,060" in capsys.readouterr().out
    assert main(["replay", "workload:Z", "--quiet"]) == 2
    assert main(["replay", "/no/such/file.jsonl", "--quiet"]) == 2
    assert main(["compare", "--workload", "A", "--policies", "nope", "--quiet"]) == 2
    assert main(["compare", "--capacity", "lots"]) == 2


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("3000000", 3_000_000),
        ("3M", 3_000_000),
        ("3m", 3_000_000),
        ("3e6", 3_000_000),
        ("1.5M", 1_500_000),
        ("1G", 10**9),
        ("64k", 64_000),
        ("1_000", 1000),
        (" 2T ", 2 * 10**12),
        ("3Mi", 3 * 2**20),
        ("64Ki", 65_536),
        ("2.5Ki", 2560),
        ("1gi", 2**30),
        (".5k", 500),
        ("1" + "0" * 40 + "e-35", 100_000),  # a large mantissa and a negative exponent
        ("0." + "0" * 32 + "1e40", 10**7),
        ("1e15", 10**15),
    ],
)
def test_capacity_accepts_decimal_and_binary_forms(text: str, tokens: int) -> None:
    assert parse_capacity(text) == tokens


@pytest.mark.parametrize(
    ("tokens", "label"),
    [
        (6400, "6.4k"),
        (2**20, "1Mi"),
        (123_456_700, "123456.7k"),
        (123_457_000, "123457k"),
        (10**9 + 1000, "1000001k"),
        (1_234_567_000, "1234567k"),
        (10**15, "1000T"),
        (1234, "1,234"),
    ],
)
def test_capacity_labels_are_exact(tokens: int, label: str) -> None:
    """A table's or a heatmap's capacity label reads back as its capacity: no rounding to
    six digits, no exponent (two columns of a sweep never share a label)."""
    assert short_tokens(tokens) == label
    assert parse_capacity(label.replace(",", "")) == tokens


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3MB", "not bytes"),
        ("3MiB", "not bytes"),
        ("0", "at least 1 token"),
        ("0k", "at least 1 token"),
        ("-5", "bad capacity"),
        ("1.5", "not a whole number"),
        ("1.0001k", "not a whole number"),
        ("lots", "bad capacity"),
        ("inf", "bad capacity"),
        ("nan", "bad capacity"),
        ("", "bad capacity"),
        ("3 M", "bad capacity"),
    ],
)
def test_capacity_refusals_are_one_line(
    text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", "--capacity", text, "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "usage" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "--max-running", "0"], "--max-running"),
        (["trace-stats", "workload:A", "--block-size=-5"], "--block-size"),
        (["trace-stats", "workload:A", "--block-size=0"], "--block-size"),
        (["compare", "--prefill-ms-per-token", "-1000"], "--prefill-ms-per-token"),
        (["compare", "--decode-step-ms", "nan"], "--decode-step-ms"),
        (["compare", "--prefill-base-ms", "inf"], "--prefill-base-ms"),
        (["compare", "--seed", "-1"], "--seed"),
        (["compare", "--workload", "Z"], "--workload"),
        # A workload list names each once, with no empty item, as every other list
        # (A,A replayed A twice; A,,C and A, ran as if the empty items were not there).
        (["compare", "--workload", "A,a"], "--workload 'A,a': A is given twice"),
        (["compare", "--workload", "A,,C"], "--workload 'A,,C': an empty item"),
        (["compare", "--workload", "A,"], "--workload 'A,': an empty item"),
        (["compare", "--eviction", "random"], "--eviction"),
        (["replay", "workload:D", "--format", "mooncake"], "--format mooncake"),
        (["sweep", "workload:A", "--capacities", ","], "at least one capacity"),
        (["compare", "--json", "/nonexistent/dir/out.json"], "does not exist"),
        (["compare", "--csv", "/"], "is a directory"),
        (["replay", "workload:A", "--records-csv", "/nonexistent/r.csv"], "--records-csv"),
        (["sweep", "workload:A", "--capacities", "1k", "--plot", "/nonexistent/x.png"], "--plot"),
        (["sweep", "workload:A", "--capacities", "1k", "--plot", "plot.txt"], "image type"),
        (["bogus"], "invalid choice"),
        (["--capacity", "1M"], "give a command before the options"),
        # Sizes in policy names are ASCII digits (str.isdigit() took "²", which int()
        # then refused with a traceback, and other scripts' digits).
        (["compare", "--policies", "radix-page\u00b2"], "unknown policy 'radix-page\u00b2'"),
        (["compare", "--policies", "vllm-blocks\u00b2"], "unknown policy 'vllm-blocks\u00b2'"),
        (["compare", "--policies", "trtllm\u00b2"], "unknown policy 'trtllm\u00b2'"),
        (["compare", "--policies", "trtllm-nopartial\u00b2"], "unknown policy"),
        (["compare", "--policies", "vllm-blocks\u0661\u0666"], "unknown policy"),
        (["compare", "--policies", "lab-lru@\u0661\u0666"], "unknown policy"),
    ],
)
def test_bad_command_lines_fail_before_running_with_one_error_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--quiet"] if argv[0] != "bogus" and argv[0][0] != "-" else argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_version_help_and_python_dash_m(capsys: pytest.CaptureFixture[str]) -> None:
    import prefixcache

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"prefixcache {prefixcache.__version__}"
    assert main([]) == 0  # a bare command prints the help, it does not run compare
    out = capsys.readouterr().out
    assert out.startswith("usage: prefixcache") and "compare" in out
    assert "prompt tokens, KV" not in out
    run = subprocess.run(
        [sys.executable, "-m", "prefixcache", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == f"prefixcache {prefixcache.__version__}"


def test_tables_fit_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    """Every table of a wide run (five policies, the time model, rejections) fits 80
    columns without cutting a cell."""
    policies = ["radix", "radix-page16", "trtllm", "trtllm-nopartial"] + (
        ["vllm-blocks"] if blocks_available() else []
    )
    assert (
        main(
            [
                "compare",
                "--workload",
                "F",
                "--capacity",
                "2k",
                "--model",
                "time",
                "--quiet",
                "--policies",
                *policies,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out and "trtllm-nopartial - " in out and "rejected" in out
    assert "requests never fit in KV 2,000 tokens, even alone" in " ".join(out.split())
    assert (
        main(
            [
                "sweep",
                "workload:D",
                "--capacities",
                "4k,16k,64k,256k,1M,4M",
                "--quiet",
                "--policies",
                *policies,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out
    assert "4,000,000" in out


def test_compressed_and_binary_traces_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = mooncake_file(tmp_path)
    gz = tmp_path / "mc.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    js = tmp_path / "s.json"
    assert main(["trace-stats", str(gz), "--json", str(js)]) == 0
    assert json.loads(js.read_text())["requests"] == 4
    capsys.readouterr()
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\xff" * 5000)
    for argv in (["trace-stats", str(binary)], ["replay", str(binary), "--skip-bad-lines"]):
        assert main([*argv, "--quiet"] if argv[0] == "replay" else argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and "not UTF-8" in err[0]


def test_hostile_trace_lines_end_in_an_error_line_or_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = mooncake_file(tmp_path).read_bytes()
    for bad in (b'{"timestamp": 0, "x": "\xff"}\n', b"[" * 50_000 + b"\n"):
        p = tmp_path / "bad.jsonl"
        p.write_bytes(good + bad)
        assert main(["replay", str(p), "--quiet", "--policies", "radix"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {p}:5: ")
        assert main(["replay", str(p), "--quiet", "--policies", "radix", "--skip-bad-lines"]) == 0
        assert "skipped 1 malformed line(s)" in capsys.readouterr().out
    salted = tmp_path / "salt.jsonl"
    salted.write_text(
        '{"id": 1, "arrival": 0, "prompt": [1, 2, 3], "output_len": 2, "cache_salt": "\\ud800"}\n'
    )
    assert main(["replay", str(salted), "--quiet", "--policies", "radix"]) == 2
    assert "not valid Unicode" in capsys.readouterr().err


def test_outputs_past_2_31_tokens_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "long.jsonl"
    p.write_text(
        "".join(
            json.dumps(
                {"timestamp": i, "input_length": 600, "output_length": 2**30, "hash_ids": [1, 2]}
            )
            + "\n"
            for i in range(3)
        )
    )
    js = tmp_path / "r.json"
    assert (
        main(
            [
                "replay",
                str(p),
                "--capacity",
                "1M",
                "--policies",
                "radix",
                "--quiet",
                "--json",
                str(js),
            ]
        )
        == 0
    )
    s = json.loads(js.read_text())["summaries"][0]
    assert s["requests"] == 3 and s["rejected"] == 3  # 2**30 output tokens never fit 1M
    assert main(["trace-stats", str(p)]) == 0
    assert "3,221,225,472" in capsys.readouterr().out


def test_running_out_of_memory_is_one_error_line(tmp_path: Path) -> None:
    """A workload too large for the machine (here: the address space is limited) ends in
    one ``error: out of memory`` line and exit status 1, from a worker process too."""
    resource = pytest.importorskip("resource")
    p = tmp_path / "huge.jsonl"
    p.write_text('{"id": 1, "arrival": 0, "prompt": [1], "output_len": 2147483647}\n')

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    for jobs in ("1", "2"):
        argv = [sys.executable, "-m", "prefixcache", "replay", str(p), "--model", "time"]
        run = subprocess.run(
            [*argv, "--quiet", "--jobs", jobs, "--policies", "radix,vllm-blocks"],
            capture_output=True,
            text=True,
            preexec_fn=limit,
        )
        assert run.returncode == 1, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: out of memory"), run.stderr


def test_compare_runs_without_matplotlib_and_plot_says_what_is_missing() -> None:
    """matplotlib is the `plot` extra: `pip install . && prefixcache compare` needs none."""
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from prefixcache.sim.cli import main\n"
        "assert main(['compare', '--workload', 'C', '--quiet', '--policies', 'radix']) == 0\n"
        "sys.exit(main(['sweep', 'workload:C', '--capacities', '1k', '--plot', 'x.png']))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 2 and "3,060" in run.stdout
    assert run.stderr.strip() == "error: --plot needs matplotlib: pip install 'prefixcache[plot]'"


def test_a_closed_pipe_still_writes_the_files(tmp_path: Path) -> None:
    """`prefixcache replay ... --json out.json | head -1`: the reader leaves early (here at
    once), the command finishes quietly and writes its file."""
    js = tmp_path / "out.json"
    cmd = (
        f"{sys.executable} -m prefixcache replay workload:F --quiet --policies radix "
        f"--json {js} | true"
    )
    run = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == ""
    assert json.loads(js.read_text())["summaries"][0]["policy"] == "radix"


def test_library_rejects_what_the_cli_rejects() -> None:
    """The same checks hold without the CLI: cost-model values and max_running."""
    from prefixcache.errors import InvalidInputError
    from prefixcache.sim.replay import make_scheduler
    from prefixcache.sim.scheduler import PrefillCost

    for bad in (
        {"per_token_ms": -1000.0},
        {"decode_step_ms": float("nan")},
        {"base_ms": float("inf")},
        {"attention_ms": "1"},
    ):
        with pytest.raises(InvalidInputError, match="PrefillCost"):
            PrefillCost(**bad)  # type: ignore[arg-type]
    for model in ("slots", "time"):
        with pytest.raises(InvalidInputError, match="max_running must be >= 1"):
            make_scheduler(model, max_running=0)


@pytest.mark.parametrize("name", ["x[/]y.jsonl", "[red]x.jsonl", "[bold]"])
def test_a_trace_name_is_shown_as_it_is_not_as_markup(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(mooncake_file(tmp_path).read_text())
    for argv in (["replay", "--quiet", "--jobs", "1", "--policies", "radix"], ["trace-stats"]):
        assert main([argv[0], str(path), *argv[1:]]) == 0
        out = capsys.readouterr().out
        assert name in out


@pytest.mark.skipif(sys.platform != "linux", reason="a file name that is not UTF-8")
def test_a_trace_name_that_is_not_utf8_is_written_with_escapes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    raw = bytes(tmp_path) + b"/bad\xffname.jsonl"
    with open(raw, "wb") as f:
        f.write(mooncake_file(tmp_path).read_bytes())
    path = os.fsdecode(raw)
    out = tmp_path / "o"
    argv = ["trace-stats", path, "--csv", f"{out}.csv", "--json", f"{out}.json"]
    assert main(argv) == 0
    assert "bad\\xffname.jsonl" in Path(f"{out}.csv").read_text()
    assert json.loads(Path(f"{out}.json").read_text())["trace"].endswith("bad\\xffname.jsonl")
    argv = ["sweep", path, "--capacities", "100k", "--policies", "radix", "--quiet", "--jobs", "1"]
    assert main([*argv, "--plot", f"{out}.png", "--json", f"{out}2.json"]) == 0
    assert Path(f"{out}.png").stat().st_size > 0
    assert json.loads(Path(f"{out}2.json").read_text())["trace"].endswith("bad\\xffname.jsonl")


@pytest.mark.parametrize(
    ("model", "flags", "refused"),
    [
        ("sequence", ["--max-running", "4"], "--max-running"),
        ("sequence", ["--no-preemption"], "--no-preemption"),
        ("slots", ["--no-preemption"], "--no-preemption"),
        (None, ["--decode-step-ms", "5"], "--decode-step-ms"),
        ("sequence", ["--prefill-base-ms", "1"], "--prefill-base-ms"),
        ("slots", ["--prefill-ms-per-token", "0.02"], "--prefill-ms-per-token"),
        ("slots", ["--prefill-attention-ms", "0"], "--prefill-attention-ms"),
    ],
)
def test_an_option_the_model_does_not_use_is_refused(
    model: str | None, flags: list[str], refused: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", "workload:A", "--quiet", "--jobs", "1", *flags]
    argv += ["--model", model] if model else []
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {refused} applies to --model")
    # The same flags are taken by the model they apply to.
    ok = "slots" if refused == "--max-running" else "time"
    assert main([*argv[:5], *flags, "--model", ok]) == 0


def test_a_host_offload_priority_in_other_digits_is_refused() -> None:
    """TrtllmPolicy's offload name takes a priority in ASCII digits: "host:²" raised
    int()'s bare ValueError."""
    from prefixcache.errors import InvalidInputError
    from prefixcache.sim.policies.trtllm import parse_trtllm_offload

    assert parse_trtllm_offload("host:40") == 40
    for bad in ("host:\u00b2", "host:\u0661"):
        with pytest.raises(InvalidInputError, match="offload must be host"):
            parse_trtllm_offload(bad)


def test_two_outputs_on_one_file_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.json"
    assert (
        main(["compare", "--workload", "A", "--quiet", "--json", str(out), "--csv", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: --json and --csv name the same file")
    assert "Traceback" not in err
    assert not out.exists()


def test_empty_output_path_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--workload", "A", "--quiet", "--csv", ""]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: --csv: an empty path"


def test_a_dash_is_not_taken_for_a_file_named_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # "-" wrote a file named "-" in the working directory; standard output is /dev/stdout.
    monkeypatch.chdir(tmp_path)
    for option in ("--json", "--csv", "--records-csv"):
        assert main(["replay", "workload:A", "--quiet", option, "-"]) == 2
        err = capsys.readouterr().err
        assert err.strip() == (
            f"error: {option} -: give a file name (or /dev/stdout to write to standard output)"
        )
    assert not (tmp_path / "-").exists()
