"""The hardware catalog's chips and systems: ``accelerators:``, ``fabrics:``, ``links:`` and ``instances:``
(``hardware_catalog/accelerators.yaml``, ``fabrics.yaml``, ``instances.yaml``, ``reference_systems.yaml``).

Each kind's keys are declared here (``*_KEYS``) and read just below by the scenario reader's typed getters,
which carry every field's type, unit and default: a quantity in its unit through :mod:`fmsim.units` and
then SI, a number, a fraction in (0, 1], a choice, a flag. Anything else in an entry is refused with a
"did you mean"; a bad value is the one line ``FILE: instances.p5.48xlarge.network.nics: ... (got ...)``.
The formats are documented in docs/catalogs.md (a test keeps every key listed there).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..fields import _what, suggest
from ..units import parse_bytes, parse_flop_rate, parse_rate, parse_time
from .files import _Entry
from .specs import PRECISIONS, Accelerator, Fabric, Instance, ScaleUp

PROVIDERS = ("aws", "reference")
SCALE_UP_KINDS = ("nvswitch", "nvl-domain", "neuronlink", "pcie")
TOPOLOGIES = ("crossbar", "torus2d", "ring")
FABRIC_KINDS = ("efa", "infiniband", "roce")

ACCELERATOR_KEYS = ("vendor", "peak", "hbm", "memory_type", "hbm_bandwidth", "scale_up_bandwidth",
                    "max_power_w", "host_link", "cores", "compute_units", "efficiency", "notes", "source")
PEAK_KEYS = PRECISIONS
EFFICIENCY_KEYS = ("gemm", "hbm", "attention", "attention_flash2", "attention_flash1", "attention_forward",
                   "attention_fp8", "overlap_clock", "moe_op", "gemm_k0", "source")
FABRIC_KEYS = ("kind", "nic_bandwidth", "latency", "efficiency", "ring_efficiency", "in_network_reduction",
               "notes", "source")
LINK_KEYS = ("latency", "efficiency", "in_switch_reduction", "bandwidth", "notes", "source")
INSTANCE_KEYS = ("provider", "accelerator", "accelerators", "scale_up", "network", "host_memory",
                 "local_nvme", "vcpus", "nodes_per_unit", "ebs_bandwidth", "ena_bandwidth", "notes", "source")
SCALE_UP_KEYS = ("kind", "link", "domain", "topology", "bandwidth", "latency", "efficiency",
                 "in_switch_reduction", "cross_node_bandwidth", "cross_node_topology", "notes", "source")
NETWORK_KEYS = ("fabric", "nics", "nic_bandwidth", "notes")


def _precision_fractions(eff: _Entry, key: str, peaks: Mapping[str, float], name: str, *,
                         what: str = "fractions") -> dict[str, float]:
    """``efficiency.<key>`` as {precision: fraction} (``what`` "numbers": {precision: positive number}): each a
    known precision the chip has a peak for."""
    if not eff.has(key):
        return {}
    if not isinstance(eff.raw(key), Mapping):
        raise eff.err(key, f"must map precisions to {what} (got {_what(eff.raw(key))})")
    sec = eff.section(key, (*PRECISIONS, "source", "note"))
    out: dict[str, float] = {}
    for k in sec.data:
        if k in ("source", "note"):
            continue
        if k not in peaks:
            raise sec.err(k, f"{name} has no {k} peak to take a fraction of")
        out[k] = sec.fraction(k) if what == "fractions" else sec.number(k)
    return out


def load_accelerator(name: str, e: _Entry) -> Accelerator:
    e.notes()
    peak = e.section("peak", PEAK_KEYS, required=True, what="a mapping of precision: dense FLOP/s")
    peaks = {p: peak.quantity(p, parse_flop_rate, None, expected="dense FLOP/s, e.g. '989 TFLOP/s'")
             for p in PRECISIONS}
    peaks = {p: v for p, v in peaks.items() if v is not None}
    if not peaks:
        raise e.err("peak", f"needs at least one of {', '.join(PRECISIONS)}")
    eff = e.section("efficiency", EFFICIENCY_KEYS, required=True)
    if isinstance(eff.raw("gemm"), Mapping):
        gemm = _precision_fractions(eff, "gemm", peaks, name)
        if not gemm:
            raise eff.err("gemm", "names no precision (expected a fraction per precision, e.g. {bf16: 0.8})")
    else:
        gemm = {"bf16": eff.fraction("gemm")}
    return Accelerator(
        name=name,
        vendor=e.text("vendor", ""),
        peak_flop_per_s=peaks,
        hbm_bytes=e.quantity("hbm", parse_bytes, expected="device memory, e.g. '81920 MiB'"),
        hbm_bytes_per_s=e.quantity("hbm_bandwidth", parse_rate, expected="e.g. '3.35 TB/s'"),
        scale_up_bytes_per_s=e.quantity("scale_up_bandwidth", parse_rate, 0.0,
                                        expected="per device, per direction"),
        gemm_efficiency=gemm,
        hbm_efficiency=eff.fraction("hbm"),
        attention_efficiency=eff.fraction("attention", 0.0),
        attention_flash2_efficiency=eff.fraction("attention_flash2", 0.0),
        attention_flash1_efficiency=eff.fraction("attention_flash1", 0.0),
        attention_forward_efficiency=eff.fraction("attention_forward", 0.0),
        attention_fp8_efficiency=eff.fraction("attention_fp8", 0.0),
        overlap_clock_ratio=eff.fraction("overlap_clock", 1.0),
        moe_op_efficiency=_precision_fractions(eff, "moe_op", peaks, name),
        gemm_k0_steps=_precision_fractions(eff, "gemm_k0", peaks, name, what="numbers"),
        compute_units=e.integer("compute_units", 0, minimum=1),
        cores=e.integer("cores", 1, minimum=1),
        source=e.source(),
        calibration=eff.source() if eff.has("source") else "",
        memory_type=e.text("memory_type", ""),
        max_power_w=e.number("max_power_w", None),
        host_link_bytes_per_s=e.quantity("host_link", parse_rate, 0.0, expected="per device, per direction"),
    )


def load_fabric(name: str, e: _Entry) -> Fabric:
    e.notes()
    return Fabric(
        name=name,
        kind=e.choice("kind", FABRIC_KINDS),
        nic_bytes_per_s=e.quantity("nic_bandwidth", parse_rate,
                                   expected="per NIC, per direction, e.g. '100 Gbps'"),
        latency_s=e.quantity("latency", parse_time, expected="one NCCL hop, e.g. '19 us'"),
        efficiency=e.fraction("efficiency"),
        ring_efficiency=e.fraction("ring_efficiency", 0.0),
        in_network_reduction=e.boolean("in_network_reduction", False),
        source=e.source(),
    )


def load_link(name: str, e: _Entry) -> Mapping[str, Any]:
    """A scale-up link technology (NVLink 4, NeuronLink v3 ...): latency, efficiency, NVLS."""
    e.notes()
    return {
        "latency_s": e.quantity("latency", parse_time, expected="one hop, e.g. '3 us'"),
        "efficiency": e.fraction("efficiency"),
        "in_switch_reduction": e.boolean("in_switch_reduction", False),
        "bytes_per_s": e.quantity("bandwidth", parse_rate, 0.0, expected="per device, per direction"),
        "source": e.source(),
    }


def _known(e: _Entry, key: str, kind: str, table: Mapping[str, Any]) -> Any:
    name = e.text(key, nonempty=True)
    if name not in table:
        raise e.err(key, f"unknown {kind} {name!r}{suggest(name, list(table))}")
    return table[name]


def _scale_up(su: _Entry, n_acc: int, acc: Accelerator, links: Mapping[str, Mapping[str, Any]]) -> ScaleUp:
    link = _known(su, "link", "link", links)
    su.notes()
    # The accelerator knows how many links it has, so its per-device figure wins over a per-link one.
    bw = su.quantity("bandwidth", parse_rate, acc.scale_up_bytes_per_s or link["bytes_per_s"],
                     expected="per device, per direction")
    if not bw:
        raise su.err("bandwidth", "is required (per device, per direction) when neither the accelerator "
                                  "nor the link has one")
    domain = su.integer("domain", n_acc, minimum=1)
    if domain % n_acc and n_acc % domain:
        raise su.err("domain", f"{domain} devices neither divide nor are a multiple of the node's {n_acc}")
    cross_bw = su.quantity("cross_node_bandwidth", parse_rate, 0.0, expected="per device, per direction")
    cross_topo = su.choice("cross_node_topology", TOPOLOGIES, "ring" if cross_bw else "")
    if cross_topo and not cross_bw:
        raise su.err("cross_node_topology", "needs cross_node_bandwidth (per device, per direction)")
    if cross_bw and domain <= n_acc:
        raise su.err("cross_node_bandwidth", f"needs a domain larger than one node ({domain} <= {n_acc})")
    return ScaleUp(
        kind=su.choice("kind", SCALE_UP_KINDS),
        domain_size=domain,
        bytes_per_s=bw,
        latency_s=su.quantity("latency", parse_time, link["latency_s"], expected="one hop, e.g. '3 us'"),
        topology=su.choice("topology", TOPOLOGIES, "crossbar"),
        in_switch_reduction=su.boolean("in_switch_reduction", link["in_switch_reduction"]),
        efficiency=su.fraction("efficiency", link["efficiency"]),
        source=su.source() if su.has("source") else link["source"],
        cross_node_bytes_per_s=cross_bw,
        cross_node_topology=cross_topo,
    )


def load_instance(name: str, e: _Entry, accels: Mapping[str, Accelerator], fabrics: Mapping[str, Fabric],
                  links: Mapping[str, Mapping[str, Any]]) -> Instance:
    acc = _known(e, "accelerator", "accelerator", accels)
    n_acc = e.integer("accelerators", minimum=1, hint="accelerators per node")
    su = e.section("scale_up", SCALE_UP_KEYS, required=True)
    net = e.section("network", NETWORK_KEYS, required=True)
    fabric = _known(net, "fabric", "fabric", fabrics)
    net.notes()
    return Instance(
        name=name,
        provider=e.choice("provider", PROVIDERS, "aws"),
        accelerator=acc,
        num_accelerators=n_acc,
        scale_up=_scale_up(su, n_acc, acc, links),
        fabric=fabric,
        num_nics=net.integer("nics", minimum=1, hint="scale-out NICs per node"),
        nic_bytes_per_s=net.quantity("nic_bandwidth", parse_rate, fabric.nic_bytes_per_s,
                                     expected="per NIC, per direction"),
        host_memory_bytes=e.quantity("host_memory", parse_bytes, 0.0, expected="e.g. '2048 GiB'"),
        local_nvme_bytes=e.quantity("local_nvme", parse_bytes, 0.0, expected="e.g. '30.4 TB'"),
        num_vcpus=e.integer("vcpus", 0, minimum=1),
        nodes_per_unit=e.integer("nodes_per_unit", 1, minimum=1),
        notes=e.notes(),
        ebs_bytes_per_s=e.quantity("ebs_bandwidth", parse_rate, 0.0, expected="e.g. '80 Gbps'"),
        ena_bytes_per_s=e.quantity("ena_bandwidth", parse_rate, 0.0, expected="e.g. '300 Gbps'"),
        source=e.source(),
    )
