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
from .workload import WORKLOAD_KEYS, check_tokens_per_step
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
    global_batch: int | None = None,
    pricing: Any = None,
    catalog: Catalog | None = None,
    mapping: Mapping[str, Any] | None = None,
    **parallelism: Any,
) -> Scenario:
    """``sc`` with another plan, re-validated by the reader's own checks of what the change touches.

    Loading a file costs milliseconds (YAML, the model, every section); a plan search needs thousands
    of variants of one validated scenario. This re-runs only the ``parallelism:`` rules (always: they tie
    the model, the batch and the cluster together), the ``cluster:`` rules and the precision check when
    the cluster changes, the micro-batch and global-batch rules and the pricing rule when given -- the same functions
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
    global_batch:
        ``workload.global_batch`` (sequences per step; its rules: a count, and the tokens-per-step bound).
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
    return PlanVariants(sc, catalog=catalog, mapping=mapping).derive(
        instance=instance, nodes=nodes, cluster=cluster, micro_batch=micro_batch, global_batch=global_batch,
        pricing=pricing, **parallelism)


class PlanVariants:
    """Variants of one validated scenario, as :func:`with_plan` derives them, for many plans in a row.

    What does not change from one variant to the next is worked out once and kept: the scenario's
    mapping, the workload of each micro-batch and global batch (the reader's ``workload.micro_batch`` and
    ``workload.global_batch`` rules, run once per pair of values), and the precision check of each cluster it is given (its answer, or its error, kept with the
    cluster object). Each :meth:`derive` then runs the ``parallelism:`` rules in full -- they tie the
    model, the batch and the cluster together -- and the pricing rule when given, so a variant is
    accepted or refused as :func:`with_plan` accepts or refuses it, with the same message.
    """

    def __init__(self, sc: Scenario, *, catalog: Catalog | None = None,
                 mapping: Mapping[str, Any] | None = None):
        self.sc = sc
        self.catalog = catalog if catalog is not None else load_catalog()
        self.mapping = mapping if mapping is not None else scenario_to_mapping(sc, catalog=self.catalog)
        # the scenario's constructor arguments, for each variant (what dataclasses.replace would gather)
        self._fields = {f.name: getattr(sc, f.name) for f in dataclasses.fields(sc) if f.init}
        self._workloads: dict[tuple[int | None, int | None], tuple[Any, _Section]] = {}
        self._precision: dict[tuple[int | None, int], tuple[Cluster, ConfigError | None]] = {}

    def _workload(self, micro_batch: int | None, global_batch: int | None = None) -> tuple[Any, _Section]:
        """(workload, its section) with ``micro_batch`` and ``global_batch`` (``None``: the scenario's),
        checked once per pair of values, in the reader's order (the micro-batch, then the global batch)."""
        key = (micro_batch, global_batch)
        hit = self._workloads.get(key)
        if hit is None:
            sc, file = self.sc, self.sc.file
            wl_map = dict(self.mapping["workload"])
            workload = sc.workload
            changes: dict[str, int] = {}
            if micro_batch is not None:
                wl_map["micro_batch"] = micro_batch
                changes["micro_batch"] = _Section(wl_map, file, "workload", WORKLOAD_KEYS) \
                    .integer("micro_batch", counts=True)
            if global_batch is not None:
                wl_map["global_batch"] = global_batch
                wl_sec = _Section(wl_map, file, "workload", WORKLOAD_KEYS)
                changes["global_batch"] = wl_sec.integer(
                    "global_batch", counts=True, hint="sequences per optimizer step, or global_batch_tokens")
                check_tokens_per_step(wl_sec, workload.seq_len, changes["global_batch"])
            if changes:
                workload = dataclasses.replace(workload, **changes)
            hit = (workload, _Section(wl_map, file, "workload", WORKLOAD_KEYS))
            if len(self._workloads) < 256:      # bounded: a search tries a handful of batch sizes
                self._workloads[key] = hit
        return hit

    def _check_precision(self, micro_batch: int | None, workload: Any, wl_sec: _Section,
                         cluster: Cluster) -> None:
        key = (micro_batch, id(cluster))
        hit = self._precision.get(key)
        if hit is None or hit[0] is not cluster:
            try:
                _check_precision(workload, wl_sec, cluster)
                err = None
            except ConfigError as exc:
                err = exc
            if len(self._precision) >= 4096:
                self._precision.clear()
            hit = self._precision[key] = (cluster, err)
        if hit[1] is not None:
            raise hit[1].with_traceback(None)

    def derive(self, *, instance: str | None = None, nodes: int | None = None, cluster: Cluster | None = None,
               micro_batch: int | None = None, global_batch: int | None = None, pricing: Any = None,
               **parallelism: Any) -> Scenario:
        """The variant (arguments as :func:`with_plan`'s)."""
        sc = self.sc
        unknown = [k for k in parallelism if k not in PARALLELISM_KEYS]
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r}{suggest(unknown[0], PARALLELISM_KEYS)}",
                              file=sc.file, field="parallelism")
        file = sc.file
        workload, wl_sec = self._workload(micro_batch, global_batch)
        if cluster is None and (instance is not None or nodes is not None):
            cluster = plan_cluster(sc, instance=instance, nodes=nodes, catalog=self.catalog)
        if cluster is not None:
            self._check_precision(micro_batch, workload, wl_sec, cluster)
        else:
            cluster = sc.cluster
        par_map = dict(self.mapping["parallelism"])
        sized = any(k in parallelism for k in _SIZE_KEYS)
        if "dp" not in parallelism and (cluster is not sc.cluster or sized):
            par_map["dp"] = "auto"
        if "vpp" in parallelism:
            par_map.pop("schedule", None)
        if "recompute" in parallelism:
            par_map.pop("recompute_modules", None)
            par_map.pop("recompute_layers", None)
        par_map.update(parallelism)
        top = _Section({"parallelism": par_map}, file, "", TOP_KEYS)
        new_par = _parallelism(top, wl_sec, workload, cluster)
        new_pricing = sc.pricing if pricing is None else \
            _pricing(_Section({"pricing": pricing}, file, "", TOP_KEYS))
        return type(sc)(**{**self._fields, "workload": workload, "cluster": cluster, "parallelism": new_par,
                           "pricing": new_pricing})


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
