"""Widgets and page pieces the explorer's pages share: where the scenario comes from, knob state,
errors with what to change, downloads, the what-ifs kept for the Compare page.

Knob state: every knob has a session-state key ``<page>.<knob>``, seeded from the base scenario
when the base changes (a new bundled pick or upload) and restored when the page is visited again
(Streamlit forgets the state of widgets that were not drawn in a run).
"""

from __future__ import annotations

import math

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import streamlit as st
import yaml

import fmsim

from . import cache, logic

SAVED_KEY = "compare.saved"  # {label: (yaml_text, file)} kept for the Compare page


BUNDLED, UPLOADED = "bundled", "uploaded"
# widget keys (after the page prefix) kept across page switches: Streamlit drops the state of a
# widget that a run did not draw, so each page copies these to a shadow key and restores them
KEPT = ("bundled", "from", "engine", "force_des")


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """The base scenario of a page: its label (file name in messages), YAML text and origin
    (the bundled picker or an uploaded file)."""

    label: str
    text: str
    origin: str = BUNDLED
    other: str = ""  # the choice not in use (the bundled pick while an upload is used)

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.label}\0{self.text}".encode()).hexdigest()[:16]

    def line(self, description: str) -> str:
        """Says which scenario the page uses (Markdown)."""
        what = "uploaded file" if self.origin == UPLOADED else "bundled scenario"
        out = f"Scenario in use: {what} **{logic.md_escape(self.label)}** — {logic.md_escape(description)}"
        if self.other:
            out += f" (the bundled pick {logic.md_escape(self.other)} is not in use)"
        return out


def page_setup(title: str, icon: str = "") -> None:
    st.set_page_config(page_title=f"fmsim · {title}", page_icon=icon or None, layout="wide")


def restore(prefix: str, names: tuple[str, ...] = KEPT) -> None:
    """Put back the kept widgets' values Streamlit dropped while another page ran."""
    ss = st.session_state
    for name in names:
        key = f"{prefix}.{name}"
        if key not in ss and f"_kept.{key}" in ss:
            ss[key] = ss[f"_kept.{key}"]


def keep(prefix: str, names: tuple[str, ...] = KEPT) -> None:
    ss = st.session_state
    for name in names:
        key = f"{prefix}.{name}"
        if key in ss:
            ss[f"_kept.{key}"] = ss[key]


def link_params(prefix: str) -> dict[str, str]:
    """The query parameters the page was opened with, on the first run of the page in a session
    (a reload starts a new one), else {}: a link's what-if applies once, then the knobs rule."""
    ss = st.session_state
    k = f"{prefix}._url"
    if k in ss:
        return {}
    ss[k] = {name: st.query_params.get(name) for name in st.query_params}
    return ss[k]


def _use(from_key: str, origin: str) -> None:
    st.session_state[from_key] = origin


def scenario_source(prefix: str, kinds: tuple[str, ...], *, what: str, preferred: str = "") -> Source | None:
    """Sidebar: a bundled scenario of one of ``kinds`` (``preferred`` first picked) or an uploaded
    YAML. One of the two is in use, never both: a new upload takes over, picking a bundled
    scenario takes over again, and a radio (shown once a file was uploaded) says which is used."""
    ss = st.session_state
    restore(prefix)
    params = link_params(prefix)
    st.sidebar.subheader("Scenario")
    try:
        choices = [b.label for b in cache.bundled() if b.kind in kinds]
    except Exception as exc:  # noqa: BLE001
        st.sidebar.error(logic.md_escape(f"cannot list the bundled scenarios: {exc}"))
        choices = []
    key, from_key, stored_key = f"{prefix}.bundled", f"{prefix}.from", f"{prefix}._uploaded"
    if params.get(logic.URL_SCENARIO) in choices:  # a link of this page (another page's is ignored)
        ss[key] = params[logic.URL_SCENARIO]
        ss[from_key] = BUNDLED
        ss[f"{prefix}._url_pending"] = True  # its knobs apply when the scenario is seeded
        engine = {"des": "discrete-event simulation", "analytical": "analytical estimate"}.get(
            params.get(logic.URL_ENGINE, "")
        )
        if engine:
            ss[f"{prefix}.engine"] = engine
    if choices:
        if ss.get(key) not in choices:
            ss[key] = preferred if preferred in choices else choices[0]
        st.sidebar.selectbox(
            f"Bundled {what} scenario", choices, key=key, on_change=_use, args=(from_key, BUNDLED)
        )
    else:
        st.sidebar.info(f"No bundled {what} scenario in this installation: load a YAML file.")
    up = st.sidebar.file_uploader(
        "…or load a scenario YAML (at most 1 MiB)",
        type=["yaml", "yml"],
        key=f"{prefix}.upload",
        help="A scenario file of schema version 1; see README.md. A new upload is used at once; "
        "pick a bundled scenario to go back.",
    )
    if up is not None:
        ident = (up.name, up.size, getattr(up, "file_id", ""))
        if ss.get(f"{prefix}._upload_id") != ident:
            ss[f"{prefix}._upload_id"] = ident
            try:
                ss[stored_key] = (up.name, logic.decode_upload(up.name, up.getvalue()))
                ss[from_key] = UPLOADED
                ss.pop(f"{prefix}._upload_error", None)
            except fmsim.FmsimError as exc:
                ss[f"{prefix}._upload_error"] = str(exc)
        if ss.get(f"{prefix}._upload_error"):
            st.sidebar.error(logic.md_escape(ss[f"{prefix}._upload_error"]))
    stored = ss.get(stored_key)
    if stored:
        if ss.get(from_key) not in (BUNDLED, UPLOADED):
            ss[from_key] = UPLOADED
        bundled_pick = ss.get(key, "")
        st.sidebar.radio(
            "Scenario in use",
            [BUNDLED, UPLOADED],
            key=from_key,
            format_func=lambda o: f"bundled: {bundled_pick}" if o == BUNDLED else f"uploaded: {stored[0]}",
            disabled=not choices,
        )
    keep(prefix)
    if stored and (ss.get(from_key) == UPLOADED or not choices):
        other = ss.get(key, "") if choices else ""
        return Source(label=stored[0], text=stored[1], origin=UPLOADED, other=other)
    if not choices:
        return None
    label = ss[key]
    try:
        return Source(label=label, text=cache.bundled_text(label))
    except Exception as exc:  # noqa: BLE001
        st.sidebar.error(logic.md_escape(exc))
        return None


def show_error(error: str, hint: str, kind: str = "") -> None:
    """An error of the API inside the page: the message, then what to change (never a traceback)."""
    if kind == "NotBuiltError":
        st.info(f"This simulator is not available yet: {logic.md_escape(error)}")
        return
    st.error(logic.md_escape(error), icon=":material/block:")
    if hint:
        st.info(f"**What to change:** {logic.md_escape(hint)}", icon=":material/lightbulb:")


def base_scenario(source: Source, kinds: tuple[str, ...], other_page: str) -> Any | None:
    """The picked scenario, loaded through the cache, or None after saying in the page why not
    (a load error with its hint, or a scenario of a kind another page handles)."""
    sc, err, hint = cache.base(source.text, source.label)
    if sc is None:
        show_error(err, hint)
        return None
    if sc.workload.kind not in kinds:
        kind = sc.workload.kind
        st.warning(
            f"{logic.md_escape(source.label)} is {logic.article(kind)} `{kind}` scenario: open it on the "
            f"{other_page} page."
        )
        return None
    return sc


def engine_choice(prefix: str, engines: Mapping[str, str], help: str) -> None:
    """The sidebar's "numbers from" radio: the discrete-event simulation or the estimate."""
    st.sidebar.subheader("Engine")
    st.sidebar.radio("Numbers from", list(engines), key=f"{prefix}.engine", help=help)


def chosen_engine(prefix: str, engines: Mapping[str, str]) -> str:
    return engines[st.session_state.get(f"{prefix}.engine") or "discrete-event simulation"]


def knob_scenario(prefix: str, source: Source, kinds: tuple[str, ...], other_page: str,
                  knob_defaults: Any, draw_knobs: Any,
                  knob_choices: Any = None) -> tuple[Any, dict[str, Any]] | None:
    """Load the base scenario, seed its knobs (from the page's link on the first visit), draw
    them, keep their state and write the what-if into the page's link; (scenario, defaults), or
    None when the page has said why it cannot (see :func:`base_scenario`). ``knob_choices(defaults,
    cat)`` gives the pick lists a link's value must be one of."""
    sc = base_scenario(source, kinds, other_page)
    if sc is None:
        return None
    cat = cache.catalog()
    defaults = knob_defaults(sc, cat)
    seed_knobs(prefix, source, defaults, knob_choices(defaults, cat) if knob_choices else None)
    ignored = st.session_state.pop(f"{prefix}._url_ignored", None)
    if ignored:
        st.warning(
            "The link's " + logic.md_escape("; ".join(ignored)) + ": ignored.", icon=":material/link_off:"
        )
    draw_knobs(defaults, cat)
    save_knobs(prefix, list(defaults))
    write_link(prefix, source, defaults)
    return sc, defaults


def write_link(prefix: str, source: Source, defaults: Mapping[str, Any]) -> None:
    """Put the what-if in the address bar (``?scenario=...&tp=4``), so that a reload or a link
    sent to a colleague reproduces the page; an uploaded file cannot travel in a link."""
    ss = st.session_state
    if source.origin != BUNDLED:
        want: dict[str, str] = {}
    else:
        values = {k: ss.get(f"{prefix}.{k}") for k in defaults}
        engine = "analytical" if ss.get(f"{prefix}.engine") == "analytical estimate" else "des"
        want = logic.url_params(defaults, values, scenario=source.label, engine=engine)
    if {k: st.query_params.get(k) for k in st.query_params} != want:
        st.query_params.from_dict(want)


def seed_knobs(
    prefix: str, source: Source, defaults: Mapping[str, Any], choices: Mapping[str, Any] | None = None
) -> None:
    """Put the base scenario's values into the knobs' session state (see module docstring)."""
    ss = st.session_state
    base_key, saved_key = f"{prefix}._base", f"{prefix}._saved"
    if ss.get(base_key) != source.key:
        for k, v in defaults.items():
            ss[f"{prefix}.{k}"] = v
        ss[base_key] = source.key
        ss[saved_key] = dict(defaults)
        if ss.pop(f"{prefix}._url_pending", False) and source.origin == BUNDLED:
            values, ignored = logic.knobs_from_url(defaults, ss.get(f"{prefix}._url", {}), choices)
            for k, v in values.items():
                ss[f"{prefix}.{k}"] = v
            ss[saved_key] = {**defaults, **values}
            ss[f"{prefix}._url_ignored"] = ignored
        return
    saved = ss.get(saved_key, {})
    for k, v in defaults.items():
        if f"{prefix}.{k}" not in ss:
            ss[f"{prefix}.{k}"] = saved.get(k, v)


def save_knobs(prefix: str, names: list[str]) -> None:
    st.session_state[f"{prefix}._saved"] = {k: st.session_state.get(f"{prefix}.{k}") for k in names}


def reset_button(prefix: str, defaults: Mapping[str, Any]) -> None:
    def reset() -> None:
        for k, v in defaults.items():
            st.session_state[f"{prefix}.{k}"] = v

    st.sidebar.button("Reset knobs to the scenario", key=f"{prefix}.reset", on_click=reset, width="stretch")


INLINE = " (inline, from the scenario)"  # a model knob's value when the scenario defines its own model
FIXED = "fixed price from the scenario"  # a pricing knob's value when the scenario gives usd_per_hour


def model_options(defaults: Mapping[str, Any], cat: Any) -> list[str]:
    """The Model knob's choices: the catalog's models, the scenario's inline model first."""
    models = sorted(cat.models)
    return [defaults["model"], *models] if str(defaults["model"]).endswith(INLINE) else models


def pricing_options(defaults: Mapping[str, Any]) -> list[str]:
    return list(logic.PRICING_OPTIONS) + ([FIXED] if defaults["pricing"] == FIXED else [])


def shared_choices(defaults: Mapping[str, Any], cat: Any, tp_options: list[int]) -> dict[str, Any]:
    """What the knobs both pages have take, for a value read from a link (see logic.knobs_from_url)."""
    return {
        "model": model_options(defaults, cat),
        "instance": sorted(cat.instances),
        "precision": with_options(list(logic.PRECISIONS), defaults["precision"]),
        "pricing": pricing_options(defaults),
        "tp": with_options(tp_options, defaults["tp"]),
        "nodes": logic.AtLeast(1, 100_000),
        "ep": logic.AtLeast(1, 1024),
    }


def name_knob(prefix: str) -> None:
    st.sidebar.text_input(
        "What-if name",
        key=f"{prefix}.name",
        placeholder="the scenario's name + '-whatif'",
        help="The name inside the downloaded or kept what-if; empty: the base scenario's name, with "
        "'-whatif' once a knob moves.",
    )


def model_and_price(prefix: str, defaults: Mapping[str, Any], cat: Any) -> None:
    """The sidebar's model, precision and pricing knobs (Training and Serving)."""
    sb = st.sidebar
    sb.markdown("**Model and price**")
    sb.selectbox("Model", model_options(defaults, cat), key=f"{prefix}.model")
    c1, c2 = sb.columns([2, 3])  # the pricing names ("savings-plan-3yr") need the wider half
    c1.selectbox(
        "Precision", with_options(list(logic.PRECISIONS), defaults["precision"]), key=f"{prefix}.precision"
    )
    c2.selectbox("Pricing", pricing_options(defaults), key=f"{prefix}.pricing")


def flow(v: Any) -> str:
    """A raw scenario value as the text a knob shows (YAML flow for mappings and lists)."""
    if v is None:
        return ""
    if isinstance(v, (Mapping, list)):
        return yaml.safe_dump(v, default_flow_style=True, sort_keys=False).strip()
    return str(v)


def with_options(options: list[Any], value: Any) -> list[Any]:
    """``options`` with ``value`` added (sorted in) when the base scenario uses another one."""
    if value in options:
        return options
    try:
        return sorted([*options, value])
    except TypeError:
        return [*options, value]


def downloads(prefix: str, outcome: logic.Outcome, name: str) -> None:
    """Download the what-if as YAML (loads back identically) and its result as CSV."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "whatif"
    c1, c2, c3 = st.columns(3)
    c1.download_button(
        "Download the what-if (YAML)",
        outcome.yaml_text,
        file_name=f"{safe}.yaml",
        mime="application/x-yaml",
        key=f"{prefix}.dl_yaml",
        disabled=not outcome.yaml_text,
        on_click="ignore",
        width="stretch",
    )
    c2.download_button(
        "Download the results (CSV)",
        outcome.csv(),
        file_name=f"{safe}.csv",
        mime="text/csv",
        key=f"{prefix}.dl_csv",
        disabled=not outcome.ok,
        on_click="ignore",
        width="stretch",
    )
    c3.button(
        "Keep for the Compare page",
        key=f"{prefix}.keep",
        disabled=not outcome.yaml_text,
        on_click=keep_for_compare,
        args=(name, outcome.yaml_text),
        width="stretch",
    )


def scenario_footer(prefix: str, outcome: logic.Outcome, name: str) -> None:
    """A page's last lines: the downloads, then the what-if as a scenario file."""
    downloads(prefix, outcome, name)
    with st.expander("The what-if as a scenario file"):
        st.code(outcome.yaml_text, language="yaml")


def engine_caption(engine: str, extra: str = "", after: str = "") -> None:
    """``Numbers from the <engine><extra>.<after>``: which engine gave the numbers on the page."""
    line = (
        "discrete-event simulation (`fmsim run`)"
        if engine == "des"
        else "analytical estimate (`fmsim run --estimate`)"
    )
    st.caption(f"Numbers from the {line}{extra}.{after}")


def keep_for_compare(name: str, yaml_text: str) -> None:
    saved: dict[str, tuple[str, str]] = dict(st.session_state.get(SAVED_KEY, {}))
    label = f"what-if: {name}"
    n = 2
    while label in saved and saved[label][0] != yaml_text:
        label = f"what-if: {name} #{n}"
        n += 1
    saved[label] = (yaml_text, f"{name}.yaml")
    st.session_state[SAVED_KEY] = saved
    st.toast(f"Kept '{label}' for the Compare page")


def metric(
    col: Any,
    label: str,
    value: str,
    delta: str | None = None,
    *,
    lower_is_better: bool = False,
    help: str | None = None,
    infeasible: bool = False,
) -> None:
    """One figure with its change against the base; an ``infeasible`` plan's changes are grey
    (a plan that cannot run is never "better")."""
    colour = "off" if infeasible else ("inverse" if lower_is_better else "normal")
    col.metric(label, value, delta=delta, delta_color=colour, help=help)


METRICS_PER_ROW = 3  # four a row truncate "52.3 / 269 ms" and "49.5 / 80 GiB" on a 1280-pixel screen


def metric_columns(n: int, per_row: int = METRICS_PER_ROW) -> list[Any]:
    """``n`` columns for figures, laid out ``per_row`` a row (wide enough for their values)."""
    cols: list[Any] = []
    while len(cols) < n:
        cols += list(st.columns(per_row))
    return cols[:n]


def infeasible_banner(reason: str) -> None:
    """Said above the figures of a plan that cannot run as asked."""
    st.error(
        f"**Infeasible plan:** {logic.md_escape(reason)}. The figures below are what it would take, "
        "not an improvement: their changes are greyed.",
        icon=":material/dangerous:",
    )


def number_knob(col: Any, label: str, *, key: str, min_value: Any = None, max_value: Any = None,
                **kwargs: Any) -> Any:
    """``col.number_input`` whose range also holds the value it starts from (``value=``, or what the base
    scenario seeded under ``key``): the scenario reader's bounds, not a widget's, decide what a file may
    hold, and a widget handed a value outside its range raised (a 10-day checkpoint interval on a
    10,000-minute knob, 2,000 samples on a 1,024 one)."""
    v = kwargs.get("value", st.session_state.get(key))
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        if max_value is not None and v > max_value:
            max_value = type(max_value)(math.ceil(v)) if isinstance(max_value, int) else float(v)
        if min_value is not None and v < min_value:
            min_value = type(min_value)(math.floor(v)) if isinstance(min_value, int) else float(v)
    return col.number_input(label, min_value=min_value, max_value=max_value, key=key, **kwargs)


def base_infeasible_caption(reason: str) -> None:
    """Said above the figures when the base (not the what-if) cannot run: its changes are greyed."""
    st.caption(f"Changes greyed: {logic.md_escape(reason)}.")


def delta(base: Any, new: Any) -> str | None:
    """The metric delta against the base scenario (None when equal or not comparable)."""
    text = logic.delta_text(base, new)
    if text in ("same", "-", "+0.0 %", "-0.0 %"):
        return None
    return text
