"""Quantities with units, parsed once at the edge (DESIGN.md principle 1).

Inside fmsim every quantity is an SI float: seconds, bytes, FLOPs, bytes/s, FLOP/s, dollars.
This module turns the strings users and catalogs write (``"80 GiB"``, ``"3200 Gbps"``,
``"3.35 TB/s"``, ``"1.5 us"``, ``"15T"``, ``"989 TFLOP/s"``) into those floats, strictly:

* ``B`` is a byte and ``b`` a bit; ``Gbps``/``Gb/s`` are bits per second, ``GB/s``/``GBps`` bytes.
* ``K M G T P E`` are decimal (10^3k), ``Ki Mi Gi Ti Pi Ei`` binary (2^10k).
* A bare number is accepted and taken in the base unit of the dimension (bytes, s, FLOP/s ...).

:func:`format_quantity` is the one formatter every face uses (:func:`format_bytes` is its bytes form,
for messages: ``needs 85.3 GiB per GPU of 80 GiB``).
"""
from __future__ import annotations

import math
import numbers
import re

from .errors import UnitError

__all__ = [
    "DIMENSIONS",
    "format_bytes",
    "format_quantity",
    "parse_bytes",
    "parse_count",
    "parse_flop_rate",
    "parse_flops",
    "parse_quantity",
    "parse_rate",
    "parse_time",
]

_DEC = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
_NUM = r"([-+]?(?:\d+(?:_\d+)*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_QTY = re.compile(r"^\s*" + _NUM + r"\s*([A-Za-z/%µ]*(?:/[A-Za-z]+)?)\s*$")

_TIME = {
    "": 1.0, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3,
    "min": 60.0, "m": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}


def _split(text: object, dimension: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected a {dimension}, got a boolean {text!r}")
    if isinstance(text, numbers.Real):          # int, float, numpy scalars
        if not math.isfinite(float(text)):
            raise UnitError(f"expected a finite {dimension}, got {text!r}")
        return float(text), ""
    if not isinstance(text, str):
        raise UnitError(f"expected a {dimension} (number or string with unit), got {type(text).__name__}")
    m = _QTY.match(text)
    if not m:
        raise UnitError(f"cannot read {text!r} as a {dimension}")
    value = float(m.group(1).replace("_", ""))
    if not math.isfinite(value):                # "1e999 GB" overflows to inf
        raise UnitError(f"expected a finite {dimension}, got {text!r}")
    return value, m.group(2)


def _prefix(prefix: str, text: str, dimension: str) -> float:
    if prefix in _BIN:
        return _BIN[prefix]
    if prefix in _DEC:
        return _DEC[prefix]
    raise UnitError(f"unknown unit prefix {prefix!r} in {text!r} ({dimension})")


def parse_bytes(text: object) -> float:
    """Bytes from ``"80 GiB"``, ``"1.5 TB"``, ``"512 MiB"``, ``"400 Gb"`` (bits) or a number."""
    value, unit = _split(text, "size in bytes")
    if unit == "":
        return value
    m = re.fullmatch(r"([kKMGTPE]i?)?(B|b|bytes?|bits?)", unit)
    if not m:
        raise UnitError(f"cannot read {text!r} as a size (expected e.g. '80 GiB', '1.5 TB')")
    scale = _prefix(m.group(1) or "", str(text), "size")
    per = 0.125 if m.group(2) in ("b", "bit", "bits") else 1.0
    return value * scale * per


def parse_rate(text: object) -> float:
    """Bytes per second from ``"3200 Gbps"``, ``"400 Gb/s"``, ``"3.35 TB/s"``, ``"250 MB/s"``, ``"900 GBps"``."""
    value, unit = _split(text, "rate in bytes/s")
    if unit == "":
        return value
    m = re.fullmatch(r"([kKMGTPE]i?)?(B|b|bit)(?:/s|ps)", unit)
    if not m:
        raise UnitError(f"cannot read {text!r} as a rate (expected e.g. '3200 Gbps', '3.35 TB/s')")
    scale = _prefix(m.group(1) or "", str(text), "rate")
    per = 0.125 if m.group(2) in ("b", "bit") else 1.0
    return value * scale * per


def parse_time(text: object) -> float:
    """Seconds from ``"1.5 us"``, ``"30 min"``, ``"1000 h"``, ``"12.3 s"`` or a number of seconds."""
    value, unit = _split(text, "duration")
    if unit not in _TIME:
        raise UnitError(f"cannot read {text!r} as a duration (units: ns, us, ms, s, min, h, d)")
    return value * _TIME[unit]


def parse_count(text: object) -> float:
    """A plain count with an optional suffix: ``"15T"`` tokens, ``"16M"``, ``"2k"`` (decimal) or
    ``"16Mi"``, ``"4Ki"`` (binary: 2^24, 4096)."""
    value, unit = _split(text, "count")
    if unit in ("", "x"):
        return value
    if unit in ("B",):  # "405B" parameters reads as billions
        return value * 1e9
    if unit in _DEC:
        return value * _DEC[unit]
    if unit in _BIN:
        return value * _BIN[unit]
    raise UnitError(f"cannot read {text!r} as a count (expected e.g. '16M', '15T', '4Ki', '2048')")


def parse_flops(text: object) -> float:
    """FLOPs from ``"3.1e23"``, ``"5 EFLOP"`` or ``"5 EFLOPs"``."""
    value, unit = _split(text, "FLOP count")
    if unit == "":
        return value
    m = re.fullmatch(r"([kKMGTPE])?FLOPs?", unit)
    if not m:
        raise UnitError(f"cannot read {text!r} as a FLOP count")
    return value * _DEC[m.group(1) or ""]


def parse_flop_rate(text: object) -> float:
    """FLOP/s from ``"989 TFLOP/s"``, ``"989 TFLOPS"`` or a number of FLOP/s."""
    value, unit = _split(text, "FLOP/s rate")
    if unit == "":
        return value
    m = re.fullmatch(r"([kKMGTPE])?FLOP(?:/s|S|s)", unit)
    if not m:
        raise UnitError(f"cannot read {text!r} as a FLOP/s rate (expected e.g. '989 TFLOP/s')")
    return value * _DEC[m.group(1) or ""]


DIMENSIONS = {
    "bytes": parse_bytes,
    "bytes_per_s": parse_rate,
    "s": parse_time,
    "count": parse_count,
    "flop": parse_flops,
    "flop_per_s": parse_flop_rate,
}


def parse_quantity(text: object, dimension: str) -> float:
    """Parse ``text`` in ``dimension`` (a key of :data:`DIMENSIONS`)."""
    try:
        return DIMENSIONS[dimension](text)
    except KeyError:
        raise ValueError(f"unknown dimension {dimension!r}") from None


def _significant(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant figures, in positional notation: a number past the largest
    unit (8 years of training in days, 2,000 PiB) keeps its digits with separators rather than
    turning into ``2.91e+03``."""
    text = f"{value:.{digits}g}"
    return f"{value:,.0f}" if "e+" in text else text


def format_quantity(value: float, dimension: str, digits: int = 3) -> str:
    """Human form of an SI value: ``format_quantity(8.6e10, 'bytes') == '80.1 GiB'``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if dimension == "s":
        if value == 0:
            return "0 s"
        a = abs(value)
        for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3),
                            ("us", 1e-6), ("ns", 1e-9)):
            if a >= scale or unit == "ns":
                return f"{_significant(value / scale, digits)} {unit}"
    if dimension == "bytes":
        for unit, scale in (("PiB", 2.0**50), ("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20),
                            ("KiB", 2.0**10), ("B", 1.0)):
            if abs(value) >= scale or unit == "B":
                return f"{_significant(value / scale, digits)} {unit}"
    suffix = {"bytes_per_s": "B/s", "flop_per_s": "FLOP/s", "flop": "FLOP", "count": "", "usd": ""}.get(
        dimension, "")
    if dimension == "usd":
        return f"${value:,.2f}"
    for p, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0)):
        if abs(value) >= scale or p == "":
            return f"{_significant(value / scale, digits)} {p}{suffix}".strip()
    return str(value)  # pragma: no cover


def format_bytes(value: float) -> str:
    """A size in bytes in its human form, as messages write it: ``format_bytes(80 * 2**30) == '80 GiB'``,
    ``'85.3 GiB'``, ``'512 MiB'``, ``'1.21 TiB'`` (:func:`format_quantity`, dimension ``bytes``)."""
    return format_quantity(value, "bytes")
