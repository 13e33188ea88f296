"""How fused a training stack's non-GEMM work is, and what the host spends launching it.

Owns two software settings of a training run and what they do to one layer's passes:

* ``workload.kernel_fusion`` -- which kernels carry the memory-bound work around the GEMMs and the attention
  core (:data:`KERNEL_FUSIONS`). The operator model (:mod:`fmsim.model.ops`) prices the ``fused`` stacks:
  Transformer Engine / Megatron-Core fused kernels (norm with the GEMM's cast, fused rotary, fused bias-SwiGLU
  or bias-GeLU, fused bias-dropout-add, one QKV and one FC1 GEMM). :func:`add_extra` adds, block by block,
  the kernels and HBM bytes another level runs beyond those, read from the PyTorch-native code that runs them.
* ``workload.cuda_graphs`` -- whether the kernels are replayed from CUDA graphs (:data:`CUDA_GRAPHS`), which
  removes the host's per-kernel launch work (:func:`attach_host`).

The host issues a pass's kernels one after the other while the device runs those already queued, so a pass
takes the longer of its device time and its host time (``PassCost.compute_s``); a pass whose kernels are long
is device-bound and the host cost vanishes behind it, a pass of many short kernels is host-bound.

Per-op bytes, eager (every op its own ATen kernel; pytorch/torchtitan torchtitan/models/llama3/model/model.py
@29624e37, v0.2.0, the layer every PyTorch-native trainer here writes the same way; Hugging Face's and
OLMo-core's Llama layers run the same ops):

* **rotary**, ``apply_rotary_emb``: ``xq.float()`` (read 2 B, write 4), the complex multiply by ``freqs_cis``
  (read 4, write 4 per real element), ``type_as`` back to 16 bits (read 4, write 2): 20 B per element of q and
  k, three kernels each. Fused (``apply_rope_fusion``), the operator model moves 4 B per element of q.
* **GQA** ``repeat_kv``: ``expand(...).reshape(...)`` of k and v to every query head is a copy (read the k/v
  heads, write the expanded), two kernels; **the attention output** ``transpose(1, 2).contiguous()``: one
  copy (read 2, write 2). Megatron-Core's fused attention takes the grouped heads and its own layout.
* **separate projections**: ``wq``, ``wk``, ``wv`` and ``w1``, ``w3`` are separate ``nn.Linear`` layers:
  three GEMM launches where Megatron's ``linear_qkv`` is one, two where ``linear_fc1`` is one (their FLOPs
  and traffic are unchanged; only the launches count).
* **SwiGLU** ``F.silu(w1(x)) * w3(x)``: silu (read 2, write 2) and the product (read 4, write 2) per element
  of the FFN width, two kernels, against the fused kernel's read 4, write 2. GeLU is one kernel either way.
* **RMSNorm**: ``nn.RMSNorm`` is one ATen kernel (``_fused_rms_norm``) since pytorch/pytorch PR #153666
  (merged 2025, in nightlies by August 2025 per pytorch/pytorch issue #157345: PyTorch 2.9), as LayerNorm's
  ``native_layer_norm`` always was -- ``eager``. Written as torch ops -- PyTorch's composite ``rms_norm`` of
  2.4-2.8, Hugging Face's ``LlamaRMSNorm``, OLMo-core's ``RMSNorm`` (src/olmo_core/nn/layer_norm.py @002e0d79:
  ``x.float()``, ``x.pow(2).mean(-1)``, ``x * torch.rsqrt(variance + eps)``, ``weight * x``, ``.to(og_dtype)``)
  -- it is ``eager-composite-norm``: the cast (read 2, write 4), pow (4, 4), mean (read 4), the product (4, 4),
  the weight (4, 4) and the cast back (4, 2) = 40 B per element and 9 kernels (with the per-row add and rsqrt
  and the weight's cast), against the fused kernel's read 2, write 2 (Hugging Face's, multiplying the weight in
  16 bits, moves 36 B in 7).
* residual adds and the attention core are the same kernels in every stack; no dropout in these layers (where a
  stack runs dropout, ``dropout.hidden_dropout_bytes`` prices it per fusion level: its own kernel under eager).

``compiled`` (torch.compile, Inductor, per transformer block as torchtitan and OLMo-core apply it): each chain of
pointwise ops (and a norm's reduction with its pointwise tail) becomes one generated kernel, so the norm, the
rotary of q and of k, and the SwiGLU each move what a fused kernel moves (the rotary of k too); the copies
(``repeat_kv``, the output transpose) and the separate projections remain, since Inductor leaves the GEMMs and
SDPA as library calls whose inputs it must materialise. A residual add folded into the next norm is not
credited.

The backward of each added kernel is priced as the operator model prices every elementwise backward: twice
the forward's bytes and two kernels per forward kernel (``ops.backward_of``). What eager's saved tensors add to
the activation memory is not modelled.

Host cost per kernel (published microbenchmarks, never a training-speed row):

* eager forward: 6.8 us per op of PyTorch's Python + dispatcher + autograd recording (pytorch/pytorch issue
  #41383, 2020-07-14: ``y = 2*x`` with ``requires_grad``, 6.8 s per million ops, on CPU tensors, so no launch
  is in it; PyTorch of 2020, whose dispatcher has since been sped up, so this errs slow) plus the driver launch,
  3.0 us (meta-pytorch/tritonbench PR #1017, 2026-04-14, GB200: ``nop_triton_direct_culaunch``, bare
  ``cuLaunchKernel``, 0 args): 9.8 us. Transformer Engine and Megatron-Core launch from eager PyTorch too, so
  ``fused`` pays it.
* eager backward: the autograd engine runs the ops from C++, "about a microsecond" per op (ngimel in #41383),
  plus the launch: 4.0 us.
* compiled: 9.1 us per kernel, Inductor's ``CachingAutotuner.run`` with 19 arguments (tritonbench #1017), and
  per compiled region call 33.3 us more (its full e2e nop, 42.4 us, less the per-kernel 9.1: guards, device
  guard, the wrapper), one region per layer and pass.
* CUDA graphs: ``none`` launches every kernel from the host (the figures above); ``layer`` replays each layer's pass as one graph (Transformer Engine ``make_graphed_callables``,
  Megatron-Core ``cuda_graph_scope``): the host makes one eager call and one launch per layer pass;
  ``step`` replays the whole step (Megatron-Core ``full_iteration``): nothing per layer. The device-side cost of
  each kernel (``kernels.KERNEL_FIXED_S``) stays: a graph removes the host's work, not the kernel's fill and
  tail (facebookresearch/sam2 issue #768, A6000: the same 1,172 kernels busy the GPU 6.67 ms under a graph
  against 7.27 ms eager, while the wall time fell from 53.7 to 11.98 ms).

The host synchronisation of dropless MoE (``parallelism.moe_host_sync``, :func:`attach_sync`). Megatron-Core's
dispatchers need each MoE layer's token counts on the host: the all-to-all's split sizes and the grouped GEMM's
per-expert ``m_splits`` are host lists. Read at the commits the stacks name (NVIDIA/Megatron-LM
megatron/core/transformer/moe/token_dispatcher.py and fused_a2a.py at 791b70e0 and 3cdfd613, the megatron-lm refs
of NeMo v2.2.0 and v2.3.0's requirements/manifest.json (core_r0.11.0, core_r0.12.0: NeMo 25.02, 25.04), at
core_v0.14.0, core_v0.15.0rc6 -- the version Megatron-Bridge f9aad1f3's uv.lock pins -- 0d8e0714, Megatron-Bridge
v0.2.0's submodule, and 3097d81d, 26.04's):

* ``alltoall`` dispatcher, dropless: ``preprocess`` computes the counts on the device (and all-gathers them over
  TP x EP); ``_maybe_dtoh_and_synchronize`` copies them (``tokens_per_expert``, ``input_splits``,
  ``output_splits``, ``output_splits_tp``, and ``num_global_tokens_per_local_expert`` without permute fusion)
  with ``.to("cpu", non_blocking=True)`` on a side stream at ``before_permutation_1`` and waits on the copies'
  event (``d2h_event.synchronize()``) at ``before_ep_alltoall`` (EP > 1 or TP > 1; ``before_finish`` otherwise;
  ``before_permutation_1`` with a capacity factor or router padding; core_r0.11.0 waits on the whole stream,
  ``torch.cuda.current_stream().synchronize()``, at the same points). One wait per MoE layer forward; the
  backward reuses the host lists, so none there. ``moe_pad_expert_input_to_capacity`` (drop and pad to the
  capacity, computed on the host) has no wait; a ``moe_preprocess`` CUDA-graph scope moves the copies to
  ``before_ep_alltoall`` but keeps the wait.
* ``flex`` dispatcher with DeepEP: ``FusedDispatch.forward`` notes "the CPU will wait for GPU's signal to arrive,
  so this is not compatible with CUDA graph" (DeepEP's ``Buffer.dispatch`` returns the received counts as a
  host list); the backward runs with the cached handle and does not wait. HybridEP dropless waits the same way
  (``num_dispatched_tokens`` None: "will cause a CPU sync"). DeepEP refuses drop-and-pad
  (transformer_config.py ``__post_init__``).
* ``allgather`` dispatcher: ``tokens_per_expert = local_map.sum(dim=0).long().cpu()``, a blocking copy.

Pricing, from the host model above, with nothing fitted: at the wait the host stops issuing until the device
has run everything before the copies and the copy has landed, so what the host had queued ahead is gone; after
it, the device runs each kernel only once the host has issued it, until the host is ahead again. The block's
forward then takes ``max(device_pre, host_pre) + copy + max(h1 + device_post, host_post)`` against
``max(device, host)`` without the wait: ``pre`` the norm, router and top-k (and, for ``alltoall``, the host's
calls issuing the copies, each an eager op), ``post`` the rest of the block, ``h1`` one kernel's host issue (the
all-to-all's launch), the host seconds shared over the kernels as :func:`attach_host` set them. A layer's CUDA
graph leaves such a block out (its shapes are the host's counts: NVIDIA/Megatron-LM issue #1598, 2025-05-29, a
maintainer: "the tensor in MoE layer has dynamic shape ... You can partially capture CUDA graph for Attention
layer"), so under ``cuda_graphs: layer`` it launches eagerly while the attention replays; a whole-step graph
cannot hold the wait at all, and the reader refuses it. ``copy`` is one small device-to-host copy: "a cudaMemcpy can incur in a 6-7us overhead"
(NVIDIA/gdrcopy README.md @00cf81f3), 6.5 us, the copies of one wait pipelined behind each other as one. DeepEP's
wait polls a counter the GPU writes into host memory, not a copy; no figure was found for that latency, so it
is 0 there (errs fast). The difference is never negative (``max(a, b) + max(c, d) >= max(a + c, b + d)``), so the
wait never shortens a step; the recompute of a checkpointed MoE block waits again (its forward re-runs the
dispatcher).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .architecture import ModelSpec
    from .ops import PassCost, Roofline, Shard

__all__ = ["CUDA_GRAPHS", "D2H_COPY_S", "KERNEL_FUSIONS", "MOE_SYNC_COPIES", "add_extra", "add_norm_part",
           "attach_host", "attach_sync", "host_per_kernel_s"]

#: fused: Transformer Engine / Megatron-Core fused kernels | compiled: torch.compile (Inductor) | eager: every op
#: its own ATen kernel, the norm one ATen kernel (PyTorch >= 2.9 RMSNorm, LayerNorm) | eager-composite-norm: the
#: same with the RMSNorm written as torch ops (Hugging Face, OLMo-core, PyTorch <= 2.8 nn.RMSNorm)
KERNEL_FUSIONS = ("fused", "compiled", "eager", "eager-composite-norm")
#: none: every kernel launched by the host | layer: one graph per layer pass | step: the whole step one graph
CUDA_GRAPHS = ("none", "layer", "step")

#: per-op host seconds of eager PyTorch, forward (Python + dispatcher + autograd, pytorch/pytorch #41383: 6.8 us)
#: plus a driver launch (tritonbench PR #1017: cuLaunchKernel 3.0 us)
EAGER_HOST_FWD_S = 6.8e-6 + 3.0e-6
#: backward: the autograd engine's C++ call of each op (about 1 us, #41383) plus the launch
EAGER_HOST_BWD_S = 1.0e-6 + 3.0e-6
#: Inductor's per-kernel launch path (CachingAutotuner.run, 19 arguments: tritonbench PR #1017)
COMPILED_HOST_S = 9.1e-6
#: Inductor's per-call cost of a compiled region beyond its kernels (42.4 us e2e - 9.1 us: tritonbench PR #1017)
COMPILED_REGION_HOST_S = 42.4e-6 - 9.1e-6

#: one small device-to-host copy's overhead: "a cudaMemcpy can incur in a 6-7us overhead" (NVIDIA/gdrcopy
#: README.md @00cf81f3), the middle of that range
D2H_COPY_S = 6.5e-6
#: the counts Megatron-Core's alltoall dispatcher copies to the host before its wait (tokens_per_expert,
#: input_splits, output_splits, output_splits_tp; token_dispatcher.py _maybe_dtoh_and_synchronize @0d8e0714),
#: each an eager ``.to("cpu", non_blocking=True)``; num_global_tokens_per_local_expert only without permute
#: fusion, not counted
MOE_SYNC_COPIES = 4

#: bytes per element moved by the norm written as torch ops (module docstring) and by one fused norm kernel
COMPOSITE_NORM_BYTES, FUSED_NORM_BYTES = 40.0, 4.0
COMPOSITE_NORM_KERNELS = 9
#: eager rotary per element of q and k (cast, complex multiply, cast back), three kernels per tensor
EAGER_ROPE_BYTES, EAGER_ROPE_KERNELS = 20.0, 3
#: eager SwiGLU per element of the FFN width (silu + product) against the fused kernel
EAGER_SWIGLU_BYTES, FUSED_SWIGLU_BYTES = 10.0, 6.0


def _norm_extra(sh: Shard, model: ModelSpec, tokens: float) -> tuple[float, float]:
    """(bytes, kernels) one norm over ``tokens`` tokens (its sequence-parallel shard) adds beyond a fused
    norm kernel."""
    if sh.kernel_fusion != "eager-composite-norm":
        return 0.0, 0.0
    elements = tokens * model.hidden / (sh.tp if sh.sequence_parallel else 1)
    return (COMPOSITE_NORM_BYTES - FUSED_NORM_BYTES) * elements, COMPOSITE_NORM_KERNELS - 1.0


def add_extra(c: PassCost, block: str, model: ModelSpec, sh: Shard, rf: Roofline, *, ffn: float = 0.0) -> None:
    """Add to ``c`` (a block's forward, per micro-batch) the kernels and HBM time its stack's kernel fusion
    runs beyond the fused kernels the operator model prices: ``block`` is ``attention``, ``mlp`` (``ffn``: its
    FFN width) or ``norm`` (a block whose only difference is its norm: an MoE block, the final norm)."""
    level = sh.kernel_fusion
    if level == "fused":
        return
    T, t = sh.tokens, sh.tp
    extra, kernels = _norm_extra(sh, model, T)
    if block == "attention" and model.attention != "mla":
        q = model.heads * model.head_dim / t
        k = model.kv_heads_per_rank(t) * model.head_dim
        if level == "compiled":
            extra += 4.0 * k * T                                     # the rotary of k, one kernel
            kernels += 1
        else:
            extra += (EAGER_ROPE_BYTES * (q + k) - 4.0 * q) * T      # three kernels each for q and k, not one
            kernels += 2 * EAGER_ROPE_KERNELS - 1
        if k < q:
            extra += 2 * 2.0 * (k + q) * T                           # repeat_kv: k and v expanded to every head
            kernels += 2
        extra += 4.0 * q * T                                         # the output's transpose(1, 2).contiguous()
        kernels += 1 + 2                                             # ... and wq, wk, wv launched apart
    elif block == "mlp":
        if model.gated and level != "compiled":
            extra += (EAGER_SWIGLU_BYTES - FUSED_SWIGLU_BYTES) * ffn * T / t
            kernels += 1
        kernels += 1 if model.gated else 0                          # w1 and w3 launched apart
    c.memory_s += extra / rf.hbm_bytes_per_s
    c.kernels += kernels


def add_norm_part(part: PassCost, model: ModelSpec, sh: Shard, rf: Roofline) -> None:
    """Add the norm's extra kernels and bytes (:func:`add_extra`) to a ``layernorm`` recompute module."""
    extra, kernels = _norm_extra(sh, model, sh.tokens)
    part.memory_s += extra / rf.hbm_bytes_per_s
    part.kernels += kernels


def host_per_kernel_s(sh: Shard) -> tuple[float, float]:
    """(forward, backward) host seconds per kernel a stack launches itself (no CUDA graph)."""
    if sh.kernel_fusion == "compiled":
        return COMPILED_HOST_S, COMPILED_HOST_S
    return EAGER_HOST_FWD_S, EAGER_HOST_BWD_S


def attach_host(costs: list[PassCost], sh: Shard, *, layer: bool = True) -> None:
    """Set the host seconds of ``costs`` -- the forward costs of one layer's blocks (``layer``) or of a piece
    outside the layers (embedding, head) -- and of their backward (``host_bwd_s``), and of their recompute
    modules, from the stack's kernel fusion and CUDA graphs."""
    graphs = sh.cuda_graphs
    fwd_k, bwd_k = host_per_kernel_s(sh)
    # a block that waits on the host (a dropless MoE block, sync_pre set) has shapes only the host knows, so a
    # layer's graph leaves it out and it launches eagerly (NVIDIA/Megatron-LM issue #1598, 2025-05-29: "the
    # tensor in MoE layer has dynamic shape ... You can partially capture CUDA graph for Attention layer")
    eager = [c for c in costs if c.sync_pre is not None] if graphs == "layer" else []
    graphed = [c for c in costs if c.sync_pre is None] if eager else costs
    if graphs == "step" or (graphs == "layer" and layer):
        # one replay per layer pass (an eager call and a launch), shared by the layer's blocks; nothing per step
        share = 0.0 if graphs == "step" else 1.0 / max(1, len(graphed))
        for c in graphed:
            c.host_s, c.host_bwd_s = share * EAGER_HOST_FWD_S, share * EAGER_HOST_BWD_S
            for part in c.parts.values():
                part.host_s = part.host_bwd_s = 0.0
    if eager or not (graphs == "step" or (graphs == "layer" and layer)):
        launched = eager or costs
        region = COMPILED_REGION_HOST_S / max(1, len(costs)) if sh.kernel_fusion == "compiled" and layer else 0.0
        for c in launched:
            c.host_s = c.kernels * fwd_k + region
            c.host_bwd_s = 2.0 * c.kernels * bwd_k + region
            for part in c.parts.values():
                part.host_s = part.kernels * fwd_k
                part.host_bwd_s = 2.0 * part.kernels * bwd_k
    for c in costs:
        attach_sync(c, sh)


def attach_sync(c: PassCost, sh: Shard) -> None:
    """Set ``c.sync_s``, what the host's wait for a dropless MoE block's token counts adds to its forward
    (module docstring), from ``c.sync_pre`` (the device seconds and kernels before the wait, set by
    ``ops.moe_mlp_forward`` under ``moe_host_sync: per-layer``) and the host seconds :func:`attach_host` set.
    A checkpointed block's recompute (its ``moe`` part) waits as much again."""
    if c.sync_pre is None or c.kernels <= 0:
        return
    device_pre, kernels_pre = c.sync_pre
    per_kernel = c.host_s / c.kernels                   # the host's issue seconds per kernel, as attach_host set
    alltoall = sh.ep_dispatch == "alltoall"
    copies = MOE_SYNC_COPIES * host_per_kernel_s(sh)[0] if alltoall and sh.cuda_graphs != "step" else 0.0
    host_pre, host_post = per_kernel * kernels_pre + copies, per_kernel * (c.kernels - kernels_pre)
    device_post = max(0.0, c.device_s - device_pre)
    waited = (max(device_pre, host_pre) + (D2H_COPY_S if alltoall else 0.0)
              + max(per_kernel + device_post, host_post))
    c.sync_s = max(0.0, waited - max(device_pre + device_post, host_pre + host_post))
    part = c.parts.get("moe")
    if part is not None:
        part.sync_s = c.sync_s
