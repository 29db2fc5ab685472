"""Every form a caller holds tokens or KV indices in gives exactly what the equivalent list
gives, for every class; anything else raises a prefixcache error and changes nothing; no
input, hook or concurrent writer can abort the process (docs/API.md, "Input forms")."""

from __future__ import annotations

import array
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hostile_sequences import LyingList, ShortSequence

from prefixcache import (
    BlockHasher,
    BlockPool,
    BlockTrie,
    KVCacheManager,
    RadixCache,
    TokenBuffer,
    hash_block_tokens,
)
from prefixcache.errors import InvalidInputError, InvalidTypeError

TOKENS = [5, 0, 7, 2**31 + 3, 9, 65536, 11, 12, 300, 4, 2**32 - 1, 6, 1, 2, 3, 8, 10]


class ArrayInterface:
    """A CPU array known only through ``__array_interface__`` (no buffer protocol)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.__array_interface__ = a.__array_interface__


class DLPackOnly:
    """A CPU tensor known only through ``__dlpack__`` (numpy's producer underneath)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class DLPackVersionedOnly(DLPackOnly):
    """A producer that exports DLPack 1.x only (it needs ``max_version``)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("max_version") is None:
            raise TypeError("__dlpack__() needs max_version")
        return self._a.__dlpack__(max_version=kwargs["max_version"])


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def sparse(values: list[int], dtype: Any, step: int) -> np.ndarray:
    """`values` `step` elements apart (a view over a mostly unused span)."""
    a = np.zeros(len(values) * step, dtype=dtype)
    a[::step] = values
    return a[::step]


def unaligned(values: list[int], dtype: Any) -> np.ndarray:
    """An array of `values` at an odd address (numpy flags it unaligned)."""
    raw = np.array(values, dtype=dtype).tobytes()
    a = np.frombuffer(b"\0" + raw, dtype=dtype, offset=1)
    assert not a.flags.aligned
    return a


def forms(values: list[int], signed_ok: bool = True) -> dict[str, Any]:
    """`values` in every accepted form whose element type can hold them."""
    out: dict[str, Any] = {
        "list": list(values),
        "tuple": tuple(values),
        "list of numpy ints": [np.uint64(v) for v in values],
        "TokenBuffer": TokenBuffer(values),
        "uint32 unaligned": unaligned(values, np.uint32),
        "int64 unaligned": unaligned(values, np.int64),
        "int64 big-endian": np.array(values, dtype=">i8"),
        "uint32 big-endian unaligned": unaligned(values, ">u4"),
        "int64 strided": np.repeat(np.array(values, dtype=np.int64), 2)[::2],
        "int64 reversed": np.array(values[::-1], dtype=np.int64)[::-1],
        "memoryview": memoryview(array.array("q", values)),
        "__array_interface__ int64": ArrayInterface(np.array(values, dtype=np.int64)),
        "__array_interface__ uint32 big-endian": ArrayInterface(np.array(values, dtype=">u4")),
        "__array_interface__ int64 reversed strided": ArrayInterface(
            np.repeat(np.array(values[::-1], dtype=np.int64), 2)[::-2]
        ),
        "__array_interface__ uint64 sparse": ArrayInterface(sparse(values, np.uint64, 9000)),
        "__dlpack__ int64": DLPackOnly(np.array(values, dtype=np.int64)),
        "__dlpack__ uint32 strided": DLPackOnly(np.repeat(np.array(values, np.uint32), 3)[::3]),
        "__dlpack__ read-only int64": DLPackOnly(read_only(np.array(values, dtype=np.int64))),
        "__dlpack__ 1.x only uint32": DLPackVersionedOnly(np.array(values, dtype=np.uint32)),
        "range-like sequence": _Seq(values),
    }
    for code in "bBhHiIlLqQ":
        a = array.array(code)
        try:
            a.extend(values)
        except OverflowError:
            continue
        out[f"array('{code}')"] = a
    for dt in ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]:
        info = np.iinfo(dt)
        if all(info.min <= v <= info.max for v in values):
            out[f"numpy {dt}"] = np.array(values, dtype=dt)
    try:
        import torch  # type: ignore[import-not-found]

        out["torch int64"] = torch.tensor(values, dtype=torch.int64)
    except ImportError:
        pass
    return out


class _Seq:
    """A plain sequence (``__len__`` + ``__getitem__``), neither list nor array."""

    def __init__(self, v: list[int]) -> None:
        self._v = v

    def __len__(self) -> int:
        return len(self._v)

    def __getitem__(self, i: int) -> int:
        return self._v[i]


SMALL = [5, 0, 7, 100, 9, 65, 11, 12, 30, 4, 127, 6, 1, 2, 3, 8, 10]
CASES = {
    **{f"small {k}": v for k, v in forms(SMALL).items()},
    **{f"wide {k}": v for k, v in forms(TOKENS).items()},
}


def expected(name: str) -> list[int]:
    return SMALL if name.startswith("small") else TOKENS


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_form_gives_the_list_result(name: str) -> None:
    toks, want = CASES[name], expected(name)
    # RadixCache: insert, match, values from the same form
    a, b = RadixCache(), RadixCache()
    a.insert(want)
    b.insert(toks, values=toks)
    assert b.dump() == a.dump()
    assert b.match_prefix(toks).length == len(want)
    assert list(b.match_prefix(want).indices) == want
    # BlockHasher and hash_block_tokens
    h = BlockHasher(4, "sha256")
    assert h.hash_blocks(toks) == h.hash_blocks(want)
    assert hash_block_tokens("sha256", None, toks) == hash_block_tokens("sha256", None, want)
    # KVCacheManager
    m1, m2 = KVCacheManager(32, block_size=4), KVCacheManager(32, block_size=4)
    r1, r2 = m1.admit(1, want), m2.admit(1, toks)
    assert r1 is not None and r2 is not None
    assert r2[0] == r1[0] and list(r2[1]) == list(r1[1])
    assert m2.block_hashes(1) == m1.block_hashes(1)
    # BlockTrie
    t1, t2 = BlockTrie(32, tokens_per_block=4), BlockTrie(32, tokens_per_block=4)
    t1.claim(1, want)
    t2.claim(1, toks)
    t1.store(1, want)
    t2.store(1, toks)
    assert t2.dump() == t1.dump()
    assert t2.lookup(toks).num_matched_tokens == t1.lookup(want).num_matched_tokens


IDS = [5, 7, 100, 9, 65, 11]


@pytest.mark.parametrize("name", sorted(forms(IDS)))
def test_block_ids_from_every_form(name: str) -> None:
    def freed(ids: Any) -> list[int]:
        p = BlockPool(200)
        p.get_new_blocks(199)
        p.free_blocks(ids)
        return [int(x) for x in p.free_block_ids()]

    assert freed(forms(IDS)[name]) == freed(IDS)


@pytest.mark.parametrize(
    "bad",
    [
        {1, 2},
        frozenset({1}),
        {1: 2},
        "12",
        b"12",
        bytearray(b"12"),
        3,
        1.5,
        object(),
        [1, True],
        [1, 2.0],
        np.array([1.0]),
        np.array([True]),
        array.array("d", [1.0]),
        np.zeros((2, 2), np.int64),
        memoryview(np.zeros((2, 2), np.int64)),
        np.array(["a"]),
        np.zeros(2, "datetime64[s]"),
        [1, -1],
        [2**32],
        [10**40],
        np.array([-1], np.int32),
        np.array([2**32], np.uint64),
        array.array("b", [-1]),
    ],
)
def test_anything_else_raises_and_changes_nothing(bad: Any) -> None:
    calls: list[tuple[Any, Callable[[Any], Any]]] = []
    tree = RadixCache()
    tree.insert([1, 2, 3])
    calls += [(tree, lambda x: tree.insert(x)), (tree, lambda x: tree.match_prefix(x))]
    pool = BlockPool(8)
    pool.get_new_blocks(3)
    calls += [(pool, lambda x: pool.touch(x)), (pool, lambda x: pool.free_blocks(x))]
    mgr = KVCacheManager(16, block_size=2)
    calls += [(mgr, lambda x: mgr.admit(1, x))]
    trie = BlockTrie(8, tokens_per_block=2)
    calls += [(trie, lambda x: trie.claim(1, x))]
    hasher = BlockHasher(2)
    calls += [(hasher, lambda x: hasher.hash_blocks(x)), (None, lambda x: TokenBuffer(x))]
    before = (tree.dump(), list(pool.free_block_ids()), len(mgr), trie.dump())
    for _, call in calls:
        with pytest.raises((InvalidTypeError, InvalidInputError)):
            call(bad)
    assert (tree.dump(), list(pool.free_block_ids()), len(mgr), trie.dump()) == before


def test_2d_memoryview_is_refused_alike_everywhere() -> None:
    mv = memoryview(np.arange(4, dtype=np.int64).reshape(2, 2))
    pool = BlockPool(8)
    for call in (RadixCache().insert, pool.touch, pool.free_blocks, BlockHasher(2).hash_blocks):
        with pytest.raises(InvalidInputError, match="1-dimensional"):
            call(mv)


def test_unaligned_arrays_are_not_read_as_empty() -> None:
    toks = list(range(1, 33))
    for dt in (np.uint32, np.int32, np.int64):
        a = unaligned(toks, dt)
        tree = RadixCache()
        assert tree.insert(a).prefix_len == 0
        assert tree.total_size() == 32
        h = BlockHasher(16)
        assert h.hash_blocks(a) == h.hash_blocks(toks)
        assert hash_block_tokens("sha256", None, a) == hash_block_tokens("sha256", None, toks)
        got = KVCacheManager(8, block_size=16).admit(1, a)
        assert got is not None and len(got[1]) == 2
    v = unaligned(toks, np.int64)
    tree = RadixCache()
    tree.insert(toks, values=v)
    assert list(tree.match_prefix(toks).indices) == toks


def test_int32_written_after_the_check_is_not_read_as_a_huge_token() -> None:
    a = np.array([1, 2, 3], dtype=np.int32)

    class Hook:
        def __index__(self) -> int:
            a[1] = -1  # written while insert converts its next argument
            return 0

    tree = RadixCache()
    tree.insert(a, priority=Hook())
    keys = [t for n in tree.dump() for t in n["key"]]
    assert keys == [1, 2, 3]
    assert 4294967295 not in keys


def test_token_buffer_is_a_snapshot_per_call() -> None:
    buf = TokenBuffer([1, 2, 3])
    tree = RadixCache()
    tree.insert(buf)
    buf.append(4)
    buf.extend(np.array([5, 6], np.int64))
    assert len(buf) == 6 and buf[-1] == 6 and buf.tolist() == [1, 2, 3, 4, 5, 6]
    assert tree.match_prefix(buf).length == 3
    tree.insert(buf)
    assert tree.match_prefix([1, 2, 3, 4, 5, 6, 7]).length == 6
    buf.truncate(2)
    assert buf.tolist() == [1, 2] and list(buf.numpy()) == [1, 2]
    with pytest.raises(InvalidInputError):
        buf.append(-1)
    with pytest.raises(InvalidTypeError):
        buf.append(True)
    assert buf.tolist() == [1, 2]
    buf.clear()
    assert len(buf) == 0


TOKEN_BUFFER_OOM_SCRIPT = textwrap.dedent("""
    import resource
    import numpy as np
    from prefixcache import RadixCache, TokenBuffer

    n = 50_000_000
    b = TokenBuffer(np.arange(n, dtype=np.uint32))
    vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.RLIM_INFINITY))
    tree = RadixCache()
    for call in (
        lambda: tree.insert([1], values=b),  # the buffer widened to int64 values
        lambda: TokenBuffer(b),  # a copy
        lambda: b.extend(b),  # a copy, while a snapshot of b is alive
        lambda: b.extend(np.zeros(n, np.uint32)),
    ):
        try:
            call()
        except MemoryError:
            continue
        raise AssertionError("no MemoryError")
    assert tree.total_size() == 0 and len(b) == n
    print("ok")
""")


def test_a_token_buffer_no_memory_can_copy_raises_memory_error() -> None:
    """Copying or widening a TokenBuffer when memory runs out raises MemoryError (the
    int64 widening and the copies were infallible allocations: the process aborted)."""
    # Small allocator arenas, so that the address-space limit is what runs out.
    env = {**os.environ, "MIMALLOC_ARENA_RESERVE": "16M"}
    r = subprocess.run(
        [sys.executable, "-c", TOKEN_BUFFER_OOM_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok"]


RESIZE_SCRIPT = textwrap.dedent("""
    import numpy as np
    from prefixcache import BlockHasher, KVCacheManager, RadixCache

    def resizer(a):
        class Hook:
            def __index__(self):
                a.resize(1 << 20, refcheck=False)
                return 0
        return Hook()

    a = np.arange(64, dtype=np.uint32)
    t = RadixCache()
    t.insert(a, priority=resizer(a))
    b = np.arange(64, dtype=np.int64)
    t.insert(list(range(64)), values=b, inserted_len=resizer(b))
    c = np.arange(64, dtype=np.uint32)

    class Keys(list):
        def __iter__(self):
            c.resize(1 << 20, refcheck=False)
            return super().__iter__()
    BlockHasher(16).hash_blocks(c, extra_keys=Keys([None] * 4))
    d = np.arange(64, dtype=np.uint32)
    KVCacheManager(16, block_size=16).admit(1, d, num_lookahead_tokens=resizer(d))
    print("ok", t.total_size())
""")


def test_an_array_resized_by_a_hook_during_a_call_does_not_abort() -> None:
    r = subprocess.run(
        [sys.executable, "-c", RESIZE_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok", "64"]


LYING_SCRIPT = textwrap.dedent("""
    import ctypes
    import numpy as np
    from prefixcache import BlockHasher, BlockPool, RadixCache, TokenBuffer
    from prefixcache.errors import InvalidInputError

    import mmap
    a = np.arange(4, dtype=np.int64)
    p = a.ctypes.data
    # Two pages, the second unreadable: an array at the end of the first, whose length
    # or stride claims more, runs into it.
    m = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    page = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(page + mmap.PAGESIZE, mmap.PAGESIZE, 0) == 0
    end = page + mmap.PAGESIZE - 32  # 4 int64 before the unreadable page

    class AI:
        def __init__(self, **d):
            self.__array_interface__ = {"typestr": "<i8", "version": 3, **d}

    class I64(ctypes.Structure):
        _fields_ = [("v", ctypes.c_int64)]

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", ctypes.c_int32 * 2),
                    ("ndim", ctypes.c_int32), ("dtype", ctypes.c_uint8 * 4),
                    ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                    ("byte_offset", ctypes.c_uint64)]

    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    keep = []

    class DL:
        def __init__(self, data, n=4, ndim=1, shape=True, at=None):
            sh = I64(n)
            t = DLTensor(data, (1, 0), ndim, (0, 64, 1, 0),
                         ctypes.addressof(sh) if shape else None, None, 0)
            keep.extend([sh, t])
            self.c = new_capsule(ctypes.addressof(t) if at is None else at, b"dltensor", None)

        def __dlpack__(self, *args, **kwargs):
            return self.c

    lying = {
        "pointer 1": AI(shape=(4,), data=(1, False)),
        "pointer -8": AI(shape=(4,), data=(-8, False)),
        "length beyond the array": AI(shape=(5,), data=(end, False)),
        "stride beyond the array": AI(shape=(4,), data=(end, False), strides=(16,)),
        "stride beyond the address space": AI(shape=(4,), data=(p, False), strides=(2**62,)),
        "dlpack data 1": DL(1),
        "dlpack length beyond": DL(end, n=5),
        "dlpack no shape": DL(p, shape=False),
        "dlpack huge ndim": DL(p, ndim=10**6),
        "dlpack capsule at 8": DL(p, at=8),
    }
    tree = RadixCache()
    tree.insert([1, 2, 3])
    pool = BlockPool(8)
    pool.get_new_blocks(3)
    before = (tree.dump(), list(pool.free_block_ids()))
    for name, obj in lying.items():
        for call in (tree.insert, tree.match_prefix, pool.touch, BlockHasher(2).hash_blocks,
                     TokenBuffer, lambda x: tree.insert([1, 2, 3, 4], values=x)):
            try:
                call(obj)
            except InvalidInputError as e:
                assert "tokens" in str(e) or "values" in str(e) or "block_ids" in str(e), e
            else:
                raise AssertionError(name)
    assert (tree.dump(), list(pool.free_block_ids())) == before
    # The honest forms still read: an interface and a capsule over live memory.
    assert RadixCache().insert(AI(shape=(4,), data=(p, False))).prefix_len == 0
    assert list(TokenBuffer(DL(p)).tolist()) == [0, 1, 2, 3]
    assert TokenBuffer(AI(shape=(4,), data=(end, False))).tolist() == [0, 0, 0, 0]
    print("ok")
""")


def test_lying_array_interfaces_and_capsules_are_refused_not_read() -> None:
    """A data pointer, length or stride that leaves the memory the process can read
    raises InvalidInputError naming the argument (was: segmentation fault)."""
    r = subprocess.run(
        [sys.executable, "-c", LYING_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["ok"]


def test_request_ids_share_one_range() -> None:
    top = 2**64 - 1
    m = KVCacheManager(8, block_size=2)
    m.add_request(top, [1, 2, 3])
    assert top in m
    t = BlockTrie(8, tokens_per_block=2)
    t.claim(top, [1, 2, 3])
    assert t.request_blocks(top)
    for call in (m.free, t.release):
        with pytest.raises(InvalidInputError, match=r"request_id must be an int in \[0, 2\*\*64\)"):
            call(2**64)
        with pytest.raises(InvalidTypeError):
            call(True)


def test_a_list_subclass_is_read_as_its_items_throughout() -> None:
    """A list (tuple) subclass is read from its items, also past an item that is not an
    exact int: its ``__len__`` / ``__getitem__`` overrides were called from there on (an
    IndexError escaped, or other values were read)."""
    items = [1, np.int64(2), 3, _IndexInt(4)]
    for obj in (LyingList(items), LyingList(items[::-1])):
        want = [int(v) for v in list.__iter__(obj)]
        tree = RadixCache()
        tree.insert(obj)
        assert [t for n in tree.dump() for t in n["key"]] == want
        assert TokenBuffer(obj).tolist() == want
        assert BlockHasher(2).hash_blocks(obj) == BlockHasher(2).hash_blocks(want)


def test_a_sequence_shorter_than_its_length_is_refused() -> None:
    tree = RadixCache()
    with pytest.raises(InvalidInputError, match="tokens: its __len__ gives 5 but item 3"):
        tree.insert(ShortSequence())
    assert tree.total_size() == 0


HUGE_SEQUENCE_SCRIPT = textwrap.dedent("""
    import resource
    # Should the reader fill memory item by item, it fails here instead of the machine.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    from prefixcache import BlockHasher, RadixCache, TokenBuffer
    for call in (RadixCache().insert, TokenBuffer, BlockHasher(4).hash_blocks):
        try:
            call(range(2**62))
        except MemoryError as e:
            assert "cannot allocate 4611686018427387904 elements for tokens" in str(e), e
        else:
            raise AssertionError(call)
    print("ok")
""")


def test_a_sequence_no_memory_can_hold_raises_memory_error_at_once() -> None:
    """``range(2**62)`` raises MemoryError at once, as ``list()`` does (it was read item by
    item until memory ran out)."""
    r = subprocess.run(
        [sys.executable, "-c", HUGE_SEQUENCE_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ok"]


def test_a_masked_array_is_read_as_its_list() -> None:
    """A numpy masked array gives what its list gives: its values when nothing is masked,
    a refusal naming the first masked position otherwise (its hidden value was read)."""
    hidden = np.ma.array([1, 2, 3, 4], mask=[0, 0, 1, 0])
    with pytest.raises(TypeError):  # the list: the masked constant is not an int
        RadixCache().insert(list(hidden))
    tree = RadixCache()
    tree.insert([9])
    pool = BlockPool(8)
    pool.get_new_blocks(5)
    before = (tree.dump(), list(pool.free_block_ids()))
    for call in (tree.insert, tree.match_prefix, TokenBuffer, pool.touch):
        with pytest.raises(InvalidInputError, match=r"\[2\] is masked"):
            call(hidden)
    with pytest.raises(InvalidInputError, match=r"values\[2\] is masked"):
        tree.insert([1, 2, 3, 4], values=hidden)
    assert (tree.dump(), list(pool.free_block_ids())) == before
    for shown in (np.ma.array([1, 2, 3, 4]), np.ma.array([1, 2, 3, 4], mask=[0, 0, 0, 0])):
        assert TokenBuffer(shown).tolist() == [1, 2, 3, 4]


def test_array_interface_offset_is_ignored_with_a_data_pointer_as_numpy_does() -> None:
    a = np.arange(4, dtype=np.int64)
    iface = ArrayInterface(a)
    iface.__array_interface__ = {**a.__array_interface__, "shape": (2,), "offset": 8}
    want = np.asarray(iface).tolist()
    assert want == [0, 1]
    assert TokenBuffer(iface).tolist() == want
    tree = RadixCache()
    tree.insert(iface)
    assert tree.match_prefix([0, 1]).length == 2


def test_lists_of_request_ids_take_the_whole_range() -> None:
    """extend / decode_steps / max_decode_steps read their request ids in [0, 2**64), as
    every call taking one id does (ids from 2**63 on were refused as not fitting int64)."""
    top = 2**64 - 1
    m = KVCacheManager(16, block_size=2)
    for rid in (top, 2**63):
        assert m.admit(rid, [1, 2, 3]) is not None
    for ids in (
        [top, 2**63],
        (top, 2**63),
        np.array([top, 2**63], np.uint64),
        array.array("Q", [top, 2**63]),
        [np.uint64(top), _IndexInt(2**63)],
    ):
        assert m.max_decode_steps(ids, 1) == 1
    m.queue_tokens(top, [7])
    m.queue_tokens(2**63, [7])
    assert len(m.decode_steps(np.array([top, 2**63], np.uint64), 1)[0]) == 2
    assert len(m.extend([top], [5], [1])[0]) == 1
    assert m.num_tokens(top) == 5
    before = (m.num_tokens(top), list(m.free_block_ids()))
    for bad, message in [
        ([2**64], r"request_ids\[0\] = 18446744073709551616 is out of range"),
        ([top, -1], r"request_ids\[1\] = -1 must be >= 0"),
        (np.array([-1], np.int64), r"request_ids\[0\] = -1 must be >= 0"),
    ]:
        with pytest.raises(InvalidInputError, match=message):
            m.max_decode_steps(bad, 1)
        with pytest.raises(InvalidInputError, match=message):
            m.extend(bad, [5] * len(bad), [1] * len(bad))
    with pytest.raises(InvalidTypeError, match=r"request_ids\[0\] must be an int, got bool"):
        m.decode_steps([True], 1)
    assert (m.num_tokens(top), list(m.free_block_ids())) == before


@pytest.mark.parametrize("value", [2**63, 2**64, 2**127, 2**200, -(2**63) - 1])
def test_integers_beyond_the_range_are_refused_not_clamped(value: int) -> None:
    tree = RadixCache()
    with pytest.raises(InvalidInputError, match="priority must be an int in"):
        tree.insert([1], priority=value)
    assert tree.total_size() == 0
    with pytest.raises(InvalidInputError, match="page_size"):
        RadixCache(value)
    with pytest.raises(InvalidInputError, match="inserted_len"):
        tree.insert([1], inserted_len=value)
    with pytest.raises(InvalidInputError, match="num_tokens"):
        tree.evict(value)
    with pytest.raises(InvalidInputError, match="retention"):
        BlockTrie(8, tokens_per_block=2).claim(1, [1, 2], retention=value)
    with pytest.raises(InvalidInputError, match="num_blocks"):
        BlockPool(8).get_new_blocks(value)


def test_strings_with_lone_surrogates_raise_prefixcache_errors() -> None:
    s = "\ud800"
    with pytest.raises(InvalidInputError, match="cache_salt"):
        RadixCache().insert([1], cache_salt=s)
    with pytest.raises(InvalidInputError, match="extra_key"):
        RadixCache().match_prefix([1], extra_key=s)
    with pytest.raises(InvalidInputError, match="lora_name"):
        KVCacheManager(8).add_request(1, [1], lora_name=s)
    with pytest.raises(InvalidInputError, match="seed"):
        BlockHasher(4, seed=s)
    with pytest.raises(InvalidInputError, match="seed"):
        hash_block_tokens("sha256", None, [1], seed=s)
    with pytest.raises(InvalidInputError, match="mm_items"):
        BlockTrie(8, tokens_per_block=2).lookup([1, 2], mm_items=[(s, 0, 1)])


def test_an_empty_parent_is_the_root() -> None:
    h = BlockHasher(4, "sha256")
    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    assert h.hash_blocks(toks, parent=b"") == h.hash_blocks(toks)
    assert h.hash_block(b"", toks[:4]) == h.hash_block(None, toks[:4])
    assert hash_block_tokens("sha256", b"", toks) == hash_block_tokens("sha256", None, toks)


class _IndexInt:
    """An int-like object read through ``__index__`` (not an exact int)."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


@pytest.mark.parametrize(
    ("keys", "values"),
    [
        (TOKENS, [3 * v - 2**40 for v in TOKENS]),  # two lists, values beyond int32
        (tuple(TOKENS), list(range(len(TOKENS)))),  # a tuple and a list
        (TOKENS, TOKENS),  # one list given as both
        (TOKENS, [_IndexInt(v) for v in TOKENS]),  # values through __index__
        ([np.uint32(v) for v in TOKENS], list(TOKENS)),  # keys through __index__
    ],
)
def test_insert_reads_key_and_value_lists_together_as_apart(keys: Any, values: Any) -> None:
    """RadixCache.insert reads a key list and a value list in one pass: the same tree as
    from arrays."""
    want = RadixCache()
    want.insert(np.array(TOKENS, np.uint32), values=np.array([int(v) for v in values], np.int64))
    got = RadixCache()
    got.insert(keys, values=values)
    assert got.dump() == want.dump()
    assert list(got.match_prefix(TOKENS).indices) == [int(v) for v in values]


@pytest.mark.parametrize(
    ("keys", "values", "error", "message"),
    [
        # The keys' error comes first (argument order), even behind an earlier bad value.
        ([1, 2, 3, 4, 5, -1], [1, 2, True, 4, 5, 6], InvalidInputError, r"tokens\[5\] = -1"),
        ([1, 2, 3, 4, 5, 2**32], [1, 2.0, 3, 4, 5, 6], InvalidInputError, r"tokens\[5\] = 42949"),
        ([1, 2, 3, 4, 5, True], [1, 2, 3, 4, 5, 6], InvalidTypeError, r"tokens\[5\] must be"),
        ([1, 2, 3, 4, 5, 6], [1, 2, True, 4, 5, 6], InvalidTypeError, r"values\[2\] must be"),
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 2**70, 6], InvalidInputError, r"values\[4\] = "),
        ([1, 2, 3], [1, 2], InvalidInputError, "values has length 2 but tokens has length 3"),
    ],
)
def test_insert_key_and_value_list_errors_name_the_argument(
    keys: list[Any], values: list[Any], error: type[Exception], message: str
) -> None:
    tree = RadixCache()
    tree.insert([1, 2, 9])
    before = tree.dump()
    with pytest.raises(error, match=message):
        tree.insert(keys, values=values)
    assert tree.dump() == before


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (-1, InvalidInputError, r"tokens\[5\] = -1"),
        (2**32, InvalidInputError, r"tokens\[5\] = 4294967296"),  # a valid value, not token
        (2**70, InvalidInputError, r"tokens\[5\] = "),
        (True, InvalidTypeError, r"tokens\[5\] must be"),
        (1.5, InvalidTypeError, r"tokens\[5\] must be"),
    ],
)
@pytest.mark.parametrize("form", [list, tuple])
def test_one_sequence_given_as_tokens_and_values_names_the_tokens(
    form: Callable[[list[Any]], Any], bad: Any, error: type[Exception], message: str
) -> None:
    """One list (or tuple) given as both is read once, as tokens: a bad item is the
    tokens' error, and nothing changes."""
    tree = RadixCache()
    tree.insert([1, 2, 9])
    before = tree.dump()
    seq = form([1, 2, 3, 4, 5, bad, 7])
    with pytest.raises(error, match=message):
        tree.insert(seq, values=seq)
    assert tree.dump() == before
    good = form([*TOKENS] * 40)  # long enough for the read-ahead
    tree.insert(good, values=good)
    assert list(tree.match_prefix(good).indices) == list(good)


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("caching", [True, False])
def test_admit_equals_add_request_and_get_computed_blocks(
    window: int | None, caching: bool
) -> None:
    """admit looks each block hash up as it is computed (full attention): the same hit and
    blocks as add_request + get_computed_blocks + allocate_slots."""
    rng = np.random.default_rng(1)
    base = rng.integers(0, 50_000, 64).tolist()
    prompts = [
        base[:n] + rng.integers(0, 50_000, k).tolist()
        for n in (0, 16, 31, 32, 48, 64)
        for k in (0, 1, 5)
    ]
    prompts = [p for p in prompts if p]
    a = KVCacheManager(64, block_size=4, sliding_window=window, enable_caching=caching)
    b = KVCacheManager(64, block_size=4, sliding_window=window, enable_caching=caching)
    for i, p in enumerate(prompts):
        got = a.admit(i, p)
        b.add_request(i, p)
        blocks, hit = b.get_computed_blocks(i)
        assert b.allocate_slots(i, len(p) - hit, hit, blocks) is not None
        assert got is not None
        assert got[0] == hit
        assert list(got[1]) == list(b.block_ids(i))
        assert a.block_hashes(i) == b.block_hashes(i)
        a.finish(i)
        b.free(i)
    assert a.stats == b.stats
    assert list(a.free_block_ids()) == list(b.free_block_ids())
    a.check_invariants()
