"""The ``--json`` files: standard JSON (NaN as null, numpy scalars as numbers), indented
by level, with each object of a list of objects on one line; and a fast path for the
per-request records, which are most of a replay's file.

:func:`record_lines` writes each record's line column by column (each column's values
converted to JSON text in one pass, each line filled into a template), the text
``json.dumps`` gives for the record's cleaned ``to_dict()``, in about half its time; a
replay of a 12,000-request trace writes one such list per policy
(docs/BENCHMARKS.md, "Simulator (replay)").
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache.sim.output_files import write_pieces
from prefixcache.sim.requests import RecordColumns, RequestRecord, record_fields

__all__ = [
    "JsonLines",
    "clean",
    "json_pieces",
    "json_text",
    "record_lines",
    "record_texts",
    "write_json",
]

_PLAIN = frozenset({int, str, bool, type(None)})


def clean(obj: Any) -> Any:
    """JSON-safe: NaN and infinities -> None (JSON has no such numbers), numpy scalars ->
    Python."""
    t = type(obj)
    if t in _PLAIN or t is JsonLines:
        return obj
    if t is float:
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):  # a record's values: plain, or floats (NaN when unset)
        return {
            k if type(k) is str else str(k): v
            if (vt := type(v)) in _PLAIN or (vt is float and v - v == 0)
            else clean(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [v if type(v) in _PLAIN else clean(v) for v in obj]
    if isinstance(obj, np.generic):
        return clean(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class JsonLines:
    """A list of objects already written as JSON text, one per line (what
    :func:`record_lines` returns): :func:`json_text` writes it as it writes any list of
    objects, each line indented to its level."""

    __slots__ = ("lines",)

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = lines


def json_text(obj: Any, indent: str = "") -> str:
    """``obj`` (cleaned) as JSON, indented by level like ``json.dumps(indent=2)``, except
    that a list of objects (per-request records, summaries) holds one object per line:
    each line then comes from the C encoder (``indent`` makes ``json`` encode in
    Python), or from :class:`JsonLines` as given."""
    return "".join(json_pieces(obj, indent))


def json_pieces(obj: Any, indent: str = "") -> Iterator[str]:
    """The text of :func:`json_text` in pieces, in order: a :class:`JsonLines` list is one
    piece (its lines joined), so the whole text is never copied into one string."""
    inner = indent + "  "
    if isinstance(obj, JsonLines):
        if not obj.lines:
            yield "[]"
            return
        yield "[\n" + inner
        yield (",\n" + inner).join(obj.lines)
        yield "\n" + indent + "]"
    elif isinstance(obj, dict) and obj:
        sep = "{\n"
        for k, v in obj.items():
            yield f"{sep}{inner}{json.dumps(k)}: "
            yield from json_pieces(v, inner)
            sep = ",\n"
        yield "\n" + indent + "}"
    elif isinstance(obj, list) and obj and any(isinstance(v, dict | list) for v in obj):
        flat = all(isinstance(v, dict) for v in obj)
        sep = "[\n"
        for v in obj:
            yield sep + inner
            if flat:
                yield json.dumps(v)
            else:
                yield from json_pieces(v, inner)
            sep = ",\n"
        yield "\n" + indent + "]"
    else:
        yield json.dumps(obj)


def write_json(path: str | Path, data: Any) -> None:
    """``data`` as JSON in ``path``, written piece by piece (:func:`write_pieces`)."""
    write_pieces(path, [*json_pieces(clean(data)), "\n"])


# -- the per-request records ------------------------------------------------------------
_INT_REPR = int.__repr__
_FLOAT_REPR = float.__repr__


def _value_text(v: Any) -> str:
    """One value as ``json.dumps(clean(v))`` writes it."""
    return json.dumps(clean(v))


def _column_text(values: list[Any]) -> list[str]:
    """Each value as JSON text: one pass of one converter when the column holds one
    plain type (ints, floats, bools), else value by value."""
    kinds = set(map(type, values))
    if kinds <= {int}:
        return list(map(_INT_REPR, values))
    if kinds <= {float}:
        # v - v is 0 for a finite v, NaN for NaN and the infinities (written as null).
        return [_FLOAT_REPR(v) if v - v == 0 else "null" for v in values]
    if kinds <= {bool}:
        return ["true" if v else "false" for v in values]
    if kinds <= {type(None)}:
        return ["null"] * len(values)
    return [_value_text(v) for v in values]


def record_texts(records: RecordColumns, host_tier: bool = False) -> dict[str, list[str]]:
    """Each reported field's values (:func:`record_fields`) as JSON text, by field name:
    what :func:`record_lines` fills in, made once for the ``--json`` lines and the
    ``--records-csv`` rows (:func:`prefixcache.sim.report.record_csv_rows`) alike."""
    return {k: _column_text(records.column(k)) for k in record_fields(host_tier)}


def record_lines(
    records: Sequence[RequestRecord] | RecordColumns,
    host_tier: bool = False,
    texts: dict[str, list[str]] | None = None,
) -> JsonLines:
    """The records (objects or columns) as :func:`write_json` writes ``[r.to_dict(host_tier)
    for r in records]``, line for line (the same text), for a fraction of the time.
    ``texts``: the columns' :func:`record_texts`, when already made."""
    names = record_fields(host_tier)
    template = "{" + ", ".join(f"{json.dumps(k)}: %s" for k in names) + "}"
    if texts is not None:
        columns = [texts[k] for k in names]
    elif isinstance(records, RecordColumns):
        columns = [_column_text(records.column(k)) for k in names]
    else:
        columns = [_column_text([getattr(r, k) for r in records]) for k in names]
    return JsonLines([template % row for row in zip(*columns, strict=True)])
