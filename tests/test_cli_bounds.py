"""Huge inputs stay bounded and serving reports its steady state (issue 31, items 12 and 18): sizes
no run could need refused at load, training steps folded past the pipeline's warm-up, serving runs
capped in requests, throughput without the drain, the SLO verdict in the human block."""

from pathlib import Path

import pytest

from fmsim.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


# -- 12: huge inputs are bounded -------------------------------------------------------------------

EXAMPLE = ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml"


@pytest.mark.parametrize("override, field", [
    ("workload.global_batch=1e26", "workload.global_batch"),
    ("workload.global_batch_tokens=1e13", "workload.global_batch_tokens"),
    ("workload.seq_len=1e9", "workload.seq_len"),
    ("cluster.nodes=1e8", "cluster.nodes"),
])
def test_sizes_no_run_could_need_are_refused_at_load(capsys, override, field):
    extra = ["--set", "workload.global_batch=null"] if "tokens" in override else []
    for command in ("lint", "run"):
        code, _, err = run_cli(capsys, command, EXAMPLE, *extra, "--set", override)
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"{EXAMPLE}: {field}: "), err
        assert "any" in err


def test_the_step_of_a_huge_batch_is_folded_in_bounded_memory_and_agrees_with_the_estimate():
    import tracemalloc

    import fmsim

    small = fmsim.load_scenario(EXAMPLE)
    des_small, est_small = fmsim.simulate(small), fmsim.estimate(small)
    results = {}
    for gb in (131_072, 1_048_576):
        sc = fmsim.load_scenario(EXAMPLE, overrides={"workload.global_batch": gb})
        if gb > 131_072:
            tracemalloc.start()
        try:
            results[gb] = (fmsim.simulate(sc), fmsim.estimate(sc))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 200 * 2**20                         # a full run of 2^20 sequences took > 20 GB
    (a, _), (b, _) = results.values()
    assert a.details["num_jobs"] == b.details["num_jobs"] < 20_000    # the cost does not grow with the batch
    gap_small = abs(est_small.metrics["step_time_s"] - des_small.metrics["step_time_s"])
    for des, est in results.values():
        assert des.details["folded"]["microbatches"] == des.metrics["num_microbatches"]
        # the steady state is extrapolated exactly: the estimate's offset from the DES stays what it is
        # at the bundled batch (a fixed 8 ms of fill and drain), whatever the step's length
        assert abs(est.metrics["step_time_s"] - des.metrics["step_time_s"]) == pytest.approx(gap_small, abs=1e-6)
        assert sum(des.breakdown.values()) == pytest.approx(des.metrics["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("overrides", [
    {},
    {"parallelism.zero": 3},
    {"cluster.stragglers": {"cv": 0.05}, "parallelism.overlap": {"pp_comm": False}},
    {"parallelism.vpp": 1, "parallelism.schedule": "1f1b", "parallelism.pp": 4, "parallelism.tp": 8},
])
def test_a_folded_step_equals_the_step_simulated_in_full(monkeypatch, overrides):
    import fmsim
    import fmsim.workloads.pretrain as pretrain

    sc = fmsim.load_scenario(EXAMPLE, overrides={**overrides, "workload.global_batch": 272})   # 136 micro-batches
    folded = fmsim.simulate(sc)
    assert "folded" in folded.details and folded.metrics["num_microbatches"] > pretrain.FOLD_ABOVE
    monkeypatch.setattr(pretrain, "FOLD_ABOVE", 10**9)
    full = fmsim.simulate(sc)
    assert "folded" not in full.details
    assert folded.metrics["step_time_s"] == pytest.approx(full.metrics["step_time_s"], rel=1e-11)
    for part in set(full.breakdown) | set(folded.breakdown):
        assert folded.breakdown.get(part, 0.0) == pytest.approx(full.breakdown.get(part, 0.0), abs=1e-9)


# -- 12 and 18: serving runs are bounded and report their steady state ---------------------------

SERVING = ROOT / "scenarios" / "examples" / "serving-llama3.1-8b-g6e.yaml"


@pytest.mark.parametrize("override, field", [
    ("traffic.requests=2e9", "traffic.requests"),
    ("test_time_compute.samples=1e6", "test_time_compute.samples"),
])
def test_serving_sizes_no_run_could_need_are_refused_at_load(capsys, override, field):
    for command in ("lint", "run"):
        code, _, err = run_cli(capsys, command, SERVING, "--set", override)
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"{SERVING}: {field}: "), err


def test_ten_million_requests_simulate_a_capped_steady_state_in_bounded_memory(monkeypatch):
    import tracemalloc

    import fmsim
    import fmsim.workloads.inference as inference

    monkeypatch.setattr(inference, "MAX_SIMULATED_QUESTIONS", 400)     # the cap's logic, at a test's size
    sc = fmsim.load_scenario(SERVING, overrides={"traffic.requests": 10_000_000})
    tracemalloc.start()
    try:
        res = fmsim.simulate(sc)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20          # ten million requests' lengths alone would take 160 MB
    assert res.metrics["requests_simulated"] == 400 and res.metrics["requests_offered"] == 10_000_000
    assert res.details["request_cap"]["cap"] == 400


def test_serving_throughput_is_the_steady_state_and_does_not_change_with_the_request_count():
    import fmsim

    fixed = {"traffic.arrival": "constant", "traffic.prompt_len": 500, "traffic.output_len": 200}
    rates = []
    for n in (600, 1800):
        m = fmsim.simulate(fmsim.load_scenario(SERVING, overrides={**fixed, "traffic.requests": n})).metrics
        assert m["steady_state_window_s"] < m["sim_duration_s"]          # the drain is left out
        rates.append((m["output_tokens_per_s"], m["requests_per_s"]))
    (tok_a, req_a), (tok_b, req_b) = rates
    assert tok_a == pytest.approx(tok_b, rel=1e-3) and req_a == pytest.approx(req_b, rel=1e-3)
    assert req_a == pytest.approx(30.0, rel=1e-3)          # the offered 30/s, served in full


def test_the_serving_block_says_whether_the_slos_are_met(capsys):
    code, out, _ = run_cli(capsys, "run", SERVING, "--estimate")
    assert code == 0 and "  SLO met: ttft_p99 " in out and "<= 1 s; tpot_p99 " in out
    code, out, err = run_cli(capsys, "run", SERVING, "--estimate", "--set", "slo.ttft_p99=1 ms")
    assert code == 3 and "  SLO NOT met: ttft_p99 " in out and "> 1 ms" in out
    bare = ROOT / "scenarios" / "validation" / "inference" / "inf-057.yaml"
    code, out, _ = run_cli(capsys, "run", bare, "--estimate")
    assert "  SLO: none given" in out
