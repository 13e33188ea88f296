"""Two-batch overlap (``serving.two_batch_overlap``): SGLang's ``--enable-two-batch-overlap``, DeepSeek's "dual
micro-batch overlap" (deepseek-ai/open-infra-index, "Day 6 One More Thing", 2025-03-01).

SGLang splits a forward batch into two micro-batches (``two_batch_overlap.compute_split_seq_index``: an extend batch
at the sequence that halves the tokens, a decode batch at half its sequences) and runs the MoE layers' operations of
the two in turn on the one compute stream, each switching at its ``YieldOperation``s (sgl-project/sglang
@1e90555b085425160d0f34fe05c9793f0e422ea2, ``python/sglang/srt/operations_strategy.py``; the executor
``operations.execute_overlapped_operations``: micro-batch A runs ``tbo_delta_stages`` stages first, then A and B
alternate a stage each, then B's last ones). DeepEP's dispatch and combine are each launched (``op_dispatch_a``,
``op_combine_a``) and waited for (``op_dispatch_b``, ``op_combine_b``) in different stages, so one micro-batch's
exchange crosses the network while the other computes. The first ``first_k_dense_replace`` (dense) layers, the
embedding and the LM head run on the whole batch, outside the overlap (``DeepseekV2Model.forward``:
``model_forward_maybe_tbo`` takes ``self.layers[first_k_dense_replace:]``; "dense layer TBO not yet implemented").

The stages per MoE layer, as :data:`PREFILL_LAYER` and :data:`DECODE_LAYER` write them (``|`` a yield):

* prefill (``_compute_moe_deepseek_blog_prefill``, delta 0): attention prepare + core, gate, dispatch launch |
  dispatch wait, routed experts, combine launch | shared experts, combine wait, layer output (and the next layer's
  attention, no yield between layers);
* decode (``_compute_moe_deepseek_blog_decode``, delta 2): attention prepare | attention core, gate | dispatch launch,
  shared experts | dispatch wait, routed experts, combine launch | combine wait | layer output.

The step is that timeline, not a fitted overlap factor (:func:`overlapped_time`): one compute stream runs the two
micro-batches' compute in the order the stages are issued, and waits at a ``*_b`` until that micro-batch's exchange
has landed; the exchanges share the node's network and run one after another in launch order, each starting when
its micro-batch's preceding compute is done. Each micro-batch's pieces are the serving cost model's own at half the
batch (:func:`tbo_gpu_time`), so every GEMM runs at half the rows (lower efficiency, and the weights read twice) and
DeepEP's exchange is priced at half the tokens a rank -- the busiest expert-parallel rank's, where
``workload.moe_imbalance`` says one carries more than the mean (its routed experts and its DeepEP bytes come from the
same pieces, so both micro-batches run at that rank's pace). In prefill SGLang also hands DeepGEMM only the SMs DeepEP's
normal kernels leave (``deep_gemm_num_sms = multi_processor_count - DeepEPConfig.num_sms``, ``Buffer.num_sms`` = 20
by default, deepseek-ai/DeepEP ``deep_ep/buffer.py``): the GEMMs of the overlapped layers run on
:data:`DEEPEP_NORMAL_SMS` fewer SMs. Decode reserves none (``deep_gemm_num_sms=None``; the low-latency kernels hold
SMs only while sending and receiving -- the LMSYS blog 2025-05-05, "Ablation Study: Two-batch Overlap"). Compute
that runs while an exchange is in flight runs at the catalog's ``overlap_clock`` (the power-capped clock of data
movement beside compute, deepseek-ai/DeepGEMM issue #120; the rule training's overlap uses,
``fmsim.parallel.strategy.overlap_slowdown``, whose SM share is here SGLang's own reservation above).

An extend batch under low-latency DeepEP runs without the overlap (``TboDPAttentionPreparer.prepare_all_gather``:
``local_can_run_tbo`` is false for an extend batch in low_latency mode).

Not priced: the send and receive kernels of the low-latency exchange on the compute stream (DeepEP's tables time the
whole call), the contention of overlapped kernels for HBM and SMs beyond DeepEP's reservation (the blog's "potential
noisy neighbor effects"), a split that is not even (one sequence per rank; later SGLang splits inside it).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

#: SMs DeepEP's normal kernels run on, which SGLang's overlapped prefill takes from DeepGEMM: deepseek-ai/DeepEP
#: ``deep_ep/buffer.py`` ``Buffer.num_sms = 20`` (SGLang's ``DeepEPConfig.num_sms`` without SGLANG_DEEPEP_CONFIG)
DEEPEP_NORMAL_SMS = 20

YIELD = "|"
PRE, ATTN, SHARED, EXPERTS = "pre", "attn", "shared", "experts"
SEND_DISPATCH, WAIT_DISPATCH, SEND_COMBINE, WAIT_COMBINE = "send_d", "wait_d", "send_c", "wait_c"
_COMPUTE = (PRE, ATTN, SHARED, EXPERTS)
#: one MoE layer's operations (module docstring); ``pre`` is the layer output, norms and the attention projections
PREFILL_LAYER = (PRE, ATTN, SEND_DISPATCH, YIELD, WAIT_DISPATCH, EXPERTS, SEND_COMBINE, YIELD, SHARED, WAIT_COMBINE)
DECODE_LAYER = (PRE, YIELD, ATTN, YIELD, SEND_DISPATCH, SHARED, YIELD, WAIT_DISPATCH, EXPERTS, SEND_COMBINE, YIELD,
                WAIT_COMBINE, YIELD)
#: ``tbo_delta_stages``: the stages micro-batch A runs before B starts
DELTA_STAGES = {"prefill": 0, "decode": 2}
SCHEDULES = {"prefill": PREFILL_LAYER, "decode": DECODE_LAYER}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HalfLayer:
    """One micro-batch's seconds in one MoE layer: compute pieces and its DeepEP exchange."""

    pre_s: float = 0.0          # layer output, norms, attention projections, router, fixed kernel costs
    attn_s: float = 0.0         # attention core
    shared_s: float = 0.0       # shared experts
    experts_s: float = 0.0      # routed experts' grouped GEMMs
    dispatch_s: float = 0.0
    combine_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.pre_s + self.attn_s + self.shared_s + self.experts_s

    @property
    def comm_s(self) -> float:
        return self.dispatch_s + self.combine_s


@functools.lru_cache(maxsize=64)
def stages(schedule: str, layers: int) -> tuple[tuple[str, ...], ...]:
    """The operations of ``layers`` MoE layers cut at their yields (SGLang's ``_convert_operations_to_stages``: the
    layers' operation lists concatenated, so a layer's last stage and the next one's first are one)."""
    ops = SCHEDULES[schedule] * layers
    out: list[tuple[str, ...]] = []
    cur: list[str] = []
    for op in ops:
        if op == YIELD:
            out.append(tuple(cur))
            cur = []
        else:
            cur.append(op)
    if cur:
        out.append(tuple(cur))
    return tuple(s for s in out if s)


def _run(start: float, work: float, busy: list[tuple[float, float]], k: int, rate: float) -> tuple[float, int]:
    """(end, first busy interval not yet passed) of ``work`` compute seconds from ``start``: at full speed, and at
    ``rate`` of it inside the network's busy intervals (sorted, disjoint; ``k`` the first that may still matter)."""
    t = start
    while k < len(busy) and busy[k][1] <= t:
        k += 1
    while work > 0.0:
        if k >= len(busy):
            return t + work, k
        s, e = busy[k]
        if t < s:
            if work <= s - t:
                return t + work, k
            work -= s - t
            t = s
        cap = (e - t) * rate
        if work <= cap:
            return t + work / rate, k
        work -= cap
        t = e
        k += 1
    return t, k


def overlapped_time(a: HalfLayer, b: HalfLayer, layers: int, schedule: str, overlap_rate: float = 1.0) -> float:
    """Seconds of ``layers`` MoE layers run as two micro-batches with pieces ``a`` and ``b`` (module docstring).

    SGLang's issue order (``execute_overlapped_operations``): A's first ``delta`` stages, then (A, B) a stage each,
    then B's last ``delta``. The compute stream takes each compute piece in that order; a launch starts the exchange
    when the compute before it is done and the network is free; a wait holds the stream until its exchange is done.
    ``overlap_rate``: the speed compute keeps while an exchange is in flight (the catalog's ``overlap_clock``, the
    power-capped clock training's overlap prices too: ``fmsim.parallel.strategy.overlap_slowdown``)."""
    if layers <= 0:
        return 0.0
    if not 0.0 < overlap_rate <= 1.0:
        raise ValueError(f"overlap_rate must be in (0, 1] (got {overlap_rate})")
    st = stages(schedule, layers)
    d = DELTA_STAGES[schedule]
    n = len(st)
    order = [(0, i) for i in range(d)]
    for i in range(n - d):
        order += [(0, i + d), (1, i)]
    order += [(1, i) for i in range(n - d, n)]
    halves = (a, b)
    compute = {PRE: "pre_s", ATTN: "attn_s", SHARED: "shared_s", EXPERTS: "experts_s"}
    stream = net = 0.0
    busy: list[tuple[float, float]] = []
    k = 0
    landed: list[dict[str, float]] = [{}, {}]
    for mb, i in order:
        h = halves[mb]
        for op in st[i]:
            if op in compute:
                stream, k = _run(stream, getattr(h, compute[op]), busy, k, overlap_rate)
            elif op == SEND_DISPATCH or op == SEND_COMBINE:
                start = max(stream, net)
                net = start + (h.dispatch_s if op == SEND_DISPATCH else h.combine_s)
                if net > start:
                    busy.append((start, net))
                landed[mb][op] = net
            else:
                stream = max(stream, landed[mb].pop(SEND_DISPATCH if op == WAIT_DISPATCH else SEND_COMBINE))
    return max(stream, net)


def serial_time(a: HalfLayer, b: HalfLayer, layers: int) -> float:
    """The same two micro-batches with nothing overlapped: every piece one after another."""
    return layers * (a.compute_s + a.comm_s + b.compute_s + b.comm_s)


@functools.lru_cache(maxsize=32)
def _reserved(cost: Any) -> Any:
    """``cost`` with DeepGEMM on the SMs DeepEP's normal kernels leave: the GEMM rate and the wave model's SMs."""
    units = cost.compute_units
    if units <= DEEPEP_NORMAL_SMS:
        return cost
    left = units - DEEPEP_NORMAL_SMS
    return dataclasses.replace(cost, gemm_flop_per_s=cost.gemm_flop_per_s * left / units, compute_units=left,
                               _eff_cache={}, _expert_eff_cache={})


def _half(w: Any) -> Any:
    fields = ("tokens", "logits", "decode_seqs", "decode_ctx", "prefill_pairs", "prefill_kv_reads",
              "rank_tokens", "rank_logits", "rank_prefill_pairs", "rank_prefill_kv_reads")
    return dataclasses.replace(w, **{f: getattr(w, f) / 2 for f in fields if getattr(w, f) is not None})


def halves(cost: Any, w: Any, padded_tokens: float | None = None) -> tuple[float, HalfLayer]:
    """(seconds outside the overlap, one micro-batch's :class:`HalfLayer`) of an iteration doing ``w``.

    Outside: the dense layers' and the LM head's share of the compute on the whole batch, fixed kernel costs but the
    MoE layers', and the collectives other than DeepEP's. A micro-batch: half of ``w`` through the same cost model's
    pieces (``compute_pieces``), the MoE layers' part of each per layer -- attention, element-wise passes and KV writes
    by layer count, the non-expert GEMMs by the MoE layers' share of their FLOPs -- plus DeepEP's exchange at its
    tokens a rank."""
    tok = w.tokens if padded_tokens is None else padded_tokens
    n_moe, n_layers = cost.num_all_to_all // 2, cost.layers
    outside_layers = (n_layers - n_moe) / n_layers
    dense, elem, _, lm, attn, kvw = cost.compute_pieces(w, padded_tokens)
    m, s = cost.moe_layer_dense_share, cost.moe_layer_shared_share
    group = cost.engine_gpus // cost.pp
    other_comm = cost.comm_time(tok) - n_moe * sum(cost.deepep_parts(tok / group))
    outside = (dense * (1.0 - m) + (elem + attn + kvw) * outside_layers + lm + other_comm
               + cost.kernel_time(tok) - cost.moe_layer_kernel_s)
    gemm_cost = _reserved(cost) if cost.deepep == "normal" and w.prefill_pairs > 0 else cost
    hw = _half(w)
    hpad = None if padded_tokens is None else padded_tokens / 2
    h_dense, h_elem, h_experts, _, h_attn, h_kvw = gemm_cost.compute_pieces(hw, hpad)
    dispatch, combine = cost.deepep_parts((tok / 2) / group)
    half = HalfLayer(pre_s=(h_dense * (m - s) + (h_elem + h_kvw) * n_moe / n_layers + cost.moe_layer_kernel_s) / n_moe,
                     attn_s=h_attn / n_layers, shared_s=h_dense * s / n_moe, experts_s=h_experts / n_moe,
                     dispatch_s=dispatch, combine_s=combine)
    return outside, half


def tbo_gpu_time(cost: Any, w: Any, padded_tokens: float | None = None) -> float:
    """GPU seconds of an iteration doing ``w`` with two-batch overlap: the part outside the overlap plus the MoE
    layers' timeline (:func:`overlapped_time`) -- the prefill stages for a batch with prefill work, else decode's."""
    n_moe = cost.num_all_to_all // 2
    if n_moe <= 0:
        return cost._serial_gpu_time(w, padded_tokens)
    outside, half = halves(cost, w, padded_tokens)
    schedule = "prefill" if w.prefill_pairs > 0 else "decode"
    return outside + overlapped_time(half, half, n_moe, schedule, cost.overlap_clock_ratio)


def tbo_decode_coeffs(cost: Any, w: Any, padded_tokens: float) -> tuple[float, float]:
    """(g0, g1): the overlapped decode step as ``g0 + g1 * sum(context)`` (GPU seconds), the tangent of
    :func:`tbo_gpu_time` at ``cost.tbo_decode_context`` tokens a sequence (the workload's mean context): the
    timeline is piecewise linear in the attention time, so one line holds near the context the pool runs at."""
    seqs = max(1.0, float(w.decode_seqs))
    ref = max(0.0, cost.tbo_decode_context) * seqs
    step = 0.05 * ref if ref > 0 else seqs
    s0 = tbo_gpu_time(cost, dataclasses.replace(w, decode_ctx=ref), padded_tokens)
    s1 = tbo_gpu_time(cost, dataclasses.replace(w, decode_ctx=ref + step), padded_tokens)
    g1 = max(0.0, (s1 - s0) / step)
    return s0 - g1 * ref, g1
