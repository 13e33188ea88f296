"""The catalog's frozen specs: what one accelerator, scale-up domain, fabric, price, instance type and
storage tier is once read (every quantity in SI), and :class:`Catalog`, the tables by name with their
lookups. The files they are read from, and each kind's fields, are in :mod:`fmsim.catalog.hardware`
and :mod:`fmsim.catalog.offers` (docs/catalogs.md).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..fields import suggest

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
PRICING_OPTIONS = ("on-demand", "capacity-block", "savings-plan-1yr", "savings-plan-3yr")

# ----------------------------------------------------------------------------------------------
# specs


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One accelerator chip: peaks, memory and the achievable fractions the cost models use."""

    name: str
    vendor: str
    peak_flop_per_s: Mapping[str, float]          # dense peak per precision (fp32, tf32, bf16, ...)
    hbm_bytes: float
    hbm_bytes_per_s: float
    scale_up_bytes_per_s: float                   # per device, per direction
    gemm_efficiency: Mapping[str, float]          # achievable fraction of peak for large GEMMs, per precision
    hbm_efficiency: float                         # achievable fraction of HBM bandwidth (streaming)
    attention_efficiency: float = 0.0             # fused (flash) attention fwd+bwd fraction of peak; 0 = gemm's
    attention_flash2_efficiency: float = 0.0      # FlashAttention-2-class kernels (FA2, Triton ports); 0 = attention's
    attention_flash1_efficiency: float = 0.0      # FlashAttention-1 class (FA1, 2022 Triton); 0 = unknown
    attention_forward_efficiency: float = 0.0     # causal attention forward only (serving prefill); 0 = gemm bf16's
    attention_fp8_efficiency: float = 0.0         # fused attention fwd+bwd in fp8, fraction of the fp8 peak; 0 = unknown
    compute_units: int = 0                        # SMs (NVIDIA) that GEMM tiles are spread over; 0 = unknown
    cores: int = 1                                # devices a framework runs one rank on (NeuronCores per chip)
    overlap_clock_ratio: float = 1.0              # core clock while communication overlaps compute, / nominal
    #: a serving engine's fused MoE op: the share of the grouped-GEMM model's rate its expert GEMMs reach, per
    #: precision (empty: 1, the model's own rate)
    moe_op_efficiency: Mapping[str, float] = field(default_factory=dict)
    #: the GEMM depth constant K0 (k-steps, ``k / (k + K0)``) per precision where it was measured on the chip's
    #: architecture (empty: fmsim.model.kernels.gemm_k0's rule, the H800 fit scaled by the math rate)
    gemm_k0_steps: Mapping[str, float] = field(default_factory=dict)
    source: str
    calibration: str = ""                         # where the efficiency figures come from
    memory_type: str = ""                         # HBM3, HBM3e, GDDR6 ... (informative)
    max_power_w: float | None = None              # board power limit, if published
    host_link_bytes_per_s: float = 0.0            # to host memory, per device, per direction; 0 = unknown

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s in ``precision``; raises if the chip has no such math."""
        try:
            return self.peak_flop_per_s[precision]
        except KeyError:
            raise ConfigError(
                f"{self.name} has no {precision} math (has: {', '.join(self.peak_flop_per_s)})") from None

    def gemm_flop_per_s(self, precision: str) -> float:
        """Achievable FLOP/s of a large GEMM in ``precision``."""
        eff = self.gemm_efficiency.get(precision, self.gemm_efficiency.get("bf16", 1.0))
        return self.peak(precision) * eff


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleUp:
    """The scale-up domain: NVSwitch crossbar, NVL36/72 rack domain, or NeuronLink torus/ring."""

    kind: str                      # nvswitch | nvl-domain | neuronlink | pcie
    domain_size: int               # devices in one domain (8 on p5, 72 on a GB200 NVL72)
    bytes_per_s: float             # per device, per direction
    latency_s: float
    topology: str = "crossbar"     # crossbar | torus2d | ring
    in_switch_reduction: bool = False   # NVLS / SHARP-like reduction in the switch
    efficiency: float = 0.8        # achievable fraction of bytes_per_s in collectives
    source: str = ""
    # A domain that spans several nodes with slower links between them (Trn2 UltraServer: 4x4 torus
    # inside each instance, a ring of same-position chips across the 4 instances). 0 / "" = the
    # domain is uniform (NVL72's NVSwitch trays give every GPU the same bandwidth to every other).
    cross_node_bytes_per_s: float = 0.0   # per device, per direction, on the links leaving the node
    cross_node_topology: str = ""         # topology of those links (ring)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fabric:
    """A scale-out fabric generation (EFA v1-v4, InfiniBand HDR/NDR, RoCE)."""

    name: str
    kind: str                      # efa | infiniband | roce
    nic_bytes_per_s: float         # per NIC, per direction, line rate
    latency_s: float               # one-way small-message latency between nodes
    efficiency: float              # achievable fraction of line rate (bus-bandwidth efficiency)
    source: str
    in_network_reduction: bool = False
    #: fraction of line rate NCCL's classic ring streams through the NICs; 0 = ``efficiency``
    ring_efficiency: float = 0.0

    @property
    def ring_fraction(self) -> float:
        """Fraction of line rate a ring's stream reaches through the NICs (``efficiency`` if not known)."""
        return self.ring_efficiency or self.efficiency


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """One price of one instance type under one purchase option, with its date.

    ``usd_per_hour`` is per node (one instance of the catalog entry); an UltraServer unit costs
    ``nodes_per_unit`` times as much.
    """

    option: str
    usd_per_hour: float
    date: str                      # ISO date the price was observed or published
    region: str
    source: str
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """An EC2 instance type (or a reference system, ``provider: reference``)."""

    name: str
    provider: str                  # aws | reference
    accelerator: Accelerator
    num_accelerators: int          # per node
    scale_up: ScaleUp
    fabric: Fabric
    num_nics: int                  # scale-out NICs per node
    nic_bytes_per_s: float         # per NIC
    host_memory_bytes: float
    local_nvme_bytes: float
    num_vcpus: int
    source: str
    nodes_per_unit: int = 1        # UltraServer: nodes sold together as one unit
    notes: str = ""
    ebs_bytes_per_s: float = 0.0   # EBS bandwidth of one node, if published
    ena_bytes_per_s: float = 0.0   # dedicated ENA bandwidth besides the EFA NICs (p6-b300: storage/S3)

    @property
    def scale_out_bytes_per_s(self) -> float:
        """Scale-out line rate of one node, per direction."""
        return self.num_nics * self.nic_bytes_per_s

    @property
    def accelerators_per_unit(self) -> int:
        """Accelerators in one purchasable unit (72 for ``u-p6e-gb200x72``, 8 for ``p5.48xlarge``)."""
        return self.num_accelerators * self.nodes_per_unit

    @property
    def is_reference(self) -> bool:
        """True for the reference systems of published measurements (DGX ...), which have no price."""
        return self.provider == "reference"


def with_in_network_reduction(instance: Instance, on: bool = True) -> Instance:
    """``instance`` whose scale-out switches reduce (NVIDIA SHARP) -- or not. SHARP exists on InfiniBand
    switches only: asking it of another fabric is a :class:`ConfigError` naming the fabric."""
    if on and instance.fabric.kind != "infiniband":
        raise ConfigError(f"needs InfiniBand switches that reduce (NVIDIA SHARP); {instance.name}'s "
                          f"{instance.fabric.name} is {instance.fabric.kind}")
    return dataclasses.replace(instance, fabric=dataclasses.replace(instance.fabric, in_network_reduction=on))


def per_core(instance: Instance) -> Instance:
    """``instance`` seen one core at a time: what a framework that runs a rank per core (Neuron: one per
    NeuronCore) schedules on. Each chip becomes ``cores`` devices with an equal share of its math, HBM
    capacity and bandwidth and scale-up links; the node's NICs are shared by twice (cores times) the
    devices. The core is the unit a Neuron topology string counts ("TP=32" on a 16-chip trn1)."""
    acc = instance.accelerator
    c = acc.cores
    if c <= 1:
        return instance
    core = dataclasses.replace(
        acc, name=f"{acc.name}-core", peak_flop_per_s={k: v / c for k, v in acc.peak_flop_per_s.items()},
        hbm_bytes=acc.hbm_bytes / c, hbm_bytes_per_s=acc.hbm_bytes_per_s / c,
        scale_up_bytes_per_s=acc.scale_up_bytes_per_s / c, cores=1)
    su = instance.scale_up
    su = dataclasses.replace(su, domain_size=su.domain_size * c, bytes_per_s=su.bytes_per_s / c,
                             cross_node_bytes_per_s=su.cross_node_bytes_per_s / c)
    return dataclasses.replace(instance, accelerator=core, num_accelerators=instance.num_accelerators * c,
                               scale_up=su)


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageTier:
    """A storage offering: FSx for Lustre deployment type x throughput tier, or an S3 class/client."""

    name: str
    kind: str                              # fsx-lustre | s3 | s3-express | mountpoint-s3
    throughput_per_tib_bytes_per_s: float  # baseline, per TiB of capacity (0 for S3)
    burst_per_tib_bytes_per_s: float
    per_client_bytes_per_s: float          # limit of one client (ENA), or instance-to-S3
    per_client_efa_bytes_per_s: float      # with EFA / GPUDirect Storage, if supported (else 0)
    usd_per_gb_month: float | None
    price_date: str
    source: str
    notes: str = ""
    deployment: str = ""                   # scratch-1 | scratch-2 | persistent-1 | persistent-2 | ...
    media: str = ""                        # ssd | hdd (FSx)
    network_per_tib_bytes_per_s: float = 0.0     # FSx network (cache) baseline per TiB, above the disk tier
    disk_burst_per_tib_bytes_per_s: float = 0.0  # FSx disk burst per TiB
    get_requests_per_s: float = 0.0        # S3: per partitioned prefix; Express: per directory bucket
    put_requests_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Catalog:
    """Everything the hardware and model catalogs hold, by name."""

    accelerators: Mapping[str, Accelerator]
    fabrics: Mapping[str, Fabric]
    instances: Mapping[str, Instance]
    prices: Mapping[str, tuple[Price, ...]]
    storage: Mapping[str, StorageTier]
    models: Mapping[str, Any]      # name -> fmsim.model.architecture.ModelSpec
    extra: Mapping[str, Any] = field(default_factory=dict)   # topology parameters, reference data
    stacks: Mapping[str, Any] = field(default_factory=dict)  # name -> fmsim.stacks.StackProfile

    def _get(self, kind: str, table: Mapping[str, Any], name: str) -> Any:
        try:
            return table[name]
        except KeyError:
            raise ConfigError(f"unknown {kind} {name!r}{suggest(name, list(table))}") from None

    def instance(self, name: str) -> Instance:
        return self._get("instance", self.instances, name)

    def accelerator(self, name: str) -> Accelerator:
        return self._get("accelerator", self.accelerators, name)

    def fabric(self, name: str) -> Fabric:
        return self._get("fabric", self.fabrics, name)

    def model(self, name: str) -> Any:
        return self._get("model", self.models, name)

    def stack(self, name: str) -> Any:
        """The software stack profile ``name`` (``stack_catalog/``), a "did you mean" on a miss."""
        return self._get("stack", self.stacks, name)

    def storage_tier(self, name: str) -> StorageTier:
        return self._get("storage tier", self.storage, name)

    def price(self, instance: str, option: str = "on-demand") -> Price | None:
        """Newest price of ``instance`` under ``option``; ``None`` if the catalog has none."""
        if option not in PRICING_OPTIONS:
            raise ConfigError(f"unknown pricing option {option!r}{suggest(option, PRICING_OPTIONS)}")
        rows = [p for p in self.prices.get(instance, ()) if p.option == option]
        if not rows:
            return None
        return max(rows, key=lambda p: _date_key(p.date))

    def storage_tiers(self, kind: str, deployment: str | None = None) -> tuple[StorageTier, ...]:
        """The storage tiers of one ``kind`` (and ``deployment``), by ascending baseline throughput."""
        rows = [t for t in self.storage.values()
                if t.kind == kind and (deployment is None or t.deployment == deployment)]
        if not rows:
            known = sorted({f"{t.kind}/{t.deployment}" if t.deployment else t.kind
                            for t in self.storage.values()})
            want = f"{kind}/{deployment}" if deployment else kind
            raise ConfigError(f"no storage tier {want!r}{suggest(want, known)}")
        return tuple(sorted(rows, key=lambda t: (t.throughput_per_tib_bytes_per_s, t.name)))

    def ultracluster_for(self, instance: str) -> Mapping[str, Any]:
        """UltraCluster parameters for ``instance``: its own entry merged over ``default``.

        Keys: ``rail_optimized`` (bool), ``oversubscription`` (>= 1), ``max_accelerators`` (int or
        None), ``network_levels``, ``source`` ... as written in ``hardware_catalog/instances.yaml``.
        """
        table = self.extra.get("ultracluster", {})
        out: dict[str, Any] = dict(table.get("default", {}))
        sources = [out["source"]] if "source" in out else []
        for name, body in table.items():
            if name != "default" and instance in body.get("instances", ()):
                out.update(body)
                sources.append(body["source"])
        if sources:
            out["source"] = "; ".join(sources)
        return out


def _date_key(date: str) -> _dt.date:
    """Sort key of a catalog date (``YYYY-MM`` counts as the first of the month)."""
    return _dt.date.fromisoformat(date[:10] if len(date) >= 10 else date + "-01")

