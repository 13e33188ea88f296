"""The ``cluster:`` section with its ``network``/``storage``/``stragglers`` sub-sections, and ``data:``:
:class:`Cluster`, :class:`DataSpec`, their keys and choices, and the check that the workload's
precision runs on the cluster's accelerator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog, Instance, per_core, with_in_network_reduction
from ..errors import ConfigError
from ..units import parse_bytes, parse_rate
from .reader import _Section, _relocate, _what, float_number
from .schema import PRECISIONS
from .workload import Workload


CLUSTER_KEYS = ("instance", "nodes", "gpus", "placement", "network", "storage", "stragglers", "rank_unit")
RANK_UNITS = ("chip", "core")
STRAGGLER_KEYS = ("cv",)
NETWORK_KEYS = ("fabric", "nics_per_node", "nic_bandwidth", "oversubscription", "in_network_reduction", "nvls")
STORAGE_KEYS = ("kind", "tier", "deployment", "throughput_per_tib", "capacity", "throughput", "efa",
                "metadata_iops", "prefixes")
#: ``data:`` (fmsim/workloads/data_loading.py): what one training sample weighs and where it is read from
DATA_KEYS = ("bytes_per_token", "sample_bytes", "prefetch", "source", "samples_per_file")
DATA_SOURCES = ("storage", "local")
# The largest clusters hold a few hundred thousand accelerators; the bound is orders of magnitude past them.
MAX_GPUS = 2**24               # accelerators in one cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Where it runs: an instance type (with ``network:`` overrides applied) times a node count."""

    instance: Instance
    nodes: int
    gpus: int
    placement: str = "auto"
    oversubscription: float = 1.0
    storage: Mapping[str, Any] | None = None  # kind, tier, deployment, throughput_per_tib (B/s), capacity (B)
    straggler_cv: float = 0.0  # per-rank compute-time jitter (coefficient of variation, normal)
    rank_unit: str = "chip"  # chip | core: one rank per NeuronCore, each a share of its chip


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    """``data:``: bytes read per sample and where from (fmsim/workloads/data_loading.py)."""

    bytes_per_token: float = 4.0           # pre-tokenised text: int32 token ids (vocabularies over 65,536)
    sample_bytes: float | None = None      # a whole sample (multimodal), instead of tokens x bytes_per_token
    prefetch: int = 2                      # batches read ahead (PyTorch DataLoader prefetch_factor default)
    source: str = "storage"                # storage (cluster.storage) | local (node-local copy: no stall)
    samples_per_file: int | None = None    # for the metadata operations (one open per file)


def _cluster(top: _Section, catalog: Catalog) -> Cluster:
    cl = top.section("cluster", CLUSTER_KEYS, required=True)
    assert cl is not None
    name = cl.raw("instance", hint="a hardware_catalog instance, e.g. p5.48xlarge")
    if not isinstance(name, str):
        raise cl.err("instance", f"got {_what(name)} (expected an instance name, e.g. p5.48xlarge)")
    try:
        base = catalog.instance(name)
    except ConfigError as exc:
        raise _relocate(exc, cl.file, cl.path("instance")) from None
    inst = base
    oversubscription = 1.0
    net = cl.section("network", NETWORK_KEYS)
    if net is not None:
        if net.has("fabric"):
            fab_name = net.text("fabric")
            kinds = sorted({f.kind for f in catalog.fabrics.values()})
            if fab_name not in catalog.fabrics and fab_name in kinds:
                # A fabric kind (DESIGN.md: "infiniband | roce"): change the protocol, keep the node's
                # NICs -- the catalog fabric of that kind whose NIC rate is closest to the node's.
                same_kind = [f for f in catalog.fabrics.values() if f.kind == fab_name]
                fabric = min(same_kind, key=lambda f: (abs(f.nic_bytes_per_s - inst.nic_bytes_per_s), f.name))
                inst = dataclasses.replace(inst, fabric=fabric)
            else:
                try:
                    fabric = catalog.fabric(fab_name)
                except ConfigError as exc:
                    raise _relocate(exc, net.file, net.path("fabric")) from None
                inst = dataclasses.replace(inst, fabric=fabric, nic_bytes_per_s=fabric.nic_bytes_per_s)
        if net.has("nics_per_node"):
            inst = dataclasses.replace(inst, num_nics=net.integer("nics_per_node"))
        if net.has("nic_bandwidth"):
            inst = dataclasses.replace(
                inst,
                nic_bytes_per_s=net.quantity(
                    "nic_bandwidth", parse_rate, expected="a rate like '100 Gbps' or '50 GB/s'"
                ),
            )
        if net.has("in_network_reduction"):
            # SHARP: the InfiniBand switches reduce (all-reduce, and with NCCL >= 2.20 reduce-scatter and
            # all-gather); the catalog fabrics leave it off, since NCCL uses it only with the SHARP plugin
            try:
                inst = with_in_network_reduction(inst, net.boolean("in_network_reduction"))
            except ConfigError as exc:
                raise net.err("in_network_reduction",
                              f"true {exc.message} (expected false, or network.fabric: infiniband)") from None
        if net.has("nvls"):
            # NCCL's NVLink SHARP (NCCL_NVLS_ENABLE, NCCL >= 2.17): the NVSwitches reduce; a run may turn it off
            nvls = net.boolean("nvls")
            if nvls and not base.scale_up.in_switch_reduction:
                raise net.err("nvls", f"true, but {base.name}'s {base.scale_up.kind} scale-up has no switch that "
                              "reduces (NVLS needs NVSwitch gen 3 or later: expected false, or leave it out)")
            inst = dataclasses.replace(inst, scale_up=dataclasses.replace(inst.scale_up, in_switch_reduction=nvls))
        oversubscription = net.quantity(
            "oversubscription",
            float_number,
            1.0,
            minimum=1.0,
            inclusive=True,
            expected="a ratio >= 1 (1 = non-blocking)",
        )
    rank_unit = cl.choice("rank_unit", RANK_UNITS, "chip")
    if rank_unit == "core":
        if inst.accelerator.cores <= 1:
            raise cl.err("rank_unit", f"core needs an accelerator split into cores; {inst.accelerator.name} "
                                      "has one (expected rank_unit: chip)")
        inst = per_core(inst)
    per_node = inst.num_accelerators
    has_nodes, has_gpus = cl.has("nodes"), cl.has("gpus")
    if not has_nodes and not has_gpus:
        raise cl.err("nodes", f"is required (expected nodes: N, or gpus: a multiple of {per_node})")
    nodes = cl.integer("nodes", counts=True) if has_nodes else None
    gpus = cl.integer("gpus", counts=True) if has_gpus else None
    if gpus is not None:
        if gpus % per_node:
            raise cl.err(
                "gpus",
                f"{gpus} is not a multiple of the {per_node} accelerators of one {name} "
                f"(expected a multiple of {per_node})",
            )
        if nodes is not None and nodes * per_node != gpus:
            raise cl.err(
                "gpus",
                f"{gpus} disagrees with nodes: {nodes} x {per_node} = {nodes * per_node} "
                "(expected nodes or gpus, or both agreeing)",
            )
        nodes = gpus // per_node
    assert nodes is not None
    if nodes * per_node > MAX_GPUS:
        key = "gpus" if has_gpus else "nodes"
        raise cl.err(key, f"{nodes * per_node:,} accelerators is past the {MAX_GPUS:,} any cluster could "
                     f"hold (expected a cluster size such as {16 * per_node})")
    unit = inst.nodes_per_unit
    if inst.provider == "aws" and unit > 1 and nodes % unit:
        key = "gpus" if has_gpus else "nodes"
        raise cl.err(
            key,
            f"{name} is sold in units of {unit} nodes ({unit * per_node} accelerators); {nodes} "
            f"nodes is not a whole number of units (expected a multiple of {unit} nodes)",
        )
    placement = cl.text("placement", "auto", nonempty=True)
    storage = _storage(cl, catalog)
    straggler_cv = 0.0
    sg = cl.section("stragglers", STRAGGLER_KEYS)
    if sg is not None:
        straggler_cv = sg.quantity("cv", float_number, 0.0, minimum=0.0, inclusive=True,
                                   expected="a coefficient of variation >= 0, e.g. 0.02")
        if straggler_cv >= 1.0:
            raise sg.err("cv", f"{straggler_cv} is not below 1 (expected a coefficient of variation, e.g. 0.02)")
    cluster = Cluster(
        instance=inst,
        nodes=nodes,
        gpus=nodes * per_node,
        placement=placement,
        oversubscription=oversubscription,
        storage=storage,
        straggler_cv=straggler_cv,
        rank_unit=rank_unit,
    )
    return cluster


def _storage(cl: _Section, catalog: Catalog) -> dict[str, Any] | None:
    st = cl.section("storage", STORAGE_KEYS)
    if st is None:
        return None
    out: dict[str, Any] = {"kind": st.text("kind", nonempty=True)}
    if st.has("tier"):
        tier = st.text("tier")
        try:
            catalog.storage_tier(tier)
        except ConfigError as exc:
            raise _relocate(exc, st.file, st.path("tier")) from None
        out["tier"] = tier
    if st.has("deployment"):
        out["deployment"] = st.text("deployment", nonempty=True)
    if st.has("throughput_per_tib"):
        out["throughput_per_tib"] = st.quantity(
            "throughput_per_tib", parse_rate, expected="a rate per TiB like '250 MB/s'"
        )
    if st.has("capacity"):
        out["capacity"] = st.quantity("capacity", parse_bytes, expected="a size like '480 TiB'")
    if st.has("throughput"):
        out["throughput"] = st.quantity("throughput", parse_rate, expected="a rate like '40 GB/s'")
    if st.has("efa"):
        out["efa"] = st.boolean("efa")
        efa_tier = out.get("tier") and catalog.storage_tier(out["tier"]).per_client_efa_bytes_per_s
        if out["efa"] and not efa_tier:
            raise st.err("efa", "true needs an FSx for Lustre PERSISTENT_2 tier (EFA is set at creation, "
                                "PERSISTENT_2 only; expected a fsx-lustre-persistent-2-* tier or efa: false)")
    if st.has("metadata_iops"):
        out["metadata_iops"] = st.integer("metadata_iops", minimum=1, maximum=10_000_000)
    if st.has("prefixes"):
        out["prefixes"] = st.integer("prefixes", minimum=1, maximum=1_000_000)
    return out


def _data(top: _Section) -> DataSpec | None:
    sec = top.section("data", DATA_KEYS)
    if sec is None:
        return None
    if sec.has("bytes_per_token") and sec.has("sample_bytes"):
        raise sec.err("sample_bytes", "give bytes_per_token (text) or sample_bytes (whole samples), not both")
    return DataSpec(
        bytes_per_token=sec.quantity("bytes_per_token", parse_bytes, 4.0, expected="a size like '4 B'"),
        sample_bytes=sec.quantity("sample_bytes", parse_bytes, None, expected="a size like '1.5 MB'"),
        prefetch=sec.integer("prefetch", 2, minimum=0, maximum=1024),
        source=sec.choice("source", DATA_SOURCES, "storage"),
        samples_per_file=sec.integer("samples_per_file", None, minimum=1, maximum=10**12),
    )


def _check_precision(workload: Workload, wl_sec: _Section, cluster: Cluster) -> None:
    accel = cluster.instance.accelerator
    if workload.precision not in accel.peak_flop_per_s:
        raise wl_sec.err(
            "precision",
            f"{workload.precision} is not supported by the {accel.name} of "
            f"{cluster.instance.name} (expected one of "
            f"{', '.join(p for p in PRECISIONS if p in accel.peak_flop_per_s)})",
        )
