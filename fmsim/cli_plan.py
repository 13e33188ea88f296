"""``fmsim plan-capacity``: the cheapest serving fleet that meets a scenario's SLOs at a given load.

Owns the command: its options, and the report -- every evaluated fleet (the searched frontier, by the
estimate and by the simulation), the answer per instance type and the cheapest over instance types and
pricing options. The search is :func:`fmsim.search.serving.plan_capacity` (it tries every tensor-parallel
layout that fits, and the expert-parallel width with data-parallel attention, sizes each by the estimate
and confirms the best by simulation; docs/search.md).

``add_parser(subparsers)`` / ``run(args) -> int`` are the plug-in contract of ``fmsim/cli.py``.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from .errors import ConfigError
from .search.serving import CapacityPlan, FleetPoint, plan_capacity

__all__ = ["CapacityPlan", "FleetPoint", "add_parser", "plan_capacity", "render", "run"]

EXIT_OK, EXIT_USAGE = 0, 2


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan-capacity",
        help="cheapest serving fleet meeting a scenario's SLOs at a request rate (layouts, types, prices)",
        description="Search tensor-parallel layouts (and expert-parallel widths with data-parallel "
                    "attention), node counts, instance types (--instances) and pricing options (--pricing) "
                    "for a kind: inference scenario so that its slo: section holds under Poisson arrivals "
                    "at --qps. The estimate sizes every layout, the simulation confirms the best --confirm "
                    "of each type. Prints every evaluated fleet, the answer per instance type and the "
                    "cheapest.")
    p.add_argument("scenario", help="a kind: inference scenario file with an slo: section")
    p.add_argument("--qps", type=float, required=True, help="questions (requests) per second to serve")
    p.add_argument("--instances", default=None,
                   help="comma-separated instance types to compare (default: the scenario's)")
    p.add_argument("--pricing", default=None,
                   help="comma-separated pricing options to price fleets under (default: the scenario's)")
    p.add_argument("--estimate", action="store_true",
                   help="use the analytical estimate only, no simulation (fast, rougher)")
    p.add_argument("--confirm", type=int, default=2, metavar="K",
                   help="layouts per instance type the simulation re-sizes, best by the estimate first "
                        "(default 2)")
    p.add_argument("--max-replicas", type=int, default=512, help="stop searching beyond this many replicas")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar of the fleets evaluated on stderr (default: only when stderr is a "
                        "terminal)")


def _fmt(v: Any, col: str) -> str:
    from .cli import format_column

    return format_column(col, v)


def _layout(p: FleetPoint) -> str:
    return f"tp{p.tp}" + (f" pp{p.pp}" if p.pp > 1 else "") + (f" ep{p.ep}" if p.ep > 1 else "")


def render(plan: CapacityPlan) -> str:
    head = ("instance", "method", "prec", "layout", "replicas", "nodes", "gpus", "$/h", "ttft_p99",
            "tpot_p99", "goodput", "meets SLO")
    rows = []
    for p in sorted(plan.points, key=lambda p: (p.instance, p.method, p.tp, p.pp, p.ep, p.nodes)):
        m = p.metrics
        good = m.get("goodput_fraction")
        rows.append((p.instance, p.method, p.precision, _layout(p), str(p.replicas), str(p.nodes),
                     str(p.gpus),
                     _fmt(p.usd_per_hour, "usd_per_hour"), _fmt(m.get("ttft_p99_s"), "ttft_p99_s"),
                     _fmt(m.get("tpot_p99_s"), "tpot_p99_s"),
                     f"{100 * good:.0f} %" if good is not None and not math.isnan(good) else "-",
                     "yes" if p.slo_met else "no"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = [f"searched frontier at {plan.qps:g} requests/s ($/h under {plan.pricing[0]}):",
             "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("")
    for name, p in plan.best_per_instance.items():
        if p is None:
            lines.append(f"{name}: no fleet found ({plan.skipped.get(name, 'SLOs not met')})")
            continue
        prices = ", ".join(f"{_fmt(v, 'usd_per_hour')}/h {o}" if v is not None else f"no {o} price"
                           for o, v in p.prices.items())
        lines.append(f"{name}: {p.replicas} replicas x {_layout(p)} ({p.precision}) = {p.gpus} GPUs on "
                     f"{p.nodes} nodes ({p.method}), {prices}")
    best = plan.cheapest_option
    if best is not None and (len(plan.best_per_instance) > 1 or len(plan.pricing) > 1):
        p, opt = best
        lines.append(f"cheapest: {p.instance} ({p.nodes} nodes, {_layout(p)}, "
                     f"{_fmt(p.prices.get(opt), 'usd_per_hour')}/h {opt})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from .catalog import PRICING_OPTIONS, load_catalog
    from .scenario import load_scenario
    from .search.space import parse_names

    sc = load_scenario(args.scenario)
    if sc.workload.kind != "inference":
        raise ConfigError(f"plan-capacity needs a kind: inference scenario (this one is {sc.workload.kind})",
                          file=sc.file, field="workload.kind")
    instances = parse_names("--instances", args.instances, sorted(load_catalog().instances)) \
        if args.instances else None
    pricing = parse_names("--pricing", args.pricing, PRICING_OPTIONS) if args.pricing else None
    if args.confirm < 1:
        raise ConfigError(f"--confirm {args.confirm} must be >= 1")
    from tqdm import tqdm

    from .cli import _progress

    with tqdm(disable=not _progress(args), file=sys.stderr, unit="fleet", desc="fleets evaluated",
              dynamic_ncols=True, mininterval=0.5) as bar:
        plan = plan_capacity(sc, args.qps, instances, estimate=args.estimate, max_replicas=args.max_replicas,
                             pricing=pricing, confirm=args.confirm, on_point=lambda _p: bar.update())
    print(render(plan))
    found = any(p is not None for p in plan.best_per_instance.values())
    if not found:
        print("no fleet meets the SLOs at this load", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK
