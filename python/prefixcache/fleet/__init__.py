"""The fleet index: which worker of a fleet of engine instances holds the longest prefix of
a request, kept exact from the KV events the engines publish (docs/FLEET.md).

- ``KvIndex`` (embedded, in-process, the Rust core) and ``RedisKvIndex`` (Redis / Valkey,
  shared by several router processes): one API. ``open_index(url)`` picks one.
- ``KvEventSubscriber`` / ``Publisher``: feed an index from ZMQ publishers in a thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefixcache._core import FleetMatch, KvIndex, decode_kv_events, decode_kv_frames
from prefixcache.errors import InvalidInputError, InvalidTypeError
from prefixcache.fleet.match import RemoteFleetMatch, WorkerPrefix
from prefixcache.fleet.redis_index import RedisKvIndex

if TYPE_CHECKING:
    from prefixcache.fleet.subscriber import KvEventSubscriber, Publisher, SubscriberStats

_SUBSCRIBER = ("KvEventSubscriber", "Publisher", "SubscriberStats")


def __getattr__(name: str) -> Any:
    # The subscriber needs pyzmq (the "fleet" extra); the embedded index does not.
    if name in _SUBSCRIBER:
        from prefixcache.fleet import subscriber

        return getattr(subscriber, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "valkey://", "valkeys://")


def open_index(
    url: str | None = None, *, ttl: float | None = None, hash_bytes: int = 32, **options: Any
) -> KvIndex | RedisKvIndex:
    """A fleet index: embedded when ``url`` is None (or ``"memory://"``), else Redis /
    Valkey at ``url`` (``redis://host:port/db``; ``valkey://`` is read as ``redis://``).
    ``options`` go to ``RedisKvIndex`` (``prefix``, ``retries``, ``socket_timeout``)."""
    if url is not None and not isinstance(url, str):
        raise InvalidTypeError(f"url must be a str or None, got {type(url).__name__}")
    if url is None or url == "memory://":
        if options:
            raise InvalidTypeError(f"options {sorted(options)} apply to the Redis backend only")
        return KvIndex(ttl=ttl, hash_bytes=hash_bytes)
    if url.startswith(REDIS_SCHEMES):
        if url.startswith("valkey"):
            url = "redis" + url[len("valkey") :]
        return RedisKvIndex(url, ttl=ttl, hash_bytes=hash_bytes, **options)
    raise InvalidInputError(
        f"unknown fleet index url {url!r} (expected None, memory://, redis://, rediss://, "
        "unix://, valkey:// or valkeys://)"
    )


__all__ = [
    "FleetMatch",
    "KvEventSubscriber",
    "KvIndex",
    "Publisher",
    "RedisKvIndex",
    "RemoteFleetMatch",
    "SubscriberStats",
    "WorkerPrefix",
    "decode_kv_events",
    "decode_kv_frames",
    "open_index",
]
