"""The global batch as an axis of the training plan search (issue 29): the scenario's value by default, a
list with ``--global-batch`` / ``axes={"global_batch": ...}``; a batch the plan cannot split refused by the
reader's own rule; carried by the plan key, the cache, the CSV, the winners' files and the report."""
from __future__ import annotations

import csv
import dataclasses

import pytest

import fmsim
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.scenario import load_scenario
from fmsim.search.space import AXES, plan_dict

EXAMPLE = "scenarios/examples/llama3-70b-p5.yaml"        # global_batch 128, 8 p5.48xlarge
SMALL = {"tp": (4, 8), "pp": (2, 4), "vpp": (1,), "micro_batch": (1,), "zero": (1,),
         "recompute": ("selective",)}
NARROW = ["--tp", "4,8", "--pp", "2,4", "--vpp", "1", "--micro-batch", "1", "--zero", "1",
          "--recompute", "selective", "-j", "1"]


@pytest.fixture(scope="module")
def sc():
    return load_scenario(EXAMPLE)


def _search(sc, gb=None, **kw):
    axes = dict(SMALL) if gb is None else {**SMALL, "global_batch": gb}
    return fmsim.search(sc, nodes=(8,), top=0, jobs=1, cache_dir=kw.pop("cache_dir", False), axes=axes, **kw)


def test_default_axis_is_the_scenario_s_batch_and_gives_the_explicit_single_value_s_records(sc):
    default = _search(sc)
    explicit = _search(sc, (sc.workload.global_batch,))
    assert default.space.global_batch == (128,)
    assert AXES[-1] == "global_batch"
    assert default.records == explicit.records
    assert {plan_dict(k)["global_batch"] for k, _ in default.records} == {128}
    assert all(rec["row"]["global_batch"] == 128 for _, rec in default.records if "row" in rec)


def test_each_batch_is_searched_and_the_best_plan_is_the_best_of_all_evaluated(sc):
    batches = (128, 256, 512)
    res = _search(sc, batches)
    assert len(res.records) == 3 * len(_search(sc).records)
    seen = {plan_dict(k)["global_batch"] for k, rec in res.records if rec["status"] == "ok"}
    assert seen == set(batches)
    for key, rec in res.records:
        if "row" in rec:
            row = rec["row"]
            assert row["global_batch"] == key[-1]
            # time to train keeps its meaning: the tokens over the tokens per second (a larger batch, fewer steps)
            assert row["time_to_train_s"] * row["tokens_per_s"] * row["goodput"] == \
                pytest.approx(sc.workload.train_tokens, rel=1e-9)
    best = res.ordered[0]
    assert all(best.time_s <= r.time_s for r in res.ranked)
    # the wider search's best is the best of the single-batch searches'
    singles = [_search(sc, (gb,)).ordered[0].time_s for gb in batches]
    assert best.time_s == min(singles)
    cheap = fmsim.search(sc, nodes=(8,), top=0, jobs=1, cache_dir=False, deadline_s=10 * best.time_s,
                         axes={**SMALL, "global_batch": batches})
    assert all(cheap.ordered[0].cost <= r.cost for r in cheap.ranked if r.time_s <= 10 * best.time_s)


def test_a_batch_the_plan_cannot_split_is_refused_by_the_reader_s_rule(sc):
    """100 sequences over dp 8 (tp 8, pp 1 on 64 GPUs): refused as "rule" before costing, and refused by
    the reader and by fmsim.estimate when that plan is run on its own."""
    res = fmsim.search(sc, nodes=(8,), top=0, jobs=1, cache_dir=False,
                       axes={**SMALL, "tp": (8,), "pp": (1,), "global_batch": (100, 128)})
    recs = {plan_dict(k)["global_batch"]: rec for k, rec in res.records}
    bad = recs[100]
    assert bad["status"] == "rule" and bad["field"] == "workload.global_batch"
    assert "not divisible by dp*micro_batch" in bad["reason"] and "row" not in bad
    assert recs[128]["status"] in ("ok", "memory")
    plan = {"parallelism.tp": 8, "parallelism.pp": 1, "parallelism.vpp": 1, "workload.micro_batch": 1,
            "parallelism.zero": 1, "parallelism.recompute": "selective", "parallelism.dp": "auto",
            "parallelism.schedule": "1f1b", "parallelism.dp_shard": "auto"}
    with pytest.raises(ConfigError) as loaded:
        load_scenario(EXAMPLE, overrides={**plan, "workload.global_batch": 100})
    assert loaded.value.message == bad["reason"]
    good = load_scenario(EXAMPLE, overrides={**plan, "workload.global_batch": 128})
    variant = dataclasses.replace(good, workload=dataclasses.replace(good.workload, global_batch=100))
    with pytest.raises(ConfigError, match="global_batch"):
        fmsim.estimate(variant)


def test_resuming_from_the_cache_gives_the_same_frontier(sc, tmp_path):
    first = _search(sc, (128, 256), cache_dir=tmp_path)
    again = _search(sc, (128, 256), cache_dir=tmp_path)
    assert again.cached == len(again.records) and first.cached == 0
    assert again.records == first.records
    assert [(r.key, r.row) for r in again.frontier] == [(r.key, r.row) for r in first.frontier]
    wider = _search(sc, (128, 256, 512), cache_dir=tmp_path)
    assert wider.cached == len(first.records)            # only the new batch is costed
    fresh = _search(sc, (128, 256, 512))
    assert [(r.key, r.row) for r in wider.frontier] == [(r.key, r.row) for r in fresh.frontier]


@pytest.mark.parametrize("text", ["0", "abc", "128,-4", "1.5", ","])
def test_a_bad_global_batch_exits_2_with_one_line(text, capsys):
    rc = main(["search", EXAMPLE, "--no-cache", "--top", "0", "--global-batch", text])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "--global-batch" in err and "Traceback" not in err


@pytest.mark.parametrize("values", [(0,), (128, True), ("128",), (12.5,)])
def test_a_bad_global_batch_through_the_api_is_a_config_error(sc, values):
    with pytest.raises(ConfigError, match="--global-batch"):
        _search(sc, values)


def test_winners_carry_their_global_batch_to_csv_report_and_scenario_files(tmp_path, capsys):
    out_csv, out_dir = tmp_path / "plans.csv", tmp_path / "winners"
    rc = main(["search", EXAMPLE, "--nodes", "8", "--global-batch", "128,512", "--top", "1", "--no-cache",
               "--csv", str(out_csv), "--yaml-dir", str(out_dir), *NARROW])
    text = capsys.readouterr().out
    assert rc == 0
    assert "x 2 global batches" in text
    winner = text.split("winner (simulated):", 1)[1]
    assert " gb128 " in winner or " gb512 " in winner
    with out_csv.open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["global_batch"] for r in rows} == {"128", "512"}
    files = sorted(out_dir.glob("*.yaml"))
    assert files
    for f in files:     # each winner's file holds its batch, and re-runs to the search's estimate
        won = load_scenario(f)
        gb = won.workload.global_batch
        assert f"-gb{gb}-" in f.name
        res = fmsim.estimate(won)
        par = won.parallelism
        match = [r for r in rows if (r["tp"], r["pp"], r["global_batch"], r["pricing_option"]) ==
                 (str(par.tp), str(par.pp), str(gb), won.pricing.option)]
        assert len(match) == 1, f
        assert float(match[0]["step_time_s"]) == pytest.approx(res.metrics["step_time_s"], rel=1e-12)
        assert float(match[0]["time_to_train_s"]) == pytest.approx(res.metrics["time_to_train_s"], rel=1e-12)


def test_no_plan_meeting_the_goal_points_at_the_global_batch_flag(capsys):
    rc = main(["search", EXAMPLE, "--nodes", "8", "--deadline", "1d", "--top", "0", "--no-cache", *NARROW])
    held = capsys.readouterr().out.split("no plan meets the goal", 1)[1]
    assert rc == 0 and "--global-batch 128,256,512 tries others" in held
    rc = main(["search", EXAMPLE, "--nodes", "8", "--deadline", "1d", "--top", "0", "--no-cache",
               "--global-batch", "128,2048", *NARROW])
    tried = capsys.readouterr().out.split("no plan meets the goal", 1)[1]
    assert rc == 0 and "global batches tried: 128, 2,048 sequences" in tried

