"""A serving run that does not serve its requests exits as before (0 without an SLO: the exit-code contract
of docs/cli.md is unchanged), but says so where a script and a person look: one warning line on stderr
naming how many requests were rejected, and the CSV's ``rejected_requests`` / ``unfinished_requests``
columns (appended to the inference row)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from fmsim.cli import EXIT_INFEASIBLE, EXIT_OK, main

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "scenarios" / "examples" / "serving-llama3.1-70b-chat-p5.yaml"


def _scenario(tmp_path: Path, *, prompt_len, requests: int = 20, slo: bool = False) -> Path:
    doc = yaml.safe_load(CHAT.read_text())
    doc.pop("expect", None)
    if not slo:
        doc.pop("slo", None)
    doc["traffic"].update(requests=requests, prompt_len=prompt_len, output_len=16)
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(capsys, path: Path, tmp_path: Path, *flags: str) -> tuple[int, list[str], dict]:
    out_csv = tmp_path / "out.csv"
    code = main(["run", str(path), "--csv", str(out_csv), *flags])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    with out_csv.open() as f:
        (row,) = list(csv.DictReader(f))
    return code, err.strip().splitlines(), row


# 4M-token prompts fit no engine's KV cache (1.4M tokens on these p5 engines): every request is rejected
@pytest.mark.parametrize("flags", [(), ("--estimate",)], ids=["simulation", "estimate"])
def test_a_run_that_rejects_every_request_without_an_slo_exits_0_and_says_so(capsys, tmp_path, flags):
    code, err, row = _run(capsys, _scenario(tmp_path, prompt_len=4_000_000), tmp_path, *flags)
    assert code == EXIT_OK
    of = "" if flags else " of 20"          # the estimate offers no request count of its own
    assert err == [f"{tmp_path / 'x.yaml'}: warning: 20{of} requests rejected (their prompt and output fit "
                   "no engine's KV cache); no SLO was given, so the run exits 0 all the same"]
    assert row["rejected_requests"] == "20" and row["unfinished_requests"] == "0"
    assert float(row["requests_per_s"]) == 0.0 and row["slo_met"] == ""


def test_a_run_that_rejects_some_requests_names_how_many(capsys, tmp_path):
    lengths = {"dist": "lognormal", "mean": 1_000_000, "sigma": 0.5, "min": 16, "max": 5_000_000}
    code, err, row = _run(capsys, _scenario(tmp_path, prompt_len=lengths, requests=60), tmp_path)
    rejected = int(row["rejected_requests"])
    assert code == EXIT_OK and 0 < rejected < 60 and float(row["requests_per_s"]) > 0
    assert len(err) == 1 and f"warning: {rejected} of 60 requests rejected" in err[0]


def test_with_an_slo_the_rejections_count_as_a_miss_and_the_exit_code_is_unchanged(capsys, tmp_path):
    code, err, row = _run(capsys, _scenario(tmp_path, prompt_len=4_000_000, slo=True), tmp_path)
    assert code == EXIT_INFEASIBLE and row["slo_met"] == "false"
    assert "warning: 20 of 20 requests rejected" in err[0] and "count as a missed SLO" in err[0]
    assert "misses its SLO" in err[1] and len(err) == 2


def test_a_run_that_serves_every_request_warns_of_nothing(capsys, tmp_path):
    code, err, row = _run(capsys, _scenario(tmp_path, prompt_len=1000), tmp_path, "--estimate")
    assert code == EXIT_OK and err == [] and row["rejected_requests"] == "0"
