"""Plain-Python reference of SGLang's RadixCache (SEMANTICS.md section 1): the executable
specification that ``prefixcache.RadixCache`` (the Rust core) is tested against.

Read off SGLang 0.5.23 (``sglang/srt/mem_cache/radix_cache.py``, ``evict_policy.py``);
where prefixcache deliberately differs it says so (docs/ANCHORS.md lists the differences):

- Time is a logical clock: every ``match_prefix`` and ``insert`` call first does
  ``clock += 1`` and stamps everything it touches with that one value. SGLang reads
  ``time.monotonic()`` several times per call; the orders the policies see agree.
- A split node inherits the creation time of the node it was split from (SGLang's classic
  class gives it a fresh one; its unified tree core inherits it). Only fifo/filo see it.
- An empty (page-truncated) match touches nothing, as in SGLang, but still ticks the clock.
- Namespaces are the structured pair ``(extra_key, cache_salt)``; an empty salt is None.
- Unlocking below zero raises ``LockRefError`` (SGLang lets lock_ref go negative), and
  so does unlocking a node locked only through its descendants (its lock count is not
  above the sum of its children's): SGLang accepts it and breaks that invariant.
- Ties in the eviction order are broken by a node serial number (creation order, split
  nodes included): ascending for lru lfu fifo priority slru, descending for mru and filo
  (their exact reverses). The only tie two candidates can have under a per-call clock is
  the lower half of a node split by an insert and the new leaf beside it (same
  last_access_time); SGLang stamps the leaf later, and the serial order reproduces that.

Eviction is O(leaves) per evicted node (``min`` over the candidates): short and obviously
correct, not fast.

The host tier (``host_capacity > 0``, SEMANTICS.md 1.9) follows SGLang's HiCache
(``unified_radix_cache.py``, ``unified_cache/unified_tree_core.py``,
``unified_cache/components/full.py``) with writes and loads that complete at once.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError, InvalidTypeError, LockRefError, StaleHandleError
from prefixcache.reference.int_args import (
    INT64_MIN,
    SIZE_MAX,
    flag_arg,
    int_arg,
    opt_str_arg,
    size_arg,
    str_arg,
    token_list,
    value_list,
)

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
# SGLang `write_through_threshold`: 1 under write_through, 2 under write_through_selective.
WRITE_THRESHOLD = {"write_through": 1, "write_through_selective": 2}
SLRU_PROTECTED_HITS = 2

Namespace = tuple[str | None, str | None]
ChildKey = tuple[Namespace, tuple[int, ...]]


PRETTY_MAX_INDENT = 32  # levels pretty_print draws before it writes the depth as a number


def _indent(depth: int) -> str:
    if depth <= PRETTY_MAX_INDENT:
        return "  " * depth
    return "  " * PRETTY_MAX_INDENT + f"({depth}) "


class Node:
    """A tree node; the node object itself is the handle given to callers."""

    __slots__ = (
        "backed",
        "cache",
        "cache_salt",
        "children",
        "creation_time",
        "evicted",
        "extra_key",
        "generation",
        "hit_count",
        "host_value",
        "key",
        "last_access_time",
        "lock_ref",
        "parent",
        "priority",
        "removed",
        "serial",
        "value",
    )

    def __init__(
        self,
        cache: RadixCache,
        parent: Node | None,
        key: tuple[int, ...],
        value: tuple[int, ...],
        namespace: Namespace,
        now: int,
        priority: int,
    ) -> None:
        self.cache = cache
        self.generation = cache._generation
        self.serial = next(cache._serials)
        self.parent = parent
        self.children: dict[ChildKey, Node] = {}
        self.key = key
        self.value = value
        self.extra_key, self.cache_salt = namespace
        self.lock_ref = 0
        self.hit_count = 0
        self.priority = priority
        self.creation_time = now
        self.last_access_time = now
        self.removed = False
        self.backed = False  # a copy is in host memory
        self.evicted = False  # host-only: no device KV (value is empty)
        self.host_value: tuple[int, ...] | None = None  # the copy's values (host_events)

    @property
    def namespace(self) -> Namespace:
        return (self.extra_key, self.cache_salt)

    def __repr__(self) -> str:
        return f"<reference RadixCache node #{self.serial} len={len(self.key)}>"


class MatchResult:
    """Result of ``match_prefix``: matched device length, the KV indices, the last device
    node; the host-only part after it (``host_hit_length``, ``last_host_node``)."""

    __slots__ = ("host_hit_length", "indices", "last_host_node", "length", "node")

    def __init__(
        self,
        length: int,
        indices: npt.NDArray[np.int64],
        node: Node,
        host_hit_length: int = 0,
        last_host_node: Node | None = None,
    ) -> None:
        self.length = length
        self.indices = indices
        self.node = node
        self.host_hit_length = host_hit_length
        self.last_host_node = node if last_host_node is None else last_host_node

    def __repr__(self) -> str:
        return (
            f"MatchResult(length={self.length}, node={self.node!r}, "
            f"host_hit_length={self.host_hit_length})"
        )


class InsertResult:
    """Result of ``insert``: tokens already cached, and the last node of the inserted key."""

    __slots__ = ("node", "prefix_len")

    def __init__(self, prefix_len: int, node: Node) -> None:
        self.prefix_len = prefix_len
        self.node = node

    def __repr__(self) -> str:
        return f"InsertResult(prefix_len={self.prefix_len}, node={self.node!r})"


def _namespace(extra_key: object, cache_salt: object) -> Namespace:
    return (opt_str_arg(extra_key, "extra_key"), opt_str_arg(cache_salt, "cache_salt") or None)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _policy_name(s: str) -> str:
    """The core's normalisation of a policy name: ASCII letters lowercased, nothing else
    (str.lower would also map the Kelvin sign to k)."""
    return s.translate(_ASCII_LOWER)


def _array(xs: list[int] | tuple[int, ...]) -> npt.NDArray[np.int64]:
    return np.array(xs, dtype=np.int64)


def _namespace_sort_key(ns: Namespace) -> tuple[bool, str, bool, str]:
    extra_key, cache_salt = ns
    return (extra_key is not None, extra_key or "", cache_salt is not None, cache_salt or "")


class RadixCache:
    """SGLang's token-level compressed radix tree with its eviction policies."""

    def __init__(
        self,
        page_size: int = 1,
        eviction_policy: str = "lru",
        host_capacity: int = 0,
        write_policy: str = "write_through",
        host_events: bool = False,
    ) -> None:
        # In argument order, as the core reads them (a policy's name checked as it is
        # read): the first bad one is named.
        page_size = 1 if page_size is None else int_arg(page_size, "page_size", 1, SIZE_MAX)
        eviction_policy = str_arg(eviction_policy, "eviction_policy")
        policy = _policy_name(eviction_policy)
        if policy not in POLICIES:
            raise InvalidInputError(
                f'unknown eviction policy "{eviction_policy}": '
                f"expected one of {', '.join(POLICIES)}"
            )
        host_capacity = 0 if host_capacity is None else size_arg(host_capacity, "host_capacity")
        write_policy = str_arg(write_policy, "write_policy")
        write = _policy_name(write_policy).replace("-", "_")
        if write not in WRITE_POLICIES:
            raise InvalidInputError(
                f'unknown write policy "{write_policy}": expected one of '
                "write_through, write_through_selective, write_back"
            )
        host_events = flag_arg(host_events, "host_events")
        if host_events and not host_capacity:
            raise InvalidInputError("host_events needs a host tier (host_capacity > 0)")
        self._host_capacity = host_capacity
        self._write = write
        self._host_events = host_events
        self._host_stored: list[int] = []
        self._host_dropped: list[int] = []
        self._host_used = 0
        self._host_stats = dict.fromkeys(
            ("stored_tokens", "host_evicted_tokens", "loaded_tokens", "peak_host_tokens"), 0
        )
        self._page_size = page_size
        self._policy = policy
        self._clock = 0
        self._serials = itertools.count(0)
        self._generation = 0
        self._root = self._new_root()
        self._evictable = 0
        self._protected = 0

    def _new_root(self) -> Node:
        # Lowest possible priority (SGLang: -sys.maxsize) so any real priority overrides it.
        root = Node(self, None, (), (), (None, None), self._clock, INT64_MIN)
        root.lock_ref = 1
        return root

    # ---- read-only properties ----
    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def eviction_policy(self) -> str:
        return self._policy

    @property
    def clock(self) -> int:
        return self._clock

    @property
    def root(self) -> Node:
        return self._root

    @property
    def num_nodes(self) -> int:
        return sum(1 for _ in self._walk()) - 1

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return sum(len(n.key) for n in self._walk() if not n.evicted)

    # ---- helpers ----
    def _walk(self) -> list[Node]:
        out, stack = [], [self._root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    @staticmethod
    def _handle(node: object) -> Node:
        """A node argument, by type only (as the core reads it, before other arguments)."""
        if not isinstance(node, Node):
            raise InvalidTypeError(f"expected a RadixCache node handle, got {type(node).__name__}")
        return node

    def _check_handle(self, node: object) -> Node:
        node = self._handle(node)
        if node.cache is not self:
            raise StaleHandleError("the node handle belongs to another RadixCache")
        if node.generation != self._generation:
            raise StaleHandleError("the node handle is from before reset()")
        if node.removed:
            raise StaleHandleError("the node handle refers to an evicted node")
        return node

    def _child_key(self, ns: Namespace, key: tuple[int, ...]) -> ChildKey:
        return (ns, key[: self._page_size])

    def _common_len(self, a: tuple[int, ...], b: tuple[int, ...]) -> int:
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return n // self._page_size * self._page_size

    def _split(self, child: Node, p: int, now: int) -> Node:
        """Put a new node holding child.key[:p] between child and its parent."""
        parent = child.parent
        assert parent is not None and 0 < p < len(child.key)
        new = Node(
            self, parent, child.key[:p], child.value[:p], child.namespace, now, child.priority
        )
        new.lock_ref = child.lock_ref
        new.hit_count = child.hit_count
        new.creation_time = child.creation_time  # inherited (a documented choice)
        new.backed, new.evicted = child.backed, child.evicted  # SGLang splits host_value too
        if child.host_value is not None:
            new.host_value, child.host_value = child.host_value[:p], child.host_value[p:]
        parent.children[self._child_key(child.namespace, child.key)] = new
        child.key, child.value = child.key[p:], child.value[p:]
        child.parent = new
        new.children[self._child_key(child.namespace, child.key)] = child
        return new

    def _aligned(self, n: int) -> int:
        return n // self._page_size * self._page_size

    # ---- match / insert ----
    def match_prefix(
        self, tokens: Any, extra_key: str | None = None, cache_salt: str | None = None
    ) -> MatchResult:
        toks = token_list(tokens)
        ns = _namespace(extra_key, cache_salt)
        key = tuple(toks[: self._aligned(len(toks))])
        self._clock += 1
        now = self._clock
        node = self._root
        values: list[int] = []
        if not key:  # SGLang returns before touching anything (the clock still ticks here)
            return MatchResult(0, _array(values), node)
        node.last_access_time = now
        device: Node | None = None  # the last device node, once the path left the device
        host = 0
        while key:
            child = node.children.get(self._child_key(ns, key))
            if child is None:
                break
            if device is None and child.evicted:
                device = node  # device nodes are a prefix of the path: the rest is host
            child.last_access_time = now
            p = self._common_len(child.key, key)
            head = self._split(child, p, now) if p < len(child.key) else child
            if device is None:
                values.extend(head.value)
            else:
                host += p
            if head is not child:
                node = head
                break
            node, key = child, key[p:]
        if device is None:
            return MatchResult(len(values), _array(values), node)
        return MatchResult(len(values), _array(values), device, host, node)

    def insert(
        self,
        tokens: Any,
        values: Any = None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        inserted_len: int = 0,
    ) -> InsertResult:
        toks = token_list(tokens)
        vals = toks if values is None else value_list(values)
        ns = _namespace(extra_key, cache_salt)
        priority = 0 if priority is None else int_arg(priority, "priority")
        inserted_len = 0 if inserted_len is None else size_arg(inserted_len, "inserted_len")
        if len(vals) != len(toks):
            raise InvalidInputError(
                f"values has length {len(vals)} but tokens has length {len(toks)}: "
                "they must be equal"
            )
        n = self._aligned(len(toks))
        key, val = tuple(toks[:n]), tuple(vals[:n])
        self._clock += 1
        now = self._clock
        node = self._root
        node.last_access_time = now
        node.priority = max(node.priority, priority)
        matched = 0
        # SGLang counts no hits under write_back (`_inc_hit_count_and_check`).
        counts = not (self._host_capacity and self._write == "write_back")
        device_prefix: int | None = None
        backups: list[Node] = []
        while key:
            child = node.children.get(self._child_key(ns, key))
            if child is None:
                break
            child.last_access_time = now
            p = self._common_len(child.key, key)
            start = matched
            matched += p
            seg = val[:p]
            key, val = key[p:], val[p:]
            node = self._split(child, p, now) if p < len(child.key) else child
            node.priority = max(node.priority, priority)
            counted = matched > inserted_len and counts
            if counted:  # a request never counts its own earlier insert
                node.hit_count += 1
            if self._host_capacity:
                if node.evicted:  # a host-only node takes the inserted KV
                    if device_prefix is None:
                        device_prefix = start
                    self._revive(node, seg)
                if counted and self._wants_backup(node):
                    backups.append(node)
        if key:
            leaf = Node(self, node, key, val, ns, now, priority)
            if matched + len(key) > inserted_len and counts:
                leaf.hit_count = 1
            node.children[self._child_key(ns, key)] = leaf
            self._evictable += len(key)
            node = leaf
            if self._wants_backup(leaf):
                backups.append(leaf)
        for b in backups:
            self._backup_chain(b)
        return InsertResult(matched if device_prefix is None else device_prefix, node)

    # ---- locks ----
    def _path(self, node: Node) -> list[Node]:
        out = []
        while node is not self._root:
            out.append(node)
            assert node.parent is not None
            node = node.parent
        return out

    def inc_lock_ref(self, node: Node) -> int:
        delta = 0
        for n in self._path(self._check_handle(node)):
            if n.lock_ref == 0 and not n.evicted:
                delta -= len(n.key)
            n.lock_ref += 1
        self._evictable += delta
        self._protected -= delta
        return delta

    def dec_lock_ref(self, node: Node) -> int:
        path = self._path(self._check_handle(node))
        if path and 0 < path[0].lock_ref <= sum(c.lock_ref for c in path[0].children.values()):
            raise LockRefError(
                "dec_lock_ref on a node that is locked only through its descendants: "
                "unlock the node that was locked"
            )
        for n in path:
            if n.lock_ref <= 0:
                raise LockRefError(
                    "dec_lock_ref would make a lock count negative: "
                    "a node on the path is not locked"
                )
        delta = 0
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0 and not n.evicted:
                delta += len(n.key)
        self._evictable += delta
        self._protected -= delta
        return delta

    # ---- eviction ----
    def _order_key(self, n: Node) -> tuple[int, ...]:
        """Eviction order, smallest first. mru and filo are the exact reverse of lru and fifo,
        serial included: one insert call stamps the tail of a split node and the new leaf
        beside it with the same time, and SGLang (which reads the clock again for the new
        leaf) sees the leaf as the more recent of the two."""
        p = self._policy
        if p == "lru":
            return (n.last_access_time, n.serial)
        if p == "lfu":
            return (n.hit_count, n.last_access_time, n.serial)
        if p == "fifo":
            return (n.creation_time, n.serial)
        if p == "mru":
            return (-n.last_access_time, -n.serial)
        if p == "filo":
            return (-n.creation_time, -n.serial)
        if p == "priority":
            return (n.priority, n.last_access_time, n.serial)
        # slru
        return (int(n.hit_count >= SLRU_PROTECTED_HITS), n.last_access_time, n.serial)

    def _is_evictable_leaf(self, n: Node) -> bool:
        return n is not self._root and n.lock_ref == 0 and not n.children

    def evict(self, num_tokens: int) -> npt.NDArray[np.int64]:
        num_tokens = size_arg(num_tokens, "num_tokens")
        if self._host_capacity:
            return _array(self._evict_with_host(num_tokens))
        candidates = [n for n in self._walk() if self._is_evictable_leaf(n)]
        freed: list[int] = []
        while len(freed) < num_tokens and candidates:
            victim = min(candidates, key=self._order_key)
            candidates.remove(victim)
            freed.extend(victim.value)
            parent = victim.parent
            assert parent is not None
            del parent.children[self._child_key(victim.namespace, victim.key)]
            victim.removed = True
            self._evictable -= len(victim.key)
            if self._is_evictable_leaf(parent):
                candidates.append(parent)
        return _array(freed)

    def evict_count(self, num_tokens: int) -> int:
        """Evicts as :meth:`evict` does; returns only the number of tokens freed."""
        return len(self.evict(num_tokens))

    # ---- host tier (SEMANTICS.md 1.9) ----
    @property
    def host_capacity(self) -> int:
        return self._host_capacity

    @property
    def write_policy(self) -> str | None:
        return self._write if self._host_capacity else None

    def host_size(self) -> int:
        return self._host_used

    @property
    def num_host_only_nodes(self) -> int:
        return sum(1 for n in self._walk() if n.evicted)

    def host_stats(self) -> dict[str, int]:
        return dict(self._host_stats)

    def host_state(self, node: Node) -> tuple[bool, bool]:
        n = self._check_handle(node)
        return (n.backed, n.evicted)

    def host_dump(self) -> list[tuple[bool, bool]]:
        return [(c.backed, c.evicted) for c, _ in self._preorder()]

    def _wants_backup(self, n: Node) -> bool:
        if not self._host_capacity or self._write == "write_back" or n.backed:
            return False
        return n.hit_count >= WRITE_THRESHOLD[self._write]

    def _revive(self, n: Node, values: tuple[int, ...]) -> None:
        n.value = tuple(values)
        n.evicted = False
        if n.lock_ref == 0:
            self._evictable += len(n.key)
        else:
            self._protected += len(n.key)

    def _backup_one(self, n: Node) -> bool:
        """SGLang `_execute_kv_backup`: evict host leaves when short; False if it won't fit."""
        need = len(n.key)
        free = self._host_capacity - self._host_used
        if free < need:
            self.evict_host(need - free)
        if self._host_capacity - self._host_used < need:
            return False
        n.backed = True
        if self._host_events:
            n.host_value = n.value
            self._host_stored.extend(n.value)
        self._host_used += need
        st = self._host_stats
        st["stored_tokens"] += need
        st["peak_host_tokens"] = max(st["peak_host_tokens"], self._host_used)
        return True

    def _backup_chain(self, n: Node) -> None:
        """Write-through: the node's unbacked ancestors first, stop at the first misfit."""
        chain = [n]
        cur = n.parent
        while cur is not None and cur is not self._root and not cur.backed:
            chain.append(cur)
            cur = cur.parent
        for c in reversed(chain):
            if not c.backed and not self._backup_one(c):
                return

    def _is_device_leaf(self, n: Node) -> bool:
        return (
            n is not self._root
            and n.lock_ref == 0
            and not n.evicted
            and all(c.evicted for c in n.children.values())
        )

    def _is_host_leaf(self, n: Node) -> bool:
        return n is not self._root and n.evicted and not n.children and n.lock_ref == 0

    def _remove(self, n: Node) -> None:
        parent = n.parent
        assert parent is not None
        del parent.children[self._child_key(n.namespace, n.key)]
        n.removed = True

    def _evict_with_host(self, num_tokens: int) -> list[int]:
        freed: list[int] = []
        while len(freed) < num_tokens:
            cands = [n for n in self._walk() if self._is_device_leaf(n)]
            if not cands:
                break
            victim = min(cands, key=self._order_key)
            if self._write == "write_back" and not victim.backed:
                self._backup_one(victim)
            freed.extend(victim.value)
            self._evictable -= len(victim.key)
            if victim.backed:  # demoted: stays, host-only
                victim.value = ()
                victim.evicted = True
                continue
            below: list[Node] = []
            stack = list(victim.children.values())
            while stack:
                c = stack.pop()
                below.append(c)
                stack.extend(c.children.values())
            for c in below:
                self._host_used -= len(c.key)
                self._host_stats["host_evicted_tokens"] += len(c.key)
                self._drop_host_value(c)
                c.removed = True
            self._remove(victim)
        return freed

    def evict_host(self, num_tokens: int) -> int:
        num_tokens = size_arg(num_tokens, "num_tokens")
        freed = 0
        while freed < num_tokens:
            cands = [n for n in self._walk() if self._is_host_leaf(n)]
            if not cands:
                break
            victim = min(cands, key=self._order_key)
            freed += len(victim.key)
            self._host_used -= len(victim.key)
            self._host_stats["host_evicted_tokens"] += len(victim.key)
            self._drop_host_value(victim)
            self._remove(victim)
        return freed

    def _drop_host_value(self, n: Node) -> None:
        if n.host_value is not None:
            self._host_dropped.extend(n.host_value)
            n.host_value = None

    @property
    def host_events(self) -> bool:
        return self._host_events

    def take_host_events(
        self, nonzero: bool = False
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        nonzero = flag_arg(nonzero, "nonzero")
        stored, dropped = self._host_stored, self._host_dropped
        self._host_stored, self._host_dropped = [], []
        if nonzero:
            stored, dropped = [v for v in stored if v], [v for v in dropped if v]
        return _array(stored), _array(dropped)

    def host_values_dump(self) -> list[npt.NDArray[np.int64]]:
        return [_array(c.host_value or ()) for c, _ in self._preorder()]

    def _preorder(self) -> list[tuple[Node, int]]:
        """Every node but the root with its depth (the root's children: 1), in dump
        order: depth first, children sorted. Iterative: a chain deeper than Python's
        recursion limit is fine."""
        out: list[tuple[Node, int]] = []
        stack = [(c, 1) for c in reversed(self._sorted_children(self._root))]
        while stack:
            n, depth = stack.pop()
            out.append((n, depth))
            stack.extend((c, depth + 1) for c in reversed(self._sorted_children(n)))
        return out

    def load_back(self, node: Node, values: Any = None) -> int:
        self._handle(node)
        vals = None if values is None else value_list(values)
        tail: list[Node] = []
        cur = self._check_handle(node)
        while cur is not self._root and cur.evicted:
            tail.append(cur)
            assert cur.parent is not None
            cur = cur.parent
        tail.reverse()
        total = sum(len(n.key) for n in tail)
        if vals is not None and len(vals) != total:
            raise InvalidInputError(
                f"load_back: values has length {len(vals)} but the node has {total} "
                "host-only tokens on its path: they must be equal"
            )
        off = 0
        for n in tail:
            seg = n.key if vals is None else tuple(vals[off : off + len(n.key)])
            off += len(n.key)
            self._revive(n, seg)
        self._host_stats["loaded_tokens"] += total
        return total

    # ---- inspection ----
    def path_indices(self, node: Node) -> npt.NDArray[np.int64]:
        if self._check_handle(node).evicted:
            raise InvalidInputError(
                "path_indices: the node is only in host memory (load_back it first)"
            )
        path = self._path(self._check_handle(node))
        return _array([v for n in reversed(path) for v in n.value])

    def parent(self, node: Node) -> Node | None:
        """The parent of ``node`` (None for the root)."""
        return self._check_handle(node).parent

    def node_info(self, node: Node) -> dict[str, Any]:
        n = self._check_handle(node)
        return {
            "length": len(n.key),
            "lock_ref": n.lock_ref,
            "hit_count": n.hit_count,
            "priority": n.priority,
            "last_access_time": n.last_access_time,
            "creation_time": n.creation_time,
            "num_children": len(n.children),
            "is_root": n is self._root,
            "extra_key": n.extra_key,
            "cache_salt": n.cache_salt,
        }

    def reset(self) -> None:
        self._generation += 1
        self._root = self._new_root()
        self._evictable = 0
        self._protected = 0
        self._host_used = 0
        self._host_stats = dict.fromkeys(self._host_stats, 0)
        self._host_stored, self._host_dropped = [], []

    def _sorted_children(self, n: Node) -> list[Node]:
        return sorted(n.children.values(), key=lambda c: (_namespace_sort_key(c.namespace), c.key))

    def dump(self) -> list[dict[str, Any]]:
        # The root has depth 0 and is not listed.
        return [
            {
                "depth": depth,
                "key": list(c.key),
                "value": list(c.value),
                "lock_ref": c.lock_ref,
                "hit_count": c.hit_count,
                "priority": c.priority,
                "last_access_time": c.last_access_time,
                "creation_time": c.creation_time,
                "extra_key": c.extra_key,
                "cache_salt": c.cache_salt,
            }
            for c, depth in self._preorder()
        ]

    def pretty_print(self) -> str:
        lines = [
            f"RadixCache(page_size={self._page_size}, eviction_policy={self._policy!r}, "
            f"clock={self._clock})"
        ]
        for r in self.dump():
            ns = (
                ""
                if (r["extra_key"], r["cache_salt"]) == (None, None)
                else f" ns=({r['extra_key']!r}, {r['cache_salt']!r})"
            )
            key = r["key"][:10]
            more = "..." if len(r["key"]) > 10 else ""
            lines.append(
                f"{_indent(r['depth'])}{len(r['key'])} {key}{more} r={r['lock_ref']} "
                f"hits={r['hit_count']} prio={r['priority']}{ns}"
            )
        lines.append(
            f"#tokens: {self.total_size()} (evictable {self._evictable}, "
            f"protected {self._protected})"
        )
        return "\n".join(lines)
