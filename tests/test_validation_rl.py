"""RL predictions against published measurements (scenarios/validation/rl).

Issue 26's bar for NeMo RL v0.4 GRPO: step time median |error| <= 10 %, worst <= 25 %. Not met: on
2026-12-02 the 7 step times are predicted 11-62 % short (median 34.4 %, worst 62.0 %; docs/rl.md
"Validation" decomposes every row against NeMo RL's step timer and says why the target is blocked after
three sessions of sourced physics). These tests guard today's level -- they fail if the set gets
worse than it is plus a small margin -- and the target is a strict xfail until it is met.
"""

from __future__ import annotations

import statistics
from functools import lru_cache
from pathlib import Path

import pytest

import fmsim
from fmsim.scenario import load_scenario
from fmsim.validate import validate_scenarios

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "scenarios" / "validation" / "rl").glob("rl-*.yaml"))
#: today's level (2026-12-02, with vLLM 0.11's per-entry-point limits: step 34.4 % / 62.0 %, tokens/s/GPU
#: 58.7 % / 169.2 %; unchanged by the third session, which found nothing sourced to add) plus a small margin.
#: The MoE policy updates' expert rows as routing draws them (kernels.routed_grouped_gemm_efficiency, 2026-12-02):
#: step worst 61.9 -> 61.6 % (rl-022), tokens/s/GPU worst 168.8 -> 166.4 % (rl-022), medians unchanged.
STEP_MEDIAN_BOUND, STEP_WORST_BOUND = 37.0, 64.5
TOKENS_MEDIAN_BOUND, TOKENS_WORST_BOUND = 62.0, 169.0
#: "G-Average Seq len" of each summary row: the mean generated length of a sample, as cut by max_model_len
G_AVG = {"rl-010": 1060, "rl-014": 745, "rl-016": 744, "rl-019": 5671, "rl-020": 5691, "rl-022": 3154,
         "rl-024": 3158, "rl-028": 3207}


@lru_cache(maxsize=1)
def errors() -> tuple[tuple[str, str, float], ...]:
    rows = validate_scenarios((load_scenario(p) for p in CASES), fmsim.simulate, jobs=1)
    assert not [r.error for r in rows if r.error], "scenarios that raised"
    return tuple((r.scenario, r.key, abs(r.error_pct)) for r in rows if r.error_pct is not None)


def _errors(key: str) -> list[float]:
    vals = [e for _, k, e in errors() if k == key]
    assert vals
    return vals


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_each_file_draws_responses_whose_clipped_mean_is_the_summary_g_avg(path):
    import numpy as np

    from fmsim.workloads.rl_spec import parse_rl_spec

    sc = load_scenario(path)
    spec = parse_rl_spec(sc.extra, file=sc.file, policy=sc.workload.model)
    drawn = spec.response_len.sample(np.random.default_rng(0), 200_000)
    assert drawn.max() <= spec.max_response_len
    assert abs(drawn.mean() / G_AVG[path.stem] - 1.0) < 0.01, drawn.mean()


def test_nemo_rl_step_time_stays_at_todays_level():
    vals = _errors("step_time_s")
    assert len(vals) == 7
    assert statistics.median(vals) <= STEP_MEDIAN_BOUND and max(vals) <= STEP_WORST_BOUND, vals


def test_nemo_rl_tokens_per_gpu_stays_at_todays_level():
    vals = _errors("tokens_per_s_per_gpu")
    assert statistics.median(vals) <= TOKENS_MEDIAN_BOUND and max(vals) <= TOKENS_WORST_BOUND, vals


@pytest.mark.xfail(
    strict=True, reason="issue 26 target not met (blocked, docs/rl.md): step times predicted 11-62 % short"
)
def test_nemo_rl_step_time_meets_the_issue_target():
    vals = _errors("step_time_s")
    assert statistics.median(vals) <= 10.0 and max(vals) <= 25.0
