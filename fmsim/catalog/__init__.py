"""The hardware, model and stack catalogs: YAML data in, frozen specs out.

Owns reading ``hardware_catalog/*.yaml``, ``model_catalog/*.yaml`` and ``stack_catalog/*.yaml`` (found in a
checkout or, after ``pip install .``, inside the package as ``fmsim/data/``), converting every quantity to
SI once, and refusing entries without a ``source:`` or prices without a date. Catalog files are read by
the same reader as scenarios: the strict YAML loader (:mod:`fmsim.yaml_safe`: size, depth, aliases,
duplicate keys, NUL bytes) and the scenario sections' validating getters (:mod:`fmsim.fields`), so a
bad entry is the one line ``hardware_catalog/instances.yaml: instances.p5.48xlarge.accelerators: ...``
(exit 2 from the CLI) and an unknown key or section gets a "did you mean". The file formats are in
docs/catalogs.md.

Modules: :mod:`.specs` (the frozen specs and :class:`Catalog`), :mod:`.files` (a folder's files,
sections and entries), :mod:`.hardware` (accelerators, fabrics, links, instances) and :mod:`.offers`
(prices, storage, UltraClusters, failure rates) -- each kind's keys declared beside its reader. Models
are read by :func:`fmsim.model.architecture.model_from_mapping`, stacks by :mod:`fmsim.stacks`.

Conventions the loader enforces or documents:

* scale-up and network bandwidths are per device (per NIC), **per direction**;
* a price is USD per hour of **one node** (one instance of the entry), also for UltraServers, whose
  unit price is ``nodes_per_unit`` times that; reference systems (``provider: reference``) have none;
* an instance's scale-up bandwidth is, in order: its own ``scale_up.bandwidth``, else the
  accelerator's ``scale_up_bandwidth``, else the link's ``bandwidth``.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ..fields import suggest
from .files import entries, read_folder
from .hardware import (
    ACCELERATOR_KEYS,
    FABRIC_KEYS,
    INSTANCE_KEYS,
    LINK_KEYS,
    PROVIDERS,
    SCALE_UP_KINDS,
    TOPOLOGIES,
    load_accelerator,
    load_fabric,
    load_instance,
    load_link,
)
from .offers import (
    FAILURE_RATE_KEYS,
    PRICE_KEYS,
    STORAGE_KEYS,
    STORAGE_KINDS,
    ULTRACLUSTER_KEYS,
    check_failure_rates,
    check_ultracluster,
    load_prices,
    load_storage,
)
from .specs import (
    PRECISIONS,
    PRICING_OPTIONS,
    Accelerator,
    Catalog,
    Fabric,
    Instance,
    Price,
    ScaleUp,
    StorageTier,
    per_core,
    with_in_network_reduction,
)

__all__ = [
    "PRECISIONS", "PRICING_OPTIONS", "PROVIDERS", "SCALE_UP_KINDS", "STORAGE_KINDS", "TOPOLOGIES",
    "Accelerator", "Catalog", "Fabric", "Instance", "Price", "ScaleUp", "StorageTier",
    "data_root", "load_catalog", "per_core", "suggest", "with_in_network_reduction",
]


def data_root() -> Path:
    """Directory holding ``hardware_catalog/``, ``model_catalog/`` and ``scenarios/``.

    A checkout (the package's parent directory has ``hardware_catalog/``) wins over the copy a
    wheel carries in ``fmsim/data/``, so that editing the YAML in a checkout takes effect at once.
    """
    pkg = Path(__file__).resolve().parent.parent
    if (pkg.parent / "hardware_catalog").is_dir():
        return pkg.parent
    return pkg / "data"


def _models(directory: Path) -> dict[str, Any]:
    from ..model.architecture import MODEL_KEYS, model_from_mapping  # pure data; no import cycle at runtime

    out = {}
    for n, e in entries(read_folder(directory), "models", (*MODEL_KEYS,), "model"):
        e.source()   # text (or a list of texts), not empty: the catalog's rule; the architecture checks the rest
        out[n] = model_from_mapping(e.data, name=n, file=e.file, where=e.where, require_source=True)
    return out


@functools.lru_cache(maxsize=4)
def load_catalog(root: str | None = None) -> Catalog:
    """Load and validate the three catalogs (cached; pass ``root`` to read another tree)."""
    base = Path(root) if root else data_root()
    hw = read_folder(base / "hardware_catalog")
    accels = {n: load_accelerator(n, e)
              for n, e in entries(hw, "accelerators", ACCELERATOR_KEYS, "accelerator")}
    fabrics = {n: load_fabric(n, e) for n, e in entries(hw, "fabrics", FABRIC_KEYS, "fabric")}
    links = {n: load_link(n, e) for n, e in entries(hw, "links", LINK_KEYS, "link")}
    instances = {n: load_instance(n, e, accels, fabrics, links)
                 for n, e in entries(hw, "instances", INSTANCE_KEYS, "instance")}
    prices = {n: load_prices(n, e, instances) for n, e in entries(hw, "prices", PRICE_KEYS, "price")}
    storage = {n: load_storage(n, e) for n, e in entries(hw, "storage", STORAGE_KEYS, "storage tier")}
    extra: dict[str, Any] = {
        "ultracluster": {n: check_ultracluster(n, e, instances)
                         for n, e in entries(hw, "ultracluster", ULTRACLUSTER_KEYS, "UltraCluster")},
        "failure_rates": {n: check_failure_rates(n, e)
                          for n, e in entries(hw, "failure_rates", FAILURE_RATE_KEYS, "failure-rate fleet")},
    }
    models = _models(base / "model_catalog")
    from ..stacks import load_stacks  # the stack catalog reads its entries with this package's helpers

    stacks = load_stacks(base / "stack_catalog")
    return Catalog(accelerators=accels, fabrics=fabrics, instances=instances, prices=prices,
                   storage=storage, models=models, extra=extra, stacks=stacks)
