"""Argument conversion for the reference implementations: token ids and int64 KV indices.

Mirrors the rules of the compiled bindings (``rust/prefixcache-py/src/convert.rs``):
1-D numpy integer arrays, objects exposing an integer buffer (``array.array``) and
sequences of ints are accepted; strings, bytes, floats, bools, float/bool arrays and
non-sequences raise ``InvalidTypeError``; out-of-range values raise ``InvalidInputError``
naming the position. Sequences are checked item by item, so the first bad item decides.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

from prefixcache.errors import InvalidInputError, InvalidTypeError

_INT_BUFFER_FORMATS = frozenset("bBhHiIlLqQnN")

TOKEN_LIMIT = 2**32
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _token_range_error(what: str, i: int, v: int) -> InvalidInputError:
    return InvalidInputError(f"{what}[{i}] = {v} is out of range: token ids must be in [0, 2**32)")


def _value_range_error(what: str, i: int, v: int) -> InvalidInputError:
    return InvalidInputError(f"{what}[{i}] = {v} does not fit in int64")


def _check_token(what: str, i: int, v: int) -> None:
    if not 0 <= v < TOKEN_LIMIT:
        raise _token_range_error(what, i, v)


def _check_value(what: str, i: int, v: int) -> None:
    if not INT64_MIN <= v <= INT64_MAX:
        raise _value_range_error(what, i, v)


def _not_a_sequence(what: str, obj: object) -> InvalidTypeError:
    return InvalidTypeError(
        f"{what} must be a sequence of ints or an integer array, not {type(obj).__name__}"
    )


def _ints(obj: object, what: str, check: Callable[[str, int, int], None]) -> list[int]:
    if isinstance(obj, (str, bytes, bytearray)):
        raise _not_a_sequence(what, obj)
    if isinstance(obj, np.ndarray):
        if obj.ndim != 1:
            raise InvalidInputError(
                f"{what} must be 1-dimensional, got an array of shape {list(obj.shape)}"
            )
        if obj.dtype.kind not in "iu":
            raise InvalidTypeError(f"{what} must hold integers, got an array of dtype {obj.dtype}")
        items: list[int] = obj.tolist()
        for i, v in enumerate(items):
            check(what, i, v)
        return items
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        view = None
    if view is not None and view.ndim == 1 and view.format.lstrip("@=<>!") in _INT_BUFFER_FORMATS:
        items = view.tolist()
        for i, v in enumerate(items):
            check(what, i, v)
        return items
    try:
        len(obj)  # type: ignore[arg-type]
        iterator = iter(obj)  # type: ignore[call-overload]
    except TypeError:
        raise _not_a_sequence(what, obj) from None
    out: list[int] = []
    for i, item in enumerate(iterator):
        if isinstance(item, bool):
            raise InvalidTypeError(f"{what}[{i}] must be an int, got bool")
        try:
            v = operator.index(item)
        except TypeError:
            name = type(item).__name__
            raise InvalidTypeError(f"{what}[{i}] must be an int, got {name}") from None
        check(what, i, v)
        out.append(v)
    return out


def token_list(obj: object, what: str = "tokens") -> list[int]:
    """Token ids in [0, 2**32) as a list of ints."""
    return _ints(obj, what, _check_token)


def value_list(obj: object, what: str = "values") -> list[int]:
    """KV indices (any int64) as a list of ints."""
    return _ints(obj, what, _check_value)
