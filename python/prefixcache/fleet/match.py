"""The answer of a fleet-index query computed outside the core (the Redis backend): the
same interface as ``prefixcache.FleetMatch``."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.errors import UnknownWorkerError


@dataclass(frozen=True)
class WorkerPrefix:
    """One worker's part of a query answer."""

    worker: str
    blocks: int
    per_medium: tuple[int, ...]
    score: float
    stale: bool
    expired: bool


@dataclass(frozen=True)
class RemoteFleetMatch:
    """Each worker's longest held prefix of one request (in blocks), per medium and on any
    medium, its score and its health; read by worker name like ``FleetMatch``."""

    num_blocks: int
    media: list[str]
    entries: list[WorkerPrefix]
    _by_name: dict[str, WorkerPrefix] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {e.worker: e for e in self.entries})

    def _get(self, worker: str) -> WorkerPrefix:
        try:
            return self._by_name[worker]
        except KeyError:
            raise UnknownWorkerError(f"unknown worker {worker!r}") from None

    @property
    def workers(self) -> list[str]:
        return [e.worker for e in self.entries]

    def blocks(self, worker: str, medium: str | None = None) -> int:
        e = self._get(worker)
        if medium is None:
            return e.blocks
        try:
            return e.per_medium[self.media.index(medium)]
        except ValueError:
            return 0

    def score(self, worker: str) -> float:
        return self._get(worker).score

    def stale(self, worker: str) -> bool:
        return self._get(worker).stale

    def expired(self, worker: str) -> bool:
        return self._get(worker).expired

    def to_dict(self) -> dict[str, dict[str, object]]:
        return {
            e.worker: {
                "blocks": e.blocks,
                "media": dict(zip(self.media, e.per_medium, strict=True)),
                "score": e.score,
                "stale": e.stale,
                "expired": e.expired,
            }
            for e in self.entries
        }

    def __len__(self) -> int:
        return len(self.entries)
