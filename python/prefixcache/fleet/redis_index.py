"""The fleet index in Redis / Valkey: several router processes share one view.

Same API as ``prefixcache.KvIndex``; events are decoded by the same core decoder
(``_core.decode_kv_frames`` / ``decode_kv_events``) and applied by one Lua script call per
batch (``redis_scripts.APPLY``), queries are one pipelined round trip. Layout and
consistency model: docs/FLEET.md.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from prefixcache import _core
from prefixcache.errors import InvalidEventError, InvalidTypeError, UnknownWorkerError
from prefixcache.fleet import redis_scripts
from prefixcache.fleet.match import RemoteFleetMatch, quoted_name
from prefixcache.fleet.redis_scripts import seq_text

MAX_MEDIA = 64

Op = tuple[str, "str | None", list[int]]


def _bit(slot: int) -> int:
    """Bit position of worker slot ``slot`` in a SETBIT bitmap read little-endian."""
    return 8 * (slot >> 3) + 7 - (slot & 7)


def _s(v: bytes | str | None) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None else v)


class RedisKvIndex:
    """Fleet index kept in a Redis / Valkey server (``redis://host:port/db``).

    ``prefix`` names the index (keys are ``{prefix}:...``, one hash slot); ``ttl`` is the
    silence in seconds after which a worker counts as expired; ``retries`` bounds the
    retries after a dropped connection (safe: every batch with a sequence number is
    applied at most once, see docs/FLEET.md).

    Arguments are converted by the same functions as ``KvIndex``'s (``_core.fleet_*_arg``):
    the same rules, the same errors, checked before anything is written.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "prefixcache",
        ttl: float | None = None,
        hash_bytes: int = 32,
        retries: int = 3,
        socket_timeout: float = 5.0,
    ) -> None:
        import redis

        # In argument order: the first bad one is named.
        if not isinstance(url, str):
            raise InvalidTypeError(f"url must be a str, got {type(url).__name__}")
        if not isinstance(prefix, str):
            raise InvalidTypeError(f"prefix must be a str, got {type(prefix).__name__}")
        ttl = _core.fleet_ttl_arg(ttl)
        hash_bytes = _core.fleet_hash_bytes_arg(hash_bytes)
        if retries is None:
            raise InvalidTypeError("retries must be an int, got NoneType")
        max_retries = _core.fleet_seq_arg(retries, "retries") or 0
        self._redis_errors = (redis.ConnectionError, redis.TimeoutError)
        self._r = redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._p = "{" + prefix + "}"
        self._ttl = ttl
        self._hash_bytes = hash_bytes
        self._retries = max_retries
        self._apply = self._r.register_script(redis_scripts.APPLY)
        self._record = self._r.register_script(redis_scripts.RECORD_ERROR)
        self._add = self._r.register_script(redis_scripts.ADD_WORKER)
        self._drop = self._r.register_script(redis_scripts.DROP_WORKER)
        self._mark_lost = self._r.register_script(redis_scripts.MARK_LOST)
        self._media: dict[str, int] = {}
        # Workers this client has seen (written or read): registered again, stale, when
        # the server loses its data.
        self._known: set[str] = set()
        #: Times this client found the server's data gone (restart, flush) and re-created it.
        self.state_losses = 0
        self._epoch = self._retry(self._ensure_epoch)

    # -- plumbing -------------------------------------------------------------------

    @property
    def ttl(self) -> float | None:
        return self._ttl

    @property
    def hash_bytes(self) -> int:
        return self._hash_bytes

    @property
    def prefix(self) -> str:
        return self._p

    def close(self) -> None:
        self._r.close()

    def _retry(self, f: Any) -> Any:
        for attempt in range(self._retries + 1):
            try:
                return f()
            except self._redis_errors:
                if attempt == self._retries:
                    raise
                time.sleep(min(0.05 * 2**attempt, 1.0))
        raise AssertionError("unreachable")

    def _ensure_epoch(self) -> str:
        key = self._p + ":epoch"
        self._r.set(key, uuid.uuid4().hex, nx=True)
        return _s(self._r.get(key))

    def _state_lost(self, now: float) -> None:
        """The server lost its data: adopt (or create) its new epoch and register every
        worker this client knew again, stale (see ``redis_scripts.MARK_LOST``), so that
        every client lists, expires, prunes and removes them alike."""
        self.state_losses += 1
        self._media.clear()
        self._epoch = self._retry(self._ensure_epoch)
        for worker in sorted(self._known):
            res = self._retry(
                lambda w=worker: self._mark_lost(keys=[], args=[self._p, self._epoch, w, repr(now)])
            )
            if _s(res[0]) == "epoch":
                # Lost again meanwhile: the next call finds out and starts over.
                return

    def _script(self, script: Any, worker: str, now: float, args: list[Any]) -> tuple[str, bool]:
        """Runs a script; returns (first reply item, whether an attempt failed first)."""
        failed = False
        for attempt in range(self._retries + 1):
            try:
                res = script(keys=[], args=[self._p, self._epoch, worker, repr(now), *args])
            except self._redis_errors:
                if attempt == self._retries:
                    raise
                failed = True
                time.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            head = _s(res[0])
            if head == "epoch":
                self._state_lost(now)
                continue
            if head == "error":
                raise InvalidEventError(_s(res[1]))
            self._known.add(worker)
            return head, failed
        raise RuntimeError(
            f"Redis fleet index: server state lost {self._retries + 1} times in a row"
        )

    @staticmethod
    def _now(now: object) -> float:
        return _core.fleet_now_arg(now)

    @staticmethod
    def _op_args(ops: Sequence[Op]) -> list[Any]:
        args: list[Any] = []
        for kind, medium, hashes in ops:
            args.append(kind[0])
            args.append(medium or "")
            args.append(len(hashes))
            args.extend([format(h, "016x") for h in hashes])
        return args

    @classmethod
    def _batch_args(
        cls,
        ops: Sequence[Op],
        seq: int | None,
        dp_rank: int | str | None,
        ts: float | None,
    ) -> list[Any]:
        """APPLY's arguments after the head. ``dp_rank`` "" leaves the recorded one as is
        (event objects carry none); None is a batch without one. With a sequence number, a
        fresh call id: a retry after a lost reply finds its own batch applied."""
        return [
            "" if seq is None else seq_text(seq),
            "" if seq is None else seq_text(seq + 1),
            "-" if dp_rank is None else dp_rank,
            MAX_MEDIA,
            "" if ts is None else repr(float(ts)),
            "" if seq is None else uuid.uuid4().hex,
            *cls._op_args(ops),
        ]

    def _apply_ops(
        self,
        worker: str,
        ops: Sequence[Op],
        seq: int | None,
        dp_rank: int | str | None,
        now: float,
        ts: float | None = None,
    ) -> str:
        args = self._batch_args(ops, seq, dp_rank, ts)
        if seq is None:
            # Without a sequence number a retry could apply the batch twice: no retry.
            res = self._apply(keys=[], args=[self._p, self._epoch, worker, repr(now), *args])
            head = _s(res[0])
            if head == "epoch":
                self._state_lost(now)
                return self._apply_ops(worker, ops, seq, dp_rank, now, ts)
            self._known.add(worker)
            if head == "error":
                raise InvalidEventError(_s(res[1]))
            return head
        out, _ = self._script(self._apply, worker, now, args)
        return out

    def _record_error(self, worker: str, message: str, now: float) -> None:
        self._script(self._record, worker, now, [message])

    # -- writes -----------------------------------------------------------------------

    def add_worker(self, worker: str, now: float | None = None) -> None:
        worker = _core.fleet_worker_arg(worker)
        self._script(self._add, worker, self._now(now), [])

    def remove_worker(self, worker: str) -> None:
        worker = _core.fleet_worker_arg(worker)
        out, _ = self._script(self._drop, worker, self._now(None), ["remove", ""])
        if out == "unknown":
            self._known.discard(worker)
            raise UnknownWorkerError(f"unknown worker {quoted_name(worker)}")
        self._known.discard(worker)

    def reset_worker(self, worker: str, next_seq: int | None = None) -> None:
        worker = _core.fleet_worker_arg(worker)
        nxt = _core.fleet_seq_arg(next_seq, "next_seq")
        arg = seq_text(0 if nxt is None else nxt)
        out, _ = self._script(self._drop, worker, self._now(None), ["reset", arg])
        if out == "unknown":
            raise UnknownWorkerError(f"unknown worker {quoted_name(worker)}")

    def apply(
        self, worker: str, events: Iterable[Any], seq: int | None = None, now: float | None = None
    ) -> str:
        """Applies event objects; returns "applied", "duplicate" or "gap"."""
        worker = _core.fleet_worker_arg(worker)
        # seq and now in argument order, as KvIndex reads them, before the events.
        seq = _core.fleet_seq_arg(seq, "seq")
        t = self._now(now)
        try:
            ops = _core.decode_kv_events(events, self._hash_bytes)
        except InvalidEventError as e:
            self._record_error(worker, str(e), t)
            raise
        return self._apply_ops(worker, ops, seq, "", t)

    def apply_frames(self, worker: str, frames: Sequence[bytes], now: float | None = None) -> str:
        """Applies one ZMQ message ``[topic, seq, payload]``."""
        worker = _core.fleet_worker_arg(worker)
        t = self._now(now)
        try:
            seq, ts, dp_rank, ops = _core.decode_kv_frames(frames, self._hash_bytes)
        except InvalidEventError as e:
            self._record_error(worker, str(e), t)
            raise
        return self._apply_ops(worker, ops, seq, dp_rank, t, ts)

    def apply_many(
        self, messages: Iterable[tuple[str, Sequence[bytes]]], now: float | None = None
    ) -> list[str]:
        """Applies many ``(worker, frames)`` messages in one pipelined round trip; returns
        each outcome ("error" for a rejected message, counted on its worker)."""
        t = self._now(now)
        # Every argument is checked, and every message decoded, before the first write: a
        # bad argument raises with nothing written.
        pairs = self._messages_arg(messages)
        decoded: list[tuple[str, list[Any]] | None] = []
        rejected: list[tuple[str, str]] = []
        outcomes: list[str] = []
        for worker, frames in pairs:
            try:
                seq, ts, dp_rank, ops = _core.decode_kv_frames(frames, self._hash_bytes)
            except InvalidEventError as e:
                rejected.append((worker, str(e)))
                decoded.append(None)
                continue
            decoded.append((worker, self._batch_args(ops, seq, dp_rank, ts)))
        for worker, message in rejected:
            self._record_error(worker, message, t)
        todo = [d for d in decoded if d is not None]
        results: list[str] = []
        for attempt in range(self._retries + 2):
            try:
                pipe = self._r.pipeline(transaction=False)
                for worker, args in todo:
                    self._apply(
                        keys=[], args=[self._p, self._epoch, worker, repr(t), *args], client=pipe
                    )
                raw = pipe.execute()
            except self._redis_errors:
                if attempt >= self._retries:
                    raise
                time.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            results = [_s(r[0]) for r in raw]
            if "epoch" in results:
                # Part of the pipeline ran against a server that lost its data: start over
                # with the new epoch (batches applied before the loss are gone anyway).
                self._state_lost(t)
                continue
            break
        it = iter(results)
        for d in decoded:
            if d is None:
                outcomes.append("error")
                continue
            self._known.add(d[0])
            outcomes.append(next(it, "error"))
        return outcomes

    @staticmethod
    def _messages_arg(messages: object) -> list[tuple[str, Any]]:
        """``apply_many``'s messages as ``(worker, frames)`` pairs, each worker converted
        as ``KvIndex`` converts it."""
        if isinstance(messages, (str, bytes, bytearray)) or not isinstance(messages, Iterable):
            raise InvalidTypeError(
                "messages must be an iterable of (worker, frames) pairs, "
                f"got {type(messages).__name__}"
            )
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, (tuple, list)) or len(m) != 2:
                raise InvalidTypeError(
                    f"messages[{i}] must be a (worker, frames) pair, got {type(m).__name__}"
                    + (f" of {len(m)} items" if isinstance(m, (tuple, list)) else "")
                )
            out.append((_core.fleet_worker_arg(m[0]), m[1]))
        return out

    def prune_expired(self, now: float | None = None) -> list[str]:
        """Removes workers silent for longer than the TTL; returns their names."""
        t = self._now(now)
        if self._ttl is None:
            return []
        ttl = self._ttl
        gone = []
        # In slot order, as the embedded index: the slots are freed (and later reused, the
        # most recently freed first) and the names returned in the same order.
        for worker, h in sorted(self._health().items(), key=lambda item: item[1][0]):
            # Expired exactly as queries and status say (and as the core computes it):
            # `t - h[3] < ttl` and `h[3] < t - ttl` differ by a rounding.
            if t - h[3] > ttl:
                out, _ = self._script(self._drop, worker, t, ["remove", repr(ttl)])
                if out == "ok":
                    gone.append(worker)
                if out != "kept":
                    self._known.discard(worker)
        return gone

    # -- reads ------------------------------------------------------------------------

    def _health(self) -> dict[str, tuple[int, int, int | None, float]]:
        raw = self._retry(lambda: self._r.hgetall(self._p + ":health"))
        return {_s(k): self._parse_health(v) for k, v in raw.items()}

    @staticmethod
    def _parse_health(v: bytes) -> tuple[int, int, int | None, float]:
        slot, nxt, ms, seen = _s(v).split(" ")
        return int(slot), int(nxt), None if ms == "-" else int(ms), float(seen)

    def _media_ids(self) -> dict[str, int]:
        raw = self._retry(lambda: self._r.hgetall(self._p + ":media"))
        return {_s(k): int(v) for k, v in raw.items()}

    @property
    def media(self) -> list[str]:
        ids = self._media_ids()
        return sorted(ids, key=ids.__getitem__)

    def workers(self) -> list[str]:
        h = self._health()
        return sorted(h, key=lambda w: h[w][0])

    def _glob_prefix(self) -> str:
        """The key prefix as a SCAN pattern matches it literally (a prefix may hold ``*``,
        ``?``, ``[``, ``]`` or ``\\``)."""
        return "".join("\\" + c if c in "*?[]\\" else c for c in self._p)

    @property
    def num_hashes(self) -> int:
        """Distinct hashes held by some worker (a SCAN over the block keys: for tests)."""
        seen = set()
        for k in self._r.scan_iter(match=self._glob_prefix() + ":b:*", count=1000):
            seen.add(_s(k).rsplit(":", 1)[1])
        return len(seen)

    def longest_prefix(
        self,
        hashes: Any = None,
        *,
        tokens: Any = None,
        hasher: Any = None,
        weights: dict[str, float] | None = None,
        now: float | None = None,
    ) -> RemoteFleetMatch:
        """Every worker's longest held prefix of a request, per medium and on any medium."""
        # In argument order, as KvIndex reads them: the first bad one is named.
        hs = _core.fleet_request_hashes(self._hash_bytes, hashes, tokens, hasher)
        wt = _core.fleet_weights_arg(weights)
        t = self._now(now)
        return self._query(hs, None if wt is None else dict(wt), t)

    def _query(self, hs: list[int], weights: dict[str, float] | None, t: float) -> RemoteFleetMatch:
        hexes = [format(h, "016x") for h in hs]
        for _ in range(4):
            media = dict(self._media)
            order = sorted(media, key=media.__getitem__)
            heads = [f"{self._p}:b:{media[m]}:" for m in order]
            keys = [head + x for head in heads for x in hexes]

            def query(keys: list[str] = keys) -> list[Any]:
                pipe = self._r.pipeline(transaction=False)
                pipe.get(self._p + ":epoch")
                pipe.hgetall(self._p + ":health")
                pipe.hgetall(self._p + ":media")
                if keys:
                    pipe.mget(keys)
                return pipe.execute()

            res = self._retry(query)
            epoch, health_raw, media_raw = _s(res[0]), res[1], res[2]
            if epoch != self._epoch:
                # The server lost its data: adopt its new epoch (a reader too) and ask again.
                self._state_lost(t)
                continue
            server_media = {_s(k): int(v) for k, v in media_raw.items()}
            if server_media != media:
                self._media = server_media
                continue
            rows = res[3] if keys else []
            health = {_s(k): self._parse_health(v) for k, v in health_raw.items()}
            return self._answer(hs, order, rows, health, weights, t)
        raise RuntimeError("Redis fleet index: media or epoch changed during four queries in a row")

    def _answer(
        self,
        hs: list[int],
        media: list[str],
        rows: list[Any],
        health: dict[str, tuple[int, int, int | None, float]],
        weights: dict[str, float] | None,
        now: float,
    ) -> RemoteFleetMatch:
        n, nm = len(hs), len(media)
        workers = sorted(health, key=lambda x: health[x][0])
        wt = None if weights is None else [float(weights.get(m, 1.0)) for m in media]
        blocks, flat, score = _core.fleet_bitmap_walk(
            list(rows), nm, [health[w][0] for w in workers], wt
        )
        ttl = self._ttl
        self._known.update(workers)
        return RemoteFleetMatch(
            n,
            media,
            workers,
            blocks,
            [tuple(flat[i * nm : (i + 1) * nm]) for i in range(len(workers))],
            score,
            [h[2] is not None and h[2] >= h[1] for h in (health[w] for w in workers)],
            [ttl is not None and now - health[w][3] > ttl for w in workers],
        )

    def top_k(
        self,
        hashes: Any = None,
        k: int = 1,
        *,
        tokens: Any = None,
        hasher: Any = None,
        weights: dict[str, float] | None = None,
        now: float | None = None,
        include_unhealthy: bool = False,
    ) -> list[tuple[str, float, int]]:
        """The ``k`` best workers as ``(worker, score, blocks)``, best first."""
        # In argument order, as KvIndex reads them: the first bad one is named (``k``
        # comes after ``hashes``, before the keyword-only ``tokens`` and ``hasher``).
        if hashes is not None:
            hs = _core.fleet_request_hashes(self._hash_bytes, hashes, tokens, hasher)
            n = _core.fleet_k_arg(k)
        else:
            n = _core.fleet_k_arg(k)
            hs = _core.fleet_request_hashes(self._hash_bytes, hashes, tokens, hasher)
        wt = _core.fleet_weights_arg(weights)
        t = self._now(now)
        unhealthy = _core.fleet_flag_arg(include_unhealthy, "include_unhealthy")
        m = self._query(hs, None if wt is None else dict(wt), t)
        idx = [i for i in range(len(m)) if unhealthy or not (m.stale_[i] or m.expired_[i])]
        idx.sort(key=lambda i: (-m.score_[i], -m.blocks_[i]))
        return [(m.workers[i], m.score_[i], m.blocks_[i]) for i in idx[:n]]

    def status(self, worker: str, now: float | None = None) -> dict[str, Any]:
        """Sequence state, health and counters of one worker (as ``KvIndex.status``)."""
        worker = _core.fleet_worker_arg(worker)
        t = self._now(now)
        raw = self._retry(lambda: self._r.hgetall(f"{self._p}:w:{worker}"))
        if not raw:
            raise UnknownWorkerError(f"unknown worker {quoted_name(worker)}")
        d = {_s(k): _s(v) for k, v in raw.items()}
        nxt = int(d["next_seq"])
        ms = int(d["max_seen"]) if "max_seen" in d else None
        seen = float(d["last_seen"])
        held = self._retry(lambda: self._r.hlen(f"{self._p}:c:{worker}"))
        return {
            "worker": worker,
            "next_seq": nxt,
            "max_seen_seq": ms,
            "stale": ms is not None and ms >= nxt,
            "expired": self._ttl is not None and t - seen > self._ttl,
            "last_seen": seen,
            **{
                k: int(d[k])
                for k in (
                    "batches",
                    "block_events",
                    "duplicates",
                    "gaps",
                    "restarts",
                    "unknown_removals",
                    "errors",
                )
            },
            "last_error": d.get("last_error"),
            "dp_rank": int(d["dp_rank"]) if "dp_rank" in d else None,
            "num_held": int(held),
        }

    def cached_hashes(self, worker: str, medium: str | None = None) -> list[int]:
        """The hashes ``worker`` holds (on ``medium``, or on any medium), sorted."""
        worker = _core.fleet_worker_arg(worker)
        medium = _core.fleet_medium_arg(medium)
        if not self._retry(lambda: self._r.exists(f"{self._p}:w:{worker}")):
            raise UnknownWorkerError(f"unknown worker {quoted_name(worker)}")
        fields = self._retry(lambda: self._r.hkeys(f"{self._p}:c:{worker}"))
        want = None
        if medium is not None:
            ids = self._media_ids()
            if medium not in ids:
                return []
            want = str(ids[medium])
        out = set()
        for f in fields:
            mid, x = _s(f).split(":")
            if want is None or mid == want:
                out.add(int(x, 16))
        return sorted(out)

    def check_invariants(self) -> None:
        """Full consistency check (tests): copies and holder bitmaps agree exactly."""
        health = self._health()
        pairs = set()
        for w, (slot, *_rest) in health.items():
            for f, c in self._r.hgetall(f"{self._p}:c:{w}").items():
                if int(c) <= 0:
                    raise AssertionError(f"worker {w!r} holds {_s(f)} with {int(c)} copies")
                if not self._r.getbit(f"{self._p}:b:{_s(f)}", slot):
                    raise AssertionError(f"worker {w!r} holds {_s(f)} but its bit is clear")
                pairs.add((slot, _s(f)))
        slots = {h[0] for h in health.values()}
        bits = 0
        for k in self._r.scan_iter(match=self._glob_prefix() + ":b:*", count=1000):
            raw = self._r.get(k)
            v = raw if isinstance(raw, bytes) else b""
            x = int.from_bytes(v, "little")
            if x == 0:
                raise AssertionError(f"empty holder bitmap {_s(k)}")
            f = _s(k).split(":b:", 1)[1]
            for s in range(len(v) * 8):
                if x >> _bit(s) & 1:
                    if s not in slots or (s, f) not in pairs:
                        raise AssertionError(f"{_s(k)} lists slot {s}, which does not hold it")
                    bits += 1
        if bits != len(pairs):
            raise AssertionError(f"{bits} holder bits, {len(pairs)} held pairs")

    def __repr__(self) -> str:
        return f"RedisKvIndex(prefix={self._p!r})"
