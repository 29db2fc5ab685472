"""Requests and synthetic workloads.

A :class:`Request` is what the simulator feeds to a scheduler: prompt token ids (numpy
uint32), the output token ids the request will generate, and optional session, arrival
time and cache namespace. Token ids are globally unique inside one workload except the
parts that are shared on purpose (a system prompt, a previous turn), so every cache hit
comes from deliberate sharing.

Generators (all seeded with a numpy ``Generator``, so the same seed gives the same
requests):

- :func:`study_workload` - the A-F study's workloads A-F (SEMANTICS.md section 5).
- :func:`shared_prefix_workload` - SGLang's "generated shared prefix" benchmark shape.
- :func:`multi_turn_workload` - multi-turn chat sessions interleaved at random.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError
from prefixcache.sim.requests import Request, TokenArray, TokenCounter

__all__ = [
    "STUDY_WORKLOADS",
    "Workload",
    "multi_turn_workload",
    "shared_prefix_workload",
    "study_workload",
]


@dataclass(frozen=True)
class Workload:
    """A named list of requests plus the KV capacity it is meant to run at."""

    name: str
    description: str
    requests: Sequence[Request]
    capacity: int | None  # tokens; None = unlimited (nothing is ever evicted)

    def __len__(self) -> int:
        return len(self.requests)


def _uniform(rng: np.random.Generator, lo_hi: tuple[int, int], n: int) -> npt.NDArray[np.int64]:
    lo, hi = lo_hi
    if lo < 0 or hi < lo:
        raise InvalidInputError(f"bad length range {lo_hi}")
    return rng.integers(lo, hi + 1, size=n, dtype=np.int64)


def shared_prefix_workload(
    *,
    num_groups: int = 1,
    prompts_per_group: int = 256,
    system_prompt_len: int | tuple[int, int] = 1000,
    question_len: int | tuple[int, int] = (20, 400),
    output_len: int | tuple[int, int] = (32, 200),
    shuffle: bool = False,
    seed: int = 0,
    request_rate: float | None = None,
    name: str = "shared-prefix",
    capacity: int | None = None,
) -> Workload:
    """Groups of requests sharing a system prompt, each with its own question.

    The shape of SGLang's ``generated-shared-prefix`` benchmark (groups x prompts per
    group, system prompt length, question length, output length). Lengths are fixed ints
    or inclusive ``(lo, hi)`` ranges drawn uniformly. Requests are emitted group by group
    unless ``shuffle``. ``request_rate`` (requests/s) draws Poisson arrivals; otherwise
    every request arrives at 0.
    """
    if num_groups < 1 or prompts_per_group < 1:
        raise InvalidInputError("num_groups and prompts_per_group must be >= 1")
    rng = np.random.default_rng(seed)
    tok = TokenCounter()
    n = num_groups * prompts_per_group

    def rng_range(x: int | tuple[int, int]) -> tuple[int, int]:
        return (x, x) if isinstance(x, int) else x

    sys_lens = _uniform(rng, rng_range(system_prompt_len), num_groups)
    q_lens = _uniform(rng, rng_range(question_len), n)
    o_lens = _uniform(rng, rng_range(output_len), n)
    if int(sys_lens.min()) + int(q_lens.min()) < 1:
        raise InvalidInputError("a prompt would be empty")
    systems = [tok.fresh(int(s)) for s in sys_lens]
    reqs: list[Request] = []
    for i in range(n):
        g = i // prompts_per_group
        prompt = np.concatenate([systems[g], tok.fresh(int(q_lens[i]))])
        reqs.append(Request(i, prompt, tok.fresh(int(o_lens[i])), session=None))
    if shuffle:
        order = rng.permutation(n)
        reqs = [reqs[int(k)] for k in order]
    _set_arrivals(reqs, rng, request_rate)
    return Workload(name, f"{num_groups} groups x {prompts_per_group} prompts", reqs, capacity)


def multi_turn_workload(
    *,
    num_sessions: int = 32,
    turns: int = 6,
    system_prompt_len: int = 500,
    new_tokens: tuple[int, int] = (30, 200),
    output_len: tuple[int, int] = (50, 300),
    seed: int = 0,
    request_rate: float | None = None,
    name: str = "multi-turn",
    capacity: int | None = None,
) -> Workload:
    """Chat sessions: turn k's prompt = turn k-1's prompt + its output + new user tokens.

    All sessions share one system prompt (``system_prompt_len`` tokens, may be 0); the
    sessions' turns are interleaved at random (each session's turns stay in order).
    """
    if num_sessions < 1 or turns < 1:
        raise InvalidInputError("num_sessions and turns must be >= 1")
    if system_prompt_len + new_tokens[0] < 1:
        raise InvalidInputError("a prompt would be empty")
    rng = np.random.default_rng(seed)
    tok = TokenCounter()
    system = tok.fresh(system_prompt_len)
    order = np.repeat(np.arange(num_sessions), turns)
    rng.shuffle(order)
    new_lens = _uniform(rng, new_tokens, order.size)
    out_lens = _uniform(rng, output_len, order.size)
    history: dict[int, TokenArray] = {}
    turn_of: dict[int, int] = {}
    reqs: list[Request] = []
    for i, s in enumerate(order.tolist()):
        prev = history.get(s, system)
        prompt = np.concatenate([prev, tok.fresh(int(new_lens[i]))])
        output = tok.fresh(int(out_lens[i]))
        t = turn_of.get(s, 0)
        reqs.append(Request(i, prompt, output, session=s, turn=t))
        history[s] = np.concatenate([prompt, output])
        turn_of[s] = t + 1
    _set_arrivals(reqs, rng, request_rate)
    return Workload(name, f"{num_sessions} sessions x {turns} turns", reqs, capacity)


def _set_arrivals(reqs: list[Request], rng: np.random.Generator, rate: float | None) -> None:
    if rate is None:
        return
    if not (math.isfinite(rate) and rate > 0):
        raise InvalidInputError(f"request_rate must be a finite number > 0, got {rate!r}")
    times = np.cumsum(rng.exponential(1.0 / rate, size=len(reqs)))
    for r, t in zip(reqs, times.tolist(), strict=True):
        r.arrival = t


# The A-F study (SEMANTICS.md section 5). Names -> (description, builder).
def _study_a(seed: int) -> Workload:
    return shared_prefix_workload(
        system_prompt_len=1000,
        question_len=(20, 400),
        output_len=(32, 200),
        seed=seed,
        name="A",
        capacity=None,
    )


def _study_b(seed: int) -> Workload:
    return shared_prefix_workload(
        system_prompt_len=1008,
        question_len=(20, 400),
        output_len=(32, 200),
        seed=seed,
        name="B",
        capacity=None,
    )


def _study_c(seed: int) -> Workload:
    return shared_prefix_workload(
        system_prompt_len=12,
        question_len=(20, 60),
        output_len=(16, 64),
        seed=seed,
        name="C",
        capacity=None,
    )


def _study_chat(name: str, capacity: int | None) -> Callable[[int], Workload]:
    def build(seed: int) -> Workload:
        return multi_turn_workload(
            num_sessions=32,
            turns=6,
            system_prompt_len=500,
            new_tokens=(30, 200),
            output_len=(50, 300),
            seed=seed,
            name=name,
            capacity=capacity,
        )

    return build


STUDY_WORKLOADS: dict[str, tuple[str, Callable[[int], Workload]]] = {
    "A": ("256 requests, 1000-token shared system prompt", _study_a),
    "B": ("256 requests, 1008-token (63 x 16) shared system prompt", _study_b),
    "C": ("256 requests, 12-token shared prefix", _study_c),
    "D": ("32 sessions x 6 turns", _study_chat("D", None)),
    "E": ("32 sessions x 6 turns", _study_chat("E", 32768)),
    "F": ("32 sessions x 6 turns", _study_chat("F", 24576)),
}


def study_workload(name: str, seed: int = 0) -> Workload:
    """The A-F study's workload ``name`` (A-F), generated with ``seed``."""
    key = name.upper()
    if key not in STUDY_WORKLOADS:
        raise InvalidInputError(f"unknown workload {name!r}; expected one of A-F")
    desc, build = STUDY_WORKLOADS[key]
    w = build(seed)
    return Workload(key, desc, w.requests, w.capacity)
