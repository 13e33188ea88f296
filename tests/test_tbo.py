"""Two-batch overlap (``serving.two_batch_overlap``, fmsim.model.tbo): the timeline's invariants, SGLang's stage
orders, the half-batch pricing through the serving cost model, and the scenario field's rules."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fmsim.catalog import load_catalog
from fmsim.errors import ConfigError
from fmsim.model import tbo
from fmsim.model.architecture import ModelSpec, MoESpec
from fmsim.model.serving_cost import IterationWork, build_cost_model
from fmsim.scenario import load_scenario
from fmsim.workloads.inference import plan_from_scenario

ROOT = Path(__file__).resolve().parent.parent
INFERENCE = ROOT / "scenarios" / "validation" / "inference"

piece = st.floats(min_value=0.0, max_value=1e-2, allow_nan=False)
halves = st.builds(tbo.HalfLayer, pre_s=piece, attn_s=piece, shared_s=piece, experts_s=piece, dispatch_s=piece,
                   combine_s=piece)


@given(a=halves, b=halves, layers=st.integers(1, 8), schedule=st.sampled_from(sorted(tbo.SCHEDULES)),
       rate=st.floats(0.5, 1.0))
def test_the_timeline_lies_between_its_busiest_resource_and_everything_in_series(a, b, layers, schedule, rate):
    t = tbo.overlapped_time(a, b, layers, schedule, rate)
    compute = layers * (a.compute_s + b.compute_s)
    comm = layers * (a.comm_s + b.comm_s)
    assert t >= max(compute, comm) * (1 - 1e-12)
    assert t <= tbo.serial_time(a, b, layers) * (1 + 1e-12) + 1e-15


@given(a=halves, layers=st.integers(1, 8), schedule=st.sampled_from(sorted(tbo.SCHEDULES)))
def test_without_communication_the_step_is_the_two_halves_compute(a, layers, schedule):
    quiet = dataclasses.replace(a, dispatch_s=0.0, combine_s=0.0)
    assert tbo.overlapped_time(quiet, quiet, layers, schedule, 0.8) == pytest.approx(2 * layers * quiet.compute_s)


def test_compute_beside_an_exchange_runs_at_the_overlap_clock():
    # one exchange of 1 s launched after 1 s of compute, then 2 s of compute: 1 s of it at 0.5 speed inside the
    # exchange (0.5 s of work), the remaining 1.5 s at full speed
    busy = [(1.0, 2.0)]
    assert tbo._run(1.0, 2.0, busy, 0, 0.5) == (3.5, 1)
    assert tbo._run(0.0, 0.5, busy, 0, 0.5) == (0.5, 0)
    slowed = tbo.HalfLayer(pre_s=1e-3, attn_s=1e-3, experts_s=1e-3, dispatch_s=1e-3, combine_s=1e-3)
    assert tbo.overlapped_time(slowed, slowed, 4, "prefill", 0.8) > tbo.overlapped_time(slowed, slowed, 4, "prefill")


def test_stages_follow_sglangs_operations_strategy():
    # prefill: 2 yields a layer, the layer boundary without one (the shared experts and combine wait run with the next
    # layer's attention); decode: 5 yields a layer, its last stage the layer output with the next attention prepare
    pre = tbo.stages("prefill", 2)
    assert pre[0] == ("pre", "attn", "send_d")
    assert pre[1] == ("wait_d", "experts", "send_c")
    assert pre[2] == ("shared", "wait_c", "pre", "attn", "send_d")
    assert len(pre) == 5
    dec = tbo.stages("decode", 2)
    assert dec[:5] == (("pre",), ("attn",), ("send_d", "shared"), ("wait_d", "experts", "send_c"), ("wait_c",))
    assert len(dec) == 10


def test_a_balanced_layer_hides_most_of_the_exchange():
    # compute of a half equal to its exchange: the overlapped layers take far less than in series, and the
    # communication-bound case is set by the network
    h = tbo.HalfLayer(pre_s=1e-3, attn_s=1e-3, shared_s=0.0, experts_s=1e-3, dispatch_s=1e-3, combine_s=2e-3)
    t = tbo.overlapped_time(h, h, 20, "prefill")
    assert t < 0.6 * tbo.serial_time(h, h, 20)
    comm_bound = dataclasses.replace(h, dispatch_s=5e-3, combine_s=5e-3)
    # (the network idles only while a micro-batch's own compute between its combine and its next dispatch runs)
    assert 20 * 2 * 10e-3 <= tbo.overlapped_time(comm_bound, comm_bound, 20, "decode") <= 1.15 * 20 * 2 * 10e-3


def _moe() -> ModelSpec:
    return ModelSpec(name="t-moe", layers=8, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn_hidden=14336,
                     activation="swiglu", vocab=32000,
                     moe=MoESpec(experts=64, top_k=4, expert_ffn_hidden=1024, shared_experts=1, dense_layers=2))


def _cost(**kw):
    inst = load_catalog().instance("dgx-h100")
    base = dict(precision="fp8", kv_dtype="bf16", tp=1, ep=16, attention_dp=True, collective=None, deepep="normal")
    base.update(kw)
    return build_cost_model(_moe(), inst, **base)


def test_without_communication_and_rate_independent_gemms_the_overlap_changes_nothing():
    # no exchange priced (collective None), no wave model, no weight floor, no fixed kernels: every piece is linear
    # in the tokens, so two halves run back to back take what the whole batch takes
    plain = _cost(kernel_fixed_s=0.0)
    plain = dataclasses.replace(plain, compute_units=0, dense_weight_bytes=0.0, expert_weight_bytes=0.0,
                                lm_weight_bytes=0.0, moe_layer_kernel_s=0.0)
    overlapped = dataclasses.replace(plain, two_batch_overlap=True)
    w = IterationWork(tokens=65536, logits=64, prefill_pairs=64 * 1024 * 1024 / 2, prefill_kv_reads=0)
    assert overlapped.iteration_time(w) == pytest.approx(plain.iteration_time(w), rel=1e-9)
    d = IterationWork(tokens=4096, logits=4096, decode_seqs=4096, decode_ctx=4096 * 2000.0)
    assert overlapped.iteration_time(d) == pytest.approx(plain.iteration_time(d), rel=1e-9)


def test_small_batches_can_lose_from_the_split():
    # with the weights read twice (once a micro-batch) and little exchange, a tiny decode batch is slower overlapped
    # -- as SGLang's own ablation found below 64-128 tokens a device
    off = _cost(collective="fabric", deepep="low_latency")
    on = dataclasses.replace(off, two_batch_overlap=True)
    w = IterationWork(tokens=32, logits=32, decode_seqs=32, decode_ctx=32 * 1000.0)
    assert on.iteration_time(w) > off.iteration_time(w)


def test_prefill_under_low_latency_deepep_runs_without_the_overlap():
    off = _cost(collective="fabric", deepep="low_latency")
    on = dataclasses.replace(off, two_batch_overlap=True)
    w = IterationWork(tokens=2048, logits=2, prefill_pairs=2 * 1024 * 1025 / 2, prefill_kv_reads=0)
    assert on.iteration_time(w) == off.iteration_time(w)


def test_prefill_gemms_run_on_the_sms_deepep_leaves():
    cost = _cost(collective="fabric")
    reserved = tbo._reserved(cost)
    units = cost.compute_units
    assert reserved.compute_units == units - tbo.DEEPEP_NORMAL_SMS
    assert reserved.gemm_flop_per_s == pytest.approx(cost.gemm_flop_per_s * (units - 20) / units)


def test_decode_coefficients_are_the_overlapped_steps_tangent():
    off = _cost(collective="fabric", deepep="low_latency")
    on = dataclasses.replace(off, two_batch_overlap=True, tbo_decode_context=2000.0)
    n = 512
    c0, c1 = on.decode_coeffs(n)
    w = IterationWork(tokens=n, logits=n, decode_seqs=n, decode_ctx=n * 2000.0)
    assert c0 + c1 * n * 2000.0 == pytest.approx(on.iteration_time(w), rel=1e-6)
    assert c1 >= 0


def test_the_cost_model_refuses_the_overlap_without_a_deepep_exchange():
    with pytest.raises(ConfigError, match="two_batch_overlap"):
        _cost(deepep="none", two_batch_overlap=True)


def test_the_scenario_field_needs_deepep(tmp_path):
    text = (INFERENCE / "inf-116.yaml").read_text()
    assert "two_batch_overlap: true" in text
    bad = tmp_path / "x.yaml"
    bad.write_text(text.replace("  deepep: low_latency", "  deepep: none"))
    with pytest.raises(ConfigError, match="true needs serving.deepep") as err:
        plan_from_scenario(load_scenario(bad))
    assert err.value.field == "serving.two_batch_overlap"
    dense_ep = tmp_path / "y.yaml"
    # (without the file's moe_imbalance unknowns: their values past 1 are refused at ep 1 before any plan is built)
    dense_ep.write_text(re.sub(r", unknown: \{[^}]*\}", "", text).replace("  ep: 72", "  ep: 1"))
    with pytest.raises(ConfigError, match="parallelism.ep") as err:
        plan_from_scenario(load_scenario(dense_ep))
    assert err.value.field == "serving.two_batch_overlap"


def test_sglang_ships_it_off_and_the_blog_rows_state_it_on():
    from fmsim.workloads.inference_spec import ServingSpec

    assert ServingSpec().two_batch_overlap is False
    for name in ("inf-113", "inf-114", "inf-115", "inf-116"):
        pool = plan_from_scenario(load_scenario(INFERENCE / f"{name}.yaml")).pools[0]
        assert pool.cost.two_batch_overlap, name
