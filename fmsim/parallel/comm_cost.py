"""Collective costs over a plan's placed parallel groups, shared across the plans of a search.

Owns: where each parallel axis's group sits on the cluster (:func:`place`, memoised per instance
object and node count), what a collective over such a group costs (:class:`CommCoster`, its memo
shared by every plan on the same instance and node count, with the line-rate twin DeepEP-class
dispatch runs at), and how much speed compute loses while a collective runs beside it
(:func:`overlap_slowdown`). Both memos are bounded and cleared by
:func:`fmsim.parallel.strategy.clear_caches`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..catalog import Instance
from ..hardware.collectives import CollectiveCost, GroupShape, all_to_all_time, collective_time
from ..hardware.topology import place
from ..model.ops import CommRequest

#: SMs a collective kernel occupies while it runs beside compute (see overlap_slowdown).
COMM_SMS = 20


def overlap_slowdown(instance: Instance, comm_sms: int = COMM_SMS) -> float:
    """Share of its speed compute loses while a collective runs beside it.

    Two effects multiply: the collective's kernels occupy about 20 SMs (DeepSeek-V3 technical report,
    arXiv 2412.19437, §3.2.2, on H800; Transformer Engine's userbuffers configs give the pipelined TP
    reduce-scatter 16-24 SMs and shrink the GEMM by as many), and the extra power of moving data while
    computing pushes the chip into its power cap, which lowers the core clock (the catalog's
    ``efficiency.overlap_clock``). Compute beside a collective runs at (1 - SMs/units) x that clock.
    Chips whose collectives run on dedicated engines (no SM count in the catalog: Trainium) lose the
    clock share only. ``comm_sms``: SMs the collective takes (Transformer Engine's userbuffers give a
    copy-engine ring exchange 1 SM and its pipelined and bulk overlaps 16, carved out of the GEMM)."""
    acc = instance.accelerator
    units = acc.compute_units
    sm_left = 1.0 - comm_sms / units if units else 1.0
    return 1.0 - sm_left * acc.overlap_clock_ratio


#: Collective costs shared by every plan on the same instance object and node count (a search asks the
#: same questions of thousands of plans): (id(instance), nodes) -> (instance, its line-rate twin, memo).
#: Bounded: at most _SHARED_CLUSTERS clusters, each memo cleared when it reaches _SHARED_COSTS entries.
_SHARED: dict[tuple[int, int], tuple[Instance, Instance, dict[tuple, CollectiveCost]]] = {}
_SHARED_CLUSTERS = 64
_SHARED_COSTS = 50_000


def _shared_costs(instance: Instance, nodes: int) -> tuple[Instance, dict]:
    """(line-rate instance, cost memo) shared by the plans on ``instance`` (this very object: an
    Instance holds a dict, so it is not hashable, and the entry keeps it alive, so its id stays its own)."""
    hit = _SHARED.get((id(instance), nodes))
    if hit is None or hit[0] is not instance:
        if len(_SHARED) >= _SHARED_CLUSTERS:
            _SHARED.clear()
        # DeepEP-class dispatch reaches the NIC's line rate over RDMA (deepseek-ai/DeepEP README,
        # V1 table on H800 + CX7 400 Gb/s "~50 GB/s maximum": internode EP16/32/64 dispatch 43/58/51,
        # combine 43/57/50 GB/s), where NCCL's collectives reach the fabric's calibrated efficiency
        line = dataclasses.replace(instance, fabric=dataclasses.replace(instance.fabric, efficiency=1.0))
        hit = _SHARED[(id(instance), nodes)] = (instance, line, {})
    if len(hit[2]) >= _SHARED_COSTS:
        hit[2].clear()
    return hit[1], hit[2]


class CommCoster:
    """Collective costs over the placed groups of one plan, memoised (a plan asks the same
    questions for every layer and stage; the memo is shared with every plan on the same instance and
    node count: a cost depends on the op, size, group shape, instance and nodes alone)."""

    def __init__(self, instance: Instance, shapes: Mapping[str, GroupShape], nodes: int):
        self.instance, self.shapes, self.nodes = instance, shapes, nodes
        self._line_rate, self._memo = _shared_costs(instance, nodes)

    def cost(self, op: str, size_bytes: float, shape: GroupShape, line_rate: bool = False,
             skew: float = 1.0, kernel: str = "deepep") -> float:
        """Seconds of one collective; an all-to-all with ``line_rate`` runs on ``kernel`` (``deepep`` or
        ``hybridep``, fmsim.hardware.dispatch), else on NCCL's send/recv."""
        if shape.size <= 1 or size_bytes <= 0:
            return 0.0
        key = (op, size_bytes, shape, line_rate, skew, kernel)
        hit = self._memo.get(key)      # one lookup: the shared memo may be emptied by another thread's plan
        if hit is None:
            inst = self._line_rate if line_rate else self.instance
            if op == "all-to-all" and line_rate:
                # DeepEP's normal kernels (or HybridEP), at the rates their tables give for this EP size
                # (fmsim.hardware.dispatch); NCCL's send/recv protocols otherwise
                hit = all_to_all_time(size_bytes, self.instance, shape, skew=skew, nodes=self.nodes,
                                      kernel=kernel)
            elif op == "all-to-all" and skew != 1.0:
                hit = all_to_all_time(size_bytes, inst, shape, skew=skew, nodes=self.nodes)
            else:
                hit = collective_time(op, size_bytes, inst, shape, nodes=self.nodes)
            self._memo[key] = hit
        return hit.time_s

    def request(self, req: CommRequest) -> float:
        return self.cost(req.op, req.size_bytes, self.shapes[req.axis], req.line_rate, req.skew, req.kernel)


#: group shapes shared across plans: (id(instance), nodes, dims, order, expert_tp) -> (instance, shapes)
_PLACED: dict[tuple, tuple[Instance, dict[str, GroupShape]]] = {}
_PLACED_MAX = 4096


def _place_shared(instance: Instance, nodes: int, dims: tuple[tuple[str, int], ...], order: tuple[str, ...],
                  expert_tp: int) -> dict[str, GroupShape]:
    """:func:`place`, shared by the plans on the same instance object and node count (a copy each time)."""
    key = (id(instance), nodes, dims, order, expert_tp)
    hit = _PLACED.get(key)
    if hit is None or hit[0] is not instance:
        if len(_PLACED) >= _PLACED_MAX:
            _PLACED.clear()
        hit = _PLACED[key] = (instance, place(instance, nodes, dict(dims), order=order, expert_tp=expert_tp))
    return dict(hit[1])
