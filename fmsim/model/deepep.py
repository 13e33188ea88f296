"""DeepEP's MoE token exchange as serving engines run it with data-parallel attention (``serving.deepep``).

DeepEP (deepseek-ai/DeepEP) replaces the all-to-all of each token's top-k hidden states with two kernel families
(README @ebfe47e4, "Performance"; ``hardware_catalog/measurements/h800_deepep.csv``):

* ``normal`` -- "NVLink and RDMA forwarding": a token crosses the scale-out network once per distinct remote node
  among its top-k experts and fans out over NVLink there (DeepSeek-V3 technical report, arXiv 2412.19437,
  §3.2.2: "IB ... then forwarded via NVLink to specific GPUs"; each token reaches at most 4 nodes, §2.1.2). The
  bytes are those of the training model's hierarchical dispatch (``fmsim.model.ops``, ``ep_dispatch: deepep``):
  ``distinct_remote + k / N`` copies a token instead of k. SGLang runs it for prefill.
* ``low_latency`` -- "pure RDMA": every (token, expert) copy goes to its expert's GPU directly, no forwarding, so k
  copies a token; SGLang runs it for decode (CUDA-graph compatible).

Both send the dispatch in FP8 with one fp32 scale per 128 channels (DeepEP: "FP8 dispatch, BF16 combine";
DeepSeek's Day 6 note: "dispatch transmissions adopt the FP8 format ... combine transmissions use the BF16
format"; the 1 x 128 activation tiles of DeepSeek-V3 §3.3.1) and the combine in BF16.

This module counts the bytes; DeepEP's measured kernels price them (:func:`layer_time_fn`, through
``fmsim.hardware.dispatch`` and ``hardware_catalog/dispatch.yaml``, the README's V1 tables):

* ``normal``: the normal kernels' NVLink and RDMA bandwidths per EP size, the path training's ``ep_dispatch: deepep``
  takes (``fmsim.hardware.collectives.all_to_all_time(kernel="deepep")``);
* ``low_latency``: the low-latency kernels' dispatch and combine bandwidths per EP size, measured at 128 tokens a
  rank. A low-latency call takes at most ``num_max_dispatch_tokens_per_rank`` tokens (DeepEP asserts it; its README
  recommends below 256); SGLang sets 128 (:data:`LL_MAX_DISPATCH_TOKENS`), and a larger batch a rank runs as
  ``ceil(tokens / 128)`` calls -- the blog's decode batch of 256 a GPU ran with two-batch overlap, two micro-batches
  of 128 (sgl-project/sglang issue #6017, the decode command: ``--cuda-graph-bs 256 --enable-two-batch-overlap``).
  Each call is the table's bandwidth over its bytes (the time linear in tokens below 128: the table has one token
  count, so no fixed part is known), never below one hop of the farthest link.

Neither pays NCCL's send/recv protocol latencies or its per-peer proxy posts: DeepEP is not NCCL.

Two-batch overlap (SGLang's ``--enable-two-batch-overlap``, DeepSeek's dual micro-batch), which hides this exchange
behind the other micro-batch's compute, is :mod:`fmsim.model.tbo`: it takes the dispatch and the combine apart
(:func:`layer_times_fn`) and places each on the timeline SGLang's stages give.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .ops import distinct_nodes

DEEPEP_MODES = ("none", "normal", "low_latency")

#: bytes a hidden element takes in DeepEP's FP8 dispatch: one fp8 byte plus an fp32 scale per 128 channels
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0
#: bytes a hidden element takes in the BF16 combine
COMBINE_BYTES = 2.0
#: SGLang's ``num_max_dispatch_tokens_per_rank`` for DeepEP's low-latency buffer: 128, hard-coded ("TODO(ch-wan):
#: allow users to set this value"; sgl-project/sglang @0004ba713aa6ab0c03a8582939a9177ad221b293,
#: python/sglang/srt/layers/moe/ep_moe/token_dispatcher.py, DeepEPDispatcher.__init__), later the environment
#: variable SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK with the same default
LL_MAX_DISPATCH_TOKENS = 128


def copies_per_token(mode: str, *, top_k: int, nodes: int, groups: int = 1, group_topk: int = 0) -> float:
    """Copies of one token's hidden state that one exchange moves (the nccl-tests all-to-all size, per token).

    ``low_latency`` sends one per chosen expert (k); ``normal`` over ``nodes`` > 1 sends one per distinct remote node
    plus the copies that stay on the sending node (``distinct_nodes(N, k, groups, group_topk) (N-1)/N + k/N``, the
    training model's hierarchical dispatch); inside one node both send k over NVLink."""
    if mode not in DEEPEP_MODES[1:]:
        raise ValueError(f"deepep mode must be one of {', '.join(DEEPEP_MODES[1:])} (got {mode!r})")
    if top_k < 1 or nodes < 1:
        raise ValueError(f"top_k and nodes must be >= 1 (got {top_k}, {nodes})")
    if mode == "low_latency" or nodes == 1:
        return float(top_k)
    met = distinct_nodes(nodes, top_k, groups, group_topk)
    return met * (nodes - 1) / nodes + top_k / nodes


def exchange_sizes(mode: str, *, tokens_per_rank: float, hidden: int, top_k: int, nodes: int, groups: int = 1,
                   group_topk: int = 0, fp8_dispatch: bool = True, load: float = 1.0) -> tuple[float, float]:
    """(dispatch, combine) bytes each rank sends in one MoE layer: the all-to-all sizes to price.

    ``fp8_dispatch``: DeepEP's FP8 dispatch (weights in fp8 or lower, whose experts take fp8 activations); else the
    dispatch moves 16-bit activations like the combine. ``load``: the busiest expert-parallel rank's routed rows over
    the mean (``workload.moe_imbalance``): that rank receives (dispatch) and sends back (combine) ``load`` times the
    mean, and the exchange ends when it has -- so the sizes priced are its (the kernel tables are symmetric: a rank's
    send and receive run at the same rates; its forwarded RDMA traffic is taken at the same load, not averaged over
    its node's ranks)."""
    if tokens_per_rank <= 0:
        return 0.0, 0.0
    copies = copies_per_token(mode, top_k=top_k, nodes=nodes, groups=groups, group_topk=group_topk)
    rows = tokens_per_rank * copies * hidden
    if load != 1.0:
        rows *= load
    return rows * (FP8_DISPATCH_BYTES if fp8_dispatch else COMBINE_BYTES), rows * COMBINE_BYTES


def layer_time_fn(mode: str, instance: Any, *, hidden: int, top_k: int, nodes: int, groups: int = 1,
                  group_topk: int = 0, fp8_dispatch: bool = True,
                  max_tokens: int = LL_MAX_DISPATCH_TOKENS, load: float = 1.0) -> Callable[[float, int], float]:
    """``(tokens per rank, EP size) -> seconds`` of one MoE layer's DeepEP dispatch plus combine on ``instance``:
    :func:`exchange_sizes`'s bytes through DeepEP's measured kernels (module docstring). ``nodes``: the nodes the EP
    group spans (its members packed into as few as it fills)."""
    parts = layer_times_fn(mode, instance, hidden=hidden, top_k=top_k, nodes=nodes, groups=groups,
                           group_topk=group_topk, fp8_dispatch=fp8_dispatch, max_tokens=max_tokens, load=load)

    def fn(tokens_per_rank: float, ep: int) -> float:
        return sum(parts(tokens_per_rank, ep))

    return fn


def layer_times_fn(mode: str, instance: Any, *, hidden: int, top_k: int, nodes: int, groups: int = 1,
                   group_topk: int = 0, fp8_dispatch: bool = True,
                   max_tokens: int = LL_MAX_DISPATCH_TOKENS,
                   load: float = 1.0) -> Callable[[float, int], tuple[float, float]]:
    """:func:`layer_time_fn`'s two parts, ``(tokens per rank, EP size) -> (dispatch, combine)`` seconds: two-batch
    overlap (fmsim.model.tbo) launches and waits for each on its own. ``load``: the busiest rank's bytes
    (:func:`exchange_sizes`); a low-latency call count follows the tokens a rank sends, not what it receives."""
    from ..hardware.collectives import GroupShape, all_to_all_time
    from ..hardware.dispatch import deepep_low_latency_rates

    if mode not in DEEPEP_MODES[1:]:
        raise ValueError(f"deepep mode must be one of {', '.join(DEEPEP_MODES[1:])} (got {mode!r})")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (got {max_tokens})")
    acc = instance.num_accelerators
    affine: dict[int, tuple[float, float]] = {}
    rates: dict[int, tuple[float, float, float]] = {}

    def normal_s(size: float, ep: int) -> float:
        # the normal kernels' cost is one hop plus the bytes over the EP size's rates: affine in the size, so two
        # evaluations per EP size give it exactly
        ab = affine.get(ep)
        if ab is None:
            shape = GroupShape(size=ep, per_node=min(ep, acc))
            t1, t2 = (all_to_all_time(x, instance, shape, nodes=nodes, kernel="deepep").time_s
                      for x in (1.0, 2.0 ** 30))
            slope = (t2 - t1) / (2.0 ** 30 - 1.0)
            ab = affine[ep] = (t1 - slope, slope)
        return ab[0] + ab[1] * size if size > 0 else 0.0

    def fn(tokens_per_rank: float, ep: int) -> tuple[float, float]:
        if tokens_per_rank <= 0 or ep <= 1:
            return 0.0, 0.0
        dispatch, combine = exchange_sizes(mode, tokens_per_rank=tokens_per_rank, hidden=hidden, top_k=top_k,
                                           nodes=nodes, groups=groups, group_topk=group_topk,
                                           fp8_dispatch=fp8_dispatch, load=load)
        if mode == "normal":
            return normal_s(dispatch, ep), normal_s(combine, ep)
        r = rates.get(ep)
        if r is None:
            r = rates[ep] = deepep_low_latency_rates(ep, instance)
        calls = math.ceil(tokens_per_rank / max_tokens)
        # each call: its bytes over the table's rate, never below one hop (dispatch.deepep_low_latency_s)
        return calls * max(dispatch / calls / r[0], r[2]), calls * max(combine / calls / r[1], r[2])

    return fn
