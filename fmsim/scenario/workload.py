"""The ``workload:`` section (and ``version:``): :class:`Workload`, its keys and choices, the model it
names, the batch and sequence-length bounds, tokens-to-sequences, and the MoE load it implies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog
from ..errors import ConfigError
from ..model.architecture import HashMemo, ModelSpec, memoise_hash, model_from_mapping
from ..model.fusion import CUDA_GRAPHS, KERNEL_FUSIONS
from ..units import parse_count
from .reader import _MISSING, _Section, _relocate, _what, float_number
from .schema import KINDS, LOW_PRECISIONS, PRECISIONS, SCHEMA_VERSION, TRAINING_KINDS


WORKLOAD_KEYS = (
    "kind",
    "model",
    "precision",
    "seq_len",
    "global_batch",
    "global_batch_tokens",
    "micro_batch",
    "train_tokens",
    "attention_kernel",
    "fp8_attention",
    "cross_entropy",
    "kernel_fusion",
    "cuda_graphs",
    "fp8_recipe",
    "hidden_dropout",
    "attention_dropout",
    "lora",
    "moe_routing",
    "moe_imbalance",
    "moe_capacity_factor",
    "moe_pad_to_capacity",
)
LORA_KEYS = ("rank", "modules", "dropout", "exchange")
LORA_MODULES = ("all", "attention")
#: how a row-parallel layer's adapter output, split over the hidden dimension, returns to the
#: sequence-parallel layout: gathered whole, then split (NeMo/Megatron ParallelLinearAdapter's default)
#: | one all-to-all (its ``a2a_experimental``)
LORA_EXCHANGES = ("all-gather", "all-to-all")
ATTENTION_KERNELS = ("flash", "flash2", "flash1", "unfused")
#: the loss kernel: fused (one fp32 pass) | unfused (Megatron's vocab-parallel cross entropy as separate
#: PyTorch ops, its default without --cross-entropy-loss-fusion; model.ops.CROSS_ENTROPY_BYTES)
CROSS_ENTROPIES = ("fused", "unfused", "torch")
MOE_ROUTINGS = ("balanced", "consecutive")
#: how an fp8 run scales its operands (Transformer Engine's recipes; fmsim.model.ops.fp8_cast_bytes). delayed is
#: Transformer Engine's default recipe (transformer_engine/pytorch/fp8.py get_default_fp8_recipe: DelayedScaling()).
FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8")
# Sizes no run could need, refused at load so that memory and time stay bounded whatever the input.
# The largest published pre-training steps hold tens of millions of tokens (Llama 3 405B: 16M, Meta
# 2024 Table 4) and the longest trained contexts ten million (Llama 4 Scout, 2025); the largest
# clusters a few hundred thousand accelerators. Each bound is orders of magnitude past those.
MAX_TOKENS_PER_STEP = 10**12   # seq_len x global_batch
MAX_SEQ_LEN = 10**8            # tokens per sequence


@memoise_hash
@dataclass(frozen=True, slots=True, kw_only=True)
class Workload(HashMemo):
    """What runs: the kind, the model, its precision and batch geometry.

    ``seq_len`` and ``global_batch`` are 0 when the kind does not use them (inference, rl).
    """

    kind: str
    model: ModelSpec
    precision: str = "bf16"
    seq_len: int = 0
    global_batch: int = 0  # sequences per optimizer step
    micro_batch: int = 1
    train_tokens: float | None = None
    #: flash | flash2 / flash1 (FlashAttention-2 / -1-class kernel) | unfused (scores materialised)
    attention_kernel: str = "flash"
    fp8_attention: bool = False      # the fused attention in fp8, forward and backward (TE fp8_dot_product_attention)
    cross_entropy: str = "fused"     # CROSS_ENTROPIES
    kernel_fusion: str = "fused"     # model.fusion.KERNEL_FUSIONS: how fused the non-GEMM kernels are
    cuda_graphs: str = "none"        # model.fusion.CUDA_GRAPHS: none | layer | step
    fp8_recipe: str = "delayed"      # FP8_RECIPES (fp8 runs)
    #: dropout probabilities of a training run: on each block's output before its residual add (Megatron's
    #: hidden_dropout, in the fused bias-dropout-add) and on the attention probabilities (attention_dropout,
    #: inside the attention kernel); 0 = none, what current pre-training recipes ship (NeMo 2's LlamaConfig, llama.py
    #: @8cfedd72 lines 73-74; Megatron-Bridge llama_provider.py @f9aad1f3 lines 49-50; torchtitan: none): model.dropout
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    lora_rank: int = 0               # 0 = full training; > 0 = LoRA adapters of this rank, base frozen
    lora_modules: str = "all"        # all | attention
    lora_dropout: float = 0.0        # dropout on each adapter's input (its own kernel)
    lora_exchange: str = "all-gather"  # LORA_EXCHANGES
    # how the run's router spreads a token's top-k experts: balanced (uniformly over the experts the
    # model's routing allows, its group limit included: a learned router under load balancing, or
    # Megatron's forced balance) | consecutive (k consecutive experts, a benchmark gate such as NeMo
    # AutoModel's FakeBalancedGate)
    moe_routing: str = "balanced"
    # the busiest expert-parallel rank's token-expert pairs over the mean (1 = balanced, as the measured
    # NeMo/Megatron-Bridge runs force it; a learned router's max/mean load, from its logs, otherwise)
    moe_imbalance: float = 1.0
    # Megatron-Core --moe-expert-capacity-factor: an expert takes at most this times its mean share and
    # drops the rest (0 = dropless); --moe-pad-expert-input-to-capacity: every expert computes its full
    # capacity, padded
    moe_capacity_factor: float = 0.0
    moe_pad_to_capacity: bool = False

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def moe_load(self) -> float:
        """Token-expert pairs the busiest expert-parallel rank computes, over the balanced share."""
        cf = self.moe_capacity_factor
        if not cf:
            return self.moe_imbalance
        return cf if self.moe_pad_to_capacity else min(self.moe_imbalance, cf)


def _version(top: _Section) -> int:
    v = top.raw("version", hint=f"expected {SCHEMA_VERSION}")
    if isinstance(v, bool) or not isinstance(v, int):
        raise top.err("version", f"got {_what(v)} (expected {SCHEMA_VERSION})")
    if v != SCHEMA_VERSION:
        raise top.err("version", f"schema version {v} is not supported (expected {SCHEMA_VERSION})")
    return v


def _model(wl: _Section, catalog: Catalog) -> ModelSpec:
    raw = wl.raw("model", hint="a model_catalog name or an inline architecture mapping")
    if isinstance(raw, str):
        try:
            return catalog.model(raw)
        except ConfigError as exc:
            raise _relocate(exc, wl.file, wl.path("model")) from None
    if isinstance(raw, Mapping):
        model = model_from_mapping(raw, file=wl.file, where=wl.path("model"))
        if raw.get("head_dim") is None and model.mla is None and model.hidden % model.heads:
            # the default head_dim, hidden / heads, would be rounded down without a word
            raise ConfigError(f"hidden {model.hidden} is not divisible by the {model.heads} heads, so "
                              "hidden / heads is no whole head_dim (expected head_dim given, or heads "
                              "dividing hidden)", file=wl.file, field=wl.path("model.head_dim"))
        return model
    raise wl.err(
        "model", f"got {_what(raw)} (expected a model_catalog name or an inline architecture mapping)"
    )


def _tokens_to_sequences(wl: _Section, seq_len: int) -> int:
    """``global_batch_tokens`` as a whole number of sequences of ``seq_len``.

    ML papers write batch sizes like "16M tokens" for 2^24 = 2048 x 8192: when the decimal reading
    of a K/M/G/T suffix is not a whole number of sequences but the binary reading is, the binary
    reading is taken (documented in README, scenario reference).
    """
    raw = wl.raw("global_batch_tokens")
    tokens = wl.quantity("global_batch_tokens", parse_count, expected="a token count like 16M or 4194304")
    if tokens % seq_len == 0:
        return int(tokens // seq_len)
    if isinstance(raw, str):
        m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT])\s*", raw)
        if m:
            binary = float(m.group(1)) * 1024.0 ** ("KMGT".index(m.group(2)) + 1)
            if binary.is_integer() and binary % seq_len == 0:
                return int(binary // seq_len)
    raise wl.err(
        "global_batch_tokens",
        f"{raw!r} = {tokens:,.0f} tokens is not a whole number of sequences of seq_len {seq_len} "
        "(expected a multiple of seq_len, or give global_batch in sequences)",
    )


def check_tokens_per_step(wl: _Section, seq_len: int, global_batch: int) -> None:
    """The reader's bound on a step's tokens (``seq_len x global_batch``; :data:`MAX_TOKENS_PER_STEP`)."""
    if seq_len * global_batch > MAX_TOKENS_PER_STEP:
        key = "global_batch_tokens" if wl.has("global_batch_tokens") else "global_batch"
        raise wl.err(key, f"{seq_len * global_batch:.3g} tokens per step (seq_len x global_batch) is past "
                     f"the {MAX_TOKENS_PER_STEP:.0e} any run could need (expected a batch such as 2048 "
                     "sequences or 16M tokens)")


def _workload(top: _Section, catalog: Catalog) -> tuple[Workload, _Section]:
    wl = top.section("workload", WORKLOAD_KEYS, required=True)
    assert wl is not None
    kind = wl.choice("kind", KINDS)
    model = _model(wl, catalog)
    precision = wl.choice("precision", PRECISIONS, "bf16")
    training = kind in TRAINING_KINDS
    seq_len = wl.integer(
        "seq_len", _MISSING if training else 0, counts=True, hint="tokens per sequence, e.g. 8192"
    )
    micro_batch = wl.integer("micro_batch", 1, counts=True)
    if wl.has("global_batch") and wl.has("global_batch_tokens"):
        raise wl.err("global_batch_tokens", "give global_batch or global_batch_tokens, not both")
    if wl.has("global_batch_tokens"):
        if not seq_len:
            raise wl.err("seq_len", "is required with global_batch_tokens (expected tokens per sequence)")
        global_batch = _tokens_to_sequences(wl, seq_len)
    else:
        global_batch = wl.integer(
            "global_batch",
            _MISSING if training else 0,
            counts=True,
            hint="sequences per optimizer step, or global_batch_tokens",
        )
    if seq_len > MAX_SEQ_LEN:
        raise wl.err("seq_len", f"{seq_len:,} tokens per sequence is past the {MAX_SEQ_LEN:,} any run could "
                     "need (expected a context length such as 8192)")
    check_tokens_per_step(wl, seq_len, global_batch)
    train_tokens = wl.quantity("train_tokens", parse_count, None, expected="a token count like 15T")
    attention_kernel = wl.choice("attention_kernel", ATTENTION_KERNELS, "flash")
    fp8_attention = wl.boolean("fp8_attention", False)
    if fp8_attention:
        if kind not in TRAINING_KINDS:
            raise wl.err("fp8_attention", f"applies to training kinds only, not {kind!r}")
        if precision not in LOW_PRECISIONS:
            raise wl.err("fp8_attention", f"true with precision {precision} (expected an fp8 or fp4 recipe)")
        if attention_kernel != "flash":
            raise wl.err("fp8_attention", f"true with attention_kernel {attention_kernel} (expected flash: the fp8 "
                         "kernel is the fused one)")
    cross_entropy = wl.choice("cross_entropy", CROSS_ENTROPIES, "fused")
    if wl.has("cross_entropy") and kind not in TRAINING_KINDS:
        raise wl.err("cross_entropy", f"applies to training kinds only, not {kind!r}")
    kernel_fusion = wl.choice("kernel_fusion", KERNEL_FUSIONS, "fused")
    cuda_graphs = wl.choice("cuda_graphs", CUDA_GRAPHS, "none")
    for key in ("kernel_fusion", "cuda_graphs"):
        if wl.has(key) and kind not in TRAINING_KINDS:
            raise wl.err(key, f"applies to training kinds only, not {kind!r} (the serving engines' kernels and "
                         "graphs are their engine profile's)")
    fp8_recipe = wl.choice("fp8_recipe", FP8_RECIPES, "delayed")
    if wl.has("fp8_recipe"):
        if kind not in TRAINING_KINDS:
            raise wl.err("fp8_recipe", f"applies to training kinds only, not {kind!r}")
        if precision != "fp8":
            raise wl.err("fp8_recipe", f"{fp8_recipe} with precision {precision} (expected precision fp8: the "
                         "recipe scales fp8 operands)")
    hidden_dropout, attention_dropout = (_dropout(wl, key, kind) for key in ("hidden_dropout", "attention_dropout"))
    moe_routing = wl.choice("moe_routing", MOE_ROUTINGS, "balanced")
    if wl.has("moe_routing") and model.moe is None:
        raise wl.err("moe_routing", f"given for {model.name}, which has no experts (expected an MoE model)")
    moe_imbalance, capacity, pad = _moe_load(wl, model, kind)
    lora_rank, lora_modules, lora_dropout, lora_exchange = 0, "all", 0.0, "all-gather"
    lo = wl.section("lora", LORA_KEYS)
    if lo is not None:
        if kind not in TRAINING_KINDS:
            raise wl.err("lora", f"applies to training kinds only, not {kind!r}")
        # an adapter B·A of rank r on a d_in x d_out weight is a full-rank update once r reaches the narrower of
        # them: a rank past the model's width is no LoRA (and its buckets would be unbounded)
        lora_rank = lo.integer("rank", _MISSING, counts=True, maximum=model.hidden, hint="adapter rank, e.g. 16")
        lora_modules = lo.choice("modules", LORA_MODULES, "all")
        lora_dropout = lo.quantity("dropout", float_number, 0.0, inclusive=True,
                                   expected="a dropout probability in [0, 1), e.g. 0.1")
        if lora_dropout >= 1.0:
            raise lo.err("dropout", f"{lora_dropout:g} must be < 1 (expected a dropout probability in [0, 1), "
                         "e.g. 0.1)")
        lora_exchange = lo.choice("exchange", LORA_EXCHANGES, "all-gather")
    return Workload(
        kind=kind,
        model=model,
        precision=precision,
        seq_len=seq_len,
        global_batch=global_batch,
        micro_batch=micro_batch,
        train_tokens=train_tokens,
        attention_kernel=attention_kernel,
        fp8_attention=fp8_attention,
        cross_entropy=cross_entropy,
        kernel_fusion=kernel_fusion,
        cuda_graphs=cuda_graphs,
        fp8_recipe=fp8_recipe,
        hidden_dropout=hidden_dropout,
        attention_dropout=attention_dropout,
        lora_rank=lora_rank,
        lora_modules=lora_modules,
        lora_dropout=lora_dropout,
        lora_exchange=lora_exchange,
        moe_routing=moe_routing,
        moe_imbalance=moe_imbalance,
        moe_capacity_factor=capacity,
        moe_pad_to_capacity=pad,
    ), wl


def _dropout(wl: _Section, key: str, kind: str) -> float:
    """``workload.hidden_dropout`` / ``attention_dropout``: a probability in [0, 1), training kinds only."""
    if not wl.has(key):
        return 0.0
    if kind not in TRAINING_KINDS:
        raise wl.err(key, f"applies to training kinds only, not {kind!r}")
    p = wl.quantity(key, float_number, 0.0, inclusive=True, expected="a dropout probability in [0, 1), e.g. 0.1")
    if p >= 1.0:
        raise wl.err(key, f"{p:g} must be < 1 (expected a dropout probability in [0, 1), e.g. 0.1)")
    return p


#: kinds whose MoE layers take a stated busiest-rank load (``moe_imbalance``): training, and serving (kind inference,
#: test-time compute included: fmsim.model.serving_cost prices the busiest expert-parallel rank's routed rows and
#: its DeepEP / all-to-all bytes); rl's rollout engines and trainer keep the balanced share
IMBALANCE_KINDS = (*TRAINING_KINDS, "inference")


def _moe_load(wl: _Section, model: Any, kind: str) -> tuple[float, float, bool]:
    """``moe_imbalance`` (training and serving MoE models), ``moe_capacity_factor`` and ``moe_pad_to_capacity``
    (training MoE models only)."""
    keys = [k for k in ("moe_imbalance", "moe_capacity_factor", "moe_pad_to_capacity") if wl.has(k)]
    if not keys:
        return 1.0, 0.0, False
    if model.moe is None:
        raise wl.err(keys[0], f"given for {model.name}, which has no experts (expected an MoE model)")
    if kind not in IMBALANCE_KINDS:
        raise wl.err(keys[0], f"applies to training and inference kinds only, not {kind!r} (rl's engines route "
                     "as balanced)")
    for key in ("moe_capacity_factor", "moe_pad_to_capacity"):
        if kind not in TRAINING_KINDS and wl.has(key):
            raise wl.err(key, f"applies to training kinds only, not {kind!r} (the serving engines run dropless)")
    imbalance = wl.quantity("moe_imbalance", float_number, 1.0, minimum=1.0, inclusive=True,
                            expected="the busiest expert-parallel rank's load over the mean, >= 1")
    capacity = wl.quantity("moe_capacity_factor", float_number, 0.0,
                           expected="an expert's capacity over its mean share, e.g. 1.25")
    pad = wl.boolean("moe_pad_to_capacity", False)
    if pad and not capacity:
        raise wl.err("moe_pad_to_capacity", "true without moe_capacity_factor (expected a capacity to pad to)")
    return imbalance, capacity, pad
