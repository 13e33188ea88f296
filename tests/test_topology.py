"""The cluster link graph and the placement of parallel groups on ranks."""
from __future__ import annotations

import pytest
from test_collectives import make_instance

from fmsim.catalog import load_catalog
from fmsim.engine.network import FlowNetwork
from fmsim.errors import ConfigError, ParallelismError
from fmsim.hardware.collectives import GroupShape
from fmsim.hardware.topology import Topology, place


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def p5(catalog):
    return catalog.instance("p5.48xlarge")


# ----------------------------------------------------------------------------------------------
# placement


def test_placement_puts_a_tp_group_of_8_inside_one_p5_node(p5):
    shapes = place(p5, 4, {"tp": 8, "dp": 4})
    assert shapes["tp"] == GroupShape(size=8, per_node=8, per_domain=8, stride=1)
    assert shapes["dp"] == GroupShape(size=4, per_node=1, per_domain=1, stride=8)


def test_placement_follows_the_given_order_innermost_first(p5):
    shapes = place(p5, 4, {"tp": 8, "dp": 4}, order=("dp", "tp", "cp", "ep", "pp"))
    assert shapes["dp"] == GroupShape(size=4, per_node=4, per_domain=4, stride=1)
    assert shapes["tp"] == GroupShape(size=8, per_node=2, per_domain=2, stride=4)


def test_placement_of_pipeline_stages_spans_nodes_outermost_by_default(p5):
    # Megatron-Core's default order tp-cp-ep-dp-pp: pipeline stages are the outermost axis
    shapes = place(p5, 16, {"tp": 8, "pp": 4, "dp": 4})
    assert shapes["pp"] == GroupShape(size=4, per_node=1, per_domain=1, stride=32)
    assert shapes["dp"].stride == 8


def test_expert_groups_fold_over_tensor_parallel_ranks_with_expert_tp_1(p5):
    shapes = place(p5, 32, {"tp": 2, "dp": 16, "ep": 32, "pp": 8}, expert_tp=1)
    assert shapes["ep"].size == 32 and shapes["ep"].stride == 1


def test_a_64_wide_group_stays_inside_one_nvl72_rack(catalog):
    gb = catalog.instance("gb200-nvl72")
    shapes = place(gb, 64, {"tp": 1, "ep": 64, "dp": 64, "pp": 4}, expert_tp=1)
    assert shapes["ep"].per_domain == 64


def test_ep_groups_are_carved_out_of_cp_and_dp(p5):
    shapes = place(p5, 8, {"tp": 4, "cp": 2, "dp": 8, "ep": 4})
    # cp inner (stride 4), dp outer (stride 8): EP members are cp0dp0, cp1dp0, cp0dp1, cp1dp1
    assert shapes["ep"].size == 4 and shapes["ep"].stride == 4
    assert shapes["ep"].per_node == 2


def test_placement_rejects_axes_that_do_not_fill_the_cluster(p5):
    with pytest.raises(ParallelismError) as err:
        place(p5, 2, {"tp": 8, "dp": 3})
    assert err.value.field == "parallelism"
    with pytest.raises(ParallelismError) as err:
        place(p5, 4, {"tp": 8, "dp": 4, "ep": 3})
    assert err.value.field == "parallelism.ep"
    with pytest.raises(ConfigError, match="unknown parallel axis"):
        place(p5, 1, {"tp": 8, "xp": 1})
    with pytest.raises(ConfigError, match="positive integer"):
        place(p5, 1, {"tp": 0})


def test_placement_on_nvl72_keeps_a_16_gpu_group_in_one_domain(catalog):
    gb = catalog.instance("u-p6e-gb200x72")
    tp = place(gb, 36, {"tp": 16, "dp": 9})["tp"]
    assert tp == GroupShape(size=16, per_node=4, per_domain=16, stride=1)


# ----------------------------------------------------------------------------------------------
# graph


def test_p5_node_has_an_nvswitch_crossbar_and_32_nics_as_rails(p5):
    topo = Topology.build(p5, 2)
    g = topo.graph
    assert sum(1 for n in g if n[0] == "gpu") == 16
    assert sum(1 for n in g if n[0] == "nic") == 64
    assert g.degree[("nvswitch", 0)] == 8
    assert sum(1 for n in g.neighbors(("gpu", 0)) if n[0] == "nic") == 4       # 32 NICs / 8 GPUs
    # rail-optimized: NIC i of every node on the leaf of rail i
    assert g.has_edge(("nic", 0, 5), ("leaf", 5, 0)) and g.has_edge(("nic", 1, 5), ("leaf", 5, 0))


def test_paths_stay_on_nvlink_inside_a_node_and_cross_the_nic_between_nodes(p5):
    topo = Topology.build(p5, 2)
    assert topo.path(0, 7) == [("gpu", 0), ("nvswitch", 0), ("gpu", 7)]
    assert topo.bottleneck_bytes_per_s(0, 7) == pytest.approx(450e9)
    cross = topo.path(0, 8)
    assert ("nic", 0, 0) in cross and ("nic", 1, 0) in cross
    assert topo.bottleneck_bytes_per_s(0, 8) == pytest.approx(100e9 / 8)
    # another rail: first over NVLink to the GPU on the destination's rail (PXN)
    assert topo.path(0, 9)[:3] == [("gpu", 0), ("nvswitch", 0), ("gpu", 1)]


def test_leaves_join_through_an_oversubscribed_spine(p5):
    topo = Topology.build(p5, 4, oversubscription=2.0, nodes_per_leaf=2)
    path = topo.path(0, 3 * 8)
    assert ("spine",) in path
    leaf, spine = ("leaf", 0, 0), ("spine",)
    assert topo.graph[leaf][spine]["capacity_bytes_per_s"] == pytest.approx(2 * 100e9 / 8 / 2.0)
    assert ("spine",) not in topo.path(0, 8)            # same leaf
    with pytest.raises(ConfigError, match="oversubscription"):
        Topology.build(p5, 2, oversubscription=0.5)


def test_without_rails_a_node_shares_one_leaf(p5):
    topo = Topology.build(p5, 2, rail_optimized=False)
    assert topo.graph.has_edge(("nic", 0, 31), ("leaf", 0, 0))
    assert topo.path(0, 9)[1] == ("nic", 0, 0)           # leaves from its own NIC


def test_trn2_ultraserver_is_a_torus_per_node_and_a_ring_across_its_four_nodes(catalog):
    inst = catalog.instance("trn2u.48xlarge")
    topo = Topology.build(inst, 4)
    g = topo.graph
    torus_nbrs = [n for n in g.neighbors(("gpu", 0)) if n[0] == "gpu" and n[1] < 16]
    assert len(torus_nbrs) == 4                           # 4x4 torus
    assert g.has_edge(("gpu", 0), ("gpu", 16)) and g.has_edge(("gpu", 0), ("gpu", 48))   # ring of 4 nodes
    assert not any(n[0] == "nic" for n in topo.path(0, 63))     # one NeuronLink domain
    assert g[("gpu", 0)][("gpu", 16)]["capacity_bytes_per_s"] == pytest.approx(128e9 / 2)


def test_gb200_nvl72_domain_is_one_switch_across_18_nodes(catalog):
    topo = Topology.build(catalog.instance("u-p6e-gb200x72"), 18)
    assert topo.graph.degree[("nvswitch", 0)] == 72
    assert topo.path(0, 71) == [("gpu", 0), ("nvswitch", 0), ("gpu", 71)]


def test_shared_nics_on_p4d_hang_off_two_gpus(catalog):
    topo = Topology.build(catalog.instance("p4de.24xlarge"), 2)
    assert topo.graph.has_edge(("gpu", 2), ("nic", 0, 1)) and topo.graph.has_edge(("gpu", 3), ("nic", 0, 1))
    assert topo.path(3, 11) == [("gpu", 3), ("nic", 0, 1), ("leaf", 1, 0), ("nic", 1, 1), ("gpu", 11)]


def test_links_of_a_collective_follow_its_placement(p5):
    topo = Topology.build(p5, 2)
    intra = topo.links_for("all-reduce", range(8))
    assert intra and all(u[0] != "nic" and v[0] != "nic" for u, v in intra)
    inter = topo.links_for("all-reduce", range(16))
    assert any(u[0] == "nic" for u, _ in inter)
    a2a = topo.links_for("all-to-all", [0, 8])
    assert set(a2a) == set(topo.path_links(0, 8)) | set(topo.path_links(8, 0))
    assert topo.links_for("send-recv", [3]) == []
    with pytest.raises(ConfigError, match="unknown collective"):
        topo.links_for("gather", [0, 1])


def test_capacities_feed_the_flow_network_in_both_directions(p5):
    import simpy

    topo = Topology.build(p5, 2)
    caps = topo.capacities()
    nic = (("gpu", 0), ("nic", 0, 0))
    assert caps[nic] == caps[(nic[1], nic[0])] == pytest.approx(100e9 / 8 * p5.fabric.efficiency)
    assert topo.capacities(achievable=False)[nic] == pytest.approx(100e9 / 8)
    # two transfers leaving through GPU 0's first NIC share it: twice the time of one
    env = simpy.Environment()
    net = FlowNetwork(env, caps)
    one = topo.path_links(0, 8)
    ends = []

    def send():
        yield net.transfer(one, 1e9)
        ends.append(env.now)

    env.process(send())
    env.process(send())
    env.run()
    assert ends == pytest.approx([2e9 / caps[nic]] * 2)


def test_ranks_outside_the_cluster_are_refused(p5):
    topo = Topology.build(p5, 1)
    with pytest.raises(ConfigError, match="rank 8"):
        topo.path(0, 8)
    with pytest.raises(ConfigError, match="nodes"):
        Topology.build(p5, 0)


def test_ring_topology_chips_form_a_ring():
    inst = make_instance(acc=12, nics=1, topology="ring", kind="neuronlink")
    topo = Topology.build(inst, 1)
    assert len(topo.path(0, 6)) == 7                      # 6 hops either way round
    assert topo.graph.degree[("gpu", 0)] == 3             # two ring neighbours and the NIC
