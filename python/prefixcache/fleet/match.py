"""The answer of a fleet-index query computed outside the core (the Redis backend): the
same interface as ``prefixcache.FleetMatch``, column by column."""

from __future__ import annotations

from dataclasses import dataclass

from prefixcache import _core
from prefixcache.errors import UnknownWorkerError


def quoted_name(name: str) -> str:
    """A name quoted as the core's messages quote it (Rust's ``{:?}``)."""
    out = ['"']
    for c in name:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif not c.isprintable():
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


@dataclass(frozen=True)
class WorkerPrefix:
    """One worker's part of a query answer."""

    worker: str
    blocks: int
    per_medium: tuple[int, ...]
    score: float
    stale: bool
    expired: bool


class RemoteFleetMatch:
    """Each worker's longest held prefix of one request (in blocks), per medium and on any
    medium, its score and its health; read by worker name like ``FleetMatch``.
    ``per_medium[i]`` lists worker ``i``'s prefix on each medium of ``media``."""

    __slots__ = (
        "_pos",
        "blocks_",
        "expired_",
        "media",
        "num_blocks",
        "per_medium",
        "score_",
        "stale_",
        "workers",
    )

    def __init__(
        self,
        num_blocks: int,
        media: list[str],
        workers: list[str],
        blocks: list[int],
        per_medium: list[tuple[int, ...]],
        score: list[float],
        stale: list[bool],
        expired: list[bool],
    ) -> None:
        self.num_blocks = num_blocks
        self.media = media
        self.workers = workers
        self.blocks_ = blocks
        self.per_medium = per_medium
        self.score_ = score
        self.stale_ = stale
        self.expired_ = expired
        self._pos = {w: i for i, w in enumerate(workers)}

    def _i(self, worker: str) -> int:
        """The position of ``worker``, converted as ``FleetMatch`` converts it (the same
        errors, the same messages)."""
        worker = _core.fleet_worker_arg(worker)
        try:
            return self._pos[worker]
        except KeyError:
            raise UnknownWorkerError(f"unknown worker {quoted_name(worker)}") from None

    def blocks(self, worker: str, medium: str | None = None) -> int:
        worker = _core.fleet_worker_arg(worker)
        medium = _core.fleet_medium_arg(medium)
        i = self._i(worker)
        if medium is None:
            return self.blocks_[i]
        try:
            return self.per_medium[i][self.media.index(medium)]
        except ValueError:
            return 0

    def score(self, worker: str) -> float:
        return self.score_[self._i(worker)]

    def stale(self, worker: str) -> bool:
        return self.stale_[self._i(worker)]

    def expired(self, worker: str) -> bool:
        return self.expired_[self._i(worker)]

    def entry(self, worker: str) -> WorkerPrefix:
        i = self._i(worker)
        return WorkerPrefix(
            worker,
            self.blocks_[i],
            self.per_medium[i],
            self.score_[i],
            self.stale_[i],
            self.expired_[i],
        )

    @property
    def entries(self) -> list[WorkerPrefix]:
        return [self.entry(w) for w in self.workers]

    def to_dict(self) -> dict[str, dict[str, object]]:
        return {
            w: {
                "blocks": self.blocks_[i],
                "media": dict(zip(self.media, self.per_medium[i], strict=True)),
                "score": self.score_[i],
                "stale": self.stale_[i],
                "expired": self.expired_[i],
            }
            for i, w in enumerate(self.workers)
        }

    def __len__(self) -> int:
        return len(self.workers)

    def __repr__(self) -> str:
        return f"RemoteFleetMatch(num_blocks={self.num_blocks}, workers={len(self.workers)})"
