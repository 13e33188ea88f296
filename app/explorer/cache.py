"""Streamlit caching wrappers around :mod:`explorer.logic` (DESIGN.md habit 8: caches live in app/).

Every wrapper is keyed by immutable values only: the scenario's YAML text, the file label used in
messages, the knob overrides as a sorted tuple of ``(dotted.key, value)`` pairs, and the engine.
Same key, same frozen :class:`explorer.logic.Outcome` (fmsim is deterministic), so a knob moved
back to an earlier value re-renders from the cache at once.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

import fmsim

from . import logic

_RUNS = 256  # outcomes kept per wrapper (each is small: a timeline has at most ~4,000 rows)


@st.cache_resource(show_spinner=False)
def catalog() -> Any:
    """The hardware and model catalogs (``fmsim.load_catalog()``), loaded once per server."""
    return fmsim.load_catalog()


def bundled() -> tuple[logic.Bundled, ...]:
    """The bundled scenarios, re-read only when a file under ``scenarios/`` changes."""
    return _bundled(logic.bundled_signature())


@st.cache_data(show_spinner=False, max_entries=4)
def _bundled(signature: tuple) -> tuple[logic.Bundled, ...]:
    return logic.bundled_scenarios()


def bundled_text(label: str) -> str:
    """A bundled scenario's text, read each run (a millisecond; the runs are cached by this text)."""
    return logic.read_bundled(label)


@st.cache_data(show_spinner=False, max_entries=_RUNS)
def base(text: str, file: str) -> tuple[Any, str, str]:
    """``(scenario, error, hint)`` of the base scenario text; the scenario is None on error."""
    try:
        return logic.load_base(text, file), "", ""
    except Exception as exc:  # noqa: BLE001 - shown on the page, never raised
        out = logic.failure(exc, file=file)
        return None, out.error, out.hint


@st.cache_data(show_spinner=False, max_entries=_RUNS)
def training(
    text: str, file: str, overrides: tuple[tuple[str, Any], ...], engine: str, des_job_limit: int | None
) -> logic.Outcome:
    return logic.run_training(text, file, overrides, engine=engine, des_job_limit=des_job_limit)


@st.cache_data(show_spinner=False, max_entries=_RUNS)
def training_band(text: str, file: str, overrides: tuple[tuple[str, Any], ...]) -> tuple[float, float, str, int] | None:
    """The what-if's band (logic.training_band), or None where the what-if itself is refused."""
    try:
        return logic.training_band(text, file, overrides)
    except fmsim.FmsimError:
        return None


@st.cache_data(show_spinner=False, max_entries=_RUNS)
def serving(text: str, file: str, overrides: tuple[tuple[str, Any], ...], engine: str) -> logic.Outcome:
    return logic.run_serving(text, file, overrides, engine=engine)


@st.cache_data(show_spinner=False, max_entries=_RUNS)
def load_curve(text: str, file: str, overrides: tuple[tuple[str, Any], ...]) -> tuple[list[dict], str]:
    return logic.load_curve(text, file, overrides)


@st.cache_data(show_spinner=False, max_entries=_RUNS)
def any_kind(text: str, file: str, engine: str) -> logic.Outcome:
    return logic.run_any(text, file, engine=engine)
