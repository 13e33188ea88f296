"""Speed of the plan search (issue 29 targets), printed with ratios in one run. Not a test.

    python bench/bench_search.py [--plans 100000] [--scenario FILE] [--skip-dask]

Prints, for the example scenario:
  1. loading + validating a scenario, one analytical estimate (the same plan again and again: its pieces
     come from the estimate's caches after the first), and deriving a variant with
     fmsim.scenario.with_plan (the search's way) -- ms each, with ratios;
  2. the search end to end on one process: candidates/s (every enumerated plan, refused ones included)
     and costed plans/s -- target >= 2,000 plans/s per core;
  3. the same search on 2 local processes (ratio to 1);
  4. Dask: 1 local worker against 2 (target >= 1.7x), in wall time and as the ratio of the busiest
     worker's CPU seconds (what two free cores would give: the wall ratio needs an idle machine);
  5. a --plans search (default 100,000 candidates) on 2 processes -- target within 60 s.
Calculon is not installed here: no side-by-side figure is printed for it.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fmsim  # noqa: E402
from fmsim.scenario import load_scenario, with_plan  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
INSTANCES = ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge")


def per_call_ms(fn, n: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (worker processes joined after a search)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed_search(sc, **kw):
    """(wall s, candidates, costed, result, CPU s): CPU time is what a shared machine cannot inflate by
    queueing (it still pays for a busy memory system)."""
    c0, t = cpu_s(), time.perf_counter()
    res = fmsim.search(sc, top=0, cache_dir=False, **kw)
    dt, cpu = time.perf_counter() - t, cpu_s() - c0
    costed = res.counts["ok"] + res.counts["memory"]
    return dt, len(res.records), costed, res, cpu


def nodes_for(plans_wanted: int, per_cluster: int) -> tuple[int, ...]:
    """Node counts (multiples of 4 from 8) giving about ``plans_wanted`` candidates over the instances."""
    n = max(1, round(plans_wanted / (per_cluster * len(INSTANCES))))
    return tuple(8 + 4 * i for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/examples/llama3-70b-p5.yaml"))
    ap.add_argument("--plans", type=int, default=100_000)
    ap.add_argument("--skip-dask", action="store_true")
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences per step for the searches (default: the scenario's; the example's 128 "
                         "refuses most large plans, 2048 admits them, and ZeRO-3 plans with many "
                         "micro-batches are the estimate's slowest)")
    ap.add_argument("--zero", default="1,3", help="ZeRO stages searched (default: the search's, 1,3)")
    args = ap.parse_args()
    sc = load_scenario(args.scenario, overrides={"workload.global_batch": args.global_batch}
                       if args.global_batch else None)
    print(f"scenario {sc.name} (global_batch {sc.workload.global_batch}, ZeRO {args.zero}); "
          f"{os.cpu_count()} CPU cores visible, load "
          f"average {os.getloadavg()[0]:.1f}; Calculon: not installed (no comparison)")

    load_ms = per_call_ms(lambda: load_scenario(args.scenario), 50)
    est_ms = per_call_ms(lambda: fmsim.estimate(sc), 100)
    var_ms = per_call_ms(lambda: with_plan(sc, tp=4, pp=8, vpp=1), 300)
    print(f"1. load+validate {load_ms:.2f} ms | estimate {est_ms:.2f} ms | with_plan variant {var_ms:.3f} ms"
          f"  (load/estimate {load_ms / est_ms:.1f}x, load/with_plan {load_ms / var_ms:.0f}x)")

    zero = tuple(int(z) for z in args.zero.split(","))
    base_kw = dict(instances=INSTANCES, nodes=(8, 16, 32, 64), axes={"zero": zero})
    dt1, n, costed, res, cpu1 = timed_search(sc, jobs=1, **base_kw)
    per_cluster = n // (len(INSTANCES) * 4)
    print(f"2. 1 process: {n:,} candidates ({costed:,} costed) in {dt1:.2f} s = {n / dt1:,.0f} candidates/s, "
          f"{costed / dt1:,.0f} costed plans/s; per CPU second: {n / cpu1:,.0f} candidates, "
          f"{costed / cpu1:,.0f} costed  (target 2,000/s per core: {n / cpu1 / 2000:.2f}x of it)")
    dt2, _, _, _, cpu2 = timed_search(sc, jobs=2, **base_kw)
    print(f"3. 2 processes: {dt2:.2f} s = {n / dt2:,.0f} candidates/s, {n / cpu2:,.0f} per CPU second "
          f"(speed-up {dt1 / dt2:.2f}x over 1 in wall time)")

    if not args.skip_dask:
        from dask.distributed import Client, LocalCluster

        times, busiest = {}, {}
        for workers in (1, 2):
            with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                              dashboard_address=None) as cluster, Client(cluster) as client:
                client.run(lambda: __import__("fmsim.search"))      # warm the workers' imports
                c0 = client.run(time.process_time)
                t = time.perf_counter()
                fmsim.search(sc, top=0, cache_dir=False, dask=client, **base_kw)
                times[workers] = time.perf_counter() - t
                c1 = client.run(time.process_time)
                busiest[workers] = max(c1[k] - c0[k] for k in c1)   # the most loaded worker's CPU seconds
        print(f"4. Dask: 1 worker {times[1]:.2f} s, 2 workers {times[2]:.2f} s wall "
              f"(speed-up {times[1] / times[2]:.2f}x); CPU s of the busiest worker "
              f"{busiest[1]:.2f} / {busiest[2]:.2f} = {busiest[1] / busiest[2]:.2f}x, "
              f"the speed-up on two free cores  (target 1.7x)")

    nodes = nodes_for(args.plans, per_cluster)
    dtb, nb, costedb, _, cpub = timed_search(sc, jobs=2, instances=INSTANCES, nodes=nodes,
                                             axes={"zero": zero})
    print(f"5. {nb:,} candidates ({costedb:,} costed; nodes {nodes[0]}..{nodes[-1]} by 4) on 2 processes in "
          f"{dtb:.1f} s ({cpub:.1f} CPU s) = {nb / dtb:,.0f}/s  "
          f"(target 100,000 within 60 s: {60 / dtb * nb / 100_000:.2f}x of it)")


if __name__ == "__main__":
    main()
