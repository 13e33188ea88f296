"""The explorer in a real browser: ``fmsim app`` serves it on 127.0.0.1, Playwright drives Debian's
chromium (``/usr/bin/chromium``, never a downloaded browser): load the Training page, move the tp
slider, see the step time change, and keep a screenshot (the test's tmp dir and ``test-output/``).

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


def test_moving_the_tp_slider_in_a_browser_changes_the_step_time(tmp_path):
    executable = _browser()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(False, "playwright is not installed (pip install '.[test]')")
        raise
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "fmsim-app.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*_fmsim(), "app", "--port", str(port), "--address", "127.0.0.1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    try:
        _wait_healthy(proc, url, log)
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                str(tmp_path / "profile"),
                executable_path=executable,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1500, "height": 1800},
            )
            try:
                page = ctx.new_page()
                page.goto(f"{url}/Training", timeout=START_TIMEOUT_S * 1000)
                before = _metric(page, "Step time")
                assert before.endswith(" s")
                # the tp select_slider (widget key train.tp): an <input type=range> inside its container
                thumb = page.locator('.st-key-train-tp input[type="range"]')
                assert thumb.get_attribute("aria-valuetext") == "8"
                thumb.focus()
                thumb.press("ArrowLeft")  # tp 8 -> 4
                page.wait_for_function(
                    """([before]) => {
                        const box = [...document.querySelectorAll('[data-testid="stMetric"]')]
                            .find(e => e.innerText.includes('Step time'));
                        const v = box && box.querySelector('[data-testid="stMetricValue"]');
                        return v && v.innerText.trim() !== before;
                    }""",
                    arg=[before],
                    timeout=CHANGE_TIMEOUT_S * 1000,
                )
                after = _metric(page, "Step time")
                assert thumb.get_attribute("aria-valuetext") == "4"
                assert after != before and after.endswith(" s")
                page.wait_for_timeout(1500)  # let the charts draw before the picture
                assert page.locator('[data-testid="stException"]').count() == 0
                shot = tmp_path / "training-tp4.png"
                page.screenshot(path=str(shot), full_page=True)
            finally:
                ctx.close()
        assert shot.stat().st_size > 10_000
        keep = ROOT / "test-output"
        keep.mkdir(exist_ok=True)
        shutil.copy(shot, keep / "app-training-tp4.png")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
