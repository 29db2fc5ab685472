"""Trace readers: Mooncake JSONL and a JSONL of token ids.

Mooncake (kvcache-ai/Mooncake FAST'25 traces), one object per line::

    {"timestamp": <ms>, "input_length": <int>, "output_length": <int>, "hash_ids": [int, ...]}

Each hash id stands for one 512-token block; equal ids mean equal content. The reader
expands id ``h`` into the 512 tokens ``h * 512 + 0 .. h * 512 + 511`` (distinct for distinct
ids, depending only on the id), truncates the last block to ``input_length``, and gives
each request ``output_length`` fresh output tokens from a range no prompt token uses
(``2**31`` and up, see :func:`fresh_outputs`). Prompts are expanded lazily (numpy, no
per-token Python loop).

Token JSONL (prefixcache's own format), one object per line::

    {"id": str|int, "arrival": seconds, "prompt": [int, ...],
     "output_len": int  |  "output": [int, ...],
     "session": str|int (optional), "extra_key": str (optional), "cache_salt": str (optional)}

With ``output_len`` the outputs get fresh tokens (``2**31`` and up, as for Mooncake).

Files compressed with gzip, zstd (needs the ``zstandard`` package), bzip2 or xz are read
transparently, recognised by their first bytes (not their name). A malformed line - not
UTF-8, not a JSON object, nested too deeply, a field of the wrong type or range, a string
that is not valid Unicode (a lone surrogate escape) - raises :class:`TraceFormatError`
naming the file and line number; with ``skip_bad_lines=True`` bad lines are skipped and
counted (``Trace.skipped``) instead. Blank lines are ignored. A file that cannot be
decompressed raises :class:`InvalidInputError`.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache._core import expand_block_ids
from prefixcache.errors import InvalidInputError
from prefixcache.sim.requests import MAX_ARRIVAL_SECONDS, Request, TokenArray

__all__ = [
    "MAX_ARRIVAL_SECONDS",
    "MAX_LINE_BYTES",
    "MOONCAKE_BLOCK",
    "Trace",
    "TraceFormatError",
    "detect_format",
    "expand_hash_ids",
    "fresh_outputs",
    "read_mooncake",
    "read_token_jsonl",
    "read_trace",
]

MOONCAKE_BLOCK = 512
_MAX_HASH_ID = (2**31) // MOONCAKE_BLOCK - 1  # prompt tokens stay below 2**31
_OUTPUT_BASE = 2**31  # fresh output tokens live in [2**31, 2**32)
_OUTPUT_IDS = 2**31
_MAX_TOKEN = 2**32 - 1


class TraceFormatError(InvalidInputError):
    """A trace line is malformed. ``path`` and ``line`` (1-based) say where."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line


@dataclass
class Trace:
    """Requests read from a trace file, in file order, plus how many lines were skipped."""

    path: str
    format: str
    requests: list[Request]
    skipped: int = 0
    skipped_lines: list[int] = field(default_factory=list)
    hash_ids: list[TokenArray] | None = None  # Mooncake: each request's block ids

    def __len__(self) -> int:
        return len(self.requests)


def expand_hash_ids(hash_ids: TokenArray | list[int], input_length: int) -> TokenArray:
    """The synthetic prompt of a Mooncake line: 512 tokens per hash id (id ``h`` stands
    for ``512 h .. 512 h + 511``), truncated to ``input_length``."""
    return expand_block_ids(hash_ids, MOONCAKE_BLOCK, input_length)


def fresh_outputs(index: int, start: int, n: int, total: int) -> TokenArray:
    """The fresh output tokens of one request, from ``[2**31, 2**32)``.

    ``index`` numbers the requests given fresh outputs (0, 1, ...), ``start`` is the number
    of fresh tokens handed out before this request, ``total`` over the whole trace. While
    ``total <= 2**31`` every request gets its own range ``2**31 + start ..`` and no two
    output tokens are equal. Beyond that there are not enough ids for that, and request
    ``index`` gets ``2**31 + (index + j) mod 2**31`` for its j-th token instead: the first
    output token still differs between any two requests, and that is all the caches need -
    a prompt never holds these ids, so no request can reuse another's output past the
    first token (tree paths, block hashes and trie nodes diverge there).
    """
    if total <= _OUTPUT_IDS:
        return np.arange(_OUTPUT_BASE + start, _OUTPUT_BASE + start + n, dtype=np.uint32)
    j = np.arange(n, dtype=np.uint64) + np.uint64(index % _OUTPUT_IDS)
    return (j % np.uint64(_OUTPUT_IDS) + np.uint64(_OUTPUT_BASE)).astype(np.uint32)


class _FreshTokens:
    """A request's fresh output tokens, produced on demand (all, or only the first k)."""

    __slots__ = ("fresh", "index", "n", "start")

    def __init__(self, fresh: _Fresh, index: int, start: int, n: int) -> None:
        self.fresh, self.index, self.start, self.n = fresh, index, start, n

    def __call__(self) -> TokenArray:
        return self.head(self.n)

    def head(self, k: int) -> TokenArray:
        return fresh_outputs(self.index, self.start, min(k, self.n), self.fresh.total)


class _Fresh:
    """Fresh output tokens, in file order; the scheme is fixed once the total is known."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    def take(self, n: int) -> _FreshTokens:
        tokens = _FreshTokens(self, self.count, self.total, n)
        self.count += 1
        self.total += n
        return tokens


class HashIdPrompt:
    """A Mooncake prompt kept as its hash ids: a slice of the trace's one flat id array,
    expanded to tokens when called (the trace never holds its prompts' tokens)."""

    __slots__ = ("flat", "hi", "lo", "n")

    def __init__(self, flat: TokenArray, lo: int, hi: int, n: int) -> None:
        self.flat = flat
        self.lo = lo
        self.hi = hi
        self.n = n

    def __call__(self) -> TokenArray:
        return expand_hash_ids(self.flat[self.lo : self.hi], self.n)


# The most output tokens one request may ask for (2**40): a bound on what a trace can
# claim, far past any KV budget; the simulators produce a request's output tokens lazily.
MAX_OUTPUT_LEN = 2**40


def _int(obj: dict[str, Any], key: str, minimum: int = 0, maximum: int | None = None) -> int:
    if key not in obj:
        raise ValueError(f"missing field {key!r}")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"field {key!r} must be an integer, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"field {key!r} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"field {key!r} must be <= {maximum:,}, got {v:,}")
    return v


def _number(obj: dict[str, Any], key: str, maximum: float) -> float:
    if key not in obj:
        raise ValueError(f"missing field {key!r}")
    v = obj[key]
    try:
        ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and v >= 0
    except OverflowError:  # an integer too large for a float
        ok = False
    if not ok:
        raise ValueError(f"field {key!r} must be a finite number >= 0, got {v!r}")
    if v > maximum:
        raise ValueError(f"field {key!r} must be <= {maximum:.0e}, got {v!r}")
    return float(v)


def _token_list(obj: dict[str, Any], key: str, *, allow_empty: bool) -> TokenArray:
    v = obj[key]
    if not isinstance(v, list):
        raise ValueError(f"field {key!r} must be a list of token ids")
    if not v:
        if allow_empty:
            return np.zeros(0, dtype=np.uint32)
        raise ValueError(f"field {key!r} is empty")
    if not all(type(t) is int for t in v):
        bad = next(i for i, t in enumerate(v) if type(t) is not int)
        raise ValueError(f"field {key!r}[{bad}] is not an integer: {v[bad]!r}")
    try:
        arr = np.asarray(v, dtype=np.int64)
        bad_pos = np.flatnonzero((arr < 0) | (arr > _MAX_TOKEN))
        i = int(bad_pos[0]) if bad_pos.size else -1
    except OverflowError:  # beyond int64: find it the slow way (error path only)
        i = next(k for k, t in enumerate(v) if not 0 <= t <= _MAX_TOKEN)
    if i >= 0:
        raise ValueError(f"field {key!r}[{i}] = {v[i]} is not a token id in [0, 2**32)")
    return arr.astype(np.uint32)


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _open(path: Path) -> Any:
    """The file as a binary stream, decompressed when its first bytes say so."""
    with path.open("rb") as f:
        head = f.read(6)
    if head.startswith(b"\x1f\x8b"):
        return gzip.open(path, "rb")
    if head.startswith(b"BZh"):
        return bz2.open(path, "rb")
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(path, "rb")
    if head.startswith(_ZSTD_MAGIC):
        try:
            import zstandard
        except ImportError:
            raise InvalidInputError(
                f"{path}: a zstd-compressed trace needs the zstandard package "
                "(pip install zstandard)"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
        return io.BufferedReader(reader)
    return path.open("rb")


def _decompress_errors() -> tuple[type[BaseException], ...]:
    errs: list[type[BaseException]] = [OSError, EOFError, zlib.error, lzma.LZMAError]
    try:
        import zstandard

        errs.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errs)


# The longest trace line read (bytes, after decompression): far beyond any real request
# (a 64 MiB line holds millions of token ids), and a bound on the memory one line takes.
MAX_LINE_BYTES = 64 * 2**20


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines with their 1-based numbers. A failure while reading (a corrupt or
    truncated compressed file) is one :class:`InvalidInputError`; a file that cannot be
    opened stays an ``OSError``; a line longer than :data:`MAX_LINE_BYTES` is a
    :class:`TraceFormatError` (even when bad lines are skipped: nothing that long is a
    request, and reading on would only take more memory)."""
    f = _open(path)
    errs = _decompress_errors()
    with f:
        lineno = 0
        while True:
            try:
                line = f.readline(MAX_LINE_BYTES + 1)
            except errs as e:
                raise InvalidInputError(
                    f"{path}: cannot read or decompress after line {lineno}: "
                    f"{str(e) or type(e).__name__}"
                ) from None
            if not line:
                return
            lineno += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                raise TraceFormatError(
                    str(path),
                    lineno,
                    f"line longer than {MAX_LINE_BYTES // 2**20} MiB "
                    f"({MAX_LINE_BYTES:,} bytes); not a trace of requests",
                )
            if line.strip():
                yield lineno, line


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {e.start + 1}); "
            "a trace is JSON lines, plain or compressed with gzip, zstd, bzip2 or xz"
        ) from None


def _valid_str(v: str, key: str) -> str:
    """Reject strings that cannot be encoded (a JSON ``\\ud800`` escape decodes to a
    lone surrogate, which no cache key, CSV or terminal can carry)."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"field {key!r} is not valid Unicode text (lone surrogate "
            f"\\u{ord(v[e.start]):04x} at position {e.start})"
        ) from None
    return v


def _object(raw: bytes) -> dict[str, Any]:
    line = _text(raw)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def read_mooncake(path: str | Path, *, skip_bad_lines: bool = False) -> Trace:
    """Read a Mooncake JSONL trace (see the module docstring). The hash ids of all lines
    are kept in one flat uint32 array; requests and ``Trace.hash_ids`` are views of it."""
    p = Path(path)
    reqs: list[Request] = []
    skipped: list[int] = []
    flat: list[int] = []  # every request's hash ids, one after the other
    spans: list[tuple[int, int, int, int, float]] = []  # (lo, hi, n_in, n_out, arrival)
    fresh = _Fresh()
    for lineno, line in _lines(p):
        try:
            obj = _object(line)
            ts = _number(obj, "timestamp", MAX_ARRIVAL_SECONDS * 1000)  # milliseconds
            n_in = _int(obj, "input_length", 1)
            n_out = _int(obj, "output_length", 0, MAX_OUTPUT_LEN)
            if "hash_ids" not in obj or not isinstance(obj["hash_ids"], list):
                raise ValueError("field 'hash_ids' must be a list of integers")
            hl = obj["hash_ids"]
            if not all(type(h) is int and 0 <= h <= _MAX_HASH_ID for h in hl):
                raise ValueError(f"'hash_ids' must hold integers in [0, {_MAX_HASH_ID}]")
            need = -(-n_in // MOONCAKE_BLOCK)
            if len(hl) != need:
                raise ValueError(
                    f"input_length {n_in} needs {need} hash ids of {MOONCAKE_BLOCK} tokens, "
                    f"got {len(hl)}"
                )
        except ValueError as e:
            if not skip_bad_lines:
                raise TraceFormatError(str(p), lineno, str(e)) from None
            skipped.append(lineno)
            continue
        spans.append((len(flat), len(flat) + len(hl), n_in, n_out, ts / 1000.0))
        flat.extend(hl)
    ids = np.asarray(flat, dtype=np.uint32)
    del flat
    for lo, hi, n_in, n_out, arrival in spans:
        reqs.append(
            Request(
                len(reqs),
                HashIdPrompt(ids, lo, hi, n_in),
                fresh.take(n_out),
                arrival=arrival,
                prompt_len=n_in,
                output_len=n_out,
            )
        )
    blocks = [ids[lo:hi] for lo, hi, _, _, _ in spans]
    return Trace(str(p), "mooncake", reqs, len(skipped), skipped, blocks)


_TOKEN_FIELDS = {
    "id",
    "arrival",
    "prompt",
    "output_len",
    "output",
    "session",
    "extra_key",
    "cache_salt",
}


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"field {key!r} must be a string or null")
    return _valid_str(v, key)


def read_token_jsonl(path: str | Path, *, skip_bad_lines: bool = False) -> Trace:
    """Read prefixcache's token-id JSONL format (see the module docstring)."""
    p = Path(path)
    reqs: list[Request] = []
    skipped: list[int] = []
    seen: set[Any] = set()
    fresh = _Fresh()
    for lineno, line in _lines(p):
        try:
            obj = _object(line)
            unknown = set(obj) - _TOKEN_FIELDS
            if unknown:
                raise ValueError(f"unknown field(s) {sorted(unknown)}")
            if "id" not in obj:
                raise ValueError("missing field 'id'")
            rid = obj["id"]
            if isinstance(rid, bool) or not isinstance(rid, int | str):
                raise ValueError("field 'id' must be a string or an integer")
            if isinstance(rid, str):
                _valid_str(rid, "id")
            if rid in seen:
                raise ValueError(f"duplicate id {rid!r}")
            arrival = _number(obj, "arrival", MAX_ARRIVAL_SECONDS)
            if "prompt" not in obj:
                raise ValueError("missing field 'prompt'")
            prompt = _token_list(obj, "prompt", allow_empty=False)
            has_out, has_len = "output" in obj, "output_len" in obj
            if has_out == has_len:
                raise ValueError("give exactly one of 'output' and 'output_len'")
            session = obj.get("session")
            if session is not None and (
                isinstance(session, bool) or not isinstance(session, int | str)
            ):
                raise ValueError("field 'session' must be a string, an integer or null")
            if isinstance(session, str):
                _valid_str(session, "session")
            extra_key = _opt_str(obj, "extra_key")
            salt = _opt_str(obj, "cache_salt")
            if has_out:
                output: Any = _token_list(obj, "output", allow_empty=True)
                n_out = len(output)
            else:
                n_out = _int(obj, "output_len", 0, MAX_OUTPUT_LEN)
                output = None
        except ValueError as e:
            if not skip_bad_lines:
                raise TraceFormatError(str(p), lineno, str(e)) from None
            skipped.append(lineno)
            continue
        seen.add(rid)
        if output is None:
            output = fresh.take(n_out)
        reqs.append(
            Request(
                rid,
                prompt,
                output,
                session=session,
                arrival=arrival,
                extra_key=extra_key,
                cache_salt=salt,
                output_len=n_out,
            )
        )
    _number_turns(reqs)
    return Trace(str(p), "tokens", reqs, len(skipped), skipped)


def _number_turns(reqs: list[Request]) -> None:
    turns: dict[Any, int] = {}
    for r in reqs:
        if r.session is not None:
            r.turn = turns.get(r.session, 0)
            turns[r.session] = r.turn + 1


def detect_format(path: str | Path, *, skip_bad_lines: bool = False) -> str:
    """'mooncake' if the first non-blank line has 'hash_ids', 'tokens' if it has 'prompt'
    (``skip_bad_lines``: the first such line that is a JSON object with either)."""
    p = Path(path)
    first: tuple[int, str] | None = None  # the first line skipped, and why
    for lineno, line in _lines(p):
        try:
            obj = _object(line)
        except ValueError as e:
            why = str(e)
        else:
            if "hash_ids" in obj:
                return "mooncake"
            if "prompt" in obj:
                return "tokens"
            why = "cannot tell the format: no 'hash_ids' (Mooncake) or 'prompt'"
        if not skip_bad_lines:
            raise TraceFormatError(str(p), lineno, why)
        first = first or (lineno, why)
    if first is not None:
        raise TraceFormatError(
            str(p), first[0], f"no line is a request of either format; this one: {first[1]}"
        )
    raise InvalidInputError(f"{p}: the trace is empty")


def read_trace(path: str | Path, *, fmt: str = "auto", skip_bad_lines: bool = False) -> Trace:
    """Read a trace, detecting the format unless ``fmt`` is 'mooncake' or 'tokens'.

    A trace without a request is refused whatever the format: an empty file (or blank
    lines only) is an :class:`InvalidInputError`, a file whose every line was skipped a
    :class:`TraceFormatError` naming the first. (``read_mooncake`` and
    ``read_token_jsonl`` themselves return an empty ``Trace``.)"""
    if fmt == "auto":
        fmt = detect_format(path, skip_bad_lines=skip_bad_lines)
    if fmt == "mooncake":
        reader = read_mooncake
    elif fmt == "tokens":
        reader = read_token_jsonl
    else:
        raise InvalidInputError(f"unknown trace format {fmt!r}; expected auto, mooncake or tokens")
    tr = reader(path, skip_bad_lines=skip_bad_lines)
    if tr.requests:
        return tr
    if not tr.skipped:
        raise InvalidInputError(f"{Path(path)}: the trace is empty")
    try:  # the first skipped line again, for its reason
        reader(path)
    except TraceFormatError as e:
        why = str(e).removeprefix(f"{e.path}:{e.line}: ")
        raise TraceFormatError(
            e.path, e.line, f"no line is a {fmt} request ({tr.skipped} skipped); this one: {why}"
        ) from None
    raise AssertionError("skipped lines that read without error")  # pragma: no cover
