"""Per-iteration serving cost: hand-worked rooflines, MoE expert occupancy, MLA KV, memory, monotonicity."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsim.catalog import load_catalog
from fmsim.errors import OutOfMemoryError, ParallelismError
from fmsim.model.architecture import model_from_mapping
from fmsim.model.serving_cost import (
    BYTES_PER_ELEMENT,
    ENGINES,
    IterationWork,
    auto_limits,
    build_cost_model,
    causal_pairs,
    kv_stream_tokens,
)


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def _cm(cat, model="llama3.1-8b", inst="dgx-h100", prec="bf16", **kw):
    kw.setdefault("collective", None)
    kw.setdefault("kernel_fixed_s", 0.0)
    return build_cost_model(cat.model(model), cat.instance(inst), precision=prec, kv_dtype=kw.pop("kv", prec),
                            tp=kw.pop("tp", 1), **kw)


def test_single_sequence_decode_reads_the_weights_once(cat):
    """Batch 1 is bandwidth-bound: time = (weights + KV + activations) / achievable HBM bandwidth."""
    m = cat.model("llama3.1-8b")
    acc = cat.instance("dgx-h100").accelerator
    cm = _cm(cat)
    bw = acc.hbm_bytes_per_s * acc.hbm_efficiency
    t = cm.iteration_time(IterationWork(tokens=1, logits=1, decode_seqs=1, decode_ctx=1000))
    non_embed = m.num_params - 2 * m.vocab * m.hidden
    weights = non_embed * 2 + m.vocab * m.hidden * 2            # bf16 layers + bf16 LM head
    kv = 2 * m.layers * m.kv_heads * m.head_dim * 2 * 1000
    expect = (weights + kv) / bw
    assert t == pytest.approx(expect, rel=0.01)                 # + tiny norm/activation traffic


def test_large_prefill_is_compute_bound_at_the_gemm_and_forward_attention_rates(cat):
    m = cat.model("llama3.1-8b")
    acc = cat.instance("dgx-h100").accelerator
    cm = _cm(cat)
    n = 8192
    w = cm.prefill_work(n, 0, finishing=True)
    t_lin = cm.linear_time(n, 1)
    non_embed = m.num_params - 2 * m.vocab * m.hidden
    assert t_lin >= 2 * non_embed * n / acc.gemm_flop_per_s("bf16")
    # causal attention: 4 * layers * heads * head_dim FLOPs per (query, key) pair
    pairs = causal_pairs(n, 0)
    assert pairs == n * (n + 1) / 2
    # attention forward, causal, at the catalog's forward fraction of the 16-bit peak (below the GEMMs')
    assert 0 < acc.attention_forward_efficiency < acc.gemm_efficiency["bf16"]
    attn = 4 * m.layers * m.heads * m.head_dim * pairs / (acc.peak("bf16") * acc.attention_forward_efficiency)
    assert cm.iteration_time(w) == pytest.approx(t_lin + attn + cm.kv_write_bytes_per_token * n
                                                 / cm.hbm_bytes_per_s, rel=1e-9)


def test_decode_coeffs_match_iteration_time(cat):
    cm = _cm(cat, tp=2, collective=None)
    for n, ctx in ((1, 100.0), (37, 2.0e4), (300, 4.0e5)):
        c0, c1 = cm.decode_coeffs(n)
        assert c0 + c1 * ctx == pytest.approx(cm.iteration_time(
            IterationWork(tokens=n, logits=n, decode_seqs=n, decode_ctx=ctx)), rel=1e-12)


def test_graph_padding_prices_the_padded_batch(cat):
    cm = _cm(cat, graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256))
    plain = _cm(cat)
    # linear layers and collectives run 128 rows; only the KV append follows the 100 real ones
    assert cm.decode_coeffs(100)[0] == pytest.approx(plain.decode_coeffs(128)[0], rel=1e-3)
    assert cm.decode_coeffs(100)[0] > plain.decode_coeffs(100)[0]


def test_moe_touched_experts_follow_occupancy(cat):
    cm = _cm(cat, model="mixtral-8x7b", prec="fp8", kv="fp8", tp=2)
    E, k = 8, 2
    assert cm._touched_fraction(1) == pytest.approx(k / E)
    assert cm._touched_fraction(4) == pytest.approx(1 - (1 - k / E) ** 4)
    assert cm._touched_fraction(10_000) == pytest.approx(1.0)


def test_mla_kv_is_the_compressed_latent(cat):
    m = cat.model("deepseek-v3")
    cm = _cm(cat, model="deepseek-v3", inst="dgx-b200", prec="fp8", kv="fp8", tp=1, ep=8, attention_dp=True)
    assert cm.kv_bytes_per_token_total == m.layers * (m.mla.kv_lora_rank + m.mla.qk_rope_dim) * 1.0
    assert cm.engine_gpus == 8 and cm.dp_groups == 8
    assert cm.num_all_to_all == 2 * m.num_moe_layers and cm.num_all_reduce == 0


def test_gqa_kv_heads_split_over_tp_and_replicated_beyond(cat):
    m = cat.model("llama3.1-70b")                   # 8 KV heads
    c8 = _cm(cat, model="llama3.1-70b", tp=8)
    assert c8.kv_bytes_per_token_per_gpu == 2 * m.layers * 1 * m.head_dim * 2
    c2 = _cm(cat, model="llama3.1-70b", tp=2)
    assert c2.kv_bytes_per_token_per_gpu == 2 * m.layers * 4 * m.head_dim * 2


def test_tp_must_divide_heads(cat):
    with pytest.raises(ParallelismError, match="does not divide"):
        _cm(cat, tp=3)


def test_weights_that_do_not_fit_raise_out_of_memory(cat):
    cm = _cm(cat, model="llama3.1-405b", inst="dgx-h100", prec="bf16", tp=1)
    with pytest.raises(OutOfMemoryError, match="nothing is left for the KV cache"):
        cm.kv_capacity_tokens(hbm_bytes=cat.instance("dgx-h100").accelerator.hbm_bytes, memory_fraction=0.9,
                              fraction_of="total", activation_bytes=0.0)


def test_fp8_halves_weight_bytes(cat):
    a, b = _cm(cat, prec="bf16"), _cm(cat, prec="fp8", kv="fp8")
    assert b.dense_weight_bytes == pytest.approx(a.dense_weight_bytes / 2)
    assert BYTES_PER_ELEMENT["fp4"] == pytest.approx(0.5 + 1 / 16)


def test_auto_limits_follow_trtllm_bench_rules():
    bs, tok = auto_limits(1_000_000, 1000, 1000)
    assert bs == 512 and tok == 1024 * math.ceil(500 * 2 / 1024) or tok == 2048
    bs, tok = auto_limits(1_000_000, 20000, 2000, chunked_prefill=False)
    assert tok >= 20000 + bs


def test_prefill_attention_reads_the_context_once_per_chunk():
    assert kv_stream_tokens(128, 1000) == 1128
    assert kv_stream_tokens(4096, 0) == 4096


def test_every_engine_profile_names_its_source():
    for p in ENGINES.values():
        assert p.source and p.admission in ("optimistic", "reserve")


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(1.0, 4.0), n=st.integers(1, 4096), ctx=st.floats(0, 1e7), pf=st.integers(0, 8192))
def test_faster_memory_or_compute_never_slows_an_iteration(scale, n, ctx, pf):
    cat = load_catalog()
    inst = cat.instance("dgx-h100")
    acc = inst.accelerator
    fast_acc = dataclasses.replace(acc, hbm_bytes_per_s=acc.hbm_bytes_per_s * scale,
                                   peak_flop_per_s={k: v * scale for k, v in acc.peak_flop_per_s.items()})
    fast = dataclasses.replace(inst, accelerator=fast_acc)
    m = cat.model("llama3.1-8b")
    w = IterationWork(tokens=n + pf, logits=n + (1 if pf else 0), decode_seqs=n, decode_ctx=ctx,
                      prefill_pairs=causal_pairs(pf, 0), prefill_kv_reads=kv_stream_tokens(pf, 0) if pf else 0)
    slow_t = build_cost_model(m, inst, precision="bf16", kv_dtype="bf16", tp=1, collective=None).iteration_time(w)
    fast_t = build_cost_model(m, fast, precision="bf16", kv_dtype="bf16", tp=1, collective=None).iteration_time(w)
    assert fast_t <= slow_t * (1 + 1e-12)


def test_inline_tiny_model_builds():
    m = model_from_mapping({"name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
                            "ffn_hidden": 128, "activation": "swiglu", "vocab": 1000})
    cat = load_catalog()
    cm = build_cost_model(m, cat.instance("dgx-h100"), precision="bf16", kv_dtype="bf16", tp=2, collective=None)
    assert cm.kv_bytes_per_token_per_gpu == 2 * 2 * 1 * 16 * 2


def test_gemm_k_efficiency_reproduces_the_deepgemm_large_m_rows_within_a_tenth():
    """K / (K + 640) times the asymptote 0.68 against DeepGEMM's M=4096 FP8 rows on H800 (README @7a70b43)."""
    from fmsim.model.serving_cost import gemm_k_efficiency

    rows = [(7168, 1058), (1536, 990), (512, 590), (16384, 1358), (7168, 1304), (2048, 1025)]
    for k, tflops in rows:
        assert abs(0.68 * gemm_k_efficiency(k) - tflops / 1979) < 0.1
    assert gemm_k_efficiency(512) < gemm_k_efficiency(4096) < gemm_k_efficiency(65536) < 1.0


def test_tensor_parallel_shortens_k_and_lowers_compute_bound_gemm_efficiency():
    cat = load_catalog()
    m = cat.model("llama3.1-70b")
    inst = cat.instance("dgx-h100")
    e1 = build_cost_model(m, inst, precision="fp8", kv_dtype="fp8", tp=1, collective=None).dense_gemm_eff
    e8 = build_cost_model(m, inst, precision="fp8", kv_dtype="fp8", tp=8, collective=None).dense_gemm_eff
    assert 0.5 < e8 < e1 < 1.0


def test_vllm_0_6_profile_waits_on_the_cpu_and_v1_does_not():
    assert ENGINES["vllm-0.6"].cpu_overhead_fraction > 0.0 == ENGINES["vllm"].cpu_overhead_fraction
    assert not ENGINES["vllm-0.6"].chunked_prefill and not ENGINES["vllm-0.6"].mixed_batches


def test_gemm_shape_pays_edge_tiles_a_partial_last_wave_and_split_k_s_shorter_depth():
    from fmsim.model.kernels import gemm_efficiency, gemm_k_efficiency

    k0 = 320.0
    # 192 rows fill a 128-row tile and a half: 75 % of the rows computed are real; 2 x 64 = 128 tiles
    # of 128x128 keep 128 of 132 SMs busy at full depth, which beats splitting the 64 tiles of 128x256
    # in two (the same SMs, each walking half the depth)
    assert gemm_efficiency(192, 8192, 8192, 132, k0) == pytest.approx(
        0.75 * 128 / 132 * gemm_k_efficiency(8192, k0))
    # a full grid of 128x256 tiles on 132 SMs: 16 x 32 = 512 tiles run in 4 waves of 132 (97 %), at full depth
    assert gemm_efficiency(2048, 8192, 8192, 132, k0) == pytest.approx(
        512 / (4 * 132) * gemm_k_efficiency(8192, k0), rel=0.1)
    # a small grid splits deeper but each split pays the tile's fixed cost again: never above the full wave
    assert gemm_efficiency(256, 1024, 4096, 132, k0) < gemm_efficiency(256, 1024 * 16, 4096, 132, k0)
    assert gemm_efficiency(4096, 8192, 8192, 0, k0) == gemm_k_efficiency(8192, k0)   # no SM count: depth only


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 60000), k=st.integers(1, 30000), dk=st.integers(1, 30000),
       units=st.sampled_from([0, 108, 132, 148]))
def test_gemm_shape_efficiency_is_a_fraction_that_a_deeper_reduction_never_lowers(m, n, k, dk, units):
    from fmsim.model.kernels import gemm_efficiency, gemm_k_efficiency

    e = gemm_efficiency(m, n, k, units, 320.0)
    assert 0.0 < e <= gemm_k_efficiency(k, 320.0) <= 1.0
    assert gemm_efficiency(m, n, k + dk, units, 320.0) >= e


def test_decode_batch_of_a_tile_and_a_half_pays_for_two_tiles_of_math():
    cat = load_catalog()
    cm = build_cost_model(cat.model("llama3.1-70b"), cat.instance("dgx-h200"), precision="fp8", kv_dtype="fp8",
                          tp=1, collective=None)
    assert cm.dense_efficiency(192) < cm.dense_efficiency(256) <= cm.dense_gemm_eff
    assert cm.dense_efficiency(192) == pytest.approx(0.75 * cm.dense_efficiency(256), rel=0.05)


def test_trtllm_limits_and_cuda_graphs_hold_per_attention_rank(cat):
    """TensorRT-LLM's --max_batch_size is 'Max batch size in each rank' (DeepSeek-R1 best-practice blog:
    8 ranks x 896 = concurrency 7168): with attention DP the engine's stated limits are each rank's, and each
    rank pads its own share of the batch to a captured graph; without attention DP, or on another engine,
    nothing changes."""
    from pathlib import Path

    import fmsim
    from fmsim.workloads.inference import plan_from_scenario

    root = Path(__file__).resolve().parent.parent
    path = root / "scenarios" / "validation" / "inference" / "inf-094.yaml"
    limits = {"serving.max_seqs": 96, "serving.max_batch_tokens": 2048}
    pool = plan_from_scenario(fmsim.load_scenario(path, overrides=limits)).pool("serve")
    assert (pool.cfg.max_seqs, pool.cfg.max_batch_tokens) == (8 * 96, 8 * 2048)
    assert pool.cost.graphs_per_rank
    assert max(pool.cost.graph_batch_sizes) == 96             # listed graphs up to each rank's 96, and 96 itself
    assert pool.cost.padded(8 * 90) == 8 * 96                 # beyond the last listed size: padded to the limit
    assert pool.cost.padded(8 * 60 + 1) == 8 * 64            # one rank's 61 pads to 64, as every rank's does
    flat = {**limits, "serving.attention_dp": False, "parallelism.tp": 8, "parallelism.ep": 1}
    plain = plan_from_scenario(fmsim.load_scenario(path, overrides=flat))
    assert plain.pool("serve").cfg.max_seqs == 96
    vllm = plan_from_scenario(fmsim.load_scenario(path, overrides={**limits, "serving.engine": "vllm"}))
    assert vllm.pool("serve").cfg.max_seqs == 96


@pytest.mark.parametrize("attention_dp,tp,ep", [(True, 1, 8), (False, 8, 1)])
def test_moe_tokens_are_permuted_once_per_chosen_expert_around_the_grouped_gemms(cat, attention_dp, tp, ep):
    """One more expert per token adds, per MoE layer, its activation-function pass and one more permuted row
    written and read back (TensorRT-LLM's expandInputRows / finalizeMoeRouting): each GPU's share of the rows
    when the experts are spread over the engine, every row on every GPU under plain TP."""
    model = cat.model("qwen3-235b-a22b")
    inst = cat.instance("dgx-h100")
    more = dataclasses.replace(model, moe=dataclasses.replace(model.moe, top_k=model.moe.top_k + 1))
    kw = dict(precision="fp8", kv_dtype="fp8", tp=tp, ep=ep, attention_dp=attention_dp, collective=None)
    a, b = build_cost_model(model, inst, **kw), build_cost_model(more, inst, **kw)
    gpus = 8
    act = 3 * model.moe.expert_ffn_hidden / gpus                      # SwiGLU over one more expert's width
    perm = 2 * model.hidden * (1 / gpus if attention_dp else 1.0)
    expect = model.num_moe_layers * (act + perm) * 2.0
    assert b.elementwise_bytes_per_token - a.elementwise_bytes_per_token == pytest.approx(expect, rel=1e-9)
