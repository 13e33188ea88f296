"""torchtitan's op-level selective activation checkpointing (``parallelism.recompute_policy: torchtitan-op``).

torchtitan wraps each transformer block in a non-reentrant checkpoint whose policy decides, op by op, what the
forward keeps (``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``). The rule, read at
the three commits the stacks and runs here name:

* pytorch/torchtitan torchtitan/parallelisms/parallelize_llama.py @04133643 (2024-04, the code of
  docs/performance.md's A100 table): ``no_recompute_list = {aten.mm, aten._scaled_dot_product_efficient_attention,
  aten._scaled_dot_product_flash_attention, _c10d_functional.reduce_scatter_tensor}``; ``_custom_policy`` counts
  the block's ``aten.mm`` calls (``meta[f"{mode}_mm_count"] += 1``) and saves an op's output when ``func in
  no_recompute_list and not (func == aten.mm and meta[mm_count_key] % 2 == 0)`` -- "Saves output of all compute
  ops, except every second mm".
* torchtitan/models/llama3/infra/parallelize.py @f7084fc7 (v0.1.0): the same rule over ``_save_list``, which adds
  ``aten.max`` ("for low precision training ... the absolute maximum is used to compute the scaling factor"),
  MUST_SAVE for those, PREFER_RECOMPUTE for every other op.
* torchtitan/distributed/activation_checkpoint.py @29624e37 (v0.2.0) ``_apply_op_sac``: the same count and rule
  over ``_op_sac_save_list`` (llama3/infra/parallelize.py @29624e37: the list above plus ``flex_attention``), an
  mm whose weight matches ``per_op_sac_force_recompute_mm_shapes_by_fqns`` (default ``moe.router.gate``, no
  dense layer has one) is recomputed and not counted, and the checkpoint runs with ``early_stop=False``
  (job_config.py @29624e37: ``early_stop: bool = False``): the whole block forward runs again.

The meta counter is made per checkpointed call (``selective_checkpointing_context_fn``: ``meta =
defaultdict(int)``), so the count restarts in every block. A torchtitan Llama block calls ``aten.mm`` in this
order (llama3/model/model.py @29624e37 and @f7084fc7, and llama/model.py @04133643: ``self.wq(x), self.wk(x), self.wv(x)``, then
``self.wo(output)``; ``self.w2(F.silu(self.w1(x)) * self.w3(x))``; ``nn.Linear`` without bias on a 3-D input is
``aten.mm`` after a view): wq 1, wk 2, wv 3, wo 4, w1 5, w3 6, w2 7 -- so wq, wv, w1 and w2 are kept and wk, wo
and w3 run again. An ungated MLP (w1, w2) continues the count the same way (:func:`layer_mms`).

What a block keeps, per token (16-bit, 2 B per element; :func:`saved_bytes_per_token`): its input (the
checkpoint's argument), the kept mm outputs, and SDPA's output when SDPA ran its flash or efficient backend. Its
log-sum-exp (fp32 per head) is left out, as :func:`fmsim.model.memory.layer_activation_bytes` leaves it out of
every other policy. SDPA's cuDNN backend (``aten._scaled_dot_product_cudnn_attention``, which torchtitan 0.2
puts first on every GPU: torchtitan/models/attention.py @29624e37) is in none of the three lists: its output is
recomputed and not kept (:func:`attention_kept`).

What runs again in the backward (:func:`recompute_pass`): every op of the block but the kept ones -- the norms,
the rotary, ``repeat_kv`` and the transposes, SwiGLU, the residual adds (each with the extra kernels its
``kernel_fusion`` level runs, :mod:`fmsim.model.fusion`), wk, wo, w3, and the attention core under cuDNN. The
v0.1 and 2024 code leave PyTorch's default early stop on (torch.utils.checkpoint docs: ``early_stop`` "Default:
True", recomputation stops once every needed tensor is made again), which would skip the block's last residual add (3 B per
element of the hidden width and one kernel); not modelled.

Under tensor parallelism (apply_tp @f7084fc7: sequence-parallel norms, column-parallel wq/wk/wv/w1/w3,
row-parallel wo/w2 with ``output_layouts=Shard(1)``) the two reduce-scatters' outputs are kept and the two
all-gathers in front of the attention and the MLP run again.

Refused, with a located line, where the rule above does not say what happens (fmsim.scenario.parallelism):
context parallelism, TP without sequence parallelism or over fewer K/V heads than ranks, MoE and
MLA layers (torchtitan's MoE runs ``torch._grouped_mm``, not read this session), biased linear layers
(``aten.addmm``, not in the list), fp8/fp4 (torchao's float8 linears call ``torch._scaled_mm``, not in the list:
not read), LoRA, local attention, and attention kernels that are not SDPA's (``flash1``, ``unfused``). Under
``kernel_fusion: fused`` -- fmsim's default where a file names no stack; torchtitan itself runs ``eager`` or
``compiled`` -- the rerun's non-GEMM work is priced at the fused kernels the forward is priced at, its GEMMs still
torchtitan's wk, wo and w3.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .flops import attention_dims

if TYPE_CHECKING:
    from .architecture import ModelSpec
    from .ops import PassCost, Roofline, Shard

__all__ = ["POLICIES", "PRICED_ATTENTION_KERNELS", "attention_kept", "layer_mms", "recompute_pass", "saved_bytes_per_token",
           "unsupported"]

#: ``parallelism.recompute_policy``: modules (Megatron-Core's --recompute-modules list, ``recompute_modules``) |
#: torchtitan-op (the op-level save list above)
POLICIES = ("modules", "torchtitan-op")
#: attention kernels the policy can price: SDPA's flash backend (FlashAttention-2: kept) and ``flash``, which is
#: FlashAttention-2 too on a chip whose catalog has no separate FA2 figure (Ampere: docs/design-notes.md) and SDPA's
#: cuDNN backend elsewhere (not named by the list: recomputed) -- :func:`attention_kept`
PRICED_ATTENTION_KERNELS = ("flash2", "flash")


def attention_kept(attention_kernel: str, flash_is_fa2: bool) -> bool:
    """Whether the block keeps SDPA's output: its flash backend ran (``flash2``, or ``flash`` where the chip's
    best kernel is FlashAttention-2, ``flash_is_fa2``), not its cuDNN backend. torchtitan 0.2 puts cuDNN first on
    every GPU (attention.py @29624e37), so on an Ampere chip its attention would be recomputed, which the
    kernel name cannot tell from FlashAttention-2 there: not modelled."""
    return attention_kernel == "flash2" or (attention_kernel == "flash" and flash_is_fa2)


def layer_mms(model: ModelSpec, tp: int = 1) -> tuple[tuple[str, float, float, bool], ...]:
    """The ``aten.mm`` calls of one dense block in torchtitan's order, as one of ``tp`` tensor-parallel ranks runs
    them: (name, output width n, reduction depth k, kept), an (tokens x k)·(k x n) product each; the 1st, 3rd,
    5th ... are kept (the count's odd values). Under TP (apply_tp, llama3/infra/parallelize.py @f7084fc7) wq, wk,
    wv, w1, w3 are column-parallel (their outputs split over tp) and wo, w2 row-parallel (their inputs split,
    their outputs the full width: partial sums)."""
    h = model.hidden
    dq, dv = attention_dims(model)
    kv = model.kv_heads_per_rank(tp) * model.head_dim
    ffn = model.ffn_hidden
    shapes = [("wq", dq / tp, h), ("wk", kv, h), ("wv", kv, h), ("wo", h, dv / tp), ("w1", ffn / tp, h)]
    shapes += [("w3", ffn / tp, h), ("w2", h, ffn / tp)] if model.gated else [("w2", h, ffn / tp)]
    return tuple((name, n, k, i % 2 == 1) for i, (name, n, k) in enumerate(shapes, start=1))


def saved_bytes_per_token(model: ModelSpec, keep_attention: bool, tp: int = 1) -> float:
    """Bytes one block keeps per token on one of ``tp`` ranks: its input (its sequence shard under TP's sequence
    parallelism), the kept mm outputs, SDPA's output if kept, and under TP the two reduce-scatters' outputs
    (``reduce_scatter_tensor`` is on the list: the sequence shards of wo's and w2's outputs)."""
    kept = sum(n for _, n, _, keep in layer_mms(model, tp) if keep)
    _, dv = attention_dims(model)
    attn = dv / tp if keep_attention else 0.0
    scattered = 2 * model.hidden / tp if tp > 1 else 0.0
    return 2.0 * (model.hidden / tp + kept + attn + scattered)


def recompute_pass(model: ModelSpec, sh: Shard, rf: Roofline, attn: PassCost, mlp: PassCost, *,
                   keep_attention: bool) -> PassCost:
    """The forward work one block runs again in its backward: ``attn`` and ``mlp`` (its two blocks' forward
    costs, host seconds attached) less the kept mm's and, when ``keep_attention`` (:func:`attention_kept`), the
    attention core. Its
    ``flops`` are what runs again (the hardware FLOPs recompute adds)."""
    from .fusion import host_per_kernel_s
    from .ops import PassCost

    from .ops import CommRequest

    T = sh.tokens
    mms = layer_mms(model, sh.tp)
    # the forward's GEMM launches: one per mm where the projections are separate nn.Linear layers (fusion.py), one
    # QKV, one output projection, one FC1 and one FC2 under the fused kernels
    launches = 4 if sh.kernel_fusion == "fused" else len(mms)
    rec = PassCost(memory_s=attn.memory_s + mlp.memory_s, kernels=attn.kernels + mlp.kernels - launches)
    for _, n, k, keep in mms:
        if keep:
            continue
        t, f = rf.gemm(T, n, k)
        rec.gemm_s += t
        rec.flops += f
        rec.kernels += 1
    core = attn.parts.get("core_attn")
    if core is not None:
        if keep_attention:
            rec.kernels -= core.kernels or 1         # the SDPA call itself (its kernel is counted with the block's)
        else:
            rec.attention_s += core.attention_s
            rec.flops += core.flops
    if sh.tp > 1:
        # the sequence-parallel all-gathers in front of the attention and the MLP run again
        # (_c10d_functional.all_gather_into_tensor is not on the list), the reduce-scatters are kept; torchtitan
        # waits on each before its GEMM (no async TP by default: enable_async_tp False), so nothing hides them
        rec.comms += [CommRequest("tp", "all-gather", T * model.hidden * rf.act_bytes) for _ in range(2)]
    # the host issues the rerun's kernels as it issues a recompute module's (fusion.attach_host)
    fwd_k, bwd_k = host_per_kernel_s(sh)
    graphed = sh.cuda_graphs != "none"
    rec.host_s = 0.0 if graphed else rec.kernels * fwd_k
    rec.host_bwd_s = 0.0 if graphed else 2.0 * rec.kernels * bwd_k
    return rec


def unsupported(model: ModelSpec, *, tp: int, cp: int, sequence_parallel: bool, precision: str,
                attention_kernel: str, lora_rank: int) -> str:
    """Why the policy cannot be priced for this run ("" when it can): the cases the save list does not settle."""
    if cp != 1:
        return (f"cp {cp} (expected cp 1: torchtitan's context parallelism runs SDPA through its ring-attention "
                "dispatch, not read)")
    if tp > 1 and not sequence_parallel:
        return (f"tp {tp} without sequence_parallel (expected sequence_parallel: true: torchtitan's TP plan shards "
                "the norms over the sequence, apply_tp @f7084fc7)")
    if tp > 1 and model.kv_heads % tp:
        return (f"tp {tp} over {model.name}'s {model.kv_heads} K/V heads (expected tp dividing them: torchtitan "
                "splits wk and wv column-wise)")
    if model.moe is not None or model.attention == "mla":
        return (f"{model.name} has {'MoE' if model.moe is not None else 'MLA'} layers (expected a dense Llama-style "
                "block: torchtitan's MoE and MLA blocks were not read)")
    if model.bias:
        return (f"{model.name}'s linear layers have biases (expected none: a biased nn.Linear is aten.addmm, "
                "which the save list does not name)")
    if model.window is not None:
        return f"{model.name} has local attention (expected global attention: SDPA's causal kernels)"
    if precision in ("fp8", "fp4"):
        return (f"workload.precision {precision} (expected a 16-bit run: torchao's float8 linears call "
                "torch._scaled_mm, which the save list does not name, not read)")
    if lora_rank:
        return "with LoRA (expected full training: torchtitan trains every weight)"
    if attention_kernel not in PRICED_ATTENTION_KERNELS:
        return (f"with workload.attention_kernel {attention_kernel} (expected flash2 or flash: SDPA's flash "
                "backend, kept, or its cuDNN backend, recomputed)")
    return ""
