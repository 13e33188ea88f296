"""``workload.moe_imbalance`` on serving: the busiest expert-parallel rank's routed rows and its DeepEP / all-to-all
bytes set an attention-DP MoE engine's pace (fmsim.model.serving_cost, fmsim.model.tbo, fmsim.model.deepep); 1.0 is
the balanced model, bit for bit; the reader refuses it where no rank carries more than the mean."""
from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path

import pytest
import yaml

import fmsim
from fmsim.band import UNKNOWN, band
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.model.deepep import exchange_sizes, layer_times_fn
from fmsim.model.serving_cost import IterationWork, build_cost_model
from fmsim.scenario import scenario_from_mapping, scenario_to_mapping
from fmsim.workloads.inference import plan_from_scenario

ROOT = Path(__file__).resolve().parent.parent
VAL = ROOT / "scenarios" / "validation" / "inference"
PREFILL, DECODE, TRTLLM = VAL / "inf-113.yaml", VAL / "inf-116.yaml", VAL / "inf-093.yaml"
IMB = "workload.moe_imbalance"
LOADS = (1.0, 1.02, 1.1, 1.25, 1.5, 2.0, 3.0)


def _cost(path: Path, load: float | None = None, **overrides):
    ov = dict(overrides)
    if load is not None:
        ov[IMB] = load
    return plan_from_scenario(fmsim.load_scenario(path, overrides=ov)).pools[0].cost


def _prefill_work(tokens: int = 524_288, prompt: int = 1024) -> IterationWork:
    return IterationWork(tokens=tokens, logits=tokens // prompt, prefill_pairs=tokens * (prompt + 1) / 2.0)


def _decode_work(seqs: int, ctx: float = 2050.0) -> IterationWork:
    return IterationWork(tokens=seqs, logits=seqs, decode_seqs=seqs, decode_ctx=seqs * ctx)


def test_an_imbalance_of_one_is_the_balanced_model_bit_for_bit():
    for path in (PREFILL, DECODE, TRTLLM):
        plain, one = fmsim.load_scenario(path), fmsim.load_scenario(path, overrides={IMB: 1.0})
        assert one.workload.moe_imbalance == 1.0
        assert fmsim.estimate(one).to_dict() == fmsim.estimate(plain).to_dict(), path.name
    a, b = _cost(DECODE), _cost(DECODE, 1.0)
    w = _decode_work(256 * 72)
    assert a.iteration_time(w) == b.iteration_time(w) and a.breakdown(w) == b.breakdown(w)


@pytest.mark.parametrize("path, work, tbo", [
    (PREFILL, _prefill_work(), True),                        # DeepEP normal, two-batch overlap, prefill stages
    (DECODE, _decode_work(256 * 72), True),                  # DeepEP low-latency, two-batch overlap, decode stages
    (PREFILL, _prefill_work(), False),                       # DeepEP normal, serial
    (TRTLLM, _decode_work(300 * 8), False),                  # TensorRT-LLM: all-gather exchange, serial
])
def test_the_step_never_speeds_up_as_the_busiest_rank_takes_more(path, work, tbo):
    times = []
    for load in LOADS:
        cost = _cost(path, load, **({} if tbo else {"serving.two_batch_overlap": False}))
        assert cost.two_batch_overlap is tbo
        times.append(cost.iteration_time(work))
    assert all(b >= a for a, b in itertools.pairwise(times)), times
    assert times[LOADS.index(1.5)] > times[0] * 1.01        # both paths respond, by more than rounding


def test_only_the_routed_experts_and_their_exchange_move():
    base, hot = _cost(PREFILL, 1.0), _cost(PREFILL, 1.5)
    w = _prefill_work()
    (d0, e0, x0, l0, a0, k0), (d1, e1, x1, l1, a1, k1) = base.compute_pieces(w), hot.compute_pieces(w)
    assert (d1, l1, a1, k1) == (d0, l0, a0, k0)               # non-expert GEMMs (shared experts too), LM head,
    assert x1 > x0 * 1.4 and e1 > e0                         # attention, KV writes unchanged; experts and the
    assert hot.comm_time(w.tokens) == pytest.approx(1.5 * base.comm_time(w.tokens), rel=0.02)   # permutes move
    disp0, comb0 = base.deepep_parts(16_384)
    disp1, comb1 = hot.deepep_parts(16_384)
    assert disp1 > disp0 and comb1 > comb0


def test_the_busiest_rank_s_experts_run_at_their_larger_rows_not_a_flat_multiple():
    # decode rows per expert sit near one tile: twice the rows fill the tiles better, so the hot rank's grouped
    # GEMMs take less than twice the time (kernels.routed_grouped_gemm_efficiency with load=2)
    base, hot = _cost(DECODE, 1.0), _cost(DECODE, 2.0)
    tokens = 64 * 72
    _, _, x0, _ = base.linear_pieces(tokens, tokens)
    _, _, x1, _ = hot.linear_pieces(tokens, tokens)
    assert hot.expert_efficiency(tokens) > base.expert_efficiency(tokens)
    assert x0 < x1 < 2.0 * x0


def test_deepep_prices_the_busiest_rank_s_bytes_and_keeps_its_call_count():
    kw = {"tokens_per_rank": 4096, "hidden": 7168, "top_k": 8, "nodes": 4, "groups": 8, "group_topk": 4}
    d0, c0 = exchange_sizes("normal", **kw)
    d1, c1 = exchange_sizes("normal", load=1.5, **kw)
    assert (d1, c1) == (pytest.approx(1.5 * d0), pytest.approx(1.5 * c0))
    inst = load_catalog().instance("dgx-h100")
    ll = {"hidden": 7168, "top_k": 8, "nodes": 9, "groups": 8, "group_topk": 4}
    t0 = layer_times_fn("low_latency", inst, **ll)(256, 72)
    t1 = layer_times_fn("low_latency", inst, load=1.5, **ll)(256, 72)
    # two calls of 128 tokens either way; each call's bytes over the table's rates
    assert t1[0] == pytest.approx(1.5 * t0[0]) and t1[1] == pytest.approx(1.5 * t0[1])


def test_the_cost_model_refuses_an_imbalance_without_experts_spread_over_ranks():
    cat = load_catalog()
    model, inst = cat.model("deepseek-v3"), cat.instance("dgx-h100")
    with pytest.raises(ConfigError, match="attention-DP"):
        build_cost_model(model, inst, precision="fp8", kv_dtype="bf16", tp=8, moe_imbalance=1.2)
    with pytest.raises(ConfigError, match=">= 1"):
        build_cost_model(model, inst, precision="fp8", kv_dtype="bf16", tp=1, ep=8, attention_dp=True,
                         moe_imbalance=0.9)


@pytest.mark.parametrize("path, overrides, field, says", [
    (ROOT / "scenarios/examples/serving-llama3.1-70b-chat-p5.yaml", {IMB: 1.2}, IMB, "which has no experts"),
    (DECODE, {IMB: 1.2, "parallelism.ep": 1, "serving.two_batch_overlap": False, "serving.deepep": "none",
              "serving.attention_dp": False, "parallelism.tp": 8, "cluster.nodes": 9}, IMB, "with ep: 1"),
    (DECODE, {IMB: 0.9}, IMB, ">= 1"),
    (TRTLLM, {IMB: 1.2, "serving.attention_dp": False}, IMB, "attention-DP ranks"),
    (DECODE, {"workload.moe_capacity_factor": 1.25}, "workload.moe_capacity_factor", "training kinds only"),
    (ROOT / "scenarios/examples/rl-deepseek-v3-disagg-p6-b200.yaml", {IMB: 1.2}, IMB, "not 'rl'"),
])
def test_a_misplaced_imbalance_is_one_located_line(path, overrides, field, says):
    with pytest.raises(ConfigError) as err:
        sc = fmsim.load_scenario(path, overrides=overrides)
        fmsim.estimate(sc)
    assert err.value.field == field and says in err.value.message, str(err.value)
    assert err.value.file and "\n" not in str(err.value)


def test_the_cli_refuses_a_bad_imbalance_with_exit_two(capsys):
    assert main(["run", str(DECODE), "--estimate", "--set", f"{IMB}=0.5"]) == 2
    err = capsys.readouterr().err
    assert "workload.moe_imbalance" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_imbalance_survives_the_round_trip_through_a_mapping():
    sc = fmsim.load_scenario(DECODE, overrides={IMB: 1.3})
    assert scenario_from_mapping(scenario_to_mapping(sc)).workload.moe_imbalance == 1.3


def _with_unknown(path: Path, values: list[float]) -> dict:
    data = yaml.safe_load(path.read_text())
    conf = data["configuration"]
    conf = copy.deepcopy(conf) if isinstance(conf, dict) else {"partial": "test"}
    conf["unknown"] = {IMB: values}
    data["configuration"] = conf
    return data


def test_a_listed_imbalance_widens_the_band_to_the_slower_side():
    data = yaml.safe_load(DECODE.read_text())
    plain = band(scenario_from_mapping(data, file=str(DECODE)))
    listed_sc = scenario_from_mapping(_with_unknown(DECODE, [1.0, 1.3]), file=str(DECODE))
    assert listed_sc.configuration_unknown == {IMB: (1.0, 1.3)}
    listed = band(listed_sc)
    key = IMB + UNKNOWN
    assert key in listed.varied and key not in listed.refused
    lo, hi = listed.swings[key]
    m = listed.headline
    assert lo < listed.point[m] == hi                         # the busier rank only slows the engine
    assert listed.low[m] < plain.low[m] and listed.high[m] >= plain.high[m]
    assert listed.point[m] == plain.point[m]


def test_an_unknown_imbalance_value_the_field_refuses_is_located():
    with pytest.raises(ConfigError) as err:
        scenario_from_mapping(_with_unknown(DECODE, [1.0, 0.8]), file="f.yaml")
    assert err.value.field == f"configuration.unknown.{IMB}[1]" and "refuses this value" in err.value.message


def test_a_replaced_cost_model_keeps_the_imbalance():
    # two-batch overlap's prefill GEMMs run on the SMs DeepEP leaves (dataclasses.replace): the load goes with them
    cost = _cost(PREFILL, 1.5)
    assert dataclasses.replace(cost, compute_units=cost.compute_units - 20).moe_imbalance == 1.5


def test_the_deepseek_ep_rows_list_the_sourced_imbalances_and_the_band_takes_them():
    # inf-113..116: TensorRT-LLM tech blog 4 Table 1's EPLB imbalance at 288 slots (EP32, EP36), 1 the point
    for name in ("inf-113", "inf-116"):
        sc = fmsim.load_scenario(VAL / f"{name}.yaml")
        assert sc.workload.moe_imbalance == 1.0
        assert sc.configuration_unknown == {IMB: (1.0, 1.109, 1.115)}
        b = band(sc)
        key = IMB + UNKNOWN
        assert key in b.varied and key not in b.refused
        lo, hi = b.swings[key]
        assert lo < b.point[b.headline] == hi, name


def test_test_time_compute_samples_run_at_the_busiest_rank_s_pace_and_its_verifier_keeps_the_mean():
    # kind inference with a test_time_compute section (best-of-4 and a dense verifier): the MoE engines take the
    # stated load, the verifier (another model, ep 1) is built balanced
    data = yaml.safe_load(TRTLLM.read_text())
    data["traffic"]["requests"] = 64
    data["test_time_compute"] = {"samples": 4, "strategy": "best-of-n",
                                 "verifier": {"model": "llama3.1-8b", "precision": "fp8", "tp": 1, "replicas": 1,
                                              "output_len": 1}}
    data["cluster"]["nodes"] = 2
    rates = []
    for load in (1.0, 1.5):
        sc = scenario_from_mapping(copy.deepcopy(data), overrides={IMB: load})
        plan = plan_from_scenario(sc)
        roles = {p.role: p.cost.moe_imbalance for p in plan.pools}
        assert roles == {"verifier": 1.0, "serve": load}
        rates.append(fmsim.estimate(sc).to_dict()["output_tokens_per_s"])
    assert rates[1] < rates[0]
