"""How a replay runs: progress reaching its total, the per-policy peaks in the summaries,
`sweep` in worker processes giving the serial results, and Ctrl-C stopping cleanly."""

from __future__ import annotations

import json
import multiprocessing as mp
import multiprocessing.context as mp_context
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prefixcache.sim.cli import main
from prefixcache.sim.policies import blocks_available
from prefixcache.sim.replay import RUN_FIELDS, ReplayResult, replay, summarize
from prefixcache.sim.report import progress_bars
from prefixcache.sim.sweep import SweepSpec, load_requests, longest_first, run_pairs, run_sweep
from prefixcache.sim.workloads import study_workload

POLICIES = ["radix", "radix-page16"] + (["vllm-blocks"] if blocks_available() else [])
# Wall time, memory and the machine-dependent fields differ between runs; nothing else may.


def _comparable(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k not in RUN_FIELDS} for s in summaries]


class Recorder:
    """A progress factory that records what the replay reported."""

    def __init__(self) -> None:
        self.tasks: list[dict[str, Any]] = []

    def __call__(self, name: str, total: int) -> Any:
        rec: dict[str, Any] = {"name": name, "total": total, "advanced": 0, "done": 0}
        self.tasks.append(rec)

        class Task:
            def advance(self, n: int) -> None:
                assert rec["done"] == 0, "advanced after done"
                rec["advanced"] += n

            def done(self) -> None:
                rec["done"] += 1

        return Task()


@pytest.mark.parametrize("model", ["slots", "time"])
def test_progress_counts_every_request_and_ends_each_policy(model: str) -> None:
    w = study_workload("F", 1)
    rec = Recorder()
    replay(w.requests, POLICIES, w.capacity, model=model, progress=rec)
    assert [t["name"] for t in rec.tasks] == POLICIES
    for t in rec.tasks:
        assert t["advanced"] == t["total"] == len(w.requests) and t["done"] == 1


def test_progress_bars_reach_the_total_and_stop_the_timer() -> None:
    from io import StringIO

    from rich.console import Console

    console = Console(file=StringIO(), force_terminal=True)
    with progress_bars(console, delay=0.0) as factory:
        assert factory is not None
        task = factory("radix", 1000)
        for _ in range(999):  # not a multiple of the batching
            task.advance(1)
        task.done()
        shown = factory.progress.tasks[0]  # type: ignore[attr-defined]
        assert shown.completed == 1000 and shown.finished
        elapsed = shown.elapsed
        time.sleep(0.05)
        assert shown.elapsed == elapsed  # the finished policy's timer has stopped


@pytest.mark.parametrize("model", ["slots", "time"])
def test_peaks_are_reported_the_same_way_for_every_policy(model: str) -> None:
    w = study_workload("D", 0)  # unlimited KV: nothing is evicted, the cache only grows
    policies = [*POLICIES, "lab-lru", "opt"]
    for res in replay(w.requests, policies, None, model=model):
        s = summarize(res)
        assert s["peak_rss_bytes"] > 0
        # The cache never shrinks here, so its peak is what it holds at the end.
        assert s["peak_cached_tokens"] == res.stats.cached_tokens > 0
        assert 0 < s["peak_used_tokens"] <= res.capacity
    tight = study_workload("F", 0)
    for res in replay(tight.requests, policies, tight.capacity, model=model):
        s = summarize(res)
        assert s["evicted_tokens"] > 0
        assert 0 < s["peak_cached_tokens"] <= res.capacity
        assert 0 < s["peak_used_tokens"] <= res.capacity


def test_sweep_in_worker_processes_equals_a_serial_run() -> None:
    spec = SweepSpec("workload:F", policies=POLICIES, model="time")
    reqs = load_requests(spec)
    caps = [8192, 16384, 24576, 1 << 20]
    rec = Recorder()
    parallel = run_sweep(spec, reqs, caps, jobs=2, progress=rec)
    serial = run_sweep(spec, reqs, caps, jobs=1)
    assert _comparable(parallel) == _comparable(serial)
    assert [(s["capacity"], s["policy"]) for s in parallel] == [
        (c, p) for c in caps for p in POLICIES
    ]
    # Each (capacity, policy) got its own bar, labelled with the capacity, run to the end.
    assert sorted(t["name"] for t in rec.tasks) == sorted(
        f"{c:,} tokens: {p}" for c in caps for p in POLICIES
    )
    assert all(t["advanced"] == t["total"] and t["done"] == 1 for t in rec.tasks)


@pytest.mark.parametrize("jobs", [1, 2])
def test_each_result_is_handed_over_once_as_it_arrives(jobs: int) -> None:
    """``run_pairs(on_result=...)`` sees every pair's result once, by its index, the
    result that is returned (records included), before ``run_pairs`` returns."""
    spec = SweepSpec("workload:F", policies=POLICIES, model="time")
    reqs = load_requests(spec)
    pairs = [(8192, p) for p in POLICIES] + [(1 << 20, "radix")]
    seen: list[tuple[int, ReplayResult]] = []
    out = run_pairs(spec, reqs, pairs, jobs=jobs, on_result=lambda i, r: seen.append((i, r)))
    assert sorted(i for i, _ in seen) == list(range(len(pairs)))
    for i, r in seen:
        assert (r.policy, r.capacity) == (out[i].policy, out[i].capacity) == pairs[i][::-1]
        assert r.records == out[i].records and len(r.records) == len(reqs)


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="fork start method")
def test_the_next_replay_starts_before_a_result_is_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a worker free, the parent starts the next replay first, then hands over the
    result that freed it (so writing that result out overlaps the next replay)."""
    events: list[str] = []
    start = mp_context.ForkProcess.start

    def counted_start(self: Any) -> None:
        events.append("start")
        start(self)

    monkeypatch.setattr(mp_context.ForkProcess, "start", counted_start)
    spec = SweepSpec("workload:F", policies=["radix"], model="time")
    reqs = load_requests(spec)
    pairs = [(8192, "radix"), (16384, "radix"), (24576, "radix")]
    run_pairs(spec, reqs, pairs, jobs=2, on_result=lambda i, r: events.append("result"))
    assert events.count("start") == 3 and events.count("result") == 3
    assert events.index("result") > events.index("start", 2)  # the third before the first


def test_workers_start_the_longest_replays_first() -> None:
    """Block-pool and block-trie replays first, then larger capacities (None: unlimited),
    then larger host capacities; ties keep their order. Every task is started once."""
    tasks = [
        (1000, 0, "radix"),
        (4000, 0, "radix-page16"),
        (1000, 0, "vllm-blocks"),
        (None, 0, "radix"),
        (4000, 0, "vllm-blocks"),
        (4000, 8000, "radix"),
        (2000, 0, "trtllm"),
        (4000, 0, "radix"),
    ]
    assert longest_first(tasks) == [4, 6, 2, 3, 5, 1, 7, 0]
    assert longest_first([]) == []


def test_replay_in_worker_processes_equals_a_serial_run(tmp_path: Path) -> None:
    outs = []
    for jobs in ("1", "3"):
        js = tmp_path / f"r{jobs}.json"
        assert (
            main(
                [
                    "replay",
                    "workload:F",
                    "--model",
                    "time",
                    "--quiet",
                    "--policies",
                    *POLICIES,
                    "--jobs",
                    jobs,
                    "--json",
                    str(js),
                ]
            )
            == 0
        )
        outs.append(json.loads(js.read_text()))
    assert _comparable(outs[0]["summaries"]) == _comparable(outs[1]["summaries"])
    assert (
        outs[0]["records"] == outs[1]["records"]
        and outs[0]["differences"] == outs[1]["differences"]
    )
    assert all(s["peak_rss_bytes"] > 0 for s in outs[1]["summaries"])


def test_sweep_command_jobs_give_the_same_json(tmp_path: Path) -> None:
    outs = []
    for jobs in ("1", "2"):
        js = tmp_path / f"s{jobs}.json"
        assert (
            main(
                [
                    "sweep",
                    "workload:E",
                    "--capacities",
                    "8k,16k,32k",
                    "--quiet",
                    "--policies",
                    *POLICIES,
                    "--jobs",
                    jobs,
                    "--json",
                    str(js),
                ]
            )
            == 0
        )
        outs.append(json.loads(js.read_text()))
    assert outs[0]["hit_rate"] == outs[1]["hit_rate"]
    assert _comparable(outs[0]["summaries"]) == _comparable(outs[1]["summaries"])
    assert main(["sweep", "workload:E", "--capacities", "8k", "--jobs", "0"]) == 2


def test_interrupt_in_process_is_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import prefixcache.sim.sweep as sweep

    def interrupted(*a: Any, **k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_pairs", interrupted)
    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    assert main(["replay", "workload:F", "--quiet", "--json", str(js), "--csv", str(cs)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0]
    assert not js.exists() and not cs.exists()


def _big_mooncake(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            ids = [i % 7] + [1000 + 40 * i + j for j in range(39)]
            f.write(
                json.dumps(
                    {
                        "timestamp": 10 * i,
                        "input_length": 40 * 512,
                        "output_length": 50,
                        "hash_ids": ids,
                    }
                )
                + "\n"
            )


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_sigint_exits_130_with_one_line_and_no_files(tmp_path: Path, command: str) -> None:
    trace = tmp_path / "big.jsonl"
    _big_mooncake(trace, 40000)  # 820M prompt tokens: runs for far longer than 4 s
    js = tmp_path / "out.json"
    extra = ["--capacities", "64k,1M"] if command == "sweep" else ["--capacity", "1M"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefixcache.sim.cli",
            command,
            str(trace),
            *extra,
            "--json",
            str(js),
            "--policies",
            *POLICIES,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
        # A suite started in the background (`cmd &` without job control) ignores
        # SIGINT, and a child that inherits that never sees the interrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(4.0)  # imports, reading the trace, into the replay
    assert proc.poll() is None, "the replay ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "interrupted" in lines[0], err
    assert "Traceback" not in err and not js.exists()


def test_ctrl_c_while_the_command_loads_is_one_line_and_130() -> None:
    """Ctrl-C before the simulator has loaded (numpy, the core: a fifth of a second) ends
    as Ctrl-C during a replay does. Deterministic: an import hook raises it where the
    signal would land."""
    code = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from prefixcache.__main__ import run\n"
        "sys.argv = ['prefixcache', 'replay', 'workload:F']\n"
        "sys.exit(run())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted: prefixcache stopped while starting\n"


def test_importing_the_package_loads_nothing_until_a_name_is_used() -> None:
    """`import prefixcache` (and so the command's first import) loads neither numpy nor the
    core; each public name loads its module on first use, and `__all__` holds them all."""
    code = (
        "import sys, prefixcache as pc\n"
        "assert 'numpy' not in sys.modules and 'prefixcache._core' not in sys.modules\n"
        "from prefixcache import RadixCache, InvalidInputError, BlockStored, LoRAKey\n"
        "assert RadixCache.__module__ == 'prefixcache._core'\n"
        "assert all(getattr(pc, n) is not None for n in pc.__all__)\n"
        "assert set(pc.__all__) <= set(dir(pc)) and sorted(pc.__all__) == sorted(pc._HOME)\n"
        "try:\n"
        "    pc.NoSuchName\n"
        "except AttributeError as e:\n"
        "    assert 'NoSuchName' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_json_output_is_the_standard_encoding_with_a_record_per_line(tmp_path: Path) -> None:
    """``write_json`` gives what ``json.dumps(indent=2)`` of the cleaned data parses to
    (NaN as null, numpy scalars as numbers), with each object of a list on one line."""
    import math

    import numpy as np

    from prefixcache.sim.json_report import write_json
    from prefixcache.sim.requests import RequestRecord

    rec = RequestRecord(id=3, session="s1", turn=2, prompt_tokens=10, output_tokens=4)
    rec.hit_tokens = 8
    data: dict[Any, Any] = {
        "command": "replay",
        "summaries": [{"policy": "radix", "hit_rate": np.float64(0.5), "n": np.int64(7)}],
        "records": {"radix": [rec.to_dict(), rec.to_dict(host_tier=True)]},
        "grid": [[1, 2], [3]],
        "empty": {},
        "nan": math.nan,
        4: (1, 2),
    }
    path = tmp_path / "out.json"
    write_json(path, data)
    got = json.loads(path.read_text())
    assert got == {
        "command": "replay",
        "summaries": [{"policy": "radix", "hit_rate": 0.5, "n": 7}],
        "records": {
            "radix": [
                {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}
                for d in (rec.to_dict(), rec.to_dict(host_tier=True))
            ]
        },
        "grid": [[1, 2], [3]],
        "empty": {},
        "nan": None,
        "4": [1, 2],
    }
    assert list(got["records"]["radix"][0]) == [
        "id", "session", "turn", "prompt_tokens", "output_tokens", "hit_tokens",
        "evicted_tokens", "rejected", "arrival", "first_token", "finished", "ttft",
        "preemptions", "recompute_hit_tokens", "recomputed_tokens",
    ]  # fmt: skip
    assert "load_time" in got["records"]["radix"][1]
    lines = path.read_text().splitlines()
    assert sum(line.strip().startswith('{"id": 3') for line in lines) == 2


_KILL_ONE_WORKER = """
import os, signal, sys
import prefixcache.sim.sweep as sweep
from prefixcache.sim.cli import main

work = sweep._work
pids = sys.argv[1]

def dying(spec, key, task, report, records):
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\\n")
    if task[2] == "radix-page16" and task[0] == 16000:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does
    return work(spec, key, task, report, records)

sweep._work = dying  # the workers are forked: they run this one
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_a_worker_killed_mid_run_stops_the_run_with_one_line(tmp_path: Path, command: str) -> None:
    """A worker that dies without a result (SIGKILL) ends the command at once: one line
    naming the replay and the signal, exit status 1, no output files, no worker left."""
    js, pids = tmp_path / "out.json", tmp_path / "pids"
    extra = ["--capacities", "8k,16k,24k"] if command == "sweep" else ["--capacity", "16k"]
    argv = [command, "workload:F", *extra, "--policies", "radix,radix-page16", "--jobs", "2"]
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_ONE_WORKER, str(pids), *argv, "--json", str(js)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: the worker process replaying radix-page16 at 16,000")
    assert "killed by SIGKILL" in lines[0]
    assert not js.exists()
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
