"""The Redis / Valkey fleet index against a real server (``PREFIXCACHE_REDIS_URL`` from
``.ci/run``, else a redis-server started here): vLLM's events as ground truth, agreement
with the embedded index, and the faults: a server restarted mid-stream, a connection
dropped during a pipeline, a worker that stops publishing, bad input."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import msgpack
import pytest
from fleet_support import DroppingProxy, RedisServer, load_vectors, redis_url
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixcache import InvalidEventError, KvIndex, UnknownWorkerError
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
