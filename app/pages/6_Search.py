"""Search page: the cheapest or fastest training plan across layouts, instance types, node counts and
pricing (``fmsim.search``, docs/search.md): the time/cost frontier, the best plan per instance type, a
tp x pp heatmap of step time with infeasible cells marked with why, how many nodes train N tokens in D
days, and any point opened as a what-if on the Training page (issue 29, item 4)."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # app/ (see app/Home.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import altair as alt
import streamlit as st
from explorer import cache, logic, search_view, widgets

import fmsim

P = "search"
TRAINING = "train"  # the Training page's widget keys (app/pages/1_Training.py's P): what opening a plan sets
#: how the tables show their numbers (sortable: the values stay numbers, only their display is formatted)
_COLUMNS = {
    "days": st.column_config.NumberColumn("days to train", format="%.1f"),
    "cost_usd": st.column_config.NumberColumn("US$ to train", format="compact"),
    "step_time_s": st.column_config.NumberColumn("step (s)", format="%.3f"),
    "mfu": st.column_config.NumberColumn("MFU", format="percent"),
}
GOALS = ("frontier (time against cost)", "deadline: cheapest in time", "budget: fastest within it")

widgets.page_setup("Search", ":material/travel_explore:")


@st.cache_data(show_spinner=False, max_entries=16)
def run_search(text: str, label: str, instances: tuple, nodes: str, pricing: tuple,
               deadline_days: float | None, budget_usd: float | None, global_batch: str = ""):
    """One search (deterministic: the same inputs give the same result), kept for the session's reruns.
    ``global_batch``: the global batches to try, as ``--global-batch`` takes them (empty: the scenario's)."""
    sc, err, _hint = cache.base(text, label)
    if sc is None:
        raise fmsim.ConfigError(err)
    axes = {"global_batch": global_batch} if global_batch.strip() else None
    return fmsim.search(sc, instances=instances, nodes=nodes, pricing=pricing, top=0, jobs=1, cache_dir=False,
                        deadline_s=deadline_days * 86400 if deadline_days else None, budget_usd=budget_usd,
                        axes=axes)


def open_on_training(label: str, text: str, key: tuple, option: str) -> None:
    """Set the Training page's scenario and knobs to this plan and go there."""
    ss = st.session_state
    for k in [k for k in ss if str(k).startswith(f"{TRAINING}.")]:
        del ss[k]
    ss[f"{TRAINING}.bundled"] = label
    ss[f"{TRAINING}._base"] = widgets.Source(label=label, text=text).key
    ss[f"{TRAINING}._saved"] = {}
    for knob, value in search_view.training_knobs(key, option).items():
        ss[f"{TRAINING}.{knob}"] = value
    st.switch_page("pages/1_Training.py")


def main() -> None:
    st.title("Plan search")
    source = widgets.scenario_source(P, logic.TRAINING_KINDS, what="training",
                                     preferred="examples/llama3-70b-p5.yaml")
    if source is None:
        st.info("Pick a bundled scenario or load a YAML file in the sidebar.")
        return
    sc = widgets.base_scenario(source, logic.TRAINING_KINDS, "Serving")
    if sc is None:
        return
    cat = cache.catalog()
    sb = st.sidebar
    sb.subheader("Search")
    aws = sorted(n for n, i in cat.instances.items() if not i.is_reference)
    own = sc.cluster.instance.name
    sb.multiselect("Instance types", aws, default=[own] if own in aws else aws[:1], key=f"{P}.instances")
    sb.text_input("Node counts", value=f"{sc.cluster.nodes}..{sc.cluster.nodes * 4}", key=f"{P}.nodes",
                  help="LO..HI doubles from LO (8..64: 8, 16, 32, 64), or a list: 8,12,16")
    sb.text_input("Global batches (sequences)", value=str(sc.workload.global_batch), key=f"{P}.global_batch",
                  help="a list such as 1024,2048,4096 (default: the scenario's). Time to train is the tokens "
                       "over tokens per second at any batch: the batch size's effect on convergence (the "
                       "critical batch size) is not modelled")
    sb.multiselect("Pricing options", list(logic.PRICING_OPTIONS), default=[sc.pricing.option or "on-demand"],
                   key=f"{P}.pricing")
    goal = sb.radio("Goal", GOALS, key=f"{P}.goal")
    deadline = budget = None
    if goal == GOALS[1]:
        deadline = widgets.number_knob(sb, "Deadline (days)", min_value=1.0, value=365.0, key=f"{P}.deadline")
    elif goal == GOALS[2]:
        budget = widgets.number_knob(sb, "Budget (US$)", min_value=1.0, value=50e6, step=1e6,
                                     key=f"{P}.budget")
    if not st.session_state.get(f"{P}.instances"):
        st.info("Pick at least one instance type.")
        return
    if not sc.workload.train_tokens:
        st.error(f"{source.label}: workload.train_tokens: is needed to compare plans by time and cost to "
                 "train")
        return
    try:
        nodes = st.session_state[f"{P}.nodes"]
        pricing = tuple(st.session_state.get(f"{P}.pricing") or ()) or (sc.pricing.option or "on-demand",)
        with st.spinner("Searching…"):
            res = run_search(source.text, source.label, tuple(st.session_state[f"{P}.instances"]), nodes,
                             pricing, deadline, budget, st.session_state.get(f"{P}.global_batch") or "")
    except fmsim.FmsimError as exc:
        st.error(str(exc))
        return
    c = res.counts
    st.caption(f"{len(res.records):,} plans: {c['ok']:,} fit and were costed, {c['memory']:,} do not fit in "
               f"memory, {c['rule']:,} refused by the scenario's rules · {res.elapsed_s:.1f} s · numbers "
               "from the analytical estimate (`fmsim search` re-checks the best with the simulation)")
    pts = search_view.points_frame(res)
    st.subheader("Time to train against cost")
    if pts.empty:
        st.warning("No costed plan has a price: pick AWS instance types with a price for these options.")
    else:
        base = alt.Chart(pts).encode(
            x=alt.X("days:Q", title="days to train", scale=alt.Scale(type="log")),
            y=alt.Y("cost_usd:Q", title="US$ to train", scale=alt.Scale(type="log")),
            tooltip=["plan", "days", "cost_usd", "mfu", "bottleneck"])
        chart = base.mark_circle(size=30, opacity=0.35).encode(color="instance:N") + \
            base.transform_filter("datum.frontier").mark_line(point=True, color="black")
        st.altair_chart(chart, width="stretch")
        frontier = pts[pts["frontier"]].drop(columns=["frontier"])
        frontier = frontier.sort_values(["days", "cost_usd"], kind="stable")
        st.dataframe(frontier, hide_index=True, column_config=_COLUMNS, key=f"{P}.frontier")
    st.subheader("Best plan per instance type")
    if res.ordered:
        st.dataframe(search_view.winners_frame(res), hide_index=True, column_config=_COLUMNS,
                     key=f"{P}.winners")
    else:
        st.warning("No plan meets the goal: widen the node counts, the instance types, the global batches or "
                   "the goal.")

    st.subheader("Step time over tp × pp")
    h1, h2 = st.columns(2)
    inst = h1.selectbox("Instance type", list(res.space.instance), key=f"{P}.heat_instance")
    n = h2.selectbox("Nodes", list(res.space.nodes), key=f"{P}.heat_nodes")
    heat = search_view.heatmap_frame(res, inst, n)
    cells = alt.Chart(heat).encode(x="pp:O", y="tp:O", tooltip=["tp", "pp", "step_time_s", "status", "plan"])
    st.altair_chart(cells.mark_rect().encode(color=alt.Color("step_time_s:Q", title="step s")) +
                    cells.mark_text(fontSize=10).encode(text="status:N"), width="stretch")
    st.dataframe(heat, hide_index=True, column_config=_COLUMNS, key=f"{P}.heat")

    st.subheader("How many nodes?")
    q1, q2 = st.columns(2)
    tokens = widgets.number_knob(q1, "Tokens to train (trillions)", min_value=0.001,
                             value=float(sc.workload.train_tokens) / 1e12, key=f"{P}.tokens")
    days = widgets.number_knob(q2, "Within days", min_value=1.0, value=90.0, key=f"{P}.days")
    need = search_view.nodes_needed(res, tokens * 1e12, days)
    if need.empty:
        st.info("No searched node count trains that many tokens in time: search more nodes.")
    else:
        st.dataframe(need, hide_index=True, column_config=_COLUMNS, key=f"{P}.need")

    st.subheader("Open a plan as a what-if")
    choices = {search_view.plan_label(r.key, r.row["pricing_option"]): r
               for r in [*res.frontier, *res.winners.values(), *res.ordered[:20]]}
    if not choices:
        return
    pick = st.selectbox("Plan", list(choices), key=f"{P}.pick")
    r = choices[pick]
    bundled = source.label in [b.label for b in cache.bundled()] and not st.session_state.get(f"{P}.upload")
    if st.button("Open on the Training page", key=f"{P}.open", disabled=not bundled,
                 help=None if bundled else "Only bundled scenarios open there; download the YAML instead."):
        open_on_training(source.label, source.text, r.key, r.row["pricing_option"])


main()
