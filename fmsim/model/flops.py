"""Model FLOPs per step, counted the ways published sources count them.

MFU/HFU and "TFLOP/s per GPU" are not one quantity across papers (SOURCES_training.md). A
prediction is compared with a measurement only through the source's own formula, applied to the
simulated step time. Each formula below names its source.

Per-token forward FLOPs of the *exact* count (``exact_forward_flops_per_token``) are what the
simulator's operator model executes; the named formulas are accounting conventions.
"""
from __future__ import annotations

import functools

from ..errors import ConfigError
from .architecture import ModelSpec

FORMULAS = ("megatron-2021", "korthikanti-2022", "palm", "nemo", "llama3", "exact")


def attention_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key width, value width) summed over heads, as the attention matmuls see them."""
    if model.attention == "mla" and model.mla is not None:
        m = model.mla
        return model.heads * (m.qk_nope_dim + m.qk_rope_dim), model.heads * m.v_head_dim
    return model.heads * model.head_dim, model.heads * model.head_dim


def matmul_params_per_token(model: ModelSpec) -> tuple[float, float]:
    """(active weights multiplied per token in the layers, in the output projection).

    Norm weights and the input embedding (a lookup) do no matmul work.
    """
    layers = 0.0
    for first, count in model.layer_kinds():
        _, active = model.layer_params(first)
        layers += count * (active - 2 * model.norm_params())
    return layers, float(model.vocab * model.hidden)


@functools.lru_cache(maxsize=1024)    # a pure function of frozen inputs, asked once per costed plan
def exact_forward_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = True) -> float:
    """Forward FLOPs per token: 2 x active matmul weights + attention scores and values.

    Attention: QK^T and AV cost 2*s*(d_qk + d_v) per token per layer for a full (non-causal) score
    matrix (Vaswani et al. 2017; Narayanan et al. 2021 eq. 2 counts it this way); a causal mask halves
    the useful work, which is what flash-attention kernels execute (Dao 2023). A causal layer with
    local attention (``model.window``) does only its window's pairs.
    """
    layers, logits = matmul_params_per_token(model)
    return 2.0 * (layers + logits) + attention_flops_per_token(model, seq_len, causal=causal)


def lora_flops_per_token(model: ModelSpec, seq_len: int, rank: int, modules: str = "all") -> tuple[float, float]:
    """(forward, forward + backward) model FLOPs per token of LoRA fine-tuning, NeMo/Meta accounting
    (every weight's matmuls, each layer's score matrix in full).

    The frozen weights' backward computes only the data gradient, as much as their forward (Hu et al.
    2021 §4.2); the attention scores' backward is twice their forward, as in pre-training; the adapters
    train, so theirs is twice their forward too. Counting 3x the forward instead would put a LoRA run's
    MFU above 1 wherever its GEMMs run near peak."""
    layers, logits = matmul_params_per_token(model)
    attn = attention_flops_per_token(model, seq_len, causal=False)
    adapters = 2.0 * model.total_lora_params(rank, modules)
    frozen = 2.0 * (layers + logits)
    return frozen + attn + adapters, 2.0 * frozen + 3.0 * attn + 3.0 * adapters


def attention_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = True) -> float:
    """Forward FLOPs per token of the attention scores and values over all layers.

    ``causal=False`` counts each layer's score matrix in full, as NeMo and Meta do: the whole
    square, or for a local layer (``model.window``) the whole band of ``window.size`` keys per
    query; ``causal=True`` counts the pairs a causal kernel computes (:meth:`ModelSpec.attention_keys`)."""
    dqk, dv = attention_dims(model)
    if causal:
        keys = sum(model.attention_keys(i, seq_len) for i in range(model.layers))
    else:
        band = min(seq_len, model.window.size) if model.window is not None else seq_len
        keys = sum(float(band if model.is_windowed_layer(i) else seq_len) for i in range(model.layers))
    return 2.0 * keys * (dqk + dv)


def model_flops_per_step(model: ModelSpec, seq_len: int, global_batch: int, formula: str,
                         *, recompute: str = "none") -> float:
    """Model FLOPs of one optimizer step of ``global_batch`` sequences of ``seq_len`` tokens.

    Parameters
    ----------
    formula:
        ``megatron-2021``: Narayanan et al. 2021 (arXiv 2104.04473) eq. 3,
        96·B·s·l·h²·(1 + s/6h + V/16lh) -- GPT with 4h GELU MLP, counts the full-recompute forward.
        ``korthikanti-2022``: Korthikanti et al. 2022 (arXiv 2205.05198) §6 model FLOPs,
        72·B·s·l·h²·(1 + s/6h + V/12lh) -- no recompute (MFU); ``recompute`` adds the recomputed
        forward for HFU (selective: attention scores; full: whole forward of the layers).
        ``palm``: Chowdhery et al. 2022 (PaLM) App. B, 6·N + 12·L·H·Q·T per token with N the
        non-embedding active parameters plus the output projection (MosaicML llm-foundry counts it so).
        ``nemo`` / ``llama3``: exact matmul count, 3 × forward with full (non-causal) attention
        scores -- NeMo's ``flops_formulas`` and Meta's MFU accounting (Llama 3 paper §3.3.2) both
        count GQA/SwiGLU/MoE-active weights exactly and the attention square in full (a local
        layer's band in full: ``window.size`` keys per query).
        ``exact``: what the simulator executes (causal attention halved), forward + backward.
    """
    tokens = float(seq_len) * global_batch
    h, l, v, s = model.hidden, model.layers, model.vocab, seq_len
    if formula == "megatron-2021":
        return 96.0 * global_batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    if formula == "korthikanti-2022":
        base = 72.0 * global_batch * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
        if recompute == "full":
            base *= 4.0 / 3.0 * (1 + s / (6 * h) + v / (16 * l * h)) / (1 + s / (6 * h) + v / (12 * l * h))
        elif recompute == "selective":
            # recomputed attention scores: 4·B·s²·h·l per forward (Korthikanti §5 / Table 2)
            base += 4.0 * global_batch * s * s * h * l
        return base
    if formula == "palm":
        layers, logits = matmul_params_per_token(model)
        dqk, dv = attention_dims(model)
        return tokens * (6.0 * (layers + logits) + 6.0 * s * (dqk + dv) * l)
    if formula in ("nemo", "llama3"):
        return 3.0 * tokens * exact_forward_flops_per_token(model, s, causal=False)
    if formula == "exact":
        return 3.0 * tokens * exact_forward_flops_per_token(model, s, causal=True)
    raise ConfigError(f"unknown FLOPs formula {formula!r} (known: {', '.join(FORMULAS)})")
