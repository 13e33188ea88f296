"""Operator cost model of one transformer layer, sharded by TP (+SP), CP and EP.

Owns the list of operators a decoder layer runs per micro-batch (norms, QKV/out projections,
attention core, MLP or MoE experts, router, residuals, embedding, logits and loss), their FLOPs
and HBM bytes for forward and backward, and their time on one accelerator by roofline:

    t_op = max(FLOPs / (peak(precision) · gemm_efficiency), bytes / (HBM bandwidth · hbm_efficiency))

with the accelerator's *global* efficiency figures from the hardware catalog. Communication
operators are returned as requests (axis, collective, bytes) and costed by the caller through
``fmsim.hardware.collectives`` so that the engine can overlap and share them.

Sources: Megatron-LM layer structure and SP collectives (Korthikanti et al. 2022, §4.2.2, Fig. 5);
flash-attention FLOPs, backward = 2.5 × forward matmul work (Dao 2023, §3.1); GEMM backward =
2 × forward (data and weight gradients, Narayanan et al. 2021 §5.1).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

from ..catalog import Accelerator
from .architecture import ModelSpec
from .flops import attention_dims
from .dropout import add_hidden_dropout
from .fusion import add_extra, add_norm_part, attach_host
from .kernels import (
    BYTES_PER_ELEMENT,
    KERNEL_FIXED_S,
    attention_length_efficiency,
    chip_gemm_k0,
    gemm_efficiency,
    gemm_k_efficiency,
    grouped_gemm_launches,
    grouped_kernel,
    grouped_kernel_efficiency,
)

#: Flash-attention backward executes 5 matmuls against forward's 2 (Dao 2023, FlashAttention-2 §3.1).
ATTENTION_BWD_FACTOR = 2.5
#: A GEMM's backward computes the data and the weight gradient: 2 × forward.
GEMM_BWD_FACTOR = 2.0
#: Elementwise kernels (norms, activations, residuals) move about twice the forward bytes backward.
MEM_BWD_FACTOR = 2.0
#: SMs Transformer Engine's userbuffers overlaps take from the GEMM beside them (module/base.py,
#: initialize_ub default config): the copy-engine ring exchange of the all-gathers (qkv/fc1 fprop,
#: proj/fc2 dgrad) runs on 1 SM with no margin carved out; the pipelined reduce-scatters (proj/fc2
#: fprop) and the bulk overlaps (qkv/fc1 dgrad and wgrad) on 16, set aside from the GEMM.
UB_RING_EXCHANGE_SMS = 1
UB_SPLIT_SMS = 16


@dataclass(frozen=True, slots=True)
class Shard:
    """How one micro-batch of one layer is split over the devices of a model replica."""

    micro_batch: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = True
    precision: str = "bf16"          # math of the linear layers (fp8 runs GEMMs in fp8, the rest in bf16)
    #: flash | flash2 / flash1 (FlashAttention-2 / -1 class) | unfused (materialised scores)
    attention_kernel: str = "flash"
    fp8_attention: bool = False      # the fused attention in fp8, forward and backward (TE fp8_dot_product_attention)
    cp_comm: str = "ring"            # ring (K/V passed around) | all-gather (gathered up front) | a2a (Ulysses)
    expert_tp: int = 1               # tensor-parallel width of each expert (Megatron ETP)
    ep_nodes: int = 1                # nodes (scale-up domains) one EP group spans
    #: alltoall (NCCL send/recv, every token-expert copy) | deepep (per node, DeepEP rates) | hybridep (per rank,
    #: HybridEP's GB200 rates, inside one NVLink domain)
    ep_dispatch: str = "alltoall"
    ep_overlap: bool = False         # dispatch/combine behind another micro-batch's compute
    moe_routing: str = "balanced"    # balanced | consecutive (a token's top-k are k consecutive experts)
    moe_load: float = 1.0            # the busiest EP rank's token-expert pairs over the balanced share
    moe_capacity_factor: float = 0.0  # an expert's capacity over its mean share (0: dropless)
    moe_pad_to_capacity: bool = False  # every expert computes its whole capacity, padded (drop-and-pad)
    #: how the local experts' GEMMs run: multi-stream (Transformer Engine's GroupedLinear, one cuBLAS GEMM
    #: per expert on 4 streams: Megatron-Core's TEGroupedMLP) | fused (one grouped kernel for all experts,
    #: DeepGEMM-grade) | cutlass-grouped | torch-grouped-mm (kernels.GROUPED_KERNELS)
    moe_grouped_gemm: str = "multi-stream"
    moe_host_sync: str = "none"      # none | per-layer: each MoE forward waits for its token counts (fusion.attach_sync)
    lora_rank: int = 0               # LoRA adapters of this rank beside the frozen linear layers (0: none)
    lora_modules: str = "all"        # all | attention
    lora_dropout: float = 0.0        # dropout on each adapter's input
    lora_exchange: str = "all-gather"  # a row-parallel adapter's output back to the SP layout: all-gather | all-to-all
    tp_qkv: bool = True              # the QKV all-gather may hide behind its GEMM (overlap.tp_qkv)
    cross_entropy: str = "fused"     # the loss over the vocabulary: fused | unfused | torch (CROSS_ENTROPY_BYTES)
    kernel_fusion: str = "fused"     # the non-GEMM kernels: fused | compiled | eager | eager-composite-norm (fusion.py)
    cuda_graphs: str = "none"        # none | layer | step: kernels replayed from CUDA graphs (fusion.attach_host)
    fp8_recipe: str = "delayed"      # fp8 runs: how operands are scaled (FP8_RECIPES; fp8_cast_bytes)
    hidden_dropout: float = 0.0      # on each block's output before its residual add (model.dropout)
    attention_dropout: float = 0.0   # dropout on the attention probabilities (attention_forward)

    @property
    def tokens(self) -> float:
        """Tokens this replica's CP shard processes per micro-batch (all TP ranks see them all)."""
        return self.micro_batch * self.seq_len / self.cp


@dataclass(frozen=True, slots=True)
class CommRequest:
    """A collective an operator needs: over which parallel axis, which op, nccl-tests size."""

    axis: str                        # tp | cp | ep | dp | pp
    op: str                          # all-gather | reduce-scatter | all-reduce | all-to-all | send-recv
    size_bytes: float
    overlappable_s: float = 0.0      # compute it may hide behind (ring attention, TP overlap)
    #: what the backward pass issues in its place, as (op, size multiple) pairs, or as
    #: (op, size multiple, behind, gemm seconds) where ``behind`` says which backward GEMM of a TP
    #: layer the collective runs beside -- "dgrad", "wgrad", or "regather" (the input gathered again
    #: beside the data gradient), see _tp_region_comms; empty: the conjugate collective of the same
    #: size (all-gather <-> reduce-scatter, others repeat)
    backward: tuple[tuple, ...] = ()
    #: moved by DeepEP's normal kernels at the NVLink and RDMA rates its README measures, rather than by
    #: NCCL's send/recv (fmsim.hardware.dispatch; all-to-all only)
    line_rate: bool = False
    #: with ``line_rate``, whose kernels move it: deepep (DeepEP's normal kernels) | hybridep (HybridEP)
    kernel: str = "deepep"
    #: issued asynchronously by the framework itself (the backward's TP collectives of a column-
    #: parallel layer): hidden behind ``overlappable_s`` without TP userbuffers, when the plan's
    #: ``overlap.tp_backward`` holds
    asynchronous: bool = False
    #: SMs the overlap takes under Transformer Engine's userbuffers (None: as any collective)
    ub_sms: int | None = None
    #: all-to-all: the busiest rank's traffic over the mean (uneven MoE routing)
    skew: float = 1.0


@dataclass(slots=True)
class PassCost:
    """Compute seconds by kind and the collectives of one forward or backward pass."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    #: the attention core's backward, priced beside its forward: flash kernels take ATTENTION_BWD_FACTOR
    #: times their forward, the unfused core its own batched GEMMs and score traffic (attention_forward)
    attention_bwd_s: float = 0.0
    memory_s: float = 0.0
    flops: float = 0.0
    comms: list[CommRequest] = field(default_factory=list)
    kernels: float = 0.0             # GPU kernels launched; each costs KERNEL_FIXED_S beyond its roofline
    adapter_s: float = 0.0           # LoRA adapter GEMMs and elementwise passes (trainable, the base frozen)
    adapter_bwd_s: float = 0.0       # their backward, priced beside the forward kernel by kernel (_adapter)
    #: low-precision casts of the GEMM operands (fp8_cast_bytes): this pass's, and its backward's priced beside it
    cast_s: float = 0.0
    cast_bwd_s: float = 0.0
    #: hidden dropout's own HBM seconds (hidden_dropout_bytes): this pass's, and its backward's priced beside it
    dropout_s: float = 0.0
    dropout_bwd_s: float = 0.0
    #: forward work of the modules selective recompute can run again (RECOMPUTE_MODULES), by name
    parts: dict[str, PassCost] = field(default_factory=dict)
    #: seconds the host takes to issue the pass's kernels, and (set beside a forward) its backward's (fusion.py)
    host_s: float = 0.0
    host_bwd_s: float = 0.0
    #: seconds a host synchronisation inside the pass adds (a dropless MoE block's token counts, fusion.attach_sync),
    #: and the (device seconds, kernels) of the pass that come before it, set where the pass has one
    sync_s: float = 0.0
    sync_pre: tuple[float, float] | None = None

    @property
    def device_s(self) -> float:
        """The device's seconds: the kernels' roofline time and each kernel's fixed cost."""
        return (self.gemm_s + self.attention_s + self.memory_s + self.adapter_s + self.cast_s
                + self.dropout_s + self.kernels * KERNEL_FIXED_S)

    @property
    def compute_s(self) -> float:
        """The device's seconds, or the host's where issuing the kernels takes longer (fusion.attach_host),
        and what a host synchronisation adds (fusion.attach_sync)."""
        device = self.device_s
        return (device if device >= self.host_s else self.host_s) + self.sync_s

    def add(self, other: PassCost, times: float = 1.0) -> None:
        self.gemm_s += other.gemm_s * times
        self.attention_s += other.attention_s * times
        self.attention_bwd_s += other.attention_bwd_s * times
        self.memory_s += other.memory_s * times
        self.flops += other.flops * times
        self.kernels += other.kernels * times
        self.adapter_s += other.adapter_s * times
        self.adapter_bwd_s += other.adapter_bwd_s * times
        self.host_s += other.host_s * times
        self.host_bwd_s += other.host_bwd_s * times
        self.sync_s += other.sync_s * times
        self.cast_s += other.cast_s * times
        self.cast_bwd_s += other.cast_bwd_s * times
        self.dropout_s += other.dropout_s * times
        self.dropout_bwd_s += other.dropout_bwd_s * times
        for _ in range(round(times)):
            self.comms.extend(other.comms)
        for name, part in other.parts.items():
            self.parts.setdefault(name, PassCost()).add(part, times)

    def snapshot(self) -> PassCost:
        """A copy of the compute so far (no collectives, no parts), to take differences from."""
        return PassCost(gemm_s=self.gemm_s, attention_s=self.attention_s, attention_bwd_s=self.attention_bwd_s,
                        memory_s=self.memory_s,
                        flops=self.flops, kernels=self.kernels, adapter_s=self.adapter_s,
                        adapter_bwd_s=self.adapter_bwd_s, cast_s=self.cast_s, cast_bwd_s=self.cast_bwd_s,
                        dropout_s=self.dropout_s, dropout_bwd_s=self.dropout_bwd_s)

    def record(self, name: str, since: PassCost) -> None:
        """File the compute added since ``since`` (a :meth:`snapshot`) under module ``name``."""
        part = self.parts.setdefault(name, PassCost())
        part.gemm_s += self.gemm_s - since.gemm_s
        part.attention_s += self.attention_s - since.attention_s
        part.attention_bwd_s += self.attention_bwd_s - since.attention_bwd_s
        part.memory_s += self.memory_s - since.memory_s
        part.flops += self.flops - since.flops
        part.kernels += self.kernels - since.kernels
        part.adapter_s += self.adapter_s - since.adapter_s
        part.adapter_bwd_s += self.adapter_bwd_s - since.adapter_bwd_s
        part.cast_s += self.cast_s - since.cast_s
        part.cast_bwd_s += self.cast_bwd_s - since.cast_bwd_s
        part.dropout_s += self.dropout_s - since.dropout_s
        part.dropout_bwd_s += self.dropout_bwd_s - since.dropout_bwd_s


@dataclass(frozen=True, slots=True)
class Roofline:
    """Achievable rates of one accelerator for one precision setting."""

    gemm_flop_per_s: float           # linear layers, in the run's precision
    gemm_flop_per_s_bf16: float      # 16-bit GEMMs (attention score products)
    attn_flop_per_s: float           # attention core (bf16/fp16 math in every public recipe)
    hbm_bytes_per_s: float
    act_bytes: float                 # bytes per activation element (bf16)
    gemm_in_bytes: float             # bytes per GEMM input element
    compute_units: int = 0           # SMs the output tiles are spread over (0: no wave model)
    gemm_k0: float = 0.0             # reduction depth at which a GEMM reaches half its large-GEMM rate
    gemm_k0_bf16: float = 0.0        # the same at the 16-bit math rate
    fp8_recipe: str = "delayed"      # how low-precision operands are scaled and cast (fp8_cast_bytes)
    wgrad: bool = True               # the GEMMs' weights train (their operands are transposed for it)

    @classmethod
    def of(cls, acc: Accelerator, precision: str, attention_kernel: str = "flash",
           fp8_attention: bool = False, fp8_recipe: str = "delayed", wgrad: bool = True) -> Roofline:
        act_precision = "bf16" if precision in ("fp8", "fp4", "bf16") else precision
        if act_precision not in acc.peak_flop_per_s and "bf16" in acc.peak_flop_per_s:
            act_precision = "bf16"
        attn_eff = acc.attention_efficiency or acc.gemm_efficiency.get(act_precision, 0.7)
        if attention_kernel == "flash2":
            # a FlashAttention-2-class kernel (FA2, its Triton ports): the chip's best fused attention
            # where that is what FA2 is (Ampere), a separate figure where newer kernels pulled ahead
            attn_eff = acc.attention_flash2_efficiency or attn_eff
        elif attention_kernel == "flash1":
            # a FlashAttention-1-class kernel (FA1, the 2022 Triton FlashAttention): its own figure,
            # which the scenario checked the chip has
            attn_eff = acc.attention_flash1_efficiency
        attn_rate = acc.peak(act_precision) * attn_eff
        if fp8_attention:
            # the fused kernel in fp8, forward and backward (the caller checked the chip has the figure)
            attn_rate = acc.peak("fp8") * acc.attention_fp8_efficiency
        return cls(
            gemm_flop_per_s=acc.gemm_flop_per_s(precision),
            gemm_flop_per_s_bf16=acc.gemm_flop_per_s(act_precision),
            attn_flop_per_s=attn_rate,
            hbm_bytes_per_s=acc.hbm_bytes_per_s * acc.hbm_efficiency,
            act_bytes=BYTES_PER_ELEMENT[act_precision],
            gemm_in_bytes=BYTES_PER_ELEMENT[precision],
            compute_units=acc.compute_units,
            # k/(k+K0): each output tile pays a fixed prologue/epilogue besides its k-loop (a
            # systolic array's fill and drain is the same kind of cost); K0 from DeepGEMM's FP8
            # table, scaled by the math rate, or the chip's own (kernels.chip_gemm_k0)
            gemm_k0=chip_gemm_k0(acc, precision),
            gemm_k0_bf16=chip_gemm_k0(acc, act_precision),
            # fp4 runs take NVFP4's quantizers whatever fp8 recipe is named (fp8_cast_bytes)
            fp8_recipe="nvfp4" if precision == "fp4" else fp8_recipe,
            wgrad=wgrad,
        )

    def at_16bit(self) -> Roofline:
        """The same chip with its GEMMs in 16-bit (what an fp8/fp4 run keeps outside the low-precision
        recipe, e.g. the output layer)."""
        if self.gemm_in_bytes >= self.act_bytes:
            return self
        return dataclasses.replace(self, gemm_flop_per_s=self.gemm_flop_per_s_bf16, gemm_in_bytes=self.act_bytes,
                                   gemm_k0=self.gemm_k0_bf16)

    def gemm(self, m: float, n: float, k: float) -> tuple[float, float]:
        """(seconds, FLOPs) of an (m×k)·(k×n) GEMM: roofline of compute and operand traffic."""
        flops = 2.0 * m * n * k
        traffic = (m * k + k * n) * self.gemm_in_bytes + m * n * self.act_bytes
        compute = flops / (self.gemm_flop_per_s * gemm_efficiency(m, n, k, self.compute_units, self.gemm_k0))
        return max(compute, traffic / self.hbm_bytes_per_s), flops

    def grouped_gemm(self, groups: int, m: float, n: float, k: float,
                     kernel: str = "fused", draw: dict | None = None) -> tuple[float, float]:
        """(seconds, FLOPs) of ``groups`` (m×k)·(k×n) expert GEMMs run by the grouped-GEMM ``kernel`` class:
        their FLOPs at its efficiency (:func:`kernels.grouped_kernel_efficiency`) against every expert's
        weights and rows through HBM. ``draw``: how routing spreads the rows over the experts (the keywords of
        :func:`kernels.routed_grouped_gemm_efficiency`, ``tokens``, ``top_k`` and ``experts`` among them): each
        expert's rows as routing draws them, the function serving prices its experts with; ``None``: every
        expert the mean ``m`` rows."""
        if groups <= 1 and draw is None:
            return self.gemm(m, n, k)
        flops = 2.0 * groups * m * n * k
        traffic = groups * ((m * k + k * n) * self.gemm_in_bytes + m * n * self.act_bytes)
        eff = grouped_kernel_efficiency(kernel, groups, m, n, k, self.compute_units, self.gemm_k0, draw)
        return max(flops / (self.gemm_flop_per_s * eff), traffic / self.hbm_bytes_per_s), flops

    def memory(self, elements: float) -> float:
        """Seconds to stream ``elements`` activation elements through HBM (read + write counted)."""
        return elements * self.act_bytes / self.hbm_bytes_per_s


#: fp8 scaling recipes (``workload.fp8_recipe``), as Transformer Engine names them: ``DelayedScaling`` (one scale
#: per tensor from the amax history of earlier steps), ``Float8CurrentScaling`` (per tensor, from the tensor's own
#: amax), ``Float8BlockScaling`` (DeepSeek-V3's 1x128 / 128x128 blocks, a scale each), ``MXFP8BlockScaling`` (a
#: power-of-two scale per 32 elements, Blackwell's tensor cores).
FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8")
#: scale bytes per element, both copies (rowwise and columnwise) together: blockwise an fp32 scale per 128
#: elements each way (Float8BlockQuantizer), MXFP8 an E8M0 byte per 32 each way (MXFP8Quantizer); NVFP4's are in
#: its 0.5625 B per element (kernels.BYTES_PER_ELEMENT)
FP8_SCALE_BYTES = {"delayed": 0.0, "current": 0.0, "blockwise": 2 * 4 / 128, "mxfp8": 2 * 1 / 32, "nvfp4": 0.0}


def fp8_cast_bytes(recipe: str, operand: str, fused: bool | str, *, wgrad: bool = True, act_bytes: float = 2.0,
                   low: float = 1.0) -> tuple[float, float, int]:
    """(forward, backward) HBM bytes per element, and forward kernels, of quantizing one fp8 GEMM operand, beyond
    what fmsim prices for the 16-bit tensor it is made from (the norm's or activation's own 16-bit output is
    priced with that kernel), as Transformer Engine's code runs each recipe.

    ``operand`` "input": a GEMM's activation input X (the cost is per element of X, forward); "grad": its output
    gradient dY (per element of dY, backward). ``fused``: X is written by a LayerNorm/RMSNorm or activation kernel
    (LayerNormLinear, LayerNormMLP), dY by the activation's backward (gelu only in TE 1.x). ``wgrad`` False
    (frozen weights): no transposed copy is needed for a weight gradient.

    - delayed (TE v1.8 @3ec998e9, NeMo 24.07's Transformer Engine 1.8): the norm and the activation write fp8
      themselves (``layernorm_fwd_fp8``, ``fp8_gelu``/``fp8_swiglu``: 1 B in place of 2), and the backward
      transposes that fp8 copy for the weight gradient (``tex.fp8_transpose``: read 1, write 1;
      layernorm_linear.py, layernorm_mlp.py); any other input goes through ``fp8_cast_transpose_fused`` (read 2,
      write 1 + 1; linear.py). dY through ``fp8_cast_transpose(_bgrad)_fused`` (read 2, write 1 + 1; module/base.py
      grad_output_preprocess), fused into the gelu backward (``fp8_cast_transpose_bgrad_dgelu_fused``); other
      activations run their backward in 16 bits and cast after (layernorm_mlp.py).
    - current (TE v2.8 @40c69e75, ``Float8CurrentScalingQuantizer::quantize_impl`` in csrc/quantizer.cpp): a
      separate tensor is read once more for its amax (``nvte_compute_amax``), then a scale kernel, then the
      quantize (read 2, write 1 + 1); a norm, activation or activation backward writes its 16-bit output with the
      amax beside it (normalization.cpp ``FUSED_NORM_AMAX_FP8``, activation.cpp ``FUSED_ACTIVATION_AMAX_FP8``) and
      ``quantize_with_amax`` reads it back.
    - blockwise (``Float8BlockQuantizer``): one pass computes each block's amax and quantizes, writing both
      copies and their scales; norms and activations are not fused with it (normalization.cpp, activation.cpp
      ``UNFUSED``): read 2, write 1 + 1 + scales, wherever the tensor comes from.
    - mxfp8 (``MXFP8Quantizer``): as blockwise, except that the activation and its backward write the MXFP8
      copies themselves (activation.cpp ``FULLY_FUSED``); TE's own norm kernel does not (cuDNN's only with
      ``NVTE_NORM_FWD_USE_CUDNN``).
    - nvfp4 (fp4 runs, ``NVFP4Quantizer``; ``low`` = 0.5625 B, its 1x16 block scales included): a per-tensor
      amax as current scaling takes it -- from the norm or activation that wrote the 16-bit tensor
      (``FUSED_NORM_AMAX_NVFP4``, ``FUSED_ACTIVATION_AMAX_NVFP4``), else an amax pass -- then the quantize.
    """
    both = low * (2.0 if wgrad else 1.0)             # the rowwise copy, and the columnwise one for wgrad
    scales = FP8_SCALE_BYTES[recipe] * (1.0 if wgrad else 0.5)
    quantize = act_bytes + both + scales             # read the 16-bit tensor, write the fp8 copies
    if recipe == "delayed":
        if fused:
            if operand == "input":
                return low - act_bytes, (2.0 * low if wgrad else 0.0), 0
            return 0.0, both - act_bytes, 0
        return (quantize, 0.0, 1) if operand == "input" else (0.0, quantize, 1)
    if recipe in ("current", "nvfp4"):
        b = quantize if fused else quantize + act_bytes
        return (b, 0.0, 2 if fused else 3) if operand == "input" else (0.0, b, 2 if fused else 3)
    if recipe == "mxfp8" and (fused == "act" if operand == "input" else fused):
        b = both + scales - act_bytes                # the activation writes the MXFP8 copies in place of 16 bits
        return (b, 0.0, 0) if operand == "input" else (0.0, b, 0)
    return (quantize, 0.0, 1) if operand == "input" else (0.0, quantize, 1)


def _gemm(cost: PassCost, rf: Roofline, m: float, n: float, k: float, *, fed_by: str = "",
          cast_rows: float | None = None, grad_fused: bool = False, grad_rows: float | None = None) -> None:
    """An (m×k)·(k×n) GEMM and, in low precision, the casts of its operands (:func:`fp8_cast_bytes`).

    ``fed_by``: "norm" or "act" when the input comes straight from a norm or activation kernel (TE's
    LayerNormLinear / LayerNormMLP), "" when it is cast on its own. ``cast_rows``: the rows the forward cast
    runs on (the local sequence shard of an input gathered after it under SP; default ``m``). ``grad_fused``:
    the output gradient comes from the activation's backward, which may write it in fp8 (LayerNormMLP's fc1).
    ``grad_rows``: a row-parallel layer's output gradient under SP, gathered from shards of this many rows; TE 1.x
    (delayed) casts the shard before the gather and transposes the gathered copy (module/base.py
    grad_output_preprocess: "cast, transpose for efficient gather"; fp8_transpose with userbuffers)."""
    t, f = rf.gemm(m, n, k)
    cost.gemm_s += t
    cost.flops += f
    cost.kernels += 1
    if rf.gemm_in_bytes < rf.act_bytes:
        # low-precision GEMMs take their operands through cast(+transpose) kernels: X in the forward, dY in the
        # backward; weights are cast once per step and cached across micro-batches (is_first_microbatch)
        rows = m if cast_rows is None else cast_rows
        fused = "act" if fed_by == "act" else bool(fed_by)
        kw = {"wgrad": rf.wgrad, "act_bytes": rf.act_bytes, "low": rf.gemm_in_bytes}
        fwd, bwd_in, kern = fp8_cast_bytes(rf.fp8_recipe, "input", fused, **kw)
        _, bwd_out, _ = fp8_cast_bytes(rf.fp8_recipe, "grad", grad_fused, **kw)
        cost.cast_s += rows * k * fwd / rf.hbm_bytes_per_s
        if grad_rows is not None and rf.fp8_recipe == "delayed":
            low = rf.gemm_in_bytes
            bwd_grad = n * (grad_rows * (rf.act_bytes + low) + (m * 2.0 * low if rf.wgrad else 0.0))
        else:
            bwd_grad = m * n * bwd_out
        cost.cast_bwd_s += (m * k * bwd_in + bwd_grad) / rf.hbm_bytes_per_s
        cost.kernels += kern


def _grouped_gemm(cost: PassCost, rf: Roofline, groups: int, m: float, n: float, k: float,
                  kernel: str, draw: dict | None = None) -> None:
    """The local experts' GEMM of an MoE layer (``groups`` experts, ``m`` rows each) and, in low
    precision, the cast of their input: Transformer Engine quantizes each expert's split separately
    (``tex.split_quantize`` in GroupedLinear), one kernel per expert like the GEMMs."""
    t, f = rf.grouped_gemm(groups, m, n, k, kernel, draw)
    launches = grouped_gemm_launches(groups, grouped_kernel(kernel).concurrent)
    cost.gemm_s += t
    cost.flops += f
    cost.kernels += launches
    if rf.gemm_in_bytes < rf.act_bytes:
        kw = {"wgrad": rf.wgrad, "act_bytes": rf.act_bytes, "low": rf.gemm_in_bytes}
        fwd, bwd_in, _ = fp8_cast_bytes(rf.fp8_recipe, "input", False, **kw)
        _, bwd_out, _ = fp8_cast_bytes(rf.fp8_recipe, "grad", False, **kw)
        cost.cast_s += groups * m * k * fwd / rf.hbm_bytes_per_s
        cost.cast_bwd_s += groups * m * (k * bwd_in + n * bwd_out) / rf.hbm_bytes_per_s
        cost.kernels += launches


def _adapter(cost: PassCost, rf: Roofline, sh: Shard, m: float, n: float, k: float, *, row: bool = False) -> None:
    """LoRA adapter beside a frozen (m×k)·(k×n) GEMM: h = x·A·B added to the base output (Hu et al.
    2021, eq. 3), A k×r and B r×n, in 16-bit (the low-precision recipes leave adapters out), as
    Megatron-Bridge's ``ParallelLinearAdapter`` runs it (src/megatron/bridge/peft/utils.py @03619215, and
    NeMo's before it): two thin GEMMs, each bound by its HBM traffic -- reading x, writing the update --
    the update scaled by alpha/r (``x * (alpha / dim)``: read and write it) and added to the base output
    (read both, write the sum). The adapters train, so their backward computes data and weight gradients
    even when the base GEMM's is only its data gradient, priced kernel by kernel (``adapter_bwd_s``): the
    add hands its gradient to both branches as it is; the scale runs again; B's data and weight gradients
    each read the m×n gradient; A's weight gradient reads x and its data gradient writes the m×k input
    gradient, which is summed into the base layer's (read both, write one: Transformer Engine adds the
    gathered norm output's gradient before its reduce-scatter, autograd sums the others).
    ``sh.lora_dropout`` > 0 drops out the adapter's input first (PEFT's ``lora_dropout``, NeMo's
    ``adapter_dropout`` at position "pre"): one more elementwise kernel reading x and writing it and its
    1-byte mask.

    Under tensor parallelism the adapter is split like its base layer (NVIDIA NeMo's and Megatron-Bridge's
    ``ParallelLinearAdapter``), and its rank-r activations cross the TP group on the critical path:

    - beside a column-parallel layer (``row`` False: QKV, MLP up) A is column-parallel with its output
      gathered (all-gather of the m×r activations) and B column-parallel, whose input gradient is
      all-reduced in the backward (m×r); the adapter reads the layer's own gathered input (Transformer
      Engine's ``return_layernorm_output_gathered``: Megatron-Bridge's adapters, and NeMo's when the QKV
      all-gather leaves the userbuffers overlap, ``overlap.tp_qkv: false``), no gather of its own -- NeMo's
      with the QKV overlap on gather the input once more, which is not costed;
    - beside a row-parallel layer (``row`` True: attention output, MLP down) A is row-parallel (all-reduce
      of the m×r activations) and B column-parallel (all-reduce of its input gradient in the backward);
      B's output, split over the hidden dimension, returns to the sequence-parallel layout by
      ``sh.lora_exchange``: gathered whole and split (all-gather of m×n forward; the split's backward
      gathers the gradient), or one all-to-all of m×n/tp each way (``a2a_experimental``). Without
      sequence parallelism it is gathered whole, and the backward only splits. Each exchange rearranges
      what it moves in copies: the gather concatenates the m×n result along the hidden dimension, the split
      and the all-to-all's chunks are made contiguous, and the backward does the same in reverse (Megatron
      ``_gather_along_last_dim`` / ``_split_along_first_dim``, Megatron-Bridge ``_All2AllHp2Sp``).
    """
    if not sh.lora_rank:
        return
    r16 = rf.at_16bit()
    r, t = sh.lora_rank, sh.tp
    # each rank's share (Megatron-Bridge peft/utils.py ParallelLinearAdapter): beside a column-parallel
    # layer A is column-parallel (m×r/tp, then gathered) and B's n columns are the layer's own split;
    # beside a row-parallel layer A reduces the layer's split input and B, column-parallel, writes the
    # rank's n/tp columns, which the exchange turns into the layer's output layout -- the sequence
    # shard (m/tp rows) under SP, the whole m×n without -- where the update is added
    a_cols, b_cols = (r, n / t) if row else (r / t, n)
    out = m * n / t if row and sh.sequence_parallel else m * n
    # the exchange's layout copies, (forward, backward) elements read and written: each copy reads and
    # writes what it holds -- the rank's m×n/tp columns, the gathered m×n, the m/tp-row shard
    copies = (0.0, 0.0)
    if row and t > 1:
        local, whole = m * b_cols, m * n
        if not sh.sequence_parallel:
            copies = (2 * whole, 2 * local)                    # gathered whole; the backward splits
        elif sh.lora_exchange == "all-to-all":
            copies = (2 * (local + out), 2 * (out + local))    # chunks made contiguous, then concatenated
        else:
            copies = (2 * (whole + out), 2 * (whole + local))  # gathered whole, the shard cut out; reversed
    cost.adapter_s += r16.gemm(m, a_cols, k)[0] + r16.gemm(m, b_cols, r)[0] + rf.memory(5 * out + copies[0])
    # backward: B's data and weight gradients, A's weight and data gradients, then the scale again, A's
    # input gradient summed into the base layer's, and the copies in reverse
    cost.adapter_bwd_s += (r16.gemm(m, r, b_cols)[0] + r16.gemm(r, b_cols, m)[0]
                           + r16.gemm(k, a_cols, m)[0] + r16.gemm(m, k, a_cols)[0]
                           + rf.memory(2 * out + 3 * m * k + copies[1]))
    cost.kernels += 4 + (2 if copies[0] else 0)
    if sh.lora_dropout:
        cost.memory_s += m * k * (2 * rf.act_bytes + 1) / rf.hbm_bytes_per_s
        cost.kernels += 1
    if sh.tp <= 1:
        return
    low = m * r * rf.act_bytes
    cost.comms.append(CommRequest("tp", "all-reduce" if row else "all-gather", low,
                                  backward=(("all-reduce", 1.0),)))
    if row:
        out = m * n * rf.act_bytes
        if not sh.sequence_parallel:
            cost.comms.append(CommRequest("tp", "all-gather", out, backward=(("all-gather", 0.0),)))
        elif sh.lora_exchange == "all-to-all":
            cost.comms.append(CommRequest("tp", "all-to-all", out / sh.tp))
        else:
            cost.comms.append(CommRequest("tp", "all-gather", out, backward=(("all-gather", 1.0),)))


def _column_parallel_sp_backward(gemm_s: float) -> tuple[tuple, ...]:
    """The backward of a sequence-parallel column-parallel layer's input all-gather: the input gathered
    again beside the data-gradient GEMM, the input gradient reduce-scattered beside the weight-gradient
    GEMM (_tp_region_comms)."""
    return (("all-gather", 1.0, "regather", gemm_s), ("reduce-scatter", 1.0, "wgrad", gemm_s))


def _tp_region_comms(c: PassCost, sh: Shard, size_bytes: float, gemm_in_s: float = 0.0,
                     gemm_out_s: float = 0.0, *, gather_hidden: bool = True) -> None:
    """Collectives around a tensor-parallel region: all-gather in and reduce-scatter out with
    sequence parallelism, one all-reduce without (Korthikanti et al. 2022 §4.2.2, Fig. 5).

    Forward, each may hide behind the one GEMM it feeds or follows (``gemm_in_s``: the column-parallel
    GEMM after the all-gather, ``gemm_out_s``: the row-parallel GEMM before the reduce-scatter) and no
    other: Transformer Engine's userbuffers overlap wraps one GEMM per collective (qkv_fprop and
    fc1_fprop ring-exchange all-gathers, proj_fprop and fc2_fprop pipelined reduce-scatters).
    ``gather_hidden`` False: the all-gather runs in the open (Megatron-Core's
    ``tp_comm_overlap_disable_qkv`` for the QKV projection).

    Backward, as Megatron-LM (``LinearWithGradAccumulationAndAsyncCommunication``) and Transformer
    Engine run it:

    - the row-parallel layer all-gathers its output gradient before its data-gradient GEMM (with SP):
      hidden behind that GEMM only with userbuffers (TE ``proj_dgrad``/``fc2_dgrad``);
    - the column-parallel layer, which saved only its sequence shard of the input, all-gathers the
      input again for its weight gradient, asynchronously behind its data-gradient GEMM, then
      reduce-scatters the input gradient behind its weight-gradient GEMM (TE ``ub_bulk_dgrad`` /
      ``ub_bulk_wgrad``); without SP it all-reduces the input gradient behind the weight-gradient GEMM
      (Megatron's async all-reduce, Korthikanti et al. 2022 §6.2: "we overlap all-reduce communication
      with the linear weight's gradient computation"). Frozen weights (LoRA) have no weight gradient:
      nothing to hide behind and no input to gather again.
    """
    if sh.sequence_parallel and sh.precision == "fp8" and sh.fp8_recipe == "current":
        # Float8CurrentScaling: the gathered tensor takes one scale over the TP group -- the column-parallel
        # input's amax all-reduced before its quantize (forward), the row-parallel output gradient's (backward),
        # 4 bytes each, waited on (TE v2.8 @40c69e75 layernorm_linear.py / layernorm_mlp.py / linear.py
        # with_amax_reduction = True for sequence_parallel; quantizer.cpp allreduce(...)->wait())
        c.comms.append(CommRequest("tp", "all-reduce", 4.0))
    if sh.sequence_parallel:
        c.comms.append(CommRequest("tp", "all-gather", size_bytes, overlappable_s=gemm_in_s if gather_hidden else 0.0,
                                   backward=_column_parallel_sp_backward(gemm_in_s), ub_sms=UB_RING_EXCHANGE_SMS))
        c.comms.append(CommRequest("tp", "reduce-scatter", size_bytes, overlappable_s=gemm_out_s,
                                   backward=(("all-gather", 1.0, "dgrad", gemm_out_s),),
                                   ub_sms=UB_SPLIT_SMS))
    else:
        c.comms.append(CommRequest("tp", "all-reduce", size_bytes, overlappable_s=gemm_out_s,
                                   backward=(("all-reduce", 1.0, "wgrad", gemm_in_s),)))


def attention_forward(model: ModelSpec, sh: Shard, rf: Roofline, *, windowed: bool = False) -> PassCost:
    """Norm, QKV projection, attention core (causal flash), output projection, residual.

    ``windowed``: the layer attends locally (``model.window``): a fused kernel skips the key blocks
    outside the window, so its work is the window's (query, key) pairs, at the rate of a kernel whose
    queries each see at most ``window.size`` keys; the unfused core computes the whole square anyway."""
    c = PassCost()
    h, t, T = model.hidden, sh.tp, sh.tokens
    dqk, dv = attention_dims(model)
    local = T / (t if sh.sequence_parallel else 1)               # the rows the norm (and its fp8 cast) runs on
    # an adapter beside the projection takes the norm's 16-bit output (return_layernorm_output), which TE then casts
    # on its own, after the sequence-parallel gather outside userbuffers (TE v1.8 layernorm_linear.py: cast_to_fp8
    # of ln_out_total when return_layernorm_output)
    norm = "" if sh.lora_rank else "norm"
    if sh.lora_rank:
        local = T
    if model.attention == "mla" and model.mla is not None:
        m = model.mla
        # q: down (replicated over TP in Megatron MLA) then up; kv: joint down-projection, then up
        if m.q_lora_rank:
            _gemm(c, rf, T, m.q_lora_rank, h, fed_by=norm, cast_rows=local)
            up = c.snapshot()
            _gemm(c, rf, T, dqk / t, m.q_lora_rank, fed_by="norm")
            c.record("mla_up_proj", up)
        else:
            _gemm(c, rf, T, dqk / t, h, fed_by=norm, cast_rows=local)
        _gemm(c, rf, T, m.kv_lora_rank + m.qk_rope_dim, h, fed_by=norm, cast_rows=local)
        up = c.snapshot()
        _gemm(c, rf, T, model.heads * (m.qk_nope_dim + m.v_head_dim) / t, m.kv_lora_rank, fed_by="norm")
        c.record("mla_up_proj", up)
        # adapters as ModelSpec.lora_params counts them: query and compressed key/value projections
        _adapter(c, rf, sh, T, dqk / t, h)
        _adapter(c, rf, sh, T, m.kv_lora_rank + m.qk_rope_dim, h)
    else:
        # a rank projects whole K/V heads: replicated when tp > kv_heads (ModelSpec.kv_heads_per_rank)
        kv_local = 2 * model.kv_heads_per_rank(t) * model.head_dim
        _gemm(c, rf, T, dqk / t + kv_local, h, fed_by=norm, cast_rows=local)
        _adapter(c, rf, sh, T, dqk / t + kv_local, h)
    qkv_s = c.gemm_s
    # attention core: QK^T and AV over the causal half of the (local query × all key) square;
    # with CP each rank holds s/cp queries against the full s keys (load-balanced ring, Liu 2023)
    s_keys = sh.seq_len
    core = c.snapshot()
    if sh.attention_kernel == "unfused":
        # Megatron before flash attention: QK^T and AV as batched GEMMs over the full square (the
        # causal mask is applied, not skipped) and the a·s² scores stored in HBM between them:
        # written by QK^T (2 B), read and written by the fused scale-mask-softmax (4 B), dropout
        # reads them and writes output and mask (5 B; its own kernel, run only when
        # sh.attention_dropout > 0: ATen's dropout returns its input at p 0), AV reads them (2 B) -- 13 B per score
        # (Korthikanti et al. 2022 §4.1 counts the same tensors: 5·a·s·b stored bytes per token).
        # The two products reduce over different depths -- QK^T over the head dimension, AV over the
        # keys -- and each pays the GEMM k/(k+K0) fixed cost per output tile like every other GEMM.
        # The backward runs four products of one forward product's FLOPs each -- dV = P^T·dO and
        # dK = dS^T·Q reduce over the queries, dQ = dS·K over the keys, dP = dO·V^T over the head
        # dimension -- and moves 19 B per score: dV reads P (2 B), dP is written (2 B), the dropout
        # backward reads it and the mask and writes (5 B, with dropout), the fused softmax backward reads its output
        # and the gradient and writes dS (6 B), dQ and dK read dS (4 B). With the A100 GEMM figure this
        # prices one layer of Korthikanti et al.'s 22B model within 1.5 % of their Table 4 (all five
        # configurations); flash's 2.5x rule put its backward 8-18 % over.
        attn_flops = 2.0 * T * s_keys * (dqk + dv) / t
        scores = T * s_keys * model.heads / t
        qk, av = attn_flops * dqk / (dqk + dv), attn_flops * dv / (dqk + dv)
        k0 = rf.gemm_k0_bf16
        e_head, e_v = gemm_k_efficiency(dqk / model.heads, k0), gemm_k_efficiency(dv / model.heads, k0)
        e_seq = gemm_k_efficiency(s_keys, k0)
        drop = 5.0 if sh.attention_dropout else 0.0
        c.attention_s += (qk / e_head + av / e_seq) / rf.gemm_flop_per_s_bf16 \
            + scores * (8.0 + drop) / rf.hbm_bytes_per_s
        c.attention_bwd_s += (av / e_seq + av / e_v + 2 * qk / e_seq) / rf.gemm_flop_per_s_bf16 \
            + scores * (14.0 + drop) / rf.hbm_bytes_per_s
        c.kernels += 1 if drop else 0                            # the dropout kernel
    else:
        # A fused kernel with attention dropout (FlashAttention, cuDNN's fused attention under Transformer
        # Engine) draws the mask from Philox inside the kernel and draws it again in the backward: no HBM
        # traffic, and its compute is not priced (no published benchmark sizes it for the kernels fmsim's
        # figures describe: docs/stacks.md, "Dropout").
        # Each kernel call (one ring step with CP) sees s/cp queries against s/cp keys; the head-split
        # all-to-all (a2a) runs one call over the whole sequence with 1/cp of the heads
        keys, kernel_len = s_keys * 0.5, (s_keys if sh.cp_comm == "a2a" else s_keys / sh.cp)
        if windowed and model.window is not None:
            keys = model.window.keys_per_query(s_keys)
            kernel_len = min(kernel_len, model.window.size)
        attn_flops = 2.0 * T * keys * (dqk + dv) / t
        fwd_s = attn_flops / (rf.attn_flop_per_s * attention_length_efficiency(kernel_len))
        c.attention_s += fwd_s
        c.attention_bwd_s += fwd_s * ATTENTION_BWD_FACTOR
    c.flops += attn_flops
    c.record("core_attn", core)
    before = c.gemm_s
    _gemm(c, rf, T, h, dv / t, grad_rows=local if sh.sequence_parallel and t > 1 else None)
    proj_s = c.gemm_s - before
    _adapter(c, rf, sh, T, h, dv / t, row=True)
    # elementwise: norm (r+w), rope on q,k (r+w), residual add (2r+w); sharded by SP over TP
    seq_shard = t if sh.sequence_parallel else 1
    c.memory_s += rf.memory(T * (2 * h + 3 * h) / seq_shard + T * 2 * dqk / t)
    c.kernels += 6 if sh.attention_kernel == "unfused" else 4    # norm, rope, attention (or QK, softmax, AV), residual
    c.parts["layernorm"] = PassCost(memory_s=rf.memory(T * 2 * h / seq_shard), kernels=1)
    add_extra(c, "attention", model, sh, rf)
    add_norm_part(c.parts["layernorm"], model, sh, rf)
    if t > 1:
        _tp_region_comms(c, sh, T * h * rf.act_bytes, qkv_s, proj_s, gather_hidden=sh.tp_qkv)
    if sh.cp > 1 and sh.cp_comm == "a2a":
        # DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509 §3): an all-to-all turns the local
        # tokens' Q, K, V (all heads of the TP rank) into all tokens' Q, K, V for 1/cp of the heads, and
        # one more turns the attention output back; on the critical path. The backward moves dO and then
        # dQ, dK, dV the same ways (Megatron-Core/TE cp_comm_type a2a). nccl-tests size: what a rank
        # sends, its own share included.
        kv_local = 2 * model.kv_heads_per_rank(t) * model.head_dim
        c.comms.append(CommRequest("cp", "all-to-all", T * (dqk / t + kv_local) * rf.act_bytes))
        c.comms.append(CommRequest("cp", "all-to-all", T * dv / t * rf.act_bytes))
    elif sh.cp > 1:
        kv_bytes = T * 2 * (model.kv_heads_per_rank(t) * model.head_dim if model.attention != "mla"
                            else (model.mla.kv_lora_rank + model.mla.qk_rope_dim) / t) * rf.act_bytes
        if sh.cp_comm == "all-gather":
            # all-gather K and V before attention (Llama 3, Dubey et al. 2024 §3.3.2; TE cp_comm_type
            # all_gather): on the critical path. The backward gathers K and V again (they are not
            # kept) and reduce-scatters dK, dV (Transformer Engine context_parallel.py,
            # AttnFuncWithCPAndKVAllGather.backward: gather_along_first_dim(k/v), then the reduce)
            c.comms.append(CommRequest("cp", "all-gather", kv_bytes * sh.cp,
                                       backward=(("all-gather", 1.0), ("reduce-scatter", 1.0))))
        else:
            # ring attention: cp-1 exchanges of this rank's K and V shard, hidden behind the blocks.
            # Backward passes K/V around the ring again and, beside it, the dK/dV accumulated so
            # far (TE AttnFuncWithCPAndKVP2P.backward: each p2p buffer holds kv and dkv), 2x bytes
            c.comms.append(CommRequest("cp", "send-recv", kv_bytes * (sh.cp - 1),
                                       overlappable_s=c.attention_s, backward=(("send-recv", 2.0),)))
        # the attention runs as cp partial calls whose outputs are merged by their softmax
        # statistics: per step, out (fp32) += out_step (16-bit) * exp(lse_step - lse) -- read the
        # step's output, read and write the fp32 accumulator (TE flash_attn_fwd_out_correction);
        # the backward accumulates dQ and dK/dV over the steps in fp32 the same way
        out_elements = T * dv / t
        c.memory_s += sh.cp * out_elements * (rf.act_bytes + 2 * BYTES_PER_ELEMENT["fp32"]) / rf.hbm_bytes_per_s
        c.kernels += 2 * (sh.cp - 1)                            # the extra attention calls and merges
    return c


def dense_mlp_forward(model: ModelSpec, ffn: int, sh: Shard, rf: Roofline) -> PassCost:
    """Norm, up (and gate) projection, activation, down projection, residual."""
    c = PassCost()
    h, t, T = model.hidden, sh.tp, sh.tokens
    up = ffn * (2 if model.gated else 1)
    # the activation's backward writes fc1's output gradient in fp8 itself: TE 1.x only for gelu
    # (fp8_cast_transpose_bgrad_dgelu_fused), the 2.x quantizers for every activation (activation.cpp)
    dact_fused = rf.fp8_recipe != "delayed" or model.activation == "gelu"
    adapted = bool(sh.lora_rank) and sh.lora_modules == "all"    # an adapter takes the norm's 16-bit output
    _gemm(c, rf, T, up / t, h, fed_by="" if adapted else "norm", cast_rows=T / (t if sh.sequence_parallel else 1),
          grad_fused=dact_fused)
    fc1_s = c.gemm_s
    _gemm(c, rf, T, h, ffn / t, fed_by="act", grad_rows=T / t if sh.sequence_parallel and t > 1 else None)
    fc2_s = c.gemm_s - fc1_s
    if sh.lora_modules == "all":
        _adapter(c, rf, sh, T, up / t, h)
        _adapter(c, rf, sh, T, h, ffn / t, row=True)
    seq_shard = t if sh.sequence_parallel else 1
    c.memory_s += rf.memory(T * 5 * h / seq_shard + T * (up + ffn) / t)
    c.kernels += 3                                              # norm, activation, residual
    add_extra(c, "mlp", model, sh, rf, ffn=ffn)
    if t > 1:
        _tp_region_comms(c, sh, T * h * rf.act_bytes, fc1_s, fc2_s)
    _whole_block_part(c, "mlp")
    c.parts["layernorm"] = PassCost(memory_s=rf.memory(T * 2 * h / seq_shard), kernels=1)
    add_norm_part(c.parts["layernorm"], model, sh, rf)
    return c


def _whole_block_part(c: PassCost, name: str) -> None:
    """File the whole block -- its compute and its collectives -- as recompute module ``name``: a
    checkpointed block runs its forward again, TP/EP collectives included."""
    part = c.snapshot()
    part.comms = list(c.comms)
    c.parts[name] = part


def _distinct(bins: float, draws: float) -> float:
    """Expected distinct bins ``draws`` uniform draws land in: n(1-(1-1/n)^k)."""
    return bins * (1.0 - (1.0 - 1.0 / bins) ** draws)


@functools.lru_cache(maxsize=256)
def distinct_nodes(nodes: int, top_k: int, groups: int = 1, group_topk: int = 0) -> float:
    """Expected distinct nodes one token's top-k experts sit on, routing balanced, experts laid out
    in order over the nodes of the EP group.

    Without groups the k experts fall anywhere: N(1-(1-1/N)^k). With group-limited routing (DeepSeek-V3
    §2.1.2: each token goes to at most M = 4 nodes; its config's n_group 8 / topk_group 4) they fall in
    the g chosen groups: when a group spans N/G nodes, among the g·N/G nodes those groups cover; when a
    node holds G/N groups, the k experts meet h = g(1-(1-1/g)^k) distinct groups, and a node is missed
    when all h avoid its groups: C(G - G/N, h) / C(G, h)."""
    g = group_topk or groups
    free = _distinct(nodes, top_k)
    if groups <= 1 or g >= groups:
        return free
    if nodes >= groups:
        return _distinct(g * nodes / groups, top_k)  # among the nodes the chosen groups cover
    h = _distinct(g, top_k)                         # distinct groups the experts land in

    def log_choose(a: float, b: float) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    others = groups - groups / nodes                # groups not on a given node
    missed = 0.0 if h >= others else math.exp(log_choose(others, h) - log_choose(groups, h))
    # the fractional-h reading can overshoot by a hair; a group limit never spreads a token wider
    return min(free, nodes * (1.0 - missed))


@functools.lru_cache(maxsize=256)
def consecutive_nodes(nodes: int, top_k: int, experts: int) -> float:
    """Distinct nodes a token meets when its top-k are k consecutive experts, token t taking experts
    t·k .. t·k+k-1 (mod E), as NeMo AutoModel's FakeBalancedGate assigns them
    (``arange(tokens·k).view(-1, k) % experts``); experts laid out in order over the nodes. Averaged
    over the starts the tokens cycle through."""
    starts = sorted({t * top_k % experts for t in range(experts // math.gcd(experts, top_k))})
    met = [len({(s + j) % experts * nodes // experts for j in range(top_k)}) for s in starts]
    return sum(met) / len(met)


def _expert_draw(moe, sh: Shard, mean_per_expert: float) -> dict:
    """How a training step's routing spreads the rows over one rank's experts
    (:func:`kernels.routed_grouped_gemm_efficiency`'s keywords). ``balanced`` routing is uniform: Megatron-Core's
    forced load balancing, which the measured NeMo/Megatron-Bridge runs use, replaces the router's logits by
    Gaussian noise before the top-k (megatron/core/transformer/moe/moe_utils.py ``RandomSTE``:
    ``logits.clone().normal_()``), so each token's k experts are a uniform draw and an expert's rows are
    ``Binomial(draws, k / E)`` over the EP group's tokens; a learned router under load balancing is taken as the
    same within the stated rank load. ``consecutive`` (NeMo AutoModel's ``FakeBalancedGate``) gives every expert
    exactly the mean. The busiest rank's stated load (``workload.moe_imbalance``) scales its experts' draw;
    capacity (``moe_capacity_factor``) caps each expert at that times its mean share, and drop-and-pad
    (``moe_pad_to_capacity``) makes every expert compute exactly its capacity."""
    draws = max(1, round(mean_per_expert * moe.experts / moe.top_k))
    cf = sh.moe_capacity_factor
    return {"tokens": draws, "top_k": moe.top_k, "experts": moe.experts,
            # the stated rank load (with a capacity and no padding it is min(imbalance, capacity): the imbalance
            # past the capacity is dropped anyway); drop-and-pad ignores it
            "load": sh.moe_load,
            "capacity": cf * mean_per_expert if cf else 0.0, "pad": bool(cf and sh.moe_pad_to_capacity),
            "spread": sh.moe_routing != "consecutive"}


def moe_mlp_forward(model: ModelSpec, sh: Shard, rf: Roofline) -> PassCost:
    """Router, all-to-all dispatch, grouped expert GEMMs, shared experts, all-to-all combine.

    Routing is taken as balanced (the measured NeMo/Megatron-Bridge MoE runs force balance), so
    every EP rank receives as many token-expert pairs as its own tokens send out. Each expert is
    split over ``expert_tp`` ranks (Megatron-Core MoE parallel folding, Liu et al. 2025: experts use
    their own TP width, usually 1, while attention keeps ``tp``): a rank enters the MoE block with
    its sequence-parallel shard of T·etp/tp tokens and runs full-width/etp expert GEMMs.
    """
    m = model.moe
    assert m is not None
    c = PassCost()
    h, t, T = model.hidden, sh.tp, sh.tokens
    etp = sh.expert_tp
    seq_shard = t if sh.sequence_parallel else 1
    _gemm(c, rf, T / seq_shard, m.experts, h)                  # router on the local tokens
    if sh.moe_host_sync == "per-layer":
        # what the device runs before the host waits for the token counts (fusion.attach_sync): the norm,
        # the router, its top-k; the copies to the host follow them
        c.sync_pre = (c.device_s + rf.memory(T * 2 * h / seq_shard) + 2 * KERNEL_FIXED_S, c.kernels + 2)
    tokens_in = T * etp / t
    mean_rows = tokens_in * m.top_k                              # token-expert pairs of a balanced rank
    # the busiest EP rank sets the pace (every rank meets it at the combine): its rows, uneven routing,
    # capacity drops or padding included; the useful FLOPs stay the balanced share's
    rows = mean_rows * sh.moe_load
    up = m.expert_ffn_hidden * (2 if model.gated else 1)
    flops = c.flops
    # the rank's experts (E / EP of them) each take their share of the rows, as separate GEMMs cut into
    # row tiles of their own, each expert's rows as routing draws them -- the function serving prices its
    # experts with (kernels.routed_grouped_gemm_efficiency): few tokens per expert leave tiles part empty
    local = max(1, m.experts // max(1, sh.ep))
    # (kernels.GROUPED_KERNELS: the stack's grouped-GEMM kernel class, its concurrency and measured rate)
    draw = _expert_draw(m, sh, mean_rows / local)
    _grouped_gemm(c, rf, local, rows / local, up / etp, h, sh.moe_grouped_gemm, draw)
    _grouped_gemm(c, rf, local, rows / local, h, m.expert_ffn_hidden / etp, sh.moe_grouped_gemm, draw)
    c.flops = flops + (c.flops - flops) / sh.moe_load
    if m.shared_experts:
        sw = (m.shared_expert_ffn_hidden or m.expert_ffn_hidden) * m.shared_experts
        shared = c.snapshot()
        _gemm(c, rf, tokens_in, sw * (2 if model.gated else 1) / etp, h)
        _gemm(c, rf, tokens_in, h, sw / etp)
        c.record("shared_experts", shared)
        if sh.lora_modules == "all":                             # routed experts are not adapted
            _adapter(c, rf, sh, tokens_in, sw * (2 if model.gated else 1) / etp, h)
            _adapter(c, rf, sh, tokens_in, h, sw / etp, row=True)
    # norm and residual on the SP shard; activation; permute/unpermute copies of the routed rows
    c.memory_s += rf.memory(T * 5 * h / seq_shard + rows * 3 * m.expert_ffn_hidden / etp + 4 * rows * h)
    c.kernels += 7 + (1 if m.shared_experts else 0)             # norm, top-k, permute, act, unpermute, residual ...
    c.parts["moe_act"] = PassCost(memory_s=rf.memory(rows * 3 * m.expert_ffn_hidden / etp), kernels=1)
    c.parts["layernorm"] = PassCost(memory_s=rf.memory(T * 2 * h / seq_shard), kernels=1)
    add_extra(c, "norm", model, sh, rf)
    add_norm_part(c.parts["layernorm"], model, sh, rf)
    if etp > 1:
        _tp_region_comms(c, sh, T * h * rf.act_bytes)
    if sh.ep > 1:
        a2a = min(mean_rows, rows) * h * rf.act_bytes            # bytes each rank sends (nccl-tests size)
        deepep = sh.ep_dispatch == "deepep"
        hybridep = sh.ep_dispatch == "hybridep"
        if hybridep:
            # HybridEP (the flex dispatcher's GB200/GB300 backend): a token goes once to every EP rank holding
            # one of its top-k experts and is permuted to them there (fused_a2a.py hybrid_ep_dispatch, "permute +
            # dispatch a2a + permute"); its table counts those received copies, the local one included
            # (fmsim.hardware.dispatch.hybridep_fraction). Experts lie in order over the ranks, so a rank is a
            # "node" of distinct_nodes with E/EP experts.
            k = m.top_k
            met = consecutive_nodes(sh.ep, k, m.experts) if sh.moe_routing == "consecutive" else \
                distinct_nodes(sh.ep, k, m.router_groups, m.token_groups())
            a2a *= met / k
        elif deepep and sh.ep_nodes > 1:
            # hierarchical dispatch (DeepEP, Megatron-Core's flex dispatcher): a token crosses the
            # scale-out network once per distinct remote node among its top-k experts, then fans
            # out over NVLink: distinct_nodes(...)·(N-1)/N remote nodes, against k(N-1)/N copies
            # sent one per expert.
            n, k = sh.ep_nodes, m.top_k
            met = consecutive_nodes(n, k, m.experts) if sh.moe_routing == "consecutive" else \
                distinct_nodes(n, k, m.router_groups, m.token_groups())
            distinct_remote = met * (n - 1) / n
            a2a *= (distinct_remote + k / n) / k
        # with EP overlap (Megatron-Core's combined 1F1B) each dispatch/combine runs behind the
        # compute of another micro-batch's MoE block; the block's own work bounds what it hides
        hide = c.compute_s if sh.ep_overlap else 0.0
        for _ in ("dispatch", "combine"):
            c.comms.append(CommRequest("ep", "all-to-all", a2a, overlappable_s=hide, line_rate=deepep or hybridep,
                                       skew=max(1.0, sh.moe_load), kernel="hybridep" if hybridep else "deepep"))
    _whole_block_part(c, "moe")
    return c


def embedding_forward(model: ModelSpec, sh: Shard, rf: Roofline) -> PassCost:
    """Embedding lookup (a gather: memory-bound) and, with TP, its all-reduce / reduce-scatter."""
    c = PassCost()
    c.memory_s += rf.memory(sh.tokens * model.hidden * 2 / (sh.tp if sh.sequence_parallel else 1))
    if sh.tp > 1:
        # vocab-parallel lookup, then the partial embeddings summed; the backward of an all-reduce
        # is the identity, of a reduce-scatter an all-gather
        size = sh.tokens * model.hidden * rf.act_bytes
        if sh.sequence_parallel:
            c.comms.append(CommRequest("tp", "reduce-scatter", size))
        else:
            c.comms.append(CommRequest("tp", "all-reduce", size, backward=(("all-reduce", 0.0),)))
    if sh.hidden_dropout:
        # the embeddings' dropout, at hidden_dropout: an nn.Dropout module after the sequence-parallel scatter
        # (Megatron-Core language_model_embedding.py @baf94af3 lines 77 and 132-135), so ATen's own kernel
        # whatever the layers' fusion (dropout.hidden_dropout_bytes, eager)
        add_hidden_dropout(c, model, sh, rf, fusion="eager")
    attach_host([c], sh, layer=False)
    return c


def logits_forward(model: ModelSpec, sh: Shard, rf: Roofline) -> PassCost:
    """Final norm, output projection (vocab-parallel over TP) and cross-entropy loss."""
    c = PassCost()
    T, h, t = sh.tokens, model.hidden, sh.tp
    # the output layer stays in 16-bit under fp8/fp4 recipes: Megatron-Core builds it as a plain
    # tensor_parallel.ColumnParallelLinear, outside Transformer Engine's fp8 autocast
    _gemm(c, rf.at_16bit(), T, model.vocab / t, h)
    out_s = c.gemm_s
    # the final norm; the loss over the logits is priced by cross_entropy_s, forward and backward
    c.memory_s += rf.memory(T * 2 * h / (t if sh.sequence_parallel else 1))
    add_extra(c, "norm", model, sh, rf)
    if t > 1 and sh.sequence_parallel:
        # a column-parallel layer, with the same backward as the layers' (_tp_region_comms)
        c.comms.append(CommRequest("tp", "all-gather", T * h * rf.act_bytes,
                                   backward=_column_parallel_sp_backward(out_s)))
    attach_host([c], sh, layer=False)
    return c


#: HBM bytes per logit (of the rank's vocabulary shard) the softmax cross-entropy moves, (forward,
#: backward). fused: one fp32 pass that reads the logits and writes the probabilities (forward), the
#: backward twice that (the model's figure for a fused loss kernel -- Megatron-Core's
#: --cross-entropy-loss-fusion, the NeMo / Megatron-Bridge recipes -- not read from one). unfused: Megatron's
#: vocab-parallel cross entropy as separate PyTorch ops (megatron/core/tensor_parallel/cross_entropy.py,
#: VocabParallelCrossEntropy, read 2026-11-30; the only kind in Megatron-LM before the fusion flag, and
#: its default after): forward .float() (read 2 B, write 4), max (read 4), in-place subtract of the
#: max (8), exp in place (8), sum (4), in-place division into the softmax kept for the backward (8) =
#: 38 B; backward the in-place multiply by the loss gradient (8) and the fp32 gradient cast back to
#: the logits' 16 bits (read 4, write 2) = 14 B. torch: PyTorch's own loss on fp32 logits,
#: ``F.cross_entropy(logits.float(), labels)`` = log_softmax + nll_loss (OLMo-core, the plain scripts): the cast
#: (read 2, write 4) and ``cunn_SoftMaxForward`` -- a vocabulary row of fp32 is past the 48 KiB
#: ``sharedMemPerBlock`` that the shared-memory variant needs, so the kernel reads the row for the max, again for
#: the sum of exponentials and again to write the log-probabilities (12 + 4) -- = 22 B forward (pytorch/pytorch
#: aten/src/ATen/native/cuda/SoftMax.cu @000cace5, host_softmax); backward ``nll_loss_backward`` zero-fills the
#: gradient (write 4; aten/src/ATen/native/cuda/Loss.cu @00e3254d, ``grad_input.zero_()``),
#: ``cunn_SoftMaxBackward`` reads it for its sum, then it and the output, and writes (16), and the cast's
#: backward takes it to 16 bits (read 4, write 2) = 26 B.
CROSS_ENTROPY_BYTES = {"fused": (12.0, 24.0), "unfused": (38.0, 14.0), "torch": (22.0, 26.0)}


def cross_entropy_s(model: ModelSpec, sh: Shard, rf: Roofline) -> tuple[float, float]:
    """(forward, backward) seconds of the softmax cross-entropy over one micro-batch's logits, the
    vocabulary split over TP (memory-bound, :data:`CROSS_ENTROPY_BYTES`)."""
    logits = sh.tokens * model.vocab / sh.tp
    fwd, bwd = CROSS_ENTROPY_BYTES[sh.cross_entropy]
    return logits * fwd / rf.hbm_bytes_per_s, logits * bwd / rf.hbm_bytes_per_s


def backward_of(fwd: PassCost, *, frozen_weights: bool = False, rs_dgrad: bool = False) -> PassCost:
    """Backward pass of a forward: 2 × GEMM work, the attention core's own backward (2.5 × a flash
    kernel's forward), 2 × elementwise; the
    conjugate collectives (AG ↔ RS swap places; all-reduce and all-to-all repeat), or what a
    collective names as its ``backward``.

    With ``frozen_weights`` (LoRA: the base weights get no gradient) the GEMMs compute only the
    data gradient, 1 × forward (Hu et al. 2021 §4.2); the adapters, which train, keep their 2 ×. A
    frozen layer's input-gradient reduce-scatter then has no weight-gradient GEMM to hide behind: it is
    pipelined with the data-gradient GEMM only under ``rs_dgrad`` (Transformer Engine's
    ``ub_overlap_rs_dgrad``, Megatron-Core ``tp_comm_overlap_rs_dgrad``, default off), else it runs in the
    open."""
    gemm_factor = 1.0 if frozen_weights else GEMM_BWD_FACTOR
    conj = {"all-gather": "reduce-scatter", "reduce-scatter": "all-gather"}
    comms = []
    for r in fwd.comms:
        hide = r.overlappable_s * (gemm_factor if r.axis in ("tp", "ep") else ATTENTION_BWD_FACTOR)
        for op, times, *behind in r.backward or ((conj.get(r.op, r.op), 1.0),):
            if not times:
                continue                                 # nothing in its place (an all-reduce's identity)
            if not behind:
                comms.append(CommRequest(r.axis, op, r.size_bytes * times, overlappable_s=hide,
                                         line_rate=r.line_rate, skew=r.skew, kernel=r.kernel))
                continue
            kind, gemm_s = behind
            if frozen_weights and kind == "regather":
                continue                                 # no weight gradient needs the full input
            # a TP layer's backward GEMMs each take its forward GEMM's time (data and weight gradient).
            # Frozen weights have no weight gradient: the input gradient's reduce-scatter can only be
            # pipelined with the data-gradient GEMM itself, which takes userbuffers and rs_dgrad
            asynchronous = kind != "dgrad" and not (frozen_weights and kind == "wgrad")
            if frozen_weights and kind == "wgrad" and not rs_dgrad:
                gemm_s = 0.0
            comms.append(CommRequest(r.axis, op, r.size_bytes * times, overlappable_s=gemm_s,
                                     asynchronous=asynchronous,
                                     ub_sms=UB_RING_EXCHANGE_SMS if kind == "dgrad" else UB_SPLIT_SMS))
    return PassCost(gemm_s=fwd.gemm_s * gemm_factor,
                    attention_s=fwd.attention_bwd_s,
                    memory_s=fwd.memory_s * MEM_BWD_FACTOR,
                    cast_s=fwd.cast_bwd_s,
                    dropout_s=fwd.dropout_bwd_s,
                    adapter_s=fwd.adapter_bwd_s,
                    flops=fwd.flops * gemm_factor,
                    kernels=fwd.kernels * 2,
                    host_s=fwd.host_bwd_s,
                    comms=comms)


def layer_forward(model: ModelSpec, layer: int, sh: Shard, rf: Roofline) -> tuple[PassCost, PassCost]:
    """(attention block, MLP block) forward costs of layer ``layer``."""
    attn = attention_forward(model, sh, rf, windowed=model.is_windowed_layer(layer))
    if model.is_moe_layer(layer):
        mlp = moe_mlp_forward(model, sh, rf)
    else:
        ffn = model.moe.dense_ffn_hidden if (model.moe and model.moe.dense_ffn_hidden) else model.ffn_hidden
        mlp = dense_mlp_forward(model, ffn, sh, rf)
    for block in (attn, mlp):
        add_hidden_dropout(block, model, sh, rf)
    attach_host([attn, mlp], sh)
    return attn, mlp
