"""Speed of the what-if explorer: how long a knob change takes to re-render the Training page.

Target (issue 6 item 7): a knob change re-renders within 1 s for training scenarios up to 16k
GPUs. Measured with ``streamlit.testing`` AppTest, which runs the page script exactly as the
server does (widgets, the cached fmsim call, the altair charts, the protobuf the browser gets),
on scenarios from 64 to 16,384 GPUs; each knob change is a *new* what-if (not in the cache),
then the same knob moved back (a cache hit). With ``--browser`` it also times the change end to
end in Debian's chromium (slider key press -> new step time on screen) against ``fmsim app``.

Prints figures; asserts nothing (STYLE.md habit 12: benchmarks are not tests).

Run: .venv/bin/python bench/bench_app.py [--browser]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from explorer import logic
from streamlit.testing.v1 import AppTest

import fmsim

EXAMPLES = ROOT / "scenarios" / "examples"
# (label, base file, overrides making the size) -- the 16k ones follow bench/bench_training.py
CASES = [
    ("llama3-70b, 64 H100", EXAMPLES / "llama3-70b-p5.yaml", {}),
    ("llama3.1-405b, 1,024 H200", EXAMPLES / "llama3.1-405b-p5en.yaml", {}),
    (
        "llama3.1-405b, 16,384 H100 (TP8 PP16)",
        EXAMPLES / "llama3.1-405b-p5en.yaml",
        {
            "name": "llama3.1-405b-16k",
            "cluster": {"instance": "p5.48xlarge", "nodes": 2048},
            "parallelism": {"tp": 8, "pp": 16, "dp": "auto", "vpp": 1, "schedule": "1f1b"},
            "workload": {"global_batch": 2048},
        },
    ),
    (
        "mixtral-8x22b, 16,384 B200 (EP8)",
        EXAMPLES / "mixtral-8x22b-p6-b200.yaml",
        {
            "name": "mixtral-16k",
            "cluster": {"nodes": 2048},
            "parallelism": {"dp": "auto"},
            "workload": {"global_batch": 8192},
        },
    ),
]
CASES.insert(
    1,
    (
        "llama3-70b, 64 H100, PP8 VPP5 (near the DES limit)",
        EXAMPLES / "llama3-70b-p5.yaml",
        {
            "name": "llama3-70b-pp8",
            "parallelism": {"pp": 8, "vpp": 5, "dp": "auto"},
            "workload": {"global_batch": 64},
        },
    ),
)
# knob key -> candidate values (the first one that differs from the scenario's is used); each change
# is applied and timed, then set back and timed again. None = double the nodes (halve at 16k GPUs).
KNOBS = [
    ("train.tp", (4, 8)),
    ("train.nodes", None),
    ("train.recompute", ("full", "selective")),
    ("train.precision", ("fp8", "bf16")),
    ("train.pricing", ("capacity-block", "on-demand")),
]


def scenario_text(path: Path, changes: dict) -> str:
    data = yaml.safe_load(path.read_text())
    for section, value in changes.items():
        if isinstance(value, dict):
            data.setdefault(section, {}).update(value)
        else:
            data[section] = value
    return yaml.safe_dump(data, sort_keys=False)


def widget(at: AppTest, key: str):
    for kind in ("select_slider", "number_input", "selectbox"):
        try:
            return getattr(at, kind)(key=key)
        except KeyError:
            continue
    raise KeyError(key)


def timed_run(at: AppTest) -> float:
    t0 = time.perf_counter()
    at.run()
    dt = time.perf_counter() - t0
    assert not at.exception, [e.value for e in at.exception]
    return dt


def bench_apptest() -> list[float]:
    print("AppTest: one Training-page run per knob change (server side: script, fmsim call, charts)\n")
    print(f"{'scenario':52} {'GPUs':>7} {'knob':36} {'engine':>8} {'jobs':>7} {'new (s)':>8} {'back (s)':>9}")
    news = []
    for label, path, changes in CASES:
        text = scenario_text(path, changes)
        at = AppTest.from_file(str(APP / "Home.py"), default_timeout=120)
        at.run()
        at.switch_page("pages/1_Training.py")
        at.run()
        name = f"{label.split(',')[0]}.yaml"
        at.file_uploader(key="train.upload").set_value((name, text.encode(), "application/x-yaml"))
        first = timed_run(at)
        base = logic.load_base(text, name)
        est = fmsim.estimate(base)
        print(
            f"{label:52} {base.cluster.gpus:>7,} {'(first load)':36} {'':>8} "
            f"{logic.approx_des_jobs(base, est):>7,} {first:>8.3f}"
        )
        for key, value in KNOBS:
            w = widget(at, key)
            old = w.value
            if value is None:
                value = old * 2 if base.cluster.gpus < 16384 else old // 2
            else:
                value = next(v for v in value if v != old)
            w.set_value(value)
            new = timed_run(at)
            engine = (
                "error"
                if at.error and not at.metric
                else ("des" if "discrete-event" in " ".join(c.value for c in at.caption) else "estimate")
            )
            w = widget(at, key)
            w.set_value(old)
            back = timed_run(at)
            news.append(new)
            change = f"{key[6:]} {old} -> {value}"
            print(f"{'':52} {'':>7} {change:36} {engine:>8} {'':>7} {new:>8.3f} {back:>9.3f}")
    print(
        f"\nknob changes (not cached): median {statistics.median(news):.3f} s, worst {max(news):.3f} s "
        f"over {len(news)}; target: under 1 s"
    )
    return news


def bench_browser() -> None:
    """End to end in chromium: ArrowLeft on the tp slider until the step time on screen changes."""
    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fmsim.cli", "app", "--port", str(port), "--address", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp,
        )
        try:
            for _ in range(400):
                try:
                    urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.25)
            with sync_playwright() as pw:
                ctx = pw.chromium.launch_persistent_context(
                    str(Path(tmp) / "profile"),
                    executable_path="/usr/bin/chromium",
                    headless=True,
                    args=[
                        "--no-sandbox",
                        "--disable-gpu",
                        "--disable-quic",
                        "--no-first-run",
                        "--disable-background-networking",
                        "--disable-component-update",
                        "--disable-sync",
                    ],
                )
                page = ctx.new_page()
                page.goto(f"{url}/Training")
                value = (
                    page.locator('[data-testid="stMetric"]')
                    .filter(has_text="Step time")
                    .locator('[data-testid="stMetricValue"]')
                )
                value.wait_for(timeout=120_000)
                thumb = page.locator('.st-key-train-tp input[type="range"]')
                times = []
                for key in ("ArrowLeft", "ArrowRight", "ArrowRight", "ArrowLeft") * 2:
                    before = value.inner_text()
                    thumb.focus()
                    t0 = time.perf_counter()
                    thumb.press(key)
                    page.wait_for_function(
                        "([b]) => { const m = [...document.querySelectorAll('[data-testid=stMetric]')]"
                        ".find(e => e.innerText.includes('Step time'));"
                        "const v = m && m.querySelector('[data-testid=stMetricValue]');"
                        "return !!v && v.innerText !== b; }",
                        arg=[before],
                        timeout=60_000,
                    )
                    times.append(time.perf_counter() - t0)
                ctx.close()
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    print(
        f"\nbrowser (chromium, llama3-70b on 64 H100, tp slider, first two uncached): "
        f"{', '.join(f'{t:.2f}' for t in times)} s; median {statistics.median(times):.2f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--browser", action="store_true", help="also time a knob change end to end in chromium")
    args = ap.parse_args()
    bench_apptest()
    if args.browser:
        bench_browser()


if __name__ == "__main__":
    main()
