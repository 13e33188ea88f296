"""RL page: knobs of an RL post-training what-if (placement, pool split, group size, the response-length
tail, off-policy depth) -> the step's phases per GPU pool, cost per step and per run, base vs what-if
(issue 26, item 5). The pieces live in ``app/explorer/rl_view.py``."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # app/ (see app/Home.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st
from explorer import logic, rl_view, widgets

P = rl_view.P
widgets.page_setup("RL", ":material/model_training:")


def main() -> None:
    st.title("RL post-training what-if")
    source = widgets.scenario_source(
        P, logic.RL_KINDS, what="RL", preferred="examples/rl-grpo-qwen3-32b-p5en.yaml"
    )
    widgets.engine_choice(
        P,
        rl_view.ENGINES,
        help="The discrete-event simulation is what `fmsim run` reports; "
        "the analytical estimate is `fmsim run --estimate`.",
    )
    if source is None:
        st.info("Pick a bundled RL scenario or load a YAML file (`workload.kind: rl`) in the sidebar.")
        return
    loaded = widgets.knob_scenario(
        P, source, logic.RL_KINDS, "Training or Serving", rl_view.knob_defaults, rl_view.draw_knobs
    )
    if loaded is None:
        return
    sc, defaults = loaded
    engine = widgets.chosen_engine(P, rl_view.ENGINES)
    overrides = rl_view.overrides_from(defaults, sc)
    with st.spinner("Simulating…"):
        out = rl_view.run(source.text, source.label, overrides, engine)
        base = rl_view.run(source.text, source.label, (), engine) if overrides else out
    st.caption(f"Base scenario: **{source.label}** — {sc.description or sc.name}")
    st.session_state[f"{P}.whatif_yaml"] = out.yaml_text
    if not out.ok:
        widgets.show_error(out.error, out.hint, out.error_kind)
        st.session_state[f"{P}.result"] = None
        return
    st.session_state[f"{P}.result"] = out.result.to_dict()
    rl_view.render(
        out, base if base.ok and base is not out else None, st.session_state[f"{P}.name"] or sc.name
    )


main()
