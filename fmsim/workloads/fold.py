"""Folding a training step's repeated micro-batches (DESIGN.md principle 5): the step is affine in the micro-batch
count past the pipeline's warm-up, so the engine (:func:`fmsim.workloads.pretrain.simulate_folded`) and the
estimate's ZeRO-3 chains (:mod:`fmsim.workloads.training_estimate`) run three counts and extrapolate."""
from __future__ import annotations

from collections.abc import Sequence

#: micro-batches per step simulated event by event; past this the steady state is folded (below)
FOLD_ABOVE = 128


def fold_counts(m: int, pp: int) -> tuple[int, int, int]:
    """Three micro-batch counts, each past the pipeline's warm-up, a whole number of groups of pp
    apart and congruent to ``m`` modulo pp (the interleaved schedule's period is a group of pp
    micro-batches, 1F1B's and GPipe's one): the step is affine in m from the warm-up on, so two of
    them give its slope and the third checks it."""
    base = max(4, -(-16 // pp)) * pp + m % pp
    return base, base + 2 * pp, base + 4 * pp


def _extrapolate(counts: Sequence[int], values: Sequence[float], m: int) -> float:
    """The affine extrapolation to ``m`` of ``values`` at ``counts[0]`` and ``counts[1]``."""
    (m1, m2), (v1, v2) = counts[:2], values[:2]
    return v1 + (m - m1) * (v2 - v1) / (m2 - m1)


__all__ = ["FOLD_ABOVE", "fold_counts"]
