"""The explorer draws the band (issue 27 item 3): the Training page's "Prediction band" box, on demand."""
from __future__ import annotations

import pytest

pytest.importorskip("streamlit")
from app_helpers import EXAMPLES, open_page  # noqa: E402

from explorer import logic  # noqa: E402
from fmsim.band import band  # noqa: E402
from fmsim.scenario import load_scenario  # noqa: E402


def test_logic_band_is_fmsim_s_band_of_the_what_if():
    path = EXAMPLES / "llama3-70b-p5.yaml"
    lo, hi, why, n = logic.training_band(path.read_text(), path.name)
    b = band(load_scenario(path))
    assert (lo, hi) == b.relative() and why == b.reason() and n == len(b.varied)
    assert lo <= 1.0 <= hi and lo < hi


def test_the_training_page_shows_the_band_only_when_asked():
    at = open_page("1_Training.py", via_home=False)
    assert not any(c.value.startswith("Band:") for c in at.caption)
    at.checkbox(key="train.band").check().run()
    assert not at.exception, [e.value for e in at.exception]
    bands = [c.value for c in at.caption if c.value.startswith("Band: step ")]
    assert len(bands) == 1 and "components varied" in bands[0], bands
