"""Shared helpers of the fleet-index tests: the vLLM event vectors, a real redis-server
process on a free loopback port, a vLLM-style ZMQ publisher with a replay ROUTER socket,
and a TCP proxy that can drop a connection mid-reply. No mocks: real sockets, real servers.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest

VECTORS = Path(__file__).parent / "data" / "vllm_kv_events.jsonl"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def load_vectors() -> list[dict[str, Any]]:
    out = []
    for line in VECTORS.read_text().splitlines():
        d = json.loads(line)
        d["payload"] = base64.b64decode(d["payload_b64"])
        d["frames"] = [d["topic"].encode(), d["seq"].to_bytes(8, "big"), d["payload"]]
        d["name"] = f"worker{d['worker']}"
        out.append(d)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server (or valkey-server) process on 127.0.0.1, no persistence."""

    def __init__(self, port: int | None = None) -> None:
        self.binary = shutil.which("redis-server") or shutil.which("valkey-server")
        if self.binary is None:
            if os.environ.get("PREFIXCACHE_REQUIRE_REDIS"):
                pytest.fail("redis-server / valkey-server not found (PREFIXCACHE_REQUIRE_REDIS)")
            pytest.skip("redis-server / valkey-server not installed")
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        assert self.binary is not None
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def redis_url() -> tuple[str, RedisServer | None]:
    """The server CI started (``PREFIXCACHE_REDIS_URL``), or a fresh one."""
    url = os.environ.get("PREFIXCACHE_REDIS_URL")
    if url:
        return url, None
    srv = RedisServer().start()
    return srv.url, srv


class ReplayPublisher:
    """vLLM's ZmqEventPublisher protocol: PUB frames ``[topic, seq, payload]`` and a ROUTER
    replay socket answering ``[b"", start_seq]`` with one reply per buffered batch from
    ``start_seq`` on, then an end marker. ``replay_topic`` (vLLM 0.33, SGLang 0.5.23):
    replies ``[b"", topic, seq, payload]``, end ``[b"", b"", END_SEQ, b""]``; otherwise
    (earlier vLLM) ``[b"", seq, payload]``, end ``[b"", END_SEQ, b""]``."""

    def __init__(
        self, ctx: Any, topic: bytes = b"", buffer_steps: int = 10_000, replay_topic: bool = True
    ) -> None:
        import zmq

        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        rport = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        self.topic = topic
        self.replay_topic = replay_topic
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.lock = threading.Lock()
        self.replay_requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def send(self, seq: int, payload: bytes, *, publish: bool = True) -> None:
        """Buffers a batch and (unless ``publish`` is False: a dropped message) sends it."""
        with self.lock:
            self.buffer.append((seq, payload))
            if publish:
                self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def send_raw(self, parts: list[bytes]) -> None:
        with self.lock:
            self.pub.send_multipart(parts)

    def _serve(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(20):
                continue
            client, _, start = self.router.recv_multipart()
            self.replay_requests += 1
            first = int.from_bytes(start, "big")
            with self.lock:
                head = [self.topic] if self.replay_topic else []
                for seq, payload in list(self.buffer):
                    if seq >= first:
                        self.router.send_multipart(
                            [client, b"", *head, seq.to_bytes(8, "big"), payload]
                        )
                end = [b""] if self.replay_topic else []
                self.router.send_multipart([client, b"", *end, END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.pub.close(0)
        self.router.close(0)


class DroppingProxy:
    """A TCP proxy to ``port``; ``drop_next_reply()`` makes it close the connection after
    the next request reached the server but before the reply reaches the client."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.drop = threading.Event()
        self.drops = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def drop_next_reply(self) -> None:
        self.drop.set()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            s = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(c, s, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(s, c, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self.drop.is_set():
                    self.drop.clear()
                    self.drops += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
