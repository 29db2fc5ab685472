"""SGLang's radix tree behind the simulator's policy protocol, with SGLang's request
lifecycle and an account of the KV slots it uses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from prefixcache.errors import InvalidInputError
from prefixcache.sim.policies.base import IndexArray, OutputsOf, PolicyStats, grow_slots, max_k
from prefixcache.sim.policies.tree_events import DEFAULT_EVENT_BLOCK, TreeBlockEvents
from prefixcache.sim.requests import RequestId, TokenArray

__all__ = ["RADIX_OFFLOADS", "RadixPolicy", "SlotBudget"]

# Host tier write policies (SGLang --hicache-write-policy), simulator spelling first.
RADIX_OFFLOADS = ("write-through", "write-through-selective", "write-back")
# SGLang `load_back_threshold`: a host hit shorter than this is recomputed, not loaded.
LOAD_BACK_THRESHOLD = 10


class SlotBudget:
    """``capacity`` KV slots, counted: how many are free.

    The simulator never reads what a KV slot holds, so it does not need to know which
    slot is which: the tree gets placeholder values (none at all, so it keeps the tokens
    as its values; zeros for a host load) and the adapter counts the slots it takes from
    and gives back to the budget. No memory is sized for the
    capacity (an "unlimited" budget costs nothing).
    """

    __slots__ = ("capacity", "free")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise InvalidInputError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.free = capacity

    def take(self, n: int) -> None:
        if n > self.free:
            raise InvalidInputError(f"KV slots: {n} requested, {self.free} free")
        self.free -= n

    def give(self, n: int) -> None:
        if n < 0 or self.free + n > self.capacity:
            raise InvalidInputError("KV slots: more slots freed than taken")
        self.free += n


class _TreeSeq:
    __slots__ = ("cache_salt", "extra_key", "node", "prompt", "protected")

    def __init__(
        self,
        prompt: TokenArray,
        protected: int,
        node: Any,
        extra_key: str | None,
        cache_salt: str | None,
    ) -> None:
        self.prompt = prompt
        self.protected = protected  # the first `protected` tokens' KV belongs to the tree
        self.node = node  # the locked node, None when nothing is locked
        self.extra_key = extra_key
        self.cache_salt = cache_salt


class RadixPolicy:
    """SGLang's radix tree with the engine's request lifecycle (SEMANTICS.md 1.8, 5).

    ``cache_cls`` builds the tree (default: the Rust core ``prefixcache.RadixCache``; the
    plain-Python reference ``prefixcache.reference.radix.RadixCache`` has the same API).
    ``cpu_capacity`` > 0 puts SGLang's HiCache host tier of that many tokens behind the
    GPU, with write policy ``offload`` (docs/SIMULATOR.md, "Offload"); 0 is no tier.
    ``publish_events`` makes the tree's full blocks of ``event_block_size`` tokens (default:
    the page size, 16 for a page-1 tree) available as KV events (:meth:`take_events`,
    ``tree_events.py``), on ``GPU`` and, with a host tier, on ``CPU``: the view a router's
    fleet index gets of the instance.
    Request ids are ints >= 0 (the schedulers use request indices): per-request counters
    live in numpy arrays indexed by them, so a decode stretch of every running request
    is a few array operations.
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
        cpu_capacity: int = 0,
        offload: str | None = None,
        publish_events: bool = False,
        event_block_size: int | None = None,
    ) -> None:
        if page_size < 1:
            raise InvalidInputError(f"page_size must be >= 1, got {page_size}")
        if cpu_capacity < 0:
            raise InvalidInputError(f"cpu_capacity must be >= 0, got {cpu_capacity}")
        write = RADIX_OFFLOADS[0] if offload is None else offload
        if write not in RADIX_OFFLOADS:
            raise InvalidInputError(
                f"unknown offload {offload!r} for {name or 'radix'}: expected one of "
                + ", ".join(RADIX_OFFLOADS)
            )
        if cache_cls is None:
            from prefixcache import RadixCache

            cache_cls = RadixCache
        self.name = name or ("radix" if page_size == 1 else f"radix-page{page_size}")
        self.capacity = capacity
        self.page = page_size
        self.cpu_capacity = cpu_capacity
        self.offload = write if cpu_capacity > 0 else None
        if cpu_capacity > 0:
            self.tree = cache_cls(
                page_size=page_size,
                eviction_policy=eviction_policy,
                host_capacity=cpu_capacity,
                write_policy=write.replace("-", "_"),
                host_events=publish_events,
            )
        else:
            self.tree = cache_cls(page_size=page_size, eviction_policy=eviction_policy)
        self.pool = SlotBudget(capacity)
        if event_block_size is None:
            event_block_size = page_size if page_size > 1 else DEFAULT_EVENT_BLOCK
        if event_block_size < 1:
            raise InvalidInputError(f"event_block_size must be >= 1, got {event_block_size}")
        self.event_block_size = event_block_size
        self.events = TreeBlockEvents(event_block_size) if publish_events else None
        self._host_events = publish_events and cpu_capacity > 0
        self.seqs: dict[int, _TreeSeq] = {}
        # Per request (indexed by id): slots held (prompt + reserve + grown, the tree's
        # share included), those of them not holding a token's KV yet, and where the
        # output fed by decode stretches starts (-1 before the first stretch; it ends
        # where the held slots' KV does).
        self._held = np.zeros(0, dtype=np.int64)
        self._slack = np.zeros(0, dtype=np.int64)
        self._fed_lo = np.zeros(0, dtype=np.int64)
        self._host_hit = np.zeros(0, dtype=np.int64)  # host part of the last admit's hit
        self._host_hit_tokens = 0
        self._outputs: OutputsOf | None = None
        self._zeros = np.zeros(0, dtype=np.int64)  # placeholder KV values of host loads
        self._private = 0  # slots held by requests beyond the tree's share
        self._evicted_tokens = 0
        self._evicted_nodes = 0
        self._peak_used = 0
        self._peak_cached = 0

    # -- helpers -------------------------------------------------------------------
    def _slot(self, rid: RequestId) -> int:
        return grow_slots(self, rid, ("_held", "_slack", "_fed_lo", "_host_hit"))

    def _values(self, n: int) -> IndexArray:
        if n > len(self._zeros):
            self._zeros = np.zeros(max(n, 2 * len(self._zeros)), dtype=np.int64)
        return self._zeros[:n]

    def _device_nodes(self) -> int:
        """Nodes holding device KV: an eviction takes one each leaf (with a host tier a
        backed-up leaf stays in the tree, host-only)."""
        return self.tree.num_nodes - self.tree.num_host_only_nodes

    def _evict(self, n: int) -> int:
        before = self._device_nodes()
        if self.events is None:  # only the count matters: no array of freed indices
            freed = int(self.tree.evict_count(n))
        else:
            values = self.tree.evict(n)
            if self._host_events:  # write-back copies, host copies dropped to make room
                self.events.host(*self.tree.take_host_events(nonzero=True))
            self.events.freed(values)
            freed = len(values)
        self._evicted_nodes += before - self._device_nodes()
        self._evicted_tokens += freed
        self.pool.give(freed)
        return freed

    def _ensure_free(self, need: int) -> bool:
        """Free ``need`` slots, evicting the shortfall; False, with nothing evicted, when
        even evicting every evictable token would not do (SGLang's PrefillAdder refuses
        such a request against free + evictable before anything is allocated)."""
        short = need - self.pool.free
        if short <= 0:
            return True
        if short > int(self.tree.evictable_size()):
            return False
        self._evict(short)
        return self.pool.free >= need

    def _note_used(self) -> None:
        used = self._private + int(self.tree.protected_size())
        if used > self._peak_used:
            self._peak_used = used

    def _note_cached(self) -> None:
        cached = int(self.tree.total_size())
        if cached > self._peak_cached:
            self._peak_cached = cached

    def _cache(self, seq: _TreeSeq, tokens: TokenArray) -> int:
        """Insert the page-aligned ``tokens``; the request's duplicate slots go back.

        Returns the aligned length. Duplicates are the request's own slots for tokens
        the tree already held: ``[protected, prefix_len)``.
        """
        aligned = len(tokens) // self.page * self.page
        if aligned == 0:
            return 0
        ev = self.events
        values: IndexArray | None
        if ev is None:
            # No values: the tree keeps the tokens as its values, and no array of the
            # whole sequence's placeholder values is read (and copied) per insert.
            values = None
        else:
            # The tree holds [0, protected) (the locked path): label the rest.
            start = min(seq.protected, aligned)
            keys = ev.keys(tokens[:aligned], seq.extra_key, seq.cache_salt)
            labelled, ids = ev.label(keys, start, aligned)
            values = np.zeros(aligned, dtype=np.int64)
            values[start:] = labelled
        r = self.tree.insert(
            tokens[:aligned],
            values,
            extra_key=seq.extra_key,
            cache_salt=seq.cache_salt,
        )
        if ev is not None:
            ev.stored(keys, start, ids, int(r.prefix_len))
            if self._host_events:  # write-through copies, host copies dropped for them
                ev.host(*self.tree.take_host_events(nonzero=True))
        dup = int(r.prefix_len) - seq.protected
        if dup > 0:
            self.pool.give(dup)
        # The tree now owns [0, aligned): [protected, aligned) left the request's share.
        if aligned > seq.protected:
            self._private -= aligned - seq.protected
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
        i = self._slot(rid)
        if i in self.seqs:
            raise InvalidInputError(f"request {rid!r} is already admitted")
        m = self.tree.match_prefix(prompt[:-1], extra_key=extra_key, cache_salt=cache_salt)
        hit = int(m.length)
        node = m.node if hit > 0 else None
        # Host tier (SGLang init_load_back): a host hit of at least LOAD_BACK_THRESHOLD
        # tokens is loaded back. The lock on the last host node protects the device path
        # and the host-only tail while eviction makes room.
        host = int(m.host_hit_length) if self.cpu_capacity > 0 else 0
        if host < LOAD_BACK_THRESHOLD:
            host = 0
        else:
            node = m.last_host_node
        if node is not None:
            self.tree.inc_lock_ref(node)
        held = len(prompt) + reserve
        # Device slots: the loaded tokens (the tree's) plus the rest of the request.
        need = held - hit
        if not self._ensure_free(need):
            if node is not None:
                self.tree.dec_lock_ref(node)
            return None
        self.pool.take(need)
        if host:
            ev = self.events
            if ev is None:
                self.tree.load_back(m.last_host_node, self._values(host))
            else:
                keys = ev.keys(prompt[: hit + host], extra_key, cache_salt)
                values, ids = ev.label(keys, hit, hit + host)
                self.tree.load_back(m.last_host_node, values)
                ev.stored(keys, hit, ids, hit)
            hit += host
            self._host_hit_tokens += host
        self._host_hit[i] = host
        self._private += need - host
        self.seqs[i] = _TreeSeq(prompt, hit, node, extra_key, cache_salt)
        self._held[i] = held
        self._slack[i] = held - len(prompt)
        self._fed_lo[i] = -1
        self._note_used()
        return hit

    def host_hit(self, rid: RequestId) -> int:
        i = int(rid)
        return int(self._host_hit[i]) if 0 <= i < len(self._host_hit) else 0

    def on_prefill_done(self, rid: RequestId) -> None:
        seq = self.seqs[int(rid)]
        aligned = self._cache(seq, seq.prompt)
        if aligned == 0:
            return
        # Adopt the tree's slots for the whole aligned prompt and move the lock there
        # (the match also refreshes the path's access time, as SGLang's does).
        m = self.tree.match_prefix(
            seq.prompt[:aligned], extra_key=seq.extra_key, cache_salt=seq.cache_salt
        )
        self.tree.inc_lock_ref(m.node)
        if seq.node is not None:
            self.tree.dec_lock_ref(seq.node)
        seq.node = m.node
        seq.protected = max(seq.protected, aligned)
        self._note_cached()

    def grow(
        self,
        rids: IndexArray,
        k: int,
        fed_from: IndexArray,
        outputs: OutputsOf,
    ) -> IndexArray | None:
        self._outputs = outputs
        first = self._fed_lo[rids] < 0
        self._fed_lo[rids[first]] = fed_from[first]
        lack = k - self._slack[rids]
        more = np.maximum(lack, 0)
        self._slack[rids] = more - lack
        total = int(more.sum())
        if total == 0:
            return None
        evicted = None
        if total > self.pool.free:
            # Evict as the requests take their slots one after the other, so each is
            # charged what was evicted for it (one evict of the total would evict the
            # same leaves: the tree evicts in a fixed order until enough is free).
            evicted = np.zeros(len(rids), dtype=np.int64)
            for j in np.flatnonzero(more):
                need = int(more[j])
                short = need - self.pool.free
                if short > 0 and self.tree.evictable_size() > 0:
                    evicted[j] = self._evict(short)
                if need > self.pool.free:
                    raise AssertionError(f"{self.name}: growth of {k} promised but refused")
                self.pool.free -= need
        else:
            self.pool.free -= total
        self._held[rids] += more
        self._private += total
        self._note_used()
        return evicted

    def finish(self, rid: RequestId, tail: TokenArray) -> None:
        i = int(rid)
        seq = self.seqs.pop(i)
        parts = [seq.prompt]
        n_fed = int(self._held[i] - self._slack[i]) - len(seq.prompt)
        if n_fed:
            if self._outputs is None:  # pragma: no cover - grow always sets it
                raise AssertionError("decode tokens without their outputs")
            lo = int(self._fed_lo[i])
            parts.append(self._outputs(i)[lo : lo + n_fed])
        if len(tail):
            parts.append(tail)
        tokens = np.concatenate(parts) if len(parts) > 1 else seq.prompt
        held = int(self._held[i])
        if len(tokens) > held:
            self.seqs[i] = seq
            raise InvalidInputError(f"request {rid!r}: {len(tokens)} tokens but KV for only {held}")
        aligned = self._cache(seq, tokens)
        # The unaligned tail and any reserved but unused slots go back to the budget.
        rest = held - max(aligned, seq.protected)
        self.pool.give(rest)
        self._private -= rest
        self._held[i] = self._slack[i] = 0
        self._fed_lo[i] = -1
        if seq.node is not None:
            self.tree.dec_lock_ref(seq.node)
        self._note_cached()

    def max_uniform_growth(
        self,
        rids: Sequence[RequestId] | IndexArray,
        limit: int | None = None,
    ) -> int:
        if not len(rids):
            return 0
        avail = self.pool.free + int(self.tree.evictable_size())
        if limit is not None and limit * len(rids) <= avail:
            return limit  # k steps take at most k slots per request
        idx = np.asarray(rids, dtype=np.int64)
        slack = self._slack[idx]
        return max_k(lambda k: int(np.maximum(k - slack, 0).sum()), avail, limit)

    def evicted_tokens(self) -> int:
        return self._evicted_tokens

    def take_events(self) -> list[dict[str, Any]]:
        """The KV events (``"type"``-tagged dicts: the tree's blocks stored and removed,
        on ``GPU`` the device copies, on ``CPU`` the host copies) since the last call, in
        order; needs ``publish_events=True``."""
        if self.events is None:
            raise InvalidInputError(f"{self.name} was built without publish_events=True")
        return self.events.take()

    def stats(self) -> PolicyStats:
        st = PolicyStats(
            self.name,
            self.capacity,
            self.eviction_unit,
            self._evicted_tokens,
            self._evicted_nodes,
            int(self.tree.total_size()),
            self._peak_used,
            self._peak_cached,
        )
        if self.cpu_capacity > 0:
            st.note_host_tier(self.cpu_capacity, self._host_hit_tokens, self.tree.host_stats())
        return st

    def check(self) -> None:
        """Slot conservation: free + cached + held privately by requests == capacity."""
        private = sum(int(self._held[i]) - s.protected for i, s in self.seqs.items())
        if private != self._private:
            raise AssertionError(f"{self.name}: private slots {private} != {self._private}")
        total = self.pool.free + int(self.tree.total_size()) + private
        if total != self.capacity:
            raise AssertionError(
                f"{self.name}: free {self.pool.free} + cached {self.tree.total_size()} + "
                f"private {private} != capacity {self.capacity}"
            )
        ev, pr = int(self.tree.evictable_size()), int(self.tree.protected_size())
        if ev + pr != int(self.tree.total_size()):
            raise AssertionError(f"{self.name}: evictable + protected != total")
        if self.cpu_capacity > 0 and int(self.tree.host_size()) > self.cpu_capacity:
            raise AssertionError(f"{self.name}: host tier over its capacity")
