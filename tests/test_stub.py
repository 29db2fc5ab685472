"""The hand-written ``_core.pyi`` must match the compiled module (mypy.stubtest)."""

import subprocess
import sys


def test_stub_matches_the_compiled_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "prefixcache._core"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
