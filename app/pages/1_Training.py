"""Training page: knobs of a pre-training / fine-tuning what-if -> step time, MFU, cost, memory,
the step's breakdown, the pipeline timeline and the bottleneck (issue 6, item 2)."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # app/ (see app/Home.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st
from explorer import cache, charts, logic, widgets

P = "train"
ENGINES = {"discrete-event simulation": "des", "analytical estimate": "analytical"}
TP_OPTIONS = [1, 2, 4, 8, 16, 32, 64]
CP_OPTIONS = [1, 2, 4, 8, 16, 32]
BUCKET_OPTIONS = [-1, 0, 10_000_000, 40_000_000, 100_000_000, 500_000_000]   # -1: Megatron-Core's, 0: one per layer
INLINE = widgets.INLINE
FIXED = widgets.FIXED
# knob -> dotted scenario path
PATHS = {
    "model": "workload.model",
    "instance": "cluster.instance",
    "nodes": "cluster.nodes",
    "precision": "workload.precision",
    "pricing": "pricing",
    "train_tokens": "workload.train_tokens",
    "seq_len": "workload.seq_len",
    "global_batch": "workload.global_batch",
    "micro_batch": "workload.micro_batch",
    "moe_imbalance": "workload.moe_imbalance",
    "tp": "parallelism.tp",
    "pp": "parallelism.pp",
    "vpp": "parallelism.vpp",
    "cp": "parallelism.cp",
    "ep": "parallelism.ep",
    "zero": "parallelism.zero",
    "dp_shard": "parallelism.dp_shard",
    "grad_bucket": "parallelism.grad_bucket",
    "cp_comm": "parallelism.cp_comm",
    "recompute": "parallelism.recompute",
    "recompute_layers": "parallelism.recompute_layers",
    "schedule": "parallelism.schedule",
    "sequence_parallel": "parallelism.sequence_parallel",
    "stack": "stack",
}

widgets.page_setup("Training", ":material/model_training:")


def knob_defaults(sc, cat) -> dict:
    model = sc.workload.model
    in_catalog = cat.models.get(model.name) == model
    par = sc.parallelism
    return {
        "name": "",  # empty: the base's name, with -whatif once a knob moves (logic.whatif_name)
        "model": model.name if in_catalog else model.name + INLINE,
        "instance": sc.cluster.instance.name,
        "nodes": int(sc.cluster.nodes),
        "precision": sc.workload.precision,
        "pricing": sc.pricing.option if sc.pricing.option is not None else FIXED,
        "train_tokens": logic.fmt_tokens(sc.workload.train_tokens),
        "seq_len": int(sc.workload.seq_len),
        "global_batch": int(sc.workload.global_batch),
        "micro_batch": int(sc.workload.micro_batch),
        "moe_imbalance": float(sc.workload.moe_imbalance),
        "tp": par.tp,
        "pp": par.pp,
        "vpp": par.vpp,
        "cp": par.cp,
        "ep": par.ep,
        "zero": par.zero,
        "dp_shard": par.dp_shard,
        "grad_bucket": par.grad_bucket,
        "cp_comm": par.cp_comm,
        "recompute": par.recompute,
        "recompute_layers": par.recompute_layers,
        "schedule": par.schedule,
        "sequence_parallel": par.sequence_parallel,
        "stack": logic.FILE_STACK,
    }


def knob_choices(defaults: dict, cat) -> dict:
    """What each knob takes, for a value read from the page's link."""
    one = logic.AtLeast(1)
    return {
        **widgets.shared_choices(defaults, cat, TP_OPTIONS),
        "cp": widgets.with_options(CP_OPTIONS, defaults["cp"]),
        "grad_bucket": widgets.with_options(BUCKET_OPTIONS, defaults["grad_bucket"]),
        "cp_comm": ["ring", "all-gather", "a2a"],
        "zero": [0, 1, 2, 3],
        "recompute": ["none", "selective", "full"],
        "schedule": ["1f1b", "interleaved", "gpipe"],
        "pp": logic.AtLeast(1, 1024),
        "vpp": logic.AtLeast(1, 64),
        "seq_len": one,
        "global_batch": one,
        "micro_batch": one,
        "moe_imbalance": logic.AtLeast(1.0),
        "recompute_layers": logic.AtLeast(0),
        "dp_shard": logic.AtLeast(0),
        "stack": logic.training_stacks(),
    }


def knob_value(knob: str):
    v = st.session_state[f"{P}.{knob}"]
    if knob == "train_tokens":
        return str(v).strip() or None
    if knob == "name":
        return str(v).strip()
    return v


def overrides_from(defaults: dict, sc) -> tuple:
    """The knobs that differ from the base scenario, as scenario overrides (cache key)."""
    out = {}
    for knob, path in PATHS.items():
        v = knob_value(knob)
        if v == defaults[knob] or (knob == "train_tokens" and (v or "") == defaults[knob]):
            continue
        if knob in ("model", "pricing") and (str(v).endswith(INLINE) or v == FIXED):
            continue
        # 0 in the knobs is the scenario's auto shard group and per-layer ("unit") bucket
        out[path] = {"dp_shard": "auto", "grad_bucket": "unit"}.get(knob, v) if v == 0 else v
        if knob == "grad_bucket" and v == -1:
            out[path] = "megatron"
    if out:
        out["parallelism.dp"] = "auto"  # dp follows the GPU count and the other axes
    name = logic.whatif_name(sc.name, knob_value("name"), changed=bool(out))
    if name != sc.name:
        out["name"] = name
    return logic.as_overrides(out)


def set_global_batch(batch: int) -> None:
    """An offer taken after a node-count change (see logic.batch_offers)."""
    st.session_state[f"{P}.global_batch"] = batch


def on_vpp_change() -> None:
    """Interleaving needs vpp >= 2 and is the only schedule with it: keep the two consistent."""
    vpp = st.session_state[f"{P}.vpp"]
    if vpp > 1:
        st.session_state[f"{P}.schedule"] = "interleaved"
    elif st.session_state[f"{P}.schedule"] == "interleaved":
        st.session_state[f"{P}.schedule"] = "1f1b"


def draw_knobs(defaults: dict, cat) -> None:
    sb = st.sidebar
    sb.subheader("Knobs")
    widgets.reset_button(P, defaults)
    sb.markdown("**Cluster**")
    sb.selectbox(
        "Instance type",
        sorted(cat.instances),
        key=f"{P}.instance",
        help="AWS instances, and the reference systems of published measurements (no price).",
    )
    widgets.number_knob(sb, "Nodes", min_value=1, max_value=100_000, step=1, key=f"{P}.nodes")
    sb.markdown("**Parallelism**")
    sb.select_slider("Tensor parallel (tp)", widgets.with_options(TP_OPTIONS, defaults["tp"]), key=f"{P}.tp")
    c1, c2 = sb.columns(2)
    widgets.number_knob(c1, "Pipeline (pp)", min_value=1, max_value=1024, step=1, key=f"{P}.pp")
    widgets.number_knob(c2, "Virtual stages (vpp)", min_value=1, max_value=64, step=1, key=f"{P}.vpp",
                        on_change=on_vpp_change
    )
    c1, c2 = sb.columns(2)
    c1.selectbox("Context (cp)", widgets.with_options(CP_OPTIONS, defaults["cp"]), key=f"{P}.cp")
    c2.selectbox(
        "CP exchange",
        ["ring", "all-gather", "a2a"],
        key=f"{P}.cp_comm",
        help="ring: K/V passed around behind attention; all-gather: gathered first (Llama 3); "
        "a2a: Ulysses head split (cp must divide a TP rank's heads).",
    )
    c1, c2 = sb.columns(2)
    widgets.number_knob(c1, "Expert (ep)", min_value=1, max_value=1024, step=1, key=f"{P}.ep")
    c2.selectbox(
        "Grad bucket",
        widgets.with_options(BUCKET_OPTIONS, defaults["grad_bucket"]),
        key=f"{P}.grad_bucket",
        format_func=lambda n: f"{n / 1e6:g}M" if n > 0 else ("per layer" if n == 0 else "Megatron-Core (1M x dp, >= 40M)"),
        help="Parameters per gradient bucket: one reduce-scatter (or all-reduce) each, with its own latency; "
        "per layer as PyTorch FSDP reduces each wrapped block; Megatron-Core's default grows with the "
        "data-parallel size.",
    )
    widgets.number_knob(sb, "MoE load imbalance",
        min_value=1.0,
        step=0.05,
        key=f"{P}.moe_imbalance",
        help="MoE models with ep > 1: the busiest expert-parallel rank's token-expert pairs over the mean "
        "(1 = balanced routing, as published benchmarks force it). Capacity factors: the scenario file.",
    )
    c1, c2 = sb.columns(2)
    c1.selectbox("ZeRO stage", [0, 1, 2, 3], key=f"{P}.zero")
    c2.selectbox("Recompute", ["none", "selective", "full"], key=f"{P}.recompute")
    widgets.number_knob(sb, "Recompute layers",
        min_value=0,
        step=1,
        key=f"{P}.recompute_layers",
        help="With full recompute: only the first this many layers of each virtual stage recompute, the rest "
        "keep their activations (Megatron-LM's --recompute-method block); 0 = every layer.",
    )
    c1, c2 = sb.columns(2)
    c1.selectbox("Schedule", ["1f1b", "interleaved", "gpipe"], key=f"{P}.schedule")
    widgets.number_knob(c2, "Shard group",
        min_value=0,
        step=1,
        key=f"{P}.dp_shard",
        help="Data-parallel ranks one ZeRO/FSDP shard spans (hybrid sharding: the rest hold replicas); "
        "0 = all of dp.",
    )
    sb.checkbox("Sequence parallel", key=f"{P}.sequence_parallel")
    stack_picker()
    widgets.model_and_price(P, defaults, cat)
    sb.markdown("**Batch**")
    c1, c2, c3 = sb.columns(3)
    widgets.number_knob(c1, "Seq len", min_value=1, step=1024, key=f"{P}.seq_len")
    widgets.number_knob(c2, "Global batch", min_value=1, step=1, key=f"{P}.global_batch",
                        help="sequences per step")
    widgets.number_knob(c3, "Micro batch", min_value=1, step=1, key=f"{P}.micro_batch")
    sb.text_input(
        "Tokens to train", key=f"{P}.train_tokens", help="e.g. 15T, 300G; empty for no time or cost to train"
    )
    widgets.name_knob(P)


def stack_picker() -> None:
    """The software stack (stack_catalog/): it supplies the settings the base file does not state itself."""
    sb = st.sidebar
    sb.selectbox(
        "Software stack",
        logic.training_stacks(),
        key=f"{P}.stack",
        help="A framework release's shipped defaults (`fmsim catalog stacks`): they replace the settings the "
        "base file leaves to its own stack or to fmsim's defaults; the file's own settings still win.",
    )
    picked = st.session_state[f"{P}.stack"]
    if picked != logic.FILE_STACK:
        sets = logic.stack_sets(picked, st.session_state[f"{P}.precision"])
        sb.caption(f"`{picked}` sets " + (", ".join(sets) if sets else "nothing the schema has") + ".")


def main() -> None:
    st.title("Training what-if")
    source = widgets.scenario_source(
        P, logic.TRAINING_KINDS, what="training", preferred="examples/llama3-70b-p5.yaml"
    )
    if source is None:
        st.info("Pick a bundled scenario or load a YAML file in the sidebar.")
        return
    loaded = widgets.knob_scenario(
        P, source, logic.TRAINING_KINDS, "Serving", knob_defaults, draw_knobs, knob_choices
    )
    if loaded is None:
        return
    # below the knobs: the cluster and its parallel layout are what a planner reaches for first
    widgets.engine_choice(
        P,
        ENGINES,
        help="The discrete-event simulation is what `fmsim run` reports; the analytical "
        "estimate is `fmsim run --estimate` (instant).",
    )
    st.sidebar.checkbox(
        "Simulate large steps",
        key=f"{P}.force_des",
        help=f"Steps of more than {logic.DES_JOB_LIMIT:,} engine jobs use the estimate "
        "unless this is ticked (the simulation then takes seconds).",
    )
    st.sidebar.checkbox(
        "Prediction band",
        key=f"{P}.band",
        help="Vary every sourced uncertainty of the prediction (`fmsim run --band`): the settings the file and "
        "its stack leave unstated, the stack's other releases' values, the hardware figures' measured spreads. "
        "A few dozen analytical estimates, computed only while ticked.",
    )
    sc, defaults = loaded
    engine = widgets.chosen_engine(P, ENGINES)
    limit = None if st.session_state.get(f"{P}.force_des") else logic.DES_JOB_LIMIT
    overrides = overrides_from(defaults, sc)
    with st.spinner("Simulating…"):
        out = cache.training(source.text, source.label, overrides, engine, limit)
        base = cache.training(source.text, source.label, (), engine, limit) if overrides else out
    n_changed = sum(1 for k, _ in overrides if k not in ("name", "parallelism.dp"))
    st.caption(
        source.line(sc.description or sc.name)
        + (f" · {n_changed} knob{'s' * (n_changed > 1)} changed" if n_changed else "")
    )
    st.session_state[f"{P}.whatif_yaml"] = out.yaml_text
    if not out.ok:
        widgets.show_error(out.error, out.hint, out.error_kind)
        if "workload.global_batch" in out.error:
            offers = logic.batch_offers(source.text, source.label, overrides)
            cols = st.columns(len(offers)) if offers else []
            for col, (label, batch) in zip(cols, offers):
                col.button(
                    label, key=f"{P}.offer_{batch}", on_click=set_global_batch, args=(batch,), width="stretch"
                )
        st.session_state[f"{P}.result"] = None
        return
    render(out, base if base.ok else None, dict(overrides).get("name", sc.name))
    if st.session_state.get(f"{P}.band"):
        got = cache.training_band(source.text, source.label, overrides)
        step = out.result.metrics.get("step_time_s")
        if got is not None and step:
            lo, hi, why, n = got
            st.caption(f"Band: step {logic.fmt_time(step)}, {logic.fmt_time(step * lo)} – "
                       f"{logic.fmt_time(step * hi)}: {logic.md_escape(why)} ({n} components varied, "
                       "analytical estimates; docs/stacks.md)")


def render(out: logic.Outcome, base: logic.Outcome | None, name: str) -> None:
    r, m = out.result, out.result.metrics
    b = base.result if base is not None and base is not out else None
    st.session_state[f"{P}.result"] = r.to_dict()

    def d(col, value=None):
        if b is None:
            return None
        return widgets.delta(
            b.get(col) if value is None else value(b), r.get(col) if value is None else value(r)
        )

    st.markdown(
        f"**{r.gpus:,} GPUs** = {r.nodes:,} × {r.instance} · tp {m['tp']} · pp {m['pp']}"
        f"{' (vpp ' + str(m.get('vpp')) + ')' if (m.get('vpp') or 1) > 1 else ''} · dp {m['dp']} · "
        f"cp {m['cp']} · ep {m['ep']} · {m.get('num_microbatches', '?')} micro-batches per step"
    )
    if out.note:  # e.g. a step too large to simulate at once: the page shows the estimate, and says why
        st.warning(logic.md_escape(out.note), icon=":material/functions:")
    bad = logic.infeasible_reason(r)
    if bad:
        widgets.infeasible_banner(bad)
    grey = logic.greyed_reason(r, b)  # the what-if's or the base's plan cannot run: no change is "better"
    if grey and not bad:
        widgets.base_infeasible_caption(grey)
    if not m.get("fits", True):
        widgets.show_error(
            f"Does not fit in memory: {logic.fmt_bytes(m['memory_per_gpu_bytes'])} per GPU needed, "
            f"{logic.fmt_bytes(m['hbm_per_gpu_bytes'])} of HBM.",
            out.hint or logic.OOM_HINT,
        )
    c = widgets.metric_columns(8)
    widgets.metric(
        c[0], "Step time", logic.fmt_time(m["step_time_s"]), d("step_time_s"), lower_is_better=True,
        infeasible=bool(grey),
    )
    widgets.metric(
        c[1],
        "MFU",
        logic.fmt_pct(m["mfu"]),
        d("mfu"),
        help=logic.mfu_help(r),
        infeasible=bool(grey),
    )
    widgets.metric(
        c[2],
        "Tokens/s",
        logic.fmt_count(m["tokens_per_s"]),
        d("tokens_per_s"),
        help=f"{m['tokens_per_s_per_gpu']:,.0f} per GPU",
        infeasible=bool(grey),
    )
    over = logic.over_hbm(m)
    widgets.metric(
        c[3],
        "Memory per GPU",
        logic.fmt_fit(m["memory_per_gpu_bytes"], m["hbm_per_gpu_bytes"]),
        f"+{logic.fmt_bytes(over)} over HBM" if over else d("memory_per_gpu_bytes"),
        lower_is_better=True,  # over HBM: a red rise
        help="needed on the fullest pipeline stage / HBM of one GPU",
        infeasible=bool(grey) and not over,
    )
    widgets.metric(
        c[4],
        "Time to train",
        logic.fmt_time(m.get("time_to_train_s")),
        d("time_to_train_s"),
        lower_is_better=True,
        infeasible=bool(grey),
    )
    widgets.metric(
        c[5],
        "Cost to train",
        logic.fmt_usd(m.get("cost_usd")),
        d("cost_usd"),
        lower_is_better=True,
        help=f"{m.get('pricing_option')} price of {r.price_date or 'no date'}",
        infeasible=bool(grey),
    )
    widgets.metric(
        c[6],
        "Cluster $/h",
        logic.fmt_usd(r.usd_per_hour),
        d("usd_per_hour", lambda x: x.usd_per_hour),
        lower_is_better=True,
        help=f"{m.get('pricing_option')}, price dated {r.price_date or '-'}",
        infeasible=bool(grey),
    )
    widgets.metric(
        c[7], "GPU-hours", logic.fmt_count(m.get("gpu_hours")), d("gpu_hours"), lower_is_better=True,
        infeasible=bool(grey),
    )
    if logic.price_note(r):
        st.warning(f"No cost: {logic.md_escape(logic.price_note(r))}.", icon=":material/money_off:")
    sentence = r.details.get("bottleneck") or m.get("bottleneck") or ""
    st.info(
        f"**Bottleneck ({logic.md_escape(m.get('bottleneck', '-'))}):** {logic.md_escape(sentence)}",
        icon=":material/search:",
    )
    est = out.estimate.metrics["step_time_s"] if out.estimate is not None else None
    extra = (
        f"; analytical estimate {logic.fmt_time(est)} "
        f"({logic.delta_text(m['step_time_s'], est)} vs the simulation)"
        if out.engine == "des" and est
        else ""
    )
    widgets.engine_caption(out.engine, extra)

    left, right = st.columns(2)
    with left:
        st.subheader("Step time breakdown")
        runs = [("base", b), ("what-if", r)] if b is not None else [("what-if", r)]
        st.altair_chart(charts.breakdown_bar(logic.breakdown_rows(runs)), width="stretch")
    with right:
        st.subheader("Memory per GPU")
        st.altair_chart(charts.memory_bar(logic.memory_rows(r), logic.hbm_bytes(r)), width="stretch")
    st.subheader("Pipeline timeline (one simulated step)")
    if out.timeline:
        st.altair_chart(charts.timeline(out.timeline), width="stretch")
    if out.timeline_note:
        st.caption(out.timeline_note)
    widgets.scenario_footer(P, out, name)


main()
__import__("explorer.storage_panel", fromlist=["render"]).render()  # storage and goodput panel (issue 30)
