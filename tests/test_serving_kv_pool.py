"""The serving KV pool: bounded by the GPU's memory, monotone in the memory fraction, and the
TensorRT-LLM terms traced to the code they restate (issue 28, KV-pool audit)."""

import pytest

from fmsim.catalog import load_catalog
from fmsim.model.serving_cost import (
    ENGINES,
    RUNTIME_RESERVE_BYTES,
    build_cost_model,
    cutlass_moe_workspace_per_row,
)
from fmsim.scenario import load_scenario
from fmsim.workloads.inference import plan_from_scenario

ROWS = ("inf-092", "inf-093", "inf-094")   # Qwen3-235B, TensorRT-LLM, attention DP x EP 8
DENSE = "inf-057"


def _plan(name, overrides=None):
    return plan_from_scenario(load_scenario(f"scenarios/validation/inference/{name}.yaml", overrides))


def _pool_bytes_per_gpu(plan):
    pool = plan.pools[0]
    c = pool.cost
    return pool.kv_capacity_tokens / c.kv_tokens_split * c.kv_bytes_per_token_per_gpu, pool


@pytest.mark.parametrize("name", ROWS + (DENSE,))
def test_kv_pool_never_exceeds_memory_left_after_weights_and_workspace(name):
    plan = _plan(name)
    kv, pool = _pool_bytes_per_gpu(plan)
    hbm = plan.hbm_bytes
    assert 0 < kv <= hbm - pool.cost.weight_bytes_per_gpu
    # the engine's own rule: fraction x (what the profiled peak leaves), never more
    frac = ENGINES["trtllm"].memory_fraction
    assert kv <= frac * (hbm - RUNTIME_RESERVE_BYTES - pool.cost.weight_bytes_per_gpu - pool.activation_bytes) + 1


@pytest.mark.parametrize("name", ("inf-094", DENSE))
def test_more_memory_fraction_never_holds_fewer_sequences(name):
    caps = [_plan(name, {"serving.memory_fraction": f}).pools[0].kv_capacity_tokens for f in (0.5, 0.7, 0.9, 0.95)]
    assert caps == sorted(caps) and caps[0] < caps[-1]


def test_cutlass_moe_workspace_per_row_restates_the_op_rule():
    # Qwen3-235B: hidden 4096, expert intermediate 1536, SwiGLU, FP8 per-tensor (T = 1 byte, GEMM output 16-bit):
    # inputs max(4096 x 1, 4096 x 2, 1536 x 1) = 8192; outputs max(2 x 1536 x 2, 4096 x 2, 1536) = 8192;
    # four int32 maps + fp32 final scales = 20
    assert cutlass_moe_workspace_per_row(4096, 1536, "fp8") == 8192 + 8192 + 20
    # a wide expert: the gated intermediate (2 x inter x 2 B) outgrows fc2's output
    assert cutlass_moe_workspace_per_row(2048, 4096, "fp8") == max(2048 * 2, 4096) + 2 * 4096 * 2 + 20
    # never below the 16-bit fc2 output each expanded row writes
    for prec in ("fp8", "fp4", "bf16"):
        assert cutlass_moe_workspace_per_row(7168, 2048, prec) >= 2 * 7168 * 2


def test_fused_moe_workspace_counts_every_gathered_row_of_the_profiling_forward():
    plan = _plan("inf-094")
    pool = plan.pools[0]
    c = pool.cost
    assert c.moe_workspace_bytes_per_row == cutlass_moe_workspace_per_row(4096, 1536, "fp8")
    model = load_scenario("scenarios/validation/inference/inf-094.yaml").workload.model
    tok, seqs = pool.cfg.max_batch_tokens, pool.cfg.max_seqs
    without = c.activation_bytes(tok, seqs, model, logits=False) - c.top_k * tok * c.moe_workspace_bytes_per_row
    # 8 ranks x 2304 tokens gathered, top-8: 147,456 expanded rows, ~2.25 GiB per GPU
    assert c.top_k * tok == 8 * 8 * 2304
    assert pool.activation_bytes - without == pytest.approx(147456 * 16404)


@pytest.mark.parametrize("name", ("inf-094", DENSE))
def test_trtllm_sizes_its_pool_without_a_decode_batch_of_logits(name):
    """Its profiling forward is max_num_tokens of context requests, logits for their last tokens only."""
    plan = _plan(name)
    pool = plan.pools[0]
    model = load_scenario(f"scenarios/validation/inference/{name}.yaml").workload.model
    tok, seqs = pool.cfg.max_batch_tokens, pool.cfg.max_seqs
    assert ENGINES["trtllm"].sizing_counts_logits is False and ENGINES["vllm"].sizing_counts_logits is True
    assert pool.activation_bytes == pytest.approx(pool.cost.activation_bytes(tok, seqs, model, logits=False))
    assert pool.activation_bytes < pool.cost.activation_bytes(tok, seqs, model)


def test_generic_moe_and_dense_engines_carry_no_fused_workspace():
    cat = load_catalog()
    model = cat.model("qwen3-235b-a22b")
    inst = cat.instance("p5.48xlarge")
    vllm = build_cost_model(model, inst, precision="fp8", kv_dtype="fp8", tp=8, moe_impl="generic")
    trt = build_cost_model(model, inst, precision="fp8", kv_dtype="fp8", tp=8, moe_impl="cutlass")
    assert vllm.moe_workspace_bytes_per_row == 0.0
    # plain TP: each GPU holds 1/8 of every expert's intermediate, every GPU runs all the rows
    assert trt.moe_workspace_bytes_per_row == cutlass_moe_workspace_per_row(4096, 1536 / 8, "fp8")
    assert trt.activation_bytes(8192, 256, model) > vllm.activation_bytes(8192, 256, model)
    dense = _plan(DENSE).pools[0].cost
    assert dense.moe_workspace_bytes_per_row == 0.0


def test_memory_terms_trace_to_tensorrt_llm_code():
    src = ENGINES["trtllm"].source
    for needle in ("_torch/pyexecutor/_util.py", "estimate_max_tokens", "kv_cache_free_gpu_mem_fraction",
                   "No KV cache space"):
        assert needle in src, needle
    doc = cutlass_moe_workspace_per_row.__doc__
    for needle in ("getWorkspaceDeviceBufferSizes", "moe_kernels.cu", "ac73e3116f", "moeOp.cpp"):
        assert needle in doc, needle
