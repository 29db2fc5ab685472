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
