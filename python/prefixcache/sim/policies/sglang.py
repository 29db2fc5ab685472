"""SGLang's radix tree behind the simulator's policy protocol, with SGLang's request
lifecycle and a pool of KV slot indices."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies.base import IndexArray, PolicyStats, max_k
from prefixcache.sim.requests import RequestId, TokenArray

__all__ = ["RadixPolicy", "SlotPool"]


class SlotPool:
    """A pool of ``capacity`` KV slot indices (int64), allocated and freed as arrays.

    Memory grows with the slots in use, not with the capacity: never-used slots are
    handed out from a counter, released ones from a stack (so a huge or "unlimited"
    budget costs nothing up front).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise InvalidInputError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._fresh = 0  # slots [_fresh, capacity) were never handed out
        self._stack = np.empty(1024, dtype=np.int64)  # released slots: _stack[:_top]
        self._top = 0

    @property
    def free(self) -> int:
        return self.capacity - self._fresh + self._top

    def alloc(self, n: int) -> IndexArray:
        if n > self.free:
            raise InvalidInputError(f"slot pool: {n} slots requested, {self.free} free")
        k = min(n, self._top)
        self._top -= k
        out = self._stack[self._top : self._top + k]
        if k == n:
            return out.copy()
        fresh = np.arange(self._fresh, self._fresh + n - k, dtype=np.int64)
        self._fresh += n - k
        return np.concatenate([out, fresh]) if k else fresh

    def release(self, idx: IndexArray) -> None:
        n = len(idx)
        if n == 0:
            return
        if self.free + n > self.capacity:
            raise InvalidInputError("slot pool: more slots freed than allocated")
        need = self._top + n
        if need > len(self._stack):
            grown = np.empty(max(need, 2 * len(self._stack)), dtype=np.int64)
            grown[: self._top] = self._stack[: self._top]
            self._stack = grown
        self._stack[self._top : need] = idx
        self._top = need


class _TreeSeq:
    __slots__ = ("appended", "appended_kv", "cache_salt", "extra_key", "filled", "kv", "node",
                 "prompt", "protected")

    def __init__(
        self, prompt: TokenArray, kv: IndexArray, protected: int, node: Any,
        extra_key: str | None, cache_salt: str | None,
    ) -> None:
        self.prompt = prompt
        self.kv = kv  # slot of token i of prompt + output (tail: reserved, unused yet)
        self.protected = protected  # kv[:protected] belongs to the tree (locked by node)
        self.node = node  # the locked node, None when nothing is locked
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.appended: list[TokenArray] = []  # decode tokens with KV, in order
        self.appended_kv: list[IndexArray] = []  # slots taken after admission
        self.filled = len(prompt)  # slots in use; the rest of kv was reserved at admission

    def held(self) -> int:
        return len(self.kv) + sum(len(a) for a in self.appended_kv)


class RadixPolicy:
    """SGLang's radix tree with the engine's request lifecycle (SEMANTICS.md 1.8, 5).

    ``cache_cls`` builds the tree (default: the Rust core ``prefixcache.RadixCache``; the
    plain-Python reference ``prefixcache.reference.radix.RadixCache`` has the same API).
    """

    eviction_unit = "nodes"

    def __init__(
        self,
        capacity: int,
        *,
        page_size: int = 1,
        eviction_policy: str = "lru",
        cache_cls: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> None:
        if page_size < 1:
            raise InvalidInputError(f"page_size must be >= 1, got {page_size}")
        if cache_cls is None:
            from prefixcache import RadixCache

            cache_cls = RadixCache
        self.name = name or ("radix" if page_size == 1 else f"radix-page{page_size}")
        self.capacity = capacity
        self.page = page_size
        self.tree = cache_cls(page_size=page_size, eviction_policy=eviction_policy)
        self.pool = SlotPool(capacity)
        self.seqs: dict[RequestId, _TreeSeq] = {}
        self._evicted_tokens = 0
        self._evicted_nodes = 0
        self._peak = 0

    # -- helpers -------------------------------------------------------------------
    def _evict(self, n: int) -> None:
        before = self.tree.num_nodes
        freed = self.tree.evict(n)
        self._evicted_nodes += before - self.tree.num_nodes
        self._evicted_tokens += len(freed)
        self.pool.release(np.asarray(freed, dtype=np.int64))

    def _ensure_free(self, need: int) -> bool:
        short = need - self.pool.free
        if short > 0 and self.tree.evictable_size() > 0:
            self._evict(short)
        return self.pool.free >= need

    def _note_usage(self) -> None:
        used = self.capacity - self.pool.free
        if used > self._peak:
            self._peak = used

    def _cache(self, seq: _TreeSeq, tokens: TokenArray) -> int:
        """Insert the page-aligned ``tokens`` with the request's slots; free duplicates.

        Returns the aligned length. Duplicates are the request's own slots for tokens
        the tree already held: ``[protected, prefix_len)``.
        """
        aligned = len(tokens) // self.page * self.page
        if aligned == 0:
            return 0
        r = self.tree.insert(
            tokens[:aligned], seq.kv[:aligned], extra_key=seq.extra_key,
            cache_salt=seq.cache_salt,
        )
        if r.prefix_len > seq.protected:
            self.pool.release(seq.kv[seq.protected : r.prefix_len])
        return aligned

    # -- protocol ------------------------------------------------------------------
    def admit(
        self,
        rid: RequestId,
        prompt: TokenArray,
        reserve: int,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        if rid in self.seqs:
            raise InvalidInputError(f"request {rid!r} is already admitted")
        m = self.tree.match_prefix(prompt[:-1], extra_key=extra_key, cache_salt=cache_salt)
        hit = int(m.length)
        node = m.node if hit > 0 else None
        if node is not None:
            self.tree.inc_lock_ref(node)
        need = len(prompt) + reserve - hit
        if not self._ensure_free(need):
            if node is not None:
                self.tree.dec_lock_ref(node)
            return None
        kv = np.concatenate([np.asarray(m.indices, dtype=np.int64), self.pool.alloc(need)])
        self.seqs[rid] = _TreeSeq(prompt, kv, hit, node, extra_key, cache_salt)
        self._note_usage()
        return hit

    def on_prefill_done(self, rid: RequestId) -> None:
        seq = self.seqs[rid]
        aligned = self._cache(seq, seq.prompt)
        if aligned == 0:
            return
        # Adopt the tree's slots for the whole aligned prompt and move the lock there.
        m = self.tree.match_prefix(
            seq.prompt[:aligned], extra_key=seq.extra_key, cache_salt=seq.cache_salt
        )
        seq.kv[:aligned] = m.indices
        self.tree.inc_lock_ref(m.node)
        if seq.node is not None:
            self.tree.dec_lock_ref(seq.node)
        seq.node = m.node
        seq.protected = aligned

    def append(self, rid: RequestId, tokens: TokenArray) -> bool:
        seq = self.seqs[rid]
        n = len(tokens)
        more = n - max(0, seq.held() - seq.filled)  # beyond the reserved slots
        if more > 0:
            if not self._ensure_free(more):
                return False
            seq.appended_kv.append(self.pool.alloc(more))
            self._note_usage()
        seq.appended.append(tokens)
        seq.filled += n
        return True

    def finish(self, rid: RequestId, tail: TokenArray) -> None:
        seq = self.seqs.pop(rid)
        if seq.appended:
            seq.kv = np.concatenate([seq.kv, *seq.appended_kv])
            tokens = np.concatenate([seq.prompt, *seq.appended, tail])
        else:
            tokens = np.concatenate([seq.prompt, tail]) if len(tail) else seq.prompt
        if len(tokens) > len(seq.kv):
            raise InvalidInputError(
                f"request {rid!r}: {len(tokens)} tokens but KV for only {len(seq.kv)}"
            )
        aligned = self._cache(seq, tokens)
        # The unaligned tail and any reserved but unused slots go back to the pool.
        self.pool.release(seq.kv[max(aligned, seq.protected) :])
        if seq.node is not None:
            self.tree.dec_lock_ref(seq.node)

    def max_uniform_growth(self, rids: Sequence[RequestId]) -> int:
        if not rids:
            return 0
        slack = np.array([self.seqs[r].held() - self.seqs[r].filled for r in rids],
                         dtype=np.int64)
        return max_k(lambda k: int(np.maximum(k - slack, 0).sum()),
                      self.pool.free + int(self.tree.evictable_size()))

    def evicted_tokens(self) -> int:
        return self._evicted_tokens

    def stats(self) -> PolicyStats:
        return PolicyStats(
            self.name, self.capacity, self.eviction_unit, self._evicted_tokens,
            self._evicted_nodes, int(self.tree.total_size()), self._peak,
        )

    def check(self) -> None:
        """Slot conservation: free + cached + held privately by requests == capacity."""
        private = sum(s.held() - s.protected for s in self.seqs.values())
        total = self.pool.free + int(self.tree.total_size()) + private
        if total != self.capacity:
            raise AssertionError(
                f"{self.name}: free {self.pool.free} + cached {self.tree.total_size()} + "
                f"private {private} != capacity {self.capacity}"
            )
        ev, pr = int(self.tree.evictable_size()), int(self.tree.protected_size())
        if ev + pr != int(self.tree.total_size()):
            raise AssertionError(f"{self.name}: evictable + protected != total")
