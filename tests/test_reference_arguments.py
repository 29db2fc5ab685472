"""The plain-Python references follow the compiled core's argument contract
(docs/ERRORS.md, rust/prefixcache-py/src/convert.rs): for every bad argument of
RadixCache and BlockTrie, core and reference raise the same exception class and leave
their state unchanged; the argument forms the core accepts (numpy scalars, None for a
default) the reference accepts too, with the same result. KVCacheManager: the same for
its request ids; KVCacheManager and BlockPool: the same for their constructors'
arguments, the first bad one named. CpuOffloadManager: the same for every argument, the
reference opening no request context for a refused call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hostile_sequences import LyingList, ShortSequence

from prefixcache import BlockTrie, RadixCache
from prefixcache.errors import InvalidInputError, InvalidTypeError
from prefixcache.reference.radix import RadixCache as RefRadix
from prefixcache.reference.trie import BlockTrie as RefTrie

Call = Callable[[Any, Any], object]


def outcome(f: Callable[[], object]) -> tuple[str, type[BaseException] | None]:
    try:
        f()
    except Exception as e:  # every class counts, the builtins included
        return ("raised", type(e))
    return ("ok", None)


# ---- RadixCache ---------------------------------------------------------------------


class RadixWorld:
    """A cache with a host tier and handles in every state: host-only, locked, stale
    (removed by a host eviction), from another cache."""

    def __init__(self, cls: Any) -> None:
        self.c = c = cls(1, "lru", host_capacity=16, host_events=True)
        self.stale = c.insert([5, 6]).node
        self.host_only = c.insert([1, 2, 3, 4]).node
        self.locked = c.insert([7, 8]).node
        c.inc_lock_ref(self.locked)
        c.evict(100)  # [5, 6] and [1, 2, 3, 4] leave the device (host-only)
        assert c.evict_host(2) == 2  # [5, 6] leaves host memory: its handle is stale
        self.foreign = cls(1, "lru").insert([1]).node

    def state(self) -> object:
        c = self.c
        return (
            c.dump(),
            c.host_dump(),
            [v.tolist() for v in c.host_values_dump()],
            c.clock,
            c.evictable_size(),
            c.protected_size(),
            c.host_size(),
            c.host_stats(),
        )


BIG = 2**64
RADIX_CTOR_BAD: list[tuple[str, dict[str, Any]]] = [
    ("page_size zero", {"page_size": 0}),
    ("page_size negative", {"page_size": -1}),
    ("page_size float", {"page_size": 1.0}),
    ("page_size bool", {"page_size": True}),
    ("page_size 2**64", {"page_size": BIG}),
    ("page_size str", {"page_size": "1"}),
    ("eviction_policy unknown", {"eviction_policy": "xyz"}),
    ("eviction_policy int", {"eviction_policy": 1}),
    ("eviction_policy None", {"eviction_policy": None}),
    ("eviction_policy surrogate", {"eviction_policy": "\ud800"}),
    ("host_capacity negative", {"host_capacity": -1}),
    ("host_capacity 2**63", {"host_capacity": 2**63}),
    ("host_capacity 2**64", {"host_capacity": BIG}),
    ("host_capacity float", {"host_capacity": 8.0}),
    ("host_capacity bool", {"host_capacity": True}),
    ("write_policy unknown", {"host_capacity": 8, "write_policy": "write_around"}),
    ("write_policy int", {"host_capacity": 8, "write_policy": 1}),
    ("write_policy None", {"host_capacity": 8, "write_policy": None}),
    ("write_policy Kelvin sign", {"host_capacity": 8, "write_policy": "write_bac\u212a"}),
    ("write_policy surrogate", {"host_capacity": 8, "write_policy": "\ud800"}),
    ("host_events int", {"host_capacity": 8, "host_events": 1}),
    ("host_events None", {"host_capacity": 8, "host_events": None}),
    ("host_events str", {"host_capacity": 8, "host_events": "yes"}),
    ("host_events without a host tier", {"host_events": True}),
]


def call(method: str, *args: Any, **kwargs: Any) -> Call:
    """``obj.method(*args, **kwargs)``."""

    def f(obj: Any, w: Any) -> object:
        return getattr(obj, method)(*args, **kwargs)

    return f


def on(method: str, handle: str, *args: Any) -> Call:
    """``obj.method(w.<handle>, *args)``: a node handle of the world."""

    def f(obj: Any, w: Any) -> object:
        return getattr(obj, method)(getattr(w, handle), *args)

    return f


COUNTS_BAD: list[tuple[str, Any]] = [
    ("None", None),
    ("-1", -1),
    ("2**63", 2**63),
    ("2**64", BIG),
    ("float", 1.0),
    ("bool", True),
    ("str", "1"),
]
HANDLE_METHODS = (
    "inc_lock_ref",
    "dec_lock_ref",
    "host_state",
    "path_indices",
    "parent",
    "node_info",
    "load_back",
)

RADIX_BAD: list[tuple[str, Call]] = [
    # tokens and namespaces (read in argument order: the tokens first)
    ("match tokens None", call("match_prefix", None)),
    ("match tokens set", call("match_prefix", {1, 2})),
    ("match tokens dict", call("match_prefix", {1: 2})),
    ("match tokens dict keys", call("match_prefix", {1: 2}.keys())),
    ("match token 2**32", call("match_prefix", [2**32])),
    ("match token float", call("match_prefix", [1.0])),
    ("match extra_key int", call("match_prefix", [1], extra_key=3)),
    ("match cache_salt bytes", call("match_prefix", [1], cache_salt=b"s")),
    ("match extra_key surrogate", call("match_prefix", [1], extra_key="\ud800")),
    ("match salt surrogate", call("match_prefix", [1], cache_salt="\ud800")),
    ("match bad token, bad extra_key", call("match_prefix", [2**32], extra_key=3)),
    ("insert tokens set", call("insert", {1, 2})),
    ("insert values set", call("insert", [1, 2], {1, 2})),
    ("insert values dict", call("insert", [1, 2], {1: 2, 3: 4})),
    ("insert values too short", call("insert", [1, 2], [1])),
    ("insert value 2**63", call("insert", [1], [2**63])),
    ("insert salt surrogate", call("insert", [1], cache_salt="\ud800")),
    ("insert priority bool", call("insert", [9], priority=True)),
    ("insert priority float", call("insert", [9], priority=0.5)),
    ("insert priority 2**63", call("insert", [9], priority=2**63)),
    ("insert priority -2**63 - 1", call("insert", [9], priority=-(2**63) - 1)),
    ("insert inserted_len -1", call("insert", [9], inserted_len=-1)),
    ("insert inserted_len 2**63", call("insert", [9], inserted_len=2**63)),
    ("insert inserted_len float", call("insert", [9], inserted_len=1.0)),
    ("insert short values, bad priority", call("insert", [1, 2], [1], priority=0.5)),
    # counts
    *[
        (f"{m} {label}", call(m, v))
        for m in ("evict", "evict_count", "evict_host")
        for label, v in COUNTS_BAD
    ],
    # handles
    *[(f"{m} int", call(m, 3)) for m in HANDLE_METHODS],
    *[(f"{m} None", call(m, None)) for m in HANDLE_METHODS],
    *[(f"{m} stale", on(m, "stale")) for m in HANDLE_METHODS],
    *[(f"{m} foreign", on(m, "foreign")) for m in HANDLE_METHODS],
    ("load_back values dict", on("load_back", "host_only", {1: 2, 3: 4})),
    ("load_back values set", on("load_back", "host_only", {1, 2, 3, 4})),
    ("load_back values str", on("load_back", "host_only", "1234")),
    ("load_back values float", on("load_back", "host_only", [1.0, 2, 3, 4])),
    ("load_back value 2**63", on("load_back", "host_only", [2**63, 2, 3, 4])),
    ("load_back values too short", on("load_back", "host_only", [1])),
    ("load_back stale node, values set", on("load_back", "stale", {1, 2})),
    ("load_back int node, value 2**63", call("load_back", 3, [2**63])),
    ("take_host_events nonzero int", call("take_host_events", nonzero=1)),
    ("take_host_events nonzero None", call("take_host_events", nonzero=None)),
    ("take_host_events nonzero str", call("take_host_events", nonzero="yes")),
]


@pytest.mark.parametrize(("label", "kwargs"), RADIX_CTOR_BAD, ids=[r[0] for r in RADIX_CTOR_BAD])
def test_radix_constructor_refuses_as_the_core(label: str, kwargs: dict[str, Any]) -> None:
    core = outcome(lambda: RadixCache(**kwargs))
    assert core[0] == "raised", f"{label}: the core accepts it"
    assert outcome(lambda: RefRadix(**kwargs)) == core


@pytest.mark.parametrize(("label", "call"), RADIX_BAD, ids=[r[0] for r in RADIX_BAD])
def test_radix_method_refuses_as_the_core(label: str, call: Call) -> None:
    core, ref = RadixWorld(RadixCache), RadixWorld(RefRadix)
    _refuse_alike(label, lambda: call(core.c, core), lambda: call(ref.c, ref), core, ref)


def _refuse_alike(
    label: str, on_core: Callable[[], object], on_ref: Callable[[], object], core: Any, ref: Any
) -> None:
    """The core refuses the call, the reference raises the same class, neither changes."""
    assert core.state() == ref.state()
    before = core.state()
    got = outcome(on_core)
    assert got[0] == "raised", f"{label}: the core accepts it"
    assert core.state() == before
    assert outcome(on_ref) == got
    assert ref.state() == before, "the reference changed on a refused call"


RADIX_GOOD: list[tuple[str, dict[str, Any], Call | None]] = [
    ("numpy scalars", {"page_size": np.int64(1), "host_capacity": np.uint32(8)}, None),
    ("host_events numpy bool", {"host_capacity": 8, "host_events": np.bool_(True)}, None),
    ("None defaults", {"page_size": None, "host_capacity": None}, None),
    ("write_policy any case", {"host_capacity": 8, "write_policy": "Write-Back"}, None),
    (
        "numpy counts",
        {"host_capacity": 8},
        lambda c, w: (
            c.insert([1, 2], priority=np.int8(-3), inserted_len=np.uint64(1)).prefix_len,
            c.evict(np.int32(1)).tolist(),
            c.evict_host(np.int64(1)),
            [a.tolist() for a in c.take_host_events(nonzero=np.bool_(False))],
        ),
    ),
]


@pytest.mark.parametrize(("label", "kwargs", "call"), RADIX_GOOD, ids=[r[0] for r in RADIX_GOOD])
def test_radix_accepts_what_the_core_accepts(
    label: str, kwargs: dict[str, Any], call: Call | None
) -> None:
    core, ref = RadixCache(**kwargs), RefRadix(**kwargs)
    for attr in ("page_size", "eviction_policy", "host_capacity", "write_policy", "host_events"):
        assert getattr(core, attr) == getattr(ref, attr), attr
    if call is not None:
        assert call(core, None) == call(ref, None)
        assert core.dump() == ref.dump()


# ---- BlockTrie ----------------------------------------------------------------------


class TrieWorld:
    """A trie with a host tier, a stored request (1) and one with a pending copy (2)."""

    def __init__(self, cls: Any) -> None:
        self.t = t = cls(8, tokens_per_block=2, host_blocks=4)
        t.claim(1, [1, 2, 3, 4, 5])
        t.store(1, [1, 2, 3, 4, 5])
        t.claim(2, [1, 2, 3, 6, 7], priority=50, retention=3)

    def state(self) -> object:
        t = self.t
        return (
            t.dump(),
            t.host_dump(),
            t.clock,
            t.num_requests,
            t.num_free_blocks,
            t.stats,
            t.host_stats(),
            [t.request_blocks(r) for r in (1, 2)],
        )


TRIE_CTOR_BAD: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("num_blocks zero", (0,), {}),
    ("num_blocks negative", (-1,), {}),
    ("num_blocks float", (8.0,), {}),
    ("num_blocks bool", (True,), {}),
    ("num_blocks None", (None,), {}),
    ("num_blocks str", ("8",), {}),
    ("num_blocks 2**32 - 1", (2**32 - 1,), {}),
    ("num_blocks 2**64", (BIG,), {}),
    ("tokens_per_block zero", (8,), {"tokens_per_block": 0}),
    ("tokens_per_block negative", (8,), {"tokens_per_block": -2}),
    ("tokens_per_block bool", (8,), {"tokens_per_block": True}),
    ("tokens_per_block float", (8,), {"tokens_per_block": 2.0}),
    ("tokens_per_block 2**64", (8,), {"tokens_per_block": BIG}),
    ("enable_partial_reuse int", (8,), {"enable_partial_reuse": 1}),
    ("enable_partial_reuse None", (8,), {"enable_partial_reuse": None}),
    ("copy_on_partial_reuse int", (8,), {"copy_on_partial_reuse": 0}),
    ("host_blocks negative", (8,), {"host_blocks": -1}),
    ("host_blocks bool", (8,), {"host_blocks": True}),
    ("host_blocks float", (8,), {"host_blocks": 1.0}),
    ("host_blocks str", (8,), {"host_blocks": "1"}),
    ("host_blocks 2**32", (8,), {"host_blocks": 2**32}),  # the reference built 2**32 blocks
    ("host_blocks 2**64", (8,), {"host_blocks": BIG}),
    ("offload priority 101", (8,), {"host_blocks": 2, "secondary_offload_min_priority": 101}),
    ("offload priority -1", (8,), {"host_blocks": 2, "secondary_offload_min_priority": -1}),
    ("offload priority bool", (8,), {"host_blocks": 2, "secondary_offload_min_priority": True}),
    ("offload priority float", (8,), {"host_blocks": 2, "secondary_offload_min_priority": 3.0}),
    ("enable_events None", (8,), {"enable_events": None}),
    ("enable_events int", (8,), {"enable_events": 1}),
    ("bad flag, no blocks", (0,), {"enable_events": None}),
]

RID_BAD: list[tuple[str, Any]] = [
    ("-1", -1),
    ("2**64", BIG),
    ("bool", True),
    ("float", 2.0),
    ("None", None),
    ("str", "1"),
    ("numpy float", np.float64(1.0)),
    ("unknown", 99),
]
TOKENS_BAD: list[tuple[str, Any]] = [
    ("None", None),
    ("str", "ab"),
    ("set", {1, 2}),
    ("2**32", [1, 2**32]),
    ("-1", [1, -1]),
    ("float", [1, 1.5]),
    ("bool", [1, True]),
    ("float array", np.array([1.0, 2.0])),
]
MM_BAD: list[tuple[str, Any]] = [
    ("not iterable", 5),
    ("short tuple", [(b"h", 0)]),
    ("list item", [[b"h", 0, 1]]),
    ("int hash", [(3, 0, 1)]),
    ("bytearray hash", [(bytearray(b"h"), 0, 1)]),
    ("surrogate hash", [("\ud800", 0, 1)]),
    ("negative start", [(b"h", -1, 1)]),
    ("float start", [(b"h", 0.0, 1)]),
    ("bool length", [(b"h", 0, True)]),
    ("empty", [(b"h", 0, 0)]),
    ("past the prompt", [(b"h", 0, 99)]),
    ("start 2**64", [(b"h", BIG, 1)]),
]
LORA_BAD: list[tuple[str, Any]] = [
    ("-1", -1),
    ("2**63", 2**63),
    ("2**64", BIG),
    ("str", "a"),
    ("float", 1.0),
    ("bool", True),
]
SALT_BAD: list[tuple[str, Any]] = [("int", 3), ("bytes", b"s"), ("surrogate", "\ud800")]
PROMPT = [1, 2, 3, 9, 9]

TRIE_BAD: list[tuple[str, Call]] = [
    *[(f"claim request_id {label}", call("claim", v, PROMPT)) for label, v in RID_BAD[:-1]],
    ("claim request_id held", call("claim", 1, PROMPT)),
    *[(f"claim tokens {label}", call("claim", 3, v)) for label, v in TOKENS_BAD],
    ("claim tokens empty", call("claim", 3, [])),
    *[
        (f"{m} {arg} {label}", call(m, *lead, PROMPT, **{arg: v}))
        for m, lead in (("claim", (3,)), ("lookup", ()))
        for arg, table in (("lora_id", LORA_BAD), ("cache_salt", SALT_BAD), ("mm_items", MM_BAD))
        for label, v in table
    ],
    *[
        (f"claim {arg} {label}", call("claim", 3, PROMPT, **{arg: v}))
        for arg, table in (
            (
                "priority",
                [("101", 101), ("-1", -1), ("bool", True), ("float", 1.5), ("2**64", BIG)],
            ),
            ("retention", [("-1", -1), ("bool", True), ("float", 1.0), ("2**64", BIG)]),
            ("reserve_tokens", [("-1", -1), ("bool", True), ("float", 1.0), ("2**64", BIG)]),
        )
        for label, v in table
    ],
    ("claim held id, bad priority", call("claim", 1, PROMPT, priority=1.5)),
    ("claim bad salt, bad id", call("claim", -1, PROMPT, cache_salt=3)),
    *[(f"lookup tokens {label}", call("lookup", v)) for label, v in TOKENS_BAD],
    *[
        (f"{m} request_id {label}", call(m, v))
        for m in ("complete", "release", "request_blocks")
        for label, v in RID_BAD
    ],
    *[(f"store request_id {label}", call("store", v, [1, 2])) for label, v in RID_BAD],
    *[(f"store tokens {label}", call("store", 1, v)) for label, v in TOKENS_BAD],
    ("store unknown request, bad tokens", call("store", 99, "ab")),
    *[(f"extend request_id {label}", call("extend", v, 8)) for label, v in RID_BAD],
    *[(f"extend num_tokens {label}", call("extend", 1, v)) for label, v in COUNTS_BAD],
    ("extend unknown request, bad count", call("extend", 99, -1)),
    *[(f"advance_clock {label}", call("advance_clock", v)) for label, v in COUNTS_BAD],
    ("take_events compact str", call("take_events", compact="yes")),
    ("take_events compact int", call("take_events", compact=1)),
    ("take_events compact None", call("take_events", compact=None)),
]


@pytest.mark.parametrize(
    ("label", "args", "kwargs"), TRIE_CTOR_BAD, ids=[r[0] for r in TRIE_CTOR_BAD]
)
def test_trie_constructor_refuses_as_the_core(
    label: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    core = outcome(lambda: BlockTrie(*args, **kwargs))
    assert core[0] == "raised", f"{label}: the core accepts it"
    assert outcome(lambda: RefTrie(*args, **kwargs)) == core


@pytest.mark.parametrize(("label", "call"), TRIE_BAD, ids=[r[0] for r in TRIE_BAD])
def test_trie_method_refuses_as_the_core(label: str, call: Call) -> None:
    core, ref = TrieWorld(BlockTrie), TrieWorld(RefTrie)
    _refuse_alike(label, lambda: call(core.t, core), lambda: call(ref.t, ref), core, ref)


def _numpy_args(t: Any, w: Any) -> object:
    c = t.claim(
        np.uint64(3),
        np.array([1, 2, 3, 4, 8], dtype=np.uint16),
        lora_id=np.int64(0),
        mm_items=[(b"img", np.int32(3), np.uint8(2))],
        priority=np.int8(60),
        retention=np.uint32(2),
        reserve_tokens=np.int64(3),
    )
    stored = t.store(np.int64(3), [1, 2, 3, 4, 8])
    ext = t.extend(np.uint8(3), np.int16(12))
    t.advance_clock(np.int64(5))
    lk = t.lookup((1, 2, 3), lora_id=np.uint8(0))
    events = t.take_events(compact=np.bool_(True))
    t.release(np.int8(3))
    return (c.block_ids, c.copies, stored, ext, lk.num_matched_tokens, events, t.dump())


def _saturating_clock(t: Any, w: Any) -> object:
    """Ticks past 2**64 - 1 (advance_clock, claim) and retention expiries beyond it stop
    there, as in the core."""
    out: list[object] = []
    t.claim(0, [1, 2], priority=80, retention=2**63 - 1)
    t.release(0)
    for _ in range(3):
        t.advance_clock(2**63 - 1)
        out.append(t.clock)
    out.append(t.dump())  # expired: back to the default priority
    t.claim(1, [5, 6], priority=80, retention=5)
    out.append(t.clock)
    t.release(1)
    t.advance_clock(0)
    out.append(t.dump())  # its expiry, 2**64 - 1, is reached
    return out


TRIE_GOOD: list[tuple[str, tuple[Any, ...], dict[str, Any], Call | None]] = [
    (
        "numpy scalars",
        (np.int64(8),),
        {
            "tokens_per_block": np.uint8(2),
            "enable_partial_reuse": np.bool_(False),
            "copy_on_partial_reuse": np.bool_(True),
            "host_blocks": np.int32(2),
            "secondary_offload_min_priority": np.int64(10),
            "enable_events": np.bool_(True),
        },
        _numpy_args,
    ),
    (
        "None defaults",
        (4,),
        {"tokens_per_block": None, "host_blocks": None, "secondary_offload_min_priority": None},
        lambda t, w: (t.advance_clock(0), t.clock, t.claim(0, [1, 2]).block_ids, t.clock),
    ),
    (
        "clock saturates at 2**64 - 1",
        (4,),
        {"tokens_per_block": 1},
        _saturating_clock,
    ),
]


@pytest.mark.parametrize(
    ("label", "args", "kwargs", "call"), TRIE_GOOD, ids=[r[0] for r in TRIE_GOOD]
)
def test_trie_accepts_what_the_core_accepts(
    label: str, args: tuple[Any, ...], kwargs: dict[str, Any], call: Call | None
) -> None:
    core, ref = BlockTrie(*args, **kwargs), RefTrie(*args, **kwargs)
    for attr in (
        "num_blocks",
        "tokens_per_block",
        "enable_partial_reuse",
        "copy_on_partial_reuse",
        "host_blocks",
        "secondary_offload_min_priority",
    ):
        a, b = getattr(core, attr), getattr(ref, attr)
        assert (a, type(a)) == (b, type(b)), attr
    if call is not None:
        assert call(core, None) == call(ref, None)


# ---- Several bad arguments: the first is named -----------------------------------------

IT, II = InvalidTypeError, InvalidInputError
RADIX_CTOR_FIRST: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("page_size, eviction_policy", {"page_size": 0, "eviction_policy": 1}, II, "page_size"),
    ("page_size, write_policy", {"page_size": 1.0, "write_policy": None}, IT, "page_size"),
    ("page_size, host_events", {"page_size": -1, "host_events": 1}, II, "page_size"),
    (
        "eviction_policy name, host_capacity",
        {"eviction_policy": "xyz", "host_capacity": -1},
        II,
        "eviction policy",
    ),
    (
        "eviction_policy name, write_policy",
        {"eviction_policy": "xyz", "write_policy": 1},
        II,
        "eviction policy",
    ),
    ("host_capacity, write_policy", {"host_capacity": -1, "write_policy": 1}, II, "host_capacity"),
    (
        "host_capacity, host_events",
        {"host_capacity": 1.0, "host_events": None},
        IT,
        "host_capacity",
    ),
    (
        "write_policy name, host_events",
        {"host_capacity": 8, "write_policy": "write_around", "host_events": 1},
        II,
        "write policy",
    ),
]
RADIX_FIRST: list[tuple[str, Call, type[Exception], str]] = [
    ("match tokens, extra_key", call("match_prefix", None, extra_key=3), IT, "tokens"),
    ("match token, cache_salt", call("match_prefix", [2**32], cache_salt=b"s"), II, "tokens"),
    ("insert tokens, extra_key", call("insert", {1, 2}, extra_key=3), IT, "tokens"),
    ("insert values, cache_salt", call("insert", [1], [2**63], cache_salt=b"s"), II, "values"),
    ("insert extra_key, priority", call("insert", [1], extra_key=3, priority=0.5), IT, "extra_key"),
]
TRIE_CTOR_FIRST: list[tuple[str, tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
    ("num_blocks 0, enable_events", (0,), {"enable_events": None}, II, "num_blocks"),
    (
        "num_blocks 2**32 - 1, tokens_per_block",
        (2**32 - 1,),
        {"tokens_per_block": 0},
        II,
        "num_blocks",
    ),
    ("num_blocks, enable_partial_reuse", (-1,), {"enable_partial_reuse": 1}, II, "num_blocks"),
    ("num_blocks, enable_events", (None,), {"enable_events": None}, IT, "num_blocks"),
    (
        "tokens_per_block, copy_on_partial_reuse",
        (8,),
        {"tokens_per_block": 0, "copy_on_partial_reuse": 0},
        II,
        "tokens_per_block",
    ),
    (
        "host_blocks, enable_events",
        (8,),
        {"host_blocks": -1, "enable_events": 1},
        II,
        "host_blocks",
    ),
    (
        "offload priority, enable_events",
        (8,),
        {"host_blocks": 2, "secondary_offload_min_priority": 101, "enable_events": 1},
        II,
        "secondary_offload_min_priority",
    ),
]
TRIE_FIRST: list[tuple[str, Call, type[Exception], str]] = [
    ("claim request_id, cache_salt", call("claim", -1, PROMPT, cache_salt=3), II, "request_id"),
    ("claim tokens, cache_salt", call("claim", 3, "ab", cache_salt=3), IT, "tokens"),
    (
        "claim lora_id, cache_salt",
        call("claim", 3, PROMPT, lora_id=-1, cache_salt=3),
        II,
        "lora_id",
    ),
    ("lookup tokens, cache_salt", call("lookup", None, cache_salt=b"s"), IT, "tokens"),
    (
        "lookup lora_id, cache_salt",
        call("lookup", PROMPT, lora_id=1.0, cache_salt=3),
        IT,
        "lora_id",
    ),
]


def _refuse_naming(
    on_core: Callable[[], object],
    on_ref: Callable[[], object],
    error: type[Exception],
    message: str,
) -> None:
    for f in (on_core, on_ref):
        with pytest.raises(error, match=message):
            f()


@pytest.mark.parametrize(
    ("label", "kwargs", "error", "message"),
    RADIX_CTOR_FIRST,
    ids=[r[0] for r in RADIX_CTOR_FIRST],
)
def test_radix_constructor_names_its_first_bad_argument(
    label: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    _refuse_naming(lambda: RadixCache(**kwargs), lambda: RefRadix(**kwargs), error, message)


@pytest.mark.parametrize(
    ("label", "call", "error", "message"), RADIX_FIRST, ids=[r[0] for r in RADIX_FIRST]
)
def test_radix_methods_name_their_first_bad_argument(
    label: str, call: Call, error: type[Exception], message: str
) -> None:
    core, ref = RadixWorld(RadixCache), RadixWorld(RefRadix)
    _refuse_alike(label, lambda: call(core.c, core), lambda: call(ref.c, ref), core, ref)
    _refuse_naming(lambda: call(core.c, core), lambda: call(ref.c, ref), error, message)


@pytest.mark.parametrize(
    ("label", "args", "kwargs", "error", "message"),
    TRIE_CTOR_FIRST,
    ids=[r[0] for r in TRIE_CTOR_FIRST],
)
def test_trie_constructor_names_its_first_bad_argument(
    label: str, args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    _refuse_naming(
        lambda: BlockTrie(*args, **kwargs), lambda: RefTrie(*args, **kwargs), error, message
    )


@pytest.mark.parametrize(
    ("label", "call", "error", "message"), TRIE_FIRST, ids=[r[0] for r in TRIE_FIRST]
)
def test_trie_methods_name_their_first_bad_argument(
    label: str, call: Call, error: type[Exception], message: str
) -> None:
    core, ref = TrieWorld(BlockTrie), TrieWorld(RefTrie)
    _refuse_alike(label, lambda: call(core.t, core), lambda: call(ref.t, ref), core, ref)
    _refuse_naming(lambda: call(core.t, core), lambda: call(ref.t, ref), error, message)


# ---- KVCacheManager: request ids ----------------------------------------------------


def _manager_state(m: Any) -> object:
    return (
        sorted(int(i) for i in m.requests) if hasattr(m, "requests") else len(m),
        [int(b) for b in m.free_block_ids()],
        [(int(i), [int(b) for b in m.block_ids(i)], m.num_tokens(i)) for i in (1, 2)],
        m.stats,
    )


BAD_REQUEST_IDS = [True, False, -1, 2**64, 1.0, None, "1", np.float64(1.0)]

MANAGER_CALLS: list[tuple[str, Callable[[Any, Any], object]]] = [
    ("free", lambda m, r: m.free(r)),
    ("preempt", lambda m, r: m.preempt(r)),
    ("block_ids", lambda m, r: m.block_ids(r)),
    ("append_tokens", lambda m, r: m.append_tokens(r, [9])),
    ("queue_tokens", lambda m, r: m.queue_tokens(r, [9])),
    ("finish", lambda m, r: m.finish(r, [9])),
    ("add_request", lambda m, r: m.add_request(r, [1, 2, 3])),
    ("admit", lambda m, r: m.admit(r, [1, 2, 3])),
    ("extend", lambda m, r: m.extend([2, r], [9, 9], [1, 1])),
    ("decode_steps", lambda m, r: m.decode_steps([2, r], 1)),
    ("max_decode_steps", lambda m, r: m.max_decode_steps([2, r], 2)),
]


@pytest.mark.parametrize(("label", "call"), MANAGER_CALLS, ids=[c[0] for c in MANAGER_CALLS])
def test_manager_request_ids_are_refused_as_the_core_refuses_them(label: str, call: Call) -> None:
    """The reference manager reads request ids as the core does (an int in [0, 2**64)):
    True was request 1 (freed, preempted or extended), -1 an unknown id, and a float or
    str was stored as a new request."""
    from prefixcache import KVCacheManager
    from prefixcache.reference.blocks import KVCacheManager as RefManager

    for rid in BAD_REQUEST_IDS:
        worlds = []
        for cls in (KVCacheManager, RefManager):
            m = cls(16, block_size=2)
            m.admit(1, [1, 2, 3])
            m.admit(2, [4, 5, 6])
            m.queue_tokens(2, [7, 8])
            before = _manager_state(m)
            got = outcome(lambda m=m, rid=rid: call(m, rid))
            assert _manager_state(m) == before, (label, rid, cls)
            worlds.append(got)
        assert worlds[0] == worlds[1], (label, rid)
        assert worlds[0][0] == "raised", (label, rid)


@pytest.mark.parametrize(
    "tokens",
    [
        LyingList([1, np.int64(2), 3]),
        ShortSequence(),
        np.ma.array([1, 2, 3], mask=[0, 1, 0]),
        np.ma.array([1, 2, 3], mask=[0, 0, 0]),
    ],
    ids=["list subclass", "short sequence", "masked entry", "nothing masked"],
)
def test_reference_reads_token_forms_as_the_core(tokens: Any) -> None:
    """A list subclass is read from its items, a sequence shorter than its length and a
    masked entry are refused (InvalidInputError), in the core and its reference alike."""
    got = []
    for cls in (RadixCache, RefRadix):
        c = cls()
        got.append((outcome(lambda c=c: c.insert(tokens)), c.dump()))
    assert got[0] == got[1]
    assert got[0][0][1] in (None, InvalidInputError)


K1, K2, K3 = b"\x01" * 8, b"\x02" * 8, b"\x03" * 8

# (label, call): every argument of CpuOffloadManager bad in turn, the others valid.
OFFLOAD_CALLS: list[tuple[str, Call]] = [
    ("request id 2**64", lambda m, _: m.on_new_request(2**64)),
    ("request id -1", lambda m, _: m.prepare_store(-1, [K3])),
    ("request id bool", lambda m, _: m.on_request_finished(True)),
    ("request id float", lambda m, _: m.prepare_load(1.0, [K1])),
    ("request id str", lambda m, _: m.touch("0", [K1])),
    ("key str", lambda m, _: m.lookup("ab")),
    ("key bytearray", lambda m, _: m.lookup(bytearray(b"ab"))),
    ("key empty", lambda m, _: m.lookup(b"")),
    ("key of 33 bytes", lambda m, _: m.lookup(b"x" * 33)),
    ("keys item str", lambda m, _: m.prepare_store(0, [K3, "ab"])),
    ("keys item of 33 bytes", lambda m, _: m.prepare_store(0, [K3, b"x" * 33])),
    ("keys bytes", lambda m, _: m.touch(0, b"ab")),
    ("keys iterator", lambda m, _: m.lookup_prefix(iter([K1]))),
    ("keys set", lambda m, _: m.complete_load(0, {K1})),
    ("keys repeated in a store", lambda m, _: m.prepare_store(0, [K3, K3])),
    ("load of a key being stored", lambda m, _: m.prepare_load(0, [K1, K2])),
    ("load of a key not stored", lambda m, _: m.prepare_load(7, [K3])),
    ("complete_load with no load", lambda m, _: m.complete_load(0, [K1])),
    ("end tokens of another length", lambda m, _: m.set_offload_key_positions(5, [K1], [1, 2])),
    ("end token -1", lambda m, _: m.set_offload_key_positions(5, [K1], [-1])),
    ("end token 2**63", lambda m, _: m.set_offload_key_positions(5, [K1], [2**63])),
    ("end token float", lambda m, _: m.set_offload_key_positions(5, [K1], [1.5])),
    ("end token bool", lambda m, _: m.set_offload_key_positions(5, [K1], [True])),
    ("end tokens str", lambda m, _: m.set_offload_key_positions(5, [K1], "1")),
    ("success None", lambda m, _: m.complete_store(0, [K2], None)),
    ("success int", lambda m, _: m.complete_store(0, [K2], 1)),
]

OFFLOAD_CONSTRUCTORS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("num_chunks -1", (-1,), {}),
    ("num_chunks 2**63", (2**63,), {}),
    ("num_chunks float", (2.0,), {}),
    ("num_chunks bool", (True,), {}),
    ("cache_policy unknown", (2, "fifo"), {}),
    ("cache_policy int", (2, 3), {}),
    ("store_threshold 0", (2,), {"store_threshold": 0}),
    ("store_threshold 2**32", (2,), {"store_threshold": 2**32}),
    ("store_threshold float", (2,), {"store_threshold": 2.0}),
    ("max_tracker_size 0", (2,), {"max_tracker_size": 0}),
    ("max_tracker_size 2**63", (2,), {"max_tracker_size": 2**63}),
    ("enable_events str", (2,), {"enable_events": "yes"}),
]


def _offload_world(cls: Any) -> Any:
    """Key 1 stored, key 2 being stored, request 0 with end tokens, events on."""
    m = cls(3, store_threshold=1, enable_events=True)
    m.set_offload_key_positions(0, [K1, K2], [16, 32])
    m.complete_store(0, m.prepare_store(0, [K1]).keys_to_store)
    m.prepare_store(0, [K2])
    return m


def _offload_state(m: Any) -> Any:
    keys = [K1, K2, K3]
    return (
        m.num_stored,
        m.num_idle,
        m.num_free_chunks,
        [m.lookup(k) for k in keys],
        m.lookup_prefix(keys),
    )


@pytest.mark.parametrize(("label", "call"), OFFLOAD_CALLS, ids=[c[0] for c in OFFLOAD_CALLS])
def test_offload_reference_refuses_as_the_core(label: str, call: Call) -> None:
    """The offload tier's reference reads arguments as the core does: the same
    exception class for each bad argument, and neither side changed (the reference
    opens no request context for a refused call)."""
    from prefixcache import CpuOffloadManager
    from prefixcache.reference.offload import CpuOffloadManager as RefOffload

    got = []
    for cls in (CpuOffloadManager, RefOffload):
        m = _offload_world(cls)
        before = _offload_state(m)
        requests = dict(m.requests) if cls is RefOffload else None
        got.append(outcome(lambda m=m: call(m, None)))
        assert _offload_state(m) == before, (label, cls)
        if requests is not None:
            assert m.requests == requests, label
    assert got[0] == got[1], label
    assert got[0][0] == "raised", label


@pytest.mark.parametrize(
    ("label", "args", "kwargs"), OFFLOAD_CONSTRUCTORS, ids=[c[0] for c in OFFLOAD_CONSTRUCTORS]
)
def test_offload_reference_constructor_refuses_as_the_core(
    label: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    from prefixcache import CpuOffloadManager
    from prefixcache.reference.offload import CpuOffloadManager as RefOffload

    got = [outcome(lambda cls=cls: cls(*args, **kwargs)) for cls in (CpuOffloadManager, RefOffload)]
    assert got[0] == got[1], label
    assert got[0][0] == "raised", label


def test_offload_reference_takes_the_forms_the_core_takes() -> None:
    """numpy integers and bools where ints and bools go, end tokens as an array."""
    from prefixcache import CpuOffloadManager
    from prefixcache.reference.offload import CpuOffloadManager as RefOffload

    states = []
    for cls in (CpuOffloadManager, RefOffload):
        m = cls(np.int64(3), store_threshold=np.int64(1), enable_events=np.bool_(True))
        m.set_offload_key_positions(np.uint64(4), (K1, K3), np.array([16, 32]))
        out = m.prepare_store(np.int64(4), (K1, K3))
        m.complete_store(4, out.keys_to_store, np.bool_(False))
        states.append((_offload_state(m), [(e.keys, e.removed) for e in m.take_events()]))
    assert states[0] == states[1]


# ---- KVCacheManager and BlockPool: constructors -------------------------------------

MANAGER_CTOR_BAD: list[tuple[str, dict[str, Any]]] = [
    ("num_blocks zero", {"num_blocks": 0}),
    ("num_blocks 2**32", {"num_blocks": 2**32}),
    ("num_blocks float", {"num_blocks": 8.0}),
    ("num_blocks bool", {"num_blocks": True}),
    ("block_size zero", {"block_size": 0}),
    ("block_size str", {"block_size": "16"}),
    ("hash_algo unknown", {"hash_algo": "md5"}),
    ("hash_algo int", {"hash_algo": 5}),
    ("hash_algo None", {"hash_algo": None}),
    ("enable_caching int", {"enable_caching": 1}),
    ("enable_caching None", {"enable_caching": None}),
    ("sliding_window 1", {"sliding_window": 1}),
    ("sliding_window -1", {"sliding_window": -1}),
    ("sliding_window float", {"sliding_window": 4.0}),
    ("enable_kv_cache_events int", {"enable_kv_cache_events": 1}),
    ("seed int", {"seed": 5}),
    ("seed bytes", {"seed": b"s"}),
    ("seed surrogate", {"seed": "\ud800"}),
    ("event_hash_format unknown", {"event_hash_format": "hex"}),
    ("event_hash_format None", {"event_hash_format": None}),
    # two bad arguments: the first is named
    ("hash_algo unknown, enable_caching int", {"hash_algo": "bad", "enable_caching": 1}),
    ("num_blocks zero, enable_caching int", {"num_blocks": 0, "enable_caching": 1}),
    ("num_blocks zero, sliding_window 1", {"num_blocks": 0, "sliding_window": 1}),
    ("sliding_window 1, seed int", {"sliding_window": 1, "seed": 5}),
    ("sliding_window 1, event_hash_format", {"sliding_window": 1, "event_hash_format": "x"}),
    ("hash_algo unknown, event_hash_format", {"hash_algo": "bad", "event_hash_format": "x"}),
    ("block_size float, hash_algo unknown", {"block_size": 1.0, "hash_algo": "bad"}),
]
POOL_CTOR_BAD: list[tuple[str, dict[str, Any]]] = [
    ("num_blocks zero", {"num_blocks": 0}),
    ("num_blocks 2**32", {"num_blocks": 2**32}),
    ("num_blocks float", {"num_blocks": 8.0}),
    ("enable_caching int", {"enable_caching": 1}),
    ("enable_kv_cache_events str", {"enable_kv_cache_events": "yes"}),
    ("event_hash_format unknown", {"event_hash_format": "hex"}),
    ("event_hash_format int", {"event_hash_format": 1}),
    ("num_blocks zero, enable_caching int", {"num_blocks": 0, "enable_caching": 1}),
    ("num_blocks zero, event_hash_format", {"num_blocks": 0, "event_hash_format": "x"}),
    ("enable_caching int, event_hash_format", {"enable_caching": 1, "event_hash_format": "x"}),
]


def _first_line(f: Callable[[], object]) -> tuple[str, type[BaseException] | None, str]:
    """The outcome with the argument the message starts with (the one named)."""
    try:
        f()
    except Exception as e:
        return ("raised", type(e), str(e).split(" ")[0])
    return ("ok", None, "")


@pytest.mark.parametrize(
    ("label", "kwargs"), MANAGER_CTOR_BAD, ids=[r[0] for r in MANAGER_CTOR_BAD]
)
def test_manager_constructor_refuses_as_the_core(label: str, kwargs: dict[str, Any]) -> None:
    """The reference manager reads its constructor's arguments as the core does, in
    order, with the core's classes (an unknown hash algorithm was a plain ValueError, a
    non-str seed or a non-bool flag were taken)."""
    from prefixcache import KVCacheManager
    from prefixcache.reference.blocks import KVCacheManager as RefManager

    kwargs = {"num_blocks": 8, **kwargs}
    core = _first_line(lambda: KVCacheManager(**kwargs))
    assert core[0] == "raised", f"{label}: the core accepts it"
    assert _first_line(lambda: RefManager(**kwargs)) == core


@pytest.mark.parametrize(("label", "kwargs"), POOL_CTOR_BAD, ids=[r[0] for r in POOL_CTOR_BAD])
def test_pool_constructor_refuses_as_the_core(label: str, kwargs: dict[str, Any]) -> None:
    from prefixcache import BlockPool
    from prefixcache.reference.blocks import BlockPool as RefPool

    kwargs = {"num_blocks": 8, **kwargs}
    core = _first_line(lambda: BlockPool(**kwargs))
    assert core[0] == "raised", f"{label}: the core accepts it"
    assert _first_line(lambda: RefPool(**kwargs)) == core


# ---- KVCacheManager and BlockPool: every method's arguments -------------------------


def _blocks_manager(cls: Any) -> Any:
    m = cls(16, block_size=2, enable_kv_cache_events=True)
    m.admit(1, [1, 2, 3])
    m.admit(2, [4, 5, 6])
    m.queue_tokens(1, [4, 5])
    m.take_events()
    return m


def _blocks_manager_state(m: Any) -> object:
    return (
        _manager_state(m),
        m.num_queued_tokens(1),
        m.num_cached_blocks,
        [int(m.ref_cnt(b)) for b in range(m.num_blocks)],
        m.take_events(),
    )


BAD_TOKENS = [("str", "x"), ("float", [1.0]), ("-1", [-1]), ("None", None), ("set", {1})]
BAD_COUNTS = [("-1", -1), ("float", 1.0), ("str", "1"), ("None", None), ("bool", True)]
MANAGER_METHOD_BAD: list[tuple[str, Call]] = [
    *[(f"add_request tokens {n}", call("add_request", 3, t)) for n, t in BAD_TOKENS],
    *[(f"admit tokens {n}", call("admit", 3, t)) for n, t in BAD_TOKENS],
    *[(f"append_tokens tokens {n}", call("append_tokens", 1, t)) for n, t in BAD_TOKENS],
    *[(f"append_tokens unknown, tokens {n}", call("append_tokens", 9, t)) for n, t in BAD_TOKENS],
    *[(f"queue_tokens unknown, tokens {n}", call("queue_tokens", 9, t)) for n, t in BAD_TOKENS],
    *[
        (f"finish unknown, output {n}", call("finish", 9, t))
        for n, t in BAD_TOKENS
        if t is not None
    ],
    *[(f"extend unknown, tokens {n}", call("extend", [9], t, [1])) for n, t in BAD_TOKENS],
    *[
        (f"allocate_slots blocks {n}", call("allocate_slots", 1, 1, 0, t))
        for n, t in BAD_TOKENS[:3]
    ],
    *[(f"evict_blocks {n}", call("evict_blocks", t)) for n, t in BAD_TOKENS],
    *[(f"allocate_slots unknown, new {n}", call("allocate_slots", 9, v)) for n, v in BAD_COUNTS],
    *[(f"allocate_slots new {n}", call("allocate_slots", 1, v)) for n, v in BAD_COUNTS],
    *[(f"allocate_slots computed {n}", call("allocate_slots", 1, 1, v)) for n, v in BAD_COUNTS],
    *[
        (f"allocate_slots lookahead {n}", call("allocate_slots", 1, 1, 0, None, v))
        for n, v in BAD_COUNTS
    ],
    *[(f"admit lookahead {n}", call("admit", 3, [1, 2], v)) for n, v in BAD_COUNTS],
    *[(f"decode_steps steps {n}", call("decode_steps", [1], v)) for n, v in BAD_COUNTS],
    *[(f"max_decode_steps unknown, {n}", call("max_decode_steps", [9], v)) for n, v in BAD_COUNTS],
    *[(f"max_decode_steps {n}", call("max_decode_steps", [1], v)) for n, v in BAD_COUNTS],
    *[(f"extend counts {n}", call("extend", [1], [9], [v])) for n, v in BAD_COUNTS],
    *[(f"ref_cnt {n}", call("ref_cnt", v)) for n, v in BAD_COUNTS],
    *[(f"block_hash {n}", call("block_hash", v)) for n, v in BAD_COUNTS],
    ("add_request lora_id float", call("add_request", 3, [1], lora_id=1.0)),
    ("add_request lora_id 2**63", call("add_request", 3, [1], lora_id=2**63)),
    ("add_request lora_name int", call("add_request", 3, [1], lora_name=5)),
    ("add_request lora_name surrogate", call("add_request", 3, [1], lora_name="\ud800")),
    ("add_request extra_keys int", call("add_request", 3, [1, 2], extra_keys=5)),
    ("add_request extra_keys str", call("add_request", 3, [1, 2], extra_keys="x")),
    ("add_request extra_keys entry int", call("add_request", 3, [1, 2], extra_keys=[1])),
    ("add_request extra_keys entry list", call("add_request", 3, [1, 2], extra_keys=[([1],)])),
    ("add_request default_extra_keys list", call("add_request", 3, [1], default_extra_keys=[1])),
    ("admit extra_keys entry float", call("admit", 3, [1, 2], extra_keys=[(1.0,)])),
    # two bad arguments: the first is named
    ("add_request bad id, bad lora_name", call("add_request", -1, [1], lora_name=5)),
    ("add_request bad tokens, bad lora_id", call("add_request", 3, "x", lora_id="y")),
    ("admit bad id, bad lora_name", call("admit", -1, [1], lora_name=5)),
    ("admit bad lookahead, bad extra_keys", call("admit", 3, [1], -1, extra_keys=5)),
    ("allocate_slots bad id, bad count", call("allocate_slots", -1, 1.0)),
    ("extend bad tokens, bad counts", call("extend", [1], "x", "y")),
    ("extend bad tokens, counts too long", call("extend", [1], "x", [1, 2])),
    ("decode_steps bad ids, bad steps", call("decode_steps", [-1], 0)),
    ("max_decode_steps bad ids, bad steps", call("max_decode_steps", [-1], -1)),
]


@pytest.mark.parametrize(
    ("label", "call"), MANAGER_METHOD_BAD, ids=[r[0] for r in MANAGER_METHOD_BAD]
)
def test_manager_method_refuses_as_the_core(label: str, call: Call) -> None:
    """The reference manager reads every argument as the core does, in order and before
    it looks the request up (a bad count of an unknown request was UnknownRequestError,
    a float count, a non-str LoRA name or a list of extra keys were taken)."""
    from prefixcache import KVCacheManager
    from prefixcache.reference.blocks import KVCacheManager as RefManager

    got = []
    for cls in (KVCacheManager, RefManager):
        m = _blocks_manager(cls)
        before = _blocks_manager_state(m)
        got.append(_first_line(lambda m=m: call(m, None)))
        assert _blocks_manager_state(m) == before, (label, cls)
    assert got[0][0] == "raised", f"{label}: the core accepts it"
    assert got[1] == got[0]


H32 = b"\x01" * 32


def _pool_state(p: Any) -> object:
    ids = range(p.num_blocks)
    return (list(p.free_block_ids()), [p.ref_cnt(b) for b in ids], [p.block_hash(b) for b in ids])


POOL_METHOD_BAD: list[tuple[str, Call]] = [
    *[(f"get_new_blocks {n}", call("get_new_blocks", v)) for n, v in BAD_COUNTS],
    *[
        (f"{m} {n}", call(m, t))
        for m in ("touch", "free_blocks", "evict_blocks")
        for n, t in BAD_TOKENS
    ],
    ("touch 2**32", call("touch", [2**32])),
    ("get_cached_block str", call("get_cached_block", "x")),
    ("get_cached_block empty", call("get_cached_block", b"")),
    ("get_cached_block groups str", call("get_cached_block", H32, "x")),
    ("get_cached_block bad hash, bad groups", call("get_cached_block", "x", "y")),
    *[
        (f"cache_full_blocks {label}", call("cache_full_blocks", *args, **kw))
        for label, args, kw in [
            ("block_ids str", ("x", [H32], 0, 1, 4), {}),
            ("block_ids float", ([1.0], [H32], 0, 1, 4), {}),
            ("block_hashes int", ([1], 5, 0, 1, 4), {}),
            ("block_hashes [int]", ([1], [5], 0, 1, 4), {}),
            ("block_hashes empty hash", ([1], [b""], 0, 1, 4), {}),
            ("block_hashes 33 bytes", ([1], [b"x" * 33], 0, 1, 4), {}),
            ("block_hashes, a bad one past the range", ([1], [H32, "x"], 0, 1, 4), {}),
            ("num_cached_blocks -1", ([1], [H32], -1, 1, 4), {}),
            ("num_full_blocks float", ([1], [H32], 0, 1.0, 4), {}),
            ("block_size 0", ([1], [H32], 0, 1, 0), {}),
            ("group_id -1", ([1], [H32], 0, 1, 4, -1), {}),
            ("token_ids str", ([1], [H32], 0, 1, 4), {"token_ids": "x"}),
            ("lora_id str", ([1], [H32], 0, 1, 4), {"lora_id": "x"}),
            ("lora_name int", ([1], [H32], 0, 1, 4), {"lora_name": 5}),
            ("extra_keys int", ([1], [H32], 0, 1, 4), {"extra_keys": 5}),
            ("extra_keys [int]", ([1], [H32], 0, 1, 4), {"extra_keys": [1]}),
            ("bad block_ids, bad count", ("x", [], -1, 0, 1), {}),
            ("bad block_hashes, bad count", ([1], "x", -1, 0, 1), {}),
            ("bad block_hashes, bad extra_keys", ([1], [5], 0, 1, 1), {"extra_keys": 5}),
            ("bad tokens, bad lora_id", ([1], [H32], 0, 1, 4), {"token_ids": "x", "lora_id": 1.0}),
        ]
    ],
]


@pytest.mark.parametrize(("label", "call"), POOL_METHOD_BAD, ids=[r[0] for r in POOL_METHOD_BAD])
def test_pool_method_refuses_as_the_core(label: str, call: Call) -> None:
    from prefixcache import BlockPool
    from prefixcache.reference.blocks import BlockPool as RefPool

    got = []
    for cls in (BlockPool, RefPool):
        p = cls(8)
        p.get_new_blocks(2)
        before = _pool_state(p)
        got.append(_first_line(lambda p=p: call(p, None)))
        assert _pool_state(p) == before, label
    assert got[0][0] == "raised", f"{label}: the core accepts it"
    assert got[1] == got[0]


def _event_fields(events: list[Any]) -> list[object]:
    """Events as comparable values (arrays as their items and dtype)."""
    import dataclasses

    out: list[object] = []
    for e in events:
        fields = {
            k: (v.tolist(), str(v.dtype)) if isinstance(v, np.ndarray) else v
            for k, v in dataclasses.asdict(e).items()
        }
        out.append((type(e).__name__, fields))
    return out


@pytest.mark.parametrize("fmt", ["u64", "bytes"])
def test_manager_compact_events_as_the_core(fmt: str) -> None:
    """The reference manager takes ``compact`` as the core does: no token ids, runs of
    removals merged, u64 hashes as uint64 arrays (it took no argument)."""
    from prefixcache import KVCacheManager
    from prefixcache.reference.blocks import KVCacheManager as RefManager

    got = []
    for cls in (KVCacheManager, RefManager):
        m = cls(6, block_size=2, enable_kv_cache_events=True, event_hash_format=fmt)
        for rid, first in ((1, 1), (2, 7), (3, 20)):  # the third evicts the first two
            m.admit(rid, list(range(first, first + 5)))
            m.free(rid)
        m.reset_prefix_cache()
        got.append(_event_fields(m.take_events(compact=np.bool_(True))))
        for bad in (1, None, "yes"):
            assert outcome(lambda m=m, bad=bad: m.take_events(compact=bad)) == (
                "raised",
                InvalidTypeError,
            )
    assert got[0] == got[1]
    removed = [e[1]["block_hashes"] for e in got[0] if e[0] == "BlockRemoved"]  # type: ignore[index]
    sizes = [len(h[0]) if isinstance(h, tuple) else len(h) for h in removed]
    assert 2 in sizes  # a merged run


def test_manager_membership_as_the_core() -> None:
    """``x in manager`` reads ``x`` as a request id as the core does: a bool, a float or
    a numpy float is no request id (the reference found request 1 for True and 1.0)."""
    from prefixcache import KVCacheManager
    from prefixcache.reference.blocks import KVCacheManager as RefManager

    probes = [1, True, 1.0, np.int64(1), np.float64(1.0), "1", 2**64 + 1, -1, None]
    got = []
    for cls in (KVCacheManager, RefManager):
        m = cls(8, block_size=2)
        m.admit(1, [1, 2, 3])
        got.append([x in m for x in probes])
    assert got[0] == got[1]
