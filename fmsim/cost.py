"""Dollar cost: which price applies to a scenario, with its date and source.

Owns the pricing rule: a scenario's ``pricing`` is either a purchase option looked up in the
price book (newest dated entry for the instance) or an explicit ``usd_per_hour`` per instance.
Reference systems carry no AWS price; their costs are reported as unknown (None), never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass

from .catalog import load_catalog


@dataclass(frozen=True, slots=True)
class AppliedPrice:
    option: str
    usd_per_hour: float | None       # per instance (node)
    date: str
    source: str


def price_for(sc) -> AppliedPrice:
    """The price per instance-hour that applies to scenario ``sc``."""
    p = sc.pricing
    explicit = getattr(p, "usd_per_hour", None)
    if explicit is not None:
        return AppliedPrice("explicit", float(explicit), "", "scenario pricing.usd_per_hour")
    option = getattr(p, "option", None) or "on-demand"
    price = load_catalog().price(sc.cluster.instance.name, option)
    if price is None:
        return AppliedPrice(option, None, "", "no price in the catalog for this instance and option")
    return AppliedPrice(option, price.usd_per_hour, price.date, price.source)
