"""The hand-written ``_core.pyi`` must match the compiled module (mypy.stubtest)."""

import subprocess
import sys
from pathlib import Path


def test_stub_matches_the_compiled_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "prefixcache._core"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


TOKEN_FORMS = """
import array
import numpy as np
from prefixcache import BlockHasher, RadixCache, TokenBuffer
t = RadixCache()
t.match_prefix([1, 2])
t.match_prefix((1, 2))
t.match_prefix(range(3))
t.match_prefix(np.arange(3))
t.match_prefix(array.array("q", [1]))
t.match_prefix(memoryview(array.array("q", [1])))
t.match_prefix(TokenBuffer([1]))
t.insert([1], values=np.arange(1))
BlockHasher().hash_blocks(TokenBuffer())
t.match_prefix("hello")  # line 15: refused
BlockHasher().hash_blocks(b"ab")  # line 16: refused
"""


def test_stub_token_types_refuse_str_and_bytes(tmp_path: Path) -> None:
    """``match_prefix("hello")`` must not pass mypy --strict (no ``Any`` in the token types)."""
    path = tmp_path / "forms.py"
    path.write_text(TOKEN_FORMS)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert [e.split(":")[1] for e in errors] == ["15", "16"], proc.stdout


def test_bound_methods_do_not_list_self() -> None:
    """``inspect.signature`` of a bound method (what help() and IDEs show) names only
    the arguments a call passes: a text signature written ``(self, ...)`` instead of
    ``($self, ...)`` made ``self`` look like the first argument."""
    import inspect

    from test_no_panic import instances

    listed = []
    for name, make in instances():
        obj = make()
        for method in dir(obj):
            bound = getattr(obj, method)
            if method.startswith("_") or not callable(bound):
                continue
            try:
                params = inspect.signature(bound).parameters
            except (TypeError, ValueError):
                continue
            if "self" in params:
                listed.append(f"{name}.{method}")
    assert not listed, listed
