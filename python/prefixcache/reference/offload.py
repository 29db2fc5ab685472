"""Plain-Python model of vLLM 0.33's CPU offloading tier (``CPUOffloadingManager`` in
``vllm/v1/kv_offload/cpu/manager.py`` with its LRU and ARC policies), the executable
specification of ``prefixcache.CpuOffloadManager``. Rules: docs/SEMANTICS.md section 2.4.

Keys are block hashes (bytes). vLLM keys an offloaded chunk by ``hash + group_idx``
(4 bytes); with one KV-cache group the group suffix is the same for every key, so
ordering and equality by the hash alone are the same. A request's context (vLLM's
``ReqContext``) is named by an int request id: its key positions (end token of each
key), the keys it accessed and the LRU rank it shares between batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixcache.errors import BlockStateError, InvalidInputError, InvalidTypeError
from prefixcache.events import BlockRemoved, BlockStored, KVCacheEvent, external_hash
from prefixcache.reference.int_args import (
    INT64_MAX,
    SIZE_MAX,
    flag_arg,
    int_arg,
    request_id_arg,
    size_arg,
    str_arg,
    value_list,
)

MEDIUM_CPU = "CPU"
MISS, HIT, HIT_PENDING = "MISS", "HIT", "HIT_PENDING"
# Loads in flight one chunk counts at most (the core's count is an int32; vLLM's is
# unbounded): a load past it is refused, nothing changed.
MAX_LOADS = 2**31 - 1


@dataclass
class Chunk:
    """One slot of host memory: ref_cnt -1 while its store is in flight, 0 idle
    (evictable), > 0 while that many loads read it."""

    chunk_id: int
    ref_cnt: int = -1

    @property
    def ready(self) -> bool:
        return self.ref_cnt >= 0


@dataclass
class PrepareStoreOutput:
    keys_to_store: list[bytes]
    chunk_ids: list[int]
    evicted_keys: list[bytes]


@dataclass
class OffloadingEvent:
    keys: list[bytes]
    removed: bool
    medium: str = MEDIUM_CPU
    metadata_only: bool = False  # a failed store released its chunks (not an eviction)


@dataclass
class RequestState:
    """What vLLM keeps in a request's ReqContext."""

    positions: dict[bytes, int] = field(default_factory=dict)
    seen: list[bytes] = field(default_factory=list)  # keys in first-access order
    seen_set: set[bytes] = field(default_factory=set)
    inserted: set[bytes] = field(default_factory=set)
    reused: set[bytes] = field(default_factory=set)
    store_missed: set[bytes] = field(default_factory=set)
    lru_rank: int | None = None
    # The request's keys in block order (``set_request_keys``), named by the range calls.
    order: list[bytes] = field(default_factory=list)


def _rid(request_id: object) -> int:
    return request_id_arg(request_id)


def _key(k: object, what: str) -> bytes:
    if not isinstance(k, bytes):
        raise InvalidTypeError(f"{what} must be bytes, got {type(k).__name__}")
    if not 1 <= len(k) <= 32:
        raise InvalidInputError(f"{what}: a block hash has 1 to 32 bytes, got {len(k)}")
    return k


def _keys(keys: object) -> list[bytes]:
    """A list or tuple of block hashes (bytes of 1 to 32), as the core reads them."""
    if not isinstance(keys, list | tuple):
        raise InvalidTypeError(f"keys must be a list or tuple of bytes, got {type(keys).__name__}")
    return [_key(k, f"keys[{i}]") for i, k in enumerate(keys)]


class _Lru:
    """Evicts the idle chunk of smallest rank. A rank is (r, -position) for a key a
    request accessed at that end token (every key of one request shares r, so tails
    go before heads), or (r, 0) from the global counter for a touch / finish."""

    def __init__(self) -> None:
        self.chunks: dict[bytes, Chunk] = {}
        self.rank: dict[bytes, tuple[int, int]] = {}
        self.idle: set[bytes] = set()
        self.counter = 0

    def request_rank(self, st: RequestState) -> int:
        if st.lru_rank is None:
            self.counter += 1
            st.lru_rank = self.counter
        return st.lru_rank

    def fresh(self, keys: list[bytes]) -> None:
        for k in keys:
            if k in self.chunks:
                self.counter += 1
                self.rank[k] = (self.counter, 0)

    def insert(self, key: bytes, chunk: Chunk, st: RequestState) -> None:
        self.chunks[key] = chunk
        pos = st.positions.get(key)
        if pos is None:
            self.counter += 1
            self.rank[key] = (self.counter, 0)
        else:
            self.rank[key] = (self.request_rank(st), -pos)

    def remove(self, key: bytes) -> None:
        del self.chunks[key]
        del self.rank[key]
        self.idle.discard(key)

    def touch(self, keys: list[bytes]) -> None:
        self.fresh(keys[::-1])

    def on_store_miss(self, keys: list[bytes]) -> None:
        self.touch(keys)  # vLLM's default hook; the keys are absent, so nothing moves

    def on_access(self, keys: list[bytes], st: RequestState) -> None:
        r = self.request_rank(st)
        for k in keys:
            pos = st.positions.get(k)
            if pos is None or k not in self.chunks:
                continue
            if self.rank[k] < (r, -pos):
                self.rank[k] = (r, -pos)

    def on_finished(
        self, ordered: list[bytes], inserted_only: set[bytes], reused: set[bytes]
    ) -> None:
        self.fresh(ordered[::-1])

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Chunk]] | None:
        cand = sorted((self.rank[k], k) for k in self.idle if k not in protected)
        if len(cand) < n:
            return None
        out = []
        for _, k in cand[:n]:
            out.append((k, self.chunks[k]))
            self.remove(k)
        return out

    def mark_idle(self, key: bytes) -> None:
        self.idle.add(key)

    def mark_busy(self, key: bytes) -> None:
        self.idle.remove(key)

    def clear(self) -> None:
        self.chunks.clear()
        self.rank.clear()
        self.idle.clear()
        self.counter = 0

    def get(self, key: bytes) -> Chunk | None:
        return self.chunks.get(key)

    def __len__(self) -> int:
        return len(self.chunks)


class _Arc:
    """Adaptive replacement: T1 (seen once) and T2 (reused), each oldest first, the
    ghost lists B1/B2 of keys evicted from them, and the target size of T1."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target = 0.0
        # Python dicts keep insertion order: popping and re-adding a key makes it newest.
        self.t1: dict[bytes, Chunk] = {}
        self.t2: dict[bytes, Chunk] = {}
        self.b1: dict[bytes, None] = {}
        self.b2: dict[bytes, None] = {}

    @staticmethod
    def _to_end(d: dict[bytes, object], key: bytes) -> None:
        d[key] = d.pop(key)

    def get(self, key: bytes) -> Chunk | None:
        c = self.t1.get(key)
        return c if c is not None else self.t2.get(key)

    def insert(self, key: bytes, chunk: Chunk, st: RequestState) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: bytes) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _ghost_hit(self, key: bytes) -> None:
        if key in self.b1:
            step = max(1, len(self.b2) / len(self.b1))
            self.target = min(self.target + step, self.capacity)
            self._to_end(self.b1, key)  # type: ignore[arg-type]
        elif key in self.b2:
            step = max(1, len(self.b1) / len(self.b2))
            self.target = max(self.target - step, 0)
            self._to_end(self.b2, key)  # type: ignore[arg-type]

    def on_store_miss(self, keys: list[bytes]) -> None:
        for k in reversed(keys):
            self._ghost_hit(k)

    def touch(self, keys: list[bytes]) -> None:
        for k in reversed(keys):
            if k in self.t1:
                c = self.t1.pop(k)
                (self.t2 if c.ready else self.t1)[k] = c
            elif k in self.t2:
                self._to_end(self.t2, k)  # type: ignore[arg-type]
            else:
                self._ghost_hit(k)

    def on_access(self, keys: list[bytes], st: RequestState) -> None:
        return

    def on_finished(
        self, ordered: list[bytes], inserted_only: set[bytes], reused: set[bytes]
    ) -> None:
        for k in reversed(ordered):
            if k in inserted_only:
                for t in (self.t1, self.t2):
                    if k in t:
                        self._to_end(t, k)  # type: ignore[arg-type]
                        break
            elif k in reused:
                if k in self.t1:
                    self.t2[k] = self.t1.pop(k)
                elif k in self.t2:
                    self._to_end(self.t2, k)  # type: ignore[arg-type]

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Chunk]] | None:
        def idle(t: dict[bytes, Chunk]) -> list[bytes]:
            return [k for k, c in t.items() if c.ref_cnt == 0 and k not in protected]

        from_t1, from_t2 = idle(self.t1), idle(self.t2)
        i1 = i2 = 0
        t1_size = len(self.t1)
        picked: list[tuple[bytes, bool]] = []
        for _ in range(n):
            if t1_size >= int(self.target) and i1 < len(from_t1):
                picked.append((from_t1[i1], True))
                i1 += 1
                t1_size -= 1
            elif i2 < len(from_t2):
                picked.append((from_t2[i2], False))
                i2 += 1
            elif i1 < len(from_t1):
                picked.append((from_t1[i1], True))
                i1 += 1
                t1_size -= 1
            else:
                return None
        out = []
        for k, in_t1 in picked:
            if in_t1:
                out.append((k, self.t1.pop(k)))
                self.b1[k] = None
            else:
                out.append((k, self.t2.pop(k)))
                self.b2[k] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                del ghost[next(iter(ghost))]
        return out

    def mark_idle(self, key: bytes) -> None:
        return

    def mark_busy(self, key: bytes) -> None:
        return

    def clear(self) -> None:
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target = 0.0

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)


class CpuOffloadManager:
    """vLLM 0.33's CPUOffloadingManager: ``num_chunks`` host slots, ``cache_policy``
    "lru" or "arc", a store admitted only once its key was offered ``store_threshold``
    times (a tracker of at most ``max_tracker_size`` keys counts offers)."""

    def __init__(
        self,
        num_chunks: int,
        cache_policy: str = "lru",
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        enable_events: bool = False,
    ) -> None:
        num_chunks = size_arg(num_chunks, "num_chunks")
        cache_policy = str_arg(cache_policy, "cache_policy")
        if cache_policy not in ("lru", "arc"):
            raise InvalidInputError(f"cache_policy must be lru or arc, got {cache_policy!r}")
        store_threshold = int_arg(store_threshold, "store_threshold", 1, 2**32 - 1)
        max_tracker_size = int_arg(max_tracker_size, "max_tracker_size", 1, SIZE_MAX)
        enable_events = flag_arg(enable_events, "enable_events")
        self.num_chunks = num_chunks
        self.cache_policy = cache_policy
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.policy: _Lru | _Arc = _Lru() if cache_policy == "lru" else _Arc(num_chunks)
        self.allocated = 0  # chunk ids handed out once, fresh ids first
        self.free_ids: list[int] = []  # released ids, reused last-in first-out
        self.num_idle = 0
        self.num_pending = 0
        # Offers counted per key, oldest first (only with a threshold >= 2).
        self.counts: dict[bytes, int] | None = {} if store_threshold >= 2 else None
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self.requests: dict[int, RequestState] = {}
        # Totals since construction (not vLLM state): chunks stored, evicted.
        self.num_stored_total = 0
        self.num_evicted_total = 0

    # -- request contexts -----------------------------------------------------------
    def _state(self, rid: int) -> RequestState:
        st = self.requests.get(rid)
        if st is None:
            st = self.requests[rid] = RequestState()
        return st

    def on_new_request(self, request_id: int) -> None:
        self._state(_rid(request_id))

    def set_offload_key_positions(
        self, request_id: int, keys: list[bytes], end_tokens: list[int]
    ) -> None:
        rid, ks = _rid(request_id), _keys(keys)
        ends = value_list(end_tokens, "end_tokens")
        for i, e in enumerate(ends):
            if e < 0:
                raise InvalidInputError(f"end_tokens[{i}] = {e} must be >= 0")
        if len(ends) != len(ks):
            raise InvalidInputError(f"{len(ks)} keys but {len(ends)} end_tokens")
        st = self._state(rid)
        st.positions.update(zip(ks, ends, strict=True))

    def set_request_keys(self, request_id: int, keys: list[bytes], tokens_per_key: int) -> None:
        """The request's keys in block order, key i ending at token
        ``(i + 1) * tokens_per_key`` (the connector's offload keys)."""
        rid, ks = _rid(request_id), _keys(keys)
        t = int_arg(tokens_per_key, "tokens_per_key", 1, SIZE_MAX)
        if len(ks) * t > INT64_MAX:
            raise InvalidInputError(
                f"{len(ks)} keys of {t} tokens end past token 2**63 - 1: an end token "
                "must fit in int64"
            )
        st = self._state(rid)
        st.positions.update((k, (i + 1) * t) for i, k in enumerate(ks))
        st.order = ks

    def set_request_keys_from(self, manager: Any, request_id: int) -> None:
        """``set_request_keys`` with the full blocks' hashes and the block size of a
        ``prefixcache.KVCacheManager``'s request (the core's class only, as the core
        takes it; the reference manager's hashes go through ``set_request_keys``)."""
        from prefixcache import _core

        if not isinstance(manager, _core.KVCacheManager):
            name = type(manager).__name__
            if name == "KVCacheManager":  # another class of the name: said with its module
                name = f"{type(manager).__module__}.{type(manager).__qualname__}"
            raise InvalidTypeError(f"manager must be a KVCacheManager, got {name}")
        rid = _rid(request_id)
        self.set_request_keys(rid, list(manager.block_hashes(rid)), manager.block_size)

    def _range(self, request_id: int, start: int, stop: int) -> tuple[int, list[bytes]]:
        """The request id and its keys ``start:stop`` (none for an unknown request)."""
        rid = _rid(request_id)
        a, b = size_arg(start, "start"), size_arg(stop, "stop")
        st = self.requests.get(rid)
        return rid, ([] if st is None else st.order[a:b])

    def lookup_prefix_range(self, request_id: int, start: int, stop: int) -> int | None:
        return self.lookup_prefix(self._range(request_id, start, stop)[1])

    def prepare_load_range(self, request_id: int, start: int, stop: int) -> int:
        rid, ks = self._range(request_id, start, stop)
        return len(self.prepare_load(rid, ks))

    def complete_load_range(self, request_id: int, start: int, stop: int) -> None:
        rid, ks = self._range(request_id, start, stop)
        self.complete_load(rid, ks)

    def prepare_store_range(
        self, request_id: int, start: int, stop: int, complete: bool = False
    ) -> tuple[int, int] | None:
        """``prepare_store`` of the request's keys ``start:stop``: (keys stored, keys
        evicted) or None; with ``complete`` the stored keys' ``complete_store`` follows."""
        rid, ks = self._range(request_id, start, stop)
        complete = flag_arg(complete, "complete")
        seen: set[bytes] = set()
        for k in ks:
            if k in seen:
                raise InvalidInputError(
                    f"prepare_store keys must be distinct: key {k.hex()} is named twice by "
                    "the request's keys in the range"
                )
            seen.add(k)
        out = self.prepare_store(rid, ks)
        if out is None:
            return None
        if complete and out.keys_to_store:
            self.complete_store(rid, out.keys_to_store)
        return len(out.keys_to_store), len(out.evicted_keys)

    def _record(self, st: RequestState, keys: list[bytes], reused: list[bytes]) -> None:
        new = [k for k in dict.fromkeys(keys) if k not in st.seen_set]
        st.seen.extend(new)
        st.seen_set.update(new)
        if new:
            self.policy.on_access(new, st)
        st.reused.update(k for k in reused if k not in st.inserted)

    def on_request_finished(self, request_id: int) -> None:
        st = self.requests.pop(_rid(request_id), None)
        if st is None:
            return
        ordered = list(st.seen)
        if all(k in st.positions for k in ordered):
            ordered.sort(key=st.positions.__getitem__)
        self.policy.on_finished(ordered, st.inserted - st.reused, st.reused)

    # -- lookups and loads ----------------------------------------------------------
    def lookup(self, key: bytes) -> str:
        c = self.policy.get(_key(key, "key"))
        return MISS if c is None else HIT if c.ready else HIT_PENDING

    def lookup_prefix(self, keys: list[bytes]) -> int | None:
        """The connector's prefix lookup: leading keys present (ready or not), None
        when one of them is still being stored."""
        n, pending = 0, False
        for k in _keys(keys):
            c = self.policy.get(k)
            if c is None:
                break
            n += 1
            pending |= not c.ready
        return None if pending else n

    def prepare_load(self, request_id: int, keys: list[bytes]) -> list[int]:
        rid, ks = _rid(request_id), _keys(keys)
        for k in ks:
            c = self.policy.get(k)
            if c is None or not c.ready:
                raise BlockStateError(f"key {k.hex()} is not stored and ready to load")
        calls: dict[bytes, int] = {}
        for k in ks:
            calls[k] = calls.get(k, 0) + 1
        for k in ks:
            c = self.policy.get(k)
            assert c is not None
            if c.ref_cnt + calls[k] > MAX_LOADS:
                raise BlockStateError(
                    f"key {k.hex()} has {c.ref_cnt} loads in flight: a chunk counts at most "
                    "2**31 - 1"
                )
        ids = []
        for k in ks:
            c = self.policy.get(k)
            assert c is not None
            if c.ref_cnt == 0:
                self.policy.mark_busy(k)
                self.num_idle -= 1
            c.ref_cnt += 1
            ids.append(c.chunk_id)
        self._record(self._state(rid), ks, ks)
        return ids

    def touch(self, request_id: int, keys: list[bytes]) -> None:
        _rid(request_id)
        self.policy.touch(_keys(keys))

    def complete_load(self, request_id: int, keys: list[bytes]) -> None:
        _rid(request_id)
        ks = _keys(keys)
        need: dict[bytes, int] = {}
        for k in ks:
            need[k] = need.get(k, 0) + 1
            c = self.policy.get(k)
            if c is None or c.ref_cnt < need[k]:
                raise BlockStateError(f"key {k.hex()} has no load in flight")
        for k in ks:
            c = self.policy.get(k)
            assert c is not None
            c.ref_cnt -= 1
            if c.ref_cnt == 0:
                self.num_idle += 1
                self.policy.mark_idle(k)

    # -- stores ---------------------------------------------------------------------
    def _count_offers(self, keys: list[bytes]) -> None:
        counts = self.counts
        assert counts is not None
        known = 0
        for k in keys:
            if k in counts:
                counts[k] = counts.pop(k) + 1
                known += 1
        unprotected = len(counts) - known
        for k in keys:
            if k in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if unprotected == 0:
                    continue
                del counts[next(iter(counts))]
                unprotected -= 1
            counts[k] = 1

    def prepare_store(self, request_id: int, keys: list[bytes]) -> PrepareStoreOutput | None:
        rid, ks = _rid(request_id), _keys(keys)
        if len(set(ks)) != len(ks):
            raise InvalidInputError("prepare_store keys must be distinct")
        if self.counts is not None:
            self._count_offers(ks)
        to_store = [k for k in ks if self.policy.get(k) is None]
        ready = [k for k in ks if (c := self.policy.get(k)) is not None and c.ready]
        if self.counts is not None:
            counts = self.counts
            to_store = [k for k in to_store if counts.get(k, 0) >= self.store_threshold]
        st = self._state(rid)
        missed = [k for k in to_store if k not in st.store_missed]
        if missed:
            self.policy.on_store_miss(missed)
            st.store_missed.update(missed)
        recorded = set(to_store) | set(ready)
        self._record(st, [k for k in ks if k in recorded], ready)
        if not to_store:
            return PrepareStoreOutput([], [], [])
        free = len(self.free_ids) + self.num_chunks - self.allocated
        short = len(to_store) - free
        evicted: list[bytes] = []
        if short > 0:
            if short > self.num_idle:
                return None
            got = self.policy.evict(short, set(ks))
            if got is None:
                return None
            self.num_idle -= len(got)
            for k, c in got:
                self.free_ids.append(c.chunk_id)
                evicted.append(k)
        if evicted and self.events is not None:
            self.events.append(OffloadingEvent(evicted, removed=True))
        ids = []
        for _ in to_store:
            if self.allocated < self.num_chunks:
                ids.append(self.allocated)
                self.allocated += 1
        while len(ids) < len(to_store):
            ids.append(self.free_ids.pop())
        for k, i in zip(to_store, ids, strict=True):
            self.policy.insert(k, Chunk(i), st)
        self.num_pending += len(to_store)
        self.num_stored_total += len(to_store)
        self.num_evicted_total += len(evicted)
        st.inserted.update(to_store)
        return PrepareStoreOutput(to_store, ids, evicted)

    def complete_store(self, request_id: int, keys: list[bytes], success: bool = True) -> None:
        _rid(request_id)
        ks = _keys(keys)
        success = flag_arg(success, "success")
        done: list[bytes] = []
        for k in ks:
            c = self.policy.get(k)
            if c is None or c.ready:
                continue
            self.num_pending -= 1
            if success:
                c.ref_cnt = 0
                self.num_idle += 1
                self.policy.mark_idle(k)
            else:
                self.policy.remove(k)
                self.free_ids.append(c.chunk_id)
            done.append(k)
        if done and self.events is not None:
            self.events.append(
                OffloadingEvent(done, removed=not success, metadata_only=not success)
            )

    def reset_cache(self) -> None:
        self.policy.clear()
        self.num_idle = self.num_pending = 0
        self.free_ids.clear()
        self.allocated = 0
        for st in self.requests.values():  # a new cache generation: access state restarts
            positions, order = st.positions, st.order
            st.__init__()  # type: ignore[misc]
            st.positions, st.order = positions, order

    def take_events(self) -> list[OffloadingEvent]:
        if self.events is None:
            return []
        evs, self.events = self.events, []
        out = []
        for e in evs:
            if e.metadata_only:
                keys = [k for k in e.keys if self.policy.get(k) is None]
                if not keys:
                    continue
                e = OffloadingEvent(keys, e.removed, e.medium, True)
            out.append(e)
        return out

    def take_kv_events(
        self, event_hash_format: str = "u64", compact: bool = False
    ) -> list[KVCacheEvent]:
        """The events since the last call as vLLM's OffloadingConnector publishes them:
        one BlockStored per stored key (hash only), one BlockRemoved per removal event (a
        failed store's release publishes nothing), medium "CPU"; ``compact`` merges runs
        of removals, leaves out token ids and gives u64 hashes as uint64 arrays."""
        fmt = str_arg(event_hash_format, "event_hash_format")
        if fmt not in ("u64", "bytes"):
            raise InvalidInputError(f"event_hash_format must be 'u64' or 'bytes', got \"{fmt}\"")
        compact = flag_arg(compact, "compact")
        runs: list[tuple[bool, list[bytes]]] = []  # (removed, keys)
        for e in self.take_events():
            if e.metadata_only:
                continue
            if not e.removed:
                runs.extend((False, [k]) for k in e.keys)
            elif compact and runs and runs[-1][0]:
                runs[-1][1].extend(e.keys)
            else:
                runs.append((True, list(e.keys)))

        def hashes(keys: list[bytes]) -> Any:
            if compact and fmt == "u64":
                return np.array([external_hash(k) for k in keys], dtype=np.uint64)
            return [external_hash(k, fmt) for k in keys]

        return [
            BlockRemoved(hashes(keys), medium=MEDIUM_CPU, group_idx=0)
            if removed
            else BlockStored(
                hashes(keys),
                None,
                None if compact else [],
                0,
                None,
                medium=MEDIUM_CPU,
                group_idx=0,
            )
            for removed, keys in runs
        ]

    # -- counters and checks --------------------------------------------------------
    @property
    def num_write_pending(self) -> int:
        return self.num_pending

    @property
    def num_tracked(self) -> int:
        return 0 if self.counts is None else len(self.counts)

    @property
    def num_stored(self) -> int:
        return len(self.policy)

    @property
    def num_free_chunks(self) -> int:
        return len(self.free_ids) + self.num_chunks - self.allocated

    def check_invariants(self) -> None:
        n = len(self.policy)
        assert n + self.num_free_chunks == self.num_chunks, "chunks lost or doubled"
        chunks = (
            list(self.policy.chunks.values())
            if isinstance(self.policy, _Lru)
            else [
                *self.policy.t1.values(),
                *self.policy.t2.values(),
            ]
        )
        ids = [c.chunk_id for c in chunks] + self.free_ids
        assert sorted(ids) == list(range(self.allocated)), "chunk ids not a permutation"
        assert self.num_idle == sum(c.ref_cnt == 0 for c in chunks)
        assert self.num_pending == sum(c.ref_cnt == -1 for c in chunks)
        if isinstance(self.policy, _Lru):
            idle = {k for k, c in self.policy.chunks.items() if c.ref_cnt == 0}
            assert idle == self.policy.idle
            assert set(self.policy.rank) == set(self.policy.chunks)
        else:
            a = self.policy
            assert not (set(a.t1) & set(a.t2))
            assert len(a.b1) <= self.num_chunks and len(a.b2) <= self.num_chunks
            assert 0 <= a.target <= self.num_chunks
        if self.counts is not None:
            assert len(self.counts) <= self.max_tracker_size
