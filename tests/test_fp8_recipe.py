"""The fp8 scaling recipe (``workload.fp8_recipe``): its pricing from Transformer Engine's code, the stacks that
state it, the band that varies it, and the errors a bad value gets."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fmsim
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.model.ops import FP8_RECIPES, PassCost, Roofline, _gemm, fp8_cast_bytes
from fmsim.scenario import load_scenario, scenario_from_mapping, scenario_to_mapping
from fmsim.scenario.workload import FP8_RECIPES as READER_RECIPES

from scenario_helpers import small_pretrain

TRAINING = Path(__file__).resolve().parent.parent / "scenarios" / "validation" / "training"


def test_the_reader_and_the_operator_model_know_the_same_recipes():
    assert READER_RECIPES == FP8_RECIPES == ("delayed", "current", "blockwise", "mxfp8")


def test_cast_bytes_are_transformer_engine_s_kernels_by_hand():
    # delayed (TE 1.8): a norm writes fp8 in place of 16 bits (-1 B) and the backward transposes it (+2 B);
    # any other input: fp8_cast_transpose_fused, read 2 + write 1 + 1
    assert fp8_cast_bytes("delayed", "input", "norm") == (-1.0, 2.0, 0)
    assert fp8_cast_bytes("delayed", "input", False) == (4.0, 0.0, 1)
    assert fp8_cast_bytes("delayed", "grad", False) == (0.0, 4.0, 1)
    assert fp8_cast_bytes("delayed", "grad", True) == (0.0, 0.0, 0)             # fused into the gelu backward
    # frozen weights: no transposed copies
    assert fp8_cast_bytes("delayed", "input", False, wgrad=False) == (3.0, 0.0, 1)
    # current (TE 2.8): an amax pass (read 2) unless the producer wrote the amax, a scale kernel, the quantize
    assert fp8_cast_bytes("current", "input", False) == (6.0, 0.0, 3)
    assert fp8_cast_bytes("current", "input", "norm") == (4.0, 0.0, 2)
    assert fp8_cast_bytes("current", "grad", True) == (0.0, 4.0, 2)
    # blockwise: one pass, scales of 4 B per 128 elements each way, never fused with a norm or activation
    assert fp8_cast_bytes("blockwise", "input", "norm") == (4.0625, 0.0, 1)
    # mxfp8: the activation writes the MXFP8 copies itself, 1 B scale per 32 elements each way
    assert fp8_cast_bytes("mxfp8", "input", "act") == (0.0625, 0.0, 0)
    assert fp8_cast_bytes("mxfp8", "input", "norm") == (4.0625, 0.0, 1)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(64, 65536), n=st.integers(64, 65536), k=st.integers(64, 65536),
       fed_by=st.sampled_from(["", "norm", "act"]), grad_fused=st.booleans(), wgrad=st.booleans())
def test_current_scaling_never_prices_a_gemm_below_delayed(m, n, k, fed_by, grad_fused, wgrad):
    """Current scaling reads each tensor once more for its amax, or cannot fuse the quantize into the norm
    and activation as delayed scaling does: at the same shapes its casts never cost less."""
    acc = load_catalog().accelerator("h100-sxm")
    costs = {}
    for recipe in ("delayed", "current"):
        c = PassCost()
        _gemm(c, Roofline.of(acc, "fp8", fp8_recipe=recipe, wgrad=wgrad), m, n, k, fed_by=fed_by,
              grad_fused=grad_fused)
        costs[recipe] = c
    assert costs["current"].gemm_s == costs["delayed"].gemm_s
    assert costs["current"].cast_s + costs["current"].cast_bwd_s >= costs["delayed"].cast_s + costs["delayed"].cast_bwd_s
    assert costs["current"].kernels >= costs["delayed"].kernels


@pytest.mark.parametrize("name", ["nemo2407-01.yaml", "nemo2407-08.yaml", "mlpv40-lora-03.yaml",
                                  "mb2511-h100-02.yaml"])
def test_current_scaling_is_never_faster_than_delayed_on_published_plans(name):
    steps = {}
    for recipe in ("delayed", "current"):
        sc = load_scenario(TRAINING / name, overrides={"workload.fp8_recipe": recipe})
        steps[recipe] = fmsim.estimate(sc).to_dict()["step_time_s"]
    assert steps["current"] > steps["delayed"]


def test_the_recipe_changes_nothing_outside_fp8():
    base = small_pretrain("p5.48xlarge")
    base["workload"]["precision"] = "bf16"
    assert fmsim.estimate(scenario_from_mapping(base, file="x.yaml")).to_dict()["step_time_s"] > 0
    rf = Roofline.of(load_catalog().accelerator("h100-sxm"), "bf16", fp8_recipe="current")
    c = PassCost()
    _gemm(c, rf, 4096, 4096, 4096, fed_by="norm")
    assert c.cast_s == c.cast_bwd_s == 0.0 and c.kernels == 1


def test_every_stack_recipe_traces_to_a_source_file_and_commit():
    import re

    found = {}
    for name, profile in load_catalog().stacks.items():
        for s in profile.settings:
            if s.path == "workload.fp8_recipe":
                found[name] = s.value
                assert s.value in FP8_RECIPES and s.recipes == ("fp8",), name
                assert re.search(r"\.(py|cu|cpp|html|yaml)\b", s.source), (name, s.source)
                assert re.search(r"@[0-9a-f]{7,}|\bv\d+\.\d+|core_r\d", s.source), (name, s.source)
    assert found == {"megatron-core-0.8": "delayed", "nemo-24.07": "delayed", "nemo-25.02": "delayed",
                     "nemo-25.04": "delayed", "megatron-bridge-25.09": "delayed", "mlperf-v4.0-gpt3": "delayed",
                     "mlperf-v4.0-llama2-lora": "delayed", "mlperf-v5.1-llama2-lora": "delayed",
                     "torchtitan-0.1": "current", "torchtitan-0.2": "current"}


@pytest.mark.parametrize("stack, recipe", [("nemo-24.07", "delayed"), ("torchtitan-0.1", "current")])
def test_a_file_repeating_its_stack_s_recipe_predicts_the_same(stack, recipe):
    data = small_pretrain("p5.48xlarge", stack=stack)
    if stack.startswith("torchtitan"):
        data["parallelism"] = {"tp": 1, "zero": 3}
    implicit = scenario_from_mapping(copy.deepcopy(data), file="x.yaml")
    assert implicit.workload.fp8_recipe == recipe
    data["workload"]["fp8_recipe"] = recipe
    explicit = scenario_from_mapping(data, file="x.yaml")
    assert scenario_to_mapping(explicit) == scenario_to_mapping(implicit)
    assert fmsim.estimate(explicit).to_dict() == fmsim.estimate(implicit).to_dict()


def test_the_recipe_round_trips_through_the_writer():
    data = small_pretrain("p5.48xlarge")
    data["workload"]["fp8_recipe"] = "blockwise"
    sc = scenario_from_mapping(data, file="x.yaml")
    again = scenario_from_mapping(scenario_to_mapping(sc), file="x.yaml")
    assert again.workload.fp8_recipe == "blockwise" and again == sc


def test_mxfp8_runs_on_blackwell_and_is_refused_on_hopper():
    data = small_pretrain("p6-b200.48xlarge")
    data["workload"]["fp8_recipe"] = "mxfp8"
    assert fmsim.estimate(scenario_from_mapping(data, file="x.yaml")).to_dict()["step_time_s"] > 0
    data["cluster"]["instance"] = "p5.48xlarge"
    with pytest.raises(ConfigError, match=r"x\.yaml: workload\.fp8_recipe: mxfp8 on p5\.48xlarge: .*no block-scaled"):
        scenario_from_mapping(data, file="x.yaml")


@pytest.mark.parametrize("change, message", [
    ({"fp8_recipe": "tensorwise"}, r"workload\.fp8_recipe: 'tensorwise' is not valid \(expected one of delayed, "
                                   r"current, blockwise, mxfp8\)"),
    ({"fp8_recipe": 3}, r"workload\.fp8_recipe: "),
    ({"fp8_recipe": "current", "precision": "bf16"}, r"workload\.fp8_recipe: current with precision bf16"),
    ({"fp8_recipe": "delayed", "precision": "fp4"}, r"workload\.fp8_recipe: delayed with precision fp4"),
])
def test_malformed_recipes_get_one_located_line_and_exit_2(tmp_path, capsys, change, message):
    import yaml

    data = small_pretrain("p6-b200.48xlarge")
    data["workload"].update(change)
    with pytest.raises(ConfigError, match=message):
        scenario_from_mapping(copy.deepcopy(data), file="x.yaml")
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", "--estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{path}: workload.fp8_recipe: ")


def test_the_band_varies_an_unstated_recipe_and_not_a_stated_one():
    from fmsim.band import candidates

    cat = load_catalog()
    bare = scenario_from_mapping(small_pretrain("p5.48xlarge"), file="x.yaml")
    # the values the stacks ship (the writer leaves the default out, so the band tries it as any other value)
    assert set(candidates(bare, cat).get("workload.fp8_recipe", ())) == {"delayed", "current"}
    stated = small_pretrain("p5.48xlarge")
    stated["workload"]["fp8_recipe"] = "delayed"
    assert "workload.fp8_recipe" not in candidates(scenario_from_mapping(stated, file="x.yaml"), cat)
    nemo = scenario_from_mapping(small_pretrain("p5.48xlarge", stack="nemo-24.07"), file="x.yaml")
    assert "workload.fp8_recipe" not in candidates(nemo, cat)         # the stack states it


def test_delayed_scaling_reduces_amaxes_once_a_pass_over_the_data_parallel_group():
    """TE 1.8 all-reduces the concatenated amaxes at each forward's autocast exit and each backward's end; the
    plan files it under the stage's data-parallel communication, which current scaling does not have."""
    from fmsim.parallel.strategy import build_plan

    sc = load_scenario(TRAINING / "nemo2407-01.yaml")
    delayed = build_plan(sc).stages[0]
    current = build_plan(load_scenario(TRAINING / "nemo2407-01.yaml",
                                       overrides={"workload.fp8_recipe": "current"})).stages[0]
    assert delayed.fwd_comm.get("dp", 0.0) > current.fwd_comm.get("dp", 0.0) >= 0.0
    assert delayed.bwd_comm.get("dp", 0.0) > current.bwd_comm.get("dp", 0.0) >= 0.0
    # a kilobyte of amaxes: the collective's latency over 64 ranks, well under a millisecond a pass
    assert delayed.fwd_comm["dp"] - current.fwd_comm.get("dp", 0.0) < 1e-3


def test_hopper_fp8_gemm_figures_are_mamf_finder_s_measured_fp8_matmuls():
    """efficiency.gemm fp8 of the H100 and H200 is the measured best fp8 matmul over the dense peak
    (hardware_catalog/measurements/mamf_finder_fp8.csv), rounded as the bf16 figures are."""
    import csv

    path = Path(__file__).resolve().parent.parent / "hardware_catalog" / "measurements" / "mamf_finder_fp8.csv"
    rows = {r["accelerator"]: r for r in csv.DictReader(line for line in path.open() if not line.startswith("#"))}
    cat = load_catalog()
    for name, chip in (("H100 SXM", "h100-sxm"), ("H200 SXM", "h200")):
        acc = cat.accelerator(chip)
        measured = float(rows[name]["mamf_tflops"]) / float(rows[name]["theory_tflops"])
        assert acc.peak("fp8") == pytest.approx(float(rows[name]["theory_tflops"]) * 1e12)
        assert acc.gemm_efficiency["fp8"] == round(measured, 2), chip
