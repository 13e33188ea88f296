"""Dollar cost: which price applies to a scenario, with its date and source.

Owns the pricing rule: a scenario's ``pricing`` is either a purchase option looked up in the
price book (newest dated entry for the instance) or an explicit ``usd_per_hour`` per instance.
Reference systems carry no AWS price; their costs are reported as unknown (None), never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass

from .catalog import PRICING_OPTIONS, load_catalog


@dataclass(frozen=True, slots=True)
class AppliedPrice:
    option: str
    usd_per_hour: float | None       # per instance (node)
    date: str
    source: str


def price_for(sc) -> AppliedPrice:
    """The price per instance-hour that applies to scenario ``sc``."""
    return price_of(sc.cluster.instance.name, sc.pricing)


def price_of(instance: str, pricing) -> AppliedPrice:
    """The price per hour of one ``instance`` under a scenario's ``pricing`` (an option, an explicit
    ``usd_per_hour``, or None for on-demand): the one rule every workload prices by. Without a price
    the source is :func:`missing_price`'s sentence."""
    explicit = getattr(pricing, "usd_per_hour", None)
    if explicit is not None:
        return AppliedPrice("explicit", float(explicit), "", "scenario pricing.usd_per_hour")
    option = getattr(pricing, "option", None) or "on-demand"
    price = load_catalog().price(instance, option)
    if price is None:
        return AppliedPrice(option, None, "", missing_price(instance, option))
    return AppliedPrice(option, price.usd_per_hour, price.date, price.source)


def missing_price(instance: str, option: str) -> str:
    """Why ``instance`` has no cost under ``option``, and which pricing it does have: the one
    sentence every face shows (``p5e.48xlarge has no on-demand price; pricing: capacity-block
    exists (2026-07-22)``)."""
    cat = load_catalog()
    others = [(o, cat.price(instance, o)) for o in PRICING_OPTIONS if o != option]
    there = ", ".join(f"{o} exists ({p.date})" for o, p in others if p is not None)
    if not there:
        return f"{instance} has no price in the catalog (a reference system, or an instance not priced yet)"
    return f"{instance} has no {option} price; pricing: {there}"
