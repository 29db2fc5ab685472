"""Partial matching of the last block at 1, 31, 32 and 1000 children (TensorRT-LLM's
Python v2 manager gives up at >= 32; the core indexes the children instead)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from prefixcache import BlockTrie
from prefixcache.reference.trie import BlockTrie as RefTrie

TPB = 16
SHARED = list(range(10_000, 10_000 + TPB))  # one full shared block


def build(impl: Any, n: int, seed: int, *, copy: bool = True) -> tuple[Any, list[list[int]]]:
    """n children under the shared block, each a distinct full block; all released at the
    end (held while building, so that no later prompt takes an earlier leaf over)."""
    rng = random.Random(seed)
    t = impl(n * 3 + 16, TPB, True, copy)
    tails: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    while len(tails) < n:
        tail = [rng.randrange(4) for _ in range(TPB)]
        if tuple(tail) in seen:
            continue
        seen.add(tuple(tail))
        tails.append(tail)
    for i, tail in enumerate(tails):
        prompt = SHARED + tail + [7]
        t.claim(i, prompt)
        t.complete(i)
        t.store(i, prompt)
    for i in range(n):
        t.release(i)
    assert t.num_cached_blocks == n + 1
    return t, tails


def brute_best(tails: list[list[int]], q: list[int]) -> tuple[int, list[int]] | None:
    best: tuple[int, list[int]] | None = None
    for tail in tails:
        n = 0
        while n < len(q) and tail[n] == q[n]:
            n += 1
        if n and (best is None or n > best[0] or (n == best[0] and tail < best[1])):
            best = (n, tail)
    return best


@pytest.mark.parametrize("n", [1, 31, 32, 1000])
def test_longest_common_prefix_wins_at_any_fan_out(n: int) -> None:
    core, tails = build(BlockTrie, n, seed=n)
    ref, _ = build(RefTrie, n, seed=n)
    blocks = {tuple(d["tokens"]): d["block_id"] for d in core.dump() if d["cached"]}
    rng = random.Random(n + 1)
    for _ in range(40):
        base = rng.choice(tails)
        k = rng.randrange(TPB)
        q_tail = base[:k] + [rng.randrange(4) for _ in range(TPB - k)]
        prompt = SHARED + q_tail + [5]
        a = core.lookup(prompt)
        b = ref.lookup(prompt)
        assert (a.num_matched_tokens, a.partial_tokens, a.partial_block, a.partial_kind) == (
            b.num_matched_tokens,
            b.partial_tokens,
            b.partial_block,
            b.partial_kind,
        )
        best = brute_best(tails, q_tail)
        if tuple(q_tail) in blocks:
            assert a.num_matched_tokens == 2 * TPB and not a.partial
        elif best is None:
            assert a.num_matched_tokens == TPB and not a.partial
        else:
            assert a.partial_tokens == best[0]
            assert a.partial_block == blocks[tuple(best[1])]
            assert a.num_matched_tokens == TPB + best[0]
            assert a.partial_kind == "taken_over"  # unreferenced leaves


@pytest.mark.parametrize("n", [1, 31, 32, 1000])
def test_claim_copies_a_referenced_match_and_takes_over_a_free_leaf(n: int) -> None:
    for impl in (BlockTrie, RefTrie):
        t, tails = build(impl, n, seed=3 * n)
        target = tails[n // 2]
        prompt = SHARED + target[: TPB // 2] + [99] * (TPB // 2) + [1]
        holder = t.claim(10_000, SHARED + target + [1])  # references the target leaf
        c = t.claim(10_001, prompt)
        assert c.partial_kind == "copied"
        assert c.partial_block == holder.block_ids[1]
        assert c.copies == [(holder.block_ids[1], c.block_ids[1], c.partial_tokens)]
        assert c.partial_tokens >= TPB // 2
        assert t.complete(10_001) == 1
        t.release(10_001)
        t.release(10_000)
        c = t.claim(10_002, prompt)
        assert c.partial_kind == "taken_over"
        assert c.block_ids[1] == holder.block_ids[1]
        assert c.copies == []
        t.check_invariants()


@pytest.mark.parametrize("n", [1, 32, 1000])
def test_without_copy_on_partial_reuse_only_free_leaves_are_candidates(n: int) -> None:
    for impl in (BlockTrie, RefTrie):
        t, tails = build(impl, n, seed=5 * n, copy=False)
        target = tails[0]
        t.claim(20_000, SHARED + target + [1])  # target now referenced
        q = SHARED + target[:-1] + [(target[-1] + 1) % 4] + [2]
        lk = t.lookup(q)
        # The referenced best match is skipped; another (free) child may match less.
        others = [x for x in tails if x != target]
        best = brute_best(others, q[TPB : 2 * TPB])
        if best is None:
            assert not lk.partial
        else:
            assert lk.partial_tokens == best[0]
            assert lk.partial_kind == "taken_over"
        t.check_invariants()
