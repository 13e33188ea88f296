"""The explorer in a real browser: ``fmsim app`` serves it on 127.0.0.1, Playwright drives Debian's
chromium (``/usr/bin/chromium``, never a downloaded browser): move the tp slider and see the step
time change, reload and open the page's link and see the same what-if, read an error message as
written, find no figure cut short, and run a small search on the Search page and open a plan from it on
the Training page; screenshots go to the test's tmp dir and ``test-output/``. One server and one browser
serve every test of the module (about 45 s on a quiet machine).

Skipped only when chromium (or playwright) is missing *and* ``CI`` is not ``true``; in CI
(``.ci/run`` installs chromium) a missing browser is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IN_CI = os.environ.get("CI", "").lower() == "true"
START_TIMEOUT_S = 90  # bounded polls: the server start and each page change
CHANGE_TIMEOUT_S = 60


def _need(ok: bool, why: str) -> None:
    if not ok:
        if IN_CI:
            pytest.fail(f"{why} (CI=true: the browser test must run; .ci/run installs chromium)")
        pytest.skip(why)


def _browser() -> str:
    path = str(CHROMIUM) if CHROMIUM.is_file() else shutil.which("chromium") or ""
    _need(bool(path), "chromium is not installed (apt-get install chromium)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fmsim() -> list[str]:
    """The ``fmsim`` console script of this interpreter's environment (or ``python -m fmsim.cli``)."""
    script = Path(sys.executable).parent / "fmsim"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fmsim.cli"]


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"fmsim app exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    pytest.fail(f"fmsim app did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text(timeout=CHANGE_TIMEOUT_S * 1000).strip()


def _keep(page, tmp_path: Path, name: str) -> None:
    """A full-page screenshot in the test's tmp dir and ``test-output/``."""
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    keep = ROOT / "test-output"
    keep.mkdir(exist_ok=True)
    shutil.copy(shot, keep / f"app-{name}")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """``fmsim app`` of this checkout on a free local port, for every test of the module."""
    executable = _browser()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _need(False, "playwright is not installed (pip install '.[test]')")
        raise
    tmp = tmp_path_factory.mktemp("fmsim-app")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "fmsim-app.log"
    with log.open("w") as out:
        # run from the checkout (python -m puts the working directory first on sys.path), so the
        # server imports this checkout's fmsim and app/ whatever else the environment holds
        proc = subprocess.Popen(
            [sys.executable, "-m", "fmsim.cli", "app", "--port", str(port), "--address", "127.0.0.1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
    try:
        _wait_healthy(proc, url, log)
        yield url, executable, tmp
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def browser(app_url):
    from playwright.sync_api import sync_playwright

    url, executable, tmp = app_url
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp / "profile"),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1500, "height": 1800},
        )
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture
def page(browser):
    p = browser.new_page()
    p.set_default_timeout(CHANGE_TIMEOUT_S * 1000)
    try:
        yield p
    finally:
        p.close()


def _wait_metric_change(page, label: str, before: str) -> str:
    page.wait_for_function(
        """([label, before]) => {
            const box = [...document.querySelectorAll('[data-testid="stMetric"]')]
                .find(e => e.innerText.includes(label));
            const v = box && box.querySelector('[data-testid="stMetricValue"]');
            return v && v.innerText.trim() !== before;
        }""",
        arg=[label, before],
        timeout=CHANGE_TIMEOUT_S * 1000,
    )
    return _metric(page, label)


def _set_number(page, key: str, value: int) -> None:
    """Type into the number input of widget ``key`` and commit it (Enter), as a person does."""
    box = page.locator(f'.st-key-{key.replace(".", "-")} input')
    box.fill(str(value))
    box.press("Enter")


def test_an_error_message_renders_as_written_with_its_stars_and_underscores(app_url, page, tmp_path):
    """12 nodes give dp 3, which 128 sequences do not divide: the message shows its formula as the
    API wrote it (Markdown would turn ``*micro_batch = 3*`` into italics and drop the stars)."""
    page.goto(f"{app_url[0]}/Training", timeout=START_TIMEOUT_S * 1000)
    _metric(page, "Step time")
    _set_number(page, "train.nodes", 12)
    alert = page.locator('[data-testid="stAlert"]').filter(has_text="workload.global_batch").first
    text = alert.inner_text(timeout=CHANGE_TIMEOUT_S * 1000)
    assert "dp*micro_batch = 3*1 = 3" in text, text
    assert alert.locator("em").count() == 0
    _keep(page, tmp_path, "training-escaped-error.png")


def test_moving_the_tp_slider_changes_the_step_time_and_a_reload_or_a_link_keeps_it(
    app_url, browser, page, tmp_path
):
    url = app_url[0]
    page.goto(f"{url}/Training", timeout=START_TIMEOUT_S * 1000)
    before = _metric(page, "Step time")
    assert before.endswith(" s")
    # the tp select_slider (widget key train.tp): an <input type=range> inside its container
    thumb = page.locator('.st-key-train-tp input[type="range"]')
    assert thumb.get_attribute("aria-valuetext") == "8"
    thumb.focus()
    thumb.press("ArrowLeft")  # tp 8 -> 4
    after = _wait_metric_change(page, "Step time", before)
    assert thumb.get_attribute("aria-valuetext") == "4"
    assert after != before and after.endswith(" s")
    assert page.locator('[data-testid="stException"]').count() == 0
    _keep(page, tmp_path, "training-tp4.png")
    # the address bar follows the knobs as soon as the run ends (a short wait: it fails fast)
    page.wait_for_function("() => location.search.includes('tp=4')", timeout=15_000)
    assert "scenario=examples%2Fllama3-70b-p5.yaml" in page.url
    link = page.url
    page.reload()
    assert _metric(page, "Step time") == after
    assert page.locator('.st-key-train-tp input[type="range"]').get_attribute("aria-valuetext") == "4"
    # a colleague's browser (a new page, a new session) opening the link sees the same what-if
    other = browser.new_page()
    try:
        other.goto(link, timeout=START_TIMEOUT_S * 1000)
        assert _metric(other, "Step time") == after
        assert other.locator('.st-key-train-tp input[type="range"]').get_attribute("aria-valuetext") == "4"
        _keep(other, tmp_path, "training-from-link.png")
    finally:
        other.close()


TRUNCATED_JS = """() => [...document.querySelectorAll(
        '[data-testid="stMetricValue"], [data-testid="stMetricLabel"]')]
    .filter(box => [box, ...box.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1))
    .map(box => box.innerText.trim())"""


def test_no_figure_or_label_is_cut_short_on_a_1280_pixel_screen(browser, app_url, tmp_path):
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 1400})
    try:
        # the serving figures from the estimate (same formats; the test need not wait for the simulation)
        for name, first in (("Training", "Step time"), ("Serving?engine=analytical", "TTFT p50 / p99")):
            page.goto(f"{app_url[0]}/{name}", timeout=START_TIMEOUT_S * 1000)
            _metric(page, first)
            page.wait_for_timeout(500)
            assert page.evaluate(TRUNCATED_JS) == [], name
        _keep(page, tmp_path, "serving-1280.png")
    finally:
        page.close()


# every text the page draws on a canvas (the data grids of st.dataframe draw their cells there, formatted by
# the page's column formats; the DOM keeps only the raw values), recorded as it is drawn
DRAWN_JS = """(() => { window.__drawn = new Set();
  const fill = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
    window.__drawn.add(String(text)); return fill.call(this, text, ...rest); };
})();"""


def test_a_search_from_the_search_page_shows_its_frontier_formatted_and_opens_a_plan_on_training(
    browser, app_url, tmp_path
):
    """A small search (one instance type, 8 and 16 nodes): the caption counts the plans the API found, the
    frontier chart and table render, the table's cells drawn as the page formats them (days to one decimal,
    MFU as a percent, not 2511.7839518981514), the tp x pp heatmap marks a cell with no plan with why,
    and "Open on the Training page" reaches the Training page with the plan's knobs."""
    import fmsim

    sc = fmsim.load_scenario(ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml")
    want = fmsim.search(sc, instances=(sc.cluster.instance.name,), nodes="8,16", pricing=("on-demand",), top=0,
                        jobs=1, cache_dir=False)
    assert want.frontier
    page = browser.new_page()
    page.add_init_script(DRAWN_JS)
    page.set_default_timeout(CHANGE_TIMEOUT_S * 1000)
    try:
        page.goto(f"{app_url[0]}/Search", timeout=START_TIMEOUT_S * 1000)
        page.get_by_text("plans:", exact=False).first.wait_for()   # the page's own first search (8..32 nodes)
        box = page.locator(".st-key-search-nodes input")
        box.fill("8,16")
        page.evaluate("() => window.__drawn.clear()")
        box.press("Enter")
        caption = f"{len(want.records):,} plans: {want.counts['ok']:,} fit and were costed"
        page.get_by_text(caption, exact=False).wait_for()
        charts = page.locator('[data-testid="stVegaLiteChart"]')
        charts.nth(1).locator("text").first.wait_for()
        frontier_chart = charts.nth(0).evaluate("e => [...e.querySelectorAll('text')].map(t => t.textContent)")
        assert "days to train" in frontier_chart and "US$ to train" in frontier_chart
        heat = charts.nth(1).evaluate("e => [...e.querySelectorAll('text')].map(t => t.textContent)")
        assert "fits" in heat and any(t.startswith(("refused: ", "does not fit in memory")) for t in heat), heat
        # the frontier table's cells, as drawn: each frontier plan's days as "%.1f" and MFU as a percent
        first = want.frontier[0]
        days = first.time_s / 86400
        page.wait_for_function("(t) => window.__drawn.has(t)", arg=f"{days:.1f}")
        drawn = set(page.evaluate("() => [...window.__drawn]"))
        assert f"{first.row['mfu'] * 100:.2f}%" in drawn
        assert repr(days) not in drawn and repr(first.row["mfu"]) not in drawn
        _keep(page, tmp_path, "search.png")
        # open the picked plan (a frontier plan, a winner or one of the fastest) as a what-if
        picked = page.locator(".st-key-search-pick input").input_value()
        m = re.search(r" x(\d+) tp(\d+) pp(\d+) ", picked)
        assert m, picked
        nodes, tp_pick = m.group(1), m.group(2)
        page.locator(".st-key-search-open button").click()
        page.wait_for_url("**/Training**")
        assert _metric(page, "Step time").endswith(" s")
        tp = page.locator('.st-key-train-tp input[type="range"]')
        assert tp.get_attribute("aria-valuetext") == tp_pick
        assert page.locator(".st-key-train-nodes input").input_value() == nodes
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()
