"""An fp8 run's weight copies (``parallelism.fp8_transpose_cache``, fp8 primary weights through
``param_gather_precision: fp8``), priced as Transformer Engine makes them (strategy._fp8_weight_bytes)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import fmsim
from fmsim.errors import ConfigError
from fmsim.parallel.strategy import _fp8_weight_bytes
from fmsim.scenario import load_scenario, scenario_from_mapping, scenario_to_mapping

from scenario_helpers import small_pretrain

LORA = Path(__file__).resolve().parent.parent / "scenarios" / "validation" / "training" / "mlpv40-lora-01.yaml"


@pytest.mark.parametrize("lora, gather, cache, expected", [
    (0, "bf16", True, (4.0, 0.0, 0.0)),     # fp8_cast_transpose_fused once a step (read 2, write 1 + 1)
    (0, "bf16", False, (0.0, 4.0, 0.0)),    # ... every micro-batch's forward
    (16, "bf16", True, (4.0, 0.0, 0.0)),    # frozen 16-bit weights are cast like trained ones
    (16, "fp8", True, (0.0, 0.0, 0.0)),     # frozen fp8 weights: used as they are, transposed once and kept
    (16, "fp8", False, (0.0, 0.0, 2.0)),    # ... tex.fp8_transpose (read 1, write 1) every micro-batch's backward
    (0, "fp8", True, (4.0, 0.0, 0.0)),      # trained fp8 weights keep the priced step cast
    (0, "fp8", False, (4.0, 0.0, 2.0)),     # ... and add the transposes
])
def test_weight_copy_bytes_follow_transformer_engine(lora, gather, cache, expected):
    w = SimpleNamespace(lora_rank=lora, fp8_recipe="delayed")
    par = SimpleNamespace(param_gather_precision=gather, fp8_transpose_cache=cache)
    assert _fp8_weight_bytes(w, par) == expected


def _step(**overrides):
    return fmsim.estimate(load_scenario(LORA, overrides=overrides)).metrics["step_time_s"]


def test_uncached_transposes_cost_per_micro_batch():
    # the MLPerf v4.0 LoRA stack states both (fp8 base weights, transpose cache off); its file has 4 micro-batches
    sc = load_scenario(LORA)
    assert sc.parallelism.param_gather_precision == "fp8" and sc.parallelism.fp8_transpose_cache is False
    cached, uncached = _step(**{"parallelism.fp8_transpose_cache": True}), _step()
    per_step = uncached - cached
    assert per_step > 0
    # twice the micro-batches (global batch 16 on the same 8 GPUs): twice the transposes
    twice = _step(**{"workload.global_batch": 16}) - _step(**{"workload.global_batch": 16,
                                                              "parallelism.fp8_transpose_cache": True})
    assert twice == pytest.approx(2 * per_step, rel=0.02)


def test_the_field_is_read_checked_and_written():
    data = small_pretrain("p5.48xlarge")
    data["workload"]["precision"] = "fp8"
    data["parallelism"]["fp8_transpose_cache"] = False
    sc = scenario_from_mapping(data, file="x.yaml")
    assert sc.parallelism.fp8_transpose_cache is False
    assert scenario_to_mapping(sc)["parallelism"]["fp8_transpose_cache"] is False
    assert scenario_from_mapping(scenario_to_mapping(sc), file="x.yaml").parallelism.fp8_transpose_cache is False
    data["workload"]["precision"] = "bf16"
    with pytest.raises(ConfigError) as exc:
        scenario_from_mapping(data, file="x.yaml")
    assert exc.value.field == "parallelism.fp8_transpose_cache" and "fp8" in exc.value.message
