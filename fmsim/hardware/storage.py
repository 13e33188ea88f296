"""Storage as a resource: an Amazon FSx for Lustre file system or an Amazon S3 bucket seen by a cluster.

Owns turning a scenario's ``cluster.storage`` (a catalog tier from ``hardware_catalog/storage.yaml``,
a capacity, optional overrides) into a :class:`FileSystem` -- its aggregate throughput, what one
client node can move, whether its traffic rides the EFA NICs the training collectives use -- and
the time, request count and price of moving bytes through it:

* **FSx for Lustre**: file-system throughput = capacity (TiB) x the tier's per-TiB baseline (the
  ``PerUnitStorageThroughput`` rule, AWS FSx docs, catalog S23); Intelligent-Tiering provisions
  throughput per file system (``cluster.storage.throughput``). One client: with EFA + GPUDirect
  Storage (PERSISTENT_2 created with ``EfaEnabled``) up to the tier's ``per_client_efa`` (1,200 Gbps)
  and at most the node's EFA line rate, *sharing those NICs with the collectives*; without EFA the
  Lustre client speaks TCP over the node's ENA interface (the instance's ``ena_bandwidth``, else one
  NIC's line rate: ASSUMED, AWS publishes no per-client figure without EFA, aws_catalog.md 4a).
  Metadata: user-provisioned metadata IOPS (1,500 ... 192,000, FSx API
  FileSystemLustreMetadataConfiguration, STO-013), 12,000 unless the scenario says.
* **S3** (Standard, Express One Zone, Mountpoint): no aggregate bandwidth limit of its own; each node
  moves at most its S3 client rate (the tier's ``per_client``, else the ENA interface), and requests
  of one part each (16 MiB, the ranged-GET size AWS recommends, STO-020) are bounded by
  ``prefixes`` x the per-prefix request rate (3,500 PUT / 5,500 GET per second, STO-018/019).

Bytes moving at once through one file system share it max-min fairly (the engine's
:func:`fmsim.engine.network.max_min_rates`, as flows share links): :meth:`FileSystem.transfer_s`
gives each client the lesser of its own limit and its fair share of the file system.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog, Instance, StorageTier, load_catalog
from ..engine.network import max_min_rates
from ..errors import ConfigError

TIB = 2.0 ** 40
GB = 1e9
#: one S3 request moves one part: the 8-16 MB ranged GET / multipart size AWS recommends (STO-020)
S3_PART_BYTES = 16 * 2.0 ** 20
#: FSx metadata IOPS when the scenario gives none: 12,000, the top of the user-provisioned SSD steps below
#: the multiples of 12,000 (FSx API FileSystemLustreMetadataConfiguration, STO-013; AUTOMATIC mode's table
#: was not retrieved)
DEFAULT_METADATA_IOPS = 12_000.0
#: S3 Standard request prices, us-east-1: Requests-Tier1 (PUT, COPY, POST, LIST) 0.005 USD per 1,000,
#: Requests-Tier2 (GET and the rest) 0.004 USD per 10,000 (AWS price list
#: pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonS3, region file 20260928230416, us-east-1)
S3_PUT_USD = 0.005 / 1000
S3_GET_USD = 0.0004 / 1000
S3_REQUEST_PRICE_DATE = "2026-09-28"
#: S3 Express One Zone request prices from 2025-04-10 (catalog S26): PUT 0.00113, GET 0.00003 USD per 1,000
S3_EXPRESS_PUT_USD = 0.00113 / 1000
S3_EXPRESS_GET_USD = 0.00003 / 1000
HOURS_PER_MONTH = 730.0  # AWS bills GB-months over 730 hours


@dataclass(frozen=True, slots=True, kw_only=True)
class FileSystem:
    """One file system or bucket as a cluster sees it (bytes/s, SI)."""

    kind: str                          # fsx-lustre | s3 | s3-express | mountpoint-s3
    tier: StorageTier | None
    capacity_bytes: float              # provisioned (FSx) or 0 (S3: billed on what is stored)
    read_bytes_per_s: float            # aggregate baseline (inf: S3, no aggregate limit)
    write_bytes_per_s: float
    client_bytes_per_s: float          # one node's limit
    efa: bool                          # traffic rides the EFA NICs (shared with the collectives)
    metadata_iops: float               # FSx metadata operations per second (inf for S3)
    get_requests_per_s: float          # aggregate over prefixes (inf for FSx)
    put_requests_per_s: float
    usd_per_gb_month: float | None
    price_date: str
    source: str
    notes: tuple[str, ...] = ()

    @property
    def is_s3(self) -> bool:
        return self.kind != "fsx-lustre"

    def aggregate_bytes_per_s(self, clients: int, *, write: bool) -> float:
        """What ``clients`` nodes moving at once get in all: each its own limit or its max-min fair
        share of the file system, whichever is less (the flows share the file system as flows share
        a link), and the request rate of S3 parts."""
        fs = self.write_bytes_per_s if write else self.read_bytes_per_s
        n = max(1, int(clients))
        if math.isfinite(fs):
            # n identical flows, each over its own client link and the one file-system link
            flows = {i: (("client", i), "fs") for i in range(min(n, 64))}
            caps = {("client", i): self.client_bytes_per_s for i in range(min(n, 64))}
            caps["fs"] = fs * min(n, 64) / n          # the same fair share per flow as n flows would get
            rate = sum(max_min_rates(flows, caps).values()) * n / min(n, 64)
        else:
            rate = n * self.client_bytes_per_s
        reqs = self.put_requests_per_s if write else self.get_requests_per_s
        if math.isfinite(reqs):
            rate = min(rate, reqs * S3_PART_BYTES)
        return rate

    def transfer_s(self, total_bytes: float, clients: int, *, write: bool) -> float:
        """Seconds for ``clients`` nodes to move ``total_bytes`` between them (evenly spread)."""
        if total_bytes <= 0:
            return 0.0
        return total_bytes / self.aggregate_bytes_per_s(clients, write=write)

    def requests(self, total_bytes: float, files: float = 1.0) -> float:
        """S3 requests for ``total_bytes`` in ``files`` objects (one per part, at least one per file)."""
        return max(float(files), math.ceil(total_bytes / S3_PART_BYTES)) if total_bytes > 0 else 0.0

    def usd(self, *, seconds: float, stored_bytes: float = 0.0, puts: float = 0.0,
            gets: float = 0.0) -> float | None:
        """Price of keeping the file system ``seconds`` (FSx: its provisioned capacity; S3: ``stored_bytes``)
        plus S3 requests. None when the catalog has no price for the tier."""
        if self.usd_per_gb_month is None:
            return None
        months = seconds / 3600.0 / HOURS_PER_MONTH
        held = stored_bytes if self.is_s3 else self.capacity_bytes
        usd = held / GB * self.usd_per_gb_month * months
        if self.is_s3:
            express = self.kind == "s3-express"
            usd += puts * (S3_EXPRESS_PUT_USD if express else S3_PUT_USD)
            usd += gets * (S3_EXPRESS_GET_USD if express else S3_GET_USD)
        return usd


def _client_limit(tier: StorageTier | None, instance: Instance, efa: bool) -> float:
    """One node's limit to the file system: EFA (bounded by the node's EFA line rate) or its ENA."""
    ena = instance.ena_bytes_per_s or instance.nic_bytes_per_s   # ASSUMED: one NIC's rate without a figure
    if efa and tier is not None and tier.per_client_efa_bytes_per_s:
        return min(tier.per_client_efa_bytes_per_s, instance.scale_out_bytes_per_s)
    if tier is not None and tier.per_client_bytes_per_s:
        return min(tier.per_client_bytes_per_s, ena)
    return ena


def file_system(storage: Mapping[str, Any] | None, instance: Instance, *,
                catalog: Catalog | None = None) -> FileSystem | None:
    """The :class:`FileSystem` a scenario's ``cluster.storage`` describes, or None without one."""
    if not storage:
        return None
    cat = catalog if catalog is not None else load_catalog()
    tier = cat.storage_tier(storage["tier"]) if storage.get("tier") else None
    kind = tier.kind if tier is not None else str(storage.get("kind", "fsx-lustre"))
    notes: list[str] = []
    capacity = float(storage.get("capacity") or 0.0)
    if kind == "fsx-lustre":
        per_tib = storage.get("throughput_per_tib") or (tier.throughput_per_tib_bytes_per_s if tier else 0.0)
        total = storage.get("throughput")
        if total:
            read = write = float(total)
        elif per_tib and capacity:
            read = write = per_tib * capacity / TIB
        else:
            read = write = math.inf
            notes.append("file-system throughput unknown (no tier with a per-TiB rate, capacity or "
                         "throughput)")
        explicit = total or storage.get("throughput_per_tib")
        if tier is not None and tier.deployment == "scratch-2" and not explicit:
            write = read / 2.0                    # scratch-2 disks: 200 MB/s/TiB read, 100 write (S22)
        supports_efa = bool(tier is not None and tier.per_client_efa_bytes_per_s)
        efa = bool(storage.get("efa", supports_efa))
        if efa and not supports_efa:
            raise ConfigError("cluster.storage.efa: true needs an FSx PERSISTENT_2 tier (EFA is set at "
                              "creation on PERSISTENT_2 only, catalog S24)")
        meta = float(storage.get("metadata_iops") or DEFAULT_METADATA_IOPS)
        gets = puts = math.inf
    else:
        read = write = math.inf
        efa = False
        meta = math.inf
        prefixes = float(storage.get("prefixes") or 1)
        gets = (tier.get_requests_per_s if tier and tier.get_requests_per_s else 5500.0) * prefixes
        puts = (tier.put_requests_per_s if tier and tier.put_requests_per_s else 3500.0) * prefixes
        if kind == "s3-express":
            gets, puts = gets / prefixes, puts / prefixes     # limits are per directory bucket, not prefix
    client = _client_limit(tier, instance, efa)
    return FileSystem(kind=kind, tier=tier, capacity_bytes=capacity, read_bytes_per_s=read,
                      write_bytes_per_s=write, client_bytes_per_s=client, efa=efa, metadata_iops=meta,
                      get_requests_per_s=gets, put_requests_per_s=puts,
                      usd_per_gb_month=tier.usd_per_gb_month if tier else None,
                      price_date=tier.price_date if tier else "", source=tier.source if tier else "scenario",
                      notes=tuple(notes))


__all__ = ["FileSystem", "S3_PART_BYTES", "file_system"]
