"""The kind: inference sections: parsing, defaults, located errors and seeded length sampling."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsim.errors import ConfigError
from fmsim.workloads.inference_spec import (
    LengthDist,
    parse_inference_spec,
    parse_length,
    parse_slo,
    parse_traffic,
    parse_ttc,
)


def test_defaults_give_a_poisson_vllm_setup():
    spec = parse_inference_spec({"traffic": {"rate": "5/s"}})
    assert spec.traffic.arrival == "poisson"
    assert spec.traffic.rate_per_s == 5.0
    assert spec.serving.engine == "vllm"
    assert spec.ttc.samples == 1 and spec.ttc.strategy == "none"
    assert spec.slo.limits_s == {}


def test_rate_units_and_infinity_choose_the_arrival():
    assert parse_traffic({"rate": "600/min"}, None).rate_per_s == pytest.approx(10.0)
    assert parse_traffic({"rate": "inf"}, None).arrival == "offline"
    assert parse_traffic({"concurrency": 16}, None).arrival == "closed-loop"


def test_unknown_key_names_file_field_and_suggestion():
    with pytest.raises(ConfigError) as e:
        parse_inference_spec({"traffic": {"rate": 1}, "serving": {"max_seq": 64}}, file="x.yaml")
    assert str(e.value).startswith("x.yaml: serving.max_seq: unknown key")
    assert "max_seqs" in str(e.value)


def test_poisson_without_rate_is_an_error():
    with pytest.raises(ConfigError, match=r"traffic\.rate: is required"):
        parse_traffic({"arrival": "poisson"}, "f.yaml")


def test_concurrency_only_for_closed_loop():
    with pytest.raises(ConfigError, match=r"traffic\.concurrency"):
        parse_traffic({"arrival": "poisson", "rate": 1, "concurrency": 4}, None)


def test_lognormal_needs_exactly_one_of_mean_or_median():
    with pytest.raises(ConfigError, match=r"traffic\.prompt_len\.median"):
        parse_length({"dist": "lognormal", "sigma": 1.0}, file=None, where="traffic.prompt_len")
    with pytest.raises(ConfigError, match=r"exactly one"):
        parse_length({"dist": "lognormal", "mean": 5, "median": 4, "sigma": 1}, file=None, where="x")


def test_length_accepts_counts_with_suffix():
    assert parse_length("2k", file=None, where="x") == LengthDist(kind="fixed", value=2000)


def test_best_of_n_needs_a_verifier_and_two_samples():
    with pytest.raises(ConfigError, match="verifier"):
        parse_ttc({"samples": 4, "strategy": "best-of-n"}, None)
    with pytest.raises(ConfigError, match="samples"):
        parse_ttc({"samples": 1, "strategy": "self-consistency"}, None)


def test_verifier_model_resolves_from_the_catalog():
    t = parse_ttc({"samples": 4, "verifier": {"model": "llama3.1-8b", "tp": 1}}, None)
    assert t.strategy == "best-of-n"
    assert t.verifier.model.name == "llama3.1-8b"


def test_unknown_verifier_model_is_located():
    with pytest.raises(ConfigError) as e:
        parse_ttc({"samples": 4, "verifier": {"model": "llama3.1-8c"}}, "s.yaml")
    assert "test_time_compute.verifier.model" in str(e.value)


def test_slo_flat_and_nested_forms_agree():
    a = parse_slo({"ttft_p99": "2 s", "tpot_p50": "50 ms"}, None)
    b = parse_slo({"ttft": {"p99": "2 s"}, "tpot": {"p50": "50 ms"}}, None)
    assert a == b
    assert a.limits_s[("tpot", "p50")] == pytest.approx(0.05)
    assert a.per_request_limit("ttft") == pytest.approx(2.0)
    assert math.isinf(a.per_request_limit("e2e"))


def test_empirical_lengths_read_a_csv_column(tmp_path):
    f = tmp_path / "lens.csv"
    f.write_text("prompt,output\n10,3\n20,5\n30,7\n")
    d = parse_length({"dist": "empirical", "file": "lens.csv", "column": "output"},
                     file=str(tmp_path / "s.yaml"), where="traffic.output_len")
    assert d.values == (3, 5, 7)
    assert set(d.sample(np.random.default_rng(0), 50).tolist()) <= {3, 5, 7}


def test_empirical_missing_column_suggests(tmp_path):
    f = tmp_path / "lens.csv"
    f.write_text("prompt,output\n10,3\n")
    with pytest.raises(ConfigError, match="did you mean 'output'"):
        parse_length({"dist": "empirical", "file": str(f), "column": "outptu"}, file=None, where="x")


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(["fixed", "uniform", "normal", "lognormal"]), seed=st.integers(0, 2**31),
       lo=st.integers(1, 50), hi=st.integers(0, 500))
def test_samples_are_clipped_integers_and_seeded(kind, seed, lo, hi):
    d = {"fixed": LengthDist(kind="fixed", value=100, min=lo, max=hi),
         "uniform": LengthDist(kind="uniform", low=1, high=400, min=lo, max=hi),
         "normal": LengthDist(kind="normal", mean=100, stdev=80, min=lo, max=hi),
         "lognormal": LengthDist(kind="lognormal", median=100, sigma=1.0, min=lo, max=hi)}[kind]
    if hi and hi < lo:
        return
    a = d.sample(np.random.default_rng(seed), 200)
    b = d.sample(np.random.default_rng(seed), 200)
    assert (a == b).all()
    assert a.dtype == np.int64 and (a >= lo).all()
    if hi:
        assert (a <= hi).all()


def test_lognormal_mean_parameter_is_the_arithmetic_mean():
    d = LengthDist(kind="lognormal", mean=300, sigma=0.8)
    x = d.sample(np.random.default_rng(1), 200_000)
    assert x.mean() == pytest.approx(300, rel=0.02)
    assert d.expected() == pytest.approx(300)


@pytest.mark.parametrize("dist", [
    LengthDist(kind="lognormal", median=168, sigma=1.0, min=4, max=1024, outside="redraw"),
    LengthDist(kind="lognormal", median=118, sigma=1.06, min=4, outside="redraw"),
    LengthDist(kind="normal", mean=100, stdev=80, min=20, max=150, outside="redraw"),
    LengthDist(kind="uniform", low=1, high=400, min=100, max=300, outside="redraw"),
], ids=["lognormal-window", "lognormal-floor", "normal", "uniform"])
def test_redraw_truncates_instead_of_piling_up_at_the_bounds(dist):
    x = dist.sample(np.random.default_rng(3), 400_000)
    assert (x >= dist.min).all() and (not dist.max or (x <= dist.max).all())
    # a clip would put the whole tail on the bound; a truncated distribution keeps it thin there
    clipped = dataclasses.replace(dist, outside="clip").sample(np.random.default_rng(3), 400_000)
    bound = dist.max or dist.min
    assert (x == bound).mean() < (clipped == bound).mean()
    # the analytical estimate's mean is the truncated distribution's mean
    assert dist.expected() == pytest.approx(x.mean(), rel=0.01)


def test_redraw_of_a_length_that_can_never_fall_inside_is_refused():
    with pytest.raises(ConfigError, match="outside: redraw can never draw"):
        parse_length({"dist": "fixed", "value": 5, "min": 10, "outside": "redraw"}, file="s.yaml",
                     where="traffic.output_len")
    with pytest.raises(ConfigError, match="traffic.output_len.outside"):
        parse_length({"dist": "fixed", "value": 5, "outside": "drop"}, file="s.yaml", where="traffic.output_len")
    far = LengthDist(kind="lognormal", median=10, sigma=0.1, min=10_000, outside="redraw")
    with pytest.raises(ConfigError, match="almost no draws"):
        far.sample(np.random.default_rng(0), 10)


def _sharegpt_scenario(**traffic):
    base = {"arrival": "offline", "requests": 3000,
            "prompt_len": {"dist": "lognormal", "median": 168, "sigma": 1.0, "min": 4, "max": 1024,
                           "outside": "redraw"},
            "output_len": {"dist": "lognormal", "median": 118, "sigma": 1.06, "min": 4, "outside": "redraw"}}
    base.update(traffic)
    return {"version": 1, "name": "sharegpt", "workload": {"kind": "inference", "model": "llama3.1-8b"},
            "parallelism": {"tp": 1}, "cluster": {"instance": "p5.48xlarge", "nodes": 1}, "traffic": base}


def _drawn(data):
    from fmsim.scenario import scenario_from_mapping
    from fmsim.workloads.inference import _Simulation, plan_from_scenario

    sim = _Simulation(plan_from_scenario(scenario_from_mapping(data)))
    return sim.prompts, sim.outs


def test_max_total_len_redraws_requests_like_the_benchmark_filter():
    prompts, outs = _drawn(_sharegpt_scenario(max_total_len=2048))
    assert (prompts + outs.max(axis=(1, 2)) <= 2048).all()
    assert (prompts <= 1024).all() and (prompts >= 4).all() and (outs >= 4).all()
    # without the cap the same distributions do draw longer requests
    prompts, outs = _drawn(_sharegpt_scenario())
    assert (prompts + outs.max(axis=(1, 2)) > 2048).any()


def test_max_total_len_below_the_shortest_request_names_the_field():
    with pytest.raises(ConfigError, match="no request fits") as exc:
        parse_traffic(_sharegpt_scenario(max_total_len=6)["traffic"], "s.yaml")
    assert exc.value.field == "traffic.max_total_len"


def test_the_sections_use_the_shared_reader_and_a_bad_limit_is_one_located_line():
    from fmsim import fields
    from fmsim.workloads import inference_spec, rl_spec

    assert inference_spec._Section is fields._Section and rl_spec._Section is fields._Section
    with pytest.raises(ConfigError) as e:   # a null limit was a TypeError traceback before the shared reader
        parse_slo({"ttft_p99": None}, "x.yaml")
    assert str(e.value) == "x.yaml: slo.ttft_p99: is required (a latency like '2 s' or '50 ms')"
    with pytest.raises(ConfigError) as e:   # the nested form names the nested path
        parse_slo({"itl": {"p99": 0}}, "x.yaml")
    assert str(e.value) == "x.yaml: slo.itl.p99: 0 must be > 0 (expected a latency like '2 s' or '50 ms')"


def test_a_negative_think_time_is_refused_on_one_located_line():
    sc = _sharegpt_scenario()["traffic"]
    with pytest.raises(ConfigError) as e:
        parse_traffic({**sc, "think_time": "-2 s"}, "x.yaml")
    assert e.value.field == "traffic.think_time" and "must be >= 0" in str(e.value) and "\n" not in str(e.value)
    assert parse_traffic({**sc, "think_time": "0 s"}, "x.yaml").think_time_s == 0.0
