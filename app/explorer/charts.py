"""Altair charts of the explorer: plain rows in (from :mod:`explorer.logic`), a chart out.

Owns how each picture looks: the step-time breakdown and memory per GPU as stacked bars, the
pipeline timeline (Gantt), latency CDFs and the serving load curve. No fmsim call, no widget.

Data travels as DataFrames: Streamlit then ships it as Arrow beside the chart spec instead of
inlining (and schema-validating) every row, which is ten times faster for a 3,000-span timeline.

Heights: Streamlit fits a chart into its given height *including* axes and legend, so charts
with a discrete y axis size by step (``alt.Step``) and the others get a generous total height.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import pandas as pd

# One colour per part everywhere (breakdown and timeline share compute/communication hues).
PART_COLOURS = {
    "compute": "#4c78a8",
    "forward": "#4c78a8",
    "backward": "#72b7b2",
    "recompute": "#9ecae9",
    "comm_tp": "#f58518",
    "comm_cp": "#ffbf79",
    "comm_ep": "#e45756",
    "comm_offload": "#9d755d",
    "comm_dp": "#54a24b",
    "comm_pp": "#b279a2",
    "dp": "#54a24b",
    "pp": "#b279a2",
    "bubble": "#bab0ac",
    "optimizer": "#eeca3b",
    "weights": "#4c78a8",
    "gradients": "#72b7b2",
    "activations": "#f58518",
    "logits": "#ffbf79",
    "kv_cache": "#e45756",
    "queue": "#bab0ac",
    "prefill": "#f58518",
    "decode": "#4c78a8",
    "linear": "#4c78a8",
    "attention_decode": "#e45756",
    "attention_prefill": "#ff9da6",
    "kv_write": "#9d755d",
    "communication": "#f58518",
    "overhead": "#bab0ac",
}


def _legend(columns: int = 4) -> alt.Legend:
    """Below the chart, ``columns`` entries a row, labels never cut short (altair cuts at 160 px)."""
    return alt.Legend(orient="bottom", title=None, columns=columns, labelLimit=0)


def _scale(parts: Sequence[str]) -> alt.Scale:
    domain = list(dict.fromkeys(parts))
    fallback = ["#9d755d", "#ff9da6", "#79706e", "#d67195", "#b6992d", "#499894"]
    rng = [PART_COLOURS.get(p, fallback[i % len(fallback)]) for i, p in enumerate(domain)]
    return alt.Scale(domain=domain, range=rng)


def breakdown_bar(
    rows: list[dict[str, Any]],
    x_title: str = "seconds per step",
    *,
    scale: alt.Scale | None = None,
    legend_columns: int = 4,
) -> alt.Chart:
    """Stacked horizontal bars: seconds of each part, one bar per run (base, what-if). A fixed
    ``scale`` (domain and colours) also fixes the stacking order; otherwise parts stack as they come."""
    parts = list(scale.domain) if scale is not None else list(dict.fromkeys(r["part"] for r in rows))
    runs = list(dict.fromkeys(r["run"] for r in rows))  # base first, then the what-if, always
    data = [{**r, "order": parts.index(r["part"])} for r in rows]
    return (
        alt.Chart(pd.DataFrame(data))
        .mark_bar()
        .encode(
            x=alt.X("seconds:Q", title=x_title, stack="zero"),
            y=alt.Y("run:N", title=None, sort=runs, axis=alt.Axis(labelLimit=0)),
            color=alt.Color(
                "part:N",
                scale=scale if scale is not None else _scale(parts),
                legend=_legend(legend_columns),
            ),
            order=alt.Order("order:Q"),
            tooltip=["run:N", "part:N", alt.Tooltip("seconds:Q", format=".4~g")],
        )
        .properties(height=alt.Step(30))
    )


def memory_bar(rows: list[dict[str, Any]], hbm_bytes: float | None) -> alt.LayerChart | alt.Chart:
    """Stacked bars of GiB per GPU by part (one bar per pipeline stage) against the HBM line."""
    data = [{**r, "GiB": r["bytes"] / 2**30} for r in rows]
    parts = [r["part"] for r in rows]
    bars = (
        alt.Chart(pd.DataFrame(data))
        .mark_bar()
        .encode(
            x=alt.X("stage:N", title=None, sort=None),
            y=alt.Y("GiB:Q", title="GiB per GPU", stack="zero"),
            color=alt.Color(
                "part:N", scale=_scale(parts), legend=_legend()
            ),
            tooltip=["stage:N", "part:N", alt.Tooltip("GiB:Q", format=".2f")],
        )
    )
    if not hbm_bytes:
        return bars.properties(height=320)
    what = f"HBM {hbm_bytes / 2**30:.0f} GiB per GPU"
    line = (
        alt.Chart(pd.DataFrame([{"GiB": hbm_bytes / 2**30, "what": what}]))
        .mark_rule(color="#d62728", strokeDash=[6, 3], size=2)
        .encode(y="GiB:Q", tooltip=["what:N", alt.Tooltip("GiB:Q", format=".1f")])
    )
    # the line's label in the axis title: a text layer would cost ~0.1 s of chart building a render
    bars = bars.encode(y=alt.Y("GiB:Q", title=f"GiB per GPU (red dashed line: {what})", stack="zero"))
    return alt.layer(bars, line).properties(height=320)


def timeline(
    rows: Sequence[tuple[str, float, float, str, str]],
    *,
    x_title: str = "seconds into the step",
    scale: alt.Scale | None = None,
    legend_columns: int = 4,
    lane_px: int = 20,
) -> alt.Chart:
    """A Gantt of ``(lane, start_s, end_s, category, label)`` spans: on the training page one lane per
    stage's compute and communication streams, on the RL page one per GPU pool (``scale`` fixes the
    categories' colours)."""
    data = pd.DataFrame(list(rows), columns=["lane", "start_s", "end_s", "category", "label"])
    lanes = list(dict.fromkeys(r[0] for r in rows))
    cats = [r[3] for r in rows]
    return (
        alt.Chart(data)
        .mark_bar(height={"band": 0.8})
        .encode(
            x=alt.X("start_s:Q", title=x_title),
            x2="end_s:Q",
            y=alt.Y("lane:N", title=None, sort=lanes),
            color=alt.Color(
                "category:N",
                scale=scale if scale is not None else _scale(cats),
                legend=_legend(legend_columns),
            ),
            tooltip=[
                "lane:N",
                "label:N",
                alt.Tooltip("start_s:Q", format=".4~g"),
                alt.Tooltip("end_s:Q", format=".4~g"),
            ],
        )
        .properties(height=alt.Step(lane_px))
    )


def latency_cdf(points: list[dict[str, Any]]) -> alt.Chart:
    """Latency CDFs (TTFT, TPOT, end-to-end), log latency axis."""
    return (
        alt.Chart(pd.DataFrame(points))
        .mark_line(point=True, interpolate="step-after")
        .encode(
            x=alt.X("latency_s:Q", title="latency (s)", scale=alt.Scale(type="log")),
            y=alt.Y("quantile:Q", title="fraction of requests", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("metric:N", legend=_legend()),
            tooltip=[
                "metric:N",
                alt.Tooltip("latency_s:Q", format=".4~g"),
                alt.Tooltip("quantile:Q", format=".2f"),
            ],
        )
        .properties(height=320)
    )


def load_curve(points: list[dict[str, Any]], offered_rate: float | None) -> alt.LayerChart:
    """Output tokens/s and p99 TTFT against offered requests/s (two axes): the what-if's offered
    load marked (dashed, labelled) and the overload region past the saturation rate shaded."""
    label = f"offered {offered_rate:.3g}/s" if offered_rate else ""
    # the dashed line is labelled in the axis title (a text layer costs ~0.1 s of chart building a render)
    title = "offered load (requests/s)" + (f"; dashed line: this what-if, {label}" if label else "")
    base = alt.Chart(pd.DataFrame(points)).encode(x=alt.X("offered_requests_per_s:Q", title=title))
    tput = base.mark_line(point=True, color="#4c78a8").encode(
        y=alt.Y("output_tokens_per_s:Q", title="output tokens/s", axis=alt.Axis(titleColor="#4c78a8")),
        tooltip=[
            alt.Tooltip("offered_requests_per_s:Q", format=".3~g"),
            alt.Tooltip("output_tokens_per_s:Q", format=".4~g"),
        ],
    )
    ttft = base.mark_line(point=True, color="#f58518", strokeDash=[4, 2]).encode(
        y=alt.Y("ttft_p99_s:Q", title="TTFT p99 (s)", axis=alt.Axis(titleColor="#f58518")),
        tooltip=[
            alt.Tooltip("offered_requests_per_s:Q", format=".3~g"),
            alt.Tooltip("ttft_p99_s:Q", format=".4~g"),
        ],
    )
    layers: list[Any] = []
    cap = points[0].get("saturation_requests_per_s") if points else None
    top = max(p["offered_requests_per_s"] for p in points) if points else None
    if cap and top and top > cap:  # overload: offered past the saturation rate
        layers.append(
            alt.Chart(pd.DataFrame([{"x": cap, "x2": top, "what": "overload (offered past saturation)"}]))
            .mark_rect(color="#d62728", opacity=0.12)
            .encode(
                x=alt.X("x:Q", title=title),
                x2="x2:Q",
                tooltip=["what:N", alt.Tooltip("x:Q", title="saturation", format=".3~g")],
            )
        )
    layers += [tput, ttft]
    if offered_rate:
        mark = pd.DataFrame([{"offered_requests_per_s": offered_rate, "label": label}])
        layers.append(
            alt.Chart(mark)
            .mark_rule(color="#555", strokeDash=[6, 3], size=2)
            .encode(x="offered_requests_per_s:Q", tooltip=["label:N"])
        )
    return alt.layer(*layers).resolve_scale(y="independent").properties(height=320)
