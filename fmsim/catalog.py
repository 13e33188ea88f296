"""The hardware and model catalogs: YAML data in, frozen specs out.

Owns reading ``hardware_catalog/*.yaml`` and ``model_catalog/*.yaml`` (found in a checkout or,
after ``pip install .``, inside the package as ``fmsim/data/``), converting every quantity to SI
once, and refusing entries without a ``source:`` or prices without a date. The schema of each
file is documented in ``hardware_catalog/README.md``.
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
    source: str
    calibration: str = ""

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """One price of one instance type under one purchase option, with its date."""

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

    @property
    def scale_out_bytes_per_s(self) -> float:
        """Scale-out line rate of one node, per direction."""
        return self.num_nics * self.nic_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageTier:
    """A storage offering: FSx for Lustre deployment type or S3 class."""

    name: str
    kind: str                              # fsx-lustre | s3
    throughput_per_tib_bytes_per_s: float  # baseline, per TiB of capacity (0 for S3)
    burst_per_tib_bytes_per_s: float
    per_client_bytes_per_s: float          # limit of one client (ENA), or instance-to-S3
    per_client_efa_bytes_per_s: float      # with EFA / GPUDirect Storage, if supported (else 0)
    usd_per_gb_month: float | None
    price_date: str
    source: str
    notes: str = ""


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

    def storage_tier(self, name: str) -> StorageTier:
        return self._get("storage tier", self.storage, name)

    def price(self, instance: str, option: str = "on-demand") -> Price | None:
        """Newest price of ``instance`` under ``option``; ``None`` if the catalog has none."""
        if option not in PRICING_OPTIONS:
            raise ConfigError(f"unknown pricing option {option!r}{suggest(option, PRICING_OPTIONS)}")
        rows = [p for p in self.prices.get(instance, ()) if p.option == option]
        if not rows:
            return None
        return max(rows, key=lambda p: p.date)


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

    def sub(self, key: str, default: Any = dataclasses.MISSING) -> "_Entry":
        value = self.get(key, default)
        return _Entry(value, self.file, f"{self.where}.{key}")

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


def _load_accelerator(name: str, e: _Entry) -> Accelerator:
    peaks_e = e.sub("peak")
    peaks = {p: peaks_e.get(p, None, parse_flop_rate) for p in PRECISIONS}
    peaks = {p: v for p, v in peaks.items() if v}
    eff_e = e.sub("efficiency")
    gemm_raw = eff_e.get("gemm")
    if isinstance(gemm_raw, Mapping) and "value" not in gemm_raw:
        gemm = {}
        for k, v in gemm_raw.items():
            if k in ("source", "note"):
                continue
            try:
                gemm[k] = _fraction(v)
            except (TypeError, ValueError) as exc:
                raise eff_e.err(f"gemm.{k}", str(exc)) from None
    else:
        gemm = {"bf16": eff_e.get("gemm", parse=_fraction)}
    return Accelerator(
        name=name,
        vendor=str(e.get("vendor", "")),
        peak_flop_per_s=peaks,
        hbm_bytes=e.get("hbm", parse=parse_bytes),
        hbm_bytes_per_s=e.get("hbm_bandwidth", parse=parse_rate),
        scale_up_bytes_per_s=e.get("scale_up_bandwidth", 0.0, parse_rate),
        gemm_efficiency=gemm,
        hbm_efficiency=eff_e.get("hbm", parse=_fraction),
        source=e.source(),
        calibration=str(eff_e.get("source", "")),
    )


def _load_fabric(name: str, e: _Entry) -> Fabric:
    return Fabric(
        name=name,
        kind=str(e.get("kind")),
        nic_bytes_per_s=e.get("nic_bandwidth", parse=parse_rate),
        latency_s=e.get("latency", parse=parse_time),
        efficiency=e.get("efficiency", parse=_fraction),
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
    su = e.sub("scale_up")
    net = e.sub("network")
    fab_name = net.get("fabric")
    if fab_name not in fabrics:
        raise net.err("fabric", f"unknown fabric {fab_name!r}{suggest(str(fab_name), list(fabrics))}")
    n_acc = int(e.get("accelerators"))
    link_name = su.get("link")
    if link_name not in links:
        raise su.err("link", f"unknown link {link_name!r}{suggest(str(link_name), list(links))}")
    link = links[link_name]
    bw = su.get("bandwidth", link["bytes_per_s"] or accels[acc_name].scale_up_bytes_per_s, parse_rate)
    if not bw:
        raise su.err("bandwidth", "is required (per device, per direction) when the link has none")
    scale_up = ScaleUp(
        kind=str(su.get("kind")),
        domain_size=int(su.get("domain", n_acc)),
        bytes_per_s=bw,
        latency_s=su.get("latency", link["latency_s"], parse_time),
        topology=str(su.get("topology", "crossbar")),
        in_switch_reduction=bool(su.get("in_switch_reduction", link["in_switch_reduction"])),
        efficiency=su.get("efficiency", link["efficiency"], _fraction),
        source=str(su.get("source", link["source"])),
    )
    return Instance(
        name=name,
        provider=str(e.get("provider", "aws")),
        accelerator=accels[acc_name],
        num_accelerators=n_acc,
        scale_up=scale_up,
        fabric=fabrics[fab_name],
        num_nics=int(net.get("nics")),
        nic_bytes_per_s=net.get("nic_bandwidth", fabrics[fab_name].nic_bytes_per_s, parse_rate),
        host_memory_bytes=e.get("host_memory", 0.0, parse_bytes),
        local_nvme_bytes=e.get("local_nvme", 0.0, parse_bytes),
        num_vcpus=int(e.get("vcpus", 0)),
        nodes_per_unit=int(e.get("nodes_per_unit", 1)),
        notes=str(e.get("notes", "")),
        source=e.source(),
    )


def _load_prices(instance: str, e: _Entry) -> tuple[Price, ...]:
    out = []
    for option, rows in e.data.items():
        if option in ("source", "notes"):
            continue
        if option not in PRICING_OPTIONS:
            raise e.err(str(option), f"unknown pricing option{suggest(str(option), PRICING_OPTIONS)}")
        if not isinstance(rows, list):
            rows = [rows]
        for i, row in enumerate(rows):
            r = _Entry(row, e.file, f"{e.where}.{option}[{i}]")
            out.append(Price(
                option=option,
                usd_per_hour=float(r.get("usd_per_hour")),
                date=r.get("date", parse=_date),
                region=str(r.get("region", "us-east-1")),
                note=str(r.get("note", "")),
                source=r.source(),
            ))
    return tuple(out)


def _load_storage(name: str, e: _Entry) -> StorageTier:
    return StorageTier(
        name=name,
        kind=str(e.get("kind")),
        throughput_per_tib_bytes_per_s=e.get("throughput_per_tib", 0.0, parse_rate),
        burst_per_tib_bytes_per_s=e.get("burst_per_tib", 0.0, parse_rate),
        per_client_bytes_per_s=e.get("per_client", 0.0, parse_rate),
        per_client_efa_bytes_per_s=e.get("per_client_efa", 0.0, parse_rate),
        usd_per_gb_month=e.get("usd_per_gb_month", None, float),
        price_date=e.get("price_date", "", _date),
        notes=str(e.get("notes", "")),
        source=e.source(),
    )


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
                raise ConfigError(f"duplicate entry (also in {seen[key]})", file=str(path), field=f"{name}.{key}")
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
        prices[n] = _load_prices(n, e)
    storage = {n: _load_storage(n, e) for n, e in _entries(hw, "storage")}
    extra = {k: {name: e.data for name, e in _entries(hw, k)} for k in hw
             if k not in ("accelerators", "fabrics", "links", "instances", "prices", "storage")}

    from .model.architecture import model_from_mapping  # pure data; no import cycle at runtime

    mc = _sections(base / "model_catalog")
    models = {}
    for n, e in _entries(mc, "models"):
        models[n] = model_from_mapping(e.data, name=n, file=str(e.file), where=e.where, require_source=True)
    return Catalog(accelerators=accels, fabrics=fabrics, instances=instances, prices=prices,
                   storage=storage, models=models, extra=extra)
