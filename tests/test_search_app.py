"""The explorer's Search page (app/pages/6_Search.py) through AppTest: it shows what fmsim.search finds,
marks infeasible tp x pp cells with why, answers "how many nodes", and opens a plan on the Training page."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

import fmsim

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
if str(APP) not in sys.path:
    sys.path.insert(0, str(APP))

from explorer import search_view  # noqa: E402

LLAMA = ROOT / "scenarios/examples/llama3-70b-p5.yaml"
TIMEOUT_S = 120     # a generous bound on a loaded 2-core machine; not a timing assertion


@pytest.fixture(scope="module")
def page():
    at = AppTest.from_file(str(APP / "Home.py"), default_timeout=TIMEOUT_S)
    at.run()
    at.switch_page("pages/6_Search.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.text_input(key="search.nodes").set_value("8,16").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def frame(at, column: str):
    """The first table on the page with ``column`` (AppTest keeps no keys on dataframes)."""
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with a {column!r} column")


@pytest.fixture(scope="module")
def expected():
    sc = fmsim.load_scenario(LLAMA)
    return fmsim.search(sc, instances=("p5.48xlarge",), nodes=(8, 16), pricing=("on-demand",), top=0, jobs=1,
                        cache_dir=False)


def test_frontier_and_winners_are_the_searchs(page, expected):
    frontier = frame(page, "bottleneck")
    assert list(frontier["plan"]) == [search_view.plan_label(r.key, r.row["pricing_option"])
                                      for r in expected.frontier]
    assert list(frontier["cost_usd"]) == pytest.approx([r.cost for r in expected.frontier])
    winners = frame(page, "why")
    assert list(winners["instance"]) == ["p5.48xlarge"]


def test_heatmap_marks_infeasible_cells_with_why(page, expected):
    heat = frame(page, "status")
    assert len(heat) == len(expected.space.tp) * len(expected.space.pp)
    bad = heat[heat["status"] != "fits"]
    assert not bad.empty and all(s.startswith(("refused:", "does not fit")) for s in bad["status"])
    good = heat[heat["status"] == "fits"]
    assert not good.empty and good["step_time_s"].notna().all()


def test_nodes_needed_scales_time_with_tokens(expected):
    r = expected.ranked[0]
    tokens = 15e12
    need = search_view.nodes_needed(expected, tokens / 2, r.time_s / 86400 / 2 * 1.0001)
    row = need[need["instance"] == "p5.48xlarge"].iloc[0]
    assert row["nodes"] <= r.row["nodes"]       # half the tokens in half the time: no more nodes needed


def test_open_a_plan_on_the_training_page(page, expected):
    at = page
    label = at.selectbox(key="search.pick").value
    at.button(key="search.open").click().run()
    assert not at.exception, [e.value for e in at.exception]
    chosen = next(r for r in [*expected.frontier, *expected.winners.values(), *expected.ordered[:20]]
                  if search_view.plan_label(r.key, r.row["pricing_option"]) == label)
    knobs = search_view.training_knobs(chosen.key, chosen.row["pricing_option"])
    for knob in ("tp", "pp", "nodes", "instance", "recompute", "zero", "global_batch"):
        assert at.session_state[f"train.{knob}"] == knobs[knob], knob      # the Training page's own keys
    assert any("Training what-if" in t.value for t in at.title)
    assert at.select_slider(key="train.tp").value == knobs["tp"]           # the page drew the plan's knobs
    assert at.number_input(key="train.nodes").value == knobs["nodes"]


def test_global_batches_are_searched_from_the_sidebar_and_a_bad_list_is_one_error():
    """The global-batch box holds the scenario's batch; a list searches each, as fmsim.search does; bad
    text is the search's one-line error, no exception."""
    at = AppTest.from_file(str(APP / "Home.py"), default_timeout=TIMEOUT_S)
    at.run()
    at.switch_page("pages/6_Search.py")
    at.run()
    assert at.text_input(key="search.global_batch").value == "128"
    at.text_input(key="search.nodes").set_value("8").run()
    at.text_input(key="search.global_batch").set_value("128,256").run()
    assert not at.exception, [e.value for e in at.exception]
    sc = fmsim.load_scenario(LLAMA)
    want = fmsim.search(sc, instances=("p5.48xlarge",), nodes=(8,), pricing=("on-demand",), top=0, jobs=1,
                        cache_dir=False, axes={"global_batch": (128, 256)})
    frontier = frame(at, "bottleneck")
    assert list(frontier["plan"]) == [search_view.plan_label(r.key, r.row["pricing_option"])
                                      for r in want.frontier]
    assert any(" gb256 " in label for label in frame(at, "plan")["plan"])
    at.text_input(key="search.global_batch").set_value("128,zero").run()
    assert not at.exception and any("--global-batch" in e.value for e in at.error)
