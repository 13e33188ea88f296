"""Serving predictions against published measurements (scenarios/validation/inference).

Issue 5 sets the bar: median |error| <= 10 % on throughput and <= 15 % on latency percentiles. Both
are met over the whole set, and the level reached is guarded too, median and worst with a small margin
(2026-12-01: throughput 7.3 % median, worst 85.8 % (inf-094), over 41 values, each published
throughput compared with the column of its definition -- all are fixed-request-count benchmarks,
compared with run_output_tokens_per_s / run_requests_per_s, scenarios/validation/README.md; 8.6 % when
they were compared with the steady state, 7.9 % before throughput left out the drain; latency 10.7 %
median, worst 31.4 % (inf-102 ttft_p50_s), over 9 values). 2026-12-02: throughput 6.5 % median over 43 values,
worst 82.5 % (inf-094), after CUDA graphs are captured as TensorRT-LLM does with padding; latency 10.9 %.
Then the six nvidia/Llama-3.1-405B-Instruct-FP8 rows run the 16-bit KV cache their checkpoint declares
(hf_quant_config.json kv_cache_quant_algo null; trtllm-bench keeps the checkpoint's KV dtype): throughput
median 6.5 -> 7.2 %, worst 82.5 % unchanged, latency unchanged. Then trtllm-bench's own batch and token
limits (tensorrt_llm/bench/build/tuning.py calc_engine_setting: its checkpoint-based KV estimate) replace the ones
sized to fmsim's KV capacity: throughput median 7.2 -> 7.0 %, worst 78.2 % (inf-094), latency unchanged.
Then the H100/H200 fp8 GEMM figures measured (mamf-finder's FP8 table, 0.71 / 0.73 from an assumed
0.70) and Transformer Engine's own casts per fp8 recipe, on top of those limits: throughput median 7.0 %, worst
78.2 -> 78.8 % (inf-094; inf-093 +49.8 -> +52.2 %), latency unchanged.
Then the CUTLASS fused MoE's own kernels per MoE layer (expert-map sort, stride setup, input quantize): throughput
median 7.0 % unchanged, worst 78.2 -> 71.4 % (inf-094), latency unchanged; with both, worst 71.9 % (inf-094) and
MoE rows +24.6 / +48.0 / +71.9 / +4.8 / +10.7 %. Then each expert's rows as routing draws them (Binomial, whole
row tiles per expert: kernels.routed_grouped_gemm_efficiency): worst 71.9 -> 69.0 % (inf-094), median unchanged.
Then TensorRT-LLM's KV pool as its PyTorch backend sizes it (the fused MoE op's workspace in the profiled peak, no
decode logits): worst 69.0 -> 68.9 % (inf-094), median 7.02 % unchanged, latency unchanged.
The MoE rows (Qwen3-235B, DeepSeek-R1: attention DP + EP on TensorRT-LLM) are far from the
issue 28 target (median <= 10 %, worst <= 25 %); their level is guarded so it can only improve.
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


#: MoE serving rows and today's level (2026-12-01, after grouped expert GEMMs, per-rank TensorRT-LLM limits,
#: B200's measured fused-MoE figure and the token permutation): inf-092 +19.5, inf-093 +42.8, inf-094 +84.9,
#: ttc-010 +32.8, ttc-011 +41.2 % -- median 41.2, worst 84.9. 2026-12-02, after each attention-DP iteration waits
#: for its busiest rank (TensorRT-LLM tech blog 10): +18.8, +41.0, +83.1, +27.1, +36.3 % -- median 36.3, worst
#: 83.1. Then TensorRT-LLM's MoE token exchange as its CUTLASS MoE runs it with attention DP (all-gather of the
#: quantized tokens + reduce-scatter, fused_moe_cutlass.py; honest and faster, so worse): +24.8, +45.7, +87.3,
#: +33.1, +41.8 % -- median 41.8, worst 87.3. Then ttc-011's checkpoint's 16-bit attention projections
#: (serving.attention_precision, the file's notes): ttc-011 +12.8 % -- median 33.1, worst 87.3; and ttc-010's
#: (nvidia/DeepSeek-R1-0528-FP4, its notes): +6.5 % -- median 24.8, worst 87.3. Then CUDA graphs as TensorRT-LLM
#: captures them with padding (the rank's own limit added as the last size): +24.8, +45.7, +82.5, +5.9, +12.8 %
#: -- median 24.8, worst 82.5. Then trtllm-bench's own limits (its checkpoint-based KV estimate over the 8 GPUs,
#: applied per attention-DP rank: 1280 / 2304 a rank on H100) and each GPU's activations at its rank's share:
#: +29.6, +49.8, +78.2, +5.9, +12.8 % -- median 29.6, worst 78.2 (the larger per-rank token budget admits prompts
#: faster on B200 and H200, where all 3000 requests fit the KV cache). Then the CUTLASS fused MoE's own kernels
#: (expert-map sort, three kernels above 256 rows; grouped-GEMM stride setup; the fp8/nvfp4 input quantize:
#: serving_cost.CUTLASS_MOE_*): +24.6, +45.6, +71.4, +4.8, +10.7 % -- median 24.6, worst 71.4 (with the fp8 GEMM
#: figures: +24.6, +48.0, +71.9, +4.8, +10.7). 2026-12-02 (third session), each expert's rows as routing draws them
#: (Binomial(tokens, k / E), whole row tiles per expert; kernels.routed_grouped_gemm_efficiency): +24.2, +47.6,
#: +69.0, +3.6, +9.1 % -- median 24.2, worst 69.0. Then TensorRT-LLM's KV-pool sizing (fused-MoE workspace in the
#: profiled peak, no decode logits): inf-094 +68.9 %, the rest unchanged; bounds at those plus a margin
MOE_ROWS = ("inf-092", "inf-093", "inf-094", "ttc-010", "ttc-011")
GUARD_MOE_MEDIAN_PCT = 25.5
GUARD_MOE_WORST_PCT = 70.0


def test_serving_moe_rows_do_not_regress_past_todays_level():
    vals = {name: e for name, metric, e in errors()
            if name in MOE_ROWS and not metric.startswith(LATENCY_PREFIXES)}
    assert set(vals) == set(MOE_ROWS)
    assert statistics.median(vals.values()) <= GUARD_MOE_MEDIAN_PCT, vals
    assert max(vals.values()) <= GUARD_MOE_WORST_PCT, vals


#: issue 28's MoE serving set with SGLang's DeepSeek-V3 large-scale EP rows (inf-113..116, DeepEP as the blog states it;
#: tests/test_validation_deepseek_serving.py guards them on their own): 2026-12-02 third session, the nine rows
#: +24.6, +48.0, +71.9, +4.8, +10.7, -12.0, -9.6, -7.4, +1.5 % -- median 10.7, worst 71.9 (inf-094); on the
#: integration branch with DeepEP priced by its measured kernels (fmsim.model.deepep.layer_time_fn)
#: +24.2, +47.6, +69.0, +3.6, +9.1, -12.0, -9.7, -7.4, -9.6 % -- median 9.7, worst 69.0 (inf-094); 2026-12-02 fourth
#: session, Blackwell's own GEMM depth constant with b200's fp8/fp4 and moe_op figures read back through it (docs/
#: catalogs.md): inf-092 +23.5, ttc-010 / ttc-011 +11.4 / +17.5 % -- median 12.0 (inf-113), worst 68.9 (inf-094)
#: and with SGLang's two-batch overlap priced (serving.two_batch_overlap, fmsim.model.tbo; every DeepSeek row ran it)
#: +23.5, +47.6, +68.9, +11.4, +17.5, +31.7, +33.3, +33.2, +16.8 % -- median 31.7, worst 68.9 (inf-094)
MOE_ROWS_WITH_DEEPSEEK_EP = MOE_ROWS + ("inf-113", "inf-114", "inf-115", "inf-116")


def test_serving_moe_set_with_the_deepseek_ep_rows_holds_todays_level():
    vals = {name: e for name, metric, e in errors()
            if name in MOE_ROWS_WITH_DEEPSEEK_EP and not metric.startswith(LATENCY_PREFIXES)}
    assert set(vals) == set(MOE_ROWS_WITH_DEEPSEEK_EP)
    assert statistics.median(vals.values()) <= 33.0, vals
    assert max(vals.values()) <= GUARD_MOE_WORST_PCT, vals


def _worst(latency: bool) -> float:
    return max(e for _, metric, e in errors() if metric.startswith(LATENCY_PREFIXES) == latency)


def test_serving_errors_stay_at_today_s_level():
    # 7.1 % at the third session; 7.8 % since the Blackwell depth constant and the two-batch overlap (2026-12-02)
    assert _median(latency=False) <= 8.2, f"throughput median {_median(latency=False):.1f} % (7.8 % measured, 47 values)"
    assert _worst(latency=False) <= 70.0, f"throughput worst {_worst(latency=False):.1f} % (68.9 % measured, KV-pool sizing)"
    assert _median(latency=True) <= 11.5, f"latency median {_median(latency=True):.1f} % (10.7 % measured)"
    assert _worst(latency=True) <= 34.0, f"latency worst {_worst(latency=True):.1f} % (31.4 % measured)"
