"""Serving capacity search: the cheapest fleet that meets a scenario's SLOs at a request rate.

Owns :func:`plan_capacity` (``fmsim plan-capacity``). For each instance type it tries every model-parallel
layout that fits -- tensor-parallel degrees up to one node (and, with data-parallel attention on an MoE
model, the expert-parallel width of an engine), in the scenario's precision or the nearest one the chip
has -- not only the smallest: the smallest TP whose weights fit is often the most expensive fleet, since
its decode steps are the slowest and an SLO on time per output token caps its batch (issue 29: a p4de
fleet sized at 60 nodes at TP 2 where 12 nodes at TP 8 meet the SLO).

The unit searched is the node, the unit billed: a fleet of ``n`` nodes runs every replica that fits on
them (``n * accelerators // GPUs per replica``). Per layout the analytical estimate finds the smallest
``n`` that meets the SLOs (doubling, then bisection); the layouts are ranked by that, and the best
``confirm`` of each instance type are re-sized with the discrete-event simulation (Poisson arrivals at
``qps``), from the estimate's answer up until the SLOs hold and down while they still do. The answer per
instance type is the smallest simulated fleet; prices follow for each pricing option. ``estimate=True``
stops at the estimate.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, FmsimError, InfeasibleError

TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 72)
PRECISION_FALLBACK = {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "bf16": ("bf16",),
                      "fp16": ("fp16", "bf16"), "fp32": ("fp32",)}


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPoint:
    """One evaluated fleet: layout, size, price and whether the SLOs held."""

    instance: str
    precision: str
    tp: int
    pp: int
    replicas: int
    nodes: int
    gpus: int
    usd_per_hour: float | None          # the fleet, under the first pricing option
    slo_met: bool
    method: str                         # estimate | simulation
    metrics: dict[str, Any]
    ep: int = 1
    prices: dict[str, float | None] = field(default_factory=dict)   # pricing option -> fleet $/h


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityPlan:
    qps: float
    points: tuple[FleetPoint, ...]
    best_per_instance: dict[str, FleetPoint | None]
    skipped: dict[str, str]
    pricing: tuple[str, ...] = ("on-demand",)

    @property
    def cheapest(self) -> FleetPoint | None:
        best = self.cheapest_option
        return best[0] if best else None

    @property
    def cheapest_option(self) -> tuple[FleetPoint, str] | None:
        """(fleet, pricing option) of the lowest $/h over instance types and pricing options."""
        cands = [(p.prices.get(o), p.gpus, p.instance, o, p) for p in self.best_per_instance.values()
                 if p is not None for o in self.pricing]
        if not cands:
            return None
        _, _, _, opt, p = min(cands, key=lambda c: (c[0] if c[0] is not None else math.inf, c[1], c[2], c[3]))
        return p, opt


@dataclass(frozen=True, slots=True)
class Layout:
    precision: str
    tp: int
    pp: int
    ep: int


def _fits_kv(sc: Any, instance: Any, spec: Any, layout: Layout) -> bool:
    """Whether the weights leave a KV cache worth a batch (16 mean requests) on an engine of ``layout``."""
    from ..model.serving_cost import build_cost_model, engine_profile, kv_dtype_for
    from ..workloads.inference import _mean_lengths

    profile = engine_profile(spec.serving.engine)
    isl, osl = _mean_lengths(spec)
    model = sc.workload.model
    try:
        cost = build_cost_model(model, instance, precision=layout.precision,
                                kv_dtype=kv_dtype_for(layout.precision, spec.serving.kv_cache_dtype, profile),
                                tp=layout.tp, pp=layout.pp, ep=layout.ep,
                                attention_dp=spec.serving.attention_dp, collective=None)
        frac = spec.serving.memory_fraction or profile.memory_fraction
        cap = cost.kv_capacity_tokens(hbm_bytes=instance.accelerator.hbm_bytes, memory_fraction=frac,
                                      fraction_of=profile.memory_fraction_of,
                                      activation_bytes=cost.activation_bytes(8192, 256, model))
    except FmsimError:
        return False
    return cap // layout.pp >= 16 * (isl + osl)


def layouts(sc: Any, instance: Any, spec: Any) -> list[Layout]:
    """The layouts tried on ``instance`` (see the module docstring), smallest engine first."""
    model = sc.workload.model
    own = instance.name == sc.cluster.instance.name
    par = sc.parallelism
    precs = [sc.workload.precision] if own else \
        [p for p in PRECISION_FALLBACK.get(sc.workload.precision, (sc.workload.precision,))
         if p in instance.accelerator.peak_flop_per_s][:1]
    if not precs:
        return []
    pp = par.pp if own else 1
    per_node = instance.num_accelerators
    dp_attention = spec.serving.attention_dp and model.moe is not None
    eps = [e for e in TP_CANDIDATES if e <= per_node] if dp_attention else [1]
    out = []
    for tp in TP_CANDIDATES:
        if tp * pp > per_node and not (own and tp == par.tp):
            continue
        if model.heads % tp:
            continue
        for ep in eps:
            if dp_attention and tp * ep * pp > per_node:
                continue
            lay = Layout(precs[0], tp, pp, ep)
            if _fits_kv(sc, instance, spec, lay):
                out.append(lay)
    if own:
        mine = Layout(sc.workload.precision, par.tp, par.pp, par.ep if dp_attention else 1)
        if mine not in out and _fits_kv(sc, instance, spec, mine):
            out.insert(0, mine)
    return out


def _gpus_per_replica(sc: Any, spec: Any, lay: Layout) -> int:
    dp_attention = spec.serving.attention_dp and sc.workload.model.moe is not None
    return lay.tp * lay.pp * (lay.ep if dp_attention else 1)


def _verifier_gpus(spec: Any) -> int:
    v = spec.ttc.verifier
    return v.tp * v.replicas if v is not None else 0


def plan_capacity(sc: Any, qps: float, instances: Sequence[str] | None = None, *, estimate: bool = False,
                  max_replicas: int = 512, pricing: Sequence[str] | None = None,
                  confirm: int = 2, on_point: Callable[[FleetPoint], None] | None = None) -> CapacityPlan:
    """The cheapest fleet per instance type meeting ``sc``'s SLOs at ``qps`` (see the module docstring);
    ``on_point`` is called with each fleet as it is evaluated (the CLI's progress bar)."""
    from ..catalog import PRICING_OPTIONS, load_catalog, suggest
    from ..workloads.inference import build_plan, simulate_plan, with_rate
    from ..workloads.inference_spec import parse_inference_spec

    if not (isinstance(qps, (int, float)) and math.isfinite(qps) and qps > 0):
        raise ConfigError(f"--qps {qps:g} must be > 0")
    if max_replicas < 1:
        raise ConfigError(f"--max-replicas {max_replicas} must be >= 1")
    spec = parse_inference_spec(sc.extra, file=sc.file)
    if not spec.slo.limits_s:
        raise ConfigError("plan-capacity needs latency targets: add an slo: section "
                          "(e.g. slo: {ttft_p99: 2 s, tpot_p99: 100 ms})", file=sc.file, field="slo")
    if spec.serving.disaggregation is not None:
        raise ConfigError("plan-capacity sizes replicas of plain serving; size disaggregated pools by hand",
                          file=sc.file, field="serving.disaggregation")
    cat = load_catalog()
    options = tuple(pricing) if pricing else ((sc.pricing.option,) if sc.pricing.option else ("explicit",))
    for o in options:
        if o not in PRICING_OPTIONS and not (o == "explicit" and sc.pricing.option is None):
            raise ConfigError(f"--pricing: unknown option {o!r}{suggest(o, PRICING_OPTIONS)}")
    names = list(dict.fromkeys(instances)) if instances else [sc.cluster.instance.name]
    points: list[FleetPoint] = []
    best: dict[str, FleetPoint | None] = {}
    skipped: dict[str, str] = {}
    vgpus = _verifier_gpus(spec)

    def prices_of(inst: Any, nodes: int) -> dict[str, float | None]:
        out = {}
        for o in options:
            if o == "explicit":
                out[o] = sc.pricing.usd_per_hour * nodes
            else:
                p = cat.price(inst.name, o)
                out[o] = p.usd_per_hour * nodes if p is not None else None
        return out

    for name in names:
        inst = cat.instance(name)
        unit = inst.nodes_per_unit if inst.provider == "aws" else 1
        lays = layouts(sc, inst, spec)
        if not lays:
            skipped[name] = (f"{sc.workload.model.name} does not fit one {name} node in "
                             f"{'/'.join(PRECISION_FALLBACK.get(sc.workload.precision, ()))}")
            best[name] = None
            continue
        cache: dict[tuple[Layout, int, str], FleetPoint] = {}

        def point(lay: Layout, n: int, method: str, inst=inst, cache=cache) -> FleetPoint:
            key = (lay, n, method)
            if key not in cache:
                per = _gpus_per_replica(sc, spec, lay)
                replicas = min(max_replicas, (n * inst.num_accelerators - vgpus) // per)
                sv = dataclasses.replace(spec.serving, replicas=replicas)
                plan = build_plan(name=sc.name, model=sc.workload.model, instance=inst,
                                  precision=lay.precision, tp=lay.tp, pp=lay.pp, ep=lay.ep, nodes=n,
                                  spec=dataclasses.replace(spec, serving=sv), seed=sc.seed,
                                  pricing=sc.pricing, file=sc.file)
                m = simulate_plan(with_rate(plan, qps), estimate=method == "estimate")["metrics"]
                pr = prices_of(inst, n)
                cache[key] = FleetPoint(instance=inst.name, precision=lay.precision, tp=lay.tp, pp=lay.pp,
                                        ep=lay.ep, replicas=replicas, nodes=n, gpus=plan.gpus,
                                        usd_per_hour=pr[options[0]], slo_met=bool(m.get("slo_met")),
                                        method=method, metrics=m, prices=pr)
                points.append(cache[key])
                if on_point is not None:
                    on_point(cache[key])
            return cache[key]

        def smallest(lay: Layout, method: str, start: int, inst=inst, unit=unit) -> FleetPoint | None:
            """The smallest node count (a multiple of ``unit``) meeting the SLOs by ``method``."""
            per = _gpus_per_replica(sc, spec, lay)
            lo_units = max(1, math.ceil((per + vgpus) / inst.num_accelerators / unit))   # one replica fits
            top_units = max(lo_units, math.ceil((max_replicas * per + vgpus) / inst.num_accelerators / unit))
            u = min(top_units, max(lo_units, math.ceil(start / unit)))
            try:
                if point(lay, u * unit, method).slo_met:
                    lo, hi = lo_units - 1, u
                else:
                    lo, hi = u, None
                    while u < top_units:
                        u = min(top_units, u * 2)
                        if point(lay, u * unit, method).slo_met:
                            hi = u
                            break
                        lo = u
                    if hi is None:
                        return None
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if point(lay, mid * unit, method).slo_met:
                        hi = mid
                    else:
                        lo = mid
                return point(lay, hi * unit, method)
            except (InfeasibleError, ConfigError):
                return None

        # the first guess per layout: replicas whose saturated estimate covers the load
        est: list[tuple[int, int, Layout, FleetPoint]] = []
        for lay in lays:
            found = smallest(lay, "estimate", _first_guess(sc, spec, inst, lay, qps, vgpus))
            if found is not None:
                est.append((found.nodes, found.gpus, lay, found))
        est.sort(key=lambda e: (e[0], e[1], e[2].tp, e[2].ep))
        if not est:
            best[name] = None
            skipped[name] = f"SLOs not met with {max_replicas} replicas of any layout"
            continue
        if estimate:
            best[name] = est[0][3]
            continue
        sims = [s for s in (smallest(lay, "simulation", fp.nodes) for _, _, lay, fp in est[:max(1, confirm)])
                if s is not None]
        if not sims:
            best[name] = None
            skipped[name] = (f"the estimate's best {min(confirm, len(est))} layout(s) do not meet the SLOs "
                             f"when simulated with up to {max_replicas} replicas")
            continue
        best[name] = min(sims, key=lambda p: (p.nodes, p.gpus, p.tp, p.ep))
    return CapacityPlan(qps=qps, points=tuple(points), best_per_instance=best, skipped=skipped,
                        pricing=options)


def _first_guess(sc: Any, spec: Any, inst: Any, lay: Layout, qps: float, vgpus: int) -> int:
    """Nodes whose replicas' saturated (offline) estimate covers ``qps``: where the search starts."""
    from ..workloads.inference import build_plan, estimate_metrics

    try:
        sv = dataclasses.replace(spec.serving, replicas=1)
        per = _gpus_per_replica(sc, spec, lay)
        nodes = max(1, math.ceil((per + vgpus) / inst.num_accelerators))
        plan = build_plan(name=sc.name, model=sc.workload.model, instance=inst, precision=lay.precision,
                          tp=lay.tp, pp=lay.pp, ep=lay.ep, nodes=nodes,
                          spec=dataclasses.replace(spec, serving=sv), seed=sc.seed, pricing=sc.pricing,
                          file=sc.file)
        offline = dataclasses.replace(plan.spec.traffic, arrival="offline")
        off = dataclasses.replace(plan.spec, traffic=offline)
        per_rep = max(estimate_metrics(dataclasses.replace(plan, spec=off))["requests_per_s"], 1e-9)
    except FmsimError:
        return 1
    replicas = math.ceil(qps / per_rep)
    return max(1, math.ceil((replicas * per + vgpus) / inst.num_accelerators))
