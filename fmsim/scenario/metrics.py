"""Result columns as scenario keys: :func:`metric_columns`, :func:`canonical_metric`,
:func:`parse_metric_value`, and the ``measured:`` and ``expect:`` sections (:class:`Expect`, its keys,
their parsing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..catalog import suggest
from ..errors import ConfigError
from ..results import COLUMNS_BY_KIND, COMMON_COLUMNS, INFERENCE_COLUMNS, TRAINING_COLUMNS
from ..units import parse_bytes, parse_count, parse_flop_rate, parse_time
from .reader import _Section, _what, float_number
from .schema import FLOPS_FORMULAS


MEASURED_STRING_KEYS = ("source", "flops_formula", "peak", "notes")
EXPECT_KEYS = ("value", "rel_tol", "abs_tol")
FLOPS_METRICS = ("model_tflops_per_gpu", "mfu", "hfu")


@dataclass(frozen=True, slots=True, kw_only=True)
class Expect:
    """A regression band: ``value`` within ``max(rel_tol * |value|, abs_tol)`` (math.isclose rule)."""

    value: float
    rel_tol: float
    abs_tol: float = 0.0

    @property
    def half_width(self) -> float:
        return max(self.rel_tol * abs(self.value), self.abs_tol)

    def band(self) -> tuple[float, float]:
        return self.value - self.half_width, self.value + self.half_width

    def contains(self, x: float | None) -> bool:
        if x is None or isinstance(x, str):
            return False
        x = float(x)
        return math.isfinite(x) and abs(x - self.value) <= self.half_width * (1 + 1e-12)


_ALIASES = {"step_time": "step_time_s", "tflops_per_gpu": "model_tflops_per_gpu"}
_NOT_METRICS = (
    "scenario",
    "kind",
    "instance",
    "nodes",
    "gpus",
    "price_date",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "hbm_per_gpu_bytes",
    "bottleneck",
    "pricing_option",
    "usd_per_hour",
    # the plan's own settings, echoed so a CSV row names its plan
    "vpp",
    "zero",
    "dp_shard",
    "micro_batch",
    "global_batch",
    "num_microbatches",
    "precision",
    "recompute",
)
for _col in TRAINING_COLUMNS + INFERENCE_COLUMNS:
    if _col.endswith("_s") and not _col.endswith("_per_s"):
        _ALIASES.setdefault(_col[:-2], _col)  # ttft_p50 -> ttft_p50_s


def metric_columns(kind: str) -> tuple[str, ...]:
    """Result columns a ``measured:``/``expect:`` entry may name for a workload ``kind``."""
    if kind in COLUMNS_BY_KIND:
        cols = COLUMNS_BY_KIND[kind]
    else:  # rl: trains and generates
        cols = TRAINING_COLUMNS + INFERENCE_COLUMNS
    return tuple(c for c in COMMON_COLUMNS + tuple(cols) if c not in _NOT_METRICS)


def canonical_metric(key: str) -> str:
    """Column name of a measured/expect key (``step_time`` -> ``step_time_s``)."""
    return _ALIASES.get(key, key)


def _dimension(col: str) -> str:
    if col in ("mfu", "hfu"):
        return "fraction"
    if col == "model_tflops_per_gpu":
        return "tflops"
    if col == "fits":
        return "bool"
    if col.endswith(("_per_s", "_per_s_per_gpu")) or col == "gpu_hours":
        return "count"
    if col.endswith("_s"):
        return "s"
    if col.endswith("_bytes"):
        return "bytes"
    if col.startswith("usd") or col.endswith("usd"):
        return "usd"
    return "count"


def parse_metric_value(col: str, value: Any) -> float:
    """A measured/expected value in the unit of column ``col`` (SI; TFLOP/s for ``*_tflops_*``).

    Raises :class:`ConfigError` (no location) with what was expected.
    """
    dim = _dimension(col)
    if dim == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{value!r} is not true/false (expected true or false)")
        return 1.0 if value else 0.0
    if isinstance(value, bool):
        raise ConfigError(f"{value!r} is not a number (expected a {dim} value)")
    if dim == "fraction":
        if isinstance(value, str) and value.strip().endswith("%"):
            out = parse_count(value.strip()[:-1]) / 100.0
        else:
            out = parse_count(value)
        if not 0.0 < out <= 1.0:
            raise ConfigError(f"{value!r} is not a fraction in (0, 1] (expected e.g. 0.45 or '45%')")
        return out
    if dim == "tflops":
        if isinstance(value, str) and re.search(r"FLOP", value):
            out = parse_flop_rate(value) / 1e12
        else:
            out = parse_count(value)
    elif dim == "s":
        out = parse_time(value)
    elif dim == "bytes":
        out = parse_bytes(value)
    elif dim == "usd":
        out = parse_count(value.strip().lstrip("$").replace(",", "") if isinstance(value, str) else value)
    else:
        out = parse_count(value)
    if not out > 0:
        raise ConfigError(f"{value!r} must be > 0")
    return out


def _metric_key(sec: _Section, key: str, kind: str, also: tuple[str, ...] = ()) -> str:
    """The result column a measured/expect ``key`` names; ``also`` = other keys allowed there."""
    col = canonical_metric(key)
    allowed = metric_columns(kind)
    if col not in allowed:
        names = allowed + tuple(a for a, c in _ALIASES.items() if c in allowed) + also
        if col in TRAINING_COLUMNS + INFERENCE_COLUMNS + COMMON_COLUMNS:
            raise sec.err(
                key, f"{key!r} is not a metric of a {kind} run (expected one of {', '.join(allowed)})"
            )
        raise sec.err(key, f"unknown key {key!r}{suggest(key, names)}")
    return col


def _measured(top: _Section, kind: str) -> tuple[dict[str, float], str, dict[str, str]]:
    if not top.has("measured"):
        return {}, "", {}
    raw = top.raw("measured")
    if not isinstance(raw, Mapping):
        raise top.err("measured", f"got {_what(raw)} (expected a mapping of result columns, plus source)")
    # metric keys are open-ended (result columns): check them one by one, so _Section allows all here
    sec = _Section(raw, top.file, "measured", tuple(str(k) for k in raw))
    values: dict[str, float] = {}
    for key in raw:
        if key in MEASURED_STRING_KEYS:
            continue
        col = _metric_key(sec, key, kind, MEASURED_STRING_KEYS)
        if col in values:
            raise sec.err(key, f"{col} is given twice (under {key!r} and an alias)")
        if col == "fits":
            raise sec.err(key, "fits is not a measurement (expected a numeric column)")
        try:
            values[col] = parse_metric_value(col, raw[key])
        except ConfigError as exc:
            raise sec.err(key, exc.message) from None
    if not values:
        raise top.err("measured", "gives no measured value (expected a result column such as step_time_s)")
    source = sec.text("source") if sec.has("source") else None
    if source is None or not source.strip():
        raise sec.err("source", "is required with measured values (expected the paper and table, or a URL)")
    notes: dict[str, str] = {}
    if any(c in values for c in FLOPS_METRICS) and not sec.has("flops_formula"):
        given = "/".join(c for c in FLOPS_METRICS if c in values)
        raise sec.err(
            "flops_formula",
            f"is required with {given} (expected the formula the source used: {', '.join(FLOPS_FORMULAS)})",
        )
    if sec.has("flops_formula"):
        notes["flops_formula"] = sec.choice("flops_formula", FLOPS_FORMULAS)
    if sec.has("peak"):
        peak = sec.quantity(
            "peak", parse_flop_rate, expected="the peak the source divided by, e.g. '989 TFLOP/s'"
        )
        notes["peak"] = repr(peak)
    if sec.has("notes"):
        notes["notes"] = sec.text("notes")
    return values, source, notes


def _tolerance_parser(col: str) -> Callable[[Any], float]:
    """An absolute tolerance: a plain number in the column's unit, or a unit string."""

    def parse(value: Any) -> float:
        if isinstance(value, str):
            return parse_metric_value(col, value)
        return float_number(value)

    return parse


def _expect(top: _Section, kind: str) -> dict[str, Expect]:
    if not top.has("expect"):
        return {}
    raw = top.raw("expect")
    if not isinstance(raw, Mapping):
        raise top.err("expect", f"got {_what(raw)} (expected a mapping: column: {{value, rel_tol}})")
    sec = _Section(raw, top.file, "expect", tuple(str(k) for k in raw))
    out: dict[str, Expect] = {}
    for key in raw:
        col = _metric_key(sec, key, kind)
        if col in out:
            raise sec.err(key, f"{col} is given twice (under {key!r} and an alias)")
        band = sec.section(key, EXPECT_KEYS, required=True, what="a mapping {value: ..., rel_tol: ...}")
        assert band is not None
        try:
            value = parse_metric_value(col, band.raw("value", hint="the expected value"))
        except ConfigError as exc:
            raise band.err("value", exc.message) from None
        if not band.has("rel_tol") and not band.has("abs_tol") and col != "fits":
            raise band.err("rel_tol", "is required (expected rel_tol, abs_tol or both)")
        rel = band.quantity("rel_tol", float_number, 0.0, inclusive=True, expected="a fraction, e.g. 0.05")
        abs_tol = band.quantity(
            "abs_tol",
            _tolerance_parser(col),
            0.0,
            inclusive=True,
            expected="a tolerance in the column's unit",
        )
        out[col] = Expect(value=value, rel_tol=rel, abs_tol=abs_tol)
    return out
