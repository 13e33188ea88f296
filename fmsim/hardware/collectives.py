"""Collective communication costs over a placed group of ranks.

Owns the time of every collective fmsim knows (:data:`OPS`) on one instance type, for a group
described by its :class:`GroupShape` (how many members, how many share a node and a scale-up
domain), under each algorithm of a small registry (:data:`ALGORITHMS`): ring, double binary tree,
hierarchical, NVLS in-switch reduction (with a ring or a tree between domains), in-network (SHARP)
reduction between domains, direct and pairwise all-to-all. ``algo="auto"`` takes the fastest
applicable one, as NCCL's tuner picks the algorithm its own cost model predicts fastest.

Every cost is an α-β model (latency × sequential steps + bytes / achievable bandwidth) over the
*tiers* a group spans:

* ``node``   -- members inside one node, on the scale-up link (NVLink/NVSwitch, NeuronLink, PCIe);
* ``domain`` -- nodes inside one multi-node scale-up domain (GB200 NVL72, Trn2 UltraServer);
* ``fabric`` -- domains joined by the scale-out fabric (EFA, InfiniBand). A member owns
  ``num_nics / num_accelerators`` NICs (rail-optimized: 8 DP groups with one member per node each
  get 1/8 of the node's EFA).

Bandwidths are line rates times the catalog's *global* efficiency of the link or fabric
(``hardware_catalog/fabrics.yaml``: one figure per fabric, calibrated on published nccl-tests).
Pipelined algorithms (tree, NVLS, chain broadcast) add NCCL's pipeline fill: the data moves in
chunks of ``NCCL_CHANNELS × NCCL_STEP_BYTES`` (times the domain size for NVLS, whose members each
pipeline their own shard) through every stage, so the first chunk pays every stage and the rest
only the slowest one; messages shorter than the pipeline use proportionally smaller chunks. Size
dependence comes only from these terms.

Size conventions are those of nccl-tests: all-reduce and broadcast: the buffer; all-gather: the
total output; reduce-scatter: the total input; all-to-all: the total each rank sends (including to
itself); send-recv: the bytes sent. Bus bandwidth follows nccl-tests ``doc/PERFORMANCE.md``.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..catalog import Instance, suggest
from ..errors import ConfigError
from .dispatch import (deepep_instance, hybridep_instance, nccl_transport, p2p_latency_s, p2p_protocol,
                       protocol_fraction)

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "send-recv")
#: who moves an all-to-all's data: NCCL's grouped send/recv, or DeepEP's normal kernels (all_to_all_time)
A2A_KERNELS = ("nccl", "deepep", "hybridep")

# busbw = algbw × factor(n): nccl-tests doc/PERFORMANCE.md ("Bus bandwidth" section)
_BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all-reduce": lambda n: 2.0 * (n - 1) / n,
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send-recv": lambda n: 1.0,
}

# NCCL's pipeline unit. The Simple protocol splits each channel's buffer (NCCL_BUFFSIZE, default
# 4 MiB: NCCL docs, "Environment Variables") into NCCL_STEPS = 8 slots (NCCL src/include/device.h),
# so a channel moves 512 KiB per pipeline step. NCCL runs 16 channels on 8-GPU NVSwitch nodes
# (NCCL_NVLS_NCHANNELS defaults to 16 on Hopper; ring/tree searches on p4d/p5 nodes give 16-32).
NCCL_STEP_BYTES = 512 * 1024
NCCL_CHANNELS = 16


# ----------------------------------------------------------------------------------------------
# the public records


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupShape:
    """Where the members of one communication group sit.

    Attributes
    ----------
    size:
        Ranks in the group.
    per_node:
        Members of the group inside one node (1..size); ``ceil(size / per_node)`` nodes are spanned.
    per_domain:
        Members inside one scale-up domain. ``0`` derives it: ``per_node`` when the domain is one
        node; on a multi-node domain (NVL72, Trn2 UltraServer) the members that consecutive
        placement puts in one domain.
    stride:
        Distance between consecutive members in rank order (for rail/NIC mapping).
    """

    size: int
    per_node: int
    per_domain: int = 0
    stride: int = 1

    def __post_init__(self) -> None:
        for name in ("size", "per_node", "stride"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"GroupShape.{name} must be a positive integer, got {v!r}")
        if not isinstance(self.per_domain, int) or self.per_domain < 0:
            raise ConfigError(f"GroupShape.per_domain must be >= 0, got {self.per_domain!r}")
        if self.per_node > self.size:
            raise ConfigError(f"GroupShape.per_node {self.per_node} exceeds the group size {self.size}")
        if self.per_domain and not self.per_node <= self.per_domain <= self.size:
            raise ConfigError(f"GroupShape.per_domain {self.per_domain} must lie between per_node "
                              f"{self.per_node} and size {self.size}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCost:
    """Time of one collective and its nccl-tests bandwidths (0 when nothing moves)."""

    time_s: float
    algorithm: str
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


# ----------------------------------------------------------------------------------------------
# the physical view of a group


@dataclass(frozen=True, slots=True)
class Tier:
    """One level a group spans: ``fanout`` units joined by links of ``bytes_per_s`` per member.

    ``unit`` members stand behind one unit's boundary, so a unit can push ``unit × bytes_per_s``
    across it (the node's NICs serving its ``unit`` members, say).
    """

    name: str                  # node | domain | fabric
    fanout: int
    bytes_per_s: float         # achievable, per member, per direction
    latency_s: float
    unit: int

    @property
    def beta_s_per_byte(self) -> float:
        """Seconds per byte crossing one unit boundary of this tier."""
        return 1.0 / (self.unit * self.bytes_per_s)


@dataclass(frozen=True, slots=True)
class GroupView:
    """A group as the cost models see it: its tiers (inner first) and the hardware features."""

    size: int
    per_node: int
    per_domain: int
    tiers: tuple[Tier, ...]          # only tiers with fanout > 1
    in_switch: bool                  # NVLS-like reduction across the scale-up domain
    in_network: bool                 # SHARP-like reduction in the scale-out fabric
    shared_domain_port: bool         # domain links are the node links (NVL72 crossbar)
    #: the tiers as NCCL's classic ring sees them: its stream crosses the NICs at the fabric's ring
    #: fraction of line rate (empty: the same as ``tiers``)
    ring_tiers: tuple[Tier, ...] = ()
    #: what NCCL's send/recv protocols need to know (fmsim.hardware.dispatch): the scale-up link kind
    #: (nvlink | pcie; "" where NCCL does not run: Neuron devices) and the scale-out fabric's catalog name
    link: str = ""
    fabric: str = ""

    def tier(self, name: str) -> Tier | None:
        return next((t for t in self.tiers if t.name == name), None)

    @property
    def domains(self) -> int:
        t = self.tier("fabric")
        return t.fanout if t else 1

    def inner(self) -> tuple[Tier, ...]:
        """Tiers inside one scale-up domain."""
        return tuple(t for t in self.tiers if t.name != "fabric")


def derive_per_domain(instance: Instance, shape: GroupShape) -> int:
    """Members of ``shape`` inside one scale-up domain (``shape.per_domain`` if given).

    A domain of one node holds ``per_node`` members. A domain spanning ``k`` nodes holds the members
    that consecutive placement puts there: ``k × per_node`` when members share nodes, else one per
    ``stride`` ranks; rounded down to a divisor of the group size.
    """
    if shape.per_domain:
        return shape.per_domain
    acc, dom = instance.num_accelerators, instance.scale_up.domain_size
    if dom <= acc:
        return shape.per_node
    if shape.per_node > 1:
        guess = (dom // acc) * shape.per_node
    else:
        guess = max(1, dom // shape.stride)
    guess = max(shape.per_node, min(shape.size, guess))
    while guess > shape.per_node and (shape.size % guess or guess % shape.per_node):
        guess -= 1
    return guess


def group_view(instance: Instance, shape: GroupShape, *, nodes: int | None = None) -> GroupView:
    """The tiers ``shape`` spans on ``instance``, with achievable bandwidths and latencies."""
    acc = instance.num_accelerators
    su, fab = instance.scale_up, instance.fabric
    p, n = shape.per_node, shape.size
    if p > acc:
        raise ConfigError(f"{p} group members per node, but {instance.name} has {acc} accelerators",
                          field="per_node")
    d = derive_per_domain(instance, shape)
    if d > p and su.domain_size <= acc:
        raise ConfigError(f"{d} members per scale-up domain, but a {instance.name} domain is one node "
                          f"({su.domain_size} devices)", field="per_domain")
    if d > max(su.domain_size, p):
        raise ConfigError(f"{d} members per scale-up domain, but a {instance.name} domain holds "
                          f"{su.domain_size}", field="per_domain")
    spanned = math.ceil(n / p)
    if nodes is not None:
        if nodes < 1:
            raise ConfigError(f"nodes must be >= 1, got {nodes}", field="nodes")
        if spanned > nodes:
            raise ConfigError(f"the group spans {spanned} nodes, but the cluster has {nodes}", field="nodes")
    tiers: list[Tier] = []
    link_bw = su.bytes_per_s * su.efficiency
    if p > 1:
        tiers.append(Tier("node", p, link_bw, su.latency_s, 1))
    if d > p:
        cross = (su.cross_node_bytes_per_s or su.bytes_per_s) * su.efficiency
        tiers.append(Tier("domain", math.ceil(d / p), cross, su.latency_s, p))
    ring_tiers = list(tiers)
    if n > d:
        # rail-optimized: each member owns num_nics / num_accelerators of its node's NICs
        line = instance.num_nics * instance.nic_bytes_per_s / acc
        tiers.append(Tier("fabric", math.ceil(n / d), line * fab.efficiency, fab.latency_s, d))
        ring_tiers.append(Tier("fabric", math.ceil(n / d), line * fab.ring_fraction, fab.latency_s, d))
    return GroupView(size=n, per_node=p, per_domain=d, tiers=tuple(tiers),
                     in_switch=su.in_switch_reduction and su.topology == "crossbar",
                     in_network=fab.in_network_reduction,
                     shared_domain_port=not su.cross_node_bytes_per_s,
                     ring_tiers=tuple(ring_tiers),
                     link=("pcie" if su.kind == "pcie" else "nvlink") if nccl_transport(instance) else "",
                     fabric=fab.name)


# ----------------------------------------------------------------------------------------------
# building blocks


def _ring_params(tiers: tuple[Tier, ...]) -> tuple[int, float, float]:
    """Members, mean per-step latency and seconds per byte of a ring over ``tiers``.

    NCCL pipelines the ring in slices, with no barrier between steps, so a chunk's n-1 hops cost
    the sum of their own latencies -- (fanout-1) x (outer fanouts) hops at each tier's latency, most
    of them inside a node -- not n-1 times the slowest (NCCL's tuning model, src/graph/tuning.cc:
    (nsteps - nInterSteps) x intraLat + nInterSteps x interLat). A boundary of a tier carries the
    ring's full stream through its ``unit`` members' links (NCCL spreads its channels over them).
    Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
    JPDC 69(2), section 3.
    """
    n = math.prod(t.fanout for t in tiers)
    hops = [(t.fanout - 1) * math.prod(u.fanout for u in tiers[i + 1:]) for i, t in enumerate(tiers)]
    alpha = sum(h * t.latency_s for h, t in zip(hops, tiers)) / (n - 1) if n > 1 else 0.0
    beta = max((t.beta_s_per_byte for t in tiers), default=0.0)
    return n, alpha, beta


def ring_all_reduce_s(size: float, tiers: tuple[Tier, ...]) -> float:
    # T = 2(n-1)·α + 2(n-1)/n · S·β  (ring reduce-scatter + ring all-gather, Rabenseifner's
    # all-reduce cost with a ring; Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
    # communication operations in MPICH", IJHPCA 19(1); Patarasuk & Yuan 2009, eq. for T_ring)
    n, a, b = _ring_params(tiers)
    return 2 * (n - 1) * a + 2 * (n - 1) / n * size * b if n > 1 else 0.0


def ring_gather_s(size: float, tiers: tuple[Tier, ...]) -> float:
    # T = (n-1)·α + (n-1)/n · S·β  (ring all-gather and reduce-scatter; Thakur et al. 2005)
    n, a, b = _ring_params(tiers)
    return (n - 1) * a + (n - 1) / n * size * b if n > 1 else 0.0


def pipelined_s(size: float, stages: list[tuple[float, float]], chunk_max: float) -> float:
    """Time to stream ``size`` bytes through pipeline ``stages`` of ``(latency_s, s_per_byte)``.

    The data moves in chunks ``c = min(chunk_max, size / depth)`` (NCCL shrinks chunks so that a
    message fills its pipeline): the first chunk crosses every stage, every other chunk adds the
    slowest stage, T = Σ(α_i + c·β_i) + (S − c)·max β. Pipelined broadcast/tree analysis of
    Sanders, Speck & Träff 2009, "Two-tree algorithms for full bandwidth broadcast, reduction and
    scan", Parallel Computing 35(12), eq. (1) generalised to unequal stages.
    """
    if not stages or size <= 0:
        return 0.0
    beta_max = max(b for _, b in stages)
    c = min(chunk_max, size / len(stages))
    return sum(a + c * b for a, b in stages) + (size - c) * beta_max


@functools.lru_cache(maxsize=256)
def double_binary_tree(n: int) -> tuple[float, int]:
    """(max bytes a node sends per byte of the message, depth) of NCCL's double binary tree on n nodes.

    Tree one is the in-order binary tree in which position i (1-based) sits at the level of its
    lowest set bit, so the odd positions are its leaves; tree two is its mirror (even n) or its
    shift by one (odd n), which makes the leaves of one the inner nodes of the other. Each tree
    carries half the data; a node sends S/2 up each tree it has a parent in and S/2 to each child
    (reduce up, broadcast down: the per-direction load). Sanders, Speck & Träff 2009 (two-tree);
    Jeaugey 2019, "Massively scale your deep learning training with NCCL 2.4", NVIDIA blog.
    """
    if n <= 1:
        return 0.0, 0
    children = [0] * (n + 1)          # 1-based positions
    has_parent = [False] * (n + 1)
    for i in range(1, n + 1):
        low = i & -i
        if low == 1:
            continue
        kids = [i - low // 2]
        c = i + low // 2
        while c > n and c - i > 1:    # right subtree cut short by n: its highest node left
            c = i + (c - i) // 2
        if i < c <= n:
            kids.append(c)
        children[i] = len(kids)
        for k in kids:
            has_parent[k] = True
    load1 = [0.5 * (children[i] + has_parent[i]) for i in range(1, n + 1)]      # by 0-based position
    second = [(n - 1 - r) if n % 2 == 0 else (r + 1) % n for r in range(n)]
    load = list(load1)
    for r in range(n):
        load[second[r]] += load1[r]
    return max(load), (n.bit_length() - 1)


# ----------------------------------------------------------------------------------------------
# algorithms


@dataclass(frozen=True, slots=True)
class Algorithm:
    """A collective algorithm: the ops it implements and its cost over a :class:`GroupView`."""

    name: str
    ops: tuple[str, ...]
    cost: Callable[[str, float, GroupView], float]
    applies: Callable[[GroupView], bool]
    doc: str


ALGORITHMS: dict[str, Algorithm] = {}


def register(alg: Algorithm) -> Algorithm:
    """Add ``alg`` to :data:`ALGORITHMS`; a second algorithm of the same name is a bug."""
    if alg.name in ALGORITHMS or alg.name == "auto":
        raise ValueError(f"collective algorithm {alg.name!r} is already registered")
    unknown = set(alg.ops) - set(OPS)
    if unknown:
        raise ValueError(f"algorithm {alg.name!r} names unknown ops {sorted(unknown)}")
    ALGORITHMS[alg.name] = alg
    return alg


def _always(view: GroupView) -> bool:
    return True


def _ring_cost(op: str, size: float, v: GroupView) -> float:
    # the ring's own view of the fabric: NCCL's ring streams through the NICs at close to line rate
    # (Fabric.ring_efficiency), where the NVLS, tree and hierarchical decompositions reach the fabric's
    # calibrated ``efficiency``
    tiers = v.ring_tiers or v.tiers
    if op == "all-reduce":
        return ring_all_reduce_s(size, tiers)
    if op in ("all-gather", "reduce-scatter"):
        return ring_gather_s(size, tiers)
    # broadcast: a pipelined chain through the ring order (NCCL's broadcast), n-1 hops
    stages = []
    for i, t in enumerate(tiers):
        hops = (t.fanout - 1) * math.prod(u.fanout for u in tiers[i + 1:])   # this tier's hops
        stages += [(t.latency_s, t.beta_s_per_byte)] * hops
    return pipelined_s(size, stages, NCCL_CHANNELS * NCCL_STEP_BYTES)


register(Algorithm("ring", ("all-reduce", "all-gather", "reduce-scatter", "broadcast"), _ring_cost, _always,
                   "one ring over all members (NCCL Ring; broadcast as a pipelined chain)"))


def _tree_cost(op: str, size: float, v: GroupView) -> float:
    # NCCL Tree: a chain through the members of each domain, a double binary tree between
    # domains, reduce up then broadcast down, pipelined in chunks (Jeaugey 2019; Sanders et al. 2009).
    node, dom, fab = v.tier("node"), v.tier("domain"), v.tier("fabric")
    chain: list[tuple[float, float]] = []
    if node:   # chain member sends S to its parent and S to its child: 2 bytes per byte per port
        hops = (node.fanout - 1) * (dom.fanout if dom else 1)
        chain += [(node.latency_s, 2.0 * node.beta_s_per_byte)] * hops
    if dom:
        chain += [(dom.latency_s, 2.0 * dom.beta_s_per_byte)] * (dom.fanout - 1)
    tree: list[tuple[float, float]] = []
    if fab:
        load, height = double_binary_tree(fab.fanout)
        tree = [(fab.latency_s, load * fab.beta_s_per_byte)] * height
    stages = chain + tree + tree + chain       # up, then down
    return pipelined_s(size, stages, NCCL_CHANNELS * NCCL_STEP_BYTES)


register(Algorithm("tree", ("all-reduce",), _tree_cost, lambda v: len(v.tiers) > 0,
                   "NCCL double binary tree between domains, chains inside them, pipelined"))


def _inter_all_reduce(fab: Tier, in_network: bool) -> tuple[float, float]:
    """(latency, s/byte) of the all-reduce each member runs on its shard across domains."""
    k = fab.fanout
    if in_network:
        # SHARP-like reduction in the switches: send the shard once, receive the result once
        # (Graham et al. 2016, "Scalable Hierarchical Aggregation Protocol (SHArP)", COMHPC)
        return 2.0 * fab.latency_s, 1.0 / fab.bytes_per_s
    # ring over the k domains on each member's own NICs (rail-aligned)
    return 2.0 * (k - 1) * fab.latency_s, 2.0 * (k - 1) / k / fab.bytes_per_s


def _nvls_cost(op: str, size: float, v: GroupView, *, inter: str = "ring") -> float:
    # NVLink SHARP (NVLS): the NVSwitch reduces (multimem.ld_reduce) and multicasts
    # (multimem.st). Reduce-scatter: a member's port sends its whole buffer S into the switch and
    # receives its reduced S/d shard; all-gather the reverse; so an all-reduce loads each port
    # direction with (1 + 1/d)·S. Between domains each member all-reduces its S/d shard over its
    # own NICs, pipelined with the switch passes (NCCL >= 2.17 NVLS / NVLSTree algorithms; PTX ISA,
    # "multimem.ld_reduce, multimem.st", sm_90).
    inner = v.inner()
    d = v.per_domain
    port = min(t.bytes_per_s for t in inner)          # one crossbar port (NVL72: same on every tier)
    alpha_su = max(t.latency_s for t in inner)
    fab = v.tier("fabric")
    chunk = d * NCCL_CHANNELS * NCCL_STEP_BYTES      # every member pipelines its own shard
    if op == "all-reduce":
        beta = (1.0 + 1.0 / d) / port
        stages = [(alpha_su, beta)]
        if fab:
            if inter == "tree":
                load, height = double_binary_tree(fab.fanout)
                tree = [(fab.latency_s, load / (d * fab.bytes_per_s))] * height
                stages += tree + tree
            else:
                a, b = _inter_all_reduce(fab, v.in_network)
                stages.append((a, b / d))
        stages.append((alpha_su, beta))
        return pipelined_s(size, stages, chunk)
    # reduce-scatter / all-gather: one pass through the switch, then (or before) a ring of the
    # S/d shards between domains
    stages = [(alpha_su, 1.0 / port)]
    if fab:
        k = fab.fanout
        stages.append(((k - 1) * fab.latency_s, (k - 1) / k / (d * fab.bytes_per_s)))
    return pipelined_s(size, stages, chunk)


register(Algorithm("nvls", ("all-reduce", "all-gather", "reduce-scatter"), _nvls_cost,
                   lambda v: v.in_switch and v.per_domain > 1,
                   "NVLink SHARP in the switch of the scale-up domain, a ring (or SHARP) between domains"))
register(Algorithm("nvls-tree", ("all-reduce",), functools.partial(_nvls_cost, inter="tree"),
                   lambda v: v.in_switch and v.per_domain > 1 and v.domains > 1,
                   "NVLink SHARP inside the domain, a double binary tree between domains (NCCL NVLSTree)"))


def _collnet_cost(op: str, size: float, v: GroupView) -> float:
    # In-network reduction across domains (NVIDIA SHARP through NCCL's CollNet path; all-reduce since
    # NCCL 2.6's "in-network collectives", reduce-scatter and all-gather since NCCL 2.20 --
    # the SHARP 3.5.2 release notes add "Reduce-Scatter and All-Gather collective operations when using
    # HPCX v2.18.1 concurrently with NCCL v2.20 or above"). Inside a domain the members first combine
    # their buffers over the scale-up link (one switch pass with NVLS, else a ring over the inner tiers);
    # each member then sends its S/d share up the switch tree once and gets its S/n result back (or the
    # reverse for all-gather) -- two fabric latencies whatever the number of domains, where a ring pays
    # one per domain (Graham et al. 2016, "Scalable Hierarchical Aggregation Protocol (SHArP)", COMHPC).
    # The two stages are pipelined in chunks like NVLS.
    if op == "all-reduce":
        # reduce-scatter inside the domain, the S/d shard all-reduced in the switches, all-gather inside:
        # the hierarchical decomposition with SHARP between domains -- one member per node included
        return _hierarchical_cost(op, size, v)
    inner, fab, d = v.inner(), v.tier("fabric"), v.per_domain
    assert fab is not None and op in ("all-gather", "reduce-scatter")
    stages = []
    if inner and v.in_switch:
        stages.append((max(t.latency_s for t in inner), 1.0 / min(t.bytes_per_s for t in inner)))
    elif inner:
        n, a, b = _ring_params(inner)
        stages.append(((n - 1) * a, (n - 1) / n * b))
    stages.append((2.0 * fab.latency_s, 1.0 / (d * fab.bytes_per_s)))
    return pipelined_s(size, stages, d * NCCL_CHANNELS * NCCL_STEP_BYTES)


register(Algorithm("collnet", ("all-reduce", "all-gather", "reduce-scatter"), _collnet_cost,
                   lambda v: v.in_network and v.domains > 1,
                   "in-network (SHARP) reduction between domains, NVLS or a ring inside them (NCCL CollNet)"))


def _hierarchical_cost(op: str, size: float, v: GroupView) -> float:
    # Two-level, phase after phase: reduce-scatter inside the domain, all-reduce of the S/d shard
    # between domains, all-gather inside the domain (hierarchical all-reduce of Jia et al. 2018,
    # "Highly scalable deep learning training system with mixed-precision", arXiv:1807.11205). NCCL's
    # tree on a node with one NIC per GPU "can also be seen as a reduce-scatter+allreduce+allgather"
    # (NVIDIA/nccl issue #530, sjeaugey, 2021-07-01). All-reduce only: NCCL has no such decomposition
    # of all-gather or reduce-scatter -- those run on a ring that spans every member, NVLS or, from
    # 2.23, PAT at one GPU per node (NVIDIA/nccl issues #1473, 2024-10-09, and #1413, 2024-08-23).
    inner, fab, d = v.inner(), v.tier("fabric"), v.per_domain
    assert fab is not None and op == "all-reduce"
    a, b = _inter_all_reduce(fab, v.in_network)
    return 2 * ring_gather_s(size, inner) + a + size / d * b


register(Algorithm("hierarchical", ("all-reduce",), _hierarchical_cost,
                   lambda v: v.domains > 1 and v.per_domain > 1,
                   "reduce-scatter in the domain, all-reduce between domains, all-gather in the domain"))


def _a2a_loads(v: GroupView) -> list[tuple[int, Tier]]:
    """(peers, tier) of each class of peer a member exchanges with, farthest last."""
    n, p, d = v.size, v.per_node, v.per_domain
    node, dom, fab = v.tier("node"), v.tier("domain"), v.tier("fabric")
    out: list[tuple[int, Tier]] = []
    if dom and v.shared_domain_port:      # one crossbar port reaches the whole domain
        out.append((d - 1, dom if not node else node))
    else:
        if node:
            out.append((p - 1, node))
        if dom:
            out.append((d - p, dom))
    if fab:
        out.append((n - d, fab))
    return out


def _direct_cost(op: str, size: float, v: GroupView, *, skew: float = 1.0, kernel: str = "nccl") -> float:
    if op == "send-recv":
        # one transfer to the next member; the farthest pair crosses the outermost tier on the
        # sender's own link: T = α + S/B (Hockney 1994, "The communication challenge for MPP")
        t = v.tiers[-1]
        return t.latency_s + size / t.bytes_per_s
    # all-to-all, all n-1 sends at once (NCCL alltoall = grouped send/recv): each class of peer
    # loads its own links with (peers/n)·S; the busiest link sets the time; the hottest rank moves
    # ``skew`` times the mean (Thakur et al. 2005, all-to-all with all isend/irecv posted at once)
    n = v.size
    times = [peers / n * size / t.bytes_per_s for peers, t in _a2a_loads(v) if peers > 0]
    if not v.link or kernel != "nccl":
        # Neuron's collectives and DeepEP's kernels: one hop of the farthest tier, at the link's rate
        return max(t.latency_s for t in v.tiers) + skew * max(times, default=0.0)
    # NCCL's send/recv: the protocol the hottest rank's messages get (LL up to 16 KiB a peer, else Simple),
    # its latency over the farthest link crossed plus a post per network peer, and its payload share of
    # each link's bandwidth (fmsim.hardware.dispatch; hardware_catalog/dispatch.yaml)
    remote = v.tier("fabric") is not None
    proto = p2p_protocol(skew * size / n, v.fabric if remote else None)
    lat = p2p_latency_s(proto, link=v.link, fabric=v.fabric if remote else None,
                        remote_peers=n - v.per_domain if remote else 0)
    return lat + skew * max(times, default=0.0) / protocol_fraction(proto)


def _pairwise_cost(op: str, size: float, v: GroupView, *, skew: float = 1.0) -> float:
    # Pairwise exchange: n-1 steps, in step k member r swaps S/n with member r XOR k (or r±k);
    # T = Σ_steps (α_step + S/n / B_step) (Thakur et al. 2005, pairwise-exchange all-to-all)
    n = v.size
    return sum(peers * (t.latency_s + skew * size / n / t.bytes_per_s) for peers, t in _a2a_loads(v))


register(Algorithm("direct", ("all-to-all", "send-recv"), _direct_cost, lambda v: len(v.tiers) > 0,
                   "all sends at once (all-to-all) or one transfer to the next member (send-recv)"))
register(Algorithm("pairwise", ("all-to-all",), _pairwise_cost, lambda v: len(v.tiers) > 0,
                   "pairwise exchange in n-1 steps"))


# ----------------------------------------------------------------------------------------------
# the entry points


def algorithms_for(op: str) -> tuple[str, ...]:
    """Names of the registered algorithms implementing ``op``."""
    _check_op(op)
    return tuple(name for name, a in ALGORITHMS.items() if op in a.ops)


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ConfigError(f"unknown collective {op!r}{suggest(op, OPS)}", field="op")


def _cost(op: str, size_bytes: float, view: GroupView, alg: Algorithm, skew: float, kernel: str = "nccl") -> float:
    if op == "all-to-all" and alg.name == "direct":
        return _direct_cost(op, size_bytes, view, skew=skew, kernel=kernel)
    if op == "all-to-all" and alg.name == "pairwise":
        return _pairwise_cost(op, size_bytes, view, skew=skew)
    return alg.cost(op, size_bytes, view)


def _collective(op: str, size_bytes: float, instance: Instance, shape: GroupShape, algo: str,
                nodes: int | None, skew: float, kernel: str = "nccl") -> CollectiveCost:
    _check_op(op)
    if not isinstance(size_bytes, (int, float)) or not math.isfinite(size_bytes) or size_bytes < 0:
        raise ConfigError(f"size must be a finite number of bytes >= 0, got {size_bytes!r}", field="size")
    names = algorithms_for(op)
    if algo != "auto" and algo not in ALGORITHMS:
        raise ConfigError(f"unknown collective algorithm {algo!r} (known: auto, {', '.join(ALGORITHMS)})",
                          field="algo")
    if algo != "auto" and algo not in names:
        raise ConfigError(f"algorithm {algo!r} does not implement {op} (those that do: {', '.join(names)})",
                          field="algo")
    view = group_view(instance, shape, nodes=nodes)
    if shape.size == 1 or size_bytes == 0:
        return CollectiveCost(time_s=0.0, algorithm="none" if algo == "auto" else algo,
                              algbw_bytes_per_s=0.0, busbw_bytes_per_s=0.0)
    if algo == "auto":
        cands = [ALGORITHMS[a] for a in names if ALGORITHMS[a].applies(view)]
    else:
        alg = ALGORITHMS[algo]
        if not alg.applies(view):
            raise ConfigError(f"algorithm {algo!r} does not apply to this group on {instance.name}: "
                              f"{alg.doc}", field="algo")
        cands = [alg]
    best_t, best = math.inf, cands[0]
    for alg in cands:              # registry order breaks ties: deterministic
        t = _cost(op, float(size_bytes), view, alg, skew, kernel)
        if t < best_t:
            best_t, best = t, alg
    algbw = size_bytes / best_t
    return CollectiveCost(time_s=best_t, algorithm=best.name, algbw_bytes_per_s=algbw,
                          busbw_bytes_per_s=algbw * _BUS_FACTOR[op](shape.size))


def collective_time(op: str, size_bytes: float, instance: Instance, shape: GroupShape, *,
                    algo: str = "auto", nodes: int | None = None) -> CollectiveCost:
    """Time of collective ``op`` on ``size_bytes`` over a group placed as ``shape`` on ``instance``.

    Parameters
    ----------
    op:
        One of :data:`OPS`.
    size_bytes:
        nccl-tests convention (module docstring).
    algo:
        ``"auto"`` (fastest applicable, NCCL-like) or a name in :data:`ALGORITHMS`.
    nodes:
        Nodes in the cluster, if known: the group must fit in them.

    Returns
    -------
    CollectiveCost
        Zero time (and bandwidths) for a group of one or an empty message.
    """
    return _collective(op, size_bytes, instance, shape, algo, nodes, 1.0)


def all_to_all_time(size_bytes: float, instance: Instance, shape: GroupShape, *, skew: float = 1.0,
                    algo: str = "auto", nodes: int | None = None, kernel: str = "nccl") -> CollectiveCost:
    """All-to-all where the busiest rank sends and receives ``skew`` times the mean (MoE routing).

    ``skew = 1`` is the uniform all-to-all of :func:`collective_time`; ``skew = max/mean`` tokens
    per expert rank models uneven routing (the step waits for the hottest rank). ``kernel``: ``nccl``
    (grouped send/recv with NCCL's protocols), ``deepep`` (DeepEP's normal kernels, algorithm direct) or
    ``hybridep`` (HybridEP inside one NVLink domain, algorithm direct; the caller counts its bytes).
    """
    if not skew >= 1.0:
        raise ConfigError(f"skew is max/mean load and must be >= 1, got {skew!r}", field="skew")
    if kernel not in A2A_KERNELS:
        raise ConfigError(f"unknown all-to-all kernel {kernel!r} (known: {', '.join(A2A_KERNELS)})", field="kernel")
    if kernel == "deepep":
        # DeepEP's normal kernels: its own send path, at the NVLink and RDMA fractions of line rate its README
        # measures at this EP size (fmsim.hardware.dispatch.deepep_normal_fractions)
        return _collective("all-to-all", size_bytes, deepep_instance(instance, shape.size), shape, "direct",
                           nodes, float(skew), kernel)
    if kernel == "hybridep":
        # HybridEP: its own NVLink path, at the fraction of line rate its GB200 table gives at this EP size
        # (fmsim.hardware.dispatch.hybridep_fraction); the scale-out efficiency is left as it is (not priced there)
        return _collective("all-to-all", size_bytes, hybridep_instance(instance, shape.size), shape, "direct",
                           nodes, float(skew), kernel)
    return _collective("all-to-all", size_bytes, instance, shape, algo, nodes, float(skew))


__all__ = [
    "A2A_KERNELS",
    "ALGORITHMS",
    "NCCL_CHANNELS",
    "NCCL_STEP_BYTES",
    "OPS",
    "Algorithm",
    "CollectiveCost",
    "GroupShape",
    "GroupView",
    "Tier",
    "algorithms_for",
    "all_to_all_time",
    "collective_time",
    "derive_per_domain",
    "double_binary_tree",
    "group_view",
    "pipelined_s",
    "register",
]
