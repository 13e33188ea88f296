"""Settings the stacks needed that the schema could not state (issue 27 item 2): ``cluster.network.nvls`` and
``workload.cross_entropy: torch`` (PyTorch's plain loss on fp32 logits)."""
from __future__ import annotations

import pytest
import yaml

from fmsim import estimate
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.scenario import scenario_from_mapping, scenario_to_mapping


def _dp8(instance="dgx-h100", **network):
    data = {"version": 1, "name": "nvls",
            "workload": {"kind": "pretrain", "model": "llama3-8b", "precision": "bf16", "seq_len": 4096,
                         "global_batch": 16},
            "parallelism": {"tp": 1, "zero": 0, "overlap": {"grad_reduce": False}},
            "cluster": {"instance": instance, "nodes": 1}}
    if network:
        data["cluster"]["network"] = network
    return data


def test_nvls_off_turns_the_switch_reduction_off_and_slows_the_all_reduce():
    on, off = scenario_from_mapping(_dp8()), scenario_from_mapping(_dp8(nvls=False))
    assert on.cluster.instance.scale_up.in_switch_reduction and not off.cluster.instance.scale_up.in_switch_reduction
    assert estimate(off).metrics["step_time_s"] > estimate(on).metrics["step_time_s"]
    assert scenario_from_mapping(_dp8(nvls=True)).cluster == on.cluster      # true where it exists: no change


def test_nvls_round_trips_through_the_writer():
    off = scenario_from_mapping(_dp8(nvls=False))
    data = scenario_to_mapping(off)
    assert data["cluster"]["network"]["nvls"] is False
    assert scenario_from_mapping(data).cluster == off.cluster
    assert "network" not in scenario_to_mapping(scenario_from_mapping(_dp8()))["cluster"]


@pytest.mark.parametrize("instance, value, rule", [
    ("p4d.24xlarge", True, "has no switch that reduces"),       # NVSwitch gen 2: no NVLS
    ("dgx-h100", "off", "expected true or false"),
])
def test_a_bad_nvls_is_one_located_line_and_exit_2(tmp_path, capsys, instance, value, rule):
    with pytest.raises(ConfigError) as exc:
        scenario_from_mapping(_dp8(instance, nvls=value), file="x.yaml")
    assert "cluster.network.nvls" in str(exc.value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_dp8(instance, nvls=value)))
    assert main(["run", "--estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster.network.nvls" in err[0] and str(path) in err[0], err
    assert rule in err[0] or rule.split()[0] in err[0]


def test_the_mlperf_stacks_state_nvls_off_from_their_configs():
    cat = load_catalog()
    for name in ("mlperf-v4.0-gpt3", "mlperf-v4.0-llama2-lora"):
        s = cat.stack(name).setting("cluster.network.nvls")
        assert s is not None and s.value is False and "NCCL_NVLS_ENABLE=0" in s.source


def _ce(value=None):
    data = _dp8()
    data["workload"]["model"] = "llama3-8b"          # 128,256-token vocabulary against a 4,096 hidden size
    if value is not None:
        data["workload"]["cross_entropy"] = value
    return data


def test_torch_cross_entropy_sits_between_the_fused_and_megatron_s_unfused_loss():
    from fmsim.model.ops import CROSS_ENTROPY_BYTES

    assert CROSS_ENTROPY_BYTES["torch"] == (22.0, 26.0)      # 6 + 16 forward; 4 + 16 + 6 backward (ops.py)
    step = {v: estimate(scenario_from_mapping(_ce(v))).metrics["step_time_s"] for v in ("fused", "torch", "unfused")}
    assert step["fused"] < step["torch"] < step["unfused"]
    sc = scenario_from_mapping(_ce("torch"))
    assert scenario_to_mapping(sc)["workload"]["cross_entropy"] == "torch"
    assert scenario_from_mapping(scenario_to_mapping(sc)).workload == sc.workload


def test_a_bad_cross_entropy_names_the_values(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_ce("pytorch")))
    assert main(["run", "--estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "workload.cross_entropy" in err[0] and "torch" in err[0], err
