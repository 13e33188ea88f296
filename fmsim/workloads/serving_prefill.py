"""The analytical serving estimate's prefill: prompts batched into iterations as the engine forms them.

The discrete-event engine (fmsim.engine.serving_des) fills each iteration with prefill chunks up to its token
budget (``max_batch_tokens``, less the decodes riding along in a mixed batch), so a prompt's prefill shares its
iteration -- its fixed kernel and CPU costs, its weight reads, its expert exchange -- with the other prompts
admitted at the same time. In steady state about ``b / osl`` sequences finish (and as many enter) per decode
step of a batch of ``b`` (offline and closed-loop traffic), or ``lambda * t_step`` under an open-loop rate: that
many prompts share a prefill iteration, within the token budget, at least one and at most the batch. The
per-prompt price is that iteration's time over its prompts -- where the engine mixes prefill and decode in one
iteration, what the prompts add to the decode iteration they ride in; with attention DP the iteration is the
busiest rank's (:func:`fmsim.engine.serving_des.busiest_rank`, the engine's own rule).
"""
from __future__ import annotations

import math
from typing import Any

from ..engine.serving_des import busiest_rank
from ..model.serving_cost import IterationWork, kv_stream_tokens


def prefill_batch_work(cost: Any, prompts: int, prompt: int, cached: int = 0, *, decodes: int = 0,
                       decode_ctx: float = 0.0) -> IterationWork:
    """One iteration prefilling ``prompts`` prompts of ``prompt`` tokens whole (``cached`` of each already in
    KV), with ``decodes`` decoding sequences riding along (``decode_ctx``: their context, summed): each prompt's
    work summed, and the busiest attention rank's as the engine builds it."""
    new = max(1, prompt - cached)
    prompts = max(1, int(prompts))
    return IterationWork(tokens=prompts * new + decodes, logits=prompts + decodes, decode_seqs=decodes,
                         decode_ctx=decode_ctx, prefill_pairs=prompts * cost.prefill_pairs(new, cached),
                         prefill_kv_reads=prompts * kv_stream_tokens(new, cached),
                         **busiest_rank(cost, [(new, cached, True)] * prompts, decodes))


def prefill_batch_time(cost: Any, prompts: int, prompt: int, cached: int = 0, *, decodes: int = 0,
                       decode_ctx: float = 0.0) -> float:
    """Seconds of the iteration of :func:`prefill_batch_work` (``prompts`` = 1, no decodes:
    ``cost.prefill_time``)."""
    return cost.iteration_time(prefill_batch_work(cost, prompts, prompt, cached, decodes=decodes,
                                                  decode_ctx=decode_ctx))


def prompts_per_iteration(entering: float, prompt: int, cached: int, *, budget_tokens: float,
                          batch: float) -> int:
    """Prompts sharing a prefill iteration: ``entering`` per decode step, as many as the iteration's token
    budget (``budget_tokens``: the engine's ``max_batch_tokens`` less the decodes it carries) holds, at least
    one (a prompt larger than the budget runs alone, as the engine lets it), at most ``batch``."""
    fit = math.floor(max(0.0, budget_tokens) / max(1, prompt - cached))
    return max(1, min(round(entering), fit, math.floor(batch)))


__all__ = ["prefill_batch_time", "prefill_batch_work", "prompts_per_iteration"]
