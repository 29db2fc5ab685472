"""Differential tests of the range calls: prefixcache.CpuOffloadManager driven through
``set_request_keys`` and the ``*_range`` calls (what the simulator uses) against the
plain-Python reference (prefixcache.reference.offload) driven through the key calls on
the same slices of the same keys. After every call both give the same answer (or the
same error class) and pass their invariants. The reference's own range calls, counters
and KV events are checked against the core's too (the twin has the core's API)."""

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


def test_the_reference_has_the_cores_api() -> None:
    """docs/API.md: the plain-Python twin of every class has the same API; the tier's
    lacked the range calls, the counters beyond the chunks and take_kv_events."""
    core, r = prefixcache.CpuOffloadManager(2), ref.CpuOffloadManager(2)
    missing = {n for n in dir(core) if not n.startswith("_")} - set(dir(r))
    assert not missing
    from prefixcache.reference.blocks import KVCacheManager

    twin = KVCacheManager(8, block_size=4)
    twin.add_request(0, list(range(8)))
    for t in (core, r):  # the core takes its own class of manager only, and says which
        with pytest.raises(
            prefixcache.InvalidTypeError,
            match=r"must be a KVCacheManager, got prefixcache\.reference\.blocks\.KVCacheManager",
        ):
            t.set_request_keys_from(twin, 0)


@pytest.mark.parametrize("fmt", ["u64", "bytes"])
@pytest.mark.parametrize("compact", [False, True])
def test_the_references_kv_events_are_the_cores(fmt: str, compact: bool) -> None:
    """Two evictions in a row (one event each; compact merges them), stored keys, a
    failed store (no KV event): the same KV events from both."""
    tiers = [m.CpuOffloadManager(2, enable_events=True) for m in (prefixcache, ref)]
    for t in tiers:
        t.set_request_keys(0, POOL[:5], TOKENS_PER_KEY)
        assert t.prepare_store_range(0, 0, 2, True) == (2, 0)
        t.on_request_finished(0)
        t.set_request_keys(1, POOL[:5], TOKENS_PER_KEY)
        assert t.prepare_store_range(1, 2, 3) == (1, 1)
        assert t.prepare_store_range(1, 3, 4) == (1, 1)
        t.complete_store(1, [POOL[2]], False)
        assert (t.num_stored_total, t.num_evicted_total, t.num_write_pending) == (4, 2, 1)
    got, want = (kv(t.take_kv_events(fmt, compact)) for t in tiers)
    assert got == want
    assert [e[0] for e in got] == ["BlockStored"] * 2 + ["BlockRemoved"] * (1 if compact else 2)


def kv(events: list[Any]) -> list[Any]:
    """KV events comparable across the two (numpy hash arrays as lists)."""
    out = []
    for e in events:
        hashes = [int(h) if not isinstance(h, bytes) else h for h in e.block_hashes]
        out.append((type(e).__name__, type(e.block_hashes).__name__, hashes, e.medium, vars(e)))
    return [(*o[:4], {k: v for k, v in o[4].items() if k != "block_hashes"}) for o in out]


def range_call(t: Any, mgr: Any, op: str, rid: int, a: int, b: int, arg: Any) -> Any:
    """One call of the range API on tier `t` (`arg`: the keys, `complete` or
    `success`)."""
    if op == "keys":
        return t.set_request_keys(rid, arg, TOKENS_PER_KEY)
    if op == "from":
        return t.set_request_keys_from(mgr, rid)
    if op == "lookup":
        return t.lookup_prefix_range(rid, a, b)
    if op == "load":
        return t.prepare_load_range(rid, a, b)
    if op == "unload":
        return t.complete_load_range(rid, a, b)
    if op == "store":
        return t.prepare_store_range(rid, a, b, arg)
    if op == "finish":
        return t.on_request_finished(rid)
    if op == "done":  # the stores in flight end (succeeded or failed)
        return t.complete_store(rid, POOL, arg)
    return t.reset_cache()


POOL = [bytes([i]) * 8 for i in range(24)]


def counters(t: Any) -> Any:
    """A tier's counters and every key of the pool's lookup."""
    return tier_state(t, POOL, {})


@pytest.mark.parametrize("seed", range(12))
def test_the_references_range_calls_match_the_cores(seed: int) -> None:
    """The same range calls on both, with the same answers (or error class), counters
    and KV events (either hash format, compact or not) after each call."""
    rng = random.Random(seed)
    kw: dict[str, Any] = {
        "cache_policy": rng.choice(["lru", "arc"]),
        "store_threshold": rng.choice([1, 1, 2, 3]),
        "max_tracker_size": rng.choice([1, 2, 8, 64]),
        "enable_events": True,
    }
    n = rng.choice([0, 1, 3, 5, 8])
    tiers = [prefixcache.CpuOffloadManager(n, **kw), ref.CpuOffloadManager(n, **kw)]
    # Requests 0 to 2 of a block manager, sharing prefixes (request 3 is not there).
    mgr = prefixcache.KVCacheManager(64, block_size=4)
    for r in range(3):
        mgr.add_request(r, [*range(4 * 2 * r), *range(100 * r, 100 * r + 16)])
    ops = [
        "keys",
        "keys",
        "from",
        "lookup",
        "load",
        "unload",
        "store",
        "store",
        "store",
        "done",
        "finish",
    ]
    for step in range(300):
        op = "reset" if rng.random() < 0.01 else rng.choice(ops)
        rid, a, b = rng.randint(0, 3), rng.randint(0, 3), rng.randint(-1, 9)
        arg: Any = {
            # Distinct keys, now and then one repeated (a store of both is refused).
            "keys": rng.sample(POOL, rng.randint(0, 7)) + [rng.choice(POOL)] * (rng.random() < 0.1),
            "store": rng.random() < 0.8,
            "done": rng.random() < 0.7,
        }.get(op)
        got = [outcome(range_call, t, mgr, op, rid, a, b, arg) for t in tiers]
        where = (seed, step, op, rid, a, b, arg)
        assert got[0] == got[1], where
        for t in tiers:
            t.check_invariants()
        assert counters(tiers[0]) == counters(tiers[1]), where
        if rng.random() < 0.2:
            fmt, compact = rng.choice(["u64", "bytes"]), rng.random() < 0.5
            evs = [kv(t.take_kv_events(fmt, compact)) for t in tiers]
            assert evs[0] == evs[1], where
