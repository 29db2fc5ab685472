"""Differential tests of the range calls: prefixcache.CpuOffloadManager driven through
``set_request_keys`` and the ``*_range`` calls (what the simulator uses) against the
plain-Python reference (prefixcache.reference.offload) driven through the key calls on
the same slices of the same keys. After every call both give the same answer (or the
same error class) and pass their invariants."""

from __future__ import annotations

import random
from typing import Any

import pytest
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


def tier_state(t: Any, keys: list[bytes], order: dict[int, int]) -> Any:
    """A tier's counters, every key's lookup and every request's range lookup."""
    return (
        t.num_stored,
        t.num_free_chunks,
        t.num_idle,
        t.num_write_pending,
        t.num_tracked,
        t.num_stored_total,
        t.num_evicted_total,
        [t.lookup(k) for k in keys],
        {rid: t.lookup_prefix_range(rid, 0, n + 1) for rid, n in sorted(order.items())},
    )


@pytest.mark.parametrize("seed", range(40))
def test_keys_from_a_manager_equal_the_same_keys_given(seed: int) -> None:
    """set_request_keys_from(manager, rid) and set_request_keys(rid, its full blocks'
    hashes, its block size) leave two tiers in the same state: the same answers to the
    same range calls, the same events, counters and lookups, as the request grows by
    appended tokens, requests share prompt prefixes and keys get end tokens by hand
    (which order them among the others only if both set the same end tokens). A request
    the manager does not know is refused and changes nothing."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    mgr = prefixcache.KVCacheManager(4096, block_size=block_size)
    kw: dict[str, Any] = dict(
        cache_policy=rng.choice(["lru", "arc"]),
        store_threshold=rng.choice([1, 2]),
        max_tracker_size=64,
        enable_events=True,
    )
    num_chunks = rng.choice([2, 4, 8])
    given_keys = prefixcache.CpuOffloadManager(num_chunks, **kw)
    from_mgr = prefixcache.CpuOffloadManager(num_chunks, **kw)
    prefixes = [[rng.randrange(50) for _ in range(3 * block_size)] for _ in range(3)]
    known: set[bytes] = set()
    order: dict[int, int] = {}  # each request's number of keys
    for step in range(300):
        op = rng.randrange(11)
        rid = rng.randrange(6)
        if op == 0 and rid not in mgr:
            prompt = rng.choice(prefixes)[: rng.randrange(3 * block_size + 1)]
            mgr.add_request(rid, prompt + [rng.randrange(50) for _ in range(rng.randrange(1, 20))])
        elif op == 1 and rid in mgr:
            mgr.append_tokens(rid, [rng.randrange(50) for _ in range(rng.randrange(10))])
        if op <= 2:
            if rid not in mgr:
                continue
            keys = mgr.block_hashes(rid)
            known.update(keys)
            given_keys.set_request_keys(rid, keys, block_size)
            from_mgr.set_request_keys_from(mgr, rid)
            order[rid] = len(keys)
        elif op == 3 and rid not in mgr:
            # A request the manager does not know: refused, nothing changed.
            with pytest.raises(prefixcache.UnknownRequestError):
                from_mgr.set_request_keys_from(mgr, rid)
        else:
            a = rng.randrange(3) if rng.random() < 0.5 else 0
            b = max(0, a + rng.randrange(-1, 12))
            hit = given_keys.lookup_prefix_range(rid, a, b) or 0
            name, args = {
                3: ("on_request_finished", (rid,)),
                4: ("prepare_store_range", (rid, a, b, rng.random() < 0.7)),
                5: ("prepare_store_range", (rid, a + hit, b, rng.random() < 0.7)),
                6: ("prepare_load_range", (rid, a, a + hit)),
                7: ("complete_load_range", (rid, a, b)),
                8: ("lookup_prefix_range", (rid, a, b)),
                9: ("on_request_finished", (rid,)),
                10: ("reset_cache", ()),
            }[op]
            if op == 8 and order.get(rid):
                # A key's end token given by hand, in tokens: it sorts among the
                # request's keys only if their end tokens are the true ones.
                j = rng.randrange(order[rid])
                end = rng.randrange((order[rid] + 1) * block_size)
                name, args = ("set_offload_key_positions", (rid, [mgr.block_hashes(rid)[j]], [end]))
            if name == "reset_cache" and rng.random() < 0.8:
                continue
            got = [outcome(getattr(t, name), *args) for t in (given_keys, from_mgr)]
            assert got[0] == got[1], (step, name, args, got)
            if name == "on_request_finished":
                order.pop(rid, None)
                if rid in mgr:
                    mgr.free(rid)
        for t in (given_keys, from_mgr):
            t.check_invariants()
        keys = sorted(known)
        assert tier_state(given_keys, keys, order) == tier_state(from_mgr, keys, order), step
        assert events(given_keys) == events(from_mgr), step
