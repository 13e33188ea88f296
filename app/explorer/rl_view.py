"""The RL page's pieces (app/pages/5_RL.py): its knobs (placement, pool split, group size, the
response-length tail, off-policy depth), their scenario overrides, the cached run and the rendering of
one RL step -- the phase timeline per GPU pool, the phase breakdown, cost per step and per run, base vs
what-if. The simulation is called through :func:`explorer.logic.run_rl` (the one API module)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import streamlit as st

from . import charts, logic, widgets

P = "rl"
ENGINES = {"discrete-event simulation": "des", "analytical estimate": "analytical"}
PLACEMENTS = ["colocated", "disaggregated"]
TP_OPTIONS = [1, 2, 4, 8, 16, 32]
PHASES = ("transition", "generation", "reward", "logprob", "training", "weight_sync")
#: one colour per phase, the same in the timeline and the breakdown
PHASE_COLOURS = {
    "offload / reload": "#9d755d",
    "generation": "#4c78a8",
    "reward": "#54a24b",
    "log-probs": "#72b7b2",
    "policy update": "#f58518",
    "weight sync": "#e45756",
}
PHASE_SCALE = alt.Scale(domain=list(PHASE_COLOURS), range=list(PHASE_COLOURS.values()))
PHASE_LABELS = {
    "transition": "offload / reload",
    "generation": "generation",
    "reward": "reward",
    "logprob": "log-probs",
    "training": "policy update",
    "weight_sync": "weight sync",
}


@st.cache_data(show_spinner=False, max_entries=256)
def run(text: str, file: str, overrides: tuple[tuple[str, Any], ...], engine: str) -> logic.Outcome:
    return logic.run_rl(text, file, overrides, engine=engine)


def _placement(raw: Any) -> tuple[str, int]:
    """(placement kind, generation nodes) of the raw ``rl.placement``."""
    if isinstance(raw, Mapping) and "disaggregated" in raw:
        return "disaggregated", int((raw["disaggregated"] or {}).get("generation_nodes") or 1)
    return "colocated", 0


def knob_defaults(sc: Any, cat: Any) -> dict[str, Any]:
    rl = dict(sc.extra.get("rl") or {})
    kind, gen_nodes = _placement(rl.get("placement"))
    resp = rl.get("response_len", 1024)
    sigma = float(resp.get("sigma")) if isinstance(resp, Mapping) and resp.get("dist") == "lognormal" else 0.0
    gen = dict(rl.get("generation") or {})
    nodes = int(sc.cluster.nodes)
    return {
        "name": sc.name,
        "nodes": nodes,
        "placement": kind,
        "generation_nodes": gen_nodes or max(1, nodes // 2),
        "generation_tp": int(gen.get("tp") or 1),
        "prompts": int(rl.get("prompts") or 64),
        "samples_per_prompt": int(rl.get("samples_per_prompt") or 8),
        "response_len": widgets.flow(resp),
        "sigma": sigma,
        "max_response_len": int(rl.get("max_response_len") or 0),
        "off_policy": int(rl.get("off_policy") or 0),
        "steps": int(rl.get("steps") or 0),
    }


def overrides_from(defaults: Mapping[str, Any], sc: Any) -> tuple:
    ss = st.session_state

    def changed(k: str) -> bool:
        return ss[f"{P}.{k}"] != defaults[k]

    out: dict[str, Any] = {}
    if changed("name"):
        out["name"] = str(ss[f"{P}.name"]).strip()
    if changed("nodes"):
        out["cluster.nodes"] = int(ss[f"{P}.nodes"])
    for k in ("prompts", "samples_per_prompt", "off_policy"):
        if changed(k):
            out[f"rl.{k}"] = int(ss[f"{P}.{k}"])
    if changed("steps"):
        out["rl.steps"] = int(ss[f"{P}.steps"]) or None
    if changed("max_response_len"):
        out["rl.max_response_len"] = int(ss[f"{P}.max_response_len"]) or None
    if changed("generation_tp"):
        gen = dict(sc.extra.get("rl", {}).get("generation") or {})
        gen["tp"] = int(ss[f"{P}.generation_tp"])
        out["rl.generation"] = gen
    if changed("response_len") or changed("sigma"):
        resp = logic.parse_knob_text(str(ss[f"{P}.response_len"]))
        if isinstance(resp, Mapping) and resp.get("dist") == "lognormal" and changed("sigma"):
            resp = {**resp, "sigma": float(ss[f"{P}.sigma"])}
        out["rl.response_len"] = resp
    if changed("placement") or changed("generation_nodes") or changed("nodes"):
        if ss[f"{P}.placement"] == "disaggregated":
            nodes, gen = int(ss[f"{P}.nodes"]), int(ss[f"{P}.generation_nodes"])
            out["rl.placement"] = {
                "disaggregated": {"generation_nodes": gen, "training_nodes": max(1, nodes - gen)}
            }
            out["rl.weight_sync"] = "broadcast"
        elif changed("placement"):
            out["rl.placement"] = "colocated"
            out["rl.weight_sync"] = "reshard"
            out["rl.off_policy"] = 0
    if out:
        out["parallelism.dp"] = "auto"  # the training pool's dp follows the pools
    return logic.as_overrides(out)


def draw_knobs(defaults: Mapping[str, Any], cat: Any) -> None:
    sb = st.sidebar
    ss = st.session_state
    sb.subheader("Knobs")
    widgets.reset_button(P, defaults)
    sb.text_input("What-if name", key=f"{P}.name")
    widgets.number_knob(sb, "Nodes", min_value=1, max_value=100_000, step=1, key=f"{P}.nodes")
    sb.markdown("**Placement**")
    sb.radio(
        "Generation and training",
        PLACEMENTS,
        key=f"{P}.placement",
        horizontal=True,
        help="colocated: both time-share every GPU; disaggregated: separate pools of nodes",
    )
    disagg = ss[f"{P}.placement"] == "disaggregated"
    c1, c2 = sb.columns(2)
    widgets.number_knob(c1, "Generation nodes",
        min_value=1,
        max_value=100_000,
        step=1,
        key=f"{P}.generation_nodes",
        disabled=not disagg,
        help="the rest of the nodes train",
    )
    widgets.number_knob(c2, "Off-policy depth",
        min_value=0,
        max_value=8,
        step=1,
        key=f"{P}.off_policy",
        disabled=not disagg,
        help="k: generation of step n+k runs beside training of step n",
    )
    sb.select_slider(
        "Generation TP", widgets.with_options(TP_OPTIONS, defaults["generation_tp"]), key=f"{P}.generation_tp"
    )
    sb.markdown("**Rollouts**")
    c1, c2 = sb.columns(2)
    widgets.number_knob(c1, "Prompts per step", min_value=1, max_value=100_000, step=1, key=f"{P}.prompts")
    widgets.number_knob(c2, "Group size",
        min_value=1,
        max_value=1024,
        step=1,
        key=f"{P}.samples_per_prompt",
        help="samples per prompt",
    )
    sb.text_input(
        "Response length (tokens)",
        key=f"{P}.response_len",
        help="a number, or a distribution: {dist: lognormal, mean: 2000, sigma: 0.8}",
    )
    c1, c2 = sb.columns(2)
    lognormal = "lognormal" in str(ss[f"{P}.response_len"])
    widgets.number_knob(c1, "Tail (lognormal sigma)",
        min_value=0.0,
        max_value=3.0,
        step=0.1,
        key=f"{P}.sigma",
        disabled=not lognormal,
        help="the spread of log response length: the long tail",
    )
    widgets.number_knob(c2, "Max response (0 = none)",
        min_value=0,
        max_value=1_000_000,
        step=256,
        key=f"{P}.max_response_len",
        help="responses are cut here",
    )
    widgets.number_knob(sb, "RL steps of the run (0 = none)", min_value=0, max_value=10_000_000, step=50,
                        key=f"{P}.steps"
    )


def phase_rows(results: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """The phases of one step of each ``(name, result)`` for the breakdown bar (seconds each)."""
    rows = []
    for name, res in results:
        for p in PHASES:
            s = logic.finite(res.metrics.get(f"{p}_s"))
            if s:
                rows.append({"run": name, "part": PHASE_LABELS[p], "seconds": s})
    return rows


def render(out: logic.Outcome, base: logic.Outcome | None, name: str) -> None:
    r, m = out.result, out.result.metrics
    b = base.result if base is not None else None

    def d(col: str) -> str | None:
        return None if b is None else widgets.delta(b.get(col), r.get(col))

    bad = logic.infeasible_reason(r)
    if bad:
        widgets.infeasible_banner(bad)
    why_grey = logic.greyed_reason(r, b)     # a plan that cannot run (or a base that cannot): no "better"
    grey = bool(why_grey)
    if grey and not bad:
        widgets.base_infeasible_caption(why_grey)
    pools = r.details.get("pools") or {}
    pool_text = " · ".join(f"{k}: {v.get('gpus')} GPUs" for k, v in pools.items())
    st.markdown(
        f"**{r.gpus:,} GPUs** = {r.nodes:,} × {r.instance} · {m.get('placement')} ({pool_text}) · "
        f"{m.get('algorithm')}, {m.get('rollouts_per_step'):,} rollouts, {m.get('optimizer_steps')} "
        f"optimizer step(s), off-policy {m.get('off_policy')}"
    )
    c = st.columns(4)
    widgets.metric(
        c[0], "RL step", logic.fmt_time(m.get("step_time_s")), d("step_time_s"), lower_is_better=True,
        infeasible=grey,
    )
    widgets.metric(
        c[1],
        "Generation",
        logic.fmt_time(m.get("generation_s")),
        d("generation_s"),
        lower_is_better=True,
        help="the step waits for its longest response",
        infeasible=grey,
    )
    widgets.metric(
        c[2],
        "Tokens/s/GPU",
        logic.fmt_count(m.get("tokens_per_s_per_gpu")),
        d("tokens_per_s_per_gpu"),
        help="NeMo RL's: training tokens per step / step time / every GPU",
        infeasible=grey,
    )
    widgets.metric(
        c[3],
        "$ per step",
        logic.fmt_usd(m.get("usd_per_step")),
        d("usd_per_step"),
        lower_is_better=True,
        help=f"{m.get('pricing_option', '')} price dated {r.price_date or '-'}",
        infeasible=grey,
    )
    c = st.columns(4)
    widgets.metric(
        c[0],
        "$ per M trained tokens",
        logic.fmt_usd(m.get("usd_per_million_trained_tokens")),
        d("usd_per_million_trained_tokens"),
        lower_is_better=True,
        infeasible=grey,
    )
    widgets.metric(
        c[1],
        "Run time",
        logic.fmt_time(m.get("time_to_train_s")),
        d("time_to_train_s"),
        lower_is_better=True,
        help="rl.steps x the step, plus every validation and checkpoint the run reaches",
        infeasible=grey,
    )
    widgets.metric(c[2], "$ per run", logic.fmt_usd(m.get("cost_usd")), d("cost_usd"), lower_is_better=True,
                   infeasible=grey)
    widgets.metric(
        c[3],
        "Generation / training busy",
        f"{logic.fmt_pct(m.get('generation_utilization'))} / {logic.fmt_pct(m.get('training_utilization'))}",
        d("generation_utilization"),
        help="share of the step each pool is busy",
        infeasible=grey,
    )
    if r.details.get("bottleneck"):
        st.info(f"**Bottleneck:** {logic.md_escape(r.details['bottleneck'])}", icon=":material/search:")
    widgets.engine_caption(out.engine)
    st.subheader("Phases per GPU pool")
    if out.timeline:
        rows = [(lane, a, b, PHASE_LABELS.get(c, c), lab) for lane, a, b, c, lab in out.timeline]
        chart = charts.timeline(rows, x_title="seconds", scale=PHASE_SCALE, legend_columns=6, lane_px=28)
        st.altair_chart(chart, width="stretch")
        st.caption(
            "Every phase of the simulated steps on its pool; with off-policy depth k, generation of "
            "step n+k runs beside training of step n."
        )
    left, right = st.columns(2)
    with left:
        st.subheader("One step's phases")
        runs = ([("base", b)] if b is not None else []) + [(name, r)]
        phases = phase_rows(runs)
        chart = charts.breakdown_bar(phases, "seconds per RL step", scale=PHASE_SCALE, legend_columns=3)
        st.altair_chart(chart, width="stretch")
    with right:
        st.subheader("Memory per GPU")
        mem = r.memory
        st.dataframe(
            [{"part": k, "GiB": round(float(v) / 2**30, 1)} for k, v in mem.items()],
            hide_index=True,
            width="stretch",
        )
    widgets.scenario_footer(P, out, name)
