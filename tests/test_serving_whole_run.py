"""The whole run's serving rates (run_output_tokens_per_s, run_requests_per_s) beside the steady state's.

A benchmark of a fixed set of requests (trtllm-bench, sglang/vllm bench_serving) prints all the output
tokens over first start to last finish, drain included; the validation files that quote such a figure
compare it with these columns (scenarios/validation/README.md, "inference/"). These tests keep the two
kinds of column from silently swapping.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import fmsim
import fmsim.workloads.inference as inference
from fmsim.scenario import load_scenario, scenario_from_mapping

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = sorted((ROOT / "scenarios" / "validation" / "inference").glob("*.yaml"))


def _closed_batch(requests: int, output_len):
    return scenario_from_mapping(
        {"version": 1, "name": "closed", "workload": {"kind": "inference", "model": "llama3.1-8b",
                                                      "precision": "bf16"},
         "parallelism": {"tp": 1}, "cluster": {"instance": "p5.48xlarge", "nodes": 1},
         "serving": {"engine": "vllm", "replicas": 1, "max_seqs": 64},
         "traffic": {"arrival": "offline", "requests": requests, "prompt_len": 200,
                     "output_len": output_len}},
        file="closed.yaml")


def test_a_fixed_request_count_file_s_whole_run_rate_includes_the_drain():
    # inf-107: sglang.bench_serving, ShareGPT lengths, every request sent at once (here 1,000 of its 5,000)
    sc = load_scenario(ROOT / "scenarios" / "validation" / "inference" / "inf-107.yaml",
                       overrides={"traffic.requests": 1000})
    m = fmsim.simulate(sc).metrics
    n, dur = m["requests_simulated"], m["sim_duration_s"]
    assert n == 1000 and m["steady_state_window_s"] < dur                  # a drain exists and is left out
    # the whole run: every output token over first arrival to last answer, as bench_serving divides
    assert m["run_output_tokens_per_s"] == pytest.approx(m["mean_output_tokens"] * n / dur, rel=1e-9)
    assert m["run_requests_per_s"] == pytest.approx(n / dur, rel=1e-9)
    # a closed batch with spread lengths empties slowly: the whole run is slower than its steady state
    assert m["run_output_tokens_per_s"] < 0.95 * m["output_tokens_per_s"]
    assert m["run_requests_per_s"] < 0.95 * m["requests_per_s"]


#: files whose source publishes a pool's rate at its full batch (scenarios/validation/README.md's table: SGLang's
#: DeepSeek-V3 large-scale EP pools, LMSYS blog 2025-05-05), compared with the steady-state columns
STEADY_RATE_FILES = ("inf-113", "inf-114", "inf-115", "inf-116")


@pytest.mark.parametrize("path", VALIDATION, ids=lambda p: p.stem)
def test_validation_files_quote_whole_run_throughputs_against_the_whole_run_columns(path):
    # every other throughput in the set is a fixed-request-count benchmark's (the README's table); a file whose
    # source publishes a steady-state rate names output_tokens_per_s and is listed there as such
    rates = [k for k in load_scenario(path).measured if "_per_s" in k]
    steady = path.stem in STEADY_RATE_FILES
    assert all(k.startswith("run_") != steady for k in rates), f"{path.name}: {rates}"


@pytest.mark.parametrize("output_len, tolerance", [(200, 0.03), ({"dist": "lognormal", "median": 200,
                                                                    "sigma": 0.8}, 0.08)],
                         ids=["fixed-lengths", "lognormal-lengths"])
def test_a_capped_run_s_whole_run_rate_stands_for_every_offered_request(monkeypatch, output_len, tolerance):
    full = fmsim.simulate(_closed_batch(1200, output_len)).metrics
    monkeypatch.setattr(inference, "MAX_SIMULATED_QUESTIONS", 300)
    capped = fmsim.simulate(_closed_batch(1200, output_len)).metrics
    assert capped["requests_simulated"] == 300 and capped["requests_offered"] == 1200
    # the 300 simulated requests' ramp-up and drain once, the other 900 at the steady state: close to the
    # 1,200-request run (the 300 alone, drain and all, came out 4 % / 41 % slower when measured)
    assert capped["run_output_tokens_per_s"] == pytest.approx(full["run_output_tokens_per_s"], rel=tolerance)
    own = capped["mean_output_tokens"] * 300 / capped["sim_duration_s"]
    assert abs(own / full["run_output_tokens_per_s"] - 1) > abs(
        capped["run_output_tokens_per_s"] / full["run_output_tokens_per_s"] - 1)
    assert full["run_output_tokens_per_s"] <= full["output_tokens_per_s"] * 1.001


def test_the_estimate_has_no_drain_and_leaves_the_whole_run_columns_empty():
    est = fmsim.estimate(_closed_batch(200, 200))
    assert est.get("output_tokens_per_s") > 0
    assert est.get("run_output_tokens_per_s") is None and est.get("run_requests_per_s") is None
