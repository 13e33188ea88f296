"""Variants of a validated scenario for plan search: :func:`with_plan` and :func:`plan_cluster` re-run
only the reader's rules the change touches, so a variant is accepted or refused exactly as the file
with those values would be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..catalog import Catalog, load_catalog, suggest
from ..errors import ConfigError
from .cluster import Cluster, _check_precision, _cluster
from .parallelism import PARALLELISM_KEYS, _parallelism
from .reader import _Section
from .run import _pricing
from .schema import TOP_KEYS
from .spec import Scenario
from .workload import WORKLOAD_KEYS
from .writer import scenario_to_mapping


#: parallelism keys whose change makes ``dp`` follow (``auto``) unless it is given too
_SIZE_KEYS = ("tp", "pp", "cp")


def with_plan(
    sc: Scenario,
    *,
    instance: str | None = None,
    nodes: int | None = None,
    cluster: Cluster | None = None,
    micro_batch: int | None = None,
    pricing: Any = None,
    catalog: Catalog | None = None,
    mapping: Mapping[str, Any] | None = None,
    **parallelism: Any,
) -> Scenario:
    """``sc`` with another plan, re-validated by the reader's own checks of what the change touches.

    Loading a file costs milliseconds (YAML, the model, every section); a plan search needs thousands
    of variants of one validated scenario. This re-runs only the ``parallelism:`` rules (always: they tie
    the model, the batch and the cluster together), the ``cluster:`` rules and the precision check when
    the cluster changes, the micro-batch rule and the pricing rule when given -- the same functions
    :func:`scenario_from_mapping` runs, so a variant is accepted or refused exactly as the file with
    those values would be, with the same message.

    Parameters
    ----------
    instance, nodes:
        The cluster (checked as :func:`plan_cluster` checks it).
    cluster:
        Or a cluster :func:`plan_cluster` built already (a search builds each one once).
    micro_batch:
        ``workload.micro_batch``.
    pricing:
        A pricing option name or ``{"usd_per_hour": N}``.
    mapping:
        ``scenario_to_mapping(sc)``, when the caller holds it already (it is not changed).
    **parallelism:
        ``parallelism:`` keys as in the file (``tp=4, pp=2, zero=3, recompute="full"``). A change of
        tp, pp, cp or the cluster makes ``dp`` auto unless ``dp`` is given; a change of ``vpp`` lets
        ``schedule`` follow it, and of ``recompute`` drops ``recompute_modules``/``recompute_layers``,
        unless they are given.

    Raises
    ------
    ConfigError, ParallelismError
        As loading the changed file would.
    """
    unknown = [k for k in parallelism if k not in PARALLELISM_KEYS]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}{suggest(unknown[0], PARALLELISM_KEYS)}",
                          file=sc.file, field="parallelism")
    cat = catalog if catalog is not None else load_catalog()
    file = sc.file
    if mapping is None:
        mapping = scenario_to_mapping(sc, catalog=cat)
    wl_map = dict(mapping["workload"])
    workload = sc.workload
    if micro_batch is not None:
        wl_map["micro_batch"] = micro_batch
        workload = dataclasses.replace(workload, micro_batch=_Section(wl_map, file, "workload", WORKLOAD_KEYS)
                                       .integer("micro_batch", counts=True))
    wl_sec = _Section(wl_map, file, "workload", WORKLOAD_KEYS)
    if cluster is None and (instance is not None or nodes is not None):
        cluster = plan_cluster(sc, instance=instance, nodes=nodes, catalog=cat)
    if cluster is not None:
        _check_precision(workload, wl_sec, cluster)
    else:
        cluster = sc.cluster
    par_map = dict(mapping["parallelism"])
    if "dp" not in parallelism and (cluster is not sc.cluster or any(k in parallelism for k in _SIZE_KEYS)):
        par_map["dp"] = "auto"
    if "vpp" in parallelism:
        par_map.pop("schedule", None)
    if "recompute" in parallelism:
        par_map.pop("recompute_modules", None)
        par_map.pop("recompute_layers", None)
    par_map.update(parallelism)
    top = _Section({"parallelism": par_map}, file, "", TOP_KEYS)
    new_par = _parallelism(top, wl_sec, workload, cluster)
    new_pricing = sc.pricing if pricing is None else _pricing(_Section({"pricing": pricing}, file, "", TOP_KEYS))
    return dataclasses.replace(sc, workload=workload, cluster=cluster, parallelism=new_par, pricing=new_pricing)


def plan_cluster(sc: Scenario, *, instance: str | None = None, nodes: int | None = None,
                 catalog: Catalog | None = None) -> Cluster:
    """``sc``'s cluster with another instance and/or node count, checked by the reader's ``cluster:`` rules.

    Another instance drops the ``cluster.network`` overrides (they describe the old one); placement,
    storage, stragglers and rank unit are kept. The workload's precision is checked by :func:`with_plan`.
    """
    cat = catalog if catalog is not None else load_catalog()
    cl_map = scenario_to_mapping(sc, catalog=cat)["cluster"]
    if instance is not None and instance != cl_map["instance"]:
        cl_map.pop("network", None)
        cl_map["instance"] = instance
    if nodes is not None:
        cl_map["nodes"] = nodes
    return _cluster(_Section({"cluster": cl_map}, sc.file, "", TOP_KEYS), cat)
