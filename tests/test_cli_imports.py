"""What a command imports: a plain ``replay`` of a trace file does not load the fleet,
the built-in workloads, the trace statistics or the progress bars (``--quiet``); the
commands that need them load them when run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LAZY = (
    "prefixcache.sim.fleet",
    "prefixcache.sim.workloads",
    "prefixcache.sim.trace_stats",
    "rich.progress",
)


def _loaded(tmp_path: Path, argv: list[str]) -> set[str]:
    """The modules of LAZY loaded after ``prefixcache.sim.cli.main(argv)`` runs in a fresh
    interpreter."""
    code = (
        "import sys, json\n"
        "from prefixcache.sim.cli import main\n"
        f"assert main({argv!r}) == 0\n"
        f"print(json.dumps([m for m in {list(LAZY)!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def _trace(tmp_path: Path) -> str:
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 5, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_replay_loads_none_of_the_other_commands_modules(tmp_path: Path) -> None:
    argv = ["replay", _trace(tmp_path), "--quiet", "--jobs", "1", "--json", "o.json"]
    assert _loaded(tmp_path, argv) == set()
    assert _loaded(tmp_path, [*argv, "--policies", "radix", "--csv", "o.csv"]) == set()


def test_the_commands_that_need_them_load_them(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    assert "prefixcache.sim.workloads" in _loaded(tmp_path, ["compare", "--workload", "A"])
    assert "prefixcache.sim.trace_stats" in _loaded(tmp_path, ["trace-stats", trace])
    fleet = ["replay", trace, "--quiet", "--instances", "2", "--capacity", "4096"]
    assert "prefixcache.sim.fleet" in _loaded(tmp_path, fleet)
