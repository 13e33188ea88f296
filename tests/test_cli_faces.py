"""The command line as scripts and CI jobs use it (issue 31, items 11, 13-17): the explorer bound to
localhost, no traceback for hostile paths and files, exit codes, machine-readable stdout,
progress and clean shutdown of worker processes, and lint agreeing with run."""

import sys
from pathlib import Path

import pytest

from fmsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
LLAMA = DATA / "llama3-70b-p5.yaml"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


# -- 11: fmsim app listens on this machine only unless told otherwise ---------------------------


def _app_argv(monkeypatch, *extra) -> dict[str, str]:
    calls = []
    monkeypatch.setattr("os.execv", lambda path, argv: calls.append(argv))
    assert main(["app", *extra]) == 0
    argv = calls[0]
    return dict(zip(argv[5::2], argv[6::2]))


def test_app_binds_to_localhost_by_default(monkeypatch):
    opts = _app_argv(monkeypatch)
    assert opts["--server.address"] == "127.0.0.1"


def test_app_address_option_overrides_the_default(monkeypatch):
    opts = _app_argv(monkeypatch, "--address", "0.0.0.0", "--port", "8700")
    assert opts["--server.address"] == "0.0.0.0" and opts["--server.port"] == "8700"


# -- 13: no traceback for hostile output paths, NUL bytes, over-long names ----------------------


class _TraceSim:
    """fmsim.simulate stand-in that writes its trace as the real one does (a file at trace_path)."""

    def __init__(self):
        self.paths: list[str] = []

    def __call__(self, sc, trace_path=None, **kw):
        from fmsim.results import Result

        if trace_path is not None:
            Path(trace_path).write_text("{}")
            self.paths.append(trace_path)
        return Result(scenario=sc.name, kind=sc.workload.kind, instance=sc.cluster.instance.name,
                      nodes=sc.cluster.nodes, gpus=sc.cluster.gpus, usd_per_hour=1.0, price_date="",
                      metrics={"step_time_s": 1.0, "fits": True})


@pytest.fixture
def trace_sim(monkeypatch):
    import fmsim

    sim = _TraceSim()
    monkeypatch.setattr(fmsim, "simulate", sim, raising=False)
    return sim


@pytest.mark.parametrize("where", ["missing-folder", "directory", "file-as-folder"])
def test_trace_into_a_bad_path_is_one_line_exit_2(capsys, tmp_path, trace_sim, where):
    (tmp_path / "plain").write_text("x")
    path = {"missing-folder": tmp_path / "nope" / "t.json", "directory": tmp_path,
            "file-as-folder": tmp_path / "plain" / "t.json"}[where]
    code, out, err = run_cli(capsys, "run", LLAMA, "--trace", path)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"{path}: cannot write the trace: ")
    assert trace_sim.paths == []          # refused before any simulation ran


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs a read-only file (Linux /proc)")
def test_trace_onto_a_read_only_file_is_one_line_exit_2(capsys, trace_sim):
    code, _, err = run_cli(capsys, "run", LLAMA, "--trace", "/proc/version")
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("/proc/version: cannot write the trace")


def test_csv_and_json_into_a_missing_folder_fail_before_simulating(capsys, tmp_path, trace_sim):
    for opt in ("--csv", "--json"):
        code, _, err = run_cli(capsys, "run", LLAMA, opt, tmp_path / "nope" / "x")
        assert code == 2 and len(err.splitlines()) == 1 and "does not exist" in err
    code, _, err = run_cli(capsys, "validate", LLAMA, "--csv", tmp_path / "nope" / "x")
    assert code == 2 and len(err.splitlines()) == 1


def test_a_file_holding_nul_bytes_is_one_located_line_from_lint_and_run(capsys, tmp_path):
    bad = tmp_path / "nul.yaml"
    bad.write_bytes(b"version: 1\nname: x\x00y\n")
    for command in ("lint", "run"):
        code, _, err = run_cli(capsys, command, bad)
        assert code == 2 and err.splitlines() == [f"{bad}: line 2, column 8: a NUL byte (expected a YAML text file)"]


def test_yaml_text_with_a_control_character_is_a_config_error():
    from fmsim.errors import ConfigError
    from fmsim.scenario import load_yaml_text

    with pytest.raises(ConfigError, match="invalid YAML: unacceptable character"):
        load_yaml_text("a: b\x07", file="x.yaml")


def test_over_long_scenario_names_are_shortened_in_trace_file_names(capsys, tmp_path, trace_sim):
    text = LLAMA.read_text()
    names = ["a" * 300 + "-one", "a" * 300 + "-two"]
    files = []
    for i, name in enumerate(names):
        f = tmp_path / f"s{i}.yaml"
        f.write_text(text.replace("name: ", f"name: {name}\n# was: ", 1))
        files.append(f)
    code, _, err = run_cli(capsys, "run", *files, "--trace", tmp_path / "t.json")
    assert code == 0, err
    written = [Path(p).name for p in trace_sim.paths]
    assert len(set(written)) == 2 and all(len(n) <= 100 for n in written)
    assert all((tmp_path / n).is_file() for n in written)


# -- 14: exit codes a CI job can rely on -----------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "validate", "lint", "run"])
def test_a_folder_with_no_scenario_is_exit_2(capsys, tmp_path, command):
    (tmp_path / "notes.txt").write_text("not a scenario")
    code, out, err = run_cli(capsys, command, tmp_path)
    assert code == 2 and err.splitlines() == [f"{tmp_path}: no scenario files found (expected *.yaml files)"]


def test_run_of_a_plan_that_does_not_fit_exits_3_and_keeps_its_csv_row(capsys, tmp_path):
    out_csv = tmp_path / "o.csv"
    code, out, err = run_cli(capsys, "run", LLAMA, "--estimate", "--set", "parallelism.tp=1",
                             "--set", "parallelism.pp=1", "--csv", out_csv)
    assert code == 3, err
    assert len(err.splitlines()) == 1 and err.startswith(f"{LLAMA}: does not fit: ")
    import csv

    (row,) = csv.DictReader(out_csv.open())
    assert row["fits"] == "false" and float(row["step_time_s"]) > 0


def test_run_of_a_serving_plan_missing_its_slo_exits_3(capsys, tmp_path):
    path = ROOT / "scenarios" / "examples" / "serving-llama3.1-8b-g6e.yaml"
    code, _, err = run_cli(capsys, "run", path, "--estimate", "--set", "slo.ttft_p99=1 ms")
    assert code == 3 and err.splitlines() == [f"{path}: misses its SLO (slo_met false: see the latency figures)"]
    assert run_cli(capsys, "run", path, "--estimate")[0] == 0


def test_bad_input_outranks_an_infeasible_plan(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\n")
    code, _, _ = run_cli(capsys, "run", LLAMA, bad, "--estimate", "--set", "parallelism.tp=1",
                         "--set", "parallelism.pp=1")
    assert code == 2


def test_the_quick_start_example_runs_with_exit_0(capsys):
    assert run_cli(capsys, "run", ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml", "--estimate")[0] == 0


# -- 15: with --csv - or --json -, stdout holds only that output ---------------------------------


def test_run_csv_to_stdout_holds_only_the_csv(capsys):
    import csv
    import io

    code, out, err = run_cli(capsys, "run", LLAMA, "--estimate", "--csv", "-")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert len(rows) == 2 and rows[0][0] == "scenario" and rows[1][0] == "llama3-70b-pretrain-p5"
    assert "== llama3-70b-pretrain-p5" in err and "breakdown" in err       # the report went to stderr


def test_run_json_to_stdout_holds_only_the_json(capsys):
    import json

    code, out, err = run_cli(capsys, "run", LLAMA, "--estimate", "--json", "-")
    assert code == 0
    (doc,) = json.loads(out)
    assert doc["scenario"] == "llama3-70b-pretrain-p5" and "== llama3-70b-pretrain-p5" in err


def test_run_to_files_keeps_the_report_on_stdout(capsys, tmp_path):
    code, out, err = run_cli(capsys, "run", LLAMA, "--estimate", "--csv", tmp_path / "o.csv")
    assert code == 0 and "== llama3-70b-pretrain-p5" in out and err == ""


def test_csv_and_json_both_on_stdout_is_refused(capsys):
    code, out, err = run_cli(capsys, "run", LLAMA, "--estimate", "--csv", "-", "--json", "-")
    assert code == 2 and out == "" and len(err.splitlines()) == 1


def test_validate_csv_to_stdout_holds_only_the_csv(capsys):
    import csv
    import io

    path = ROOT / "scenarios" / "validation" / "training" / "mb2511-gb200-02.yaml"
    code, out, err = run_cli(capsys, "validate", path, "--estimate", "--csv", "-", "-j", "1")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows and all(r["scenario"] for r in rows) and "median |error|" in err


# -- 16: progress on stderr when asked; SIGTERM stops the worker processes too -------------------

_SLOW_VALIDATE = """
import os, sys, time
import fmsim, fmsim.cli

def slow(sc, **kw):          # a scenario that takes long: the workers are busy when SIGTERM comes
    open(os.path.join(os.environ["MARKS"], str(os.getpid())), "w").close()
    time.sleep(120)

fmsim.simulate = slow
sys.exit(fmsim.cli.main(["validate", *sys.argv[1:], "-j", "2"]))
"""


def _children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(x) for x in text.split()}


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    state = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("State:")), "X")
    return state not in ("Z", "X")          # a zombie has stopped; only its parent's reaping is left


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads child processes from Linux /proc")
def test_sigterm_stops_the_worker_processes_of_validate(tmp_path):
    import signal
    import subprocess
    import time

    paths = [ROOT / "scenarios" / "validation" / "training" / "mb2511-gb200-02.yaml",
             ROOT / "scenarios" / "validation" / "inference" / sorted(
                 p.name for p in (ROOT / "scenarios" / "validation" / "inference").glob("*.yaml"))[0]]
    # -c: this checkout's fmsim comes first on sys.path (cwd), as in the other subprocess tests
    marks = tmp_path / "marks"
    marks.mkdir()
    import os

    proc = subprocess.Popen([sys.executable, "-c", _SLOW_VALIDATE, *map(str, paths)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "MARKS": str(marks)})
    try:
        workers: set[int] = set()
        for _ in range(600):                    # until both workers run a scenario (at most a minute)
            workers = _children(proc.pid)
            if len(list(marks.iterdir())) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert len(workers) >= 2 and {int(p.name) for p in marks.iterdir()} <= workers, workers
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, err
        for _ in range(100):
            if not any(_alive(w) for w in workers):
                break
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_progress_bar_goes_to_stderr_only_when_asked(capsys):
    examples = [ROOT / "scenarios" / "examples" / n for n in ("llama3-70b-p5.yaml", "gpt3-175b-p4d.yaml")]
    code, out, err = run_cli(capsys, "check", *examples, "--estimate", "-j", "1", "--progress")
    assert "2/2" in err and "scenario" in err and "2/2" not in out       # tqdm's bar, on stderr
    code2, out2, err2 = run_cli(capsys, "check", *examples, "--estimate", "-j", "1")
    assert (code2, out2) == (code, out) and err2 == ""     # stderr is no terminal here: no bar


# -- 17: lint catches what run rejects ------------------------------------------------------------

_RUN_REJECTS = ["interleaved_microbatches_not_multiple_of_pp", "sequence_parallel_seq_len_not_divisible_by_tp",
                "inline_model_head_dim_not_whole"]


@pytest.mark.parametrize("stem", _RUN_REJECTS)
def test_lint_and_run_give_the_same_one_located_line(capsys, stem):
    path = Path(__file__).parent / "malformed" / f"{stem}.yaml"
    field = path.read_text().splitlines()[0].split(":", 1)[1].strip()
    lint = run_cli(capsys, "lint", path)
    run = run_cli(capsys, "run", path, "--estimate")
    assert lint[0] == run[0] == 2
    assert len(run[2].splitlines()) == 1 and run[2].startswith(f"{path}: {field}: ")
    assert lint[2] == run[2]


def test_set_with_an_empty_value_is_refused_by_lint_and_run(capsys):
    for command in ("lint", "run"):
        code, _, err = run_cli(capsys, command, LLAMA, "--set", "parallelism.tp=")
        assert code == 2 and err.splitlines() == [
            "--set: parallelism.tp: 'parallelism.tp=' has no value (expected parallelism.tp=VALUE; write "
            "parallelism.tp=null to drop the field, or parallelism.tp=\"\" for an empty string)"]


def test_an_inline_model_with_an_explicit_head_dim_may_have_any_hidden(capsys, tmp_path):
    text = (Path(__file__).parent / "malformed" / "inline_model_head_dim_not_whole.yaml").read_text()
    ok = tmp_path / "ok.yaml"
    ok.write_text(text.replace("    heads: 3\n", "    heads: 3\n    head_dim: 128\n"))
    assert run_cli(capsys, "lint", ok)[0] == 0
