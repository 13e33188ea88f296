"""``fmsim plan-capacity``: the smallest serving fleet that meets a scenario's SLOs at a given load.

Owns the fleet search. For each candidate instance type it picks a model-parallel layout (the
scenario's own on its own instance type; elsewhere the smallest tensor-parallel degree whose
weights leave room for a KV cache, falling back to a precision the chip has), sizes a first guess
of replicas from the analytical estimate, then confirms with the discrete-event simulation:
replicas go up until the SLOs hold at ``--qps`` (Poisson arrivals) and down while they still do.
Every evaluated point is printed (the searched frontier), then the smallest fleet per type and
the cheapest overall.

``add_parser(subparsers)`` / ``run(args) -> int`` are the plug-in contract of ``fmsim/cli.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, FmsimError, InfeasibleError

EXIT_OK, EXIT_USAGE = 0, 2
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
    usd_per_hour: float | None
    slo_met: bool
    method: str
    metrics: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityPlan:
    qps: float
    points: tuple[FleetPoint, ...]
    best_per_instance: dict[str, FleetPoint | None]
    skipped: dict[str, str]

    @property
    def cheapest(self) -> FleetPoint | None:
        ok = [p for p in self.best_per_instance.values() if p is not None]
        if not ok:
            return None
        return min(ok, key=lambda p: (p.usd_per_hour if p.usd_per_hour is not None else math.inf, p.gpus))


def _layout(sc: Any, instance: Any, spec: Any) -> tuple[str, int, int]:
    """(precision, tp, pp) for ``instance``: the scenario's own on its instance type."""
    from .model.serving_cost import build_cost_model, engine_profile, kv_dtype_for
    from .workloads.inference import _mean_lengths

    par = sc.parallelism
    if instance.name == sc.cluster.instance.name:
        return sc.workload.precision, par.tp, par.pp
    model = sc.workload.model
    profile = engine_profile(spec.serving.engine)
    isl, osl = _mean_lengths(spec)
    acc = instance.accelerator
    for prec in PRECISION_FALLBACK.get(sc.workload.precision, (sc.workload.precision,)):
        if prec not in acc.peak_flop_per_s:
            continue
        for tp in TP_CANDIDATES:
            if tp > instance.num_accelerators or model.heads % tp:
                continue
            cost = build_cost_model(model, instance, precision=prec,
                                    kv_dtype=kv_dtype_for(prec, spec.serving.kv_cache_dtype, profile), tp=tp,
                                    collective=None)
            frac = spec.serving.memory_fraction or profile.memory_fraction
            try:
                cap = cost.kv_capacity_tokens(hbm_bytes=acc.hbm_bytes, memory_fraction=frac,
                                              fraction_of=profile.memory_fraction_of,
                                              activation_bytes=cost.activation_bytes(8192, 256, model))
            except InfeasibleError:
                continue
            if cap >= 16 * (isl + osl):       # room for a useful batch
                return prec, tp, 1
    raise InfeasibleError(f"{model.name} does not fit one {instance.name} node in "
                          f"{'/'.join(PRECISION_FALLBACK.get(sc.workload.precision, ()))}")


def _plan_for(sc: Any, spec: Any, instance: Any, precision: str, tp: int, pp: int, replicas: int, qps: float):
    from .workloads.inference import build_plan, with_rate

    ep = sc.parallelism.ep if instance.name == sc.cluster.instance.name else 1
    per_replica = tp * pp * (ep if (spec.serving.attention_dp and sc.workload.model.moe) else 1)
    vgpus = 0
    if spec.ttc.verifier is not None:
        vgpus = spec.ttc.verifier.tp * spec.ttc.verifier.replicas
    gpus = replicas * per_replica + vgpus
    nodes = max(1, math.ceil(gpus / instance.num_accelerators))
    sv = dataclasses.replace(spec.serving, replicas=replicas)
    plan = build_plan(name=sc.name, model=sc.workload.model, instance=instance, precision=precision, tp=tp,
                      pp=pp, ep=ep, nodes=nodes, spec=dataclasses.replace(spec, serving=sv), seed=sc.seed,
                      pricing=sc.pricing, file=sc.file)
    return with_rate(plan, qps)


def _evaluate(plan: Any, *, estimate: bool) -> tuple[bool, dict[str, Any]]:
    from .workloads.inference import simulate_plan

    out = simulate_plan(plan, estimate=estimate)
    m = out["metrics"]
    return bool(m.get("slo_met")), m


def plan_capacity(sc: Any, qps: float, instances: Sequence[str] | None = None, *, estimate: bool = False,
                  max_replicas: int = 512) -> CapacityPlan:
    """Search the smallest fleet meeting ``sc``'s SLOs at ``qps`` on each instance type."""
    from .catalog import load_catalog
    from .workloads.inference import estimate_metrics
    from .workloads.inference_spec import parse_inference_spec

    if not qps > 0:
        raise ConfigError(f"--qps {qps:g} must be > 0")
    spec = parse_inference_spec(sc.extra, file=sc.file)
    if not spec.slo.limits_s:
        raise ConfigError("plan-capacity needs latency targets: add an slo: section "
                          "(e.g. slo: {ttft_p99: 2 s, tpot_p99: 100 ms})", file=sc.file, field="slo")
    if spec.serving.disaggregation is not None:
        raise ConfigError("plan-capacity sizes replicas of plain serving; size disaggregated pools by hand",
                          file=sc.file, field="serving.disaggregation")
    cat = load_catalog()
    names = list(instances) if instances else [sc.cluster.instance.name]
    points: list[FleetPoint] = []
    best: dict[str, FleetPoint | None] = {}
    skipped: dict[str, str] = {}
    for name in names:
        inst = cat.instance(name)
        try:
            prec, tp, pp = _layout(sc, inst, spec)
            first = _plan_for(sc, spec, inst, prec, tp, pp, 1, qps)
        except FmsimError as exc:
            skipped[name] = str(exc)
            best[name] = None
            continue
        # first guess from the estimate: replicas whose saturated throughput covers the load
        sat = estimate_metrics(dataclasses.replace(first, spec=dataclasses.replace(
            first.spec, traffic=dataclasses.replace(first.spec.traffic, arrival="offline"))))
        per_rep = max(sat["requests_per_s"], 1e-9)
        guess = min(max_replicas, max(1, math.ceil(qps / per_rep)))
        cache: dict[int, FleetPoint] = {}

        def point(r: int, inst=inst, prec=prec, tp=tp, pp=pp, cache=cache) -> FleetPoint:
            if r not in cache:
                plan = _plan_for(sc, spec, inst, prec, tp, pp, r, qps)
                ok, m = _evaluate(plan, estimate=estimate)
                cache[r] = FleetPoint(instance=inst.name, precision=prec, tp=tp, pp=pp, replicas=r,
                                      nodes=plan.nodes, gpus=plan.gpus, usd_per_hour=plan.usd_per_hour,
                                      slo_met=ok, method="estimate" if estimate else "simulation", metrics=m)
                points.append(cache[r])
            return cache[r]

        r = guess
        if point(r).slo_met:
            lo, hi = 0, r                      # hi meets; find the smallest that does
        else:
            lo = r
            hi = None
            while r < max_replicas:
                r = min(max_replicas, r * 2)
                if point(r).slo_met:
                    hi = r
                    break
                lo = r
            if hi is None:
                best[name] = None
                skipped[name] = f"SLOs not met with {max_replicas} replicas"
                continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if point(mid).slo_met:
                hi = mid
            else:
                lo = mid
        best[name] = point(hi)
    return CapacityPlan(qps=qps, points=tuple(points), best_per_instance=best, skipped=skipped)


# ----------------------------------------------------------------------------------------------
# the command


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan-capacity",
        help="smallest serving fleet meeting a scenario's SLOs at a request rate (and the cheapest type)",
        description="Search replicas (and, with --instances, instance types) for a kind: inference "
                    "scenario so that its slo: section holds under Poisson arrivals at --qps. Prints every "
                    "evaluated fleet, the smallest per instance type and the cheapest.")
    p.add_argument("scenario", help="a kind: inference scenario file with an slo: section")
    p.add_argument("--qps", type=float, required=True, help="questions (requests) per second to serve")
    p.add_argument("--instances", default=None,
                   help="comma-separated instance types to compare (default: the scenario's)")
    p.add_argument("--estimate", action="store_true",
                   help="use the analytical estimate instead of the simulation (fast, rougher)")
    p.add_argument("--max-replicas", type=int, default=512, help="stop searching beyond this many replicas")


def _fmt(v: Any, col: str) -> str:
    from .cli import format_column

    return format_column(col, v)


def render(plan: CapacityPlan) -> str:
    head = ("instance", "prec", "tp", "pp", "replicas", "nodes", "gpus", "$/h", "ttft_p99", "tpot_p99",
            "goodput", "meets SLO")
    rows = []
    for p in sorted(plan.points, key=lambda p: (p.instance, p.replicas)):
        m = p.metrics
        rows.append((p.instance, p.precision, str(p.tp), str(p.pp), str(p.replicas), str(p.nodes), str(p.gpus),
                     _fmt(p.usd_per_hour, "usd_per_hour"), _fmt(m.get("ttft_p99_s"), "ttft_p99_s"),
                     _fmt(m.get("tpot_p99_s"), "tpot_p99_s"),
                     f"{100 * m['goodput_fraction']:.0f} %" if m.get("goodput_fraction") is not None and
                     not math.isnan(m.get("goodput_fraction")) else "-",
                     "yes" if p.slo_met else "no"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = [f"searched frontier at {plan.qps:g} requests/s ({'estimate' if plan.points and plan.points[0].method == 'estimate' else 'simulation'}):",
             "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("")
    for name, p in plan.best_per_instance.items():
        if p is None:
            lines.append(f"{name}: no fleet found ({plan.skipped.get(name, 'SLOs not met')})")
        else:
            price = _fmt(p.usd_per_hour, "usd_per_hour") + "/h" if p.usd_per_hour is not None else "no price"
            lines.append(f"{name}: {p.replicas} replicas x tp{p.tp}{f' pp{p.pp}' if p.pp > 1 else ''} "
                         f"({p.precision}) = {p.gpus} GPUs on {p.nodes} nodes, {price}")
    best = plan.cheapest
    if best is not None and len(plan.best_per_instance) > 1:
        lines.append(f"cheapest: {best.instance} ({best.nodes} nodes, "
                     f"{_fmt(best.usd_per_hour, 'usd_per_hour')}/h)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from .scenario import load_scenario

    sc = load_scenario(args.scenario)
    if sc.workload.kind != "inference":
        raise ConfigError(f"plan-capacity needs a kind: inference scenario (this one is {sc.workload.kind})",
                          file=sc.file, field="workload.kind")
    instances = [s.strip() for s in args.instances.split(",") if s.strip()] if args.instances else None
    plan = plan_capacity(sc, args.qps, instances, estimate=args.estimate, max_replicas=args.max_replicas)
    print(render(plan))
    found = any(p is not None for p in plan.best_per_instance.values())
    if not found:
        print("no fleet meets the SLOs at this load", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK
