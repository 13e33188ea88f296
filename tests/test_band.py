"""The band on a prediction (fmsim.band): holds the point, narrows as settings are stated, reaches the CSV."""
from __future__ import annotations

import csv
from pathlib import Path

import yaml

from fmsim.band import RELEASES, band, band_columns, candidates
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.scenario import load_scenario, scenario_from_mapping
from scenario_helpers import small_pretrain

ROOT = Path(__file__).resolve().parent.parent
INSTANCE = "dgx-h100"


def _sc(**top):
    return scenario_from_mapping(small_pretrain(INSTANCE, **top))


def _width(b):
    lo, hi = b.relative()
    return hi - lo


def test_the_band_holds_the_point():
    for sc in (_sc(), _sc(stack="nemo-25.04"),
               load_scenario(ROOT / "scenarios/validation/training/meg21t2-01.yaml"),
               load_scenario(ROOT / "scenarios/examples/llama3-70b-p5.yaml")):
        b = band(sc)
        for m, p in b.point.items():
            assert b.low[m] <= p <= b.high[m], (sc.name, m)
        assert b.varied and b.runs > 1


def _unstated(b):
    return {k for k in b.varied if not k.startswith("hardware.") and not k.endswith(RELEASES)}


def test_a_stack_narrows_the_band_and_stated_settings_are_not_varied():
    plain, stacked = band(_sc()), band(_sc(stack="megatron-bridge-25.11"))
    assert _unstated(stacked) < _unstated(plain)
    assert "workload.attention_kernel" in plain.varied and "workload.attention_kernel" not in stacked.varied
    assert _width(stacked) < _width(plain)
    assert plain.most == "workload.attention_kernel"     # unfused attention: the 2021-22 stacks' value


def test_stating_every_varied_setting_leaves_the_point():
    sc = _sc(stack="megatron-bridge-25.11")
    data = small_pretrain(INSTANCE)
    data["stack"] = "megatron-bridge-25.11"
    for path in candidates(sc, load_catalog()):
        node = data
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = _current(sc, path)      # state what the file resolved to
    full = scenario_from_mapping(data)
    assert full.parallelism == sc.parallelism and full.workload == sc.workload
    assert candidates(full, load_catalog()) == {}
    b = band(full)
    # what is left: the settings the stack's other releases ship and the hardware figures' spreads
    assert _unstated(b) == set() and b.low["step_time_s"] < b.point["step_time_s"] < b.high["step_time_s"]
    assert {k for k in b.varied if k.startswith("hardware.")} == {"hardware.chip_speed", "hardware.hbm",
                                                                  "hardware.fabric"}


def _current(sc, path):
    from fmsim.scenario import scenario_to_mapping
    from fmsim.stacks import lookup

    v = lookup(scenario_to_mapping(sc), path)
    if v is None:   # written only when it departs from the default
        return {"workload.attention_kernel": "flash", "workload.cross_entropy": "fused",
                "workload.fp8_attention": False, "parallelism.activation_fp8_input": False,
                "parallelism.fp8_transpose_cache": True,
                "parallelism.gradient_accumulation_fusion": True, "parallelism.grad_bucket": "40M",
                "cluster.network.in_network_reduction": False, "parallelism.param_fetch": "unit",
                "parallelism.grad_reduce_op": sc.parallelism.grad_reduce_op,
                "cluster.network.nvls": True, "workload.kernel_fusion": "fused", "workload.cuda_graphs": "none",
                "workload.fp8_recipe": "delayed", "workload.hidden_dropout": 0.0,
                "workload.attention_dropout": 0.0}[path]
    return v


def test_band_columns_scale_with_the_row_s_own_point():
    b = band(_sc())
    cols = band_columns("pretrain", b, {"step_time_s": 2 * b.point["step_time_s"]})
    lo, hi = b.relative()
    assert abs(cols["step_time_low_s"] - 2 * b.point["step_time_s"] * lo) < 1e-9
    assert cols["step_time_high_s"] >= 2 * b.point["step_time_s"]
    empty = {"step_time_low_s": None, "step_time_high_s": None}
    assert band_columns("pretrain", None, {"step_time_s": 1.0}) == empty


def test_run_band_prints_the_band_and_writes_its_columns(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    # a plan that fits (the small what-if needs 89 GiB of 80 without ZeRO; `run` exits 3 for one that does not)
    fits = small_pretrain(INSTANCE)
    fits["parallelism"]["zero"] = 1
    path.write_text(yaml.safe_dump(fits))
    out = tmp_path / "r.csv"
    assert main(["run", "--estimate", "--band", str(path), "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    assert "band: step " in text and "attention kernel unstated" in text
    header, row = list(csv.reader(out.open()))
    cell = dict(zip(header, row, strict=True))
    i = header.index("recompute_layers")     # the band columns follow the plan's (storage's come after)
    assert header[i + 1:i + 3] == ["step_time_low_s", "step_time_high_s"]
    assert float(cell["step_time_low_s"]) <= float(cell["step_time_s"]) <= float(cell["step_time_high_s"])
    assert main(["run", "--estimate", str(path), "--csv", str(out)]) == 0
    header, row = list(csv.reader(out.open()))
    cell = dict(zip(header, row, strict=True))
    assert cell["step_time_low_s"] == "" and cell["step_time_high_s"] == ""      # only on demand


def test_validate_reports_rows_by_configuration_and_band_honesty(capsys):
    files = [str(ROOT / "scenarios/validation/training" / f) for f in ("mpt-04.yaml", "meg21-01.yaml")]
    assert main(["validate", "--estimate", "--band", *files]) == 0
    out = capsys.readouterr().out
    assert "by configuration -- partial: 1 rows" in out and "stated: 1 rows" in out
    assert "band (all): " in out and "of 2 measured values inside their band" in out
