"""vLLM v1's block manager behind the simulator's policy protocol."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies.base import PolicyStats, max_k
from prefixcache.sim.requests import RequestId, TokenArray

__all__ = ["BlocksPolicy", "blocks_available"]


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
        publish_events: bool = False,
    ) -> None:
        if block_size < 1:
            raise InvalidInputError(f"block_size must be >= 1, got {block_size}")
        if count_evictions not in ("track", "events"):
            raise InvalidInputError(f"count_evictions must be track or events, "
                                    f"got {count_evictions!r}")
        cls = manager_cls or _default_manager_cls()
        self._use_events = count_evictions == "events"
        self._outbox: list[Any] | None = [] if publish_events else None
        self.name = name or "vllm-blocks"
        self.capacity = capacity
        self.block_size = block_size
        self.usable_blocks = capacity // block_size
        # vLLM's null block (block 0) comes on top of the usable blocks.
        self.mgr = cls(
            self.usable_blocks + 1, block_size=block_size, hash_algo=hash_algo,
            enable_caching=True,
            enable_kv_cache_events=self._use_events or publish_events,
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

        events = self.mgr.take_events()
        if self._outbox is not None:
            self._outbox.extend(events)
        for e in events:
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

    def take_events(self) -> list[Any]:
        """The KV events (``prefixcache.events``) published since the last call, in order
        (needs ``publish_events=True``): what the fleet index of a router consumes. Their
        ``BlockStored.token_ids`` are None (the index reads hashes; building the token
        lists would dominate a fleet replay) and runs of removals are merged
        (``KVCacheManager.take_events(compact=True)``), except with
        ``count_evictions="events"``."""
        if self._outbox is None:
            raise InvalidInputError(f"{self.name} was built without publish_events=True")
        if not self._use_events:
            return list(self.mgr.take_events(compact=True))
        out, self._outbox = self._outbox, []
        return out

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

        return max_k(blocks_needed, int(self.mgr.num_free_blocks))

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
