"""The analytical estimate (what plan search ranks by) against the discrete-event simulation it stands in
for (what the search re-checks its best plans with): over a fixed, small corpus of search variants, the
step times agree within today's measured worst plus a small margin, by plan family, and the estimate's
best plan of a candidate set is among the simulation's best few.

Figures measured on this corpus (estimate / simulate - 1; bench/estimate_vs_des.py measures a larger
one): see ``BOUNDS``. Before the estimate mirrored the engine's ZeRO-3 pipeline (shared links, every
stage's slowed tasks, the pipeline's waits), the Llama 3 70B ZeRO-3 plans on 1,024 p5 nodes were 14-22 %
short of the simulation.
"""
from __future__ import annotations

import functools
import random
import statistics
from pathlib import Path

import pytest

import fmsim
from fmsim.parallel.strategy import build_plan
from fmsim.search.evaluate import Evaluator
from fmsim.search.space import candidates, default_space
from fmsim.workloads.pretrain import estimate_step, simulate_folded

EXAMPLES = Path(__file__).resolve().parent.parent / "scenarios" / "examples"
INSTANCES = ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "p4d.24xlarge")
NODES = (8, 32, 128, 512, 1024)
BASES = ("gpt-oss-120b-p5", "gpt3-175b-p4d", "llama3-70b-p5", "llama3-70b-hsdp-p5", "llama3.1-405b-p5en",
         "mixtral-8x22b-p6-b200")
PER_BASE = 6
#: tasks per stage the simulation may replay for a corpus plan (keeps the file to seconds)
MAX_TASKS = 96

#: family -> (median |error| bound, worst |error| bound): measured + a small margin. Measured on this
#: corpus (36 plans), median / worst |error| in %: all 0.29 / 5.2; zero0 0.29 / 5.2; zero1 0.35 / 2.5;
#: zero3 0.21 / 2.3; pp>1 0.38 / 5.2; vpp>1 1.7 / 5.2; cp>1 0.23 / 5.2; ep>1 1.3 / 5.2 (the worst: Mixtral
#: 8x22B tp1 pp8 vpp2 cp2 ep8 ZeRO-0, m 2). Before the estimate mirrored the engine (main @ df3873b): all
#: 1.6 / 16.0; zero3 1.8 / 16.0; zero1 1.3 / 8.8; zero0 0.8 / 8.9.
BOUNDS = {
    "all": (0.006, 0.065),
    "zero0": (0.008, 0.065),
    "zero1": (0.008, 0.035),
    "zero3": (0.006, 0.035),
    "pp>1": (0.008, 0.065),
    "vpp>1": (0.025, 0.065),
    "cp>1": (0.006, 0.065),
    "ep>1": (0.02, 0.065),
}


def families(plan) -> list[str]:
    fam = ["all", f"zero{min(plan.zero, 3)}"]
    for name, on in (("pp>1", plan.pp > 1), ("vpp>1", plan.vpp > 1), ("cp>1", plan.cp > 1),
                     ("ep>1", plan.ep > 1)):
        if on:
            fam.append(name)
    return fam


def error(plan) -> float:
    est = estimate_step(plan)[0]
    sim = simulate_folded(plan, record=False)[0]
    return est / sim - 1.0


@functools.lru_cache(maxsize=None)
def evaluator(base: str) -> Evaluator:
    return Evaluator(fmsim.load_scenario(EXAMPLES / f"{base}.yaml"))


def fitting_plans(base: str, keys) -> list:
    """The plans of ``keys`` the reader accepts and the memory model fits, as the search derives them."""
    ev = evaluator(base)
    out = []
    for key in keys:
        try:
            sc = ev.variant(key)
            res = fmsim.estimate(sc)
        except fmsim.FmsimError:
            continue
        if res.metrics["fits"]:
            out.append((key, build_plan(sc)))
    return out


@functools.lru_cache(maxsize=None)
def corpus() -> tuple:
    """PER_BASE fitting plans per base scenario, drawn (seeded) from the space the search enumerates, with
    ZeRO 0 and context parallelism added; plans whose simulation replays many tasks are skipped."""
    plans = []
    for i, base in enumerate(BASES):
        sc = evaluator(base).base
        space = default_space(sc, instances=INSTANCES, nodes=NODES, zero=(0, 1, 3), cp=(1, 2))
        keys = list(candidates(space, moe=sc.workload.model.moe is not None))
        random.Random(i).shuffle(keys)
        kept = 0
        for start in range(0, len(keys), 16):
            for key, plan in fitting_plans(base, keys[start:start + 16]):
                if kept < PER_BASE and 2 * plan.num_microbatches * plan.vpp <= MAX_TASKS:
                    plans.append((base, key, plan))
                    kept += 1
            if kept >= PER_BASE:
                break
    return tuple(plans)


@functools.lru_cache(maxsize=None)
def corpus_errors() -> dict[str, list[float]]:
    by_family: dict[str, list[float]] = {}
    for _, _, plan in corpus():
        e = error(plan)
        for f in families(plan):
            by_family.setdefault(f, []).append(e)
    return by_family


def test_corpus_covers_the_families():
    fams = corpus_errors()
    assert len(corpus()) == PER_BASE * len(BASES)
    for f in BOUNDS:
        assert len(fams.get(f, ())) >= 3, f"corpus has too few {f} plans"


@pytest.mark.parametrize("family", list(BOUNDS))
def test_estimate_within_the_measured_bounds(family):
    errs = corpus_errors()[family]
    med, worst = BOUNDS[family]
    assert statistics.median(abs(e) for e in errs) <= med
    assert max(abs(e) for e in errs) <= worst, sorted(errs, key=abs)[-3:]


def test_zero3_on_1024_p5_nodes_agrees():
    """The case the plan search met: Llama 3 70B, ZeRO-3 on 1,024 p5 nodes (every fitting tp x pp x
    recompute x micro-batch plan of the default space). Measured: worst 1.0 % (was 14-22 %)."""
    sc = evaluator("llama3-70b-p5").base
    keys = candidates(default_space(sc, instances=("p5.48xlarge",), nodes=(1024,), zero=(3,)), moe=False)
    plans = fitting_plans("llama3-70b-p5", keys)
    assert len(plans) >= 8
    errs = [error(p) for _, p in plans]
    assert max(abs(e) for e in errs) <= 0.02, errs


def test_ranking_agrees():
    """A small candidate set ranked by the estimate, as the search ranks it: its best plan is among the
    simulation's best three, and the simulation's best is in the estimate's top three (what a search
    re-checking ``--top 3`` needs to find the true best)."""
    sc = evaluator("llama3-70b-p5").base
    space = default_space(sc, instances=("p5.48xlarge",), nodes=(128,), tp=(4, 8), pp=(2, 4, 8), vpp=(1, 2),
                          micro_batch=(1,), zero=(1, 3), recompute=("none", "selective"))
    plans = fitting_plans("llama3-70b-p5", candidates(space, moe=False))
    assert len(plans) >= 10
    est = {k: estimate_step(p)[0] for k, p in plans}
    sim = {k: simulate_folded(p, record=False)[0] for k, p in plans}
    by_est, by_sim = sorted(est, key=est.get), sorted(sim, key=sim.get)
    assert by_est[0] in by_sim[:3]
    assert by_sim[0] in by_est[:3]
