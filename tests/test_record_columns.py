"""Per-request records held as columns (:class:`RecordColumns`): a replay's columns are
the records its scheduler's ``run`` gives, ``ReplayResult.records`` built from them equals
the eager list, and summaries, differences and written files are those of the records."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import pytest

from prefixcache.errors import InvalidInputError
from prefixcache.sim.cli import main
from prefixcache.sim.json_report import record_lines
from prefixcache.sim.replay import (
    ReplayResult,
    hit_difference,
    host_tier_summary,
    make_scheduler,
    replay,
    summarize,
)
from prefixcache.sim.requests import RecordColumns, Request, RequestRecord, record_fields
from prefixcache.sim.workloads import study_workload

MODELS = ("slots", "time", "sequence")


def _requests(n: int = 120, workload: str = "B") -> list[Request]:
    return list(study_workload(workload, 0).requests[:n])


def _same(a: list[RequestRecord], b: list[RequestRecord]) -> bool:
    """Field for field, NaN equal to NaN."""

    def key(r: RequestRecord) -> list[Any]:
        return [
            "nan" if isinstance(v, float) and math.isnan(v) else (type(v), v)
            for v in r.to_dict(host_tier=True).values()
        ]

    return [key(r) for r in a] == [key(r) for r in b]


def _records() -> list[RequestRecord]:
    return [
        RequestRecord(1, "s", 0, 10, 2, hit_tokens=4, arrival=0.5, ttft=0.25),
        RequestRecord("b", None, 1, 12, 3, rejected=True, evicted_tokens=7, load_time=1.5),
        RequestRecord(3, 3, 2, 0, 0, host_hit_tokens=2, loaded_tokens=1, preemptions=2),
    ]


def test_columns_round_trip_records() -> None:
    recs = _records()
    cols = RecordColumns.from_records(recs)
    assert len(cols) == 3
    assert cols.hit_tokens == [4, 0, 0]
    assert cols.column("session") == ["s", None, 3]
    assert cols.records() == recs
    assert RecordColumns.from_records(cols.records()) == cols
    again = pickle.loads(pickle.dumps(cols))
    assert _same(again.records(), recs)
    assert RecordColumns.from_records([]).records() == []


def test_columns_reject_ragged_or_unknown() -> None:
    cols = RecordColumns.from_records(_records()).columns()
    cols[4] = cols[4][:2]
    with pytest.raises(InvalidInputError, match="output_tokens holds 2 values, not 3"):
        RecordColumns(cols)
    with pytest.raises(InvalidInputError, match="columns expected"):
        RecordColumns(cols[:3])
    with pytest.raises(InvalidInputError, match="no record field"):
        RecordColumns.from_records(_records()).column("nope")


def test_new_columns_are_new_records() -> None:
    from prefixcache.sim.requests import new_record

    reqs = _requests(30)
    assert _same(RecordColumns.for_requests(reqs).records(), [new_record(r) for r in reqs])


def _slot_records(reqs: list[Request], policy: Any, max_running: int = 8) -> list[RequestRecord]:
    """The slot model's records, one object per request, as it made them before columns."""
    from collections import deque

    from prefixcache.sim.requests import new_record

    records = [new_record(r) for r in reqs]
    running: deque[int] = deque()
    active: dict[Any, int] = {}

    def finish_oldest() -> None:
        i = running.popleft()
        policy.finish(i, reqs[i].output)
        if reqs[i].session is not None and active.get(reqs[i].session) == i:
            del active[reqs[i].session]

    for i, req in enumerate(reqs):
        if req.session is not None:
            while req.session in active:
                finish_oldest()
        while len(running) >= max_running:
            finish_oldest()
        rec = records[i]
        while True:
            before = policy.evicted_tokens()
            hit = policy.admit(i, req.prompt, req.output_len, req.extra_key, req.cache_salt)
            rec.evicted_tokens += policy.evicted_tokens() - before
            if hit is not None or not running:
                break
            finish_oldest()
        if hit is None:
            rec.rejected = True
            continue
        rec.hit_tokens = hit
        if hit:
            rec.host_hit_tokens = rec.loaded_tokens = policy.host_hit(i)
        policy.on_prefill_done(i)
        running.append(i)
        if req.session is not None:
            active[req.session] = i
    while running:
        finish_oldest()
    return records


@pytest.mark.parametrize("workload", ["B", "D"])
def test_slot_columns_are_the_records_of_one_object_per_request(workload: str) -> None:
    from prefixcache.sim.policies import make_policy

    reqs = _requests(workload=workload)
    want = _slot_records(reqs, make_policy("radix", 3_000, cpu_capacity=40_000))
    got = make_scheduler("slots").run_columns(
        reqs, make_policy("radix", 3_000, cpu_capacity=40_000)
    )
    assert _same(got.records(), want)
    assert any(r.evicted_tokens for r in want)
    assert any(r.host_hit_tokens for r in want) or workload != "D"


@pytest.mark.parametrize("model", MODELS)
def test_run_columns_are_run_records(model: str) -> None:
    reqs = _requests()
    from prefixcache.sim.policies import make_policy

    eager = make_scheduler(model).run(reqs, make_policy("radix", 20_000))
    cols = make_scheduler(model).run_columns(reqs, make_policy("radix", 20_000))
    assert _same(cols.records(), eager)
    assert any(r.hit_tokens for r in eager)  # a run that reuses something


@pytest.mark.parametrize("model", MODELS)
def test_lazy_records_equal_the_eager_ones(model: str) -> None:
    from prefixcache.sim.policies import make_policy

    reqs = _requests()
    (res,) = replay(reqs, ["radix-page16"], 20_000, model=model)
    eager = make_scheduler(model).run(reqs, make_policy("radix-page16", 20_000))
    assert res._records is None  # nothing built yet
    summary = summarize(res)
    listed = ReplayResult(
        res.policy,
        res.model,
        res.capacity,
        eager,
        res.stats,
        res.seconds,
        res.peak_rss_bytes,
        start_rss_bytes=res.start_rss_bytes,
    )
    assert _same(res.records, eager)
    assert res.records is res.records  # built once
    assert _nan_free(summarize(listed)) == _nan_free(summary)
    assert _nan_free(summarize(res)) == _nan_free(summary)


def _nan_free(d: dict[str, Any]) -> dict[str, Any]:
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in d.items()}


def test_changed_records_change_the_summary() -> None:
    (res,) = replay(_requests(), ["radix"], 20_000)
    before = summarize(res)["hit_tokens"]
    res.records[0].hit_tokens += 1000
    assert summarize(res)["hit_tokens"] == before + 1000
    assert res.columns.hit_tokens[0] == res.records[0].hit_tokens
    res.records = []
    assert summarize(res)["requests"] == 0
    given = _records()
    res.records = given
    assert res.records is given  # held as given, not copied
    given.pop()
    assert summarize(res)["requests"] == 2


def test_pickled_result_ships_columns() -> None:
    (res,) = replay(_requests(), ["radix"], 20_000)
    res.records  # noqa: B018 - built, then not shipped: the columns are
    again = pickle.loads(pickle.dumps(res))
    assert again._records is None
    assert _same(again.records, res.records)
    assert _nan_free(summarize(again)) == _nan_free(summarize(res))
    assert "120 records" in repr(again)


def test_differences_and_host_summary_follow_the_records() -> None:
    reqs = _requests()
    a, b = replay(reqs, ["radix", "radix-page16"], 20_000, cpu_capacity=40_000)
    listed = [
        ReplayResult(r.policy, r.model, r.capacity, list(r.records), r.stats, r.seconds)
        for r in (a, b)
    ]
    assert hit_difference(a, b) == hit_difference(*listed)
    served = [r for r in a.records if not r.rejected]
    prompt = sum(r.prompt_tokens for r in served)
    host = host_tier_summary(a, served, prompt)
    assert host == {k: summarize(a)[k] for k in host}


def test_record_lines_of_columns_are_those_of_records() -> None:
    (res,) = replay(_requests(), ["radix"], 20_000, model="time", cpu_capacity=40_000)
    for host_tier in (False, True):
        assert (
            record_lines(res.columns, host_tier).lines == record_lines(res.records, host_tier).lines
        )


def test_records_csv_rows_are_the_records(tmp_path: Path) -> None:
    import csv

    out = tmp_path / "r.csv"
    assert (
        main(
            [
                *("replay", "workload:B", "--policies", "radix", "--jobs", "1", "--quiet"),
                *("--model", "time", "--records-csv", str(out)),
            ]
        )
        == 0
    )
    w = study_workload("B", 0)
    (res,) = replay(list(w.requests), ["radix"], w.capacity, model="time")
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["policy", *record_fields()]
    assert len(rows) == len(res.records)
    for row, rec in zip(rows, res.records, strict=True):
        want = {k: _csv_text(v) for k, v in rec.to_dict().items()}
        assert row == {"policy": "radix", **want}


def _csv_text(v: object) -> str:
    """A value as the CSV writer writes it: NaN and None empty."""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
