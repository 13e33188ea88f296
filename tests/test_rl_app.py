"""The explorer's RL page (app/pages/5_RL.py) through streamlit's AppTest: it shows what the API says for
the bundled GRPO example, a knob (placement, pool split, off-policy depth, group size, the tail) changes
the what-if against the base, and a plan that cannot run is one st.error with what to change."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")

import fmsim
from app_helpers import EXAMPLES, open_page, shown

from explorer import logic  # noqa: E402

EXAMPLE = EXAMPLES / "rl-grpo-qwen3-32b-p5en.yaml"


def open_rl():
    return open_page("5_RL.py", via_home=False)


def test_the_rl_page_shows_the_apis_step_for_the_bundled_example():
    at = open_rl()
    res = fmsim.simulate(fmsim.load_scenario(EXAMPLE))
    m = shown(at)
    assert m["RL step"] == logic.fmt_time(res.metrics["step_time_s"])
    assert m["$ per step"] == logic.fmt_usd(res.metrics["usd_per_step"])
    assert m["$ per run"] == logic.fmt_usd(res.metrics["cost_usd"])
    assert "Phases per GPU pool" in [s.value for s in at.subheader]
    assert not at.error


def test_knobs_make_a_what_if_against_the_base():
    at = open_rl()
    base = shown(at)["RL step"]
    at.sidebar.radio(key="rl.placement").set_value("disaggregated").run()
    at.sidebar.number_input(key="rl.generation_nodes").set_value(3).run()
    at.sidebar.number_input(key="rl.off_policy").set_value(1).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    m = {x.label: x for x in at.metric}
    assert m["RL step"].value != base and m["RL step"].delta  # the delta against the base is shown
    sc = fmsim.load_scenario(
        EXAMPLE,
        overrides={
            "rl.placement": {"disaggregated": {"generation_nodes": 3, "training_nodes": 1}},
            "rl.weight_sync": "broadcast",
            "rl.off_policy": 1,
        },
    )
    assert m["RL step"].value == logic.fmt_time(fmsim.simulate(sc).metrics["step_time_s"])


def test_a_plan_that_cannot_run_is_one_error_with_what_to_change():
    at = open_rl()
    at.sidebar.number_input(key="rl.samples_per_prompt").set_value(1).run()
    assert not at.exception
    # the page escapes Markdown so the message renders as written (logic.md_escape)
    assert len(at.error) == 1 and logic.md_escape("rl.samples_per_prompt") in at.error[0].value


def test_the_bottleneck_sentence_renders_as_written():
    """The bottleneck line is Markdown-escaped as on the Training and Serving pages (a sentence with
    `_` or `*` would otherwise lose characters to italics)."""
    at = open_rl()
    sentence = fmsim.simulate(fmsim.load_scenario(EXAMPLE)).details["bottleneck"]
    infos = [i.value for i in at.info if "Bottleneck" in i.value]
    assert infos == [f"**Bottleneck:** {logic.md_escape(sentence)}"]
