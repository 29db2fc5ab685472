"""The embedded fleet index (``KvIndex``): vLLM 0.33's own KV events as ground truth, the
three input forms, copies, media, sequence numbers, TTL, queries, bad input, and a
differential test against the plain-Python reference."""

from __future__ import annotations

import re
from typing import Any

import msgpack
import numpy as np
import pytest
from fleet_support import load_vectors
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache import AllBlocksCleared as Cleared
from prefixcache import (
    BlockHasher,
    BlockRemoved,
    BlockStored,
    InvalidEventError,
    InvalidInputError,
    InvalidTypeError,
    KvIndex,
    UnknownWorkerError,
)
from prefixcache.fleet import decode_kv_events, decode_kv_frames, open_index
from prefixcache.reference.fleet import FleetReference

VECTORS = load_vectors()


def test_vectors_cover_the_interesting_cases() -> None:
    kinds = {d["after"] for d in VECTORS}
    assert kinds == {"admit", "free", "reset"} or kinds >= {"admit", "reset"}
    assert len({d["worker"] for d in VECTORS}) == 3


def test_frames_agree_with_vllm_after_every_batch() -> None:
    ix = KvIndex()
    for d in VECTORS:
        assert ix.apply_frames(d["name"], d["frames"], now=0.0) == "applied"
        assert ix.cached_hashes(d["name"]) == d["cached_hashes"], (d["name"], d["seq"])
    ix.check_invariants()
    assert ix.status("worker0", now=0.0)["dp_rank"] == 0


def _vllm_style(ev: dict) -> object:
    """An object shaped like vLLM's msgspec event classes (attributes, class name)."""
    cls = type(ev["type"], (), {})
    obj = cls()
    for k, v in ev.items():
        if k != "type":
            setattr(obj, k, v)
    return obj


def _prefixcache_events(ev: dict) -> object:
    if ev["type"] == "BlockStored":
        return BlockStored(
            block_hashes=ev["block_hashes"],
            parent_block_hash=ev.get("parent_block_hash"),
            token_ids=ev["token_ids"],
            block_size=ev["block_size"],
            lora_id=ev.get("lora_id"),
            medium=ev.get("medium"),
            lora_name=ev.get("lora_name"),
            extra_keys=ev.get("extra_keys"),
            group_idx=ev.get("group_idx", 0),
        )
    if ev["type"] == "BlockRemoved":
        return BlockRemoved(block_hashes=ev["block_hashes"], medium=ev.get("medium"))
    return Cleared()


@pytest.mark.parametrize("form", ["dict", "vllm", "prefixcache"])
def test_event_objects_agree_with_vllm(form: str) -> None:
    ix = KvIndex()
    for d in VECTORS:
        _ts, events, _rank = msgpack.unpackb(d["payload"])
        objs = {
            "dict": lambda e: e,
            "vllm": _vllm_style,
            "prefixcache": _prefixcache_events,
        }[form]
        assert ix.apply(d["name"], [objs(e) for e in events], seq=d["seq"], now=0.0) == "applied"
        assert ix.cached_hashes(d["name"]) == d["cached_hashes"]
    ix.check_invariants()


def test_decoders_agree() -> None:
    for d in VECTORS[:50]:
        seq, _ts, rank, ops = decode_kv_frames(d["frames"])
        _ts2, events, _ = msgpack.unpackb(d["payload"])
        assert seq == d["seq"] and rank == 0
        assert ops == decode_kv_events(events)


def test_a_hash_on_several_blocks_is_lost_with_its_last_copy() -> None:
    ix = KvIndex()
    stored = {"type": "BlockStored", "block_hashes": [1, 2], "block_size": 16}
    ix.apply("a", [stored, {**stored, "block_hashes": [2]}])
    ix.apply("a", [{"type": "BlockRemoved", "block_hashes": [2]}])
    assert ix.cached_hashes("a") == [1, 2]
    ix.apply("a", [{"type": "BlockRemoved", "block_hashes": [2]}])
    assert ix.cached_hashes("a") == [1]
    ix.apply("a", [{"type": "BlockRemoved", "block_hashes": [2]}])  # unknown: counted
    assert ix.status("a")["unknown_removals"] == 1
    ix.check_invariants()


@pytest.mark.parametrize("dtype", [np.uint64, np.int64])
def test_hash_arrays_in_events_read_as_their_lists(dtype: type) -> None:
    hashes = [3, 1, 2**62 + 5, 7]
    by_list, by_array = KvIndex(), KvIndex()
    stored = {"type": "BlockStored", "block_size": 16}
    by_list.apply("a", [{**stored, "block_hashes": hashes}])
    by_array.apply("a", [{**stored, "block_hashes": np.array(hashes, dtype=dtype)}])
    strided = np.array([9, 0, 3, 0], dtype=dtype)[::2]  # not contiguous: 9 and 3
    by_list.apply("a", [{"type": "BlockRemoved", "block_hashes": [9, 3]}])
    by_array.apply("a", [{"type": "BlockRemoved", "block_hashes": strided}])
    assert by_array.cached_hashes("a") == by_list.cached_hashes("a") == [1, 7, 2**62 + 5]
    assert by_array.status("a")["unknown_removals"] == by_list.status("a")["unknown_removals"]
    if dtype is np.int64:
        with pytest.raises(InvalidEventError, match="negative"):
            by_array.apply("a", [{"type": "BlockRemoved", "block_hashes": np.array([1, -2])}])
        assert by_array.cached_hashes("a") == [1, 7, 2**62 + 5]


def test_media_are_tracked_separately() -> None:
    ix = KvIndex()
    ix.apply(
        "a",
        [
            {"type": "BlockStored", "block_hashes": [1, 2, 3], "block_size": 16, "medium": "GPU"},
            {
                "type": "BlockStored",
                "block_hashes": [1, 2],
                "block_size": 16,
                "medium": "CPU_PINNED",
            },
            {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"},
        ],
    )
    m = ix.longest_prefix([1, 2, 3, 4])
    assert (m.blocks("a", "GPU"), m.blocks("a", "CPU_PINNED"), m.blocks("a")) == (1, 2, 3)
    assert m.blocks("a", "DISK") == 0
    assert ix.cached_hashes("a", "GPU") == [1, 3]
    assert ix.cached_hashes("a", "CPU_PINNED") == [1, 2]
    weighted = ix.longest_prefix([1, 2, 3], weights={"CPU_PINNED": 0.25})
    assert weighted.score("a") == 2.25
    assert m.to_dict()["a"] == {
        "blocks": 3,
        "media": {"GPU": 1, "CPU_PINNED": 2},
        "score": 3.0,
        "stale": False,
        "expired": False,
    }


def test_queries_by_tokens_and_top_k() -> None:
    hasher = BlockHasher(block_size=16, algo="sha256")
    tokens = np.arange(16 * 10, dtype=np.uint32)
    keys = [int.from_bytes(h[-8:], "big") for h in hasher.hash_blocks(tokens)]
    ix = KvIndex()
    ix.apply("a", [{"type": "BlockStored", "block_hashes": keys[:4], "block_size": 16}])
    ix.apply("b", [{"type": "BlockStored", "block_hashes": keys[:7], "block_size": 16}])
    ix.apply("c", [{"type": "BlockStored", "block_hashes": keys[1:], "block_size": 16}])
    m = ix.longest_prefix(tokens=tokens, hasher=hasher)
    assert [m.blocks(w) for w in m.workers] == [4, 7, 0]
    assert ix.top_k(tokens=tokens, hasher=hasher, k=2) == [("b", 7.0, 7), ("a", 4.0, 4)]
    # digests (32 bytes) and numpy arrays give the same answer
    digests = hasher.hash_blocks(tokens)
    assert ix.longest_prefix(digests).blocks("b") == 7
    assert ix.longest_prefix(np.array(keys, dtype=np.uint64)).blocks("b") == 7
    with pytest.raises(InvalidInputError):
        ix.longest_prefix(tokens=tokens)
    with pytest.raises(UnknownWorkerError):
        m.blocks("nobody")


def test_sequence_gap_replay_duplicate_restart() -> None:
    ix = KvIndex()
    s = {"type": "BlockStored", "block_size": 16}
    assert ix.apply("a", [{**s, "block_hashes": [1]}], seq=0) == "applied"
    assert ix.apply("a", [{**s, "block_hashes": [3]}], seq=2) == "gap"
    assert ix.status("a")["stale"] and ix.longest_prefix([1]).stale("a")
    assert ix.top_k([1]) == []  # stale workers are left out
    assert ix.top_k([1], include_unhealthy=True) == [("a", 1.0, 1)]
    # the replay: seq 1 then 2
    assert ix.apply("a", [{**s, "block_hashes": [2]}], seq=1) == "applied"
    assert ix.status("a")["stale"]
    assert ix.apply("a", [{**s, "block_hashes": [3]}], seq=2) == "applied"
    assert not ix.status("a")["stale"]
    assert ix.apply("a", [{**s, "block_hashes": [9]}], seq=2) == "duplicate"
    assert ix.cached_hashes("a") == [1, 2, 3]
    # a repeated batch 0 (a replay from 0, a second copy) is a duplicate
    assert ix.apply("a", [{**s, "block_hashes": [5]}], seq=0) == "duplicate"
    st = ix.status("a")
    assert (st["restarts"], st["gaps"], st["duplicates"]) == (0, 1, 2)


def test_publisher_restart_starts_a_new_stream() -> None:
    """Sequence 0 again with another batch timestamp: the engine restarted empty."""
    ix = KvIndex()
    s = {"type": "BlockStored", "block_size": 16}

    def frame(seq: int, ts: float, hashes: list[int]) -> list[bytes]:
        return [b"t", seq.to_bytes(8, "big"), _payload([{**s, "block_hashes": hashes}], ts=ts)]

    assert ix.apply_frames("a", frame(0, 1.0, [1])) == "applied"
    assert ix.apply_frames("a", frame(1, 2.0, [2])) == "applied"
    assert ix.apply_frames("a", frame(0, 1.0, [1])) == "duplicate"  # replayed batch 0
    assert ix.cached_hashes("a") == [1, 2]
    assert ix.apply_frames("a", frame(0, 9.0, [5])) == "applied"  # a new stream
    assert ix.cached_hashes("a") == [5]
    assert ix.apply_frames("a", frame(1, 9.5, [6])) == "applied"
    assert ix.cached_hashes("a") == [5, 6]
    assert ix.status("a")["restarts"] == 1
    # a worker first seen mid-stream is stale until the batches from 0 arrive
    assert ix.apply("late", [{**s, "block_hashes": [5]}], seq=7) == "gap"
    assert ix.status("late")["stale"]
    ix.reset_worker("late", next_seq=8)
    assert not ix.status("late")["stale"]


def test_ttl_ages_out_a_silent_worker() -> None:
    ix = KvIndex(ttl=30.0)
    ix.apply("a", [{"type": "BlockStored", "block_hashes": [1], "block_size": 16}], now=100.0)
    ix.apply("b", [{"type": "BlockStored", "block_hashes": [1], "block_size": 16}], now=120.0)
    assert ix.top_k([1], k=2, now=125.0) == [("a", 1.0, 1), ("b", 1.0, 1)]
    m = ix.longest_prefix([1], now=140.0)
    assert m.expired("a") and not m.expired("b")
    assert ix.top_k([1], k=2, now=140.0) == [("b", 1.0, 1)]
    assert ix.prune_expired(now=140.0) == ["a"]
    assert ix.workers() == ["b"]
    ix.check_invariants()


def test_add_and_remove_workers() -> None:
    ix = KvIndex()
    ix.add_worker("idle")
    ix.apply("a", [{"type": "BlockStored", "block_hashes": [1, 2], "block_size": 16}])
    assert ix.workers() == ["idle", "a"]
    assert ix.longest_prefix([1, 2]).blocks("idle") == 0
    ix.remove_worker("a")
    assert ix.num_hashes == 0 and ix.workers() == ["idle"]
    with pytest.raises(UnknownWorkerError):
        ix.remove_worker("a")
    ix.check_invariants()


def _payload(events: object, ts: object = 1.0, rank: object = 0) -> bytes:
    return msgpack.packb([ts, events, rank])


GOOD = {"type": "BlockStored", "block_hashes": [7], "block_size": 16}
BAD_MESSAGES = {
    "truncated msgpack": [b"t", (1).to_bytes(8, "big"), _payload([GOOD])[:-3]],
    "trailing bytes": [b"t", (1).to_bytes(8, "big"), _payload([GOOD]) + b"\x00"],
    "unknown tag": [b"t", (1).to_bytes(8, "big"), _payload([{**GOOD, "type": "BlockMoved"}])],
    "hash as str": [b"t", (1).to_bytes(8, "big"), _payload([{**GOOD, "block_hashes": ["7"]}])],
    "block_size as str": [b"t", (1).to_bytes(8, "big"), _payload([{**GOOD, "block_size": "16"}])],
    "token as float": [b"t", (1).to_bytes(8, "big"), _payload([{**GOOD, "token_ids": [1.5]}])],
    "medium as int": [b"t", (1).to_bytes(8, "big"), _payload([{**GOOD, "medium": 3}])],
    "hash too wide (int)": [
        b"t",
        (1).to_bytes(8, "big"),
        _payload([{**GOOD, "block_hashes": [-1]}]),
    ],
    "hash of 7 bytes": [
        b"t",
        (1).to_bytes(8, "big"),
        _payload([{**GOOD, "block_hashes": [b"1234567"]}]),
    ],
    "missing block_hashes": [b"t", (1).to_bytes(8, "big"), _payload([{"type": "BlockRemoved"}])],
    "payload not an array": [b"t", (1).to_bytes(8, "big"), msgpack.packb({"ts": 1})],
    "events not an array": [b"t", (1).to_bytes(8, "big"), _payload(5)],
    "two frames": [(1).to_bytes(8, "big"), _payload([GOOD])],
    "four frames": [b"t", (1).to_bytes(8, "big"), _payload([GOOD]), b""],
    "seq of 4 bytes": [b"t", (1).to_bytes(4, "big"), _payload([GOOD])],
    "frame not bytes": [b"t", 1, _payload([GOOD])],
    # the second event is bad: the first must not be applied either
    "bad second event": [b"t", (1).to_bytes(8, "big"), _payload([GOOD, {"type": 7}])],
}


@pytest.mark.parametrize("case", sorted(BAD_MESSAGES))
def test_bad_messages_are_counted_and_change_nothing(case: str) -> None:
    ix = KvIndex()
    assert (
        ix.apply_frames(
            "a",
            [
                b"t",
                (0).to_bytes(8, "big"),
                _payload([{"type": "BlockStored", "block_hashes": [1, 2], "block_size": 16}]),
            ],
        )
        == "applied"
    )
    before = (ix.cached_hashes("a"), ix.status("a")["next_seq"], ix.num_hashes)
    with pytest.raises(InvalidEventError) as err:
        ix.apply_frames("a", BAD_MESSAGES[case])
    assert str(err.value)
    st = ix.status("a")
    assert st["errors"] == 1 and st["last_error"] == str(err.value)
    assert (ix.cached_hashes("a"), st["next_seq"], ix.num_hashes) == before
    # the next good batch still applies
    assert ix.apply_frames("a", [b"t", (1).to_bytes(8, "big"), _payload([GOOD])]) == "applied"
    assert ix.cached_hashes("a") == [1, 2, 7]


def test_bad_event_objects_are_counted_and_change_nothing() -> None:
    ix = KvIndex(hash_bytes=32)
    for bad in (
        [GOOD, {"type": "Nope"}],
        [{**GOOD, "block_hashes": [1 << 64]}],
        [{**GOOD, "block_hashes": [b"\x00" * 16]}],
        [{**GOOD, "lora_id": "x"}],
        [
            BlockStored(
                block_hashes=[1],
                parent_block_hash=None,
                token_ids=[0.5],
                block_size=16,
                lora_id=None,
            )
        ],
        [object()],
        5,
    ):
        with pytest.raises(InvalidEventError):
            ix.apply("a", bad)
    assert ix.status("a")["errors"] == 7
    assert ix.cached_hashes("a") == [] and ix.num_hashes == 0
    assert ix.apply("a", [{**GOOD, "block_hashes": [b"\x00" * 24 + (9).to_bytes(8, "big")]}])
    assert ix.cached_hashes("a") == [9]


def test_open_index_picks_the_backend() -> None:
    assert isinstance(open_index(), KvIndex)
    assert open_index(ttl=5.0).ttl == 5.0
    # Misuse raises prefixcache.errors classes naming every accepted form (docs/FLEET.md),
    # as every other bad argument does (it raised a plain ValueError naming redis:// only).
    with pytest.raises(InvalidInputError, match="memory://, redis://, rediss://, unix://"):
        open_index("mongodb://x")
    with pytest.raises(InvalidTypeError, match="Redis backend only"):
        open_index(prefix="p")


# -- differential: random operation sequences vs the plain-Python reference ----------------

HASHES = st.integers(0, 12)
MEDIA = st.sampled_from([None, "GPU", "CPU", "DISK"])
OP = st.one_of(
    st.tuples(st.just("stored"), MEDIA, st.lists(HASHES, max_size=6)),
    st.tuples(st.just("removed"), MEDIA, st.lists(HASHES, max_size=3)),
    st.tuples(st.just("cleared"), st.none(), st.just([])),
)
STEP = st.tuples(
    st.sampled_from(["w0", "w1", "w2"]),
    st.lists(OP, max_size=4),
    st.one_of(st.none(), st.integers(0, 6)),
)


def _as_events(ops: list) -> list[dict]:
    out = []
    for kind, medium, hashes in ops:
        if kind == "stored":
            out.append(
                {"type": "BlockStored", "block_hashes": hashes, "block_size": 4, "medium": medium}
            )
        elif kind == "removed":
            out.append({"type": "BlockRemoved", "block_hashes": hashes, "medium": medium})
        else:
            out.append({"type": "AllBlocksCleared"})
    return out


# Workers padded to slots 62..65: the inline holder words end at slot 63 on the first
# medium and at slot 64 on the second (fleet/holders.rs), so these cross both edges.
PADDED_STEP = st.tuples(
    st.sampled_from(["w62", "w63", "w64", "w65"]),
    st.lists(OP, max_size=4),
    st.one_of(st.none(), st.integers(0, 6)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=25), st.lists(HASHES, max_size=8))
def test_differential_against_reference(steps: list, query: list[int]) -> None:
    _differential(steps, query, padding=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(PADDED_STEP, max_size=25), st.lists(HASHES, max_size=8))
def test_differential_against_reference_on_high_slots(steps: list, query: list[int]) -> None:
    _differential(steps, query, padding=62)


def _differential(steps: list, query: list[int], padding: int) -> None:
    ix = KvIndex()
    ref = FleetReference()
    for i in range(padding):  # workers on slots 0..padding, holding nothing
        assert ix.apply(f"pad{i}", [], seq=None, now=0.0) == ref.apply(f"pad{i}", [], None)
    for worker, ops, seq in steps:
        got = ix.apply(worker, _as_events(ops), seq=seq, now=0.0)
        assert got == ref.apply(worker, ops, seq)
        for medium in [None, *ref.media]:
            assert ix.cached_hashes(worker, medium) == ref.cached_hashes(worker, medium)
        held_pairs = sum(len(+c) for c in ref.held[worker].values())
        assert ix.status(worker, now=0.0)["num_held"] == held_pairs
        ix.check_invariants()
    m = ix.longest_prefix(query, now=0.0, weights={"CPU": 0.5, "DISK": 0.25})
    assert ix.media == ref.media
    for w in ref.held:
        assert ix.cached_hashes(w) == ref.cached_hashes(w)
        assert m.blocks(w) == ref.longest(w, query)
        for medium in ref.media:
            assert m.blocks(w, medium) == ref.longest(w, query, medium)
        assert m.stale(w) == ref.stale(w)
        assert m.score(w) == pytest.approx(ref.score(w, query, {"CPU": 0.5, "DISK": 0.25}))


def test_argument_messages_name_the_argument_and_the_problem() -> None:
    ix = KvIndex()
    ix.add_worker("w", now=0.0)
    with pytest.raises(InvalidTypeError, match=r"^now must be a number, got str$"):
        ix.apply("w", [], now="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"^now must be a finite time, got inf$"):
        ix.status("w", now=float("inf"))
    with pytest.raises(InvalidInputError, match=r"^next_seq must be >= 0, got -1$"):
        ix.reset_worker("w", -1)
    with pytest.raises(InvalidInputError, match=r"must be 1-D, got shape \(1, 2\)$"):
        ix.longest_prefix(np.array([[1, 2]], dtype=np.uint64), now=0.0)
    assert ix.status("w", now=0.0)["next_seq"] == 0


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda ix: ix.longest_prefix(5, now="x"), InvalidTypeError, "^hashes"),
        (lambda ix: ix.longest_prefix([1], weights=[1.0], now="x"), InvalidTypeError, "^weights"),
        (lambda ix: ix.longest_prefix(tokens=[1], now="x"), InvalidInputError, "hasher"),
        (lambda ix: ix.top_k(5, k=-1, now="x"), InvalidTypeError, "^hashes"),
        (lambda ix: ix.top_k([1], k=-1, include_unhealthy=1), InvalidInputError, "^k must"),
        (lambda ix: ix.top_k(k=1.5, tokens=5), InvalidTypeError, "^k must"),
        (lambda ix: ix.top_k([1], weights=[1.0], now="x"), InvalidTypeError, "^weights"),
        (lambda ix: ix.top_k([1], now="x", include_unhealthy=1), InvalidTypeError, "^now"),
        (lambda ix: ix.top_k([1], include_unhealthy=None), InvalidTypeError, "include_unhealthy"),
        (lambda ix: ix.apply("w", [], seq=-1, now="x"), InvalidInputError, "^seq must"),
        (lambda ix: ix.apply("w", [], seq=1.5, now=float("inf")), InvalidTypeError, "^seq must"),
    ],
    ids=[
        "longest_prefix hashes, now",
        "longest_prefix weights, now",
        "longest_prefix tokens without hasher, now",
        "top_k hashes, k",
        "top_k k, include_unhealthy",
        "top_k k, tokens",
        "top_k weights, now",
        "top_k now, include_unhealthy",
        "top_k include_unhealthy None",
        "apply seq, now",
        "apply seq type, now",
    ],
)
def test_calls_name_their_first_bad_argument(call: Any, error: type, message: str) -> None:
    """Arguments are read in order: of several bad ones, the first is named (``now`` and
    ``include_unhealthy`` were read before the hashes, ``now`` before ``seq``)."""
    ix = KvIndex()
    ix.apply("w", [{"type": "BlockStored", "block_hashes": [1], "block_size": 4}], 0, now=0.0)
    before = ix.status("w", now=0.0)
    with pytest.raises(error, match=message):
        call(ix)
    assert ix.status("w", now=0.0) == before
    assert ix.top_k([1], now=0.0) == [("w", 1.0, 1)]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"ttl": -1, "hash_bytes": "x"}, InvalidInputError, "^ttl must be a positive"),
        ({"ttl": float("inf"), "hash_bytes": 7}, InvalidInputError, "^ttl must be a positive"),
        ({"ttl": "x", "hash_bytes": 7}, InvalidTypeError, "^ttl must be None or a number"),
    ],
)
def test_constructor_names_its_first_bad_argument(
    kwargs: dict[str, Any], error: type, message: str
) -> None:
    """The ttl's range is checked as it is read, before ``hash_bytes`` (as RedisKvIndex
    checks it)."""
    with pytest.raises(error, match=message):
        KvIndex(**kwargs)


def test_block_size_zero_is_accepted_as_the_docs_say() -> None:
    """vLLM's OffloadingConnector publishes block_size 0 (hash-only placeholders): both
    decoders take it, and docs/FLEET.md says so (it used to say "> 0")."""
    from pathlib import Path

    ev = {"type": "BlockStored", "block_hashes": [1], "block_size": 0}
    ix = KvIndex()
    assert ix.apply("w", [ev], now=0.0) == "applied"
    frames = [b"", (0).to_bytes(8, "big"), msgpack.packb([1.0, [ev], 0])]
    assert ix.apply_frames("v", frames, now=0.0) == "applied"
    doc = (Path(__file__).parent.parent / "docs" / "FLEET.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `BlockStored`"))
    assert "`block_size` (required, an int in `[0, 2**32)`" in row


def test_a_restart_whose_batch_0_is_lost_is_not_detected() -> None:
    """docs/FLEET.md, "Publisher restart": sequence numbers cannot tell a restart whose
    first batch was lost; the deployment resets the worker when it learns of it."""
    ix = KvIndex()
    for s in range(3):
        ev = {"type": "BlockStored", "block_hashes": [100 + s], "block_size": 4}
        ix.apply_frames("w", [b"", s.to_bytes(8, "big"), msgpack.packb([1.0 + s, [ev], 0])])
    ev = {"type": "BlockStored", "block_hashes": [1], "block_size": 4}
    new1 = [b"", (1).to_bytes(8, "big"), msgpack.packb([50.0, [ev], 0])]
    assert ix.apply_frames("w", new1, now=0.0) == "duplicate"
    assert not ix.status("w", now=0.0)["stale"]
    ix.reset_worker("w")  # what a deployment that learns of the restart does
    assert ix.cached_hashes("w") == [] and ix.status("w", now=0.0)["next_seq"] == 0


def _small_index() -> KvIndex:
    ix = KvIndex()
    ix.apply("w0", [{"type": "BlockStored", "block_hashes": [1, 2, 3], "block_size": 16}], now=1.0)
    ix.apply("w1", [{"type": "BlockStored", "block_hashes": [1, 2], "block_size": 16}], now=1.0)
    return ix


@pytest.mark.parametrize(
    "dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, ">u8", ">i8", "<u8"]
)
def test_query_hash_arrays_of_any_integer_dtype_read_as_their_lists(dtype: object) -> None:
    ix = _small_index()
    want = ix.longest_prefix([1, 2, 3], now=1.0).to_dict()
    a = np.array([1, 2, 3], dtype=dtype)  # type: ignore[call-overload]
    assert ix.longest_prefix(a, now=1.0).to_dict() == want
    strided = np.array([1, 9, 2, 9, 3], dtype=dtype)[::2]  # type: ignore[call-overload]
    assert ix.longest_prefix(strided, now=1.0).to_dict() == want
    assert ix.top_k(a, 2, now=1.0) == ix.top_k([1, 2, 3], 2, now=1.0)
    with pytest.raises(InvalidInputError):
        ix.longest_prefix(np.array([1, -1], dtype=np.int32))


@pytest.mark.parametrize(
    "hashes", [{1, 2}, frozenset({1}), {1: 2}, b"\x01\x02", bytearray(b"\x01")]
)
def test_query_hashes_without_an_order_or_of_bytes_raise_invalid_type(hashes: object) -> None:
    ix = _small_index()
    with pytest.raises(InvalidTypeError, match="hashes must be a sequence of block hashes"):
        ix.longest_prefix(hashes)
    with pytest.raises(InvalidTypeError, match="hashes must be a sequence of block hashes"):
        ix.top_k(hashes)


def test_a_weight_that_changes_the_weights_dict_does_not_panic() -> None:
    ix = _small_index()

    class Growing:
        def __init__(self, d: dict[str, object]) -> None:
            self.d = d

        def __float__(self) -> float:
            self.d[f"X{len(self.d)}"] = 1.0
            return 0.5

    weights: dict[str, object] = {}
    weights["GPU"] = Growing(weights)
    before = ix.longest_prefix([1, 2, 3], now=1.0).to_dict()
    m = ix.longest_prefix([1, 2, 3], weights=weights, now=1.0)
    assert m.score("w0") == 1.5
    weights = {}
    weights["GPU"] = Growing(weights)
    assert ix.top_k([1, 2, 3], weights=weights, now=1.0)[0] == ("w0", 1.5, 3)
    assert ix.longest_prefix([1, 2, 3], now=1.0).to_dict() == before


def _vllm_class(name: str, failing: str, error: type[BaseException]) -> type:
    def fail(self: object) -> object:
        raise error("cannot read it")

    return type(
        name,
        (),
        {
            "__init__": lambda self, **kw: self.__dict__.update(kw),
            failing: property(fail),
        },
    )


@pytest.mark.parametrize("failing", ["medium", "block_hashes", "lora_name", "parent_block_hash"])
def test_an_event_attribute_that_raises_is_an_error_not_an_absent_field(failing: str) -> None:
    ix = _small_index()
    before = ix.longest_prefix([1, 2, 3], now=1.0).to_dict()
    cls = _vllm_class("BlockStored", failing, RuntimeError)
    fields = {"block_hashes": [7], "block_size": 16}
    fields.pop(failing, None)
    ev = cls(**fields)
    with pytest.raises(InvalidEventError, match=f"^event 0: {failing}: RuntimeError: cannot read"):
        ix.apply("w0", [ev], now=1.0)
    with pytest.raises(InvalidEventError, match=f"^event 0: {failing}: RuntimeError"):
        decode_kv_events([ev])
    assert ix.longest_prefix([1, 2, 3], now=1.0).to_dict() == before
    assert ix.cached_hashes("w0") == [1, 2, 3]
    # MemoryError stays one, and is not counted as bad input.
    errors = ix.status("w0")["errors"]
    with pytest.raises(MemoryError):
        ix.apply("w0", [_vllm_class("BlockStored", failing, MemoryError)(**fields)], now=1.0)
    assert ix.status("w0")["errors"] == errors


def test_an_event_medium_with_lone_surrogates_is_named() -> None:
    ix = _small_index()
    ev = {"type": "BlockRemoved", "block_hashes": [1], "medium": "\ud800"}
    with pytest.raises(InvalidEventError, match=r"^event 0: medium is not valid text"):
        ix.apply("w0", [ev], now=1.0)
    assert ix.cached_hashes("w0") == [1, 2, 3]


NUMBER_ARGUMENTS: list[tuple[Any, type, str]] = [
    (
        lambda ix: ix.longest_prefix([1], now=True),
        InvalidTypeError,
        "now must be a number, got bool",
    ),
    (lambda ix: ix.status("w0", now=False), InvalidTypeError, "now must be a number, got bool"),
    (lambda ix: ix.prune_expired(now=10**400), InvalidInputError, "now must be a finite time"),
    (lambda ix: ix.apply("w0", [], now=-(10**400)), InvalidInputError, "now must be a finite time"),
    (
        lambda ix: ix.top_k([1], weights={"GPU": True}),
        InvalidTypeError,
        'weights["GPU"] must be a number, got bool',
    ),
    (
        lambda ix: ix.longest_prefix([1], weights={"GPU": 10**400}),
        InvalidInputError,
        "must be a finite number >= 0",
    ),
    (lambda ix: KvIndex(ttl=10**400), InvalidInputError, "ttl must be a positive number"),
]


@pytest.mark.parametrize(("call", "error", "message"), NUMBER_ARGUMENTS)
def test_number_arguments_refuse_bools_and_range_check_huge_ints(
    call: Any, error: type, message: str
) -> None:
    ix = _small_index()
    before = (ix.status("w0", now=1.0), ix.longest_prefix([1, 2, 3], now=1.0).to_dict())
    with pytest.raises(error, match=re.escape(message)):
        call(ix)
    assert (ix.status("w0", now=1.0), ix.longest_prefix([1, 2, 3], now=1.0).to_dict()) == before
    assert ix.longest_prefix([1], weights={"GPU": 2}, now=1.0).score("w0") == 2.0
    assert ix.status("w0", now=np.float32(5.0))["expired"] is False
