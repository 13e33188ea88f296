"""Ranking costed plans: pricing options, goals, the time/cost Pareto frontier, winners per instance.

Owns :func:`priced` (a costed row under another pricing option: the step time is the same, only the
dollar columns change, by the same rule as ``fmsim.workloads.pretrain.make_result``: the instance price
from :mod:`fmsim.cost`'s price book times nodes times hours), the goals (``deadline``: the cheapest plan
that trains ``train_tokens`` in time; ``budget``: the fastest plan within the money; neither: the Pareto
frontier of time to train against cost), and the order everything is sorted in: by the goal's measure,
then the other measure, then the plan key, so that ties break the same way every run.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

EXPLICIT = "explicit"   # the scenario's own pricing: {usd_per_hour: N}


class PriceBook:
    """``catalog.price`` memoised for the rows of one search: each costed plan is priced under every option,
    and the catalog's lookup (the newest of an instance's entries under an option, their dates parsed)
    depends on the instance and the option alone -- a handful of answers for thousands of rows."""

    __slots__ = ("catalog", "_memo")

    def __init__(self, catalog):
        self.catalog = catalog
        self._memo: dict[tuple[str, str], Any] = {}

    def price(self, instance: str, option: str):
        key = (instance, option)
        try:
            return self._memo[key]
        except KeyError:
            hit = self._memo[key] = self.catalog.price(instance, option)
            return hit


def priced(row: Mapping[str, Any], option: str, catalog, explicit_usd_per_hour: float | None = None) -> dict:
    """``row`` (a training result row) priced under pricing ``option`` (or the scenario's explicit price);
    ``catalog``: a :class:`~fmsim.catalog.Catalog` or a :class:`PriceBook` of one."""
    out = dict(row)
    if option == EXPLICIT:
        hourly, date = explicit_usd_per_hour, ""
    else:
        price = catalog.price(row["instance"], option)
        hourly, date = (price.usd_per_hour, price.date) if price is not None else (None, "")
    nodes = row["nodes"]
    step, ttt = row.get("step_time_s"), row.get("time_to_train_s")
    out["usd_per_hour"] = hourly * nodes if hourly else None
    out["price_date"] = date
    out["pricing_option"] = option
    out["usd_per_step"] = hourly * nodes * step / 3600.0 if (hourly and step) else None
    out["cost_usd"] = hourly * nodes * ttt / 3600.0 if (hourly and ttt) else None
    return out


@dataclass(frozen=True, slots=True)
class Ranked:
    """One costed plan under one pricing option: its key, row and bottleneck sentence; the measures it is
    sorted by are read from the row once, as it is made (a search sorts thousands of them several times)."""

    key: tuple
    row: Mapping[str, Any]
    why: str
    time_s: float = field(init=False, compare=False, repr=False)    # time to train; inf without one
    cost: float = field(init=False, compare=False, repr=False)      # dollars to train; inf without a price
    sort_key: tuple = field(init=False, compare=False, repr=False)  # the tie-break: plan key, pricing option

    def __post_init__(self) -> None:
        t, c = self.row.get("time_to_train_s"), self.row.get("cost_usd")
        object.__setattr__(self, "time_s", float(t) if t is not None else math.inf)
        object.__setattr__(self, "cost", float(c) if c is not None else math.inf)
        object.__setattr__(self, "sort_key", (repr(self.key), self.row.get("pricing_option") or ""))


def runnable(items: Iterable[Ranked]) -> list[Ranked]:
    """The plans with a time and a cost that fit (a re-checked plan the simulation finds over memory never
    ranks, wins or makes the frontier)."""
    return [r for r in items
            if math.isfinite(r.time_s) and math.isfinite(r.cost) and r.row.get("fits") is not False]


def pareto_frontier(items: Iterable[Ranked]) -> list[Ranked]:
    """The plans no other plan beats on both time to train and cost (ascending time)."""
    pts = sorted(runnable(items), key=lambda r: (r.time_s, r.cost, r.sort_key))
    out: list[Ranked] = []
    best_cost = math.inf
    for r in pts:
        if r.cost < best_cost:
            out.append(r)
            best_cost = r.cost
    return out


def goal_order(items: Iterable[Ranked], *, deadline_s: float | None = None,
               budget_usd: float | None = None) -> list[Ranked]:
    """The plans meeting the goal, best first.

    ``deadline_s``: those that train in time, cheapest first; ``budget_usd``: those within it, fastest
    first; both: within both, cheapest first; neither: fastest first (the frontier is separate).
    """
    pts = runnable(items)
    if deadline_s is not None:
        pts = [r for r in pts if r.time_s <= deadline_s]
    if budget_usd is not None:
        pts = [r for r in pts if r.cost <= budget_usd]
    if deadline_s is not None:
        return sorted(pts, key=lambda r: (r.cost, r.time_s, r.sort_key))
    return sorted(pts, key=lambda r: (r.time_s, r.cost, r.sort_key))


def winners_by_instance(ordered: Sequence[Ranked]) -> dict[str, Ranked]:
    """The first (best) plan of each instance type in ``ordered``, instances in catalog-name order."""
    out: dict[str, Ranked] = {}
    for r in ordered:
        out.setdefault(r.row["instance"], r)
    return dict(sorted(out.items()))
