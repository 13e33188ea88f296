"""DeepSpeed ZeRO-3's parameter fetch (fmsim.parallel.zero3, ``parallelism.param_fetch: deepspeed``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import fmsim
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.model.kernels import KERNEL_FIXED_S
from fmsim.parallel.strategy import build_plan
from fmsim.parallel.zero3 import (
    MAX_LIVE_PARAMETERS,
    PERSISTENCE_THRESHOLD,
    Use,
    chain_s,
    list_copies_s,
    persistent_tensors,
    step_trace,
)
from fmsim.scenario import load_scenario, scenario_from_mapping, scenario_to_mapping

ROOT = Path(__file__).resolve().parent.parent
ROW = ROOT / "scenarios" / "validation" / "training" / "meg21t2-09.yaml"


def _chain(uses, g=0.5, r=0.25, bucket=1e18, slowdown=0.0):
    return chain_s(uses, gather_s=lambda n: g, reduce_s=lambda tensors: r * len(tensors), bucket=bucket,
                   slowdown=slowdown)


def test_a_tensor_not_prefetched_is_gathered_in_the_open():
    assert _chain([Use(0, 1e7, 1.0, False)]) == [pytest.approx(1.5)]


def test_the_next_tensor_is_prefetched_beside_the_current_submodule():
    uses = [Use(0, 1e7, 1.0, False), Use(1, 1e7, 1.0, False)]
    # the first waits for its own gather, the second's runs beside the first's compute
    assert sum(_chain(uses)) == pytest.approx(0.5 + 1.0 + 1.0)
    # a gather longer than the compute it hides behind sets the interval
    assert sum(_chain(uses, g=3.0)) == pytest.approx(3.0 + 3.0 + 1.0)
    # the SMs the gather takes slow the compute beside it
    assert sum(_chain(uses, slowdown=0.2)) == pytest.approx(0.5 + 1.0 + 0.2 * 0.5 + 1.0)


def test_no_prefetch_once_max_live_parameters_are_gathered():
    big = MAX_LIVE_PARAMETERS * 1.2
    uses = [Use(0, big, 1.0, False), Use(1, big, 1.0, False)]
    assert sum(_chain(uses)) == pytest.approx(2 * (0.5 + 1.0))


def test_a_tensor_reused_within_the_reuse_distance_is_kept():
    near = [Use(0, 1e8, 1.0, False), Use(1, 5e8, 1.0, False), Use(0, 1e8, 1.0, True)]
    far = [Use(0, 1e8, 1.0, False), Use(1, 2e9, 1.0, False), Use(0, 1e8, 1.0, True)]
    g, r = 0.5, 0.25
    # near: tensor 0 stays gathered; tensor 1 is prefetched beside tensor 0's compute
    assert sum(_chain(near, g=g, r=r)) == pytest.approx(g + 1.0 + 1.0 + 1.0 + r)
    # far: released after its first use (2e9 elements between), and with 2e9 gathered nothing is
    # prefetched beside tensor 1 (max live): tensor 0 waits for its gather in the open again
    assert sum(_chain(far, g=g, r=r)) == pytest.approx(g + 1.0 + 1.0 + g + 1.0 + r)
    # a small tensor after the big one prefetches tensor 0 again beside its own compute
    huge = [Use(0, 1e8, 1.0, False), Use(1, 2e9, 1.0, False), Use(2, 1e7, 1.0, False), Use(0, 1e8, 1.0, True)]
    assert sum(_chain(huge, g=g, r=r)) == pytest.approx(g + 1.0 + 1.0 + g + 1.0 + 1.0 + r)


def test_a_full_bucket_is_reduced_beside_the_next_submodule_and_the_last_one_after_the_pass():
    uses = [Use(i, 3e8, 1.0, True) for i in range(3)]
    out = _chain(uses, g=0.0, r=2.0, bucket=5e8)
    # buckets of one tensor each (two would pass 5e8): tensor 0's reduce runs beside tensor 1's compute,
    # tensor 1's beside tensor 2's, tensor 2's after the pass
    assert out == [pytest.approx(1.0), pytest.approx(2.0), pytest.approx(2.0 + 2.0)]


def test_the_step_trace_uses_each_tensor_where_the_passes_reach_it():
    layers = [(4e8, 1e8, 4e8, 4e8)] * 2
    uses, start = step_trace(layers, 6e8, None, fwd_s=3.0, bwd_s=6.0, recompute_s=3.0)
    fwd, bwd = uses[:start], uses[start:]
    assert len(fwd) == 1 + 8 + 1 and fwd[0].tensor == fwd[-1].tensor == 0        # tied embedding at both ends
    assert len(bwd) == 1 + 2 * (4 + 4) + 1                                      # recompute then backward
    assert sum(u.compute_s for u in fwd) == pytest.approx(3.0)
    assert sum(u.compute_s for u in bwd) == pytest.approx(6.0 + 3.0)
    # the tied embedding's gradient is complete only after the embedding's own backward
    assert not bwd[0].backward and bwd[-1].backward
    assert sum(u.numel for u in bwd if u.backward) == pytest.approx(sum(map(sum, layers)) + 6e8)
    untied, s2 = step_trace(layers, 6e8, 6e8, fwd_s=3.0, bwd_s=6.0, recompute_s=0.0)
    assert untied[s2 - 1].tensor != 0 and len(untied) - s2 == 1 + 2 * 4 + 1


def test_list_form_collectives_pay_one_copy_per_rank():
    assert list_copies_s(0.0, 1536, 2e12) == pytest.approx(1536 * KERNEL_FIXED_S)
    assert list_copies_s(1e9, 768, 1e12) == pytest.approx(768 * KERNEL_FIXED_S + 2e-3)


def test_persistent_tensors_are_the_small_ones():
    sc = load_scenario(ROW)
    small = persistent_tensors(sc.workload.model, 1)
    assert small and all(n < PERSISTENCE_THRESHOLD for n in small)
    # GPT-175B: two LayerNorms (gain, bias) and four biases per layer, and the final LayerNorm
    assert len(small) == 8 * 96 + 2


def test_the_engine_and_the_estimate_agree_and_the_fetch_is_exposed():
    sc = load_scenario(ROW)
    assert sc.parallelism.param_fetch == "deepspeed" and sc.parallelism.grad_reduce_op == "all-reduce"
    sim, est = fmsim.simulate(sc), fmsim.estimate(sc)
    assert sim.metrics["step_time_s"] == pytest.approx(est.metrics["step_time_s"], rel=1e-6)
    plan = build_plan(sc)
    assert plan.dp_gather_s == (0.0,) and plan.dp_buckets == ((),)
    st = plan.stages[0]
    assert st.fwd_comm["dp"] > 0 and st.bwd_comm["dp"] > 0
    assert sim.breakdown["comm_dp"] == pytest.approx(st.fwd_comm["dp"] + st.bwd_comm["dp"], rel=1e-6)
    # FSDP's fetch of the same run (one gather per layer on its own stream, reduce-scatter): faster
    unit = load_scenario(ROW, overrides={"parallelism.param_fetch": "unit",
                                         "parallelism.grad_reduce_op": "reduce-scatter"})
    assert fmsim.estimate(unit).metrics["step_time_s"] < est.metrics["step_time_s"]
    # v0.5.0's reduce-scatter, one per tensor, is priced differently from v0.3's bucket all-reduce
    rs = load_scenario(ROW, overrides={"parallelism.grad_reduce_op": "reduce-scatter"})
    assert fmsim.estimate(rs).metrics["step_time_s"] != pytest.approx(est.metrics["step_time_s"], rel=1e-3)


def test_the_fetch_s_working_set_is_in_memory():
    sc = load_scenario(ROW)
    unit = load_scenario(ROW, overrides={"parallelism.param_fetch": "unit",
                                         "parallelism.grad_reduce_op": "reduce-scatter"})
    ds, fsdp = build_plan(sc).memory[0], build_plan(unit).memory[0]
    # at least one layer's largest tensor gathered (GPT-3 175B's MLP GEMMs: 604M elements, fp16) and at most
    # the live limit plus the prefetch bucket; a 5e8-element bucket of fp16 gradients waiting
    extra_w = ds.weights - fsdp.weights
    assert 2 * 604e6 <= extra_w <= 2 * (MAX_LIVE_PARAMETERS + 2 * 604e6)
    assert ds.gradients - fsdp.gradients == pytest.approx(2 * 5e8)
    assert ds.activations == fsdp.activations and ds.optimizer == fsdp.optimizer


def test_the_file_round_trips_its_fetch():
    sc = load_scenario(ROW)
    m = scenario_to_mapping(sc)
    assert m["parallelism"]["param_fetch"] == "deepspeed" and m["parallelism"]["grad_reduce_op"] == "all-reduce"
    assert scenario_from_mapping(m).parallelism == sc.parallelism


@pytest.mark.parametrize("change, message", [
    ({"pp": 2, "dp": "auto", "param_fetch": "deepspeed"},
     r"parallelism\.param_fetch: deepspeed with zero: 3 and pp 2, vpp 1 \(expected pp: 1"),
    ({"param_fetch": "unit", "grad_reduce_op": "all-reduce"},
     r"parallelism\.grad_reduce_op: all-reduce with zero: 3 and param_fetch: unit \(expected reduce-scatter"),
    ({"zero": 0, "param_fetch": "unit", "grad_reduce_op": "reduce-scatter"},
     r"parallelism\.grad_reduce_op: reduce-scatter with zero: 0 and param_fetch: unit \(expected all-reduce"),
    ({"param_fetch": "deepspeeed"}, r"parallelism\.param_fetch: 'deepspeeed' is not valid"),
])
def test_bad_fetch_settings_name_the_field(change, message):
    data = yaml.safe_load(ROW.read_text())
    data["parallelism"].update(change)
    with pytest.raises(ConfigError, match=message):
        scenario_from_mapping(data, file="x.yaml")


def test_the_fetch_is_a_zero3_setting():
    """deepspeed-0.3 on a ZeRO-1 plan (a search's variant, say): nothing is fetched and the gradients are
    reduce-scattered as any ZeRO-1 run's, the same numbers as without the DeepSpeed settings."""
    data = yaml.safe_load(ROW.read_text())
    data["parallelism"]["zero"] = 1
    sc = scenario_from_mapping(data, file="x.yaml")
    assert sc.stack == "deepspeed-0.3" and sc.parallelism.param_fetch == "deepspeed"
    plain = scenario_from_mapping(data | {"parallelism": {**data["parallelism"], "param_fetch": "unit",
                                                          "grad_reduce_op": "reduce-scatter"}}, file="x.yaml")
    assert fmsim.estimate(sc).to_dict() == fmsim.estimate(plain).to_dict()
    # a search writes the stack's values into the variant's mapping: it reads back the same
    assert scenario_from_mapping(scenario_to_mapping(sc)).parallelism == sc.parallelism
    # a stack's all-reduce where no DeepSpeed fetch runs gives way to the default
    data["parallelism"].update(param_fetch="unit")
    assert scenario_from_mapping(data, file="x.yaml").parallelism.grad_reduce_op == "reduce-scatter"
    # ZeRO-3 over a pipeline is refused even from the stack: the DeepSpeed fetch is not modelled there
    data["parallelism"] = {**yaml.safe_load(ROW.read_text())["parallelism"], "pp": 2, "dp": "auto"}
    with pytest.raises(ConfigError, match=r"parallelism\.param_fetch: deepspeed with zero: 3 and pp 2.*"
                                          r"\(set by stack 'deepspeed-0\.3'\)"):
        scenario_from_mapping(data, file="x.yaml")


def test_the_cli_answers_a_bad_fetch_with_one_line_and_exit_2(tmp_path, capsys):
    data = yaml.safe_load(ROW.read_text())
    data["parallelism"].update(pp=2, dp="auto", param_fetch="deepspeed")
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", "--estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parallelism.param_fetch" in err[0] and str(path) in err[0]
