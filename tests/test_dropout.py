"""Dropout in training (``workload.hidden_dropout``, ``workload.attention_dropout``): its pricing from the code
that runs it, the masks it keeps, the files and stacks that state it, and the errors a bad value gets."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

import fmsim
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.model.kernels import KERNEL_FIXED_S
from fmsim.model.memory import layer_activation_bytes
from fmsim.model.dropout import hidden_dropout_bytes
from fmsim.model.ops import PassCost, Roofline, Shard, attention_forward, backward_of, layer_forward
from fmsim.scenario import load_scenario, scenario_from_mapping, scenario_to_mapping

from scenario_helpers import small_pretrain

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "scenarios" / "validation" / "training"


def _step(data: dict) -> float:
    return fmsim.estimate(scenario_from_mapping(copy.deepcopy(data), file="x.yaml")).to_dict()["step_time_s"]


def test_hidden_dropout_bytes_are_the_kernels_by_hand():
    # fused bias-dropout-add (torch.compile / nvFuser): the 1-byte mask written beside the add; the backward
    # reads the gradient (2) and the mask (1) and writes the input's gradient (2)
    assert hidden_dropout_bytes("fused") == (1.0, 5.0, 0)
    assert hidden_dropout_bytes("compiled") == (1.0, 5.0, 0)
    # eager: native_dropout, its own kernel: read 2, write 2 + 1; native_dropout_backward: read 2 + 1, write 2
    assert hidden_dropout_bytes("eager") == (5.0, 5.0, 1)
    assert hidden_dropout_bytes("eager-composite-norm") == (5.0, 5.0, 1)


def test_one_layer_adds_two_sites_over_the_sequence_parallel_shard():
    cat = load_catalog()
    model, acc = cat.model("gpt3-5b"), cat.accelerator("h100-sxm")
    rf = Roofline.of(acc, "fp8")
    plain = Shard(micro_batch=4, seq_len=2048, tp=2, sequence_parallel=True, precision="fp8")
    dropped = Shard(micro_batch=4, seq_len=2048, tp=2, sequence_parallel=True, precision="fp8", hidden_dropout=0.1)
    a0, m0 = layer_forward(model, 0, plain, rf)
    a1, m1 = layer_forward(model, 0, dropped, rf)
    elements = 4 * 2048 * model.hidden / 2
    for before, after in ((a0, a1), (m0, m1)):
        assert after.compute_s - before.compute_s == pytest.approx(elements * 1.0 / rf.hbm_bytes_per_s)
        assert backward_of(after).compute_s - backward_of(before).compute_s == \
            pytest.approx(elements * 5.0 / rf.hbm_bytes_per_s)
        assert after.kernels == before.kernels


def test_attention_dropout_moves_the_unfused_core_s_scores_and_not_a_fused_kernel():
    cat = load_catalog()
    model, rf = cat.model("gpt3-5b"), Roofline.of(cat.accelerator("a100-80gb"), "bf16")
    for kernel in ("unfused", "flash"):
        plain = Shard(micro_batch=1, seq_len=2048, tp=1, attention_kernel=kernel)
        dropped = Shard(micro_batch=1, seq_len=2048, tp=1, attention_kernel=kernel, attention_dropout=0.1)
        a, b = attention_forward(model, plain, rf), attention_forward(model, dropped, rf)
        if kernel == "flash":
            assert (b.attention_s, b.attention_bwd_s, b.kernels) == (a.attention_s, a.attention_bwd_s, a.kernels)
            continue
        scores = 2048 * 2048 * model.heads
        # dropout reads the scores and writes them and the mask (5 B); its backward the same (5 B); one kernel
        assert b.attention_s - a.attention_s == pytest.approx(scores * 5.0 / rf.hbm_bytes_per_s)
        assert b.attention_bwd_s - a.attention_bwd_s == pytest.approx(scores * 5.0 / rf.hbm_bytes_per_s)
        assert b.kernels == a.kernels + 1


def test_the_masks_are_korthikanti_s_two_sbh_bytes_and_gone_under_full_recompute():
    model = load_catalog().model("gpt3-5b")
    kw = dict(micro_batch=2, seq_len=2048, tp=2, cp=1, sequence_parallel=True, recompute="none")
    extra = layer_activation_bytes(model, 0, dropout_mask_bytes=1.0, **kw) - layer_activation_bytes(model, 0, **kw)
    assert extra == pytest.approx(2 * 2048 * 2 * model.hidden / 2)          # 2 sites x s·b·h / tp, 1 byte each
    kw["recompute"] = "full"
    assert layer_activation_bytes(model, 0, dropout_mask_bytes=1.0, **kw) == layer_activation_bytes(model, 0, **kw)


@pytest.mark.parametrize("fusion", ["fused", "compiled", "eager"])
@pytest.mark.parametrize("attention", ["flash", "unfused"])
@pytest.mark.parametrize("p", [0.05, 0.1, 0.5])
def test_dropout_never_shortens_a_step(fusion, attention, p):
    data = small_pretrain("p5.48xlarge")
    data["workload"].update(precision="bf16", kernel_fusion=fusion, attention_kernel=attention, seq_len=2048)
    base = _step(data)
    for key in ("hidden_dropout", "attention_dropout"):
        one = copy.deepcopy(data)
        one["workload"][key] = p
        assert _step(one) >= base, key
    both = copy.deepcopy(data)
    both["workload"].update(hidden_dropout=p, attention_dropout=p)
    assert _step(both) >= base


def test_zero_dropout_stated_predicts_as_it_is_left_out():
    data = small_pretrain("p5.48xlarge")
    stated = copy.deepcopy(data)
    stated["workload"].update(hidden_dropout=0.0, attention_dropout=0)
    assert fmsim.estimate(scenario_from_mapping(stated, file="x.yaml")).to_dict() == \
        fmsim.estimate(scenario_from_mapping(data, file="x.yaml")).to_dict()


def test_dropout_round_trips_through_the_writer():
    data = small_pretrain("p5.48xlarge")
    data["workload"].update(hidden_dropout=0.1, attention_dropout=0.05)
    sc = scenario_from_mapping(data, file="x.yaml")
    again = scenario_from_mapping(scenario_to_mapping(sc), file="x.yaml")
    assert (again.workload.hidden_dropout, again.workload.attention_dropout) == (0.1, 0.05) and again == sc


def test_the_gpt3_files_state_their_launcher_config_s_dropout_with_its_line():
    config = {"01": "5b", "02": "20b", "03": "175b", "04": "175b"}
    for n, name in config.items():
        path = TRAINING / f"nemo2407-{n}.yaml"
        sc = load_scenario(path)
        assert (sc.workload.hidden_dropout, sc.workload.attention_dropout) == (0.1, 0.1), path.name
        text = path.read_text()
        for key in ("hidden_dropout", "attention_dropout"):
            line = next(x for x in text.splitlines() if x.strip().startswith(f"{key}:"))
            assert f"launcher_scripts/conf/training/gpt3/{name}.yaml @329df4af" in line, line
    llama = {"05": "llama/llama2_7b", "06": "llama/llama2_13b", "08": "nemotron/nemotron_8b",
             "09": "nemotron/nemotron_22b", "10": "nemotron/nemotron_340b", "11": "llama/llama3_8b",
             "12": "llama/llama3_70b"}
    for n, name in llama.items():                     # the Llama and Nemotron configs set 0.0 (the default)
        path = TRAINING / f"nemo2407-{n}.yaml"
        sc = load_scenario(path)
        assert (sc.workload.hidden_dropout, sc.workload.attention_dropout) == (0.0, 0.0)
        assert {"workload.hidden_dropout", "workload.attention_dropout"} <= set(sc.stated), path.name
        for line in (x for x in path.read_text().splitlines() if "_dropout:" in x):
            assert f"launcher_scripts/conf/training/{name}.yaml @329df4af" in line, line


def test_the_stacks_that_state_dropout_cite_the_code_that_sets_it():
    stacks = load_catalog().stacks
    stating = {name for name, prof in stacks.items()
               if prof.setting("workload.hidden_dropout") or prof.setting("workload.attention_dropout")}
    megatron = {"megatron-lm-2021", "megatron-deepspeed-bigscience", "megatron-lm-2022", "megatron-core-0.8"}
    assert stating == megatron | {"pytorch-fsdp2-example", "mlperf-v4.0-gpt3"}
    for name in megatron:                             # Megatron-LM's argument defaults
        for key, flag in (("hidden_dropout", "--hidden-dropout"), ("attention_dropout", "--attention-dropout")):
            s = stacks[name].setting(f"workload.{key}")
            assert s.value == 0.1
            assert re.search(rf"arguments\.py @[0-9a-f]{{8}}.*{flag} default=0\.1", s.source), (name, s.source)
    fsdp2 = stacks["pytorch-fsdp2-example"]          # its train.py passes dropout_p=0 (model.py's default is 0.1)
    for key in ("hidden_dropout", "attention_dropout"):
        s = fsdp2.setting(f"workload.{key}")
        assert s.value == 0.0 and "train.py @9789d443 line 45: ModelArgs(..., dropout_p=0)" in s.source
    mlperf = stacks["mlperf-v4.0-gpt3"]               # NVIDIA's v4.0 GPT-3 config overrides NeMo's 0.1 with 0.0
    for key in ("hidden_dropout", "attention_dropout"):
        s = mlperf.setting(f"workload.{key}")
        assert s.value == 0.0 and "conf/custom.yaml @62f111b7 lines 73-74" in s.source and f"{key}: 0.0" in s.source


@pytest.mark.parametrize("key, value, message", [
    ("hidden_dropout", -0.1, r"-0\.1 must be >= 0"),
    ("attention_dropout", 1.0, r"1 must be < 1"),
    ("hidden_dropout", 1.5, r"1\.5 must be < 1"),
    ("attention_dropout", "lots", r"expected a number"),
    ("hidden_dropout", [0.1], r""),
])
def test_malformed_dropout_gets_one_located_line_and_exit_2(tmp_path, capsys, key, value, message):
    data = small_pretrain("p5.48xlarge")
    data["workload"][key] = value
    with pytest.raises(ConfigError, match=rf"x\.yaml: workload\.{key}: .*{message}"):
        scenario_from_mapping(copy.deepcopy(data), file="x.yaml")
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", "--estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{path}: workload.{key}: ")


def test_serving_refuses_dropout():
    data = {"version": 1, "name": "s", "workload": {"kind": "inference", "model": "llama3-8b",
                                                    "hidden_dropout": 0.1},
            "cluster": {"instance": "p5.48xlarge", "nodes": 1}}
    with pytest.raises(ConfigError, match=r"workload\.hidden_dropout: applies to training kinds only"):
        scenario_from_mapping(data, file="x.yaml")


def test_pass_cost_carries_dropout_through_add_and_backward():
    c = PassCost(dropout_s=1.0, dropout_bwd_s=5.0)
    total = PassCost()
    total.add(c, 2.0)
    assert (total.dropout_s, total.dropout_bwd_s, total.compute_s) == (2.0, 10.0, 2.0)
    assert backward_of(total).compute_s == 10.0


def test_the_embeddings_dropout_is_its_own_kernel_whatever_the_fusion():
    from fmsim.model.ops import embedding_forward

    cat = load_catalog()
    model, rf = cat.model("gpt3-5b"), Roofline.of(cat.accelerator("h100-sxm"), "bf16")
    plain = Shard(micro_batch=2, seq_len=2048, tp=2, sequence_parallel=True)
    dropped = Shard(micro_batch=2, seq_len=2048, tp=2, sequence_parallel=True, hidden_dropout=0.1)
    a, b = embedding_forward(model, plain, rf), embedding_forward(model, dropped, rf)
    elements = 2 * 2048 * model.hidden / 2
    assert b.compute_s - a.compute_s == pytest.approx(elements * 5.0 / rf.hbm_bytes_per_s + KERNEL_FIXED_S)
    assert backward_of(b).compute_s - backward_of(a).compute_s == \
        pytest.approx(elements * 5.0 / rf.hbm_bytes_per_s + 2 * KERNEL_FIXED_S)


def test_an_moe_layer_pays_its_dropout_sites_too():
    cat = load_catalog()
    model = cat.model("mixtral-8x7b")
    rf = Roofline.of(cat.accelerator("h100-sxm"), "bf16")
    plain = Shard(micro_batch=1, seq_len=4096, tp=2, ep=4, sequence_parallel=True)
    dropped = Shard(micro_batch=1, seq_len=4096, tp=2, ep=4, sequence_parallel=True, hidden_dropout=0.1)
    elements = 4096 * model.hidden / 2
    for before, after in zip(layer_forward(model, 0, plain, rf), layer_forward(model, 0, dropped, rf)):
        assert after.compute_s - before.compute_s == pytest.approx(elements / rf.hbm_bytes_per_s)
