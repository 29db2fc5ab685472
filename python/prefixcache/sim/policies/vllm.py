"""vLLM v1's block manager behind the simulator's policy protocol."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies.base import (
    IndexArray,
    OutputsOf,
    PolicyStats,
    grow_slots,
)
from prefixcache.sim.requests import RequestId, TokenArray

__all__ = ["BlocksPolicy", "blocks_available", "parse_offload"]

_NO_LIMIT = 1 << 62  # max_uniform_growth without a limit: the pool is the only bound


def parse_offload(offload: str | None) -> tuple[str, int]:
    """The CPU tier's policy and store threshold from an offload name: "lru" (default)
    or "arc", optionally ":K" (a block is stored once offered K times), e.g. "arc:2"."""
    name, sep, k = (offload or "lru").partition(":")
    if name not in ("lru", "arc") or (
        sep and not (k.isascii() and k.isdigit() and 1 <= int(k) < 2**32)
    ):
        raise InvalidInputError(
            f"offload must be lru or arc with an optional :K store threshold "
            f"(1 <= K < 2**32), got {offload!r}"
        )
    return name, int(k) if k else 1


class _TierRequest:
    """One admitted request's state in the CPU tier (the connector's RequestOffloadState;
    the keys themselves stay in the tier, named by block index)."""

    __slots__ = ("load_start", "load_stop", "next_store", "num_prompt_blocks")

    def __init__(self, num_prompt_blocks: int) -> None:
        self.num_prompt_blocks = num_prompt_blocks
        self.load_start = self.load_stop = 0  # blocks pinned by the load until the prefill
        self.next_store = 0  # first prompt block not yet stored (next_stored_chunk_idx)


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
    builds the manager (default ``prefixcache.KVCacheManager``); request ids are ints
    >= 0 (per-request counters live in numpy arrays indexed by them).

    Decode tokens reach the manager only when they change something there: a stretch
    that neither fills a block (which vLLM caches at once) nor needs a new block is
    remembered and handed over with the next one that does (or at finish). The manager
    ends in the same state as if every stretch had been handed over at once, since a
    call that fills and allocates nothing changes nothing but the request's own token
    list.

    Evictions are cached blocks whose hash is dropped because the block is reused. With
    ``count_evictions="counter"`` (default) the adapter reads the manager's counters
    after each call (``num_evicted_blocks``, ``num_cached_blocks``). ``"events"`` counts
    the manager's BlockRemoved / BlockStored events instead (exact by construction, but
    materialising every event costs about 3x the replay); the tests check both agree.

    ``cpu_capacity`` (tokens, 0 = none) puts vLLM's CPU offloading tier behind the pool
    (``prefixcache.CpuOffloadManager``, ``cpu_capacity // block_size`` chunks of one
    block), driven as vLLM's OffloadingConnector drives it; ``offload`` names its policy
    (``parse_offload``). docs/SIMULATOR.md "Offload" lists the rules.
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
        count_evictions: str = "counter",
        publish_events: bool = False,
        cpu_capacity: int = 0,
        offload: str | None = None,
    ) -> None:
        if block_size < 1:
            raise InvalidInputError(f"block_size must be >= 1, got {block_size}")
        if count_evictions not in ("counter", "events"):
            raise InvalidInputError(
                f"count_evictions must be counter or events, got {count_evictions!r}"
            )
        cls = manager_cls or _default_manager_cls()
        self._use_events = count_evictions == "events"
        self._outbox: list[Any] | None = [] if publish_events else None
        self.name = name or "vllm-blocks"
        self.capacity = capacity
        self.block_size = block_size
        self.usable_blocks = capacity // block_size
        # vLLM's null block (block 0) comes on top of the usable blocks.
        try:
            self.mgr = cls(
                self.usable_blocks + 1,
                block_size=block_size,
                hash_algo=hash_algo,
                enable_caching=True,
                enable_kv_cache_events=self._use_events or publish_events,
            )
        except InvalidInputError as e:
            # Named in the caller's terms: the capacity, not the pool's block count.
            raise InvalidInputError(
                f"{self.name} with a capacity of {capacity} tokens ({self.usable_blocks} "
                f"blocks of {block_size}): {e}"
            ) from None
        # Per request (indexed by id): the tokens of KV taken at admission (prompt +
        # reserve), and 1 once its output is queued in the manager for its decode steps.
        self._reserved = np.zeros(0, dtype=np.int64)
        self._queued = np.zeros(0, dtype=np.int64)
        self._running: set[int] = set()  # admitted, not finished (their blocks: block_ids)
        self._num_cached = 0  # blocks holding a hash
        self._evicted_blocks = 0
        self._peak_used = 0
        self._peak_cached = 0
        # The CPU tier (None without one).
        if isinstance(cpu_capacity, bool) or not isinstance(cpu_capacity, int) or cpu_capacity < 0:
            raise InvalidInputError(f"cpu_capacity must be an int >= 0, got {cpu_capacity!r}")
        self.cpu_capacity = cpu_capacity
        self.offload = offload if cpu_capacity > 0 else None  # the tier's policy, as given
        self.tier: Any = None
        self._tier_req: dict[int, _TierRequest] = {}
        self._host_hit: dict[int, int] = {}
        self._host_hit_tokens = 0
        self._peak_host = 0
        if 0 < cpu_capacity < block_size:
            raise InvalidInputError(
                f"{self.name}: cpu_capacity {cpu_capacity} is less than one {block_size}-token "
                "block"
            )
        if cpu_capacity > 0:
            import prefixcache
            from prefixcache import _core

            core_cls = getattr(_core, "KVCacheManager", None)
            self._core_manager = core_cls is not None and isinstance(self.mgr, core_cls)
            policy, threshold = parse_offload(offload)
            self.tier = prefixcache.CpuOffloadManager(
                cpu_capacity // block_size,
                cache_policy=policy,
                store_threshold=threshold,
                enable_events=publish_events,
            )
        elif offload is not None:
            parse_offload(offload)

    # -- helpers -------------------------------------------------------------------
    def _slot(self, rid: RequestId) -> int:
        return grow_slots(self, rid, ("_reserved", "_queued"))

    def _after_call(self) -> int:
        """Account for the manager call just made: evictions, cached blocks and their
        peak. Returns the blocks the call evicted."""
        if self._use_events:
            return self._drain_events()
        total = int(self.mgr.num_evicted_blocks)
        ev = total - self._evicted_blocks
        self._evicted_blocks = total
        self._num_cached = int(self.mgr.num_cached_blocks)
        if self._num_cached > self._peak_cached:
            self._peak_cached = self._num_cached
        return ev

    def _drain_events(self) -> int:
        """Count the manager's events (``count_evictions="events"``); returns the blocks
        removed."""
        if not self._use_events:
            return 0
        from prefixcache.events import AllBlocksCleared, BlockRemoved, BlockStored

        removed = 0
        events = self.mgr.take_events()
        if self._outbox is not None:
            self._outbox.extend(events)
        for e in events:
            if isinstance(e, BlockRemoved):
                removed += len(e.block_hashes)
            elif isinstance(e, BlockStored):
                self._num_cached += len(e.block_hashes)
            elif isinstance(e, AllBlocksCleared):  # pragma: no cover - never reset here
                raise AssertionError("the prefix cache was reset during a replay")
        self._evicted_blocks += removed
        self._num_cached -= removed
        if self._num_cached > self._peak_cached:
            self._peak_cached = self._num_cached
        return removed

    def _note_used(self) -> None:
        used = (self.usable_blocks - int(self.mgr.num_free_blocks)) * self.block_size
        if used > self._peak_used:
            self._peak_used = used

    # -- protocol ------------------------------------------------------------------
    def admit(
        self,
        rid: RequestId,
        prompt: TokenArray,
        reserve: int,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int | None:
        i = self._slot(rid)
        if i in self._running:
            raise InvalidInputError(f"request {rid!r} is already admitted")
        got = self.mgr.admit(i, prompt, reserve, **_vllm_extra_keys(extra_key, cache_salt))
        self._after_call()
        if got is None:
            return None
        hit = int(got[0])
        self._running.add(i)
        self._reserved[i] = len(prompt) + reserve
        self._queued[i] = 0
        self._note_used()
        if self.tier is not None:
            hit += self._tier_admit(i, len(prompt), hit)
        return hit

    def host_hit(self, rid: RequestId) -> int:
        return self._host_hit.get(int(rid), 0)

    # -- the CPU tier (OffloadingConnector, scheduler side) ---------------------------
    def _tier_admit(self, i: int, prompt_len: int, gpu_hit: int) -> int:
        """After the GPU hit: the tier's hit on the following full blocks (capped like
        the GPU hit at ``len(prompt) - 1``), pinned for loading. Returns its tokens."""
        bs = self.block_size
        tier = self.tier
        st = _TierRequest(prompt_len // bs)
        self._tier_req[i] = st
        tier.on_new_request(i)
        # The prompt's full blocks, in order (read in the core when the manager is the
        # core's; another manager, the plain-Python reference, lists its hashes).
        if self._core_manager:
            tier.set_request_keys_from(self.mgr, i)
        else:
            tier.set_request_keys(i, self.mgr.block_hashes(i), bs)
        start, cap = gpu_hit // bs, (prompt_len - 1) // bs
        n = 0
        if cap > start:
            n = tier.lookup_prefix_range(i, start, cap) or 0  # None: a store in flight
        if n:
            tier.prepare_load_range(i, start, start + n)
            st.load_start, st.load_stop = start, start + n
            st.next_store = start + n  # the connector skips the chunks it loads
        self._host_hit[i] = n * bs
        self._host_hit_tokens += n * bs
        return n * bs

    def _tier_store(self, i: int, st: _TierRequest) -> None:
        """Offer the prompt's computed full blocks not yet stored (the connector stores
        prompt blocks only: ``offload_prompt_only``); the store completes at once."""
        if st.load_stop:
            self.tier.complete_load_range(i, st.load_start, st.load_stop)
            st.load_start = st.load_stop = 0
        if st.next_store >= st.num_prompt_blocks:
            return
        out = self.tier.prepare_store_range(i, st.next_store, st.num_prompt_blocks, True)
        if out is None:
            return  # not enough to evict: offered again when the request finishes
        st.next_store = st.num_prompt_blocks
        if out[0]:
            held = int(self.tier.num_stored) * self.block_size
            if held > self._peak_host:
                self._peak_host = held

    def block_ids(self, rid: RequestId) -> IndexArray:
        """The blocks a running request holds (vLLM's block table, in order)."""
        return np.asarray(self.mgr.block_ids(int(rid)), dtype=np.int64)

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
            out = list(self.mgr.take_events(compact=True))
        else:
            out, self._outbox = self._outbox, []
        if self.tier is not None:  # after the pool's, as vLLM's scheduler appends them
            out.extend(self.tier.take_kv_events(compact=True))
        return out

    def on_prefill_done(self, rid: RequestId) -> None:
        # The full prompt blocks were cached when their slots were allocated.
        if self.tier is not None:
            st = self._tier_req.get(int(rid))
            if st is not None:
                self._tier_store(int(rid), st)

    def grow(
        self,
        rids: IndexArray,
        k: int,
        fed_from: IndexArray,
        outputs: OutputsOf,
    ) -> IndexArray | None:
        mgr = self.mgr
        # A request's output is queued in the manager at its first decode stretch; each
        # stretch then feeds the next k tokens of every request in one call.
        fresh = (self._queued[rids] == 0).nonzero()[0]
        if len(fresh):
            for j in fresh.tolist():
                i = int(rids[j])
                mgr.queue_tokens(i, outputs(i)[int(fed_from[j]) :])
            self._queued[rids[fresh]] = 1
        if self._use_events:
            evicted = self._decode_counting_events(rids, k)
        else:
            ev, peak = mgr.decode_steps(rids, k)
            if len(ev) < len(rids):
                raise AssertionError(f"{self.name}: growth of {k} promised but refused")
            ev = np.asarray(ev, dtype=np.int64)
            evicted = None
            if ev.any():
                evicted = ev * self.block_size
                self._evicted_blocks = int(mgr.num_evicted_blocks)
            if peak > self._peak_cached:
                self._peak_cached = int(peak)
        self._note_used()
        return evicted

    def _decode_counting_events(self, rids: IndexArray, k: int) -> IndexArray | None:
        """``grow``'s decode steps one request at a time, counting each one's events
        (``count_evictions="events"``). Returns the evicted tokens per running request."""
        evicted = None
        for j, i in enumerate(rids.tolist()):
            if len(self.mgr.decode_steps([i], k)[0]) < 1:
                raise AssertionError(f"{self.name}: growth of {k} promised but refused")
            ev = self._after_call()
            if ev:
                if evicted is None:
                    evicted = np.zeros(len(rids), dtype=np.int64)
                evicted[j] = ev * self.block_size
        return evicted

    def finish(self, rid: RequestId, tail: TokenArray) -> None:
        i = int(rid)
        if len(tail) and int(self.mgr.num_tokens(i)) + len(tail) > int(self._reserved[i]):
            raise InvalidInputError(f"request {rid!r}: {len(tail)} more tokens exceed its KV")
        ok = self.mgr.finish(i, tail if len(tail) else None)
        self._after_call()
        if self.tier is not None:
            st = self._tier_req.pop(i, None)
            if st is not None:
                self._tier_store(i, st)
            self.tier.on_request_finished(i)
        if not ok:  # pragma: no cover - the slots were reserved
            raise AssertionError(f"{self.name}: the pool could not take reserved output")
        self._reserved[i] = self._queued[i] = 0
        self._running.discard(i)

    def max_uniform_growth(
        self,
        rids: Sequence[RequestId] | IndexArray,
        limit: int | None = None,
    ) -> int:
        if not len(rids):
            return 0
        return int(self.mgr.max_decode_steps(rids, _NO_LIMIT if limit is None else limit))

    def evicted_tokens(self) -> int:
        return self._evicted_blocks * self.block_size

    def stats(self) -> PolicyStats:
        ev = self._evicted_blocks
        bs = self.block_size
        if not self._use_events:  # decode steps cache blocks without a read of the count
            self._num_cached = int(self.mgr.num_cached_blocks)
        return PolicyStats(
            self.name,
            self.capacity,
            self.eviction_unit,
            ev * bs,
            ev,
            self._num_cached * bs,
            self._peak_used,
            self._peak_cached * bs,
            cpu_capacity=self.cpu_capacity,
            host_hit_tokens=self._host_hit_tokens,
            stored_tokens=int(self.tier.num_stored_total) * bs if self.tier is not None else 0,
            host_evicted_tokens=(
                int(self.tier.num_evicted_total) * bs if self.tier is not None else 0
            ),
            peak_host_tokens=self._peak_host,
        )

    def check(self) -> None:
        if hasattr(self.mgr, "check_invariants"):
            self.mgr.check_invariants()
        if self.tier is not None:
            self.tier.check_invariants()
        free = int(self.mgr.num_free_blocks)
        if not 0 <= free <= self.usable_blocks:
            raise AssertionError(f"{self.name}: {free} free of {self.usable_blocks} blocks")
