"""Differential tests of the range calls: prefixcache.CpuOffloadManager driven through
``set_request_keys`` and the ``*_range`` calls (what the simulator uses) against the
plain-Python reference (prefixcache.reference.offload) driven through the key calls on
the same slices of the same keys. After every call both give the same answer (or the
same error class) and pass their invariants."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prefixcache
from prefixcache.reference import offload as ref

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

KEYS = [bytes([i]) * 8 for i in range(12)]
TOKENS_PER_KEY = 16


def outcome(f: Any, *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", f(*args))
    except prefixcache.PrefixCacheError as e:
        return ("err", type(e).__name__)


def check(core: Any, r: Any) -> None:
    core.check_invariants()
    r.check_invariants()
    assert core.num_stored == r.num_stored
    assert core.num_free_chunks == r.num_free_chunks
    assert core.num_idle == r.num_idle


def ref_load(r: Any, rid: int, keys: list[bytes]) -> int:
    return len(r.prepare_load(rid, keys))


def ref_store(r: Any, rid: int, keys: list[bytes], complete: bool) -> tuple[int, int] | None:
    """The reference's prepare_store (then complete_store), answered as the range call."""
    out = r.prepare_store(rid, keys)
    if out is None:
        return None
    if complete and out.keys_to_store:
        r.complete_store(rid, out.keys_to_store)
    return (len(out.keys_to_store), len(out.evicted_keys))


def events(x: Any) -> list[Any]:
    return [(list(e.keys), e.removed, e.metadata_only) for e in x.take_events()]


@SETTINGS
@given(
    policy=st.sampled_from(["lru", "arc"]),
    threshold=st.integers(1, 2),
    num_chunks=st.integers(0, 10),
    data=st.data(),
)
def test_range_calls_match_the_key_calls_of_the_reference(
    policy: str, threshold: int, num_chunks: int, data: st.DataObject
) -> None:
    kw: dict[str, Any] = dict(
        cache_policy=policy, store_threshold=threshold, max_tracker_size=8, enable_events=True
    )
    core = prefixcache.CpuOffloadManager(num_chunks, **kw)
    r = ref.CpuOffloadManager(num_chunks, **kw)
    order: dict[int, list[bytes]] = {}  # each request's keys in block order
    loads: list[tuple[int, int, int]] = []
    span = st.integers(0, 10)
    for _ in range(data.draw(st.integers(1, 50))):
        rid = data.draw(st.integers(0, 3))
        op = data.draw(
            st.sampled_from(["keys", "lookup", "load", "complete_load", "store", "finish"])
        )
        ks = order.get(rid, [])
        a, b = data.draw(span), data.draw(span)
        if op == "keys":
            # Keys may repeat: a repeated key has one position, its last.
            new = data.draw(st.lists(st.sampled_from(KEYS), max_size=10))
            core.set_request_keys(rid, new, TOKENS_PER_KEY)
            r.set_offload_key_positions(
                rid, new, [TOKENS_PER_KEY * (i + 1) for i in range(len(new))]
            )
            order[rid] = new
        elif op == "lookup":
            assert core.lookup_prefix_range(rid, a, b) == r.lookup_prefix(ks[a:b])
        elif op == "load":
            n = r.lookup_prefix(ks[a:b]) or 0
            got = outcome(core.prepare_load_range, rid, a, a + n)
            want = outcome(ref_load, r, rid, ks[a : a + n])
            assert got == want
            if want[0] == "ok" and n:
                loads.append((rid, a, a + n))
        elif op == "complete_load" and loads:
            rid2, lo, hi = loads.pop(data.draw(st.integers(0, len(loads) - 1)))
            got = outcome(core.complete_load_range, rid2, lo, hi)
            want = outcome(r.complete_load, rid2, order.get(rid2, [])[lo:hi])
            assert got == want
        elif op == "store":
            complete = data.draw(st.booleans())
            got = outcome(core.prepare_store_range, rid, a, b, complete)
            assert got == outcome(ref_store, r, rid, ks[a:b], complete)
        elif op == "finish":
            core.on_request_finished(rid)
            r.on_request_finished(rid)
            order.pop(rid, None)  # the context (and its keys) is dropped
        check(core, r)
        assert events(core) == events(r)
