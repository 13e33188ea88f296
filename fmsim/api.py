"""The facade (DESIGN.md "Python API", glue layer): a scenario in, the workload's simulator run, a :class:`Result` out (the Python API).

``simulate`` runs the discrete-event engine; ``estimate`` the analytical fast path over the same
cost functions. Kinds whose simulator is not built yet raise :class:`NotBuiltError`.
"""
from __future__ import annotations

from .errors import NotBuiltError
from .results import Result


def simulate(sc, *, trace_path: str | None = None) -> Result:
    """Discrete-event simulation of ``sc`` (a :class:`fmsim.scenario.Scenario`)."""
    kind = sc.workload.kind
    if kind in ("pretrain", "finetune"):
        from .workloads.pretrain import simulate_pretrain
        return simulate_pretrain(sc, trace_path=trace_path)
    if kind == "inference":
        from .workloads.inference import simulate_inference
        return simulate_inference(sc, estimate=False, trace_path=trace_path)
    raise NotBuiltError(f"{sc.file or sc.name}: workload.kind: the {kind!r} simulator is not built yet "
                        "(built: pretrain, finetune, inference)")


def estimate(sc) -> Result:
    """Analytical estimate of ``sc``: same cost functions, no event queue."""
    kind = sc.workload.kind
    if kind in ("pretrain", "finetune"):
        from .workloads.pretrain import estimate_pretrain
        return estimate_pretrain(sc)
    if kind == "inference":
        from .workloads.inference import simulate_inference
        return simulate_inference(sc, estimate=True)
    raise NotBuiltError(f"{sc.file or sc.name}: workload.kind: the {kind!r} simulator is not built yet "
                        "(built: pretrain, finetune, inference)")


def search(sc, **options):
    """Plan search over ``sc``: the cheapest or fastest plan across plans, instance types and pricing.

    Training kinds (pretrain, finetune): :func:`fmsim.search.search_training` -- its keyword arguments
    (``instances``, ``nodes``, ``pricing``, ``deadline_s``, ``budget_usd``, ``top``, ``jobs``, ``dask``,
    ``cache_dir``, ``axes``) and its :class:`fmsim.search.SearchResult`. Inference:
    :func:`fmsim.search.serving.plan_capacity` (``qps``, ``instances``, ``pricing``, ``estimate``,
    ``confirm``) and its ``CapacityPlan``. See docs/search.md.
    """
    from .search import search_scenario

    return search_scenario(sc, **options)
