"""Plain-Python fleet index: the executable specification of ``KvIndex``.

Events are ``(kind, medium, hashes)`` ops as ``_core.decode_kv_events`` returns them.
"""

from __future__ import annotations

from collections import Counter


class FleetReference:
    def __init__(self, ttl: float | None = None) -> None:
        self.ttl = ttl
        self.media: list[str] = []
        # worker -> medium -> Counter(hash -> copies)
        self.held: dict[str, dict[str, Counter[int]]] = {}
        self.next_seq: dict[str, int] = {}
        self.max_seen: dict[str, int | None] = {}
        self.last_seen: dict[str, float] = {}

    def add_worker(self, w: str, now: float = 0.0) -> None:
        if w not in self.held:
            self.held[w] = {}
            self.next_seq[w] = 0
            self.max_seen[w] = None
            self.last_seen[w] = now

    def remove_worker(self, w: str) -> None:
        for d in (self.held, self.next_seq, self.max_seen, self.last_seen):
            del d[w]

    def apply(
        self,
        w: str,
        ops: list[tuple[str, str | None, list[int]]],
        seq: int | None,
        now: float = 0.0,
    ) -> str:
        self.add_worker(w, now)
        self.last_seen[w] = max(self.last_seen[w], now)
        if seq is not None:
            if seq < self.next_seq[w]:  # without a batch timestamp, a repeated 0 too
                return "duplicate"
            elif seq > self.next_seq[w]:
                ms = self.max_seen[w]
                self.max_seen[w] = seq if ms is None else max(ms, seq)
                return "gap"
        for kind, m, _ in ops:
            if kind != "cleared" and (m or "GPU") not in self.media:
                self.media.append(m or "GPU")
        for kind, m, hashes in ops:
            if kind == "cleared":
                self.held[w] = {}
                continue
            c = self.held[w].setdefault(m or "GPU", Counter())
            for h in hashes:
                if kind == "stored":
                    c[h] += 1
                elif c[h] > 1:
                    c[h] -= 1
                else:
                    c.pop(h, None)  # the last copy, or a hash the worker did not hold
        if seq is not None:
            self.next_seq[w] = seq + 1
            ms = self.max_seen[w]
            if ms is not None and ms < seq + 1:
                self.max_seen[w] = None
        return "applied"

    def cached_hashes(self, w: str, medium: str | None = None) -> list[int]:
        out: set[int] = set()
        for m, c in self.held[w].items():
            if medium is None or m == medium:
                out |= {h for h, n in c.items() if n > 0}
        return sorted(out)

    def stale(self, w: str) -> bool:
        ms = self.max_seen[w]
        return ms is not None and ms >= self.next_seq[w]

    def longest(self, w: str, hashes: list[int], medium: str | None = None) -> int:
        held = self.held[w]
        n = 0
        for h in hashes:
            if medium is None:
                ok = any(c.get(h, 0) > 0 for c in held.values())
            else:
                ok = held.get(medium, Counter()).get(h, 0) > 0
            if not ok:
                break
            n += 1
        return n

    def score(self, w: str, hashes: list[int], weights: dict[str, float]) -> float:
        s = 0.0
        for h in hashes[: self.longest(w, hashes)]:
            s += max(weights.get(m, 1.0) for m, c in self.held[w].items() if c.get(h, 0) > 0)
        return s
