"""``fmsim search``: its report, CSV, winners as scenario files, one-line errors, clean stop on SIGTERM."""
from __future__ import annotations

import csv
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fmsim
from fmsim.cli import main
from fmsim.scenario import load_scenario

EXAMPLE = "scenarios/examples/llama3-70b-p5.yaml"
NARROW = ["--tp", "4,8", "--pp", "2,4", "--vpp", "1,2", "--micro-batch", "1", "--zero", "1",
          "--recompute", "selective,full", "--no-cache", "-j", "1"]
ROOT = Path(__file__).resolve().parent.parent


def test_search_prints_frontier_winners_and_writes_csv_and_scenarios(tmp_path, capsys):
    out_csv, out_dir = tmp_path / "plans.csv", tmp_path / "winners"
    rc = main(["search", EXAMPLE, "--instances", "p5.48xlarge,p5en.48xlarge", "--nodes", "8..16",
               "--deadline", "3000d", "--top", "1", "--csv", str(out_csv), "--yaml-dir", str(out_dir),
               *NARROW])
    text = capsys.readouterr().out
    assert rc == 0
    for part in ("frontier, time to train against cost", "best per instance type", "p5.48xlarge x",
                 "p5en.48xlarge x", "re-checked by the discrete-event simulation", "winner (simulated):"):
        assert part in text
    with out_csv.open() as fh:
        rows = list(csv.DictReader(fh))
    header = (ROOT / "tests/golden/training_csv_header.txt").read_text().strip()
    assert ",".join(rows[0].keys()) == header          # the columns of fmsim run --csv
    assert {r["instance"] for r in rows} == {"p5.48xlarge", "p5en.48xlarge"}
    files = sorted(out_dir.glob("*.yaml"))
    assert files
    by_name = {r["scenario"]: r for r in rows}
    for f in files:     # round trip: each winner loads and gives the numbers the search printed
        sc = load_scenario(f)
        res = fmsim.estimate(sc)
        par = sc.parallelism
        plan = (sc.cluster.instance.name, str(sc.cluster.nodes), str(par.tp), str(par.pp), str(par.vpp),
                par.recompute, sc.pricing.option)
        match = [r for r in rows if (r["instance"], r["nodes"], r["tp"], r["pp"], r["vpp"], r["recompute"],
                                     r["pricing_option"]) == plan]
        assert len(match) == 1, f
        assert float(match[0]["step_time_s"]) == pytest.approx(res.metrics["step_time_s"], rel=1e-12)
        assert float(match[0]["cost_usd"]) == pytest.approx(res.metrics["cost_usd"], rel=1e-12)
    assert by_name   # rows name the base scenario


def test_an_instance_type_that_misses_the_goal_gets_its_nearest_plan(capsys):
    """With a deadline one instance type meets and the other does not, the report still names both: the
    winner of one, and the fastest plan of the other with "none meets the goal"."""
    sc = load_scenario(EXAMPLE)
    res = fmsim.search(sc, instances=("p5.48xlarge", "p6-b200.48xlarge"), nodes=(8,), top=0, cache_dir=False,
                       jobs=1, axes={"tp": (4, 8), "pp": (2, 4), "vpp": (1,), "micro_batch": (1,),
                                     "zero": (1,), "recompute": ("selective",)})
    fastest = {i: min(r.time_s for r in res.ranked if r.row["instance"] == i) for i in res.space.instance}
    assert fastest["p6-b200.48xlarge"] < fastest["p5.48xlarge"]
    days = (fastest["p6-b200.48xlarge"] + fastest["p5.48xlarge"]) / 2 / 86400
    rc = main(["search", EXAMPLE, "--instances", "p5.48xlarge,p6-b200.48xlarge", "--nodes", "8",
               "--tp", "4,8", "--pp", "2,4", "--vpp", "1", "--micro-batch", "1", "--zero", "1",
               "--recompute", "selective", "--deadline", f"{days:.0f}d", "--top", "0", "--no-cache",
               "-j", "1"])
    text = capsys.readouterr().out
    assert rc == 0
    best = text.split("best per instance type", 1)[1].split("winner", 1)[0]
    assert "p6-b200.48xlarge x8" in best
    assert "p5.48xlarge: none meets the goal; fastest: p5.48xlarge x8" in best


def test_no_plan_meeting_the_goal_names_the_nearest_per_instance_type(capsys):
    """A deadline no plan meets: the report says so, names each instance type's fastest plan, and points at
    the held global batch (the scenario's alone unless --global-batch asks for more)."""
    rc = main(["search", EXAMPLE, "--instances", "p5.48xlarge,p6-b200.48xlarge", "--nodes", "8",
               "--deadline", "1d", "--top", "0", *NARROW])
    text = capsys.readouterr().out
    assert rc == 0
    tail = text.split("no plan meets the goal", 1)[1]
    assert "--global-batch 128,256,512" in tail and "128 sequences" in tail
    for inst in ("p5.48xlarge", "p6-b200.48xlarge"):
        assert f"{inst}: none meets the goal; fastest: {inst} x8" in tail
    assert "(estimate; 1 plans" not in text


def test_progress_bar_and_csv_on_stdout(capsys):
    rc = main(["search", EXAMPLE, "--nodes", "8", "--top", "0", "--progress", "--csv", "-", *NARROW])
    cap = capsys.readouterr()
    assert rc == 0
    assert "plan/s" in cap.err or "s/plan" in cap.err          # tqdm's rate, on stderr
    assert "frontier, time to train against cost" in cap.err    # the report moves aside for the CSV
    header = (ROOT / "tests/golden/training_csv_header.txt").read_text().strip()
    assert cap.out.splitlines()[0] == header


@pytest.mark.parametrize("argv, needle", [
    (["--nodes", "16..8"], "--nodes"),
    (["--nodes", "eight"], "--nodes"),
    (["--instances", "p5.48xlarg"], "did you mean 'p5.48xlarge'"),
    (["--pricing", "spot"], "--pricing"),
    (["--deadline", "soon"], "--deadline"),
    (["--budget", "lots"], "--budget"),
    (["--tp", "0"], "--tp"),
    (["--zero", "4"], "--zero"),
    (["--recompute", "some"], "--recompute"),
    (["--dask", "local:zero"], "--dask"),
    (["-j", "0"], "-j"),
    (["--set", "workload.train_tokens=null"], "train_tokens"),
])
def test_bad_arguments_exit_2_with_one_line(argv, needle, capsys):
    rc = main(["search", EXAMPLE, "--no-cache", "--top", "0", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_serving_scenario_is_refused_with_a_pointer(capsys):
    rc = main(["search", "scenarios/examples/serving-llama3.1-8b-g6e.yaml", "--no-cache"])
    err = capsys.readouterr().err
    assert rc == 2 and "plan-capacity" in err and len(err.strip().splitlines()) == 1


def _children(pid: int) -> list[int]:
    """Live children of ``pid``, but multiprocessing's resource tracker (it ends with its parent)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"resource_tracker" not in cmd:
                out.append(int(entry))
    return out


def _cached(directory: Path) -> int:
    """Records in the result cache at ``directory`` (the search is under way once there are some)."""
    import sqlite3

    from fmsim.search.cache import FILE_NAME

    try:
        with sqlite3.connect(f"file:{directory / FILE_NAME}?mode=ro", uri=True, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    except sqlite3.Error:
        return 0


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("executor, stop", [
    (["-j", "2"], "SIGTERM to the search"),
    pytest.param(["--dask", "local:2"], "Ctrl-C to the process group",
                 marks=pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="no dask")),
])
def test_stopping_the_search_leaves_no_worker(tmp_path, executor, stop):
    """SIGTERM mid-search (once it has cached some plans), or Ctrl-C (a terminal's SIGINT reaches every
    process of the group, the workers too): exit 130, one note on stderr, no worker process left behind."""
    cmd = [sys.executable, "-m", "fmsim.cli", "search", EXAMPLE, "--instances",
           "p5.48xlarge,p5en.48xlarge,p6-b200.48xlarge", "--nodes", "8..1024", "--pp", "1,2,3,4,5,6,8,10,16",
           "--cache", str(tmp_path), "--top", "0", "--no-progress", *executor]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        kids: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None:
            if len(kids) >= 2 and _cached(tmp_path):
                break
            time.sleep(0.1)
            kids = _children(proc.pid)
        assert len(kids) >= 2 and _cached(tmp_path), "the search never got going"
        if stop.startswith("SIGTERM"):
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "search stopped" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    time.sleep(0.2)
    assert not [k for k in kids if _alive(k)]
