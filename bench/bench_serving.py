"""Speed of the serving DES (issue 5, item 6): 10,000 requests of 1k prompt / 1k output on one replica.

Prints wall time, simulated engine iterations, discrete events (engine steps the loop took, request
arrivals and completions) and events per second, for offline (max-load) and Poisson traffic. Not a
test: no assertion on time (STYLE.md habit 12). Run: ``.venv/bin/python bench/bench_serving.py``.
"""
from __future__ import annotations

import sys
import time

from fmsim.catalog import load_catalog
from fmsim.workloads.inference import _collect, _Simulation, build_plan
from fmsim.workloads.inference_spec import parse_inference_spec


def bench(arrival: dict, label: str, engine: str = "vllm", n: int = 10_000) -> None:
    cat = load_catalog()
    spec = parse_inference_spec({"traffic": {**arrival, "requests": n, "prompt_len": 1000, "output_len": 1000},
                                 "serving": {"engine": engine, "replicas": 1}})
    plan = build_plan(name="bench", model=cat.model("llama3.1-8b"), instance=cat.instance("p5.48xlarge"),
                      precision="fp8", tp=1, nodes=1, spec=spec, seed=0)
    t0 = time.perf_counter()
    sim = _Simulation(plan)
    sim.run()
    m = _collect(sim)
    wall = time.perf_counter() - t0
    engines = [e for es in sim.engines.values() for e in es]
    steps = sum(e.stats.macro_steps for e in engines)
    iters = sum(e.stats.iterations for e in engines)
    events = steps + 2 * len(sim.gen_jobs)          # engine steps + arrivals + completions
    print(f"{label:34s} {engine:7s} wall {wall:6.2f} s   iterations {iters:9,d}   events {events:8,d}   "
          f"{events / wall:10,.0f} events/s   simulated {m['sim_duration_s']:8.1f} s   "
          f"{m['output_tokens_per_s']:9,.0f} out tok/s   unfinished {m['unfinished_requests']}")


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    print(f"{n:,} requests, 1000/1000 tokens, Llama-3.1-8B FP8 on one H100 (p5.48xlarge, 1 replica), one core")
    bench({"arrival": "offline"}, "offline (all queued at t=0)", n=n)
    bench({"arrival": "offline"}, "offline (all queued at t=0)", engine="trtllm", n=n)
    bench({"arrival": "poisson", "rate": "8/s"}, "poisson 8 req/s (~90 % load)", n=n)
    bench({"arrival": "poisson", "rate": "30/s"}, "poisson 30 req/s (overload)", n=n)
