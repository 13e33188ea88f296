"""MoE dispatch and combine at the message sizes MoE produces: NCCL's point-to-point protocols and DeepEP's kernels.

NCCL runs an all-to-all as grouped sends and receives, one to every peer. Those do not go through NCCL's tuner
(src/graph/tuning.cc prices collectives only); the send/recv path picks its protocol per message
(src/enqueue.cc addP2pToPlan): LL up to ``NCCL_P2P_LL_THRESHOLD`` bytes per channel (16 KiB; a message under
64 KiB runs on one channel), Simple above -- never LL128. This module prices one such message the way NCCL's
tuning model prices one step of its ring, the algorithm whose every step is one send/recv to a neighbour:

* latency ``base(proto) + hop(link, proto)``: tuning.cc's base latency plus the hop latency of the link crossed
  (NVLink, PCI, or the network: InfiniBand/RoCE from tuning.cc's NET row, EFA from the aws-ofi-nccl tuner's own
  ``net_lat``, Simple adding its completion overhead), plus the proxy's post overhead for every remote peer
  (tuning.cc getNetOverhead: 1 us, 2 us on AMD hosts, 3x for Simple -- one proxy thread posts every network
  send of a rank);
* bandwidth: the link's achievable rate times the protocol's fraction (LL carries 4 data bytes in every 8:
  0.5; Simple the rate itself).

LL runs over a scale-out fabric only where the network plugin keeps it on: EFA delivers in order on 128-byte
boundaries on p5 and later (aws-ofi-nccl PR #516 and platform-aws.cpp), not on p4d, where the plugin sets
``NCCL_PROTO=simple`` (``fabric_protocols`` in hardware_catalog/dispatch.yaml).

DeepEP (deepseek-ai/DeepEP, V1 tables): the *normal* kernels (NVLink inside a node, RDMA forwarding between nodes,
training and prefill) reach the bottleneck bandwidths of its README per EP size; the *low-latency* kernels (decode)
take a dispatch and a combine latency per EP size at 128 tokens per rank. Both tables were measured at hidden 7168,
top-8, FP8 dispatch and BF16 combine; fmsim scales them by the bytes moved (the byte counts of
``fmsim.model.deepep``): a bandwidth holds at other sizes, the low-latency kernels' time is the table's bandwidth
over the bytes of one call, never below one hop of the farthest link (:func:`deepep_low_latency_s`). DeepEP is not
NCCL: neither family pays NCCL's send/recv protocol latencies or per-peer posts. Figures and sources:
``hardware_catalog/dispatch.yaml``.

HybridEP (DeepEP's hybrid-ep branch, NVIDIA's backend of Megatron-Core's flex dispatcher on GB200/GB300 NVL72): one
dispatch sends each token once to every rank holding one of its experts and one combine returns as many; its GB200
table gives the Torch-API bandwidth per EP size (8-36 ranks of one NVL72 domain) at 32 SMs, the bytes a rank
receives over the call's time (:func:`hybridep_fraction`, training's ``ep_dispatch: hybridep`` through
``all_to_all_time(kernel="hybridep")``). Serving reaches them only through :func:`fmsim.model.deepep.layer_time_fn`
(``serving.deepep``), training's ``ep_dispatch: deepep`` through ``all_to_all_time(kernel="deepep")``, which
serving's normal mode calls too.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import catalog as _catalog
from ..catalog import Instance
from ..catalog.files import entries, read_folder
from ..errors import ConfigError

PROTOCOLS = ("ll", "ll128", "simple")
_US = 1e-6
_GB = 1e9


@dataclass(frozen=True, slots=True)
class Protocol:
    """One NCCL protocol: its latencies (seconds) and the share of a link's bandwidth it carries."""

    name: str
    base_s: float
    nvlink_s: float
    pcie_s: float
    net_s: float                     # InfiniBand / RoCE (tuning.cc NET row)
    bandwidth_fraction: float
    point_to_point: bool
    source: str


@dataclass(frozen=True, slots=True)
class FabricProtocols:
    """How NCCL's network path runs over one scale-out fabric through its plugin."""

    name: str
    ll: bool                         # LL may run over it (in-order 128-byte delivery)
    net_s: float                     # one send/recv's network latency under LL / LL128
    simple_extra_s: float            # Simple's completion overhead on top
    post_s: float                    # the proxy's post overhead per message (the host CPU's)
    source: str


@dataclass(frozen=True, slots=True)
class DeepEP:
    """DeepEP's V1 tables (GB/s and microseconds as printed) and the setting they were measured at."""

    normal_nvlink: Mapping[int, tuple[float, float]]       # ep -> (dispatch, combine) GB/s
    normal_rdma: Mapping[int, tuple[float, float]]
    nvlink_line_gbps: float
    rdma_line_gbps: float
    low_latency: Mapping[int, tuple[float, float, float, float]]   # ep -> (disp us, disp GB/s, comb us, comb GB/s)
    ll_tokens: int
    hidden: int
    top_k: int
    source: str


@dataclass(frozen=True, slots=True)
class HybridEP:
    """HybridEP's GB200 table (GB/s as printed) and the setting it was measured at."""

    nvlink: Mapping[int, tuple[float, float]]     # ep -> (dispatch BF16, combine) GB/s, Torch API
    nvlink_line_gbps: float
    tokens: int
    hidden: int
    top_k: int
    local_experts: int
    sms: int
    source: str


@dataclass(frozen=True, slots=True)
class DispatchCatalog:
    protocols: Mapping[str, Protocol]
    ll_threshold: float              # bytes per peer (one channel)
    post_s: float                    # default post overhead per network message
    simple_post_factor: float
    fabrics: Mapping[str, FabricProtocols]
    deepep: DeepEP
    hybridep: HybridEP


def _ep_table(e: Any, key: str, width: int) -> dict[int, tuple[float, ...]]:
    raw = e.raw(key)
    if not isinstance(raw, Mapping) or not raw:
        raise e.err(key, "must be a mapping of EP size to a list of figures")
    out: dict[int, tuple[float, ...]] = {}
    for ep, row in raw.items():
        ok = isinstance(ep, int) and not isinstance(ep, bool) and ep >= 2 and isinstance(row, list) \
            and len(row) == width and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
                                          for x in row)
        if not ok:
            raise e.err(key, f"entry {ep!r}: expected an EP size >= 2 and a list of {width} positive numbers "
                             f"(got {row!r})")
        out[int(ep)] = tuple(float(x) for x in row)
    return dict(sorted(out.items()))


_PROTO_KEYS = ("base_latency_us", "nvlink_latency_us", "pcie_latency_us", "net_latency_us", "bandwidth_fraction",
               "point_to_point", "source")
_P2P_KEYS = ("ll_threshold", "net_post_overhead_us", "simple_post_factor", "source")
_FABRIC_KEYS = ("ll", "net_latency_us", "simple_extra_us", "net_post_overhead_us", "source")
_NORMAL_KEYS = ("tokens", "hidden", "top_k", "nvlink_line_gbps", "rdma_line_gbps", "nvlink_gbps", "rdma_gbps",
                "source")
_LL_KEYS = ("tokens", "hidden", "top_k", "rdma_line_gbps", "table", "source")


def dispatch_catalog(root: str | None = None) -> DispatchCatalog:
    """The figures of ``hardware_catalog/dispatch.yaml`` (cached per tree; ``root`` as
    :func:`fmsim.catalog.load_catalog`: the data root is looked up at each call, so a tree read once is never
    taken for another)."""
    return _dispatch_catalog_at(str(Path(root) if root else _catalog.data_root()))


@functools.lru_cache(maxsize=4)
def _dispatch_catalog_at(root: str) -> DispatchCatalog:
    base = Path(root)
    hw = read_folder(base / "hardware_catalog")
    protos = {}
    for n, e in entries(hw, "nccl_protocols", _PROTO_KEYS, "NCCL protocol"):
        if n not in PROTOCOLS:
            raise e.err("", f"unknown protocol {n!r} (known: {', '.join(PROTOCOLS)})")
        num = functools.partial(e.number, inclusive=True)
        protos[n] = Protocol(n, num("base_latency_us") * _US, num("nvlink_latency_us") * _US,
                             num("pcie_latency_us") * _US, num("net_latency_us") * _US,
                             e.fraction("bandwidth_fraction"), e.boolean("point_to_point"), e.source())
    if set(protos) != set(PROTOCOLS):
        raise ConfigError(f"nccl_protocols must hold {', '.join(PROTOCOLS)} (got {', '.join(sorted(protos))})",
                          file="hardware_catalog/dispatch.yaml", field="nccl_protocols")
    p2p = dict(entries(hw, "nccl_p2p", _P2P_KEYS, "NCCL send/recv rule"))
    if "default" not in p2p:
        raise ConfigError("needs the entry 'default'", file="hardware_catalog/dispatch.yaml", field="nccl_p2p")
    d = p2p["default"]
    d.source()
    fabrics = {}
    for n, e in entries(hw, "fabric_protocols", _FABRIC_KEYS, "fabric protocol"):
        fabrics[n] = FabricProtocols(n, e.boolean("ll"), e.number("net_latency_us") * _US,
                                     e.number("simple_extra_us", inclusive=True) * _US,
                                     e.number("net_post_overhead_us", inclusive=True) * _US, e.source())
    dep = dict(entries(hw, "deepep", ("tokens", "hidden", "top_k", "nvlink_line_gbps", "rdma_line_gbps",
                                      "nvlink_gbps", "rdma_gbps", "table", "source"), "DeepEP table"))
    if set(dep) != {"normal", "low_latency"}:
        raise ConfigError("must hold 'normal' and 'low_latency'", file="hardware_catalog/dispatch.yaml",
                          field="deepep")
    nm, ll = dep["normal"], dep["low_latency"]
    deepep = DeepEP(
        normal_nvlink=_ep_table(nm, "nvlink_gbps", 2), normal_rdma=_ep_table(nm, "rdma_gbps", 2),
        nvlink_line_gbps=nm.number("nvlink_line_gbps"), rdma_line_gbps=nm.number("rdma_line_gbps"),
        low_latency=_ep_table(ll, "table", 4), ll_tokens=ll.integer("tokens"), hidden=ll.integer("hidden"),
        top_k=ll.integer("top_k"), source=f"{nm.source()}; {ll.source()}")
    hyb = dict(entries(hw, "hybridep", ("tokens", "hidden", "top_k", "local_experts", "sms", "nvlink_line_gbps",
                                        "nvlink_gbps", "source"), "HybridEP table"))
    if set(hyb) != {"normal"}:
        raise ConfigError("must hold 'normal'", file="hardware_catalog/dispatch.yaml", field="hybridep")
    hn = hyb["normal"]
    hybridep = HybridEP(nvlink=_ep_table(hn, "nvlink_gbps", 2), nvlink_line_gbps=hn.number("nvlink_line_gbps"),
                        tokens=hn.integer("tokens"), hidden=hn.integer("hidden"), top_k=hn.integer("top_k"),
                        local_experts=hn.integer("local_experts"), sms=hn.integer("sms"), source=hn.source())
    return DispatchCatalog(protocols=protos, ll_threshold=d.number("ll_threshold"),
                           post_s=d.number("net_post_overhead_us", inclusive=True) * _US,
                           simple_post_factor=d.number("simple_post_factor"), fabrics=fabrics, deepep=deepep,
                           hybridep=hybridep)


# ----------------------------------------------------------------------------------------------
# NCCL send/recv


def nccl_transport(instance: Instance) -> bool:
    """True where NCCL moves the group's data (NVIDIA scale-up links or PCIe); Neuron devices run their own
    collective library, whose all-to-all keeps the link catalog's latencies."""
    return instance.scale_up.kind in ("nvswitch", "nvl-domain", "pcie")


def p2p_protocol(bytes_per_peer: float, fabric: str | None, cat: DispatchCatalog | None = None) -> str:
    """The protocol NCCL's send/recv picks for one message: ``ll`` up to the threshold (where every link it may
    cross allows LL: ``fabric`` is the scale-out fabric's name, ``None`` inside a scale-up domain), else
    ``simple`` (enqueue.cc addP2pToPlan)."""
    cat = cat or dispatch_catalog()
    if bytes_per_peer > cat.ll_threshold:
        return "simple"
    if fabric is not None:
        fp = cat.fabrics.get(fabric)
        if fp is not None and not fp.ll:
            return "simple"
    return "ll"


def p2p_latency_s(proto: str, *, link: str, fabric: str | None = None, remote_peers: int = 0,
                  cat: DispatchCatalog | None = None) -> float:
    """Latency of one rank's sends to all its peers at once under ``proto``: the protocol's base latency, the
    slowest hop among the links crossed (``link``: ``nvlink`` or ``pcie``; the fabric when ``fabric`` is given),
    and the proxy's post overhead for each of ``remote_peers`` network messages."""
    cat = cat or dispatch_catalog()
    p = cat.protocols[proto]
    hop = p.pcie_s if link == "pcie" else p.nvlink_s
    if fabric is not None:
        fp = cat.fabrics.get(fabric)
        if fp is not None:                                   # EFA: the aws-ofi-nccl tuner's figures
            net = fp.net_s + (fp.simple_extra_s if proto == "simple" else 0.0)
            post = fp.post_s
        else:                                                # InfiniBand / RoCE: tuning.cc's NET row
            net, post = p.net_s, cat.post_s
        hop = max(hop, net)
        post *= cat.simple_post_factor if proto == "simple" else 1.0
        return p.base_s + hop + remote_peers * post
    return p.base_s + hop


def protocol_fraction(proto: str, cat: DispatchCatalog | None = None) -> float:
    """Share of a link's achievable bandwidth the protocol carries as payload."""
    return (cat or dispatch_catalog()).protocols[proto].bandwidth_fraction


# ----------------------------------------------------------------------------------------------
# DeepEP


def _interp_log2(table: Mapping[int, tuple[float, ...]], ep: int, col: int) -> float:
    """Column ``col`` of ``table`` at ``ep``: linear in log2(EP) between the printed sizes, held at the ends."""
    keys = sorted(table)
    if ep <= keys[0]:
        return table[keys[0]][col]
    if ep >= keys[-1]:
        return table[keys[-1]][col]
    hi = next(k for k in keys if k >= ep)
    lo = max(k for k in keys if k <= ep)
    if hi == lo:
        return table[lo][col]
    w = (math.log2(ep) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return table[lo][col] * (1 - w) + table[hi][col] * w


def deepep_normal_fractions(ep: int, cat: DispatchCatalog | None = None) -> tuple[float, float]:
    """(NVLink, RDMA) fractions of line rate DeepEP's normal kernels reach at EP size ``ep``: the README's
    bottleneck bandwidths over the line rates of its H800 nodes; the dispatch and combine figures are joined
    by their harmonic mean (one of each runs per MoE layer, so the pair's time is the bytes over it). The
    README's internode figures are "logical" bandwidths (local traffic included): above line rate they are
    held at 1."""
    d = (cat or dispatch_catalog()).deepep

    def hmean(table: Mapping[int, tuple[float, ...]]) -> float:
        a, b = _interp_log2(table, ep, 0), _interp_log2(table, ep, 1)
        return 2.0 / (1.0 / a + 1.0 / b)

    return (min(1.0, hmean(d.normal_nvlink) / d.nvlink_line_gbps),
            min(1.0, hmean(d.normal_rdma) / d.rdma_line_gbps))


def deepep_instance(instance: Instance, ep: int, cat: DispatchCatalog | None = None) -> Instance:
    """``instance`` with its scale-up and scale-out efficiencies replaced by DeepEP's normal-kernel fractions at
    EP size ``ep`` (the link and NIC line rates stay the instance's own)."""
    nv, rdma = deepep_normal_fractions(ep, cat)
    return dataclasses.replace(instance, scale_up=dataclasses.replace(instance.scale_up, efficiency=nv),
                               fabric=dataclasses.replace(instance.fabric, efficiency=rdma))


def hybridep_fraction(ep: int, cat: DispatchCatalog | None = None) -> float:
    """Fraction of NVLink line rate HybridEP's dispatch and combine reach at EP size ``ep`` inside one NVLink
    domain: the GB200 table's Torch-API bandwidths (interpolated in log2 EP, held at the ends: the table stops at
    36 ranks) over GB200's 900 GB/s, dispatch and combine joined by their harmonic mean (one of each per MoE layer
    and pass, moving the same bytes). The table's bytes are those a rank receives, one copy per token and
    destination rank: the caller counts the same (``fmsim.model.ops.moe_mlp_forward``)."""
    h = (cat or dispatch_catalog()).hybridep
    a, b = _interp_log2(h.nvlink, ep, 0), _interp_log2(h.nvlink, ep, 1)
    return min(1.0, 2.0 / (1.0 / a + 1.0 / b) / h.nvlink_line_gbps)


def hybridep_instance(instance: Instance, ep: int, cat: DispatchCatalog | None = None) -> Instance:
    """``instance`` with its scale-up efficiency replaced by HybridEP's fraction at EP size ``ep``
    (:func:`hybridep_fraction`; the link's line rate stays the instance's own)."""
    return dataclasses.replace(instance, scale_up=dataclasses.replace(instance.scale_up,
                                                                      efficiency=hybridep_fraction(ep, cat)))


def deepep_low_latency_s(op: str, size_bytes: float, ep: int, instance: Instance,
                         cat: DispatchCatalog | None = None) -> float:
    """One low-latency ``dispatch`` or ``combine`` call that sends ``size_bytes`` from each rank (the caller's byte
    count: every token to each of its top-k experts, fmsim.model.deepep): the bytes over the README's bandwidth at
    ``ep`` (interpolated in log2 EP, held at the ends), scaled by the instance's per-GPU NIC line rate against the
    table's 50 GB/s. The table has one token count (128 a rank), so its fixed part is not printed: a call never
    takes less than one hop of the farthest link the group crosses (the link catalog's latency, the floor the
    normal kernels pay too) -- not NCCL's send/recv protocol latencies, which DeepEP's kernels (NVSHMEM / IBGDA
    puts) do not run through."""
    if op not in ("dispatch", "combine"):
        raise ConfigError(f"op must be 'dispatch' or 'combine' (got {op!r})", field="op")
    if size_bytes <= 0 or ep <= 1:
        return 0.0
    disp, comb, floor = deepep_low_latency_rates(ep, instance, cat)
    return max(size_bytes / (disp if op == "dispatch" else comb), floor)


def deepep_low_latency_rates(ep: int, instance: Instance,
                             cat: DispatchCatalog | None = None) -> tuple[float, float, float]:
    """(dispatch bytes/s, combine bytes/s, floor seconds) of DeepEP's low-latency kernels over an EP group of ``ep``
    packed into as few nodes of ``instance`` as it fills (:func:`deepep_low_latency_s`)."""
    from .collectives import GroupShape, group_view     # collectives imports this module

    d = (cat or dispatch_catalog()).deepep
    nic = instance.num_nics * instance.nic_bytes_per_s / instance.num_accelerators
    scale = _GB * nic / (d.rdma_line_gbps * _GB)
    view = group_view(instance, GroupShape(size=ep, per_node=min(ep, instance.num_accelerators)))
    floor = max((t.latency_s for t in view.tiers), default=0.0)
    return _interp_log2(d.low_latency, ep, 1) * scale, _interp_log2(d.low_latency, ep, 3) * scale, floor


__all__ = [
    "PROTOCOLS",
    "DeepEP",
    "DispatchCatalog",
    "FabricProtocols",
    "HybridEP",
    "Protocol",
    "deepep_instance",
    "deepep_low_latency_rates",
    "deepep_low_latency_s",
    "deepep_normal_fractions",
    "dispatch_catalog",
    "hybridep_fraction",
    "hybridep_instance",
    "nccl_transport",
    "p2p_latency_s",
    "p2p_protocol",
    "protocol_fraction",
]
