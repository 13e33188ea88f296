"""HybridEP, the flex dispatcher's GB200/GB300 backend (``parallelism.ep_dispatch: hybridep``): its GB200 table
(deepseek-ai/DeepEP hybrid-ep Hybrid-EP_Implementation.md @83e0d156, 32 SMs, Torch API), the bytes it moves (one
copy per token and destination rank, tests/test_hybrid_ep.py @29b4d6f5) and where fmsim refuses it."""
from __future__ import annotations

from pathlib import Path

import pytest

import fmsim
from fmsim.errors import ParallelismError
from fmsim.hardware.collectives import GroupShape, all_to_all_time
from fmsim.hardware.dispatch import dispatch_catalog, hybridep_fraction
from fmsim.model.ops import Roofline, Shard, consecutive_nodes, distinct_nodes, moe_mlp_forward
from fmsim.parallel.strategy import build_plan

ROOT = Path(__file__).resolve().parent.parent
GB200_DSV3 = ROOT / "scenarios" / "validation" / "training" / "mb2511-gb200-04.yaml"


def _hmean(a: float, b: float) -> float:
    return 2.0 / (1.0 / a + 1.0 / b)


def test_table_is_the_readmes_gb200_rows_at_32_sms():
    h = dispatch_catalog().hybridep
    assert (h.tokens, h.hidden, h.top_k, h.local_experts, h.sms) == (4096, 7168, 8, 8, 32)
    assert h.nvlink_line_gbps == 900
    # README "GB200 Platform", SM Count 32, Torch API: Dispatch (BF16), Combine
    assert h.nvlink[32] == (484.22, 464.54)
    assert h.nvlink[36] == (479.02, 447.89)
    assert "83e0d156" in h.source


def test_fraction_is_the_harmonic_mean_over_nvlink5_line_rate():
    assert hybridep_fraction(32) == pytest.approx(_hmean(484.22, 464.54) / 900)   # 0.5269
    assert hybridep_fraction(8) == pytest.approx(_hmean(545.71, 568.94) / 900)
    # beyond the printed sizes the ends hold (the table stops at 36 ranks)
    assert hybridep_fraction(64) == hybridep_fraction(36) == pytest.approx(_hmean(479.02, 447.89) / 900)
    assert hybridep_fraction(2) == hybridep_fraction(8)


def test_fraction_never_rises_with_the_ep_size():
    sizes = list(range(2, 73))
    fr = [hybridep_fraction(n) for n in sizes]
    assert all(a >= b for a, b in zip(fr, fr[1:]))


def test_all_to_all_time_is_the_bytes_over_the_tables_rate_plus_one_hop():
    inst = fmsim.load_catalog().instance("gb200-nvl72")
    shape = GroupShape(size=32, per_node=4, per_domain=32)
    size = 4096 * 6.0 * 7168 * 2
    t = all_to_all_time(size, inst, shape, kernel="hybridep").time_s
    line = inst.scale_up.bytes_per_s                  # NVLink 5, 900 GB/s per GPU per direction
    assert line == pytest.approx(900e9)
    expect = 31 / 32 * size / (hybridep_fraction(32) * line)   # the peers' share of the received bytes
    assert expect < t < expect + 20e-6                # one NVLink hop on top, none of NCCL's protocol latencies
    t2 = all_to_all_time(2 * size, inst, shape, kernel="hybridep").time_s
    assert t2 - t == pytest.approx(expect, rel=1e-9)  # linear in the bytes


def _a2a(dispatch: str, *, ep: int = 64, routing: str = "balanced") -> list:
    model = fmsim.load_catalog().model("deepseek-v3")
    rf = Roofline.of(fmsim.load_catalog().accelerator("gb200"), "bf16")
    sh = Shard(micro_batch=1, seq_len=4096, ep=ep, ep_dispatch=dispatch, moe_routing=routing)
    return [r for r in moe_mlp_forward(model, sh, rf).comms if r.axis == "ep"]


def test_training_sends_each_token_once_per_destination_rank():
    flat = _a2a("alltoall")
    hyb = _a2a("hybridep")
    assert len(hyb) == 2 and all(r.line_rate and r.kernel == "hybridep" for r in hyb)
    assert all(not r.line_rate for r in flat)
    every_copy = 4096 * 8 * 7168 * 2
    assert flat[0].size_bytes == every_copy
    # DeepSeek-V3's group-limited routing (8 groups, top 4) over 64 ranks of 4 experts: 7.14 distinct ranks of 8
    assert hyb[0].size_bytes == pytest.approx(every_copy * distinct_nodes(64, 8, 8, 4) / 8)
    assert distinct_nodes(64, 8, 8, 4) == pytest.approx(32 * (1 - (31 / 32) ** 8))
    # AutoModel's consecutive gate: a token's 8 experts sit on two ranks of 4
    assert _a2a("hybridep", routing="consecutive")[0].size_bytes == pytest.approx(
        every_copy * consecutive_nodes(64, 8, 256) / 8)
    # the backward repeats them on the same kernel
    from fmsim.model.ops import backward_of, PassCost
    fwd = PassCost(comms=hyb)
    assert all(r.kernel == "hybridep" and r.line_rate for r in backward_of(fwd).comms)


def test_plan_prices_the_gb200_row_with_hybridep_and_refuses_it_elsewhere():
    sc = fmsim.load_scenario(GB200_DSV3)
    assert sc.parallelism.ep_dispatch == "hybridep"
    hyb = fmsim.estimate(sc)
    nccl = fmsim.estimate(fmsim.load_scenario(GB200_DSV3, overrides={"parallelism.ep_dispatch": "alltoall"}))
    assert hyb.breakdown["comm_ep"] > 0 and nccl.breakdown["comm_ep"] > 0
    # DGX-B200 has an 8-GPU NVSwitch: Megatron-Bridge applies HybridEP on GB200/GB300 NVL72 only
    with pytest.raises(ParallelismError, match="ep_dispatch.*nvl-domain|ep_dispatch.*NVL72"):
        build_plan(fmsim.load_scenario(GB200_DSV3, overrides={"cluster.instance": "dgx-b200",
                                                               "parallelism.ep": 8}))
    # an EP group wider than one NVL72 domain: no table of HybridEP's RDMA path
    with pytest.raises(ParallelismError, match="ep_dispatch.*spans"):
        build_plan(fmsim.load_scenario(GB200_DSV3, overrides={"parallelism.ep": 128, "parallelism.pp": 2}))
