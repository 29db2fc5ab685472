"""Argument conversion for the reference implementations, by the rules of the compiled
bindings (``rust/prefixcache-py/src/convert.rs``, docs/ERRORS.md).

Token ids and int64 KV indices: 1-D numpy integer arrays, objects exposing an integer
buffer (``array.array``) and sequences of ints are accepted; strings, bytes, sets, dicts,
floats, bools, float/bool arrays and non-sequences raise ``InvalidTypeError``;
out-of-range values raise ``InvalidInputError`` naming the position. Sequences are read
item by item, by index, so the first bad item decides.

Scalar arguments: an integer is an int or an object with ``__index__`` (numpy integers),
never a bool or a float (``InvalidTypeError``), and a value outside the argument's range,
however large, raises ``InvalidInputError`` naming it: nothing is clamped. A flag is a
bool or a numpy bool. A str with lone surrogates raises ``InvalidInputError``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from prefixcache.errors import InvalidInputError, InvalidTypeError

_INT_BUFFER_FORMATS = frozenset("bBhHiIlLqQnN")

TOKEN_LIMIT = 2**32
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
SIZE_MAX = INT64_MAX  # counts and sizes: [0, 2**63)
U64_MAX = 2**64 - 1


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


def _all_pass(check: Callable[[str, int, int], None], what: str, items: list[int]) -> bool:
    """Whether every item (ints, checks being range checks) passes ``check``: its smallest
    and largest do. False sends the caller to the item-by-item loop, which names the
    first bad item."""
    if not items:
        return True
    try:
        check(what, 0, min(items))
        check(what, 0, max(items))
    except InvalidInputError:
        return False
    return True


def _not_a_sequence(what: str, obj: object) -> InvalidTypeError:
    return InvalidTypeError(
        f"{what} must be a sequence of ints or an integer array, not {type(obj).__name__}"
    )


def _ints(obj: object, what: str, check: Callable[[str, int, int], None]) -> list[int]:
    if isinstance(obj, (str, bytes, bytearray, set, frozenset, dict)):
        raise _not_a_sequence(what, obj)
    if isinstance(obj, np.ndarray):
        if isinstance(obj, np.ma.MaskedArray):
            mask = np.ma.getmaskarray(obj)
            if mask.any():  # as the core: its list would hold the masked constant
                at = int(mask.argmax())
                raise InvalidInputError(
                    f"{what}[{at}] is masked (a masked array's hidden values are not read)"
                )
            obj = obj.data
        if obj.ndim != 1:
            raise InvalidInputError(
                f"{what} must be 1-dimensional, got an array of shape {list(obj.shape)}"
            )
        if obj.dtype.kind not in "iu":
            raise InvalidTypeError(f"{what} must hold integers, got an array of dtype {obj.dtype}")
        items: list[int] = obj.tolist()
        if _all_pass(check, what, items):
            return items
        for i, v in enumerate(items):
            check(what, i, v)
        return items
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        view = None
    if view is not None and view.ndim != 1:
        raise InvalidInputError(
            f"{what} must be 1-dimensional, got an array of shape {tuple(view.shape or ())}"
        )
    if view is not None and view.format.lstrip("@=<>!") in _INT_BUFFER_FORMATS:
        items = view.tolist()
        if _all_pass(check, what, items):
            return items
        for i, v in enumerate(items):
            check(what, i, v)
        return items
    # A sequence as Python's C API has it: item access by index, and a length.
    if not hasattr(type(obj), "__getitem__"):
        raise _not_a_sequence(what, obj)
    try:
        len(obj)  # type: ignore[arg-type]
    except TypeError:
        raise _not_a_sequence(what, obj) from None
    # A list or tuple (subclasses too) is read from its items, as the core reads it: its
    # own __len__ / __getitem__ overrides are not called.
    seq: Any = obj
    kind: Any = list if isinstance(obj, list) else tuple if isinstance(obj, tuple) else None
    if type(obj) in (list, tuple):
        # Exact ints run no __index__: the items are the values, in range when their
        # smallest and largest are (else the loop below names the first bad one).
        fast: list[int] = list(obj)  # type: ignore[call-overload]
        if set(map(type, fast)) <= {int} and _all_pass(check, what, fast):
            return fast

    def size() -> int:
        return int(kind.__len__(seq)) if kind else len(seq)

    out: list[int] = []
    i = 0
    while i < (n := size()):
        try:
            item = kind.__getitem__(seq, i) if kind else seq[i]
        except IndexError as e:
            raise InvalidInputError(
                f"{what}: its __len__ gives {n} but item {i} raised IndexError"
            ) from e
        if isinstance(item, bool):
            raise InvalidTypeError(f"{what}[{i}] must be an int, got bool")
        try:
            v = operator.index(item)
        except Exception:  # as the core: any failure of __index__
            name = type(item).__name__
            raise InvalidTypeError(f"{what}[{i}] must be an int, got {name}") from None
        check(what, i, v)
        out.append(v)
        i += 1
    return out


def token_list(obj: object, what: str = "tokens") -> list[int]:
    """Token ids in [0, 2**32) as a list of ints."""
    return _ints(obj, what, _check_token)


def value_list(obj: object, what: str = "values") -> list[int]:
    """KV indices (any int64) as a list of ints."""
    return _ints(obj, what, _check_value)


def _bound(v: int) -> str:
    for p in (31, 32, 63, 64):
        if abs(v) == 2**p:
            return f"-2**{p}" if v < 0 else f"2**{p}"
    return str(v)


def _range(lo: int, hi: int) -> str:
    end = _bound(hi + 1)
    return f"[{_bound(lo)}, {end})" if "**" in end else f"[{_bound(lo)}, {_bound(hi)}]"


def int_arg(v: object, what: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """An integer argument in ``[lo, hi]`` (convert.rs ``int_in``)."""
    if isinstance(v, bool):
        raise InvalidTypeError(f"{what} must be an int, got bool")
    try:
        i = operator.index(v)  # type: ignore[arg-type]
    except Exception:  # as the core: any failure of __index__
        raise InvalidTypeError(f"{what} must be an int, got {type(v).__name__}") from None
    if i < lo and lo >= 0 and hi == INT64_MAX:
        raise InvalidInputError(f"{what} must be >= {_bound(lo)}, got {i}")
    if not lo <= i <= hi:
        raise InvalidInputError(f"{what} must be an int in {_range(lo, hi)}, got {i}")
    return i


def opt_int_arg(v: object, what: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int | None:
    """:func:`int_arg`, or None for None."""
    return None if v is None else int_arg(v, what, lo, hi)


def size_arg(v: object, what: str) -> int:
    """A count, size or length: ``[0, 2**63)``."""
    return int_arg(v, what, 0, SIZE_MAX)


def request_id_arg(v: object) -> int:
    """A request id, the same range for every class: ``[0, 2**64)``."""
    return int_arg(v, "request_id", 0, U64_MAX)


def flag_arg(v: object, what: str) -> bool:
    """A bool argument: a Python bool or a numpy bool."""
    if not isinstance(v, (bool, np.bool_)):
        raise InvalidTypeError(f"{what} must be a bool, got {type(v).__name__}")
    return bool(v)


def str_arg(v: object, what: str) -> str:
    """A str argument that is valid text (encodable as UTF-8)."""
    if not isinstance(v, str):
        raise InvalidTypeError(f"{what} must be a str, got {type(v).__name__}")
    try:
        v.encode()
    except UnicodeEncodeError:
        raise InvalidInputError(
            f"{what} is not valid text: it holds lone surrogates (cannot be UTF-8 encoded)"
        ) from None
    return v


def opt_str_arg(v: object, what: str) -> str | None:
    """A str argument or None."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise InvalidTypeError(f"{what} must be a str or None, got {type(v).__name__}")
    return str_arg(v, what)


def _check_u64(what: str, i: int, v: int) -> None:
    if v < 0:
        raise InvalidInputError(f"{what}[{i}] = {v} must be >= 0")
    if v > U64_MAX:
        raise InvalidInputError(f"{what}[{i}] = {v} does not fit in uint64")


def u64_list(obj: object, what: str) -> list[int]:
    """Ints in ``[0, 2**64)`` (request ids, counts) as a list of ints, any form."""
    return _ints(obj, what, _check_u64)


def _check_u32(what: str, i: int, v: int) -> None:
    if not 0 <= v <= 0xFFFF_FFFF:
        raise InvalidInputError(f"{what}[{i}] = {v} is out of range: ids must be in [0, 2**32)")


def u32_list(obj: object, what: str) -> list[int]:
    """Ids in ``[0, 2**32)`` (block ids, KV-cache group ids) as a list of ints, any form."""
    return _ints(obj, what, _check_u32)
