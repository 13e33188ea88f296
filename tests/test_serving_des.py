"""Behaviour of the continuous-batching serving DES: latency accounting, Little's law, batching,
KV admission and preemption, shared prefixes, test-time compute, disaggregation, determinism."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fmsim.catalog import load_catalog
from fmsim.engine.serving_des import itl_samples, weighted_percentile
from fmsim.model.serving_cost import IterationWork
from fmsim.workloads.inference import _collect, _Simulation, build_plan, estimate_metrics, simulate_plan
from fmsim.workloads.inference_spec import parse_inference_spec

CAT = load_catalog()


def make_plan(extra, *, model="llama3.1-8b", inst="dgx-h100", prec="bf16", tp=1, nodes=1, seed=0,
              collective=None):
    spec = parse_inference_spec(extra)
    return build_plan(name="t", model=CAT.model(model), instance=CAT.instance(inst), precision=prec, tp=tp,
                      nodes=nodes, spec=spec, seed=seed, collective=collective)


def run(plan):
    sim = _Simulation(plan)
    sim.run()
    return sim, _collect(sim)


def test_single_request_latency_is_prefill_plus_n_decode_steps():
    P, N = 500, 50
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 1, "prompt_len": P, "output_len": N},
                      "serving": {"engine": "vllm", "replicas": 1}})
    _, m = run(plan)
    cost = plan.pool("serve").cost
    ttft = cost.iteration_time(cost.prefill_work(P, 0, finishing=True))
    c0, c1 = cost.decode_coeffs(1)
    decode = sum(c0 + c1 * (P + 1 + j) for j in range(N - 1))    # context grows by one per step
    assert m["ttft_p50_s"] == pytest.approx(ttft, rel=1e-9)
    assert m["e2e_p50_s"] == pytest.approx(ttft + decode, rel=1e-9)
    assert m["tpot_p50_s"] == pytest.approx(decode / (N - 1), rel=1e-9)


def test_littles_law_holds_for_the_decode_batch():
    """Time-averaged running sequences = completion rate x mean decode time (L = lambda W)."""
    plan = make_plan({"traffic": {"arrival": "poisson", "rate": "20/s", "requests": 600, "prompt_len": 300,
                                  "output_len": {"dist": "lognormal", "mean": 200, "sigma": 0.5}},
                      "serving": {"engine": "vllm", "replicas": 1}})
    sim, m = run(plan)
    duration = m["sim_duration_s"]
    L = sum(e.stats.batch_seq_seconds for e in sim.engines["serve"]) / duration
    decode_times = []
    for j in sim.gen_jobs:
        decode_times.extend((j.finish_s - j.first_token_s).tolist())
    lam = len(decode_times) / duration
    W = float(np.mean(decode_times))
    assert L == pytest.approx(lam * W, rel=0.01)
    assert 1.0 < L


def test_no_request_is_lost_when_the_horizon_cuts_an_overloaded_run():
    plan = make_plan({"traffic": {"arrival": "poisson", "rate": "80/s", "requests": 400, "horizon": "3 s",
                                  "prompt_len": 1000, "output_len": 500},
                      "serving": {"engine": "vllm", "replicas": 1, "max_seqs": 16}})
    sim, m = run(plan)
    issued = len(sim.questions)
    done = sum(1 for q in sim.questions if not math.isnan(q.done_s))
    assert m["unfinished_requests"] > 0
    assert done + m["unfinished_requests"] + m["rejected_requests"] == issued
    assert m["not_issued_requests"] == plan.spec.traffic.num_requests - issued
    assert m["slo_met"] is None          # no SLO given


def test_a_run_cut_at_its_horizon_counts_the_tokens_generated_in_the_window():
    traffic = {"arrival": "poisson", "rate": "80/s", "requests": 400, "prompt_len": 1000, "output_len": 500}
    serving = {"engine": "vllm", "replicas": 1, "max_seqs": 16}
    sim, m = run(make_plan({"traffic": {**traffic, "horizon": "3 s"}, "serving": serving}))
    assert m["unfinished_requests"] > 0
    assert m["sim_duration_s"] == pytest.approx(3.0 - min(q.arrival_s for q in sim.questions))
    finished = sum(int(j.out[~np.isnan(j.finish_s)].sum()) for j in sim.gen_jobs)
    in_flight = sum(int(j.gen[np.isnan(j.finish_s)].sum()) for j in sim.gen_jobs)
    assert in_flight > 0                                     # the running batch's progress is counted
    assert m["output_tokens_per_s"] * m["sim_duration_s"] == pytest.approx(finished + in_flight)
    # 16 sequences a step at most: the window cannot hold more tokens than 16 per decode step
    cost = sim.plan.pool("serve").cost
    step = cost.decode_coeffs(16)[0]
    assert m["output_tokens_per_s"] <= 16 / step
    # a horizon past the last finish changes nothing
    _, drained = run(make_plan({"traffic": traffic, "serving": serving}))
    _, late = run(make_plan({"traffic": {**traffic, "horizon": "1 h"}, "serving": serving}))
    assert late["output_tokens_per_s"] == drained["output_tokens_per_s"]
    assert late["sim_duration_s"] == drained["sim_duration_s"]


def test_every_request_completes_without_a_horizon():
    plan = make_plan({"traffic": {"arrival": "poisson", "rate": "40/s", "requests": 300, "prompt_len": 800,
                                  "output_len": {"dist": "uniform", "low": 10, "high": 400}},
                      "serving": {"engine": "sglang", "replicas": 1}})
    sim, m = run(plan)
    assert m["unfinished_requests"] == 0 and m["rejected_requests"] == 0
    assert all(not math.isnan(q.done_s) for q in sim.questions)
    assert all(e.used_blocks == 0 for e in sim.engines["serve"])     # every KV block returned


def _offline_tps(max_seqs, memory_fraction=None):
    serving = {"engine": "trtllm", "replicas": 1, "max_seqs": max_seqs, "max_batch_tokens": 8192}
    if memory_fraction:
        serving["memory_fraction"] = memory_fraction
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 256, "prompt_len": 512, "output_len": 256},
                      "serving": serving})
    return simulate_plan(plan)["metrics"]["output_tokens_per_s"], plan.pool("serve").kv_capacity_tokens


def test_throughput_does_not_drop_as_the_batch_limit_grows_until_kv_binds():
    """On a KV cache that holds ~150 whole requests, raising max_seqs helps up to there, not beyond."""
    tps = []
    for s in (1, 2, 4, 8, 16, 32, 64, 128):
        t, cap = _offline_tps(s, memory_fraction=0.23)
        tps.append(t)
    binds = cap // (512 + 256)
    assert 128 < binds < 256                    # the KV cache binds between the last two limits
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(tps))
    assert tps[-1] > 20 * tps[0]
    beyond = [_offline_tps(s, memory_fraction=0.23)[0] for s in (256, 1024)]
    assert max(beyond) <= tps[-1] * 1.1         # memory, not the limit, sets the batch now


def test_shared_prefix_samples_prefill_the_prompt_once():
    base = {"traffic": {"arrival": "offline", "requests": 20, "prompt_len": 2000, "output_len": 64},
            "test_time_compute": {"samples": 8, "strategy": "self-consistency"}}
    shared = make_plan({**base, "serving": {"engine": "vllm", "replicas": 1, "prefix_caching": True}})
    alone = make_plan({**base, "serving": {"engine": "vllm", "replicas": 1, "prefix_caching": False}})
    s1, m1 = run(shared)
    s2, m2 = run(alone)
    pf1 = sum(e.stats.prefill_tokens for e in s1.engines["serve"])
    pf2 = sum(e.stats.prefill_tokens for e in s2.engines["serve"])
    assert pf1 == 20 * 2000
    assert pf2 == 8 * 20 * 2000
    assert m1["question_latency_p50_s"] < m2["question_latency_p50_s"]
    assert m1["output_tokens_per_s"] == pytest.approx(m1["samples_per_s"] * 64)


def test_same_seed_same_result_and_another_seed_differs():
    extra = {"traffic": {"arrival": "poisson", "rate": "15/s", "requests": 200,
                         "prompt_len": {"dist": "lognormal", "median": 400, "sigma": 0.8},
                         "output_len": {"dist": "lognormal", "median": 100, "sigma": 0.8}},
             "serving": {"replicas": 2, "router": "random"}}
    a = simulate_plan(make_plan(extra, seed=1))["metrics"]
    b = simulate_plan(make_plan(extra, seed=1))["metrics"]
    c = simulate_plan(make_plan(extra, seed=2))["metrics"]
    assert a == b
    assert a["ttft_p99_s"] != c["ttft_p99_s"]


def test_optimistic_admission_preempts_and_recomputes_when_kv_runs_out():
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 64, "prompt_len": 256, "output_len": 1500},
                      "serving": {"engine": "vllm", "replicas": 1, "memory_fraction": 0.23}})
    sim, m = run(plan)
    assert m["preemptions"] > 0
    assert m["unfinished_requests"] == 0
    assert m["kv_utilization_peak"] <= 1.0
    recomputed = sum(e.stats.prefill_tokens for e in sim.engines["serve"])
    assert recomputed > 64 * 256                # preempted sequences re-ran their prefill


def test_a_request_admitted_into_the_last_free_blocks_can_take_its_first_step():
    # block size 1 (SGLang), separate prefill iterations, a KV cache that fills: before admission kept
    # room for the job's own next token, the newest request was evicted at its first decode step,
    # re-admitted and evicted again without end (found on the ShareGPT offline validation case)
    from pathlib import Path

    import fmsim

    sc = fmsim.load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / "validation" / "inference"
                             / "inf-106.yaml")
    m = fmsim.simulate(sc).metrics
    assert m["preemptions"] > 0
    assert m["unfinished_requests"] == 0 and m["rejected_requests"] == 0


def test_reserve_admission_never_preempts():
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 64, "prompt_len": 256, "output_len": 1500},
                      "serving": {"engine": "trtllm", "replicas": 1, "memory_fraction": 0.23,
                                  "max_seqs": 256, "max_batch_tokens": 4096}})
    _, m = run(plan)
    assert m["preemptions"] == 0 and m["unfinished_requests"] == 0


@pytest.mark.parametrize("fraction", [0.2, 0.23, 0.31, 0.5, 0.9, 0.95])
def test_the_estimate_runs_whole_sequences_under_reserve_admission(fraction):
    """An engine reserving each sequence's whole output holds floor(KV / (prompt + output)) sequences: the
    estimate's offline batch is that whole number, never the fraction rounded up (which would not fit)."""
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 3000, "prompt_len": 128, "output_len": 2048},
                      "serving": {"engine": "trtllm", "replicas": 1, "memory_fraction": fraction}},
                     model="llama3.3-70b", prec="fp8", tp=2)
    pool = plan.pool("serve")
    assert pool.cfg.admission == "reserve"
    b = estimate_metrics(plan)["decode_batch_mean"]
    whole = pool.kv_capacity_tokens / float(pool.cfg.kv_slots(128 + 2048))
    assert b == min(pool.cfg.max_seqs, math.floor(whole))


def test_a_request_longer_than_the_whole_kv_cache_is_rejected_not_lost():
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 3, "prompt_len": 64,
                                  "output_len": 2_000_000},
                      "serving": {"engine": "vllm", "replicas": 1}})
    _, m = run(plan)
    assert m["rejected_requests"] == 3


def test_disaggregated_prefill_hands_kv_to_decode_pool():
    plan = make_plan({"traffic": {"arrival": "poisson", "rate": "10/s", "requests": 100, "prompt_len": 2000,
                                  "output_len": 100},
                      "serving": {"engine": "vllm", "disaggregation": {"prefill_replicas": 1, "decode_replicas": 1,
                                                                       "prefill_tp": 2, "decode_tp": 2}}},
                     model="llama3.1-70b", prec="fp8", tp=2, nodes=2, collective="fabric")
    sim, m = run(plan)
    assert m["unfinished_requests"] == 0
    assert sum(e.stats.decode_tokens for e in sim.engines["prefill"]) == 0
    assert sum(e.stats.prefill_tokens for e in sim.engines["decode"]) == 0
    alone = plan.pool("prefill").cost.prefill_time(2000)
    assert m["ttft_p50_s"] >= alone * (1 - 1e-9)
    j = sim.gen_jobs[0]
    d = sim.decode_jobs[j.jid]
    assert np.nanmin(d.finish_s) > j.first_token_s     # decoding waits for the KV transfer


def test_best_of_n_verifier_scores_every_sample_and_adds_latency():
    base = {"traffic": {"arrival": "offline", "requests": 10, "prompt_len": 300, "output_len": 200},
            "test_time_compute": {"samples": 4}}
    plain = make_plan({**base, "serving": {"replicas": 1}})
    verified = make_plan({**base, "serving": {"replicas": 1},
                          "test_time_compute": {"samples": 4, "verifier": {"model": "llama3.1-8b", "tp": 1}}})
    _, m1 = run(plain)
    s2, m2 = run(verified)
    assert "verifier" in s2.engines and verified.pool("verifier").gpus == 1
    scored = sum(e.stats.prefill_tokens for e in s2.engines["verifier"])
    assert scored == 10 * 4 * (300 + 200)
    assert m2["question_latency_p50_s"] > m1["question_latency_p50_s"]


def test_revision_rounds_chain_on_the_cached_context():
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 5, "prompt_len": 500, "output_len": 100},
                      "serving": {"replicas": 1, "prefix_caching": True},
                      "test_time_compute": {"strategy": "sequential-revision", "revision_rounds": 3}})
    sim, m = run(plan)
    assert len(sim.gen_jobs) == 15
    pf = sum(e.stats.prefill_tokens for e in sim.engines["serve"])
    assert pf == 5 * 500 + 10 * 1                   # later rounds compute only the uncached token
    assert m["question_latency_p50_s"] > 3 * 99 * m["tpot_p50_s"]


def test_thinking_tokens_respect_the_budget():
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 50, "prompt_len": 100, "output_len": 10},
                      "serving": {"replicas": 1},
                      "test_time_compute": {"thinking": {"budget": 300,
                                                         "length": {"dist": "lognormal", "median": 500,
                                                                    "sigma": 1.0}}}})
    sim, _ = run(plan)
    outs = np.concatenate([j.out for j in sim.gen_jobs])
    assert outs.max() <= 310 and outs.min() >= 11


def test_closed_loop_keeps_at_most_concurrency_requests_in_flight():
    plan = make_plan({"traffic": {"arrival": "closed-loop", "concurrency": 4, "requests": 40, "prompt_len": 200,
                                  "output_len": 50}, "serving": {"replicas": 1}})
    sim, m = run(plan)
    assert len(sim.questions) == 40 and m["unfinished_requests"] == 0
    events = sorted([(q.arrival_s, 1) for q in sim.questions] + [(q.done_s, -1) for q in sim.questions],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= 4


def test_least_loaded_router_spreads_requests():
    plan = make_plan({"traffic": {"arrival": "poisson", "rate": "50/s", "requests": 400, "prompt_len": 200,
                                  "output_len": 100}, "serving": {"replicas": 4}})
    sim, _ = run(plan)
    served = [e.stats.prefill_tokens / 200 for e in sim.engines["serve"]]
    assert min(served) > 0.15 * 400


def test_bursty_arrivals_raise_the_ttft_tail():
    def ttft99(arrival, extra=None):
        tr = {"arrival": arrival, "rate": "30/s", "requests": 600, "prompt_len": 1000, "output_len": 100}
        tr.update(extra or {})
        return simulate_plan(make_plan({"traffic": tr, "serving": {"replicas": 1}}))["metrics"]["ttft_p99_s"]
    assert ttft99("bursty", {"burstiness": 4.0}) > ttft99("poisson")


def test_slo_goodput_and_cost_columns():
    plan = make_plan({"traffic": {"arrival": "poisson", "rate": "10/s", "requests": 200, "prompt_len": 500,
                                  "output_len": 100},
                      "serving": {"replicas": 1}, "slo": {"ttft_p99": "10 s", "tpot_p99": "1 s"}},
                     inst="p5.48xlarge")
    out = simulate_plan(plan)
    m = out["metrics"]
    assert m["slo_met"] is True and m["goodput_fraction"] == 1.0
    usd_s = plan.usd_per_hour / 3600
    assert m["usd_per_million_output_tokens"] == pytest.approx(usd_s / m["output_tokens_per_s"] * 1e6)
    tight = make_plan({"traffic": {"arrival": "poisson", "rate": "10/s", "requests": 200, "prompt_len": 500,
                                   "output_len": 100},
                       "serving": {"replicas": 1}, "slo": {"tpot_p50": "1 us"}}, inst="p5.48xlarge")
    mt = simulate_plan(tight)["metrics"]
    assert mt["slo_met"] is False and mt["goodput_fraction"] == 0.0
    assert out["details"]["decode_step_s"]["step_s"] > 0 and out["memory"]["weights"] > 0
    bd = out["breakdown"]
    assert bd["queue_s"] + bd["prefill_s"] + bd["decode_s"] == pytest.approx(m["e2e_p50_s"])


def test_estimate_agrees_with_the_simulation_offline():
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 600, "prompt_len": 512, "output_len": 512},
                      "serving": {"engine": "vllm", "replicas": 1}})
    des = simulate_plan(plan)["metrics"]["output_tokens_per_s"]
    est = estimate_metrics(plan)["output_tokens_per_s"]
    assert 0.6 < est / des < 1.6


def test_itl_runs_expand_to_arithmetic_gaps():
    g, w = itl_samples([(1.0, 0.5, 3, 2), (10.0, 0.0, 1, 5)])
    assert g.tolist() == [1.0, 1.5, 2.0, 10.0] and w.tolist() == [2, 2, 2, 5]
    assert weighted_percentile(g, w, 50) == 2.0
    assert weighted_percentile(g, w, 99) == 10.0


def test_iteration_work_of_a_mixed_batch_adds_its_parts():
    cost = make_plan({"traffic": {"arrival": "offline", "requests": 1}}).pool("serve").cost
    mixed = IterationWork(tokens=100 + 10, logits=11, decode_seqs=10, decode_ctx=5000.0,
                          prefill_pairs=100 * 101 / 2, prefill_kv_reads=100)
    assert cost.iteration_time(mixed) > cost.iteration_time(IterationWork(tokens=10, logits=10, decode_seqs=10,
                                                                          decode_ctx=5000.0))


def test_cuda_graphs_are_captured_only_up_to_the_engine_batch_limit():
    """Listed sizes up to the engine's limit, and -- padding enabled, the list running past it -- the limit itself
    (TensorRT-LLM _filter_cuda_graph_batch_sizes), so a batch above the last listed size pads to the limit."""
    plan = make_plan({"traffic": {"arrival": "offline", "requests": 8, "prompt_len": 128, "output_len": 64},
                      "serving": {"engine": "trtllm", "replicas": 1, "max_seqs": 300, "max_batch_tokens": 4096}})
    cost = plan.pool("serve").cost
    assert cost.graph_batch_sizes and max(cost.graph_batch_sizes) == 300
    assert 384 not in cost.graph_batch_sizes and 256 in cost.graph_batch_sizes
    assert cost.padded(200) == 256 and cost.padded(280) == 300


def test_a_job_preempted_after_one_sample_finished_does_not_count_that_sample_twice():
    """Two samples per question on a KV cache that preempts often (22B on one Trainium chip): a sample
    that finished before its job was preempted used to be counted again when the job came back, which
    retired the job with its other sample still decoding -- an orphaned sequence, then a stuck engine."""
    import fmsim
    from fmsim.scenario import scenario_from_mapping

    sc = scenario_from_mapping({
        "version": 1, "name": "revise", "seed": 142,
        "workload": {"kind": "inference", "model": "gpt-22b", "precision": "fp8"},
        "parallelism": {"tp": 1}, "cluster": {"instance": "trn1n.32xlarge", "nodes": 1},
        "traffic": {"arrival": "bursty", "rate": "5/s", "burstiness": 2.0, "requests": 200,
                    "prompt_len": 2000, "output_len": 50},
        "serving": {"engine": "vllm"},
        "test_time_compute": {"samples": 2, "strategy": "sequential-revision", "revision_rounds": 2,
                              "thinking": {"budget": 2048, "length": {"dist": "lognormal", "median": 500,
                                                                      "sigma": 0.8}}}})
    r = fmsim.simulate(sc)
    assert r.get("preemptions") > 100
    assert r.get("unfinished_requests") == 0


def test_requests_that_cannot_fit_the_kv_cache_are_rejected_and_named_in_both_methods():
    """Four samples of 2.5k tokens each on an engine whose KV cache holds under 2k tokens: the engine
    refuses every request; the estimate used to report a throughput, and the bottleneck pointed at the
    decode step."""
    import fmsim
    from fmsim.scenario import scenario_from_mapping

    sc = scenario_from_mapping({
        "version": 1, "name": "too-big", "seed": 1,
        "workload": {"kind": "inference", "model": "gpt-310b", "precision": "fp8"},
        "parallelism": {"tp": 1, "pp": 2}, "cluster": {"instance": "dgx-b200", "nodes": 1},
        "traffic": {"arrival": "poisson", "rate": "5/s", "requests": 20, "prompt_len": 2000, "output_len": 500},
        "serving": {"engine": "vllm-0.6", "admission": "reserve"},
        "test_time_compute": {"samples": 4, "strategy": "self-consistency"}})
    for r in (fmsim.simulate(sc), fmsim.estimate(sc)):
        assert r.get("output_tokens_per_s") == 0.0
        assert r.get("rejected_requests") == 20 and r.get("unfinished_requests") == 0
        assert r.get("bottleneck").startswith("KV cache too small: 20 requests rejected")
