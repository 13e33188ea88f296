"""Stage costs the operator model's passes leave out, added to a plan's stages after they are built.

Owns: fp8 delayed scaling's amax reduction per pass (Transformer Engine), the HBM traffic of making an
fp8 run's weight copies (once a step, or every micro-batch with the transpose cache off), and the
gradient-buffer add of each weight gradient when gradient-accumulation fusion is off.
"""
from __future__ import annotations

import dataclasses

from ..model.architecture import ModelSpec
from ..model.kernels import BYTES_PER_ELEMENT, KERNEL_FIXED_S
from ..model.memory import stage_params_cached
from ..model.ops import fp8_cast_bytes
from .comm_cost import CommCoster
from .data_parallel import _local_trainable
from .stage_costs import StageCost

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
