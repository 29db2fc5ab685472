"""Output files of the command line: checked before a run, written whole after it
(prefixcache.sim.output_files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefixcache.sim.cli import main
from prefixcache.sim.output_files import check_writable, write_pieces, write_text


def test_a_failed_write_leaves_the_old_file_or_none_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.json"
    out.write_text("old\n")
    out.chmod(0o640)
    with pytest.raises(UnicodeEncodeError):
        write_text(out, "new \ud800\n")  # refused before the file is opened
    assert out.read_text() == "old\n"
    write_text(out, "new\n")  # an existing file: written in place, keeping its mode
    assert out.read_text() == "new\n" and out.stat().st_mode & 0o777 == 0o640
    new = tmp_path / "new.json"

    def fail(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)  # a new file fails once written
    with pytest.raises(OSError, match=r"new\.json: No space left on device"):
        write_text(new, "x\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no part, no temporary


def test_a_new_file_gets_the_mode_open_gives_it(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        write_text(tmp_path / "a.csv", "x\r\ny\r\n")
    finally:
        os.umask(mask)
    assert (tmp_path / "a.csv").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "a.csv").read_bytes() == b"x\r\ny\r\n"  # line ends as given


def test_an_existing_file_keeps_its_hard_links(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("old")
    os.link(tmp_path / "a.json", tmp_path / "b.json")
    write_text(tmp_path / "a.json", "new")
    assert (tmp_path / "b.json").read_text() == "new"


def test_a_link_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "target.json").write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to("target.json")
    write_text(link, "new")
    assert link.is_symlink() and (tmp_path / "target.json").read_text() == "new"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing" / "x.json", "does not exist"),
        (lambda d: d, "is a directory"),
        (lambda d: _dangling(d), "does not exist"),
    ],
)
def test_unwritable_paths_are_named(tmp_path: Path, make: object, message: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(OSError, match=message) as ei:
        check_writable(path)
    assert str(path) in str(ei.value)


def _dangling(d: Path) -> Path:
    link = d / "dangling.csv"
    link.symlink_to(d / "no-such-dir" / "x.csv")
    return link


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_file_system_that_takes_no_new_file_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js = tmp_path / "r.json"
    argv = ["replay", "workload:A", "--quiet", "--policies", "radix"]
    assert main([*argv, "--json", str(js), "--csv", "/proc/r.csv"]) == 2
    err = capsys.readouterr().err
    assert "error: --csv /proc/r.csv" in err
    assert not js.exists()  # nothing ran, nothing was written


def test_json_to_a_pipe_through_dev_stdout() -> None:
    argv = ["replay", "workload:A", "--quiet", "--policies", "radix", "--json", "/dev/stdout"]
    run = subprocess.run(
        [sys.executable, "-m", "prefixcache", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    start = run.stdout.index('{\n  "command"')
    data = json.loads(run.stdout[start:])
    assert data["command"] == "replay" and data["summaries"][0]["policy"] == "radix"


def test_a_write_error_after_the_run_names_the_path(capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    argv = ["replay", "workload:A", "--quiet", "--policies", "radix", "--json", "/dev/full"]
    assert main(argv) == 2
    assert "error: /dev/full: No space left on device" in capsys.readouterr().err


def test_pieces_are_written_as_their_text_or_not_at_all(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    pieces = ["{\n", '  "a": ', "[1, 2]", "\n}", "\n"]
    write_pieces(out, iter(pieces))  # a new file
    assert out.read_text() == "".join(pieces)
    write_pieces(out, ["é", "x\n"])  # in place, UTF-8
    assert out.read_bytes() == "éx\n".encode()
    with pytest.raises(UnicodeEncodeError):
        write_pieces(out, ["new\n", "\ud800"])  # the last piece refused before any write
    assert out.read_bytes() == "éx\n".encode()
    with pytest.raises(UnicodeEncodeError):
        write_pieces(tmp_path / "new.json", ["ok", "\udc80"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    write_pieces(out, [])
    assert out.read_bytes() == b""
