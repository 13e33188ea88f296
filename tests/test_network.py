"""Flow-level network: max-min fair sharing, its invariants, and transfers in simpy."""
from __future__ import annotations

import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from fmsim.engine.network import FlowNetwork, max_min_rates
from fmsim.errors import ConfigError

TOL = 1e-9


@st.composite
def flow_sets(draw):
    num_links = draw(st.integers(1, 8))
    caps = {f"l{i}": draw(st.floats(0.5, 100.0)) for i in range(num_links)}
    flows = {f"f{j}": draw(st.lists(st.sampled_from(sorted(caps)), min_size=1, max_size=4))
             for j in range(draw(st.integers(1, 10)))}
    return flows, caps


def loads(flows, rates):
    out = {}
    for fid, links in flows.items():
        for lk in set(links):
            out[lk] = out.get(lk, 0.0) + rates[fid]
    return out


def reference_water_filling(flows, caps):
    """Textbook progressive filling: raise every unfrozen flow by the same step until a link fills."""
    rates = {f: 0.0 for f in flows}
    frozen = set()
    paths = {f: set(ls) for f, ls in flows.items()}
    while len(frozen) < len(flows):
        load = loads(flows, rates)
        steps = []
        for lk, c in caps.items():
            n = sum(1 for f in flows if f not in frozen and lk in paths[f])
            if n:
                steps.append((c - load.get(lk, 0.0)) / n)
        step = min(steps)
        for f in flows:
            if f not in frozen:
                rates[f] += step
        load = loads(flows, rates)
        full = {lk for lk, c in caps.items() if load.get(lk, 0.0) >= c * (1 - 1e-12)}
        frozen |= {f for f in flows if paths[f] & full}
    return rates


@given(flow_sets())
def test_max_min_never_loads_a_link_above_its_capacity(fs):
    flows, caps = fs
    rates = max_min_rates(flows, caps)
    for lk, load in loads(flows, rates).items():
        assert load <= caps[lk] * (1 + TOL)


@given(flow_sets())
def test_max_min_bottlenecks_every_flow_at_a_saturated_link_where_it_is_largest(fs):
    flows, caps = fs
    rates = max_min_rates(flows, caps)
    load = loads(flows, rates)
    for fid, links in flows.items():
        assert any(load[lk] >= caps[lk] * (1 - 1e-9)
                   and all(rates[g] <= rates[fid] * (1 + 1e-9) for g, gl in flows.items() if lk in gl)
                   for lk in links), fid


@given(flow_sets())
def test_max_min_total_rate_is_maximal_no_flow_can_grow_alone(fs):
    flows, caps = fs
    rates = max_min_rates(flows, caps)
    load = loads(flows, rates)
    for links in flows.values():
        headroom = min(caps[lk] - load[lk] for lk in links)
        assert headroom <= max(caps.values()) * 1e-9
    # and it is THE max-min allocation: equal to textbook water filling
    ref = reference_water_filling(flows, caps)
    assert sum(rates.values()) == pytest.approx(sum(ref.values()), rel=1e-9)
    for fid in flows:
        assert rates[fid] == pytest.approx(ref[fid], rel=1e-9)


def test_max_min_classic_example():
    # A crosses both links, B and C one each: A is held to the tighter link's share
    rates = max_min_rates({"A": ["l1", "l2"], "B": ["l1"], "C": ["l2"]}, {"l1": 1.0, "l2": 2.0})
    assert rates == pytest.approx({"A": 0.5, "B": 0.5, "C": 1.5})


def test_max_min_flow_without_links_is_unconstrained_and_unknown_links_are_refused():
    assert max_min_rates({"x": []}, {}) == {"x": float("inf")}
    with pytest.raises(ConfigError, match="unknown link"):
        max_min_rates({"x": ["nope"]}, {"l": 1.0})


def run_transfers(caps, specs):
    """specs: (name, start_s, links, size, latency) -> completion time by name."""
    env = simpy.Environment()
    net = FlowNetwork(env, caps)
    ends = {}

    def proc(name, start, links, size, latency):
        yield env.timeout(start)
        yield net.transfer(links, size, latency)
        ends[name] = env.now

    for spec in specs:
        env.process(proc(*spec))
    env.run()
    return ends


def test_two_flows_through_one_nic_take_twice_as_long_as_one():
    one = run_transfers({"nic": 50e9}, [("a", 0, ["nic"], 1e9, 0)])
    two = run_transfers({"nic": 50e9}, [("a", 0, ["nic"], 1e9, 0), ("b", 0, ["nic"], 1e9, 0)])
    assert one["a"] == pytest.approx(0.02)
    assert two["a"] == pytest.approx(2 * one["a"]) and two["b"] == pytest.approx(2 * one["a"])


def test_rates_are_recomputed_when_a_flow_starts_and_when_it_ends():
    # a alone for 5 s (50 of 100 B), then a and b share 10 B/s: b's 50 B and a's last 50 B end at 15 s
    ends = run_transfers({"l": 10.0}, [("a", 0, ["l"], 100.0, 0), ("b", 5, ["l"], 50.0, 0)])
    assert ends == pytest.approx({"a": 15.0, "b": 15.0})
    # b short: shares 5 B/s until it ends at 7 (a has 60 B), then a runs alone: 40 B more by 11
    ends = run_transfers({"l": 10.0}, [("a", 0, ["l"], 100.0, 0), ("b", 5, ["l"], 10.0, 0)])
    assert ends == pytest.approx({"b": 7.0, "a": 11.0})


def test_latency_delays_a_transfer_and_empty_transfers_take_only_latency():
    ends = run_transfers({"l": 10.0}, [("a", 0, ["l"], 100.0, 2.0), ("z", 1, ["l"], 0.0, 0.5),
                                        ("n", 0, [], 5.0, 0.25)])
    assert ends == pytest.approx({"a": 12.0, "z": 1.5, "n": 0.25})


def test_flows_on_disjoint_links_do_not_slow_each_other():
    ends = run_transfers({"r0": 1.0, "r1": 1.0}, [("a", 0, ["r0"], 3.0, 0), ("b", 0, ["r1"], 5.0, 0)])
    assert ends == pytest.approx({"a": 3.0, "b": 5.0})


def test_a_flow_crossing_a_congested_link_is_limited_by_it():
    # c crosses the shared uplink with a and b: each gets a third of it
    ends = run_transfers({"up": 3.0, "x": 100.0},
                         [("a", 0, ["up"], 3.0, 0), ("b", 0, ["up"], 3.0, 0), ("c", 0, ["x", "up"], 3.0, 0)])
    assert ends == pytest.approx({"a": 3.0, "b": 3.0, "c": 3.0})


def test_same_transfers_same_times():
    import random

    rng = random.Random(7)
    caps = {f"l{i}": rng.uniform(1, 10) for i in range(20)}
    specs = [(f"t{j}", rng.random(), rng.sample(sorted(caps), 3), rng.uniform(1, 50), rng.random() * 0.1)
             for j in range(60)]
    assert run_transfers(caps, specs) == run_transfers(caps, specs)


def test_network_rejects_bad_capacities_links_and_sizes():
    env = simpy.Environment()
    with pytest.raises(ConfigError, match="capacity"):
        FlowNetwork(env, {"l": 0.0})
    net = FlowNetwork(env, {"l": 1.0})
    with pytest.raises(ConfigError, match="unknown link"):
        net.transfer(["m"], 1.0)
    with pytest.raises(ConfigError, match="size"):
        net.transfer(["l"], -1.0)
    with pytest.raises(ConfigError, match="latency"):
        net.transfer(["l"], 1.0, latency_s=-1.0)
