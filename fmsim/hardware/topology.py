"""The cluster as a link graph, and the placement of parallel groups on its ranks.

Owns two things:

* :class:`Topology` -- a networkx graph of one cluster of ``nodes`` instances: accelerators
  (``("gpu", rank)``), the scale-up fabric (an NVSwitch crossbar per node, one NVLink switch per
  multi-node NVL36/NVL72 domain, a PCIe switch, or NeuronLink point-to-point links: a 2D torus
  inside a trn1/trn2 node and a ring joining same-position chips of the nodes of a Trn2
  UltraServer), the EFA/InfiniBand NICs (``("nic", node, i)``) attached to accelerators as rails,
  and the leaf/spine switches of a (rail-optimized) UltraCluster with configurable
  oversubscription. Every edge carries ``capacity_bytes_per_s`` (line rate, per direction),
  ``efficiency`` (the catalog's achievable fraction) and ``latency_s``. Queries: the path and its
  bottleneck between two ranks, and the links a collective over a set of ranks uses -- the link
  ids :class:`fmsim.engine.network.FlowNetwork` shares between concurrent transfers.
* :func:`place` -- maps parallel axes (tp, cp, ep, pp, dp) onto ranks, first axis innermost, and
  returns the :class:`~fmsim.hardware.collectives.GroupShape` of one group of each axis.

Ranks are numbered node-major: rank ``r`` is accelerator ``r % A`` of node ``r // A``.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from ..catalog import Instance
from ..errors import ConfigError, ParallelismError
from .collectives import OPS, GroupShape

# Nodes behind one leaf switch of a rail (per rail, or per rack when not rail-optimized). AWS does
# not publish its UltraCluster switch radix; 32 is the downlink half of a 64-port switch, the
# building block of NVIDIA's rail-optimized SuperPOD (32 nodes per scalable unit, DGX SuperPOD
# reference architecture). Only path length and oversubscription depend on it.
NODES_PER_LEAF = 32

Link = tuple[Hashable, Hashable]


def _grid(n: int) -> tuple[int, int]:
    """Rows × columns of the most square 2D torus holding ``n`` chips (4×4 for 16)."""
    rows = math.isqrt(n)
    while n % rows:
        rows -= 1
    return rows, n // rows


@dataclass(frozen=True, slots=True)
class _Layout:
    acc: int           # accelerators per node
    domain: int        # accelerators per scale-up domain
    nics: int          # NICs per node

    def node(self, rank: int) -> int:
        return rank // self.acc

    def local(self, rank: int) -> int:
        return rank % self.acc

    def domain_of(self, rank: int) -> int:
        return rank // self.domain

    def nic_of(self, local: int) -> int:
        """The first NIC of accelerator ``local`` (rail-optimized ownership)."""
        return local * self.nics // self.acc

    def attached(self, nic: int) -> list[int]:
        """Accelerators NIC ``nic`` hangs off: one when each owns several NICs (p5: 4 each),
        several when they share one (p4d: 2 GPUs per NIC)."""
        if self.nics >= self.acc:
            return [nic * self.acc // self.nics]
        return [a for a in range(self.acc) if a * self.nics // self.acc == nic]

    def owner_of(self, nic: int) -> int:
        """The (first) accelerator NIC ``nic`` hangs off."""
        return self.attached(nic)[0]


class Topology:
    """Link graph of ``nodes`` instances of one type; build it with :meth:`build`."""

    def __init__(self, instance: Instance, nodes: int, graph: nx.Graph, *, oversubscription: float,
                 rail_optimized: bool, nodes_per_leaf: int):
        self.instance = instance
        self.nodes = nodes
        self.graph = graph
        self.oversubscription = oversubscription
        self.rail_optimized = rail_optimized
        self.nodes_per_leaf = nodes_per_leaf
        su = instance.scale_up
        self._lay = _Layout(instance.num_accelerators, max(su.domain_size, 1), instance.num_nics)
        self._domain_paths: dict[int, dict] = {}

    # ------------------------------------------------------------------------------------------
    # construction

    @classmethod
    def build(cls, instance: Instance, nodes: int, *, oversubscription: float = 1.0,
              rail_optimized: bool = True, nodes_per_leaf: int = NODES_PER_LEAF) -> Topology:
        """The graph of ``nodes`` instances of ``instance``.

        Parameters
        ----------
        oversubscription:
            Leaf downlink over uplink capacity (1 = non-blocking, AWS UltraClusters' default).
        rail_optimized:
            NIC ``i`` of every node on the leaf of rail ``i`` (NVIDIA SuperPOD style); otherwise all
            NICs of a node share one leaf (a top-of-rack switch).
        """
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
            raise ConfigError(f"nodes must be a positive integer, got {nodes!r}", field="cluster.nodes")
        if not oversubscription >= 1.0:
            raise ConfigError(f"oversubscription must be >= 1, got {oversubscription!r}",
                              field="cluster.network.oversubscription")
        if nodes_per_leaf < 1:
            raise ConfigError(f"nodes_per_leaf must be >= 1, got {nodes_per_leaf}")
        su, fab = instance.scale_up, instance.fabric
        acc, nics = instance.num_accelerators, instance.num_nics
        lay = _Layout(acc, max(su.domain_size, 1), nics)
        g = nx.Graph()
        total = nodes * acc
        for r in range(total):
            g.add_node(("gpu", r), kind="gpu", node=r // acc, local=r % acc)

        def link(u, v, cap, eff, lat, kind):
            if g.has_edge(u, v):          # a torus of side 2 meets the same neighbour twice
                g[u][v]["capacity_bytes_per_s"] += cap
                return
            g.add_edge(u, v, capacity_bytes_per_s=cap, efficiency=eff, latency_s=lat, kind=kind)

        # scale-up: a switch per domain, or point-to-point torus / ring links
        if su.topology == "crossbar":
            sw_kind = "pcie" if su.kind == "pcie" else "nvswitch"
            for r in range(total):
                sw = (sw_kind, lay.domain_of(r))
                g.add_node(sw, kind=sw_kind)
                link(("gpu", r), sw, su.bytes_per_s, su.efficiency, su.latency_s / 2, "scale-up")
        else:
            per_node = min(acc, lay.domain)
            rows, cols = _grid(per_node) if su.topology == "torus2d" else (1, per_node)
            for n in range(nodes):
                for block in range(acc // per_node):
                    base = n * acc + block * per_node
                    for i in range(per_node):
                        r, c = divmod(i, cols)
                        if su.topology == "torus2d":
                            nbrs = {((r + dr) % rows) * cols + (c + dc) % cols
                                    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))} - {i}
                        else:
                            nbrs = {(i + 1) % per_node, (i - 1) % per_node} - {i}
                        for j in sorted(nbrs):
                            if j > i:
                                link(("gpu", base + i), ("gpu", base + j), su.bytes_per_s / len(nbrs),
                                     su.efficiency, su.latency_s, "scale-up")
        # a domain spanning nodes with its own cross-node links (Trn2 UltraServer ring)
        if lay.domain > acc and su.cross_node_bytes_per_s and su.topology != "crossbar":
            span = lay.domain // acc
            for dom_start in range(0, nodes, span):
                members = list(range(dom_start, min(nodes, dom_start + span)))
                if len(members) < 2:
                    continue
                hops = len(members) if len(members) > 2 else 1
                per_link = su.cross_node_bytes_per_s / (2 if len(members) > 2 else 1)
                for k in range(hops):
                    a, b = members[k], members[(k + 1) % len(members)]
                    for loc in range(acc):
                        link(("gpu", a * acc + loc), ("gpu", b * acc + loc), per_link, su.efficiency,
                             su.latency_s, "scale-up-cross")

        # scale-out: NICs, leaves, one spine layer
        nic_bw = instance.nic_bytes_per_s
        leaves: dict[Hashable, float] = {}
        for n in range(nodes):
            for i in range(nics):
                nic = ("nic", n, i)
                g.add_node(nic, kind="nic")
                for a in lay.attached(i):
                    link(("gpu", n * acc + a), nic, nic_bw, fab.efficiency, 0.0, "nic")
                leaf = ("leaf", i if rail_optimized else 0, n // nodes_per_leaf)
                g.add_node(leaf, kind="leaf")
                link(nic, leaf, nic_bw, fab.efficiency, fab.latency_s / 2, "fabric")
                leaves[leaf] = leaves.get(leaf, 0.0) + nic_bw
        if len(leaves) > 1:
            spine = ("spine",)
            g.add_node(spine, kind="spine")
            for leaf, down in leaves.items():
                link(leaf, spine, down / oversubscription, fab.efficiency, 0.0, "spine")
        return cls(instance, nodes, g, oversubscription=oversubscription, rail_optimized=rail_optimized,
                   nodes_per_leaf=nodes_per_leaf)

    # ------------------------------------------------------------------------------------------
    # queries

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.instance.num_accelerators

    def _check(self, rank: int) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self.num_ranks:
            raise ConfigError(f"rank {rank!r} is not in 0..{self.num_ranks - 1}")

    def _scale_up_path(self, a: int, b: int) -> list:
        su = self.instance.scale_up
        if su.topology == "crossbar":
            sw = ("pcie" if su.kind == "pcie" else "nvswitch", self._lay.domain_of(a))
            return [("gpu", a), sw, ("gpu", b)]
        dom = self._lay.domain_of(a)
        if dom not in self._domain_paths:
            lo = dom * self._lay.domain
            members = [("gpu", r) for r in range(lo, min(self.num_ranks, lo + self._lay.domain))]
            sub = self.graph.subgraph(members)
            self._domain_paths[dom] = dict(nx.all_pairs_shortest_path(sub))
        return list(self._domain_paths[dom][("gpu", a)][("gpu", b)])

    def _nic_leaf_path(self, node: int, nic: int) -> list:
        return [("nic", node, nic), ("leaf", nic if self.rail_optimized else 0, node // self.nodes_per_leaf)]

    def path(self, a: int, b: int) -> list:
        """Graph nodes from rank ``a`` to rank ``b``.

        Inside a scale-up domain: over the switch, or the shortest torus/ring route. Between
        domains: out of the NIC on the destination's rail (reached first over the scale-up link,
        as NCCL's PXN does), through the leaf, the spine when the leaves differ, and in at the
        destination's NIC.
        """
        self._check(a)
        self._check(b)
        if a == b:
            return [("gpu", a)]
        lay = self._lay
        if lay.domain_of(a) == lay.domain_of(b):
            return self._scale_up_path(a, b)
        nb, lb = lay.node(b), lay.local(b)
        na = lay.node(a)
        nic_b = lay.nic_of(lb)
        if self.rail_optimized:
            nic_a = nic_b
        else:
            nic_a = lay.nic_of(lay.local(a))
        relay = a if lay.local(a) in lay.attached(nic_a) else na * lay.acc + lay.owner_of(nic_a)
        head = [("gpu", a)] if relay == a else self._scale_up_path(a, relay)
        out_leg = self._nic_leaf_path(na, nic_a)
        in_leg = list(reversed(self._nic_leaf_path(nb, nic_b)))
        mid = [("spine",)] if out_leg[-1] != in_leg[0] else []
        if not mid:
            in_leg = in_leg[1:]
        owner_b = b if lb in lay.attached(nic_b) else nb * lay.acc + lay.owner_of(nic_b)
        tail = [("gpu", owner_b)] if owner_b == b else self._scale_up_path(owner_b, b)
        return head + out_leg + mid + in_leg + tail

    def path_links(self, a: int, b: int) -> list[Link]:
        """Directed links ``(u, v)`` along :meth:`path`."""
        p = self.path(a, b)
        return list(itertools.pairwise(p))

    def bottleneck_bytes_per_s(self, a: int, b: int) -> float:
        """Smallest line rate on the path from ``a`` to ``b`` (``inf`` for ``a == b``)."""
        links = self.path_links(a, b)
        return min((self.graph[u][v]["capacity_bytes_per_s"] for u, v in links), default=math.inf)

    def latency_s(self, a: int, b: int) -> float:
        """Sum of the edge latencies on the path from ``a`` to ``b``."""
        return sum(self.graph[u][v]["latency_s"] for u, v in self.path_links(a, b))

    def links_for(self, op: str, ranks: Sequence[int]) -> list[Link]:
        """Directed links a collective ``op`` over ``ranks`` uses, each once, in first-use order.

        Ring-based collectives (all-reduce, all-gather, reduce-scatter, broadcast) use the ring
        through the ranks in rank order (which visits a node's members before leaving it, as NCCL
        rings do); send-recv the same ring's hops (each rank sends to the next); all-to-all the
        paths between every ordered pair.
        """
        if op not in OPS:
            raise ConfigError(f"unknown collective {op!r} (known: {', '.join(OPS)})", field="op")
        rs = list(dict.fromkeys(ranks))
        if len(rs) <= 1:
            return []
        if op == "all-to-all":
            pairs = [(a, b) for a in rs for b in rs if a != b]
        else:
            order = sorted(rs)
            pairs = list(zip(order, order[1:] + order[:1]))
        out: dict[Link, None] = {}
        for a, b in pairs:
            for lk in self.path_links(a, b):
                out.setdefault(lk, None)
        return list(out)

    def capacities(self, *, achievable: bool = True) -> dict[Link, float]:
        """Per-direction capacity of every directed link, for :class:`~fmsim.engine.network.FlowNetwork`.

        ``achievable`` multiplies line rate by the link's catalog efficiency.
        """
        caps: dict[Link, float] = {}
        for u, v, d in self.graph.edges(data=True):
            c = d["capacity_bytes_per_s"] * (d["efficiency"] if achievable else 1.0)
            caps[(u, v)] = c
            caps[(v, u)] = c
        return caps


# ----------------------------------------------------------------------------------------------
# placement


def _shape_of(members: Sequence[int], acc: int, domain: int) -> GroupShape:
    if len(members) <= 1:
        return GroupShape(size=1, per_node=1, per_domain=1, stride=1)
    per_node = max(Counter(r // acc for r in members).values())
    per_domain = max(Counter(r // domain for r in members).values()) if domain > acc else per_node
    return GroupShape(size=len(members), per_node=per_node, per_domain=max(per_domain, per_node),
                      stride=members[1] - members[0])


#: Megatron-Core's rank order (``RankGenerator`` default ``tp-cp-ep-dp-pp``): TP innermost, then CP,
#: EP (carved out of the data-parallel ranks), DP, and PP outermost, so that data- and
#: expert-parallel groups stay dense inside scale-up domains and only pipeline sends cross nodes.
DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")


def used_domain(domain: int, acc: int, inner_sizes: Sequence[int]) -> int:
    """GPUs of a scale-up domain a job uses so that its groups do not straddle domains.

    An NVL72 rack holds 72 GPUs; jobs whose groups are powers of two run 64 per rack (16 of its
    18 trays) so that a 64-wide expert or data group stays on NVLink -- as NVIDIA's GB200 runs do
    (256 GPUs = 4 racks × 64). Single-node domains are used whole.
    """
    if domain <= acc:
        return domain
    used = domain
    for g in inner_sizes:
        if 1 < g < domain and domain % g:
            used = min(used, max(acc, (domain // g) * g))
    return used


def place(instance: Instance, nodes: int, dims: Mapping[str, int],
          order: Sequence[str] = DEFAULT_ORDER, *, expert_tp: int | None = None) -> dict[str, GroupShape]:
    """GroupShape of one group of each parallel axis, the first axis of ``order`` innermost.

    Ranks are laid out with the axes of ``order`` (except ``ep``) from innermost to outermost, so
    the default puts TP inside the scale-up domain. Expert parallelism is carved out of the ranks
    of one pipeline stage (Megatron-Core MoE parallel folding, ``expert_tp`` wide experts): an EP
    group is ``ep`` consecutive members of the ``tp·cp·dp`` space after the first ``expert_tp``
    (without folding, ``expert_tp = tp``, that is the ``cp·dp`` space).

    Raises
    ------
    ParallelismError
        (field ``parallelism``) when the product of the axes is not ``nodes × accelerators``, or
        (``parallelism.ep``) when ep·expert_tp does not divide ``tp·cp·dp``.
    ConfigError
        For an axis not in ``order``, a non-positive size, or a malformed order.
    """
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ConfigError(f"nodes must be a positive integer, got {nodes!r}", field="cluster.nodes")
    order = tuple(order)
    if len(set(order)) != len(order):
        raise ConfigError(f"parallel order {list(order)} names an axis twice", field="parallelism.order")
    sizes: dict[str, int] = {}
    for axis, v in dims.items():
        if axis not in order:
            raise ConfigError(f"unknown parallel axis {axis!r} (order: {', '.join(order)})",
                              field=f"parallelism.{axis}")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"must be a positive integer, got {v!r}", field=f"parallelism.{axis}")
        sizes[axis] = v
    acc = instance.num_accelerators
    total = nodes * acc
    layout = [a for a in order if a != "ep"]
    product = math.prod(sizes.get(a, 1) for a in layout)
    if product != total:
        expr = "·".join(f"{a}={sizes.get(a, 1)}" for a in layout)
        raise ParallelismError(f"{expr} gives {product} ranks, but {nodes} × {instance.name} have {total} "
                               f"accelerators", field="parallelism")
    stride: dict[str, int] = {}
    s = 1
    inner = []
    for a in layout:
        stride[a] = s
        s *= sizes.get(a, 1)
        inner.append(s)
    ep = sizes.get("ep", 1)
    tp = sizes.get("tp", 1)
    etp = tp if expert_tp is None else expert_tp
    inner.append(etp * ep)
    domain = used_domain(max(instance.scale_up.domain_size, 1), acc, inner)
    out: dict[str, GroupShape] = {}
    for a in layout:
        out[a] = _shape_of([k * stride[a] for k in range(sizes.get(a, 1))], acc, domain)
    if "ep" in order:
        carve = [a for a in layout if a in ("tp", "cp", "dp")]
        space = math.prod(sizes.get(a, 1) for a in carve)
        if ep > 1 and space % (ep * etp):
            raise ParallelismError(f"ep·expert_tp = {ep * etp} does not divide tp·cp·dp = {space}",
                                   field="parallelism.ep")
        members = []
        for j in range(ep):
            r, rest = 0, j * etp
            for a in carve:                      # inner axis first, as laid out
                rest, coord = divmod(rest, sizes.get(a, 1))
                r += coord * stride[a]
            members.append(r)
        out["ep"] = _shape_of(members, acc, domain)
    return {a: out[a] for a in order if a in out}


__all__ = ["DEFAULT_ORDER", "NODES_PER_LEAF", "Topology", "place", "used_domain"]
