"""The ``parallelism:`` section: :class:`Parallelism` and :class:`Overlap`, their keys, choices and
defaults (schedule, recompute, overlap, bucket sizes, precisions of the collectives), and every rule
that ties the plan to the model, the batch and the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..catalog import suggest
from ..errors import ConfigError, ParallelismError
from .cluster import Cluster
from .reader import _Section, _what
from .schema import AXES, LOW_PRECISIONS, TRAINING_KINDS
from .workload import Workload
from ..model.sac import POLICIES as SAC_POLICIES, unsupported as sac_unsupported


SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
#: what `recompute: selective` may run again in the backward, Megatron-Core's --recompute-modules names:
#: the attention core (its default, Korthikanti et al. 2022), the dense MLP block, the MoE block, the
#: experts' activation function, the shared experts, the norms, and MLA's up-projections
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "shared_experts", "layernorm", "mla_up_proj")
#: what decides what `recompute: selective` keeps: modules (the RECOMPUTE_MODULES list above) or torchtitan-op,
#: torchtitan's op-level save list (activation_checkpoint selective_ac_option "op"; fmsim.model.sac)
RECOMPUTE_POLICIES = SAC_POLICIES
DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")  # Megatron-Core RankGenerator default
GRAD_REDUCE_PRECISIONS = ("fp32", "bf16", "fp16")
PARAM_GATHER_PRECISIONS = ("bf16", "fp8")
CP_COMMS = ("ring", "all-gather", "a2a")
EP_DISPATCHES = ("alltoall", "deepep", "hybridep")
#: how a rank's expert GEMMs run (fmsim.model.kernels.grouped_gemm_efficiency): multi-stream, Transformer
#: Engine's GroupedLinear (one cuBLAS GEMM per expert over 4 streams: Megatron-Core's TEGroupedMLP), or
#: fused, one grouped kernel for every expert at the DeepGEMM-grade rate the model reproduces; cutlass-grouped
#: (CUTLASS SM90 grouped GEMM: TE's NVTE_USE_CUTLASS_GROUPED_GEMM) and torch-grouped-mm (torch._grouped_mm:
#: torchtitan), each at the rate its micro-benchmark table gives (fmsim.model.kernels.GROUPED_KERNELS)
MOE_GROUPED_GEMMS = ("multi-stream", "fused", "cutlass-grouped", "torch-grouped-mm")
#: whether a dropless MoE layer's forward waits on the host for its token counts (fmsim.model.fusion
#: attach_sync): per-layer (Megatron-Core's dropless dispatchers: the counts are copied to the host for the
#: all-to-all's split sizes and the grouped GEMM's, once per MoE layer forward) or none (capacity padding,
#: a device-side path, or a stack that was not read)
MOE_HOST_SYNCS = ("none", "per-layer")
#: how ZeRO-3 brings a unit's weights in (fmsim.parallel.zero3): unit (one gather per transformer layer on a
#: stream of its own, prefetched a task ahead: PyTorch FSDP) or deepspeed (DeepSpeed's
#: PartitionedParameterCoordinator of v0.3.12-v0.5.x: one gather per weight tensor as its submodule is
#: entered, the device synchronised at each fetch)
PARAM_FETCHES = ("unit", "deepspeed")
#: the data-parallel gradient reduction under ZeRO: reduce-scatter (each rank keeps its shard), or
#: all-reduce (DeepSpeed ZeRO-3 without contiguous_gradients, its default before v0.5.0, all-reduces each
#: bucket and then keeps its shard)
GRAD_REDUCE_OPS = ("reduce-scatter", "all-reduce")
#: Parameters per gradient bucket when neither the file (``parallelism.grad_bucket``) nor its stack states
#: one: Megatron-Core's minimum --ddp-bucket-size. The stack profiles (stack_catalog/) state each release's
#: own rule -- Megatron-Core's max(40M, 1M x dp) (``grad_bucket: megatron``), NeMo 2.x / Megatron-Bridge's
#: 128 Mi when dp > 1, PyTorch FSDP's one reduce-scatter per unit (``unit``), DeepSpeed's 5e8 elements.
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
    "recompute_policy",
    "zero",
    "dp_shard",
    "grad_bucket",
    "grad_reduce_precision",
    "param_gather_precision",
    "offload_activations",
    "activation_fp8_input",
    "fp8_transpose_cache",
    "gradient_accumulation_fusion",
    "cp_comm",
    "ep_dispatch",
    "moe_grouped_gemm",
    "moe_host_sync",
    "param_fetch",
    "grad_reduce_op",
    "overlap",
    "order",
)
OVERLAP_KEYS = ("grad_reduce", "param_gather", "tp_comm", "tp_backward", "tp_qkv", "tp_rs_dgrad", "ep_comm", "pp_comm")


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
    # with recompute: selective, what decides what is kept: modules (recompute_modules) | torchtitan-op
    # (torchtitan's op-level save list, fmsim.model.sac; recompute_modules then ())
    recompute_policy: str = "modules"
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
    # Transformer Engine's fp8 weight copies (and their transposes for the data gradient) made on a step's first
    # micro-batch and reused by the others (Megatron-Core passes is_first_microbatch to TE); false: made again every
    # micro-batch (Megatron-Core disable_parameter_transpose_cache, NeMo's model key of that name; fp8/fp4 recipes)
    fp8_transpose_cache: bool = True
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
    # alltoall dispatcher), deepep (DeepEP through Megatron-Core's flex dispatcher: a token crosses
    # the scale-out network once per destination node, at DeepEP's rates) or hybridep (HybridEP, the
    # flex dispatcher's GB200/GB300 backend: a token goes once to each destination rank of its NVLink
    # domain, at HybridEP's GB200 rates)
    ep_dispatch: str = "alltoall"
    moe_grouped_gemm: str = "multi-stream"   # MOE_GROUPED_GEMMS
    moe_host_sync: str = "none"              # MOE_HOST_SYNCS
    param_fetch: str = "unit"                # PARAM_FETCHES (ZeRO-3 only)
    # GRAD_REDUCE_OPS; unstated: reduce-scatter with ZeRO, all-reduce without (default_grad_reduce_op;
    # "" on a record built by hand: the same rule)
    grad_reduce_op: str = ""
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


def default_grad_reduce_precision(precision: str) -> str:
    """Gradient reduction dtype when the scenario does not say: Megatron-LM accumulates and reduces
    gradients in the parameters' dtype unless ``--accumulate-allreduce-grads-in-fp32``, which it forces
    for bf16 ("bfloat16 requires gradient accumulation and all-reduce to be done in fp32",
    megatron/training/arguments.py); fp8/fp4 recipes keep bf16 parameters, so fp32 too. An fp16 run
    (Megatron-LM ``--fp16``, DeepSpeed fp16) reduces fp16 gradients."""
    return "fp16" if precision == "fp16" else "fp32"


def default_grad_reduce_op(zero: int) -> str:
    """The gradient reduction when the scenario does not say: with ZeRO each rank keeps its shard
    (reduce-scatter), without it every rank keeps the whole gradient (all-reduce)."""
    return "reduce-scatter" if zero >= 1 else "all-reduce"


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
    if workload.fp8_recipe == "mxfp8" and workload.precision == "fp8" and "fp4" not in acc.peak_flop_per_s:
        # MXFP8 scales blocks of 32 in the tensor cores, which Blackwell's fifth generation adds together with
        # fp4 math (Transformer Engine check_mxfp8_support: compute capability 10.0 or later)
        raise wl_sec.err("fp8_recipe", f"mxfp8 on {cluster.instance.name}: {acc.name} has no block-scaled "
                         "tensor cores (expected a Blackwell-class accelerator, or delayed | current | blockwise)")
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
    policy = ps.choice("recompute_policy", RECOMPUTE_POLICIES, "modules")
    if policy == "torchtitan-op":
        if recompute != "selective":
            raise ps.err("recompute_policy", f"torchtitan-op given with recompute: {recompute} (expected recompute: "
                         "selective; torchtitan's per-layer option is recompute: full with recompute_layers)")
        if ps.has("recompute_modules"):
            raise ps.err("recompute_modules", "given with recompute_policy: torchtitan-op (expected one of the two: "
                         "torchtitan's save list decides op by op, not by module)")
        why = sac_unsupported(model, tp=tp, cp=cp, sequence_parallel=ps.boolean("sequence_parallel", False),
                              precision=workload.precision, attention_kernel=workload.attention_kernel,
                              lora_rank=workload.lora_rank)
        if why:
            raise ps.err("recompute_policy", f"torchtitan-op {why}")
        modules = ()
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
    host_sync = ps.choice("moe_host_sync", MOE_HOST_SYNCS, "none")
    if host_sync == "per-layer" and model.moe is not None and workload.cuda_graphs == "step" \
            and not workload.moe_pad_to_capacity:
        # the wait is a host call inside each MoE layer: a graph of the whole step cannot hold it (Megatron-LM
        # fused_a2a.py: "not compatible with CUDA graph")
        raise ps.err("moe_host_sync", "per-layer with workload.cuda_graphs: step (expected none, or cuda_graphs "
                     "none or layer: a whole-step CUDA graph cannot capture the host's wait for each MoE layer's "
                     "token counts)")
    act_fp8 = ps.boolean("activation_fp8_input", False)
    if act_fp8 and workload.precision not in LOW_PRECISIONS:
        raise ps.err("activation_fp8_input", f"true with workload.precision {workload.precision} (expected an fp8 or "
                     "fp4 recipe: the fp8 copy is Transformer Engine's)")
    t_cache = ps.boolean("fp8_transpose_cache", True)
    if not t_cache and workload.precision not in LOW_PRECISIONS:
        raise ps.err("fp8_transpose_cache", f"false with workload.precision {workload.precision} (expected an fp8 or "
                     "fp4 recipe: the cached copies are Transformer Engine's fp8 weights)")
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
        recompute_policy=policy,
        zero=zero,
        dp_shard=_dp_shard(ps, dp=dp, zero=zero, ep=ep),
        grad_bucket=_grad_bucket(ps),
        grad_reduce_precision=ps.choice("grad_reduce_precision", GRAD_REDUCE_PRECISIONS,
                                        default_grad_reduce_precision(workload.precision)),
        param_gather_precision=param_gather,
        offload_activations=offload,
        activation_fp8_input=act_fp8,
        fp8_transpose_cache=t_cache,
        gradient_accumulation_fusion=ps.boolean("gradient_accumulation_fusion", True),
        cp_comm=_cp_comm(ps, model, tp=tp, cp=cp),
        ep_dispatch=ps.choice("ep_dispatch", EP_DISPATCHES, "alltoall"),
        moe_grouped_gemm=ps.choice("moe_grouped_gemm", MOE_GROUPED_GEMMS, "multi-stream"),
        moe_host_sync=host_sync,
        param_fetch=(fetch := _param_fetch(ps, model, zero=zero, pp=pp, vpp=vpp)),
        grad_reduce_op=_grad_reduce_op(ps, zero=zero, fetch=fetch),
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


def _param_fetch(ps: _Section, model: Any, *, zero: int, pp: int, vpp: int) -> str:
    """``parallelism.param_fetch``: how ZeRO-3 gathers the weights (no effect below ZeRO-3). deepspeed under
    ZeRO-3 needs one stage holding every layer and dense layers."""
    fetch = ps.choice("param_fetch", PARAM_FETCHES, "unit")
    if fetch == "unit" or zero != 3:
        return fetch
    if pp != 1 or vpp != 1:
        raise ps.err("param_fetch", f"deepspeed with zero: 3 and pp {pp}, vpp {vpp} (expected pp: 1 and vpp: 1: the "
                     "DeepSpeed fetch is modelled for one stage holding every layer)", ParallelismError)
    if model.moe is not None or model.mla is not None:
        raise ps.err("param_fetch", f"deepspeed with zero: 3 and {model.name} (expected a dense model with standard "
                     "attention: the DeepSpeed fetch is modelled for its four weight GEMMs per layer)",
                     ParallelismError)
    return fetch


def _grad_reduce_op(ps: _Section, *, zero: int, fetch: str) -> str:
    """``parallelism.grad_reduce_op``: a setting of DeepSpeed's ZeRO-3 (param_fetch: deepspeed), whose v0.3.x
    all-reduces each bucket; elsewhere the reduction follows the ZeRO stage (reduce-scatter with ZeRO,
    all-reduce without) and a file that states another is refused. A stack's value where it does not apply
    gives way to that default."""
    default = default_grad_reduce_op(zero)
    op = ps.choice("grad_reduce_op", GRAD_REDUCE_OPS, default)
    if op == default or fetch == "deepspeed":
        return op
    if ps.data.get("grad_reduce_op") is None:
        return default
    raise ps.err("grad_reduce_op", f"{op} with zero: {zero} and param_fetch: {fetch} (expected {default}: another "
                 "reduction is modelled for DeepSpeed's ZeRO-3 only, param_fetch: deepspeed)", ParallelismError)


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
