"""What the hardware catalog sells and observes beside the chips: ``prices:`` (``prices.yaml``),
``storage:`` (``storage.yaml``), ``ultracluster:`` (``instances.yaml``) and ``failure_rates:``
(``failure_rates.yaml``).

As in :mod:`fmsim.catalog.hardware`, each kind's keys are declared here (``*_KEYS``) and read just below
with the scenario reader's typed getters (type, unit and default at the call). ``ultracluster`` and
``failure_rates`` entries are checked here and kept as written, in :attr:`Catalog.extra`, for
:meth:`Catalog.ultracluster_for` and :func:`fmsim.workloads.reliability.fleet_rates`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..fields import _what, suggest
from ..units import parse_rate
from .files import _Entry
from .specs import PRICING_OPTIONS, Instance, Price, StorageTier

STORAGE_KINDS = ("fsx-lustre", "s3", "s3-express", "mountpoint-s3")
STORAGE_MEDIA = ("ssd", "hdd")
#: what a fleet's component rate is counted per (fmsim.workloads.reliability scales it by that count)
FAILURE_UNITS = ("gpu", "node", "nic")
#: which interruptions a fleet's rates count: every unexpected one whatever its cause, or only those the
#: study attributes to hardware (a validation row compares like with like: docs/storage.md)
FAILURE_COUNTS = ("all", "hardware")

PRICE_KEYS = (*PRICING_OPTIONS, "notes", "source")          # an instance's prices, by purchase option
PRICE_ROW_KEYS = ("usd_per_hour", "date", "region", "note", "source")
STORAGE_KEYS = ("kind", "deployment", "media", "throughput_per_tib", "network_per_tib", "burst_per_tib",
                "disk_burst_per_tib", "per_client", "per_client_efa", "get_requests_per_s",
                "put_requests_per_s", "usd_per_gb_month", "price_date", "notes", "source")
ULTRACLUSTER_KEYS = ("instances", "oversubscription", "rail_optimized", "max_accelerators", "network_levels",
                     "notes", "source")
FAILURE_RATE_KEYS = ("accelerator", "period_days", "gpus", "nodes", "counts", "components", "notes", "source")
COMPONENT_KEYS = ("per", "rate")


def load_prices(instance: str, e: _Entry, instances: Mapping[str, Instance]) -> tuple[Price, ...]:
    if instance not in instances:
        raise ConfigError(f"price for unknown instance{suggest(instance, list(instances))}", file=e.file,
                          field=e.where)
    if instances[instance].is_reference:
        raise ConfigError("reference systems (provider: reference) carry no price", file=e.file,
                          field=e.where)
    e.notes()
    if e.has("source"):
        e.source()
    if not any(k in PRICING_OPTIONS for k in e.data):
        raise ConfigError(f"has no pricing option (expected one or more of {', '.join(PRICING_OPTIONS)})",
                          file=e.file, field=e.where)
    out = []
    for option in (k for k in e.data if k in PRICING_OPTIONS):   # in the file's order
        rows = e.raw(option, None)
        if rows is None or rows == []:
            raise e.err(option, "is empty (leave the option out when no sourced figure exists)")
        for i, row in enumerate(rows if isinstance(rows, list) else [rows]):
            r = _Entry(row, e.file, f"{e.where}.{option}[{i}]", PRICE_ROW_KEYS,
                       what="a mapping of price fields")
            out.append(Price(
                option=option,
                usd_per_hour=r.number("usd_per_hour"),
                date=r.date("date"),
                region=r.text("region", "us-east-1", nonempty=True),
                note=r.notes("note"),
                source=r.source(),
            ))
    return tuple(out)


def load_storage(name: str, e: _Entry) -> StorageTier:
    def rate(key: str) -> float:
        return e.quantity(key, parse_rate, 0.0, expected="e.g. '250 MB/s'")

    usd = e.number("usd_per_gb_month", None)
    return StorageTier(
        name=name,
        kind=e.choice("kind", STORAGE_KINDS),
        deployment=e.text("deployment", ""),
        media=e.choice("media", STORAGE_MEDIA, ""),
        throughput_per_tib_bytes_per_s=rate("throughput_per_tib"),
        burst_per_tib_bytes_per_s=rate("burst_per_tib"),
        network_per_tib_bytes_per_s=rate("network_per_tib"),
        disk_burst_per_tib_bytes_per_s=rate("disk_burst_per_tib"),
        per_client_bytes_per_s=rate("per_client"),
        per_client_efa_bytes_per_s=rate("per_client_efa"),
        get_requests_per_s=e.number("get_requests_per_s", 0.0),
        put_requests_per_s=e.number("put_requests_per_s", 0.0),
        usd_per_gb_month=usd,
        price_date=e.date("price_date") if usd is not None else e.date("price_date", ""),
        notes=e.notes(),
        source=e.source(),
    )


def check_ultracluster(name: str, e: _Entry, instances: Mapping[str, Instance]) -> Mapping[str, Any]:
    """Validate one ``ultracluster:`` entry; return its data as written (kept in ``Catalog.extra``)."""
    e.boolean("rail_optimized", None)
    e.number("oversubscription", None, minimum=1.0, inclusive=True)   # 1.0 = non-blocking
    e.integer("max_accelerators", None, minimum=1)
    e.integer("network_levels", None, minimum=1)
    members = e.raw("instances", [])
    if not isinstance(members, list):
        raise e.err("instances", f"got {_what(members)} (expected a list of instance names)")
    for i, inst in enumerate(members):
        if not isinstance(inst, str) or inst not in instances:
            raise e.err(f"instances[{i}]", f"unknown instance {inst!r}{suggest(str(inst), list(instances))}")
    e.notes()
    e.source()
    return e.data


def check_failure_rates(name: str, e: _Entry) -> Mapping[str, Any]:
    """Validate one ``failure_rates:`` fleet; return its data as written (kept in ``Catalog.extra``)."""
    e.text("accelerator", "")
    e.number("period_days")
    e.integer("gpus", None, minimum=1)
    e.integer("nodes", None, minimum=1)
    e.choice("counts", FAILURE_COUNTS, "all")
    shape = "component: {per: gpu | node | nic, rate: interruptions per unit per day}"
    comps = e.raw("components", hint=shape)
    if not isinstance(comps, Mapping) or not comps:
        raise e.err("components", f"got {_what(comps)} (expected a mapping {shape})")
    for comp, spec in comps.items():
        c = _Entry(spec, e.file, e.path(f"components.{comp}"), COMPONENT_KEYS,
                   what="a mapping {per: gpu | node | nic, rate: interruptions per unit per day}")
        c.choice("per", FAILURE_UNITS)
        c.number("rate", minimum=0.0, inclusive=True)
    e.notes()
    e.source()
    return e.data
