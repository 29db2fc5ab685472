"""Cache policies behind one protocol, so one scheduler can drive every cache.

A scheduler talks to a policy only through :class:`CachePolicy`:

- ``admit(rid, prompt, reserve, extra_key, cache_salt)``: look up the prompt's cached
  prefix (reuse capped at ``len(prompt) - 1``), take KV for the rest of the prompt plus
  ``reserve`` output tokens (evicting cached tokens when short), return the hit in tokens,
  or ``None`` when the KV budget is still short (nothing held for the request then).
- ``on_prefill_done(rid)``: the prompt's KV exists now (the tree inserts the prompt).
- ``append(rid, n)``: take KV for ``n`` more output tokens; False when short.
- ``finish(rid, output)``: the request ends with ``output`` generated (its KV exists);
  cache what the engine caches and release the rest.
- ``stats()``: evicted tokens, evictions (nodes or blocks), usage.

Adapters: :class:`RadixPolicy` (SGLang's RadixCache, any page size, any cache class with
its API - the Rust core or the plain-Python reference) and :class:`BlocksPolicy` (vLLM v1's
KVCacheManager). Capacity is given in tokens and is the same physical budget for every
policy: the tree gets ``capacity`` KV slots, the block manager ``capacity // block_size``
usable blocks plus vLLM's null block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError
from prefixcache.workloads import RequestId, TokenArray

IndexArray = npt.NDArray[np.int64]

__all__ = [
    "POLICY_NAMES",
    "BlocksPolicy",
    "CachePolicy",
    "PolicyStats",
    "RadixPolicy",
    "SlotPool",
    "make_policy",
]


@dataclass
class PolicyStats:
    """Counters a policy keeps over a replay."""

    name: str
    capacity: int  # tokens
    eviction_unit: str  # "nodes" or "blocks"
    evicted_tokens: int = 0
    evictions: int = 0  # nodes or blocks evicted
    cached_tokens: int = 0  # tokens held by the cache at the end
    peak_used_tokens: int = 0  # KV in use by requests or the cache, maximum over time

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CachePolicy(Protocol):
    """What a scheduler needs from a prefix cache."""

    name: str
    capacity: int

    def admit(
        self,
        rid: RequestId,
        prompt: TokenArray,
        reserve: int,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int | None: ...

    def on_prefill_done(self, rid: RequestId) -> None: ...

    def append(self, rid: RequestId, n: int) -> bool: ...

    def finish(self, rid: RequestId, output: TokenArray) -> None: ...

    def max_uniform_growth(self, rids: Sequence[RequestId]) -> int: ...

    def evicted_tokens(self) -> int: ...

    def stats(self) -> PolicyStats: ...

    def check(self) -> None: ...


class SlotPool:
    """A pool of ``capacity`` KV slot indices (int64), allocated and freed as arrays."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise InvalidInputError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._buf = np.arange(capacity, dtype=np.int64)
        self._top = capacity  # _buf[:_top] are free

    @property
    def free(self) -> int:
        return self._top

    def alloc(self, n: int) -> IndexArray:
        if n > self._top:
            raise InvalidInputError(f"slot pool: {n} slots requested, {self._top} free")
        self._top -= n
        return self._buf[self._top : self._top + n].copy()

    def release(self, idx: IndexArray) -> None:
        n = len(idx)
        if n == 0:
            return
        if self._top + n > self.capacity:
            raise InvalidInputError("slot pool: more slots freed than allocated")
        self._buf[self._top : self._top + n] = idx
        self._top += n


class _TreeSeq:
    __slots__ = ("cache_salt", "extra_key", "kv", "node", "prompt", "protected")

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
            from prefixcache import RadixCache  # type: ignore[attr-defined]

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

    def append(self, rid: RequestId, n: int) -> bool:
        seq = self.seqs[rid]
        if not self._ensure_free(n):
            return False
        seq.kv = np.concatenate([seq.kv, self.pool.alloc(n)])
        self._note_usage()
        return True

    def finish(self, rid: RequestId, output: TokenArray) -> None:
        seq = self.seqs.pop(rid)
        tokens = np.concatenate([seq.prompt, output]) if len(output) else seq.prompt
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
        return int((self.pool.free + self.tree.evictable_size()) // len(rids))

    def evicted_tokens(self) -> int:
        return self._evicted_tokens

    def stats(self) -> PolicyStats:
        return PolicyStats(
            self.name, self.capacity, self.eviction_unit, self._evicted_tokens,
            self._evicted_nodes, int(self.tree.total_size()), self._peak,
        )

    def check(self) -> None:
        """Slot conservation: free + cached + held privately by requests == capacity."""
        private = sum(len(s.kv) - s.protected for s in self.seqs.values())
        total = self.pool.free + int(self.tree.total_size()) + private
        if total != self.capacity:
            raise AssertionError(
                f"{self.name}: free {self.pool.free} + cached {self.tree.total_size()} + "
                f"private {private} != capacity {self.capacity}"
            )
        ev, pr = int(self.tree.evictable_size()), int(self.tree.protected_size())
        if ev + pr != int(self.tree.total_size()):
            raise AssertionError(f"{self.name}: evictable + protected != total")


class BlocksPolicy:
    """vLLM v1's block manager (chained block hashes, LRU free queue; SEMANTICS.md 2).

    Lifecycle: longest cached hit capped at ``len(prompt) - 1``, allocate the prompt
    remainder plus ``reserve`` lookahead slots (the full prompt blocks are cached at
    admission), append output tokens as they are generated (newly full blocks are
    cached), free the request's blocks in reverse order at finish. ``manager_cls`` builds
    the manager (default ``prefixcache.KVCacheManager``).
    """

    eviction_unit = "blocks"

    def __init__(
        self,
        capacity: int,
        *,
        block_size: int = 16,
        hash_algo: str = "sha256",
        manager_cls: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> None:
        if block_size < 1:
            raise InvalidInputError(f"block_size must be >= 1, got {block_size}")
        if manager_cls is None:
            from prefixcache import KVCacheManager  # type: ignore[attr-defined]

            manager_cls = KVCacheManager
        self.name = name or "vllm-blocks"
        self.capacity = capacity
        self.block_size = block_size
        self.usable_blocks = capacity // block_size
        # vLLM's null block (block 0) comes on top of the usable blocks.
        self.mgr = manager_cls(
            self.usable_blocks + 1, block_size=block_size, hash_algo=hash_algo,
            enable_caching=True,
        )
        self.allocated: dict[RequestId, int] = {}  # tokens of KV each request holds
        self.tokens: dict[RequestId, int] = {}  # tokens each request has appended
        self._peak = 0

    def _blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def _note_usage(self) -> None:
        used = (self.usable_blocks - self._free_blocks()) * self.block_size
        if used > self._peak:
            self._peak = used

    def _free_blocks(self) -> int:
        return int(self.mgr.num_free_blocks)

    def _evicted_blocks(self) -> int:
        return int(self.mgr.num_evicted_blocks)

    def admit(
        self,
        rid: RequestId,
        prompt: TokenArray,
        reserve: int,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        if rid in self.allocated:
            raise InvalidInputError(f"request {rid!r} is already admitted")
        self.mgr.add_request(rid, prompt, extra_key=extra_key, cache_salt=cache_salt)
        blocks, hit = self.mgr.get_computed_blocks(rid)
        hit = int(hit)
        got = self.mgr.allocate_slots(
            rid, len(prompt) - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks,
            num_lookahead_tokens=reserve,
        )
        if got is None:
            self.mgr.free(rid)
            return None
        self.allocated[rid] = len(prompt) + reserve
        self.tokens[rid] = len(prompt)
        self._note_usage()
        return hit

    def on_prefill_done(self, rid: RequestId) -> None:
        # The full prompt blocks were cached when their slots were allocated.
        return None

    def append(self, rid: RequestId, n: int) -> bool:
        have = self.allocated[rid]
        got = self.mgr.allocate_slots(rid, 0, num_lookahead_tokens=have + n - self.tokens[rid])
        if got is None:
            return False
        self.allocated[rid] = have + n
        self._note_usage()
        return True

    def finish(self, rid: RequestId, output: TokenArray) -> None:
        if self.tokens[rid] + len(output) > self.allocated[rid]:
            raise InvalidInputError(
                f"request {rid!r}: {len(output)} output tokens exceed its KV"
            )
        if len(output):
            self.mgr.append_tokens(rid, output)
        self.mgr.free(rid)
        del self.allocated[rid]
        del self.tokens[rid]

    def max_uniform_growth(self, rids: Sequence[RequestId]) -> int:
        if not rids:
            return 0
        free = self._free_blocks()
        have = np.array([self.allocated[r] for r in rids], dtype=np.int64)
        bs = self.block_size

        def blocks_needed(k: int) -> int:
            return int(((have + k + bs - 1) // bs - (have + bs - 1) // bs).sum())

        lo, hi = 0, free * bs + bs  # blocks_needed(hi) > free for any non-empty rids
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks_needed(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def evicted_tokens(self) -> int:
        return self._evicted_blocks() * self.block_size

    def stats(self) -> PolicyStats:
        ev = self._evicted_blocks()
        return PolicyStats(
            self.name, self.capacity, self.eviction_unit, ev * self.block_size, ev,
            int(self.mgr.num_cached_blocks) * self.block_size, self._peak,
        )

    def check(self) -> None:
        free = self._free_blocks()
        if not 0 <= free <= self.usable_blocks:
            raise AssertionError(f"{self.name}: {free} free of {self.usable_blocks} blocks")


POLICY_NAMES = ("radix", "radix-page16", "vllm-blocks")


def make_policy(name: str, capacity: int, *, eviction_policy: str = "lru",
                hash_algo: str = "sha256") -> CachePolicy:
    """Build a policy by name: radix, radix-page<N>, vllm-blocks or vllm-blocks<N>."""
    if name == "radix":
        return RadixPolicy(capacity, eviction_policy=eviction_policy)
    if name.startswith("radix-page") and name[len("radix-page"):].isdigit():
        page = int(name[len("radix-page"):])
        return RadixPolicy(capacity, page_size=page, eviction_policy=eviction_policy, name=name)
    if name == "vllm-blocks" or (
        name.startswith("vllm-blocks") and name[len("vllm-blocks"):].isdigit()
    ):
        bs = int(name[len("vllm-blocks"):] or 16)
        return BlocksPolicy(capacity, block_size=bs, hash_algo=hash_algo, name=name)
    raise InvalidInputError(
        f"unknown policy {name!r}; expected radix, radix-page<N>, vllm-blocks or vllm-blocks<N>"
    )

