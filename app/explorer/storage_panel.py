"""Storage and goodput panel of the Training page (issue 30): the file system's tier and size, the
checkpoint interval and mode as knobs, then the run's checkpoint write and downtime, the data-loading
stall, the expected interruptions and goodput with its spread, the storage dollars beside compute,
and goodput against the checkpoint interval (the simulated curve, Young's and the chosen interval).

It re-runs the Training page's what-if (``train.whatif_yaml``) through :mod:`explorer.cache` with the
analytical estimate (the figures here are the run's, not the step's) and its own overrides; a
scenario without a ``reliability:`` section gets Llama 3's fleet rates and a 15-minute restart
(said under the panel). Errors are shown with ``st.error``, never raised.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from . import cache, logic, widgets

P = "train.storage"
WHATIF = "train.whatif_yaml"
DEFAULT_RELIABILITY = {"fleet": "llama3-405b-h100", "restart": "15 min", "trials": 60}


def fsx_tiers() -> list[str]:
    """Catalog storage tiers a file system can be sized in (FSx with a per-TiB rate), then S3's."""
    cat = cache.catalog()
    fsx = sorted((t.throughput_per_tib_bytes_per_s, n) for n, t in cat.storage.items()
                 if t.kind == "fsx-lustre" and t.throughput_per_tib_bytes_per_s)
    return [n for _, n in fsx] + sorted(n for n, t in cat.storage.items() if t.kind != "fsx-lustre")


def overrides(base: Any, tier: str, capacity_tib: float, every_min: float, async_: bool) -> dict[str, Any]:
    """The panel's knobs as scenario overrides (dotted path -> value)."""
    kind = cache.catalog().storage_tier(tier).kind
    storage: dict[str, Any] = {"kind": kind, "tier": tier}
    if kind == "fsx-lustre":
        storage["capacity"] = f"{capacity_tib:g} TiB"
    out: dict[str, Any] = {"cluster.storage": storage}
    if base.checkpoint is not None:
        # the knobs' two keys only: the file's own grads, keep, staging and writers stay
        out.update({"checkpoint.every": f"{every_min:g} min", "checkpoint.async": bool(async_)})
    else:
        out["checkpoint"] = {"every": f"{every_min:g} min", "async": bool(async_)}
    if base.reliability is None:
        out["reliability"] = dict(DEFAULT_RELIABILITY)
    return out


def curve_chart(curve: list[list[float]], chosen_s: float, young_s: float | None) -> alt.LayerChart:
    data = pd.DataFrame([{"interval (min)": iv / 60.0, "goodput": g} for iv, g in curve])
    line = alt.Chart(data).mark_line(point=True).encode(
        x=alt.X("interval (min):Q", scale=alt.Scale(type="log")),
        y=alt.Y("goodput:Q", scale=alt.Scale(zero=False)),
        tooltip=[alt.Tooltip("interval (min):Q", format=".3~g"), alt.Tooltip("goodput:Q", format=".4f")])
    marks = [{"interval (min)": chosen_s / 60.0, "what": "chosen"}]
    if young_s:
        marks.append({"interval (min)": young_s / 60.0, "what": "Young"})
    rules = alt.Chart(pd.DataFrame(marks)).mark_rule(strokeDash=[4, 3]).encode(
        x="interval (min):Q", color=alt.Color("what:N", legend=alt.Legend(orient="bottom", title=None)))
    return alt.layer(line, rules)


def render() -> None:
    """The panel, under the Training page's what-if (nothing when the page has no valid what-if)."""
    text = st.session_state.get(WHATIF)
    if not text or not st.session_state.get("train.result"):
        return
    try:
        base = logic.load_base(text, "what-if")
    except Exception:  # noqa: BLE001 - the page above already shows the scenario's error
        return
    if base.workload.kind not in logic.TRAINING_KINDS:
        return
    st.subheader("Storage and goodput over the run")
    tiers = fsx_tiers()
    st_now = dict(base.cluster.storage or {})
    default_tier = st_now.get("tier") if st_now.get("tier") in tiers else "fsx-lustre-persistent-2-125"
    c1, c2, c3, c4 = st.columns(4)
    tier = c1.selectbox("File system tier", tiers, index=tiers.index(default_tier), key=f"{P}.tier")
    cap = widgets.number_knob(c2, "Capacity (TiB)", min_value=1.2, max_value=100_000.0,
                          value=float(st_now.get("capacity", 100 * 2**40)) / 2**40, step=10.0,
                          key=f"{P}.capacity", disabled=not tier.startswith("fsx"))
    every = widgets.number_knob(c3, "Checkpoint every (min)", min_value=1.0, max_value=10_000.0,
                            value=base.checkpoint.every_s / 60.0 if base.checkpoint else 30.0, step=5.0,
                            key=f"{P}.every")
    asyn = c4.checkbox("Asynchronous save", value=bool(base.checkpoint and base.checkpoint.async_),
                       key=f"{P}.async")
    knobs = overrides(base, tier, cap, every, asyn)
    with st.spinner("Replaying the run…"):
        out = cache.training(text, "what-if", logic.as_overrides(knobs), "analytical", None)
    if not out.ok:
        widgets.show_error(out.error, out.hint, out.error_kind)
        return
    m, ck = out.result.metrics, out.result.details.get("checkpoint", {})
    a, b, c, d = st.columns(4)
    a.metric("Checkpoint write", logic.fmt_time(m.get("checkpoint_write_s")),
             help="one full write of every rank's shard at once")
    b.metric("Downtime per checkpoint", logic.fmt_time(m.get("checkpoint_downtime_s")))
    c.metric("Expected interruptions", logic.fmt_count(m.get("expected_interruptions")),
             help=f"p10 {logic.fmt_count(ck.get('interruptions_p10'))}, "
                  f"p90 {logic.fmt_count(ck.get('interruptions_p90'))}")
    d.metric("Goodput", logic.fmt_pct(m.get("goodput")),
             help=f"p10 {logic.fmt_pct(m.get('goodput_p10'))}, p90 {logic.fmt_pct(m.get('goodput_p90'))}")
    e, f, g, h = st.columns(4)
    e.metric("Data-loading stall", logic.fmt_pct(m.get("data_stall_share")), help="share of the step")
    f.metric("Storage", logic.fmt_usd(m.get("storage_usd")),
             help="the file system over the run's wall-clock time")
    g.metric("Compute over the run", logic.fmt_usd(m.get("cost_usd")))
    h.metric("Wall-clock run", logic.fmt_time(m.get("time_to_train_s")),
             help="the useful time divided by the goodput")
    # the curve on request: the page's own charts come first, and the replay of the grid takes a moment
    if ck.get("interval_curve") and st.toggle("Goodput against the checkpoint interval", key=f"{P}.curve"):
        st.altair_chart(curve_chart(ck["interval_curve"], every * 60.0, ck.get("young_interval_s")),
                        width="stretch")
        st.caption(f"Mean goodput of the replayed run against the checkpoint interval; simulated best "
                   f"{logic.fmt_time(ck.get('best_interval_s'))}, "
                   f"Young {logic.fmt_time(ck.get('young_interval_s'))}, "
                   f"Daly {logic.fmt_time(ck.get('daly_interval_s'))}.")
    if base.reliability is None:
        st.caption("The scenario has no reliability section: interruptions at Llama 3's per-component fleet "
                   "rates (Table 5) with a 15-minute restart (assumed). docs/storage.md says how it is "
                   "simulated.")
