"""Checkpoints and failures: what share of wall-clock time a training run spends on useful steps.

Owns the goodput of a run from its scenario's ``checkpoint:`` and ``reliability:`` sections and
the storage it writes to (``cluster.storage``, a catalog FSx for Lustre or S3 tier):

* a checkpoint is the full training state -- bf16 weights and fp32 master weights, Adam m and v
  (14 bytes per trained parameter; Megatron distributed checkpoints save model and optimizer),
  written by all nodes at once at ``min(file-system throughput, nodes x per-client limit)``;
* a synchronous checkpoint stalls training for the whole write; an asynchronous one (Megatron
  async save, PyTorch DCP async) only for the part of the write that outlasts the interval;
* failures arrive at ``nodes / node_mtbf``; each costs the restart plus, on average, half an
  interval of lost work (Young 1974, "A first order approximation to the optimum checkpoint
  interval", CACM 17(9); Daly 2006, FGCS 22(3)), and Young's optimum interval
  ``sqrt(2 · checkpoint cost · MTBF)`` is reported as advice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..catalog import load_catalog
from ..model.memory import OPTIMIZER_BYTES, WEIGHT_BYTES

CHECKPOINT_BYTES_PER_PARAM = WEIGHT_BYTES + OPTIMIZER_BYTES


@dataclass(frozen=True, slots=True)
class Goodput:
    goodput: float                       # useful step time / wall-clock time, in (0, 1]
    checkpoint_bytes: float
    checkpoint_write_s: float | None     # one full write at the storage's rate (None: no storage given)
    checkpoint_stall_s: float            # training time lost per checkpoint
    failures_per_s: float
    young_interval_s: float | None       # Young's optimum checkpoint interval
    notes: tuple[str, ...]


def storage_write_bytes_per_s(sc) -> float | None:
    """Aggregate checkpoint write rate of the scenario's storage, or None if it names none."""
    st = sc.cluster.storage
    if not st:
        return None
    tier = load_catalog().storage_tier(st["tier"]) if st.get("tier") else None
    per_tib = st.get("throughput_per_tib") or (tier.throughput_per_tib_bytes_per_s if tier else 0.0)
    capacity = st.get("capacity")
    fs = per_tib * capacity / 2.0**40 if (per_tib and capacity) else math.inf
    client = 0.0
    if tier is not None:
        client = tier.per_client_efa_bytes_per_s or tier.per_client_bytes_per_s
    clients = client * sc.cluster.nodes if client else math.inf
    rate = min(fs, clients)
    return rate if math.isfinite(rate) and rate > 0 else None


def goodput(sc, trained_params: float) -> Goodput:
    """Goodput of ``sc`` training ``trained_params`` parameters (1.0 without checkpoint/reliability)."""
    notes = []
    ckpt_bytes = trained_params * CHECKPOINT_BYTES_PER_PARAM
    rate = storage_write_bytes_per_s(sc)
    write_s = ckpt_bytes / rate if rate else None
    ck, rel = sc.checkpoint, sc.reliability
    stall = 0.0
    interval = ck.every_s if ck is not None else None
    if ck is not None:
        if write_s is None:
            notes.append("checkpoint cost unknown: cluster.storage names no throughput (tier or capacity)")
        elif ck.async_:
            stall = max(0.0, write_s - ck.every_s)
            if stall:
                notes.append("asynchronous checkpoint writes outlast the interval and stall training")
        else:
            stall = write_s
    lam = sc.cluster.nodes / rel.node_mtbf_s if rel is not None else 0.0
    wall_per_useful = 1.0 + (stall / interval if interval else 0.0)
    if lam:
        lost = rel.restart_s + (interval / 2.0 if interval else 0.0)
        if not interval:
            notes.append("no checkpoint section: failures cost the restart only (lost work unknown)")
        waste = lam * lost
        if waste >= 1.0:
            notes.append("failures arrive faster than the run can make progress")
            return Goodput(0.0, ckpt_bytes, write_s, stall, lam, None, tuple(notes))
        wall_per_useful /= 1.0 - waste
    young = math.sqrt(2.0 * stall * (1.0 / lam)) if (lam and stall) else None
    return Goodput(1.0 / wall_per_useful, ckpt_bytes, write_s, stall, lam, young, tuple(notes))
