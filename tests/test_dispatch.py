"""MoE dispatch and combine at small messages (issue 28 item 3): NCCL's send/recv protocols, the EFA plugin's
protocol rules, DeepEP's normal and low-latency kernels -- the figures against their sources, and the shape a
dispatch cost must keep (monotone in size, latency-bound when small, bandwidth-bound when large, no faster past
a protocol switch)."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsim.catalog import data_root, load_catalog
from fmsim.errors import ConfigError
from fmsim.hardware.collectives import GroupShape, all_to_all_time
from fmsim.hardware.dispatch import (
    deepep_low_latency_rates,
    deepep_low_latency_s,
    deepep_normal_fractions,
    dispatch_catalog,
    p2p_latency_s,
    p2p_protocol,
    protocol_fraction,
)

CAT = load_catalog()
DC = dispatch_catalog()
RAW = yaml.safe_load((data_root() / "hardware_catalog" / "dispatch.yaml").read_text())
NCCL_TAG = "NVIDIA/nccl v2.30.7-1 (73cf112295c33aee2b895f329f592f2a9b4b0f97)"
OFI = "aws/aws-ofi-nccl"
DEEPEP = "deepseek-ai/DeepEP README.md @de8cfca3cf86464c856f0e393f6a17359ff28c70"
KIB = 1024.0


# ---------------------------------------------------------------------------------------------- sources


def test_every_figure_names_its_source():
    for name, p in DC.protocols.items():
        assert p.source.startswith(NCCL_TAG), name
        assert "tuning.cc" in p.source, name
    assert NCCL_TAG in RAW["nccl_p2p"]["default"]["source"]
    assert "enqueue.cc" in RAW["nccl_p2p"]["default"]["source"]
    for name, f in DC.fabrics.items():
        assert OFI in f.source or f.source.startswith("ASSUMED"), name
    assert DEEPEP in DC.deepep.source


def test_nccls_tuning_constants_are_read_as_printed():
    """tuning.cc ncclTunerConstantsDefaults at v2.30.7-1: baseLatencies Ring {6.6, 14.0, 8.4}; hwLatencies
    NVLINK Ring {0.6, 1.9, 3.4}, PCI Ring {1.0, 2.5, 5.7}, NET Ring {2.7, 4.0, 14.0} (LL, LL128, Simple)."""
    us = 1e-6
    got = {n: (p.base_s / us, p.nvlink_s / us, p.pcie_s / us, p.net_s / us) for n, p in DC.protocols.items()}
    want = {"ll": (6.6, 0.6, 1.0, 2.7), "ll128": (14.0, 1.9, 2.5, 4.0), "simple": (8.4, 3.4, 5.7, 14.0)}
    assert set(got) == set(want)
    for name, figures in want.items():
        assert got[name] == pytest.approx(figures), name
    assert protocol_fraction("ll") == 0.5 and protocol_fraction("simple") == 1.0
    assert DC.ll_threshold == 16384
    assert not DC.protocols["ll128"].point_to_point          # addP2pToPlan: LL or SIMPLE, never LL128


def test_efa_figures_follow_the_plugin():
    """aws-ofi-nccl v1.21.1 tuner: P5/P5e net_lat 20 us, P5en 18 us; Simple +3 us; p4d forced to Simple."""
    f = DC.fabrics
    assert (f["efa-v2"].net_s, f["efa-v3"].net_s) == pytest.approx((20e-6, 18e-6))
    assert all(x.simple_extra_s == pytest.approx(3e-6) for x in f.values())
    assert not f["efa-v1"].ll and f["efa-v2"].ll and f["efa-v3"].ll
    assert f["efa-v2"].post_s == pytest.approx(2e-6)          # p5: AMD EPYC -> getNetOverhead 2 us


def test_deepep_tables_are_the_readmes():
    d = DC.deepep
    assert d.normal_nvlink == {8: (153.0, 158.0)}
    assert d.normal_rdma == {16: (43.0, 43.0), 32: (58.0, 57.0), 64: (51.0, 50.0)}
    assert d.low_latency[8] == (77.0, 98.0, 114.0, 127.0) and d.low_latency[256] == (194.0, 39.0, 360.0, 40.0)
    assert (d.ll_tokens, d.hidden, d.top_k) == (128, 7168, 8)


# ---------------------------------------------------------------------------------------------- protocols


def test_nccl_picks_ll_up_to_16_kib_a_peer_and_simple_above():
    assert p2p_protocol(16 * KIB, None) == "ll"
    assert p2p_protocol(16 * KIB + 1, None) == "simple"
    assert p2p_protocol(1 * KIB, "efa-v2") == "ll"
    assert p2p_protocol(1 * KIB, "ib-ndr") == "ll"
    assert p2p_protocol(1 * KIB, "efa-v1") == "simple"       # p4d: the plugin sets NCCL_PROTO=simple


def test_simple_costs_more_latency_than_ll_on_every_link():
    for link in ("nvlink", "pcie"):
        assert p2p_latency_s("simple", link=link) > p2p_latency_s("ll", link=link)
    for fab in ("efa-v1", "efa-v2", "efa-v3", "efa-v4", "ib-ndr"):
        for peers in (0, 8, 56):
            assert p2p_latency_s("simple", link="nvlink", fabric=fab, remote_peers=peers) > \
                p2p_latency_s("ll", link="nvlink", fabric=fab, remote_peers=peers)


def test_every_remote_peer_costs_a_post():
    one = p2p_latency_s("simple", link="nvlink", fabric="ib-ndr", remote_peers=1)
    many = p2p_latency_s("simple", link="nvlink", fabric="ib-ndr", remote_peers=57)
    assert many - one == pytest.approx(56 * 3 * 1e-6)        # 1 us a post, x3 for Simple (getNetOverhead)


GROUPS = [("p5.48xlarge", 8, 8), ("p5.48xlarge", 16, 8), ("p5.48xlarge", 64, 8), ("p5.48xlarge", 256, 8),
          ("p4d.24xlarge", 32, 8), ("p5en.48xlarge", 64, 8), ("dgx-h100", 128, 8), ("dgx-b200", 8, 8),
          ("gb200-nvl72", 72, 4), ("p5.48xlarge", 8, 1)]


def _a2a(inst: str, ep: int, per_node: int, size: float, **kw) -> float:
    i = CAT.instance(inst)
    return all_to_all_time(size, i, GroupShape(size=ep, per_node=per_node), nodes=-(-ep // per_node), **kw).time_s


@pytest.mark.parametrize("inst,ep,per_node", GROUPS)
def test_no_faster_past_the_protocol_switch(inst, ep, per_node):
    """Just past 16 KiB a peer NCCL leaves LL for Simple: the time jumps up (Simple's latency) or holds, never
    falls."""
    at = _a2a(inst, ep, per_node, 16 * KIB * ep)
    past = _a2a(inst, ep, per_node, (16 * KIB + 1) * ep)
    assert past >= at


@pytest.mark.parametrize("inst,ep,per_node", GROUPS)
def test_latency_bound_when_small_bandwidth_bound_when_large(inst, ep, per_node):
    small = _a2a(inst, ep, per_node, 256.0 * ep)                 # 256 B a peer
    large = _a2a(inst, ep, per_node, 8 * 2**20 * ep)             # 8 MiB a peer
    lat_small = small - _a2a(inst, ep, per_node, 128.0 * ep)     # what halving the bytes saves
    assert lat_small < 0.02 * small                               # the bytes are nothing beside the latency
    assert large > 10 * small
    half = _a2a(inst, ep, per_node, 4 * 2**20 * ep)
    assert large - half > 0.4 * large                             # halving the bytes nearly halves the time


@settings(max_examples=150, deadline=None)
@given(size=st.floats(64.0, 2.0**28), grow=st.floats(1.0, 16.0), g=st.sampled_from(GROUPS),
       kernel=st.sampled_from(["nccl", "deepep"]), skew=st.floats(1.0, 2.0))
def test_monotone_in_message_size(size, grow, g, kernel, skew):
    inst, ep, pn = g
    assert _a2a(inst, ep, pn, size * grow, kernel=kernel, skew=skew) >= \
        _a2a(inst, ep, pn, size, kernel=kernel, skew=skew) * (1 - 1e-12)


def test_unknown_kernel_is_refused():
    with pytest.raises(ConfigError, match="kernel"):
        _a2a("p5.48xlarge", 16, 8, 1e6, kernel="nvshmem")


# ---------------------------------------------------------------------------------------------- DeepEP


def test_deepep_normal_fractions_from_the_table():
    nv, rdma = deepep_normal_fractions(16)
    assert nv == pytest.approx(2 / (1 / 153 + 1 / 158) / 200)
    assert rdma == pytest.approx(43 / 50)
    assert deepep_normal_fractions(64)[1] == 1.0              # 51 / 50 GB/s "logical": held at line rate
    assert deepep_normal_fractions(512) == deepep_normal_fractions(64)
    lo, hi = deepep_normal_fractions(16)[1], deepep_normal_fractions(32)[1]
    assert lo < deepep_normal_fractions(20)[1] <= hi == 1.0       # linear in log2(EP) between the printed sizes


def test_deepep_normal_beats_nccl_between_nodes_at_large_messages():
    for ep in (16, 32, 64):
        size = 4096 * 8 * 7168 * 2.0                           # DeepSeek-V3's pre-training setting, BF16
        assert _a2a("dgx-h100", ep, 8, size, kernel="deepep") < _a2a("dgx-h100", ep, 8, size)


def _ll_bytes(tokens: float, per_element: float) -> float:
    return tokens * 8 * 7168 * per_element                          # hidden 7168, top-8: every (token, expert) copy


def test_deepep_low_latency_reproduces_its_table_at_its_own_setting():
    """On an H800 node (hgx-h800: one ConnectX-7 400 Gb/s per GPU) at 128 tokens, hidden 7168, top-8, the kernel's
    time is the README's latency within 6 % (the bandwidth column over the FP8 / BF16 bytes)."""
    inst = CAT.instance("hgx-h800")
    for ep, (dl, _, cl, _) in DC.deepep.low_latency.items():
        d = deepep_low_latency_s("dispatch", _ll_bytes(128, 1 + 4 / 128), ep, inst)
        c = deepep_low_latency_s("combine", _ll_bytes(128, 2.0), ep, inst)
        assert d == pytest.approx(dl * 1e-6, rel=0.06), ep
        assert c == pytest.approx(cl * 1e-6, rel=0.06), ep


def test_deepep_low_latency_scales_with_bytes_down_to_one_hop_not_nccls_latency():
    inst = CAT.instance("hgx-h800")
    t = [deepep_low_latency_s("dispatch", _ll_bytes(n, 1.03125), 64, inst) for n in (1, 2, 8, 32, 128, 512)]
    assert t == sorted(t)
    assert t[-1] == pytest.approx(4 * t[-2])                     # bandwidth-bound: linear in tokens
    # one token: one hop of the farthest link (the fabric's catalog latency), not NCCL's LL send + posts
    assert t[0] == pytest.approx(inst.fabric.latency_s)
    assert t[0] < p2p_latency_s("ll", link="nvlink", fabric=inst.fabric.name, remote_peers=56)
    disp, comb, floor = deepep_low_latency_rates(64, inst)
    assert floor == inst.fabric.latency_s                      # hgx-h800: 50 GB/s a GPU, the table's own NIC
    assert (disp, comb) == (pytest.approx(43e9), pytest.approx(46e9))   # EP 64: dispatch 43, combine 46 GB/s
    assert deepep_low_latency_s("combine", 0, 64, inst) == 0.0
    with pytest.raises(ConfigError, match="dispatch"):
        deepep_low_latency_s("gather", 1, 64, inst)


# ---------------------------------------------------------------------------------------------- serving


def test_serving_deepep_prices_each_mode_through_deepeps_kernels():
    """``serving.deepep`` is the one way serving reaches DeepEP: low_latency through the low-latency table (calls of
    at most SGLang's 128 tokens a rank), normal through the normal kernels training uses -- neither pays NCCL's
    send/recv latencies, and the engine option ``moe_comm="deepep"`` is gone."""
    from fmsim.model.deepep import exchange_sizes
    from fmsim.model.serving_cost import build_cost_model

    model, inst = CAT.model("deepseek-r1"), CAT.instance("dgx-h100")
    kw = dict(precision="fp8", kv_dtype="bf16", tp=1, ep=16, attention_dp=True)
    low = build_cost_model(model, inst, deepep="low_latency", **kw)
    normal = build_cost_model(model, inst, deepep="normal", **kw)
    nccl = build_cost_model(model, inst, **kw)
    layers = model.num_moe_layers
    assert low.num_all_to_all == 2 * layers
    # decode: 64 tokens a rank, one low-latency call each way per MoE layer (FP8 dispatch, BF16 combine)
    d, c = exchange_sizes("low_latency", tokens_per_rank=64, hidden=model.hidden, top_k=model.moe.top_k, nodes=2)
    per_layer = deepep_low_latency_s("dispatch", d, 16, inst) + deepep_low_latency_s("combine", c, 16, inst)
    assert low.comm_time(64 * 16) == pytest.approx(layers * per_layer, rel=1e-9)
    # 256 tokens a rank: two calls of 128 (SGLang's num_max_dispatch_tokens_per_rank), each at the table's rate
    d2, c2 = exchange_sizes("low_latency", tokens_per_rank=128, hidden=model.hidden, top_k=model.moe.top_k, nodes=2)
    two = 2 * (deepep_low_latency_s("dispatch", d2, 16, inst) + deepep_low_latency_s("combine", c2, 16, inst))
    assert low.comm_time(256 * 16) == pytest.approx(layers * two, rel=1e-9)
    # prefill: 4096 tokens a rank through the normal kernels, over the per-node byte count
    d, c = exchange_sizes("normal", tokens_per_rank=4096, hidden=model.hidden, top_k=model.moe.top_k, nodes=2,
                          groups=model.moe.router_groups or 1, group_topk=model.moe.token_groups())
    shape = GroupShape(size=16, per_node=8)
    per_layer = sum(all_to_all_time(b, inst, shape, nodes=2, kernel="deepep").time_s for b in (d, c))
    assert normal.comm_time(4096 * 16) == pytest.approx(layers * per_layer, rel=1e-9)
    # faster than NCCL's all-to-all of every copy at 16 bits from decode-sized batches up (8 tokens a rank and
    # more; below, DeepEP's one-hop floor, the fabric's catalog latency, exceeds NCCL's LL send: no fixed part of
    # the low-latency kernels is published to set it by)
    for tokens in (128, 1024, 65536):
        assert low.comm_time(tokens) < nccl.comm_time(tokens)
        assert normal.comm_time(tokens) < nccl.comm_time(tokens)
    with pytest.raises(ConfigError, match="moe_comm"):
        build_cost_model(model, inst, moe_comm="deepep", **kw)
