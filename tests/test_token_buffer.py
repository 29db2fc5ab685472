"""``TokenBuffer`` as a sequence: slices, equality, numpy's array protocol, pickling."""

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixcache import RadixCache, TokenBuffer
from prefixcache.errors import InvalidInputError

TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=40)
BOUND = st.none() | st.integers(-50, 50)


@given(TOKENS, BOUND, BOUND, st.none() | st.integers(-5, 5).filter(bool))
def test_a_slice_is_the_lists_slice(
    tokens: list[int], a: int | None, b: int | None, step: int | None
) -> None:
    buf = TokenBuffer(tokens)
    part = buf[a:b:step]
    assert isinstance(part, TokenBuffer)
    assert part.tolist() == tokens[a:b:step]
    part.append(7)  # a new buffer: the original is unchanged
    assert buf.tolist() == tokens


def test_a_slice_is_accepted_as_tokens() -> None:
    tree = RadixCache()
    buf = TokenBuffer(range(10))
    tree.insert(buf[:6])
    assert tree.match_prefix(buf).length == 6
    assert tree.match_prefix(buf[2:]).length == 0


def test_a_zero_step_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="step cannot be zero"):
        TokenBuffer([1, 2])[::0]


def test_equal_buffers_hold_the_same_tokens() -> None:
    a = TokenBuffer([1, 2, 3])
    assert a == TokenBuffer(np.array([1, 2, 3], dtype=np.int64))
    assert a != TokenBuffer([1, 2])
    assert a != TokenBuffer([1, 2, 4])
    assert TokenBuffer() == TokenBuffer([])
    assert a != [1, 2, 3]  # other forms are not buffers: convert them first
    b = TokenBuffer([1, 2])
    assert a != b
    b.append(3)
    assert a == b
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    with pytest.raises(TypeError):
        a < b  # noqa: B015


def test_numpy_reads_a_buffer_through_its_array_protocol() -> None:
    buf = TokenBuffer([5, 2**32 - 1, 0])
    a = np.asarray(buf)
    assert a.dtype == np.uint32 and a.tolist() == [5, 2**32 - 1, 0]
    assert np.asarray(buf, dtype=np.int64).tolist() == [5, 2**32 - 1, 0]
    a[0] = 9  # a copy: the buffer is unchanged
    assert buf[0] == 5
    with pytest.raises(ValueError, match="copy"):
        np.array(buf, copy=False)


def test_a_buffer_pickles_and_copies_as_its_tokens() -> None:
    buf = TokenBuffer(range(1000, 1100))
    for other in (pickle.loads(pickle.dumps(buf)), copy.copy(buf), copy.deepcopy(buf)):
        assert isinstance(other, TokenBuffer) and other == buf
        other.append(1)
        assert len(buf) == 100
