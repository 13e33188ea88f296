"""Compare page: two or more scenarios (bundled, uploaded, or what-ifs kept on the other pages)
side by side, with the change of each against the first (issue 6, item 4)."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # app/ (see app/Home.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import altair as alt
import pandas as pd
import streamlit as st
from explorer import cache, logic, widgets

from fmsim.export import csv_text

P = "compare"
ENGINES = {"discrete-event simulation": "des", "analytical estimate": "analytical"}
PREFERRED = ("examples/llama3-70b-p5.yaml", "examples/llama3.1-405b-p5en.yaml")
CHART_METRICS = (
    "step_time_s",
    "mfu",
    "tokens_per_s",
    "cost_usd",
    "time_to_train_s",
    "usd_per_hour",
    "ttft_p99_s",
    "tpot_p50_s",
    "output_tokens_per_s",
    "usd_per_million_output_tokens",
)

widgets.page_setup("Compare", ":material/compare_arrows:")


def sources() -> dict[str, tuple[str, str]]:
    """label -> (YAML text, file name in messages) of everything that can be compared."""
    out: dict[str, tuple[str, str]] = {}
    for label, (text, file) in st.session_state.get(widgets.SAVED_KEY, {}).items():
        out[label] = (text, file)
    for f in st.session_state.get(f"{P}.upload") or []:
        try:
            out[f"upload: {f.name}"] = (logic.decode_upload(f.name, f.getvalue()), f.name)
        except Exception as exc:  # noqa: BLE001
            st.error(logic.md_escape(exc))
    for b in cache.bundled():
        if b.kind in logic.TRAINING_KINDS + logic.SERVING_KINDS:
            out[b.label] = ("", b.label)  # read when picked
    return out


KEPT = ("picked", "engine", "chart")  # kept across page switches (widgets.restore)


def main() -> None:
    st.title("Compare scenarios")
    widgets.restore(P, KEPT)
    st.sidebar.file_uploader(
        "Load scenario YAMLs (at most 1 MiB each)",
        type=["yaml", "yml"],
        accept_multiple_files=True,
        key=f"{P}.upload",
    )
    st.sidebar.radio("Numbers from", list(ENGINES), key=f"{P}.engine")
    avail = sources()
    key = f"{P}.picked"
    if key not in st.session_state:
        kept = [k for k in avail if k.startswith(("what-if:", "upload:"))]
        st.session_state[key] = (kept + [p for p in PREFERRED if p in avail])[: max(2, len(kept))]
    else:
        st.session_state[key] = [k for k in st.session_state[key] if k in avail]
    picked = st.multiselect(
        "Scenarios (the first is the reference for the deltas)",
        list(avail),
        key=key,
        help="What-ifs kept with 'Keep for the Compare page' on the Training and Serving "
        "pages appear here, and so do uploads.",
    )
    widgets.keep(P, KEPT)
    if len(picked) < 2:
        st.info("Pick two or more scenarios to compare.")
        return
    engine = widgets.chosen_engine(P, ENGINES)
    runs, notes, plans = [], [], []
    with st.spinner("Simulating…"):
        for label in picked:
            text, file = avail[label]
            if not text:
                try:
                    text = cache.bundled_text(label)
                except Exception as exc:  # noqa: BLE001
                    st.error(logic.md_escape(f"{label}: {exc}"))
                    continue
            out = cache.any_kind(text, file, engine)
            if not out.ok:
                st.error(
                    f"**{logic.md_escape(label)}**: {logic.md_escape(out.error)}", icon=":material/block:"
                )
                if out.hint:
                    st.info(f"**What to change:** {logic.md_escape(out.hint)}", icon=":material/lightbulb:")
                continue
            runs.append((label, out.result))
            sc, _, _ = cache.base(text, file)
            plans.append(logic.plan_summary(sc, out.result) if sc is not None else {})
            if out.note:
                notes.append(f"{label}: {out.note}")
            elif out.engine != engine:
                notes.append(f"{label}: {out.engine}")
    if not runs:
        return
    st.session_state[f"{P}.table"] = logic.compare_table(runs, plans)
    st.dataframe(st.session_state[f"{P}.table"], hide_index=True, width="stretch")
    st.caption(f"Δ: the change against the first scenario, {picked[0]}; n/a where a plan (or the "
               "reference) cannot run as asked (does not fit, misses its SLOs, leaves requests unserved): "
               "its figures are no improvement.")
    for n in notes:
        st.warning(logic.md_escape(n), icon=":material/functions:")
    cols = [c for c in CHART_METRICS if any(logic.finite(r.get(c)) is not None for _, r in runs)]
    if cols:
        if st.session_state.get(f"{P}.chart") not in cols:
            st.session_state.pop(f"{P}.chart", None)
        col = st.selectbox("Chart", cols, format_func=logic.label_of, key=f"{P}.chart")
        widgets.keep(P, ("chart",))
        data = [{"scenario": label, "value": logic.chart_value(col, r.get(col))[0]} for label, r in runs]
        st.altair_chart(
            alt.Chart(pd.DataFrame(data))
            .mark_bar()
            .encode(
                x=alt.X("value:Q", title=logic.chart_value(col, None)[1]),
                y=alt.Y("scenario:N", sort=None, title=None, axis=alt.Axis(labelLimit=400)),
                tooltip=["scenario:N", alt.Tooltip("value:Q", format=".4~g")],
            )
            .properties(height=alt.Step(28)),
            width="stretch",
        )
    st.download_button(
        "Download the results (CSV)",
        csv_text([r.to_dict() for _, r in runs]),
        file_name="fmsim-compare.csv",
        mime="text/csv",
        on_click="ignore",
        key=f"{P}.dl_csv",
    )


main()
