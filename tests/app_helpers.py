"""What the explorer's AppTest files (tests/test_rl_app.py, tests/test_app_storage.py) share: where
``app/`` is (put on ``sys.path`` so ``from explorer import ...`` works), the per-run bound, opening a
page and the metrics it shows. Import it after ``pytest.importorskip("streamlit")``."""

from __future__ import annotations

import sys
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
EXAMPLES = ROOT / "scenarios" / "examples"
if str(APP) not in sys.path:
    sys.path.insert(0, str(APP))

TIMEOUT_S = 90  # generous per-run bound on a loaded 2-core machine; not a timing assertion


def open_page(page: str, *, via_home: bool = True) -> AppTest:
    """``pages/<page>`` run without an exception: reached from Home.py (as ``fmsim app`` starts), or
    run on its own (``via_home=False``)."""
    if via_home:
        at = AppTest.from_file(str(APP / "Home.py"), default_timeout=TIMEOUT_S)
        at.run()
        at.switch_page(f"pages/{page}")
    else:
        at = AppTest.from_file(str(APP / "pages" / page), default_timeout=TIMEOUT_S)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shown(at: AppTest) -> dict[str, str]:
    """The page's metrics: label -> shown value."""
    return {m.label: m.value for m in at.metric}
