"""Collective cost models: formulas, invariants over every registered algorithm, and the
published nccl-tests on AWS they must reproduce within 10 %."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fmsim.catalog import Accelerator, Fabric, Instance, ScaleUp, load_catalog
from fmsim.errors import ConfigError
from fmsim.hardware.collectives import (
    ALGORITHMS,
    OPS,
    Algorithm,
    GroupShape,
    algorithms_for,
    all_to_all_time,
    collective_time,
    derive_per_domain,
    double_binary_tree,
    group_view,
    pipelined_s,
    register,
)
from fmsim.hardware.topology import place

GiB, MiB = 2.0 ** 30, 2.0 ** 20


def make_instance(*, acc: int = 8, nics: int = 8, nic_gbps: float = 400.0, link_bytes: float = 450e9,
                  domain: int | None = None, topology: str = "crossbar", in_switch: bool = False,
                  link_eff: float = 1.0, fab_eff: float = 1.0, link_lat: float = 0.0, fab_lat: float = 0.0,
                  cross: float = 0.0, sharp: bool = False, kind: str = "nvswitch") -> Instance:
    """An instance built in code, so formulas can be checked against hand-worked numbers."""
    accel = Accelerator(name="x", vendor="t", peak_flop_per_s={"bf16": 1e15}, hbm_bytes=80e9,
                        hbm_bytes_per_s=3e12, scale_up_bytes_per_s=link_bytes, gemm_efficiency={"bf16": 0.8},
                        hbm_efficiency=0.9, source="test")
    su = ScaleUp(kind=kind, domain_size=domain or acc, bytes_per_s=link_bytes, latency_s=link_lat,
                 topology=topology, in_switch_reduction=in_switch, efficiency=link_eff, source="test",
                 cross_node_bytes_per_s=cross, cross_node_topology="ring" if cross else "")
    fab = Fabric(name="f", kind="efa", nic_bytes_per_s=nic_gbps * 1e9 / 8, latency_s=fab_lat,
                 efficiency=fab_eff, source="test", in_network_reduction=sharp)
    return Instance(name="test.node", provider="aws", accelerator=accel, num_accelerators=acc, scale_up=su,
                    fabric=fab, num_nics=nics, nic_bytes_per_s=nic_gbps * 1e9 / 8, host_memory_bytes=0,
                    local_nvme_bytes=0, num_vcpus=0, source="test")


def scaled(inst: Instance, *, link: float = 1.0, nic: float = 1.0) -> Instance:
    """``inst`` with its scale-up and NIC bandwidths multiplied."""
    su = dataclasses.replace(inst.scale_up, bytes_per_s=inst.scale_up.bytes_per_s * link,
                             cross_node_bytes_per_s=inst.scale_up.cross_node_bytes_per_s * link)
    return dataclasses.replace(inst, scale_up=su, nic_bytes_per_s=inst.nic_bytes_per_s * nic)


# Instances and groups the invariants run over: one node, several nodes, one member per node,
# an NVLS node, a multi-node NVLink domain (NVL72-like), a torus domain with slow cross-node links
# (Trn2 UltraServer-like), SHARP in the fabric.
CASES = [
    (make_instance(link_lat=3e-6, fab_lat=20e-6), GroupShape(size=8, per_node=8)),
    (make_instance(link_lat=3e-6, fab_lat=20e-6), GroupShape(size=32, per_node=8)),
    (make_instance(link_lat=3e-6, fab_lat=20e-6), GroupShape(size=6, per_node=1, stride=8)),
    (make_instance(in_switch=True, link_lat=6e-6, fab_lat=28e-6, link_eff=0.7, fab_eff=0.66),
     GroupShape(size=24, per_node=8)),
    (make_instance(acc=4, nics=4, domain=72, in_switch=True, kind="nvl-domain", link_bytes=900e9,
                   link_lat=6e-6, fab_lat=19e-6), GroupShape(size=144, per_node=4, per_domain=72)),
    (make_instance(acc=16, nics=16, nic_gbps=200, domain=64, topology="torus2d", kind="neuronlink",
                   link_bytes=512e9, cross=128e9, link_lat=5e-6, fab_lat=19e-6),
     GroupShape(size=128, per_node=16, per_domain=64)),
    (make_instance(sharp=True, in_switch=True, link_lat=3e-6, fab_lat=5e-6), GroupShape(size=64, per_node=8)),
]
PAIRS = [(op, name) for op in OPS for name in algorithms_for(op)]
sizes = st.floats(min_value=1.0, max_value=64 * GiB, allow_nan=False)


def applicable(name: str, inst: Instance, shape: GroupShape) -> bool:
    return ALGORITHMS[name].applies(group_view(inst, shape))


# ----------------------------------------------------------------------------------------------
# formulas against hand-worked numbers


@given(n=st.integers(2, 8), size=sizes)
def test_ring_all_reduce_moves_2_n_minus_1_over_n_of_the_buffer_per_rank(n, size):
    inst = make_instance()                      # no latency, efficiency 1: pure bandwidth
    c = collective_time("all-reduce", size, inst, GroupShape(size=n, per_node=n), algo="ring")
    moved = c.time_s * inst.scale_up.bytes_per_s
    assert moved == pytest.approx(2 * (n - 1) / n * size, rel=1e-12)
    assert c.busbw_bytes_per_s == pytest.approx(inst.scale_up.bytes_per_s, rel=1e-12)


def test_ring_all_reduce_adds_one_latency_per_step():
    inst = make_instance(link_lat=5e-6)
    c = collective_time("all-reduce", 8.0, inst, GroupShape(size=8, per_node=8), algo="ring")
    assert c.time_s == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * 8.0 / 450e9)


def test_ring_across_nodes_is_bound_by_the_nics_of_the_node():
    # 16 ranks on 2 nodes: each node pushes 2(n-1)/n·S through its 8 × 50 GB/s NICs
    inst = make_instance()
    c = collective_time("all-reduce", GiB, inst, GroupShape(size=16, per_node=8), algo="ring")
    assert c.busbw_bytes_per_s == pytest.approx(8 * 50e9, rel=1e-12)


def test_a_ring_streams_through_the_nics_at_the_ring_efficiency_other_algorithms_at_the_calibrated_one():
    inst = make_instance(fab_eff=0.5)
    inst = dataclasses.replace(inst, fabric=dataclasses.replace(inst.fabric, ring_efficiency=0.9))
    shape = GroupShape(size=16, per_node=8)
    ring = collective_time("all-reduce", GiB, inst, shape, algo="ring")
    assert ring.busbw_bytes_per_s == pytest.approx(0.9 * 8 * 50e9, rel=1e-12)
    for algo in ("tree", "hierarchical"):          # their inter-node stage keeps the calibrated figure
        plain = collective_time("all-reduce", GiB, make_instance(fab_eff=0.5), shape, algo=algo)
        assert collective_time("all-reduce", GiB, inst, shape, algo=algo).time_s == plain.time_s
    single = collective_time("reduce-scatter", GiB, inst, GroupShape(size=4, per_node=1, stride=8), algo="ring")
    assert single.busbw_bytes_per_s == pytest.approx(0.9 * 50e9, rel=1e-12)
    # without a ring figure the ring sees the calibrated one
    assert make_instance(fab_eff=0.5).fabric.ring_fraction == 0.5


def test_infiniband_ring_efficiency_reproduces_the_nccl_maintainers_figures(catalog):
    # NVIDIA/nccl-tests issue #29 (2019-12-06): all_reduce busbw 12.2 GB/s through one 100 Gb/s adapter,
    # 48 GB/s through a DGX-1's four
    for name in ("ib-hdr", "ib-ndr", "ib-xdr", "roce-200g"):
        f = catalog.fabric(name).ring_fraction
        assert f * 12.5 == pytest.approx(12.2, rel=0.02) and f * 50 == pytest.approx(48, rel=0.01), name
    inst = catalog.instance("dgx-h100")
    edr = dataclasses.replace(inst, nic_bytes_per_s=100e9 / 8)      # each GPU behind its own 100 Gb/s adapter
    c = collective_time("all-reduce", 8 * GiB, edr, GroupShape(size=2, per_node=1), algo="ring")
    assert c.busbw_bytes_per_s / 1e9 == pytest.approx(12.2, rel=0.03)


def test_one_member_per_node_gets_its_share_of_the_node_nics():
    # 8 DP groups with one member per node each get 1/8 of the node's EFA
    inst = make_instance()
    c = collective_time("send-recv", GiB, inst, GroupShape(size=4, per_node=1, stride=8))
    assert c.algbw_bytes_per_s == pytest.approx(inst.scale_out_bytes_per_s / 8, rel=1e-12)


def test_nvls_all_reduce_loads_each_port_with_1_plus_1_over_d_of_the_buffer():
    inst = make_instance(in_switch=True)
    size = 64 * GiB            # pipeline fill negligible
    c = collective_time("all-reduce", size, inst, GroupShape(size=8, per_node=8), algo="nvls")
    assert c.time_s == pytest.approx((1 + 1 / 8) * size / 450e9, rel=2e-3)


def test_hierarchical_all_reduce_is_reduce_scatter_then_shard_all_reduce_then_all_gather():
    inst = make_instance()
    size = GiB
    c = collective_time("all-reduce", size, inst, GroupShape(size=32, per_node=8), algo="hierarchical")
    intra = 7 / 8 * size / 450e9
    inter = 2 * 3 / 4 * (size / 8) / 50e9
    assert c.time_s == pytest.approx(2 * intra + inter, rel=1e-12)


def test_all_gather_and_reduce_scatter_span_nodes_on_one_ring_as_nccl_runs_them():
    # NCCL has no hierarchical all-gather or reduce-scatter (NVIDIA/nccl #1473, #1413): across nodes
    # without an in-switch reduction they run on a ring over every member, whose latency grows with it
    inst = make_instance(link_lat=3e-6, fab_lat=30e-6)
    shape = GroupShape(size=1536, per_node=8)
    for op in ("all-gather", "reduce-scatter"):
        c = collective_time(op, 80e6, inst, shape)
        assert c.algorithm == "ring"
        assert c.time_s == pytest.approx(collective_time(op, 80e6, inst, shape, algo="ring").time_s)
        assert c.time_s > (1344 * 3e-6 + 191 * 30e-6)          # the ring's hops: 7 x 192 NVLink, 191 fabric
        with pytest.raises(ConfigError, match="does not implement"):
            collective_time(op, 80e6, inst, shape, algo="hierarchical")
    assert collective_time("all-reduce", 80e6, inst, shape).algorithm != "ring"     # tree or hierarchical


def test_pipeline_of_one_stage_is_plain_alpha_beta():
    assert pipelined_s(1000.0, [(2e-6, 1e-9)], chunk_max=64.0) == pytest.approx(2e-6 + 1000 * 1e-9)


def test_pipeline_pays_every_stage_once_and_the_slowest_for_the_rest():
    stages = [(0.0, 1.0), (0.0, 3.0), (0.0, 2.0)]
    # chunk 10 of 100: first chunk crosses all (10·6), the other 90 bytes at the slowest (3)
    assert pipelined_s(100.0, stages, chunk_max=10.0) == pytest.approx(60 + 90 * 3)


def test_double_binary_tree_of_two_nodes_sends_the_buffer_once_each_way():
    assert double_binary_tree(2) == (1.0, 1)


@given(n=st.integers(3, 300))
def test_double_binary_tree_load_is_at_most_twice_the_buffer_and_depth_logarithmic(n):
    load, depth = double_binary_tree(n)
    assert 1.0 <= load <= 2.0
    assert depth == math.floor(math.log2(n))


def test_bus_bandwidth_follows_nccl_tests_definitions():
    inst = make_instance(link_lat=1e-6)
    shape = GroupShape(size=8, per_node=8)
    factors = {"all-reduce": 2 * 7 / 8, "all-gather": 7 / 8, "reduce-scatter": 7 / 8, "all-to-all": 7 / 8,
               "broadcast": 1.0, "send-recv": 1.0}
    for op in OPS:
        c = collective_time(op, GiB, inst, shape)
        assert c.algbw_bytes_per_s == pytest.approx(GiB / c.time_s)
        assert c.busbw_bytes_per_s == pytest.approx(c.algbw_bytes_per_s * factors[op])


def test_skewed_all_to_all_waits_for_the_hottest_rank():
    inst = make_instance()
    shape = GroupShape(size=32, per_node=8)
    uniform = all_to_all_time(GiB, inst, shape)
    assert uniform.time_s == collective_time("all-to-all", GiB, inst, shape).time_s
    # the hottest rank's bytes double; the latency of its sends (NCCL's per-message protocol latency and
    # one post per network peer, fmsim.hardware.dispatch) does not
    skewed = all_to_all_time(GiB, inst, shape, skew=2.0).time_s
    assert uniform.time_s < skewed < 2 * uniform.time_s
    assert skewed == pytest.approx(2 * uniform.time_s, rel=1e-2)
    with pytest.raises(ConfigError, match="skew"):
        all_to_all_time(GiB, inst, shape, skew=0.5)


# ----------------------------------------------------------------------------------------------
# invariants, run against every registered algorithm


@pytest.mark.parametrize("op,algo", PAIRS)
def test_every_collective_costs_nothing_for_a_group_of_one(op, algo):
    for inst, _ in CASES:
        c = collective_time(op, GiB, inst, GroupShape(size=1, per_node=1), algo=algo)
        assert c.time_s == 0.0 and c.busbw_bytes_per_s == 0.0


@pytest.mark.parametrize("op,algo", PAIRS)
@given(a=sizes, b=sizes)
def test_every_collective_is_monotone_in_size(op, algo, a, b):
    lo, hi = sorted((a, b))
    for inst, shape in CASES:
        if applicable(algo, inst, shape):
            t_lo = collective_time(op, lo, inst, shape, algo=algo).time_s
            t_hi = collective_time(op, hi, inst, shape, algo=algo).time_s
            assert t_lo <= t_hi * (1 + 1e-12)


@pytest.mark.parametrize("op,algo", [*PAIRS, *[(op, "auto") for op in OPS]])
@given(size=sizes, link=st.floats(1.0, 16.0), nic=st.floats(1.0, 16.0))
def test_every_collective_is_non_increasing_in_bandwidth(op, algo, size, link, nic):
    for inst, shape in CASES:
        if algo == "auto" or applicable(algo, inst, shape):
            slow = collective_time(op, size, inst, shape, algo=algo).time_s
            fast = collective_time(op, size, scaled(inst, link=link, nic=nic), shape, algo=algo).time_s
            assert fast <= slow * (1 + 1e-12)


@pytest.mark.parametrize("op", OPS)
def test_auto_takes_the_fastest_applicable_algorithm(op):
    for inst, shape in CASES:
        for size in (8.0, MiB, GiB):
            auto = collective_time(op, size, inst, shape)
            for name in algorithms_for(op):
                if applicable(name, inst, shape):
                    assert auto.time_s <= collective_time(op, size, inst, shape, algo=name).time_s


def test_registry_refuses_a_second_algorithm_of_the_same_name():
    with pytest.raises(ValueError, match="already registered"):
        register(Algorithm("ring", ("all-reduce",), lambda *a: 0.0, lambda v: True, "dup"))


def test_unknown_algorithm_lists_the_known_ones():
    with pytest.raises(ConfigError, match="known: auto, ring, tree"):
        collective_time("all-reduce", GiB, make_instance(), GroupShape(size=8, per_node=8), algo="rign")


def test_algorithm_that_does_not_implement_the_op_is_refused():
    with pytest.raises(ConfigError, match="does not implement all-gather"):
        collective_time("all-gather", GiB, make_instance(), GroupShape(size=8, per_node=8), algo="tree")


def test_nvls_is_refused_without_in_switch_reduction():
    with pytest.raises(ConfigError, match="does not apply"):
        collective_time("all-reduce", GiB, make_instance(), GroupShape(size=8, per_node=8), algo="nvls")


def test_unknown_op_and_bad_sizes_are_config_errors():
    inst, shape = make_instance(), GroupShape(size=8, per_node=8)
    with pytest.raises(ConfigError, match="did you mean 'all-reduce'"):
        collective_time("allreduce", GiB, inst, shape)
    with pytest.raises(ConfigError, match="size"):
        collective_time("all-reduce", -1.0, inst, shape)
    with pytest.raises(ConfigError, match="per node"):
        collective_time("all-reduce", GiB, inst, GroupShape(size=32, per_node=16))
    with pytest.raises(ConfigError, match="cluster has 2"):
        collective_time("all-reduce", GiB, inst, GroupShape(size=32, per_node=8), nodes=2)


@pytest.mark.parametrize("kwargs,msg", [({"size": 0, "per_node": 1}, "size"),
                                         ({"size": 4, "per_node": 8}, "exceeds"),
                                         ({"size": 8, "per_node": 4, "per_domain": 2}, "per_domain")])
def test_group_shape_rejects_impossible_groups(kwargs, msg):
    with pytest.raises(ConfigError, match=msg):
        GroupShape(**kwargs)


def test_per_domain_is_derived_from_consecutive_placement_on_multi_node_domains():
    nvl = make_instance(acc=4, nics=4, domain=72, in_switch=True, kind="nvl-domain")
    assert derive_per_domain(nvl, GroupShape(size=16, per_node=4)) == 16
    assert derive_per_domain(nvl, GroupShape(size=144, per_node=4)) == 72
    assert derive_per_domain(nvl, GroupShape(size=36, per_node=1, stride=4)) == 18
    assert derive_per_domain(make_instance(), GroupShape(size=16, per_node=8)) == 8


# ----------------------------------------------------------------------------------------------
# the catalog's fabrics: placement on real instance types and the published nccl-tests


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_a_group_of_16_stays_on_nvlink_on_a_gb200_nvl72_ultraserver_but_crosses_efa_on_p5(catalog):
    gb = catalog.instance("u-p6e-gb200x72")
    p5 = catalog.instance("p5.48xlarge")
    tp_gb = place(gb, 36, {"tp": 16, "dp": 9})["tp"]        # two UltraServers, 144 GPUs
    tp_p5 = place(p5, 18, {"tp": 16, "dp": 9})["tp"]
    assert tp_gb.size == tp_p5.size == 16
    assert [t.name for t in group_view(gb, tp_gb).tiers] == ["node", "domain"]
    assert "fabric" in [t.name for t in group_view(p5, tp_p5).tiers]
    # the NVL72 time does not depend on the EFA; the p5 time does
    c_gb = collective_time("all-reduce", GiB, gb, tp_gb)
    assert c_gb.time_s == collective_time("all-reduce", GiB, scaled(gb, nic=0.01), tp_gb).time_s
    assert collective_time("all-reduce", GiB, scaled(p5, nic=0.01), tp_p5).time_s > \
        collective_time("all-reduce", GiB, p5, tp_p5).time_s
    assert c_gb.algorithm == "nvls"


# S20 aws-samples/awsome-distributed-training @7217859f67bc, as in /work/shared/reference/aws_catalog.md §3c
PUBLISHED = [
    ("p4de.24xlarge", 2, 256 * MiB, 69.89), ("p4de.24xlarge", 2, 1 * GiB, 76.79),
    ("p4de.24xlarge", 2, 2 * GiB, 78.33),
    ("p5.48xlarge", 2, 128 * MiB, 289.16), ("p5.48xlarge", 2, 1 * GiB, 436.95),
    ("p5.48xlarge", 2, 2 * GiB, 443.72), ("p5.48xlarge", 2, 16 * GiB, 487.09),
    ("p5.48xlarge", 1, 16 * GiB, 483.05),
    ("p5en.48xlarge", 16, 16 * GiB, 369.86),
]


@pytest.mark.parametrize("instance,nodes,size,busbw_gbps", PUBLISHED)
def test_published_nccl_tests_all_reduce_bus_bandwidth_is_reproduced_within_10_percent(
        catalog, instance, nodes, size, busbw_gbps):
    inst = catalog.instance(instance)
    shape = GroupShape(size=nodes * inst.num_accelerators, per_node=inst.num_accelerators)
    c = collective_time("all-reduce", size, inst, shape, nodes=nodes)
    assert c.busbw_bytes_per_s / 1e9 == pytest.approx(busbw_gbps, rel=0.10), c


@pytest.mark.parametrize("instance,nodes,time_us", [
    ("p5.48xlarge", 1, 12.9), ("p5.48xlarge", 2, 69.1), ("p4de.24xlarge", 2, 164.3), ("p5en.48xlarge", 16, 166.1)])
def test_published_8_byte_all_reduce_latency_is_reproduced_within_10_percent(catalog, instance, nodes,
                                                                              time_us):
    inst = catalog.instance(instance)
    shape = GroupShape(size=nodes * inst.num_accelerators, per_node=inst.num_accelerators)
    assert collective_time("all-reduce", 8, inst, shape).time_s * 1e6 == pytest.approx(time_us, rel=0.10)


def test_every_catalog_instance_costs_every_collective(catalog):
    for inst in catalog.instances.values():
        for nodes in (1, 2):
            shape = GroupShape(size=nodes * inst.num_accelerators, per_node=inst.num_accelerators)
            for op in OPS:
                c = collective_time(op, 64 * MiB, inst, shape)
                assert 0 < c.time_s < 10 and c.algorithm in ALGORITHMS


def test_fabrics_yaml_has_every_required_entry_with_known_keys_and_a_source(catalog):
    import yaml

    from fmsim.catalog import data_root

    raw = yaml.safe_load((data_root() / "hardware_catalog" / "fabrics.yaml").read_text())
    fabrics = {"efa-v1", "efa-v2", "efa-v3", "efa-v4", "ib-hdr", "ib-ndr", "ib-xdr", "roce-200g"}
    links = {"nvlink3", "nvlink4", "nvlink5", "neuronlink-v2", "neuronlink-v3", "pcie-gen4", "pcie-gen5"}
    assert set(raw["fabrics"]) == fabrics and set(raw["links"]) == links
    fabric_keys = {"kind", "nic_bandwidth", "latency", "efficiency", "ring_efficiency", "in_network_reduction",
                   "source"}
    link_keys = {"latency", "efficiency", "in_switch_reduction", "source"}
    for name, body in raw["fabrics"].items():
        assert set(body) <= fabric_keys and body["kind"] in ("efa", "infiniband", "roce"), name
        assert len(str(body["source"])) > 40, name
        assert catalog.fabric(name).efficiency == body["efficiency"]
        assert catalog.fabric(name).ring_fraction == body.get("ring_efficiency", body["efficiency"])
    for name, body in raw["links"].items():
        assert set(body) <= link_keys and len(str(body["source"])) > 40, name


def test_in_network_reduce_scatter_with_one_member_per_node_is_two_fabric_latencies_plus_the_shard_stream():
    """CollNet (SHARP) reduce-scatter, one member per node: the member streams its whole buffer up the
    switch tree once -- T = 2·α_fabric + S / (per-member fabric bandwidth) -- whatever the node count."""
    inst = make_instance(sharp=True, nics=8, nic_gbps=400.0, fab_lat=5e-6)
    per_member = 8 * 400e9 / 8 / 8                         # one 400 Gb/s NIC per GPU
    for nodes in (16, 448):
        t = collective_time("reduce-scatter", 100 * MiB, inst, GroupShape(size=nodes, per_node=1),
                            algo="collnet").time_s
        assert t == pytest.approx(2 * 5e-6 + 100 * MiB / per_member, rel=1e-9)


def test_in_network_gather_latency_does_not_grow_with_the_domains_where_the_ring_does():
    inst = make_instance(sharp=True, fab_lat=5e-6, link_lat=1e-6)
    small = [collective_time("all-gather", 8, inst, GroupShape(size=2 * k, per_node=2), algo=a).time_s
             for a in ("collnet", "ring") for k in (16, 256)]
    assert small[0] == pytest.approx(small[1], rel=1e-6)   # collnet: 16 vs 256 nodes
    assert small[3] > 10 * small[2]                         # ring: grows with the nodes
    # and the fastest algorithm at scale is the in-network one, which needs the fabric's SHARP
    assert collective_time("reduce-scatter", 100 * MiB, inst, GroupShape(size=896, per_node=2)).algorithm == "collnet"
    plain = make_instance(fab_lat=5e-6, link_lat=1e-6)
    assert collective_time("reduce-scatter", 100 * MiB, plain, GroupShape(size=896, per_node=2)).algorithm != "collnet"
    with pytest.raises(ConfigError, match="collnet"):
        collective_time("reduce-scatter", 100 * MiB, plain, GroupShape(size=896, per_node=2), algo="collnet")
