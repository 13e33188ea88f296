"""Uneven MoE routing in training: the busiest expert-parallel rank's load, capacity drops and padding."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fmsim
from fmsim.hardware.collectives import all_to_all_time
from fmsim.model.memory import layer_activation_bytes
from fmsim.model.ops import Roofline, Shard, moe_mlp_forward
from fmsim.parallel.strategy import build_plan

ROOT = Path(__file__).resolve().parent.parent
MIXTRAL = ROOT / "scenarios" / "examples" / "mixtral-8x22b-p6-b200.yaml"


def scenario(**workload):
    return fmsim.load_scenario(MIXTRAL, overrides={f"workload.{k}": v for k, v in workload.items()})


def test_the_load_of_the_busiest_rank_follows_imbalance_capacity_and_padding():
    assert scenario().workload.moe_load == 1.0
    assert scenario(moe_imbalance=1.5).workload.moe_load == 1.5
    assert scenario(moe_imbalance=1.5, moe_capacity_factor=1.25).workload.moe_load == 1.25    # dropped
    assert scenario(moe_imbalance=1.1, moe_capacity_factor=1.25).workload.moe_load == 1.1     # under capacity
    assert scenario(moe_capacity_factor=1.25, moe_pad_to_capacity=True).workload.moe_load == 1.25   # padded


def test_the_expert_gemms_scale_with_the_load_and_the_useful_flops_do_not():
    sc = scenario()
    model, inst = sc.workload.model, sc.cluster.instance
    rf = Roofline.of(inst.accelerator, "fp8")
    sh = Shard(micro_batch=1, seq_len=4096, tp=2, ep=8, precision="fp8", expert_tp=1)
    even = moe_mlp_forward(model, sh, rf)
    heavy = moe_mlp_forward(model, Shard(micro_batch=1, seq_len=4096, tp=2, ep=8, precision="fp8", expert_tp=1,
                                         moe_load=1.5), rf)
    m, h = model.moe, model.hidden
    rows = 4096 / 2 * m.top_k                                  # tokens_in = T * etp / tp, top-k pairs each
    up = m.expert_ffn_hidden * 2                                # SwiGLU
    # one expert per rank (8 over EP8), its rows as routing draws them over the EP group's 8 x 2048 tokens, the
    # busiest rank's draw scaled by its load (tests/test_moe_training_routed.py)
    draw = lambda load: {"tokens": 8 * 2048, "top_k": m.top_k, "experts": m.experts, "load": load, "capacity": 0.0,
                         "pad": False, "spread": True}
    experts = lambda r, load: sum(rf.grouped_gemm(1, r, n, k, "multi-stream", draw(load))[0]
                                  for n, k in ((up, h), (h, m.expert_ffn_hidden)))
    assert heavy.gemm_s - even.gemm_s == pytest.approx(experts(1.5 * rows, 1.5) - experts(rows, 1.0), rel=1e-9)
    assert heavy.gemm_s > even.gemm_s
    assert heavy.flops == pytest.approx(even.flops, rel=1e-12)
    assert [r.size_bytes for r in heavy.comms] == [r.size_bytes for r in even.comms]   # own tokens' pairs
    assert [r.skew for r in heavy.comms] == [1.5, 1.5]          # the busiest receives 1.5x the mean


def test_the_dispatch_of_an_uneven_router_costs_the_busiest_ranks_traffic():
    sc = scenario(moe_imbalance=1.5)
    plan = build_plan(sc)
    even = build_plan(scenario())
    assert sum(st.fwd_comm.get("ep", 0.0) for st in plan.stages) > sum(st.fwd_comm.get("ep", 0.0) for st in even.stages)
    shape = plan.shapes["ep"]
    size = 64e6
    assert all_to_all_time(size, sc.cluster.instance, shape, skew=1.5).time_s > \
        all_to_all_time(size, sc.cluster.instance, shape).time_s


def test_the_busiest_rank_holds_more_expert_activations():
    model = scenario().workload.model
    args = {"micro_batch": 1, "seq_len": 4096, "tp": 2, "cp": 1, "sequence_parallel": True, "recompute": "none",
            "ep": 8, "expert_tp": 1}
    assert layer_activation_bytes(model, 0, **args, moe_load=1.5) > layer_activation_bytes(model, 0, **args)
    assert fmsim.simulate(scenario(moe_imbalance=1.5)).get("memory_per_gpu_bytes") > \
        fmsim.simulate(scenario()).get("memory_per_gpu_bytes")


@settings(max_examples=20, deadline=None)
@given(a=st.floats(1.0, 3.0), b=st.floats(1.0, 3.0))
def test_a_more_uneven_router_never_makes_the_step_shorter(a, b):
    lo, hi = sorted((a, b))
    t_lo = fmsim.estimate(scenario(moe_imbalance=lo)).get("step_time_s")
    t_hi = fmsim.estimate(scenario(moe_imbalance=hi)).get("step_time_s")
    assert t_hi >= t_lo * (1 - 1e-12)
    assert fmsim.estimate(scenario(moe_imbalance=lo)).get("mfu") >= fmsim.estimate(scenario(moe_imbalance=hi)).get("mfu") * (1 - 1e-12)


def test_a_balanced_router_reproduces_the_bundled_bands():
    assert fmsim.simulate(scenario(moe_imbalance=1.0)).metrics == fmsim.simulate(scenario()).metrics


@pytest.mark.parametrize("workload, says", [
    ({"moe_imbalance": 0.9}, "workload.moe_imbalance: 0.9 must be >= 1"),
    ({"moe_capacity_factor": 0}, "workload.moe_capacity_factor: 0 must be > 0"),
    ({"moe_pad_to_capacity": True}, "without moe_capacity_factor"),
])
def test_bad_moe_load_settings_are_refused_in_one_line(workload, says):
    with pytest.raises(fmsim.FmsimError) as err:
        scenario(**workload)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_moe_load_settings_are_refused_where_they_do_not_apply():
    with pytest.raises(fmsim.FmsimError, match="moe_imbalance: 1.2 with ep: 1"):
        fmsim.load_scenario(MIXTRAL, overrides={"workload.moe_imbalance": 1.2, "parallelism.ep": 1})
    with pytest.raises(fmsim.FmsimError, match="which has no experts"):
        fmsim.load_scenario(ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml",
                            overrides={"workload.moe_imbalance": 1.2})
    with pytest.raises(fmsim.FmsimError, match="training kinds only"):
        fmsim.load_scenario(ROOT / "scenarios" / "examples" / "serving-deepseek-v3-ep-p6-b200.yaml",
                            overrides={"workload.moe_capacity_factor": 1.25})


def test_the_moe_load_settings_survive_the_round_trip_through_a_mapping():
    from fmsim.scenario import scenario_from_mapping, scenario_to_mapping
    sc = scenario(moe_imbalance=1.3, moe_capacity_factor=1.25, moe_pad_to_capacity=True)
    again = scenario_from_mapping(scenario_to_mapping(sc)).workload
    assert (again.moe_imbalance, again.moe_capacity_factor, again.moe_pad_to_capacity) == (1.3, 1.25, True)
