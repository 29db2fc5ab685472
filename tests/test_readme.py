"""The README's library example runs as written and passes ``mypy --strict``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def library_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    runnable = [b for b in blocks if "print(" in b]
    assert len(runnable) == 1, "the README has one runnable library example"
    return runnable[0]


def test_readme_library_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    code = library_example()
    path = tmp_path / "example.py"
    path.write_text(code)
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    promised = [m.group(1) for m in re.finditer(r"print\(.*\)\s+# ([^:\n]+)", code)]
    assert [line.strip() for line in out if line.strip()] == [p.strip() for p in promised]


def test_readme_library_example_passes_mypy_strict(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    path = tmp_path / "example.py"
    path.write_text(library_example())
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path), str(path)]
    )
    assert status == 0, out + err


def test_readme_command_lines_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every `prefixcache ...` line of the README's command-line section, from a clone's
    root (examples/ present), exits 0 and writes what it says it writes."""
    import shlex

    from prefixcache.sim.cli import main

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Command line") : text.index("## Library")]
    lines = [
        ln.split("#")[0].strip()
        for b in re.findall(r"```bash\n(.*?)```", section, re.S)
        for ln in b.splitlines()
    ]
    commands = [shlex.split(ln)[1:] for ln in lines if ln.startswith("prefixcache")]
    assert len(commands) == 8
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    for argv in commands:
        assert main([*argv, "--quiet"]) == 0, argv
    assert (tmp_path / "out.json").stat().st_size > 0
    assert (tmp_path / "hit_rate.png").read_bytes()[:4] == b"\x89PNG"


def test_simulator_python_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/SIMULATOR.md's Python API example runs as written from a clone's root."""
    text = (ROOT / "docs" / "SIMULATOR.md").read_text()
    section = text[text.index("## Python API") :]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    exec(compile(code, "SIMULATOR.md", "exec"), namespace)
    assert len(namespace["timed"]) == 2  # type: ignore[arg-type]


def test_token_buffer_lifecycle_example_runs_and_prints_what_it_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/API.md's SGLang-style request lifecycle with a TokenBuffer runs as written."""
    text = (ROOT / "docs" / "API.md").read_text()
    section = text[text.index("### Convert once: `TokenBuffer`") :]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    exec(compile(code, "API.md", "exec"), {})
    promised = re.search(r"print\(.*\)\s+# ([^:\n]+)", code)
    assert promised is not None
    assert capsys.readouterr().out.strip() == promised.group(1).strip()


def test_simulator_token_jsonl_example_is_a_readable_trace_line(tmp_path: Path) -> None:
    """docs/SIMULATOR.md's token JSONL example, saved as a file, is a one-request trace
    with the fields it shows (a line of the format: the example is one line)."""
    from prefixcache.sim.traces import read_trace

    text = (ROOT / "docs" / "SIMULATOR.md").read_text()
    section = text[text.index("**Token JSONL**") :]
    (example,) = re.findall(r"```json\n(.*?)```", section, re.S)[:1]
    path = tmp_path / "trace.jsonl"
    path.write_text(example)
    (req,) = read_trace(path).requests
    assert (req.id, req.arrival, req.prompt.tolist(), req.output_len) == ("r1", 0.25, [1, 2, 3], 16)
    assert (req.session, req.extra_key, req.cache_salt) == ("chat-7", "lora-a", "tenant-3")


def test_fleet_replay_python_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/FLEET_REPLAY.md's Python example runs as written from a clone's root, and its
    summary has the keys the comment lists."""
    text = (ROOT / "docs" / "FLEET_REPLAY.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)[:1]
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    exec(compile(code, "FLEET_REPLAY.md", "exec"), namespace)
    summary = namespace["s"]
    assert isinstance(summary, dict)
    listed = re.search(r"s = res\.summary\(\)\s+# (.*)", code)
    assert listed is not None
    for key in (
        listed.group(1).replace("ttft_p50/p90/p99", "ttft_p50, ttft_p90, ttft_p99").split(", ")
    ):
        assert key in summary, key
