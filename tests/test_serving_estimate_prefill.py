"""The analytical serving estimate prefills prompts in batches as the discrete-event engine forms them.

The engine fills an iteration with prefill chunks up to ``max_batch_tokens``; the estimate priced every prompt
alone in its own iteration, ten times the engine's cost for an attention-DP expert-parallel prefill pool
(inf-113: 27 against 297 requests/s). Now ``b / osl`` prompts (``lambda * t_step`` under a rate) share an
iteration within its token budget, the busiest attention rank's work built by the engine's own rule
(fmsim.engine.serving_des.busiest_rank), and the per-prompt price is that iteration over its prompts -- in an
engine that mixes prefill and decode, the iteration's time over the decode step it rides in.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import fmsim
from fmsim.engine.serving_des import busiest_rank
from fmsim.model.serving_cost import IterationWork
from fmsim.workloads.inference import estimate_metrics, plan_from_scenario
from fmsim.workloads.serving_prefill import prefill_batch_time, prefill_batch_work, prompts_per_iteration

ROOT = Path(__file__).resolve().parents[1]
INF = ROOT / "scenarios" / "validation" / "inference"


def _ratio(name: str, key: str = "output_tokens_per_s") -> float:
    sc = fmsim.load_scenario(INF / f"{name}.yaml")
    return fmsim.estimate(sc).metrics[key] / fmsim.simulate(sc).metrics[key]


def _cost(name: str):
    plan = plan_from_scenario(fmsim.load_scenario(INF / f"{name}.yaml"))
    return (plan.pool("serve") or plan.pool("decode")).cost


# (a) the attention-DP EP32 prefill pool: the estimate was 0.09 x the DES (27 vs 297 requests/s); now 0.997
def test_the_estimate_of_an_attention_dp_prefill_pool_is_near_the_event_simulation():
    assert _ratio("inf-113", "requests_per_s") == pytest.approx(1.0, abs=0.05)


def test_the_estimate_of_a_one_wave_attention_dp_decode_pool_is_near_the_event_simulation():
    # inf-116: 18,432 requests, exactly the batch -- all admitted at once, their one-token prefills in a few full
    # iterations; the estimate was 0.027 x the DES (each prompt alone), 0.83 x with steady-state batches, now 0.99
    assert _ratio("inf-116") == pytest.approx(1.0, abs=0.05)


# (b) batching shares an iteration's fixed costs and weight reads: with the GEMMs' wave model off (the tile and wave
# quantisation of kernels.gemm_efficiency makes single steps rise, in the DES as here) a prompt never costs more in a
# larger batch; with attention DP, at whole rounds of the ranks (the busiest rank takes one prompt more per round)
@pytest.mark.parametrize("name", ["inf-085", "inf-098", "inf-113", "ttc-011"])
def test_the_per_prompt_prefill_cost_never_rises_with_the_batch(name):
    cost = dataclasses.replace(_cost(name), compute_units=0)
    g = cost.dp_groups
    per = [prefill_batch_time(cost, n, 1024) / n for n in range(g, 64 * g + 1, g)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(per, per[1:]))
    assert per[-1] < per[0]                          # and it falls (shared fixed costs and weight reads)


def test_the_full_model_never_prices_a_batched_prompt_far_above_a_lone_one():
    # the wave model's steps, bounded: a prompt in any batch of 1..256 costs at most 5 % more than alone
    cost = _cost("inf-098")
    solo = prefill_batch_time(cost, 1, 226)
    assert max(prefill_batch_time(cost, n, 226) / n for n in range(1, 257)) <= 1.05 * solo


# (c) a dense single-node row: unchanged where one prompt enters per step, closer where several do
def test_a_dense_single_node_row_stays_where_it_was():
    assert _ratio("inf-066") == pytest.approx(1.0, abs=0.02)        # 0.995 before, 1.008 now (one prompt a step)


def test_a_dense_row_whose_prompts_now_share_iterations_is_near_the_event_simulation():
    assert _ratio("inf-085") == pytest.approx(1.0, abs=0.03)        # 0.64 before, 1.014 now (31 prompts a step)


# (d) one prompt: the old solo price (without attention DP); with it, the prompt on one rank, as the engine runs it
def test_one_prompt_reproduces_the_solo_prefill_time():
    cost = _cost("inf-085")
    assert cost.dp_groups == 1
    for prompt, cached in ((128, 0), (2048, 0), (2048, 1500)):
        assert prefill_batch_time(cost, 1, prompt, cached) == pytest.approx(cost.prefill_time(prompt, cached),
                                                                            rel=1e-12)


def test_one_prompt_with_attention_dp_is_the_engine_s_one_chunk_iteration():
    cost = _cost("inf-113")
    w = prefill_batch_work(cost, 1, 1024)
    chunk = cost.prefill_work(1024, 0, finishing=True)
    des = dataclasses.replace(chunk, **busiest_rank(cost, [(1024, 0, True)], 0))
    assert cost.iteration_time(w) == pytest.approx(cost.iteration_time(des), rel=1e-12)
    assert w.rank_tokens == cost.dp_groups * 1024
    assert cost.iteration_time(w) >= cost.prefill_time(1024)


def test_the_batch_sums_its_prompts_and_deals_them_to_the_ranks():
    cost = _cost("inf-113")
    g = cost.dp_groups
    w = prefill_batch_work(cost, 3 * g + 1, 1024, 24)
    assert isinstance(w, IterationWork)
    assert (w.tokens, w.logits) == ((3 * g + 1) * 1000, 3 * g + 1)
    assert w.prefill_pairs == pytest.approx((3 * g + 1) * cost.prefill_pairs(1000, 24))
    assert w.rank_tokens == g * 4 * 1000            # the busiest rank: four of the 3g + 1 prompts


def test_prompts_per_iteration_keep_within_the_budget_and_the_batch():
    assert prompts_per_iteration(10.4, 1024, 0, budget_tokens=1 << 20, batch=256) == 10
    assert prompts_per_iteration(1000, 1024, 0, budget_tokens=8192, batch=256) == 8
    assert prompts_per_iteration(1000, 1024, 1023, budget_tokens=8192, batch=256) == 256
    assert prompts_per_iteration(0.2, 1024, 0, budget_tokens=100, batch=0.5) == 1     # at least one, alone


def test_a_ttft_waits_for_the_batched_iteration():
    plan = plan_from_scenario(fmsim.load_scenario(INF / "inf-113.yaml"))
    m = estimate_metrics(plan)
    solo = plan.pool("serve").cost.prefill_time(1024)
    assert m["ttft_p50_s"] > 100 * solo             # 511 prompts' iteration, then half the batch's prefills ahead


def test_in_a_mixed_batch_a_prompt_costs_what_it_adds_to_the_decode_iteration():
    cost = _cost("ttc-011")
    g = cost.dp_groups
    w = prefill_batch_work(cost, 2, 1024, decodes=3072, decode_ctx=3072 * 2048.0)
    assert (w.tokens, w.logits, w.decode_seqs) == (2 * 1024 + 3072, 2 + 3072, 3072)
    assert w.rank_tokens == 3072 + g * 1024         # the decodes spread evenly, one prompt on the busiest rank
    alone = cost.iteration_time(IterationWork(tokens=3072, logits=3072, decode_seqs=3072, decode_ctx=3072 * 2048.0))
    added = cost.iteration_time(w) - alone
    assert 0 < added < prefill_batch_time(cost, 2, 1024)      # the decode step's fixed costs and weights are shared
