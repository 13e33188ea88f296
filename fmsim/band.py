"""A band on a prediction: what the settings a file leaves unstated could make of it (faces' helper).

A scenario fixes some software settings itself and inherits others from its stack (``stack:``,
:mod:`fmsim.stacks`); the rest are fmsim's global defaults, which the run it describes may not have used.
:func:`band` varies each of those unstated settings, one at a time, over the values the stack catalog's
profiles give it (the set real stacks use, :func:`fmsim.stacks.stack_values`, plus the global default),
then runs the two combinations that the one-at-a-time runs say are fastest and slowest. The band is the
lowest and highest value of each metric over all those runs and the point itself, so it always holds the
point; the setting whose values alone move the headline metric most is named. Stating a setting (in the
file or through a stack) removes it from the variations, so the band narrows.

Every run goes through the analytical estimate (:func:`fmsim.estimate`), so a band costs a few dozen
estimates -- on demand (``fmsim run --band``, ``fmsim validate --band``), never inside sweeps or search. A
variant the reader refuses (fp8 gather on a bf16 run, in-network reduction on EFA) is skipped.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import FmsimError
from .stacks import SETTABLE, lookup, stack_values

__all__ = ["BAND_COLUMNS", "Band", "band", "band_columns"]

#: settings no stack profile states but real runs differ in, with the values they take: in-network
#: reduction (NVIDIA SHARP) is a fabric fact that MLPerf's and NeMo's SHARP runs switch on
#: (docs/design-notes.md)
EXTRA_VALUES: Mapping[str, tuple[Any, ...]] = {"cluster.network.in_network_reduction": (False, True)}
#: the metric a band is chosen by (its extremes pick the combined runs) and reported on, per stack kind
HEADLINE = {"training": "step_time_s", "serving": "output_tokens_per_s"}
#: the result columns a band fills (appended to the CSV contract, fmsim.results): metric -> (low, high)
BAND_COLUMNS: Mapping[str, Mapping[str, tuple[str, str]]] = {
    "training": {"step_time_s": ("step_time_low_s", "step_time_high_s")},
    "serving": {"output_tokens_per_s": ("output_tokens_per_s_low", "output_tokens_per_s_high")},
}
_LABELS = {"cluster.network.in_network_reduction": "in-network reduction"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """Low and high of each metric over the unstated settings' variations, around the point estimate."""

    point: Mapping[str, float]
    low: Mapping[str, float]
    high: Mapping[str, float]
    headline: str
    varied: tuple[str, ...]                     # setting paths the band varied (unstated ones)
    most: str = ""                              # the setting that alone moves the headline most
    swings: Mapping[str, tuple[float, float]] = field(default_factory=dict)   # path -> (low, high) alone
    runs: int = 0

    def relative(self, metric: str | None = None) -> tuple[float, float]:
        """(low, high) of ``metric`` as fractions of the point (1.0 = the point)."""
        m = metric or self.headline
        p = self.point.get(m)
        if not p:
            return 1.0, 1.0
        return self.low[m] / p, self.high[m] / p

    def label(self, path: str | None = None) -> str:
        path = path if path is not None else self.most
        return _LABELS.get(path, path.split(".")[-1].replace("_", " "))


def _kind(sc: Any) -> str:
    return "serving" if sc.workload.kind == "inference" else "training"


def _set(mapping: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = mapping
    for p in parents:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            node[p] = nxt
        node = nxt
    node[leaf] = list(value) if isinstance(value, tuple) else value


def candidates(sc: Any, catalog: Any) -> dict[str, tuple[Any, ...]]:
    """Unstated settings of ``sc`` and the values the band tries for each (its current one excluded)."""
    from .scenario import scenario_to_mapping

    kind = _kind(sc)
    current = scenario_to_mapping(sc, catalog=catalog)
    paths = {p: stack_values(catalog.stacks, p) for p, k in SETTABLE.items() if k == kind}
    if kind == "training":
        paths.update(EXTRA_VALUES)
    out: dict[str, tuple[Any, ...]] = {}
    for path, values in paths.items():
        if path in sc.stated:
            continue
        now = lookup(current, path)
        now = list(now) if isinstance(now, tuple) else now
        tried = tuple(v for v in values if (list(v) if isinstance(v, tuple) else v) != now)
        if tried:
            out[path] = tried
    return out


def _metrics(res: Any) -> dict[str, float]:
    return {k: float(v) for k, v in res.to_dict().items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def band(sc: Any, *, catalog: Any = None) -> Band:
    """The band of ``sc``'s prediction over its unstated settings (analytical estimates)."""
    from . import estimate
    from .catalog import load_catalog
    from .scenario import scenario_from_mapping, scenario_to_mapping

    cat = catalog if catalog is not None else load_catalog()
    kind = _kind(sc)
    headline = HEADLINE[kind]
    point = _metrics(estimate(sc))
    base = scenario_to_mapping(sc, catalog=cat)
    file = sc.file or "<scenario>"

    def run(changes: Mapping[str, Any]) -> dict[str, float] | None:
        data = copy.deepcopy(base)
        for path, value in changes.items():
            _set(data, path, value)
        try:
            return _metrics(estimate(scenario_from_mapping(data, file=file, catalog=cat)))
        except FmsimError:
            return None        # a combination the reader or a workload refuses: not a run anyone made

    seen: list[dict[str, float]] = [point]
    swings: dict[str, tuple[float, float]] = {}
    best: dict[str, tuple[float, Any]] = {}
    worst: dict[str, tuple[float, Any]] = {}
    p0 = point.get(headline, 0.0)
    lower_is_faster = kind == "training"         # step time: lower is faster; throughput: higher is
    for path, values in candidates(sc, cat).items():
        lo = hi = p0
        for value in values:
            got = run({path: value})
            if got is None or headline not in got:
                continue
            seen.append(got)
            v = got[headline]
            lo, hi = min(lo, v), max(hi, v)
            fast = v < p0 if lower_is_faster else v > p0
            slow = v > p0 if lower_is_faster else v < p0
            if fast and (path not in best or abs(v - p0) > abs(best[path][0] - p0)):
                best[path] = (v, value)
            if slow and (path not in worst or abs(v - p0) > abs(worst[path][0] - p0)):
                worst[path] = (v, value)
        swings[path] = (lo, hi)
    for extreme in (best, worst):
        if len(extreme) > 1:
            got = run({p: val for p, (_, val) in extreme.items()})
            if got is not None:
                seen.append(got)
    low = {m: min(r[m] for r in seen if m in r) for m in point}
    high = {m: max(r[m] for r in seen if m in r) for m in point}
    moved = {p: hi - lo for p, (lo, hi) in swings.items() if hi > lo}
    most = max(moved, key=lambda p: moved[p]) if moved else ""
    return Band(point=point, low=low, high=high, headline=headline, varied=tuple(swings), most=most,
                swings=swings, runs=len(seen))


def band_columns(kind: str, b: Band | None, point: Mapping[str, Any]) -> dict[str, Any]:
    """The CSV band columns of a row: the band's relative width applied to the row's own point (a
    simulated row keeps its point; the estimate's band scales with it), empty without a band."""
    stack_kind = "serving" if kind == "inference" else "training"
    out: dict[str, Any] = {}
    for metric, (lo_col, hi_col) in BAND_COLUMNS.get(stack_kind, {}).items():
        value = point.get(metric)
        if b is None or not isinstance(value, (int, float)) or metric not in b.point:
            out[lo_col] = out[hi_col] = None
            continue
        lo, hi = b.relative(metric)
        out[lo_col], out[hi_col] = value * lo, value * hi
    return out
