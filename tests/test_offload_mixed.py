"""Differential tests of range calls and key calls mixed on the same requests:
prefixcache.CpuOffloadManager driven through both ``set_request_keys`` with the
``*_range`` calls and the explicit key-list calls (``set_offload_key_positions``,
``prepare_store``, ``prepare_load``, ...), against the plain-Python reference
(prefixcache.reference.offload) driven through the key calls on the same keys. The
requests draw their keys from one small pool, so that keys collide across requests
(one request loads or stores what another stored) and repeat within a request.

After every step both give the same answer (or the same error class), pass their
invariants and show the same state: counters, every key's lookup, every request's
range lookup. Their events are the same whenever they are taken (now and then, and at
the end). Steps are drawn by a seeded generator (long runs) and by hypothesis (short
runs, shrunk on failure)."""

from __future__ import annotations

import random
from typing import Any, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prefixcache
from prefixcache.reference import offload as ref

KEYS = [bytes([i]) * 8 for i in range(16)]
TOKENS_PER_KEY = 16
REQUESTS = 4
T = TypeVar("T")


class Draw(Protocol):
    """Where a step's choices come from: a seeded generator or hypothesis."""

    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, items: list[T]) -> T: ...


class SeededDraw:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, items: list[T]) -> T:
        return self.rng.choice(items)


class HypothesisDraw:
    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def choice(self, items: list[T]) -> T:
        return self.data.draw(st.sampled_from(items))


def outcome(f: Any, *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", f(*args))
    except prefixcache.PrefixCacheError as e:
        return ("err", type(e).__name__)


def store_output(out: Any) -> Any:
    if out is None:
        return None
    return (list(out.keys_to_store), list(out.chunk_ids), list(out.evicted_keys))


class Pair:
    """The core and the reference side by side, with what the test knows of them: each
    request's keys in block order (what the core's range calls slice), the loads in
    flight and the stores not completed."""

    def __init__(self, num_chunks: int, **kw: Any) -> None:
        self.core = prefixcache.CpuOffloadManager(num_chunks, **kw)
        self.ref = ref.CpuOffloadManager(num_chunks, **kw)
        self.order: dict[int, list[bytes]] = {}
        self.loads: list[tuple[int, list[bytes]]] = []
        self.stores: list[tuple[int, list[bytes]]] = []

    def keys(self, rid: int, a: int, b: int) -> list[bytes]:
        return self.order.get(rid, [])[a:b]

    def ref_load_range(self, rid: int, ks: list[bytes]) -> int:
        return len(self.ref.prepare_load(rid, ks))

    def ref_store_range(self, rid: int, ks: list[bytes], complete: bool) -> Any:
        """The reference's prepare_store (then complete_store), answered as the range
        call answers."""
        out = self.ref.prepare_store(rid, ks)
        if out is None:
            return None
        if complete and out.keys_to_store:
            self.ref.complete_store(rid, out.keys_to_store)
        return (len(out.keys_to_store), len(out.evicted_keys))

    def state(self, m: Any, ranged: bool) -> Any:
        """Everything observable of one side; ``ranged``: the core (its range lookups),
        else the reference (the same lookups over the slices)."""
        ranges = {
            rid: (m.lookup_prefix_range(rid, 0, len(ks) + 1) if ranged else m.lookup_prefix(ks))
            for rid, ks in sorted(self.order.items())
        }
        tracked = m.num_tracked if ranged else len(m.counts or ())
        pending = m.num_write_pending if ranged else m.num_pending
        return (
            m.num_stored,
            m.num_free_chunks,
            m.num_idle,
            pending,
            tracked,
            [m.lookup(k) for k in KEYS],
            ranges,
        )

    def events(self, where: Any) -> None:
        """Both sides' events since the last call, the same."""
        got, want = (
            [(list(e.keys), e.removed, e.metadata_only) for e in m.take_events()]
            for m in (self.core, self.ref)
        )
        assert got == want, where

    def check(self, where: Any) -> None:
        self.core.check_invariants()
        self.ref.check_invariants()
        got, want = self.state(self.core, True), self.state(self.ref, False)
        assert got == want, where

    def life(self, d: Draw, rid: int, ks: list[bytes]) -> tuple[Any, ...]:
        """A request's life as the connector runs it: its keys, a lookup, a load of the
        hit prefix, a store of the rest, the load completed, the request finished; each
        call through the range or the key form, drawn."""
        c, r = self.core, self.ref
        steps: list[Any] = []

        def same(what: str, got: Any, want: Any) -> Any:
            steps.append(what)
            assert got == want, (rid, steps, got, want)
            return want[1] if want[0] == "ok" else None

        ends = [TOKENS_PER_KEY * (i + 1) for i in range(len(ks))]
        same(
            "keys",
            outcome(c.set_request_keys, rid, ks, TOKENS_PER_KEY),
            outcome(r.set_offload_key_positions, rid, ks, ends),
        )
        self.order[rid] = ks
        hit = same(
            "lookup", outcome(c.lookup_prefix_range, rid, 0, len(ks)), outcome(r.lookup_prefix, ks)
        )
        loaded = False
        if hit:
            if d.integer(0, 1) == 0:
                got = outcome(c.prepare_load_range, rid, 0, hit)
                want = outcome(self.ref_load_range, rid, ks[:hit])
                loaded = same("load_range", got, want) is not None
            else:
                got, want = (
                    outcome(c.prepare_load, rid, ks[:hit]),
                    outcome(r.prepare_load, rid, ks[:hit]),
                )
                loaded = same("load_keys", got, want) is not None
        start = hit or 0
        if d.integer(0, 1) == 0:
            got = outcome(c.prepare_store_range, rid, start, len(ks), True)
            same("store_range", got, outcome(self.ref_store_range, rid, ks[start:], True))
        else:
            want = outcome(lambda: store_output(r.prepare_store(rid, ks[start:])))
            got = outcome(lambda: store_output(c.prepare_store(rid, ks[start:])))
            out = same("store_keys", got, want)
            if out is not None and out[0]:
                same(
                    "complete_store",
                    outcome(c.complete_store, rid, out[0]),
                    outcome(r.complete_store, rid, out[0]),
                )
        if loaded and d.integer(0, 3) != 0:
            if d.integer(0, 1) == 0:
                got = outcome(c.complete_load_range, rid, 0, hit)
                same("complete_load_range", got, outcome(r.complete_load, rid, ks[:hit]))
            else:
                got = outcome(c.complete_load, rid, ks[:hit])
                same("complete_load_keys", got, outcome(r.complete_load, rid, ks[:hit]))
        elif loaded:
            self.loads.append((rid, ks[:hit]))
        if d.integer(0, 3) != 0:
            same("finish", outcome(c.on_request_finished, rid), outcome(r.on_request_finished, rid))
            self.order.pop(rid, None)
        return ("life", rid, steps)

    def step(self, d: Draw) -> tuple[Any, ...]:
        """One call on both sides, drawn from `d`; asserts the same outcome. Returns what
        was called, for messages."""
        c, r = self.core, self.ref
        rid = d.integer(0, REQUESTS - 1)
        # A slice of the request's keys, now and then an empty or reversed one.
        a = d.integer(0, 4) if d.integer(0, 2) == 0 else 0
        b = max(0, a + d.integer(-2, 7))
        op = d.choice(
            [
                *["set_request_keys"] * 3,
                "positions",
                "lookup_range",
                "lookup_keys",
                *["load_range"] * 2,
                "load_keys",
                *["complete_load_range"] * 2,
                *["complete_load_keys"] * 2,
                *["store_range"] * 4,
                *["store_keys"] * 2,
                *["complete_store"] * 2,
                "touch",
                "finish",
                "new_request",
                "reset",
                "events",
                *["life"] * 3,
            ]
        )

        def some_keys(distinct: bool, most: int = 5) -> list[bytes]:
            """Keys from the pool, or a slice of some request's keys (and so shared
            with it), now and then none."""
            n = d.integer(0, most) if d.integer(0, 4) == 0 else d.integer(1, most)
            own = self.order.get(d.integer(0, REQUESTS - 1), [])
            if own and d.integer(0, 2) == 0:
                ks = own[a : a + n] + [d.choice(KEYS) for _ in range(d.integer(0, 1))]
            else:
                ks = [d.choice(KEYS) for _ in range(n)]
            return list(dict.fromkeys(ks)) if distinct else ks

        if op == "set_request_keys":
            # Keys may repeat within a request (a repeated key keeps its last position).
            ks = some_keys(distinct=d.integer(0, 1) == 0, most=9)
            ends = [TOKENS_PER_KEY * (i + 1) for i in range(len(ks))]
            got = outcome(c.set_request_keys, rid, ks, TOKENS_PER_KEY)
            want = outcome(r.set_offload_key_positions, rid, ks, ends)
            if want[0] == "ok":
                self.order[rid] = ks
        elif op == "positions":
            # Positions set by hand, over (or beside) the range keys' own.
            ks = some_keys(distinct=False)
            ends = [d.integer(0, 200) for _ in ks]
            if ks and d.integer(0, 5) == 0:
                ends.append(1)  # one end token too many: refused by both
            got = outcome(c.set_offload_key_positions, rid, ks, ends)
            want = outcome(r.set_offload_key_positions, rid, ks, ends)
        elif op == "lookup_range":
            got = ("ok", c.lookup_prefix_range(rid, a, b))
            want = ("ok", r.lookup_prefix(self.keys(rid, a, b)))
        elif op == "lookup_keys":
            ks = some_keys(distinct=False)
            got, want = outcome(c.lookup_prefix, ks), outcome(r.lookup_prefix, ks)
        elif op == "load_range":
            # Half the time the longest loadable prefix, else any slice (may be refused).
            ks = self.keys(rid, a, b)
            if d.integer(0, 1) == 0:
                b = a + (r.lookup_prefix(ks) or 0)
                ks = self.keys(rid, a, b)
            got = outcome(c.prepare_load_range, rid, a, b)
            want = outcome(self.ref_load_range, rid, ks)
            if want[0] == "ok" and ks:
                self.loads.append((rid, ks))
        elif op == "load_keys":
            ks = some_keys(distinct=False)
            if d.integer(0, 1) == 0:
                ks = ks[: r.lookup_prefix(ks) or 0]
            got, want = outcome(c.prepare_load, rid, ks), outcome(r.prepare_load, rid, ks)
            if want[0] == "ok" and ks:
                self.loads.append((rid, ks))
        elif op == "complete_load_range":
            # A load in flight when the request's keys still name it, else any slice.
            ks = self.keys(rid, a, b)
            for i, (lrid, lks) in enumerate(self.loads):
                order = self.order.get(lrid, [])
                for s in range(len(order)):
                    if order[s : s + len(lks)] == lks:
                        rid, a, b, ks = lrid, s, s + len(lks), lks
                        self.loads.pop(i)
                        break
                else:
                    continue
                break
            got = outcome(c.complete_load_range, rid, a, b)
            want = outcome(r.complete_load, rid, ks)
        elif op == "complete_load_keys":
            if self.loads and d.integer(0, 3) != 0:
                rid, ks = self.loads.pop(d.integer(0, len(self.loads) - 1))
                if d.integer(0, 3) == 0:
                    ks = ks + ks[:1]  # a key listed twice: two loads of it released
            else:
                ks = some_keys(distinct=False)
            got, want = outcome(c.complete_load, rid, ks), outcome(r.complete_load, rid, ks)
        elif op == "store_range":
            complete = d.integer(0, 2) != 0
            ks = self.keys(rid, a, b)
            before = {k: r.lookup(k) for k in ks}
            got = outcome(c.prepare_store_range, rid, a, b, complete)
            want = outcome(self.ref_store_range, rid, ks, complete)
            if want[0] == "ok" and want[1] is not None and not complete:
                new = [k for k in ks if before[k] == "MISS" and r.lookup(k) == "HIT_PENDING"]
                if new:
                    self.stores.append((rid, new))
        elif op == "store_keys":
            ks = some_keys(distinct=d.integer(0, 5) != 0)  # sometimes a repeat: refused
            got = outcome(lambda: store_output(c.prepare_store(rid, ks)))
            want = outcome(lambda: store_output(r.prepare_store(rid, ks)))
            if want[0] == "ok" and want[1] is not None and want[1][0]:
                self.stores.append((rid, want[1][0]))
        elif op == "complete_store":
            success = d.integer(0, 3) != 0
            if self.stores and d.integer(0, 3) != 0:
                rid, ks = self.stores.pop(d.integer(0, len(self.stores) - 1))
            else:
                ks = some_keys(distinct=False)
            got = outcome(c.complete_store, rid, ks, success)
            want = outcome(r.complete_store, rid, ks, success)
        elif op == "touch":
            ks = some_keys(distinct=False)
            got, want = outcome(c.touch, rid, ks), outcome(r.touch, rid, ks)
        elif op == "finish":
            got = outcome(c.on_request_finished, rid)
            want = outcome(r.on_request_finished, rid)
            self.order.pop(rid, None)  # the context, its keys with it, is dropped
        elif op == "life":
            return self.life(d, rid, some_keys(distinct=d.integer(0, 3) != 0, most=9))
        elif op == "events":
            # Taken now and then, not after every step: a failed store's release event
            # drops the keys stored again before it is taken.
            self.events((op, rid))
            return (op,)
        elif op == "new_request":
            got, want = outcome(c.on_new_request, rid), outcome(r.on_new_request, rid)
        else:  # reset, rarely: key positions and block order stay
            if d.integer(0, 7) != 0:
                return (op, "skipped")
            got, want = outcome(c.reset_cache), outcome(r.reset_cache)
            self.loads.clear()
            self.stores.clear()
        call = (op, rid, a, b)
        assert got == want, (call, got, want)
        return call


def run(d: Draw, steps: int) -> None:
    policy = d.choice(["lru", "arc"])
    threshold = d.integer(1, 3)
    pair = Pair(
        d.choice([0, 1, 2, 3, 4, 5, 6, 8]),
        cache_policy=policy,
        store_threshold=threshold,
        max_tracker_size=d.choice([1, 2, 3, 8, 64]),
        enable_events=True,
    )
    history: list[Any] = []
    for _ in range(steps):
        history.append(pair.step(d))
        pair.check(history[-8:])
    pair.events(history[-8:])


@pytest.mark.parametrize("seed", range(24))
def test_mixed_calls_match_the_reference_seeded(seed: int) -> None:
    run(SeededDraw(seed), 400)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_mixed_calls_match_the_reference(data: st.DataObject) -> None:
    d = HypothesisDraw(data)
    run(d, d.integer(1, 60))
