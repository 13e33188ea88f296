"""The CLI's search faces never show a plan that cannot run as asked as a winner: a per-instance best the
discrete-event re-check finds missing the goal is marked in the report and not written by ``--yaml-dir``,
and a plan over memory never ranks, wins or makes the frontier (``fmsim.search.rank``)."""
from __future__ import annotations

import dataclasses

import fmsim
import fmsim.api
from fmsim.cli import main
from fmsim.search.rank import Ranked, goal_order, pareto_frontier

EXAMPLE = "scenarios/examples/llama3-70b-p5.yaml"
NARROW = ["--tp", "4,8", "--pp", "2,4", "--vpp", "1", "--micro-batch", "1", "--zero", "1",
          "--recompute", "selective", "--no-cache", "-j", "1", "--no-progress"]


def test_winners_the_simulation_refutes_are_marked_and_not_written(monkeypatch, tmp_path, capsys):
    sc = fmsim.load_scenario(EXAMPLE)
    found = fmsim.search(sc, nodes=(8,), top=0, jobs=1, cache_dir=False,
                         axes={"tp": (4, 8), "pp": (2, 4), "vpp": (1,), "micro_batch": (1,), "zero": (1,),
                               "recompute": ("selective",)})
    times = [r.time_s for r in found.ordered]
    assert times and max(times) / min(times) < 100
    deadline_days = 1.01 * max(times) / 86400          # every plan meets it by the estimate

    real = fmsim.api.simulate

    def slow(s, **kw):   # a simulation that finds every plan 1000x slower than the estimate
        res = real(s, **kw)
        m = dict(res.metrics)
        for k in ("step_time_s", "time_to_train_s"):
            m[k] = m[k] * 1000
        return dataclasses.replace(res, metrics=m)

    monkeypatch.setattr(fmsim.api, "simulate", slow)
    out_dir = tmp_path / "winners"
    rc = main(["search", EXAMPLE, "--nodes", "8", "--deadline", f"{deadline_days:.6f}d", "--top", "1",
               "--yaml-dir", str(out_dir), *NARROW])
    text = capsys.readouterr().out
    assert rc == 0
    assert "winner: none of the re-checked plans meets the goal when simulated" in text
    best = text.split("best per instance type")[1].split("re-checked")[0]
    lines = [ln for ln in best.splitlines()[1:] if ln.strip()]
    assert lines and all("[misses the goal when simulated: no winner]" in ln for ln in lines)
    assert list(out_dir.glob("*.yaml")) == []           # no refuted plan written as a runnable winner
    assert "wrote 0 scenario file(s)" in text


def test_a_plan_over_memory_never_ranks_wins_or_makes_the_frontier():
    fast_oom = Ranked(("a",), {"time_to_train_s": 1.0, "cost_usd": 1.0, "fits": False, "instance": "x"}, "")
    ok = Ranked(("b",), {"time_to_train_s": 2.0, "cost_usd": 2.0, "fits": True, "instance": "x"}, "")
    assert goal_order([fast_oom, ok]) == [ok]
    assert goal_order([fast_oom, ok], deadline_s=10.0) == [ok]
    assert pareto_frontier([fast_oom, ok]) == [ok]


def test_a_scenario_name_that_a_spreadsheet_would_run_is_written_as_text(tmp_path, capsys):
    """CSV injection: the budgeting sheet opens the CSV, and a name is the user's own text."""
    import csv

    out = tmp_path / "run.csv"
    rc = main(["run", EXAMPLE, "--estimate", "--set", """name='=HYPERLINK("http://x","y")'""", "--csv", str(out)])
    capsys.readouterr()
    assert rc == 0
    with out.open() as fh:
        row = next(csv.DictReader(fh))
    assert row["scenario"] == "'=HYPERLINK(\"http://x\",\"y\")" and row["step_time_s"][0].isdigit()
    from fmsim.export import csv_cell

    assert [csv_cell(v) for v in ("+1", "-x", "@a", "\tb", "plain", -1.5, -2)] == \
        ["'+1", "'-x", "'@a", "'\tb", "plain", "-1.5", "-2"]     # numbers stay numbers
