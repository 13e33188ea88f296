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
format"; the 1 x 128 activation tiles of DeepSeek-V3 §3.3.1) and the combine in BF16. DeepEP moves them at the
NIC's line rate (its tables reach 39-58 GB/s of a 400 Gb/s ConnectX-7's ~50), so the serving model prices them on
a line-rate fabric, as the training model does for ``ep_dispatch: deepep``.

Not here: two-batch overlap (SGLang's ``--enable-two-batch-overlap``, DeepSeek's dual micro-batch), which hides
part of this exchange behind the other micro-batch's compute -- not priced, for want of a source for how much of
it a real overlap hides (the files that ran it say so).
"""
from __future__ import annotations

from .ops import distinct_nodes

DEEPEP_MODES = ("none", "normal", "low_latency")

#: bytes a hidden element takes in DeepEP's FP8 dispatch: one fp8 byte plus an fp32 scale per 128 channels
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0
#: bytes a hidden element takes in the BF16 combine
COMBINE_BYTES = 2.0


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
                   group_topk: int = 0, fp8_dispatch: bool = True) -> tuple[float, float]:
    """(dispatch, combine) bytes each rank sends in one MoE layer: the all-to-all sizes to price.

    ``fp8_dispatch``: DeepEP's FP8 dispatch (weights in fp8 or lower, whose experts take fp8 activations); else the
    dispatch moves 16-bit activations like the combine."""
    if tokens_per_rank <= 0:
        return 0.0, 0.0
    copies = copies_per_token(mode, top_k=top_k, nodes=nodes, groups=groups, group_topk=group_topk)
    rows = tokens_per_rank * copies * hidden
    return rows * (FP8_DISPATCH_BYTES if fp8_dispatch else COMBINE_BYTES), rows * COMBINE_BYTES
