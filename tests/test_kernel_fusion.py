"""How fused a stack's non-GEMM work is, its host launch cost, CUDA graphs and op-level recompute (issue 27 item 2:
``workload.kernel_fusion``, ``workload.cuda_graphs``; fmsim/model/fusion.py)."""
from __future__ import annotations

import copy
import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsim import estimate
from fmsim.band import candidates
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.model import fusion
from fmsim.model.fusion import CUDA_GRAPHS, KERNEL_FUSIONS
from fmsim.scenario import scenario_from_mapping, scenario_to_mapping

CAT = load_catalog()


def _scenario(model="llama3-8b", *, seq=4096, mb=1, tp=1, gpus=8, instance="p5.48xlarge", recompute="none",
              modules=None, **workload):
    par = {"tp": tp, "zero": 1, "recompute": recompute}
    if modules:
        par["recompute_modules"] = list(modules)
    return {"version": 1, "name": "fusion",
            "workload": {"kind": "pretrain", "model": model, "precision": "bf16", "seq_len": seq,
                         "global_batch": 8 * mb * gpus // tp, "micro_batch": mb, **workload},
            "parallelism": par, "cluster": {"instance": instance, "gpus": gpus}}


def _step(data, **changes) -> float:
    data = copy.deepcopy(data)
    data["workload"].update(changes)
    return estimate(scenario_from_mapping(data, catalog=CAT)).metrics["step_time_s"]


#: a plan of short kernels (a small model, short sequences, TP 8): each layer pass is host-bound without graphs
HOST_BOUND = _scenario("gpt-1.7b", seq=256, tp=8)


def test_each_value_and_figure_traces_to_its_source():
    doc = fusion.__doc__
    for value in KERNEL_FUSIONS + CUDA_GRAPHS:
        assert f"``{value}``" in doc, value
    # the host figures are the sums the docstring derives from the microbenchmarks it names
    assert fusion.EAGER_HOST_FWD_S == pytest.approx(6.8e-6 + 3.0e-6)
    assert fusion.EAGER_HOST_BWD_S == pytest.approx(1.0e-6 + 3.0e-6)
    assert fusion.COMPILED_REGION_HOST_S == pytest.approx(42.4e-6 - 9.1e-6)
    for ref in ("pytorch/pytorch issue\n  #41383", "tritonbench PR #1017", "@29624e37", "@002e0d79", "#153666"):
        assert ref.replace("\n  ", " ") in " ".join(doc.split()), ref
    # every stack that states them names a value the reader knows and a repository and commit
    stated = 0
    for name, profile in CAT.stacks.items():
        for path, values in (("workload.kernel_fusion", KERNEL_FUSIONS), ("workload.cuda_graphs", CUDA_GRAPHS)):
            s = profile.setting(path)
            if s is None:
                continue
            stated += 1
            assert s.value in values, (name, s.value)
            assert re.search(r"@[0-9a-f]{7,40}", s.source), (name, s.source)
    assert stated >= 15


def test_the_default_is_the_fused_stack_and_no_graphs():
    sc = scenario_from_mapping(_scenario(), catalog=CAT)
    assert (sc.workload.kernel_fusion, sc.workload.cuda_graphs) == ("fused", "none")
    assert "kernel_fusion" not in scenario_to_mapping(sc, catalog=CAT)["workload"]
    assert _step(_scenario(), kernel_fusion="fused", cuda_graphs="none") == _step(_scenario())


@settings(max_examples=12, deadline=None)
@given(model=st.sampled_from(["llama3-8b", "gpt-1.7b"]),
       seq=st.sampled_from([256, 512, 2048, 8192]), tp=st.sampled_from([1, 2, 8]),
       graphs=st.sampled_from(CUDA_GRAPHS), recompute=st.sampled_from(["none", "selective", "full"]))
def test_eager_is_never_faster_than_fused_at_the_same_plan(model, seq, tp, graphs, recompute):
    data = _scenario(model, seq=seq, tp=tp, recompute=recompute)
    fused = _step(data, cuda_graphs=graphs)
    eager = _step(data, cuda_graphs=graphs, kernel_fusion="eager")
    composite = _step(data, cuda_graphs=graphs, kernel_fusion="eager-composite-norm")
    compiled = _step(data, cuda_graphs=graphs, kernel_fusion="compiled")
    # compiled runs fewer, fused kernels than eager but launches its backward from Python (9.1 us a kernel against
    # autograd's 4.0): where the host bounds a pass it can trail eager, so only fused <= compiled is asserted
    assert fused <= eager <= composite and fused <= compiled
    assert fused < eager
    # a graph only takes host work away: never slower than launching every kernel
    for level in KERNEL_FUSIONS:
        assert _step(data, kernel_fusion=level, cuda_graphs="step") <= _step(data, kernel_fusion=level,
                                                                              cuda_graphs="layer") \
            <= _step(data, kernel_fusion=level)


@pytest.mark.parametrize("level", KERNEL_FUSIONS)
def test_cuda_graphs_are_never_slower_and_help_where_the_host_bounds(level):
    none = _step(HOST_BOUND, kernel_fusion=level)
    layer = _step(HOST_BOUND, kernel_fusion=level, cuda_graphs="layer")
    step = _step(HOST_BOUND, kernel_fusion=level, cuda_graphs="step")
    assert step <= layer < none
    # a device-bound plan: the host's launches hide behind long kernels, graphs change nothing
    big = _scenario(seq=8192)
    assert _step(big, kernel_fusion=level, cuda_graphs="step") == _step(big, kernel_fusion=level)


def test_host_time_binds_a_pass_only_when_its_kernels_are_short():
    from fmsim.model.ops import PassCost
    c = PassCost(gemm_s=1e-3, kernels=10, host_s=5e-4)
    assert c.compute_s == pytest.approx(1e-3 + 10 * 4.2e-6)
    c.host_s = 2e-3
    assert c.compute_s == 2e-3


RECOMPUTE_LADDER = [("none", None), ("selective", ["core_attn"]), ("selective", ["core_attn", "layernorm"]),
                    ("selective", ["core_attn", "layernorm", "mlp"]), ("full", None)]


@pytest.mark.parametrize("level", KERNEL_FUSIONS)
@pytest.mark.parametrize("plan", [dict(seq=4096, tp=1), dict(seq=2048, tp=8), dict(model="gpt-1.7b", seq=256, tp=8)])
def test_more_recompute_never_shortens_a_step(level, plan):
    steps = [_step(_scenario(recompute=r, modules=m, **plan), kernel_fusion=level) for r, m in RECOMPUTE_LADDER]
    assert steps == sorted(steps), steps
    assert steps[0] < steps[-1]


MOE_LADDER = [("none", None), ("selective", ["core_attn"]), ("selective", ["core_attn", "moe_act"]),
              ("selective", ["core_attn", "moe_act", "layernorm"]), ("full", None)]


@pytest.mark.parametrize("level", ["fused", "eager-composite-norm"])
def test_more_recompute_never_shortens_an_moe_step(level):
    def step(recompute, modules):
        data = _scenario("mixtral-8x7b", recompute=recompute, modules=modules)
        data["parallelism"]["ep"] = 8
        return _step(data, kernel_fusion=level)
    steps = [step(r, m) for r, m in MOE_LADDER]
    assert steps == sorted(steps) and steps[0] < steps[-1], steps
    assert step("selective", ["core_attn"]) <= step("selective", ["core_attn", "moe"]) <= step("full", None)


def test_recomputing_the_norm_costs_more_when_it_is_written_as_torch_ops():
    def extra(level):
        sel = _step(_scenario(recompute="selective", modules=["core_attn"]), kernel_fusion=level)
        norm = _step(_scenario(recompute="selective", modules=["core_attn", "layernorm"]), kernel_fusion=level)
        return norm - sel
    assert extra("eager-composite-norm") > extra("eager") > 0


def _stack_file(stack, **workload):
    data = _scenario(**workload)
    data["stack"] = stack
    data["parallelism"]["zero"] = 3
    return data


@pytest.mark.parametrize("stack", ["torchtitan-0.1", "torchtitan-0.2", "olmo-core-2.5", "megatron-core-0.8"])
def test_a_file_that_repeats_its_stack_predicts_the_same(stack):
    profile = CAT.stack(stack)
    bare = scenario_from_mapping(_stack_file(stack), catalog=CAT)
    repeated = _stack_file(stack)
    for path in ("workload.kernel_fusion", "workload.cuda_graphs"):
        s = profile.setting(path)
        if s is not None:
            repeated["workload"][path.split(".")[1]] = s.value
    again = scenario_from_mapping(repeated, catalog=CAT)
    assert again.workload == bare.workload
    assert estimate(again).metrics == estimate(bare).metrics
    assert bare.workload.kernel_fusion == profile.setting("workload.kernel_fusion").value


def test_the_torchtitan_stacks_run_eager_and_predict_slower_than_fused():
    tt = estimate(scenario_from_mapping(_stack_file("torchtitan-0.2"), catalog=CAT)).metrics["step_time_s"]
    data = _stack_file("torchtitan-0.2", kernel_fusion="fused")
    assert estimate(scenario_from_mapping(data, catalog=CAT)).metrics["step_time_s"] < tt


def test_the_band_varies_the_fusion_only_where_nothing_states_it():
    plain = scenario_from_mapping(_scenario(), catalog=CAT)
    assert set(candidates(plain, CAT)["workload.kernel_fusion"]) == {"compiled", "eager", "eager-composite-norm"}
    assert set(candidates(plain, CAT)["workload.cuda_graphs"]) == {"layer", "step"}
    megatron = scenario_from_mapping({**_scenario(), "stack": "megatron-core-0.8"}, catalog=CAT)
    assert "workload.kernel_fusion" not in candidates(megatron, CAT)
    assert "workload.cuda_graphs" not in candidates(megatron, CAT)


@pytest.mark.parametrize("key, value, rule", [
    ("kernel_fusion", "eagr", "eager"),
    ("cuda_graphs", "per-layer", "layer"),
    ("kernel_fusion", 3, "fused"),
])
def test_a_bad_value_is_one_located_line_and_exit_2(tmp_path, capsys, key, value, rule):
    data = _scenario()
    data["workload"][key] = value
    with pytest.raises(ConfigError) as exc:
        scenario_from_mapping(data, file="x.yaml", catalog=CAT)
    assert f"workload.{key}" in str(exc.value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", "--estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"workload.{key}" in err[0] and str(path) in err[0] and rule in err[0], err


def test_serving_files_refuse_the_training_kernel_settings():
    data = {"version": 1, "name": "srv", "workload": {"kind": "inference", "model": "llama3-8b",
                                                      "kernel_fusion": "eager"},
            "cluster": {"instance": "p5.48xlarge", "nodes": 1}}
    with pytest.raises(ConfigError, match="workload.kernel_fusion: applies to training kinds only"):
        scenario_from_mapping(data, file="s.yaml", catalog=CAT)
