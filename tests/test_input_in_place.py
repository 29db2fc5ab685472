"""RadixCache reads arrays in place in short calls (docs/API.md, "Input forms": match keys
and insert values): every form that may be read in place gives exactly what the
equivalent list gives, whether it is read in place (uint32 / int64, native order,
contiguous, aligned) or copied; a call whose arguments can run Python code
(``__index__``, list items, sequences) copies each array when it converts it, in argument
order, so hooks that resize or rewrite an array cannot make it read freed memory; a call
that finds the lock taken copies its input before waiting."""

from __future__ import annotations

import array
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest

from prefixcache import RadixCache, TokenBuffer
from prefixcache.errors import InvalidInputError


class _Sub(np.ndarray):
    """A numpy subclass: it could override anything, so it is read like any buffer."""


class _List(list):
    pass


TOKENS = [7, 0, 5, 2**31 + 3, 9, 65536, 11, 2**32 - 1, 300, 4, 12, 6, 1, 2, 3, 8, 10, 13]


def in_place_forms(values: list[int]) -> dict[str, Any]:
    """Forms of `values` a short call reads in place or copies without running Python."""
    u32 = np.array(values, dtype=np.uint32)
    i64 = np.array(values, dtype=np.int64)
    out: dict[str, Any] = {
        "numpy uint32": u32,
        "numpy uint32 sliced view": np.concatenate([[99], u32])[1:],
        "numpy uint32 read-only": np.frombuffer(u32.tobytes(), dtype=np.uint32),
        "numpy int64": i64,
        "numpy int64 sliced view": np.concatenate([[99], i64])[1:],
        "numpy uint64": i64.astype(np.uint64),
        "numpy uint32 strided (copied)": np.repeat(u32, 2)[::2],
        "numpy int64 big-endian (copied)": i64.astype(">i8"),
        "numpy uint32 unaligned (copied)": np.frombuffer(
            b"\0" + u32.tobytes(), np.uint32, offset=1
        ),
        "array('I')": array.array("I", values),
        "array('q')": array.array("q", values),
        "array('Q')": array.array("Q", values),
        "memoryview uint32": memoryview(u32),
        "memoryview array('q')": memoryview(array.array("q", values)),
        "TokenBuffer": TokenBuffer(values),
    }
    if max(values) < 2**31:
        out["numpy int32 (copied)"] = i64.astype(np.int32)
    out["numpy subclass (copied)"] = u32.view(_Sub)
    out["list subclass (copied)"] = _List(values)
    try:
        import torch  # type: ignore[import-not-found]

        t = torch.tensor(values, dtype=torch.int64)
        out["torch int64"] = t
        out["torch int64 sliced view"] = torch.cat([torch.tensor([99]), t])[1:]
        out["torch int64 strided"] = t.repeat_interleave(2)[::2]
        if max(values) < 2**31:
            out["torch int32"] = t.to(torch.int32)
    except ImportError:
        pass
    return out


CASES = {
    f"{k} {s}": v
    for s, vals in (("small", [*TOKENS[:1], 1, 2, 3]), ("wide", TOKENS))
    for k, v in in_place_forms(vals).items()
}


def want(name: str) -> list[int]:
    return [*TOKENS[:1], 1, 2, 3] if name.endswith("small") else TOKENS


@pytest.mark.parametrize("name", sorted(CASES))
def test_in_place_forms_give_the_list_result(name: str) -> None:
    x, ref = CASES[name], want(name)
    a, b = RadixCache(), RadixCache()
    ra = a.insert(ref, values=ref)
    rb = b.insert(x, values=x)
    assert rb.prefix_len == ra.prefix_len == 0
    assert b.dump() == a.dump()
    # Shared prefix, split, then a full match: the same results and the same tree.
    a.insert([*ref[:2], 42], values=[1, 2, 3])
    b.insert([*ref[:2], 42], values=np.array([1, 2, 3], np.int64))
    ma, mb = a.match_prefix(ref), b.match_prefix(x)
    assert mb.length == ma.length == len(ref)
    assert list(mb.indices) == list(ma.indices) == ref
    assert b.dump() == a.dump()
    # Values only (tokens a list), and a second insert that finds everything cached.
    c = RadixCache()
    c.insert(ref, values=x)
    assert list(c.match_prefix(ref).indices) == ref
    assert b.insert(x, values=x).prefix_len == len(ref)


def test_values_of_another_form_than_the_tokens() -> None:
    toks = np.arange(100, 164, dtype=np.uint32)
    for values in (
        np.arange(64, dtype=np.int64),
        array.array("q", range(64)),
        TokenBuffer(list(range(64))),
        list(range(64)),
        np.arange(64, dtype=np.int32),
    ):
        t = RadixCache()
        t.insert(toks, values=values)
        assert list(t.match_prefix(toks).indices) == list(range(64))


def test_out_of_range_in_place_values_raise_and_change_nothing() -> None:
    t = RadixCache()
    t.insert([1, 2, 3])
    before = t.dump()
    for toks in (np.array([1, 2**32], np.int64), np.array([5, 2**63], np.uint64)):
        with pytest.raises(InvalidInputError, match=r"tokens\[1\]"):
            t.insert(toks, values=np.zeros(2, np.int64))
        with pytest.raises(InvalidInputError):
            t.match_prefix(toks)
    with pytest.raises(InvalidInputError, match="values"):
        t.insert(np.arange(3, dtype=np.uint32) + 10, values=np.array([0, 1, 2**63], np.uint64))
    with pytest.raises(InvalidInputError, match="length"):
        t.insert(np.arange(3, dtype=np.uint32) + 10, values=np.arange(2, dtype=np.int64))
    assert t.dump() == before


def test_result_handles_are_built_once_and_equal_to_other_handles() -> None:
    t = RadixCache()
    r = t.insert(np.arange(8, dtype=np.uint32))
    assert r.node is r.node
    m = t.match_prefix(np.arange(8, dtype=np.uint32))
    assert m.node is m.node and m.node == r.node and hash(m.node) == hash(r.node)
    assert repr(m) == f"MatchResult(length=8, node={m.node!r}, host_hit_length=0)"
    assert m.last_host_node is m.node
    assert repr(r) == f"InsertResult(prefix_len=0, node={r.node!r})"
    assert t.match_prefix([99]).node == t.root


def test_calls_with_hooks_read_their_arguments_in_order() -> None:
    """A call with an argument that may run Python code reads every argument in order,
    each array copied when it is read: a hook sees (and may change) only what is read
    after it."""
    toks = np.arange(1, 65, dtype=np.uint32)

    class Rewrite:
        def __index__(self) -> int:
            toks[:] = 7  # rewritten while the call converts its next argument
            return 0

    t = RadixCache()
    t.insert(toks, priority=Rewrite())
    assert [k for n in t.dump() for k in n["key"]] == list(range(1, 65))

    vals = np.arange(64, dtype=np.int64)

    class Item:
        def __index__(self) -> int:
            vals[:] = -5
            return 3

    t2 = RadixCache()
    t2.insert([Item(), *list(range(1, 64))], values=vals)
    assert list(t2.match_prefix([3, *list(range(1, 64))]).indices) == [-5] * 64


def test_block_manager_calls_read_their_arguments_in_order() -> None:
    """`KVCacheManager.admit` / `add_request` read the prompt before `num_lookahead_tokens`
    and `lora_id`, and `allocate_slots` the block ids before `num_lookahead_tokens`: what a
    later argument's hook changes is not seen."""
    from prefixcache import KVCacheManager

    for call in ("admit", "add_request"):
        for hooked in ("num_lookahead_tokens", "lora_id"):
            if call == "add_request" and hooked == "num_lookahead_tokens":
                continue
            arr = np.arange(16, dtype=np.int64)

            class Rewrite:
                def __index__(self, arr: np.ndarray = arr) -> int:
                    arr[:] = 7
                    return 0

            m = KVCacheManager(num_blocks=100, block_size=4)
            getattr(m, call)(1, arr, **{hooked: Rewrite()})
            plain = KVCacheManager(num_blocks=100, block_size=4)
            plain.add_request(1, list(range(16)), lora_id=0 if hooked == "lora_id" else None)
            assert list(m.block_hashes(1)) == list(plain.block_hashes(1)), (call, hooked)

    # lora_id is read after the extra keys: its hook cannot change them.
    extra = [("a",), ("b",)]

    class RewriteKeys:
        def __index__(self) -> int:
            extra[0] = extra[1] = ("zzz",)
            return 0

    m = KVCacheManager(num_blocks=100, block_size=4)
    m.add_request(1, list(range(8)), extra_keys=extra, lora_id=RewriteKeys())
    plain = KVCacheManager(num_blocks=100, block_size=4)
    plain.add_request(1, list(range(8)), extra_keys=[("a",), ("b",)], lora_id=0)
    assert list(m.block_hashes(1)) == list(plain.block_hashes(1))

    m = KVCacheManager(num_blocks=100, block_size=4)
    m.admit(1, list(range(8)))
    m.free(1)
    m.add_request(2, list(range(8)))
    blocks, hit = m.get_computed_blocks(2)
    assert hit == 4  # one full block cached (the last token is always computed)
    ids = np.array(blocks, dtype=np.int64)  # a copy the hook rewrites
    expected = list(blocks)

    class Clear:
        def __index__(self) -> int:
            ids[:] = 0
            return 0

    got = m.allocate_slots(2, 8 - hit, hit, ids, num_lookahead_tokens=Clear())
    assert got is not None and list(m.block_ids(2))[: len(expected)] == expected


def test_a_lookahead_beyond_the_pool_is_refused_not_reserved() -> None:
    from prefixcache import InvalidTypeError, KVCacheManager

    m = KVCacheManager(num_blocks=10, block_size=4)
    for n in (2**40, 2**62):
        assert m.admit(1, [1, 2, 3], num_lookahead_tokens=n) is None
    with pytest.raises(InvalidTypeError, match="num_lookahead_tokens"):
        m.admit(1, [1, 2, 3], num_lookahead_tokens=None)  # None is no count
    assert m.admit(1, [1, 2, 3], num_lookahead_tokens=4) is not None
    with pytest.raises(InvalidTypeError, match="num_lookahead_tokens"):
        m.allocate_slots(1, 1, 0, None, None)


RESIZE_SCRIPT = textwrap.dedent("""
    import array
    import numpy as np
    from prefixcache import RadixCache
    from prefixcache.errors import PrefixCacheError

    t = RadixCache()
    a = np.arange(64, dtype=np.uint32)
    v = np.arange(64, dtype=np.int64)

    class Seq:
        # A sequence of values whose items resize the token array while they are read.
        def __len__(self):
            return 64
        def __getitem__(self, i):
            if i >= 64:
                raise IndexError(i)
            a.resize(1 << 20, refcheck=False)
            v.resize(1 << 20, refcheck=False)
            return i

    t.insert(a, values=Seq())

    class Item:
        def __index__(self):
            v.resize(1 << 21, refcheck=False)
            return 1

    t.insert(np.arange(100, 164, dtype=np.uint32), values=[Item()] * 64)
    b = array.array("q", range(64))
    class Prio:
        def __index__(self):
            try:
                b.extend(range(1 << 16))  # refused by array while exported; fine if not
            except BufferError:
                pass
            return 0
    t.insert(np.arange(200, 264, dtype=np.uint32), values=b, priority=Prio())
    for x in (a, v, b):
        try:
            t.match_prefix(x)
        except PrefixCacheError:
            pass
    t.check_invariants()
    print("ok", t.total_size())
""")


def test_arrays_resized_by_hooks_during_a_call_do_not_abort() -> None:
    r = subprocess.run(
        [sys.executable, "-c", RESIZE_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok", str(3 * 64)]


def test_contended_in_place_calls_copy_and_agree_with_lists() -> None:
    """Short calls that find the lock held (a long insert running without the GIL in
    another thread) copy their input and wait; the results equal the list results."""
    tree = RadixCache()
    base = [np.arange(k * 1000, k * 1000 + 64, dtype=np.uint32) for k in range(20)]
    for x in base:
        tree.insert(x)
    stop = threading.Event()
    errors: list[BaseException] = []

    def long_inserts() -> None:
        try:
            k = 0
            while not stop.is_set() and k < 200:
                big = np.arange(10**7 + k * 20000, 10**7 + k * 20000 + 16384, dtype=np.uint32)
                tree.insert(big, values=big.astype(np.int64))
                k += 1
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    th = threading.Thread(target=long_inserts)
    th.start()
    try:
        for _ in range(300):
            for x in base:
                m = tree.match_prefix(x)
                assert m.length == 64
                y = x.astype(np.int64)
                assert tree.insert(y, values=y).prefix_len == 64
                assert tree.match_prefix(x.tolist()).length == 64
    finally:
        stop.set()
        th.join()
    assert not errors
    tree.check_invariants()
