"""Drive the real SGLang 0.5.23 RadixCache and prefixcache's reference RadixCache
(python/prefixcache/reference/radix.py) through the same random operation sequences and
report every disagreement.

Run it with the anchors venv (see docs/ANCHORS.md), never from the tests or CI:

    bash tools/anchors/setup_engines.sh                       # once, ~10 GB
    "$ANCHORS_VENV"/bin/python tools/check_radix_against_sglang.py [--seeds 200] [--steps 60]
    "$ANCHORS_VENV"/bin/python tools/check_radix_against_sglang.py --impl core   # the Rust core

Compared after every step: match lengths and indices (SGLang: path_device_indices of the
matched node), insert prefix_len, lock/unlock deltas, the KV indices each evict call frees
(in order, and as a multiset), evictable/protected/total sizes, and the whole tree
(key, value, lock_ref, hit_count, priority of every node).

SGLang reads time.monotonic() several times per call; it is replaced by a tick counter so
runs are deterministic. The reference ticks once per call: the orders the policies compare
agree. By default SGLang's split is patched to inherit the split child's creation_time (what
prefixcache does, and what SGLang's own Rust TreeCore does); `--split-creation fresh` runs
the classic class unpatched to show the fifo/filo differences that choice causes.
Handles are only unlocked when the reference says they are locked (SGLang lets lock_ref go
negative; prefixcache raises instead).
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
import types
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# Load prefixcache's pure-Python modules without its compiled extension (not built for this
# interpreter): a bare package object pointing at the source directory.
_pkg = types.ModuleType("prefixcache")
_pkg.__path__ = [str(REPO / "python" / "prefixcache")]
sys.modules.setdefault("prefixcache", _pkg)

import sglang.srt.mem_cache.radix_cache as rc  # noqa: E402
import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402

from prefixcache.errors import StaleHandleError  # noqa: E402
from prefixcache.reference import radix as reference  # noqa: E402

SGLANG_POLICIES = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]
NAMESPACES: list[tuple[str | None, str | None]] = [
    (None, None),
    ("a", None),
    ("", None),
    (None, "s"),
    (None, ""),
    ("ab", "c"),
    ("a", "bc"),
]

_tick = itertools.count(1)
rc.time = types.SimpleNamespace(
    monotonic=lambda: float(next(_tick)),  # type: ignore[attr-defined]
    perf_counter=time.perf_counter,
)
_original_split = rc.RadixCache._split_node


def _inheriting_split(self: Any, key: Any, child: Any, split_len: int) -> Any:
    created = child.creation_time
    new_node = _original_split(self, key, child, split_len)
    new_node.creation_time = created
    return new_node


class Alloc:
    """Stub KV allocator that records what the tree frees."""

    device = torch.device("cpu")
    page_size = 1

    def __init__(self) -> None:
        self.freed: list[int] = []

    def free(self, idx: Any) -> None:
        self.freed.extend(idx.tolist())

    def free_segment(self, idx: Any, start_pos: int = 0) -> None:
        self.freed.extend(idx.tolist())


def sglang_dump(tree: Any) -> list[tuple[Any, ...]]:
    """SGLang's tree in prefixcache's canonical dump order (times left out)."""
    out: list[tuple[Any, ...]] = []

    def ns_key(n: Any) -> tuple[Any, ...]:
        ek, salt = n.key.extra_key, n.key.cache_salt
        return (ek is not None, ek or "", salt is not None, salt or "", list(n.key.token_ids))

    def visit(node: Any, depth: int) -> None:
        for c in sorted(node.children.values(), key=ns_key):
            out.append(
                (
                    depth,
                    list(c.key.token_ids),
                    c.value.tolist(),
                    c.lock_ref,
                    c.hit_count,
                    c.priority,
                    c.key.extra_key,
                    c.key.cache_salt,
                )
            )
            visit(c, depth + 1)

    visit(tree.root_node, 1)
    return out


def reference_dump(cache: Any) -> list[tuple[Any, ...]]:
    return [
        (
            r["depth"],
            r["key"],
            r["value"],
            r["lock_ref"],
            r["hit_count"],
            r["priority"],
            r["extra_key"],
            r["cache_salt"],
        )
        for r in cache.dump()
    ]


def random_ops(rng: random.Random, page: int, steps: int) -> list[tuple[Any, ...]]:
    pool = [
        [rng.randrange(4) for _ in range(rng.randint(1, 2 * page + 1))]
        for _ in range(rng.randint(2, 5))
    ]

    def tokens() -> list[int]:
        parts = [t for _ in range(rng.randint(0, 4)) for t in rng.choice(pool)]
        return parts + [rng.randrange(4) for _ in range(rng.randint(0, page + 1))]

    ops: list[tuple[Any, ...]] = []
    for _ in range(steps):
        r = rng.random()
        ns = rng.choice(NAMESPACES)
        if r < 0.40:
            il = 0 if rng.random() < 0.7 else rng.randint(0, 6 * page)
            ops.append(("insert", tokens(), ns, rng.choice([-2, 0, 0, 1, 3]), il))
        elif r < 0.65:
            ops.append(("match", tokens(), ns))
        elif r < 0.75:
            ops.append(("lock", rng.randrange(1000)))
        elif r < 0.85:
            ops.append(("unlock", rng.randrange(1000)))
        elif r < 0.99:
            ops.append(("evict", rng.choice([rng.randint(0, 4 * page), 10**6])))
        else:
            ops.append(("reset",))
    return ops


class Mismatch(Exception):
    pass


def alive(cache: Any, node: Any) -> bool:
    """Whether a handle still names a node of the cache (works for both implementations)."""
    try:
        cache.node_info(node)
    except StaleHandleError:
        return False
    return True


def run(ops: list[tuple[Any, ...]], page: int, policy: str, impl: Any) -> list[str]:
    """Run one sequence on both; returns the disagreements (stops at the first structural one)."""
    alloc = Alloc()
    tree = rc.RadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=alloc,
            page_size=page,
            eviction_policy=policy,
        )
    )
    ref = impl(page, policy)
    handles: list[tuple[Any, Any]] = []
    locked: list[int] = []
    next_value = 1_000_000
    problems: list[str] = []

    def expect(what: str, ours: Any, theirs: Any, step: int, op: Any) -> None:
        if ours != theirs:
            problems.append(
                f"step {step} {op!r}: {what}: prefixcache {ours!r} != sglang {theirs!r}"
            )
            raise Mismatch

    def key(tokens: list[int], ns: tuple[str | None, str | None]) -> Any:
        return rc.RadixKey(array("q", tokens), extra_key=ns[0], cache_salt=ns[1])

    try:
        for step, op in enumerate(ops):
            kind = op[0]
            if kind == "insert":
                _, toks, ns, prio, il = op
                vals = list(range(next_value, next_value + len(toks)))
                next_value += len(toks)
                ours = ref.insert(
                    toks, vals, extra_key=ns[0], cache_salt=ns[1], priority=prio, inserted_len=il
                )
                theirs = tree.insert(
                    InsertParams(
                        key=key(toks, ns),
                        value=torch.tensor(vals, dtype=torch.int64),
                        priority=prio,
                        inserted_len=il,
                    )
                )
                expect("prefix_len", ours.prefix_len, theirs.prefix_len, step, op)
                expect(
                    "insert path",
                    ref.path_indices(ours.node).tolist(),
                    tree.path_device_indices(theirs.last_device_node).tolist(),
                    step,
                    op,
                )
                handles.append((ours.node, theirs.last_device_node))
            elif kind == "match":
                _, toks, ns = op
                ours = ref.match_prefix(toks, extra_key=ns[0], cache_salt=ns[1])
                theirs = tree.match_prefix(MatchPrefixParams(key=key(toks, ns)))
                expect("match length", ours.length, theirs.device_prefix_len, step, op)
                expect(
                    "match indices",
                    ours.indices.tolist(),
                    tree.path_device_indices(theirs.last_device_node).tolist(),
                    step,
                    op,
                )
                handles.append((ours.node, theirs.last_device_node))
            elif kind == "lock":
                live = [i for i, (n, _) in enumerate(handles) if alive(ref, n)]
                if not live:
                    continue
                h = live[op[1] % len(live)]
                expect(
                    "inc_lock_ref delta",
                    ref.inc_lock_ref(handles[h][0]),
                    tree.inc_lock_ref(handles[h][1]).delta,
                    step,
                    op,
                )
                locked.append(h)
            elif kind == "unlock":
                if not locked:
                    continue
                h = locked.pop(op[1] % len(locked))
                expect(
                    "dec_lock_ref delta",
                    ref.dec_lock_ref(handles[h][0]),
                    tree.dec_lock_ref(handles[h][1]).delta,
                    step,
                    op,
                )
            elif kind == "evict":
                before = len(alloc.freed)
                ours_freed = ref.evict(op[1]).tolist()
                tree.evict(EvictParams(num_tokens=op[1]))
                theirs_freed = alloc.freed[before:]
                expect(
                    "evicted indices (multiset)",
                    Counter(ours_freed),
                    Counter(theirs_freed),
                    step,
                    op,
                )
                expect("evicted indices (order)", ours_freed, theirs_freed, step, op)
            elif kind == "reset":
                ref.reset()
                tree.reset()
                handles.clear()
                locked.clear()
            expect(
                "sizes (evictable, protected, total)",
                (ref.evictable_size(), ref.protected_size(), ref.total_size()),
                (tree.evictable_size(), tree.protected_size(), tree.total_size()),
                step,
                op,
            )
            expect("tree", reference_dump(ref), sglang_dump(tree), step, op)
    except Mismatch:
        pass
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200, help="sequences per (policy, page size)")
    ap.add_argument("--steps", type=int, default=60, help="operations per sequence")
    ap.add_argument("--policies", default=",".join(SGLANG_POLICIES))
    ap.add_argument("--page-sizes", default="1,4,16")
    ap.add_argument(
        "--split-creation",
        choices=["inherit", "fresh"],
        default="inherit",
        help="patch SGLang's split to inherit creation_time (default) or not",
    )
    ap.add_argument("--show", type=int, default=3, help="disagreements to print per config")
    ap.add_argument(
        "--impl",
        choices=["reference", "core"],
        default="reference",
        help="what to compare with SGLang: the plain-Python reference (default) or "
        "the compiled core (needs `maturin develop` in this checkout for the "
        "same Python version)",
    )
    args = ap.parse_args()
    if args.impl == "core":
        from prefixcache._core import RadixCache as impl
    else:
        impl = reference.RadixCache
    rc.RadixCache._split_node = (
        _inheriting_split
        if args.split_creation == "inherit"  # type: ignore[method-assign]
        else _original_split
    )
    total_bad = 0
    for policy in args.policies.split(","):
        for page in (int(p) for p in args.page_sizes.split(",")):
            bad = 0
            shown = 0
            for seed in range(args.seeds):
                rng = random.Random(f"{policy}-{page}-{seed}")
                problems = run(random_ops(rng, page, args.steps), page, policy, impl)
                if problems:
                    bad += 1
                    if shown < args.show:
                        shown += 1
                        print(f"  [{policy} page={page} seed={seed}] {problems[0]}")
            total_bad += bad
            agree = args.seeds - bad
            print(f"{policy:8s} page_size={page:<3d} {agree}/{args.seeds} sequences agree")
    print("ALL AGREE" if total_bad == 0 else f"{total_bad} sequences disagree")
    return 0 if total_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
