"""CSV and JSON export of results (the budgeting spreadsheet and the everything-dump).

Owns the file formats: the CSV header is the union of the rows' ``Result.to_dict()`` keys in
contract order (common columns, then training, then inference, then RL, then anything else in
first-seen order), floats written at full precision (``repr``), booleans as ``true``/``false``, missing
values empty. JSON is a list of ``Result.to_json()`` objects with non-finite floats as ``null``.
A path of ``-`` writes to standard output.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from .results import COLUMNS_BY_KIND, COMMON_COLUMNS, INFERENCE_COLUMNS, RL_COLUMNS, TRAINING_COLUMNS, Result

__all__ = ["csv_cell", "csv_header", "csv_text", "json_value", "write_csv", "write_json"]

_CONTRACT_ORDER = tuple(dict.fromkeys(COMMON_COLUMNS + TRAINING_COLUMNS + INFERENCE_COLUMNS + RL_COLUMNS))


def _contract_order(kinds: Iterable[Any]) -> tuple[str, ...]:
    """The contract's column order for a CSV holding these kinds: a kind's own columns in its own order
    (an inference-only CSV keeps the inference columns first and its later ones, such as tp, at the end),
    training before inference when both are there."""
    present = set(kinds)
    groups = [cols for kind, cols in (("training", TRAINING_COLUMNS), ("inference", INFERENCE_COLUMNS),
                                      ("rl", RL_COLUMNS))
              if any(COLUMNS_BY_KIND.get(k) is cols for k in present)]
    if not groups:
        return _CONTRACT_ORDER
    return tuple(dict.fromkeys(COMMON_COLUMNS + sum(groups, ())))


def csv_header(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Union of the rows' keys: contract columns in contract order, then others as first seen."""
    seen: dict[str, None] = {}
    kinds: dict[Any, None] = {}
    for row in rows:
        kinds.setdefault(row.get("kind"), None)
        for key in row:
            seen.setdefault(key, None)
    known = [c for c in _contract_order(kinds) if c in seen]
    return known + [k for k in seen if k not in known]


# A text cell a spreadsheet would run as a formula (OWASP "CSV injection"): a scenario's name is the user's
# own text, and a budgeting sheet opens the file. Such a cell is written with a leading apostrophe.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """One CSV cell: full-precision floats, ``true``/``false``, empty for ``None``; text that would start a
    spreadsheet formula (``=``, ``+``, ``-``, ``@``, a tab) gets a leading ``'``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):  # also numpy.float64 (a float subclass)
        return repr(float(value))
    if isinstance(value, int):
        return str(int(value))
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
        return csv_cell(value.item())
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _write_rows(rows: Sequence[Mapping[str, Any]], fh: TextIO, header: Sequence[str] | None = None) -> None:
    cols = list(header) if header is not None else csv_header(rows)
    writer = csv.writer(fh, lineterminator="\n")
    writer.writerow(cols)
    for row in rows:
        writer.writerow([csv_cell(row.get(c)) for c in cols])


def csv_text(rows: Sequence[Mapping[str, Any]], header: Sequence[str] | None = None) -> str:
    """The CSV document of ``rows`` (mappings) as a string."""
    buf = io.StringIO()
    _write_rows(rows, buf, header)
    return buf.getvalue()


def _open_out(path: str | os.PathLike[str]) -> tuple[TextIO, bool]:
    if os.fspath(path) == "-":
        return sys.stdout, False
    return open(path, "w", newline="", encoding="utf-8"), True


def write_rows_csv(
    rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], header: Sequence[str] | None = None
) -> None:
    """Write plain mappings (e.g. validation rows) as CSV with the same cell rules."""
    fh, close = _open_out(path)
    try:
        _write_rows(rows, fh, header)
    finally:
        if close:
            fh.close()


def write_csv(results: Iterable[Result], path: str | os.PathLike[str]) -> None:
    """One row per result (``Result.to_dict()``); mixed kinds share the union header."""
    write_rows_csv([r.to_dict() for r in results], path)


def json_value(value: Any) -> Any:
    """``value`` made JSON-safe: mappings/dataclasses/sequences recursed, numpy scalars unwrapped,
    non-finite floats as ``None``."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [json_value(v) for v in items]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return json_value(value.tolist())
    if hasattr(value, "item"):
        return json_value(value.item())
    return str(value)


def write_json(results: Iterable[Result], path: str | os.PathLike[str]) -> None:
    """A JSON list of ``Result.to_json()`` objects (everything: row, breakdowns, details)."""
    doc = [json_value(r.to_json()) for r in results]
    fh, close = _open_out(path)
    try:
        json.dump(doc, fh, indent=2, allow_nan=False)
        fh.write("\n")
    finally:
        if close:
            fh.close()
