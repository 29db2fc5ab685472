"""The offline optimum (``opt``) against brute force, and as a bound.

Under the request-sequence model Belady's rule (evict the block whose next hittable use
is farthest, deeper first on ties; a block a request brings again outside its hittable
prefix, at no cost, is not needed until then) is exactly optimal among prefix-closed
caches (a block kept only with its parent, as the lab's cache keeps them). The brute
force below knows nothing of Belady: after each request it tries every subset of the
cached and new blocks that fits the budget (every prefix-closed one, or *every* one) and
keeps the best total over the rest of the sequence.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.sim.policies.lab import LabPolicy
from prefixcache.sim.replay import replay, summarize
from prefixcache.sim.requests import Request
from prefixcache.sim.sequence import SequenceScheduler


def make_requests(prompts: list[list[int]]) -> list[Request]:
    return [
        Request(i, np.array(p, dtype=np.uint32), np.zeros(0, dtype=np.uint32))
        for i, p in enumerate(prompts)
    ]


def brute_force_hits(
    prompts: list[list[int]], block: int, cap_blocks: int, closed: bool = False
) -> int:
    """The most hit tokens any cache of ``cap_blocks`` blocks can get, by search
    (``closed``: any prefix-closed one, which keeps a block only with its parent)."""

    # A block is identified by the whole prefix up to its end (chained keys).
    def blocks(p: list[int]) -> list[tuple[int, ...]]:
        return [tuple(p[: (i + 1) * block]) for i in range(len(p) // block)]

    seq = [(blocks(p), (len(p) - 1) // block) for p in prompts]

    @cache
    def best(t: int, cached: frozenset[tuple[int, ...]]) -> int:
        if t == len(seq):
            return 0
        keys, hittable = seq[t]
        hit = 0
        while hit < hittable and keys[hit] in cached:
            hit += 1
        pool = sorted(cached | set(keys))
        out = 0
        n = len(pool)
        for mask in range(1 << n):
            if bin(mask).count("1") > cap_blocks:
                continue
            keep = frozenset(pool[i] for i in range(n) if mask >> i & 1)
            if closed and any(len(k) > block and k[:-block] not in keep for k in keep):
                continue
            out = max(out, best(t + 1, keep))
        return hit * block + out

    return best(0, frozenset())


def opt_hits(prompts: list[list[int]], block: int, cap_blocks: int) -> int:
    reqs = make_requests(prompts)
    pol = LabPolicy(cap_blocks * block, rule="opt", block_size=block, name="opt")
    res = replay(reqs, [pol], scheduler=SequenceScheduler(), check=True)[0]
    return int(summarize(res)["hit_tokens"])


HAND_MADE = [
    # (prompts, block, capacity in blocks, optimum in tokens)
    # LRU keeps b (most recent) and loses a, which comes back first.
    ([[1, 2], [3, 4], [1, 2, 9], [3, 4, 9]], 2, 1, 2),
    # A shared root: keep it, bypass the one-off tails.
    ([[0, 0, 1, 1, 5], [0, 0, 2, 2, 5], [0, 0, 3, 3, 5], [0, 0, 1, 1, 6]], 2, 2, 8),
    # Scan resistance: a long one-off prompt must not flush the hot prefix.
    ([[7, 7, 7], [1, 2, 3, 4, 5, 6, 8], [7, 7, 7, 1]], 1, 3, 3),
    # Nothing fits: budget 0.
    ([[1, 2, 3], [1, 2, 3]], 1, 0, 0),
    # [1] comes back at no cost (request 4 brings it, unhittable: its last token) before
    # it is needed (request 5): keep [2] for request 6 instead.
    ([[2], [1], [3], [3, 9], [1], [1, 9], [2, 9]], 1, 2, 3),
]

# Better than any prefix-closed cache: keep [0, 1] without its parent [0], which request
# 3 brings back at no cost, and [2] for request 2 (the optimum, 3; opt, prefix-closed: 2).
NOT_PREFIX_CLOSED = ([[0, 1, 2], [2], [2, 0], [0], [0, 1, 0]], 1, 2)


@pytest.mark.parametrize(("prompts", "block", "cap", "expected"), HAND_MADE)
def test_opt_on_hand_made_sequences(
    prompts: list[list[int]], block: int, cap: int, expected: int
) -> None:
    assert brute_force_hits(prompts, block, cap) == expected
    assert opt_hits(prompts, block, cap) == expected


prompt_st = st.lists(st.integers(0, 2), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(prompt_st, min_size=1, max_size=6),
    cap=st.integers(0, 3),
    block=st.sampled_from([1, 2]),
)
def test_opt_equals_brute_force(prompts: list[list[int]], cap: int, block: int) -> None:
    got = opt_hits(prompts, block, cap)
    assert got == brute_force_hits(prompts, block, cap, closed=True)
    assert got <= brute_force_hits(prompts, block, cap)


def test_a_cache_keeping_a_block_without_its_parent_can_beat_opt() -> None:
    """What docs/LAB.md says opt is not optimal for: a cache that is not prefix-closed."""
    prompts, block, cap = NOT_PREFIX_CLOSED
    assert brute_force_hits(prompts, block, cap) == 3
    assert opt_hits(prompts, block, cap) == brute_force_hits(prompts, block, cap, closed=True) == 2


@settings(max_examples=30, deadline=None)
@given(prompts=st.lists(prompt_st, min_size=1, max_size=8), cap=st.integers(0, 4))
def test_opt_bounds_every_online_policy(prompts: list[list[int]], cap: int) -> None:
    reqs = make_requests(prompts)
    names = [
        "opt@1",
        "lab-lru@1",
        "lab-slru@1",
        "lab-lfu@1",
        "lab-cost@1",
        "lab-2q@1",
        "lab-session@1",
        "lab-density@1",
        "lab-lru-admit2@1",
    ]
    res = replay(reqs, names, cap, model="sequence", check=True)
    hits = {r.policy: summarize(r)["hit_tokens"] for r in res}
    assert all(hits["opt@1"] >= h for h in hits.values()), hits


@pytest.mark.parametrize("rid", [3, 2**32, 2**63, 2**64 - 1])
def test_opt_request_past_the_sequence_has_no_future(rid: int) -> None:
    """A request id the future does not cover (up to the largest id the binding takes)
    sees no next use: its blocks go first, and the cache stays usable."""
    from prefixcache._core import LabCache

    c = LabCache(4, "opt")
    c.set_future(
        np.array([7], dtype=np.uint64),
        np.array([0, 1], dtype=np.uint64),
        np.array([1], dtype=np.uint32),
    )
    assert c.acquire(rid, np.array([7], dtype=np.uint64), 1, 1) == 0
    assert c.num_used == 1
    c.check_invariants()


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("keys", np.array([7], dtype=np.int64)),
        ("offsets", [0, 1]),
        ("hittable", np.array([1], dtype=np.uint64)),
    ],
)
def test_opt_future_of_the_wrong_type_names_the_argument(arg: str, value: object) -> None:
    from prefixcache._core import LabCache
    from prefixcache.errors import InvalidTypeError

    args = {
        "keys": np.array([7], dtype=np.uint64),
        "offsets": np.array([0, 1], dtype=np.uint64),
        "hittable": np.array([1], dtype=np.uint32),
    }
    args[arg] = value
    with pytest.raises(InvalidTypeError, match=f"^{arg} must be a 1-D numpy"):
        LabCache(4, "opt").set_future(args["keys"], args["offsets"], args["hittable"])
