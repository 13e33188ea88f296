"""Storage and failures in a training result: the one call :func:`fmsim.workloads.pretrain.make_result` makes.

Owns putting :mod:`fmsim.hardware.storage` (the file system), :mod:`.data_loading` (the stall per
step), :mod:`.checkpointing` (the plan's shards, write, restore, downtime) and :mod:`.reliability`
(the seeded run: interruptions, goodput and its spread, the best interval) together, and the
storage's dollars over the run: an FSx file system's provisioned capacity for the run's wall-clock
time at the tier's catalog price, or for S3 what is stored (``checkpoint.keep`` checkpoints and the
data read) plus its PUT and GET requests.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..hardware.storage import FileSystem, file_system
from .checkpointing import CheckpointCost, checkpoint_cost, contended_step_s
from .data_loading import DataLoad, data_stall
from .reliability import Goodput, as_details, run_goodput


@dataclass(frozen=True, slots=True)
class RunFigures:
    step_s: float                      # the step with its data-loading stall
    stall_s: float
    fs: FileSystem | None
    data: DataLoad | None
    ckpt: CheckpointCost
    good: Goodput

    def storage_usd(self, sc, wall_s: float | None, steps: float | None) -> float | None:
        fs = self.fs
        if fs is None or not wall_s:
            return None
        n_ckpt = wall_s / sc.checkpoint.every_s if sc.checkpoint else 0.0
        stored = (sc.checkpoint.keep if sc.checkpoint else 0) * self.ckpt.total_bytes
        gets = 0.0
        if self.data is not None and self.data.read_s is not None and steps:
            stored += self.data.bytes_per_step * steps
            gets = fs.requests(self.data.bytes_per_step) * steps if fs.is_s3 else 0.0
        return fs.usd(seconds=wall_s, stored_bytes=stored, puts=n_ckpt * self.ckpt.requests, gets=gets)

    def metrics(self, sc, wall_s: float | None, steps: float | None) -> dict[str, Any]:
        g = self.good
        return {"storage_usd": self.storage_usd(sc, wall_s, steps),
                "data_stall_share": self.stall_s / self.step_s if self.data is not None else None,
                "checkpoint_downtime_s": (g.checkpoint_stall_s if sc.checkpoint is not None
                                          and g.checkpoint_write_s is not None else None),
                "expected_interruptions": g.interruptions, "goodput_p10": g.goodput_p10,
                "goodput_p90": g.goodput_p90}

    def details(self) -> dict[str, Any]:
        det = as_details(self.good)
        c = self.ckpt
        det.update({"mode": c.mode, "rank_bytes_by_stage": list(c.rank_bytes), "node_bytes": c.node_bytes,
                    "device_to_host_s": c.copy_s, "slowdown_beside_write": c.slowdown})
        out: dict[str, Any] = {"checkpoint": det}
        if self.fs is not None:
            fs = self.fs
            out["storage"] = {"kind": fs.kind, "tier": fs.tier.name if fs.tier else None,
                              "capacity_bytes": fs.capacity_bytes, "read_bytes_per_s": fs.read_bytes_per_s,
                              "write_bytes_per_s": fs.write_bytes_per_s,
                              "client_bytes_per_s": fs.client_bytes_per_s, "efa": fs.efa,
                              "usd_per_gb_month": fs.usd_per_gb_month, "price_date": fs.price_date,
                              "notes": list(fs.notes)}
        if self.data is not None:
            out["data_loading"] = {"bytes_per_step": self.data.bytes_per_step, "read_s": self.data.read_s,
                                   "stall_s": self.data.stall_s, "notes": list(self.data.notes)}
        return out


def run_figures(sc, plan, step_s: float, *, train_tokens: float | None,
                contention: bool = False) -> RunFigures:
    """Storage, data-loading and failure figures of ``sc`` run with ``plan`` at ``step_s`` per step.
    ``contention``: replay the step in the engine beside the file-system traffic that rides EFA
    (the discrete-event path); the analytical path leaves it out."""
    fs = file_system(sc.cluster.storage, plan.instance)
    data = data_stall(sc, fs, plan.nodes, step_s)
    stall = data.stall_s if data is not None else 0.0
    if contention and data is not None and data.read_s and fs is not None and fs.efa:
        # the reads ride the same EFA NICs as the step's collectives: replay the step beside them
        rate = data.bytes_per_step / max(step_s, data.read_s) / plan.gpus
        slower = contended_step_s(plan, step_s, rx_per_gpu=rate) - step_s
        if slower > 0:
            stall += slower
            data = dataclasses.replace(data, stall_s=stall, notes=data.notes + (
                f"the reads over EFA slow the step's collectives by {slower:.3g} s",))
    step = step_s + stall
    ck = sc.checkpoint
    cost = checkpoint_cost(plan, fs, async_=bool(ck and ck.async_), interval_s=ck.every_s if ck else None,
                           grads=bool(ck and ck.grads), step_s=step_s,
                           contention=contention and ck is not None,
                           shard_width=sc.parallelism.shard_width if plan.zero else None,
                           frozen=bool(getattr(sc.workload, "lora_rank", 0)),
                           staging=ck.staging if ck else "pinned", writers=ck.writers if ck else "all",
                           master_only=bool(ck and ck.master_only))
    useful = train_tokens / plan.tokens_per_step * step if train_tokens else None
    downtime = cost.downtime_s or 0.0
    good = run_goodput(sc, ckpt_bytes=cost.total_bytes, write_s=cost.write_s, downtime_s=downtime,
                       restore_s=cost.restore_s, gpus=plan.gpus, nodes=plan.nodes,
                       nics_per_node=plan.instance.num_nics, useful_s=useful,
                       min_interval_s=cost.write_s if (ck and ck.async_ and cost.write_s) else 0.0)
    return RunFigures(step, stall, fs, data, cost, good)


def wall_time_s(useful_s: float | None, good: Goodput) -> float | None:
    if not useful_s or not good.goodput or not math.isfinite(useful_s):
        return None
    return useful_s / good.goodput


__all__ = ["RunFigures", "run_figures", "wall_time_s"]


def summary_lines(details: Any, fmt) -> list[str]:
    """The human block's "storage and failures" lines from a result's details (``fmsim run``);
    ``fmt(col, value)`` formats a value as the column ``col`` would be."""
    if not isinstance(details, dict):
        return []
    ck, st, dl = details.get("checkpoint"), details.get("storage"), details.get("data_loading")
    if not isinstance(ck, dict) or not (st or dl or ck.get("interruptions") is not None or ck.get("write_s")):
        return []
    out = ["  storage and failures"]
    if isinstance(st, dict):
        cap = fmt("x_bytes", st["capacity_bytes"]) if st.get("capacity_bytes") else "-"
        out.append(f"    file system       {st.get('tier') or st.get('kind')}, {cap}, read "
                   f"{fmt('x_bytes', st['read_bytes_per_s'])}/s, "
                   f"per node {fmt('x_bytes', st['client_bytes_per_s'])}/s"
                   f"{' over EFA' if st.get('efa') else ''}")
    if isinstance(dl, dict):
        out.append(f"    data loading      {fmt('x_bytes', dl['bytes_per_step'])} per step, read in "
                   f"{fmt('x_s', dl['read_s'])}, stall {fmt('x_s', dl['stall_s'])} per step")
    if ck.get("write_s") is not None:
        out.append(f"    checkpoint        {fmt('x_bytes', ck['bytes'])} ({ck.get('mode')}), write "
                   f"{fmt('x_s', ck['write_s'])}, restore {fmt('x_s', ck.get('restore_s'))}, downtime "
                   f"{fmt('x_s', ck['stall_s'])} each")
    if ck.get("young_interval_s"):
        best = fmt("x_s", ck.get("best_interval_s")) if ck.get("best_interval_s") else "-"
        out.append(f"    best interval     Young {fmt('x_s', ck['young_interval_s'])}, Daly "
                   f"{fmt('x_s', ck.get('daly_interval_s'))}, simulated {best}")
    if ck.get("interruptions") is not None:
        lo, hi = ck.get("interruptions_p10"), ck.get("interruptions_p90")
        spread = f" (p10 {lo:.0f}, p90 {hi:.0f})" if lo is not None and hi is not None else ""
        out.append(f"    interruptions     {ck['interruptions']:.1f} expected{spread}; lost work "
                   f"{fmt('x_s', ck.get('lost_work_s'))}, "
                   f"restart + restore {fmt('x_s', ck.get('restart_restore_s'))}")
    if ck.get("goodput_p50") is not None:
        out.append(f"    goodput           p10 {ck['goodput_p10']:.2%}, p50 {ck['goodput_p50']:.2%}, "
                   f"p90 {ck['goodput_p90']:.2%}")
    return out
