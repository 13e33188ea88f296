"""How far the analytical serving estimate (``fmsim.estimate``) is from the discrete-event simulation
(``fmsim.simulate``) it stands in for (the prediction band, ``fmsim plan-capacity``, serving search): the ratio
estimate/simulate of output tokens per second (requests per second where the output is one token) over the
serving scenarios of scenarios/validation/inference and scenarios/examples (printed figures, not tests).

Run: .venv/bin/python bench/serving_estimate_vs_des.py [--csv FILE] [FILE ...]
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fmsim  # noqa: E402


def files() -> list[Path]:
    out = []
    for d in (ROOT / "scenarios" / "validation" / "inference", ROOT / "scenarios" / "examples"):
        out += [f for f in sorted(d.glob("*.yaml")) if "kind: inference" in f.read_text()]
    return out


def measure(path: Path) -> dict | None:
    try:
        sc = fmsim.load_scenario(path)
        est = fmsim.estimate(sc)
        sim = fmsim.simulate(sc)
    except fmsim.FmsimError as exc:
        print(f"  skipped {path.name}: {exc}", file=sys.stderr)
        return None
    e, s = est.metrics.get("output_tokens_per_s"), sim.metrics.get("output_tokens_per_s")
    if not e or not s:
        return None
    pools = sim.details.get("pools", [])
    row = {"name": path.stem, "gpus": sim.gpus, "nodes": sim.nodes, "arrival": (sc.extra.get("traffic") or {}).get("arrival", ""),
           "attention_dp": any(p.get("attention_dp") for p in pools), "moe": sc.workload.model.moe is not None,
           "est": e, "sim": s, "ratio": e / s}
    for k in ("ttft_p50_s", "tpot_p50_s"):      # the estimate's one latency against the simulation's median
        a, b = est.metrics.get(k), sim.metrics.get(k)
        row[k] = a / b if a and b and math.isfinite(a) and math.isfinite(b) else None
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default=None)
    ap.add_argument("files", nargs="*")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = [r for f in (map(Path, args.files) if args.files else files()) if (r := measure(f)) is not None]
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    groups = {"all": rows, "dense 1 node": [r for r in rows if not r["moe"] and r["nodes"] == 1],
              "attention-DP": [r for r in rows if r["attention_dp"]]}
    print(f"{'group':14} {'n':>4} {'median':>8} {'med |e|':>8} {'worst':>8}   (ratio estimate/simulate - 1)")
    for g, rs in groups.items():
        if not rs:
            continue
        rat = [r["ratio"] for r in rs]
        worst = max(rat, key=lambda x: abs(x - 1))
        print(f"{g:14} {len(rs):4d} {statistics.median(rat) - 1:+8.2%} "
              f"{statistics.median(abs(x - 1) for x in rat):8.2%} {worst - 1:+8.2%}")
    for k, keep in (("ttft_p50_s", lambda r: r["arrival"] != "offline"), ("tpot_p50_s", lambda r: True)):
        rat = [r[k] for r in rows if r[k] is not None and keep(r)]
        if rat:
            worst = max(rat, key=lambda x: abs(x - 1))
            print(f"{k:14} {len(rat):4d} {statistics.median(rat) - 1:+8.2%} "
                  f"{statistics.median(abs(x - 1) for x in rat):8.2%} {worst - 1:+8.2%}"
                  f"{'   (offline left out: its TTFT is the queue)' if k == 'ttft_p50_s' else ''}")
    for r in sorted(rows, key=lambda r: -abs(r["ratio"] - 1))[:12]:
        print(f"  {r['ratio'] - 1:+8.2%} {r['name']} ({r['gpus']} GPUs{', attention DP' if r['attention_dp'] else ''})"
              f" estimate {r['est']:,.1f} simulate {r['sim']:,.1f} output tokens/s")
    print(f"{len(rows)} scenarios, {time.perf_counter() - t0:.1f} s wall", file=sys.stderr)


if __name__ == "__main__":
    main()
