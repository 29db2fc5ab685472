"""The per-request records' fast path of the ``--json`` files: the same text as the
general encoder, line for line, for every kind of value a record can hold."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.sim.json_report import (
    JsonLines,
    clean,
    json_pieces,
    json_text,
    record_lines,
    record_texts,
    write_json,
)
from prefixcache.sim.report import record_csv_header, record_csv_rows, write_csv
from prefixcache.sim.requests import RecordColumns, RequestRecord, record_fields

ids = st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=6))
counts = st.one_of(st.integers(0, 2**40), st.integers(-(2**70), 2**70))
times = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(math.nan),
    st.just(-0.0),
    st.integers(0, 10**6),  # an int where a float is declared: written as an int
    st.builds(np.float64, st.floats(allow_nan=True, allow_infinity=True)),
)


@st.composite
def records(draw: st.DrawFn) -> RequestRecord:
    rec = RequestRecord(
        id=draw(ids),
        session=draw(st.one_of(st.none(), ids)),
        turn=draw(st.integers(0, 1000)),
        prompt_tokens=draw(counts),
        output_tokens=draw(counts),
    )
    rec.hit_tokens = draw(st.one_of(counts, st.builds(np.int64, st.integers(0, 2**40))))
    rec.evicted_tokens = draw(counts)
    rec.rejected = draw(st.one_of(st.booleans(), st.builds(np.bool_, st.booleans())))
    for name in ("arrival", "first_token", "finished", "ttft", "load_time"):
        setattr(rec, name, draw(times))
    rec.host_hit_tokens = draw(counts)
    return rec


def _refuse(literal: str) -> None:
    raise AssertionError(f"{literal} is not JSON")


def _general(recs: list[RequestRecord], host_tier: bool) -> list[str]:
    return [json.dumps(clean(r.to_dict(host_tier=host_tier))) for r in recs]


@settings(max_examples=300, deadline=None)
@given(st.lists(records(), max_size=8), st.booleans(), st.booleans())
def test_record_lines_equal_the_general_encoder(
    recs: list[RequestRecord], host_tier: bool, uniform: bool
) -> None:
    if uniform:  # the common case: every column of one plain type (the one-pass paths)
        for r in recs:
            r.id, r.session, r.rejected = len(recs), None, bool(r.rejected)
            r.hit_tokens = int(r.hit_tokens)
            for name in ("arrival", "first_token", "finished", "ttft", "load_time"):
                setattr(r, name, float(getattr(r, name)))
    got = record_lines(recs, host_tier=host_tier).lines
    assert got == _general(recs, host_tier)
    for line, r in zip(got, recs, strict=True):
        # Strict JSON: no NaN or Infinity literals.
        assert list(json.loads(line, parse_constant=_refuse)) == list(record_fields(host_tier))
        assert json.loads(line)["turn"] == r.turn


def test_a_file_with_record_lines_is_the_file_with_the_records(tmp_path: Path) -> None:
    a, b = RequestRecord(1, "s", 0, 10, 2), RequestRecord(2, None, 1, 12, 3)
    a.ttft, b.ttft = 0.25, math.inf
    for host_tier in (False, True):
        data: dict[str, Any] = {"summaries": [{"n": 1}], "empty": []}
        fast = {**data, "records": {"radix": record_lines([a, b], host_tier), "x": JsonLines([])}}
        general = {
            **data,
            "records": {"radix": [r.to_dict(host_tier=host_tier) for r in (a, b)], "x": []},
        }
        write_json(tmp_path / "fast.json", fast)
        write_json(tmp_path / "general.json", general)
        text = (tmp_path / "fast.json").read_text()
        assert text == (tmp_path / "general.json").read_text()
        assert '    "radix": [\n      {"id": 1, "session": "s"' in text


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--capacities", "1k"],
        ["sweep", "--capacities", "1k", "--cpu-capacities", "0,1k"],
        ["sweep", "--capacities", "1k", "--instances", "1,2"],
        ["replay", "--instances", "2", "--capacity", "1k"],
        ["replay"],
        ["trace-stats"],
    ],
)
def test_every_json_counts_the_skipped_lines(tmp_path: Path, argv: list[str]) -> None:
    from prefixcache.sim.cli import main

    trace = tmp_path / "t.jsonl"
    line = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}
    trace.write_text(json.dumps(line) + "\nnot json\n" + json.dumps(line) + "\n")
    js = tmp_path / "out.json"
    extra = ["--quiet", "--jobs", "1", "--policies", "radix"] if argv[0] != "trace-stats" else []
    if "--instances" in argv:
        extra.remove("--jobs")  # a fleet runs in one process: --jobs is refused there
        extra.remove("1")
    cmd = [argv[0], str(trace), *argv[1:], *extra, "--skip-bad-lines", "--json", str(js)]
    assert main(cmd) == 0
    assert json.loads(js.read_text())["skipped_lines"] == 1


def test_the_json_layout_is_indented_by_level_with_an_object_per_line(tmp_path: Path) -> None:
    """The text is the standard encoding, laid out as before it was written in pieces."""
    data: dict[str, Any] = {
        "command": "replay",
        "none": None,
        "nan": math.nan,
        "summaries": [{"policy": "radix", "hit_rate": 0.5}, {"policy": "x", "n": [1, 2]}],
        "nested": [[1, 2], {"a": {}}, []],
        "flat": [1, "two", None],
        "empty": {},
        "records": {"radix": JsonLines(['{"id": 1}', '{"id": 2}']), "none": JsonLines([])},
    }
    want = """{
  "command": "replay",
  "none": null,
  "nan": null,
  "summaries": [
    {"policy": "radix", "hit_rate": 0.5},
    {"policy": "x", "n": [1, 2]}
  ],
  "nested": [
    [1, 2],
    {
      "a": {}
    },
    []
  ],
  "flat": [1, "two", null],
  "empty": {},
  "records": {
    "radix": [
      {"id": 1},
      {"id": 2}
    ],
    "none": []
  }
}
"""
    write_json(tmp_path / "out.json", data)
    assert (tmp_path / "out.json").read_text() == want
    assert json_text(clean(data)) + "\n" == want
    assert "".join(json_pieces(clean(data))) + "\n" == want
    # The records' lines come as one piece: no piece per record.
    pieces = list(json_pieces({"r": JsonLines([f'{{"id": {i}}}' for i in range(1000)])}))
    assert len(pieces) < 10


@settings(max_examples=300, deadline=None)
@given(
    st.lists(records(), max_size=8),
    st.booleans(),
    st.booleans(),
    st.one_of(st.just("radix"), st.text(max_size=6)),
)
def test_record_csv_rows_are_what_write_csv_writes(
    tmp_path_factory: pytest.TempPathFactory,
    recs: list[RequestRecord],
    host_tier: bool,
    uniform: bool,
    policy: str,
) -> None:
    """The ``--records-csv`` rows made from the columns' JSON text are the text of the
    general CSV writer, quoting, NaN and numpy scalars included."""
    if uniform:
        for r in recs:
            r.id, r.session, r.rejected = len(recs), None, bool(r.rejected)
            r.hit_tokens = int(r.hit_tokens)
            for name in ("arrival", "first_token", "finished", "ttft", "load_time"):
                setattr(r, name, float(getattr(r, name)))
    cols = RecordColumns.from_records(recs)
    texts = record_texts(cols, host_tier)
    assert record_lines(cols, host_tier, texts).lines == _general(recs, host_tier)
    path = tmp_path_factory.mktemp("csv") / "r.csv"
    rows = [{"policy": policy, **r.to_dict(host_tier=host_tier)} for r in recs]
    write_csv(path, rows)
    general = path.read_bytes().decode()
    header = record_csv_header(host_tier)
    if recs:
        assert general.startswith(header)
    assert record_csv_rows(policy, cols, host_tier, texts) == general[len(header) :]
