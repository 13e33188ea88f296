"""The host synchronisation of dropless MoE (issue 28 item 2: ``parallelism.moe_host_sync``,
fmsim/model/fusion.py ``attach_sync``): each MoE layer's forward waits on the host for its token counts."""
from __future__ import annotations

import copy

import pytest
import yaml

from fmsim import estimate
from fmsim.band import candidates
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.model import fusion
from fmsim.model.kernels import KERNEL_FIXED_S
from fmsim.model.ops import PassCost, Shard
from fmsim.scenario import scenario_from_mapping, scenario_to_mapping

CAT = load_catalog()
MEGATRON = ("nemo-25.02", "nemo-25.04", "megatron-bridge-25.09", "megatron-bridge-25.11", "megatron-bridge-26.04",
            "nemo-automodel-2025")


def _moe(model="mixtral-8x7b", *, ep=8, tp=1, seq=4096, gpus=8, **par):
    return {"version": 1, "name": "moesync",
            "workload": {"kind": "pretrain", "model": model, "precision": "bf16", "seq_len": seq,
                         "global_batch": 8 * gpus // tp, "micro_batch": 1},
            "parallelism": {"tp": tp, "ep": ep, "zero": 1, **par},
            "cluster": {"instance": "p5.48xlarge", "gpus": gpus}}


def _step(data, *, workload=None, **par) -> float:
    data = copy.deepcopy(data)
    data["parallelism"].update(par)
    data["workload"].update(workload or {})
    return estimate(scenario_from_mapping(data, catalog=CAT)).metrics["step_time_s"]


def test_the_figures_trace_to_their_sources():
    assert fusion.D2H_COPY_S == 6.5e-6                      # gdrcopy README: "6-7us overhead", the middle
    doc = fusion.__doc__
    for needle in ("NVIDIA/gdrcopy README.md @00cf81f3", "791b70e0", "3cdfd613", "core_v0.15.0rc6", "0d8e0714",
                   "3097d81d", "d2h_event.synchronize()", "the CPU will wait for GPU's signal to arrive"):
        assert needle in doc, needle
    for name in MEGATRON:
        s = CAT.stack(name).setting("parallelism.moe_host_sync")
        assert s is not None and s.value == "per-layer", name
        assert ("token_dispatcher.py" in s.source and "NVIDIA/Megatron-LM" in s.source) or \
            "nemo_automodel/components/moe/megatron/fused_a2a.py @01926a5c" in s.source, name


def test_the_default_is_none_and_the_megatron_core_stacks_state_per_layer():
    plain = scenario_from_mapping(_moe(), catalog=CAT)
    assert plain.parallelism.moe_host_sync == "none"
    bridge = scenario_from_mapping({**_moe(), "stack": "megatron-bridge-25.11"}, catalog=CAT)
    assert bridge.parallelism.moe_host_sync == "per-layer"
    # unstated, the band varies it over what the stacks ship; stated by a stack, it is not varied
    assert set(candidates(plain, CAT)["parallelism.moe_host_sync"]) == {"per-layer"}
    assert "parallelism.moe_host_sync" not in candidates(bridge, CAT)


@pytest.mark.parametrize("plan", [
    dict(),                                         # mixtral EP 8, alltoall
    dict(ep_dispatch="deepep"),
    dict(ep=1, tp=2),                               # no EP: the counts still go to the host (before_finish)
    dict(model="qwen3-30b-a3b", ep=8, seq=2048),    # fine-grained: 128 experts, 16 a rank
])
@pytest.mark.parametrize("graphs", ["none", "layer"])
@pytest.mark.parametrize("level", ["fused", "eager"])
def test_the_wait_never_shortens_a_step(plan, graphs, level):
    data = _moe(**plan)
    wl = {"cuda_graphs": graphs, "kernel_fusion": level}
    none, waited = _step(data, workload=wl, moe_host_sync="none"), _step(data, workload=wl, moe_host_sync="per-layer")
    assert waited > none, (none, waited)
    assert waited < 1.05 * none                      # tens of microseconds a layer against milliseconds


def test_a_layer_graph_leaves_the_waiting_moe_block_to_the_host():
    """Under cuda_graphs: layer the attention replays but the dropless MoE block launches eagerly (Megatron-LM
    issue #1598); without the wait both replay."""
    sh = Shard(micro_batch=1, seq_len=1, cuda_graphs="layer")
    attn, moe = PassCost(kernels=20), PassCost(kernels=30, sync_pre=(1e-6, 3))
    fusion.attach_host([attn, moe], sh)
    assert attn.host_s == fusion.EAGER_HOST_FWD_S                   # the layer's one replay
    assert moe.host_s == 30 * fusion.EAGER_HOST_FWD_S and moe.sync_s > 0
    attn, moe = PassCost(kernels=20), PassCost(kernels=30)
    fusion.attach_host([attn, moe], sh)
    assert attn.host_s == moe.host_s == fusion.EAGER_HOST_FWD_S / 2 and moe.sync_s == 0


def test_the_recomputed_moe_block_waits_again():
    data = _moe()
    extra = {r: _step(data, recompute=r, moe_host_sync="per-layer") - _step(data, recompute=r, moe_host_sync="none")
             for r in ("none", "full")}
    assert extra["full"] > extra["none"] > 0


def test_none_capacity_padding_and_dense_models_predict_as_without_it():
    data = _moe()
    none = _step(data, moe_host_sync="none")
    assert _step(data) == none                       # the global default is none
    padded = {"moe_capacity_factor": 1.25, "moe_pad_to_capacity": True}
    # drop-and-pad: the counts are known on the host, no wait (token_dispatcher.py drop_and_pad)
    assert _step(data, workload=padded, moe_host_sync="per-layer") == _step(data, workload=padded, moe_host_sync="none")
    dense = _moe("llama3-8b", ep=1)
    assert _step(dense, moe_host_sync="per-layer") == _step(dense, moe_host_sync="none")


def test_attach_sync_is_the_split_of_max_device_host_at_the_wait():
    """A block of 10 kernels, 2 before the wait: device 10 us before, 90 after; host 5 us a kernel."""
    sh = Shard(micro_batch=1, seq_len=1, moe_host_sync="per-layer", ep_dispatch="deepep")
    c = PassCost(gemm_s=100e-6 - 10 * KERNEL_FIXED_S, kernels=10, host_s=50e-6, sync_pre=(10e-6, 2))
    fusion.attach_sync(c, sh)
    # max(10, 10) + 0 (deepep: no copy) + max(5 + 90, 40) - max(100, 50) = 5 us: one kernel's issue
    assert c.sync_s == pytest.approx(5e-6)
    assert c.compute_s == pytest.approx(105e-6)
    alltoall = Shard(micro_batch=1, seq_len=1, moe_host_sync="per-layer", ep_dispatch="alltoall")
    c2 = PassCost(gemm_s=100e-6 - 10 * KERNEL_FIXED_S, kernels=10, host_s=50e-6, sync_pre=(10e-6, 2))
    fusion.attach_sync(c2, alltoall)
    copies = fusion.MOE_SYNC_COPIES * fusion.EAGER_HOST_FWD_S      # the host's calls issuing the copies
    assert c2.sync_s == pytest.approx(max(10e-6, 10e-6 + copies) + fusion.D2H_COPY_S + 95e-6 - 100e-6)


def test_moe_host_sync_round_trips_through_the_writer():
    sc = scenario_from_mapping(_moe(moe_host_sync="per-layer"), catalog=CAT)
    m = scenario_to_mapping(sc)
    assert m["parallelism"]["moe_host_sync"] == "per-layer"
    assert scenario_from_mapping(m, catalog=CAT).parallelism == sc.parallelism
    assert "moe_host_sync" not in scenario_to_mapping(scenario_from_mapping(_moe(), catalog=CAT))["parallelism"]


@pytest.mark.parametrize("value, graphs", [("sometimes", "none"), (1, "none"), (True, "none"), ("per-layer", "step")])
def test_a_bad_value_is_one_located_line_and_exit_2(tmp_path, capsys, value, graphs):
    """A bad value, or a wait a whole-step CUDA graph cannot hold, gives the reader's one located line."""
    data = _moe(moe_host_sync=value)
    data["workload"]["cuda_graphs"] = graphs
    with pytest.raises(ConfigError, match="parallelism.moe_host_sync"):
        scenario_from_mapping(data, file="x.yaml", catalog=CAT)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", "--estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parallelism.moe_host_sync" in err[0] and str(path) in err[0] and "per-layer" in err[0], err


def test_a_whole_step_graph_is_refused_only_where_the_wait_exists():
    for data in (_moe("llama3-8b", ep=1, moe_host_sync="per-layer"), _moe(moe_host_sync="none")):
        data["workload"]["cuda_graphs"] = "step"
        scenario_from_mapping(data, catalog=CAT)
    padded = _moe(moe_host_sync="per-layer")
    padded["workload"].update(cuda_graphs="step", moe_capacity_factor=1.0, moe_pad_to_capacity=True)
    scenario_from_mapping(padded, catalog=CAT)


def test_a_stack_s_wait_under_a_whole_step_graph_names_the_stack():
    data = {**_moe(), "stack": "megatron-bridge-25.11"}
    data["workload"]["cuda_graphs"] = "step"
    with pytest.raises(ConfigError, match=r"parallelism.moe_host_sync: per-layer with workload.cuda_graphs: step.*"
                                          r"set by stack 'megatron-bridge-25.11'"):
        scenario_from_mapping(data, file="x.yaml", catalog=CAT)
    data["parallelism"]["moe_host_sync"] = "none"                 # the file departs from its stack
    scenario_from_mapping(data, file="x.yaml", catalog=CAT)
