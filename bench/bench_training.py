"""Speed of the training simulator, through the public API (printed figures, not tests).

Targets (issue 4 item 7): a DES step of Llama 3.1 405B on 16,384 H100 (TP8 PP16, 2048 x 8192
tokens) in under 1 s on one core; the analytical estimate at >= 500 plans/s on one core
(Calculon evaluates about 435/s).

Run: .venv/bin/python bench/bench_training.py
"""
from __future__ import annotations

import itertools
import time
from pathlib import Path

import fmsim

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "scenarios" / "examples" / "llama3.1-405b-p5en.yaml"
OVERRIDES = {
    "name": "llama3.1-405b-16k-h100",
    "cluster.instance": "p5.48xlarge", "cluster.nodes": 2048,
    "parallelism.tp": 8, "parallelism.pp": 16, "parallelism.vpp": 1, "parallelism.schedule": "1f1b",
    "workload.global_batch": 2048, "workload.seq_len": 8192,
}


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    sc = fmsim.load_scenario(BASE, overrides=OVERRIDES)
    fmsim.simulate(sc)  # warm caches and imports
    des = best_of(lambda: fmsim.simulate(sc))
    res = fmsim.simulate(sc)
    print(f"DES step, Llama 3.1 405B on {sc.cluster.gpus} H100 (TP8 PP16, m={res.metrics['num_microbatches']}):"
          f" {des * 1e3:.1f} ms wall ({1.0 / des:.2f} steps/s); target < 1000 ms -> ratio {des / 1.0:.3f}")
    print(f"  simulated step {res.metrics['step_time_s']:.2f} s, MFU {res.metrics['mfu']:.3f},"
          f" jobs {res.details['num_jobs']}")
    # analytical plans over a grid of tp x pp x micro-batch x vpp
    # (the interleaved ones need their micro-batches in groups of pp: the grid keeps the plans that run)
    grid = list(itertools.product([4, 8], [8, 16, 32], [1, 2], [1, 2]))
    plans = []
    for tp, pp, mb, vpp in grid:
        try:   # the reader refuses some (interleaved micro-batches not in groups of pp), the estimate others
            p = fmsim.load_scenario(BASE, overrides={
                **OVERRIDES, "parallelism.tp": tp, "parallelism.pp": pp, "workload.micro_batch": mb,
                "parallelism.vpp": vpp, "parallelism.schedule": "interleaved" if vpp > 1 else "1f1b"})
            fmsim.estimate(p)
        except fmsim.FmsimError:
            continue
        plans.append(p)
    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < 3.0:
        for p in plans:
            fmsim.estimate(p)
            n += 1
    rate, cpu_rate = n / (time.perf_counter() - t0), n / (time.process_time() - c0)
    print(f"analytical estimate: {rate:.0f} plans/s wall, {cpu_rate:.0f} per CPU second, over {len(plans)} "
          f"distinct plans; target >= 500 -> ratio {rate / 500:.2f}; "
          f"Calculon ~435/s -> ratio {rate / 435:.2f}")


if __name__ == "__main__":
    main()
