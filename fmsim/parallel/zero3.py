"""DeepSpeed ZeRO-3's parameter fetch, submodule by submodule (``parallelism.param_fetch: deepspeed``).

Owns the time one forward or backward pass takes when DeepSpeed's ``PartitionedParameterCoordinator``
(deepspeed/runtime/zero/stage3.py, v0.3.12 to v0.5.x) moves the weights, as its code does it:

* each weight tensor is gathered by its own all-gather as the submodule holding it is entered
  (``fetch_sub_module`` -> ``Init._allgather_param``, one ``torch.distributed.all_gather`` per
  parameter, deepspeed/runtime/zero/partition_parameters.py); tensors below
  ``stage3_param_persistence_threshold`` elements are kept whole and never gathered;
* the fetch waits for the gathers in flight and then synchronises the device
  (``_synchronize_communication``: ``torch.cuda.synchronize()``), so a gather, or a gradient
  reduction on the reduction stream, overlaps only the one submodule's compute running beside it;
* after the fetch, the next tensors in the recorded trace are prefetched, up to
  ``stage3_prefetch_bucket_size`` elements and only while fewer than ``stage3_max_live_parameters``
  elements are gathered (``prefetch_next_sub_modules``);
* after its submodule, a tensor is released unless the trace reuses it within
  ``stage3_max_reuse_distance`` elements (``release_sub_module`` / ``_keep_for_later``);
* gradients fill a bucket of ``reduce_bucket_size`` elements; when a gradient's hook finds the bucket
  full, the bucket is reduced on the reduction stream beside that submodule's compute
  (``reduce_independent_p_g_buckets_and_remove_grads``), and the last one after the backward.

The pass is a chain of intervals, one per weight tensor in trace order: an interval lasts the longer
of the submodule's compute (slowed by the SMs the collectives beside it take) and the traffic issued
beside it; a tensor not prefetched is gathered in the open first. The submodule's compute is its
pass's compute shared by parameter count (a linear layer's GEMM FLOPs are proportional to its weight).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..model.kernels import KERNEL_FIXED_S

#: The coordinator's defaults, the same from v0.3.12 (2021-03) to v0.5.x: deepspeedai/DeepSpeed
#: deepspeed/runtime/zero/constants.py @12a53b43 (v0.3.13) and @f2843244 (v0.5.0)
PREFETCH_BUCKET_SIZE = 50_000_000        # ZERO_OPTIMIZATION_PREFETCH_BUCKET_SIZE_DEFAULT
MAX_LIVE_PARAMETERS = 1_000_000_000      # ZERO_OPTIMIZATION_MAX_LIVE_PARAMETERS_DEFAULT
MAX_REUSE_DISTANCE = 1_000_000_000       # ZERO_OPTIMIZATION_MAX_REUSE_DISTANCE_DEFAULT
PERSISTENCE_THRESHOLD = 100_000          # ZERO_OPTIMIZATION_PARAM_PERSISTENCE_THRESHOLD_DEFAULT


@dataclass(frozen=True, slots=True)
class Use:
    """One submodule's use of one weight tensor, in trace order."""

    tensor: int          # which tensor (a use of the same tensor again has the same id)
    numel: float         # its elements
    compute_s: float     # the submodule's compute this use runs
    backward: bool       # a backward use: its gradient joins the reduce bucket


def step_trace(layer_numels: Sequence[Sequence[float]], embedding_numel: float, head_numel: float | None, *,
               fwd_s: float, bwd_s: float, recompute_s: float) -> tuple[list[Use], int]:
    """The uses of one micro-batch's forward then backward on a stage holding every layer, and the index
    where the backward starts: the embedding, each layer's tensors, the output layer (``head_numel``
    ``None``: the embedding again, tied); in the backward the output layer, then per layer in reverse its
    recompute forward (with full recompute) and its backward, then the embedding. Compute is shared by
    parameter count."""
    ids: list[list[int]] = []
    nxt = 1
    for layer in layer_numels:
        ids.append(list(range(nxt, nxt + len(layer))))
        nxt += len(layer)
    head = [(0 if head_numel is None else nxt, embedding_numel if head_numel is None else head_numel)]
    total = sum(sum(layer) for layer in layer_numels) + embedding_numel + head[0][1]

    in_layers = sum(sum(layer) for layer in layer_numels)

    def share(n: float, pass_s: float, over: float = total) -> float:
        return pass_s * n / over if over else 0.0

    out: list[Use] = []
    emb = [(0, embedding_numel)] if embedding_numel >= PERSISTENCE_THRESHOLD else []
    head = [h for h in head if h[1] >= PERSISTENCE_THRESHOLD]
    for t, n in emb:
        out.append(Use(t, n, share(n, fwd_s), False))
    for layer, lid in zip(layer_numels, ids):
        out += [Use(t, n, share(n, fwd_s), False) for t, n in zip(lid, layer)]
    for t, n in head:
        out.append(Use(t, n, share(n, fwd_s), False))
    start = len(out)
    for t, n in head:
        # a tied embedding's gradient is complete (its hook fires) only after the embedding's backward
        out.append(Use(t, n, share(n, bwd_s), head_numel is not None))
    for layer, lid in zip(reversed(layer_numels), reversed(ids)):
        if recompute_s > 0:
            # the layers alone run again
            out += [Use(t, n, share(n, recompute_s, in_layers), False) for t, n in zip(lid, layer)]
        out += [Use(t, n, share(n, bwd_s), True) for t, n in reversed(list(zip(lid, layer)))]
    for t, n in emb:
        out.append(Use(t, n, share(n, bwd_s), True))
    return out, start


def chain_s(uses: Sequence[Use], *, gather_s: Callable[[float], float],
            reduce_s: Callable[[tuple[float, ...]], float], bucket: float, slowdown: float,
            peak: list[float] | None = None) -> list[float]:
    """Time of each interval of the trace (the last one also carries the final bucket's reduction).
    ``gather_s``: one tensor's gather, by elements; ``reduce_s``: one bucket's reduction, by its tensors'
    elements. ``peak``, when given, receives the most elements gathered at once (in use and in flight)."""
    n = len(uses)
    # the elements the trace uses between a use and the next use of the same tensor (release rule)
    next_use: dict[int, int] = {}
    reuse = [float("inf")] * n
    suffix = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + uses[i].numel
    for i in range(n - 1, -1, -1):
        j = next_use.get(uses[i].tensor)
        if j is not None:
            reuse[i] = suffix[i + 1] - suffix[j]
        next_use[uses[i].tensor] = i
    live: dict[int, float] = {}          # gathered tensors and their elements
    inflight: dict[int, float] = {}      # prefetched, their gathers issued
    in_bucket = 0.0
    bucket_tensors: list[float] = []
    most = 0.0
    out = []
    for i, u in enumerate(uses):
        t = 0.0
        if u.tensor not in live:
            if u.tensor not in inflight:
                t += gather_s(u.numel)       # fetched in the open
            live[u.tensor] = u.numel
        inflight.pop(u.tensor, None)
        beside = 0.0
        if u.backward:
            # this gradient's hook finds the bucket full: the bucket so far is reduced on the reduction
            # stream beside this submodule's compute (the next fetch's synchronize waits for it)
            if in_bucket + u.numel > bucket and in_bucket > 0:
                beside += reduce_s(tuple(bucket_tensors))
                in_bucket, bucket_tensors = 0.0, []
            in_bucket += u.numel
            bucket_tensors.append(u.numel)
        # DeepSpeed counts a prefetched tensor as available from its issue
        if sum(live.values()) + sum(inflight.values()) < MAX_LIVE_PARAMETERS:
            got = 0.0
            for v in uses[i + 1:]:
                if got >= PREFETCH_BUCKET_SIZE:
                    break
                if v.tensor in live or v.tensor in inflight:
                    continue
                inflight[v.tensor] = v.numel
                beside += gather_s(v.numel)
                got += v.numel
        most = max(most, sum(live.values()) + sum(inflight.values()))
        c = u.compute_s
        t += max(c + slowdown * min(c, beside), beside)
        if reuse[i] >= MAX_REUSE_DISTANCE:
            live.pop(u.tensor, None)
        out.append(t)
    if out:
        out[-1] += reduce_s(tuple(bucket_tensors)) if bucket_tensors else 0.0
    if peak is not None:
        peak.append(most)
    return out


def list_copies_s(size_bytes: float, ranks: int, hbm_bytes_per_s: float) -> float:
    """The copies PyTorch's NCCL process group adds to an all-gather or reduce-scatter called with a list
    of one tensor per rank, as DeepSpeed ZeRO-3 calls them (``torch.distributed.all_gather(partitions,
    ...)``): the collective runs on a flat buffer and each of the ``ranks`` tensors is copied out of it
    (all-gather) or into it (reduce-scatter) by its own copy on the NCCL stream (pytorch/pytorch
    torch/lib/c10d/ProcessGroupNCCL.cpp @00f5dfd5, ProcessGroupNCCL::allgather / reduce_scatter,
    ``outputTensors[i][j].copy_(outputFlattened[i][j], true)``). Each copy costs one kernel's fixed time
    (:data:`fmsim.model.kernels.KERNEL_FIXED_S`) and all of them read and write the buffer once."""
    return ranks * KERNEL_FIXED_S + 2 * size_bytes / hbm_bytes_per_s


def deepspeed_stage(stage, model, *, tp: int, seq_len: int, group: int, gather_s: Callable[[float], float],
                    collective_s: Callable[[str, float], float], grad_op: str, weight_bytes: float,
                    grad_bytes: float, hbm_bytes_per_s: float, bucket: float, slowdown: float):
    """(``stage``, a :class:`fmsim.parallel.strategy.StageCost` holding every layer, with DeepSpeed's fetch:
    the gathers and gradient reductions its passes expose, as ``dp`` communication of its forward and
    backward; the seconds the step adds after the optimizer, gathering the persistent tensors; the
    :class:`WorkingSet` of memory the fetch and the gradient buckets hold). ``gather_s(elements)``: one tensor's all-gather over the ``group`` ranks;
    ``collective_s(op, elements)``: one gradient collective (its precision and hybrid replicas included);
    ``grad_op``: all-reduce (DeepSpeed before v0.5.0: each bucket all-reduced, then each rank keeps its
    shard) or reduce-scatter (v0.5.0: one per tensor); ``bucket``: elements per gradient bucket (0: one per
    layer). Each collective also pays its PyTorch list-form copies (:func:`list_copies_s`)."""
    attn = model.heads * model.head_dim
    qkv = (model.heads + 2 * model.kv_heads) * model.head_dim
    fc1 = model.ffn_hidden * (2 if model.gated else 1)
    one = tuple(n / tp for n in (qkv * model.hidden, attn * model.hidden, fc1 * model.hidden,
                                 model.ffn_hidden * model.hidden) if n / tp >= PERSISTENCE_THRESHOLD)
    layers = [one] * model.layers
    pos = (model.max_seq_len or seq_len) * model.hidden if model.position_embedding == "learned" else 0
    emb = model.vocab * model.hidden / tp + pos
    head = None if model.tied_embeddings else model.vocab * model.hidden / tp
    fwd = stage.fwd_s
    bwd = stage.bwd_s - stage.recompute_s
    uses, start = step_trace(layers, emb, head, fwd_s=fwd, bwd_s=bwd, recompute_s=stage.recompute_s)
    memo_g: dict[float, float] = {}
    memo_r: dict[tuple[float, ...], float] = {}

    def g(n: float) -> float:
        if n not in memo_g:
            # Init._allgather_param also zero-fills the full tensor first (torch.zeros: write it once)
            memo_g[n] = gather_s(n) + list_copies_s(n * weight_bytes, group, hbm_bytes_per_s) \
                + n * weight_bytes / hbm_bytes_per_s
        return memo_g[n]

    def r(tensors: tuple[float, ...]) -> float:
        if tensors not in memo_r:
            if grad_op == "all-reduce":
                # allreduce_bucket: flatten the bucket, divide by the ranks, all-reduce, copy back
                # (three read-and-write passes over it)
                n = sum(tensors)
                memo_r[tensors] = collective_s("all-reduce", n) + 6 * n * grad_bytes / hbm_bytes_per_s
            else:
                # _reduce_scatter_gradients: one reduce-scatter per tensor, its inputs copied into the
                # flat buffer rank by rank
                memo_r[tensors] = sum(collective_s("reduce-scatter", n)
                                      + list_copies_s(n * grad_bytes, group, hbm_bytes_per_s) for n in tensors)
        return memo_r[tensors]

    peak: list[float] = []
    times = chain_s(uses, gather_s=g, reduce_s=r, bucket=bucket or sum(one), slowdown=slowdown, peak=peak)
    fwd_dp = max(0.0, sum(times[:start]) - fwd)
    bwd_dp = max(0.0, sum(times[start:]) - bwd - stage.recompute_s)
    # after the optimizer step every rank gathers the persistent (small) tensors again, in one
    # all-gather (_post_step: persistent_parameters[0].all_gather(...), synchronous: Init._allgather_params),
    # whose result is copied out tensor by tensor and rank by rank (one copy per tensor per rank)
    small = persistent_tensors(model, tp)
    total = sum(small)
    post = 0.0
    if small:
        post = (gather_s(total) + list_copies_s(total * weight_bytes, group, hbm_bytes_per_s)
                + len(small) * group * KERNEL_FIXED_S + 2 * total * weight_bytes / hbm_bytes_per_s)
    # the device also holds what the fetch gathers (the most at once, and the persistent tensors whole) and
    # the gradients waiting for their bucket's reduction: v0.3.x keeps each parameter's full-size .grad until
    # its bucket is reduced (up to a bucket of them); with contiguous gradients (v0.5.0's reduce-scatter path)
    # two ipg_buffer of reduce_bucket_size elements, swapped under overlap_comm (stage3.py @f2843244)
    bucket_elems = min(bucket or sum(one), sum(one) * model.layers + emb)
    working = WorkingSet(weights=(peak[0] + total) * weight_bytes,
                         gradients=bucket_elems * grad_bytes * (1 if grad_op == "all-reduce" else 2))
    return dataclasses.replace(stage, fwd_comm={**stage.fwd_comm, "dp": fwd_dp},
                               bwd_comm={**stage.bwd_comm, "dp": bwd_dp}), post, working


@dataclass(frozen=True, slots=True)
class WorkingSet:
    """Bytes DeepSpeed's ZeRO-3 holds beyond the shards: gathered weights, gradients awaiting reduction."""

    weights: float
    gradients: float


def persistent_tensors(model, tp: int) -> list[float]:
    """Elements of each tensor below the persistence threshold (kept whole on every rank): the norms'
    gains and biases, the linear layers' biases, the final norm; the four weight GEMMs of a layer are far
    above it at any width DeepSpeed trains."""
    qkv = (model.heads + 2 * model.kv_heads) * model.head_dim
    fc1 = model.ffn_hidden * (2 if model.gated else 1)
    norm = [model.hidden] * (2 if model.norm == "layernorm" else 1)
    per_layer = norm * 2 + ([qkv / tp, model.hidden, fc1 / tp, model.hidden] if model.bias else [])
    out = [n for n in per_layer if n < PERSISTENCE_THRESHOLD] * model.layers + norm
    return [float(n) for n in out]


__all__ = ["WorkingSet", "deepspeed_stage", "list_copies_s", "persistent_tensors", "MAX_LIVE_PARAMETERS", "MAX_REUSE_DISTANCE", "PERSISTENCE_THRESHOLD", "PREFETCH_BUCKET_SIZE",
           "Use", "chain_s", "step_trace"]
