"""torchtitan's op-level selective activation checkpointing (parallelism.recompute_policy: torchtitan-op)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fmsim
from fmsim.errors import ConfigError
from fmsim.model import sac
from fmsim.parallel.strategy import build_plan
from fmsim.scenario import scenario_from_mapping, scenario_to_mapping

ROOT = Path(__file__).resolve().parent.parent
SAC_OP = ROOT / "scenarios" / "out_of_sample" / "torchtitan-a100-llama3-8b-sac-op.yaml"


def _sc(**overrides):
    return fmsim.load_scenario(SAC_OP, overrides=overrides)


def _op():
    return _sc()


def _modules():
    return _sc(**{"parallelism.recompute_policy": "modules"})


def test_the_save_rule_keeps_every_other_mm_of_a_llama_block_as_torchtitan_counts_them():
    # parallelize_llama.py @04133643 / llama3 parallelize.py @f7084fc7 / activation_checkpoint.py @29624e37:
    # the block's mm calls are counted and an mm is kept unless its count is even; model.py calls wq, wk, wv,
    # wo, then w1, w3 (F.silu(w1(x)) * w3(x)) and w2
    model = _op().workload.model
    mms = sac.layer_mms(model)
    assert [name for name, *_ in mms] == ["wq", "wk", "wv", "wo", "w1", "w3", "w2"]
    assert [name for name, _, _, keep in mms if keep] == ["wq", "wv", "w1", "w2"]
    # Llama 3 8B per token: input 4096, wq 4096, wv 1024 (8 K/V heads of 128), attention output 4096,
    # w1 14336, w2 4096 elements, 2 bytes each
    assert sac.saved_bytes_per_token(model, True) == 2.0 * (4096 + 4096 + 1024 + 4096 + 14336 + 4096)
    assert sac.saved_bytes_per_token(model, False) == 2.0 * (4096 + 4096 + 1024 + 14336 + 4096)
    for commit in ("@04133643", "@f7084fc7", "@29624e37"):
        assert commit in sac.__doc__


def test_the_op_policy_sits_between_no_and_full_recompute_in_memory_and_in_time():
    runs = {rc: fmsim.estimate(_sc(**{"parallelism.recompute": rc, "parallelism.recompute_policy": None}))
            for rc in ("none", "full")}
    runs["op"] = fmsim.estimate(_op())
    mem = {k: r.metrics["memory_per_gpu_bytes"] for k, r in runs.items()}
    step = {k: r.metrics["step_time_s"] for k, r in runs.items()}
    assert mem["full"] < mem["op"] < mem["none"]
    assert step["none"] < step["op"] < step["full"]


def test_against_core_attn_only_the_recompute_and_the_kept_activations_differ():
    op, mod = build_plan(_op()), build_plan(_modules())
    assert mod.recompute_modules == ("core_attn",) and op.recompute_modules == ()
    for a, b in zip(op.stages, mod.stages):
        assert a.fwd_compute_s == b.fwd_compute_s and a.bwd_compute_s == b.bwd_compute_s
        assert a.fwd_comm == b.fwd_comm and a.bwd_comm == b.bwd_comm
        assert a.recompute_s > b.recompute_s          # wk, wo, w3 and every elementwise op run again
    assert op.dp_buckets == mod.dp_buckets and op.dp_gather_s == mod.dp_gather_s
    assert op.optimizer_s == mod.optimizer_s
    for a, b in zip(op.memory, mod.memory):
        assert (a.weights, a.gradients, a.optimizer, a.logits) == (b.weights, b.gradients, b.optimizer, b.logits)
        assert a.activations < b.activations


def test_the_rerun_is_the_forward_less_the_kept_mms_and_the_kept_attention():
    sc = _op()
    model = sc.workload.model
    plan = build_plan(sc)
    full = build_plan(_sc(**{"parallelism.recompute": "full", "parallelism.recompute_policy": None}))
    layer = [s for s in plan.stages][0]
    # per layer: the rerun is a strict part of the forward (full recompute reruns all of it)
    assert 0 < layer.recompute_s < full.stages[0].recompute_s
    # the hardware FLOPs it adds are wk, wo and w3 (attention kept under SDPA's flash backend on A100)
    tokens = sc.workload.micro_batch * sc.workload.seq_len
    h, kv, ffn = model.hidden, model.kv_heads * model.head_dim, model.ffn_hidden
    per_layer = 2.0 * tokens * (kv * h + h * h + ffn * h)
    assert layer.recompute_extra_flops == pytest.approx(per_layer * model.layers)


def test_sdpa_cudnn_attention_is_recomputed_and_not_kept():
    # torchtitan 0.2 runs SDPA's cuDNN backend first (flash on H100): not in the save list
    flash2 = _sc(**{"cluster.instance": "p5.48xlarge", "cluster.gpus": None, "cluster.nodes": 8,
                    "workload.attention_kernel": "flash2"})
    cudnn = _sc(**{"cluster.instance": "p5.48xlarge", "cluster.gpus": None, "cluster.nodes": 8,
                   "workload.attention_kernel": "flash"})
    a, b = build_plan(flash2), build_plan(cudnn)
    assert b.memory[0].activations < a.memory[0].activations
    assert b.stages[0].recompute_extra_flops > a.stages[0].recompute_extra_flops
    assert sac.attention_kept("flash", True) and not sac.attention_kept("flash", False)


def test_the_policy_round_trips_through_the_writer():
    sc = _op()
    data = scenario_to_mapping(sc)
    assert data["parallelism"]["recompute_policy"] == "torchtitan-op"
    assert "recompute_modules" not in data["parallelism"]
    again = scenario_from_mapping(data, file="x.yaml")
    assert again.parallelism.recompute_policy == "torchtitan-op"
    assert scenario_to_mapping(_modules())["parallelism"].get("recompute_policy") is None


@pytest.mark.parametrize("overrides, rule", [
    ({"parallelism.recompute_policy": "op"}, "'op' is not valid"),
    ({"parallelism.recompute_policy": 3}, "is not valid"),
    ({"parallelism.recompute": "full"}, "torchtitan-op given with recompute: full"),
    ({"parallelism.recompute_modules": ["core_attn"]}, "given with recompute_policy: torchtitan-op"),
    ({"parallelism.tp": 2, "parallelism.dp": 32}, "expected sequence_parallel: true"),
    ({"parallelism.cp": 2, "parallelism.dp": 32}, "expected cp 1"),
    ({"workload.precision": "fp8", "cluster.instance": "p5.48xlarge", "cluster.gpus": None, "cluster.nodes": 8},
     "torch._scaled_mm"),
    ({"workload.attention_kernel": "unfused"}, "expected flash2 or flash"),
    ({"workload.model": "mixtral-8x7b"}, "MoE"),
])
def test_a_bad_or_unpriced_policy_gets_one_located_line(overrides, rule):
    with pytest.raises(ConfigError) as err:
        _sc(**overrides)
    text = str(err.value)
    assert rule in text and "\n" not in text
    assert "torchtitan-a100-llama3-8b-sac-op.yaml" in text
    field = "recompute_modules" if "parallelism.recompute_modules" in overrides else "recompute_policy"
    assert f"parallelism.{field}" in text


def test_the_cli_exits_2_on_a_bad_policy(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SAC_OP.read_text().replace("recompute_policy: torchtitan-op", "recompute_policy: torchtitan"))
    out = subprocess.run([sys.executable, "-m", "fmsim.cli", "run", str(bad)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 2
    assert "bad.yaml: parallelism.recompute_policy: 'torchtitan' is not valid" in out.stderr
    assert "Traceback" not in out.stderr


TP2 = {"parallelism.tp": 2, "parallelism.dp": 32, "parallelism.sequence_parallel": True}


def test_under_tp_the_all_gathers_rerun_and_the_reduce_scatters_are_kept():
    # apply_tp @f7084fc7: sequence-parallel norms, column-parallel wq/wk/wv/w1/w3, row-parallel wo/w2 into Shard(1)
    op = build_plan(_sc(**TP2))
    mod = build_plan(_sc(**TP2, **{"parallelism.recompute_policy": "modules"}))
    none = build_plan(_sc(**TP2, **{"parallelism.recompute": "none", "parallelism.recompute_policy": None}))
    full = build_plan(_sc(**TP2, **{"parallelism.recompute": "full", "parallelism.recompute_policy": None}))
    acts = [p.memory[0].activations for p in (full, op, none)]
    assert acts == sorted(acts) and len(set(acts)) == 3
    # the rerun's two all-gathers: exposed tp time beyond core_attn's backward (which reruns no collective)
    assert op.stages[0].bwd_comm.get("tp", 0.0) > mod.stages[0].bwd_comm.get("tp", 0.0)
    assert op.stages[0].fwd_comm == mod.stages[0].fwd_comm
    model = _sc().workload.model
    h, dq, kv, ffn = 4096, 4096, 1024, 14336
    assert sac.saved_bytes_per_token(model, True, 2) == 2.0 * (h / 2 + dq / 2 + kv / 2 + dq / 2 + ffn / 2 + h
                                                                + 2 * h / 2)


def test_the_rerun_runs_the_stacks_own_elementwise_kernels():
    # eager torch ops (fusion.py): composite RMSNorm, three-kernel rotary, repeat_kv, SwiGLU as two ops, all rerun
    fused = build_plan(_op()).stages[0]
    eager = build_plan(_sc(**{"workload.kernel_fusion": "eager-composite-norm"})).stages[0]
    assert eager.recompute_s > fused.recompute_s
    assert eager.recompute_extra_flops == fused.recompute_extra_flops      # the same GEMMs run again
