"""Failure-rate fleets (hardware_catalog/failure_rates.yaml) and the seeded run of fmsim.workloads.reliability:
what each fleet counts, its located errors, and the monotone properties of the expected interruptions."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import fmsim
from fmsim.workloads.reliability import component_rates, fleet_counts, fleet_rates, simulate_run
from test_catalog_reader import HW, _cli_error, _minimal, _set, tree  # noqa: F401  (tree: a fixture)
from test_storage import FSX, scenario

FLEETS = sorted(fmsim.load_catalog().extra["failure_rates"])


def test_each_fleet_says_what_its_rates_count():
    assert fleet_counts("llama3-405b-h100") == "all"            # Table 5: every unexpected interruption
    for name in ("meta-rsc-a100", "meta-rsc1-a100", "meta-rsc2-a100"):
        assert fleet_counts(name) == "hardware"                 # Kokolis et al.: NODE_FAIL or health check


@pytest.mark.parametrize("value,message", [
    ("hardwre", "failure_rates.fleet.counts: 'hardwre' is not valid (did you mean 'hardware'?)"),
    (3, "failure_rates.fleet.counts: a number (3) is not valid (expected one of all, hardware)"),
])
def test_a_bad_counts_value_is_one_located_line_and_exit_2(tree, capsys, value, message):  # noqa: F811
    (tree / "hardware_catalog" / "hw.yaml").write_text(yaml.safe_dump(_set(_minimal(), "failure_rates/fleet/counts",
                                                                           value)))
    assert _cli_error(capsys) == f"{HW}: {message}"


def test_a_fleet_without_counts_counts_everything(tree, capsys):  # noqa: F811
    (tree / "hardware_catalog" / "hw.yaml").write_text(yaml.safe_dump(_minimal()))
    fmsim.load_catalog.cache_clear()
    assert fleet_counts("fleet") == "all"


def test_a_hardware_only_fleet_says_so_in_the_result_and_a_whole_count_fleet_does_not():
    rel = {"restart": "10 min", "run_length": "5 days", "trials": 20}
    ch = {"cluster.storage": FSX, "checkpoint": {"every": "1 h"}}
    hw = fmsim.estimate(scenario(**ch, reliability={**rel, "fleet": "meta-rsc-a100"}))
    whole = fmsim.estimate(scenario(**ch, reliability={**rel, "fleet": "llama3-405b-h100"}))
    assert any("attributed to hardware only" in n for n in hw.details["checkpoint"]["notes"])
    assert not any("attributed to hardware only" in n for n in whole.details["checkpoint"]["notes"])


@pytest.mark.parametrize("fleet", FLEETS)
def test_more_components_never_give_fewer_expected_interruptions(fleet):
    # every fleet's rate over the cluster grows with each of its parts: GPUs, nodes, NICs per node
    rel = {"fleet": fleet, "restart": "10 min"}
    sc = scenario(reliability=rel)
    base = sum(component_rates(sc, 64, 8, 4).values())
    assert base > 0
    for gpus, nodes, nics in ((128, 8, 4), (64, 16, 4), (64, 8, 8), (1024, 128, 32)):
        assert sum(component_rates(sc, gpus, nodes, nics).values()) >= base
    # and a component switched on by an override (rates: {c: x > 0} over a zero) never lowers the total
    rates, _ = fleet_rates(fleet)
    comp = next(iter(rates))
    off = scenario(reliability={**rel, "rates": {comp: 0.0}})
    on = scenario(reliability={**rel, "rates": {comp: 1e-3}})
    assert sum(component_rates(on, 64, 8, 4).values()) >= sum(component_rates(off, 64, 8, 4).values())


@settings(max_examples=25, deadline=None)
@given(rate=st.floats(1e-7, 1e-4), factor=st.floats(1.0, 8.0), seed=st.integers(0, 2**16))
def test_a_higher_interruption_rate_never_gives_fewer_interruptions_in_the_same_seeded_window(rate, factor, seed):
    kw = dict(interval=3600.0, downtime=30.0, recover=900.0, wall_limit=20 * 86400.0, trials=16, seed=seed)
    lo, hi = simulate_run(rate=rate, **kw), simulate_run(rate=rate * factor, **kw)
    assert (hi.interruptions >= lo.interruptions).all()
    # the seeded run is deterministic: the same inputs give the same trials, array for array
    again = simulate_run(rate=rate, **kw)
    assert (again.interruptions == lo.interruptions).all() and (again.goodput == lo.goodput).all()


def test_the_expected_count_follows_rate_times_running_time():
    # a 10-day window at 2 interruptions a day with a 15-minute recovery: about 2 x (10 days less the
    # recoveries) = 19.6
    st_ = simulate_run(rate=2.0 / 86400.0, interval=3600.0, downtime=0.0, recover=900.0,
                       wall_limit=10 * 86400.0, trials=400, seed=1)
    running = 10.0 / (1.0 + 2.0 * 900.0 / 86400.0)
    assert st_.interruptions.mean() == pytest.approx(2.0 * running, rel=0.05)
    assert math.isfinite(st_.goodput.mean())
