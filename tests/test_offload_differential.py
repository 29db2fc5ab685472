"""Differential tests: prefixcache.CpuOffloadManager (Rust core) against the plain-Python
reference (prefixcache.reference.offload) on random call streams, LRU and ARC, store
thresholds 1 to 3. After every call both give the same answer (or the same error class)
and both pass their invariants."""

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

KEYS = [bytes([i]) * 8 for i in range(14)]


def norm(op: str, x: Any) -> Any:
    if op == "prepare_store" and x is not None:
        return (list(x.keys_to_store), list(x.chunk_ids), list(x.evicted_keys))
    if op == "take_events":
        return [(list(e.keys), e.removed, e.medium, e.metadata_only) for e in x]
    return x


def both(core: Any, r: Any, op: str, *args: Any) -> Any:
    outcomes = []
    for obj in (core, r):
        try:
            outcomes.append(("ok", norm(op, getattr(obj, op)(*args))))
        except prefixcache.PrefixCacheError as e:
            outcomes.append(("err", type(e).__name__))
    assert outcomes[0] == outcomes[1], (op, args, outcomes)
    core.check_invariants()
    r.check_invariants()
    assert core.num_stored == r.num_stored
    assert core.num_free_chunks == r.num_free_chunks
    return outcomes[0][1] if outcomes[0][0] == "ok" else None


key_runs = st.lists(st.sampled_from(KEYS), max_size=8)


@SETTINGS
@given(
    policy=st.sampled_from(["lru", "arc"]),
    threshold=st.integers(1, 3),
    num_chunks=st.integers(0, 10),
    tracker=st.integers(1, 12),
    data=st.data(),
)
def test_core_matches_reference(
    policy: str, threshold: int, num_chunks: int, tracker: int, data: st.DataObject
) -> None:
    kw = dict(
        cache_policy=policy,
        store_threshold=threshold,
        max_tracker_size=tracker,
        enable_events=True,
    )
    core = prefixcache.CpuOffloadManager(num_chunks, **kw)
    r = ref.CpuOffloadManager(num_chunks, **kw)  # type: ignore[arg-type]
    loads: list[tuple[int, list[bytes]]] = []
    stores: list[tuple[int, list[bytes]]] = []
    for _ in range(data.draw(st.integers(1, 60))):
        rid = data.draw(st.integers(0, 4))
        op = data.draw(
            st.sampled_from(
                [
                    "positions",
                    "lookup",
                    "lookup_prefix",
                    "load",
                    "complete_load",
                    "store",
                    "complete_store",
                    "touch",
                    "finish",
                    "events",
                    "reset",
                    "bad_load",
                ]
            )
        )
        if op == "positions":
            ks = data.draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=8))
            both(
                core,
                r,
                "set_offload_key_positions",
                rid,
                ks,
                [16 * (i + 1) for i in range(len(ks))],
            )
        elif op == "lookup":
            both(core, r, "lookup", data.draw(st.sampled_from(KEYS)))
        elif op == "lookup_prefix":
            both(core, r, "lookup_prefix", data.draw(key_runs))
        elif op == "load":
            ks = data.draw(key_runs)
            n = both(core, r, "lookup_prefix", ks)
            if n:
                both(core, r, "prepare_load", rid, ks[:n])
                loads.append((rid, ks[:n]))
        elif op == "complete_load" and loads:
            i = data.draw(st.integers(0, len(loads) - 1))
            both(core, r, "complete_load", *loads.pop(i))
        elif op == "store":
            ks = data.draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=8))
            out = both(core, r, "prepare_store", rid, ks)
            if out and out[0]:
                stores.append((rid, out[0]))
        elif op == "complete_store" and stores:
            i = data.draw(st.integers(0, len(stores) - 1))
            rid2, ks = stores.pop(i)
            both(core, r, "complete_store", rid2, ks, data.draw(st.booleans()))
        elif op == "touch":
            both(core, r, "touch", rid, data.draw(key_runs))
        elif op == "finish":
            both(core, r, "on_request_finished", rid)
        elif op == "events":
            both(core, r, "take_events")
        elif op == "reset" and data.draw(st.integers(0, 9)) == 0:
            both(core, r, "reset_cache")
            loads.clear()
            stores.clear()
        elif op == "bad_load":
            # A key not stored and ready, or a load never prepared: an error, nothing changed.
            both(core, r, "prepare_load", rid, data.draw(key_runs))
            both(core, r, "complete_load", rid, data.draw(key_runs))
    both(core, r, "take_events")
