"""Data-parallel attention: an iteration waits for its busiest attention rank.

With attention DP each rank runs its own sequences through attention and the non-expert layers, and the MoE
layers' collectives make every rank wait for the slowest (TensorRT-LLM tech blog 10, "ADP Balance Strategy":
"the execution time for the Attention module in any given iteration is bounded by the rank with the highest
workload"). Its baseline scheduler sorts new requests by tokens and deals them round-robin over the ranks, so
a prefill chunk lands on one rank while the others only decode.
"""
from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from fmsim.catalog import load_catalog
from fmsim.engine.serving_des import Job, ReplicaEngine
from fmsim.model.serving_cost import IterationWork, build_cost_model

CAT = load_catalog()
ROOT = Path(__file__).resolve().parents[1]


def _cost(attention_dp: bool = True):
    return build_cost_model(CAT.model("deepseek-r1"), CAT.instance("dgx-b200"), precision="fp4", kv_dtype="bf16",
                            tp=1 if attention_dp else 8, ep=8, attention_dp=attention_dp, collective=None)


def _job(prompt: int) -> Job:
    return Job(jid=0, arrival_s=0.0, prompt=prompt, out=np.array([16]))


def _busiest(cost, chunks, n):
    return ReplicaEngine._busiest_rank(types.SimpleNamespace(cost=cost), chunks, n)


def _work(cost, chunks, n, ctx=2048.0, **rank):
    pairs = sum(cost.prefill_pairs(c, 0) for _, c in chunks)
    tokens = n + sum(c for _, c in chunks)
    return IterationWork(tokens=tokens, logits=n + len(chunks), decode_seqs=n, decode_ctx=n * ctx,
                         prefill_pairs=pairs, prefill_kv_reads=float(sum(c for _, c in chunks)), **rank)


def test_one_prefill_chunk_makes_the_iteration_wait_for_its_rank():
    cost = _cost()
    chunks = [(_job(1024), 1024)]
    rank = _busiest(cost, chunks, 3072)
    assert rank["rank_tokens"] == 3072 + 8 * 1024      # its 384 decodes and the whole chunk, times 8 ranks
    even = cost.iteration_time(_work(cost, chunks, 3072))
    busiest = cost.iteration_time(_work(cost, chunks, 3072, **rank))
    assert busiest > even * 1.05
    # the routed experts see every rank's tokens either way: only the rank-local parts grow
    assert cost.breakdown(_work(cost, chunks, 3072, **rank))["attention_prefill_s"] == pytest.approx(
        8 * cost.breakdown(_work(cost, chunks, 3072))["attention_prefill_s"], rel=1e-9)


def test_a_chunk_per_rank_is_the_even_spread():
    cost = _cost()
    chunks = [(_job(1024), 1024) for _ in range(8)]
    rank = _busiest(cost, chunks, 3072)
    assert rank["rank_tokens"] == pytest.approx(3072 + 8 * 1024)
    assert cost.iteration_time(_work(cost, chunks, 3072, **rank)) == pytest.approx(
        cost.iteration_time(_work(cost, chunks, 3072)), rel=1e-12)


def test_round_robin_gives_rank_zero_the_largest_chunk_of_each_round():
    cost = _cost()
    sizes = [100, 900, 300, 500, 200, 800, 700, 400, 600]   # 9 chunks over 8 ranks: rank 0 takes 900 and 100
    rank = _busiest(cost, [(_job(s), s) for s in sizes], 0)
    assert rank["rank_tokens"] == 8 * (900 + 100)


@pytest.mark.parametrize("chunks", [[], [(1024, 1024)]])
def test_plain_tensor_parallel_and_decode_only_iterations_are_unchanged(chunks):
    jobs = [(_job(p), c) for p, c in chunks]
    assert _busiest(_cost(attention_dp=False), jobs, 256) == {}
    if not chunks:
        assert _busiest(_cost(), jobs, 256) == {}


def test_the_busiest_rank_never_speeds_an_iteration():
    cost = _cost()
    rng = np.random.default_rng(7)
    for _ in range(20):
        sizes = [int(s) for s in rng.integers(1, 2048, size=int(rng.integers(1, 20)))]
        chunks = [(_job(s), s) for s in sizes]
        n = int(rng.integers(0, 4000))
        assert cost.iteration_time(_work(cost, chunks, n, **_busiest(cost, chunks, n))) >= \
            cost.iteration_time(_work(cost, chunks, n)) * (1 - 1e-12)


def test_trtllm_moves_tokens_by_allgather_and_reduce_scatter_as_its_cutlass_moe_does():
    """TensorRT-LLM's CUTLASS MoE with attention DP all-gathers the quantized tokens (with their top-k ids and
    weights) and reduce-scatters the 16-bit outputs (fused_moe_cutlass.py); the other engines' profiles keep
    the all-to-all dispatch and combine."""
    from fmsim.model.serving_cost import ENGINES

    assert ENGINES["trtllm"].moe_comm == "allgather"
    assert {e.moe_comm for n, e in ENGINES.items() if n != "trtllm"} == {"all-to-all"}
    calls = []

    def coll(op, size, group, per_node=None):
        calls.append((op, size, group))
        return 1e-6

    model, inst = CAT.model("deepseek-r1"), CAT.instance("dgx-b200")
    kw = dict(precision="fp4", kv_dtype="bf16", tp=1, ep=8, attention_dp=True, collective=coll)
    ag = build_cost_model(model, inst, moe_comm="allgather", **kw)
    a2a = build_cost_model(model, inst, **kw)
    calls.clear()
    layers = model.num_moe_layers
    assert ag.comm_time(3072) == pytest.approx(layers * 2e-6, rel=1e-12)   # one gather + one scatter per layer
    assert len(calls) == 2
    assert ("all-gather", 3072 * (model.hidden * 0.5625 + 8 * 8), 8) in calls
    assert ("reduce-scatter", 3072 * model.hidden * 2.0, 8) in calls
    # the finalize kernel writes a row for every gathered token, not only the rank's own
    assert ag.elementwise_bytes_per_token - a2a.elementwise_bytes_per_token == pytest.approx(
        layers * model.hidden * 2.0 * (1 - 1 / 8), rel=1e-9)
    # plain tensor parallelism has no token exchange to choose
    tp8 = build_cost_model(model, inst, moe_comm="allgather", **{**kw, "tp": 8, "attention_dp": False})
    assert tp8.moe_comm == "all-to-all" and tp8.num_all_to_all == 0


def test_an_unknown_moe_exchange_is_refused():
    from fmsim.errors import ConfigError

    with pytest.raises(ConfigError, match="moe_comm"):
        build_cost_model(CAT.model("deepseek-r1"), CAT.instance("dgx-b200"), precision="fp4", kv_dtype="bf16",
                         tp=1, ep=8, attention_dp=True, collective=None, moe_comm="ring")


def test_attention_kept_at_16_bits_reads_and_computes_at_16_bits():
    """serving.attention_precision: a checkpoint that leaves its attention projections unquantized (NVIDIA's
    NVFP4 DeepSeek-R1) stores and multiplies them at 16 bits; the rest of the model keeps its precision."""
    model, inst = CAT.model("deepseek-r1"), CAT.instance("dgx-b200")
    kw = dict(precision="fp4", kv_dtype="bf16", tp=1, ep=8, attention_dp=True, collective=None)
    fp4 = build_cost_model(model, inst, **kw)
    mixed = build_cost_model(model, inst, attention_precision="bf16", **kw)
    same = build_cost_model(model, inst, attention_precision="fp4", **kw)
    attn = model.layers * model.attention_params()
    assert mixed.dense_weight_bytes - fp4.dense_weight_bytes == pytest.approx(attn * (2.0 - 0.5625), rel=1e-9)
    acc = inst.accelerator
    rate = acc.gemm_flop_per_s("fp4") / acc.gemm_flop_per_s("bf16")
    assert mixed.dense_flop_per_token - fp4.dense_flop_per_token == pytest.approx(2 * attn * (rate - 1) / 8,
                                                                                  rel=1e-9)
    assert same == fp4 and mixed.expert_weight_bytes == fp4.expert_weight_bytes
    w = IterationWork(tokens=3072, logits=3072, decode_seqs=3072, decode_ctx=3072 * 2048.0)
    assert mixed.iteration_time(w) > fp4.iteration_time(w)


def test_attention_precision_is_a_serving_setting_with_a_located_error(tmp_path):
    import fmsim
    from fmsim.errors import ConfigError

    src = (ROOT / "scenarios" / "validation" / "inference" / "ttc-011.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace("attention_precision: bf16", "attention_precision: int3"))
    with pytest.raises(ConfigError, match="attention_precision"):
        fmsim.estimate(fmsim.load_scenario(bad))


def test_padding_captures_the_rank_s_own_limit_as_a_graph_as_tensorrt_llm_does():
    """TensorRT-LLM with graph padding keeps the listed sizes within min(max_batch, max_tokens) and, when the list
    holds a larger one, captures that bound too (_filter_cuda_graph_batch_sizes), so every decode batch pads
    into a graph: a 224-sequence rank pads 172 sequences to 224, not runs them bare."""
    from fmsim.workloads.inference import captured_graph_sizes

    listed = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512)
    assert captured_graph_sizes(listed, 224, 2048) == (1, 2, 4, 8, 16, 32, 64, 128, 224)
    assert captured_graph_sizes(listed, 384, 1536) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 384)
    assert captured_graph_sizes(listed, 4096, 300) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 300)
    assert captured_graph_sizes((1, 2, 4), 224, 2048) == (1, 2, 4)        # nothing larger listed: nothing added


def test_the_h100_qwen3_row_pads_each_rank_to_its_own_limit():
    import fmsim
    from fmsim.workloads.inference import plan_from_scenario

    plan = plan_from_scenario(fmsim.load_scenario(ROOT / "scenarios/validation/inference/inf-094.yaml"),
                              collective=None)
    cost = plan.pool("serve").cost
    per_rank = plan.pool("serve").cfg.max_seqs // cost.dp_groups
    # trtllm-bench's limit (1280 a rank on H100, tests/test_moe_serving_limits.py) is captured as the last graph;
    # a rank of 172 sequences pads to the next listed size below it
    assert cost.graph_batch_sizes[-1] == per_rank == 1280 and cost.padded(172 * 8) == 256 * 8
