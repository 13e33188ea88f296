"""Serving scenarios end to end: bundled examples stay in their bands, validation files build and
stay within the recorded error bound, errors are located, plan-capacity answers, traces are written."""
from __future__ import annotations

import glob
import json
import statistics
from pathlib import Path

import pytest

import fmsim
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.scenario import load_scenario, scenario_from_mapping
from fmsim.workloads.inference import plan_from_scenario, simulate_inference

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(glob.glob(str(ROOT / "scenarios/examples/serving-*.yaml")))
VALIDATION = sorted(glob.glob(str(ROOT / "scenarios/validation/inference/*.yaml")))


def test_there_are_bundled_examples_and_twenty_validation_rows():
    assert len(EXAMPLES) >= 4
    assert len(VALIDATION) >= 20


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_bundled_example_stays_in_its_expect_bands(path):
    sc = load_scenario(path)
    assert sc.expect, "every bundled serving example carries expect: bands"
    res = fmsim.simulate(sc)
    assert res.kind == "inference" and res.usd_per_hour
    for key, band in sc.expect.items():
        assert band.contains(res.get(key)), f"{key}: {res.get(key)} outside {band.band()}"


@pytest.mark.parametrize("path", VALIDATION, ids=lambda p: Path(p).stem)
def test_validation_scenario_builds_a_plan_with_a_measurement(path):
    sc = load_scenario(path)
    assert sc.measured and sc.measured_source
    plan = plan_from_scenario(sc)
    assert plan.pools


# A fast, fixed subset of the validation rows (about 2 s). The bound is the error the simulator
# reaches today on these rows, so a physics change that makes them worse fails here; the target
# of issue 5 (median <= 10 % on throughput) is tracked by `fmsim validate`, see docs/serving.md.
REGRESSION_ROWS = ("inf-061", "inf-067", "inf-068", "inf-070", "inf-071", "inf-079", "inf-080", "inf-086",
                   "inf-088", "inf-089", "inf-090", "inf-091", "inf-093", "inf-094")
# measured 5.0 % with the K-depth GEMM efficiency (was 15 %); 6.5 % since decode batches larger than
# the engine's batch limit stopped being padded to CUDA graphs that are never captured; 3.0 % with
# tile and wave quantization of the decode GEMMs and H200's measured HBM efficiency; 4.4 % once prefill
# attention runs at the measured forward-causal rate (0.55 on Hopper, was the GEMM rate 0.80): the 8B
# 20k-token rows here went from -3 to -8 %, while the whole set improved (throughput mean 14.5 -> 14.1 %)
# (still 4.4 % after inf-093/094 took their source's attention-DP configuration: +38 / +88 %); 3.6 -> 5.7 %
# (2026-12-02) once inf-079/080 run the 16-bit KV cache nvidia/Llama-3.1-405B-Instruct-FP8 declares
# (hf_quant_config.json kv_cache_quant_algo null; -0.2 / +13.3 -> -11.7 / -14.1 %, the files' notes)
REGRESSION_MEDIAN_BOUND = 0.06


def test_validation_subset_median_error_stays_within_its_recorded_bound():
    errs = []
    for row in REGRESSION_ROWS:
        sc = load_scenario(ROOT / f"scenarios/validation/inference/{row}.yaml")
        res = simulate_inference(sc)
        for key, measured in sc.measured.items():
            errs.append(abs(res.get(key) - measured) / measured)
    assert statistics.median(errs) <= REGRESSION_MEDIAN_BOUND


def _mapping(**sections):
    base = {"version": 1, "name": "t", "workload": {"kind": "inference", "model": "llama3.1-8b",
                                                      "precision": "bf16"},
            "parallelism": {"tp": 1}, "cluster": {"instance": "p5.48xlarge", "nodes": 1},
            "traffic": {"arrival": "offline", "requests": 20, "prompt_len": 100, "output_len": 20}}
    base.update(sections)
    return base


def test_a_bad_serving_key_is_reported_with_file_and_field():
    sc = scenario_from_mapping(_mapping(serving={"engnie": "vllm"}), file="bad.yaml")
    with pytest.raises(ConfigError) as e:
        fmsim.simulate(sc)
    assert str(e.value).startswith("bad.yaml: serving.engnie: unknown key") and "'engine'" in str(e.value)


def test_too_many_replicas_for_the_cluster_is_located():
    sc = scenario_from_mapping(_mapping(serving={"replicas": 9}), file="r.yaml")
    with pytest.raises(ConfigError, match=r"r\.yaml: serving\.replicas: 9 replicas"):
        fmsim.simulate(sc)


def test_estimate_goes_through_the_facade():
    sc = scenario_from_mapping(_mapping(), file="e.yaml")
    est = fmsim.estimate(sc)
    assert est.details["method"] == "analytical" and est.get("output_tokens_per_s") > 0
    row = est.to_dict()
    assert row["kind"] == "inference" and "tpot_p50_s" in row


def test_trace_is_a_chrome_trace(tmp_path):
    sc = scenario_from_mapping(_mapping(), file="t.yaml")
    out = tmp_path / "trace.json"
    simulate_inference(sc, trace_path=str(out))
    data = json.loads(out.read_text())
    assert any(e.get("ph") == "X" for e in data["traceEvents"])


def test_plan_capacity_prints_the_frontier_and_a_fleet(capsys):
    rc = main(["plan-capacity", str(ROOT / "scenarios/examples/serving-llama3.1-8b-g6e.yaml"), "--qps", "20",
               "--instances", "g6e.48xlarge,p5.48xlarge", "--estimate"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "searched frontier at 20 requests/s" in out
    assert "g6e.48xlarge:" in out and "p5.48xlarge:" in out and "cheapest:" in out


def test_plan_capacity_needs_an_slo(tmp_path, capsys):
    import yaml

    f = tmp_path / "noslo.yaml"
    f.write_text(yaml.safe_dump(_mapping(traffic={"rate": "5/s", "requests": 50, "prompt_len": 100,
                                                   "output_len": 20})))
    rc = main(["plan-capacity", str(f), "--qps", "5"])
    err = capsys.readouterr().err
    assert rc == 2 and "plan-capacity needs latency targets" in err and f"{f}: slo:" in err


def test_plan_capacity_simulation_finds_the_smallest_fleet():
    from fmsim.cli_plan import plan_capacity

    sc = load_scenario(ROOT / "scenarios/examples/serving-llama3.1-8b-g6e.yaml")
    plan = plan_capacity(sc, 20.0)
    best = plan.best_per_instance["g6e.48xlarge"]
    assert best is not None and best.slo_met
    smaller = [p for p in plan.points if p.replicas == best.replicas - 1]
    assert all(not p.slo_met for p in smaller)
