"""The facade (DESIGN.md "Python API", glue layer): a scenario in, the workload's simulator run, a :class:`Result` out (the Python API).

``simulate`` runs the discrete-event engine; ``estimate`` the analytical fast path over the same
cost functions. One registry, :data:`WORKLOADS`, maps each ``workload.kind`` to its simulator (a
new workload plugs in with :func:`register`); kinds without one raise :class:`NotBuiltError`.
The workload modules are imported when first used, so that ``import fmsim`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import NotBuiltError
from .results import Result


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload kind's entry points. ``check`` validates the sections the kind reads itself (kept
    raw by the scenario reader) without running, for ``fmsim lint``; None when loading checks all."""

    simulate: Callable[..., Result]  # (scenario, *, trace_path) -> Result
    estimate: Callable[[Any], Result]  # (scenario) -> Result
    check: Callable[[Any], None] | None = None
    #: (scenario) -> Result with the same row and bottleneck and only the details a search record keeps
    #: (None: the kind has no lean result, and ``estimate(sc, lean=True)`` gives the whole one)
    estimate_lean: Callable[[Any], Result] | None = None


WORKLOADS: dict[str, Workload] = {}


def register(kind: str, workload: Workload) -> None:
    """Add ``kind``'s simulator; a kind is registered once."""
    if kind in WORKLOADS:
        raise ValueError(f"workload kind {kind!r} is already registered")
    WORKLOADS[kind] = workload


def _pretrain_simulate(sc, *, trace_path=None):
    from .workloads.pretrain import simulate_pretrain

    return simulate_pretrain(sc, trace_path=trace_path)


def _pretrain_estimate(sc):
    from .workloads.pretrain import estimate_pretrain

    return estimate_pretrain(sc)


def _pretrain_estimate_lean(sc):
    from .workloads.pretrain import estimate_pretrain

    return estimate_pretrain(sc, lean=True)


def _inference_simulate(sc, *, trace_path=None):
    from .workloads.inference import simulate_inference

    return simulate_inference(sc, estimate=False, trace_path=trace_path)


def _inference_estimate(sc):
    from .workloads.inference import simulate_inference

    return simulate_inference(sc, estimate=True)


def _inference_check(sc):
    from .workloads.inference_spec import parse_inference_spec

    parse_inference_spec(sc.extra, file=sc.file)


def _rl_simulate(sc, *, trace_path=None):
    from .workloads.rl import simulate_rl

    return simulate_rl(sc, trace_path=trace_path)


def _rl_estimate(sc):
    from .workloads.rl import estimate_rl

    return estimate_rl(sc)


def _rl_check(sc):
    from .workloads.rl import check_rl_sections

    check_rl_sections(sc)


register("pretrain", Workload(_pretrain_simulate, _pretrain_estimate, estimate_lean=_pretrain_estimate_lean))
register("finetune", Workload(_pretrain_simulate, _pretrain_estimate, estimate_lean=_pretrain_estimate_lean))
register("inference", Workload(_inference_simulate, _inference_estimate, _inference_check))
register("rl", Workload(_rl_simulate, _rl_estimate, _rl_check))


def _workload(sc) -> Workload:
    kind = sc.workload.kind
    w = WORKLOADS.get(kind)
    if w is None:
        raise NotBuiltError(
            f"{sc.file or sc.name}: workload.kind: the {kind!r} simulator is not built yet "
            f"(built: {', '.join(WORKLOADS)})"
        )
    return w


def simulate(sc, *, trace_path: str | None = None) -> Result:
    """Discrete-event simulation of ``sc`` (a :class:`fmsim.scenario.Scenario`)."""
    return _workload(sc).simulate(sc, trace_path=trace_path)


def estimate(sc, *, lean: bool = False) -> Result:
    """Analytical estimate of ``sc``: same cost functions, no event queue. ``lean``: the same row and
    bottleneck without the per-stage details (what a plan search keeps of each candidate), where the kind
    has such a result."""
    w = _workload(sc)
    return (w.estimate_lean if lean and w.estimate_lean is not None else w.estimate)(sc)


def check_sections(sc) -> None:
    """Validate the sections ``sc``'s kind reads itself (``fmsim lint``); raises ConfigError."""
    check = _workload(sc).check
    if check is not None:
        check(sc)


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
