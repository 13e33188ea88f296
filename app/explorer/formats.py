"""How the explorer shows numbers and text: times, bytes, counts, dollars and percentages for
people, result columns with their labels and chart units, changes against a base, and Markdown
escaping (every message renders as written). Pure functions, no widget, no simulation: sizes and counts go
through fmsim's one formatter (``fmsim.format_bytes`` / ``fmsim.format_quantity``); the
pages reach them through :mod:`explorer.logic`, which re-exports them.
"""

from __future__ import annotations

import math
import re
from typing import Any

import fmsim


def finite(x: Any) -> float | None:
    """``x`` as a float when it is a finite number, else None (None, inf, NaN, text)."""
    if isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def delta_text(a: Any, b: Any) -> str:
    """``+12.3 %`` from ``a`` to ``b`` (numbers), ``same``/``changed`` otherwise."""
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return "same" if a == b else "changed"
    fa, fb = finite(a), finite(b)
    if fa is None or fb is None:
        return "-"
    if fa == 0:
        return "same" if fb == 0 else "-"
    return f"{100 * (fb - fa) / abs(fa):+.1f} %"



# The unit each charted column is drawn in: (scale from the column's SI value, unit).
_CHART_UNITS = {
    "mfu": (100.0, "%"),
    "tokens_per_s": (1.0, "tokens/s"),
    "output_tokens_per_s": (1.0, "tokens/s"),
    "cost_usd": (1.0, "$"),
    "usd_per_hour": (1.0, "$/h"),
    "usd_per_million_output_tokens": (1.0, "$ per M tokens"),
    "time_to_train_s": (1 / 86400.0, "days"),
}


def chart_value(col: str, v: Any) -> tuple[float | None, str]:
    """A column's value in the unit its chart axis shows, and the axis title with the unit
    (``Step time (s)``, ``MFU (%)``, ``Time to train (days)``)."""
    scale, unit = _CHART_UNITS.get(col, (1.0, "s" if col.endswith("_s") else ""))
    x = finite(v)
    title = f"{label_of(col)} ({unit})" if unit else label_of(col)
    return (None if x is None else x * scale), title


# ----------------------------------------------------------------------------------------------
# formats (what the pages show; tests compare with these)

# Characters that change how Streamlit's Markdown shows a message mid-line: CommonMark's
# emphasis, code, links and HTML, GitHub's tables and strike-through, Streamlit's LaTeX ($) and
# colour directives (:red[..]). Each is ASCII punctuation, which CommonMark lets a backslash
# escape, so the escaped text renders exactly as written. (Messages start with a file name, so
# the line-start markers -, +, #, 1. never occur where they would count.)
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>$~|])")


def article(word: str) -> str:
    """"an" before a vowel sound (an inference, an RL run), else "a"."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def md_escape(text: Any) -> str:
    """``text`` escaped for ``st.error``/``st.info``/``st.markdown``: shown as written
    (``dp*micro_batch = 3*1 = 3`` keeps its stars, ``ep_size`` its underscore)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", str(text)).replace("\n", "  \n")


_LABELS = {
    "gpus": "GPUs",
    "step_time_s": "Step time",
    "mfu": "MFU",
    "tokens_per_s": "Tokens/s",
    "memory_per_gpu_bytes": "Memory per GPU",
    "fits": "Fits in HBM",
    "usd_per_hour": "Cluster $/h",
    "time_to_train_s": "Time to train",
    "cost_usd": "Cost to train",
    "bottleneck": "Bottleneck",
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "TTFT p99",
    "tpot_p50_s": "TPOT p50",
    "tpot_p99_s": "TPOT p99",
    "e2e_p50_s": "E2E p50",
    "e2e_p99_s": "E2E p99",
    "output_tokens_per_s": "Output tokens/s",
    "requests_per_s": "Requests/s",
    "usd_per_million_output_tokens": "$ per M output tokens",
    "usd_per_query": "$ per answered question",
}


def label_of(col: str) -> str:
    return _LABELS.get(col, col)


def fmt_time(s: Any) -> str:
    """Seconds for people: ``15.6 s``, ``8.61 ms``, ``3.2 h``, ``98.4 d``, ``7.08 years``."""
    v = finite(s)
    if v is None:
        return "-" if s is None else ("unbounded" if s == math.inf else "-")
    a = abs(v)
    if a >= 365.25 * 86400:
        return f"{v / (365.25 * 86400):.3g} years"
    for unit, scale in (
        ("d", 86400.0),
        ("h", 3600.0),
        ("min", 60.0),
        ("s", 1.0),
        ("ms", 1e-3),
        ("µs", 1e-6),
        ("ns", 1e-9),
    ):
        if a >= scale or unit == "ns":
            return f"{v / scale:.3g} {unit}" if v else "0 s"
    return f"{v:g} s"  # pragma: no cover


def fmt_bytes(b: Any) -> str:
    """A size as every face writes it (``fmsim.format_bytes``: ``80 GiB``, ``85.3 GiB``, ``512 MiB``)."""
    v = finite(b)
    return "-" if v is None else fmsim.format_bytes(v)


def fmt_pair(a: Any, b: Any) -> str:
    """Two times, sharing the unit when they can: ``12.5 / 14.9 ms``, ``45 ms / 1.2 s``."""
    ta, tb = fmt_time(a), fmt_time(b)
    ua, ub = ta.rpartition(" ")[2], tb.rpartition(" ")[2]
    if " " in ta and ua == ub:
        return f"{ta.rpartition(' ')[0]} / {tb}"
    return f"{ta} / {tb}"


def fmt_fit(need: Any, have: Any) -> str:
    """Memory needed against memory there: ``53.1 / 80 GiB``."""
    n, h = finite(need), finite(have)
    if n is None:
        return "-"
    if h is None:
        return fmt_bytes(n)
    tn, th = fmt_bytes(n), fmt_bytes(h)
    if tn.rpartition(" ")[2] == th.rpartition(" ")[2]:
        return f"{tn.rpartition(' ')[0]} / {th}"
    return f"{tn} / {th}"


def fmt_usd(x: Any) -> str:
    v = finite(x)
    if v is None:
        return "no price"
    if abs(v) >= 1e6:
        return f"${v / 1e6:,.2f} M"
    if abs(v) >= 1:
        return f"${v:,.2f}"
    return f"${v:.4g}"


def fmt_count(x: Any, unit: str = "") -> str:
    v = finite(x)
    if v is None:
        return "-"
    text = fmsim.format_quantity(v, "count")     # one helper for every face: ``1.23 k``, ``45.6 M``, ``512``
    return f"{text}{unit}" if text[-1:].isalpha() else f"{text} {unit}".rstrip()


def fmt_pct(x: Any) -> str:
    v = finite(x)
    return "-" if v is None else f"{100 * v:.1f} %"


def fmt_column(col: str, v: Any) -> str:
    """A result column as the pages show it (units from the name)."""
    if v is None:
        return "-"
    if col == "fits" or isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    if col in ("mfu", "hfu") or col.startswith("kv_utilization") or col.endswith("_fraction"):
        return fmt_pct(v)
    if col.startswith("usd") or col.endswith("usd"):
        return fmt_usd(v)
    if col.endswith("_per_s"):
        return fmt_count(v, "/s")
    if col.endswith("_bytes"):
        return fmt_bytes(v)
    if col.endswith("_s"):
        return fmt_time(v)
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def fmt_tokens(x: float | None) -> str:
    """A token count as the scenario files write it (``15T``, ``1.5T``, ``300B`` -> ``300G``)."""
    if x is None:
        return ""
    for p, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{p}"
    return f"{x:g}"
