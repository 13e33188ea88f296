"""Per-iteration cost of a continuous-batching serving engine: prefill and decode batches.

Owns the serving engine profiles (global, sourced figures per engine: per-iteration overhead,
default limits, memory semantics) and :class:`ServingCostModel`, a frozen set of coefficients
derived once from (model, accelerator, precision, parallelism) that prices one engine iteration
from aggregate sums of its batch:

* linear layers as one roofline each (dense part, routed experts, LM head): FLOPs at the
  accelerator's achievable GEMM rate vs weight bytes at its achievable HBM bandwidth;
* attention as a roofline over (query, context) pairs: causal prefill is compute-bound, decode
  reads every context token's K/V once (bandwidth-bound), MLA reads its compressed latent;
* routed-expert weight traffic scaled by the expected number of distinct experts a batch of T
  tokens touches, ``E * (1 - (1 - k/E)^T)``;
* tensor-parallel all-reduces per layer, expert-parallel all-to-alls per MoE layer (from the fabric
  engineer's ``fmsim.hardware.collectives.collective_time``) and pipeline hops;
* a fixed per-iteration overhead, global per engine (:data:`ENGINES`).

Because every decode sequence adds one context token per step, a decode-only iteration costs
``c0 + c1 * sum(context)``: :meth:`ServingCostModel.decode_coeffs` gives (c0, c1) so the DES can
jump over many identical steps in closed form.

Convention: one *engine* is the group of GPUs that steps one batch together -- ``tp`` GPUs (or
``max(tp, ep)`` with data-parallel attention). With pipeline parallelism an engine is one
microbatch's path through all ``pp`` stages: its iteration takes the sum of the stage times
(all layers, each stage reading its own weights), and a replica runs ``pp`` engines at once.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, OutOfMemoryError, ParallelismError
from ..units import format_bytes
from .architecture import causal_pairs, window_pairs
from .deepep import DEEPEP_MODES, exchange_sizes, layer_times_fn
from .tbo import tbo_decode_coeffs, tbo_gpu_time
from .kernels import (
    BYTES_PER_ELEMENT,
    GEMM_K0,
    KERNEL_FIXED_S,
    chip_gemm_k0,
    gemm_efficiency,
    gemm_k_efficiency,
    routed_grouped_gemm_efficiency,
)

ACT_BYTES = 2.0          # activations and collectives move bf16
LOGIT_BYTES = 4.0        # fp32 logits in the sampler
# Device memory a serving process cannot use: CUDA context and allocator reserve, ~0.5-1 GiB per
# GPU (hardware_catalog/accelerators.yaml header, "hbm:" convention); the upper end, as engines
# also keep CUDA-graph pools.
RUNTIME_RESERVE_BYTES = 2.0 ** 30
# Kernels per transformer layer in a fused inference engine: norm, QKV GEMM, RoPE/KV append,
# attention, output GEMM, norm, gate-up GEMM, activation, down GEMM (9); an MoE layer adds the
# router GEMM, top-k, token permute and un-permute and runs grouped GEMMs (13; +3 with shared
# experts). Collectives are priced by the fabric model, not counted here.
KERNELS_DENSE_LAYER = 9
KERNELS_MOE_LAYER = 13
KERNELS_PER_ITERATION = 3   # embedding, LM head, sampling
# TensorRT-LLM's CUTLASS fused MoE (PyTorch backend) launches more than the generic count above, per MoE layer
# (NVIDIA/TensorRT-LLM, module tensorrt_llm/_torch/modules/fused_moe/fused_moe_cutlass.py @000a01de66 forward_chunk;
# op cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_kernels.cu @000dea273b CutlassMoeFCRunner::runMoe, the
# stored revision nearest it, same sequence): the expert-map build and sort before the permute
# (fusedBuildExpertMapsSortFirstToken, one single-block kernel while the op's rows are <= 256 and top-k is 1/2/4/6/8,
# else threeStepBuildExpertMapsSortFirstToken: blockExpertPrefixSum, globalExpertPrefixSum, mergeExpertPrefixSum),
# the grouped GEMMs' stride/pointer setup (computeStridesTmaWarpSpecializedKernel, setupTmaWarpSpecializedInputs,
# once for both GEMMs), and for an FP8 (static_quantize_e4m3_per_tensor) or NVFP4 (fp4_quantize) checkpoint the
# quantization of the layer's input before the op. gemm1's activation (doActivation) and gemm2's finalize (its
# kernel, or the output memset of the fused-finalize epilogue) are already among the 13.
CUTLASS_MOE_KERNELS = 2            # expert-map build/sort (fused), stride setup
CUTLASS_MOE_QUANT_KERNELS = 1      # input quantize, fp8 / nvfp4 checkpoints
CUTLASS_MOE_FUSED_SORT_MAX_ROWS = 256
CUTLASS_MOE_UNFUSED_SORT_EXTRA = 2  # three-step sort instead of the fused one
INDEX_BYTES = 4.0                  # int32 expert ids and row maps
#: bytes per element of the CUTLASS MoE op's activation type T (``dtype_size`` in getWorkspaceDeviceBufferSizes: the
#: fp8 / nvfp4 checkpoint's quantized input, else 16-bit) and of its unfused GEMM output (``UnfusedGemmOutputType``,
#: 16-bit), and the int32 / fp32 per-row maps it keeps (unpermuted/permuted source ids and expert ids, four int32, and
#: the fp32 final scales of the fused finalize)
_CUTLASS_MOE_T_BYTES = {"fp8": 1.0, "fp4": 0.5}
_CUTLASS_MOE_OUT_BYTES = 2.0
_CUTLASS_MOE_ROW_MAP_BYTES = 4 * INDEX_BYTES + 4.0


def cutlass_moe_workspace_per_row(hidden: float, inter: float, precision: str, gated: bool = True) -> float:
    """Workspace bytes TensorRT-LLM's CUTLASS fused MoE op allocates per expanded row (top-k x the op's rows).

    The rule of ``CutlassMoeFCRunner::getWorkspaceDeviceBufferSizes`` (cpp/tensorrt_llm/kernels/cutlass_kernels/
    moe_gemm/moe_kernels.cu, NVIDIA/TensorRT-LLM, the stored revisions read: the one of the v1.0 line and the listing's
    @ac73e3116f, the same rule), restated: ``num_moe_inputs = experts_per_token * num_rows`` rows -- sized for every
    expanded row whatever EP keeps local -- and two overlapped buffers, the GEMMs' inputs ``max(permuted_data
    (hidden x T), fc2_result (hidden x out), fc1_result (inter x T))`` and their outputs ``max(glu_inter (2 inter x
    out when gated), fc2_result, fc1_result)``, plus the per-row maps; the sorter, pointer arrays and GEMM workspace do
    not grow with hidden size and are left out. ``inter`` is the expert's intermediate on one GPU. The torch op keeps
    it as a torch tensor (cpp/tensorrt_llm/thop/moeOp.cpp getWorkspaceInfo: torch::empty), so the engine's memory
    profiling counts it in its peak."""
    t = _CUTLASS_MOE_T_BYTES.get(precision, ACT_BYTES)
    o = _CUTLASS_MOE_OUT_BYTES
    glu = (2 if gated else 1) * inter * o
    inputs = max(hidden * t, hidden * o, inter * t)
    outputs = max(glu, hidden * o, inter * t)
    return inputs + outputs + _CUTLASS_MOE_ROW_MAP_BYTES
def _flop_weighted_efficiency(gemms: list[tuple[float, float, float]], k0: float = GEMM_K0) -> float:
    """Efficiency of a chain of GEMMs given as (FLOPs share, K, N): sum(f) / sum(f / e(K))."""
    tot = sum(g[0] for g in gemms)
    if tot <= 0:
        return 1.0
    return tot / sum(g[0] / gemm_k_efficiency(g[1], k0) for g in gemms)


def _gemm_shapes(gemms: list[tuple[float, float, float]]) -> tuple[tuple[float, float, float], ...]:
    """(FLOPs share, K, N on one GPU) of each GEMM family, for the shape model (kernels.gemm_efficiency)."""
    tot = sum(g[0] for g in gemms)
    return tuple((f / tot, k, n) for f, k, n in gemms) if tot > 0 else ()


# ----------------------------------------------------------------------------------------------
# engine profiles (global figures, one per engine family)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineProfile:
    """What a serving engine does by default, and its fixed per-iteration overhead.

    The overhead is CPU scheduling / input preparation / kernel-launch time that the GPU waits
    for on every iteration. It is a global figure per engine with its source, never set per
    scenario.
    """

    name: str
    iteration_overhead_s: float
    max_seqs: int | None            # None: derive from KV capacity (see ``auto_limits``)
    max_batch_tokens: int | None
    chunked_prefill: bool
    mixed_batches: bool             # prefill chunks and decodes in one iteration
    prefix_caching: bool
    kv_block_size: int
    memory_fraction: float
    memory_fraction_of: str         # "total": frac*HBM - weights; "free": frac*(HBM - weights - act)
    admission: str                  # optimistic (preempt+recompute) | reserve (no eviction)
    kv_follows_quantization: bool   # kv_cache_dtype auto = fp8 when weights are fp8/fp4 (assumed: the engine takes the checkpoint's declaration)
    source: str
    graph_batch_sizes: tuple[int, ...] = ()   # decode-only batches run as CUDA graphs padded up to these
    cpu_overhead_fraction: float = 0.0        # share of wall time the GPU waits for the CPU scheduler
    window_kv: bool = False                   # local-attention layers keep KV for their window only
    #: with data-parallel attention, max_seqs and max_batch_tokens bound each attention rank's own batch
    #: (TensorRT-LLM: "--max_batch_size: Max batch size in each rank", DeepSeek-R1 best-practice blog, where
    #: concurrency 7168 runs as 8 ranks x 896), not the engine's; CUDA graphs pad each rank's batch
    limits_per_rank: bool = False
    #: how the MoE layers of a data-parallel-attention engine move tokens to their experts: ``all-to-all``
    #: (dispatch + combine of each token's top-k copies) or ``allgather`` (every rank gathers all ranks'
    #: quantized tokens, runs its own experts over them, and a reduce-scatter sums the outputs back); DeepEP's
    #: exchange is the scenario's ``serving.deepep`` (fmsim.model.deepep), not an engine default
    moe_comm: str = "all-to-all"
    #: (max_seqs, max_batch_tokens) on a device with under ``large_device_bytes`` of memory or named A100:
    #: vLLM >= 0.9 sets its defaults per device ("device_memory >= 70 * GiB_bytes and 'a100' not in
    #: device_name", vllm/engine/arg_utils.py); None: the limits above hold on every device
    small_device_limits: tuple[int, int] | None = None
    large_device_bytes: float = 70 * 2.0 ** 30
    #: how ``auto`` limits are sized: ``kv`` (to the KV capacity fmsim's memory model gives the engine) or
    #: ``trtllm-bench`` (its own checkpoint-based estimate, :func:`trtllm_bench_kv_tokens`)
    auto_limits_from: str = "kv"
    #: the MoE layer's kernels: ``generic`` (KERNELS_MOE_LAYER) or ``cutlass`` (TensorRT-LLM's CUTLASS fused MoE adds
    #: its expert-map sort, stride setup and input quantize: CUTLASS_MOE_*)
    moe_impl: str = "generic"
    #: whether the memory the KV pool is sized against holds fp32 logits for ``max_seqs`` sequences: TensorRT-LLM's
    #: PyTorch backend sizes it from one profiled forward of max_num_tokens in context requests (each
    #: ``max_seq_len - 1`` tokens long, logits for their last token only: KvCacheCreator._create_dummy_context_requests,
    #: _util.py), so a full decode batch's logits are not in that peak and come out of the 1 - fraction left
    sizing_counts_logits: bool = True

    def limits_on(self, accelerator: Any) -> tuple[int | None, int | None]:
        """(max_seqs, max_batch_tokens) this engine defaults to on ``accelerator`` (a catalog Accelerator)."""
        if self.small_device_limits is not None and (
                accelerator.hbm_bytes < self.large_device_bytes or "a100" in accelerator.name.lower()):
            return self.small_device_limits
        return self.max_seqs, self.max_batch_tokens


#: vLLM 0.11's default CUDA-graph capture sizes: [1, 2, 4] + range(8, 513, 8) (a batch never exceeds max_num_seqs, so
#: the min(2 max_num_seqs, 512) cap changes nothing here)
_VLLM_011_GRAPHS = (1, 2, 4, *range(8, 513, 8))


def _vllm_011(name: str, max_seqs: int, max_batch_tokens: int, small: tuple[int, int] | None,
              source: str) -> EngineProfile:
    """A vLLM 0.11.0 entry point's profile: its limits, the V1 defaults it shares with the others."""
    return EngineProfile(
        name=name, iteration_overhead_s=0.0, max_seqs=max_seqs, max_batch_tokens=max_batch_tokens,
        small_device_limits=small, chunked_prefill=True, mixed_batches=True, prefix_caching=True, kv_block_size=16,
        memory_fraction=0.9, memory_fraction_of="total", admission="optimistic", kv_follows_quantization=False,
        window_kv=True, graph_batch_sizes=_VLLM_011_GRAPHS,
        source=f"vLLM 0.11.0 (V1 engine) {source}; chunked prefill and prefix caching on for generative models "
               "(_set_default_args L1547-1560); CUDA graphs for batches [1, 2, 4, 8, 16, ..., min(2 max_num_seqs, "
               "512)] (vllm/config/scheduler.py cuda_graph_sizes L222-227, vllm/config/__init__.py "
               "_set_cudagraph_sizes L551, vllm-project/vllm @f71952c1c); other defaults as vllm")


ENGINES: Mapping[str, EngineProfile] = {
    "vllm": EngineProfile(
        name="vllm", iteration_overhead_s=0.0, max_seqs=1024, max_batch_tokens=8192, small_device_limits=(256, 2048),
        chunked_prefill=True, mixed_batches=True, prefix_caching=True, kv_block_size=16,
        memory_fraction=0.9, memory_fraction_of="total", admission="optimistic",
        kv_follows_quantization=False, window_kv=True, graph_batch_sizes=_VLLM_011_GRAPHS,
        source="the current release's OpenAI API server (vllm serve), as vllm-0.11: max_num_seqs 1024 and "
               "max_num_batched_tokens 8192 on a device of >= 70 GiB not named A100, else 256 and 2048 "
               "(vllm-project/vllm vllm/engine/arg_utils.py @f71952c1c (tag v0.11.0) _set_default_args "
               "L1605-1624), CUDA graphs as vllm-0.11; vLLM engine arguments (block_size 16, "
               "gpu_memory_utilization 0.9, "
               "kv_cache_dtype auto = model dtype), https://docs.vllm.ai/en/latest/serving/engine_args.html; "
               "V1 scheduler: chunked prefill and prefix caching on by default, 'near-zero CPU overhead' "
               "(vLLM blog 2025-01-27 'vLLM V1: A Major Upgrade'); recompute preemption "
               "(Kwon et al., SOSP'23 PagedAttention, sec. 4.5); hybrid KV cache manager: 'sliding window "
               "layers: reserve slots only for the most recent sliding_window_size tokens', one pool of "
               "equal-size pages (https://docs.vllm.ai/en/latest/design/hybrid_kv_cache_manager/)"),
    "vllm-0.6": EngineProfile(
        name="vllm-0.6", iteration_overhead_s=0.0, max_seqs=256, max_batch_tokens=8192,
        chunked_prefill=False, mixed_batches=False, prefix_caching=False, kv_block_size=16,
        memory_fraction=0.9, memory_fraction_of="total", admission="optimistic",
        kv_follows_quantization=False, cpu_overhead_fraction=0.071,
        source="vLLM v0.6 (V0 engine) with --num-scheduler-steps 10, as benchmarked in 2024. CPU share: the "
               "vLLM blog 2024-09-05 'vLLM v0.6.0: 2.7x Throughput Improvement' profiles v0.5 (Llama 3 8B, "
               "H100) at API server 33 %, scheduling and input preparation 29 %, GPU 38 % of the time; v0.6 "
               "moves the API server to its own process and overlaps output processing, and multi-step "
               "scheduling runs the remaining 29 % once per 10 steps, so the GPU still waits "
               "2.9 / (38 + 2.9) = 7.1 % of the time. Prefill-first, no chunked prefill and no prefix "
               "caching: the V0 defaults under multi-step (engine arguments, docs.vllm.ai v0.6.0). Limits at the tag: "
               "max_num_seqs 256 (vllm-project/vllm vllm/engine/arg_utils.py L90 @32e7db2536, tag v0.6.0); "
               "max_num_batched_tokens max(max_model_len, 2048) without chunked prefill (vllm/config.py L977-981), "
               "which is off unless max_model_len > 32768 (arg_utils.py L843-869): the 8192 here stands for a file "
               "that states neither, and the validation files state theirs"),
    "vllm-0.11": _vllm_011("vllm-0.11", 1024, 8192, (256, 2048),
        "behind its OpenAI API server (vllm serve, api_server.py usage_context "
        "OPENAI_API_SERVER): vllm-project/vllm vllm/engine/arg_utils.py @f71952c1c (tag v0.11.0) "
        "_set_default_args L1605-1624: UsageContext.OPENAI_API_SERVER max_num_seqs 1024, "
        "max_num_batched_tokens 8192 on a device of >= 70 GiB not named A100, else 256 and 2048"),
    "vllm-0.11-llm": _vllm_011("vllm-0.11-llm", 1024, 16384, (256, 8192),
        "as the offline vllm.LLM class (entrypoints/llm.py L298 usage_context "
        "LLM_CLASS; vllm bench throughput builds an LLM, benchmarks/throughput.py L44): vllm-project/vllm "
        "vllm/engine/arg_utils.py @f71952c1c (tag v0.11.0) _set_default_args L1605-1624: "
        "UsageContext.LLM_CLASS max_num_seqs 1024, max_num_batched_tokens 16384 on a device of >= 70 GiB not "
        "named A100, else 256 and 8192"),
    "vllm-0.11-async": _vllm_011("vllm-0.11-async", 128, 2048, None,
        "as an AsyncLLM built from AsyncEngineArgs with no usage context (NeMo RL's "
        "async_engine: true, nemo_rl/models/generation/vllm/vllm_worker_async.py _create_engine, "
        "NVIDIA-NeMo/RL @00cf6b43: 'AsyncLLM.from_engine_args(self.llm_async_engine_args, stat_loggers=...)',"
        " the stored revision; 06beed91 is not stored): AsyncLLM.from_engine_args defaults to "
        "UsageContext.ENGINE_CONTEXT (vllm/v1/engine/async_llm.py L225), which vllm-project/vllm "
        "vllm/engine/arg_utils.py @f71952c1c (tag v0.11.0) _set_default_args L1653-1678 leaves unset, so "
        "SchedulerConfig.__post_init__ sets max_num_seqs 128 and, with chunked prefill, "
        "DEFAULT_MAX_NUM_BATCHED_TOKENS 2048 (vllm/config/scheduler.py L167-173, vllm/utils/__init__.py L88) "
        "on every device"),
    "trtllm": EngineProfile(
        name="trtllm", iteration_overhead_s=0.0, max_seqs=None, max_batch_tokens=None,
        chunked_prefill=False, mixed_batches=True, prefix_caching=True, kv_block_size=32,
        memory_fraction=0.9, memory_fraction_of="free", admission="reserve",
        kv_follows_quantization=True,
        graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192),
        limits_per_rank=True, moe_comm="allgather", auto_limits_from="trtllm-bench", moe_impl="cutlass",
        sizing_counts_logits=False,
        source="TensorRT-LLM: CUDA graphs with padding for generation batches of 1..8192 (the llm_options.yml "
               "of docs/source/performance/perf-overview.md); kv_cache_free_gpu_mem_fraction 0.9 of free memory (trtllm-bench's "
               "--kv_cache_free_gpu_mem_fraction default .90): the PyTorch backend profiles one forward of max_num_tokens "
               "per rank after loading the weights and sizes the pool to fraction x (device total - peak), the peak "
               "being weights + that forward's torch allocations (the fused MoE op's workspace among them) + memory held "
               "outside torch (tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator.estimate_max_tokens / "
               "_cal_max_tokens, the v1.0 line; the same rule @0004396720 configure_kv_cache_capacity); no max_tokens "
               "cap unless set; each attention-DP rank sizes its own pool; CUDA graphs are captured largest first at "
               "executor warmup and the capture stops where the (estimation-sized) cache cannot hold the batch "
               "(model_engine.py warmup: 'No KV cache space!'), so the final graphs come out of the 1 - fraction left; "
               "GUARANTEED_NO_EVICT capacity scheduler (trtllm-bench throughput's --scheduler_policy default "
               "guaranteed_no_evict, tensorrt_llm/bench/benchmark/throughput.py @000a01de66; the PyTorch backend applies "
               "no dynamic batch tuning: _torch/pyexecutor/_util.py create_py_executor_instance), in-flight batching of context and generation, overlap scheduler hides "
               "CPU work behind GPU work (docs/source/features/overlap-scheduler.md); trtllm-bench sizes "
               "max_batch_size from its own KV estimate (GPUs x device memory less the checkpoint's size, KV bytes "
               "per token with max(tp, kv_heads) heads) / (ISL+OSL) and max_num_tokens from batch x (1+ISL/OSL), "
               "capped at 4096 and 32768 (tensorrt_llm/bench/build/tuning.py @04cba88208 calc_engine_setting, "
               "finetune_setting); with attention DP "
               "max_batch_size and max_num_tokens hold per rank (docs/source/blogs/"
               "Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md @01c4ece911: '--max_batch_size: Max "
               "batch size in each rank'); the CUTLASS MoE with attention DP quantizes the tokens, all-gathers them with their "
               "expert ids and scales, runs the rank's experts over every gathered token and reduce-scatters the 16-bit "
               "outputs (tensorrt_llm/_torch/modules/fused_moe/fused_moe_cutlass.py, NVIDIA/TensorRT-LLM@000a01de66: "
               "'routing ... + fp4_allgather + FusedMoe Op + reducescatter, with AttentionDP on'); later revisions add "
               "an all-to-all only on multi-node NVLink (GB200) or DeepEP behind an environment variable, and never when "
               "moe_ep_size <= top_k (select_alltoall_method_type)"),
    "sglang-0.3": EngineProfile(
        name="sglang-0.3", iteration_overhead_s=0.0, max_seqs=None, max_batch_tokens=8192,
        chunked_prefill=True, mixed_batches=False, prefix_caching=True, kv_block_size=1,
        memory_fraction=0.88, memory_fraction_of="total", admission="optimistic",
        kv_follows_quantization=False, cpu_overhead_fraction=0.09,
        source="SGLang before v0.4 (scheduler not overlapped with the GPU): the v0.4 zero-overhead "
               "batch scheduler gave '1.1x increase in throughput' (LMSYS blog 2024-12-04), i.e. the "
               "GPU waited 1 - 1/1.1 = 9% of the time; other defaults as sglang"),
    "sglang": EngineProfile(
        name="sglang", iteration_overhead_s=0.0, max_seqs=None, max_batch_tokens=8192,
        chunked_prefill=True, mixed_batches=False, prefix_caching=True, kv_block_size=1,
        memory_fraction=0.88, memory_fraction_of="total", admission="optimistic",
        kv_follows_quantization=False,
        source="SGLang server arguments (chunked_prefill_size 8192, page_size 1, mixed chunk off, "
               "radix cache on, mem_fraction_static ~0.88), https://docs.sglang.ai/backend/server_arguments.html; "
               "zero-overhead batch scheduler (LMSYS blog 2024-12-04 'SGLang v0.4')"),
}


def engine_profile(name: str) -> EngineProfile:
    try:
        return ENGINES[name]
    except KeyError:
        from ..catalog import suggest

        raise ConfigError(f"unknown serving engine {name!r}{suggest(name, tuple(ENGINES))}") from None


def auto_limits(kv_capacity_tokens: float, prompt_len: float, output_len: float, *,
                chunked_prefill: bool = True, max_prompt_len: float | None = None, pp: int = 1) -> tuple[int, int]:
    """(max_seqs, max_batch_tokens) sized to the KV cache, as trtllm-bench does.

    Batch limit = requests whose whole sequence fits the KV cache, capped at 4096, divided by the
    pipeline stages and rounded up to a multiple of 32/128/256; token budget = batch x (1 + ISL/OSL),
    at least 2048, at most 32768 (tensorrt_llm/bench/build/tuning.py, ``finetune_setting``). Without
    chunked prefill the budget is raised to hold the longest prompt next to a full batch of decodes,
    max ISL + batch (tensorrt_llm/bench/benchmark/utils/general.py, ``get_settings``). Rules restated,
    not copied.
    """
    raw_bs = min(kv_capacity_tokens / max(1.0, prompt_len + output_len), 4096.0) / max(1, pp)
    if raw_bs < 256:
        bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        bs = 128 * math.ceil(raw_bs / 128)
    else:
        bs = 256 * math.ceil(raw_bs / 256)
    raw_tok = min(raw_bs * (1.0 + prompt_len / max(1.0, output_len)), 32768.0)
    if raw_tok < 4096:
        tok = max(2048, 256 * math.ceil(raw_tok / 256))
    elif raw_tok < 8192:
        tok = 512 * math.ceil(raw_tok / 512)
    else:
        tok = 1024 * math.ceil(raw_tok / 1024)
    if not chunked_prefill:
        tok = max(tok, math.ceil(max_prompt_len or prompt_len) + bs)
    return int(bs), int(tok)


#: bytes per element trtllm-bench's estimate gives a checkpoint's weights and KV cache by their quant algo
#: (tensorrt_llm/bench/build/tuning.py ``BYTES_PER_ELEM``: FP8 and FP8_BLOCK_SCALES 1, NVFP4 0.5, anything else 2)
_BENCH_BYTES = {"fp8": 1.0, "fp4": 0.5}
#: tensor elements a checkpoint stores per weight: NVFP4 packs two 4-bit values per uint8 element and adds one FP8
#: scale per 16 (ModelOpt's export; NVIDIA developer blog 'Introducing NVFP4', block 16); FP8 one per weight
_CHECKPOINT_ELEMENTS = {"fp4": 0.5 + 1 / 16}


def trtllm_bench_kv_tokens(model: Any, *, precision: str, kv_dtype: str, tp: int, pp: int, device_bytes: float,
                           memory_fraction: float, attention_precision: str | None = None) -> float:
    """KV-cache tokens trtllm-bench's heuristic believes ``tp x pp`` GPUs hold (``calc_engine_setting``).

    It estimates from the checkpoint, not the runtime: total memory ``tp * pp * device`` less the engine size
    (the checkpoint's safetensors element count times the quant algo's bytes), times the KV memory fraction, over
    ``2 * layers * max(tp, kv_heads) * head_size`` bytes per token -- every GPU of the TP group holding at least one
    KV head, as if attention were tensor-parallel, which is what it assumes even when attention DP later runs
    (tensorrt_llm/bench/build/tuning.py, NVIDIA/TensorRT-LLM@04cba88208; ``param_count`` is the sum of the
    safetensors header's tensor sizes, bench/build/dataclasses.py @89fd9b74ab; the GPU's memory is
    ``get_device_memory()``, the device's total). Its batch limit then holds per attention-DP rank
    (:attr:`EngineProfile.limits_per_rank`). MLA models (DeepSeek-V3's config.json: num_key_value_heads 128, no
    head_dim, so ``head_size`` = hidden / heads): the heads formula is applied as it reads that config, though their
    real KV per token is the latent."""
    total, _ = model.param_counts(include_mtp=True)
    emb = model.embedding_params()
    a_prec = attention_precision or precision
    per = _CHECKPOINT_ELEMENTS.get(precision, 1.0)
    attn = model.layers * model.attention_params()
    elements = emb + (total - emb - attn) * per + attn * _CHECKPOINT_ELEMENTS.get(a_prec, 1.0)
    engine = elements * _BENCH_BYTES.get(precision, 2.0)
    heads = max(tp, model.kv_heads)
    head = model.head_dim
    if model.attention == "mla" and model.mla is not None:
        heads, head = max(tp, model.heads), model.hidden // model.heads
    per_token = 2.0 * model.layers * heads * head * _BENCH_BYTES.get(kv_dtype, 2.0)
    cache = (tp * pp * device_bytes - engine) * memory_fraction
    return max(0.0, cache / per_token)


# ----------------------------------------------------------------------------------------------
# communication


CollectiveFn = Callable[..., float]   # (op, bytes, group size, per_node=None) -> seconds


def fabric_collective(instance: Any) -> CollectiveFn:
    """``(op, size, group, per_node=None) -> seconds`` from the fabric model on ``instance``.

    Ops and size conventions are those of :func:`fmsim.hardware.collectives.collective_time`
    (nccl-tests). ``per_node`` defaults to packing the group into as few nodes as possible. Each
    (op, group, per_node) is sampled once on a log grid of sizes and interpolated linearly in size
    (collective costs are piecewise alpha-beta, so interpolation between close sizes is tight).
    """
    from ..hardware.collectives import GroupShape, collective_time

    grid = np.array([2.0 ** k for k in range(6, 36)])
    tables: dict[tuple[str, int, int], np.ndarray] = {}

    def fn(op: str, size: float, group: int, per_node: int | None = None) -> float:
        if size <= 0 or group <= 1:
            return 0.0
        pn = per_node or min(group, instance.num_accelerators)
        key = (op, group, pn)
        t = tables.get(key)
        if t is None:
            shape = GroupShape(size=group, per_node=pn)
            t = np.array([collective_time(op, float(x), instance, shape).time_s for x in grid])
            tables[key] = t
        if size >= grid[-1]:
            slope = (t[-1] - t[-2]) / (grid[-1] - grid[-2])
            return float(t[-1] + slope * (size - grid[-1]))
        return float(np.interp(size, grid, t))

    return fn


def transfer_time(size_bytes: float, instance: Any, *, same_node: bool, streams: int = 1,
                  collective: CollectiveFn | None = None) -> float:
    """Point-to-point copy of ``size_bytes`` split over ``streams`` GPU pairs working in parallel.

    One ``send-recv`` of the fabric model per pair (scale-up link inside a node; the pair's share
    of the scale-out NICs between nodes); the pairs use disjoint links, so the time is one pair's.
    """
    if size_bytes <= 0:
        return 0.0
    fn = collective or fabric_collective(instance)
    return fn("send-recv", size_bytes / max(1, streams), 2, 2 if same_node else 1)


# ----------------------------------------------------------------------------------------------
# the cost model


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationWork:
    """Aggregate sums describing one engine iteration (all counts over the whole engine batch)."""

    tokens: int = 0                 # tokens through the linear layers (prefill chunk tokens + decodes)
    logits: int = 0                 # rows through the LM head (decodes + prefills finishing)
    decode_seqs: int = 0
    decode_ctx: float = 0.0         # sum of decode sequences' context lengths
    prefill_pairs: float = 0.0      # causal (query, key) pairs of prefill chunks: sum c*(p + (c+1)/2)
    prefill_kv_reads: float = 0.0   # context tokens whose K/V prefill attention reads (once per chunk)
    #: With data-parallel attention each rank runs its own sequences through attention and the non-expert layers,
    #: and the MoE layers' collectives hold every rank to the slowest: "the execution time for the Attention module
    #: in any given iteration is bounded by the rank with the highest workload" (TensorRT-LLM tech blog 10, "ADP
    #: Balance Strategy", NVIDIA/TensorRT-LLM@011cfc2c docs/source/blogs/tech_blog/blog10_ADP_Balance_Strategy.md).
    #: The busiest rank's tokens, logits, prefill pairs and prefill K/V reads, each times the number of ranks (the
    #: engine total an evenly spread batch with that rank's load would have); ``None``: the batch spread evenly.
    rank_tokens: float | None = None
    rank_logits: float | None = None
    rank_prefill_pairs: float | None = None
    rank_prefill_kv_reads: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingCostModel:
    """Coefficients of one engine's iteration time; build with :func:`build_cost_model`.

    All byte and FLOP coefficients are per GPU of the engine (the slowest, symmetric GPU sets
    the pace); times are seconds.
    """

    model_name: str
    engine_gpus: int
    tp: int
    pp: int
    attention_dp: bool
    precision: str
    kv_dtype: str
    gemm_flop_per_s: float          # weights precision
    attn_flop_per_s: float          # bf16 attention math
    lm_flop_per_s: float            # bf16 LM head
    hbm_bytes_per_s: float          # achievable
    dense_weight_bytes: float       # non-expert layer weights read per iteration, per GPU
    dense_flop_per_token: float
    expert_weight_bytes: float      # all routed experts' weights on one GPU
    elementwise_bytes_per_token: float  # norms, residual adds, RoPE, activation function (per GPU)
    expert_flop_per_token: float
    num_experts: int
    top_k: int
    lm_weight_bytes: float
    lm_flop_per_logit: float
    kv_read_bytes_per_ctx: float    # bytes read per GPU per decode context token
    kv_write_bytes_per_token: float
    attn_flop_per_pair_decode: float
    attn_flop_per_pair_prefill: float
    kv_bytes_per_token_per_gpu: float   # stored KV per token on each GPU that holds it
    kv_bytes_per_token_total: float     # one copy of a token's KV over all layers (what a hand-off moves)
    kv_tokens_split: int            # attention groups among which an engine's tokens are split
    weight_bytes_per_gpu: float     # resident weights per GPU (this stage)
    layers: int
    hidden: int
    num_all_reduce: int             # per iteration
    num_all_to_all: int             # per iteration (each dispatch or combine)
    dp_groups: int                  # data-parallel attention groups in the engine (1 = plain TP)
    pp_same_node: bool              # pipeline stages inside one node (NVLink hops) or across nodes
    overhead_s: float
    kernel_fixed_s: float = 0.0     # fixed kernel costs of one iteration (all layers)
    #: kernels the MoE layers add when the op's rows pass ``moe_sort_fused_max_rows`` (CUTLASS's three-step sort;
    #: 0: none), each at ``moe_kernel_s``
    moe_sort_fused_max_rows: int = 0
    moe_unfused_sort_kernels: int = 0
    moe_kernel_s: float = 0.0
    dense_gemm_eff: float = 1.0     # K-depth efficiency of the non-expert GEMMs (gemm_k_efficiency)
    expert_gemm_eff: float = 1.0
    lm_gemm_eff: float = 1.0
    cpu_overhead_fraction: float = 0.0
    #: local attention (``ModelSpec.window``): the share of the layers that attend to at most
    #: ``window`` keys (sliding; 0: none) -- their attention reads and math stop growing with context
    window: int = 0
    window_share: float = 0.0
    graph_batch_sizes: tuple[int, ...] = ()
    graphs_per_rank: bool = False   # each data-parallel attention rank runs its own padded graph
    # shape efficiency of the linear layers at the batch's row count (kernels.gemm_efficiency: tiles,
    # waves, split-K): (FLOPs share, K, N on one GPU) of each non-expert GEMM family and their K0, the
    # LM head's N and K0 (its K is ``hidden``), and the SMs (0: no wave model)
    dense_gemm_shapes: tuple[tuple[float, float, float], ...] = ()
    dense_k0: float = 0.0
    lm_n: float = 0.0
    lm_k0: float = 0.0
    compute_units: int = 0
    #: routed experts as grouped GEMMs (kernels.grouped_gemm_efficiency): (FLOPs share, K, N) of one
    #: expert's gate-up and down GEMMs on one GPU, and the experts each GPU holds (0: depth only)
    expert_gemm_shapes: tuple[tuple[float, float, float], ...] = ()
    local_experts: int = 0
    #: the engine's fused MoE op against the grouped-GEMM model (the catalog's ``moe_op`` for the precision)
    moe_op_fraction: float = 1.0
    #: the part of ``elementwise_bytes_per_token`` each attention rank spends on its own tokens (norms, RoPE,
    #: activation; not the token permutation around the experts, which sees the whole engine's tokens)
    rank_elementwise_bytes_per_token: float = 0.0
    #: MoE token exchange of an attention-DP engine (EngineProfile.moe_comm) and the bytes per element of the
    #: tokens it gathers (the experts' activation precision: 1 for fp8, 0.5625 for nvfp4, 2 for 16-bit)
    moe_comm: str = "all-to-all"
    moe_gather_bytes: float = ACT_BYTES
    #: DeepEP's exchange (``serving.deepep``, fmsim.model.deepep): mode, the nodes the engine spans, and
    #: (tokens per rank, EP size) -> one MoE layer's (dispatch, combine) seconds through DeepEP's measured kernels
    #: (fmsim.model.deepep.layer_times_fn; None: priced by ``collective``, a test's function, or not at all)
    deepep: str = "none"
    ep_nodes: int = 1
    deepep_layer: Callable[[float, int], tuple[float, float]] | None = field(default=None, compare=False, hash=False,
                                                                             repr=False)
    #: a test's ``collective`` function prices DeepEP's byte counts instead: the model's router groups and
    #: whether the dispatch is fp8 (exchange_sizes)
    router_groups: int = 1
    router_group_topk: int = 0
    deepep_fp8_dispatch: bool = True
    #: the fused MoE op's workspace per expanded row (top-k x its rows; :func:`cutlass_moe_workspace_per_row`; 0: the
    #: generic MoE, whose workspace the memory model leaves to the activation buffers)
    moe_workspace_bytes_per_row: float = 0.0
    #: SGLang's two-batch overlap (``serving.two_batch_overlap``, fmsim.model.tbo): the MoE layers run as two
    #: micro-batches whose DeepEP exchange hides behind the other's compute; the MoE layers' share of the
    #: non-expert GEMM time and of it the shared experts', their fixed kernel seconds, the SMs DeepEP's normal
    #: kernels hold meanwhile, and the context a decode sequence has when its step is linearised (decode_coeffs)
    two_batch_overlap: bool = False
    #: the busiest expert-parallel rank's routed rows over the mean (``workload.moe_imbalance``; 1: balanced): every
    #: rank meets the others at the combine, so that rank's routed grouped GEMMs, the permutes and activation around
    #: them (``routed_elementwise_bytes_per_token``) and its DeepEP / all-to-all receive (dispatch) and send (combine)
    #: bytes set the MoE layers' pace; attention, the dense layers and the shared experts keep their own rows
    moe_imbalance: float = 1.0
    routed_elementwise_bytes_per_token: float = 0.0
    moe_layer_dense_share: float = 0.0
    moe_layer_shared_share: float = 0.0
    moe_layer_kernel_s: float = 0.0
    tbo_decode_context: float = 0.0
    overlap_clock_ratio: float = 1.0    # the core clock while communication overlaps compute (catalog overlap_clock)
    collective: CollectiveFn | None = field(default=None, compare=False, hash=False, repr=False)
    _eff_cache: dict[int, float] = field(default_factory=dict, compare=False, hash=False, repr=False)
    _expert_eff_cache: dict[int, float] = field(default_factory=dict, compare=False, hash=False, repr=False)

    # -- pieces ---------------------------------------------------------------------------
    def _touched_fraction(self, tokens: float) -> float:
        # Expected share of E experts hit when each of T tokens picks k distinct experts uniformly:
        # 1 - (1 - k/E)^T (balls-into-bins occupancy; uniform routing is the load-balanced limit). The busiest
        # rank's experts each draw ``moe_imbalance`` times that chance (kernels.routed_grouped_gemm_efficiency's
        # ``load``, the same draw its GEMMs are priced over).
        if self.num_experts == 0 or tokens <= 0:
            return 0.0
        p = self.top_k / self.num_experts
        if self.moe_imbalance != 1.0:
            p = min(1.0, p * self.moe_imbalance)
        return 1.0 - (1.0 - p) ** tokens

    def comm_time(self, tokens: float) -> float:
        """TP all-reduces, EP all-to-alls and pipeline hops of one iteration with ``tokens``."""
        if tokens <= 0:
            return 0.0
        t = 0.0
        if self.collective is not None:
            if self.num_all_reduce:
                # each attention group all-reduces its own tokens' activations (Megatron-LM TP)
                size = tokens / self.dp_groups * self.hidden * ACT_BYTES
                t += self.num_all_reduce * self.collective("all-reduce", size, self.tp)
            if self.num_all_to_all:
                group = self.engine_gpus // self.pp
                if self.deepep != "none":
                    t += self._deepep_time(tokens, group)
                elif self.moe_comm == "allgather":
                    # per MoE layer: all-gather every rank's quantized tokens with their top-k ids (int32) and
                    # weights (fp32), then reduce-scatter the 16-bit outputs (nccl-tests sizes: the totals)
                    layers = self.num_all_to_all // 2
                    gathered = tokens * (self.hidden * self.moe_gather_bytes + self.top_k * 8)
                    t += layers * (self.collective("all-gather", gathered, group)
                                   + self.collective("reduce-scatter", tokens * self.hidden * ACT_BYTES, group))
                else:
                    # dispatch / combine: every GPU sends its tokens' top-k hidden states; the busiest rank receives
                    # (dispatch) and sends back (combine) moe_imbalance times the mean, and every rank waits for it
                    size = tokens / self.engine_gpus * self.pp * self.top_k * self.hidden * ACT_BYTES
                    if self.moe_imbalance != 1.0:
                        size *= self.moe_imbalance
                    t += self.num_all_to_all * self.collective("all-to-all", size, group)
            if self.pp > 1:
                # activations cross each stage boundary; every rank sends its shard to its peer
                size = tokens * self.hidden * ACT_BYTES / (self.engine_gpus // self.pp)
                t += (self.pp - 1) * self.collective("send-recv", size, 2, 2 if self.pp_same_node else 1)
        return t

    def _deepep_time(self, tokens: float, group: int) -> float:
        """DeepEP's dispatch and combine over the MoE layers: its measured kernels (fmsim.model.deepep.layer_time_fn),
        or, under a test's ``collective`` function, its byte counts through that function's all-to-all."""
        return self.num_all_to_all // 2 * sum(self.deepep_parts(tokens / group))

    def deepep_parts(self, tokens_per_rank: float) -> tuple[float, float]:
        """One MoE layer's DeepEP (dispatch, combine) seconds at ``tokens_per_rank``: its measured kernels
        (fmsim.model.deepep.layer_times_fn), or its byte counts through a test's ``collective`` all-to-all; both with
        the busiest rank's bytes (``moe_imbalance``, deepep.exchange_sizes's ``load``)."""
        group = self.engine_gpus // self.pp
        if self.deepep_layer is not None:
            return self.deepep_layer(tokens_per_rank, group)
        if self.collective is None or tokens_per_rank <= 0:
            return 0.0, 0.0
        dispatch, combine = exchange_sizes(self.deepep, tokens_per_rank=tokens_per_rank, hidden=self.hidden,
                                           top_k=self.top_k, nodes=self.ep_nodes, groups=self.router_groups,
                                           group_topk=self.router_group_topk, fp8_dispatch=self.deepep_fp8_dispatch,
                                           load=self.moe_imbalance)
        fn = self.collective
        return fn("all-to-all", dispatch, group), fn("all-to-all", combine, group)

    def dense_efficiency(self, tokens: float) -> float:
        """Compute efficiency of the non-expert GEMMs for a batch of ``tokens``: K depth and, on
        GPUs, the tiles, waves and split-K of each GEMM's (tokens per attention group) × N output."""
        if not self.compute_units or not self.dense_gemm_shapes:
            return self.dense_gemm_eff
        m = max(1, math.ceil(tokens / self.dp_groups))
        e = self._eff_cache.get(m)
        if e is None:
            e = 1.0 / sum(share / gemm_efficiency(m, n, k, self.compute_units, self.dense_k0)
                          for share, k, n in self.dense_gemm_shapes)
            self._eff_cache[m] = e
        return e

    def expert_efficiency(self, tokens: float) -> float:
        """Compute efficiency of the routed experts for a batch of ``tokens``: each GPU's experts run as
        one fused grouped GEMM (the serving engines' MoE kernels), each expert over the rows routing
        sends it -- ``Binomial(tokens, k / E)`` under uniform routing, cut into whole row tiles of its own,
        an expert that draws none launching no tile (kernels.routed_grouped_gemm_efficiency). The busiest
        expert-parallel rank's experts (``moe_imbalance``) draw ``Binomial(tokens, load k / E)``: its GEMMs at their
        larger rows."""
        if not self.compute_units or not self.expert_gemm_shapes or not self.local_experts:
            return self.expert_gemm_eff
        t = max(1, math.ceil(tokens))
        e = self._expert_eff_cache.get(t)
        if e is None:
            e = self.moe_op_fraction / sum(
                share / routed_grouped_gemm_efficiency(t, self.top_k, self.num_experts, self.local_experts, n, k,
                                                       self.compute_units, self.dense_k0, load=self.moe_imbalance)
                for share, k, n in self.expert_gemm_shapes)
            self._expert_eff_cache[t] = e
        return e

    def linear_time(self, tokens: float, logits: float, rank_tokens: float | None = None,
                    rank_logits: float | None = None) -> float:
        """Dense layers, routed experts and LM head, each a roofline (Williams et al., CACM 2009).

        ``rank_tokens`` / ``rank_logits`` (data-parallel attention): the busiest attention rank's load as engine
        equivalents (:class:`IterationWork`); its non-expert layers and LM head set the pace, the routed experts
        see every rank's tokens."""
        if tokens <= 0:
            return 0.0
        return sum(self.linear_pieces(tokens, logits, rank_tokens, rank_logits))

    def linear_pieces(self, tokens: float, logits: float, rank_tokens: float | None = None,
                      rank_logits: float | None = None) -> tuple[float, float, float, float]:
        """:meth:`linear_time`'s parts (seconds): non-expert GEMMs, element-wise passes, routed experts, LM head."""
        lt = tokens if rank_tokens is None else max(tokens, rank_tokens)
        ll = logits if rank_logits is None else max(logits, rank_logits)
        f, b = self.gemm_flop_per_s, self.hbm_bytes_per_s
        dense = max(self.dense_flop_per_token * lt / (f * self.dense_efficiency(lt)), self.dense_weight_bytes / b)
        elem = (self.elementwise_bytes_per_token * tokens + self.rank_elementwise_bytes_per_token * (lt - tokens)) / b
        experts = lm = 0.0
        if self.num_experts:
            routed = self.expert_flop_per_token * tokens
            if self.moe_imbalance != 1.0:
                # the busiest rank's routed rows: its grouped GEMMs and the permutes and activation around them
                routed *= self.moe_imbalance
                elem += self.routed_elementwise_bytes_per_token * (self.moe_imbalance - 1.0) * tokens / b
            experts = max(routed / (f * self.expert_efficiency(tokens)),
                          self.expert_weight_bytes * self._touched_fraction(tokens) / b)
        if ll > 0:
            lm_eff = (gemm_efficiency(math.ceil(ll / self.dp_groups), self.lm_n, self.hidden, self.compute_units,
                                      self.lm_k0) if self.lm_n else self.lm_gemm_eff)
            lm = max(self.lm_flop_per_logit * ll / (self.lm_flop_per_s * lm_eff), self.lm_weight_bytes / b)
        return dense, elem, experts, lm

    def kernel_time(self, tokens: float) -> float:
        """Fixed kernel costs of an iteration whose linear layers see ``tokens`` rows (the MoE op takes all of them:
        every GPU's experts see every token under TP, and the all-gathered ones under attention DP)."""
        t = self.kernel_fixed_s
        if self.moe_sort_fused_max_rows and tokens > self.moe_sort_fused_max_rows:
            t += self.moe_unfused_sort_kernels * self.moe_kernel_s
        return t

    def _prefill_attention(self, w: IterationWork) -> float:
        pairs = w.prefill_pairs if w.rank_prefill_pairs is None else max(w.prefill_pairs, w.rank_prefill_pairs)
        reads = w.prefill_kv_reads if w.rank_prefill_kv_reads is None else max(w.prefill_kv_reads,
                                                                               w.rank_prefill_kv_reads)
        if pairs <= 0:
            return 0.0
        return max(self.attn_flop_per_pair_prefill * pairs / self.attn_flop_per_s,
                   self.kv_read_bytes_per_ctx * reads / self.hbm_bytes_per_s)

    def _gpu_time(self, w: IterationWork, padded_tokens: int | None = None) -> float:
        if self.two_batch_overlap and self.deepep != "none" and (w.prefill_pairs <= 0 or self.deepep == "normal"):
            # SGLang's two-batch overlap (fmsim.model.tbo); no TBO for an extend batch under low-latency DeepEP
            return tbo_gpu_time(self, w, padded_tokens)
        return self._serial_gpu_time(w, padded_tokens)

    def _serial_gpu_time(self, w: IterationWork, padded_tokens: int | None = None) -> float:
        tok = w.tokens if padded_tokens is None else padded_tokens
        return sum(self.compute_pieces(w, padded_tokens)) + self.comm_time(tok) + self.kernel_time(tok)

    def compute_pieces(self, w: IterationWork, padded_tokens: float | None = None) -> tuple[float, ...]:
        """The compute of an iteration doing ``w`` (seconds): :meth:`linear_pieces` (non-expert GEMMs, element-wise,
        routed experts, LM head), then attention and the KV writes."""
        b = self.hbm_bytes_per_s
        if padded_tokens is None:
            lin = self.linear_pieces(w.tokens, w.logits, w.rank_tokens, w.rank_logits) if w.tokens > 0 else (0.0,) * 4
        else:
            lin = self.linear_pieces(padded_tokens, padded_tokens)
        attn = self._prefill_attention(w)
        if w.decode_ctx > 0:
            attn += max(self.attn_flop_per_pair_decode * w.decode_ctx / self.attn_flop_per_s,
                        self.kv_read_bytes_per_ctx * w.decode_ctx / b)
        written = w.tokens if w.rank_tokens is None else max(w.tokens, w.rank_tokens)
        return (*lin, attn, self.kv_write_bytes_per_token * written / b)

    def _wall(self, gpu_s: float) -> float:
        # an engine whose CPU work is not overlapped keeps the GPU idle a fixed share of the time
        return gpu_s / (1.0 - self.cpu_overhead_fraction) + self.overhead_s

    def iteration_time(self, w: IterationWork) -> float:
        """Seconds of one engine iteration doing ``w``."""
        if w.tokens <= 0:
            return 0.0
        return self._wall(self._gpu_time(w))

    def breakdown(self, w: IterationWork) -> dict[str, float]:
        """The parts of :meth:`iteration_time` (seconds), for reports."""
        b = self.hbm_bytes_per_s
        dec = max(self.attn_flop_per_pair_decode * w.decode_ctx / self.attn_flop_per_s,
                  self.kv_read_bytes_per_ctx * w.decode_ctx / b) if w.decode_ctx else 0.0
        pre = self._prefill_attention(w)
        gpu = self._gpu_time(w)
        written = w.tokens if w.rank_tokens is None else max(w.tokens, w.rank_tokens)
        return {"linear_s": self.linear_time(w.tokens, w.logits, w.rank_tokens, w.rank_logits),
                "attention_decode_s": dec,
                "attention_prefill_s": pre, "kv_write_s": self.kv_write_bytes_per_token * written / b,
                "communication_s": self.comm_time(w.tokens), "kernel_fixed_s": self.kernel_time(w.tokens),
                "overhead_s": self._wall(gpu) - gpu}

    def effective_context(self, ctx: Any) -> float:
        """Decode context summed over sequences (``ctx``: one length or an array of them) as the
        attention sees it: full layers the whole context, local layers at most ``window`` keys."""
        if not self.window_share:
            return float(np.sum(ctx))
        return float(np.sum(windowed_tokens(ctx, ctx, self.window_share, self.window)))

    def context_growth(self, ctx: Any) -> float:
        """How much :meth:`effective_context` grows when each sequence gains one token."""
        n = float(np.size(ctx))
        if not self.window_share:
            return n
        growing = float(np.count_nonzero(np.asarray(ctx) < self.window))
        return (1.0 - self.window_share) * n + self.window_share * growing

    def prefill_pairs(self, chunk: int, past: int) -> float:
        """(query, key) pairs of a prefill chunk: causal on full layers, capped by the window on
        local ones (:func:`window_pairs`)."""
        full = causal_pairs(chunk, past)
        if not self.window_share:
            return full
        return (1.0 - self.window_share) * full + self.window_share * window_pairs(chunk, past, self.window)

    def prefill_work(self, chunk: int, past: int, *, finishing: bool) -> IterationWork:
        """Work of one prefill chunk of ``chunk`` new tokens after ``past`` tokens already in KV."""
        return IterationWork(tokens=chunk, logits=1 if finishing else 0,
                             prefill_pairs=self.prefill_pairs(chunk, past),
                             prefill_kv_reads=kv_stream_tokens(chunk, past))

    def padded(self, n: int) -> int:
        """Decode batch size as the engine runs it: padded up to the next CUDA-graph size, if any
        (with ``graphs_per_rank``, each attention rank pads its own share of the batch)."""
        ranks = self.dp_groups if self.graphs_per_rank else 1
        per = math.ceil(n / ranks)
        for g in self.graph_batch_sizes:
            if g >= per:
                return g * ranks
        return n

    def decode_coeffs(self, n: int) -> tuple[float, float]:
        """(c0, c1): a decode-only iteration of ``n`` sequences takes ``c0 + c1 * sum(context)``.

        Linear layers and collectives run the padded batch (CUDA-graph engines replay a graph
        captured for the next larger size; padding rows attend to nothing).
        """
        w = IterationWork(tokens=n, logits=n, decode_seqs=n, decode_ctx=0.0)
        if self.two_batch_overlap and self.deepep != "none":
            g0, g1 = tbo_decode_coeffs(self, w, self.padded(n))    # the overlapped step, linearised (tbo)
        else:
            g0 = self._gpu_time(w, padded_tokens=self.padded(n))
            g1 = max(self.attn_flop_per_pair_decode / self.attn_flop_per_s,
                     self.kv_read_bytes_per_ctx / self.hbm_bytes_per_s)
        scale = 1.0 / (1.0 - self.cpu_overhead_fraction)
        return g0 * scale + self.overhead_s, g1 * scale

    def prefill_time(self, prompt: int, cached: int = 0) -> float:
        """One prompt alone: its uncached tokens in one iteration (no decodes)."""
        new = max(1, prompt - cached)
        return self.iteration_time(self.prefill_work(new, cached, finishing=True))

    # -- memory ---------------------------------------------------------------------------
    def activation_bytes(self, max_batch_tokens: int, max_seqs: int, model: Any, *, logits: bool = True) -> float:
        """Activation workspace per GPU for the engine's largest iteration.

        A few hidden-size buffers plus the MLP intermediate per token (bf16), and fp32 logits for
        every sequence -- the buffers TensorRT-LLM and vLLM size from max tokens / max sequences.
        With data-parallel attention each GPU holds its own rank's tokens and sequences (the engine's
        limits over its ``dp_groups``); an all-gather MoE exchange adds, per GPU, the gathered tokens of every
        rank (quantized) and the op's 16-bit output for each before the reduce-scatter; a fused CUTLASS MoE adds its
        workspace (:func:`cutlass_moe_workspace_per_row`). ``logits=False``: the memory an engine's KV sizing
        profiles holds no decode batch's logits (:attr:`EngineProfile.sizing_counts_logits`).
        """
        split = self.tp
        ffn = model.ffn_hidden if model.moe is None else max(model.ffn_hidden, model.moe.expert_ffn_hidden)
        per_token = (4 * model.hidden + 3 * ffn / split) * ACT_BYTES
        g = self.dp_groups
        act = max_batch_tokens / g * per_token + (max_seqs / g * model.vocab / split * LOGIT_BYTES if logits else 0.0)
        if g > 1 and self.moe_comm == "allgather":
            act += max_batch_tokens * model.hidden * (self.moe_gather_bytes + ACT_BYTES)
        if self.moe_workspace_bytes_per_row and model.moe is not None:
            # the fused MoE op over every token it takes at the profiling forward of max_num_tokens per rank: the
            # whole engine's tokens under TP or an all-gather exchange (TensorRT-LLM does not chunk them: its
            # moe_max_num_tokens defaults to max_num_tokens x the attention-DP size, fused_moe_cutlass.py), else
            # the rank's own
            rows = max_batch_tokens if (g == 1 or self.moe_comm == "allgather") else max_batch_tokens / g
            act += self.top_k * rows * self.moe_workspace_bytes_per_row
        return act

    def kv_capacity_tokens(self, *, hbm_bytes: float, memory_fraction: float, fraction_of: str,
                           activation_bytes: float) -> int:
        """Tokens of KV cache one engine holds (every GPU holding its slice or its sequences)."""
        usable = hbm_bytes - RUNTIME_RESERVE_BYTES
        if fraction_of == "free":
            kv = memory_fraction * (usable - self.weight_bytes_per_gpu - activation_bytes)
        else:
            kv = memory_fraction * usable - self.weight_bytes_per_gpu - activation_bytes
        if kv <= 0:
            raise OutOfMemoryError(
                f"{self.model_name} in {self.precision} needs {format_bytes(self.weight_bytes_per_gpu)} of "
                f"weights per GPU (tp={self.tp}, pp={self.pp}); with {format_bytes(activation_bytes)} of "
                f"activations nothing is left for the KV cache in {format_bytes(hbm_bytes)} x "
                f"{memory_fraction:g} -- raise tp/pp or lower the precision",
                breakdown={"weights": self.weight_bytes_per_gpu, "activations": activation_bytes,
                           "hbm": hbm_bytes})
        return int(kv / self.kv_bytes_per_token_per_gpu) * self.kv_tokens_split


def windowed_tokens(full: Any, local: Any, share: float, keep: float) -> Any:
    """Tokens as a model with local-attention layers counts them: ``full`` on its full-attention
    layers, ``local`` capped at ``keep`` on its ``share`` of local ones (scalars or arrays)."""
    return (1.0 - share) * np.asarray(full, dtype=float) + share * np.minimum(local, keep)


def kv_stream_tokens(chunk: int, past: int) -> float:
    """Context tokens whose K/V a prefill chunk reads from HBM: its whole context, once.

    FlashAttention re-reads K/V blocks for every query tile (Dao 2023, Algorithm 1), but those
    re-reads hit L2: FlashAttention-3 runs long causal prefills compute-bound at 600-740 TFLOP/s
    bf16 on H100 (Shah et al. 2024, Fig. 5), so HBM sees each context token about once per chunk.
    """
    return float(past + chunk)


def build_cost_model(model: Any, instance: Any, *, precision: str, kv_dtype: str, tp: int, pp: int = 1,
                     ep: int = 1, attention_dp: bool = False, overhead_s: float = 0.0,
                     collective: CollectiveFn | None | str = "fabric",
                     graph_batch_sizes: tuple[int, ...] = (), cpu_overhead_fraction: float = 0.0,
                     kernel_fixed_s: float | None = None, moe_comm: str = "all-to-all",
                     attention_precision: str | None = None, moe_impl: str = "generic",
                     deepep: str = "none", two_batch_overlap: bool = False,
                     tbo_decode_context: float = 0.0, moe_imbalance: float = 1.0) -> ServingCostModel:
    """Derive a :class:`ServingCostModel` for one engine of ``model`` on ``instance``.

    Layout: without ``attention_dp`` an engine is ``tp`` GPUs sharding every layer (MoE experts
    included; ``ep`` changes where experts sit, not what each GPU reads). With ``attention_dp``
    and ``ep > 1`` it is ``tp * ep`` GPUs: ``ep`` attention groups of ``tp`` GPUs each serve their
    own sequences, and the routed experts are spread over all ``tp * ep`` GPUs, reached by
    all-to-all dispatch/combine (DeepSeek-V3 / SGLang / TensorRT-LLM "attention DP + EP").

    ``attention_precision``: the precision a quantized checkpoint keeps its attention projections in (NVIDIA's
    ModelOpt NVFP4 exports often leave ``self_attn`` at 16 bits); ``None``: ``precision``.

    ``moe_impl``: ``generic`` or ``cutlass`` (TensorRT-LLM's CUTLASS fused MoE: its extra kernels per MoE layer and
    the bytes of its input quantize and expert maps; CUTLASS_MOE_*).

    ``deepep``: ``none``, ``normal`` or ``low_latency`` -- the MoE exchange of an attention-DP engine as DeepEP's
    kernels run it (fmsim.model.deepep: per-node forwarding or pure RDMA, fp8 dispatch, priced by DeepEP's measured
    kernel tables, fmsim.hardware.dispatch).

    ``two_batch_overlap``: SGLang's two-batch overlap over the MoE layers (fmsim.model.tbo; needs ``deepep``);
    ``tbo_decode_context``: the context a decode sequence has where the overlapped step is linearised.

    ``moe_imbalance``: the busiest expert-parallel rank's routed rows over the mean (>= 1; ``workload.moe_imbalance``),
    for an engine whose experts spread over attention-DP ranks: that rank's routed expert GEMMs (at its larger rows,
    kernels.routed_grouped_gemm_efficiency's ``load``), the permutes and activation around them, and its dispatch
    receive and combine send bytes scale by it; attention, the dense layers and the shared experts do not.

    ``collective`` is ``"fabric"`` (the fabric model's ``collective_time``), a function
    ``(op, bytes, group) -> seconds``, or ``None`` (no communication cost; for tests).
    """
    acc = instance.accelerator
    if moe_comm not in ("all-to-all", "allgather"):
        raise ConfigError(f"moe_comm must be 'all-to-all' or 'allgather' (got {moe_comm!r}; DeepEP: deepep=...)")
    if moe_impl not in ("generic", "cutlass"):
        raise ConfigError(f"moe_impl must be 'generic' or 'cutlass' (got {moe_impl!r})")
    if deepep not in DEEPEP_MODES:
        raise ConfigError(f"deepep must be one of {', '.join(DEEPEP_MODES)} (got {deepep!r})")
    if two_batch_overlap and (deepep == "none" or not attention_dp or model.moe is None):
        raise ConfigError("two_batch_overlap needs a DeepEP exchange (deepep normal or low_latency, attention DP, "
                          "an MoE model): it overlaps one micro-batch's dispatch/combine with the other's compute")
    if tp < 1 or pp < 1 or ep < 1:
        raise ParallelismError(f"tp={tp}, pp={pp}, ep={ep} must all be >= 1")
    if pp > model.layers:
        raise ParallelismError(f"pp={pp} exceeds {model.layers} layers")
    if model.heads % tp:
        raise ParallelismError(f"tp={tp} does not divide {model.heads} attention heads")
    moe = model.moe
    groups = ep if (attention_dp and moe is not None) else 1
    gpus = tp * groups
    if not moe_imbalance >= 1.0:
        raise ConfigError(f"moe_imbalance must be >= 1 (got {moe_imbalance!r}): the busiest rank's load over the mean")
    if moe_imbalance != 1.0 and groups == 1:
        raise ConfigError(f"moe_imbalance {moe_imbalance:g} needs an MoE model with its experts spread over attention-DP "
                          "ranks (attention_dp, ep > 1): under plain TP every GPU holds a slice of every expert")
    if moe is not None and moe.experts % gpus and gpus % moe.experts:
        raise ParallelismError(f"{moe.experts} experts do not spread evenly over the engine's {gpus} GPUs")
    if precision not in BYTES_PER_ELEMENT:
        raise ConfigError(f"unknown precision {precision!r}")
    bw = BYTES_PER_ELEMENT[precision]
    bkv = BYTES_PER_ELEMENT[kv_dtype]

    L = model.layers
    n_moe = model.num_moe_layers if moe else 0
    n_dense = L - n_moe
    p_attn = model.attention_params()
    dense_ffn = (moe.dense_ffn_hidden if (moe and moe.dense_ffn_hidden) else model.ffn_hidden)
    p_mlp = model.mlp_params(dense_ffn)
    if moe:
        p_shared = moe.shared_experts * model.mlp_params(moe.shared_expert_ffn_hidden or moe.expert_ffn_hidden)
        p_router = model.hidden * moe.experts
        p_expert = model.mlp_params(moe.expert_ffn_hidden)
    else:
        p_shared = p_router = p_expert = 0
    # non-expert weights (attention, dense MLPs, shared experts, routers): TP-sharded inside an
    # attention group, replicated across groups; each GPU computes for its group's tokens
    p_nonexp = L * p_attn + n_dense * p_mlp + n_moe * (p_shared + p_router)
    # attention projections at their own precision when the checkpoint keeps them apart: their bytes as
    # stored, their FLOPs scaled to the weights precision's GEMM rate (rate-equivalent FLOPs)
    a_prec = attention_precision or precision
    if a_prec not in BYTES_PER_ELEMENT:
        raise ConfigError(f"unknown attention precision {a_prec!r}")
    p_attn_all = L * p_attn
    a_rate = acc.gemm_flop_per_s(precision) / acc.gemm_flop_per_s(a_prec) if a_prec != precision else 1.0
    dense_bytes = ((p_nonexp - p_attn_all) * bw + p_attn_all * BYTES_PER_ELEMENT[a_prec]) / tp
    dense_rate_params = p_nonexp - p_attn_all + p_attn_all * a_rate
    dense_flop = 2.0 * dense_rate_params / gpus
    # routed experts: spread over all the engine's GPUs; FLOPs follow the top-k tokens
    expert_bytes = n_moe * (moe.experts if moe else 0) * p_expert * bw / gpus
    expert_flop = 2.0 * n_moe * (moe.top_k if moe else 0) * p_expert / gpus
    # Element-wise passes over the activations, per token and layer (bf16 elements read + written):
    # two fused residual-add + RMSNorm (read x and residual, write both: 4h each), RoPE on the
    # local q and k heads (read + write), and the SwiGLU/GELU activation over the local MLP width
    # (read gate and up, write one: 3 x ffn; 2 x ffn ungated). Llama-style block structure
    # (Touvron et al. 2023, sec. 2.2); MoE layers apply it to the top-k experts' widths.
    qk_local = (model.heads + model.kv_heads) * model.head_dim / tp
    act_mult = 3 if model.gated else 2
    if moe:
        moe_ffn = moe.top_k * moe.expert_ffn_hidden + moe.shared_experts * (
            moe.shared_expert_ffn_hidden or moe.expert_ffn_hidden)
        ffn_local = (n_dense * dense_ffn / tp + n_moe * moe_ffn / gpus * groups) / L
    else:
        ffn_local = dense_ffn / tp
    elementwise = L * (8 * model.hidden + 2 * qk_local + act_mult * ffn_local) * ACT_BYTES / groups
    rank_elementwise = elementwise
    if moe:
        # token permutation around the grouped GEMMs (TensorRT-LLM's fused MoE: expandInputRowsKernel copies
        # each token once per chosen expert into expert order, finalizeMoeRoutingKernel reads the k expert
        # outputs back and writes their weighted sum; cpp/tensorrt_llm/kernels/mixtureOfExperts/moe_kernels.cu):
        # the rows a GPU's experts take -- all k copies under plain TP, its share with the experts spread --
        # are written and read once, and the token's own vector read and written once
        pair_rows = moe.top_k * (1.0 / gpus if groups > 1 else 1.0)
        # with an all-gather exchange the finalize kernel writes an output row for every gathered token (the
        # reduce-scatter sums them), not only for the rank's own
        own = 1.0 / groups
        elementwise += n_moe * (2 * pair_rows * model.hidden
                                + (own + (1.0 if (groups > 1 and moe_comm == "allgather") else own)) * model.hidden
                                ) * ACT_BYTES
    # the part of it that follows one rank's routed rows (its share of the permute copies and of the experts'
    # activation), which the busiest expert-parallel rank runs moe_imbalance times over
    routed_elementwise = (n_moe * (2 * moe.top_k / gpus * model.hidden + act_mult * moe.top_k * moe.expert_ffn_hidden
                                   / gpus) * ACT_BYTES if moe and groups > 1 else 0.0)
    cutlass = moe is not None and moe_impl == "cutlass"
    moe_quant = cutlass and precision in ("fp8", "fp4")
    if cutlass:
        # the expert maps over every row the op takes: the k int32 ids read, permuted_row_to_unpermuted_row and
        # unpermuted_row_to_permuted_row written (fusedBuildExpertMapsSortFirstTokenKernel)
        elementwise += n_moe * 3 * moe.top_k * INDEX_BYTES
    if moe_quant:
        # the input quantize runs over each rank's own tokens before any gather: 16-bit read, fp8 / nvfp4 written
        quant = n_moe * model.hidden * (ACT_BYTES + BYTES_PER_ELEMENT[precision]) / groups
        elementwise += quant
        rank_elementwise += quant

    # K-depth efficiency of each GEMM family (FLOPs share, K): column-parallel GEMMs keep K =
    # hidden, row-parallel ones (attention output, MLP down) run K / tp (Megatron-LM sharding)
    h = model.hidden
    if model.attention == "mla" and model.mla is not None:
        m = model.mla
        qk = m.qk_nope_dim + m.qk_rope_dim
        # (weights, K, N on one GPU): the latent down-projections are replicated over TP
        attn_gemms = [(h * (m.kv_lora_rank + m.qk_rope_dim), h, m.kv_lora_rank + m.qk_rope_dim),
                      (m.kv_lora_rank * model.heads * (m.qk_nope_dim + m.v_head_dim), m.kv_lora_rank,
                       model.heads * (m.qk_nope_dim + m.v_head_dim) / tp),
                      (model.heads * m.v_head_dim * h, model.heads * m.v_head_dim / tp, h)]
        attn_gemms += ([(h * m.q_lora_rank, h, m.q_lora_rank),
                        (m.q_lora_rank * model.heads * qk, m.q_lora_rank, model.heads * qk / tp)]
                       if m.q_lora_rank else [(h * model.heads * qk, h, model.heads * qk / tp)])
    else:
        d = model.head_dim
        qkv_width = (model.heads + 2 * model.kv_heads) * d
        attn_gemms = [(h * qkv_width, h, qkv_width / tp), (model.heads * d * h, model.heads * d / tp, h)]
    mlp_mult = 2 if model.gated else 1

    def _mlp(ffn: float, split: float, n: float) -> list[tuple[float, float, float]]:
        return [(n * mlp_mult * h * ffn, h, mlp_mult * ffn / split), (n * ffn * h, ffn / split, h)]

    k0 = chip_gemm_k0(acc, precision if precision in acc.peak_flop_per_s else "bf16")
    dense_gemms = [(L * f, k, n) for f, k, n in attn_gemms] + _mlp(dense_ffn, tp, n_dense)
    if moe:
        sh_ffn = moe.shared_expert_ffn_hidden or moe.expert_ffn_hidden
        dense_gemms += _mlp(sh_ffn, tp, n_moe * moe.shared_experts)
        expert_gemms = _mlp(moe.expert_ffn_hidden, 1 if groups > 1 else tp, n_moe)
        expert_eff = _flop_weighted_efficiency(expert_gemms, k0)
    else:
        expert_gemms = []
        expert_eff = 1.0
    dense_eff = _flop_weighted_efficiency(dense_gemms, k0)
    lm_k0 = chip_gemm_k0(acc, "bf16")

    # LM head kept in bf16 (quantization recipes leave it unquantized)
    lm_bytes = model.vocab * model.hidden * ACT_BYTES / tp
    lm_flop = 2.0 * model.vocab * model.hidden / gpus

    # KV cache per token. GQA/MHA: K and V of kv_heads heads per layer, heads split over TP
    # ranks (replicated when tp > kv_heads). MLA (DeepSeek-V2, Liu et al. 2024, eq. 9-10): one
    # compressed latent of kv_lora_rank plus the decoupled RoPE key, shared by all heads.
    if model.attention == "mla" and model.mla is not None:
        m = model.mla
        kv_per_gpu = L * (m.kv_lora_rank + m.qk_rope_dim) * bkv   # every TP rank keeps the full latent
        kv_total = kv_per_gpu
        # absorbed decode: scores over (kv_lora + rope) dims and values over kv_lora, all heads
        f_dec = 2.0 * L * model.heads * (2 * m.kv_lora_rank + m.qk_rope_dim)
        # prefill decompresses: q.k over (nope + rope) dims and p.v over v_head_dim
        f_pre = 2.0 * L * model.heads * (m.qk_nope_dim + m.qk_rope_dim + m.v_head_dim)
    else:
        kv_heads_gpu = max(1.0, model.kv_heads / tp)
        kv_per_gpu = 2.0 * L * kv_heads_gpu * model.head_dim * bkv
        kv_total = 2.0 * L * model.kv_heads * model.head_dim * bkv
        f_dec = f_pre = 4.0 * L * model.heads * model.head_dim   # QK^T and PV, 2 FLOPs per MAC
    # a batch's sequences are split over the attention groups; heads over a group's tp GPUs
    kv_read = kv_per_gpu / groups
    f_dec, f_pre = f_dec / gpus, f_pre / gpus

    # resident weights per GPU: this stage's layers plus the embedding / LM head at the ends
    layer_bytes = dense_bytes + expert_bytes
    embed = model.vocab * model.hidden * ACT_BYTES / tp
    ends = (embed if model.tied_embeddings else 2 * embed) if pp == 1 else embed
    weights_gpu = layer_bytes / pp + ends

    n_ar = 2 * L if tp > 1 else 0               # after attention and after the MLP (Megatron-LM)
    n_a2a = 2 * n_moe if groups > 1 else 0      # dispatch + combine per MoE layer
    if collective == "fabric":
        coll: CollectiveFn | None = fabric_collective(instance) if gpus * pp > 1 else None
    else:
        coll = collective  # type: ignore[assignment]

    # local attention: a sliding layer reads and scores at most `size` keys; a chunked one (Llama 4)
    # at most `size` too (exactly its context until the first chunk fills; half that on average after)
    n_local = sum(model.is_windowed_layer(i) for i in range(L))
    hbm = acc.hbm_bytes_per_s * acc.hbm_efficiency
    return ServingCostModel(
        model_name=model.name, engine_gpus=gpus * pp, tp=tp, pp=pp, attention_dp=groups > 1,
        precision=precision, kv_dtype=kv_dtype,
        gemm_flop_per_s=acc.gemm_flop_per_s(precision),
        # attention runs forward only, causal: the chip's forward figure where the catalog has one
        attn_flop_per_s=(acc.peak("bf16") * acc.attention_forward_efficiency if acc.attention_forward_efficiency
                         else acc.gemm_flop_per_s("bf16")),
        lm_flop_per_s=acc.gemm_flop_per_s("bf16"), hbm_bytes_per_s=hbm,
        dense_weight_bytes=dense_bytes, dense_flop_per_token=dense_flop,
        expert_weight_bytes=expert_bytes, expert_flop_per_token=expert_flop,
        elementwise_bytes_per_token=elementwise, rank_elementwise_bytes_per_token=rank_elementwise,
        num_experts=moe.experts if moe else 0, top_k=moe.top_k if moe else 0,
        lm_weight_bytes=lm_bytes, lm_flop_per_logit=lm_flop,
        kv_read_bytes_per_ctx=kv_read, kv_write_bytes_per_token=kv_read,
        attn_flop_per_pair_decode=f_dec, attn_flop_per_pair_prefill=f_pre,
        kv_bytes_per_token_per_gpu=kv_per_gpu / pp, kv_bytes_per_token_total=kv_total,
        kv_tokens_split=groups,
        weight_bytes_per_gpu=weights_gpu, layers=L, hidden=model.hidden,
        num_all_reduce=n_ar, num_all_to_all=n_a2a, dp_groups=groups,
        pp_same_node=gpus * pp <= instance.num_accelerators, overhead_s=overhead_s,
        kernel_fixed_s=(n_dense * KERNELS_DENSE_LAYER + n_moe * (KERNELS_MOE_LAYER + (3 if p_shared else 0))
                        + n_moe * ((CUTLASS_MOE_KERNELS if cutlass else 0) + (CUTLASS_MOE_QUANT_KERNELS if moe_quant else 0))
                        + KERNELS_PER_ITERATION) * KERNEL_FIXED_S if kernel_fixed_s is None else kernel_fixed_s,
        moe_sort_fused_max_rows=CUTLASS_MOE_FUSED_SORT_MAX_ROWS if cutlass else 0,
        moe_unfused_sort_kernels=n_moe * CUTLASS_MOE_UNFUSED_SORT_EXTRA if cutlass else 0,
        moe_kernel_s=KERNEL_FIXED_S if kernel_fixed_s is None else 0.0,
        cpu_overhead_fraction=cpu_overhead_fraction,
        window=model.window.size if n_local else 0, window_share=n_local / L,
        dense_gemm_eff=dense_eff, expert_gemm_eff=expert_eff, lm_gemm_eff=gemm_k_efficiency(h, lm_k0),
        dense_gemm_shapes=_gemm_shapes(dense_gemms), dense_k0=k0, lm_n=model.vocab / tp, lm_k0=lm_k0,
        compute_units=acc.compute_units,
        # with data-parallel attention the experts spread over the engine's GPUs; under plain TP every
        # GPU holds a 1/tp slice of every expert
        expert_gemm_shapes=_gemm_shapes(expert_gemms),
        local_experts=(max(1, moe.experts // gpus) if groups > 1 else moe.experts) if moe else 0,
        moe_op_fraction=acc.moe_op_efficiency.get(precision, 1.0),
        graph_batch_sizes=tuple(graph_batch_sizes), collective=coll,
        moe_comm=moe_comm if groups > 1 else "all-to-all",
        moe_gather_bytes=BYTES_PER_ELEMENT[precision] if precision in ("fp8", "fp4") else ACT_BYTES,
        **_deepep_fields(deepep, model, instance, gpus, groups > 1, precision, collective, moe_imbalance),
        two_batch_overlap=two_batch_overlap, tbo_decode_context=tbo_decode_context,
        moe_imbalance=moe_imbalance, routed_elementwise_bytes_per_token=routed_elementwise,
        overlap_clock_ratio=acc.overlap_clock_ratio,
        moe_layer_dense_share=(n_moe * (p_attn * a_rate + p_shared + p_router) / dense_rate_params
                               if moe and dense_rate_params else 0.0),
        moe_layer_shared_share=n_moe * p_shared / dense_rate_params if moe and dense_rate_params else 0.0,
        moe_layer_kernel_s=(n_moe * (KERNELS_MOE_LAYER + (3 if p_shared else 0)) * KERNEL_FIXED_S
                            if kernel_fixed_s is None else 0.0),
        moe_workspace_bytes_per_row=cutlass_moe_workspace_per_row(
            model.hidden, moe.expert_ffn_hidden / (1 if groups > 1 else tp), precision, model.gated) if cutlass else 0.0,
    )


def _deepep_fields(deepep: str, model: Any, instance: Any, gpus: int, attention_dp: bool, precision: str,
                   collective: Any, load: float = 1.0) -> dict[str, Any]:
    """The cost model's DeepEP fields (``deepep``): none without an attention-DP MoE engine, or without a
    communication cost (``collective`` None); on the fabric model, DeepEP's measured kernels
    (fmsim.model.deepep.layer_times_fn); under a test's function, its byte counts through that function."""
    if deepep == "none" or not attention_dp or model.moe is None or collective is None:
        return {}
    nodes = max(1, math.ceil(gpus / instance.num_accelerators))
    groups, group_topk, fp8 = model.moe.router_groups or 1, model.moe.token_groups(), precision in ("fp8", "fp4")
    layer = layer_times_fn(deepep, instance, hidden=model.hidden, top_k=model.moe.top_k, nodes=nodes, groups=groups,
                          group_topk=group_topk, fp8_dispatch=fp8, load=load) if collective == "fabric" else None
    return {"deepep": deepep, "ep_nodes": nodes, "deepep_layer": layer, "router_groups": groups,
            "router_group_topk": group_topk, "deepep_fp8_dispatch": fp8}


def kv_dtype_for(precision: str, requested: str, profile: EngineProfile) -> str:
    """The KV cache dtype: as requested, or ``auto`` per the engine's convention."""
    if requested != "auto":
        return requested
    if profile.kv_follows_quantization and precision in ("fp8", "fp4"):
        return "fp8"
    return precision if precision in ("bf16", "fp16", "fp32") else "bf16"
