"""Speed of the RL simulator (issue 26, item 7): one RL step of 128 GPUs with 2,048 rollouts simulated
(target < 2 s on one core), and the analytical estimate in plans per second (target >= 100/s).

The step: GRPO on Qwen3-32B (BF16) colocated on 16 p5.48xlarge, 128 prompts x 16 samples, responses
lognormal (mean 2,000 tokens) cut at 8,192, vLLM TP4 engines, training TP8 with full recompute. The
estimate loop varies the generation TP, the group size and the placement, so no two plans are the same.
Not a test: no assertion on time (STYLE.md habit 12). Run: ``.venv/bin/python bench/bench_rl.py``.
"""

from __future__ import annotations

import copy
import itertools
import time

import fmsim
from fmsim.scenario import scenario_from_mapping

BASE = {
    "version": 1,
    "name": "bench-rl",
    "seed": 0,
    "workload": {"kind": "rl", "model": "qwen3-32b", "precision": "bf16"},
    "parallelism": {"tp": 8, "sequence_parallel": True, "recompute": "full", "zero": 1},
    "cluster": {"instance": "p5.48xlarge", "nodes": 16},
    "rl": {
        "algorithm": "grpo",
        "prompts": 128,
        "samples_per_prompt": 16,
        "train_global_batch": 512,
        "prompt_len": 300,
        "response_len": {"dist": "lognormal", "mean": 2000, "sigma": 0.8},
        "max_response_len": 8192,
        "generation": {"tp": 4, "memory_fraction": 0.6},
    },
}


def variant(gen_tp: int, samples: int, placement: str) -> dict:
    d = copy.deepcopy(BASE)
    d["rl"]["generation"]["tp"] = gen_tp
    d["rl"]["samples_per_prompt"] = samples
    d["rl"]["prompts"] = 2048 // samples
    if placement != "colocated":
        d["rl"]["placement"] = {"disaggregated": {"generation_nodes": 8, "training_nodes": 8}}
        d["rl"]["off_policy"] = 1 if placement == "off-policy" else 0
    return d


def main() -> None:
    sc = scenario_from_mapping(BASE, file="bench")
    fmsim.simulate(sc)  # warm imports and catalogs
    t0 = time.perf_counter()
    res = fmsim.simulate(sc)
    wall = time.perf_counter() - t0
    m = res.metrics
    print(
        f"one RL step, {res.gpus} GPUs, {m['rollouts_per_step']:,} rollouts (DES): wall {wall:.2f} s   "
        f"(target < 2 s)   step {m['step_time_s']:.1f} s, generation {m['generation_s']:.1f} s on "
        f"{len(res.details['simulated_engines'])} of {res.details['engines']} engines simulated"
    )
    plans = [
        scenario_from_mapping(variant(*v), file="bench")
        for v in itertools.product((2, 4, 8), (4, 8, 16, 32), ("colocated", "on-policy", "off-policy"))
    ]
    for p in plans[:3]:
        fmsim.estimate(p)
    t0, c0 = time.perf_counter(), time.process_time()
    for p in plans:
        fmsim.estimate(p)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"--estimate: {len(plans)} plans in {wall:.2f} s = {len(plans) / wall:,.0f} plans/s"
        f"   (target >= 100/s; {len(plans) / cpu:,.0f} per CPU-second, what a busy machine leaves aside)"
    )


if __name__ == "__main__":
    main()
