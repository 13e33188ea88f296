"""trtllm-bench's own batch and token limits, as attention-DP ranks then apply them, and the MoE decode step.

trtllm-bench sizes ``max_batch_size`` / ``max_num_tokens`` from a checkpoint-based KV estimate over the ``--tp`` GPUs
it is given (tensorrt_llm/bench/build/tuning.py ``calc_engine_setting``, ``finetune_setting``); with
``enable_attention_dp`` the engine applies them to each rank ("--max_batch_size: Max batch size in each rank").
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

import fmsim
from fmsim.catalog import load_catalog
from fmsim.model.serving_cost import (
    ENGINES,
    IterationWork,
    auto_limits,
    build_cost_model,
    trtllm_bench_kv_tokens,
)
from fmsim.workloads.inference import plan_from_scenario

CAT = load_catalog()
ROOT = Path(__file__).resolve().parents[1]
GIB = 2.0 ** 30


def test_the_estimate_is_trtllm_bench_s_formula_worked_by_hand():
    """Qwen3-235B-A22B FP8 (fp8 KV) over 8 x 80 GiB: (8 x 80 GiB - checkpoint bytes) x 0.9 over
    2 x 94 layers x max(8, 4) heads x 128 x 1 byte per token."""
    model = CAT.model("qwen3-235b-a22b")
    total, _ = model.param_counts(include_mtp=True)
    expect = (8 * 80 * GIB - total * 1.0) * 0.9 / (2 * 94 * 8 * 128 * 1.0)
    got = trtllm_bench_kv_tokens(model, precision="fp8", kv_dtype="fp8", tp=8, pp=1, device_bytes=80 * GIB,
                                 memory_fraction=0.9)
    assert got == pytest.approx(expect, rel=1e-12)
    # then finetune_setting: ~1,057 requests of 2,000 tokens -> 1280 sequences, 2304 tokens
    assert auto_limits(got, 1000, 1000, chunked_prefill=False, max_prompt_len=1000) == (1280, 2304)
    # 16-bit KV halves the tokens a byte of cache holds; more GPUs, more room
    assert trtllm_bench_kv_tokens(model, precision="fp8", kv_dtype="bf16", tp=8, pp=1, device_bytes=80 * GIB,
                                  memory_fraction=0.9) == pytest.approx(got / 2, rel=1e-12)


def test_nvfp4_checkpoints_count_their_packed_elements_as_the_safetensors_header_does():
    """NVFP4 stores two weights per uint8 element plus an FP8 scale per 16, and the estimate then prices each element
    at 0.5 bytes; the embeddings stay 16-bit elements at 0.5 too (the formula's bytes follow the quant algo)."""
    model = CAT.model("qwen3-235b-a22b")
    total, _ = model.param_counts(include_mtp=True)
    emb = model.embedding_params()
    engine = (emb + (total - emb) * (0.5 + 1 / 16)) * 0.5
    expect = (8 * 180 * GIB - engine) * 0.9 / (2 * 94 * 8 * 128 * 1.0)
    got = trtllm_bench_kv_tokens(model, precision="fp4", kv_dtype="fp8", tp=8, pp=1, device_bytes=180 * GIB,
                                 memory_fraction=0.9)
    assert got == pytest.approx(expect, rel=1e-12)


def test_the_pipeline_stages_divide_the_batch_as_finetune_setting_does():
    assert auto_limits(1_000_000, 1000, 1000, pp=2) == (256, 2048)
    assert auto_limits(1_000_000, 1000, 1000) == (512, 2048)


def test_an_attention_dp_engine_takes_the_global_estimate_per_rank():
    """inf-094 (Qwen3-235B FP8, 8 x H100, trtllm-bench --tp 8 --ep 8 with attention DP): each of the 8 ranks may hold
    1280 sequences and 2304 tokens -- the heuristic's figure for the whole engine, applied per rank -- so the
    rank's CUDA graphs run up to 1280 and a rank of 172 sequences pads to the 256 graph."""
    assert ENGINES["trtllm"].auto_limits_from == "trtllm-bench"
    plan = plan_from_scenario(fmsim.load_scenario(ROOT / "scenarios/validation/inference/inf-094.yaml"),
                              collective=None)
    pool = plan.pool("serve")
    assert (pool.cfg.max_seqs, pool.cfg.max_batch_tokens) == (8 * 1280, 8 * 2304)
    assert pool.cost.graph_batch_sizes[-3:] == (512, 1024, 1280)
    assert pool.cost.padded(172 * 8) == 256 * 8


def test_each_attention_dp_gpu_holds_its_own_rank_s_activations():
    """The logits and hidden buffers of an attention-DP GPU are its rank's share; an all-gather MoE exchange adds the
    gathered tokens (quantized) and the op's 16-bit output for each."""
    model = CAT.model("qwen3-235b-a22b")
    inst = CAT.instance("dgx-h100")
    kw = dict(precision="fp8", kv_dtype="fp8", collective=None)
    adp = build_cost_model(model, inst, tp=1, ep=8, attention_dp=True, moe_comm="all-to-all", **kw)
    one = build_cost_model(model, inst, tp=1, ep=1, **kw)
    assert adp.activation_bytes(8 * 2304, 8 * 1280, model) == pytest.approx(one.activation_bytes(2304, 1280, model))
    ag = build_cost_model(model, inst, tp=1, ep=8, attention_dp=True, moe_comm="allgather", **kw)
    extra = 8 * 2304 * model.hidden * (1.0 + 2.0)
    assert ag.activation_bytes(8 * 2304, 8 * 1280, model) == pytest.approx(
        one.activation_bytes(2304, 1280, model) + extra)


@pytest.mark.parametrize("n", [8, 64, 512, 2048, 8192])
def test_more_experts_at_the_same_active_parameters_never_speed_a_decode_step(n):
    """Experts x top-k x width fixed (128 x 8 x 1536 -> 256 x 16 x 768 -> 512 x 32 x 384): the same FLOPs per token
    in more, smaller, emptier expert GEMMs, and as many or more expert bytes touched per step."""
    base = CAT.model("qwen3-235b-a22b")
    inst = CAT.instance("dgx-h100")
    prev = 0.0
    for mult in (1, 2, 4):
        moe = dataclasses.replace(base.moe, experts=128 * mult, top_k=8 * mult, expert_ffn_hidden=1536 // mult)
        model = dataclasses.replace(base, moe=moe)
        cost = build_cost_model(model, inst, precision="fp8", kv_dtype="fp8", tp=1, ep=8, attention_dp=True,
                                collective=None)
        t = cost.iteration_time(IterationWork(tokens=n, logits=n, decode_seqs=n, decode_ctx=n * 1500.0))
        assert t >= prev * (1 - 1e-9)
        prev = t
    assert math.isfinite(prev)
