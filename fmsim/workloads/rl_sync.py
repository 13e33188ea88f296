"""An RL weight update priced alone (``rl.only: weight_sync``): the checkpoint-engine benchmark's update
of every generation engine from weights waiting in host memory, as one :class:`~fmsim.results.Result`.

No rollouts and no training run: the step is the update (``step_time_s`` = ``weight_sync_s``). The
update itself is :func:`fmsim.workloads.rl_phases.host_broadcast` (the same one a full RL step with
``weight_sync: {method: broadcast, source: host}`` prices). Method: ``docs/rl.md`` "Weight sync".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..results import Result
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


def weight_sync_result(sc: Any, spec: RLSpec) -> Result:
    """The update of every engine on the cluster's GPUs (checkpoint-engine's colocated parameter server:
    each GPU's rank holds a share of the checkpoint and the whole cluster is one broadcast group)."""
    from ..cost import price_for

    cl = sc.cluster
    engine_gpus = ph.check_generation_layout(sc, spec, cl.gpus)
    hb = ph.host_broadcast(sc, spec.weight_sync.bucket_bytes, gpus=cl.gpus, nodes=cl.nodes, engine_gpus=engine_gpus)
    t = hb.time_s
    price = price_for(sc)
    usd_h = price.usd_per_hour * cl.nodes if price.usd_per_hour else None
    metrics: dict[str, Any] = {
        "step_time_s": t,
        "hbm_per_gpu_bytes": cl.instance.accelerator.hbm_bytes,
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
        details=details,
    )


__all__ = ["weight_sync_result"]
