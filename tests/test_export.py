"""CSV and JSON export: stable contract columns (a golden header), full-precision floats,
true/false booleans, a union header for mixed kinds, and strict JSON."""

import csv
import json
import math
from pathlib import Path

import numpy as np

from fmsim.export import csv_cell, csv_header, write_csv, write_json
from fmsim.results import COMMON_COLUMNS, INFERENCE_COLUMNS, TRAINING_COLUMNS, Result

GOLDEN = Path(__file__).parent / "golden" / "training_csv_header.txt"


def training_result(name: str = "t", **metrics) -> Result:
    base = {
        "tp": 8,
        "pp": 4,
        "dp": 4,
        "cp": 1,
        "ep": 1,
        "step_time_s": 0.1 + 0.2,
        "tokens_per_s": 1.5e6,
        "mfu": 0.4123456789012345,
        "fits": True,
        "memory_per_gpu_bytes": 7.0e10,
        "bottleneck": "compute",
    }
    base.update(metrics)
    return Result(
        scenario=name,
        kind="pretrain",
        instance="p5.48xlarge",
        nodes=16,
        gpus=128,
        usd_per_hour=55.04,
        price_date="2026-07-20",
        metrics=base,
        breakdown={"compute": 0.2, "bubble": 0.1},
        memory={"weights": 1e10},
        details={"bottleneck_sentence": "compute-bound", "trace": ["big"]},
    )


def inference_result() -> Result:
    return Result(
        scenario="i",
        kind="inference",
        instance="p5.48xlarge",
        nodes=1,
        gpus=8,
        usd_per_hour=55.04,
        price_date="2026-07-20",
        metrics={"output_tokens_per_s": 12000.0, "ttft_p50_s": 0.12},
    )


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def test_training_csv_header_matches_the_golden_file(tmp_path):
    out = tmp_path / "r.csv"
    write_csv([training_result()], out)
    header = out.read_text().splitlines()[0]
    assert header == GOLDEN.read_text().strip()


def test_golden_header_keeps_every_contract_column_in_order():
    cols = GOLDEN.read_text().strip().split(",")
    contract = [
        "scenario",
        "kind",
        "instance",
        "nodes",
        "gpus",
        "usd_per_hour",
        "price_date",
        "tp",
        "pp",
        "dp",
        "cp",
        "ep",
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "model_tflops_per_gpu",
        "mfu",
        "hfu",
        "memory_per_gpu_bytes",
        "hbm_per_gpu_bytes",
        "fits",
        "usd_per_step",
        "time_to_train_s",
        "gpu_hours",
        "cost_usd",
    ]
    assert cols[: len(contract)] == contract  # more may be appended, none renamed or moved


def test_floats_keep_full_precision_and_bools_are_lowercase(tmp_path):
    out = tmp_path / "r.csv"
    write_csv([training_result()], out)
    header, row = read_csv(out)
    cell = dict(zip(header, row, strict=True))
    assert cell["step_time_s"] == repr(0.1 + 0.2) and float(cell["step_time_s"]) == 0.1 + 0.2
    assert float(cell["mfu"]) == 0.4123456789012345
    assert cell["fits"] == "true" and cell["nodes"] == "16" and cell["hfu"] == ""
    assert cell["bottleneck"] == "compute"


def test_cells():
    assert csv_cell(None) == "" and csv_cell(False) == "false" and csv_cell(3) == "3"
    assert csv_cell(np.float64(0.1)) == "0.1" and csv_cell(np.int64(4)) == "4" and csv_cell("a,b") == "a,b"


def test_mixed_kinds_share_a_union_header_in_contract_order(tmp_path):
    out = tmp_path / "mixed.csv"
    write_csv([inference_result(), training_result()], out)
    rows = read_csv(out)
    assert rows[0] == list(COMMON_COLUMNS + TRAINING_COLUMNS + INFERENCE_COLUMNS)
    inf = dict(zip(rows[0], rows[1], strict=True))
    assert inf["kind"] == "inference" and inf["step_time_s"] == "" and inf["ttft_p50_s"] == "0.12"


def test_unknown_columns_follow_the_contract_ones():
    assert csv_header([{"zeta": 1, "scenario": "a"}, {"alpha": 2, "kind": "x"}]) == [
        "scenario",
        "kind",
        "zeta",
        "alpha",
    ]


def test_empty_result_list_writes_an_empty_header(tmp_path):
    out = tmp_path / "none.csv"
    write_csv([], out)
    assert out.read_text() == "\n"


def test_json_holds_everything_and_is_strict(tmp_path):
    out = tmp_path / "r.json"
    r = training_result(extra=np.float64(2.5), bad=math.inf, arr=np.arange(3))
    write_json([r, inference_result()], out)
    doc = json.loads(out.read_text())  # strict: NaN/inf would not parse in other tools
    assert isinstance(doc, list) and len(doc) == 2
    first = doc[0]
    assert first["scenario"] == "t" and first["step_time_s"] == 0.1 + 0.2 and first["fits"] is True
    assert first["breakdown_s"] == {"compute": 0.2, "bubble": 0.1} and first["memory_bytes"] == {
        "weights": 1e10
    }
    assert (
        first["metrics"]["extra"] == 2.5
        and first["metrics"]["bad"] is None
        and first["metrics"]["arr"] == [0, 1, 2]
    )
    assert "trace" not in first["details"]
    assert doc[1]["kind"] == "inference"
    assert "NaN" not in out.read_text() and "Infinity" not in out.read_text()


def test_dash_writes_to_stdout(capsys):
    write_csv([training_result()], "-")
    assert capsys.readouterr().out.splitlines()[0] == GOLDEN.read_text().strip()


def test_a_training_row_names_the_plan_it_prices(tmp_path):
    """The plan's own settings ride in the row: a budgeting sheet comparing plans can tell them apart."""
    from fmsim.api import simulate
    from fmsim.scenario import load_scenario

    examples = Path(__file__).parent.parent / "scenarios" / "examples"
    hsdp = simulate(load_scenario(examples / "llama3-70b-hsdp-p5.yaml"))
    out = tmp_path / "plans.csv"
    write_csv([hsdp], out)
    header, row = read_csv(out)
    cell = dict(zip(header, row))
    assert (cell["zero"], cell["dp_shard"], cell["precision"], cell["recompute"]) == ("3", "64", "bf16", "full")
    assert int(cell["num_microbatches"]) * int(cell["micro_batch"]) * int(cell["dp"]) == int(cell["global_batch"])
    # without ZeRO there is no shard group to name
    plain = simulate(load_scenario(examples / "llama3-70b-hsdp-p5.yaml",
                                   overrides={"parallelism.zero": 0, "parallelism.dp_shard": "auto"}))
    write_csv([plain], out)
    header, row = read_csv(out)
    assert dict(zip(header, row))["dp_shard"] == ""
    assert dict(zip(header, row))["recompute_layers"] == ""
    block = simulate(load_scenario(examples / "llama3-70b-hsdp-p5.yaml",
                                   overrides={"parallelism.recompute_layers": 10}))
    write_csv([block], out)
    header, row = read_csv(out)
    assert (dict(zip(header, row))["recompute"], dict(zip(header, row))["recompute_layers"]) == ("full", "10")
