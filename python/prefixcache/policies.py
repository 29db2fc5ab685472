"""Cache policies behind one protocol, so one scheduler can drive every cache.

A scheduler talks to a policy only through :class:`CachePolicy`:

- ``admit(rid, prompt, reserve, extra_key, cache_salt)``: look up the prompt's cached
  prefix (reuse capped at ``len(prompt) - 1``), take KV for the rest of the prompt plus
  ``reserve`` output tokens (evicting cached tokens when short), return the hit in tokens,
  or ``None`` when the KV budget is still short (nothing held for the request then).
- ``on_prefill_done(rid)``: the prompt's KV exists now (the tree inserts the prompt).
- ``append(rid, tokens)``: the request computes KV for these further tokens (decode);
  take KV for them; False (nothing changed) when short.
- ``finish(rid, tail)``: the request ends; ``tail`` are tokens whose KV exists beyond the
  prompt and the appended tokens (the seed model reserves all output at admission and
  passes it here). Cache what the engine caches and release the rest.
- ``stats()``: evicted tokens, evictions (nodes or blocks), usage.

Adapters: :class:`RadixPolicy` (SGLang's RadixCache, any page size, any cache class with
its API - the Rust core or the plain-Python reference) and :class:`BlocksPolicy` (vLLM v1's
KVCacheManager). Capacity is given in tokens and is the same physical budget for every
policy: the tree gets ``capacity`` KV slots, the block manager ``capacity // block_size``
usable blocks plus vLLM's null block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
    # Policy-specific counters reported beside the common ones (trtllm: partial_hits,
    # partial_tokens, copies, copied_tokens).
    extra: dict[str, int] = field(default_factory=dict)

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

    def append(self, rid: RequestId, tokens: TokenArray) -> bool: ...

    def finish(self, rid: RequestId, tail: TokenArray) -> None: ...

    def max_uniform_growth(self, rids: Sequence[RequestId]) -> int: ...

    def evicted_tokens(self) -> int: ...

    def stats(self) -> PolicyStats: ...

    def check(self) -> None: ...


def _max_k(needed: Callable[[int], int], available: int) -> int:
    """The largest k >= 0 with needed(k) <= available (needed is non-decreasing, and
    grows by at least 1 per step once k passes every request's reserve)."""
    lo, hi = 0, 1
    while needed(hi) <= available:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if needed(mid) <= available:
            lo = mid
        else:
            hi = mid
    return lo


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
        return _max_k(lambda k: int(np.maximum(k - slack, 0).sum()),
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


def _default_manager_cls() -> Callable[..., Any]:
    import prefixcache
    from prefixcache import _core

    cls = getattr(prefixcache, "KVCacheManager", None) or getattr(_core, "KVCacheManager", None)
    if cls is None:
        raise InvalidInputError("this build of prefixcache has no KVCacheManager")
    return cls  # type: ignore[no-any-return]


def blocks_available() -> bool:
    """Whether this build has vLLM's block manager (the ``vllm-blocks`` policy)."""
    try:
        _default_manager_cls()
    except InvalidInputError:
        return False
    return True


def _vllm_extra_keys(extra_key: str | None, cache_salt: str | None) -> dict[str, Any]:
    """A namespace as vLLM keys blocks: extra_key as a LoRA adapter name on every block,
    the cache salt on block 0 only (SEMANTICS.md 2.1)."""
    base: tuple[Any, ...] = (("lora", extra_key, ""),) if extra_key is not None else ()
    out: dict[str, Any] = {}
    if base:
        out["default_extra_keys"] = base
    if cache_salt:
        out["extra_keys"] = [(*base, ("cache_salt", cache_salt))]
    return out


class BlocksPolicy:
    """vLLM v1's block manager (chained block hashes, LRU free queue; SEMANTICS.md 2).

    Lifecycle: longest cached hit capped at ``len(prompt) - 1``, allocate the prompt
    remainder plus ``reserve`` lookahead slots (the full prompt blocks are cached at
    admission), take more slots as output grows, and at finish append the output tokens
    (caching the blocks they fill) and free the blocks in reverse order. ``manager_cls``
    builds the manager (default ``prefixcache.KVCacheManager``); request ids must be ints.

    Evictions are cached blocks whose hash is dropped because the block is reused. With
    ``count_evictions="track"`` (default) the adapter keeps one flag per block (numpy,
    per request, never per token): every full block of a request is cached, and a newly
    allocated block whose flag is set was evicted. ``"events"`` counts the manager's
    BlockRemoved events instead (exact by construction, but materialising every
    BlockStored event costs about 3x the replay); the tests check both agree.
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
        count_evictions: str = "track",
    ) -> None:
        if block_size < 1:
            raise InvalidInputError(f"block_size must be >= 1, got {block_size}")
        if count_evictions not in ("track", "events"):
            raise InvalidInputError(f"count_evictions must be track or events, "
                                    f"got {count_evictions!r}")
        cls = manager_cls or _default_manager_cls()
        self._use_events = count_evictions == "events"
        self.name = name or "vllm-blocks"
        self.capacity = capacity
        self.block_size = block_size
        self.usable_blocks = capacity // block_size
        # vLLM's null block (block 0) comes on top of the usable blocks.
        self.mgr = cls(
            self.usable_blocks + 1, block_size=block_size, hash_algo=hash_algo,
            enable_caching=True, enable_kv_cache_events=self._use_events,
        )
        self.allocated: dict[RequestId, int] = {}  # tokens of KV each request holds
        self.tokens: dict[RequestId, int] = {}  # tokens the manager knows per request
        self.blocks: dict[RequestId, npt.NDArray[np.int64]] = {}  # each request's blocks
        self.flagged: dict[RequestId, int] = {}  # leading blocks already flagged cached
        self._cached = np.zeros(self.usable_blocks + 1, dtype=bool)  # block holds a hash
        self._evicted_blocks = 0
        self._peak = 0

    def _took(self, new_blocks: npt.NDArray[np.int64]) -> None:
        """Blocks just taken from the free queue: those holding a hash were evicted."""
        if not self._use_events and len(new_blocks):
            self._evicted_blocks += int(np.count_nonzero(self._cached[new_blocks]))
            self._cached[new_blocks] = False

    def _cache_full(self, rid: RequestId, n_tokens: int) -> None:
        """The request's blocks full at ``n_tokens`` tokens now hold their hashes."""
        if not self._use_events:
            done, full = self.flagged.get(rid, 0), n_tokens // self.block_size
            if full > done:
                self._cached[self.blocks[rid][done:full]] = True
                self.flagged[rid] = full

    def _drain_events(self) -> None:
        if not self._use_events:
            return
        from prefixcache.events import AllBlocksCleared, BlockRemoved

        for e in self.mgr.take_events():
            if isinstance(e, BlockRemoved):
                self._evicted_blocks += len(e.block_hashes)
            elif isinstance(e, AllBlocksCleared):  # pragma: no cover - never reset here
                raise AssertionError("the prefix cache was reset during a replay")

    def _note_usage(self) -> None:
        used = (self.usable_blocks - int(self.mgr.num_free_blocks)) * self.block_size
        if used > self._peak:
            self._peak = used

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
        got = self.mgr.admit(rid, prompt, reserve, **_vllm_extra_keys(extra_key, cache_salt))
        self._drain_events()
        if got is None:
            return None
        hit, ids = int(got[0]), np.asarray(got[1], dtype=np.int64)
        self.blocks[rid] = ids
        self._took(ids[hit // self.block_size :])
        self._cache_full(rid, len(prompt))
        self.allocated[rid] = len(prompt) + reserve
        self.tokens[rid] = len(prompt)
        self._note_usage()
        return hit

    def on_prefill_done(self, rid: RequestId) -> None:
        # The full prompt blocks were cached when their slots were allocated.
        return None

    def append(self, rid: RequestId, tokens: TokenArray) -> bool:
        have, n = self.allocated[rid], len(tokens)
        known = self.tokens[rid]
        if have - known >= n:  # inside the lookahead reserved at admission
            need = 0
        else:
            bs = self.block_size
            need = -(-(known + n) // bs) - -(-have // bs)
        if need > int(self.mgr.num_free_blocks):
            return False
        self.mgr.append_tokens(rid, tokens)
        new = self.mgr.allocate_slots(rid, n)
        if new is None:  # pragma: no cover - checked above
            raise AssertionError(f"{self.name}: allocation failed with enough free blocks")
        new = np.asarray(new, dtype=np.int64)
        if len(new):
            self.blocks[rid] = np.concatenate([self.blocks[rid], new])
            self._took(new)
        self._cache_full(rid, known + n)
        self._drain_events()
        self.allocated[rid] = max(have, known + n)
        self.tokens[rid] = known + n
        self._note_usage()
        return True

    def finish(self, rid: RequestId, tail: TokenArray) -> None:
        if self.tokens[rid] + len(tail) > self.allocated[rid]:
            raise InvalidInputError(
                f"request {rid!r}: {len(tail)} more tokens exceed its KV"
            )
        ok = self.mgr.finish(rid, tail if len(tail) else None)
        self._drain_events()
        if not ok:  # pragma: no cover - the slots were reserved
            raise AssertionError(f"{self.name}: the pool could not take reserved output")
        self._cache_full(rid, self.tokens[rid] + len(tail))
        del self.allocated[rid]
        del self.tokens[rid]
        del self.blocks[rid]
        self.flagged.pop(rid, None)

    def max_uniform_growth(self, rids: Sequence[RequestId]) -> int:
        if not rids:
            return 0
        have = np.array([self.allocated[r] for r in rids], dtype=np.int64)
        known = np.array([self.tokens[r] for r in rids], dtype=np.int64)
        bs = self.block_size

        def blocks_needed(k: int) -> int:
            return int(((np.maximum(have, known + k) + bs - 1) // bs
                        - (have + bs - 1) // bs).sum())

        return _max_k(blocks_needed, int(self.mgr.num_free_blocks))

    def evicted_tokens(self) -> int:
        return self._evicted_blocks * self.block_size

    def stats(self) -> PolicyStats:
        ev = self._evicted_blocks
        return PolicyStats(
            self.name, self.capacity, self.eviction_unit, ev * self.block_size, ev,
            0, self._peak,
        )

    def check(self) -> None:
        if hasattr(self.mgr, "check_invariants"):
            self.mgr.check_invariants()
        free = int(self.mgr.num_free_blocks)
        if not 0 <= free <= self.usable_blocks:
            raise AssertionError(f"{self.name}: {free} free of {self.usable_blocks} blocks")


POLICY_NAMES = ("radix", "radix-page16", "vllm-blocks")


def make_policy(name: str, capacity: int, *, eviction_policy: str = "lru",
                hash_algo: str = "sha256") -> CachePolicy:
    """Build a policy by name: radix, radix-page<N>, vllm-blocks, vllm-blocks<N>, trtllm,
    trtllm<N>, trtllm-nopartial or trtllm-nopartial<N> (policy_trtllm.py)."""
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
    from prefixcache.policy_trtllm import TrtllmPolicy, parse_trtllm_name

    trt = parse_trtllm_name(name)
    if trt is not None:
        return TrtllmPolicy(capacity, tokens_per_block=trt[0], partial_reuse=trt[1], name=name)
    raise InvalidInputError(
        f"unknown policy {name!r}; expected radix, radix-page<N>, vllm-blocks, "
        "vllm-blocks<N>, trtllm[<N>] or trtllm-nopartial[<N>]"
    )

