"""End to end through ZMQ: vLLM's frames replayed on real PUB sockets on loopback (one
publisher per worker, each with vLLM's replay ROUTER socket), a ``KvEventSubscriber``
thread feeding the embedded and the Redis index. After every batch the index agrees with
vLLM's cached hashes; dropped messages are recovered by replay; bad messages are counted
and the thread lives on; a worker that stops publishing ages out."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from fleet_support import RedisServer, ReplayPublisher, load_vectors, redis_url

from prefixcache import InvalidInputError, InvalidTypeError, KvIndex, UnknownWorkerError
from prefixcache.fleet import KvEventSubscriber, Publisher, RedisKvIndex

VECTORS = load_vectors()
WORKERS = sorted({d["name"] for d in VECTORS})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    u, srv = redis_url()
    yield u
    if srv is not None:
        srv.stop()


@pytest.fixture(params=["embedded", "redis"])
def make_index(request: Any, url: str) -> Any:
    def make(ttl: float | None = None) -> Any:
        if request.param == "embedded":
            return KvIndex(ttl=ttl)
        return RedisKvIndex(url, prefix="z-" + uuid.uuid4().hex[:12], ttl=ttl)

    return make


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    c: zmq.Context[Any] = zmq.Context()
    yield c
    c.term()


def publishers(
    ctx: zmq.Context[Any], names: list[str], replay_topic: bool = True
) -> dict[str, ReplayPublisher]:
    return {
        w: ReplayPublisher(ctx, topic=f"kv@{w}@model".encode(), replay_topic=replay_topic)
        for w in names
    }


def subscribe(index: Any, pubs: dict[str, ReplayPublisher], **kw: Any) -> KvEventSubscriber:
    return KvEventSubscriber(
        index,
        [
            Publisher(p.endpoint, w, p.replay_endpoint, topic=f"kv@{w}@model")
            for w, p in pubs.items()
        ],
        **kw,
    ).start()


def caught_up(index: Any, worker: str, seq: int) -> Any:
    return lambda: index.status(worker)["next_seq"] > seq


def test_replayed_frames_agree_after_every_batch(ctx: zmq.Context[Any], make_index: Any) -> None:
    index = make_index()
    pubs = publishers(ctx, WORKERS)
    sub = subscribe(index, pubs)
    try:
        time.sleep(0.3)  # let the SUB sockets connect (a lost first batch is replayed anyway)
        for d in VECTORS:
            pubs[d["name"]].send(d["seq"], d["payload"])
            assert sub.wait_for(caught_up(index, d["name"], d["seq"]), timeout=10, interval=0.001)
            assert index.cached_hashes(d["name"]) == d["cached_hashes"], (d["name"], d["seq"])
        index.check_invariants()
        assert sub.alive and sub.loop_errors == 0
        assert sum(s.applied + s.replayed for s in sub.stats.values()) == len(VECTORS)
    finally:
        sub.stop()
        for p in pubs.values():
            p.close()


@pytest.mark.parametrize("replay_topic", [True, False], ids=["vllm-0.33-sglang", "older-vllm"])
def test_dropped_messages_are_replayed(
    ctx: zmq.Context[Any], make_index: Any, replay_topic: bool
) -> None:
    """Every 7th batch never reaches the subscriber (as with a PUB high-water mark): the
    next one is a gap, the subscriber asks the replay socket, the index is exact again.
    Both replay reply shapes (vLLM 0.33 includes the topic; earlier versions do not)."""
    index = make_index()
    pubs = publishers(ctx, WORKERS, replay_topic)
    # a batch published before the subscriber exists: fetched by the start-up sync
    first = VECTORS[0]
    pubs[first["name"]].send(first["seq"], first["payload"])
    sub = subscribe(index, pubs, replay_interval=0.0)
    try:
        assert index.cached_hashes(first["name"]) == first["cached_hashes"]
        time.sleep(0.3)
        for i, d in enumerate(VECTORS[1:], 1):
            pubs[d["name"]].send(d["seq"], d["payload"], publish=i % 7 != 0)
        last = {d["name"]: d for d in VECTORS}
        for w, d in last.items():
            assert sub.wait_for(caught_up(index, w, d["seq"]), timeout=10)
            assert index.cached_hashes(w) == d["cached_hashes"]
            assert not index.status(w)["stale"]
        assert sum(s.replays for s in sub.stats.values()) >= 1
        assert sum(p.replay_requests for p in pubs.values()) >= 1
        index.check_invariants()
    finally:
        sub.stop()
        for p in pubs.values():
            p.close()


def test_bad_messages_are_counted_and_the_thread_lives(
    ctx: zmq.Context[Any], make_index: Any
) -> None:
    index = make_index()
    pubs = publishers(ctx, ["worker0"])
    sub = subscribe(index, pubs)
    pub = pubs["worker0"]
    topic = b"kv@worker0@model"
    mine = [d for d in VECTORS if d["name"] == "worker0"]
    try:
        time.sleep(0.3)
        pub.send(mine[0]["seq"], mine[0]["payload"])
        assert sub.wait_for(caught_up(index, "worker0", 0))
        good = msgpack.unpackb(mine[1]["payload"])
        seq1 = (1).to_bytes(8, "big")
        bad = [
            [topic, seq1, mine[1]["payload"][:-5]],  # truncated msgpack
            [topic, seq1, msgpack.packb([1.0, [{"type": "BlockEvicted"}], 0])],  # unknown tag
            [topic, seq1, msgpack.packb([1.0, [{**good[1][0], "block_hashes": "x"}], 0])],
            [
                topic,
                seq1,
                msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [b"\x00" * 5]}], 0]),
            ],
            [topic, seq1],  # two frames
            [topic, seq1, mine[1]["payload"], b"extra"],  # four frames
        ]
        for parts in bad:
            pub.send_raw(parts)
        assert sub.wait_for(lambda: index.status("worker0")["errors"] == len(bad))
        assert sub.stats["worker0"].errors == len(bad) and sub.alive
        assert index.cached_hashes("worker0") == mine[0]["cached_hashes"]
        for d in mine[1:]:
            pub.send(d["seq"], d["payload"])
        assert sub.wait_for(caught_up(index, "worker0", mine[-1]["seq"]), timeout=10)
        assert index.cached_hashes("worker0") == mine[-1]["cached_hashes"]
        assert sub.alive and sub.loop_errors == 0
    finally:
        sub.stop()
        for p in pubs.values():
            p.close()


def test_a_worker_that_stops_publishing_ages_out(ctx: zmq.Context[Any], make_index: Any) -> None:
    index = make_index(ttl=0.5)
    pubs = publishers(ctx, ["worker0", "worker1"])
    sub = subscribe(index, pubs)
    stored = {"type": "BlockStored", "block_hashes": [11, 12], "block_size": 16}
    try:
        time.sleep(0.3)
        for w in pubs:
            pubs[w].send(0, msgpack.packb([time.time(), [stored], 0]))
        assert sub.wait_for(lambda: all(index.status(w)["next_seq"] == 1 for w in pubs))
        assert [w for w, _, _ in index.top_k([11, 12], k=2)] == ["worker0", "worker1"]
        # worker1 falls silent, worker0 keeps publishing
        deadline = time.monotonic() + 1.0
        seq = 1
        while time.monotonic() < deadline:
            pubs["worker0"].send(seq, msgpack.packb([time.time(), [], 0]))
            seq += 1
            time.sleep(0.05)
        assert sub.wait_for(lambda: index.status("worker0")["next_seq"] == seq)
        m = index.longest_prefix([11, 12])
        assert m.expired("worker1") and not m.expired("worker0")
        assert index.top_k([11, 12], k=2) == [("worker0", 2.0, 2)]
        assert index.prune_expired() == ["worker1"]
    finally:
        sub.stop()
        for p in pubs.values():
            p.close()


def test_redis_restart_mid_stream_resyncs_through_replay(ctx: zmq.Context[Any]) -> None:
    """The Redis server restarts (empty) while the subscriber runs: the next live batches
    are gaps, the subscriber asks the publishers' replay sockets from 0, and the index is
    exact again; queries in between report the workers stale, never a wrong prefix."""
    srv = RedisServer().start()
    pubs = publishers(ctx, WORKERS)
    index = RedisKvIndex(srv.url, prefix="zrestart", retries=8)
    sub = subscribe(index, pubs, replay_interval=0.0)
    try:
        time.sleep(0.3)
        half = len(VECTORS) // 2
        for d in VECTORS[:half]:
            pubs[d["name"]].send(d["seq"], d["payload"])
        for w in WORKERS:
            mine = [d for d in VECTORS[:half] if d["name"] == w]
            if mine:
                assert sub.wait_for(caught_up(index, w, mine[-1]["seq"]), timeout=10)
        srv.restart()
        probe = msgpack.unpackb(VECTORS[half - 1]["payload"])[1][0].get("block_hashes", [1])
        m = index.longest_prefix(probe)
        assert all(m.stale(w) and m.blocks(w) == 0 for w in m.workers)
        for d in VECTORS[half:]:
            pubs[d["name"]].send(d["seq"], d["payload"])
        last = {d["name"]: d for d in VECTORS}

        def exact(w: str, seq: int) -> bool:
            try:
                st = index.status(w)
            except UnknownWorkerError:  # not re-registered since the restart yet
                return False
            return st["next_seq"] > seq and not st["stale"]

        for w, d in last.items():
            assert sub.wait_for(lambda w=w, d=d: exact(w, d["seq"]), timeout=20), (
                w,
                d["seq"],
                index.status(w),
                sub.stats,
                sub.loop_errors,
            )
            assert index.cached_hashes(w) == d["cached_hashes"]
        assert index.state_losses >= 1 and sub.alive
        assert sum(p.replay_requests for p in pubs.values()) >= len(WORKERS)
        index.check_invariants()
    finally:
        sub.stop()
        for p in pubs.values():
            p.close()
        srv.stop()


def test_a_connecting_publisher_with_a_binding_subscriber(ctx: zmq.Context[Any]) -> None:
    """vLLM's PUB connects when its endpoint names a host: the subscriber binds."""
    from fleet_support import free_port

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    index = KvIndex()
    sub = KvEventSubscriber(index, [Publisher(endpoint, "w", bind=True)]).start()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoint)
    try:
        mine = [d for d in VECTORS if d["name"] == "worker0"]
        # PUB drops what it sends before the subscription has crossed the connection:
        # repeat the first batch (a duplicate is ignored) until the worker is known.
        deadline = time.monotonic() + 30
        while "w" not in index.workers() and time.monotonic() < deadline:
            pub.send_multipart(mine[0]["frames"])
            time.sleep(0.05)
        for d in mine[1:]:
            pub.send_multipart(d["frames"])
        assert sub.wait_for(caught_up(index, "w", mine[-1]["seq"]))
        assert index.cached_hashes("w") == mine[-1]["cached_hashes"]
    finally:
        sub.stop()
        pub.close(0)


def test_a_replay_held_back_by_the_interval_runs_once_it_has_passed(
    ctx: zmq.Context[Any], make_index: Any
) -> None:
    """A second gap within ``replay_interval`` of the last replay is replayed once the
    interval has passed, though no batch follows (an idle engine)."""
    index = make_index()
    pub = ReplayPublisher(ctx)

    def payload(h: int) -> bytes:
        ev = {"type": "BlockStored", "block_hashes": [h], "block_size": 4}
        return msgpack.packb([time.time(), [ev], 0])

    sub = KvEventSubscriber(
        index, [Publisher(pub.endpoint, "w", pub.replay_endpoint)], context=ctx, replay_interval=0.5
    ).start()
    try:
        time.sleep(0.3)
        pub.send(0, payload(1))
        pub.send(1, payload(2), publish=False)
        pub.send(2, payload(3))  # a gap: replayed at once
        assert sub.wait_for(caught_up(index, "w", 2), timeout=5)
        pub.send(3, payload(4), publish=False)
        pub.send(4, payload(5))  # a gap within the interval: held back, then replayed
        assert sub.wait_for(caught_up(index, "w", 4), timeout=5)
        assert not index.status("w")["stale"]
        assert index.top_k([1, 2, 3, 4, 5], 1)[0][2] == 5
    finally:
        sub.stop()
        pub.close()


BAD_SUBSCRIBER_ARGUMENTS: list[tuple[dict[str, Any], type, str]] = [
    ({"max_batch": 0}, InvalidInputError, "max_batch must be >= 1, got 0"),
    ({"max_batch": 1.5}, InvalidTypeError, "max_batch must be an int, got float"),
    ({"poll_ms": -1}, InvalidInputError, "poll_ms must be >= 0, got -1"),
    ({"poll_ms": None}, InvalidTypeError, "poll_ms must be an int, got NoneType"),
    ({"replay_timeout": -1.0}, InvalidInputError, "replay_timeout must be a finite number"),
    ({"replay_interval": float("nan")}, InvalidInputError, "replay_interval must be a finite"),
    ({"replay_timeout": "1"}, InvalidTypeError, "replay_timeout must be a number of seconds"),
    ({"sync_on_start": 1}, InvalidTypeError, "sync_on_start must be a bool, got int"),
    ({"publishers": [Publisher("tcp://127.0.0.1:1", 5)]}, InvalidTypeError, "worker must be"),  # type: ignore[arg-type]
    ({"publishers": ["tcp://127.0.0.1:1"]}, InvalidTypeError, "publishers[0] must be a Publisher"),
    (
        {"publishers": Publisher("tcp://127.0.0.1:1", "w")},
        InvalidTypeError,
        "iterable of Publisher",
    ),
    (
        {"publishers": [Publisher("tcp://127.0.0.1:1", "w"), Publisher("tcp://127.0.0.1:2", "w")]},
        InvalidInputError,
        "each publisher needs its own worker name",
    ),
]


@pytest.mark.parametrize(("kw", "error", "message"), BAD_SUBSCRIBER_ARGUMENTS)
def test_bad_subscriber_arguments_raise_before_any_socket(
    kw: dict[str, Any], error: type, message: str
) -> None:
    pubs = kw.pop("publishers", [Publisher("tcp://127.0.0.1:1", "w")])
    with pytest.raises(error, match=re.escape(message)):
        KvEventSubscriber(KvIndex(), pubs, **kw)


def test_request_replay_checks_its_worker() -> None:
    sub = KvEventSubscriber(KvIndex(), [Publisher("tcp://127.0.0.1:1", "w")])
    with pytest.raises(InvalidTypeError, match=r"^worker must be a str, got int$"):
        sub.request_replay(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r'^no replay endpoint for worker "w"$'):
        sub.request_replay("w")
    with pytest.raises(InvalidInputError, match=r'^no replay endpoint for worker "zz"$'):
        sub.request_replay("zz")
