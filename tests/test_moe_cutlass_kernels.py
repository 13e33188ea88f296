"""TensorRT-LLM's CUTLASS fused MoE: the kernels it runs per MoE layer beyond the generic count.

Counted from NVIDIA/TensorRT-LLM's code (serving_cost.CUTLASS_MOE_* and their comment): the expert-map build and
sort (one fused kernel while the op's rows are <= 256, else three), the grouped GEMMs' stride setup, and for an FP8 /
NVFP4 checkpoint the quantization of the layer's input in the PyTorch module before the op.
"""
from __future__ import annotations

import dataclasses

import pytest

from fmsim.catalog import load_catalog
from fmsim.errors import ConfigError
from fmsim.model.kernels import BYTES_PER_ELEMENT, KERNEL_FIXED_S
from fmsim.model.serving_cost import (
    ACT_BYTES,
    CUTLASS_MOE_FUSED_SORT_MAX_ROWS,
    ENGINES,
    INDEX_BYTES,
    IterationWork,
    build_cost_model,
)

CAT = load_catalog()
QWEN = CAT.model("qwen3-235b-a22b")
H100 = CAT.instance("p5.48xlarge")


def _pair(precision: str, model=QWEN, **kw):
    kw = {"tp": 1, "ep": 8, "attention_dp": True, "collective": None, "moe_comm": "allgather", **kw}
    kw["kv_dtype"] = "fp8"
    gen = build_cost_model(model, H100, precision=precision, moe_impl="generic", **kw)
    cut = build_cost_model(model, H100, precision=precision, moe_impl="cutlass", **kw)
    return gen, cut


def test_trtllm_runs_the_cutlass_moe_and_the_others_do_not():
    assert ENGINES["trtllm"].moe_impl == "cutlass"
    assert all(p.moe_impl == "generic" for name, p in ENGINES.items() if name != "trtllm")


def test_fp8_moe_layer_adds_sort_strides_and_quantize_kernels():
    gen, cut = _pair("fp8")
    n_moe = QWEN.num_moe_layers
    assert cut.kernel_time(64) - gen.kernel_time(64) == pytest.approx(n_moe * 3 * KERNEL_FIXED_S, rel=1e-12)


def test_bf16_moe_layer_has_no_quantize_kernel_or_bytes():
    gen, cut = _pair("bf16")
    n_moe = QWEN.num_moe_layers
    assert cut.kernel_time(64) - gen.kernel_time(64) == pytest.approx(n_moe * 2 * KERNEL_FIXED_S, rel=1e-12)
    # only the expert maps' int32 traffic (ids read, two row maps written) per routed token
    extra = cut.elementwise_bytes_per_token - gen.elementwise_bytes_per_token
    assert extra == pytest.approx(n_moe * 3 * QWEN.moe.top_k * INDEX_BYTES, rel=1e-12)
    assert cut.rank_elementwise_bytes_per_token == gen.rank_elementwise_bytes_per_token


def test_quantize_bytes_fall_on_each_rank_s_own_tokens():
    gen, cut = _pair("fp8")
    n_moe, h, ranks = QWEN.num_moe_layers, QWEN.hidden, 8
    quant = n_moe * h * (ACT_BYTES + BYTES_PER_ELEMENT["fp8"]) / ranks
    assert cut.rank_elementwise_bytes_per_token - gen.rank_elementwise_bytes_per_token == pytest.approx(quant)
    maps = n_moe * 3 * QWEN.moe.top_k * INDEX_BYTES
    assert cut.elementwise_bytes_per_token - gen.elementwise_bytes_per_token == pytest.approx(quant + maps)


def test_the_sort_goes_three_step_above_256_rows_and_time_never_falls():
    _, cut = _pair("fp8")
    n_moe = QWEN.num_moe_layers
    at, above = cut.kernel_time(CUTLASS_MOE_FUSED_SORT_MAX_ROWS), cut.kernel_time(CUTLASS_MOE_FUSED_SORT_MAX_ROWS + 1)
    assert above - at == pytest.approx(n_moe * 2 * KERNEL_FIXED_S, rel=1e-12)
    times = [cut.iteration_time(IterationWork(tokens=n, logits=n, decode_seqs=n, decode_ctx=1000.0 * n))
             for n in (1, 64, 256, 257, 512, 2048)]
    assert times == sorted(times)


def test_dense_models_and_explicit_kernel_costs_are_untouched():
    dense = CAT.model("llama3.1-8b")
    kw = {"tp": 1, "collective": None, "kv_dtype": "fp8"}
    a = build_cost_model(dense, H100, precision="fp8", moe_impl="generic", **kw)
    b = build_cost_model(dense, H100, precision="fp8", moe_impl="cutlass", **kw)
    assert dataclasses.replace(b, _expert_eff_cache={}) == dataclasses.replace(a, _expert_eff_cache={})
    gen, cut = _pair("fp8", kernel_fixed_s=0.0)
    assert cut.kernel_time(4096) == gen.kernel_time(4096) == 0.0


def test_unknown_moe_impl_is_a_config_error():
    with pytest.raises(ConfigError, match="moe_impl"):
        build_cost_model(QWEN, H100, precision="fp8", kv_dtype="fp8", tp=8, collective=None, moe_impl="triton")
