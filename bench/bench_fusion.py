"""What ``workload.kernel_fusion`` and ``workload.cuda_graphs`` do to a step (fmsim/model/fusion.py): prints the
estimated step time of each level and graph scope on a few plans, against the fused, graph-less default.

    python bench/bench_fusion.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's fmsim, not an installed one

PLANS = {
    "llama3-8b, seq 8192, FSDP on 8 H100 (device-bound)":
        dict(model="llama3-8b", seq=8192, tp=1, instance="p5.48xlarge", zero=3),
    "llama3-70b, seq 4096, TP 8 on 16 H100":
        dict(model="llama3-70b", seq=4096, tp=8, instance="p5.48xlarge", zero=1, gpus=16),
    "gpt-1.7b, seq 256, TP 8 on 8 H100 (short kernels: host-bound)":
        dict(model="gpt-1.7b", seq=256, tp=8, instance="p5.48xlarge", zero=1),
}


def _scenario(model, seq, tp, instance, zero, gpus=8):
    return {"version": 1, "name": "bench-fusion",
            "workload": {"kind": "pretrain", "model": model, "precision": "bf16", "seq_len": seq,
                         "global_batch": 8 * gpus // tp, "micro_batch": 1},
            "parallelism": {"tp": tp, "zero": zero}, "cluster": {"instance": instance, "gpus": gpus}}


def main() -> None:
    from fmsim import estimate
    from fmsim.catalog import load_catalog
    from fmsim.model.fusion import CUDA_GRAPHS, KERNEL_FUSIONS
    from fmsim.scenario import scenario_from_mapping

    cat = load_catalog()
    for title, plan in PLANS.items():
        base = _scenario(**plan)
        print(title)
        ref = None
        for level in KERNEL_FUSIONS:
            row = []
            for graphs in CUDA_GRAPHS:
                data = {**base, "workload": {**base["workload"], "kernel_fusion": level, "cuda_graphs": graphs}}
                t = estimate(scenario_from_mapping(data, catalog=cat)).metrics["step_time_s"]
                ref = ref or t
                row.append(f"{graphs} {t * 1e3:9.2f} ms ({t / ref:5.3f}x)")
            print(f"  {level:22s} " + "   ".join(row))


if __name__ == "__main__":
    main()
