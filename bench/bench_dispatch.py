"""Print MoE dispatch times per message size: NCCL's all-to-all (the protocol it picks) and DeepEP's kernels.

    python bench/bench_dispatch.py

Figures, not assertions (tests/test_dispatch.py holds the shape): for a few EP groups, the time of one
all-to-all at each per-peer size, the protocol NCCL's send/recv takes there, the share of the time that is
latency, and DeepEP's normal kernels on the same bytes; then DeepEP's low-latency dispatch at decode batch sizes.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's fmsim, not an installed one

from fmsim.catalog import load_catalog
from fmsim.hardware.collectives import GroupShape, all_to_all_time
from fmsim.hardware.dispatch import p2p_protocol
from fmsim.model.deepep import layer_time_fn

GROUPS = [("p5.48xlarge", 8), ("p5.48xlarge", 64), ("p4d.24xlarge", 32), ("p5en.48xlarge", 64), ("dgx-h100", 64)]
PER_PEER = [256, 4096, 16384, 16385, 65536, 262144, 1 << 20, 4 << 20]


def main() -> None:
    cat = load_catalog()
    for name, ep in GROUPS:
        inst = cat.instance(name)
        shape = GroupShape(size=ep, per_node=min(ep, inst.num_accelerators))
        nodes = -(-ep // inst.num_accelerators)
        print(f"\n{name} EP{ep} ({nodes} node{'s' if nodes > 1 else ''}, fabric {inst.fabric.name})")
        print(f"{'per peer':>10} {'proto':>6} {'NCCL us':>10} {'latency %':>10} {'DeepEP us':>10}")
        for m in PER_PEER:
            size = float(m * ep)
            t = all_to_all_time(size, inst, shape, nodes=nodes).time_s
            # the latency term: t = alpha + beta S under one protocol, read from two sizes on the same side of 16 KiB
            other = size / 2 if m <= 16384 else size * 2
            t2 = all_to_all_time(other, inst, shape, nodes=nodes).time_s
            alpha = (t * other - t2 * size) / (other - size)
            d = all_to_all_time(size, inst, shape, nodes=nodes, kernel="deepep").time_s
            proto = p2p_protocol(float(m), inst.fabric.name if nodes > 1 else None)
            print(f"{m:>10} {proto:>6} {t * 1e6:>10.1f} {100 * alpha / t:>9.0f}% {d * 1e6:>10.1f}")
    inst = cat.instance("dgx-h100")
    print("\nDeepEP low-latency dispatch + combine on dgx-h100, hidden 7168, top-8, FP8 dispatch (us; calls of 128)")
    eps = (8, 16, 32, 64, 128, 256)
    print(f"{'tokens':>7} " + " ".join(f"{'EP' + str(ep):>8}" for ep in eps))
    fns = {ep: layer_time_fn("low_latency", inst, hidden=7168, top_k=8, nodes=-(-ep // inst.num_accelerators))
           for ep in eps}
    for tokens in (1, 8, 32, 128, 256):
        print(f"{tokens:>7} " + " ".join(f"{fns[ep](tokens, ep) * 1e6:>8.1f}" for ep in eps))


if __name__ == "__main__":
    main()
