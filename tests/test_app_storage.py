"""The Training page's storage and goodput panel (app/explorer/storage_panel.py) through streamlit's AppTest:
the figures it shows are the API's for the same what-if, and its knobs move them as the API does."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")

import fmsim
from app_helpers import EXAMPLES, open_page, shown

from explorer import logic, storage_panel  # noqa: E402

LLAMA = EXAMPLES / "llama3-70b-p5.yaml"


def training_page():
    return open_page("1_Training.py")


def expected(tier: str, capacity_tib: float, every_min: float, async_: bool):
    sc = fmsim.load_scenario(LLAMA)
    over = storage_panel.overrides(sc, tier, capacity_tib, every_min, async_)
    return fmsim.estimate(fmsim.load_scenario(LLAMA, overrides=over))


def test_the_panel_shows_the_apis_storage_and_goodput_figures_and_its_knobs_move_them():
    at = training_page()
    assert "Storage and goodput over the run" in [s.value for s in at.subheader]
    tier = at.selectbox(key="train.storage.tier").value
    cap = at.number_input(key="train.storage.capacity").value
    res = expected(tier, cap, 30.0, False)
    m = shown(at)
    assert m["Checkpoint write"] == logic.fmt_time(res.metrics["checkpoint_write_s"])
    assert m["Expected interruptions"] == logic.fmt_count(res.metrics["expected_interruptions"])
    assert m["Goodput"] == logic.fmt_pct(res.metrics["goodput"])
    assert m["Storage"] == logic.fmt_usd(res.metrics["storage_usd"])
    # a bigger file system writes faster and costs more
    at.number_input(key="train.storage.capacity").set_value(1000.0).run()
    assert not at.exception
    big = expected(tier, 1000.0, 30.0, False)
    m2 = shown(at)
    write = logic.fmt_time(big.metrics["checkpoint_write_s"])
    assert m2["Checkpoint write"] == write != m["Checkpoint write"]
    assert big.metrics["checkpoint_write_s"] < res.metrics["checkpoint_write_s"]
    # the interval curve on request
    charts = len(at.get("vega_lite_chart"))
    at.toggle(key="train.storage.curve").set_value(True).run()
    assert not at.exception and len(at.get("vega_lite_chart")) == charts + 1
    assert not at.error


def test_a_tier_without_a_sourced_price_says_so_instead_of_a_number():
    at = training_page()
    at.selectbox(key="train.storage.tier").set_value("fsx-lustre-persistent-2-250").run()
    assert not at.exception
    assert shown(at)["Storage"] == "no price"


def test_the_knobs_keep_the_files_other_checkpoint_fields():
    text = LLAMA.read_text() + "\ncheckpoint: {every: 1 h, async: true, keep: 3, staging: pageable}\n"
    base = logic.load_base(text, "what-if")
    knobs = storage_panel.overrides(base, "fsx-lustre-persistent-2-125", 100.0, 20.0, False)
    sc = logic.whatif_scenario(text, "what-if", tuple(knobs.items()))
    assert (sc.checkpoint.every_s, sc.checkpoint.async_) == (1200.0, False)
    assert (sc.checkpoint.keep, sc.checkpoint.staging) == (3, "pageable")
