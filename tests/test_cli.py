"""The ``fmsim`` command line, in-process through ``fmsim.cli.main``: catalog tables, run (with a
stand-in simulator), check, validate, lint, plug-in sub-commands, and exit codes with one-line errors."""

import csv
import dataclasses
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

import fmsim
import fmsim.model.flops
from fmsim.catalog import load_catalog
from fmsim.cli import expand_paths, format_column, main
from fmsim.errors import InfeasibleError, NotBuiltError
from fmsim.results import Result

DATA = Path(__file__).parent / "data"
LLAMA = DATA / "llama3-70b-p5.yaml"
MOE = DATA / "moe-finetune-inline.yaml"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


class FakeSim:
    """Stands in for fmsim.simulate/estimate: a Result whose numbers come from the scenario."""

    def __init__(self, step_time_s: float = 12.3, raise_for: dict | None = None):
        self.calls: list[tuple[object, dict]] = []
        self.step_time_s = step_time_s
        self.raise_for = raise_for or {}

    def __call__(self, sc, **kw):
        self.calls.append((sc, kw))
        if sc.name in self.raise_for:
            raise self.raise_for[sc.name]
        p = sc.parallelism
        tokens = sc.workload.seq_len * sc.workload.global_batch
        return Result(
            scenario=sc.name,
            kind=sc.workload.kind,
            instance=sc.cluster.instance.name,
            nodes=sc.cluster.nodes,
            gpus=sc.cluster.gpus,
            usd_per_hour=55.04,
            price_date="2026-07-20",
            metrics={
                "tp": p.tp,
                "pp": p.pp,
                "dp": p.dp,
                "cp": p.cp,
                "ep": p.ep,
                "step_time_s": self.step_time_s,
                "tokens_per_s": tokens / self.step_time_s,
                "tokens_per_s_per_gpu": tokens / self.step_time_s / sc.cluster.gpus,
                "mfu": 0.41,
                "fits": True,
                "memory_per_gpu_bytes": 6.5e10,
                "cost_usd": 1.5e6,
            },
            breakdown={"compute": 0.8 * self.step_time_s, "bubble": 0.2 * self.step_time_s},
            memory={"weights": 2.2e10, "activations": 3e10},
            details={"bottleneck": "compute-bound: GEMMs take 80 % of the step"},
        )


@pytest.fixture
def fake(monkeypatch):
    sim, est = FakeSim(), FakeSim(step_time_s=11.0)
    monkeypatch.setattr(fmsim, "simulate", sim, raising=False)
    monkeypatch.setattr(fmsim, "estimate", est, raising=False)
    return sim, est


# -- catalog -------------------------------------------------------------------------------------


def test_catalog_instances_lists_every_instance_with_efa_and_dated_price(capsys):
    code, out, err = run_cli(capsys, "catalog", "instances")
    assert code == 0 and err == ""
    cat = load_catalog()
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(lines) == set(cat.instances)
    p5 = lines["p5.48xlarge"]
    hbm = cat.instance("p5.48xlarge").accelerator.hbm_bytes
    assert (
        "8 x h100-sxm" in p5
        and "3,200" in p5
        and (f"{hbm / 2**30:.0f} GiB" in p5 or f"{hbm / 1e9:.0f} GB" in p5)
    )
    price = cat.price("p5.48xlarge", "on-demand")
    assert f"${price.usd_per_hour:,.2f} ({price.date})" in p5


def test_catalog_default_table_is_instances(capsys):
    assert run_cli(capsys, "catalog")[1] == run_cli(capsys, "catalog", "instances")[1]


@pytest.mark.parametrize(
    "table, expect",
    [
        ("accelerators", "h100-sxm"),
        ("models", "llama3-70b"),
        ("storage", "fsx-lustre"),
        ("prices", "on-demand"),
        ("fabrics", "efa-v2"),
    ],
)
def test_catalog_tables(capsys, table, expect):
    code, out, err = run_cli(capsys, "catalog", table)
    assert code == 0 and expect in out and err == ""


@pytest.mark.parametrize(
    "name, expect",
    [
        ("p5.48xlarge", "num_accelerators: 8"),
        ("h100-sxm", "hbm_bytes"),
        ("h100-sxm", "bf16: 989 TFLOP/s"),          # a rate: its name ends in _s, but it is no duration
        ("llama3-70b", "parameters (computed)"),
        ("efa-v2", "kind: efa"),
    ],
)
def test_catalog_show(capsys, name, expect):
    code, out, _ = run_cli(capsys, "catalog", "show", name)
    assert code == 0 and expect in out


def test_catalog_show_unknown_name_suggests(capsys):
    code, _out, err = run_cli(capsys, "catalog", "show", "p5.48xl")
    assert code == 2 and len(err.splitlines()) == 1 and "did you mean 'p5.48xlarge'" in err


# -- run -----------------------------------------------------------------------------------------


def test_run_prints_a_block_per_scenario_and_writes_csv_and_json(capsys, fake, tmp_path):
    sim, _ = fake
    csv_path, json_path = tmp_path / "r.csv", tmp_path / "r.json"
    code, out, err = run_cli(capsys, "run", LLAMA, MOE, "--csv", csv_path, "--json", json_path)
    assert code == 0 and err == ""
    assert [c[0].name for c in sim.calls] == ["llama3-70b-pretrain-p5", "moe-16x1b-finetune"]
    assert sim.calls[0][1] == {}  # no trace asked: simulate(sc)
    assert "== llama3-70b-pretrain-p5" in out and "12.3 s" in out and "41.0 %" in out
    assert "breakdown" in out and "(80.0 %)" in out and "memory per GPU" in out and "compute-bound" in out
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["scenario"] for r in rows] == ["llama3-70b-pretrain-p5", "moe-16x1b-finetune"]
    assert rows[0]["step_time_s"] == "12.3" and rows[0]["fits"] == "true"
    doc = json.loads(json_path.read_text())
    assert doc[1]["breakdown_s"]["bubble"] == pytest.approx(0.2 * 12.3)


def test_run_applies_set_overrides(capsys, fake):
    sim, _ = fake
    code, _, _ = run_cli(capsys, "run", LLAMA, "--set", "parallelism.tp=4", "--set", "workload.precision=fp8")
    sc = sim.calls[0][0]
    assert code == 0 and sc.parallelism.tp == 4 and sc.parallelism.dp == 8 and sc.workload.precision == "fp8"


def test_run_estimate_uses_the_analytical_path(capsys, fake):
    sim, est = fake
    code, out, _ = run_cli(capsys, "run", LLAMA, "--estimate")
    assert code == 0 and not sim.calls and len(est.calls) == 1 and "11 s" in out


def test_run_trace_passes_the_path_per_scenario(capsys, fake, tmp_path):
    sim, _ = fake
    assert run_cli(capsys, "run", LLAMA, "--trace", tmp_path / "t.json")[0] == 0
    assert sim.calls[0][1] == {"trace_path": str(tmp_path / "t.json")}
    sim.calls.clear()
    assert run_cli(capsys, "run", LLAMA, MOE, "--trace", tmp_path / "t.json")[0] == 0
    assert [c[1]["trace_path"] for c in sim.calls] == [
        str(tmp_path / "t-llama3-70b-pretrain-p5.json"),
        str(tmp_path / "t-moe-16x1b-finetune.json"),
    ]


def test_run_trace_with_estimate_is_a_usage_error(capsys, fake):
    code, _, err = run_cli(capsys, "run", LLAMA, "--estimate", "--trace", "t.json")
    assert code == 2 and len(err.splitlines()) == 1


def test_run_directory_expands_recursively_sorted(tmp_path, capsys, fake):
    sim, _ = fake
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.yaml").write_text(LLAMA.read_text().replace("llama3-70b-pretrain-p5", "z"))
    (tmp_path / "a.yaml").write_text(LLAMA.read_text().replace("llama3-70b-pretrain-p5", "a"))
    (tmp_path / "notes.txt").write_text("not a scenario")
    files, errors = expand_paths([str(tmp_path)])
    assert files == [str(tmp_path / "a.yaml"), str(tmp_path / "b" / "z.yaml")] and errors == []
    assert run_cli(capsys, "run", tmp_path)[0] == 0
    assert [c[0].name for c in sim.calls] == ["a", "z"]


def test_run_kind_not_built_says_so_in_one_line(capsys, monkeypatch):
    def not_built(sc, **kw):
        raise NotBuiltError(f"{sc.file}: workload.kind: the 'rl' simulator is not built yet")

    monkeypatch.setattr(fmsim, "simulate", not_built, raising=False)
    code, _, err = run_cli(capsys, "run", LLAMA, "--set", "workload.kind=rl")
    assert code == 2 and err.splitlines() == [f"{LLAMA}: workload.kind: the 'rl' simulator is not built yet"]


def test_run_infeasible_scenario_is_one_line_and_others_still_run(capsys, monkeypatch):
    sim = FakeSim(raise_for={"moe-16x1b-finetune": InfeasibleError("does not fit: 90 GiB > 80 GiB HBM")})
    monkeypatch.setattr(fmsim, "simulate", sim, raising=False)
    code, out, err = run_cli(capsys, "run", LLAMA, MOE)
    assert code == 2 and "== llama3-70b-pretrain-p5" in out
    assert err.splitlines() == [f"{MOE}: does not fit: 90 GiB > 80 GiB HBM"]


def test_run_bad_file_and_missing_path(capsys, fake, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(LLAMA.read_text().replace("tp: 8", "tp: 12"))
    code, _, err = run_cli(capsys, "run", bad, tmp_path / "missing.yaml")
    assert code == 2
    assert err.splitlines() == [
        (
            f"{tmp_path / 'missing.yaml'}: no such file or directory (expected a scenario "
            ".yaml file or a directory)"
        ),
        (
            f"{bad}: parallelism.tp: 12 does not divide the 64 attention heads of llama3-70b "
            "(expected a divisor of 64)"
        ),
    ]


def test_run_unwritable_csv_is_one_line(capsys, fake, tmp_path):
    code, _, err = run_cli(capsys, "run", LLAMA, "--csv", tmp_path / "no" / "such" / "dir.csv")
    assert code == 2 and len(err.splitlines()) == 1 and "cannot write the CSV" in err


def test_bad_set_option_is_one_line(capsys, fake):
    code, _, err = run_cli(capsys, "run", LLAMA, "--set", "parallelism.tp")
    assert code == 2 and err.splitlines() == [
        "--set: 'parallelism.tp' is not key.path=value (expected e.g. parallelism.tp=4)"
    ]


# -- check ---------------------------------------------------------------------------------------


def test_check_passes_inside_the_band_and_skips_files_without_expect(capsys, fake, tmp_path):
    no_expect = yaml.safe_load(LLAMA.read_text())
    del no_expect["expect"]
    no_expect["name"] = "plain"
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(no_expect))
    code, out, err = run_cli(capsys, "check", LLAMA, tmp_path / "plain.yaml")
    assert code == 0 and err == ""
    assert (
        "ok" in out
        and "1 scenario checked, 1 of 1 metrics in band; 1 scenario without expect: skipped" in out
    )


def test_check_fails_with_exit_1_when_a_prediction_leaves_its_band(capsys, monkeypatch):
    monkeypatch.setattr(fmsim, "simulate", FakeSim(step_time_s=14.0), raising=False)
    code, out, _ = run_cli(capsys, "check", LLAMA)
    assert code == 1
    row = next(line for line in out.splitlines() if line.startswith("llama3-70b-pretrain-p5"))
    assert "step_time_s" in row and "14 s" in row and "12.3 s" in row and "OUT OF BAND" in row


def test_check_with_a_failing_simulation_is_exit_2(capsys, monkeypatch):
    sim = FakeSim(raise_for={"llama3-70b-pretrain-p5": InfeasibleError("does not fit")})
    monkeypatch.setattr(fmsim, "simulate", sim, raising=False)
    code, out, err = run_cli(capsys, "check", LLAMA)
    assert code == 2 and "ERROR" in out and err.splitlines() == [f"{LLAMA}: does not fit"]


def test_check_multiple_metrics_including_booleans(capsys, fake):
    code, out, _ = run_cli(capsys, "check", MOE)  # step_time 1.9 s +-10 %, mfu 0.31 +-0.02, fits
    assert code == 1  # the fake says 12.3 s and mfu 0.41
    assert out.count("OUT OF BAND") == 2 and "fits" in out


# -- validate ------------------------------------------------------------------------------------


def test_validate_reports_errors_with_the_source_formula(capsys, fake, monkeypatch, tmp_path):
    calls = []

    def flops(model, seq_len, global_batch, formula, **kw):
        calls.append((model.name, seq_len, global_batch, formula, kw))
        return 1e18

    monkeypatch.setattr(fmsim.model.flops, "model_flops_per_step", flops)
    out_csv = tmp_path / "v.csv"
    code, out, err = run_cli(capsys, "validate", MOE, LLAMA, "--csv", out_csv)
    assert code == 0 and err == ""
    assert calls[0] == ("tiny-moe", 4096, 256, "palm", {})
    rows = {r["key"]: r for r in csv.DictReader(out_csv.open())}
    # step time: 12.3 predicted vs 1.9 measured
    assert float(rows["step_time_s"]["error_pct"]) == pytest.approx(100 * (12.3 - 1.9) / 1.9)
    # model TFLOP/s = 1e18 FLOP / 12.3 s / 32 GPUs; MFU against the source's 989 TFLOP/s
    tflops = 1e18 / 12.3 / 32 / 1e12
    assert float(rows["model_tflops_per_gpu"]["predicted"]) == pytest.approx(tflops)
    assert float(rows["mfu"]["predicted"]) == pytest.approx(tflops * 1e12 / 989e12)
    assert rows["mfu"]["flops_formula"] == "palm" and rows["step_time_s"]["flops_formula"] == ""
    errors = sorted(abs(float(r["error_pct"])) for r in rows.values())
    median = (errors[1] + errors[2]) / 2
    assert f"median |error| {median:.1f} %" in out and f"worst {errors[-1]:.1f} %" in out
    assert "1 without measured: skipped" in out


def test_validate_names_measured_runs_the_memory_model_says_do_not_fit(capsys, monkeypatch, tmp_path):
    class NoFit(FakeSim):
        def __call__(self, sc, **kw):
            r = super().__call__(sc, **kw)
            return dataclasses.replace(r, metrics={**r.metrics, "fits": sc.name != "moe-16x1b-finetune"})

    monkeypatch.setattr(fmsim, "simulate", NoFit(), raising=False)
    monkeypatch.setattr(fmsim.model.flops, "model_flops_per_step", lambda *a, **k: 1e18)
    out_csv = tmp_path / "v.csv"
    code, out, _ = run_cli(capsys, "validate", MOE, LLAMA, "--csv", out_csv)
    assert code == 0
    assert [line for line in out.splitlines() if "does not fit" in line] and all(
        line.startswith("moe-16x1b-finetune") for line in out.splitlines() if "does not fit" in line)
    assert "1 measured run predicted not to fit in HBM (a memory-model miss: they ran): moe-16x1b-finetune" in out
    assert {r["scenario"]: r["fits"] for r in csv.DictReader(out_csv.open())} == {"moe-16x1b-finetune": "false"}


def test_validate_counts_a_failing_scenario_and_keeps_going(capsys, monkeypatch, tmp_path):
    second = yaml.safe_load(MOE.read_text())
    second["name"] = "second"
    (tmp_path / "second.yaml").write_text(yaml.safe_dump(second))
    sim = FakeSim(raise_for={"moe-16x1b-finetune": InfeasibleError("does not fit")})
    monkeypatch.setattr(fmsim, "simulate", sim, raising=False)
    monkeypatch.setattr(fmsim.model.flops, "model_flops_per_step", lambda *a, **k: 1e18)
    code, out, _ = run_cli(capsys, "validate", MOE, tmp_path / "second.yaml")
    assert code == 0
    assert (
        "ERROR" in out and "1 scenario raised an error" in out and "compared metrics over 1 scenarios" in out
    )


def test_validate_bad_file_is_exit_2_but_runs_the_good_ones(capsys, fake, monkeypatch, tmp_path):
    monkeypatch.setattr(fmsim.model.flops, "model_flops_per_step", lambda *a, **k: 1e18)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\n")
    code, out, err = run_cli(capsys, "validate", MOE, bad)
    assert code == 2 and "moe-16x1b-finetune" in out and err.splitlines() == [f"{bad}: name: is required"]


# -- lint, app, usage ----------------------------------------------------------------------------


def test_lint_valid_files(capsys):
    code, out, err = run_cli(capsys, "lint", DATA)
    assert code == 0 and "2 of 2 scenario files OK" in out and err == ""


def test_lint_with_set_checks_the_overridden_file(capsys):
    code, _, err = run_cli(capsys, "lint", LLAMA, "--set", "parallelism.dp=3")
    assert code == 2 and err.startswith(f"{LLAMA}: parallelism.dp: ")


SECTION_ERRORS = sorted((Path(__file__).parent / "malformed_sections").glob("*.yaml"))


@pytest.mark.parametrize("path", SECTION_ERRORS, ids=[p.stem for p in SECTION_ERRORS])
@pytest.mark.parametrize("command", ["lint", "run"])
def test_errors_in_a_kinds_own_sections_are_one_located_line(command, path, capsys):
    """``traffic``/``serving``/... are validated by the serving simulator, and ``lint`` asks it too:
    each file starts with its ``# expect-field:`` and ``# expect-message:`` as in tests/malformed."""
    lines = path.read_text().splitlines()
    field, message = (line.split(":", 1)[1].strip() for line in lines[:2])
    code, _, err = run_cli(capsys, command, path)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"{path}: {field}: ") and message in err


def test_app_execs_streamlit_headless_on_the_given_port(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr("os.execv", lambda path, argv: calls.append(argv))
    assert main(["app", "--port", "8600"]) == 0
    argv = calls[0]
    assert "streamlit" in argv and "run" in argv and argv[argv.index("run") + 1].endswith("Home.py")
    assert "8600" in argv and "true" in argv            # --server.port 8600 --server.headless true


def test_app_with_a_bad_port_is_a_one_line_error(capsys):
    code, _, err = run_cli(capsys, "app", "--port", "70000")
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "argv", [[], ["frobnicate"], ["run"], ["catalog", "gadgets"], ["run", "x", "--bogus"]]
)
def test_usage_errors_exit_2(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err


def test_usage_error_is_one_line(capsys):
    assert main(["run", str(LLAMA), "--bogus"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_version_and_help_exit_0(capsys):
    assert main(["--version"]) == 0
    assert main(["--help"]) == 0
    assert "catalog" in capsys.readouterr().out


def test_plugin_subcommands_are_registered_when_their_module_imports(capsys, monkeypatch):
    seen = []

    def add_parser(sub):
        p = sub.add_parser("collective", help="time a collective")
        p.add_argument("op")
        return p

    def run(args):
        seen.append(args.op)
        return 0

    plugin = types.ModuleType("fmsim.cli_collective")
    plugin.add_parser, plugin.run = add_parser, run
    monkeypatch.setitem(sys.modules, "fmsim.cli_collective", plugin)
    assert main(["collective", "all-reduce"]) == 0 and seen == ["all-reduce"]


def test_format_column_uses_the_unit_in_the_name():
    assert format_column("step_time_s", 12.34) == "12.3 s"
    assert format_column("memory_per_gpu_bytes", 80 * 2.0**30) == "80 GiB"
    assert format_column("mfu", 0.4123) == "41.2 %"
    assert format_column("model_tflops_per_gpu", 400.04) == "400.0 TFLOP/s"
    assert format_column("cost_usd", 1234567.891) == "$1,234,567.89"
    assert format_column("usd_per_query", 0.000123) == "$0.000123"
    assert format_column("tokens_per_s", 1.5e6) == "1.5 M/s"
    assert format_column("fits", False) == "no"
    assert format_column("gpus", 16384) == "16,384"
    assert format_column("price_date", "") == "-" and format_column("hfu", None) == "-"
    # a large count held as a float prints with a unit prefix, not in exponent form
    assert format_column("trained_tokens_per_step", 2.6e6) == "2.6 M"
    assert format_column("goodput", 0.9571) == "0.9571"


def test_console_script_module_never_shows_a_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nworkload: {kind: pretrain, model: llama3-70b, seq_len: 10, tp: 3}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "fmsim.cli", "lint", str(bad)],
        check=False,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        (
            f"{bad}: workload.tp: unknown key 'tp' (known: attention_dropout, attention_kernel, cross_entropy, "
            "cuda_graphs, fp8_attention, fp8_recipe, global_batch, global_batch_tokens, hidden_dropout, kernel_fusion, kind, lora, micro_batch, model, moe_capacity_factor, "
            "moe_imbalance, "
            "moe_pad_to_capacity, moe_routing, precision, seq_len, train_tokens)"
        )
    ]


def test_run_shows_the_host_memory_of_offloaded_activations(capsys):
    path = Path(__file__).resolve().parent.parent / "scenarios" / "validation" / "training" / "mb2511-gb200-02.yaml"
    code, out, _ = run_cli(capsys, "run", path)
    assert code == 0
    block = out.split("host memory (activation offload, 40 layers)", 1)[1].splitlines()[1:4]
    assert [line.split()[0:2] for line in block] == [["per", "GPU"], ["per", "node"], ["node", "has"]]
    assert "comm_offload" in out
