"""Per-(virtual-)stage forward and backward costs of one micro-batch, from the operator model.

Owns: the split of layers over pipeline stages and virtual stages (Megatron-style, uneven when
pp·vpp does not divide the layers), :class:`StageCost`, the exposed share of each pass's inline
collectives (TP, CP, EP; :func:`_exposed`), the costing of each kind of layer, the embedding and the
head once per plan (:class:`_Piece`), and the memos that share stage costs and pieces across the
plans of a search (bounded; cleared by :func:`fmsim.parallel.strategy.clear_caches`).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..catalog import Instance
from ..errors import ParallelismError
from ..model.architecture import ModelSpec
from ..model.memory import layer_recompute
from ..model.ops import (
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
from ..model.sac import attention_kept, recompute_pass
from .comm_cost import CommCoster, overlap_slowdown


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
