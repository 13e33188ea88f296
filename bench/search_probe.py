"""One measurement of the plan search in a fresh process, for ``bench_search.py`` (not a test).

    python bench/search_probe.py ROOT serial [--scenario FILE] [--global-batch N] [--zero 1,3]
    python bench/search_probe.py ROOT dask [--rounds 2] [--nodes 8,16,32,64] ...

ROOT is the checkout whose ``fmsim`` is imported (this one, or another, e.g. the main branch, to compare
the two in the same minutes: ``bench_search.py --compare ROOT`` runs probes of both, alternating). It
prints one JSON line:

* ``serial``: the bench space searched on one process -- the first search of the process (cold: only the
  scenario loaded and one estimate run before it, so the imports are done) and two more (warm), each in
  candidates per CPU second; and a digest of the records (every plan's status and row), so that two
  checkouts' answers are compared as well as their speed;
* ``dask``: LocalClusters of 1 and 2 single-threaded workers, as ``--dask local:N`` starts them, started and
  warmed by one search each; then ``--rounds`` rounds of one search on each, the order alternating (1-2,
  2-1), the workers' estimate caches emptied before each: per round the wall seconds, the busiest
  worker's CPU seconds and the client process's (client and scheduler share it).

The load average (1 minute) at the start and the end of the probe is in the line.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

INSTANCES = ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge")
NODES = (8, 16, 32, 64)


def digest(records) -> str:
    """A hash of every record (plan key, status, row or refusal): equal digests, equal answers."""
    h = hashlib.sha256()
    for key, rec in records:
        h.update(json.dumps([list(key), rec], sort_keys=True, default=repr).encode())
    return h.hexdigest()[:16]


def serial(fmsim, sc, kw: dict, warm: int = 2) -> dict:
    def one():
        c = time.process_time()
        res = fmsim.search(sc, top=0, cache_dir=False, jobs=1, **kw)
        return len(res.records) / (time.process_time() - c), res

    cold, res = one()
    warms = [one()[0] for _ in range(warm)]
    return {"candidates": len(res.records), "cold": cold, "warm": warms, "digest": digest(res.records)}


def dask_rounds(fmsim, sc, kw: dict, rounds: int, *, warm_caches: bool = False, report=None) -> dict:
    """Clusters of 1 and 2 workers, warmed; ``rounds`` rounds, the order alternating (see the module
    docstring). ``report(i, round)`` is called after each round (the bench prints it)."""
    from dask.distributed import Client

    from fmsim.parallel import strategy
    from fmsim.search.executors import local_cluster

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
                res = fmsim.search(sc, top=0, cache_dir=False, dask=client, **kw)
                wall = time.perf_counter() - t
                c1, me = client.run(time.process_time), time.process_time() - me0
            used = [c1[k] - c0[k] for k in c1]
            return {"wall": wall, "busiest": max(used), "workers": sum(used), "client": me,
                    "digest": digest(res.records)}

        for w in clusters:
            one(w)          # the workers' imports and catalogs: what follows is the steady state
        out = []
        for i in range(rounds):
            got = {w: one(w) for w in ((1, 2) if i % 2 == 0 else (2, 1))}
            out.append({"1": got[1], "2": got[2], "load": os.getloadavg()[0]})
            if report:
                report(i, out[-1])
        return {"rounds": out}
    finally:
        for c in clusters.values():
            c.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("mode", choices=("serial", "dask"))
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--global-batch", type=int, default=None)
    ap.add_argument("--zero", default="1,3")
    ap.add_argument("--nodes", default=",".join(map(str, NODES)))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dask-warm", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    sys.path.insert(0, root)
    load0 = os.getloadavg()[0]
    import fmsim
    from fmsim.scenario import load_scenario

    scenario = args.scenario or os.path.join(root, "scenarios/examples/llama3-70b-p5.yaml")
    sc = load_scenario(scenario, overrides={"workload.global_batch": args.global_batch}
                       if args.global_batch else None)
    fmsim.estimate(sc)          # the imports an estimate needs, done before any clock
    kw = {"instances": INSTANCES, "nodes": tuple(int(n) for n in args.nodes.split(",")),
          "axes": {"zero": tuple(int(z) for z in args.zero.split(","))}}
    if args.mode == "serial":
        out = serial(fmsim, sc, kw)
    else:
        out = dask_rounds(fmsim, sc, kw, args.rounds, warm_caches=args.dask_warm)
    out.update(root=root, fmsim_file=fmsim.__file__, load_start=load0, load_end=os.getloadavg()[0])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
