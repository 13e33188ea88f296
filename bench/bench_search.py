"""Speed of the plan search (issue 29 targets), printed with ratios in one run. Not a test.

    python bench/bench_search.py [--plans 100000] [--scenario FILE] [--skip-dask | --only-dask]
                                 [--dask-rounds 6] [--dask-nodes LIST] [--calculon DIR]

Prints, for the example scenario, each figure with the load average beside it (the build machine is
shared: compare the ratios, measured back to back in one run, more than the absolute figures):
  1. loading + validating a scenario, one analytical estimate (the same plan again and again: its pieces
     come from the estimate's caches after the first), and deriving a variant with
     fmsim.scenario.with_plan (the search's way) -- ms each, with ratios;
  2. the search end to end on one process: candidates/s (every enumerated plan, refused ones included)
     and costed plans/s, per CPU second -- target >= 2,000 plans/s per core; the first search (cold
     caches), the best of two more (warm), and one with the on-disk result cache written;
  3. the same search on 2 local processes (ratio to 1);
  4. Dask: 1 local worker against 2 (target >= 1.7x), clusters made as --dask local:N makes them, started
     and warmed by one search each before any clock (start-up not timed); then --dask-rounds rounds (6),
     one search on each, the order alternating 1-2, 2-1 so that load drift weighs on both, each worker's
     estimate caches emptied before each search (--dask-warm keeps them); each round's wall ratio, the
     CPU seconds of the one worker, of the busiest of two (their ratio: what two free cores would give)
     and of the client+scheduler process, then the medians, with the load average at start and end
     (--only-dask: this item alone; --dask-nodes: a longer search);
  5. a --plans search (default 100,000 candidates) on 2 processes -- target within 60 s;
  6. with --calculon DIR (a checkout of github.com/calculon-ai/calculon; or $CALCULON_HOME): Calculon's
     own search loop (calculon.llm.optimal_execution.OptimalExecution.search, one process) on the same
     model and a cluster of the same size (its H100 NVL8 system file, 8 nodes of 8), against fmsim's
     search of that model on 8 p5.48xlarge, both in plans per CPU second. Calculon is not a dependency:
     without a checkout this line says so.
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fmsim  # noqa: E402
from fmsim.scenario import load_scenario, with_plan  # noqa: E402
from fmsim.search.space import parse_nodes  # noqa: E402

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


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


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
    ap.add_argument("--dask-rounds", type=int, default=6, help="Dask rounds timed, 1 and 2 workers each "
                                                               "(default 6)")
    ap.add_argument("--dask-nodes", default=None,
                    help="node counts of the Dask rounds' space (default: item 2's, 8,16,32,64)")
    ap.add_argument("--dask-warm", action="store_true",
                    help="keep the workers' estimate caches between Dask searches (default: emptied)")
    ap.add_argument("--only-dask", action="store_true", help="item 4 alone")
    ap.add_argument("--calculon", default=None, help="a checkout of github.com/calculon-ai/calculon")
    ap.add_argument("--calculon-seconds", type=float, default=20.0,
                    help="CPU seconds of Calculon's search to time (default 20)")
    args = ap.parse_args()
    sc = load_scenario(args.scenario, overrides={"workload.global_batch": args.global_batch}
                       if args.global_batch else None)
    print(f"scenario {sc.name} (global_batch {sc.workload.global_batch}, ZeRO {args.zero}); "
          f"{os.cpu_count()} CPU cores visible; load average {_avg(os.getloadavg())} at the start")
    zero = tuple(int(z) for z in args.zero.split(","))
    base_kw = dict(instances=INSTANCES, nodes=(8, 16, 32, 64), axes={"zero": zero})
    dask_kw = dict(base_kw, nodes=parse_nodes(args.dask_nodes)) if args.dask_nodes else base_kw
    if args.only_dask:
        dask_rounds(sc, dask_kw, rounds=args.dask_rounds, warm_caches=args.dask_warm)
        return

    load_ms = per_call_ms(lambda: load_scenario(args.scenario), 50)
    est_ms = per_call_ms(lambda: fmsim.estimate(sc), 100)
    var_ms = per_call_ms(lambda: with_plan(sc, tp=4, pp=8, vpp=1), 300)
    print(f"1. load+validate {load_ms:.2f} ms | estimate {est_ms:.2f} ms | with_plan variant {var_ms:.3f} ms"
          f"  (load/estimate {load_ms / est_ms:.1f}x, load/with_plan {load_ms / var_ms:.0f}x)  [{load()}]")

    dt1, n, costed, res, cpu1 = timed_search(sc, jobs=1, **base_kw)
    per_cluster = n // (len(INSTANCES) * 4)
    warm = min((timed_search(sc, jobs=1, **base_kw) for _ in range(2)), key=lambda r: r[4])
    with tempfile.TemporaryDirectory() as tmp:
        c0 = cpu_s()
        fmsim.search(sc, top=0, cache_dir=tmp, jobs=1, **base_kw)
        cpu_disk = cpu_s() - c0
    print(f"2. 1 process: {n:,} candidates ({costed:,} costed) in {dt1:.2f} s = {n / dt1:,.0f} candidates/s, "
          f"{costed / dt1:,.0f} costed plans/s; per CPU second: {n / cpu1:,.0f} candidates, "
          f"{costed / cpu1:,.0f} costed (first search); {n / warm[4]:,.0f} candidates (best of 2 warm); "
          f"{n / cpu_disk:,.0f} writing the disk cache  (target 2,000/s per core: {n / cpu1 / 2000:.2f}x of "
          f"it cold, {n / warm[4] / 2000:.2f}x warm)  [{load()}]")
    dt2, _, _, _, cpu2 = timed_search(sc, jobs=2, **base_kw)
    print(f"3. 2 processes: {dt2:.2f} s = {n / dt2:,.0f} candidates/s, {n / cpu2:,.0f} per CPU second "
          f"(speed-up {dt1 / dt2:.2f}x over 1 in wall time)  [{load()}]")

    if not args.skip_dask:
        dask_rounds(sc, dask_kw, rounds=args.dask_rounds, warm_caches=args.dask_warm)

    nodes = nodes_for(args.plans, per_cluster)
    dtb, nb, costedb, _, cpub = timed_search(sc, jobs=2, instances=INSTANCES, nodes=nodes,
                                             axes={"zero": zero})
    print(f"5. {nb:,} candidates ({costedb:,} costed; nodes {nodes[0]}..{nodes[-1]} by 4) on 2 processes in "
          f"{dtb:.1f} s ({cpub:.1f} CPU s) = {nb / dtb:,.0f}/s  "
          f"(target 100,000 within 60 s: {60 / dtb * nb / 100_000:.2f}x of it)  [{load()}]")

    calculon_side_by_side(sc, args.calculon or os.environ.get("CALCULON_HOME"), seconds=args.calculon_seconds)
    print(f"load average {_avg(os.getloadavg())} at the end")


def dask_rounds(sc, base_kw, rounds: int, *, warm_caches: bool = False) -> None:
    """Item 4: two LocalClusters (1 and 2 single-threaded worker processes), started and warmed by one
    search each before any clock runs; then ``rounds`` rounds, each one search on each cluster, the order
    alternating (1-2, 2-1, 1-2 ...) so that a drift in the machine's load weighs on both alike. Before each
    timed search every worker's estimate caches are emptied (unless ``warm_caches``): a search starts as a
    user's does, and the one worker does not keep every layout's stage costs while two keep half each.
    Printed per round: wall seconds, the ratio, the busiest worker's CPU seconds and the client process's
    (scheduler and client share it: on two cores they compete with the second worker), and the cores the
    search got (all its CPU seconds over its wall time: on a shared machine, what the others left it);
    then the medians."""
    from dask.distributed import Client

    from fmsim.parallel import strategy
    from fmsim.search.executors import local_cluster

    load0 = os.getloadavg()
    clusters = {w: local_cluster(w) for w in (1, 2)}      # as --dask local:N starts them
    try:
        # one client at a time (two live clients in one process tripped a tornado stream assertion here)
        def one(w):
            with Client(clusters[w]) as client:
                client.wait_for_workers(w)
                if not warm_caches:
                    client.run(strategy.clear_caches)
                c0, me0 = client.run(time.process_time), time.process_time()
                t = time.perf_counter()
                fmsim.search(sc, top=0, cache_dir=False, dask=client, **base_kw)
                wall = time.perf_counter() - t
                c1, me = client.run(time.process_time), time.process_time() - me0
            used = [c1[k] - c0[k] for k in c1]
            return wall, max(used), sum(used), me

        for w in clusters:
            one(w)          # the workers' imports and catalogs: what follows is the steady state
        print(f"4. Dask: clusters of 1 and 2 workers started and warmed (not timed); {rounds} rounds, "
              f"{'warm' if warm_caches else 'cold'} estimate caches, order alternating  "
              f"[load average {_avg(load0)} at the start]")
        walls, cpus, cores = [], [], []
        for i in range(rounds):
            got = {w: one(w) for w in ((1, 2) if i % 2 == 0 else (2, 1))}
            (w1, c1, _, m1), (w2, c2, t2, m2) = got[1], got[2]
            walls.append(w1 / w2)
            cpus.append(c1 / c2)
            cores.append(((c1 + m1) / w1, (t2 + m2) / w2))
            print(f"4. round {i + 1}: 1 worker {w1:.2f} s, 2 workers {w2:.2f} s wall = {w1 / w2:.2f}x; "
                  f"CPU s: the worker {c1:.2f}, the busiest of two {c2:.2f} ({c1 / c2:.2f}x; both {t2:.2f}); "
                  f"client+scheduler {m1:.2f} / {m2:.2f}; cores the search got {cores[-1][0]:.2f} / "
                  f"{cores[-1][1]:.2f}  [{load()}]")
        print(f"4. Dask, 2 workers against 1, median of {rounds} rounds: {statistics.median(walls):.2f}x "
              f"wall (rounds {min(walls):.2f}-{max(walls):.2f}x), {statistics.median(cpus):.2f}x in the "
              f"busiest worker's CPU seconds  (target 1.7x); the 2-worker searches got "
              f"{statistics.median(c[1] for c in cores):.2f} cores (median; 2.0 would be both: fewer is the "
              f"machine's other load)  [load average {_avg(load0)} at the start, {_avg(os.getloadavg())} at "
              f"the end]")
        free = [r for r, c in zip(walls, cores) if c[1] >= FREE_CORES]
        print(f"4. the rounds whose 2-worker search got at least {FREE_CORES} cores ({len(free)} of {rounds}): "
              + (f"median {statistics.median(free):.2f}x wall" if free else "none: no round had two free cores"))
    finally:
        for c in clusters.values():
            c.close()


#: a 2-worker Dask search that got this many cores had (nearly) both to itself
FREE_CORES = 1.75


def _avg(avg) -> str:
    return "/".join(f"{v:.2f}" for v in avg) + " (1/5/15 min)"


def calculon_side_by_side(sc, path: str | None, *, seconds: float) -> None:
    """Item 6: Calculon's search loop and fmsim's on the same model and an 8 x 8 H100 cluster, per CPU s."""
    if not path or not (Path(path) / "calculon" / "llm" / "optimal_execution.py").is_file():
        print("6. Calculon: no checkout given (--calculon DIR or $CALCULON_HOME, a clone of "
              "github.com/calculon-ai/calculon; PyPI's 'calculon' is an unrelated package): no side-by-side figure")
        return
    sys.path.insert(0, str(Path(path).resolve()))
    import logging

    import calculon  # noqa: F401  (optional: a checkout, never a dependency)
    from calculon.llm import Llm
    from calculon.llm.optimal_execution import OptimalExecution
    from calculon.system import System

    from fmsim.parallel import strategy

    m, w = sc.workload.model, sc.workload
    gpus, batch = 64, w.global_batch
    # the same model in Calculon's application terms (its attention is multi-head: GQA is not modelled)
    app = Llm.Application({"hidden": m.hidden, "feedforward": m.ffn_hidden, "seq_size": w.seq_len,
                           "attn_heads": m.heads, "attn_size": m.head_dim, "num_blocks": m.layers})
    syst = System(calculon.io.read_json_file(str(Path(path) / "systems" / "h100_80g_nvl8.json")))
    logging.disable(logging.CRITICAL)
    params = []     # OptimalExecution.run_command's own enumeration of the layouts
    for tp in Llm.get_all_tensor_parallelisms(gpus, app.hidden, app.attn_heads):
        for pp in Llm.get_all_pipeline_parallelisms(gpus, tp, app.num_blocks):
            dp = Llm.get_data_parallelism(gpus, tp, pp)
            for ppint in Llm.get_valid_pipeline_interleavings(app.num_blocks, pp):
                bs = OptimalExecution.get_batch_size(dp, batch)
                if bs is None:
                    continue
                for rc in ("full", "attn_only", "none"):
                    for osh in ((True, False) if dp > 1 else (False,)):
                        for comm in ("ar", "p2p_rs_ag", "rs_ag"):
                            params.append((False, 1, False, gpus, batch, "float16", app, syst, tp, pp, dp, ppint,
                                           bs, rc, osh, comm, [True], False, True, True))
    random.Random(0).shuffle(params)        # a fair sample of its layouts within the time given
    execs = done = 0
    per_layout = []
    c0 = time.process_time()
    for p in params:
        c1 = time.process_time()
        ec = OptimalExecution.search(*p)[1]
        per_layout.append(ec / max(1e-9, time.process_time() - c1))
        execs += ec
        done += 1
        if time.process_time() - c0 > seconds:
            break
    calc_cpu = time.process_time() - c0
    logging.disable(logging.NOTSET)
    rates = []
    for _ in range(3):
        strategy.clear_caches()          # cold: no plan's pieces left from an earlier search
        c0 = time.process_time()
        r = fmsim.search(sc, instances=("p5.48xlarge",), nodes=(8,), top=0, cache_dir=False, jobs=1)
        rates.append(len(r.records) / (time.process_time() - c0))
    fm = statistics.median(rates)
    print(f"6. Calculon (github.com/calculon-ai/calculon, its search loop, one process): {execs:,} executions of "
          f"{done} of its {len(params)} layouts on {gpus} H100 in {calc_cpu:.1f} CPU s = {execs / calc_cpu:,.0f}/s "
          f"per CPU second (layouts {min(per_layout):,.0f} to {max(per_layout):,.0f}/s); fmsim: "
          f"{len(r.records):,} candidates on 8 x p5.48xlarge, cold caches, "
          f"{fm:,.0f}/s per CPU second ({fm / (execs / calc_cpu):.1f}x)  [{load()}]")


if __name__ == "__main__":
    main()
