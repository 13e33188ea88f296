"""Plan search: the fastest or cheapest way to train a model across plans, instance types and prices.

The search layer (DESIGN.md "Layers": faces -> api -> search -> workloads): it enumerates plans
(:mod:`.space`), derives each from one validated scenario and refuses what the scenario reader would
refuse (:mod:`.evaluate`, through :func:`fmsim.scenario.with_plan`), costs the rest with
:func:`fmsim.estimate`, ranks them (:mod:`.rank`), keeps results on disk (:mod:`.cache`) and runs here,
in local processes or on Dask (:mod:`.executors`). :func:`search_training` (:mod:`.driver`) ties them
together; ``fmsim.search`` is the facade. docs/search.md is the user's guide.
"""
from __future__ import annotations

import sys

from .driver import SearchResult, search_training
from .space import AXES, SearchSpace, default_space

__all__ = ["AXES", "SearchResult", "SearchSpace", "default_space", "search", "search_scenario",
           "search_training"]


def search_scenario(sc, **options):
    """The search of ``sc``'s kind: :func:`search_training` (pretrain, finetune) or
    :func:`fmsim.search.serving.plan_capacity` (inference, ``qps=...``)."""
    if sc.workload.kind == "inference":
        from .serving import plan_capacity

        return plan_capacity(sc, **options)
    return search_training(sc, **options)


def search(sc, **options):
    """Search plans of scenario ``sc``: ``fmsim.search(sc, instances=..., nodes=..., deadline_s=...)``.

    Training kinds: :func:`search_training` (its keyword arguments; docs/search.md), a
    :class:`SearchResult`; inference: ``plan_capacity`` (``qps=...``), a ``CapacityPlan``.
    """
    from .. import api

    return api.search(sc, **options)


class _CallableModule(type(sys.modules[__name__])):
    """``fmsim.search`` is both this package and the facade's function: once the package is imported,
    the name ``fmsim.search`` is the package, so the package itself answers a call."""

    def __call__(self, sc, **options):
        return search(sc, **options)


sys.modules[__name__].__class__ = _CallableModule
