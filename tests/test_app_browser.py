"""The explorer in a real browser: ``fmsim app`` serves it on 127.0.0.1, Playwright drives Debian's
chromium (``/usr/bin/chromium``, never a downloaded browser): move the tp slider and see the step
time change, reload and open the page's link and see the same what-if, read an error message as
written, and find no figure cut short; screenshots go to the test's tmp dir and ``test-output/``.
One server and one browser serve every test of the module (about 30 s on a quiet machine).

Skipped only when chromium (or playwright) is missing *and* ``CI`` is not ``true``; in CI
(``.ci/run`` installs chromium) a missing browser is a failure.
"""

from __future__ import annotations

import os
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
