"""Serving page: knobs of an inference / test-time-compute what-if -> latency percentiles and CDF,
throughput against load, KV-cache use, $ per million tokens and per answered question (issue 6,
item 3)."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # app/ (see app/Home.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collections.abc import Mapping
from typing import Any

import streamlit as st
from explorer import cache, charts, logic, widgets

P = "serve"
ENGINES = {"discrete-event simulation": "des", "analytical estimate": "analytical"}
TP_OPTIONS = [1, 2, 4, 8, 16, 32, 64]
ARRIVALS = ["poisson", "constant", "bursty", "closed-loop", "offline"]
STRATEGIES = ["none", "self-consistency", "best-of-n", "sequential-revision"]
INLINE = widgets.INLINE
ANALYTICAL_PERCENTILES = (
    "The analytical estimate is deterministic: one latency per request of the mean shape, so its p50, "
    "p90 and p99 are equal. Choose the discrete-event simulation for real percentiles."
)
FIXED = widgets.FIXED
SIMPLE = {  # knob -> dotted scenario path (the sections' own keys; see docs of kind: inference)
    "model": "workload.model",
    "instance": "cluster.instance",
    "nodes": "cluster.nodes",
    "precision": "workload.precision",
    "pricing": "pricing",
    "tp": "parallelism.tp",
    "ep": "parallelism.ep",
    "arrival": "traffic.arrival",
    "rate": "traffic.rate",
    "concurrency": "traffic.concurrency",
    "requests": "traffic.requests",
    "prompt_len": "traffic.prompt_len",
    "output_len": "traffic.output_len",
    "replicas": "serving.replicas",
}

widgets.page_setup("Serving", ":material/chat:")


def _flat_slo(raw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (raw or {}).items():
        if isinstance(v, Mapping):
            for stat, lim in v.items():
                out[f"{k}_{stat}"] = lim
        else:
            out[str(k)] = v
    return out


def knob_defaults(sc, cat) -> dict:
    model = sc.workload.model
    ex = sc.extra
    tr = dict(ex.get("traffic") or {})
    sv = dict(ex.get("serving") or {})
    ttc = dict(ex.get("test_time_compute") or {})
    slo = _flat_slo(ex.get("slo"))
    reps = sv.get("replicas")
    return {
        "name": "",  # empty: the base's name, with -whatif once a knob moves (logic.whatif_name)
        "model": model.name if cat.models.get(model.name) == model else model.name + INLINE,
        "instance": sc.cluster.instance.name,
        "nodes": int(sc.cluster.nodes),
        "precision": sc.workload.precision,
        "pricing": sc.pricing.option if sc.pricing.option is not None else FIXED,
        "tp": sc.parallelism.tp,
        "ep": sc.parallelism.ep,
        "replicas": int(reps) if isinstance(reps, int) else 0,
        "arrival": str(tr.get("arrival") or ("closed-loop" if tr.get("concurrency") else "poisson")),
        "rate": widgets.flow(tr.get("rate")),
        "concurrency": int(tr.get("concurrency") or 0),
        "requests": int(tr["requests"]) if isinstance(tr.get("requests"), int) else 0,
        "prompt_len": widgets.flow(tr.get("prompt_len", 1000)),
        "output_len": widgets.flow(tr.get("output_len", 1000)),
        "ttft_p99": widgets.flow(slo.get("ttft_p99")),
        "tpot_p50": widgets.flow(slo.get("tpot_p50")),
        "samples": int(ttc.get("samples") or 1),
        "strategy": str(
            ttc.get("strategy")
            or (
                "best-of-n"
                if ttc.get("verifier")
                else "self-consistency"
                if (ttc.get("samples") or 1) > 1
                else "none"
            )
        ),
        "revision_rounds": int(ttc.get("revision_rounds") or 1),
    }


def knob_choices(defaults: dict, cat) -> dict:
    """What each knob takes, for a value read from the page's link."""
    return {
        **widgets.shared_choices(defaults, cat, TP_OPTIONS),
        "arrival": widgets.with_options(ARRIVALS, defaults["arrival"]),
        "strategy": widgets.with_options(STRATEGIES, defaults["strategy"]),
        "replicas": logic.AtLeast(0, 100_000),
        "concurrency": logic.AtLeast(0),
        "requests": logic.AtLeast(0),
        "samples": logic.AtLeast(1, 1024),
        "revision_rounds": logic.AtLeast(1, 64),
    }


def overrides_from(defaults: dict, sc) -> tuple:
    ss = st.session_state
    out: dict[str, Any] = {}
    for knob, path in SIMPLE.items():
        v = ss[f"{P}.{knob}"]
        if v == defaults[knob]:
            continue
        if knob in ("model", "pricing") and (str(v).endswith(INLINE) or v == FIXED):
            continue
        if knob in ("rate", "prompt_len", "output_len"):
            v = logic.parse_knob_text(str(v))
        elif knob == "replicas":
            v = v or "auto"
        elif knob in ("concurrency", "requests"):
            v = v or None
        out[path] = v
    if ss[f"{P}.arrival"] != defaults["arrival"]:
        if ss[f"{P}.arrival"] != "closed-loop":
            out["traffic.concurrency"] = None
        if ss[f"{P}.arrival"] in ("closed-loop", "offline"):
            out["traffic.rate"] = None
        if ss[f"{P}.arrival"] != "bursty":
            out["traffic.burstiness"] = None
    if any(ss[f"{P}.{k}"] != defaults[k] for k in ("ttft_p99", "tpot_p50")):
        slo = _flat_slo(sc.extra.get("slo"))
        for k in ("ttft_p99", "tpot_p50"):
            v = str(ss[f"{P}.{k}"]).strip()
            if v:
                slo[k] = v
            else:
                slo.pop(k, None)
        out["slo"] = slo
    if any(ss[f"{P}.{k}"] != defaults[k] for k in ("samples", "strategy", "revision_rounds")):
        ttc = dict(sc.extra.get("test_time_compute") or {})
        ttc["samples"] = int(ss[f"{P}.samples"])
        ttc["strategy"] = ss[f"{P}.strategy"]
        if ss[f"{P}.strategy"] == "sequential-revision":
            ttc["revision_rounds"] = int(ss[f"{P}.revision_rounds"])
        else:
            ttc.pop("revision_rounds", None)
        if ss[f"{P}.strategy"] != "best-of-n":
            ttc.pop("verifier", None)
        out["test_time_compute"] = ttc
    if out:
        out["parallelism.dp"] = "auto"
    name = logic.whatif_name(sc.name, ss[f"{P}.name"], changed=bool(out))
    if name != sc.name:
        out["name"] = name
    return logic.as_overrides(out)


def draw_knobs(defaults: dict, cat) -> None:
    sb = st.sidebar
    sb.subheader("Knobs")
    widgets.reset_button(P, defaults)
    sb.markdown("**Cluster and parallelism**")
    sb.selectbox("Instance type", sorted(cat.instances), key=f"{P}.instance")
    c1, c2 = sb.columns(2)
    widgets.number_knob(c1, "Nodes", min_value=1, max_value=100_000, step=1, key=f"{P}.nodes")
    widgets.number_knob(c2, "Replicas (0 = auto)", min_value=0, max_value=100_000, step=1,
                        key=f"{P}.replicas")
    sb.select_slider("Tensor parallel (tp)", widgets.with_options(TP_OPTIONS, defaults["tp"]), key=f"{P}.tp")
    widgets.number_knob(sb, "Expert parallel (ep)", min_value=1, max_value=1024, step=1, key=f"{P}.ep")
    widgets.model_and_price(P, defaults, cat)
    sb.markdown("**Traffic**")
    sb.selectbox("Arrivals", widgets.with_options(ARRIVALS, defaults["arrival"]), key=f"{P}.arrival")
    arrival = st.session_state[f"{P}.arrival"]
    c1, c2 = sb.columns(2)
    c1.text_input(
        "Rate",
        key=f"{P}.rate",
        disabled=arrival in ("closed-loop", "offline"),
        help="requests per second: 12, '12/s', '600/min'",
    )
    widgets.number_knob(c2, "Clients",
        min_value=0,
        step=1,
        key=f"{P}.concurrency",
        disabled=arrival != "closed-loop",
        help="closed-loop clients",
    )
    widgets.number_knob(sb, "Requests simulated (0 = the scenario's default)", min_value=0, step=100,
                        key=f"{P}.requests"
    )
    sb.text_input(
        "Prompt length (tokens)",
        key=f"{P}.prompt_len",
        help="a number, or a distribution: {dist: lognormal, median: 800, sigma: 1.0}",
    )
    sb.text_input("Output length (tokens)", key=f"{P}.output_len")
    sb.markdown("**SLOs**")
    c1, c2 = sb.columns(2)
    c1.text_input("TTFT p99 ≤", key=f"{P}.ttft_p99", help="e.g. 2 s; empty for none")
    c2.text_input("TPOT p50 ≤", key=f"{P}.tpot_p50", help="e.g. 50 ms; empty for none")
    sb.markdown("**Test-time compute**")
    c1, c2 = sb.columns(2)
    widgets.number_knob(c1, "Samples per prompt", min_value=1, max_value=1024, step=1, key=f"{P}.samples")
    c2.selectbox("Strategy", widgets.with_options(STRATEGIES, defaults["strategy"]), key=f"{P}.strategy")
    widgets.number_knob(sb, "Revision rounds",
        min_value=1,
        max_value=64,
        step=1,
        key=f"{P}.revision_rounds",
        disabled=st.session_state[f"{P}.strategy"] != "sequential-revision",
    )
    widgets.name_knob(P)


def main() -> None:
    st.title("Serving what-if")
    source = widgets.scenario_source(
        P, logic.SERVING_KINDS, what="serving", preferred="examples/serving-llama3.1-70b-chat-p5.yaml"
    )
    if source is None:
        st.info(
            "Pick a bundled serving scenario or load a YAML file (`workload.kind: inference`) in the sidebar."
        )
        return
    loaded = widgets.knob_scenario(
        P, source, logic.SERVING_KINDS, "Training", knob_defaults, draw_knobs, knob_choices
    )
    if loaded is None:
        return
    widgets.engine_choice(  # below the knobs: the cluster and parallel layout come first
        P,
        ENGINES,
        help="The discrete-event simulation is what `fmsim run` reports (percentiles from "
        "simulated requests); the analytical estimate is `fmsim run --estimate`.",
    )
    sc, defaults = loaded
    engine = widgets.chosen_engine(P, ENGINES)
    overrides = overrides_from(defaults, sc)
    with st.spinner("Simulating…"):
        out = cache.serving(source.text, source.label, overrides, engine)
        base = cache.serving(source.text, source.label, (), engine) if overrides else out
    st.caption(source.line(sc.description or sc.name))
    st.session_state[f"{P}.whatif_yaml"] = out.yaml_text
    if not out.ok:
        if out.error_kind == "NotBuiltError":
            st.info(
                "The serving simulator is not available in this fmsim yet "
                f"(`fmsim.simulate` says: {logic.md_escape(out.error)})."
            )
        else:
            widgets.show_error(out.error, out.hint, out.error_kind)
        st.session_state[f"{P}.result"] = None
        return
    render(
        out,
        base if base.ok and base is not out else None,
        source,
        overrides,
        dict(overrides).get("name", sc.name),
    )


def render(
    out: logic.Outcome, base: logic.Outcome | None, source: widgets.Source, overrides: tuple, name: str
) -> None:
    r, m = out.result, out.result.metrics
    b = base.result if base is not None else None
    st.session_state[f"{P}.result"] = r.to_dict()

    def d(col):
        return None if b is None else widgets.delta(b.get(col), r.get(col))

    pools = r.details.get("pools") or []
    pool_text = "; ".join(f"{p.get('role')}: {p.get('replicas')} × tp {p.get('tp')}" for p in pools)
    st.markdown(
        f"**{r.gpus:,} GPUs** = {r.nodes:,} × {r.instance} · {pool_text or 'tp ' + str(m.get('tp'))} · "
        f"engine {r.details.get('engine', '-')}"
    )
    curve, cerr = cache.load_curve(source.text, source.label, overrides)
    offered = out.offered_requests_per_s
    saturation = curve[0]["saturation_requests_per_s"] if curve else None
    flat = out.engine != "des" and m.get("ttft_p50_s") == m.get("ttft_p99_s")  # one value per latency
    bad = logic.infeasible_reason(r, offered, saturation)
    if bad:
        widgets.infeasible_banner(bad)
    grey = logic.greyed_reason(r, b, offered, saturation,
                               base.offered_requests_per_s if base is not None else None)
    if grey and not bad:
        widgets.base_infeasible_caption(grey)
    if m.get("slo_met") is False:
        st.warning(
            "The SLOs are not met at this load: lower the rate, add replicas, or pick faster hardware."
        )
    over = logic.overload(r, offered, saturation)
    if over:
        st.warning(logic.md_escape(over), icon=":material/speed:")
    c = widgets.metric_columns(8)
    widgets.metric(
        c[0],
        "TTFT p50 / p99",
        logic.fmt_pair(m.get("ttft_p50_s"), m.get("ttft_p99_s")),
        d("ttft_p99_s"),
        lower_is_better=True,
        help="time to first token; the delta is of p99",
        infeasible=bool(grey),
    )
    widgets.metric(
        c[1],
        "TPOT p50 / p99",
        logic.fmt_pair(m.get("tpot_p50_s"), m.get("tpot_p99_s")),
        d("tpot_p50_s"),
        lower_is_better=True,
        help="time per output token; the delta is of p50",
        infeasible=bool(grey),
    )
    widgets.metric(
        c[2],
        "E2E p50 / p99",
        logic.fmt_pair(m.get("e2e_p50_s"), m.get("e2e_p99_s")),
        d("e2e_p99_s"),
        lower_is_better=True,
        infeasible=bool(grey),
    )
    widgets.metric(
        c[3],
        "Output tokens/s",
        logic.fmt_count(m.get("output_tokens_per_s")),
        d("output_tokens_per_s"),
        help=f"{logic.fmt_count(m.get('output_tokens_per_s_per_gpu'))} per GPU",
        infeasible=bool(grey),
    )
    widgets.metric(
        c[4],
        "Requests/s",
        logic.fmt_count(m.get("requests_per_s")),
        d("requests_per_s"),
        help="requests completed per second: by the simulation, over the whole simulated run (its fill and "
        "drain included); by the estimate, at the offered rate up to saturation",
        infeasible=bool(grey),
    )
    widgets.metric(
        c[5],
        "$ per M output tokens",
        logic.fmt_usd(m.get("usd_per_million_output_tokens")),
        d("usd_per_million_output_tokens"),
        lower_is_better=True,
        help=f"{r.details.get('pricing_option', '')} price dated {r.price_date or '-'}",
        infeasible=bool(grey),
    )
    widgets.metric(
        c[6],
        "$ per answered question",
        logic.fmt_usd(m.get("usd_per_query")),
        d("usd_per_query"),
        lower_is_better=True,
        infeasible=bool(grey),
    )
    kv = m.get("kv_utilization_mean")
    peak = m.get("kv_utilization_peak")
    widgets.metric(
        c[7],
        "KV cache use (mean / peak)",
        f"{logic.fmt_pct(kv)} / {logic.fmt_pct(peak)}",
        d("kv_utilization_mean"),
        help="share of the KV-cache blocks in use",
        infeasible=bool(grey),
    )
    if logic.price_note(r):
        st.warning(f"No cost: {logic.md_escape(logic.price_note(r))}.", icon=":material/money_off:")
    if m.get("slo_met") is not None:
        st.caption(
            f"SLOs met: **{'yes' if m['slo_met'] else 'no'}** · goodput "
            f"{logic.fmt_count(m.get('goodput_requests_per_s'), '/s')} "
            f"({logic.fmt_pct(m.get('goodput_fraction'))} of requests within every SLO)"
        )
    if r.details.get("bottleneck"):
        st.info(f"**Bottleneck:** {logic.md_escape(r.details['bottleneck'])}", icon=":material/search:")
    widgets.engine_caption(
        out.engine, after="" if out.engine == "des" else " " + (ANALYTICAL_PERCENTILES if flat else "")
    )

    left, right = st.columns(2)
    with left:
        st.subheader("Latency CDF")
        points, src = logic.latency_cdf(r)
        if points:
            st.altair_chart(charts.latency_cdf(points), width="stretch")
            if flat:
                st.caption(ANALYTICAL_PERCENTILES)
            elif src == "percentiles":
                st.caption("Drawn through the p50, p90 and p99 the simulator reports.")
        rows = []
        for metric in ("ttft", "tpot", "itl", "e2e", "question_latency"):
            vals = {f"p{q}": logic.fmt_time(m.get(f"{metric}_p{q}_s")) for q in (50, 90, 99)}
            if any(v != "-" for v in vals.values()):
                rows.append({"latency": metric, **vals})
        st.dataframe(rows, hide_index=True, width="stretch")
    with right:
        st.subheader("Throughput against load (analytical estimate)")
        if curve:
            st.altair_chart(charts.load_curve(curve, offered), width="stretch")
            engine_words = (
                "the numbers above are the discrete-event simulation's, so they can differ"
                if out.engine == "des"
                else "the same engine as the numbers above"
            )
            st.caption(
                f"The curve is the analytical estimate (`fmsim run --estimate`) at fractions of its "
                f"saturation rate, {logic.fmt_count(saturation, '/s')}; {engine_words}. The dashed line "
                "marks this what-if's offered load; the red band is overload (offered past saturation), "
                "where the queue grows without bound."
            )
        else:
            st.caption(f"No load curve: {logic.md_escape(cerr)}")
    left, right = st.columns(2)
    with left:
        st.subheader("Memory per GPU")
        st.altair_chart(charts.memory_bar(logic.memory_rows(r), logic.hbm_bytes(r)), width="stretch")
    with right:
        request, step = logic.serving_parts(r)
        if request:
            st.subheader("Where a request's time goes")
            st.altair_chart(charts.breakdown_bar(request, "seconds (mean over requests)"), width="stretch")
        if step:
            st.subheader("One decode step")
            st.altair_chart(charts.breakdown_bar(step, "seconds per decode step"), width="stretch")
            st.caption("At the mean simulated batch and context.")
    widgets.scenario_footer(P, out, name)


main()
