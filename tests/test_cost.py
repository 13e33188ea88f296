"""The pricing rule lives once (fmsim.cost.price_of): training and serving price an instance alike,
and a missing price says which pricing the instance does have."""
from __future__ import annotations

from pathlib import Path

import fmsim
from fmsim.cost import price_of

EXAMPLES = Path(__file__).resolve().parents[1] / "scenarios" / "examples"
TRAIN = EXAMPLES / "llama3-70b-p5.yaml"
SERVE = EXAMPLES / "serving-llama3.1-70b-chat-p5.yaml"


def both(**overrides):
    return [fmsim.estimate(fmsim.load_scenario(f, overrides=overrides)) for f in (TRAIN, SERVE)]


def test_price_of_reads_an_option_an_explicit_price_or_says_which_pricing_exists():
    cat = fmsim.load_catalog()
    od = cat.price("p5.48xlarge", "on-demand")
    got = price_of("p5.48xlarge", None)
    assert (got.option, got.usd_per_hour, got.date) == ("on-demand", od.usd_per_hour, od.date)
    assert got.source == od.source
    block = cat.price("trn2.48xlarge", "capacity-block")
    missing = price_of("trn2.48xlarge", None)
    assert missing.usd_per_hour is None and missing.option == "on-demand"
    want = f"trn2.48xlarge has no on-demand price; pricing: capacity-block exists ({block.date})"
    assert missing.source == want
    assert "no price in the catalog" in price_of("dgx-h100", None).source


def test_training_and_serving_price_an_instance_by_the_same_rule():
    p5e = {"cluster.instance": "p5e.48xlarge"}
    for over in (p5e, {**p5e, "pricing": "capacity-block"}, {}, {"pricing": {"usd_per_hour": 40}}):
        train, serve = both(**over)
        assert serve.details["price_source"] == train.details["price_source"] != ""
        assert serve.details["pricing_option"] == train.metrics["pricing_option"]
        assert serve.price_date == train.price_date
        per_node = [r.usd_per_hour / r.nodes if r.usd_per_hour is not None else None for r in (train, serve)]
        assert per_node[0] == per_node[1]
    assert serve.usd_per_hour == 40 * serve.nodes and serve.metrics["usd_per_query"] is not None
