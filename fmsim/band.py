"""A band on a prediction: what the settings a file leaves unstated could make of it (faces' helper).

A scenario fixes some software settings itself and inherits others from its stack (``stack:``,
:mod:`fmsim.stacks`); the rest are fmsim's global defaults, which the run it describes may not have used.
:func:`band` varies each of those unstated settings, one at a time, over the values the stack catalog's
profiles give it (the set real stacks use, :func:`fmsim.stacks.stack_values`, plus the global default),
then runs the two combinations that the one-at-a-time runs say are fastest and slowest. The band is the
lowest and highest value of each metric over all those runs and the point itself, so it always holds the
point; the setting whose values alone move the headline metric most is named. Stating a setting (in the
file or through a stack) removes it from the variations, so the band narrows. A field the file's source
leaves open (``configuration: {partial: ..., unknown: {path: [values]}}``) is varied over exactly the values
the file lists, in place of the catalog's.

Every run goes through the analytical estimate (:func:`fmsim.estimate`), so a band costs a few dozen
estimates -- on demand (``fmsim run --band``, ``fmsim validate --band``), never inside sweeps or search. A
variant the reader refuses (fp8 gather on a bf16 run, in-network reduction on EFA) is skipped.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import band_sources
from .errors import FmsimError
from .stacks import SETTABLE, lookup, stack_defaults, stack_values

__all__ = ["BAND_COLUMNS", "METRIC_ALIASES", "Band", "band", "band_columns", "components", "inherited",
           "release_candidates", "unknown_candidates"]

#: settings no stack profile states but real runs differ in, with the values they take: in-network
#: reduction (NVIDIA SHARP) is a fabric fact that MLPerf's and NeMo's SHARP runs switch on
#: (docs/design-notes.md)
EXTRA_VALUES: Mapping[str, tuple[Any, ...]] = {
    "cluster.network.in_network_reduction": (False, True),
    # values real runs use that no profile states as its default: torch.compile (torchtitan's llama3_405b.toml
    # @29624e37 sets compile enable=true) and CUDA graphs (Megatron-Bridge's performance configs @7af9601c:
    # llama3 cuda_graph_scope "full_iteration", DeepSeek/GPT-OSS per-module "attn"/"moe_router" scopes)
    "workload.kernel_fusion": ("compiled", "eager", "eager-composite-norm"),
    "workload.cuda_graphs": ("layer", "step"),
}
#: the metric a band is chosen by (its extremes pick the combined runs) and reported on, per stack kind
HEADLINE = {"training": "step_time_s", "serving": "output_tokens_per_s"}
#: the result columns a band fills (appended to the CSV contract, fmsim.results): metric -> (low, high)
BAND_COLUMNS: Mapping[str, Mapping[str, tuple[str, str]]] = {
    "training": {"step_time_s": ("step_time_low_s", "step_time_high_s")},
    "serving": {"output_tokens_per_s": ("output_tokens_per_s_low", "output_tokens_per_s_high")},
}
#: a metric only the simulation reports, and the estimate's metric whose relative band it takes (a whole
#: run's output rate over its requests, and the steady-state output rate the estimate computes)
METRIC_ALIASES: Mapping[str, str] = {"run_output_tokens_per_s": "output_tokens_per_s"}
_LABELS = {"cluster.network.in_network_reduction": "in-network reduction",
           **{sp.key: sp.label for sp in band_sources.SPREADS}}
#: suffix of a component that varies a setting the file inherits from its stack over its other releases
RELEASES = "@releases"
#: suffix of a component that varies a field the file's source leaves open over the values the file lists for
#: it (``configuration.unknown``)
UNKNOWN = "@unknown"
#: a variant value meaning "the path left out": the global default
DEFAULT = object()


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
    refused: tuple[str, ...] = ()               # components one of whose values the reader refused (skipped)
    names: Mapping[str, str] = field(default_factory=dict)   # a section's unknown -> the fields it varies

    def relative(self, metric: str | None = None) -> tuple[float, float]:
        """(low, high) of ``metric`` as fractions of the point (1.0 = the point)."""
        m = metric or self.headline
        p = self.point.get(m)
        if not p:
            return 1.0, 1.0
        return self.low[m] / p, self.high[m] / p

    def label(self, path: str | None = None) -> str:
        path = path if path is not None else self.most
        if path.endswith(UNKNOWN):
            return self.names.get(path, path.removesuffix(UNKNOWN))
        path = path.removesuffix(RELEASES)
        leaf = path.split(".")[-1].replace("_", " ")
        return _LABELS.get(path, f"{leaf} overlap" if ".overlap." in path else leaf)

    def reason(self) -> str:
        """What moves the band most, as a phrase: ``attention kernel unstated``, ``grad bucket as the
        stack's other releases ship it``, ``chip speed (mamf-finder spread)``."""
        if not self.most:
            return "nothing it varies moves it"
        if self.most.endswith(UNKNOWN):
            return f"{self.label()} unknown (per the file's source)"
        if self.most.endswith(RELEASES):
            return f"{self.label()} as the stack's other releases ship it"
        if self.most.startswith("hardware."):
            return self.label()
        return f"{self.label()} unstated"


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


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def release_candidates(sc: Any, catalog: Any) -> dict[str, tuple[Any, ...]]:
    """Settings ``sc`` inherits from its stack, each with the values its framework's other releases ship
    for the file's precision (:data:`DEFAULT` where a release states none: the global default applies).

    A setting counts as inherited where the file resolves to the stack's value (a file that repeats its
    stack's value gets the same band as one that leaves it out); a file's own departure is not varied."""
    from .scenario import scenario_to_mapping

    profile = catalog.stacks.get(sc.stack) if sc.stack else None
    if profile is None:
        return {}
    precision = sc.workload.precision
    siblings = [stack_defaults(p, precision) for n, p in catalog.stacks.items()
                if n != profile.name and p.family == profile.family and p.kind == profile.kind]
    out: dict[str, tuple[Any, ...]] = {}
    for path, value in inherited(sc, catalog, scenario_to_mapping(sc, catalog=catalog)).items():
        tried: list[Any] = []
        for d in siblings:
            v = lookup(d, path)
            v = DEFAULT if v is None else _norm(v)
            if (v is DEFAULT or v != _norm(value)) and v not in tried:
                tried.append(v)
        if tried:
            out[path] = tuple(tried)
    return out


def inherited(sc: Any, catalog: Any, current: Mapping[str, Any]) -> dict[str, Any]:
    """The settings ``sc`` takes from its stack (path -> the stack's value for its precision): those where
    the file resolves to the stack's value (``current``: its written-out mapping); a departure is the
    file's own."""
    profile = catalog.stacks.get(sc.stack) if sc.stack else None
    if profile is None:
        return {}
    mine = stack_defaults(profile, sc.workload.precision)
    out: dict[str, Any] = {}
    for path in SETTABLE:
        value = lookup(mine, path)
        now = lookup(current, path)
        if value is not None and (now is None or _norm(now) == _norm(value)):
            out[path] = value
    return out


def _restack(data: dict[str, Any], sc: Any, catalog: Any, from_stack: Mapping[str, Any],
             precision: Any) -> None:
    """``data`` (``sc`` written out) with the stack's settings for another ``precision``, as the reader would
    resolve the file with that precision: an inherited setting takes the stack's value for it (the global
    default where the stack has none), and one the file leaves to the global default takes the stack's where
    it has one for that precision only (fp8-only settings drop out of a bf16 variant)."""
    profile = catalog.stacks.get(sc.stack) if sc.stack else None
    if profile is None:
        return
    theirs = stack_defaults(profile, precision)
    for path in SETTABLE:
        value = lookup(theirs, path)
        if path in from_stack or (path not in sc.stated and value is not None):
            if value is None:
                _drop(data, path)
            else:
                _set(data, path, value)


def _metrics(res: Any) -> dict[str, float]:
    return {k: float(v) for k, v in res.to_dict().items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _drop(mapping: dict[str, Any], path: str) -> None:
    *parents, leaf = path.split(".")
    node: Any = mapping
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def unknown_candidates(sc: Any, catalog: Any) -> dict[str, tuple[Any, ...]]:
    """The fields ``sc``'s source leaves open (``configuration.unknown``), each with the values the file lists
    for it other than the one it resolves to (all of them where the file leaves the field to a default the
    mapping does not show, such as an engine's)."""
    from .scenario import scenario_to_mapping, unknown_changes

    if not sc.configuration_unknown:
        return {}
    current = scenario_to_mapping(sc, catalog=catalog)
    out: dict[str, tuple[Any, ...]] = {}
    for path, values in sc.configuration_unknown.items():
        tried = tuple(v for v in values if any(_norm(lookup(current, p)) != _norm(x)
                                               for p, x in unknown_changes(path, v).items()))
        if tried:
            out[path] = tried
    return out


def components(sc: Any, catalog: Any) -> dict[str, tuple[Any, ...]]:
    """Every component the band varies, with the values (or factors) it tries: the settings ``sc`` leaves
    unstated (by path), those it inherits from its stack (``path@releases``), the fields its source leaves
    open over the values the file lists (``path@unknown``: these replace the first two for their path) and
    the hardware figures' sourced spreads (``hardware.*``, :mod:`fmsim.band_sources`)."""
    listed = sc.configuration_unknown
    out: dict[str, tuple[Any, ...]] = {p: v for p, v in candidates(sc, catalog).items() if p not in listed}
    out.update({p + RELEASES: v for p, v in release_candidates(sc, catalog).items() if p not in listed})
    out.update({p + UNKNOWN: v for p, v in unknown_candidates(sc, catalog).items()})
    out.update(band_sources.applicable(sc.cluster.instance))
    return out


def band(sc: Any, *, catalog: Any = None) -> Band:
    """The band of ``sc``'s prediction over its unstated settings, the settings its stack's other releases
    ship and its hardware figures' sourced spreads (analytical estimates)."""
    from . import estimate
    from .catalog import load_catalog
    from .scenario import scenario_from_mapping, scenario_to_mapping, unknown_changes

    cat = catalog if catalog is not None else load_catalog()
    kind = _kind(sc)
    headline = HEADLINE[kind]
    point = _metrics(estimate(sc))
    # every value resolved and written out: without its stack the mapping resolves to the same scenario,
    # and a setting left out of it falls to the global default
    base = scenario_to_mapping(sc, catalog=cat)
    base.pop("stack", None)
    base.pop("configuration", None)      # its unknowns are the band's components, not re-checked per variant
    file = sc.file or "<scenario>"
    from_stack = inherited(sc, cat, base)

    def run(changes: Mapping[str, Any]) -> dict[str, float] | None:
        data = copy.deepcopy(base)
        unknown: dict[str, Any] = {}
        for key, value in changes.items():
            if key.endswith(UNKNOWN):
                unknown.update(unknown_changes(key.removesuffix(UNKNOWN), value))
        if "workload.precision" in unknown:
            _restack(data, sc, cat, from_stack, unknown["workload.precision"])
        for path, value in unknown.items():
            _set(data, path, value)
        hw: dict[str, float] = {}
        for key, value in changes.items():
            if key.startswith("hardware."):
                hw[key] = value
            elif key.endswith(UNKNOWN):
                continue
            elif value is DEFAULT:
                _drop(data, key.removesuffix(RELEASES))
            else:
                _set(data, key.removesuffix(RELEASES), value)
        try:
            variant = sc if data == base else scenario_from_mapping(data, file=file, catalog=cat)
            return _metrics(estimate(band_sources.perturb(variant, hw)))
        except FmsimError:
            return None        # a combination the reader or a workload refuses: not a run anyone made

    seen: list[dict[str, float]] = [point]
    refused: list[str] = []
    swings: dict[str, tuple[float, float]] = {}
    best: dict[str, tuple[float, Any]] = {}
    worst: dict[str, tuple[float, Any]] = {}
    p0 = point.get(headline, 0.0)
    lower_is_faster = kind == "training"         # step time: lower is faster; throughput: higher is
    parts = components(sc, cat)
    sections = [k.removesuffix(UNKNOWN) for k in parts if k.endswith(UNKNOWN) and "." not in k]
    names = {s + UNKNOWN: " and ".join(dict.fromkeys(p for v in parts[s + UNKNOWN]
                                                     for p in unknown_changes(s, v))) for s in sections}
    for key, values in parts.items():
        lo = hi = p0
        for value in values:
            got = run({key: value})
            if got is None or headline not in got:
                refused.append(key)
                continue
            seen.append(got)
            v = got[headline]
            lo, hi = min(lo, v), max(hi, v)
            fast = v < p0 if lower_is_faster else v > p0
            slow = v > p0 if lower_is_faster else v < p0
            if fast and (key not in best or abs(v - p0) > abs(best[key][0] - p0)):
                best[key] = (v, value)
            if slow and (key not in worst or abs(v - p0) > abs(worst[key][0] - p0)):
                worst[key] = (v, value)
        swings[key] = (lo, hi)
    for extreme in (best, worst):
        combos = [{k: val for k, (_, val) in extreme.items()}]
        # and without the file's unknowns, so that listing them never narrows the band (a value that alone
        # slows a run by little can speed up the combination: fp16's cheaper gradient reduction)
        combos.append({k: v for k, v in combos[0].items() if not k.endswith(UNKNOWN)})
        for combo in combos if len(combos[1]) < len(combos[0]) else combos[:1]:
            if len(combo) > 1:
                got = run(combo)
                if got is not None:
                    seen.append(got)
    low = {m: min(r[m] for r in seen if m in r) for m in point}
    high = {m: max(r[m] for r in seen if m in r) for m in point}
    moved = {p: hi - lo for p, (lo, hi) in swings.items() if hi > lo}
    most = max(moved, key=lambda p: moved[p]) if moved else ""
    return Band(point=point, low=low, high=high, headline=headline, varied=tuple(swings), most=most,
                swings=swings, runs=len(seen), refused=tuple(dict.fromkeys(refused)), names=names)


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
