"""A ZMQ subscriber that feeds a fleet index from the engines' KV event publishers.

One SUB socket per publisher (vLLM ``--kv-events-config`` ``endpoint``, SGLang's
publisher), read by one background thread. Each message ``[topic, seq, payload]`` goes to
``index.apply_frames`` (or, for an index with ``apply_many`` such as the Redis backend, all
messages read in one poll go in one pipelined call). When a sequence gap appears and the
publisher has a replay endpoint (vLLM's ROUTER ``replay_endpoint``), the missing batches
are requested: a DEALER sends ``[b"", start_seq (8 bytes big-endian)]`` and reads the
replies until ``seq`` is -1 (``END_SEQ``): ``[b"", topic, seq, payload]`` from vLLM 0.33
and SGLang 0.5.23, ``[b"", seq, payload]`` from earlier vLLM versions.

Replays of one publisher are at most one per ``replay_interval``: a gap within the interval
is replayed once it has passed (at the next poll, if the worker is still stale).

When the index reports that its store lost its data (``RedisKvIndex.state_losses``
grows: the server restarted empty), every publisher is asked for a replay from 0.

Bad messages are counted (by the index, per worker, and here) and never stop the thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import zmq

from prefixcache import _core
from prefixcache.errors import (
    InvalidInputError,
    InvalidTypeError,
    PrefixCacheError,
    UnknownWorkerError,
)
from prefixcache.fleet.match import quoted_name

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class Publisher:
    """One engine publisher: its PUB endpoint, the worker name its events belong to, and
    optionally its replay (ROUTER) endpoint and topic filter. vLLM's PUB binds when its
    endpoint has a wildcard host (``tcp://*:5557``, the default) and connects otherwise;
    for a connecting publisher set ``bind=True`` so that the subscriber binds
    ``endpoint``."""

    endpoint: str
    worker: str
    replay_endpoint: str | None = None
    topic: str = ""
    bind: bool = False


@dataclass
class SubscriberStats:
    """Counters of one publisher as seen by the subscriber."""

    messages: int = 0
    applied: int = 0
    duplicates: int = 0
    gaps: int = 0
    errors: int = 0
    replays: int = 0
    replayed: int = 0
    last_error: str | None = None


def _publishers_arg(publishers: object) -> list[Publisher]:
    """The publishers as a list, each a ``Publisher`` whose worker name is converted as the
    index converts it, no two with one name."""
    if isinstance(publishers, (str, bytes, Publisher)) or not isinstance(publishers, Iterable):
        raise InvalidTypeError(
            f"publishers must be an iterable of Publisher, got {type(publishers).__name__}"
        )
    out = list(publishers)
    for i, p in enumerate(out):
        if not isinstance(p, Publisher):
            raise InvalidTypeError(f"publishers[{i}] must be a Publisher, got {type(p).__name__}")
        _core.fleet_worker_arg(p.worker)
        for what in ("endpoint", "topic"):
            if not isinstance(getattr(p, what), str):
                raise InvalidTypeError(
                    f"publishers[{i}].{what} must be a str, got {type(getattr(p, what)).__name__}"
                )
        if p.replay_endpoint is not None and not isinstance(p.replay_endpoint, str):
            raise InvalidTypeError(
                f"publishers[{i}].replay_endpoint must be a str or None, "
                f"got {type(p.replay_endpoint).__name__}"
            )
    names = [p.worker for p in out]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"each publisher needs its own worker name, got {names}")
    return out


def _seconds_arg(v: object, what: str) -> float:
    """A duration in seconds: a finite int or float >= 0 (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidTypeError(f"{what} must be a number of seconds, got {type(v).__name__}")
    x = float(v) if not isinstance(v, int) or abs(v) < 2**1023 else float("inf")
    if not (math.isfinite(x) and x >= 0):
        raise InvalidInputError(f"{what} must be a finite number of seconds >= 0, got {v}")
    return x


def _count_arg(v: object, what: str, least: int) -> int:
    """An int >= ``least`` (in ``[0, 2**63)``), converted as the index converts counts."""
    n = _core.fleet_seq_arg(v, what)
    if n is None:
        raise InvalidTypeError(f"{what} must be an int, got NoneType")
    if n < least:
        raise InvalidInputError(f"{what} must be >= {least}, got {n}")
    return n


class KvEventSubscriber:
    """Feeds ``index`` (a ``KvIndex`` or ``RedisKvIndex``) from ``publishers`` in a
    background thread. Use as a context manager, or ``start()`` / ``stop()``.

    With ``sync_on_start`` each publisher with a replay endpoint is asked at start for the
    batches the index lacks (from its ``next_seq``: 0 for a new worker)."""

    def __init__(
        self,
        index: Any,
        publishers: Iterable[Publisher],
        *,
        replay_timeout: float = 1.0,
        replay_interval: float = 0.2,
        poll_ms: int = 50,
        max_batch: int = 512,
        sync_on_start: bool = True,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.index = index
        self.publishers = _publishers_arg(publishers)
        self.replay_timeout = _seconds_arg(replay_timeout, "replay_timeout")
        self.replay_interval = _seconds_arg(replay_interval, "replay_interval")
        self.poll_ms = _count_arg(poll_ms, "poll_ms", 0)
        self.max_batch = _count_arg(max_batch, "max_batch", 1)
        self.sync_on_start = _core.fleet_flag_arg(sync_on_start, "sync_on_start")
        self._ctx = context or zmq.Context.instance()
        self.stats: dict[str, SubscriberStats] = {
            p.worker: SubscriberStats() for p in self.publishers
        }
        self._last_replay: dict[str, float] = {}
        # Workers whose replay the interval held back: replayed once it has passed.
        self._replay_due: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.loop_errors = 0
        self._losses_seen = getattr(index, "state_losses", 0)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> KvEventSubscriber:
        if self._thread is not None:
            raise RuntimeError("subscriber already started")
        self._thread = threading.Thread(target=self._run, name="kv-event-subscriber", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> KvEventSubscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_for(self, predicate: Any, timeout: float = 5.0, interval: float = 0.01) -> bool:
        """Polls ``predicate()`` until true or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval)
        return bool(predicate())

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        socks: dict[zmq.Socket[Any], Publisher] = {}
        poller = zmq.Poller()
        try:
            for p in self.publishers:
                s = self._ctx.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SUBSCRIBE, p.topic.encode())
                if p.bind:
                    s.bind(p.endpoint)
                else:
                    s.connect(p.endpoint)
                socks[s] = p
                poller.register(s, zmq.POLLIN)
            if self.sync_on_start:
                # Batches published before we connected (or while this process was down)
                # are only in the publishers' replay buffers: ask for them now rather than
                # at the next live batch.
                for p in self.publishers:
                    if p.replay_endpoint:
                        self.index.add_worker(p.worker)
                        self._replay(p)
            self._ready.set()
            while not self._stop.is_set():
                try:
                    ready = dict(poller.poll(self.poll_ms))
                    batch: list[tuple[Publisher, list[bytes]]] = []
                    for s in ready:
                        for _ in range(self.max_batch):
                            try:
                                parts = s.recv_multipart(zmq.NOBLOCK)
                            except zmq.Again:
                                break
                            batch.append((socks[s], parts))
                    if batch:
                        self._deliver(batch)
                    if self._replay_due:
                        self._replay_held_back()
                except Exception as e:  # keep the thread alive whatever happens
                    self.loop_errors += 1
                    log.exception("kv event subscriber: %s", e)
        finally:
            self._ready.set()
            for s in socks:
                s.close(0)

    def _count(self, p: Publisher, outcome: str, error: str | None = None) -> None:
        st = self.stats[p.worker]
        with self._lock:
            if outcome == "applied":
                st.applied += 1
            elif outcome == "duplicate":
                st.duplicates += 1
            elif outcome == "gap":
                st.gaps += 1
            else:
                st.errors += 1
                st.last_error = error

    def _deliver(self, batch: list[tuple[Publisher, list[bytes]]]) -> None:
        for p, _ in batch:
            self.stats[p.worker].messages += 1
        gapped: set[str] = set()
        apply_many = getattr(self.index, "apply_many", None)
        if apply_many is not None:
            outcomes = apply_many([(p.worker, parts) for p, parts in batch])
            for (p, _), out in zip(batch, outcomes, strict=True):
                self._count(p, out, None if out != "error" else "rejected (see index status)")
                if out == "gap":
                    gapped.add(p.worker)
        else:
            for p, parts in batch:
                try:
                    out = self.index.apply_frames(p.worker, parts)
                except PrefixCacheError as e:
                    self._count(p, "error", str(e))
                    continue
                self._count(p, out)
                if out == "gap":
                    gapped.add(p.worker)
        losses = getattr(self.index, "state_losses", 0)
        if losses != self._losses_seen:
            # The index's store lost its data (a Redis restart): every worker must be
            # rebuilt from its publisher's replay buffer, not only those that spoke.
            self._losses_seen = losses
            gapped = {p.worker for p in self.publishers}
            self._last_replay.clear()
        for p in self.publishers:
            if p.worker in gapped and p.replay_endpoint:
                self._replay(p)

    def _replay_held_back(self) -> None:
        """Replays held back by ``replay_interval`` whose interval has passed (for a worker
        still stale: batches since may have filled the gap)."""
        now = time.monotonic()
        for p in self.publishers:
            if p.worker not in self._replay_due:
                continue
            if now - self._last_replay.get(p.worker, -1e9) < self.replay_interval:
                continue
            self._replay_due.discard(p.worker)
            try:
                stale = bool(self.index.status(p.worker)["stale"])
            except UnknownWorkerError:
                stale = True
            if stale:
                self._replay(p)

    def request_replay(self, worker: str) -> int:
        """Requests the batches ``worker``'s index state is missing from its publisher's
        replay endpoint and applies them; returns how many were applied. Called by the
        thread on a gap; callable directly (not concurrently with the thread's own)."""
        worker = _core.fleet_worker_arg(worker)
        p = next((x for x in self.publishers if x.worker == worker), None)
        if p is None or not p.replay_endpoint:
            raise InvalidInputError(f"no replay endpoint for worker {quoted_name(worker)}")
        self._last_replay.pop(worker, None)
        return self._replay(p)

    def _replay(self, p: Publisher) -> int:
        now = time.monotonic()
        if now - self._last_replay.get(p.worker, -1e9) < self.replay_interval:
            self._replay_due.add(p.worker)
            return 0
        self._replay_due.discard(p.worker)
        self._last_replay[p.worker] = now
        try:
            start = int(self.index.status(p.worker)["next_seq"])
        except UnknownWorkerError:  # e.g. a Redis index whose server lost its data
            start = 0
        st = self.stats[p.worker]
        st.replays += 1
        applied = 0
        d = self._ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        try:
            assert p.replay_endpoint is not None
            d.connect(p.replay_endpoint)
            d.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not d.poll(int(left * 1000)):
                    break
                frames = d.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                # vLLM 0.33 / SGLang 0.5.23 reply [topic, seq, payload] (end: [b"",
                # END_SEQ, b""]); earlier vLLM versions [seq, payload] (end: [END_SEQ, b""]).
                if len(frames) == 3:
                    topic, seq, payload = frames
                elif len(frames) == 2:
                    topic, (seq, payload) = p.topic.encode(), frames
                else:
                    self._count(p, "error", f"replay reply with {len(frames)} frames")
                    continue
                if seq == END_SEQ:
                    break
                try:
                    out = self.index.apply_frames(
                        p.worker, [topic or p.topic.encode(), seq, payload]
                    )
                except PrefixCacheError as e:
                    self._count(p, "error", str(e))
                    continue
                if out == "applied":
                    applied += 1
        finally:
            d.close(0)
        st.replayed += applied
        return applied
