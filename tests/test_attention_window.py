"""Local attention (``attention_window``): sliding and chunked layers, GPT-OSS, training and serving.

The pair counts are checked against a brute-force count of which keys each query sees; the
simulators must price local layers by those pairs and no more."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fmsim
from fmsim.errors import ConfigError
from fmsim.model.architecture import AttentionWindow, model_from_mapping
from fmsim.model.flops import attention_flops_per_token, model_flops_per_step
from fmsim.model.serving_cost import build_cost_model, causal_pairs, window_pairs
from fmsim.scenario import scenario_from_mapping

BASE = {"name": "m", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "vocab": 1000,
        "activation": "swiglu", "ffn_hidden": 1024}


def _brute_keys(s: int, size: int, kind: str) -> float:
    """Mean keys per query of a causal s-token sequence, query by query."""
    total = 0
    for i in range(s):                       # 0-based position
        if kind == "sliding":
            total += min(i + 1, size)
        else:                                # chunked: its own chunk, up to itself
            total += i % size + 1
    return total / s


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 600), size=st.integers(1, 300), kind=st.sampled_from(["sliding", "chunked"]))
def test_keys_per_query_matches_a_brute_force_count(s, size, kind):
    w = AttentionWindow(size=size, kind=kind)
    assert w.keys_per_query(s) == pytest.approx(_brute_keys(s, size, kind), rel=1e-12)
    assert w.keys_per_query(s) <= min(size, (s + 1) / 2) + 1e-9


@settings(max_examples=60, deadline=None)
@given(chunk=st.integers(1, 300), past=st.integers(0, 400), window=st.integers(1, 300))
def test_window_pairs_of_a_prefill_chunk_match_a_brute_force_count(chunk, past, window):
    brute = sum(min(j, window) for j in range(past + 1, past + chunk + 1))
    assert window_pairs(chunk, past, window) == pytest.approx(brute)
    assert window_pairs(chunk, past, window) <= causal_pairs(chunk, past)


def test_full_every_picks_the_full_layers_as_gpt_oss_alternates_them():
    m = fmsim.load_catalog().model("gpt-oss-120b")
    # layer_types in its config.json: sliding_attention, full_attention, ... from layer 0
    assert [m.is_windowed_layer(i) for i in range(4)] == [True, False, True, False]
    assert sum(m.is_windowed_layer(i) for i in range(m.layers)) == 18
    every = model_from_mapping({**BASE, "attention_window": {"size": 16}})
    assert all(every.is_windowed_layer(i) for i in range(4))
    assert every.window == AttentionWindow(size=16, kind="sliding", full_every=0)
    assert model_from_mapping(every.to_mapping()) == every


@pytest.mark.parametrize("window, field, words", [
    ({"size": 16, "full_every": 1}, "model.attention_window.full_every", "every layer full"),
    ({"size": 16, "full_every": 9}, "model.attention_window.full_every", "exceeds 4 layers"),
    ({"size": 16, "kind": "slide"}, "model.attention_window.kind", "did you mean 'sliding'"),
    ({"size": 0}, "model.attention_window.size", ""),
    ({"sise": 16}, "model.attention_window.sise", "did you mean 'size'"),
    (128, "model.attention_window", "expected a mapping"),
])
def test_a_malformed_window_is_a_located_error(window, field, words):
    with pytest.raises(ConfigError) as info:
        model_from_mapping({**BASE, "attention_window": window})
    assert info.value.field == field
    assert words in info.value.message


def test_exact_flops_count_the_window_pairs_and_the_nemo_count_the_band():
    cat = fmsim.load_catalog()
    m = cat.model("gpt-oss-120b")
    full = dataclasses.replace(m, window=None)
    s, per_layer = 4096, 2.0 * 2 * m.heads * m.head_dim      # QK^T and AV: 2 FLOPs per MAC, d_qk + d_v
    half = m.layers // 2
    assert attention_flops_per_token(m, s) == pytest.approx(
        per_layer * (half * s / 2 + half * _brute_keys(s, 128, "sliding")))
    assert attention_flops_per_token(m, s, causal=False) == pytest.approx(per_layer * (half * s + half * 128))
    assert model_flops_per_step(m, s, 8, "nemo") < model_flops_per_step(full, s, 8, "nemo")
    # conventions that know nothing of windows count every layer in full
    assert model_flops_per_step(m, s, 8, "palm") == model_flops_per_step(full, s, 8, "palm")


def _train(model, seq_len=8192):
    return scenario_from_mapping({
        "version": 1, "name": "w",
        "workload": {"kind": "pretrain", "model": model, "precision": "bf16", "seq_len": seq_len,
                     "global_batch": 64, "micro_batch": 1},
        "parallelism": {"tp": 1, "pp": 1, "ep": 8, "dp": "auto", "zero": 1, "recompute": "none"},
        "cluster": {"instance": "p5.48xlarge", "nodes": 1}})


def test_training_prices_local_layers_by_their_window():
    cat = fmsim.load_catalog()
    m = cat.model("gpt-oss-20b")
    local = fmsim.simulate(_train(m.to_mapping()))
    full = fmsim.simulate(_train({**m.to_mapping(), "attention_window": None, "name": "no-window"}))
    assert local.get("step_time_s") < full.get("step_time_s")
    # only the attention core changes: the saving is at most what the full model spends on it
    saving = full.breakdown["compute"] - local.breakdown["compute"]
    assert 0 < saving < full.breakdown["compute"]
    # a window as long as the sequence is no window at all (full layers count s²/2 pairs, the
    # window its exact s(s+1)/2: a few parts per million apart)
    wide = fmsim.simulate(_train({**m.to_mapping(), "name": "wide",
                                  "attention_window": {"size": 8192, "full_every": 2}}))
    assert wide.get("step_time_s") == pytest.approx(full.get("step_time_s"), rel=1e-4)
    assert fmsim.estimate(_train(m.to_mapping())).get("step_time_s") < fmsim.estimate(
        _train({**m.to_mapping(), "attention_window": None, "name": "no-window"})).get("step_time_s")


def test_serving_decode_and_prefill_see_at_most_the_window_on_local_layers():
    cat = fmsim.load_catalog()
    m = cat.model("gpt-oss-120b")
    inst = cat.instance("p5.48xlarge")
    local = build_cost_model(m, inst, precision="bf16", kv_dtype="bf16", tp=4, collective=None)
    full = build_cost_model(dataclasses.replace(m, window=None), inst, precision="bf16", kv_dtype="bf16", tp=4,
                            collective=None)
    assert (local.window, local.window_share) == (128, 0.5)
    ctx = np.array([50, 128, 4000])
    assert local.effective_context(ctx) == pytest.approx(0.5 * 4178 + 0.5 * (50 + 128 + 128))
    assert full.effective_context(ctx) == 4178
    assert local.context_growth(ctx) == pytest.approx(0.5 * 3 + 0.5 * 1)   # only the 50-token one still grows
    assert local.prefill_pairs(4096, 0) == pytest.approx(0.5 * causal_pairs(4096, 0) + 0.5 * window_pairs(4096, 0, 128))
    assert local.prefill_time(8192) < full.prefill_time(8192)


# -- the KV pool of an engine that keeps a local layer's window only ------------------------------

def _kv_cfg(window_share, window_keep=144, block=16):
    from fmsim.engine.serving_des import EngineConfig
    return EngineConfig(max_seqs=256, max_batch_tokens=8192, chunked_prefill=True, mixed_batches=True,
                        block_size=block, total_blocks=10_000, admission="optimistic", prefix_caching=True,
                        window_share=window_share, window_keep=window_keep)


@settings(max_examples=60, deadline=None)
@given(own=st.integers(0, 5000), extra=st.integers(0, 3000), share=st.sampled_from([0.0, 0.5, 5 / 6]))
def test_a_sequence_takes_its_full_layers_tokens_and_at_most_the_window_on_local_ones(own, extra, share):
    cfg = _kv_cfg(share)
    total = own + extra                           # the part before `own` sits in shared prefix blocks
    slots = (1 - share) * own + share * min(total, 144)
    assert int(cfg.blocks(own, total)) == math.ceil(round(slots / 16, 9))
    if share == 0:
        assert int(cfg.blocks(own, total)) == -(-own // 16)          # the plain paged count
    assert float(cfg.kv_slots(total)) <= total


def test_vllm_holds_more_long_sequences_of_a_sliding_window_model_and_never_overfills_its_pool():
    cat = fmsim.load_catalog()
    local = cat.model("gpt-oss-20b").to_mapping()
    full = {**local, "name": "gpt-oss-20b-full-kv"}
    full.pop("attention_window")

    def run(model, engine="vllm"):
        return fmsim.simulate(scenario_from_mapping({
            "version": 1, "name": "kv", "seed": 3,
            "workload": {"kind": "inference", "model": model, "precision": "bf16"},
            "parallelism": {"tp": 1}, "cluster": {"instance": "p5.48xlarge", "nodes": 1},
            "traffic": {"arrival": "offline", "requests": 200, "prompt_len": 8000, "output_len": 1000},
            "serving": {"engine": engine, "replicas": 1, "max_seqs": 1024}}))

    w, f = run(local), run(full)
    assert w.get("decode_batch_mean") > 1.5 * f.get("decode_batch_mean")
    assert w.get("output_tokens_per_s") > f.get("output_tokens_per_s")
    assert w.get("kv_utilization_peak") <= 1.0 and f.get("kv_utilization_peak") <= 1.0
    assert w.get("unfinished_requests") == 0 and w.get("rejected_requests") == 0
    # an engine without a sliding-window KV manager (vLLM V0) stores every layer's KV for every token
    assert run(local, "vllm-0.6").get("decode_batch_mean") == pytest.approx(
        run(full, "vllm-0.6").get("decode_batch_mean"), rel=0.05)
