"""No per-token work on the Python side: a replay of a workload whose prompts and outputs
are numpy arrays that refuse to be iterated, listed or indexed element by element runs
through every policy and scheduler model. Token arrays may be sliced, concatenated and
handed to the core (which borrows them as buffers), never walked token by token.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from prefixcache.sim.policies import POLICY_NAMES
from prefixcache.sim.replay import replay
from prefixcache.sim.requests import Request


class Guarded(np.ndarray):
    """A token array that fails on any per-token Python access."""

    def __iter__(self) -> Any:
        raise AssertionError("a token array was iterated in Python")

    def tolist(self) -> Any:
        raise AssertionError("a token array was converted to a list")

    def item(self, *args: Any) -> Any:
        raise AssertionError("a token was read as a Python scalar")

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int | np.integer):
            raise AssertionError("a token array was indexed element by element")
        return super().__getitem__(key)


def guarded(a: np.ndarray) -> Guarded:
    return np.ascontiguousarray(a, dtype=np.uint32).view(Guarded)


def workload() -> list[Request]:
    rng = np.random.default_rng(0)
    systems = [rng.integers(0, 30_000, 300) for _ in range(3)]
    reqs = []
    for i in range(40):
        prompt = np.concatenate([systems[i % 3], rng.integers(0, 30_000, 50 + i)])
        output = rng.integers(0, 30_000, 20)
        reqs.append(Request(i, guarded(prompt), guarded(output), arrival=i * 0.01))
    return reqs


def test_guard_works() -> None:
    g = guarded(np.arange(4))
    with pytest.raises(AssertionError):
        list(g)
    with pytest.raises(AssertionError):
        g.tolist()
    with pytest.raises(AssertionError):
        int(g[2])
    assert len(g[1:3]) == 2


@pytest.mark.parametrize("model", ["slots", "time"])
def test_replay_never_walks_tokens_in_python(model: str) -> None:
    reqs = workload()
    policies = [*POLICY_NAMES, "trtllm", "trtllm-nopartial"]
    results = replay(reqs, policies, capacity=2000, model=model, check=True)
    assert len(results) == len(policies)
    assert all(len(r.records) == len(reqs) for r in results)
