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
    cat = load_catalog()
    hit = _APPLIED.get((instance, option))
    if hit is not None and hit[0] is cat:
        return hit[1]
    price = cat.price(instance, option)
    if price is None:
        out = AppliedPrice(option, None, "", missing_price(instance, option))
    else:
        out = AppliedPrice(option, price.usd_per_hour, price.date, price.source)
    if len(_APPLIED) >= 1024:
        _APPLIED.clear()
    _APPLIED[(instance, option)] = (cat, out)
    return out


#: price_of's answers for the catalog they came from ((instance, option) -> (catalog, price)): every result
#: of a plan search asks it again of the same few instances and options (the catalog's lookup scans and
#: parses an instance's dated entries); bounded
_APPLIED: dict[tuple[str, str], tuple[object, AppliedPrice]] = {}


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
