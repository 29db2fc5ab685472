"""The Redis / Valkey fleet index against a real server (``PREFIXCACHE_REDIS_URL`` from
``.ci/run``, else a redis-server started here): vLLM's events as ground truth, agreement
with the embedded index, and the faults: a server restarted mid-stream, a connection
dropped during a pipeline, a worker that stops publishing, bad input."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from fleet_support import DroppingProxy, RedisServer, load_vectors, redis_url
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixcache import InvalidEventError, KvIndex, UnknownWorkerError
from prefixcache.errors import InvalidInputError, InvalidTypeError, PrefixCacheError
from prefixcache.fleet import RedisKvIndex, open_index

VECTORS = load_vectors()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    u, srv = redis_url()
    yield u
    if srv is not None:
        srv.stop()


def fresh(url: str, **kw: object) -> RedisKvIndex:
    """An index under its own key prefix (tests share one server)."""
    return RedisKvIndex(url, prefix="t-" + uuid.uuid4().hex[:12], **kw)  # type: ignore[arg-type]


def test_frames_agree_with_vllm_after_every_batch(url: str) -> None:
    ix = fresh(url)
    for d in VECTORS:
        assert ix.apply_frames(d["name"], d["frames"], now=0.0) == "applied"
        assert ix.cached_hashes(d["name"]) == d["cached_hashes"], (d["name"], d["seq"])
    ix.check_invariants()
    assert ix.status("worker1", now=0.0)["batches"] == sum(1 for d in VECTORS if d["worker"] == 1)


def test_pipelined_apply_many_agrees(url: str) -> None:
    ix = fresh(url)
    emb = KvIndex()
    for i in range(0, len(VECTORS), 37):
        chunk = VECTORS[i : i + 37]
        assert ix.apply_many([(d["name"], d["frames"]) for d in chunk], now=0.0) == [
            "applied"
        ] * len(chunk)
        for d in chunk:
            emb.apply_frames(d["name"], d["frames"], now=0.0)
        last = {d["name"]: d["cached_hashes"] for d in chunk}
        for w, hashes in last.items():
            assert ix.cached_hashes(w) == hashes
    # queries agree with the embedded index on every request prefix in the vectors
    for d in VECTORS[::7]:
        _ts, events, _ = msgpack.unpackb(d["payload"])
        for ev in events:
            if ev["type"] == "BlockStored":
                q = ev["block_hashes"]
                a, b = ix.longest_prefix(q, now=0.0), emb.longest_prefix(q, now=0.0)
                assert a.to_dict() == b.to_dict()
                assert ix.top_k(q, k=3, now=0.0) == emb.top_k(q, k=3, now=0.0)
    ix.check_invariants()


def test_concurrent_writers_apply_each_batch_once(url: str) -> None:
    """Two router processes subscribed to the same publishers: the sequence check inside
    the script makes every batch apply exactly once."""
    a = fresh(url)
    b = RedisKvIndex(url, prefix=a.prefix[1:-1])
    outcomes = []
    for d in VECTORS:
        outcomes.append(a.apply_frames(d["name"], d["frames"], now=0.0))
        outcomes.append(b.apply_frames(d["name"], d["frames"], now=0.0))
        assert b.cached_hashes(d["name"]) == d["cached_hashes"]
    assert outcomes.count("applied") == len(VECTORS)
    assert outcomes.count("duplicate") == len(VECTORS)


def test_sequence_media_ttl_workers(url: str) -> None:
    ix = fresh(url, ttl=30.0)
    s = {"type": "BlockStored", "block_size": 16}
    assert (
        ix.apply(
            "a",
            [{**s, "block_hashes": [1, 2, 3]}, {**s, "block_hashes": [1, 2], "medium": "CPU"}],
            seq=0,
            now=100.0,
        )
        == "applied"
    )
    assert ix.apply("a", [{"type": "BlockRemoved", "block_hashes": [2]}], seq=2, now=100.0) == "gap"
    m = ix.longest_prefix([1, 2, 3], now=100.0)
    assert m.stale("a") and (m.blocks("a", "GPU"), m.blocks("a", "CPU"), m.blocks("a")) == (3, 2, 3)
    assert ix.top_k([1], now=100.0) == []
    assert ix.apply("a", [], seq=1, now=100.0) == "applied"
    assert (
        ix.apply("a", [{"type": "BlockRemoved", "block_hashes": [2]}], seq=2, now=100.0)
        == "applied"
    )
    assert ix.longest_prefix([1, 2, 3], weights={"CPU": 0.5}, now=100.0).score("a") == 2.5
    # b publishes later; a falls silent and ages out
    ix.apply("b", [{**s, "block_hashes": [1]}], seq=0, now=125.0)
    assert ix.top_k([1, 2], k=2, now=129.0) == [("a", 2.0, 2), ("b", 1.0, 1)]
    assert ix.longest_prefix([1], now=140.0).expired("a")
    assert ix.top_k([1], k=2, now=140.0) == [("b", 1.0, 1)]
    assert ix.prune_expired(now=140.0) == ["a"]
    assert ix.workers() == ["b"]
    with pytest.raises(UnknownWorkerError):
        ix.remove_worker("a")
    ix.check_invariants()


@pytest.mark.parametrize("case", ["truncated", "unknown tag", "wrong type", "wide hash", "parts"])
def test_bad_input_is_counted_and_changes_nothing(url: str, case: str) -> None:
    ix = fresh(url)
    ix.apply_frames("a", VECTORS[0]["frames"], now=0.0)
    good = msgpack.unpackb(VECTORS[1]["payload"])
    seq1 = (1).to_bytes(8, "big")
    frames = {
        "truncated": [b"t", seq1, VECTORS[1]["payload"][:-9]],
        "unknown tag": [b"t", seq1, msgpack.packb([1.0, [{"type": "Zap"}], 0])],
        "wrong type": [b"t", seq1, msgpack.packb([1.0, [{**good[1][0], "block_size": []}], 0])],
        "wide hash": [
            b"t",
            seq1,
            msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [b"\x01" * 9]}], 0]),
        ],
        "parts": [seq1, VECTORS[1]["payload"]],
    }[case]
    before = ix.cached_hashes("a")
    with pytest.raises(InvalidEventError):
        ix.apply_frames("a", frames, now=0.0)
    assert ix.apply_many([("a", frames)], now=0.0) == ["error"]
    st = ix.status("a", now=0.0)
    assert st["errors"] == 2 and st["last_error"] and st["next_seq"] == 1
    assert ix.cached_hashes("a") == before
    ix.check_invariants()


def test_server_restart_mid_stream_is_noticed_and_resynced() -> None:
    """The server loses everything mid-stream: queries report every worker stale (never a
    wrong answer), the next batches are gaps until a replay from 0 rebuilds the state."""
    srv = RedisServer().start()
    try:
        ix = RedisKvIndex(srv.url, prefix="restart", retries=5)
        half = len(VECTORS) // 2
        for d in VECTORS[:half]:
            ix.apply_frames(d["name"], d["frames"], now=0.0)
        q = msgpack.unpackb(VECTORS[half - 1]["payload"])[1][0].get("block_hashes", [1])
        before = ix.longest_prefix(q, now=0.0)
        assert any(before.blocks(w) for w in before.workers)
        srv.restart()
        after = ix.longest_prefix(q, now=0.0)
        assert after.workers == before.workers
        assert all(after.stale(w) and after.blocks(w) == 0 for w in after.workers)
        assert ix.top_k(q, now=0.0) == []
        # the live stream goes on: gaps (batches before were lost with the server); a
        # worker that has not published since is still reported, stale
        first = VECTORS[half]
        assert ix.apply_frames(first["name"], first["frames"], now=0.0) == "gap"
        m = ix.longest_prefix(q, now=0.0)
        assert set(m.workers) == set(before.workers)
        assert all(m.stale(w) and m.blocks(w) == 0 for w in m.workers)
        outcomes = ["gap"] + [
            ix.apply_frames(d["name"], d["frames"], now=0.0) for d in VECTORS[half + 1 :]
        ]
        seen = {d["name"] for d in VECTORS[:half]}
        expected = ["gap" if d["name"] in seen else "applied" for d in VECTORS[half:]]
        assert ix.state_losses == 1 and outcomes == expected and "gap" in outcomes
        assert all(ix.status(w, now=0.0)["stale"] == (w in seen) for w in ix.workers())
        # the publishers replay their buffers from 0: exact again
        for d in VECTORS:
            ix.apply_frames(d["name"], d["frames"], now=0.0)
        for w in ix.workers():
            last = [d for d in VECTORS if d["name"] == w][-1]
            assert ix.cached_hashes(w) == last["cached_hashes"]
            assert not ix.status(w, now=0.0)["stale"]
        ix.check_invariants()
    finally:
        srv.stop()


def test_connection_dropped_during_a_pipeline() -> None:
    """The connection drops after the server ran the batch but before the reply: the
    client retries, the sequence check makes the retry a duplicate, the state is exact."""
    srv = RedisServer().start()
    proxy = DroppingProxy(srv.port)
    try:
        ix = RedisKvIndex(proxy.url, prefix="drop", retries=3)
        for i, d in enumerate(VECTORS):
            if i % 25 == 10:
                proxy.drop_next_reply()
            if i % 50 == 20:
                proxy.drop_next_reply()
                chunk = [(x["name"], x["frames"]) for x in VECTORS[i : i + 1]]
                assert ix.apply_many(chunk, now=0.0) == ["applied"]
            else:
                assert ix.apply_frames(d["name"], d["frames"], now=0.0) == "applied"
            assert ix.cached_hashes(d["name"]) == d["cached_hashes"]
        assert proxy.drops >= 10
        ix.check_invariants()
    finally:
        proxy.close()
        srv.stop()


def test_open_index_redis(url: str) -> None:
    ix = open_index(
        url.replace("redis://", "valkey://"), ttl=3.0, prefix="open-" + uuid.uuid4().hex
    )
    assert isinstance(ix, RedisKvIndex) and ix.ttl == 3.0


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["w0", "w1", "w2"]),
            st.lists(
                st.one_of(
                    st.tuples(
                        st.just("BlockStored"),
                        st.sampled_from([None, "GPU", "CPU"]),
                        st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 9), max_size=5),
                    ),
                    st.tuples(
                        st.just("BlockRemoved"),
                        st.sampled_from([None, "GPU", "CPU"]),
                        st.lists(st.integers(0, 9), max_size=3),
                    ),
                    st.tuples(st.just("AllBlocksCleared"), st.none(), st.just([])),
                ),
                max_size=4,
            ),
            st.one_of(st.none(), st.integers(0, 5)),
        ),
        max_size=20,
    ),
    st.lists(st.integers(0, 9), max_size=6),
)
def test_differential_against_embedded(url: str, steps: list, query: list[int]) -> None:
    ix = fresh(url)
    emb = KvIndex()
    for worker, ops, seq in steps:
        events = [
            {"type": t, "block_hashes": h, "block_size": 4, "medium": m}
            if t != "AllBlocksCleared"
            else {"type": t}
            for t, m, h in ops
        ]
        assert ix.apply(worker, events, seq=seq, now=0.0) == emb.apply(
            worker, events, seq=seq, now=0.0
        )
    for w in emb.workers():
        assert ix.cached_hashes(w) == emb.cached_hashes(w)
        assert ix.status(w, now=0.0)["stale"] == emb.status(w, now=0.0)["stale"]
    a = ix.longest_prefix(query, now=0.0, weights={"CPU": 0.5})
    b = emb.longest_prefix(query, now=0.0, weights={"CPU": 0.5})
    assert a.to_dict() == b.to_dict()
    ix.check_invariants()


# -- argument rules, server data loss, sequence numbers, counters (both backends alike) --


def _lose_data(url: str, ix: RedisKvIndex) -> None:
    """The server loses this index's data (as a restart without persistence or a flush,
    without touching the other tests' indexes on the shared server)."""
    import redis

    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=ix.prefix + ":*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


def _frames(seq: int, events: list[dict], ts: float = 1.0, dp: int | None = 0) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), msgpack.packb([ts, events, dp])]


def _stored(hashes: list[int], medium: str | None = None) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "block_size": 4, "medium": medium}


def test_a_client_that_only_reads_recovers_after_the_server_lost_its_data(url: str) -> None:
    writer = fresh(url)
    reader = RedisKvIndex(url, prefix=writer.prefix[1:-1])
    writer.apply("w", [_stored([1, 2, 3])], seq=0, now=0.0)
    assert reader.longest_prefix([1, 2, 3], now=0.0).blocks("w") == 3
    _lose_data(url, writer)
    writer.apply("w", [_stored([1, 2, 3])], seq=0, now=1.0)  # a replay from 0 rebuilds it
    for _ in range(2):
        m = reader.longest_prefix([1, 2, 3], now=1.0)
        assert m.blocks("w") == 3 and not m.stale("w")
        assert reader.top_k([1, 2, 3], 1, now=1.0) == [("w", 3.0, 3)]
    assert reader.state_losses == 1 and writer.state_losses == 1


def test_workers_known_before_a_data_loss_are_listed_removable_and_expire(url: str) -> None:
    ix = fresh(url, ttl=5.0)
    ix.apply("gone", [_stored([1])], seq=0, now=0.0)
    ix.apply("back", [_stored([1])], seq=0, now=0.0)
    _lose_data(url, ix)
    ix.apply("back", [_stored([1])], seq=0, now=1.0)
    other = RedisKvIndex(url, prefix=ix.prefix[1:-1], ttl=5.0)
    for client in (ix, other):
        assert client.workers() == ["back", "gone"]
        m = client.longest_prefix([1], now=2.0)
        assert m.workers == ["back", "gone"] and m.stale("gone") and m.blocks("gone") == 0
        assert client.status("gone", now=2.0)["stale"]
    ix.remove_worker("gone")
    assert ix.longest_prefix([1], now=2.0).workers == ["back"]
    with pytest.raises(UnknownWorkerError):
        ix.remove_worker("gone")
    # one known before the loss that no one removes expires and is pruned like any other
    ix.apply("old", [_stored([2])], seq=0, now=1.0)
    _lose_data(url, ix)
    ix.apply("back", [_stored([1])], seq=0, now=3.0)
    assert "old" in ix.workers()
    assert sorted(ix.prune_expired(now=100.0)) == ["back", "old"]
    assert ix.workers() == [] and ix.longest_prefix([1], now=100.0).workers == []
    ix.check_invariants()


def both(url: str, **kw: Any) -> list[Any]:
    return [KvIndex(**kw), fresh(url, **kw)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call",
    [
        lambda ix: ix.apply("w", [], seq=1.5, now=0.0),
        lambda ix: ix.apply("w", [], seq=-1, now=0.0),
        lambda ix: ix.apply("w", [], seq=2**63, now=0.0),
        lambda ix: ix.apply("w", [], seq="1", now=0.0),
        lambda ix: ix.reset_worker("w", 2**63),
        lambda ix: ix.reset_worker("w", -1),
        lambda ix: ix.reset_worker("w", "abc"),
        lambda ix: ix.reset_worker("w", 1.5),
    ],
)
def test_bad_sequence_numbers_are_refused_alike_and_change_nothing(url: str, call: Any) -> None:
    errors = []
    for ix in both(url):
        ix.apply("w", [_stored([1, 2])], seq=0, now=0.0)
        before = ix.status("w", now=0.0)
        with pytest.raises(PrefixCacheError) as e:
            call(ix)
        errors.append((type(e.value), str(e.value)))
        assert ix.status("w", now=0.0) == before
        assert ix.longest_prefix([1, 2], now=0.0).blocks("w") == 2
        assert ix.apply("w", [_stored([3])], seq=1, now=0.0) == "applied"
    assert errors[0] == errors[1]
    assert errors[0][1].startswith(("seq must be", "next_seq must be"))


def test_reset_worker_errors_name_next_seq(url: str) -> None:
    for ix in both(url):
        ix.add_worker("w", now=0.0)
        with pytest.raises(PrefixCacheError, match=r"^next_seq must be >= 0, got -1"):
            ix.reset_worker("w", -1)


def test_sequence_numbers_compare_exactly_up_to_2_63(url: str) -> None:
    for ix in both(url):
        for start in (2**53, 2**62 + 1, 2**63 - 5):
            ix.add_worker("w", now=0.0)
            ix.reset_worker("w", start)
            assert ix.apply("w", [_stored([7])], seq=start, now=0.0) == "applied"
            assert ix.apply("w", [_stored([7])], seq=start, now=0.0) == "duplicate"
            assert ix.apply("w", [_stored([8])], seq=start + 2, now=0.0) == "gap"
            st = ix.status("w", now=0.0)
            assert (st["next_seq"], st["max_seen_seq"], st["stale"]) == (start + 1, start + 2, True)
            assert ix.apply("w", [_stored([9])], seq=start + 1, now=0.0) == "applied"
            assert ix.status("w", now=0.0)["next_seq"] == start + 2
            assert ix.apply_frames("w", _frames(start + 3, [_stored([1])]), now=0.0) == "gap"
            ix.remove_worker("w")
        ix.add_worker("w", now=0.0)
        ix.reset_worker("w", 2**63 - 1)
        assert ix.apply("w", [], seq=2**63 - 1, now=0.0) == "applied"
        assert ix.status("w", now=0.0)["next_seq"] == 2**63


class _SelfIndex:
    def __index__(self) -> _SelfIndex:
        return self


BAD_ARGUMENTS: list[Any] = [
    lambda ix, url: ix.apply("w", [], now=float("inf")),
    lambda ix, url: ix.apply("w", [], now=float("nan")),
    lambda ix, url: ix.apply("w", [], now="x"),
    lambda ix, url: ix.apply("w", [], now=True),
    lambda ix, url: ix.status("w", now=10**400),
    lambda ix, url: ix.prune_expired(now="x"),
    lambda ix, url: ix.longest_prefix([1], weights={"GPU": True}),
    lambda ix, url: ix.longest_prefix([1], weights={"GPU": 10**400}),
    lambda ix, url: type(ix)(ttl=True) if isinstance(ix, KvIndex) else fresh(url, ttl=True),
    lambda ix, url: type(ix)(ttl=10**400) if isinstance(ix, KvIndex) else fresh(url, ttl=10**400),
    lambda ix, url: ix.longest_prefix([1], now=float("inf")),
    lambda ix, url: ix.top_k([1], k=-1),
    lambda ix, url: ix.top_k([1], k=1.5),
    lambda ix, url: ix.top_k([1], 2, include_unhealthy="yes"),
    lambda ix, url: ix.apply(5, []),
    lambda ix, url: ix.add_worker("\ud800"),
    lambda ix, url: ix.status(b"w"),
    lambda ix, url: ix.cached_hashes("w", medium=3),
    lambda ix, url: ix.longest_prefix([_SelfIndex()]),
    lambda ix, url: ix.longest_prefix([2**64]),
    lambda ix, url: ix.longest_prefix(5),
    lambda ix, url: ix.longest_prefix("abc"),
    lambda ix, url: ix.longest_prefix(tokens=[1, 2], hasher="sha256"),
    lambda ix, url: ix.longest_prefix(tokens=[1, 2]),
    lambda ix, url: ix.longest_prefix([1], weights=[1.0]),
    lambda ix, url: ix.longest_prefix([1], weights={"\ud800": 1.0}),
    lambda ix, url: ix.longest_prefix([1], weights={"CPU": -1}),
    lambda ix, url: ix.longest_prefix([1], weights={"CPU": float("inf")}),
    lambda ix, url: ix.longest_prefix([1], weights={"CPU": "1"}),
    lambda ix, url: ix.longest_prefix(np.array([[1, 2]], dtype=np.uint64)),
    lambda ix, url: ix.longest_prefix(np.array([1.0])),
    lambda ix, url: ix.longest_prefix({1, 2}),
    lambda ix, url: ix.top_k(b"\x01\x02"),
    # several bad arguments: the first is named
    lambda ix, url: ix.longest_prefix(5, now="x"),
    lambda ix, url: ix.longest_prefix([1], weights=[1.0], now="x"),
    lambda ix, url: ix.top_k(5, k=-1, now="x"),
    lambda ix, url: ix.top_k([1], k=-1, include_unhealthy=1),
    lambda ix, url: ix.top_k(k=1.5, tokens=5),
    lambda ix, url: ix.top_k([1], now="x", include_unhealthy=1),
    lambda ix, url: ix.apply("w", [], seq=-1, now="x"),
    lambda ix, url: (
        type(ix)(ttl=-1, hash_bytes="x")
        if isinstance(ix, KvIndex)
        else fresh(url, ttl=-1, hash_bytes="x")
    ),
    lambda ix, url: ix.remove_worker("zz"),
    lambda ix, url: (
        type(ix)(ttl=float("inf")) if isinstance(ix, KvIndex) else fresh(url, ttl=1e999)
    ),
    lambda ix, url: type(ix)(ttl=0) if isinstance(ix, KvIndex) else fresh(url, ttl=0),
    lambda ix, url: type(ix)(hash_bytes=7) if isinstance(ix, KvIndex) else fresh(url, hash_bytes=7),
]


@pytest.mark.parametrize("call", BAD_ARGUMENTS)
def test_bad_arguments_raise_the_same_error_in_both_backends(url: str, call: Any) -> None:
    errors = []
    for ix in both(url):
        ix.apply("w", [_stored([1])], seq=0, now=0.0)
        before = ix.status("w", now=0.0)
        with pytest.raises(PrefixCacheError) as e:
            call(ix, url)
        errors.append((type(e.value).__name__, str(e.value)))
        assert ix.status("w", now=0.0) == before
        assert ix.workers() == ["w"]
    assert errors[0] == errors[1]


def test_a_batch_with_a_65th_medium_is_counted_on_its_worker(url: str) -> None:
    messages = []
    for ix in both(url):
        for i in range(64):
            ix.apply("w", [_stored([i], medium=f"m{i}")], now=0.0)
        with pytest.raises(InvalidEventError, match="more than 64 distinct media") as e:
            ix.apply("w", [_stored([99], medium='X"\\'), _stored([9], medium="Y")], now=0.0)
        messages.append(str(e.value))
        frames = _frames(0, [_stored([99], medium="X")])
        if isinstance(ix, RedisKvIndex):
            assert ix.apply_many([("w", frames)], now=0.0) == ["error"]
        else:
            with pytest.raises(InvalidEventError):
                ix.apply_frames("w", frames, now=0.0)
        st = ix.status("w", now=0.0)
        assert st["errors"] == 2 and "more than 64 distinct media" in st["last_error"]
        assert st["batches"] == 64 and "X" not in ix.media
    assert messages[0] == messages[1] == 'more than 64 distinct media (new: ["X\\"\\\\"])'


def test_freed_worker_slots_are_reused_as_in_the_embedded_index(url: str) -> None:
    orders = []
    for ix in both(url):
        for w in "abcd":
            ix.add_worker(w, now=0.0)
        ix.remove_worker("a")
        ix.remove_worker("b")
        ix.add_worker("y", now=0.0)
        ix.add_worker("x", now=0.0)
        orders.append(ix.workers())
    assert orders[0] == orders[1] == ["x", "y", "c", "d"]  # the last freed slot first


def test_dp_rank_is_that_of_the_last_applied_batch(url: str) -> None:
    for ix in both(url):
        ix.apply_frames("w", _frames(0, [_stored([1])], dp=3), now=0.0)
        assert ix.status("w", now=0.0)["dp_rank"] == 3
        assert ix.apply_frames("w", _frames(5, [_stored([2])], dp=7), now=0.0) == "gap"
        assert ix.status("w", now=0.0)["dp_rank"] == 3
        assert ix.apply_frames("w", _frames(0, [_stored([1])], dp=9), now=0.0) == "duplicate"
        assert ix.status("w", now=0.0)["dp_rank"] == 3
        assert ix.apply("w", [_stored([2])], seq=1, now=0.0) == "applied"  # objects: no rank
        assert ix.status("w", now=0.0)["dp_rank"] == 3
        assert ix.apply_frames("w", _frames(2, [_stored([2])], dp=None), now=0.0) == "applied"
        assert ix.status("w", now=0.0)["dp_rank"] is None


def test_a_dropped_reply_relabels_only_the_batch_this_call_applied() -> None:
    srv = RedisServer().start()
    proxy = DroppingProxy(srv.port)
    try:
        ix = RedisKvIndex(proxy.url, prefix="relabel", retries=3)
        assert ix.apply_frames("w", _frames(0, [_stored([1])]), now=0.0) == "applied"
        proxy.drop_next_reply()  # a real duplicate whose reply is lost: still a duplicate
        assert ix.apply_frames("w", _frames(0, [_stored([1])]), now=0.0) == "duplicate"
        proxy.drop_next_reply()
        assert ix.apply_many([("w", _frames(0, [_stored([1])]))], now=0.0) == ["duplicate"]
        proxy.drop_next_reply()  # this call applies batch 1, its reply is lost: applied
        assert ix.apply_frames("w", _frames(1, [_stored([2])]), now=0.0) == "applied"
        proxy.drop_next_reply()
        assert ix.apply_many([("w", _frames(2, [_stored([3])]))], now=0.0) == ["applied"]
        proxy.drop_next_reply()  # a gap whose reply is lost: counted once
        assert ix.apply_frames("w", _frames(9, [_stored([4])]), now=0.0) == "gap"
        st = ix.status("w", now=0.0)
        # as the embedded index would count these calls (each attempt ran on the server)
        assert (st["batches"], st["duplicates"], st["gaps"], st["next_seq"]) == (3, 2, 1, 3)
        assert proxy.drops == 5
    finally:
        proxy.close()
        srv.stop()


def test_query_hash_arrays_of_any_integer_dtype_read_alike(url: str) -> None:
    for ix in both(url):
        ix.apply("w", [_stored([1, 2, 3])], seq=0, now=0.0)
        for dtype in (np.int32, np.uint16, ">u8", ">i8"):
            a = np.array([1, 2, 3], dtype=dtype)
            assert (
                ix.longest_prefix(a, now=0.0).to_dict()
                == ix.longest_prefix([1, 2, 3], now=0.0).to_dict()
            )
            assert ix.top_k(a[::2], now=0.0) == ix.top_k([1, 3], now=0.0) == [("w", 2.0, 2)]


@pytest.mark.parametrize(
    "messages",
    [
        lambda good, bad: [("w", [b"x"]), (5, good)],
        lambda good, bad: [("w", bad), ("w", good, 3)],
        lambda good, bad: [("w", bad), "w"],
        lambda good, bad: 5,
        lambda good, bad: "w",
    ],
)
def test_apply_many_checks_every_argument_before_writing(url: str, messages: Any) -> None:
    ix = fresh(url)
    ix.apply("w", [_stored([1, 2])], seq=0, now=0.0)
    before = ix.status("w", now=0.0)
    with pytest.raises(InvalidTypeError):
        ix.apply_many(messages(_frames(1, [_stored([3])]), [b"x"]), now=0.0)
    assert ix.status("w", now=0.0) == before
    assert ix.workers() == ["w"]
    assert ix.longest_prefix([1, 2, 3], now=0.0).blocks("w") == 2
    ix.check_invariants()


MATCH_CALLS: list[Any] = [
    lambda m: m.blocks("zz"),
    lambda m: m.blocks(5),
    lambda m: m.blocks(["w"]),
    lambda m: m.blocks("w", 5),
    lambda m: m.blocks("zz", 5),
    lambda m: m.score('a"b\n'),
    lambda m: m.stale("\ud800"),
    lambda m: m.expired(b"w"),
]


@pytest.mark.parametrize("call", MATCH_CALLS)
def test_match_arguments_raise_the_same_error_in_both_backends(url: str, call: Any) -> None:
    errors = []
    for ix in both(url):
        ix.apply("w", [_stored([1])], seq=0, now=0.0)
        with pytest.raises(PrefixCacheError) as e:
            call(ix.longest_prefix([1], now=0.0))
        errors.append((type(e.value).__name__, str(e.value)))
    assert errors[0] == errors[1]


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"retries": -1}, InvalidInputError, "retries must be >= 0, got -1"),
        ({"retries": 1.5}, InvalidTypeError, "retries must be an int, got float"),
        ({"retries": None}, InvalidTypeError, "retries must be an int, got NoneType"),
        ({"prefix": 5}, InvalidTypeError, "prefix must be a str, got int"),
        ({"url": b"redis://127.0.0.1:1/0"}, InvalidTypeError, "url must be a str, got bytes"),
        # several bad arguments: the first is named
        (
            {"url": b"redis://127.0.0.1:1/0", "ttl": True},
            InvalidTypeError,
            "url must be a str, got bytes",
        ),
        ({"prefix": 5, "hash_bytes": 7}, InvalidTypeError, "prefix must be a str, got int"),
    ],
)
def test_bad_client_options_raise_clear_errors(
    url: str, kw: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        RedisKvIndex(**{"url": url, **kw})
    if "url" in kw:
        with pytest.raises(InvalidTypeError, match=r"^url must be a str or None, got bytes$"):
            open_index(kw["url"])


@pytest.mark.parametrize(
    ("seen", "ttl", "now"),
    [
        (563057163.5212291, 0.001, 563057163.5222292),
        (526412667.66921407, 86.86724267130292, 526412754.53645676),
        (1598324911.0802605, 47.602310869737366, 1598324958.6825714),
    ],
)
def test_prune_removes_exactly_the_workers_reported_expired(
    url: str, seen: float, ttl: float, now: float
) -> None:
    # `now - seen > ttl` holds, `seen < now - ttl` does not (a rounding apart).
    assert now - seen > ttl and not seen < now - ttl
    for ix in both(url, ttl=ttl):
        ix.add_worker("w", now=seen)
        ix.add_worker("fresh", now=now)
        assert ix.status("w", now=now)["expired"]
        assert ix.longest_prefix([1], now=now).expired("w")
        assert ix.prune_expired(now=now) == ["w"]
        assert ix.workers() == ["fresh"]


def test_prune_frees_slots_in_the_embedded_index_order(url: str) -> None:
    # More workers than a small Redis hash holds in order (a listpack: 128 or 512 entries).
    names = [f"w{i}" for i in range(600)]
    seen = []
    for ix in both(url, ttl=5.0):
        for i, w in enumerate(names):
            ix.add_worker(w, now=0.0 if i % 3 else 10.0)
        gone = ix.prune_expired(now=12.0)
        for w in ("n0", "n1", "n2", "n3"):
            ix.add_worker(w, now=12.0)
        seen.append((gone, ix.workers(), ix.top_k([], 50, now=12.0)))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("special", ["*", "?", "[x]", "\\"])
def test_a_prefix_with_glob_characters_counts_only_its_own_keys(url: str, special: str) -> None:
    base = "g-" + uuid.uuid4().hex[:8]
    mine = RedisKvIndex(url, prefix=base + special)
    other = RedisKvIndex(url, prefix=base + "x")
    other.apply("w", [_stored([1, 2, 3])], now=0.0)
    mine.apply("w", [_stored([7])], now=0.0)
    assert mine.num_hashes == 1 and other.num_hashes == 3
    mine.check_invariants()
    other.check_invariants()
