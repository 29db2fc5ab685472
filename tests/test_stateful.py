"""Stateful property tests: one hypothesis RuleBasedStateMachine per core class, driving
the Rust core and the plain-Python reference in lockstep.

Each rule applies one operation to both and compares results (or error classes); the
invariants compare the observable state (dumps, sizes, free block ids, events, stats)
and run the core's own consistency checks. The operation vocabularies and comparison
helpers are the differential tests' (tests/radix_ops.py, test_blocks_differential.py,
test_trie_differential.py, test_hash_differential.py): hypothesis shrinks a failing run
to a minimal rule sequence and prints it as replayable code.

Bounded (SETTINGS): the whole file runs in a few seconds.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from radix_ops import NAMESPACES, PRIORITIES, Lockstep
from test_blocks_differential import (
    HASHES,
    both,
    check_same_manager,
    check_same_pool,
    prompt_strategy,
)
from test_hash_differential import fresh, key_tuples
from test_trie_differential import op_st as trie_op_st
from test_trie_differential import outcome as trie_outcome
from test_trie_differential import state as trie_state

import prefixcache
from prefixcache.reference import blocks as ref_blocks
from prefixcache.reference import hashing as ref_hashing
from prefixcache.reference import radix as ref_radix
from prefixcache.reference.trie import BlockTrie as RefTrie

SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TOKEN = st.sampled_from([0, 1, 2**31, 2**32 - 1])


# ----------------------------------------------------------------------------- radix
class RadixMachine(RuleBasedStateMachine):
    """prefixcache.RadixCache vs prefixcache.reference.radix.RadixCache."""

    def __init__(self) -> None:
        super().__init__()
        self.step: Lockstep | None = None
        self.seen: list[list[int]] = []

    @initialize(
        page_size=st.sampled_from([1, 2, 4]),
        policy=st.sampled_from(["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]),
    )
    def setup(self, page_size: int, policy: str) -> None:
        self.page = page_size
        self.step = Lockstep(
            [prefixcache.RadixCache(page_size, policy), ref_radix.RadixCache(page_size, policy)]
        )

    def _tokens(self, data: st.DataObject) -> list[int]:
        """Often an earlier key's prefix plus a suffix, so paths share and split."""
        suffix = data.draw(st.lists(TOKEN, max_size=3 * self.page))
        if self.seen and data.draw(st.booleans()):
            base = data.draw(st.sampled_from(self.seen))
            return base[: data.draw(st.integers(0, len(base)))] + suffix
        return suffix

    def _apply(self, op: tuple[Any, ...]) -> None:
        assert self.step is not None
        self.step.apply(op)

    @rule(
        data=st.data(),
        ns=st.sampled_from(NAMESPACES),
        priority=st.sampled_from(PRIORITIES),
        inserted_len=st.integers(0, 12),
    )
    def insert(
        self,
        data: st.DataObject,
        ns: tuple[str | None, str | None],
        priority: int,
        inserted_len: int,
    ) -> None:
        tokens = self._tokens(data)
        self.seen.append(tokens)
        self._apply(("insert", tokens, ns, priority, inserted_len))

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def match(self, data: st.DataObject, ns: tuple[str | None, str | None]) -> None:
        self._apply(("match", self._tokens(data), ns))

    @rule(h=st.integers(0, 1000))
    def lock(self, h: int) -> None:
        self._apply(("lock", h))

    @rule(h=st.integers(0, 1000))
    def unlock(self, h: int) -> None:
        self._apply(("unlock", h))

    @rule(h=st.integers(0, 1000))
    def info(self, h: int) -> None:
        self._apply(("info", h))

    @rule(k=st.integers(0, 12) | st.just(10**6))
    def evict(self, k: int) -> None:
        self._apply(("evict", k))

    @rule(draw=st.integers(0, 9))
    def reset(self, draw: int) -> None:
        """Rarely: an argument-free rule would be drawn far more often than the others."""
        if draw == 0:
            self._apply(("reset",))

    @invariant()
    def same_state(self) -> None:
        if self.step is not None:
            self.step.check()  # invariants of both, same dump, sizes, clock, root


# ------------------------------------------------------------------------ block pool
class BlockPoolMachine(RuleBasedStateMachine):
    """prefixcache.BlockPool vs prefixcache.reference.blocks.BlockPool."""

    def __init__(self) -> None:
        super().__init__()
        self.core: Any = None
        self.ref: Any = None
        self.held: list[int] = []
        self.n = 1

    @initialize(
        num_blocks=st.integers(1, 10), caching=st.booleans(), fmt=st.sampled_from(["u64", "bytes"])
    )
    def setup(self, num_blocks: int, caching: bool, fmt: str) -> None:
        self.n = num_blocks
        self.core = prefixcache.BlockPool(num_blocks, caching, True, event_hash_format=fmt)
        self.ref = ref_blocks.BlockPool(num_blocks, caching, True, event_hash_format=fmt)

    def _ids(self, data: st.DataObject, max_size: int = 5) -> list[int]:
        any_ids = st.lists(st.integers(0, self.n), max_size=max_size)
        if self.held and data.draw(st.booleans()):
            return data.draw(st.lists(st.sampled_from(self.held), max_size=max_size))
        return data.draw(any_ids)

    @rule(data=st.data())
    def get_new_blocks(self, data: st.DataObject) -> None:
        both(self.core, self.ref, "get_new_blocks", data.draw(st.integers(0, self.n)))

    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        both(self.core, self.ref, "touch", self._ids(data))

    @rule(data=st.data())
    def free_blocks(self, data: st.DataObject) -> None:
        both(self.core, self.ref, "free_blocks", self._ids(data))

    @rule(data=st.data())
    def cache_full_blocks(self, data: st.DataObject) -> None:
        ids = self._ids(data, 4)
        hashes = data.draw(st.lists(st.sampled_from(HASHES), min_size=len(ids), max_size=len(ids)))
        lo = data.draw(st.integers(0, len(ids)))
        hi = data.draw(st.integers(0, len(ids)))
        both(
            self.core,
            self.ref,
            "cache_full_blocks",
            ids,
            hashes,
            lo,
            hi,
            2,
            0,
            list(range(hi * 2)),
            7,
            "l",
        )

    @rule(data=st.data())
    def evict_blocks(self, data: st.DataObject) -> None:
        both(self.core, self.ref, "evict_blocks", self._ids(data))

    @rule()
    def reset_prefix_cache(self) -> None:
        both(self.core, self.ref, "reset_prefix_cache")

    @rule(h=st.sampled_from(HASHES), groups=st.sampled_from([[0], [0, 1], []]))
    def get_cached_block(self, h: bytes, groups: list[int]) -> None:
        both(self.core, self.ref, "get_cached_block", h, groups)

    @invariant()
    def same_pool(self) -> None:
        if self.core is not None:
            check_same_pool(self.core, self.ref)
            # the blocks in use, for the next rule to free / touch / cache
            self.held = [b for b in range(1, self.n) if self.ref.ref[b] > 0]


# ---------------------------------------------------------------------- the manager
class ManagerMachine(RuleBasedStateMachine):
    """prefixcache.KVCacheManager vs prefixcache.reference.blocks.KVCacheManager
    (full attention and sliding window, tight pools)."""

    def __init__(self) -> None:
        super().__init__()
        self.core: Any = None
        self.ref: Any = None
        self.known: set[int] = set()
        self.next_id = 0
        self.bs = 1

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(2, 24),
        window=st.none() | st.integers(2, 20),
        caching=st.booleans(),
    )
    def setup(self, block_size: int, num_blocks: int, window: int | None, caching: bool) -> None:
        self.bs = block_size
        self.num_blocks = num_blocks
        kw: dict[str, Any] = dict(
            block_size=block_size,
            enable_caching=caching,
            sliding_window=window,
            enable_kv_cache_events=True,
        )
        self.core = prefixcache.KVCacheManager(num_blocks, **kw)
        self.ref = ref_blocks.KVCacheManager(num_blocks, **kw)

    def _new_id(self) -> int:
        rid, self.next_id = self.next_id, self.next_id + 1
        return rid

    def _adopt_and_allocate(self, rid: int, n: int, look: int) -> None:
        hit = both(self.core, self.ref, "get_computed_blocks", rid)
        assert hit is not None
        blocks, n_hit = hit
        both(self.core, self.ref, "allocate_slots", rid, n, n_hit, blocks, look)

    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        rid = self._new_id()
        got = both(
            self.core,
            self.ref,
            "admit",
            rid,
            data.draw(prompt_strategy(self.bs)),
            data.draw(st.integers(0, 2 * self.bs)),
        )
        if got is not None:
            self.known.add(rid)

    @rule(data=st.data())
    def add_and_schedule(self, data: st.DataObject) -> None:
        rid = self._new_id()
        prompt = data.draw(prompt_strategy(self.bs))
        both(self.core, self.ref, "add_request", rid, prompt)
        self.known.add(rid)
        self._adopt_and_allocate(
            rid, data.draw(st.integers(0, len(prompt))), data.draw(st.integers(0, self.bs))
        )

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.known)))
        left = self.ref.num_tokens(rid) - self.ref.num_computed_tokens(rid)
        n = data.draw(st.integers(0, left + 1))
        look = data.draw(st.integers(0, self.bs))
        if not self.ref.requests[rid].admitted:
            self._adopt_and_allocate(rid, n, look)
        else:
            both(self.core, self.ref, "allocate_slots", rid, n, 0, None, look)

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.known)))
        toks = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=self.bs + 1))
        both(self.core, self.ref, "append_tokens", rid, toks)
        if self.ref.requests[rid].admitted:
            both(self.core, self.ref, "allocate_slots", rid, len(toks))

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.known)))
        both(self.core, self.ref, "free", rid)
        self.known.discard(rid)

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.known)))
        toks = data.draw(st.lists(st.integers(0, 50), max_size=2 * self.bs))
        both(self.core, self.ref, "finish", rid, toks)
        self.known.discard(rid)

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        both(self.core, self.ref, "preempt", data.draw(st.sampled_from(sorted(self.known))))

    @rule(rid=st.integers(10_000, 10_002))
    def unknown_request(self, rid: int) -> None:
        """Errors on unknown ids: same class on both, nothing changes (checked next)."""
        both(self.core, self.ref, "free", rid)
        both(self.core, self.ref, "append_tokens", rid, [1])

    @rule()
    def reset_prefix_cache(self) -> None:
        both(self.core, self.ref, "reset_prefix_cache")

    @rule(data=st.data())
    def evict_blocks(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(0, self.num_blocks - 1), max_size=3))
        both(self.core, self.ref, "evict_blocks", ids)

    @invariant()
    def same_manager(self) -> None:
        if self.core is not None:
            check_same_manager(self.core, self.ref, self.known)

    def teardown(self) -> None:
        if self.core is not None:
            assert self.core.take_stats() == self.ref.take_stats()


# ---------------------------------------------------------------------------- trie
class BlockTrieMachine(RuleBasedStateMachine):
    """prefixcache.BlockTrie vs prefixcache.reference.trie.BlockTrie."""

    def __init__(self) -> None:
        super().__init__()
        self.core: Any = None
        self.ref: Any = None
        self.prompts: dict[int, list[int]] = {}

    @initialize(
        num_blocks=st.integers(2, 12),
        tpb=st.sampled_from([1, 2, 3, 4]),
        partial=st.booleans(),
        copy=st.booleans(),
    )
    def setup(self, num_blocks: int, tpb: int, partial: bool, copy: bool) -> None:
        self.core = prefixcache.BlockTrie(num_blocks, tpb, partial, copy)
        self.ref = RefTrie(num_blocks, tpb, partial, copy)

    @rule(op=trie_op_st)
    def apply(self, op: tuple[Any, ...]) -> None:
        a = trie_outcome(self.core, op, self.prompts)
        b = trie_outcome(self.ref, op, self.prompts)
        assert a == b, op
        if a[0] == "ok":
            if op[0] == "claim":
                self.prompts[op[1]] = list(op[2])
            elif op[0] == "store":
                self.prompts[op[1]] = self.prompts.get(op[1], [0]) + list(op[2])
            elif op[0] == "release":
                self.prompts.pop(op[1], None)

    @invariant()
    def same_trie(self) -> None:
        if self.core is not None:
            self.core.check_invariants()
            self.ref.check_invariants()
            assert trie_state(self.core) == trie_state(self.ref)
            for rid in self.prompts:
                assert self.core.request_blocks(rid) == self.ref.request_blocks(rid)


# --------------------------------------------------------------------------- hasher
class BlockHasherMachine(RuleBasedStateMachine):
    """prefixcache.BlockHasher vs prefixcache.reference.hashing: a request's chain of
    block hashes grown block by block, checked against whole-sequence hashing."""

    def __init__(self) -> None:
        super().__init__()
        self.core: Any = None
        self.tokens: list[int] = []
        self.extra: list[Any] = []
        self.hashes: list[bytes] = []

    @initialize(
        algo=st.sampled_from(list(ref_hashing.ALGORITHMS)),
        block_size=st.sampled_from([1, 2, 3, 16]),
        seed=st.sampled_from(["s", "", "é"]),
    )
    def setup(self, algo: str, block_size: int, seed: str) -> None:
        self.algo, self.bs, self.seed = algo, block_size, seed
        self.core = prefixcache.BlockHasher(block_size, algo, seed)
        assert self.core.none_hash == ref_hashing.none_hash(algo, seed)

    def _tail(self) -> list[int]:
        return self.tokens[len(self.hashes) * self.bs :]

    @rule(data=st.data(), keys=st.none() | key_tuples)
    def append_block(self, data: st.DataObject, keys: Any) -> None:
        """Complete the partial tail to a full block and hash it from its parent."""
        need = self.bs - len(self._tail())
        self.tokens += data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=need, max_size=need))
        block = self._tail()
        parent = self.hashes[-1] if self.hashes else None
        keys = fresh(keys)
        got = self.core.hash_block(parent, block, keys)
        want = ref_hashing.hash_block_tokens(self.algo, parent, block, keys, seed=self.seed)
        assert got == want
        self.extra.append(keys)
        self.hashes.append(got)

    @rule(data=st.data())
    def append_partial(self, data: st.DataObject) -> None:
        """A few tokens that do not complete a block: no new hash."""
        room = self.bs - 1 - len(self._tail())
        if room > 0:
            self.tokens += data.draw(st.lists(st.integers(0, 300), max_size=room))

    @rule(n=st.integers(0, 4))
    def wrong_block_size(self, n: int) -> None:
        if n != self.bs:
            with pytest.raises(prefixcache.PrefixCacheError):
                self.core.hash_block(None, list(range(n)), None)

    @rule(data=st.data())
    def resume_chain(self, data: st.DataObject) -> None:
        """Hashing the rest of the sequence from a block's hash continues the chain."""
        if not self.hashes:
            return
        k = data.draw(st.integers(1, len(self.hashes)))
        rest = self.core.hash_blocks(self.tokens[k * self.bs :], self.extra[k:], self.hashes[k - 1])
        assert rest == self.hashes[k:]

    @invariant()
    def whole_sequence(self) -> None:
        if self.core is None:
            return
        got = self.core.hash_blocks(self.tokens, [*self.extra, None])
        want = ref_hashing.hash_blocks(
            self.algo, self.bs, self.tokens, [*self.extra, None], seed=self.seed
        )
        assert got == want == self.hashes


@pytest.mark.parametrize(
    "machine",
    [RadixMachine, BlockPoolMachine, ManagerMachine, BlockTrieMachine, BlockHasherMachine],
    ids=lambda m: m.__name__,
)
def test_stateful(machine: type[RuleBasedStateMachine]) -> None:
    run_state_machine_as_test(machine, settings=SETTINGS)
