"""The KV events of a radix tree and of a block trie, as a router's fleet index consumes
them: full blocks named by the router's own chained keys.

SGLang publishes one ``BlockStored`` per page of a node when the node enters its radix
tree and one ``BlockRemoved`` per page when it leaves (``KVCacheEventMixin``). A router's
index only needs the full blocks of a path: block ``k`` of a path (its tokens
``[k*B, (k+1)*B)``) is held exactly when the tree holds the block's last token on the
device, because a tree holds every token it holds together with the whole path above it.
So :class:`TreeBlockEvents` labels the tree's KV values: the value of a block's last
token is a small integer id (any other token gets 0), an id names the block's 64-bit key,
and the values the tree frees on eviction say which blocks left. With a host tier the
tree keeps each host copy's values (``host_events=True``) and reports the copies it made
and dropped (``take_host_events``): the same ids name the blocks on ``CPU``. Nothing is
read from the tree beyond what its API returns (the insert's ``prefix_len``, the freed
values, the host copies' values).

Block keys are the router's own chained keys (``prefixcache._core.lab_block_keys``,
seeded by the request's namespace), as NVIDIA Dynamo's router recomputes its own block
hashes from the token ids a worker's events carry; the publisher computes them here so
the events need not ship token lists. docs/FLEET_REPLAY.md, "Events", says what differs
from SGLang's own hashes.

:class:`TrieEventKeys` does the same for TensorRT-LLM's block trie, whose own events
(``prefixcache.trie_events``) name blocks by a chained hash over interned keys that a
router cannot compute from a prompt: it follows the trie's events and renames every full
block by the router's key, chained from its parent's (Dynamo's router keeps the same map
from a worker's block hashes to its own).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from prefixcache.events import MEDIUM_CPU, MEDIUM_GPU
from prefixcache.sim.requests import TokenArray, namespace_seed

__all__ = [
    "DEFAULT_EVENT_BLOCK",
    "StoreContext",
    "TreeBlockEvents",
    "TrieEventKeys",
    "removed_event",
    "stored_event",
]

# The block of a page-1 tree's events when none is given: vLLM's and the router's default.
DEFAULT_EVENT_BLOCK = 16

Keys = npt.NDArray[np.uint64]
Ids = npt.NDArray[np.int64]


class TreeBlockEvents:
    """Block ids as KV values, their keys, and the events of the blocks entering and
    leaving a tree (``take``): on ``GPU`` the device copies, on ``CPU`` the host copies.
    ``block_size`` tokens per block; every position is counted from the root of the
    request's namespace. An id is reserved while the device values or a host copy's
    values hold it (a block on both media has one id, or two after a load back)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._key = np.zeros(1024, dtype=np.uint64)  # id -> key (id 0: no block)
        self._refs = np.zeros(1024, dtype=np.int8)  # id -> copies holding it (0, 1 or 2)
        # Free ids, a stack (top last) in a buffer as long as the id space: `_nfree` first.
        self._free = np.arange(1023, -1, -1, dtype=np.int64)
        self._nfree = 1023
        self._events: list[dict[str, Any]] = []
        self.live = 0  # ids naming a block the tree holds or is about to hold

    # -- ids -----------------------------------------------------------------------------
    def _take_ids(self, n: int) -> Ids:
        if n > self._nfree:
            old = len(self._key)
            size = max(2 * old, old + n)
            key = np.zeros(size, dtype=np.uint64)
            key[:old] = self._key
            self._key = key
            refs = np.zeros(size, dtype=np.int8)
            refs[:old] = self._refs
            self._refs = refs
            free = np.empty(size, dtype=np.int64)
            free[: size - old] = np.arange(size - 1, old - 1, -1)  # new ids below the old
            free[size - old : size - old + self._nfree] = self._free[: self._nfree]
            self._free = free
            self._nfree += size - old
        top = self._nfree
        ids = self._free[top - n : top][::-1].copy()
        self._nfree = top - n
        self._refs[ids] = 1
        self.live += n
        return ids

    def _release(self, ids: Ids) -> None:
        """One copy holding each of these (distinct) ids went; ids no copy holds go back."""
        if len(ids):
            self._refs[ids] -= 1
            done = ids[self._refs[ids] == 0]
            if len(done):
                self._key[done] = 0
                top = self._nfree
                self._free[top : top + len(done)] = done
                self._nfree = top + len(done)
                self.live -= len(done)

    # -- what the tree is given and gives back -------------------------------------------
    def keys(self, tokens: TokenArray, extra_key: str | None, cache_salt: str | None) -> Keys:
        """The keys of the full blocks of ``tokens`` in a namespace."""
        return _router_keys(tokens, self.block_size, namespace_seed(extra_key, cache_salt))

    def label(self, keys: Keys, start: int, end: int) -> tuple[Ids, Ids]:
        """KV values for the tokens ``[start, end)`` of a path whose full-block keys are
        ``keys``: a fresh id at the last token of every block ending in the range, 0
        elsewhere. Returns ``(values, ids)``; settle the ids with :meth:`stored`."""
        bs = self.block_size
        first = start // bs  # the first block whose last token is >= start
        last = min(end // bs, len(keys))  # blocks ending at or before `end`
        values = np.zeros(end - start, dtype=np.int64)
        if last <= first:
            return values, np.zeros(0, dtype=np.int64)
        ids = self._take_ids(last - first)
        self._key[ids] = keys[first:last]
        values[(first + 1) * bs - 1 - start : last * bs - start : bs] = ids
        return values, ids

    def stored(self, keys: Keys, start: int, ids: Ids, cached_from: int) -> None:
        """The tree took the labelled values of ``[cached_from, ...)`` (``label(keys,
        start, ...)`` gave ``ids``): those blocks are stored; the ids of blocks the tree
        already held go back."""
        bs = self.block_size
        first = start // bs
        held = max(cached_from // bs, first) - first  # blocks the tree had: not taken
        self._release(ids[:held])
        if held < len(ids):
            lo = first + held
            self._events.append(stored_event(keys[lo : first + len(ids)], bs))

    def freed(self, values: Ids | list[int]) -> None:
        """The tree freed these KV values (an eviction): their blocks are removed from
        the device. Call after :meth:`host` for the same tree call."""
        arr = np.asarray(values, dtype=np.int64)
        ids = arr[arr != 0]
        if len(ids):
            self._events.append(removed_event(self._key[ids]))
            self._release(ids)

    def host(self, stored: Ids, dropped: Ids) -> None:
        """The tree made host copies of the values ``stored`` and dropped those of the
        values ``dropped`` (``take_host_events(nonzero=True)``: the ids alone): their
        blocks are stored on and removed from ``CPU``. Copies made are counted before
        copies dropped (a copy can be both within one tree call), and both before the
        device values the call freed."""
        if len(stored):
            self._refs[stored] += 1
            self._events.append(stored_event(self._key[stored], self.block_size, MEDIUM_CPU))
        if len(dropped):
            self._events.append(removed_event(self._key[dropped], MEDIUM_CPU))
            self._release(dropped)

    def key_of(self, ids: Ids) -> Keys:
        """The keys of live ids (tests)."""
        return self._key[ids]

    def take(self) -> list[dict[str, Any]]:
        """The events since the last call, in order."""
        out, self._events = self._events, []
        return out


def _router_keys(tokens: TokenArray, block_size: int, seed: int) -> Keys:
    from prefixcache._core import lab_block_keys

    return lab_block_keys(tokens, block_size, seed)


class StoreContext:
    """One ``BlockTrie.store`` call: the request's tokens, its blocks and its namespace.
    The trie keys ``tokens[:-1]`` in blocks (the last token has no KV yet); block ``j``
    of the request is full when ``(j + 1) * B <= len(tokens) - 1``."""

    __slots__ = ("_keys", "block_size", "blocks", "seed", "tokens")

    def __init__(self, tokens: TokenArray, blocks: list[int], block_size: int, seed: int) -> None:
        self.tokens = tokens
        self.blocks = blocks
        self.block_size = block_size
        self.seed = seed
        self._keys: Keys | None = None

    def run_keys(self, block_ids: list[int]) -> Keys:
        """The router's keys of the full blocks of a stored run of the request's blocks."""
        if not block_ids:
            return np.zeros(0, dtype=np.uint64)
        pos = self.blocks.index(block_ids[0])
        if self.blocks[pos : pos + len(block_ids)] != block_ids:
            raise AssertionError("a stored run that is not a run of the request's blocks")
        if self._keys is None:
            usable = max(len(self.tokens) - 1, 0)
            self._keys = _router_keys(self.tokens[:usable], self.block_size, self.seed)
        return self._keys[pos : pos + len(block_ids)]


class TrieEventKeys:
    """A block trie's events (``BlockTrie.take_events``) in the router's keys: a
    ``BlockStored`` per run of full blocks stored, a ``BlockRemoved`` per block leaving,
    and a move between GPU and host memory as a removal on one medium and a store on the
    other. A partial last block has no key and is not published (a router matches full
    blocks)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._key: dict[int, tuple[int, str]] = {}  # trie hash -> (router key, medium)
        self._events: list[dict[str, Any]] = []

    def keys(self, tokens: TokenArray, extra_key: str | None, cache_salt: str | None) -> Keys:
        """The keys of the full blocks of ``tokens`` in a namespace."""
        return _router_keys(tokens, self.block_size, namespace_seed(extra_key, cache_salt))

    def follow(self, events: list[Any], store: StoreContext | None = None) -> None:
        """Translates the trie's compact events (``take_events(compact=True)``), in
        order; ``store`` describes the ``store`` call whose ``TrieBlockStored`` is among
        them (a stored run is a run of that request's blocks)."""
        from prefixcache.trie_events import TrieBlockMoved, TrieBlockRemoved, TrieBlockStored

        known, out = self._key, self._events
        gone: list[int] = []  # a run of removals on one medium, published as one event
        gone_on = MEDIUM_GPU

        def flush() -> None:
            if gone:
                out.append(removed_event(gone.copy(), gone_on))
                gone.clear()

        for ev in events:
            if isinstance(ev, TrieBlockRemoved):
                for h in ev.block_hashes:
                    entry = known.pop(h, None)
                    if entry is not None:
                        if entry[1] != gone_on:
                            flush()
                            gone_on = entry[1]
                        gone.append(entry[0])
                continue
            flush()
            if isinstance(ev, TrieBlockStored):
                if store is None:
                    raise AssertionError("a trie store event outside a store")
                keys = store.run_keys(ev.block_ids)
                for h, k in zip(ev.block_hashes, keys.tolist(), strict=False):
                    known[h] = (k, MEDIUM_GPU)
                if len(keys):
                    out.append(stored_event(keys, self.block_size, MEDIUM_GPU))
            elif isinstance(ev, TrieBlockMoved):
                for h in ev.block_hashes:
                    entry = known.get(h)
                    if entry is not None and entry[1] != ev.medium:
                        out.append(removed_event([entry[0]], entry[1]))
                        key = np.array([entry[0]], dtype=np.uint64)
                        out.append(stored_event(key, self.block_size, ev.medium))
                        known[h] = (entry[0], ev.medium)
        flush()

    def published(self) -> dict[int, tuple[int, str]]:
        """Trie hash -> (router key, medium) of every published block (tests)."""
        return dict(self._key)

    def take(self) -> list[dict[str, Any]]:
        """The events since the last call, in order."""
        out, self._events = self._events, []
        return out


def stored_event(keys: Keys, block_size: int, medium: str = MEDIUM_GPU) -> dict[str, Any]:
    """A ``BlockStored`` of full blocks named by their keys, as a fleet index reads it."""
    return {
        "type": "BlockStored",
        "block_hashes": keys,
        "parent_block_hash": None,
        "token_ids": None,
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
    }


def removed_event(keys: Keys | list[int], medium: str = MEDIUM_GPU) -> dict[str, Any]:
    """A ``BlockRemoved`` of blocks named by their keys."""
    return {"type": "BlockRemoved", "block_hashes": keys, "medium": medium}
