"""Serving predictions against published measurements (scenarios/validation/inference).

Issue 5 sets the bar: median |error| <= 10 % on throughput and <= 15 % on latency percentiles. Both
are met and asserted over the whole set (2026-12-01: 8.7 % over 41 throughput values, 7.9 % before
throughput left out the drain; 10.7 % over 9 latency values).
"""
from __future__ import annotations

import statistics
from functools import lru_cache
from pathlib import Path

import fmsim
from fmsim.scenario import load_scenario
from fmsim.validate import validate_scenarios

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "scenarios" / "validation" / "inference").glob("*.yaml"))
LATENCY_PREFIXES = ("ttft", "tpot", "itl", "e2e")


@lru_cache(maxsize=1)
def errors() -> tuple[tuple[str, str, float], ...]:
    rows = validate_scenarios((load_scenario(p) for p in CASES), fmsim.simulate, jobs=2)
    assert not [r.error for r in rows if r.error], "scenarios that raised"
    return tuple((r.scenario, r.key, abs(r.error_pct)) for r in rows if r.error_pct is not None)


def _median(latency: bool) -> float:
    vals = [e for _, metric, e in errors() if metric.startswith(LATENCY_PREFIXES) == latency]
    assert vals
    return statistics.median(vals)


def test_serving_throughput_meets_the_issue_target_over_the_whole_set():
    assert _median(latency=False) <= 10.0, f"throughput median {_median(latency=False):.1f} %"


def test_serving_latency_meets_the_issue_target_over_the_whole_set():
    assert _median(latency=True) <= 15.0, f"latency median {_median(latency=True):.1f} %"
