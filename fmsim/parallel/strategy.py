"""Compile a training scenario into a frozen :class:`Plan` (STYLE habit 5: compile, then run).

Owns: checking the scenario's parallel layout against the cluster and the batch, the :class:`Plan`
itself, the memory per device of each physical stage, and putting the parts together. The
analytical estimate and the discrete-event engine both consume the same Plan, so each checks the
other. The parts live in their own modules:

* :mod:`.comm_cost` -- where each axis's group is placed, collective costs over it, overlap slowdown;
* :mod:`.stage_costs` -- the split of layers over (virtual) stages and each one's forward/backward
  costs from the operator model, its inline TP/CP/EP collectives exposed;
* :mod:`.stage_extras` -- fp8 amax reduction and weight casts, unfused gradient accumulation;
* :mod:`.data_parallel` -- gradient buckets, weight gathers and the optimizer step per stage.

The names callers import from here (and :func:`clear_caches`, which empties every module's memo)
stay here.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from collections.abc import Mapping

from ..catalog import Instance
from ..engine.order_stats import expected_max_normal
from ..errors import ParallelismError
from ..hardware.collectives import GroupShape
from ..model.architecture import ModelSpec
from ..model.flops import exact_forward_flops_per_token
from ..model.kernels import BYTES_PER_ELEMENT
from ..model.sac import attention_kept
from ..model.memory import (
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    MemoryBreakdown,
    layer_activation_bytes,
    stage_activations_cached,
    stage_params_cached,
    training_memory,
)
from ..model.ops import Shard
from ..scenario import DEFAULT_GRAD_BUCKET, GRAD_BUCKET_MEGATRON
from ..scenario.parallelism import default_grad_reduce_op
from .comm_cost import _PLACED, _SHARED, CommCoster, _place_shared, overlap_slowdown
from .data_parallel import _DP, _dp_costs_shared, _dp_group, _edp_group, _fsdp_units_shared, _hybrid_groups, _Lora
from .schedules import schedule_tasks
from .stage_costs import _PIECES, _STAGES, StageCost, _split_layers, _stage_costs_shared, split_layers
from .stage_extras import (
    _fp8_weight_bytes,
    _with_amax_reduction,
    _with_uncached_fp8_weights,
    _with_unfused_grad_accumulation,
)
from .zero3 import deepspeed_stage

# re-exported: the names that lived here before the split, which callers and tests import from here
from ..model.ops import Roofline  # noqa: F401
from .comm_cost import COMM_SMS, _PLACED_MAX, _SHARED_CLUSTERS, _SHARED_COSTS, _shared_costs  # noqa: F401
from .data_parallel import (  # noqa: F401
    FP16_UNSCALE_BYTES_PER_PARAM,
    MAX_BUCKETS_PER_STAGE,
    OPTIMIZER_BYTES_PER_PARAM,
    _DP_MAX,
    _fsdp_units,
    _local_trainable,
)
from .stage_costs import _STAGES_MAX, _exposed, build_stage_costs  # noqa: F401
from .stage_extras import FP8_AMAXES_PER_GEMM, GEMMS_PER_LAYER  # noqa: F401


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything the estimate and the engine need, derived once from a scenario."""

    name: str
    model: ModelSpec
    instance: Instance
    nodes: int
    gpus: int
    precision: str
    seq_len: int
    global_batch: int
    micro_batch: int
    num_microbatches: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    schedule: str
    zero: int
    recompute: str
    sequence_parallel: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    overlap_tp_comm: bool
    shapes: Mapping[str, GroupShape]
    stages: tuple[StageCost, ...]                 # per virtual stage, index = chunk * pp + stage
    pp_send_s: float                              # one activation/gradient send between stages
    pp_cross_node: bool
    #: the data-parallel reductions and gathers (over dp·cp ranks, experts over their own group) leave
    #: the node, so they share its NICs and contend with each other
    dp_cross_node: bool
    dp_buckets: tuple[tuple[float, ...], ...]     # per physical stage: reduce-scatter seconds per bucket
    dp_gather_s: tuple[float, ...]                # per physical stage: param all-gather seconds
    optimizer_s: tuple[float, ...]                # per physical stage
    memory: tuple[MemoryBreakdown, ...]           # per physical stage
    hbm_bytes: float
    straggler_cv: float = 0.0
    recompute_modules: tuple[str, ...] = ()       # what selective recompute runs again
    recompute_share: float = 1.0                  # share of the layers full recompute covers (block method)
    offload_layers: int = 0                       # layers whose activations wait in host memory
    overlap_pp_comm: bool = False                 # pipeline sends beside compute (else a stage waits for its own)

    @property
    def tokens_per_step(self) -> float:
        return float(self.global_batch) * self.seq_len

    @property
    def overlap_slowdown(self) -> float:
        """Share of its speed compute loses while a collective overlaps it (:func:`overlap_slowdown`)."""
        return overlap_slowdown(self.instance)

    @property
    def straggler_task_factor(self) -> float:
        """Each task waits for the slowest of the tp·cp·ep ranks that synchronise inside it."""
        if not self.straggler_cv:
            return 1.0
        return 1.0 + self.straggler_cv * expected_max_normal(self.tp * self.cp * self.ep)

    def straggler_step_wait_s(self, task_s: list[float]) -> float:
        """Gradient sync waits for the slowest data-parallel replica: a replica's task times add up
        to a sum whose spread is cv·sqrt(Σ t²); the expected maximum over dp replicas adds e(dp) of it."""
        if not self.straggler_cv or self.dp <= 1:
            return 0.0
        return self.straggler_cv * math.sqrt(sum(t * t for t in task_s)) * expected_max_normal(self.dp)

    def virtual_stage(self, stage: int, chunk: int) -> StageCost:
        return self.stages[chunk * self.pp + stage]


def clear_caches() -> None:
    """Forget every cost shared across plans (tests compare cached and uncached evaluations)."""
    _SHARED.clear()
    _STAGES.clear()
    _PIECES.clear()
    _PLACED.clear()
    _DP.clear()
    for fn in CACHED:
        fn.cache_clear()


@functools.lru_cache(maxsize=4096)
def _stage_memories(model: ModelSpec, pp: int, vpp: int, micro_batch: int, seq_len: int, tp: int, shard_w: int,
                    cp: int, ep: int, zero: int, sequence_parallel: bool, recompute: str, recompute_layers: int,
                    schedule: str, num_microbatches: int, recompute_modules: tuple[str, ...], etp: int,
                    grad_bytes: float, weight_bytes: float, gemm_in: float, frozen_mlp: bool, offload_layers: int,
                    moe_load: float, act_in: float, recompute_policy: str, keep_attention: bool,
                    masks: float) -> tuple[MemoryBreakdown, ...]:
    """:func:`training_memory` of each physical stage, memoised on its frozen inputs (the plans of a search
    on other instance types or node counts repeat them: none of these reads the instance)."""
    layers = _split_layers(model.layers, pp, vpp)
    # Megatron-LM's block method: the first recompute_layers layers of each virtual stage recompute
    recomputed = frozenset(i for chunk in layers for i in chunk[:recompute_layers]) \
        if recompute == "full" and recompute_layers else None
    return tuple(
        training_memory(model, stage_layers=[i for c in range(vpp) for i in layers[c * pp + s]], first=s == 0,
                        last=s == pp - 1, micro_batch=micro_batch, seq_len=seq_len, tp=tp, pp=pp, dp=shard_w, cp=cp,
                        ep=ep, vpp=vpp, zero=zero, sequence_parallel=sequence_parallel, recompute=recompute,
                        schedule=schedule, num_microbatches=num_microbatches, stage=s,
                        recompute_modules=recompute_modules, expert_tp=etp, grad_bytes=grad_bytes,
                        weight_bytes=weight_bytes, gemm_input_bytes=gemm_in, frozen_mlp=frozen_mlp,
                        offload_layers=offload_layers, moe_load=moe_load, act_input_bytes=act_in,
                        recomputed=recomputed, recompute_policy=recompute_policy, keep_attention=keep_attention,
                        dropout_mask_bytes=masks)
        for s in range(pp))


#: the memoised pure functions of frozen inputs the estimate calls (functools LRU caches, bounded)
CACHED = (stage_params_cached, exact_forward_flops_per_token, _fsdp_units_shared, stage_activations_cached,
          schedule_tasks, _stage_memories, _split_layers)


def _check_hybridep(sc, inst: Instance, ep_shape) -> None:
    """HybridEP is priced from its GB200 table, inside one NVLink domain: Megatron-Bridge applies it on GB200 /
    GB300 NVL72 only (src/megatron/bridge/training/flex_dispatcher_backend.py @d19cb73c), and fmsim has no table
    of its RDMA path."""
    if inst.scale_up.kind != "nvl-domain":
        raise ParallelismError(f"hybridep runs on NVL72-class NVLink domains (GB200/GB300); {inst.name} has a "
                               f"{inst.scale_up.kind} scale-up", file=sc.file, field="parallelism.ep_dispatch")
    if ep_shape.size > ep_shape.per_domain:
        raise ParallelismError(f"hybridep is priced inside one NVLink domain; the EP group of {ep_shape.size} spans "
                               f"{-(-ep_shape.size // max(1, ep_shape.per_domain))} domains of {inst.name}",
                               file=sc.file, field="parallelism.ep_dispatch")


def build_plan(sc) -> Plan:
    """Validate and derive everything a training simulation needs from a Scenario."""
    w, par, cl = sc.workload, sc.parallelism, sc.cluster
    model: ModelSpec = w.model
    inst: Instance = cl.instance
    tp, pp, dp, cp, ep, vpp = par.tp, par.pp, par.dp, par.cp, par.ep, par.vpp
    schedule = "interleaved" if vpp > 1 else par.schedule
    if schedule == "interleaved" and pp == 1:
        raise ParallelismError("interleaved schedule needs pp > 1", file=sc.file, field="parallelism.vpp")
    if tp * pp * dp * cp != cl.gpus:
        raise ParallelismError(f"tp·pp·dp·cp = {tp * pp * dp * cp} does not equal {cl.gpus} GPUs",
                               file=sc.file, field="parallelism.dp")
    per_replica = w.global_batch // dp
    if w.global_batch % dp or per_replica % w.micro_batch:
        raise ParallelismError(
            f"global_batch {w.global_batch} is not a multiple of dp·micro_batch = {dp * w.micro_batch}",
            file=sc.file, field="workload.global_batch")
    m = per_replica // w.micro_batch
    if schedule == "interleaved" and m % pp:
        # Megatron-Core runs interleaved micro-batches in groups of pp (microbatch_group_size_per_vp_stage)
        # and refuses a last group shorter than pp; PyTorch's ScheduleInterleaved1F1B needs the same
        raise ParallelismError(
            f"the interleaved schedule needs the micro-batches per step, {m} = global_batch / "
            f"(dp·micro_batch), to be a multiple of pp = {pp} (they run in groups of pp); "
            f"make global_batch a multiple of {dp * w.micro_batch * pp}, or use schedule 1f1b",
            file=sc.file, field="workload.global_batch")
    order = tuple(par.order)
    # experts: their own TP width (Megatron-Core MoE parallel folding) -- tp without EP, 1 with EP
    etp = tp if ep == 1 else 1
    shapes = dict(_place_shared(inst, cl.nodes, (("tp", tp), ("cp", cp), ("ep", ep), ("pp", pp), ("dp", dp)),
                                order, etp))
    if par.ep_dispatch == "hybridep" and ep > 1:
        _check_hybridep(sc, inst, shapes["ep"])
    layers = split_layers(model.layers, pp, vpp)
    # Megatron-LM's block method: the first recompute_layers layers of each virtual stage recompute
    recomputed = frozenset(i for chunk in layers for i in chunk[:par.recompute_layers]) \
        if par.recompute == "full" and par.recompute_layers else None
    shard = Shard(micro_batch=w.micro_batch, seq_len=w.seq_len, tp=tp, cp=cp, ep=ep,
                  sequence_parallel=par.sequence_parallel and tp > 1, precision=w.precision,
                  attention_kernel=w.attention_kernel, fp8_attention=w.fp8_attention,
                  cp_comm=par.cp_comm, expert_tp=etp,
                  ep_nodes=max(1, shapes["ep"].size // max(1, shapes["ep"].per_domain)),
                  ep_dispatch=par.ep_dispatch, ep_overlap=par.overlap.ep_comm, moe_routing=w.moe_routing,
                  moe_load=w.moe_load, moe_grouped_gemm=par.moe_grouped_gemm,
                  moe_capacity_factor=w.moe_capacity_factor, moe_pad_to_capacity=w.moe_pad_to_capacity,
                  moe_host_sync="none" if w.moe_pad_to_capacity else par.moe_host_sync,   # drop-and-pad: no wait
                  lora_rank=w.lora_rank, lora_modules=w.lora_modules, lora_dropout=w.lora_dropout,
                  lora_exchange=w.lora_exchange, tp_qkv=par.overlap.tp_qkv, cross_entropy=w.cross_entropy,
                  kernel_fusion=w.kernel_fusion, cuda_graphs=w.cuda_graphs,
                  fp8_recipe=w.fp8_recipe, hidden_dropout=w.hidden_dropout,
                  attention_dropout=w.attention_dropout)
    coster = CommCoster(inst, shapes, cl.nodes)
    # what a layer keeps for its backward: the GEMMs' quantized inputs under fp8/fp4; under LoRA the
    # frozen base GEMMs keep no inputs and the 16-bit adapters keep theirs
    low_bytes = min(WEIGHT_BYTES, BYTES_PER_ELEMENT.get(w.precision, WEIGHT_BYTES))   # the GEMMs' input precision
    gemm_in = WEIGHT_BYTES if w.lora_rank else low_bytes
    frozen_mlp = bool(w.lora_rank) and w.lora_modules == "attention"
    act_in = BYTES_PER_ELEMENT["fp8"] if par.activation_fp8_input else WEIGHT_BYTES   # the MLP activation's input
    masks = 1.0 if w.hidden_dropout else 0.0          # PyTorch's boolean dropout masks (memory.layer_activation_bytes)
    offload_s = {}
    if par.offload_activations:    # pp 1 (the scenario enforces it): the stage holds every layer
        for i in layers[0][:par.offload_activations]:
            act = layer_activation_bytes(model, i, micro_batch=w.micro_batch, seq_len=w.seq_len, tp=tp, cp=cp,
                                         sequence_parallel=shard.sequence_parallel, recompute=par.recompute,
                                         ep=ep, expert_tp=etp, gemm_input_bytes=gemm_in, frozen_mlp=frozen_mlp,
                                         moe_load=w.moe_load, act_input_bytes=act_in, dropout_mask_bytes=masks)
            offload_s[i] = act / inst.accelerator.host_link_bytes_per_s
    stages = _stage_costs_shared(model, inst, coster, layers=layers, shard=shard,
                               recompute=par.recompute, overlap_tp=par.overlap.tp_comm, pp=pp, vpp=vpp,
                               tp_async=par.overlap.tp_backward, rs_dgrad=par.overlap.tp_rs_dgrad,
                               recompute_modules=par.recompute_modules,
                               frozen_weights=w.lora_rank > 0, offload_s=offload_s, recomputed=recomputed,
                               recompute_policy=par.recompute_policy)
    acc = inst.accelerator
    hbm = acc.hbm_bytes_per_s * acc.hbm_efficiency
    if w.precision == "fp8" and w.fp8_recipe == "delayed":
        stages = _with_amax_reduction(stages, coster, shapes)
    fp8_step, fp8_fwd, fp8_bwd = _fp8_weight_bytes(w, par) if w.precision == "fp8" else (0.0, 0.0, 0.0)
    if fp8_fwd or fp8_bwd:
        stages = _with_uncached_fp8_weights(stages, model, layers, pp=pp, tp=tp, ep=ep, etp=etp, fwd_bytes=fp8_fwd,
                                            bwd_bytes=fp8_bwd, hbm=hbm)
    if not par.gradient_accumulation_fusion:
        stages = _with_unfused_grad_accumulation(stages, model, w, layers, pp=pp, tp=tp, ep=ep, etp=etp,
                                                 grad_bytes=BYTES_PER_ELEMENT[par.grad_reduce_precision], hbm=hbm)
    # pipeline point-to-point: one micro-batch's boundary activations (SP-split over TP ranks)
    act_bytes = 2.0 * w.micro_batch * w.seq_len / cp * model.hidden / (tp if shard.sequence_parallel else 1)
    pp_shape = shapes.get("pp")
    pp_send = 0.0
    pp_cross = False
    if pp > 1 and pp_shape is not None:
        pp_send = coster.cost("send-recv", act_bytes, pp_shape)
        pp_cross = pp_shape.per_node < pp_shape.size
    # data parallel: gradient reduce-scatter (fp32 or bf16 main grads) in buckets, param all-gather (bf16)
    # hybrid sharding: ZeRO shards over groups of shard_w ranks, the dp / shard_w groups hold replicas
    shard_w = par.shard_width
    hybrid = shard_w < dp
    dp_shape, replicas = _hybrid_groups(shapes["dp"], shard_w)
    edp = max(1, tp * shard_w * cp // (ep * etp))
    grad_bytes = BYTES_PER_ELEMENT[par.grad_reduce_precision]
    weight_bytes = BYTES_PER_ELEMENT[par.param_gather_precision]
    dense_group, expert_group = _dp_group(dp_shape, cp, shapes), _edp_group(shapes, edp, ep, etp)
    # Megatron-Core sizes its buckets from the (dense) data-parallel group, context parallelism included
    bucket = max(DEFAULT_GRAD_BUCKET, 1_000_000 * dense_group.size) if par.grad_bucket == GRAD_BUCKET_MEGATRON \
        else par.grad_bucket
    # grad_reduce_op is DeepSpeed ZeRO-3's (v0.3.x all-reduces its buckets); elsewhere the ZeRO stage decides
    deepspeed = par.param_fetch == "deepspeed" and par.zero >= 3
    reduce_op = (par.grad_reduce_op or default_grad_reduce_op(par.zero)) if deepspeed \
        else default_grad_reduce_op(par.zero)
    lora = _Lora(w.lora_rank, w.lora_modules)
    buckets, gathers, opt, trainable = _dp_costs_shared(
        sc, coster, model, lora, w.precision, tp=tp, pp=pp, vpp=vpp, dp=dp, cp=cp, ep=ep, etp=etp, zero=par.zero,
        grad_bucket=par.grad_bucket, shard_w=shard_w, bucket=bucket, reduce_op=reduce_op, grad_bytes=grad_bytes,
        weight_bytes=weight_bytes, fp8_step=fp8_step, hbm=hbm, dense_group=dense_group, expert_group=expert_group,
        replicas=replicas)
    mem = list(_stage_memories(
        model, pp, vpp, w.micro_batch, w.seq_len, tp, shard_w, cp, ep, par.zero, shard.sequence_parallel,
        par.recompute, par.recompute_layers, schedule, m, par.recompute_modules, etp, grad_bytes, weight_bytes,
        gemm_in, frozen_mlp, par.offload_activations, w.moe_load, act_in, par.recompute_policy,
        # whether SDPA's output is kept is read by torchtitan-op's selective recompute alone
        # (memory.layer_activation_bytes): the other policies share the memo across accelerators
        attention_kept(w.attention_kernel, not acc.attention_flash2_efficiency)
        if par.recompute_policy == "torchtitan-op" else True, masks))
    if w.lora_rank:
        for s, (local_dense, _, owned) in enumerate(trainable):
            # frozen base weights: no gradients or optimizer state for them, only for the adapters;
            # with no master copy to update they can be kept in the run's GEMM precision (fp8 base
            # weights in the MLPerf Llama 2 70B LoRA submissions)
            mem_s = mem[s]
            mem[s] = MemoryBreakdown(weights=mem_s.weights * low_bytes / weight_bytes,
                                     gradients=grad_bytes * local_dense,
                                     optimizer=OPTIMIZER_BYTES * owned, activations=mem_s.activations,
                                     logits=mem_s.logits, host_offload=mem_s.host_offload)
    if deepspeed:
        # DeepSpeed ZeRO-3 (pp 1, the scenario enforces it): the gathers and reductions run inside the
        # passes, weight tensor by weight tensor, each fetch synchronising the device (fmsim.parallel.zero3)
        def grad_s(op: str, n: float) -> float:
            t = coster.cost(op, n * grad_bytes, dense_group)
            return t + (coster.cost("all-reduce", n * grad_bytes / dense_group.size, replicas) if hybrid else 0.0)

        stage0, post_step, working = deepspeed_stage(stages[0], model, tp=tp, seq_len=w.seq_len, group=dense_group.size,
                                  gather_s=lambda n: coster.cost("all-gather", n * weight_bytes, dense_group),
                                  collective_s=grad_s, grad_op=reduce_op, weight_bytes=weight_bytes,
                                  grad_bytes=grad_bytes, hbm_bytes_per_s=hbm, bucket=bucket,
                                  slowdown=overlap_slowdown(inst))
        stages, buckets, gathers, opt = (stage0,), [()], [0.0], [opt[0] + post_step]
        mem = [dataclasses.replace(mem[0], weights=mem[0].weights + working.weights,
                                   gradients=mem[0].gradients + working.gradients)]
    return Plan(
        name=sc.name, model=model, instance=inst, nodes=cl.nodes, gpus=cl.gpus, precision=w.precision,
        seq_len=w.seq_len, global_batch=w.global_batch, micro_batch=w.micro_batch, num_microbatches=m,
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, schedule=schedule, zero=par.zero,
        recompute=par.recompute, sequence_parallel=shard.sequence_parallel,
        overlap_grad_reduce=par.overlap.grad_reduce, overlap_param_gather=par.overlap.param_gather,
        overlap_tp_comm=par.overlap.tp_comm, overlap_pp_comm=par.overlap.pp_comm, shapes=shapes, stages=stages,
        pp_send_s=pp_send,
        pp_cross_node=pp_cross,
        dp_cross_node=any(g.size > 1 and g.per_node < g.size for g in (dense_group, expert_group, replicas)),
        dp_buckets=tuple(buckets), dp_gather_s=tuple(gathers), optimizer_s=tuple(opt),
        memory=tuple(mem), hbm_bytes=acc.hbm_bytes,
        straggler_cv=cl.straggler_cv, recompute_modules=par.recompute_modules,
        recompute_share=len(recomputed) / model.layers if recomputed is not None else 1.0,
        offload_layers=par.offload_activations,
    )


__all__ = ["Plan", "StageCost", "build_plan", "split_layers"]
