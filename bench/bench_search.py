"""Speed of the plan search (issue 29 targets), printed with ratios in one run. Not a test.

    python bench/bench_search.py [--plans 100000] [--scenario FILE] [--skip-dask | --only-dask]
                                 [--repeats 3] [--dask-rounds 6] [--dask-nodes LIST] [--calculon DIR]
    python bench/bench_search.py --compare OTHER_CHECKOUT [--pairs 4] [--only-dask]

This machine is shared: its CPU time for identical work moves by about a third from minute to minute. So
the figures are measured the standard way: what is compared runs interleaved, in alternating repeats
(A B, B A, ...) in the same minutes, and is reported as the median of the per-pair ratios; a rate is
reported as the best of N (timeit's recommendation: the least-noisy estimate, the others being slowed by
the rest of the machine) beside the median; the load average is printed at the start and the end and
beside each figure. No figure is asserted anywhere (tests assert answers, not speed). Items:
  1. loading + validating a scenario, one analytical estimate (the same plan again and again: its pieces
     come from the estimate's caches after the first), and deriving a variant with
     fmsim.scenario.with_plan (the search's way) -- ms each, with ratios;
  2. the search end to end on one process: candidates per CPU second (every enumerated plan, refused
     ones included) -- target >= 2,000 plans/s per core -- in --repeats fresh processes
     (bench/search_probe.py: the first search of a process is cold, two more warm): best of N and median;
     and one search with the on-disk result cache written;
  3. 2 local processes against 1, --repeats pairs alternating, the estimate caches emptied before each;
  4. Dask: 1 local worker against 2 (target >= 1.7x), clusters made as --dask local:N makes them, started
     and warmed by one search each before any clock (start-up not timed); then --dask-rounds rounds (6),
     one search on each, the order alternating 1-2, 2-1, each worker's estimate caches emptied before
     each search (--dask-warm keeps them); each round's wall ratio, the CPU seconds of the one worker, of
     the busiest of two (their ratio: what two free cores would give) and of the client+scheduler
     process, then the median of the per-round ratios and best against best, with the load average at
     start and end (--only-dask: this item alone; --dask-nodes: a longer search);
  5. a --plans search (default 100,000 candidates) on 2 processes -- target within 60 s;
  6. with --calculon DIR (a checkout of github.com/calculon-ai/calculon; or $CALCULON_HOME): Calculon's
     own search loop (calculon.llm.optimal_execution.OptimalExecution.search, one process) on the same
     model and a cluster of the same size (its H100 NVL8 system file, 8 nodes of 8), against fmsim's
     search of that model on 8 p5.48xlarge, both in plans per CPU second. Calculon is not a dependency:
     without a checkout this line says so.

--compare OTHER_CHECKOUT: this checkout (A) against another (B, e.g. the main branch) in the same minutes:
--pairs pairs of item-2 probes (with --only-dask: of item-4 rounds), alternating A B, B A; best of N,
medians, the median of the per-pair ratios, and whether the two answered with identical records.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import search_probe  # noqa: E402
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
    ap.add_argument("--repeats", type=int, default=3,
                    help="fresh processes for item 2, and pairs for item 3 (default 3)")
    ap.add_argument("--compare", default=None, metavar="ROOT",
                    help="only: this checkout against another (e.g. the main branch), probes alternating "
                         "A B B A ... in the same minutes (--pairs); with --only-dask, their Dask rounds")
    ap.add_argument("--pairs", type=int, default=4, help="--compare: probe pairs (default 4)")
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
    if args.compare:
        compare(args)
        return
    if args.only_dask:
        dask_rounds(sc, dask_kw, rounds=args.dask_rounds, warm_caches=args.dask_warm)
        return

    load_ms = per_call_ms(lambda: load_scenario(args.scenario), 50)
    est_ms = per_call_ms(lambda: fmsim.estimate(sc), 100)
    var_ms = per_call_ms(lambda: with_plan(sc, tp=4, pp=8, vpp=1), 300)
    print(f"1. load+validate {load_ms:.2f} ms | estimate {est_ms:.2f} ms | with_plan variant {var_ms:.3f} ms"
          f"  (load/estimate {load_ms / est_ms:.1f}x, load/with_plan {load_ms / var_ms:.0f}x)  [{load()}]")

    # 2: fresh processes (a cold search is the first of a process), best of N beside the median
    probes = [probe(ROOT, args) for _ in range(args.repeats)]
    n = probes[0]["candidates"]
    cold = [p["cold"] for p in probes]
    warm = [w for p in probes for w in p["warm"]]
    dt1, _, costed, res, cpu1 = timed_search(sc, jobs=1, **base_kw)
    per_cluster = n // (len(INSTANCES) * 4)
    with tempfile.TemporaryDirectory() as tmp:
        c0 = cpu_s()
        fmsim.search(sc, top=0, cache_dir=tmp, jobs=1, **base_kw)
        cpu_disk = cpu_s() - c0
    print(f"2. 1 process: {n:,} candidates ({costed:,} costed); per CPU second, in {args.repeats} fresh processes: "
          f"{max(cold):,.0f} candidates cold (best of {len(cold)}; median {statistics.median(cold):,.0f}), "
          f"{max(warm):,.0f} warm (best of {len(warm)}; median {statistics.median(warm):,.0f}); here, warm: "
          f"{n / dt1:,.0f} candidates/s wall, {costed / dt1:,.0f} costed plans/s; {n / cpu_disk:,.0f} per CPU "
          f"second writing the disk cache  (target 2,000/s per core: {max(cold) / 2000:.2f}x of it cold, "
          f"{max(warm) / 2000:.2f}x warm)  [{_loads(probes)}; {load()}]", flush=True)
    # 3: 1 and 2 processes alternating, the estimate caches emptied before each (the workers fork from here)
    from fmsim.parallel import strategy

    ratios, one, two = [], [], []
    for i in range(args.repeats):
        got = {}
        for jobs in ((1, 2) if i % 2 == 0 else (2, 1)):
            strategy.clear_caches()
            got[jobs] = timed_search(sc, jobs=jobs, **base_kw)
        one.append(got[1][0])
        two.append(got[2][0])
        ratios.append(one[-1] / two[-1])
    print(f"3. 2 processes against 1, cold caches, {args.repeats} pairs alternating: median of the per-pair "
          f"ratios {statistics.median(ratios):.2f}x wall (pairs {min(ratios):.2f}-{max(ratios):.2f}x); best "
          f"{min(two):.2f} s against {min(one):.2f} s = {n / min(two):,.0f} candidates/s on 2  [{load()}]",
          flush=True)

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


def probe(root, args, mode: str = "serial", rounds: int = 2) -> dict:
    """A :mod:`search_probe` of checkout ``root`` in a fresh process (its JSON line)."""
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "search_probe.py"), str(root), mode,
           "--zero", args.zero, "--rounds", str(rounds)]
    if args.scenario:
        cmd += ["--scenario", str(Path(args.scenario).resolve())]
    if args.global_batch:
        cmd += ["--global-batch", str(args.global_batch)]
    if mode == "dask" and args.dask_nodes:
        cmd += ["--nodes", ",".join(map(str, parse_nodes(args.dask_nodes)))]
    if mode == "dask" and args.dask_warm:
        cmd.append("--dask-warm")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=root).stdout
    return json.loads(out.strip().splitlines()[-1])


def _loads(probes) -> str:
    lo = min(min(p["load_start"], p["load_end"]) for p in probes)
    hi = max(max(p["load_start"], p["load_end"]) for p in probes)
    return f"load {lo:.1f}-{hi:.1f}"


def compare(args) -> None:
    """``--compare ROOT``: this checkout (A) against ROOT (B) in the same minutes: ``--pairs`` pairs of fresh
    probes, the order alternating (A B, B A, ...) so that the machine's drift weighs on both; per variant the
    best of N (the least-noisy estimate, as timeit's documentation recommends) beside the median, and the
    median of the per-pair ratios A/B. Both checkouts' records are compared by digest."""
    a, b = ROOT, Path(args.compare).resolve()
    mode = "dask" if args.only_dask else "serial"
    print(f"compare {mode}: A = {a}, B = {b}; {args.pairs} pairs alternating; load average "
          f"{_avg(os.getloadavg())} at the start", flush=True)
    got: dict[str, list] = {"A": [], "B": []}
    for i in range(args.pairs):
        for name in (("A", "B") if i % 2 == 0 else ("B", "A")):
            got[name].append(probe(a if name == "A" else b, args, mode, rounds=args.dask_rounds))
            p = got[name][-1]
            if mode == "serial":
                print(f"  pair {i + 1} {name}: cold {p['cold']:,.0f}, warm "
                      f"{', '.join(f'{w:,.0f}' for w in p['warm'])} candidates per CPU s  [{_loads([p])}]",
                      flush=True)
            else:
                for r in p["rounds"]:
                    print(f"  pair {i + 1} {name}: 1 worker {r['1']['wall']:.2f} s, 2 workers {r['2']['wall']:.2f} s "
                          f"= {r['1']['wall'] / r['2']['wall']:.2f}x (CPU s: busiest {r['1']['busiest']:.2f} / "
                          f"{r['2']['busiest']:.2f}; client+scheduler {r['1']['client']:.2f} / "
                          f"{r['2']['client']:.2f})  [load {r['load']:.1f}]", flush=True)
    if mode == "serial":
        for what in ("cold", "warm"):
            vals = {k: [p[what] if what == "cold" else max(p[what]) for p in v] for k, v in got.items()}
            ratios = [x / y for x, y in zip(vals["A"], vals["B"])]
            print(f"{what}: A best {max(vals['A']):,.0f} (median {statistics.median(vals['A']):,.0f}), B best "
                  f"{max(vals['B']):,.0f} (median {statistics.median(vals['B']):,.0f}) candidates per CPU s; "
                  f"A/B median of per-pair ratios {statistics.median(ratios):.2f}x (pairs {min(ratios):.2f}-"
                  f"{max(ratios):.2f}x), best/best {max(vals['A']) / max(vals['B']):.2f}x")
        digests = {k: {p["digest"] for p in v} for k, v in got.items()}
    else:
        for k, v in got.items():
            rs = [r["1"]["wall"] / r["2"]["wall"] for p in v for r in p["rounds"]]
            one = [r["1"]["wall"] for p in v for r in p["rounds"]]
            two = [r["2"]["wall"] for p in v for r in p["rounds"]]
            cl = [r["2"]["client"] for p in v for r in p["rounds"]]
            print(f"{k}: 2 workers against 1, median of {len(rs)} per-round ratios {statistics.median(rs):.2f}x "
                  f"(rounds {min(rs):.2f}-{max(rs):.2f}x), best/best {min(one) / min(two):.2f}x; client+scheduler "
                  f"CPU s on 2 workers median {statistics.median(cl):.2f}")
        digests = {k: {r[w]["digest"] for p in v for r in p["rounds"] for w in "12"} for k, v in got.items()}
    same = len(digests["A"] | digests["B"]) == 1
    print(f"records: {'identical' if same else 'DIFFERENT'} in A and B (digests {digests})  [load average "
          f"{_avg(os.getloadavg())} at the end]")


def dask_rounds(sc, base_kw, rounds: int, *, warm_caches: bool = False) -> None:
    """Item 4 (:func:`search_probe.dask_rounds`: clusters of 1 and 2 workers started and warmed before any
    clock, rounds alternating 1-2, 2-1, the workers' estimate caches emptied before each search unless
    ``warm_caches``). Printed per round: wall seconds, the ratio, the busiest worker's CPU seconds and the
    client process's (scheduler and client share it: on two cores they compete with the second worker),
    and the cores the search got (all its CPU seconds over its wall time: on a shared machine, what the
    others left it); then the median of the per-round ratios and each variant's best (least-noisy) and
    median wall time."""
    load0 = os.getloadavg()
    print(f"4. Dask: clusters of 1 and 2 workers started and warmed (not timed); {rounds} rounds, "
          f"{'warm' if warm_caches else 'cold'} estimate caches, order alternating  "
          f"[load average {_avg(load0)} at the start]", flush=True)
    walls, cpus, cores = [], [], []

    def report(i, rnd):
        a, b = rnd["1"], rnd["2"]
        walls.append(a["wall"] / b["wall"])
        cpus.append(a["busiest"] / b["busiest"])
        cores.append(((a["workers"] + a["client"]) / a["wall"], (b["workers"] + b["client"]) / b["wall"]))
        print(f"4. round {i + 1}: 1 worker {a['wall']:.2f} s, 2 workers {b['wall']:.2f} s wall = {walls[-1]:.2f}x; "
              f"CPU s: the worker {a['busiest']:.2f}, the busiest of two {b['busiest']:.2f} ({cpus[-1]:.2f}x; both "
              f"{b['workers']:.2f}); client+scheduler {a['client']:.2f} / {b['client']:.2f}; cores the search got "
              f"{cores[-1][0]:.2f} / {cores[-1][1]:.2f}  [{load()}]", flush=True)

    got = search_probe.dask_rounds(fmsim, sc, base_kw, rounds, warm_caches=warm_caches, report=report)["rounds"]
    one, two = [r["1"]["wall"] for r in got], [r["2"]["wall"] for r in got]
    print(f"4. Dask, 2 workers against 1, median of {rounds} per-round ratios: {statistics.median(walls):.2f}x "
          f"wall (rounds {min(walls):.2f}-{max(walls):.2f}x; best of {rounds} against best of {rounds}: "
          f"{min(one) / min(two):.2f}x), {statistics.median(cpus):.2f}x in the busiest worker's CPU seconds  "
          f"(target 1.7x); the 2-worker searches got {statistics.median(c[1] for c in cores):.2f} cores (median; "
          f"2.0 would be both: fewer is the machine's other load)  [load average {_avg(load0)} at the start, "
          f"{_avg(os.getloadavg())} at the end]")
    free = [r for r, c in zip(walls, cores) if c[1] >= FREE_CORES]
    print(f"4. the rounds whose 2-worker search got at least {FREE_CORES} cores ({len(free)} of {rounds}): "
          + (f"median {statistics.median(free):.2f}x wall" if free else "none: no round had two free cores"))


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
