"""Data-parallel costs of each physical pipeline stage: gradient buckets, weight gathers, the optimizer step.

Owns: the trainable parameters a rank holds (its TP and EP share, or LoRA's adapters alone) and the
units ZeRO-3/FSDP gathers one by one, the data-parallel groups (dense over dp·cp, experts over their
own expert-data-parallel group, hybrid sharding's shard and replica groups), each stage's gradient
reduce-scatter (or all-reduce) in buckets, its weight all-gathers, and the memory-bound optimizer
step -- memoised across the plans of a search (bounded; cleared by
:func:`fmsim.parallel.strategy.clear_caches`).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import NamedTuple

from ..catalog import Instance
from ..errors import ConfigError
from ..hardware.collectives import GroupShape
from ..model.architecture import ModelSpec
from ..model.kernels import BYTES_PER_ELEMENT
from ..model.memory import stage_params_cached
from .comm_cost import CommCoster
from .stage_costs import _split_layers

#: Optimizer step traffic per locally-owned parameter, as Megatron's mixed-precision optimizers run it
#: (megatron/core/optimizer/optimizer.py: clip_grad_norm, then the step, then the copy back): the
#: gradient norm reads the fp32 main grads (4 B); FusedAdam (apex multi-tensor apply) reads grad,
#: master, m, v (16 B) and writes master, m, v (12 B); _copy_main_params_to_model_params reads the
#: fp32 master and writes the 16-bit weight (6 B). Each is a memory-bound kernel.
OPTIMIZER_BYTES_PER_PARAM = 38.0
#: fp16 runs unscale the main grads first (multi_tensor_scale with the inf check: read and write 4 B).
FP16_UNSCALE_BYTES_PER_PARAM = 8.0


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
