"""The hardware and model catalogs: YAML data in, frozen specs out.

Owns reading ``hardware_catalog/*.yaml`` and ``model_catalog/*.yaml`` (found in a checkout or,
after ``pip install .``, inside the package as ``fmsim/data/``), converting every quantity to SI
once, and refusing entries without a ``source:`` or prices without a date. The schema of each
file is documented in ``hardware_catalog/README.md``.

Entries of the sections this module types (``accelerators``, ``instances``, ``prices``, ``storage``,
``ultracluster``) are checked for unknown keys, with a "did you mean"; ``fabrics`` and ``links``
are read for the fields below and otherwise left to their owners. Every other top-level section is
kept, untyped, in :attr:`Catalog.extra`.

Conventions the loader enforces or documents:

* scale-up and network bandwidths are per device (per NIC), **per direction**;
* a price is USD per hour of **one node** (one instance of the entry), also for UltraServers, whose
  unit price is ``nodes_per_unit`` times that; reference systems (``provider: reference``) have none;
* an instance's scale-up bandwidth is, in order: its own ``scale_up.bandwidth``, else the
  accelerator's ``scale_up_bandwidth``, else the link's ``bandwidth``.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .units import parse_bytes, parse_flop_rate, parse_rate, parse_time

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
PRICING_OPTIONS = ("on-demand", "capacity-block", "savings-plan-1yr", "savings-plan-3yr")
PROVIDERS = ("aws", "reference")
SCALE_UP_KINDS = ("nvswitch", "nvl-domain", "neuronlink", "pcie")
TOPOLOGIES = ("crossbar", "torus2d", "ring")
STORAGE_KINDS = ("fsx-lustre", "s3", "s3-express", "mountpoint-s3")


# ----------------------------------------------------------------------------------------------
# where the data lives


def data_root() -> Path:
    """Directory holding ``hardware_catalog/``, ``model_catalog/`` and ``scenarios/``.

    A checkout (the package's parent directory has ``hardware_catalog/``) wins over the copy a
    wheel carries in ``fmsim/data/``, so that editing the YAML in a checkout takes effect at once.
    """
    pkg = Path(__file__).resolve().parent
    if (pkg.parent / "hardware_catalog").is_dir():
        return pkg.parent
    return pkg / "data"


def suggest(name: str, known: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` or, failing a close match, the list of known names."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known: {', '.join(sorted(known))})"


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


# ----------------------------------------------------------------------------------------------
# loading


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}".splitlines()[0], file=str(path)) from None


class _Entry:
    """Reads one catalog mapping with located errors."""

    def __init__(self, data: Any, file: Path, where: str):
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping", file=str(file), field=where)
        self.data, self.file, self.where = data, file, where
        self.used: set[str] = set()

    def err(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, file=str(self.file), field=f"{self.where}.{key}")

    def get(self, key: str, default: Any = dataclasses.MISSING, parse: Any = None) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is dataclasses.MISSING:
                raise self.err(key, "is required")
            return default
        value = self.data[key]
        if parse is None:
            return value
        try:
            return parse(value)
        except ConfigError as exc:
            raise self.err(key, exc.message) from None
        except (TypeError, ValueError) as exc:
            raise self.err(key, str(exc)) from None

    def sub(self, key: str, default: Any = dataclasses.MISSING) -> _Entry:
        value = self.get(key, default)
        return _Entry(value, self.file, f"{self.where}.{key}")

    def check_unknown(self) -> None:
        """Refuse keys nobody read (typos), naming the closest known key."""
        for key in self.data:
            if key not in self.used:
                raise self.err(str(key), f"unknown key{suggest(str(key), sorted(self.used))}")

    def source(self) -> str:
        src = self.get("source")
        if isinstance(src, list):
            src = "; ".join(str(s) for s in src)
        if not str(src).strip():
            raise self.err("source", "is empty (every catalog number needs a source)")
        return str(src)


def _fraction(v: Any) -> float:
    if isinstance(v, Mapping):
        v = v.get("value")
    f = float(v)
    if not 0.0 < f <= 1.0:
        raise ValueError(f"{v} is not a fraction in (0, 1]")
    return f


def _date(v: Any) -> str:
    if isinstance(v, (_dt.date, _dt.datetime)):
        return v.isoformat()[:10]
    s = str(v)
    try:
        _dt.date.fromisoformat(s[:10] if len(s) >= 10 else s + "-01" if len(s) == 7 else s)
    except ValueError:
        raise ValueError(f"{v!r} is not a date (YYYY-MM-DD or YYYY-MM)") from None
    return s


def _choice(options: tuple[str, ...]):
    """A parser that accepts one of ``options`` (as a string) and names them on a miss."""
    def parse(v: Any) -> str:
        s = str(v)
        if s not in options:
            raise ValueError(f"{s!r} is not a known value{suggest(s, options)}")
        return s
    return parse


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{v!r} is not a positive whole number")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{v!r} is not true or false")  # noqa: TRY004 -- the reader turns it into a located ConfigError
    return v


def _usd(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{v!r} is not a positive amount of US dollars")
    return float(v)


def _precision_fractions(eff_e: Any, key: str, raw: Mapping[str, Any], peaks: Mapping[str, float],
                         name: str) -> dict[str, float]:
    """``efficiency.<key>`` as {precision: fraction}: each a known precision the chip has a peak for."""
    out: dict[str, float] = {}
    for k, v in raw.items():
        if k in ("source", "note"):
            continue
        if k not in PRECISIONS:
            raise eff_e.err(f"{key}.{k}", f"unknown precision{suggest(str(k), PRECISIONS)}")
        if k not in peaks:
            raise eff_e.err(f"{key}.{k}", f"{name} has no {k} peak to take a fraction of")
        try:
            out[k] = _fraction(v)
        except (TypeError, ValueError) as exc:
            raise eff_e.err(f"{key}.{k}", str(exc)) from None
    return out


def _load_accelerator(name: str, e: _Entry) -> Accelerator:
    peaks_e = e.sub("peak")
    peaks = {p: peaks_e.get(p, None, parse_flop_rate) for p in PRECISIONS}
    peaks = {p: v for p, v in peaks.items() if v}
    peaks_e.check_unknown()
    if not peaks:
        raise e.err("peak", f"needs at least one of {', '.join(PRECISIONS)}")
    eff_e = e.sub("efficiency")
    gemm_raw = eff_e.get("gemm")
    if isinstance(gemm_raw, Mapping) and "value" not in gemm_raw:
        gemm = _precision_fractions(eff_e, "gemm", gemm_raw, peaks, name)
    else:
        gemm = {"bf16": eff_e.get("gemm", parse=_fraction)}
    hbm_eff = eff_e.get("hbm", parse=_fraction)
    attn_eff = eff_e.get("attention", 0.0, _fraction)
    attn_fa2_eff = eff_e.get("attention_flash2", 0.0, _fraction)
    attn_fa1_eff = eff_e.get("attention_flash1", 0.0, _fraction)
    attn_fwd_eff = eff_e.get("attention_forward", 0.0, _fraction)
    attn_fp8_eff = eff_e.get("attention_fp8", 0.0, _fraction)
    overlap_clock = eff_e.get("overlap_clock", 1.0, _fraction)
    moe_raw = eff_e.get("moe_op", {}) or {}
    if not isinstance(moe_raw, Mapping):
        raise eff_e.err("moe_op", f"must map precisions to fractions (got {moe_raw!r})")
    moe_op = _precision_fractions(eff_e, "moe_op", moe_raw, peaks, name)
    calibration = str(eff_e.get("source", ""))
    eff_e.check_unknown()
    acc = Accelerator(
        name=name,
        vendor=str(e.get("vendor", "")),
        peak_flop_per_s=peaks,
        hbm_bytes=e.get("hbm", parse=parse_bytes),
        hbm_bytes_per_s=e.get("hbm_bandwidth", parse=parse_rate),
        scale_up_bytes_per_s=e.get("scale_up_bandwidth", 0.0, parse_rate),
        gemm_efficiency=gemm,
        hbm_efficiency=hbm_eff,
        attention_efficiency=attn_eff,
        attention_flash2_efficiency=attn_fa2_eff,
        attention_flash1_efficiency=attn_fa1_eff,
        attention_forward_efficiency=attn_fwd_eff,
        attention_fp8_efficiency=attn_fp8_eff,
        overlap_clock_ratio=overlap_clock,
        moe_op_efficiency=moe_op,
        compute_units=int(e.get("compute_units", 0)),
        cores=e.get("cores", 1, _positive_int),
        source=e.source(),
        calibration=calibration,
        memory_type=str(e.get("memory_type", "")),
        max_power_w=e.get("max_power_w", None, float),
        host_link_bytes_per_s=e.get("host_link", 0.0, parse_rate),
    )
    e.get("notes", "")
    e.check_unknown()
    return acc


def _load_fabric(name: str, e: _Entry) -> Fabric:
    return Fabric(
        name=name,
        kind=str(e.get("kind")),
        nic_bytes_per_s=e.get("nic_bandwidth", parse=parse_rate),
        latency_s=e.get("latency", parse=parse_time),
        efficiency=e.get("efficiency", parse=_fraction),
        ring_efficiency=e.get("ring_efficiency", 0.0, parse=_fraction),
        in_network_reduction=bool(e.get("in_network_reduction", False)),
        source=e.source(),
    )


def _load_link(name: str, e: _Entry) -> Mapping[str, Any]:
    """A scale-up link technology (NVLink 4, NeuronLink v3 ...): latency, efficiency, NVLS."""
    return {
        "latency_s": e.get("latency", parse=parse_time),
        "efficiency": e.get("efficiency", parse=_fraction),
        "in_switch_reduction": bool(e.get("in_switch_reduction", False)),
        "bytes_per_s": e.get("bandwidth", 0.0, parse_rate),
        "source": e.source(),
    }


def _load_instance(name: str, e: _Entry, accels: Mapping[str, Accelerator],
                   fabrics: Mapping[str, Fabric], links: Mapping[str, Mapping[str, Any]]) -> Instance:
    acc_name = e.get("accelerator")
    if acc_name not in accels:
        raise e.err("accelerator", f"unknown accelerator {acc_name!r}{suggest(str(acc_name), list(accels))}")
    acc = accels[acc_name]
    su = e.sub("scale_up")
    net = e.sub("network")
    fab_name = net.get("fabric")
    if fab_name not in fabrics:
        raise net.err("fabric", f"unknown fabric {fab_name!r}{suggest(str(fab_name), list(fabrics))}")
    n_acc = e.get("accelerators", parse=_positive_int)
    link_name = su.get("link")
    if link_name not in links:
        raise su.err("link", f"unknown link {link_name!r}{suggest(str(link_name), list(links))}")
    link = links[link_name]
    # The accelerator knows how many links it has, so its per-device figure wins over a per-link one.
    bw = su.get("bandwidth", acc.scale_up_bytes_per_s or link["bytes_per_s"], parse_rate)
    if not bw:
        raise su.err("bandwidth", "is required (per device, per direction) when neither the accelerator "
                                  "nor the link has one")
    domain = su.get("domain", n_acc, _positive_int)
    if domain % n_acc and n_acc % domain:
        raise su.err("domain", f"{domain} devices neither divide nor are a multiple of the node's {n_acc}")
    cross_bw = su.get("cross_node_bandwidth", 0.0, parse_rate)
    cross_topo = su.get("cross_node_topology", "ring" if cross_bw else "", _choice(TOPOLOGIES))
    if cross_topo and not cross_bw:
        raise su.err("cross_node_topology", "needs cross_node_bandwidth (per device, per direction)")
    if cross_bw and domain <= n_acc:
        raise su.err("cross_node_bandwidth", f"needs a domain larger than one node ({domain} <= {n_acc})")
    scale_up = ScaleUp(
        kind=su.get("kind", parse=_choice(SCALE_UP_KINDS)),
        domain_size=domain,
        bytes_per_s=bw,
        latency_s=su.get("latency", link["latency_s"], parse_time),
        topology=su.get("topology", "crossbar", _choice(TOPOLOGIES)),
        in_switch_reduction=su.get("in_switch_reduction", link["in_switch_reduction"], _bool),
        efficiency=su.get("efficiency", link["efficiency"], _fraction),
        source=str(su.get("source", link["source"])),
        cross_node_bytes_per_s=cross_bw,
        cross_node_topology=cross_topo,
    )
    su.get("notes", "")
    su.check_unknown()
    num_nics = net.get("nics", parse=_positive_int)
    nic_bw = net.get("nic_bandwidth", fabrics[fab_name].nic_bytes_per_s, parse_rate)
    net.get("notes", "")
    net.check_unknown()
    inst = Instance(
        name=name,
        provider=e.get("provider", "aws", _choice(PROVIDERS)),
        accelerator=acc,
        num_accelerators=n_acc,
        scale_up=scale_up,
        fabric=fabrics[fab_name],
        num_nics=num_nics,
        nic_bytes_per_s=nic_bw,
        host_memory_bytes=e.get("host_memory", 0.0, parse_bytes),
        local_nvme_bytes=e.get("local_nvme", 0.0, parse_bytes),
        num_vcpus=int(e.get("vcpus", 0)),
        nodes_per_unit=e.get("nodes_per_unit", 1, _positive_int),
        notes=str(e.get("notes", "")),
        ebs_bytes_per_s=e.get("ebs_bandwidth", 0.0, parse_rate),
        ena_bytes_per_s=e.get("ena_bandwidth", 0.0, parse_rate),
        source=e.source(),
    )
    e.check_unknown()
    return inst


def _load_prices(instance: str, e: _Entry) -> tuple[Price, ...]:
    out = []
    for option, rows in e.data.items():
        if option in ("source", "notes"):
            continue
        if option not in PRICING_OPTIONS:
            raise e.err(str(option), f"unknown pricing option{suggest(str(option), PRICING_OPTIONS)}")
        if not isinstance(rows, list):
            rows = [rows]
        if not rows:
            raise e.err(str(option), "is empty (leave the option out when no sourced figure exists)")
        for i, row in enumerate(rows):
            r = _Entry(row, e.file, f"{e.where}.{option}[{i}]")
            out.append(Price(
                option=option,
                usd_per_hour=r.get("usd_per_hour", parse=_usd),
                date=r.get("date", parse=_date),
                region=str(r.get("region", "us-east-1")),
                note=str(r.get("note", "")),
                source=r.source(),
            ))
            r.check_unknown()
    return tuple(out)


def _load_storage(name: str, e: _Entry) -> StorageTier:
    usd = e.get("usd_per_gb_month", None, float)
    tier = StorageTier(
        name=name,
        kind=e.get("kind", parse=_choice(STORAGE_KINDS)),
        deployment=str(e.get("deployment", "")),
        media=str(e.get("media", "")),
        throughput_per_tib_bytes_per_s=e.get("throughput_per_tib", 0.0, parse_rate),
        burst_per_tib_bytes_per_s=e.get("burst_per_tib", 0.0, parse_rate),
        network_per_tib_bytes_per_s=e.get("network_per_tib", 0.0, parse_rate),
        disk_burst_per_tib_bytes_per_s=e.get("disk_burst_per_tib", 0.0, parse_rate),
        per_client_bytes_per_s=e.get("per_client", 0.0, parse_rate),
        per_client_efa_bytes_per_s=e.get("per_client_efa", 0.0, parse_rate),
        get_requests_per_s=e.get("get_requests_per_s", 0.0, float),
        put_requests_per_s=e.get("put_requests_per_s", 0.0, float),
        usd_per_gb_month=usd,
        price_date=e.get("price_date", "" if usd is None else dataclasses.MISSING, _date),
        notes=str(e.get("notes", "")),
        source=e.source(),
    )
    e.check_unknown()
    return tier


def _check_ultracluster(name: str, e: _Entry, instances: Mapping[str, Instance]) -> Mapping[str, Any]:
    """Validate one ``ultracluster:`` entry; return its data unchanged (kept in ``Catalog.extra``)."""
    e.get("rail_optimized", None, _bool)
    over = e.get("oversubscription", None, float)
    if over is not None and over < 1.0:
        raise e.err("oversubscription", f"{over} is below 1 (1.0 = non-blocking)")
    e.get("max_accelerators", None, _positive_int)
    e.get("network_levels", None, _positive_int)
    for i, inst in enumerate(e.get("instances", [])):
        if inst not in instances:
            raise e.err(f"instances[{i}]", f"unknown instance {inst!r}{suggest(str(inst), list(instances))}")
    e.get("notes", "")
    e.source()
    e.check_unknown()
    return e.data


def _sections(directory: Path) -> dict[str, list[tuple[Path, Mapping[str, Any]]]]:
    """All top-level sections of all YAML files in ``directory``, by section name."""
    out: dict[str, list[tuple[Path, Mapping[str, Any]]]] = {}
    for path in sorted(directory.glob("*.yaml")):
        data = _read_yaml(path) or {}
        if not isinstance(data, Mapping):
            raise ConfigError("expected a mapping of sections", file=str(path))
        for section, body in data.items():
            if not isinstance(body, Mapping):
                raise ConfigError("expected a mapping of named entries", file=str(path), field=str(section))
            out.setdefault(str(section), []).append((path, body))
    return out


def _entries(sections: Mapping[str, list[tuple[Path, Mapping[str, Any]]]], name: str):
    seen: dict[str, Path] = {}
    for path, body in sections.get(name, []):
        for key, value in body.items():
            if key in seen:
                raise ConfigError(f"duplicate entry (also in {seen[key]})", file=str(path),
                                  field=f"{name}.{key}")
            seen[key] = path
            yield str(key), _Entry(value, path, f"{name}.{key}")


@functools.lru_cache(maxsize=4)
def load_catalog(root: str | None = None) -> Catalog:
    """Load and validate both catalogs (cached; pass ``root`` to read another tree)."""
    base = Path(root) if root else data_root()
    hw = _sections(base / "hardware_catalog")
    accels = {n: _load_accelerator(n, e) for n, e in _entries(hw, "accelerators")}
    fabrics = {n: _load_fabric(n, e) for n, e in _entries(hw, "fabrics")}
    links = {n: _load_link(n, e) for n, e in _entries(hw, "links")}
    instances = {n: _load_instance(n, e, accels, fabrics, links) for n, e in _entries(hw, "instances")}
    prices: dict[str, tuple[Price, ...]] = {}
    for n, e in _entries(hw, "prices"):
        if n not in instances:
            raise ConfigError(f"price for unknown instance{suggest(n, list(instances))}",
                              file=str(e.file), field=e.where)
        if instances[n].is_reference:
            raise ConfigError("reference systems (provider: reference) carry no price",
                              file=str(e.file), field=e.where)
        prices[n] = _load_prices(n, e)
    storage = {n: _load_storage(n, e) for n, e in _entries(hw, "storage")}
    extra: dict[str, Any] = {"ultracluster": {n: _check_ultracluster(n, e, instances)
                                              for n, e in _entries(hw, "ultracluster")}}
    extra.update({k: {name: e.data for name, e in _entries(hw, k)} for k in hw
                  if k not in ("accelerators", "fabrics", "links", "instances", "prices", "storage",
                               "ultracluster")})

    from .model.architecture import model_from_mapping  # pure data; no import cycle at runtime

    mc = _sections(base / "model_catalog")
    models = {}
    for n, e in _entries(mc, "models"):
        models[n] = model_from_mapping(e.data, name=n, file=str(e.file), where=e.where, require_source=True)
    from .stacks import load_stacks  # the stack catalog reads its entries with this module's helpers

    stacks = load_stacks(base / "stack_catalog")
    return Catalog(accelerators=accels, fabrics=fabrics, instances=instances, prices=prices,
                   storage=storage, models=models, extra=extra, stacks=stacks)
