"""The what-if in a link: a page's bundled scenario, engine and changed knobs as query
parameters, and back (each value read as its knob's type and checked against what it takes).
Pure functions; :mod:`explorer.widgets` reads and writes ``st.query_params`` with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


URL_SCENARIO = "scenario"  # the bundled scenario's label
URL_ENGINE = "engine"  # "des" | "analytical"


def url_params(
    defaults: Mapping[str, Any], values: Mapping[str, Any], *, scenario: str | None, engine: str = "des"
) -> dict[str, str]:
    """The query parameters that reproduce a page: its bundled scenario, the engine when it is not
    the simulation, and every knob whose value differs from the scenario's (as text)."""
    out: dict[str, str] = {}
    if scenario:
        out[URL_SCENARIO] = scenario
    if engine != "des":
        out[URL_ENGINE] = engine
    for k, default in defaults.items():
        v = values.get(k, default)
        if v != default and v is not None:
            out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


@dataclass(frozen=True, slots=True)
class AtLeast:
    """The values a number knob takes (``v in AtLeast(1)``), for :func:`knobs_from_url`."""

    low: float
    high: float = math.inf

    def __contains__(self, v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and self.low <= v <= self.high


def knobs_from_url(
    defaults: Mapping[str, Any], params: Mapping[str, str], choices: Mapping[str, Sequence[Any]] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Knob values read back from query parameters, each as the type of its default (and one of
    its ``choices`` where the knob is a pick list); ``(values, ignored)``, ``ignored`` naming each
    parameter that is not a knob or not a value the knob takes (``tp=abc``)."""
    values: dict[str, Any] = {}
    ignored: list[str] = []
    for k, text in params.items():
        if k in (URL_SCENARIO, URL_ENGINE):
            continue
        if k not in defaults:
            ignored.append(f"{k}={text} (no such knob)")
            continue
        default = defaults[k]
        try:
            if isinstance(default, bool):
                if text not in ("true", "false"):
                    raise ValueError
                v: Any = text == "true"
            elif isinstance(default, int):
                v = int(text)
            elif isinstance(default, float):
                v = float(text)
                if not math.isfinite(v):
                    raise ValueError
            else:
                v = text
        except ValueError:
            want = "a whole number" if isinstance(default, int) else "a number"
            ignored.append(f"{k}={text} (expected {want})")
            continue
        opts = (choices or {}).get(k)
        if opts is not None and v not in opts:
            ignored.append(f"{k}={text} (not one of the knob's choices)")
            continue
        values[k] = v
    return values, ignored
