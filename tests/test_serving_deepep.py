"""DeepEP's MoE exchange in the serving cost model (``serving.deepep``, fmsim.model.deepep)."""
from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from fmsim.catalog import load_catalog
from fmsim.errors import ConfigError
from fmsim.model.deepep import COMBINE_BYTES, FP8_DISPATCH_BYTES, copies_per_token, exchange_sizes
from fmsim.model.serving_cost import build_cost_model
from fmsim.workloads.inference_spec import parse_serving

ROOT = Path(__file__).resolve().parent.parent
CAT = load_catalog()
DSV3 = CAT.model("deepseek-v3")
DEEPEP = ROOT / "hardware_catalog" / "measurements" / "h800_deepep.csv"


def test_low_latency_sends_a_copy_per_expert_and_normal_one_per_remote_node():
    assert copies_per_token("low_latency", top_k=8, nodes=9) == 8
    assert copies_per_token("normal", top_k=8, nodes=1) == 8            # inside a node: NVLink, every copy
    free = copies_per_token("normal", top_k=8, nodes=4)
    grouped = copies_per_token("normal", top_k=8, nodes=4, groups=8, group_topk=4)
    assert 2.0 < grouped < free < 8                                        # 4 nodes: at most 3 remote + local
    # the copies crossing the network (all but the k/N that stay on the node) grow with the nodes
    remote = [copies_per_token("normal", top_k=8, nodes=n, groups=8, group_topk=4) - 8 / n for n in (2, 4, 8, 16)]
    assert remote == sorted(remote)
    with pytest.raises(ValueError):
        copies_per_token("auto", top_k=8, nodes=4)


def test_dispatch_in_fp8_with_its_scales_and_combine_in_bf16():
    d, c = exchange_sizes("low_latency", tokens_per_rank=128, hidden=7168, top_k=8, nodes=8)
    assert d == pytest.approx(128 * 8 * 7168 * FP8_DISPATCH_BYTES)
    assert c == pytest.approx(128 * 8 * 7168 * COMBINE_BYTES)
    d16, c16 = exchange_sizes("low_latency", tokens_per_rank=128, hidden=7168, top_k=8, nodes=8, fp8_dispatch=False)
    assert d16 == c16 == c
    assert exchange_sizes("normal", tokens_per_rank=0, hidden=7168, top_k=8, nodes=4) == (0.0, 0.0)
    a = exchange_sizes("normal", tokens_per_rank=1000, hidden=7168, top_k=8, nodes=4)
    b = exchange_sizes("normal", tokens_per_rank=2000, hidden=7168, top_k=8, nodes=4)
    assert b[0] == pytest.approx(2 * a[0]) and b[1] == pytest.approx(2 * a[1])


def _engine(deepep: str, nodes: int = 4):
    return build_cost_model(DSV3, CAT.instance("dgx-h100"), precision="fp8", kv_dtype="bf16", tp=1, ep=8 * nodes,
                            attention_dp=True, deepep=deepep)


def test_deepep_moves_less_than_every_copy_at_16_bits_and_normal_least():
    tokens = 32 * 4096.0
    none, low, normal = (_engine(m).comm_time(tokens) for m in ("none", "low_latency", "normal"))
    assert normal < low < none
    # communication grows with the tokens, never falls
    e = _engine("normal")
    ts = [e.comm_time(x) for x in (256.0, 4096.0, 65536.0, 524288.0)]
    assert ts == sorted(ts) and ts[0] > 0


def test_deepep_leaves_a_tp_engine_and_a_dense_model_alone():
    tp = build_cost_model(DSV3, CAT.instance("dgx-h100"), precision="fp8", kv_dtype="bf16", tp=8, deepep="normal")
    assert tp.deepep == "none"
    dense = build_cost_model(CAT.model("llama3.1-8b"), CAT.instance("dgx-h100"), precision="fp8", kv_dtype="bf16",
                             tp=1, ep=8, attention_dp=True, deepep="normal")
    assert dense.deepep == "none"
    with pytest.raises(ConfigError, match="deepep"):
        _engine("auto")


def test_the_low_latency_exchange_is_deepeps_table_not_nccls_send_recv():
    """DeepEP's low-latency kernels on H800 (one ConnectX-7 per GPU), DeepSeek-V3 at 128 tokens a rank: the serving
    engine's dispatch + combine per MoE layer is the catalog's table (README @de8cfca3, hardware_catalog/dispatch.yaml)
    within 6 % at every EP size, and 0.6-1.02 x the initial release's (@ebfe47e4, h800_deepep.csv, EP 16-256, whose
    smaller EP sizes ran slower before the kernels used NVLink inside a node). No NCCL send/recv latency: at one
    token a rank a call costs one hop of the fabric, not NCCL's LL send plus a post per remote peer."""
    from fmsim.hardware.dispatch import dispatch_catalog

    inst = CAT.instance("hgx-h800")
    table = dispatch_catalog().deepep.low_latency
    with DEEPEP.open() as fh:
        rows = [r for r in csv.DictReader(line for line in fh if not line.startswith("#"))]
    first = {}
    for r in rows:
        if r["kernel"] == "low_latency":
            first[int(r["ep"])] = first.get(int(r["ep"]), 0.0) + float(r["latency_us"]) * 1e-6
    ratios = []
    for ep in sorted(table):
        e = build_cost_model(DSV3, inst, precision="fp8", kv_dtype="bf16", tp=1, ep=ep, attention_dp=True,
                             deepep="low_latency")
        assert e.deepep_layer is not None
        t = sum(e.deepep_layer(128, ep))
        assert t == pytest.approx((table[ep][0] + table[ep][2]) * 1e-6, rel=0.06), ep
        if ep > 8:
            ratios.append(t / first[ep])
        assert sum(e.deepep_layer(1, ep)) == pytest.approx(2 * max(tier.latency_s for tier in
                                                              _tiers(inst, ep)))
    assert len(ratios) == 5
    assert 0.6 <= min(ratios) and max(ratios) <= 1.05
    assert 0.85 <= statistics.median(ratios) <= 1.0


def _tiers(inst, ep):
    from fmsim.hardware.collectives import GroupShape, group_view

    return group_view(inst, GroupShape(size=ep, per_node=min(ep, inst.num_accelerators))).tiers


def test_the_scenario_field_names_file_field_and_rule():
    assert parse_serving({"attention_dp": True, "deepep": "low_latency"}, "x.yaml").deepep == "low_latency"
    assert parse_serving({}, "x.yaml").deepep == "none"
    with pytest.raises(ConfigError, match=r"x\.yaml: serving\.deepep: normal needs attention_dp: true"):
        parse_serving({"deepep": "normal"}, "x.yaml")
    with pytest.raises(ConfigError, match=r"serving\.deepep"):
        parse_serving({"attention_dp": True, "deepep": "fast"}, "x.yaml")
