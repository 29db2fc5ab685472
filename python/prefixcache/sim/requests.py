"""What the simulator passes around per request: the request itself (prompt and output
tokens, session, arrival, cache namespace) and the record of what happened to it under one
policy."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from prefixcache.errors import InvalidInputError, InvalidTypeError

TokenArray = npt.NDArray[np.uint32]
TokenFactory = Callable[[], TokenArray]
RequestId = int | str

__all__ = [
    "MAX_ARRIVAL_SECONDS",
    "RecordColumns",
    "Request",
    "RequestId",
    "RequestRecord",
    "TokenArray",
    "TokenCounter",
    "TokenFactory",
    "namespace_seed",
    "new_record",
    "record_fields",
]


# The latest arrival a request may have, in seconds (about 317 years: a Unix time in
# seconds, or a Mooncake timestamp in milliseconds, is far below it). The time model's
# clock is a float of seconds; up to here it still tells 2 microseconds apart, where a
# prefill takes milliseconds. A later arrival (1e300) would leave it nothing to count.
MAX_ARRIVAL_SECONDS = 1e10


def _arrival(value: object) -> float:
    """An arrival time in seconds: a finite number in [0, MAX_ARRIVAL_SECONDS] (the time
    model's clock starts at 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidTypeError(f"arrival must be a number of seconds, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int too large for a float
        v = math.inf
    if not (0.0 <= v <= MAX_ARRIVAL_SECONDS):
        raise InvalidInputError(
            f"arrival must be a finite number of seconds in [0, {MAX_ARRIVAL_SECONDS:.0e}], "
            f"got {value!r}"
        )
    return v


_TOKEN_LIMIT = 2**32


def _token_array(tokens: object, rid: object, what: str) -> TokenArray:
    """``tokens`` as a one-dimensional uint32 array of token ids (as given when it is
    one already), or InvalidInputError / InvalidTypeError naming the request."""
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.uint32 and tokens.ndim == 1:
        return tokens
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as e:
        raise InvalidTypeError(
            f"request {rid!r}: the {what} is not an array of token ids: {e}"
        ) from None
    if arr.ndim != 1:
        raise InvalidInputError(
            f"request {rid!r}: the {what} must be a one-dimensional array of token ids, "
            f"got {arr.ndim} dimensions"
        )
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint32)
    if arr.dtype.kind not in "iu":
        raise InvalidTypeError(
            f"request {rid!r}: the {what} must hold integers, got an array of dtype {arr.dtype}"
        )
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= _TOKEN_LIMIT:
        bad = lo if lo < 0 else hi
        raise InvalidInputError(
            f"request {rid!r}: the {what} holds {bad}: token ids must be in [0, 2**32)"
        )
    return arr.astype(np.uint32)


class Request:
    """One request: prompt tokens, output tokens and where it belongs.

    ``prompt`` / ``output`` may be given as numpy arrays or as zero-argument callables
    producing them (trace readers expand long prompts lazily so a 12k-request trace does
    not hold every token in memory); then ``prompt_len`` / ``output_len`` must be given.
    Reading ``req.prompt`` always returns a uint32 numpy array.
    """

    __slots__ = (
        "_arrival",
        "_output",
        "_prompt",
        "cache_salt",
        "extra_key",
        "id",
        "output_len",
        "prompt_len",
        "session",
        "turn",
    )

    def __init__(
        self,
        id: RequestId,
        prompt: TokenArray | TokenFactory,
        output: TokenArray | TokenFactory,
        *,
        session: RequestId | None = None,
        turn: int = 0,
        arrival: float = 0.0,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        prompt_len: int | None = None,
        output_len: int | None = None,
    ) -> None:
        self.id = id
        if not callable(prompt):
            prompt = _token_array(prompt, id, "prompt")
        if not callable(output):
            output = _token_array(output, id, "output")
        self._prompt = prompt
        self._output = output
        self.prompt_len = _length(prompt, prompt_len, "prompt")
        self.output_len = _length(output, output_len, "output")
        if self.prompt_len < 1:
            raise InvalidInputError(f"request {id!r}: the prompt is empty")
        self.session = session
        self.turn = turn
        self._arrival = _arrival(arrival)
        self.extra_key = extra_key
        # SGLang and vLLM treat an empty salt as no salt.
        self.cache_salt = cache_salt or None

    @property
    def arrival(self) -> float:
        """Seconds (the time model): a finite number in [0, MAX_ARRIVAL_SECONDS]."""
        return self._arrival

    @arrival.setter
    def arrival(self, value: float) -> None:
        self._arrival = _arrival(value)

    @property
    def prompt(self) -> TokenArray:
        p = self._prompt
        return self._produced(p(), self.prompt_len, "prompt") if callable(p) else p

    @property
    def output(self) -> TokenArray:
        o = self._output
        return self._produced(o(), self.output_len, "output") if callable(o) else o

    def _produced(self, tokens: object, n: int, what: str) -> TokenArray:
        """What a lazy prompt or output produced: token ids, as many as declared."""
        arr = _token_array(tokens, self.id, what)
        if len(arr) != n:
            raise InvalidInputError(
                f"request {self.id!r}: the lazy {what} produced {len(arr)} tokens, "
                f"{what}_len {n} declared"
            )
        return arr

    def output_head(self, k: int) -> TokenArray:
        """The first ``k`` output tokens; a lazy output that can produce only its head
        (the trace readers' fresh outputs can) is not produced whole."""
        o = self._output
        head = getattr(o, "head", None)
        if callable(o) and callable(head):
            return self._produced(head(k), min(max(k, 0), self.output_len), "output")
        return self.output[:k]

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id!r}, prompt_len={self.prompt_len}, "
            f"output_len={self.output_len}, session={self.session!r}, turn={self.turn}, "
            f"arrival={self.arrival})"
        )


def _length(tokens: TokenArray | TokenFactory, given: int | None, what: str) -> int:
    if given is not None and (isinstance(given, bool) or not isinstance(given, int | np.integer)):
        raise InvalidTypeError(f"{what}_len must be an int, got {type(given).__name__}")
    if given is not None and given < 0:
        raise InvalidInputError(f"{what}_len must be >= 0, got {given}")
    if callable(tokens):
        if given is None:
            raise InvalidInputError(f"a lazy {what} needs an explicit {what}_len")
        return int(given)
    n = len(tokens)
    if given is not None and given != n:
        raise InvalidInputError(f"{what}_len {given} does not match {n} tokens")
    return n


class TokenCounter:
    """Hands out fresh token ids: every call returns ids never returned before."""

    def __init__(self, start: int = 1, limit: int = 2**32) -> None:
        self._next = start
        self._limit = limit

    def fresh(self, n: int) -> TokenArray:
        start = self._next
        if start + n > self._limit:
            raise InvalidInputError("ran out of unique token ids (2**32)")
        self._next = start + n
        return np.arange(start, start + n, dtype=np.uint32)


@dataclass
class RequestRecord:
    """What happened to one request under one policy."""

    id: RequestId
    session: RequestId | None
    turn: int
    prompt_tokens: int
    output_tokens: int
    hit_tokens: int = 0  # reused prompt tokens at first admission
    evicted_tokens: int = 0  # tokens the cache evicted to make room for this request's KV
    rejected: bool = False  # could not fit even alone
    arrival: float = 0.0  # seconds (time model; effective arrival for session turns)
    first_token: float = math.nan  # seconds (time model)
    finished: float = math.nan
    ttft: float = math.nan  # seconds (time model)
    preemptions: int = 0
    recompute_hit_tokens: int = 0  # hits on re-admission after preemption
    recomputed_tokens: int = 0  # tokens prefilled again after preemption
    # Second tier (docs/SIMULATOR.md, "Offload"), at first admission: the reused tokens
    # found in host memory, those of them loaded (the rest were recomputed: loading them
    # would have been slower), and the load's time in seconds (part of the TTFT).
    host_hit_tokens: int = 0
    loaded_tokens: int = 0
    load_time: float = 0.0

    def to_dict(self, host_tier: bool = False) -> dict[str, object]:
        """The record's fields; the second tier's only with ``host_tier`` (a policy
        without one reports exactly what it reported before tiers existed)."""
        return {k: getattr(self, k) for k in record_fields(host_tier)}


_HOST_FIELDS = ("host_hit_tokens", "loaded_tokens", "load_time")
_ALL_FIELDS = tuple(f.name for f in fields(RequestRecord))
_BASE_FIELDS = tuple(k for k in _ALL_FIELDS if k not in _HOST_FIELDS)


def record_fields(host_tier: bool = False) -> tuple[str, ...]:
    """The fields :meth:`RequestRecord.to_dict` reports, in order."""
    return _ALL_FIELDS if host_tier else _BASE_FIELDS


def new_record(req: Request) -> RequestRecord:
    return RequestRecord(
        req.id, req.session, req.turn, req.prompt_len, req.output_len, arrival=req.arrival
    )


class RecordColumns:
    """The records of one replay held column by column: one list per
    :class:`RequestRecord` field, entry ``i`` of each the value of request ``i``'s record.

    A replay writes its records here instead of one object per request: the lists pickle
    (from a worker process) and convert to JSON text a column at a time for a fraction
    of what as many objects cost. :meth:`records` gives the objects, equal field for
    field.
    """

    __slots__ = _ALL_FIELDS

    id: list[RequestId]
    session: list[RequestId | None]
    turn: list[int]
    prompt_tokens: list[int]
    output_tokens: list[int]
    hit_tokens: list[int]
    evicted_tokens: list[int]
    rejected: list[bool]
    arrival: list[float]
    first_token: list[float]
    finished: list[float]
    ttft: list[float]
    preemptions: list[int]
    recompute_hit_tokens: list[int]
    recomputed_tokens: list[int]
    host_hit_tokens: list[int]
    loaded_tokens: list[int]
    load_time: list[float]

    def __init__(self, columns: Sequence[list[Any]]) -> None:
        """``columns``: one list per field, in :func:`record_fields` order (host tier
        included), all of one length."""
        if len(columns) != len(_ALL_FIELDS):
            raise InvalidInputError(
                f"{len(_ALL_FIELDS)} record columns expected, got {len(columns)}"
            )
        n = len(columns[0]) if columns else 0
        for name, values in zip(_ALL_FIELDS, columns, strict=True):
            if len(values) != n:
                raise InvalidInputError(f"record column {name} holds {len(values)} values, not {n}")
            setattr(self, name, values)

    @classmethod
    def for_requests(cls, requests: Sequence[Request]) -> RecordColumns:
        """Each request's record as :func:`new_record` starts it."""
        n = len(requests)
        nan = math.nan
        return cls(
            [
                [r.id for r in requests],
                [r.session for r in requests],
                [r.turn for r in requests],
                [r.prompt_len for r in requests],
                [r.output_len for r in requests],
                [0] * n,  # hit_tokens
                [0] * n,  # evicted_tokens
                [False] * n,  # rejected
                [r.arrival for r in requests],
                [nan] * n,  # first_token
                [nan] * n,  # finished
                [nan] * n,  # ttft
                [0] * n,  # preemptions
                [0] * n,  # recompute_hit_tokens
                [0] * n,  # recomputed_tokens
                [0] * n,  # host_hit_tokens
                [0] * n,  # loaded_tokens
                [0.0] * n,  # load_time
            ]
        )

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord]) -> RecordColumns:
        """The columns of ``records``."""
        return cls([[getattr(r, k) for r in records] for k in _ALL_FIELDS])

    def column(self, name: str) -> list[Any]:
        """The values of field ``name``, one per request."""
        if name not in _ALL_FIELDS:
            raise InvalidInputError(f"no record field {name!r}")
        values: list[Any] = getattr(self, name)
        return values

    def columns(self) -> list[list[Any]]:
        """Every column, in :func:`record_fields` order (host tier included)."""
        return [getattr(self, k) for k in _ALL_FIELDS]

    def records(self) -> list[RequestRecord]:
        """One :class:`RequestRecord` per request, in order."""
        return [RequestRecord(*row) for row in zip(*self.columns(), strict=True)]

    def __len__(self) -> int:
        return len(self.id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordColumns):
            return NotImplemented
        return self.columns() == other.columns()

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> list[list[Any]]:
        return self.columns()

    def __setstate__(self, state: list[list[Any]]) -> None:
        for name, values in zip(_ALL_FIELDS, state, strict=True):
            setattr(self, name, values)

    def __repr__(self) -> str:
        return f"RecordColumns({len(self)} records)"


def namespace_seed(extra_key: str | None, cache_salt: str | None) -> int:
    """A 64-bit seed for a request's cache namespace (0 for the default one): the seed of
    the chained block keys the lab caches and the cache-aware router's own bookkeeping
    compute (``prefixcache._core.lab_block_keys``), so two namespaces never share a key."""
    if extra_key is None and cache_salt is None:
        return 0
    text = f"{extra_key!r}\x00{cache_salt!r}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
