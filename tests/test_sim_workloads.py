"""Workload generators: exact parameters, seeding, and token uniqueness."""

from __future__ import annotations

import numpy as np
import pytest

from prefixcache.errors import InvalidInputError
from prefixcache.sim.requests import Request
from prefixcache.sim.workloads import multi_turn_workload, shared_prefix_workload, study_workload


def all_tokens(reqs: list[Request]) -> np.ndarray:
    return np.concatenate([np.concatenate([r.prompt, r.output]) for r in reqs])


@pytest.mark.parametrize(
    ("name", "shared", "q", "o"),
    [
        ("A", 1000, (20, 400), (32, 200)),
        ("B", 1008, (20, 400), (32, 200)),
        ("C", 12, (20, 60), (16, 64)),
    ],
)
def test_shared_prefix_study_workloads(
    name: str, shared: int, q: tuple[int, int], o: tuple[int, int]
) -> None:
    w = study_workload(name, 3)
    reqs = list(w.requests)
    assert len(reqs) == 256 and w.capacity is None
    prefix = reqs[0].prompt[:shared]
    for r in reqs:
        assert r.prompt.dtype == np.uint32 and r.output.dtype == np.uint32
        assert np.array_equal(r.prompt[:shared], prefix)
        assert q[0] <= r.prompt_len - shared <= q[1]
        assert o[0] <= r.output_len <= o[1]
    # Everything but the shared prefix is unique across the whole workload.
    rest = np.concatenate([np.concatenate([r.prompt[shared:], r.output]) for r in reqs])
    assert np.unique(rest).size == rest.size
    assert not np.isin(rest, prefix).any()


@pytest.mark.parametrize(("name", "capacity"), [("D", None), ("E", 32768), ("F", 24576)])
def test_multi_turn_study_workloads(name: str, capacity: int | None) -> None:
    w = study_workload(name, 5)
    reqs = list(w.requests)
    assert len(reqs) == 192 and w.capacity == capacity
    system = reqs[0].prompt[:500]
    last: dict[object, Request] = {}
    turns: dict[object, int] = {}
    fresh = 500
    for r in reqs:
        assert np.array_equal(r.prompt[:500], system)
        assert 50 <= r.output_len <= 300
        if r.session in last:
            prev = last[r.session]
            hist = np.concatenate([prev.prompt, prev.output])
            assert np.array_equal(r.prompt[: hist.size], hist)
            new = r.prompt_len - hist.size
        else:
            new = r.prompt_len - 500
        assert 30 <= new <= 200
        fresh += new + r.output_len
        assert r.turn == turns.get(r.session, 0)
        turns[r.session] = r.turn + 1
        last[r.session] = r
    assert sorted(turns.values()) == [6] * 32
    # Sessions are interleaved, not run one after another.
    assert [r.session for r in reqs[:6]] != [reqs[0].session] * 6
    # Distinct content: the system prompt plus each turn's new tokens and output.
    assert np.unique(all_tokens(reqs)).size == fresh


def test_multi_turn_token_ids_unique_except_history() -> None:
    w = multi_turn_workload(num_sessions=4, turns=3, system_prompt_len=10, seed=1)
    seen_new: list[np.ndarray] = []
    hist: dict[object, int] = {}
    for r in w.requests:
        start = hist.get(r.session, 10)
        seen_new.append(r.prompt[start:])
        seen_new.append(r.output)
        hist[r.session] = r.prompt_len + r.output_len
    new = np.concatenate(seen_new)
    assert np.unique(new).size == new.size


def test_same_seed_same_requests_other_seed_differs() -> None:
    a, b, c = study_workload("D", 11), study_workload("D", 11), study_workload("D", 12)
    assert all(
        np.array_equal(x.prompt, y.prompt)
        and np.array_equal(x.output, y.output)
        and x.session == y.session
        for x, y in zip(a.requests, b.requests, strict=True)
    )
    assert [r.prompt_len for r in a.requests] != [r.prompt_len for r in c.requests]


def test_generated_shared_prefix_shape() -> None:
    w = shared_prefix_workload(
        num_groups=4,
        prompts_per_group=5,
        system_prompt_len=64,
        question_len=8,
        output_len=16,
        shuffle=True,
        seed=2,
        request_rate=10.0,
    )
    reqs = list(w.requests)
    assert len(reqs) == 20
    assert {r.prompt_len for r in reqs} == {72} and {r.output_len for r in reqs} == {16}
    groups: dict[bytes, int] = {}
    for r in reqs:
        key = r.prompt[:64].tobytes()
        groups[key] = groups.get(key, 0) + 1
    assert sorted(groups.values()) == [5, 5, 5, 5]
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0


def test_bad_parameters_raise() -> None:
    with pytest.raises(InvalidInputError):
        study_workload("G")
    with pytest.raises(InvalidInputError):
        shared_prefix_workload(num_groups=0)
    with pytest.raises(InvalidInputError):
        shared_prefix_workload(question_len=(10, 5))
    with pytest.raises(InvalidInputError):
        multi_turn_workload(system_prompt_len=0, new_tokens=(0, 3))
    with pytest.raises(InvalidInputError):
        Request(1, np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.uint32))
