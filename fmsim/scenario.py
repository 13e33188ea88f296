"""Scenario files, schema version 1: reading them safely, validating them, writing them back.

Owns the scenario contract of DESIGN.md ("The scenario file"): the frozen :class:`Scenario` the
simulators consume, the strict YAML reader (duplicate keys, alias bombs, oversize files and deep
nesting are refused before anything is built), ``--set key.path=value`` overrides, and every
check a file can fail with its located message ``FILE: field.path: what is wrong (expected ...)``.
Quantities are parsed once here through :mod:`fmsim.units`; everything past this module is SI.

The ``traffic``/``serving``/``test_time_compute``/``slo`` (``kind: inference``) and ``rl``
(``kind: rl``) sections are kept as raw mappings in :attr:`Scenario.extra`; the simulators of
those kinds validate them.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .catalog import (
    PRICING_OPTIONS,
    Catalog,
    Instance,
    load_catalog,
    per_core,
    suggest,
    with_in_network_reduction,
)
from .errors import ConfigError, ParallelismError
from .model.architecture import ModelSpec, model_from_mapping
from .results import COLUMNS_BY_KIND, COMMON_COLUMNS, INFERENCE_COLUMNS, TRAINING_COLUMNS
from .stacks import SETTABLE, check_kind, lookup, stack_defaults
from .units import parse_bytes, parse_count, parse_flop_rate, parse_rate, parse_time

__all__ = [
    "FLOPS_FORMULAS",
    "KINDS",
    "MAX_ALIASES",
    "MAX_FILE_BYTES",
    "MAX_GPUS",
    "MAX_SEQ_LEN",
    "MAX_TOKENS_PER_STEP",
    "PRECISIONS",
    "RECOMPUTE",
    "RECOMPUTE_MODULES",
    "SCHEDULES",
    "Checkpoint",
    "Cluster",
    "Expect",
    "Overlap",
    "Parallelism",
    "Pricing",
    "Reliability",
    "Scenario",
    "Workload",
    "apply_overrides",
    "canonical_metric",
    "load_scenario",
    "load_yaml_text",
    "metric_columns",
    "parse_metric_value",
    "parse_set_option",
    "scenario_from_mapping",
    "plan_cluster",
    "scenario_to_mapping",
    "with_plan",
]

# ----------------------------------------------------------------------------------------------
# vocabulary of schema v1

SCHEMA_VERSION = 1
KINDS = ("pretrain", "finetune", "rl", "inference")
TRAINING_KINDS = ("pretrain", "finetune")
PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "fp32")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
#: what `recompute: selective` may run again in the backward, Megatron-Core's --recompute-modules names:
#: the attention core (its default, Korthikanti et al. 2022), the dense MLP block, the MoE block, the
#: experts' activation function, the shared experts, the norms, and MLA's up-projections
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "shared_experts", "layernorm", "mla_up_proj")
AXES = ("tp", "cp", "ep", "pp", "dp")
DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")  # Megatron-Core RankGenerator default
FLOPS_FORMULAS = ("megatron-2021", "korthikanti-2022", "palm", "nemo", "llama3")
# Sections a kind adds; kept raw in Scenario.extra and validated by that kind's simulator.
EXTRA_SECTIONS = {
    "traffic": "inference",
    "serving": "inference",
    "test_time_compute": "inference",
    "slo": "inference",
    "rl": "rl",
}

TOP_KEYS = (
    "version",
    "name",
    "description",
    "seed",
    "workload",
    "parallelism",
    "cluster",
    "pricing",
    "checkpoint",
    "reliability",
    "data",
    "measured",
    "expect",
    "stack",
    "configuration",
    *EXTRA_SECTIONS,
)
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
CROSS_ENTROPIES = ("fused", "unfused")
#: the low-precision recipes whose Transformer Engine copies (fp8 weights, fp8 attention, fp8 saved inputs) exist
LOW_PRECISIONS = ("fp8", "fp4")
MOE_ROUTINGS = ("balanced", "consecutive")
GRAD_REDUCE_PRECISIONS = ("fp32", "bf16", "fp16")
PARAM_GATHER_PRECISIONS = ("bf16", "fp8")
CP_COMMS = ("ring", "all-gather", "a2a")
EP_DISPATCHES = ("alltoall", "deepep")
#: how a rank's expert GEMMs run (fmsim.model.kernels.grouped_gemm_efficiency): multi-stream, Transformer
#: Engine's GroupedLinear (one cuBLAS GEMM per expert over 4 streams: Megatron-Core's TEGroupedMLP), or
#: fused, one grouped kernel for every expert (DeepGEMM, CUTLASS grouped GEMM)
MOE_GROUPED_GEMMS = ("multi-stream", "fused")
#: Parameters per gradient bucket unless ``parallelism.grad_bucket`` says otherwise: Megatron-Core's minimum
#: --ddp-bucket-size, taken for every framework. Megatron-Core's own default grows to 1M x dp at large data
#: parallelism (``grad_bucket: megatron``, which the validation files of Megatron-Core runs state); as the
#: default for every framework it fits the set worse (Meta's Llama 3 runs), so files say it where it applies.
DEFAULT_GRAD_BUCKET = 40_000_000
#: ``parallelism.grad_bucket: megatron``: Megatron-Core's own default, max(40M, 1M x data-parallel size)
#: parameters ("larger DP sizes need larger buckets to ensure collectives do not become latency-bound",
#: megatron/core/distributed/distributed_data_parallel_config.py, ``bucket_size``)
GRAD_BUCKET_MEGATRON = -1
PARALLELISM_KEYS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "vpp",
    "schedule",
    "sequence_parallel",
    "recompute",
    "recompute_modules",
    "recompute_layers",
    "zero",
    "dp_shard",
    "grad_bucket",
    "grad_reduce_precision",
    "param_gather_precision",
    "offload_activations",
    "activation_fp8_input",
    "gradient_accumulation_fusion",
    "cp_comm",
    "ep_dispatch",
    "moe_grouped_gemm",
    "overlap",
    "order",
)
OVERLAP_KEYS = ("grad_reduce", "param_gather", "tp_comm", "tp_backward", "tp_qkv", "tp_rs_dgrad", "ep_comm", "pp_comm")
CLUSTER_KEYS = ("instance", "nodes", "gpus", "placement", "network", "storage", "stragglers", "rank_unit")
RANK_UNITS = ("chip", "core")
STRAGGLER_KEYS = ("cv",)
NETWORK_KEYS = ("fabric", "nics_per_node", "nic_bandwidth", "oversubscription", "in_network_reduction")
STORAGE_KEYS = ("kind", "tier", "deployment", "throughput_per_tib", "capacity", "throughput", "efa",
                "metadata_iops", "prefixes")
CHECKPOINT_KEYS = ("every", "async", "grads", "keep")
RELIABILITY_KEYS = ("node_mtbf", "restart", "fleet", "rates", "run_length", "trials")
#: ``data:`` (fmsim/workloads/data_loading.py): what one training sample weighs and where it is read from
DATA_KEYS = ("bytes_per_token", "sample_bytes", "prefetch", "source", "samples_per_file")
DATA_SOURCES = ("storage", "local")
MEASURED_STRING_KEYS = ("source", "flops_formula", "peak", "notes")
EXPECT_KEYS = ("value", "rel_tol", "abs_tol")
FLOPS_METRICS = ("model_tflops_per_gpu", "mfu", "hfu")

# Input safety limits (the reader refuses files beyond them before building anything).
MAX_FILE_BYTES = 1 << 20  # 1 MiB
MAX_ALIASES = 100  # YAML aliases (*name) per file
MAX_EXPANDED_NODES = 200_000  # nodes after expanding aliases (billion-laughs guard)
MAX_DEPTH = 64  # nesting of mappings/sequences
# Sizes no run could need, refused at load so that memory and time stay bounded whatever the input.
# The largest published pre-training steps hold tens of millions of tokens (Llama 3 405B: 16M, Meta
# 2024 Table 4) and the longest trained contexts ten million (Llama 4 Scout, 2025); the largest
# clusters a few hundred thousand accelerators. Each bound is orders of magnitude past those.
MAX_TOKENS_PER_STEP = 10**12   # seq_len x global_batch
MAX_SEQ_LEN = 10**8            # tokens per sequence
MAX_GPUS = 2**24               # accelerators in one cluster


# ----------------------------------------------------------------------------------------------
# specs


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlap:
    """Which communications the training schedule overlaps with compute."""

    grad_reduce: bool = True  # bucketed gradient reduce-scatter/all-reduce during backward
    param_gather: bool = True  # ZeRO/FSDP parameter all-gather prefetched during forward
    tp_comm: bool = False  # TP all-gather/reduce-scatter overlapped with GEMMs
    # the backward's TP collectives of a column-parallel layer issued asynchronously behind its own
    # data- and weight-gradient GEMMs (Megatron-LM since 2022, Transformer Engine); false for the
    # Megatron-LM of 2020-21, which ran them in line
    tp_backward: bool = True
    # with tp_comm: the QKV projection's all-gather joins the userbuffers overlap; false as Megatron-Core's
    # tp_comm_overlap_disable_qkv (the all-gather runs in the open, e.g. for a LoRA adapter to reuse its output)
    tp_qkv: bool = True
    # with tp_comm: a layer without a weight gradient (LoRA's frozen base) pipelines its input-gradient
    # reduce-scatter with its data-gradient GEMM (Megatron-Core tp_comm_overlap_rs_dgrad, default false);
    # otherwise that reduce-scatter has no GEMM to hide behind
    tp_rs_dgrad: bool = False
    # EP dispatch/combine of one micro-batch behind another's compute (Megatron-Core
    # --overlap-moe-expert-parallel-comm, Megatron-Bridge moe_a2a_overlap)
    ep_comm: bool = False
    # pipeline sends and receives beside compute (Megatron-Core overlap_p2p_comm, interleaved schedule
    # only); false: a stage waits for its own send before its next task, as Megatron's 1F1B schedule
    # runs them (send_forward_recv_backward and the like wait on their requests). Default: false for the
    # 1f1b schedule, true otherwise
    pp_comm: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelism:
    """How the job is split: sizes of each axis, pipeline schedule, recompute and ZeRO stage."""

    tp: int = 1
    pp: int = 1
    dp: int = 1  # resolved from ``auto`` = gpus / (tp*pp*cp)
    cp: int = 1
    ep: int = 1  # carved out of dp*cp (Megatron convention)
    vpp: int = 1  # virtual stages per pipeline rank
    schedule: str = "1f1b"
    sequence_parallel: bool = False
    recompute: str = "none"
    # the modules `selective` recomputes (RECOMPUTE_MODULES); () unless recompute is selective
    recompute_modules: tuple[str, ...] = ()
    # with recompute: full, only the first this many layers of each virtual stage are recomputed, the
    # rest keep their activations (Megatron-LM --recompute-method block --recompute-num-layers N;
    # torchtitan's every-k-th-layer checkpointing holds as many); 0 = every layer (the default)
    recompute_layers: int = 0
    zero: int = 0
    # hybrid sharding (PyTorch FSDP HYBRID_SHARD / torchtitan's dp_shard x dp_replicate, Megatron-Core's
    # --num-distributed-optimizer-instances): ZeRO shards over groups of dp_shard data-parallel ranks and
    # the dp / dp_shard groups keep replicas, their gradients all-reduced shard by shard. 0 = all of dp
    dp_shard: int = 0
    # parameters per gradient bucket: each bucket is one reduce-scatter / all-reduce with its own latency
    # (Megatron-Core --ddp-bucket-size, whose minimum is 40M; DeepSpeed reduce_bucket_size, 500M by default);
    # 0 = one bucket per layer ("unit": PyTorch FSDP reduce-scatters each wrapped block's gradients at once)
    grad_bucket: int = DEFAULT_GRAD_BUCKET
    # data-parallel gradient buffers and their reduction: fp32 (Megatron-LM's default for bf16, its
    # --accumulate-allreduce-grads-in-fp32) or bf16 (grad_reduce_in_fp32=False, as NeMo's and
    # Megatron-Bridge's performance recipes set it); fp16 runs keep fp16 gradients unless told
    # otherwise (the default below follows workload.precision)
    grad_reduce_precision: str = "fp32"
    # the weights' compute copy and its data-parallel all-gather: bf16, or fp8 with an fp8/fp4 recipe
    # (Megatron-Core --fp8-param-gather: Transformer Engine keeps the weights as fp8 tensors)
    param_gather_precision: str = "bf16"
    # transformer layers whose activations wait in host memory between forward and backward
    # (Megatron-Core --cpu-offloading-num-layers; pp 1, no recompute, as Megatron-Core requires)
    offload_activations: int = 0
    # the MLP activation function's input kept for its backward as fp8, not 16-bit (Megatron-Core
    # --activation-func-fp8-input-store; fp8/fp4 recipes only)
    activation_fp8_input: bool = False
    # the weight-gradient GEMM accumulates straight into the gradient buffer (Megatron-LM
    # --gradient-accumulation-fusion, Transformer Engine fuse_wgrad_accumulation); false: it writes a
    # 16-bit gradient that a hook adds into the buffer, per micro-batch (Megatron-LM of 2020-21,
    # DeepSpeed's bf16 optimizer)
    gradient_accumulation_fusion: bool = True
    # context parallelism's K/V exchange: ring (passed around while attention runs, Liu et al. 2023),
    # all-gather (gathered before attention, on the critical path: Llama 3) or a2a (DeepSpeed-Ulysses,
    # Megatron-Core --cp-comm-type a2a: all-to-alls trade the sequence split for a head split around the
    # attention core)
    cp_comm: str = "ring"
    # MoE token dispatch: alltoall (NCCL all-to-all of every token-expert copy, Megatron-Core's
    # alltoall dispatcher) or deepep (DeepEP / HybridEP through Megatron-Core's flex dispatcher: a
    # token crosses the scale-out network once per destination node, at the NIC's line rate)
    ep_dispatch: str = "alltoall"
    moe_grouped_gemm: str = "multi-stream"   # MOE_GROUPED_GEMMS
    overlap: Overlap = field(default_factory=Overlap)
    order: tuple[str, ...] = DEFAULT_ORDER  # placement order of the axes, innermost first

    @property
    def shard_width(self) -> int:
        """Data-parallel ranks one ZeRO/FSDP shard group spans (dp without hybrid sharding)."""
        return self.dp_shard or self.dp

    @property
    def model_parallel(self) -> int:
        """Ranks one model replica spans: tp * pp * cp."""
        return self.tp * self.pp * self.cp

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Where it runs: an instance type (with ``network:`` overrides applied) times a node count."""

    instance: Instance
    nodes: int
    gpus: int
    placement: str = "auto"
    oversubscription: float = 1.0
    storage: Mapping[str, Any] | None = None  # kind, tier, deployment, throughput_per_tib (B/s), capacity (B)
    straggler_cv: float = 0.0  # per-rank compute-time jitter (coefficient of variation, normal)
    rank_unit: str = "chip"  # chip | core: one rank per NeuronCore, each a share of its chip


@dataclass(frozen=True, slots=True, kw_only=True)
class Pricing:
    """A catalog purchase option, or a fixed price per instance-hour; exactly one is set."""

    option: str | None = "on-demand"
    usd_per_hour: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    every_s: float
    async_: bool = False
    grads: bool = False          # save the fp32 gradients too
    keep: int = 1                # checkpoints kept on the storage (priced)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reliability:
    restart_s: float
    node_mtbf_s: float | None = None       # v1: every node alike; else per-component fleet rates
    fleet: str | None = None               # hardware_catalog/failure_rates.yaml [llama3-405b-h100]
    rates: Mapping[str, float] = field(default_factory=dict)  # component -> interruptions per unit per day
    run_length_s: float | None = None      # wall-clock length to replay (else until train_tokens are done)
    trials: int = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    """``data:``: bytes read per sample and where from (fmsim/workloads/data_loading.py)."""

    bytes_per_token: float = 4.0           # pre-tokenised text: int32 token ids (vocabularies over 65,536)
    sample_bytes: float | None = None      # a whole sample (multimodal), instead of tokens x bytes_per_token
    prefetch: int = 2                      # batches read ahead (PyTorch DataLoader prefetch_factor default)
    source: str = "storage"                # storage (cluster.storage) | local (node-local copy: no stall)
    samples_per_file: int | None = None    # for the metadata operations (one open per file)


@dataclass(frozen=True, slots=True, kw_only=True)
class Expect:
    """A regression band: ``value`` within ``max(rel_tol * |value|, abs_tol)`` (math.isclose rule)."""

    value: float
    rel_tol: float
    abs_tol: float = 0.0

    @property
    def half_width(self) -> float:
        return max(self.rel_tol * abs(self.value), self.abs_tol)

    def band(self) -> tuple[float, float]:
        return self.value - self.half_width, self.value + self.half_width

    def contains(self, x: float | None) -> bool:
        if x is None or isinstance(x, str):
            return False
        x = float(x)
        return math.isfinite(x) and abs(x - self.value) <= self.half_width * (1 + 1e-12)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One scenario file, validated and in SI units."""

    name: str
    description: str = ""
    version: int = SCHEMA_VERSION
    file: str | None = None
    seed: int = 0
    workload: Workload
    parallelism: Parallelism
    cluster: Cluster
    pricing: Pricing = field(default_factory=Pricing)
    checkpoint: Checkpoint | None = None
    reliability: Reliability | None = None
    data: DataSpec | None = None
    measured: Mapping[str, float] = field(default_factory=dict)  # column -> value (column's unit)
    measured_source: str = ""
    measured_notes: Mapping[str, str] = field(default_factory=dict)  # flops_formula, peak, notes
    expect: Mapping[str, Expect] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # raw kind-specific sections
    # software stack (stack_catalog/): its name, and the stack-settable fields (fmsim.stacks.SETTABLE) the
    # file or its stack states -- the others are fmsim's global defaults, which fmsim.band varies
    stack: str = ""
    stated: tuple[str, ...] = field(default=(), compare=False)
    configuration: str = ""              # stated | partial (how completely the source states the settings)
    configuration_missing: str = ""      # with partial: what the source leaves out

    @property
    def measured_peak_flop_per_s(self) -> float | None:
        """The peak FLOP/s the measurement's source divided by (``measured.peak``), if given."""
        peak = self.measured_notes.get("peak")
        return float(peak) if peak else None

    @property
    def flops_formula(self) -> str | None:
        return self.measured_notes.get("flops_formula") or None


# ----------------------------------------------------------------------------------------------
# result columns as scenario keys (measured:, expect:)

_ALIASES = {"step_time": "step_time_s", "tflops_per_gpu": "model_tflops_per_gpu"}
_NOT_METRICS = (
    "scenario",
    "kind",
    "instance",
    "nodes",
    "gpus",
    "price_date",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "hbm_per_gpu_bytes",
    "bottleneck",
    "pricing_option",
    "usd_per_hour",
    # the plan's own settings, echoed so a CSV row names its plan
    "vpp",
    "zero",
    "dp_shard",
    "micro_batch",
    "global_batch",
    "num_microbatches",
    "precision",
    "recompute",
)
for _col in TRAINING_COLUMNS + INFERENCE_COLUMNS:
    if _col.endswith("_s") and not _col.endswith("_per_s"):
        _ALIASES.setdefault(_col[:-2], _col)  # ttft_p50 -> ttft_p50_s


def metric_columns(kind: str) -> tuple[str, ...]:
    """Result columns a ``measured:``/``expect:`` entry may name for a workload ``kind``."""
    if kind in COLUMNS_BY_KIND:
        cols = COLUMNS_BY_KIND[kind]
    else:  # rl: trains and generates
        cols = TRAINING_COLUMNS + INFERENCE_COLUMNS
    return tuple(c for c in COMMON_COLUMNS + tuple(cols) if c not in _NOT_METRICS)


def canonical_metric(key: str) -> str:
    """Column name of a measured/expect key (``step_time`` -> ``step_time_s``)."""
    return _ALIASES.get(key, key)


def _dimension(col: str) -> str:
    if col in ("mfu", "hfu"):
        return "fraction"
    if col == "model_tflops_per_gpu":
        return "tflops"
    if col == "fits":
        return "bool"
    if col.endswith(("_per_s", "_per_s_per_gpu")) or col == "gpu_hours":
        return "count"
    if col.endswith("_s"):
        return "s"
    if col.endswith("_bytes"):
        return "bytes"
    if col.startswith("usd") or col.endswith("usd"):
        return "usd"
    return "count"


def parse_metric_value(col: str, value: Any) -> float:
    """A measured/expected value in the unit of column ``col`` (SI; TFLOP/s for ``*_tflops_*``).

    Raises :class:`ConfigError` (no location) with what was expected.
    """
    dim = _dimension(col)
    if dim == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{value!r} is not true/false (expected true or false)")
        return 1.0 if value else 0.0
    if isinstance(value, bool):
        raise ConfigError(f"{value!r} is not a number (expected a {dim} value)")
    if dim == "fraction":
        if isinstance(value, str) and value.strip().endswith("%"):
            out = parse_count(value.strip()[:-1]) / 100.0
        else:
            out = parse_count(value)
        if not 0.0 < out <= 1.0:
            raise ConfigError(f"{value!r} is not a fraction in (0, 1] (expected e.g. 0.45 or '45%')")
        return out
    if dim == "tflops":
        if isinstance(value, str) and re.search(r"FLOP", value):
            out = parse_flop_rate(value) / 1e12
        else:
            out = parse_count(value)
    elif dim == "s":
        out = parse_time(value)
    elif dim == "bytes":
        out = parse_bytes(value)
    elif dim == "usd":
        out = parse_count(value.strip().lstrip("$").replace(",", "") if isinstance(value, str) else value)
    else:
        out = parse_count(value)
    if not out > 0:
        raise ConfigError(f"{value!r} must be > 0")
    return out


# ----------------------------------------------------------------------------------------------
# safe YAML


class _Refused(yaml.MarkedYAMLError):
    """The reader refuses this input (aliases, nesting, duplicate keys)."""


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, too many aliases and too deep nesting."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._num_aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._num_aliases += 1
            if self._num_aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise _Refused(
                    None, None, f"more than {MAX_ALIASES} YAML aliases (refused: alias bomb guard)", mark
                )
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Refused(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:  # unhashable key: the base constructor says so
                    continue
                if seen:
                    raise _Refused(
                        None,
                        None,
                        f"duplicate key {key!r} (first given at line {first_line[key]})",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: Any) -> None:
    """Refuse node graphs whose alias expansion is huge or cyclic (iterative: no recursion limit)."""
    cap = MAX_EXPANDED_NODES + 1
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            size[key] = min(cap, 1 + sum(size[id(c)] for c in _children(node)))
            on_path.discard(key)
            continue
        if key in size:
            continue
        if key in on_path:
            raise _Refused(None, None, "a YAML alias refers to a node containing itself", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    if size[id(root)] > MAX_EXPANDED_NODES:
        raise _Refused(
            None,
            None,
            f"aliases expand to more than {MAX_EXPANDED_NODES:,} values (refused: alias bomb guard)",
            root.start_mark,
        )


def load_yaml_text(text: str, *, file: str | None = None) -> Any:
    """Parse one YAML document strictly; errors are :class:`ConfigError` naming the line."""
    try:
        loader = _StrictLoader(text)    # the reader checks the characters here (NUL and the like)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"invalid YAML: {first}", file=file) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "cannot parse"
        if isinstance(exc, _Refused):
            raise ConfigError(f"{where}{problem}", file=file) from None
        context = ""
        if exc.context and exc.problem:
            cm = exc.context_mark
            started = f" started at line {cm.line + 1}" if cm is not None and cm is not mark else ""
            context = f" ({exc.context}{started})"
        raise ConfigError(
            f"{where}invalid YAML: {problem}{context} (expected valid YAML)", file=file
        ) from None
    except yaml.YAMLError as exc:  # reader errors (bad characters) and the like
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"invalid YAML: {first}", file=file) from None
    except RecursionError:  # pragma: no cover - MAX_DEPTH comes first
        raise ConfigError("nested too deeply", file=file) from None
    finally:
        loader.dispose()


def _read_text(path: Path, file: str) -> str:
    try:
        if path.is_dir():
            raise ConfigError("is a directory (expected a scenario .yaml file)", file=file)
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(
                f"file is {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit for scenario "
                "files (refused before parsing)",
                file=file,
            )
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=file) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"file is over the {MAX_FILE_BYTES:,}-byte limit for scenario files", file=file)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not UTF-8 text (byte {exc.start}) (expected a YAML text file)", file=file
        ) from None
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        column = nul - (text.rfind("\n", 0, nul) + 1) + 1
        raise ConfigError(f"line {line}, column {column}: a NUL byte (expected a YAML text file)", file=file)
    return text


# ----------------------------------------------------------------------------------------------
# overrides (--set key.path=value)

_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*$")


def parse_set_option(text: str) -> tuple[str, Any]:
    """``"parallelism.tp=4"`` -> ``("parallelism.tp", 4)``; the value is read as a YAML scalar/flow."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not _PATH.match(key):
        raise ConfigError(f"{text!r} is not key.path=value (expected e.g. parallelism.tp=4)", file="--set")
    if not value.strip():
        # an empty value would read as null, which a section takes as "not given": the field would
        # silently keep its default
        raise ConfigError(f"{text!r} has no value (expected {key}=VALUE; write {key}=null to drop the "
                          f"field, or {key}=\"\" for an empty string)", file="--set", field=key)
    parsed = load_yaml_text(value, file=f"--set {key}")
    return key, parsed


def apply_overrides(
    data: Mapping[str, Any], overrides: Mapping[str, Any], *, file: str | None = None
) -> dict[str, Any]:
    """A deep copy of ``data`` with each dotted ``key.path`` set to its value (mappings created)."""
    out: dict[str, Any] = copy.deepcopy(dict(data))
    for path, value in overrides.items():
        if not isinstance(path, str) or not _PATH.match(path):
            raise ConfigError(
                f"{path!r} is not a dotted key path (expected e.g. parallelism.tp)",
                file=file,
                field=str(path),
            )
        parts = path.split(".")
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif isinstance(nxt, Mapping) and not isinstance(nxt, dict):
                nxt = node[part] = dict(nxt)
            elif not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"cannot set {path}: {where} is {_what(nxt)}, not a mapping", file=file, field=path
                )
            node = nxt
        node[parts[-1]] = copy.deepcopy(value)
    return out


# ----------------------------------------------------------------------------------------------
# reading sections with located errors

_MISSING: Any = dataclasses.MISSING


def _what(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


class _Section:
    """One mapping of the scenario: typed getters whose errors carry ``file`` and ``field``.

    Defaults resolve in one place, file -> stack -> global: a key the file leaves out is looked up in
    ``inherited`` (this section's part of the scenario's stack, :func:`fmsim.stacks.stack_defaults`)
    before a getter falls back to its global default, and a stack's value is checked by the same getter as
    a file's (its errors name the stack).
    """

    def __init__(self, data: Any, file: str | None, where: str, allowed: tuple[str, ...], *, what: str = "",
                 inherited: Mapping[str, Any] | None = None, stack: str = ""):
        if not isinstance(data, Mapping):
            expected = what or f"a mapping with keys {', '.join(allowed)}"
            raise ConfigError(f"got {_what(data)} (expected {expected})", file=file, field=where or None)
        self.data, self.file, self.where, self.allowed = data, file, where, allowed
        self.inherited, self.stack = (inherited or {}), stack
        for key in data:
            if not isinstance(key, str):
                raise self.err(str(key), f"key {key!r} is not a name (expected one of {', '.join(allowed)})")
            if key not in allowed:
                raise self.err(key, f"unknown key {key!r}{suggest(key, allowed)}")
        for key in self.inherited:
            if key not in allowed:  # a stack catalog path the reader does not know: a catalog bug
                raise self.err(key, f"unknown key {key!r}{suggest(key, allowed)}")

    def _value(self, key: str) -> Any:
        """The file's value of ``key``, else the stack's (mappings merged, the file's on top), else None."""
        own, inherited = self.data.get(key), self.inherited.get(key)
        if own is None:
            return inherited
        if isinstance(own, Mapping) and isinstance(inherited, Mapping):
            return {**inherited, **own}
        return own

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def err(self, key: str, message: str, cls: type[ConfigError] = ConfigError) -> ConfigError:
        head = key.split(".")[0].split("[")[0]
        if head and self.data.get(head) is None and self.inherited.get(head) is not None:
            message = f"{message} (set by stack {self.stack!r})"
        return cls(message, file=self.file, field=self.path(key) if key else (self.where or None))

    def has(self, key: str) -> bool:
        return self._value(key) is not None

    def raw(self, key: str, default: Any = _MISSING, *, hint: str = "") -> Any:
        if not self.has(key):
            if default is _MISSING:
                raise self.err(key, f"is required{f' ({hint})' if hint else ''}")
            return default
        return self._value(key)

    def text(self, key: str, default: Any = _MISSING, *, nonempty: bool = False) -> Any:
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key)
        if not isinstance(value, str):
            raise self.err(key, f"got {_what(value)} (expected a string; quote it)")
        if nonempty and not value.strip():
            raise self.err(key, "is empty (expected a non-empty string)")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> Any:
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key, hint=f"one of {', '.join(choices)}")
        if not isinstance(value, str) or value not in choices:
            shown = repr(value) if isinstance(value, str) else _what(value)
            sugg = (
                suggest(value, choices)
                if isinstance(value, str)
                else f" (expected one of {', '.join(choices)})"
            )
            if "known:" in sugg:
                sugg = f" (expected one of {', '.join(choices)})"
            raise self.err(key, f"{shown} is not valid{sugg}")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self.err(key, f"got {_what(value)} (expected true or false)")
        return value

    def integer(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        minimum: int = 1,
        maximum: int | None = None,
        counts: bool = False,
        hint: str = "",
    ) -> Any:
        """An integer; ``counts`` also accepts count strings (``"2k"``, ``"16Ki"``)."""
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key, hint=hint)
        number: float | int
        if isinstance(value, bool):
            raise self.err(key, f"got {_what(value)} (expected an integer >= {minimum})")
        if isinstance(value, int):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif counts and isinstance(value, str):
            try:
                parsed = parse_count(value)
            except ConfigError as exc:
                raise self.err(key, exc.message) from None
            if not float(parsed).is_integer():
                raise self.err(key, f"{value!r} = {parsed:g} is not a whole number (expected an integer)")
            number = int(parsed)
        else:
            raise self.err(key, f"got {_what(value)} (expected an integer >= {minimum})")
        if number < minimum:
            raise self.err(key, f"{number} is less than {minimum} (expected an integer >= {minimum})")
        if maximum is not None and number > maximum:
            raise self.err(key, f"{number} is more than {maximum} (expected {minimum}..{maximum})")
        return int(number)

    def quantity(
        self,
        key: str,
        parse: Callable[[Any], float],
        default: Any = _MISSING,
        *,
        minimum: float = 0.0,
        inclusive: bool = False,
        expected: str = "",
    ) -> Any:
        """A unit quantity through :mod:`fmsim.units`, required to be > ``minimum`` (or >=)."""
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key, hint=expected)
        try:
            out = parse(value)
        except ConfigError as exc:
            raise self.err(key, exc.message) from None
        ok = out >= minimum if inclusive else out > minimum
        if not ok or not math.isfinite(out):
            rel = ">=" if inclusive else ">"
            raise self.err(
                key, f"{value!r} must be {rel} {minimum:g}{f' (expected {expected})' if expected else ''}"
            )
        return float(out)

    def section(
        self, key: str, allowed: tuple[str, ...], *, required: bool = False, what: str = ""
    ) -> _Section | None:
        if not self.has(key):
            if required:
                raise self.err(key, f"is required (expected a mapping with keys {', '.join(allowed)})")
            return None
        own = self.data.get(key)
        inherited = self.inherited.get(key)
        return _Section({} if own is None else own, self.file, self.path(key), allowed, what=what,
                        inherited=inherited if isinstance(inherited, Mapping) else None, stack=self.stack)


def _relocate(exc: ConfigError, file: str | None, field_path: str) -> ConfigError:
    """``exc`` (raised without a location, e.g. by the catalog) placed at ``file``/``field_path``."""
    return type(exc)(exc.message, file=file, field=field_path)


# ----------------------------------------------------------------------------------------------
# building a Scenario


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
    if seq_len * global_batch > MAX_TOKENS_PER_STEP:
        key = "global_batch_tokens" if wl.has("global_batch_tokens") else "global_batch"
        raise wl.err(key, f"{seq_len * global_batch:.3g} tokens per step (seq_len x global_batch) is past "
                     f"the {MAX_TOKENS_PER_STEP:.0e} any run could need (expected a batch such as 2048 "
                     "sequences or 16M tokens)")
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
    moe_routing = wl.choice("moe_routing", MOE_ROUTINGS, "balanced")
    if wl.has("moe_routing") and model.moe is None:
        raise wl.err("moe_routing", f"given for {model.name}, which has no experts (expected an MoE model)")
    moe_imbalance, capacity, pad = _moe_load(wl, model, kind)
    lora_rank, lora_modules, lora_dropout, lora_exchange = 0, "all", 0.0, "all-gather"
    lo = wl.section("lora", LORA_KEYS)
    if lo is not None:
        if kind not in TRAINING_KINDS:
            raise wl.err("lora", f"applies to training kinds only, not {kind!r}")
        lora_rank = lo.integer("rank", _MISSING, counts=True, hint="adapter rank, e.g. 16")
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
        lora_rank=lora_rank,
        lora_modules=lora_modules,
        lora_dropout=lora_dropout,
        lora_exchange=lora_exchange,
        moe_routing=moe_routing,
        moe_imbalance=moe_imbalance,
        moe_capacity_factor=capacity,
        moe_pad_to_capacity=pad,
    ), wl


def _moe_load(wl: _Section, model: Any, kind: str) -> tuple[float, float, bool]:
    """``moe_imbalance``, ``moe_capacity_factor`` and ``moe_pad_to_capacity`` (training MoE models only)."""
    keys = [k for k in ("moe_imbalance", "moe_capacity_factor", "moe_pad_to_capacity") if wl.has(k)]
    if not keys:
        return 1.0, 0.0, False
    if model.moe is None:
        raise wl.err(keys[0], f"given for {model.name}, which has no experts (expected an MoE model)")
    if kind not in TRAINING_KINDS:
        raise wl.err(keys[0], f"applies to training kinds only, not {kind!r} (the serving engines route as "
                     "balanced)")
    imbalance = wl.quantity("moe_imbalance", float_number, 1.0, minimum=1.0, inclusive=True,
                            expected="the busiest expert-parallel rank's load over the mean, >= 1")
    capacity = wl.quantity("moe_capacity_factor", float_number, 0.0,
                           expected="an expert's capacity over its mean share, e.g. 1.25")
    pad = wl.boolean("moe_pad_to_capacity", False)
    if pad and not capacity:
        raise wl.err("moe_pad_to_capacity", "true without moe_capacity_factor (expected a capacity to pad to)")
    return imbalance, capacity, pad


def _cluster(top: _Section, catalog: Catalog) -> Cluster:
    cl = top.section("cluster", CLUSTER_KEYS, required=True)
    assert cl is not None
    name = cl.raw("instance", hint="a hardware_catalog instance, e.g. p5.48xlarge")
    if not isinstance(name, str):
        raise cl.err("instance", f"got {_what(name)} (expected an instance name, e.g. p5.48xlarge)")
    try:
        base = catalog.instance(name)
    except ConfigError as exc:
        raise _relocate(exc, cl.file, cl.path("instance")) from None
    inst = base
    oversubscription = 1.0
    net = cl.section("network", NETWORK_KEYS)
    if net is not None:
        if net.has("fabric"):
            fab_name = net.text("fabric")
            kinds = sorted({f.kind for f in catalog.fabrics.values()})
            if fab_name not in catalog.fabrics and fab_name in kinds:
                # A fabric kind (DESIGN.md: "infiniband | roce"): change the protocol, keep the node's
                # NICs -- the catalog fabric of that kind whose NIC rate is closest to the node's.
                same_kind = [f for f in catalog.fabrics.values() if f.kind == fab_name]
                fabric = min(same_kind, key=lambda f: (abs(f.nic_bytes_per_s - inst.nic_bytes_per_s), f.name))
                inst = dataclasses.replace(inst, fabric=fabric)
            else:
                try:
                    fabric = catalog.fabric(fab_name)
                except ConfigError as exc:
                    raise _relocate(exc, net.file, net.path("fabric")) from None
                inst = dataclasses.replace(inst, fabric=fabric, nic_bytes_per_s=fabric.nic_bytes_per_s)
        if net.has("nics_per_node"):
            inst = dataclasses.replace(inst, num_nics=net.integer("nics_per_node"))
        if net.has("nic_bandwidth"):
            inst = dataclasses.replace(
                inst,
                nic_bytes_per_s=net.quantity(
                    "nic_bandwidth", parse_rate, expected="a rate like '100 Gbps' or '50 GB/s'"
                ),
            )
        if net.has("in_network_reduction"):
            # SHARP: the InfiniBand switches reduce (all-reduce, and with NCCL >= 2.20 reduce-scatter and
            # all-gather); the catalog fabrics leave it off, since NCCL uses it only with the SHARP plugin
            try:
                inst = with_in_network_reduction(inst, net.boolean("in_network_reduction"))
            except ConfigError as exc:
                raise net.err("in_network_reduction",
                              f"true {exc.message} (expected false, or network.fabric: infiniband)") from None
        oversubscription = net.quantity(
            "oversubscription",
            float_number,
            1.0,
            minimum=1.0,
            inclusive=True,
            expected="a ratio >= 1 (1 = non-blocking)",
        )
    rank_unit = cl.choice("rank_unit", RANK_UNITS, "chip")
    if rank_unit == "core":
        if inst.accelerator.cores <= 1:
            raise cl.err("rank_unit", f"core needs an accelerator split into cores; {inst.accelerator.name} "
                                      "has one (expected rank_unit: chip)")
        inst = per_core(inst)
    per_node = inst.num_accelerators
    has_nodes, has_gpus = cl.has("nodes"), cl.has("gpus")
    if not has_nodes and not has_gpus:
        raise cl.err("nodes", f"is required (expected nodes: N, or gpus: a multiple of {per_node})")
    nodes = cl.integer("nodes", counts=True) if has_nodes else None
    gpus = cl.integer("gpus", counts=True) if has_gpus else None
    if gpus is not None:
        if gpus % per_node:
            raise cl.err(
                "gpus",
                f"{gpus} is not a multiple of the {per_node} accelerators of one {name} "
                f"(expected a multiple of {per_node})",
            )
        if nodes is not None and nodes * per_node != gpus:
            raise cl.err(
                "gpus",
                f"{gpus} disagrees with nodes: {nodes} x {per_node} = {nodes * per_node} "
                "(expected nodes or gpus, or both agreeing)",
            )
        nodes = gpus // per_node
    assert nodes is not None
    if nodes * per_node > MAX_GPUS:
        key = "gpus" if has_gpus else "nodes"
        raise cl.err(key, f"{nodes * per_node:,} accelerators is past the {MAX_GPUS:,} any cluster could "
                     f"hold (expected a cluster size such as {16 * per_node})")
    unit = inst.nodes_per_unit
    if inst.provider == "aws" and unit > 1 and nodes % unit:
        key = "gpus" if has_gpus else "nodes"
        raise cl.err(
            key,
            f"{name} is sold in units of {unit} nodes ({unit * per_node} accelerators); {nodes} "
            f"nodes is not a whole number of units (expected a multiple of {unit} nodes)",
        )
    placement = cl.text("placement", "auto", nonempty=True)
    storage = _storage(cl, catalog)
    straggler_cv = 0.0
    sg = cl.section("stragglers", STRAGGLER_KEYS)
    if sg is not None:
        straggler_cv = sg.quantity("cv", float_number, 0.0, minimum=0.0, inclusive=True,
                                   expected="a coefficient of variation >= 0, e.g. 0.02")
        if straggler_cv >= 1.0:
            raise sg.err("cv", f"{straggler_cv} is not below 1 (expected a coefficient of variation, e.g. 0.02)")
    cluster = Cluster(
        instance=inst,
        nodes=nodes,
        gpus=nodes * per_node,
        placement=placement,
        oversubscription=oversubscription,
        storage=storage,
        straggler_cv=straggler_cv,
        rank_unit=rank_unit,
    )
    return cluster


def float_number(value: Any) -> float:
    """A plain number (int or float, not a boolean) as float, for ratios and tolerances."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"got {_what(value)} (expected a number)")
    return float(value)


def _storage(cl: _Section, catalog: Catalog) -> dict[str, Any] | None:
    st = cl.section("storage", STORAGE_KEYS)
    if st is None:
        return None
    out: dict[str, Any] = {"kind": st.text("kind", nonempty=True)}
    if st.has("tier"):
        tier = st.text("tier")
        try:
            catalog.storage_tier(tier)
        except ConfigError as exc:
            raise _relocate(exc, st.file, st.path("tier")) from None
        out["tier"] = tier
    if st.has("deployment"):
        out["deployment"] = st.text("deployment", nonempty=True)
    if st.has("throughput_per_tib"):
        out["throughput_per_tib"] = st.quantity(
            "throughput_per_tib", parse_rate, expected="a rate per TiB like '250 MB/s'"
        )
    if st.has("capacity"):
        out["capacity"] = st.quantity("capacity", parse_bytes, expected="a size like '480 TiB'")
    if st.has("throughput"):
        out["throughput"] = st.quantity("throughput", parse_rate, expected="a rate like '40 GB/s'")
    if st.has("efa"):
        out["efa"] = st.boolean("efa")
        efa_tier = out.get("tier") and catalog.storage_tier(out["tier"]).per_client_efa_bytes_per_s
        if out["efa"] and not efa_tier:
            raise st.err("efa", "true needs an FSx for Lustre PERSISTENT_2 tier (EFA is set at creation, "
                                "PERSISTENT_2 only; expected a fsx-lustre-persistent-2-* tier or efa: false)")
    if st.has("metadata_iops"):
        out["metadata_iops"] = st.integer("metadata_iops", minimum=1, maximum=10_000_000)
    if st.has("prefixes"):
        out["prefixes"] = st.integer("prefixes", minimum=1, maximum=1_000_000)
    return out


def default_grad_reduce_precision(precision: str) -> str:
    """Gradient reduction dtype when the scenario does not say: Megatron-LM accumulates and reduces
    gradients in the parameters' dtype unless ``--accumulate-allreduce-grads-in-fp32``, which it forces
    for bf16 ("bfloat16 requires gradient accumulation and all-reduce to be done in fp32",
    megatron/training/arguments.py); fp8/fp4 recipes keep bf16 parameters, so fp32 too. An fp16 run
    (Megatron-LM ``--fp16``, DeepSpeed fp16) reduces fp16 gradients."""
    return "fp16" if precision == "fp16" else "fp32"


def default_pp_comm(schedule: str) -> bool:
    """Whether a schedule's pipeline sends run beside compute when the scenario does not say: only
    Megatron's non-interleaved 1F1B waits on its own sends (its p2p helpers wait on their requests); its
    interleaved schedule overlaps them (overlap_p2p_comm), and GPipe-style schedules post theirs
    asynchronously."""
    return schedule != "1f1b"


def _parallelism(top: _Section, wl_sec: _Section, workload: Workload, cluster: Cluster) -> Parallelism:
    ps = top.section("parallelism", PARALLELISM_KEYS)
    if ps is None:
        ps = _Section({}, top.file, "parallelism", PARALLELISM_KEYS)
    model = workload.model
    gpus = cluster.gpus
    tp = ps.integer("tp", 1)
    pp = ps.integer("pp", 1)
    cp = ps.integer("cp", 1)
    ep = ps.integer("ep", 1)
    vpp = ps.integer("vpp", 1)
    PE = ParallelismError
    acc = cluster.instance.accelerator
    if workload.fp8_attention and not acc.attention_fp8_efficiency:
        raise wl_sec.err("fp8_attention", f"{cluster.instance.name}: the catalog has no fp8 attention figure for "
                         f"{acc.name} (expected an accelerator with efficiency.attention_fp8 in "
                         "hardware_catalog/accelerators.yaml, or fp8_attention: false)")
    if workload.attention_kernel == "flash1" and not acc.attention_flash1_efficiency:
        raise wl_sec.err("attention_kernel", f"flash1 on {cluster.instance.name}: the catalog has no "
                         f"FlashAttention-1-class figure for {acc.name} (expected an accelerator with "
                         "efficiency.attention_flash1 in hardware_catalog/accelerators.yaml, "
                         "or another kernel)")

    # Megatron-LM shards attention heads over TP ranks; KV heads are split when tp divides them and
    # replicated when kv_heads < tp (Megatron core, TransformerConfig num_query_groups).
    if model.heads % tp:
        raise ps.err(
            "tp",
            f"{tp} does not divide the {model.heads} attention heads of {model.name} "
            f"(expected a divisor of {model.heads})",
            PE,
        )
    if model.kv_heads % tp and tp % model.kv_heads:
        raise ps.err(
            "tp",
            f"{tp} and the {model.kv_heads} KV heads of {model.name} do not divide one another "
            "(expected tp | kv_heads or kv_heads | tp)",
            PE,
        )
    mp = tp * pp * cp
    raw_dp = ps.raw("dp", "auto")
    # kind: rl trains on a pool of the cluster (rl.placement); its workload checks dp and ep there
    pool = workload.kind == "rl"
    if raw_dp == "auto":
        if gpus % mp and not pool:
            raise ps.err(
                "dp",
                f"auto: {gpus} GPUs are not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {mp} "
                f"(expected a GPU count that is a multiple of {mp})",
                PE,
            )
        dp = max(1, gpus // mp)
    else:
        if isinstance(raw_dp, str):
            raise ps.err("dp", f"{raw_dp!r} is not valid (expected auto or an integer >= 1)")
        dp = ps.integer("dp", hint="auto or an integer")
        if mp * dp != gpus and not pool:
            raise ps.err(
                "dp",
                f"tp*pp*cp*dp = {tp}*{pp}*{cp}*{dp} = {mp * dp} does not equal the {gpus} GPUs "
                f"of the cluster (expected dp = {gpus / mp:g}, or dp: auto)",
                PE,
            )
    # Megatron-LM convention: expert-parallel ranks are carved out of the dp*cp ranks; with MoE
    # parallel folding (Megatron-Core >= 0.10; Liu et al. 2025, arXiv 2504.14960) the expert layers
    # regroup all tp*cp*dp ranks of a stage, expert-TP 1, so ep may take TP ranks too.
    if ep > 1:
        if model.moe is None:
            raise ps.err("ep", f"{ep} > 1 but {model.name} is a dense model (expected ep: 1)", PE)
        if model.moe.experts % ep:
            raise ps.err(
                "ep",
                f"{ep} does not divide the {model.moe.experts} experts of {model.name} "
                f"(expected a divisor of {model.moe.experts})",
                PE,
            )
        if (tp * dp * cp) % ep and not pool:
            raise ps.err(
                "ep",
                f"{ep} does not divide the tp*cp*dp = {tp}*{cp}*{dp} = {tp * dp * cp} ranks of a "
                "pipeline stage (expected ep to divide dp*cp, or tp*cp*dp with MoE parallel "
                "folding)",
                PE,
            )
    if workload.moe_imbalance > 1.0 and ep == 1:
        raise wl_sec.err("moe_imbalance", f"{workload.moe_imbalance:g} with ep: 1 (expected ep > 1: a rank that "
                         "holds every expert carries the mean load)", PE)
    # Uneven layer splits are allowed (Megatron-style); every virtual stage needs one layer.
    if vpp > 1 and pp == 1:
        raise ps.err(
            "vpp", f"{vpp} virtual stages need pipeline parallelism (expected pp > 1, or vpp: 1)", PE
        )
    if pp * vpp > model.layers and pp * vpp != model.layers + 2:
        # (layers + 2 stages: the embedding and the loss take one virtual stage each, as in Llama 3)
        field_name = "vpp" if vpp > 1 else "pp"
        raise ps.err(
            field_name,
            f"pp*vpp = {pp}*{vpp} = {pp * vpp} stages exceed the {model.layers} layers "
            f"of {model.name} (expected at most {model.layers} stages, or {model.layers + 2} with the "
            "embedding and the loss on stages of their own)",
            PE,
        )
    schedule = ps.choice("schedule", SCHEDULES, "interleaved" if vpp > 1 else "1f1b")
    if vpp > 1 and schedule != "interleaved":
        raise ps.err("schedule", f"{schedule} with vpp {vpp} (expected interleaved when vpp > 1)")
    if vpp == 1 and schedule == "interleaved":
        raise ps.err("schedule", "interleaved needs virtual stages (expected vpp >= 2, or schedule: 1f1b)")
    if workload.kind in TRAINING_KINDS:
        # Megatron-LM context parallelism cuts each sequence into 2*cp chunks (load-balanced causal).
        if cp > 1 and workload.seq_len % (2 * cp):
            raise ps.err(
                "cp",
                f"seq_len {workload.seq_len} is not divisible by 2*cp = {2 * cp} "
                "(expected seq_len a multiple of 2*cp)",
                PE,
            )
        per_step = dp * workload.micro_batch
        if workload.global_batch % per_step:
            raise ParallelismError(
                f"{workload.global_batch} sequences are not divisible by dp*micro_batch = {dp}*"
                f"{workload.micro_batch} = {per_step} (expected a multiple of {per_step})",
                file=wl_sec.file,
                field=wl_sec.path("global_batch"),
            )
        _check_plan_shape(ps, wl_sec, workload, tp=tp, pp=pp, cp=cp, dp=dp, schedule=schedule)
    ov = ps.section("overlap", OVERLAP_KEYS)
    p2p_overlap = default_pp_comm(schedule)
    overlap = (
        Overlap(pp_comm=p2p_overlap)
        if ov is None
        else Overlap(
            grad_reduce=ov.boolean("grad_reduce", True),
            param_gather=ov.boolean("param_gather", True),
            tp_comm=ov.boolean("tp_comm", False),
            tp_backward=ov.boolean("tp_backward", True),
            tp_qkv=ov.boolean("tp_qkv", True),
            tp_rs_dgrad=ov.boolean("tp_rs_dgrad", False),
            ep_comm=ov.boolean("ep_comm", False),
            pp_comm=ov.boolean("pp_comm", p2p_overlap),
        )
    )
    recompute = ps.choice("recompute", RECOMPUTE, "none")
    modules: tuple[str, ...] = ("core_attn",) if recompute == "selective" else ()
    if ps.has("recompute_modules"):
        raw = ps.raw("recompute_modules")
        if recompute != "selective":
            raise ps.err("recompute_modules", f"given with recompute: {recompute} (expected recompute: selective; "
                         "none keeps every activation and full recomputes whole layers)")
        if not isinstance(raw, (list, tuple)) or not raw or not all(isinstance(m, str) for m in raw):
            raise ps.err("recompute_modules", f"got {_what(raw)} (expected a non-empty list of: "
                         f"{', '.join(RECOMPUTE_MODULES)})")
        for i, name in enumerate(raw):
            if name not in RECOMPUTE_MODULES:
                raise ps.err(f"recompute_modules[{i}]", f"unknown module {name!r}{suggest(name, RECOMPUTE_MODULES)} "
                             f"(expected one of: {', '.join(RECOMPUTE_MODULES)})")
        if len(set(raw)) != len(raw):
            raise ps.err("recompute_modules", f"{list(raw)} names a module twice")
        modules = tuple(raw)
    recompute_layers = ps.integer("recompute_layers", 0, minimum=0)      # 0: every layer
    if recompute_layers:
        if recompute != "full":
            raise ps.err("recompute_layers", f"given with recompute: {recompute} (expected recompute: full; "
                         "it picks how many layers of each virtual stage full recompute covers)")
        most = -(-model.layers // (pp * vpp))
        if recompute_layers > most:
            raise ps.err("recompute_layers", f"{recompute_layers} exceeds the {most} layers of a virtual "
                         f"stage ({model.layers} layers over pp {pp} x vpp {vpp}; expected 1..{most}, or "
                         "omit it to recompute every layer)")
    param_gather = ps.choice("param_gather_precision", PARAM_GATHER_PRECISIONS, "bf16")
    offload = ps.integer("offload_activations", 0, minimum=0)
    if offload:
        # Megatron-Core TransformerConfig refuses the other combinations ("Currently there is no
        # support for Pipeline parallelism with CPU offloading"; "CPU offloading does not work when
        # activation recomputation is enabled"; "CPU offloading can be done only for layers less than
        # num_layers")
        if pp != 1:
            raise ps.err("offload_activations", f"{offload} layers with pp {pp} (expected pp: 1; Megatron-Core "
                         "offloads activations without pipeline parallelism only)")
        if recompute != "none":
            raise ps.err("offload_activations", f"{offload} layers with recompute: {recompute} (expected recompute: "
                         "none; Megatron-Core does not offload recomputed activations)")
        if offload >= model.layers:
            raise ps.err("offload_activations", f"{offload} layers of {model.name}'s {model.layers} (expected fewer "
                         "than the model's layers)")
        if not cluster.instance.accelerator.host_link_bytes_per_s:
            raise ps.err("offload_activations", f"{cluster.instance.name}: the catalog has no host link bandwidth "
                         f"for {cluster.instance.accelerator.name} (expected an accelerator with host_link in "
                         "hardware_catalog/accelerators.yaml, or offload_activations: 0)")
    act_fp8 = ps.boolean("activation_fp8_input", False)
    if act_fp8 and workload.precision not in LOW_PRECISIONS:
        raise ps.err("activation_fp8_input", f"true with workload.precision {workload.precision} (expected an fp8 or "
                     "fp4 recipe: the fp8 copy is Transformer Engine's)")
    if param_gather == "fp8" and workload.precision not in LOW_PRECISIONS:
        raise ps.err("param_gather_precision", f"fp8 with workload.precision {workload.precision} (expected an fp8 "
                     "or fp4 recipe: the fp8 weight copy is Transformer Engine's)")
    zero = ps.integer("zero", 0, minimum=0, maximum=3)
    order = DEFAULT_ORDER
    if ps.has("order"):
        raw = ps.raw("order")
        if not isinstance(raw, (list, tuple)) or not all(isinstance(a, str) for a in raw):
            raise ps.err("order", f"got {_what(raw)} (expected a list of axes: {', '.join(AXES)})")
        for i, axis in enumerate(raw):
            if axis not in AXES:
                raise ps.err(f"order[{i}]", f"unknown axis {axis!r}{suggest(axis, AXES)}")
        if sorted(raw) != sorted(AXES):
            raise ps.err(
                "order",
                f"{list(raw)} is not an ordering of {', '.join(AXES)} "
                "(expected each axis once, innermost first)",
            )
        order = tuple(raw)
    return Parallelism(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        vpp=vpp,
        schedule=schedule,
        sequence_parallel=ps.boolean("sequence_parallel", False),
        recompute=recompute,
        recompute_modules=modules,
        recompute_layers=recompute_layers,
        zero=zero,
        dp_shard=_dp_shard(ps, dp=dp, zero=zero, ep=ep),
        grad_bucket=_grad_bucket(ps),
        grad_reduce_precision=ps.choice("grad_reduce_precision", GRAD_REDUCE_PRECISIONS,
                                        default_grad_reduce_precision(workload.precision)),
        param_gather_precision=param_gather,
        offload_activations=offload,
        activation_fp8_input=act_fp8,
        gradient_accumulation_fusion=ps.boolean("gradient_accumulation_fusion", True),
        cp_comm=_cp_comm(ps, model, tp=tp, cp=cp),
        ep_dispatch=ps.choice("ep_dispatch", EP_DISPATCHES, "alltoall"),
        moe_grouped_gemm=ps.choice("moe_grouped_gemm", MOE_GROUPED_GEMMS, "multi-stream"),
        overlap=overlap,
        order=order,
    )


def _check_plan_shape(ps: _Section, wl_sec: _Section, workload: Workload, *, tp: int, pp: int, cp: int,
                      dp: int, schedule: str) -> None:
    """What the training plan build would refuse, refused at load so that ``lint`` and ``run`` agree:
    the interleaved schedule's groups of pp micro-batches, and a sequence split over the TP ranks."""
    m = workload.global_batch // (dp * workload.micro_batch)
    if schedule == "interleaved" and m % pp:
        # Megatron-Core runs interleaved micro-batches in groups of pp (microbatch_group_size_per_vp_stage)
        # and refuses a last group shorter than pp; PyTorch's ScheduleInterleaved1F1B needs the same
        raise ParallelismError(
            f"the interleaved schedule needs the micro-batches per step, {m} = global_batch / "
            f"(dp·micro_batch), to be a multiple of pp = {pp} (they run in groups of pp); "
            f"make global_batch a multiple of {dp * workload.micro_batch * pp}, or use schedule 1f1b",
            file=wl_sec.file, field=wl_sec.path("global_batch"))
    if ps.boolean("sequence_parallel", False) and tp > 1 and (workload.seq_len // cp) % tp:
        # sequence parallelism splits each rank's tokens (seq_len / cp) over the TP ranks; Megatron-Core's
        # tensor_parallel.mappings asserts "First dimension of the tensor should be divisible by tensor
        # parallel size"
        raise ParallelismError(
            f"seq_len {workload.seq_len} over cp {cp} leaves {workload.seq_len // cp} tokens per rank, which "
            f"sequence parallelism cannot split over tp = {tp} ranks (expected seq_len a multiple of "
            f"cp*tp = {cp * tp}, or sequence_parallel: false)",
            file=wl_sec.file, field=wl_sec.path("seq_len"))


def _cp_comm(ps: _Section, model: Any, *, tp: int, cp: int) -> str:
    """``parallelism.cp_comm``; a2a splits the heads a TP rank holds over the cp ranks, so cp must divide them."""
    comm = ps.choice("cp_comm", CP_COMMS, "ring")
    if comm != "a2a" or cp == 1:
        return comm
    if model.attention == "mla":
        raise ps.err("cp_comm", f"a2a with {model.name}'s MLA attention (expected ring or all-gather: the "
                     "head-split all-to-all is modelled for MHA/GQA)", ParallelismError)
    q_heads, kv_heads = model.heads // tp, model.kv_heads_per_rank(tp)
    if q_heads % cp or kv_heads % cp:
        raise ps.err("cp_comm", f"a2a with cp = {cp}: a TP rank's {q_heads:g} query and {kv_heads:g} K/V heads of "
                     f"{model.name} do not split over {cp} ranks (expected cp to divide both, or cp_comm: ring)",
                     ParallelismError)
    return comm


def _grad_bucket(ps: _Section) -> int:
    """``parallelism.grad_bucket``: parameters per gradient bucket (>= 1M), ``unit`` (0: one per layer) or
    ``megatron`` (:data:`GRAD_BUCKET_MEGATRON`: Megatron-Core's default, growing with the data-parallel size)."""
    raw = ps.raw("grad_bucket", DEFAULT_GRAD_BUCKET)
    if raw == "unit":
        return 0
    if raw == "megatron":
        return GRAD_BUCKET_MEGATRON
    try:
        return ps.integer("grad_bucket", DEFAULT_GRAD_BUCKET, minimum=1_000_000, counts=True)
    except ConfigError as exc:
        raise ps.err("grad_bucket", f"{exc.message}; or unit, one bucket per layer; or megatron, "
                                    "Megatron-Core's max(40M, 1M x dp)") from None


def _dp_shard(ps: _Section, *, dp: int, zero: int, ep: int) -> int:
    """``parallelism.dp_shard``: 0 (all of dp, the default) or the width of a hybrid shard group."""
    raw = ps.raw("dp_shard", "auto")
    if raw == "auto":
        return 0
    if isinstance(raw, str):
        raise ps.err("dp_shard", f"{raw!r} is not valid (expected auto or an integer >= 1)")
    n = ps.integer("dp_shard", hint="auto or an integer")
    if dp % n:
        raise ps.err("dp_shard", f"{n} does not divide dp = {dp} (expected a divisor of {dp}: dp / dp_shard "
                     "replicas of one shard group)", ParallelismError)
    if n == dp:
        return 0
    if zero == 0:
        raise ps.err("dp_shard", f"{n} < dp = {dp} with zero: 0 (expected zero >= 1: without ZeRO nothing is "
                     "sharded; or dp_shard: auto)", ParallelismError)
    if ep > 1:
        raise ps.err("dp_shard", f"{n} < dp = {dp} with ep = {ep} (expected ep: 1 or dp_shard: auto: hybrid "
                     "sharding of expert weights is not modelled)", ParallelismError)
    return n


def _pricing(top: _Section) -> Pricing:
    raw = top.raw("pricing", "on-demand")
    if isinstance(raw, str):
        if raw not in PRICING_OPTIONS:
            raise top.err("pricing", f"{raw!r} is not a pricing option{suggest(raw, PRICING_OPTIONS)}")
        return Pricing(option=raw, usd_per_hour=None)
    if isinstance(raw, Mapping):
        sec = _Section(raw, top.file, "pricing", ("usd_per_hour",))
        price = sec.quantity("usd_per_hour", float_number, expected="US dollars per instance-hour, e.g. 40")
        return Pricing(option=None, usd_per_hour=price)
    raise top.err(
        "pricing", f"got {_what(raw)} (expected one of {', '.join(PRICING_OPTIONS)} or {{usd_per_hour: N}})"
    )


def _checkpoint(top: _Section) -> Checkpoint | None:
    sec = top.section("checkpoint", CHECKPOINT_KEYS)
    if sec is None:
        return None
    return Checkpoint(
        every_s=sec.quantity("every", parse_time, expected="a duration like '30 min'"),
        async_=sec.boolean("async", False),
        grads=sec.boolean("grads", False),
        keep=sec.integer("keep", 1, minimum=1, maximum=10_000),
    )


def _reliability(top: _Section) -> Reliability | None:
    sec = top.section("reliability", RELIABILITY_KEYS)
    if sec is None:
        return None
    restart = sec.quantity("restart", parse_time, minimum=0.0, inclusive=True,
                           expected="a duration like '10 min'")
    if sec.has("node_mtbf") and (sec.has("fleet") or sec.has("rates")):
        raise sec.err("node_mtbf", "give node_mtbf (every node alike) or fleet/rates (per component), "
                                   "not both")
    fleet = sec.text("fleet", None, nonempty=True)
    if fleet is not None:
        fleets = load_catalog().extra.get("failure_rates", {})
        if fleet not in fleets:
            raise sec.err("fleet", f"unknown failure-rate fleet {fleet!r}{suggest(fleet, list(fleets))}")
    rates: dict[str, float] = {}
    if sec.has("rates"):
        rs = sec.raw("rates")
        if not isinstance(rs, Mapping) or not rs:
            raise sec.err("rates", f"got {_what(rs)} (expected a mapping component: interruptions per "
                                   "unit per day)")
        for comp, v in rs.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise sec.err(f"rates.{comp}",
                              f"got {_what(v)} (expected interruptions per unit per day, >= 0)")
            rates[str(comp)] = float(v)
    return Reliability(
        node_mtbf_s=sec.quantity("node_mtbf", parse_time, None, expected="a duration like '1000 h'"),
        restart_s=restart,
        fleet=fleet,
        rates=rates,
        run_length_s=sec.quantity("run_length", parse_time, None, expected="a duration like '54 days'"),
        trials=sec.integer("trials", 200, minimum=1, maximum=10_000),
    )


def _data(top: _Section) -> DataSpec | None:
    sec = top.section("data", DATA_KEYS)
    if sec is None:
        return None
    if sec.has("bytes_per_token") and sec.has("sample_bytes"):
        raise sec.err("sample_bytes", "give bytes_per_token (text) or sample_bytes (whole samples), not both")
    return DataSpec(
        bytes_per_token=sec.quantity("bytes_per_token", parse_bytes, 4.0, expected="a size like '4 B'"),
        sample_bytes=sec.quantity("sample_bytes", parse_bytes, None, expected="a size like '1.5 MB'"),
        prefetch=sec.integer("prefetch", 2, minimum=0, maximum=1024),
        source=sec.choice("source", DATA_SOURCES, "storage"),
        samples_per_file=sec.integer("samples_per_file", None, minimum=1, maximum=10**12),
    )


def _metric_key(sec: _Section, key: str, kind: str, also: tuple[str, ...] = ()) -> str:
    """The result column a measured/expect ``key`` names; ``also`` = other keys allowed there."""
    col = canonical_metric(key)
    allowed = metric_columns(kind)
    if col not in allowed:
        names = allowed + tuple(a for a, c in _ALIASES.items() if c in allowed) + also
        if col in TRAINING_COLUMNS + INFERENCE_COLUMNS + COMMON_COLUMNS:
            raise sec.err(
                key, f"{key!r} is not a metric of a {kind} run (expected one of {', '.join(allowed)})"
            )
        raise sec.err(key, f"unknown key {key!r}{suggest(key, names)}")
    return col


def _measured(top: _Section, kind: str) -> tuple[dict[str, float], str, dict[str, str]]:
    if not top.has("measured"):
        return {}, "", {}
    raw = top.raw("measured")
    if not isinstance(raw, Mapping):
        raise top.err("measured", f"got {_what(raw)} (expected a mapping of result columns, plus source)")
    # metric keys are open-ended (result columns): check them one by one, so _Section allows all here
    sec = _Section(raw, top.file, "measured", tuple(str(k) for k in raw))
    values: dict[str, float] = {}
    for key in raw:
        if key in MEASURED_STRING_KEYS:
            continue
        col = _metric_key(sec, key, kind, MEASURED_STRING_KEYS)
        if col in values:
            raise sec.err(key, f"{col} is given twice (under {key!r} and an alias)")
        if col == "fits":
            raise sec.err(key, "fits is not a measurement (expected a numeric column)")
        try:
            values[col] = parse_metric_value(col, raw[key])
        except ConfigError as exc:
            raise sec.err(key, exc.message) from None
    if not values:
        raise top.err("measured", "gives no measured value (expected a result column such as step_time_s)")
    source = sec.text("source") if sec.has("source") else None
    if source is None or not source.strip():
        raise sec.err("source", "is required with measured values (expected the paper and table, or a URL)")
    notes: dict[str, str] = {}
    if any(c in values for c in FLOPS_METRICS) and not sec.has("flops_formula"):
        given = "/".join(c for c in FLOPS_METRICS if c in values)
        raise sec.err(
            "flops_formula",
            f"is required with {given} (expected the formula the source used: {', '.join(FLOPS_FORMULAS)})",
        )
    if sec.has("flops_formula"):
        notes["flops_formula"] = sec.choice("flops_formula", FLOPS_FORMULAS)
    if sec.has("peak"):
        peak = sec.quantity(
            "peak", parse_flop_rate, expected="the peak the source divided by, e.g. '989 TFLOP/s'"
        )
        notes["peak"] = repr(peak)
    if sec.has("notes"):
        notes["notes"] = sec.text("notes")
    return values, source, notes


def _tolerance_parser(col: str) -> Callable[[Any], float]:
    """An absolute tolerance: a plain number in the column's unit, or a unit string."""

    def parse(value: Any) -> float:
        if isinstance(value, str):
            return parse_metric_value(col, value)
        return float_number(value)

    return parse


def _expect(top: _Section, kind: str) -> dict[str, Expect]:
    if not top.has("expect"):
        return {}
    raw = top.raw("expect")
    if not isinstance(raw, Mapping):
        raise top.err("expect", f"got {_what(raw)} (expected a mapping: column: {{value, rel_tol}})")
    sec = _Section(raw, top.file, "expect", tuple(str(k) for k in raw))
    out: dict[str, Expect] = {}
    for key in raw:
        col = _metric_key(sec, key, kind)
        if col in out:
            raise sec.err(key, f"{col} is given twice (under {key!r} and an alias)")
        band = sec.section(key, EXPECT_KEYS, required=True, what="a mapping {value: ..., rel_tol: ...}")
        assert band is not None
        try:
            value = parse_metric_value(col, band.raw("value", hint="the expected value"))
        except ConfigError as exc:
            raise band.err("value", exc.message) from None
        if not band.has("rel_tol") and not band.has("abs_tol") and col != "fits":
            raise band.err("rel_tol", "is required (expected rel_tol, abs_tol or both)")
        rel = band.quantity("rel_tol", float_number, 0.0, inclusive=True, expected="a fraction, e.g. 0.05")
        abs_tol = band.quantity(
            "abs_tol",
            _tolerance_parser(col),
            0.0,
            inclusive=True,
            expected="a tolerance in the column's unit",
        )
        out[col] = Expect(value=value, rel_tol=rel, abs_tol=abs_tol)
    return out


def _extra(top: _Section, kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, owner in EXTRA_SECTIONS.items():
        if not top.has(key):
            continue
        if kind != owner:
            raise top.err(key, f"is a section of kind: {owner} scenarios (this one is kind: {kind})")
        value = top.raw(key)
        if not isinstance(value, Mapping):
            raise top.err(key, f"got {_what(value)} (expected a mapping)")
        out[key] = copy.deepcopy(dict(value))
    return out


def scenario_from_mapping(
    data: Any,
    *,
    file: str = "<scenario>",
    overrides: Mapping[str, Any] | None = None,
    catalog: Catalog | None = None,
) -> Scenario:
    """Validate a scenario mapping (schema v1) and build the :class:`Scenario`.

    Parameters
    ----------
    data:
        The parsed YAML mapping.
    file:
        Name used in error messages and kept in :attr:`Scenario.file`.
    overrides:
        ``{"parallelism.tp": 4}``: dotted paths set on the raw mapping before validation.
    catalog:
        The catalog to resolve names in (default: :func:`fmsim.catalog.load_catalog`).

    Raises
    ------
    ConfigError, ParallelismError
        With ``file`` and the dotted ``field`` of the first problem.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the file holds {_what(data)} (expected a mapping: version, name, workload, ...)", file=file
        )
    if overrides:
        data = apply_overrides(data, overrides, file=file)
    cat = catalog if catalog is not None else load_catalog()
    stack, inherited = _stack(data, file, cat)
    top = _Section(data, file, "", TOP_KEYS, inherited=inherited, stack=stack)
    version = _version(top)
    name = top.text("name", nonempty=True)
    description = top.text("description", "")
    seed = top.integer("seed", 0, minimum=0)
    configuration, missing = _configuration(top)
    workload, wl_sec = _workload(top, cat)
    cluster = _cluster(top, cat)
    _check_precision(workload, wl_sec, cluster)
    parallelism = _parallelism(top, wl_sec, workload, cluster)
    pricing = _pricing(top)
    measured, measured_source, measured_notes = _measured(top, workload.kind)
    return Scenario(
        name=name,
        description=description,
        version=version,
        file=file,
        seed=seed,
        workload=workload,
        parallelism=parallelism,
        cluster=cluster,
        pricing=pricing,
        checkpoint=_checkpoint(top),
        reliability=_reliability(top),
        data=_data(top),
        measured=measured,
        measured_source=measured_source,
        measured_notes=measured_notes,
        expect=_expect(top, workload.kind),
        extra=_extra(top, workload.kind),
        stack=stack,
        stated=tuple(p for p in SETTABLE if lookup(data, p) is not None or lookup(inherited, p) is not None),
        configuration=configuration,
        configuration_missing=missing,
    )


def _stack(data: Mapping[str, Any], file: str, cat: Catalog) -> tuple[str, dict[str, Any]]:
    """The file's ``stack:`` name and the nested defaults it supplies (empty without one)."""
    name = data.get("stack")
    if name is None:
        return "", {}
    if not isinstance(name, str):
        raise ConfigError(f"got {_what(name)} (expected a stack_catalog name)", file=file, field="stack")
    try:
        profile = cat.stack(name)
    except ConfigError as exc:
        raise _relocate(exc, file, "stack") from None
    workload = data.get("workload")
    workload = workload if isinstance(workload, Mapping) else {}
    check_kind(profile, workload.get("kind"), file=file)
    return name, stack_defaults(profile, workload.get("precision", "bf16"))


def _configuration(top: _Section) -> tuple[str, str]:
    """``configuration: stated`` or ``configuration: {partial: what the source leaves out}``."""
    if not top.has("configuration"):
        return "", ""
    raw = top.raw("configuration")
    if raw == "stated":
        return "stated", ""
    sec = _Section(raw, top.file, "configuration", ("partial",),
                   what="stated, or a mapping {partial: what the source leaves out}")
    return "partial", sec.text("partial", nonempty=True)


def load_scenario(
    path: str | os.PathLike[str],
    overrides: Mapping[str, Any] | None = None,
    *,
    catalog: Catalog | None = None,
) -> Scenario:
    """Read, check and build the scenario in ``path``.

    The file is refused before parsing when over :data:`MAX_FILE_BYTES`; duplicate keys, more than
    :data:`MAX_ALIASES` aliases and alias expansion past :data:`MAX_EXPANDED_NODES` are refused
    with the line. ``overrides`` (``{"parallelism.tp": 4}``) apply before validation.
    """
    file = os.fspath(path)
    text = _read_text(Path(file), file)
    if not text.strip():
        raise ConfigError(
            "the file is empty (expected a scenario mapping: version, name, workload, ...)", file=file
        )
    data = load_yaml_text(text, file=file)
    if data is None:
        raise ConfigError(
            "the file holds no YAML document, only comments (expected a scenario mapping: "
            "version, name, workload, ...)",
            file=file,
        )
    return scenario_from_mapping(data, file=file, overrides=overrides, catalog=catalog)


# ----------------------------------------------------------------------------------------------
# variants of a validated scenario (plan search)

#: parallelism keys whose change makes ``dp`` follow (``auto``) unless it is given too
_SIZE_KEYS = ("tp", "pp", "cp")


def with_plan(
    sc: Scenario,
    *,
    instance: str | None = None,
    nodes: int | None = None,
    cluster: Cluster | None = None,
    micro_batch: int | None = None,
    pricing: Any = None,
    catalog: Catalog | None = None,
    mapping: Mapping[str, Any] | None = None,
    **parallelism: Any,
) -> Scenario:
    """``sc`` with another plan, re-validated by the reader's own checks of what the change touches.

    Loading a file costs milliseconds (YAML, the model, every section); a plan search needs thousands
    of variants of one validated scenario. This re-runs only the ``parallelism:`` rules (always: they tie
    the model, the batch and the cluster together), the ``cluster:`` rules and the precision check when
    the cluster changes, the micro-batch rule and the pricing rule when given -- the same functions
    :func:`scenario_from_mapping` runs, so a variant is accepted or refused exactly as the file with
    those values would be, with the same message.

    Parameters
    ----------
    instance, nodes:
        The cluster (checked as :func:`plan_cluster` checks it).
    cluster:
        Or a cluster :func:`plan_cluster` built already (a search builds each one once).
    micro_batch:
        ``workload.micro_batch``.
    pricing:
        A pricing option name or ``{"usd_per_hour": N}``.
    mapping:
        ``scenario_to_mapping(sc)``, when the caller holds it already (it is not changed).
    **parallelism:
        ``parallelism:`` keys as in the file (``tp=4, pp=2, zero=3, recompute="full"``). A change of
        tp, pp, cp or the cluster makes ``dp`` auto unless ``dp`` is given; a change of ``vpp`` lets
        ``schedule`` follow it, and of ``recompute`` drops ``recompute_modules``/``recompute_layers``,
        unless they are given.

    Raises
    ------
    ConfigError, ParallelismError
        As loading the changed file would.
    """
    unknown = [k for k in parallelism if k not in PARALLELISM_KEYS]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}{suggest(unknown[0], PARALLELISM_KEYS)}",
                          file=sc.file, field="parallelism")
    cat = catalog if catalog is not None else load_catalog()
    file = sc.file
    if mapping is None:
        mapping = scenario_to_mapping(sc, catalog=cat)
    wl_map = dict(mapping["workload"])
    workload = sc.workload
    if micro_batch is not None:
        wl_map["micro_batch"] = micro_batch
        workload = dataclasses.replace(workload, micro_batch=_Section(wl_map, file, "workload", WORKLOAD_KEYS)
                                       .integer("micro_batch", counts=True))
    wl_sec = _Section(wl_map, file, "workload", WORKLOAD_KEYS)
    if cluster is None and (instance is not None or nodes is not None):
        cluster = plan_cluster(sc, instance=instance, nodes=nodes, catalog=cat)
    if cluster is not None:
        _check_precision(workload, wl_sec, cluster)
    else:
        cluster = sc.cluster
    par_map = dict(mapping["parallelism"])
    if "dp" not in parallelism and (cluster is not sc.cluster or any(k in parallelism for k in _SIZE_KEYS)):
        par_map["dp"] = "auto"
    if "vpp" in parallelism:
        par_map.pop("schedule", None)
    if "recompute" in parallelism:
        par_map.pop("recompute_modules", None)
        par_map.pop("recompute_layers", None)
    par_map.update(parallelism)
    top = _Section({"parallelism": par_map}, file, "", TOP_KEYS)
    new_par = _parallelism(top, wl_sec, workload, cluster)
    new_pricing = sc.pricing if pricing is None else _pricing(_Section({"pricing": pricing}, file, "", TOP_KEYS))
    return dataclasses.replace(sc, workload=workload, cluster=cluster, parallelism=new_par, pricing=new_pricing)


def plan_cluster(sc: Scenario, *, instance: str | None = None, nodes: int | None = None,
                 catalog: Catalog | None = None) -> Cluster:
    """``sc``'s cluster with another instance and/or node count, checked by the reader's ``cluster:`` rules.

    Another instance drops the ``cluster.network`` overrides (they describe the old one); placement,
    storage, stragglers and rank unit are kept. The workload's precision is checked by :func:`with_plan`.
    """
    cat = catalog if catalog is not None else load_catalog()
    cl_map = scenario_to_mapping(sc, catalog=cat)["cluster"]
    if instance is not None and instance != cl_map["instance"]:
        cl_map.pop("network", None)
        cl_map["instance"] = instance
    if nodes is not None:
        cl_map["nodes"] = nodes
    return _cluster(_Section({"cluster": cl_map}, sc.file, "", TOP_KEYS), cat)


def _check_precision(workload: Workload, wl_sec: _Section, cluster: Cluster) -> None:
    accel = cluster.instance.accelerator
    if workload.precision not in accel.peak_flop_per_s:
        raise wl_sec.err(
            "precision",
            f"{workload.precision} is not supported by the {accel.name} of "
            f"{cluster.instance.name} (expected one of "
            f"{', '.join(p for p in PRECISIONS if p in accel.peak_flop_per_s)})",
        )


# ----------------------------------------------------------------------------------------------
# writing back


def _reliability_mapping(rel: Reliability) -> dict[str, Any]:
    out: dict[str, Any] = {"restart": rel.restart_s}
    for key, value in (("node_mtbf", rel.node_mtbf_s), ("fleet", rel.fleet),
                       ("run_length", rel.run_length_s)):
        if value is not None:
            out[key] = value
    if rel.rates:
        out["rates"] = dict(rel.rates)
    if rel.trials != 200:
        out["trials"] = rel.trials
    return out


def scenario_to_mapping(sc: Scenario, *, catalog: Catalog | None = None) -> dict[str, Any]:
    """A YAML-able mapping that loads back to an equal scenario (SI numbers, no unit strings)."""
    cat = catalog if catalog is not None else load_catalog()
    wl, par, cl = sc.workload, sc.parallelism, sc.cluster
    model: Any = wl.model.name if cat.models.get(wl.model.name) == wl.model else wl.model.to_mapping()
    workload: dict[str, Any] = {"kind": wl.kind, "model": model, "precision": wl.precision}
    if wl.seq_len:
        workload["seq_len"] = wl.seq_len
    if wl.global_batch:
        workload["global_batch"] = wl.global_batch
    workload["micro_batch"] = wl.micro_batch
    if wl.train_tokens is not None:
        workload["train_tokens"] = wl.train_tokens
    if wl.attention_kernel != "flash":
        workload["attention_kernel"] = wl.attention_kernel
    if wl.fp8_attention:
        workload["fp8_attention"] = True
    if wl.cross_entropy != "fused":
        workload["cross_entropy"] = wl.cross_entropy
    if wl.lora_rank:
        workload["lora"] = {"rank": wl.lora_rank, "modules": wl.lora_modules}
        if wl.lora_dropout:
            workload["lora"]["dropout"] = wl.lora_dropout
        if wl.lora_exchange != "all-gather":
            workload["lora"]["exchange"] = wl.lora_exchange
    if wl.moe_routing != "balanced":
        workload["moe_routing"] = wl.moe_routing
    if wl.moe_imbalance != 1.0:
        workload["moe_imbalance"] = wl.moe_imbalance
    if wl.moe_capacity_factor:
        workload["moe_capacity_factor"] = wl.moe_capacity_factor
        workload["moe_pad_to_capacity"] = wl.moe_pad_to_capacity
    parallelism = {
        "tp": par.tp,
        "pp": par.pp,
        "dp": par.dp,
        "cp": par.cp,
        "ep": par.ep,
        "vpp": par.vpp,
        "schedule": par.schedule,
        "sequence_parallel": par.sequence_parallel,
        "recompute": par.recompute,
        **({"recompute_modules": list(par.recompute_modules)} if par.recompute == "selective" else {}),
        **({"recompute_layers": par.recompute_layers} if par.recompute_layers else {}),
        "zero": par.zero,
        **({"dp_shard": par.dp_shard} if par.dp_shard else {}),
        **({"grad_bucket": {0: "unit", GRAD_BUCKET_MEGATRON: "megatron"}.get(par.grad_bucket, par.grad_bucket)}
           if par.grad_bucket != DEFAULT_GRAD_BUCKET else {}),
        "grad_reduce_precision": par.grad_reduce_precision,
        "param_gather_precision": par.param_gather_precision,
        **({"offload_activations": par.offload_activations} if par.offload_activations else {}),
        **({"activation_fp8_input": True} if par.activation_fp8_input else {}),
        **({} if par.gradient_accumulation_fusion else {"gradient_accumulation_fusion": False}),
        "cp_comm": par.cp_comm,
        "ep_dispatch": par.ep_dispatch,
        **({"moe_grouped_gemm": par.moe_grouped_gemm} if par.moe_grouped_gemm != "multi-stream" else {}),
        "overlap": {
            "grad_reduce": par.overlap.grad_reduce,
            "param_gather": par.overlap.param_gather,
            "tp_comm": par.overlap.tp_comm,
            "tp_backward": par.overlap.tp_backward,
            "tp_qkv": par.overlap.tp_qkv,
            "tp_rs_dgrad": par.overlap.tp_rs_dgrad,
            "ep_comm": par.overlap.ep_comm,
            # pp_comm's default follows the schedule: written only where it departs from it, so that a
            # change of schedule made on this mapping (the explorer's knobs) takes the new default
            **({} if par.overlap.pp_comm == default_pp_comm(par.schedule) else {"pp_comm": par.overlap.pp_comm}),
        },
        "order": list(par.order),
    }
    cluster: dict[str, Any] = {"instance": cl.instance.name, "nodes": cl.nodes, "placement": cl.placement}
    base = cat.instance(cl.instance.name)
    if cl.rank_unit != "chip":
        cluster["rank_unit"] = cl.rank_unit
        base = per_core(base)
    network: dict[str, Any] = {}
    if cl.instance != base:
        network = {
            "fabric": cl.instance.fabric.name,
            "nics_per_node": cl.instance.num_nics,
            "nic_bandwidth": cl.instance.nic_bytes_per_s,
        }
    if cl.instance.fabric.in_network_reduction != cat.fabric(cl.instance.fabric.name).in_network_reduction:
        network["in_network_reduction"] = cl.instance.fabric.in_network_reduction
    if cl.oversubscription != 1.0:
        network["oversubscription"] = cl.oversubscription
    if network:
        cluster["network"] = network
    if cl.storage is not None:
        cluster["storage"] = dict(cl.storage)
    if cl.straggler_cv:
        cluster["stragglers"] = {"cv": cl.straggler_cv}
    out: dict[str, Any] = {"version": sc.version, "name": sc.name}
    if sc.description:
        out["description"] = sc.description
    if sc.stack:
        out["stack"] = sc.stack
    if sc.configuration:
        out["configuration"] = (
            "stated" if sc.configuration == "stated" else {"partial": sc.configuration_missing}
        )
    out["seed"] = sc.seed
    out["workload"] = workload
    out["parallelism"] = parallelism
    out["cluster"] = cluster
    out["pricing"] = (
        sc.pricing.option if sc.pricing.option is not None else {"usd_per_hour": sc.pricing.usd_per_hour}
    )
    if sc.checkpoint is not None:
        out["checkpoint"] = {"every": sc.checkpoint.every_s, "async": sc.checkpoint.async_}
        if sc.checkpoint.grads:
            out["checkpoint"]["grads"] = True
        if sc.checkpoint.keep != 1:
            out["checkpoint"]["keep"] = sc.checkpoint.keep
    if sc.reliability is not None:
        out["reliability"] = _reliability_mapping(sc.reliability)
    if sc.data is not None:
        d = sc.data
        out["data"] = {k: v for k, v in (("bytes_per_token", None if d.sample_bytes else d.bytes_per_token),
                                         ("sample_bytes", d.sample_bytes), ("prefetch", d.prefetch),
                                         ("source", d.source), ("samples_per_file", d.samples_per_file))
                       if v is not None}
    if sc.measured:
        measured: dict[str, Any] = dict(sc.measured)
        measured["source"] = sc.measured_source
        for key in ("flops_formula", "notes"):
            if key in sc.measured_notes:
                measured[key] = sc.measured_notes[key]
        if sc.measured_peak_flop_per_s is not None:
            measured["peak"] = sc.measured_peak_flop_per_s
        out["measured"] = measured
    if sc.expect:
        out["expect"] = {
            k: {
                "value": (bool(e.value) if k == "fits" else e.value),
                "rel_tol": e.rel_tol,
                "abs_tol": e.abs_tol,
            }
            for k, e in sc.expect.items()
        }
    for key, value in sc.extra.items():
        out[key] = copy.deepcopy(dict(value))
    return out
