"""How far the analytical estimate (``fmsim.estimate``) is from the discrete-event simulation
(``fmsim.simulate``) it stands in for during plan search: the step-time ratio estimate/simulate over a
corpus of scenario files and search variants, by plan family (printed figures, not tests).

The corpus: every training scenario of scenarios/validation/training and scenarios/examples, and a
deterministic sample of the plans ``fmsim search`` enumerates (fmsim.search.space.default_space, with
ZeRO 0, context parallelism and activation offloading added) on p5, p5en, p6-b200 and p4d at 8..1024
nodes, derived as the search derives them (fmsim.search.evaluate.Evaluator). Plans that do not fit are
left out (the search re-checks only plans that fit).

Run: .venv/bin/python bench/estimate_vs_des.py [--per-base N] [--csv FILE]
"""
from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fmsim  # noqa: E402
from fmsim.search.evaluate import Evaluator  # noqa: E402
from fmsim.search.space import candidates, default_space  # noqa: E402

INSTANCES = ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "p4d.24xlarge")
NODES = (8, 32, 128, 512, 1024)
BASES = ("gpt-oss-120b-p5", "gpt3-175b-p4d", "llama3-70b-p5", "llama3-70b-hsdp-p5", "llama3.1-405b-p5en",
         "mixtral-8x22b-p6-b200")


def families(row: dict) -> list[str]:
    fam = [f"zero{row['zero']}"]
    if row["pp"] > 1:
        fam.append("pp>1")
    if row.get("vpp", 1) > 1:
        fam.append("vpp>1")
    if row["cp"] > 1:
        fam.append("cp>1")
    if row["ep"] > 1:
        fam.append("ep>1")
    if row.get("offload"):
        fam.append("offload")
    return fam


def measure(sc, name: str, out: list[dict]) -> None:
    try:
        est = fmsim.estimate(sc)
    except fmsim.FmsimError:
        return
    if not est.metrics.get("fits", True):
        return
    t0 = time.perf_counter()
    sim = fmsim.simulate(sc)
    wall = time.perf_counter() - t0
    p = sc.parallelism
    row = {"name": name, "instance": sc.cluster.instance.name, "nodes": sc.cluster.nodes,
           "tp": est.metrics["tp"], "pp": est.metrics["pp"], "vpp": est.metrics["vpp"], "cp": est.metrics["cp"],
           "ep": est.metrics["ep"], "dp": est.metrics["dp"], "zero": est.metrics["zero"],
           "mb": est.metrics["micro_batch"], "m": est.metrics["num_microbatches"],
           "recompute": est.metrics["recompute"], "offload": p.offload_activations,
           "est_s": est.metrics["step_time_s"], "sim_s": sim.metrics["step_time_s"], "des_wall_s": wall}
    row["ratio"] = row["est_s"] / row["sim_s"]
    out.append(row)


def files() -> list[Path]:
    out = []
    for d in (ROOT / "scenarios" / "validation" / "training", ROOT / "scenarios" / "examples"):
        for f in sorted(d.glob("*.yaml")):
            text = f.read_text()
            if "kind: pretrain" in text or "kind: finetune" in text:
                out.append(f)
    return out


def variant_keys(base, per_base: int, seed: int) -> list[tuple]:
    moe = base.workload.model.moe is not None
    axes = {"zero": (0, 1, 3), "cp": (1, 2), "offload_activations": (0, 4)}
    space = default_space(base, instances=INSTANCES, nodes=NODES, **axes)
    keys = list(candidates(space, moe=moe))
    rng = random.Random(seed)
    rng.shuffle(keys)
    return keys[: per_base * 6]       # oversample: many are refused or do not fit


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-base", type=int, default=25, help="fitting variants kept per base scenario")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--no-files", action="store_true")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    t0 = time.perf_counter()
    if not args.no_files:
        for f in files():
            measure(fmsim.load_scenario(f), f.stem, rows)
    print(f"files: {len(rows)} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    for i, b in enumerate(BASES):
        base = fmsim.load_scenario(ROOT / "scenarios" / "examples" / f"{b}.yaml")
        ev = Evaluator(base)
        kept = 0
        for key in variant_keys(base, args.per_base, seed=i):
            if kept >= args.per_base:
                break
            try:
                sc = ev.variant(key)
            except fmsim.FmsimError:
                continue
            n = len(rows)
            measure(sc, f"{b}:" + ",".join(map(str, key[1:])), rows)
            kept += len(rows) > n
        print(f"{b}: {kept} variants, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    fam: dict[str, list[float]] = {"all": []}
    for r in rows:
        fam["all"].append(r["ratio"])
        for f in families(r):
            fam.setdefault(f, []).append(r["ratio"])
    print(f"{'family':10} {'n':>4} {'median':>8} {'p90 |e|':>8} {'worst':>8}   (ratio estimate/simulate - 1)")
    for f, rs in fam.items():
        errs = sorted(abs(x - 1) for x in rs)
        worst = max(rs, key=lambda x: abs(x - 1))
        p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]
        print(f"{f:10} {len(rs):4d} {statistics.median(rs) - 1:+8.2%} {p90:8.2%} {worst - 1:+8.2%}")
    worst = sorted(rows, key=lambda r: -abs(r["ratio"] - 1))[:15]
    for r in worst:
        print(f"  {r['ratio'] - 1:+7.2%} {r['name']} {r['instance']} x{r['nodes']} tp{r['tp']} pp{r['pp']} "
              f"vpp{r['vpp']} cp{r['cp']} ep{r['ep']} dp{r['dp']} z{r['zero']} mb{r['mb']} m{r['m']} "
              f"{r['recompute']} off{r['offload']}  des {r['des_wall_s']:.2f}s")
    print(f"total {len(rows)} plans, {time.perf_counter() - t0:.1f} s wall", file=sys.stderr)


if __name__ == "__main__":
    main()
