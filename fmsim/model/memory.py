"""Memory per device of a training plan: weights, gradients, optimizer states, activations.

Sources:
* Mixed-precision Adam: 2 B bf16 weights + 4 B fp32 main gradients + 12 B fp32 master weights,
  momentum and variance per parameter; ZeRO stage k shards the last k of (optimizer, gradients,
  weights) over the data-parallel group (Rajbhandari et al. 2020, §5; Megatron's distributed
  optimizer = ZeRO-1, Korthikanti et al. 2022 §3 "6 + 12/d bytes").
* Activations per layer and micro-batch: Korthikanti et al. 2022, §4 eq. (1)-(6), generalised
  from GPT's 34·s·b·h to any attention/MLP width (GQA, SwiGLU, MoE) and with flash attention,
  which stores the attention output and log-sum-exp instead of the s² score matrix (Dao 2022).
* In-flight micro-batches: 1F1B stage i holds p - i; interleaving multiplies the first stage's
  load by (1 + (p-1)/(p·v)) (Korthikanti et al. 2022 §4.2.3); GPipe holds all m.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import OutOfMemoryError
from ..units import format_bytes
from .architecture import ModelSpec
from .flops import attention_dims
from .sac import saved_bytes_per_token

WEIGHT_BYTES = 2.0        # bf16 weights (fp8 recipes keep bf16 weights and cast per GEMM)
GRAD_BYTES = 4.0          # fp32 main gradients (Megatron accumulate-in-fp32)
OPTIMIZER_BYTES = 12.0    # fp32 master weights + Adam m and v


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes per device by part, for the most loaded pipeline stage."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float                 # loss-side activations on the last stage (fp32 logits)
    #: activations waiting in host memory (activation offloading); not HBM, so not in ``total``
    host_offload: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits

    def as_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "logits": self.logits}

    def require_fit(self, hbm_bytes: float, *, where: str = "") -> None:
        """Raise :class:`OutOfMemoryError` naming the largest part when the total exceeds ``hbm_bytes``."""
        if self.total <= hbm_bytes:
            return
        parts = self.as_dict()
        big = max(parts, key=parts.get)
        raise OutOfMemoryError(
            f"{where + ': ' if where else ''}needs {format_bytes(self.total)} per GPU of {format_bytes(hbm_bytes)}; "
            f"largest part: {big} {format_bytes(parts[big])} "
            f"(expected a plan that fits: raise tp/pp, recompute, ZeRO, smaller micro-batch)",
            breakdown=parts)


def layer_activation_bytes(model: ModelSpec, layer: int, *, micro_batch: int, seq_len: int, tp: int,
                           cp: int, sequence_parallel: bool, recompute: str, ep: int = 1,
                           expert_tp: int | None = None, recompute_modules: tuple[str, ...] = (),
                           gemm_input_bytes: float = 2.0, frozen_mlp: bool = False,
                           moe_load: float = 1.0, act_input_bytes: float = 2.0,
                           recompute_policy: str = "modules", keep_attention: bool = True,
                           dropout_mask_bytes: float = 0.0) -> float:
    """Stored activation bytes of one layer for one micro-batch on one device.

    Per token (bf16, 2 bytes per element), after Korthikanti et al. 2022 §4.1 with flash attention:
    attention block = 2h (QKV input) + 2(d_q + d_kv) (Q, K, V) + 2 d_v (output);
    MLP block = 2h (input) + 2·up (activation input) + 2·ffn (down-projection input);
    two norms = 4h. Tensors inside TP regions are split by tp; with sequence parallelism the
    norm/residual regions are split too (eq. 5). Full recompute keeps only the layer input (eq. 6).
    Selective recompute drops what its modules make again: with flash attention the attention core
    stores nothing beyond Q, K, V and its output (so ``core_attn`` saves nothing here); ``mlp`` and
    ``moe`` keep only the block input; ``moe_act`` the experts' down-projection input; ``shared_experts``
    their internals; ``layernorm`` the two norm outputs; ``mla_up_proj`` the up-projected Q, K, V.

    A tensor kept only as a linear layer's input, for its weight gradient, is kept in the GEMM's
    precision: Transformer Engine's fp8 (and fp4) linear layers save the quantized copy they
    multiplied with (``gemm_input_bytes`` per element: the QKV and MLP inputs, the down-projection
    input; the attention output is kept in 16-bit for the attention backward and in fp8 beside it
    for the output projection). A frozen linear layer (LoRA's base weights) computes no weight
    gradient, so its input is not kept at all: ``frozen_mlp`` drops the MLP's and the experts'
    inputs and down-projection inputs (LoRA on the attention projections only). An adapted layer's
    input is kept for its 16-bit adapters (the caller passes ``gemm_input_bytes`` 2 under LoRA).
    ``moe_load``: the routed rows of the busiest expert-parallel rank over the balanced share.
    ``act_input_bytes``: bytes per element of the MLP activation function's saved input (1 under
    Megatron-Core's ``activation_func_fp8_input_store``, which keeps it as fp8 for the backward).
    ``recompute_policy`` torchtitan-op (with selective): the block's input, its kept mm outputs and SDPA's
    output when ``keep_attention`` (:func:`fmsim.model.sac.saved_bytes_per_token`; dense, 16-bit, cp 1).
    ``dropout_mask_bytes``: bytes per element of the mask each hidden-dropout site keeps for its backward
    (1 under hidden dropout: PyTorch's boolean mask, :func:`fmsim.model.dropout.hidden_dropout_bytes`), two sites
    a layer over the residual stream's SP-split h -- the two ``sbh`` masks of Korthikanti et al.'s 34·s·b·h;
    a fused attention kernel keeps no mask of its attention dropout (it draws it again in the backward).
    """
    tokens = micro_batch * seq_len / cp
    h = model.hidden
    seq_split = tp if sequence_parallel else 1
    if recompute == "full":
        return 2.0 * tokens * h / seq_split
    if recompute == "selective" and recompute_policy == "torchtitan-op":
        return tokens * saved_bytes_per_token(model, keep_attention, tp)
    dqk, dv = attention_dims(model)
    mods = set(recompute_modules) if recompute == "selective" else set()
    mla = model.attention == "mla" and model.mla is not None
    if mla:
        kv = model.heads * (model.mla.qk_nope_dim + model.mla.v_head_dim)
    else:
        kv = 2 * model.kv_heads_per_rank(tp) * tp * model.head_dim     # whole K/V heads per rank
    g = gemm_input_bytes
    proj_copy = g * dv if g < 2.0 else 0.0          # the fp8 copy of the attention output for the projection
    attn_tp = 2.0 * (dqk + kv + dv) + proj_copy
    if mla and "mla_up_proj" in mods:
        attn_tp = 2.0 * dv + proj_copy              # Q, K, V made again from the kept latents
    mlp_in = 0.0 if frozen_mlp else g * h
    replicated = g * h + 4.0 * h + mlp_in           # QKV input, norms, MLP input (SP-split)
    replicated += 2.0 * dropout_mask_bytes * h      # the two hidden-dropout masks (SP-split)
    if "layernorm" in mods:
        replicated -= g * h + mlp_in                # the two norm outputs (QKV and MLP inputs) made again
    if model.is_moe_layer(layer):
        m = model.moe
        assert m is not None
        up = m.expert_ffn_hidden * (2 if model.gated else 1)
        etp = tp if expert_tp is None else expert_tp
        # routed rows: each rank computes tokens·etp/tp·top_k rows of width ffn/etp (see ops.moe_mlp_forward)
        down_in = 0.0 if ("moe_act" in mods or frozen_mlp) else g * m.expert_ffn_hidden
        expert_in = 0.0 if frozen_mlp else g * h
        routed = m.top_k * etp * (expert_in + (act_input_bytes * up + down_in) / etp) * moe_load
        shared = 0.0
        if m.shared_experts and "shared_experts" not in mods:
            sw = (m.shared_expert_ffn_hidden or m.expert_ffn_hidden) * m.shared_experts
            shared = 2.0 * sw * (2 if model.gated else 1) + (0.0 if frozen_mlp else g * sw)
        if "moe" in mods:
            routed = shared = 0.0                   # the whole block made again from its input
        per_token = replicated / seq_split + (attn_tp + shared + routed) / tp
    else:
        ffn = model.moe.dense_ffn_hidden if (model.moe and model.moe.dense_ffn_hidden) else model.ffn_hidden
        up = ffn * (2 if model.gated else 1)
        mlp_tp = 0.0 if "mlp" in mods else act_input_bytes * up + (0.0 if frozen_mlp else g * ffn)
        per_token = replicated / seq_split + (attn_tp + mlp_tp) / tp
    return tokens * per_token


def in_flight_microbatches(schedule: str, pp: int, vpp: int, num_microbatches: int, stage: int = 0) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the layers
    of one *physical* stage (so interleaving is a fractional factor)."""
    if schedule == "gpipe":
        return float(num_microbatches)
    held = min(pp - stage, num_microbatches)
    if vpp > 1 and stage == 0:
        return min(pp * (1.0 + (pp - 1) / (pp * vpp)), float(num_microbatches))
    return float(held)


def stage_params(model: ModelSpec, layers: list[int], first: bool, last: bool, pp: int) -> tuple[float, float]:
    """(dense, expert) parameters held by a physical stage (all its chunks), before TP/EP split."""
    dense = expert = 0.0
    for one, count in model.layer_kinds(layers):
        total = model.layer_params(one)[0]
        if model.is_moe_layer(one):
            e = model.moe.experts * model.mlp_params(model.moe.expert_ffn_hidden)
            expert += count * e
            dense += count * (total - e)
        else:
            dense += count * total
    if first:
        dense += model.vocab * model.hidden
    if last and (not model.tied_embeddings or pp > 1):
        dense += model.vocab * model.hidden + model.hidden
    if last and model.mtp_layers:
        total = model.mtp_params()[0]
        per = model.moe.experts * model.mlp_params(model.moe.expert_ffn_hidden) if model.moe else 0
        expert += per * model.mtp_layers
        dense += total - per * model.mtp_layers
    return dense, expert


def layer_recompute(recompute: str, recomputed: frozenset[int] | None, layer: int) -> str:
    """How ``layer`` recomputes: the run's ``recompute``, or none for a layer outside ``recomputed`` (the
    layers full recompute covers under Megatron-LM's block method; None = every layer)."""
    return recompute if recomputed is None or layer in recomputed else "none"


def training_memory(model: ModelSpec, *, stage_layers: list[int], first: bool, last: bool,
                    micro_batch: int, seq_len: int, tp: int, pp: int, dp: int, cp: int, ep: int,
                    vpp: int, zero: int, sequence_parallel: bool, recompute: str, schedule: str,
                    num_microbatches: int, stage: int, expert_tp: int | None = None,
                    grad_bytes: float = GRAD_BYTES, recompute_modules: tuple[str, ...] = (),
                    weight_bytes: float = WEIGHT_BYTES, gemm_input_bytes: float = 2.0,
                    frozen_mlp: bool = False, offload_layers: int = 0, moe_load: float = 1.0,
                    act_input_bytes: float = 2.0,
                    recomputed: frozenset[int] | None = None, recompute_policy: str = "modules",
                    keep_attention: bool = True, dropout_mask_bytes: float = 0.0) -> MemoryBreakdown:
    """Memory of the device of pipeline stage ``stage`` holding ``stage_layers`` (all its chunks).

    ``offload_layers``: the activations of the stage's first that many layers go to host memory after
    their forward and come back for their backward (Megatron-Core's CPU offloading, which offloads the
    first layers: the last ones are needed first); one offloaded layer's activations are in transit
    on the device at a time. ``recomputed``: with ``recompute`` full, the layers that recompute (keeping
    only their input); the others keep every activation. None = every layer. ``recompute_policy``,
    ``keep_attention``: :func:`layer_activation_bytes`."""
    dense_params, expert_params = stage_params_cached(model, stage_layers, first, last, pp)
    etp = tp if expert_tp is None else expert_tp
    dense_params += tp * model.replicated_kv_params(tp) * len(stage_layers)   # K/V heads copied over tp > kv_heads
    local = dense_params / tp + expert_params / (etp * ep)
    # data-parallel sharding groups: dense params over dp·cp, expert params over tp·dp·cp/(ep·etp)
    dense_dp = dp * cp
    expert_dp = max(1, tp * dp * cp // (ep * etp))
    shard_dense = dense_params / tp / dense_dp
    shard_expert = expert_params / (etp * ep) / expert_dp
    sharded = shard_dense + shard_expert
    weights = weight_bytes * (sharded if zero >= 3 else local)
    grads = grad_bytes * (sharded if zero >= 2 else local)
    opt = OPTIMIZER_BYTES * (sharded if zero >= 1 else local)
    per_mb, host_offload = _stage_activations(
        model, tuple(stage_layers), micro_batch, seq_len, tp, cp, sequence_parallel, recompute, ep, etp,
        tuple(recompute_modules), gemm_input_bytes, frozen_mlp, moe_load, act_input_bytes, offload_layers,
        recomputed, recompute_policy, keep_attention, dropout_mask_bytes)
    acts = per_mb * in_flight_microbatches(schedule, pp, vpp, num_microbatches, stage)
    logits = 0.0
    if last:
        # fp32 logits and their gradient over the local vocab shard, one micro-batch at a time
        logits = 2 * 4.0 * micro_batch * seq_len / cp * model.vocab / tp
    return MemoryBreakdown(weights=weights, gradients=grads, optimizer=opt, activations=acts, logits=logits,
                           host_offload=host_offload)


@functools.lru_cache(maxsize=4096)
def _stage_activations(model: ModelSpec, stage_layers: tuple[int, ...], micro_batch: int, seq_len: int, tp: int,
                       cp: int, sequence_parallel: bool, recompute: str, ep: int, etp: int,
                       recompute_modules: tuple[str, ...], gemm_input_bytes: float, frozen_mlp: bool,
                       moe_load: float, act_input_bytes: float, offload_layers: int,
                       recomputed: frozenset[int] | None, recompute_policy: str = "modules",
                       keep_attention: bool = True,
                       dropout_mask_bytes: float = 0.0) -> tuple[float, float]:
    """(stored activation bytes of one micro-batch on the device, of which offloaded to the host) for a
    stage's layers: what :func:`training_memory` multiplies by the micro-batches in flight. Memoised
    (bounded) on its frozen inputs: it reads neither the data-parallel width, nor the ZeRO stage, nor the
    schedule, nor the instance, so a search's plans that differ only in those share it."""
    # a layer's stored activations depend only on its kind (dense or MoE MLP) and whether it
    # recomputes: price each pair once
    kinds = [(model.is_moe_layer(i), layer_recompute(recompute, recomputed, i)) for i in stage_layers]
    first_of: dict[tuple[bool, str], int] = {}
    for kind, i in zip(kinds, stage_layers):
        first_of.setdefault(kind, i)
    by_kind = {kind: layer_activation_bytes(
        model, one, micro_batch=micro_batch, seq_len=seq_len, tp=tp, cp=cp, sequence_parallel=sequence_parallel,
        recompute=kind[1], ep=ep, expert_tp=etp, recompute_modules=recompute_modules,
        gemm_input_bytes=gemm_input_bytes, frozen_mlp=frozen_mlp, moe_load=moe_load,
        act_input_bytes=act_input_bytes, recompute_policy=recompute_policy, keep_attention=keep_attention,
        dropout_mask_bytes=dropout_mask_bytes)
        for kind, one in first_of.items()}
    per_layer = [by_kind[kind] for kind in kinds]
    off = per_layer[:offload_layers]
    per_mb = sum(per_layer[offload_layers:]) + (max(off) if off else 0.0)
    return per_mb, sum(off)


@functools.lru_cache(maxsize=4096)
def _stage_params_memo(model: ModelSpec, layers: tuple[int, ...], first: bool, last: bool,
                       pp: int) -> tuple[float, float]:
    return stage_params(model, list(layers), first, last, pp)


def stage_params_cached(model: ModelSpec, layers, first: bool, last: bool, pp: int) -> tuple[float, float]:
    """:func:`stage_params`, memoised (bounded) on its frozen inputs: a search asks it of the same stages
    and, under ZeRO-3, of the same single layers for thousands of plans. Same numbers, computed once."""
    return _stage_params_memo(model, tuple(layers), first, last, pp)


stage_params_cached.cache_clear = _stage_params_memo.cache_clear     # type: ignore[attr-defined]
stage_params_cached.cache_info = _stage_params_memo.cache_info       # type: ignore[attr-defined]

#: the stage activations' memo, for the estimate's cache registry (fmsim.parallel.strategy.CACHED)
stage_activations_cached = _stage_activations
