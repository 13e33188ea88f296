"""An RL weight update priced alone (``rl.only: weight_sync``): the checkpoint-engine benchmark's update
of every generation engine from weights waiting in host memory, as one :class:`~fmsim.results.Result`.

No rollouts and no training run: the step is the update (``step_time_s`` = ``weight_sync_s``). The
update itself is :func:`fmsim.workloads.rl_phases.host_broadcast` (the same one a full RL step with
``weight_sync: {method: broadcast, source: host}`` prices). Method: ``docs/rl.md`` "Weight sync".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import OutOfMemoryError
from ..results import Result
from ..units import format_bytes
from . import rl_phases as ph
from .rl_spec import RLSpec


def write_sync_trace(res: Result, path: str) -> None:
    """``--trace`` of an update alone: one span on the GPUs' track (the timeline of an RL step has one phase)."""
    from ..engine.des import Job, run_jobs
    from .rl_timeline import timeline_rows, write_trace

    t = float(res.metrics["weight_sync_s"])
    run = run_jobs([Job("sync0", "gpus", t, (), category="weight_sync", label="weight update")], record=True)
    write_trace(run, path, res.scenario)
    res.details["timeline"] = timeline_rows(run)  # type: ignore[index]


#: device buffers of a broadcast update: the h2d buffer and the double IPC buffer, a bucket each
#: (checkpoint_engine/ps.py @415c3205 ``_update_per_bucket``: ``torch.empty(bucket_size)`` and
#: ``torch.empty(bucket_size * 2)``; ``_detect_bucket_size`` sizes the bucket to a third of free memory)
UPDATE_BUFFERS = 3


def update_memory(sc: Any, spec: RLSpec, engine_gpus: int) -> dict[str, float]:
    """HBM per GPU during the update: the engine's weight shard and the update's three bucket buffers
    (the KV cache the engine holds beside them is the engine's to size). Raises
    :class:`OutOfMemoryError` naming what overflows."""
    hbm = sc.cluster.instance.accelerator.hbm_bytes
    weights = ph.weight_bytes(sc) / engine_gpus
    buffers = UPDATE_BUFFERS * spec.weight_sync.bucket_bytes
    mem = {"engine_weights": weights, "update_buffers": buffers, "hbm": hbm}
    if weights + buffers > hbm:
        raise OutOfMemoryError(
            f"{sc.file}: rl.weight_sync.bucket: the engine's weights ({format_bytes(weights)} per GPU at tp "
            f"{engine_gpus}) and the update's 3 buffers of one bucket ({format_bytes(buffers)}) need "
            f"{format_bytes(weights + buffers)} of {format_bytes(hbm)}; lower the bucket or raise "
            "rl.generation.tp",
            breakdown=mem,
        )
    return mem


def weight_sync_result(sc: Any, spec: RLSpec) -> Result:
    """The update of every engine on the cluster's GPUs (checkpoint-engine's colocated parameter server:
    each GPU's rank holds a share of the checkpoint and the whole cluster is one broadcast group)."""
    from ..cost import price_for

    cl = sc.cluster
    engine_gpus = ph.check_generation_layout(sc, spec, cl.gpus)
    memory = update_memory(sc, spec, engine_gpus)
    hb = ph.host_broadcast(sc, spec.weight_sync.bucket_bytes, gpus=cl.gpus, nodes=cl.nodes, engine_gpus=engine_gpus)
    t = hb.time_s
    price = price_for(sc)
    usd_h = price.usd_per_hour * cl.nodes if price.usd_per_hour else None
    metrics: dict[str, Any] = {
        "step_time_s": t,
        "memory_per_gpu_bytes": memory["engine_weights"] + memory["update_buffers"],
        "hbm_per_gpu_bytes": cl.instance.accelerator.hbm_bytes,
        "fits": True,
        "usd_per_step": usd_h * t / 3600.0 if usd_h else None,
        "bottleneck": "weight_sync",
        "pricing_option": price.option,
        "algorithm": spec.algorithm,
        "placement": spec.placement.kind,
        "off_policy": 0,
        "rollouts_per_step": 0,  # no rollouts and no optimizer step: the update alone
        "generated_sequences_per_step": 0,
        "optimizer_steps": 0,
        "generation_gpus": cl.gpus,
        "training_gpus": 0,
        "generation_tp": engine_gpus,
        "weight_sync_s": t,
        "mean_step_time_s": t,
    }
    per_bucket = max(hb.h2d_s / hb.owners + hb.copy_s + hb.broadcast_s, hb.reload_s)
    what = "the NCCL broadcast" if hb.broadcast_s >= max(hb.copy_s, hb.reload_s) else "the engines' reload"
    details = {
        "method": "analytical",
        "weight_sync": {k: v for k, v in dataclasses.asdict(hb).items()},
        "engines": cl.gpus // engine_gpus,
        "engine_gpus": engine_gpus,
        "bottleneck": (
            f"100% of the step is the weight update: {hb.broadcasts:,} bucket turns of ~{per_bucket * 1e3:.0f} ms, "
            f"led by {what}; larger buckets, a faster fabric or fewer weights to move"
        ),
        "price_source": price.source,
        "pools": {"gpus": {"gpus": cl.gpus, "busy_fraction": 1.0}},
    }
    return Result(
        scenario=sc.name,
        kind="rl",
        instance=cl.instance.name,
        nodes=cl.nodes,
        gpus=cl.gpus,
        usd_per_hour=usd_h,
        price_date=price.date,
        metrics=metrics,
        breakdown={"weight_sync_s": t},
        memory=memory,
        details=details,
    )


__all__ = ["weight_sync_result"]
