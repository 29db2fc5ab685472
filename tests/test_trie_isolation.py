"""Blocks of different LoRA ids, cache salts or multimodal items never share anything:
no exact match, no partial match, no common block."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache import BlockTrie
from prefixcache.reference.trie import BlockTrie as RefTrie

IMPLS = [BlockTrie, RefTrie]

scope_st = st.tuples(
    st.sampled_from([None, 0, 1, 2**40]),
    st.sampled_from([None, "", "a", "b", "ab"]),
    st.sampled_from([None, ((b"x" * 32, 2, 3),), ((b"y" * 32, 2, 3),), ((b"x" * 32, 3, 3),)]),
)


def kwargs(scope: tuple[Any, ...]) -> dict[str, Any]:
    lora, salt, mm = scope
    return {"lora_id": lora, "cache_salt": salt, "mm_items": list(mm) if mm else None}


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=60, deadline=None)
@given(
    a=scope_st,
    b=scope_st,
    prompt=st.lists(st.integers(0, 3), min_size=6, max_size=20),
    tpb=st.sampled_from([1, 4]),
)
def test_different_scopes_share_no_block(
    impl: Any, a: tuple[Any, ...], b: tuple[Any, ...], prompt: list[int], tpb: int
) -> None:
    t = impl(64, tpb)
    ca = t.claim(1, prompt, **kwargs(a))
    t.store(1, prompt)
    t.release(1)
    cb = t.claim(2, prompt, **kwargs(b))
    if a[:2] != b[:2]:
        # LoRA id or salt differ: nothing at all is shared.
        assert cb.num_matched_tokens == 0
        assert not cb.partial
        assert cb.copies == []
        assert not set(ca.block_ids) & set(cb.block_ids) or t.num_free_blocks < 64
        cached = [d for d in t.dump() if d["cached"]]
        assert all((d["lora_id"], d["cache_salt"]) == a[:2] for d in cached)
    elif a[2] != b[2]:
        # Same scope, different multimodal items: at most the blocks before the first
        # block that any item touches can match.
        first = min(item[1] for items in (a[2], b[2]) if items for item in items)
        assert cb.num_matched_tokens <= (first // tpb) * tpb
    else:
        assert cb.num_matched_tokens == len(prompt) - 1


@pytest.mark.parametrize("impl", IMPLS)
def test_multimodal_blocks_never_match_partially(impl: Any) -> None:
    t = impl(32, 4)
    img = [(b"h" * 32, 4, 2)]
    p = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    t.claim(1, p, mm_items=img)
    t.store(1, p)
    t.release(1)
    # Same item, different token after it inside the block: exact miss, no partial.
    q = [1, 2, 3, 4, 5, 6, 0, 8, 9, 10]
    lk = t.lookup(q, mm_items=img)
    assert lk.num_matched_tokens == 4
    assert not lk.partial
    # Without the item the block at position 4 has another key: no partial either
    # (the stored block has multimodal keys).
    lk = t.lookup(p)
    assert lk.num_matched_tokens == 4
    assert not lk.partial


@pytest.mark.parametrize("impl", IMPLS)
def test_salt_and_lora_isolate_partial_matches(impl: Any) -> None:
    t = impl(32, 8)
    p = list(range(20))
    t.claim(1, p, cache_salt="tenant-a", lora_id=3)
    t.store(1, p)
    t.release(1)
    q = [*range(10), 99, 98, 97]
    assert t.lookup(q, cache_salt="tenant-a", lora_id=3).num_matched_tokens == 10
    for kw in ({"cache_salt": "tenant-b", "lora_id": 3}, {"cache_salt": "tenant-a"}, {}):
        lk = t.lookup(q, **kw)
        assert lk.num_matched_tokens == 0 and not lk.partial
