"""Dropout in training: what Megatron's ``hidden_dropout`` adds to a layer's passes, by the kernels that run it.

Owns :func:`hidden_dropout_bytes` (the HBM bytes and kernels one dropout site adds to a block, by kernel fusion)
and :func:`add_hidden_dropout` (one site added to a block's forward cost, its backward priced beside it in
``PassCost.dropout_bwd_s``). The operator model (:mod:`fmsim.model.ops`) calls it at the two residual adds of every
layer and after the embeddings; the attention dropout is priced inside ``ops.attention_forward`` (the unfused
core's dropout kernel; nothing for a fused kernel, whose cost no published benchmark sizes: docs/stacks.md), and
the masks kept for the backward in ``memory.layer_activation_bytes``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .architecture import ModelSpec
    from .ops import PassCost, Roofline, Shard

__all__ = ["HIDDEN_DROPOUT_BYTES", "add_hidden_dropout", "hidden_dropout_bytes"]

#: bytes per element of one hidden-dropout site beyond the residual add the operator model prices, (forward,
#: backward), by kernel fusion (hidden_dropout_bytes)
HIDDEN_DROPOUT_BYTES = {"fused": (1.0, 5.0), "compiled": (1.0, 5.0), "eager": (5.0, 5.0),
                        "eager-composite-norm": (5.0, 5.0)}


def hidden_dropout_bytes(kernel_fusion: str) -> tuple[float, float, int]:
    """(forward, backward) HBM bytes per element, and forward kernels, that one hidden-dropout site adds to a
    block's output -- Megatron's ``hidden_dropout`` before each residual add, after attention and after the MLP
    (megatron/core/transformer/transformer_layer.py @baf94af3, core_r0.8.0: ``self_attn_bda`` and ``mlp_bda``
    with ``self.hidden_dropout``) -- beyond the residual add the operator model already prices (read two, write
    one).

    - fused / compiled: Megatron-Core's ``bias_dropout_add_fused_train`` (megatron/core/fusions/
      fused_bias_dropout.py @baf94af3: ``x + bias``, ``F.dropout``, ``residual + out`` under ``jit_fuser``,
      which megatron/core/jit.py makes ``torch.compile`` from PyTorch 2.2 -- NeMo 24.07's container runs 2.4 --
      and ``torch.jit.script``/nvFuser before) is one generated kernel with the random mask drawn inside it:
      beyond the add it writes the 1-byte mask it keeps for the backward (Inductor saves the boolean mask; a
      random op is not recomputed by its partitioner). Its backward scales the output gradient by the mask:
      read the gradient (2 B) and the mask (1 B), write the input's gradient (2 B) -- where without dropout
      that gradient is the output's own, passed on. Inductor (``compiled``) fuses dropout into the same
      pointwise chain.
    - eager: ``F.dropout`` is ATen's ``native_dropout``, its own kernel: read 2, write the output 2 and the
      mask 1; its backward ``native_dropout_backward`` reads the gradient and the mask and writes 2.

    At probability 0 nothing runs: ATen's ``dropout`` returns its input when ``p == 0`` (the fused kernel is
    taken only for 0 < p < 1), and so does the traced function.
    """
    fwd, bwd = HIDDEN_DROPOUT_BYTES[kernel_fusion]
    return fwd, bwd, 1 if kernel_fusion.startswith("eager") else 0


def add_hidden_dropout(c: PassCost, model: ModelSpec, sh: Shard, rf: Roofline, *, fusion: str = "") -> None:
    """Add one hidden-dropout site (:func:`hidden_dropout_bytes`) to a block's forward ``c``: over the block
    output's elements on this rank, the sequence-parallel shard under SP (the residual stream's layout after
    the row-parallel layer's reduce-scatter). ``fusion``: the kernel that runs it, if not the stack's own."""
    if not sh.hidden_dropout:
        return
    elements = sh.tokens * model.hidden / (sh.tp if sh.sequence_parallel else 1)
    fwd, bwd, kernels = hidden_dropout_bytes(fusion or sh.kernel_fusion)
    c.dropout_s += elements * fwd / rf.hbm_bytes_per_s
    c.dropout_bwd_s += elements * bwd / rf.hbm_bytes_per_s
    c.kernels += kernels
