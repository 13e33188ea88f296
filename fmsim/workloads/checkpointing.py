"""Checkpoints as the plan shards them: what each rank writes, how long the write and the restore take,
and what a synchronous or asynchronous save costs the training run.

Owns :func:`checkpoint_cost`:

* **What is saved.** Each rank saves its share of the training state from the parallel layout and the
  ZeRO stage -- the bf16 weights it holds and its fp32 master weights and Adam moments
  (:mod:`fmsim.model.memory`, per pipeline stage), and its fp32 gradients with ``checkpoint.grads`` --
  divided by the number of ranks holding the same copy: PyTorch DCP (``dedup_replicated_tensors``) and
  Megatron's fully parallel save write a replicated tensor once, so the shards over all ranks add up to
  the full state (weights over dp x cp replicas, ZeRO-sharded optimizer state over dp / dp_shard).
  ``checkpoint.master_only``: the parameters *are* the fp32 master weights (PyTorch FSDP keeps its sharded
  flat parameters in the module's dtype and casts to ``MixedPrecision.param_dtype`` only for compute), so
  no separate bf16 copy is saved: 12 B per parameter instead of 14.
* **Write.** All nodes write at once: the slowest of the file system's aggregate rate shared by the nodes
  (:meth:`fmsim.hardware.storage.FileSystem.transfer_s`), the most loaded node at its client limit, and the
  file creates against the FSx metadata IOPS (one file per writing rank plus the ``.metadata`` file: DCP's
  ``FileSystemWriter(single_file_per_rank=True)``, Megatron's ``torch_dist`` format likewise; one metadata
  operation each, as data loading counts one per open).
* **Who writes** (``checkpoint.writers``): ``all`` ranks, replicated tensors spread over their replicas
  (above), or ``first-replica``: only the first data-parallel replica's ranks save, each its whole ZeRO
  shard (IBM's fms-fsdp Checkpointer under HSDP: ``_do_save`` is ``rank == local_rank``, so node 0's
  shard group writes everything; foundation-model-stack/fms-fsdp@5a296af,
  fms_fsdp/utils/checkpointing_utils.py). The bytes still add up to the full state; fewer nodes move them.
* **Synchronous** save (torch DCP ``save``, Megatron without ``--async-save``): training waits for the
  whole write. **Asynchronous** (DCP ``async_save``, Megatron ``--async-save``): training waits for the
  device-to-host copy of the rank's shard over its host link (PCIe / NVLink-C2C, catalog ``host_link``),
  then the write runs behind the next steps -- over the same EFA NICs as the collectives when the file
  system is EFA-attached, which slows those steps (:func:`contended_step_s`, the engine's flows) -- and
  stalls training again only if it outlasts the checkpoint interval. The copy (``checkpoint.staging``):
  ``pinned`` -- a blocking copy into page-locked buffers at the host link's rate (DCP's
  ``BlockingAsyncStager(cache_staged_state_dict=True)``; Megatron-Core's ``--async-save``,
  ``FileSystemWriterAsync.preload_tensors``: ``tensor.to("cpu", non_blocking=True)``, "knob to enable pinned
  D2H memcpy", megatron/core/dist_checkpointing/strategies/filesystem_async.py; the default here);
  ``pageable`` -- a blocking copy into freshly allocated pageable memory, tensor by tensor (DCP
  ``async_save`` given no stager: the ``FileSystemWriter``'s ``BlockingAsyncStager`` with
  ``cache_staged_state_dict=False``, ``_offload_state_dict_to_cpu`` in PyTorch 2.4), slower by
  :data:`PAGEABLE_SLOWDOWN`; ``overlapped`` -- DCP's ``DefaultStager`` (PyTorch 2.9:
  pinned, shared memory, ``use_async_staging``) copies on a background stream while the next step runs,
  and training blocks only for what of the copy outlasts that step (NeMo Automodel waits for the staging
  before ``optimizer.step``, recipes/llm/train_ft.py ``maybe_wait_for_staging``; ASSUMED: the whole step
  is the window, the optimizer's share of it left in). Not modelled, as no source gives a rate: building
  the state dict, the save-plan gather/scatter (it runs in DCP's background thread or process for an
  asynchronous save, on the training path for a synchronous one), serialisation, and per-file metadata.
* **Restore** after an interruption: every rank reads its shard back at the file system's read rate.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hardware.storage import FileSystem
from ..model.memory import GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES

#: a copy between device and pageable host memory against page-locked, on a node of 8 GPUs copying at
#: once: DeepSpeed's switch of its ZeRO-offload copies from pageable to pinned buffers "Speedup h2d memcpy by
#: 6x on single GPU and 4-5x on 8GPU node" (deepspeedai/DeepSpeed, formerly microsoft/, pull request #5301,
#: 2024-03-20, commit 7b5b066; #6670 pins the d2h side the same way, giving no figure). The middle of 4-5 on
#: multi-GPU nodes, 6 on one GPU; measured host-to-device, taken for device-to-host (ASSUMED)
PAGEABLE_SLOWDOWN = 4.5
PAGEABLE_SLOWDOWN_ONE_GPU = 6.0
STAGING_MODES = ("pinned", "pageable", "overlapped")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCost:
    total_bytes: float                   # the whole checkpoint, all ranks
    rank_bytes: tuple[float, ...]        # per pipeline stage: one rank's shard
    node_bytes: float                    # the most loaded node's share
    write_s: float | None                # one full write (None: no file system)
    restore_s: float | None              # one full read back
    copy_s: float                        # device -> host copy of a rank's shard (async)
    downtime_s: float | None             # training time lost per checkpoint
    slowdown: float = 1.0                # step time beside the background write / without it (async, EFA)
    requests: float = 0.0                # S3 PUT requests per checkpoint
    mode: str = "sync"


def _writing_dp(plan, shard_width: int | None, writers: str) -> tuple[int, int]:
    """(data-parallel ranks that write, ZeRO shard width): all of dp, or the first replica's shard group."""
    shard = max(1, shard_width or plan.dp)
    if writers == "first-replica":
        return min(shard, plan.dp), min(shard, plan.dp)
    if writers != "all":
        raise ValueError(f"checkpoint writers {writers!r}: expected all or first-replica")
    return plan.dp, shard


def rank_shard_bytes(plan, *, shard_width: int | None = None, grads: bool = False,
                     frozen: bool = False, writers: str = "all",
                     master_only: bool = False) -> tuple[float, ...]:
    """Bytes one writing rank of each pipeline stage saves (replicated tensors counted once over their
    replicas); ``shard_width``: the data-parallel ranks one ZeRO shard group spans (dp unless hybrid
    sharding); ``writers``: ``all`` or ``first-replica`` (module docstring)."""
    dp, shard = _writing_dp(plan, shard_width, writers)
    weight_copies = dp * plan.cp if plan.zero < 3 else max(1, dp // shard)
    opt_copies = dp * plan.cp if plan.zero < 1 else max(1, dp // shard)
    grad_copies = dp * plan.cp if plan.zero < 2 else max(1, dp // shard)
    out = []
    for mem in plan.memory:
        # LoRA (``frozen``): the base weights are not saved, only the adapters' bf16 weights and their
        # optimizer state (what the optimizer holds: 12 B per trained parameter, so 2/12 of it again)
        w = mem.optimizer * WEIGHT_BYTES / OPTIMIZER_BYTES if frozen else mem.weights
        if master_only:
            w = 0.0
        b = w / (opt_copies if frozen else weight_copies) + mem.optimizer / opt_copies
        if grads:
            b += mem.gradients / grad_copies
        out.append(b)
    return tuple(out)


def writing_ranks_per_stage(plan, *, shard_width: int | None = None, writers: str = "all") -> int:
    """Ranks of one pipeline stage that write: tp x cp x the writing data-parallel ranks."""
    return plan.tp * plan.cp * _writing_dp(plan, shard_width, writers)[0]


def total_state_bytes(plan, *, shard_width: int | None = None, grads: bool = False,
                      frozen: bool = False, writers: str = "all", master_only: bool = False) -> float:
    """The checkpoint over all writing ranks: every stage's shard times its writing ranks."""
    ranks_per_stage = writing_ranks_per_stage(plan, shard_width=shard_width, writers=writers)
    return sum(b * ranks_per_stage for b in rank_shard_bytes(plan, shard_width=shard_width, grads=grads,
                                                              frozen=frozen, writers=writers,
                                                              master_only=master_only))


def contended_step_s(plan, step_s: float, *, tx_per_gpu: float = 0.0, rx_per_gpu: float = 0.0) -> float:
    """Step time when file-system traffic of ``tx_per_gpu`` / ``rx_per_gpu`` bytes/s per GPU crosses the
    same NICs as the step's collectives: the step's jobs are replayed in the engine with one more flow
    per stage and direction, capped at that rate by a link of its own, sharing the NIC max-min fairly."""
    if tx_per_gpu <= 0 and rx_per_gpu <= 0:
        return step_s
    from ..engine.des import Job, run_jobs
    from .pretrain import build_jobs, link_capacities   # deferred: pretrain imports this module's users

    jobs = list(build_jobs(plan))
    caps = dict(link_capacities(plan))
    horizon = 4.0 * step_s
    keys = {j.key for j in jobs}
    for s in range(plan.pp):
        for way, rate in (("tx", tx_per_gpu), ("rx", rx_per_gpu)):
            if rate > 0:
                caps[("fs-" + way, s)] = rate
                # lasts past the step at its own rate: the duration is priced at the slowest link it crosses
                jobs.append(Job(f"fs-{way}{s}", None, horizon, links=((way, s), ("fs-" + way, s)),
                                category="storage", label=f"file-system {way}"))
    run = run_jobs(jobs, caps, contention=True, record=False)
    return max(e for k, e in run.end_s.items() if k in keys)


def staging_copy_s(plan, shard_bytes: float, staging: str = "pinned") -> float:
    """Seconds to copy one rank's ``shard_bytes`` to host memory: the host link's rate, pageable memory
    slower by :data:`PAGEABLE_SLOWDOWN` (``overlapped`` copies as ``pinned`` do)."""
    if staging not in STAGING_MODES:
        raise ValueError(f"checkpoint staging {staging!r}: expected one of {', '.join(STAGING_MODES)}")
    host = plan.instance.accelerator.host_link_bytes_per_s
    if not host:
        return 0.0
    if staging == "pageable":
        host /= PAGEABLE_SLOWDOWN_ONE_GPU if plan.instance.num_accelerators == 1 else PAGEABLE_SLOWDOWN
    return shard_bytes / host


def checkpoint_cost(plan, fs: FileSystem | None, *, async_: bool, interval_s: float | None,
                    grads: bool = False, step_s: float | None = None, contention: bool = True,
                    shard_width: int | None = None, frozen: bool = False, staging: str = "pinned",
                    writers: str = "all", master_only: bool = False) -> CheckpointCost:
    """Bytes, write, restore and downtime of one checkpoint of ``plan`` to ``fs`` (see module docstring)."""
    kw = dict(shard_width=shard_width, grads=grads, frozen=frozen, writers=writers, master_only=master_only)
    ranks = rank_shard_bytes(plan, **kw)
    total = total_state_bytes(plan, **kw)
    gpn = plan.instance.num_accelerators
    writing = writing_ranks_per_stage(plan, shard_width=shard_width, writers=writers) * plan.pp
    nodes = min(plan.nodes, max(1, -(-writing // gpn)))
    node_bytes = max(ranks) * min(gpn, writing)
    copy_s = staging_copy_s(plan, max(ranks), staging)
    mode = "async" if async_ else "sync"
    if fs is None:
        return CheckpointCost(total_bytes=total, rank_bytes=ranks, node_bytes=node_bytes, write_s=None,
                              restore_s=None, copy_s=copy_s, downtime_s=None, mode=mode)
    creates = (writing + 1) / fs.metadata_iops if not fs.is_s3 else 0.0
    write_s = max(fs.transfer_s(total, nodes, write=True), node_bytes / fs.client_bytes_per_s, creates)
    # a restore reads the state back on every node; with first-replica writers each replica reads it whole
    replicas = max(1, plan.dp // _writing_dp(plan, shard_width, writers)[0])
    restore_s = max(fs.transfer_s(total * replicas, plan.nodes, write=False),
                    max(ranks) * gpn / fs.client_bytes_per_s)
    puts = fs.requests(total, files=writing) if fs.is_s3 else 0.0
    if not async_:
        return CheckpointCost(total_bytes=total, rank_bytes=ranks, node_bytes=node_bytes, write_s=write_s,
                              restore_s=restore_s, copy_s=copy_s, downtime_s=write_s, requests=puts)
    slowdown = 1.0
    if fs.efa and step_s and contention and write_s > 0:
        per_gpu = total / write_s / plan.gpus
        slowdown = contended_step_s(plan, step_s, tx_per_gpu=per_gpu) / step_s
    # steps beside the write run slower: the time lost is the write's length times the slowed share
    behind = write_s * (1.0 - 1.0 / slowdown)
    over = max(0.0, write_s - interval_s) if interval_s else 0.0
    # overlapped staging: the next step runs beside the copy; training waits only for the rest of it
    blocked = max(0.0, copy_s - step_s) if staging == "overlapped" and step_s else copy_s
    return CheckpointCost(total_bytes=total, rank_bytes=ranks, node_bytes=node_bytes, write_s=write_s,
                          restore_s=restore_s, copy_s=copy_s, downtime_s=blocked + behind + over,
                          slowdown=slowdown, requests=puts, mode="async")


__all__ = ["CheckpointCost", "PAGEABLE_SLOWDOWN", "STAGING_MODES", "checkpoint_cost", "contended_step_s",
           "rank_shard_bytes", "staging_copy_s", "total_state_bytes", "writing_ranks_per_stage", "GRAD_BYTES"]
