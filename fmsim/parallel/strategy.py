"""Compile a training scenario into a frozen :class:`Plan` (STYLE habit 5: compile, then run).

Owns: the split of layers over pipeline stages and virtual stages (Megatron-style, uneven when
pp·vpp does not divide the layers), the per-(virtual-)stage forward/backward costs from the
operator model, the collectives each parallel axis needs and their costs over the placed
groups, and the memory per device. The analytical estimate and the discrete-event engine both
consume the same Plan, so each checks the other.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import NamedTuple
from dataclasses import dataclass

from ..catalog import Instance
from ..engine.order_stats import expected_max_normal
from ..errors import ConfigError, ParallelismError
from ..hardware.collectives import CollectiveCost, GroupShape, all_to_all_time, collective_time
from ..hardware.topology import place
from ..model.architecture import ModelSpec
from ..model.flops import exact_forward_flops_per_token
from ..model.kernels import BYTES_PER_ELEMENT, KERNEL_FIXED_S
from ..model.sac import attention_kept, recompute_pass
from ..model.memory import (
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    MemoryBreakdown,
    layer_activation_bytes,
    layer_recompute,
    stage_activations_cached,
    stage_params_cached,
    training_memory,
)
from ..model.ops import (
    fp8_cast_bytes,
    CommRequest,
    PassCost,
    Roofline,
    Shard,
    backward_of,
    cross_entropy_s,
    embedding_forward,
    layer_forward,
    logits_forward,
)
from ..scenario import DEFAULT_GRAD_BUCKET, GRAD_BUCKET_MEGATRON
from ..scenario.parallelism import default_grad_reduce_op
from .schedules import schedule_tasks
from .zero3 import deepspeed_stage

#: Optimizer step traffic per locally-owned parameter, as Megatron's mixed-precision optimizers run it
#: (megatron/core/optimizer/optimizer.py: clip_grad_norm, then the step, then the copy back): the
#: gradient norm reads the fp32 main grads (4 B); FusedAdam (apex multi-tensor apply) reads grad,
#: master, m, v (16 B) and writes master, m, v (12 B); _copy_main_params_to_model_params reads the
#: fp32 master and writes the 16-bit weight (6 B). Each is a memory-bound kernel.
OPTIMIZER_BYTES_PER_PARAM = 38.0
#: fp16 runs unscale the main grads first (multi_tensor_scale with the inf check: read and write 4 B).
FP16_UNSCALE_BYTES_PER_PARAM = 8.0
#: SMs a collective kernel occupies while it runs beside compute (see overlap_slowdown).
COMM_SMS = 20


@dataclass(frozen=True, slots=True)
class StageCost:
    """Cost of one micro-batch through one virtual stage (seconds), split by kind."""

    fwd_compute_s: float
    bwd_compute_s: float
    fwd_comm: Mapping[str, float]        # exposed inline communication by axis (tp, cp, ep)
    bwd_comm: Mapping[str, float]
    recompute_s: float                   # extra forward work done in backward
    layers: tuple[int, ...]
    #: FLOPs that selective recompute runs again beyond the attention core (other recompute modules)
    recompute_extra_flops: float = 0.0

    @property
    def fwd_s(self) -> float:
        return self.fwd_compute_s + sum(self.fwd_comm.values())

    @property
    def bwd_s(self) -> float:
        return self.bwd_compute_s + self.recompute_s + sum(self.bwd_comm.values())


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


def overlap_slowdown(instance: Instance, comm_sms: int = COMM_SMS) -> float:
    """Share of its speed compute loses while a collective runs beside it.

    Two effects multiply: the collective's kernels occupy about 20 SMs (DeepSeek-V3 technical report,
    arXiv 2412.19437, §3.2.2, on H800; Transformer Engine's userbuffers configs give the pipelined TP
    reduce-scatter 16-24 SMs and shrink the GEMM by as many), and the extra power of moving data while
    computing pushes the chip into its power cap, which lowers the core clock (the catalog's
    ``efficiency.overlap_clock``). Compute beside a collective runs at (1 - SMs/units) x that clock.
    Chips whose collectives run on dedicated engines (no SM count in the catalog: Trainium) lose the
    clock share only. ``comm_sms``: SMs the collective takes (Transformer Engine's userbuffers give a
    copy-engine ring exchange 1 SM and its pipelined and bulk overlaps 16, carved out of the GEMM)."""
    acc = instance.accelerator
    units = acc.compute_units
    sm_left = 1.0 - comm_sms / units if units else 1.0
    return 1.0 - sm_left * acc.overlap_clock_ratio


def split_layers(layers: int, pp: int, vpp: int) -> list[list[int]]:
    """Layers of each virtual stage (chunk-major: index = chunk * pp + stage), new lists each call
    (:func:`_split_layers`, memoised)."""
    return [list(chunk) for chunk in _split_layers(layers, pp, vpp)]


@functools.lru_cache(maxsize=1024)
def _split_layers(layers: int, pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
    """Layers of each virtual stage (chunk-major: index = chunk * pp + stage).

    Megatron-style: an even split when ``pp·vpp`` divides ``layers``; when ``layers + 2`` divides,
    the embedding and the loss count as one layer each on the first and last virtual stage
    (``--account-for-embedding/loss-in-pipeline-split``: 126 layers + 2 over 64 virtual stages; over
    128, the first chunk holds only the embedding and the last only the output layer and loss, as Llama 3
    405B ran: Dubey et al. 2024 §3.3.2);
    otherwise the remainder goes to the middle stages, keeping the ends (which carry the
    embedding and logits) lighter.
    """
    n = pp * vpp
    if layers < n and layers + 2 != n:
        raise ParallelismError(f"{layers} layers cannot fill pp·vpp = {n} virtual stages",
                               field="parallelism.pp")
    if layers % n == 0:
        counts = [layers // n] * n
    elif (layers + 2) % n == 0:
        per = (layers + 2) // n
        counts = [per] * n
        counts[0] -= 1
        counts[-1] -= 1
    else:
        base, rem = divmod(layers, n)
        counts = [base] * n
        order = sorted(range(n), key=lambda i: (abs(i - (n - 1) / 2), i))
        for i in order[:rem]:
            counts[i] += 1
    out, start = [], 0
    for c in counts:
        out.append(tuple(range(start, start + c)))
        start += c
    return tuple(out)


#: Collective costs shared by every plan on the same instance object and node count (a search asks the
#: same questions of thousands of plans): (id(instance), nodes) -> (instance, its line-rate twin, memo).
#: Bounded: at most _SHARED_CLUSTERS clusters, each memo cleared when it reaches _SHARED_COSTS entries.
_SHARED: dict[tuple[int, int], tuple[Instance, Instance, dict[tuple, CollectiveCost]]] = {}
_SHARED_CLUSTERS = 64
_SHARED_COSTS = 50_000


def _shared_costs(instance: Instance, nodes: int) -> tuple[Instance, dict]:
    """(line-rate instance, cost memo) shared by the plans on ``instance`` (this very object: an
    Instance holds a dict, so it is not hashable, and the entry keeps it alive, so its id stays its own)."""
    hit = _SHARED.get((id(instance), nodes))
    if hit is None or hit[0] is not instance:
        if len(_SHARED) >= _SHARED_CLUSTERS:
            _SHARED.clear()
        # DeepEP-class dispatch reaches the NIC's line rate over RDMA (deepseek-ai/DeepEP README,
        # V1 table on H800 + CX7 400 Gb/s "~50 GB/s maximum": internode EP16/32/64 dispatch 43/58/51,
        # combine 43/57/50 GB/s), where NCCL's collectives reach the fabric's calibrated efficiency
        line = dataclasses.replace(instance, fabric=dataclasses.replace(instance.fabric, efficiency=1.0))
        hit = _SHARED[(id(instance), nodes)] = (instance, line, {})
    if len(hit[2]) >= _SHARED_COSTS:
        hit[2].clear()
    return hit[1], hit[2]


def clear_caches() -> None:
    """Forget every cost shared across plans (tests compare cached and uncached evaluations)."""
    _SHARED.clear()
    _STAGES.clear()
    _PIECES.clear()
    _PLACED.clear()
    _DP.clear()
    for fn in CACHED:
        fn.cache_clear()


class CommCoster:
    """Collective costs over the placed groups of one plan, memoised (a plan asks the same
    questions for every layer and stage; the memo is shared with every plan on the same instance and
    node count: a cost depends on the op, size, group shape, instance and nodes alone)."""

    def __init__(self, instance: Instance, shapes: Mapping[str, GroupShape], nodes: int):
        self.instance, self.shapes, self.nodes = instance, shapes, nodes
        self._line_rate, self._memo = _shared_costs(instance, nodes)

    def cost(self, op: str, size_bytes: float, shape: GroupShape, line_rate: bool = False,
             skew: float = 1.0) -> float:
        if shape.size <= 1 or size_bytes <= 0:
            return 0.0
        key = (op, size_bytes, shape, line_rate, skew)
        hit = self._memo.get(key)      # one lookup: the shared memo may be emptied by another thread's plan
        if hit is None:
            inst = self._line_rate if line_rate else self.instance
            if op == "all-to-all" and line_rate:
                # DeepEP's normal kernels, at the NVLink and RDMA rates its README gives for this EP size
                # (fmsim.hardware.dispatch); NCCL's send/recv protocols otherwise
                hit = all_to_all_time(size_bytes, self.instance, shape, skew=skew, nodes=self.nodes,
                                      kernel="deepep")
            elif op == "all-to-all" and skew != 1.0:
                hit = all_to_all_time(size_bytes, inst, shape, skew=skew, nodes=self.nodes)
            else:
                hit = collective_time(op, size_bytes, inst, shape, nodes=self.nodes)
            self._memo[key] = hit
        return hit.time_s

    def request(self, req: CommRequest) -> float:
        return self.cost(req.op, req.size_bytes, self.shapes[req.axis], req.line_rate, req.skew)


def _exposed(coster: CommCoster, cost: PassCost, overlap_tp: bool, tp_async: bool = True) -> dict[str, float]:
    """Exposed seconds of a pass's inline collectives, by axis.

    TP/EP collectives sit on the critical path between the GEMMs that produce and consume them
    (Megatron without ``--tp-comm-overlap``); with TP overlap (userbuffers pipelining, Wang et al.
    2023) each shows only where it outlasts the one GEMM it is paired with. CP ring exchanges hide
    behind the attention blocks (Liu et al. 2023) except for what exceeds them. The backward's
    collectives of a column-parallel layer, which the framework itself issues asynchronously beside
    its data- and weight-gradient GEMMs (``tp_async``: Megatron-LM since 2022, Transformer Engine),
    hide behind those GEMMs with or without userbuffers.
    """
    out: dict[str, float] = {}
    share = overlap_slowdown(coster.instance)
    for req in cost.comms:
        t = coster.request(req)
        if req.overlappable_s and (req.axis != "tp" or overlap_tp or (req.asynchronous and tp_async)):
            # hidden behind the compute it overlaps -- for TP its own GEMM only -- which runs slower
            # beside it: fewer SMs and a power-capped clock (overlap_slowdown); under userbuffers
            # with the SMs Transformer Engine gives that overlap
            sh = share
            if req.axis == "tp" and overlap_tp and req.ub_sms is not None:
                sh = overlap_slowdown(coster.instance, req.ub_sms)
            hidden = min(t, req.overlappable_s)
            t = t - hidden + sh * hidden
        out[req.axis] = out.get(req.axis, 0.0) + t
    return out


@dataclass(frozen=True, slots=True)
class _Piece:
    """One building block of a stage (a layer kind, the embedding, the head): its compute seconds
    and exposed communication, forward and backward, costed once and counted per stage."""

    fwd_s: float
    bwd_s: float
    rec_s: float
    fwd_comm: Mapping[str, float]
    bwd_comm: Mapping[str, float]
    rec_extra_flops: float = 0.0

    @classmethod
    def of(cls, coster: CommCoster, fwd: PassCost, bwd: PassCost, rec: PassCost, overlap_tp: bool,
           rec_extra_flops: float = 0.0, tp_async: bool = True) -> _Piece:
        bc = _exposed(coster, bwd, overlap_tp, tp_async)
        for k, t in _exposed(coster, rec, overlap_tp).items():
            bc[k] = bc.get(k, 0.0) + t
        return cls(fwd.compute_s, bwd.compute_s, rec.compute_s, _exposed(coster, fwd, overlap_tp), bc,
                   rec_extra_flops)


def build_stage_costs(model: ModelSpec, instance: Instance, coster: CommCoster, *,
                      layers: list[list[int]], shard: Shard, recompute: str, overlap_tp: bool,
                      pp: int, vpp: int, frozen_weights: bool = False, tp_async: bool = True,
                      rs_dgrad: bool = False,
                      recompute_modules: tuple[str, ...] = ("core_attn",),
                      offload_s: Mapping[int, float] | None = None,
                      recomputed: frozenset[int] | None = None,
                      recompute_policy: str = "modules", pieces: dict | None = None) -> tuple[StageCost, ...]:
    """Forward/backward cost of one micro-batch through each virtual stage.

    Each kind of layer (dense, MoE, DeepSeek's wider dense layers), the embedding and the head is
    costed once -- collectives included, TP overlap applied layer by layer -- and counted.

    ``offload_s``: per offloaded layer, the seconds its activations take over the host link one way.
    The copy runs on its own stream beside the next layer's pass (Transformer Engine's double-buffered
    offload: out after the layer's forward, back ahead of its backward); what the pass cannot cover
    waits in the open, filed under ``offload``.

    ``recomputed``: with ``recompute`` full, the layers that recompute (the others keep their
    activations: Megatron-LM's block method); None = every layer.

    ``recompute_policy`` torchtitan-op (with selective): each layer runs again every forward op but those
    torchtitan's save list keeps (:func:`fmsim.model.sac.recompute_pass`).

    ``pieces``: a memo of the layer kinds', the embedding's and the head's pieces, which read neither the
    layer split nor the offloaded layers, for calls that differ only in those (:func:`_stage_costs_shared`)."""
    rf = Roofline.of(instance.accelerator, shard.precision, shard.attention_kernel, shard.fp8_attention,
                     shard.fp8_recipe, wgrad=not frozen_weights)
    offload_s = offload_s or {}
    per_layer: dict[tuple, _Piece] = {} if pieces is None else pieces

    def layer_piece(i: int) -> _Piece:
        moe = model.is_moe_layer(i)
        mode = layer_recompute(recompute, recomputed, i)
        wide = bool(model.moe and model.moe.dense_ffn_hidden and not moe)
        key = (moe, wide, model.is_windowed_layer(i), mode)
        if key not in per_layer:
            attn, mlp = layer_forward(model, i, shard, rf)
            fwd = PassCost()
            fwd.add(attn)
            fwd.add(mlp)
            if mode == "full":
                rec, extra = fwd, 0.0
            elif mode == "selective" and recompute_policy == "torchtitan-op":
                keep = attention_kept(shard.attention_kernel, not instance.accelerator.attention_flash2_efficiency)
                rec = recompute_pass(model, shard, rf, attn, mlp, keep_attention=keep)
                extra = rec.flops
            elif mode == "selective":
                # the checkpointed modules run their forward again: by default the attention core
                # only (Korthikanti et al. 2022 §5); Megatron-Core's --recompute-modules add the
                # MLP or MoE block, the experts' activation, the norms, MLA's up-projections ...
                rec, extra = PassCost(), 0.0
                for name in recompute_modules:
                    if name in fwd.parts:
                        rec.add(fwd.parts[name])
                        extra += fwd.parts[name].flops if name != "core_attn" else 0.0
            else:
                rec, extra = PassCost(), 0.0
            bwd = backward_of(fwd, frozen_weights=frozen_weights, rs_dgrad=rs_dgrad)
            per_layer[key] = _Piece.of(coster, fwd, bwd, rec, overlap_tp, rec_extra_flops=extra, tp_async=tp_async)
        return per_layer[key]

    def simple_piece(fwd: PassCost, memory_s: tuple[float, float] = (0.0, 0.0)) -> _Piece:
        """A piece with no recompute; ``memory_s``: memory-bound (forward, backward) seconds priced on
        their own rather than by the backward's 2x rule (the loss)."""
        bwd = backward_of(fwd, frozen_weights=frozen_weights, rs_dgrad=rs_dgrad)
        fwd.memory_s += memory_s[0]
        bwd.memory_s += memory_s[1]
        return _Piece.of(coster, fwd, bwd, PassCost(), overlap_tp, tp_async=tp_async)

    if "embed" not in per_layer:
        per_layer["embed"] = simple_piece(embedding_forward(model, shard, rf))
        per_layer["head"] = simple_piece(logits_forward(model, shard, rf), cross_entropy_s(model, shard, rf))
        proj = PassCost()
        proj.gemm_s, proj.flops = rf.gemm(shard.tokens, model.hidden, 2 * model.hidden)
        per_layer["proj"] = simple_piece(proj)
    embed, head = per_layer["embed"], per_layer["head"]
    # DeepSeek-V3 multi-token prediction (arXiv 2412.19437 §2.2): per depth one more transformer
    # block (as the last layer), a 2h -> h projection and the shared head, on the last stage
    mtp = [layer_piece(model.layers - 1), per_layer["proj"], head] * model.mtp_layers
    n = pp * vpp
    out = []
    for v, lay in enumerate(layers):
        pieces = [layer_piece(i) for i in lay]
        if v == 0:
            pieces.append(embed)
        if v == n - 1:
            pieces += [head, *mtp]
        fc: dict[str, float] = {}
        bc: dict[str, float] = {}
        for pc in pieces:
            for k, t in pc.fwd_comm.items():
                fc[k] = fc.get(k, 0.0) + t
            for k, t in pc.bwd_comm.items():
                bc[k] = bc.get(k, 0.0) + t
        for i in lay:
            copy = offload_s.get(i, 0.0)
            if copy:
                pc = layer_piece(i)           # the neighbouring layer's pass, as long as this one's
                fc["offload"] = fc.get("offload", 0.0) + max(0.0, copy - pc.fwd_s - sum(pc.fwd_comm.values()))
                bc["offload"] = bc.get("offload", 0.0) + max(0.0, copy - pc.bwd_s - pc.rec_s
                                                             - sum(pc.bwd_comm.values()))
        out.append(StageCost(fwd_compute_s=sum(pc.fwd_s for pc in pieces),
                             bwd_compute_s=sum(pc.bwd_s for pc in pieces), fwd_comm=fc, bwd_comm=bc,
                             recompute_s=sum(pc.rec_s for pc in pieces), layers=tuple(lay),
                             recompute_extra_flops=sum(pc.rec_extra_flops for pc in pieces)))
    return tuple(out)


#: the parallel axes whose collectives a layer's passes issue (ops.py's CommRequest axes); the stage costs
#: of two plans on the same instance with the same shapes on these axes are the same
_PIECE_AXES = ("tp", "cp", "ep")
#: stage costs shared across plans: key -> (instance, stages); emptied when it reaches _STAGES_MAX
_STAGES: dict[tuple, tuple[Instance, tuple[StageCost, ...]]] = {}
_STAGES_MAX = 4096
#: the pieces of build_stage_costs shared by plans that differ in their layer split (pp, vpp), the layers
#: they offload or recompute: key -> (instance, pieces); emptied when it reaches _STAGES_MAX
_PIECES: dict[tuple, tuple[Instance, dict]] = {}


class _AxisRecorder:
    """A CommCoster that notes the axes it is asked about (None: a shape given directly)."""

    def __init__(self, coster: CommCoster):
        self.instance, self.shapes, self.nodes = coster.instance, coster.shapes, coster.nodes
        self._coster, self.axes = coster, set()

    def request(self, req: CommRequest) -> float:
        self.axes.add(req.axis)
        return self._coster.request(req)

    def cost(self, *args, **kwargs) -> float:
        self.axes.add(None)
        return self._coster.cost(*args, **kwargs)


def _stage_costs_shared(model: ModelSpec, instance: Instance, coster: CommCoster, *, layers: list[list[int]],
                        offload_s: Mapping[int, float], recomputed: frozenset[int] | None,
                        **kw) -> tuple[StageCost, ...]:
    """:func:`build_stage_costs`, shared by the plans of a search that differ only where it does not look
    (ZeRO stage, node count, data-parallel width). Its inputs are frozen values but the instance (this very
    object, kept alive by the entry) and the coster, whose costs depend on the instance, the node count and
    the group shapes of the axes asked: the key holds the shapes of ``_PIECE_AXES``, and the node count only
    through collective_time's check that each group fits in the cluster (a group that does not is costed
    afresh, to raise as it did). A result is kept only when its passes asked about those axes alone."""
    build = lambda c: build_stage_costs(model, instance, c, layers=layers, offload_s=offload_s,  # noqa: E731
                                        recomputed=recomputed, **kw)
    shapes = tuple(coster.shapes.get(a) for a in _PIECE_AXES)
    if any(g is not None and math.ceil(g.size / g.per_node) > coster.nodes for g in shapes):
        return build(coster)
    settings = tuple(sorted(kw.items()))
    key = (id(instance), model, shapes, tuple(map(tuple, layers)), tuple(sorted(offload_s.items())),
           recomputed, settings)
    hit = _STAGES.get(key)
    if hit is not None and hit[0] is instance:
        return hit[1]
    # the layer kinds', embedding's and head's pieces read neither the split nor the offloaded or recomputed
    # layers (each layer's recompute mode is in its piece's key): shared by every such plan, under the same
    # rule (a copy is worked on, and kept only when its passes asked about _PIECE_AXES alone)
    pkey = (id(instance), model, shapes, tuple(kv for kv in settings if kv[0] not in ("pp", "vpp")))
    known = _PIECES.get(pkey)
    pieces = dict(known[1]) if known is not None and known[0] is instance else {}
    rec = _AxisRecorder(coster)
    out = build_stage_costs(model, instance, rec, layers=layers, offload_s=offload_s, recomputed=recomputed,
                            pieces=pieces, **kw)
    if rec.axes <= set(_PIECE_AXES):
        if len(_STAGES) >= _STAGES_MAX:
            _STAGES.clear()
        if len(_PIECES) >= _STAGES_MAX:
            _PIECES.clear()
        _STAGES[key] = (instance, out)
        _PIECES[pkey] = (instance, pieces)
    return out


def _local_trainable(model: ModelSpec, w, layer_ids: list[int], first: bool, last: bool, *, pp: int, tp: int,
                     ep: int, etp: int) -> tuple[float, float]:
    """(dense, expert) trainable parameters one rank holds for these layers, as its gradient buffer
    holds them: its TP share and its copies of K/V heads, its experts; under LoRA the adapters alone."""
    if w.lora_rank:
        return sum(model.lora_params(i, w.lora_rank, w.lora_modules) for i in layer_ids) / tp, 0.0
    dense, expert = stage_params_cached(model, layer_ids, first, last, pp)
    return dense / tp + model.replicated_kv_params(tp) * len(layer_ids), expert / (etp * ep)


def _fsdp_units(model: ModelSpec, w, layer_ids: list[int], first: bool, last: bool, *, pp: int, tp: int, ep: int,
                etp: int) -> list[tuple[float, float]]:
    """(dense, expert) parameters of each unit ZeRO-3/FSDP gathers on its own: one per transformer layer
    (PyTorch FSDP wraps each block; DeepSpeed fetches each block's submodules as the forward reaches
    them), and the embedding and output layer as one more."""
    units = [_local_trainable(model, w, [i], False, False, pp=pp, tp=tp, ep=ep, etp=etp) for i in layer_ids]
    dense, expert = _local_trainable(model, w, layer_ids, first, last, pp=pp, tp=tp, ep=ep, etp=etp)
    rest = (dense - sum(d for d, _ in units), expert - sum(e for _, e in units))
    return units + ([rest] if rest[0] > 0 or rest[1] > 0 else [])



@functools.lru_cache(maxsize=4096)
def _fsdp_units_shared(model: ModelSpec, w, layer_ids: tuple[int, ...], first: bool, last: bool, pp: int,
                       tp: int, ep: int, etp: int) -> tuple[tuple[float, float], ...]:
    """:func:`_fsdp_units`, memoised on its frozen inputs (the workload whole, so any field it reads is in
    the key): the plans of a search repeat the same stages under ZeRO-3."""
    return tuple(_fsdp_units(model, w, list(layer_ids), first, last, pp=pp, tp=tp, ep=ep, etp=etp))



#: group shapes shared across plans: (id(instance), nodes, dims, order, expert_tp) -> (instance, shapes)
_PLACED: dict[tuple, tuple[Instance, dict[str, GroupShape]]] = {}
_PLACED_MAX = 4096


def _place_shared(instance: Instance, nodes: int, dims: tuple[tuple[str, int], ...], order: tuple[str, ...],
                  expert_tp: int) -> dict[str, GroupShape]:
    """:func:`place`, shared by the plans on the same instance object and node count (a copy each time)."""
    key = (id(instance), nodes, dims, order, expert_tp)
    hit = _PLACED.get(key)
    if hit is None or hit[0] is not instance:
        if len(_PLACED) >= _PLACED_MAX:
            _PLACED.clear()
        hit = _PLACED[key] = (instance, place(instance, nodes, dict(dims), order=order, expert_tp=expert_tp))
    return dict(hit[1])


#: fp8 tensors whose amax a Transformer Engine module registers per GEMM: three in the forward (input, weight,
#: output), two in the backward (output and input gradients) -- TE v1.8 @3ec998e9 module/base.py
#: init_fp8_meta_tensors, ``num_gemms * 3 if fwd else num_gemms * 2``
FP8_AMAXES_PER_GEMM = (3, 2)
#: the GEMMs of a dense transformer layer (QKV, attention output, MLP up and down)
GEMMS_PER_LAYER = 4


def _with_amax_reduction(stages: tuple[StageCost, ...], coster: CommCoster, shapes) -> tuple[StageCost, ...]:
    """fp8 delayed scaling's amax reduction (Transformer Engine v1.8 @3ec998e9, pytorch/fp8.py): at the exit of
    each forward's fp8_autocast (Megatron-Core wraps each model chunk's TransformerBlock in one, per micro-batch)
    and at the end of each backward (the first module's, linear.py ``reduce_and_update_bwd_fp8_tensors``), the
    amaxes of every fp8 tensor the pass met are concatenated, all-reduced with MAX (``async_op=False``: on the
    critical path) over the fp8 group, and a fused kernel rolls each amax history and recomputes the scales
    (``fused_amax_and_scale_update_after_reduction``). Megatron-Core's group is tensor x data x context parallel
    (transformer_block.py ``get_amax_reduction_group(with_context_parallel=True)``, core_r0.8.0); it is costed
    over the data-parallel group (the tensor-parallel one at dp 1), which is where it leaves the node; two
    kernels a pass besides it (concatenate, update). Filed with the data-parallel communication."""
    group = shapes["dp"] if shapes["dp"].size > 1 else shapes["tp"]
    out = []
    for st in stages:
        gemms = GEMMS_PER_LAYER * len(st.layers)
        fwd, bwd = (coster.cost("all-reduce", n * gemms * 4.0, group) + 2 * KERNEL_FIXED_S
                    for n in FP8_AMAXES_PER_GEMM)
        out.append(dataclasses.replace(st, fwd_comm={**st.fwd_comm, "dp": st.fwd_comm.get("dp", 0.0) + fwd},
                                       bwd_comm={**st.bwd_comm, "dp": st.bwd_comm.get("dp", 0.0) + bwd}))
    return tuple(out)


def _fp8_weight_bytes(w, par) -> tuple[float, float, float]:
    """(per step, per micro-batch forward, per micro-batch backward) HBM bytes per GEMM weight element that making
    an fp8 run's weight copies costs, as Transformer Engine does it (TE v1.6rc2 and v1.8 module/linear.py,
    layernorm_linear.py, layernorm_mlp.py):

    - 16-bit weights: ``fp8_cast_transpose_fused`` (read 2, write 1 + 1) when ``is_first_microbatch`` is True or
      None; Megatron-Core passes True on a step's first micro-batch and False after (schedules.py
      ``set_is_first_microbatch``; transformer_engine.py), so once a step, or every micro-batch with the transpose
      cache off (``disable_parameter_transpose_cache``: it passes None).
    - fp8 primary weights that never change (LoRA's frozen base layers with ``param_gather_precision: fp8``, TE's
      fp8 weights: NeMo ``fp8_params``): used as they are (``primary_weights_in_fp8``: no cast); the data gradient's
      transpose is ``weight.transpose_2d(cache=is_first_microbatch is not None)`` (float8_tensor.py), made once
      and kept, or with the cache off a ``tex.fp8_transpose`` (read 1, write 1) in every micro-batch's backward.
    Trainable fp8 primary weights keep the once-a-step cast fmsim has priced (their optimizer-side quantization was
    not re-read), and with the cache off add the per-micro-batch transposes."""
    cast = fp8_cast_bytes(w.fp8_recipe, "input", False)[0]
    if par.param_gather_precision == "fp8":
        step = 0.0 if w.lora_rank else cast
        return (step, 0.0, 0.0) if par.fp8_transpose_cache else (step, 0.0, 2.0 * BYTES_PER_ELEMENT["fp8"])
    return (cast, 0.0, 0.0) if par.fp8_transpose_cache else (0.0, cast, 0.0)


def _with_uncached_fp8_weights(stages: tuple[StageCost, ...], model: ModelSpec, layers: list[list[int]], *,
                               pp: int, tp: int, ep: int, etp: int, fwd_bytes: float, bwd_bytes: float,
                               hbm: float) -> tuple[StageCost, ...]:
    """Stages whose passes also make their layers' fp8 weight copies, every micro-batch (:func:`_fp8_weight_bytes`
    with the transpose cache off): one memory-bound kernel per GEMM weight in the pass that makes it."""
    out = []
    for v, st in enumerate(stages):
        dense, expert = stage_params_cached(model, layers[v], False, False, pp)
        weights = dense / tp + expert / (etp * ep)
        kernels = GEMMS_PER_LAYER * len(layers[v]) * KERNEL_FIXED_S
        fwd = weights * fwd_bytes / hbm + (kernels if fwd_bytes else 0.0)
        bwd = weights * bwd_bytes / hbm + (kernels if bwd_bytes else 0.0)
        out.append(dataclasses.replace(st, fwd_compute_s=st.fwd_compute_s + fwd, bwd_compute_s=st.bwd_compute_s + bwd))
    return tuple(out)


def _with_unfused_grad_accumulation(stages: tuple[StageCost, ...], model: ModelSpec, w, layers: list[list[int]], *,
                                    pp: int, tp: int, ep: int, etp: int, grad_bytes: float,
                                    hbm: float) -> tuple[StageCost, ...]:
    """Stages whose backward also adds each weight gradient into the gradient buffer, per micro-batch.

    Without gradient-accumulation fusion the weight-gradient GEMM writes a 16-bit gradient and a hook
    adds it into the buffer (Megatron-LM's DDP ``param.main_grad.add_(param.grad.data)``, DeepSpeed's
    bf16 optimizer into its fp32 copy): one memory-bound pass that reads the 16-bit gradient and reads
    and writes the buffer, over every trainable parameter a rank holds."""
    n = len(stages)
    out = []
    for v, st in enumerate(stages):
        local = sum(_local_trainable(model, w, layers[v], v == 0, v == n - 1, pp=pp, tp=tp, ep=ep, etp=etp))
        extra = local * (BYTES_PER_ELEMENT["bf16"] + 2 * grad_bytes) / hbm
        out.append(dataclasses.replace(st, bwd_compute_s=st.bwd_compute_s + extra))
    return tuple(out)


# Each gradient bucket is a collective of its own in the step (an engine job per micro-batch pass): a
# stage's buckets are bounded, so that a tiny grad_bucket on a huge model cannot make the step unbounded.
# 10,000 is past any real plan's (405B on tp 8 x pp 16 in 1M-parameter buckets holds about 3,200).
MAX_BUCKETS_PER_STAGE = 10_000


def _too_many_buckets(sc, n: int, params: float) -> ConfigError:
    return ConfigError(f"{n:,}+ gradient buckets per pipeline stage is past the {MAX_BUCKETS_PER_STAGE:,} a step "
                       f"simulates (expected a grad_bucket of at least {params / MAX_BUCKETS_PER_STAGE:,.0f} "
                       "parameters, or more tp or pp)", file=sc.file, field="parallelism.grad_bucket")



class _Lora(NamedTuple):
    """The workload's fields a rank's trainable-parameter count reads (:func:`_local_trainable`): a key
    shared by the workloads that differ elsewhere (micro-batch, sequence)."""

    lora_rank: int
    lora_modules: str


#: per-stage data-parallel costs shared across plans: key -> (instance, (buckets, gathers, opt, trainable))
_DP: dict[tuple, tuple[Instance, tuple]] = {}
_DP_MAX = 4096


def _dp_costs_shared(sc, coster: CommCoster, model: ModelSpec, lora: _Lora, precision: str, **kw) -> tuple:
    """:func:`_dp_costs`, shared by the plans that differ only where it does not look (micro-batch,
    recompute, offloading, sequence parallelism): its inputs are the key, with the coster's instance
    (this very object, kept alive by the entry) and node count, on which its collective costs depend
    (``sc`` names the file in a refusal, which is raised afresh each time and never kept)."""
    inst = coster.instance
    key = (id(inst), coster.nodes, model, lora, precision, tuple(kw.items()))
    hit = _DP.get(key)
    if hit is None or hit[0] is not inst:
        if len(_DP) >= _DP_MAX:
            _DP.clear()
        hit = _DP[key] = (inst, _dp_costs(sc, coster, model, lora, precision, **kw))
    return hit[1]


def _dp_costs(sc, coster: CommCoster, model: ModelSpec, lora: _Lora, precision: str, *, tp: int, pp: int, vpp: int,
              dp: int, cp: int, ep: int, etp: int, zero: int, grad_bucket: int, shard_w: int, bucket: int,
              reduce_op: str, grad_bytes: float, weight_bytes: float, fp8_step: float, hbm: float,
              dense_group: GroupShape, expert_group: GroupShape, replicas: GroupShape) -> tuple:
    """Per physical stage: its gradient buckets' seconds, its weight gathers' seconds, its optimizer step's
    seconds, and (dense, expert, owned) trainable parameters -- (buckets, gathers, opt, trainable)."""
    layers = _split_layers(model.layers, pp, vpp)
    hybrid = shard_w < dp
    edp = max(1, tp * shard_w * cp // (ep * etp))

    def bucket_s(params: float, shape: GroupShape) -> float:
        t = coster.cost(reduce_op, params * grad_bytes, shape)
        if hybrid:
            # each bucket's reduced shard is then all-reduced across the replicas, on the same stream
            # (PyTorch FSDP HYBRID_SHARD; Megatron-Core's distributed-optimizer instances)
            t += coster.cost("all-reduce", params * grad_bytes / shape.size, replicas)
        return t

    buckets, gathers, opt, trainable = [], [], [], []
    for s in range(pp):
        mine = [i for c in range(vpp) for i in layers[c * pp + s]]
        # LoRA: only the adapters train -- they alone are reduced, gathered and stepped
        local_dense, local_expert = _local_trainable(model, lora, mine, s == 0, s == pp - 1, pp=pp, tp=tp, ep=ep,
                                                     etp=etp)
        # ZeRO-3/FSDP's units (and grad_bucket 0's buckets): one per transformer layer, plus the embedding and head
        units = list(_fsdp_units_shared(model, lora, tuple(mine), s == 0, s == pp - 1, pp, tp, ep, etp)) \
            if zero >= 3 or not grad_bucket else []
        if hybrid:     # ep 1 (the scenario enforces it): the experts shard and reduce as the dense weights
            local_dense, local_expert = local_dense + local_expert, 0.0
            units = [(dense + expert, 0.0) for dense, expert in units]

        # the gradient buckets: grad_bucket parameters each, or one per unit with grad_bucket 0, as PyTorch
        # FSDP reduces each wrapped block's gradients in one collective
        # a stage's units repeat (every transformer layer alike): each distinct unit's buckets and
        # gathers are priced once and then laid down in the units' order, the same numbers in the same order
        times: list[float] = []
        unit_buckets: dict[tuple[float, float], list[float]] = {}
        for unit in (units if not grad_bucket else [(local_dense, local_expert)]):
            part = unit_buckets.get(unit)
            if part is None:
                part = []
                for params, shape in zip(unit, (dense_group, expert_group)):
                    if params <= 0 or (shape.size <= 1 and not hybrid):
                        continue
                    nb = max(1, round(params / bucket)) if bucket else 1
                    if len(times) + len(part) + nb > MAX_BUCKETS_PER_STAGE:
                        raise _too_many_buckets(sc, len(times) + len(part) + nb, local_dense + local_expert)
                    part += [bucket_s(params / nb, shape)] * nb
                unit_buckets[unit] = part
            if len(times) + len(part) > MAX_BUCKETS_PER_STAGE:
                raise _too_many_buckets(sc, len(times) + len(part), local_dense + local_expert)
            times += part
        buckets.append(tuple(times))
        g = 0.0
        if zero >= 1:
            # ZeRO-1/2 gathers the updated weights once a step, one collective of the stage's share;
            # ZeRO-3/FSDP gathers them unit by unit ahead of their use, each unit its own collective
            unit_gathers: dict[tuple[float, float], tuple[float, ...]] = {}
            for unit in (units if zero >= 3 else [(local_dense, local_expert)]):
                costs = unit_gathers.get(unit)
                if costs is None:
                    costs = unit_gathers[unit] = tuple(
                        coster.cost("all-gather", params * weight_bytes, shape)
                        for params, shape in zip(unit, (dense_group, expert_group))
                        if params > 0 and shape.size > 1)
                for c in costs:
                    g += c
        gathers.append(g)
        owned = (local_dense / (shard_w * cp) + local_expert / edp) if zero >= 1 else local_dense + local_expert
        step_bytes = owned * OPTIMIZER_BYTES_PER_PARAM
        if grad_bytes < BYTES_PER_ELEMENT["fp32"]:
            # 16-bit gradient buffers: the owned shard is cast to fp32 main grads (read 2, write 4 B)
            step_bytes += owned * (grad_bytes + BYTES_PER_ELEMENT["fp32"])
        if precision == "fp16":
            step_bytes += owned * FP16_UNSCALE_BYTES_PER_PARAM
        # the next step's gradients start from zero: the whole local gradient buffer is cleared (sharded
        # only under ZeRO-3/FSDP)
        step_bytes += (owned if zero >= 3 else local_dense + local_expert) * grad_bytes
        if fp8_step:
            # the layers' weights are quantized once a step, on the first micro-batch, and the fp8 copies (and
            # their transposes for the data gradient) reused by the others (Megatron-Core schedules.py
            # forward_step: set_is_first_microbatch; TE caches the fp8 weight when is_first_microbatch is True)
            dense, expert = stage_params_cached(model, mine, False, False, pp)
            weights = dense / tp + expert / (etp * ep)
            step_bytes += weights * fp8_step
        opt.append(step_bytes / hbm)
        trainable.append((local_dense, local_expert, owned))
    return tuple(buckets), tuple(gathers), tuple(opt), tuple(trainable)


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


def _hybrid_groups(dp_shape: GroupShape, shard: int) -> tuple[GroupShape, GroupShape]:
    """(shard group, replica group) of hybrid sharding over a data-parallel group placed as ``dp_shape``.

    A shard group is ``shard`` consecutive data-parallel ranks (the inner part of the axis, as torchtitan's
    dp_shard mesh dimension and FSDP's HYBRID_SHARD intra-node group are); the replica group joins the
    ranks one shard group apart. Data-parallel ranks fill nodes in order, so a shard group holds
    min(shard, per_node) members per node and a node holds per_node / shard replicas of a shard."""
    n = dp_shape.size
    if shard >= n:
        return dp_shape, GroupShape(size=1, per_node=1)
    dom = dp_shape.per_domain or dp_shape.per_node
    inner = GroupShape(size=shard, per_node=min(shard, dp_shape.per_node), per_domain=min(shard, dom),
                       stride=dp_shape.stride)
    reps = n // shard
    rn = max(1, min(reps, dp_shape.per_node // shard))
    outer = GroupShape(size=reps, per_node=rn, per_domain=max(rn, min(reps, dom // shard)),
                       stride=dp_shape.stride * shard)
    return inner, outer


def _dp_group(dp_shape: GroupShape, cp: int, shapes: Mapping[str, GroupShape]) -> GroupShape:
    """Dense gradients reduce over dp·cp ranks (Megatron folds CP into the DP gradient group)."""
    if cp <= 1:
        return dp_shape
    cp_shape = shapes["cp"]
    per_node = dp_shape.per_node * cp_shape.per_node
    return GroupShape(size=dp_shape.size * cp, per_node=min(per_node, dp_shape.size * cp))


def _edp_group(shapes: Mapping[str, GroupShape], edp: int, ep: int, etp: int) -> GroupShape:
    """Expert gradients reduce over the tp·dp·cp/(ep·etp) ranks holding the same experts.

    A pipeline stage's tp·cp·dp ranks are regrouped for the experts (Megatron-Core's MoE parallel
    folding): expert TP innermost, then EP, then the expert-data-parallel ranks, which hold the same
    experts and so sit ep·etp ranks apart. A node's share of the stage holds as many of them as it
    holds whole EP·ETP groups -- one when EP fills or spans the node."""
    stage_per_node = shapes["tp"].per_node * shapes["cp"].per_node * shapes["dp"].per_node
    ep_per_node = shapes["ep"].per_node if "ep" in shapes else 1
    etp_per_node = min(etp, shapes["tp"].per_node)
    per_node = max(1, min(edp, stage_per_node // max(1, ep_per_node * etp_per_node)))
    return GroupShape(size=edp, per_node=per_node, stride=1 if per_node > 1 else ep * etp)


__all__ = ["Plan", "StageCost", "build_plan", "split_layers"]
