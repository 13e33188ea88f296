"""Storage as a resource (fmsim/hardware/storage.py), data loading, sharded checkpoints and the
located errors of the storage-related sections (docs/storage.md)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

import fmsim
from fmsim.cli import main
from fmsim.parallel.strategy import build_plan
from fmsim.scenario import scenario_from_mapping, scenario_to_mapping
from fmsim.workloads.checkpointing import rank_shard_bytes, total_state_bytes

BASE = yaml.safe_load((Path(__file__).parent / "data" / "llama3-70b-p5.yaml").read_text())
FSX = {"kind": "fsx-lustre", "tier": "fsx-lustre-persistent-2-250", "capacity": "100 TiB"}


def scenario(**changes):
    data = copy.deepcopy(BASE)
    data.pop("expect", None)
    data["reliability"] = None
    data["checkpoint"] = None
    for path, value in changes.items():
        node = data
        *head, last = path.split(".")
        for part in head:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    data = {k: v for k, v in data.items() if v is not None}
    return scenario_from_mapping(data, file="t.yaml")


@pytest.mark.parametrize("layout", [
    {"parallelism.tp": 8, "parallelism.pp": 4, "parallelism.zero": 1},
    {"parallelism.tp": 8, "parallelism.pp": 4, "parallelism.zero": 0},
    {"parallelism.tp": 8, "parallelism.pp": 1, "parallelism.zero": 3, "parallelism.dp_shard": 8,
     "parallelism.recompute": "full"},
    {"parallelism.tp": 4, "parallelism.pp": 8, "parallelism.zero": 1, "parallelism.dp_shard": 2},
])
def test_checkpoint_shards_sum_to_the_full_training_state_over_the_ranks(layout):
    sc = scenario(**layout)
    plan = build_plan(sc)
    shard = sc.parallelism.shard_width if plan.zero else None
    ranks = rank_shard_bytes(plan, shard_width=shard)
    total = total_state_bytes(plan, shard_width=shard)
    assert total == pytest.approx(sum(r * plan.tp * plan.cp * plan.dp for r in ranks))
    # bf16 weights + fp32 master weights and Adam moments: 14 B per parameter, saved once
    assert total == pytest.approx(14.0 * plan.model.num_params, rel=0.01)
    # ZeRO-1 shards the optimizer state: a rank saves less than its stage's full state
    if plan.zero >= 1:
        assert max(ranks) < plan.memory[0].weights + plan.memory[0].optimizer


def test_a_faster_file_system_never_lowers_goodput():
    rel = {"fleet": "llama3-405b-h100", "restart": "10 min", "run_length": "5 days", "trials": 40}
    out = []
    for tier in ("fsx-lustre-persistent-2-125", "fsx-lustre-persistent-2-250", "fsx-lustre-persistent-2-500",
                 "fsx-lustre-persistent-2-1000"):
        sc = scenario(**{"cluster.storage": {**FSX, "tier": tier, "capacity": "20 TiB"},
                         "checkpoint": {"every": "30 min"}, "reliability": rel})
        out.append(fmsim.estimate(sc).metrics["goodput"])
    assert out == sorted(out) and out[0] < out[-1]


@pytest.mark.parametrize("small,large", [("10 TiB", "20 TiB"), ("20 TiB", "200 TiB"), ("1 TiB", "1000 TiB")])
def test_a_larger_file_system_never_shortens_a_checkpoint_by_more_than_its_throughput_allows(small, large):
    def write(cap):
        sc = scenario(**{"cluster.storage": {**FSX, "capacity": cap}, "checkpoint": {"every": "30 min"}})
        return fmsim.estimate(sc).metrics["checkpoint_write_s"], sc.cluster.storage["capacity"]
    (w1, c1), (w2, c2) = write(small), write(large)
    assert w2 <= w1
    assert w2 >= w1 * c1 / c2 * (1 - 1e-9)


def test_the_seeded_run_is_deterministic_and_the_seed_matters():
    ch = {"cluster.storage": FSX, "checkpoint": {"every": "1 h"},
          "reliability": {"restart": "10 min", "run_length": "20 days", "trials": 30}}
    a, b = fmsim.estimate(scenario(**ch)), fmsim.estimate(scenario(**ch))
    c = fmsim.estimate(scenario(seed=7, **ch))
    keys = ("goodput", "expected_interruptions", "goodput_p10", "goodput_p90")
    assert [a.metrics[k] for k in keys] == [b.metrics[k] for k in keys]
    assert a.details["checkpoint"]["interval_curve"] == b.details["checkpoint"]["interval_curve"]
    assert a.metrics["expected_interruptions"] != c.metrics["expected_interruptions"]
    # 16 nodes x 20 days at Llama 3's per-component rates: about 16 x 20 x 0.0038 = 1.2 interruptions
    assert 0.5 < a.metrics["expected_interruptions"] < 2.5
    assert a.metrics["goodput_p10"] <= a.metrics["goodput"] <= 1.0


def test_interruptions_scale_with_the_cluster_and_the_override():
    ch = {"checkpoint": {"every": "1 h"}, "cluster.storage": FSX}
    base = {"restart": "10 min", "run_length": "10 days", "trials": 50}
    one = fmsim.estimate(scenario(**ch, reliability=base)).metrics["expected_interruptions"]
    gpu_heavy = fmsim.estimate(scenario(**ch, reliability={**base, "rates": {"gpu": 0.01}}))
    assert gpu_heavy.metrics["expected_interruptions"] > 5 * one
    # 128 GPUs x 10 days x 0.01 = 12.8 GPU interruptions on top of the rest
    assert gpu_heavy.metrics["expected_interruptions"] == pytest.approx(12.8 + one, rel=0.3)


def test_v1_reliability_fields_keep_working_and_round_trip():
    sc = scenario(**{"cluster.storage": FSX, "checkpoint": {"every": "30 min", "async": True},
                     "reliability": {"node_mtbf": "1000 h", "restart": "10 min"}})
    res = fmsim.estimate(sc)
    assert res.details["checkpoint"]["failures_per_s"] == pytest.approx(16 / 3.6e6)
    assert res.metrics["expected_interruptions"] == pytest.approx(
        16 / 3.6e6 * res.details["checkpoint"]["wall_s"], rel=0.15)
    back = scenario_from_mapping(scenario_to_mapping(sc), file="t.yaml")
    assert back.reliability == sc.reliability and back.checkpoint == sc.checkpoint


def test_the_new_sections_round_trip_through_the_canonical_mapping():
    sc = scenario(**{"cluster.storage": {**FSX, "efa": False, "metadata_iops": 24000},
                     "checkpoint": {"every": "20 min", "async": True, "grads": True, "keep": 3},
                     "reliability": {"restart": "5 min", "fleet": "meta-rsc1-a100", "rates": {"all": 0.01},
                                     "run_length": "7 days", "trials": 17},
                     "data": {"sample_bytes": "2 MB", "prefetch": 0, "samples_per_file": 500}})
    back = scenario_from_mapping(scenario_to_mapping(sc), file="t.yaml")
    assert (back.cluster.storage, back.checkpoint, back.reliability, back.data) == (
        sc.cluster.storage, sc.checkpoint, sc.reliability, sc.data)
    assert sc.data.sample_bytes == 2e6 and sc.reliability.run_length_s == 7 * 86400


def test_the_simulated_best_interval_sits_near_young_and_daly():
    sc = scenario(**{"cluster.storage": {**FSX, "capacity": "10 TiB"}, "checkpoint": {"every": "3 h"},
                     "reliability": {"restart": "10 min", "run_length": "30 days", "rates": {"gpu": 0.002},
                                     "trials": 60}})
    det = fmsim.estimate(sc).details["checkpoint"]
    young, daly, best = det["young_interval_s"], det["daly_interval_s"], det["best_interval_s"]
    assert young and daly and best
    assert 0.5 * young < best < 2.0 * young
    curve = dict((iv, g) for iv, g in det["interval_curve"])
    assert curve[best] == max(curve.values())


def test_data_loading_stalls_when_the_file_system_cannot_keep_up_and_not_otherwise():
    video = {"sample_bytes": "400 MB", "prefetch": 2}
    small = {**FSX, "tier": "fsx-lustre-persistent-2-125", "capacity": "2.4 TiB"}
    slow = fmsim.estimate(scenario(data=video, **{"cluster.storage": small}))
    fast = fmsim.estimate(scenario(data=video, **{"cluster.storage": {**small, "capacity": "2000 TiB"}}))
    local = fmsim.estimate(scenario(data={**video, "source": "local"}, **{"cluster.storage": small}))
    text = fmsim.estimate(scenario(data={"bytes_per_token": "4 B"}, **{"cluster.storage": small}))
    nostall = fmsim.estimate(scenario())
    # 2,048 samples x 400 MB = 819 GB per step over 2.4 TiB x 125 MB/s/TiB = 330 MB/s
    read = 2048 * 400e6 / (2.4 * 125e6)
    assert slow.details["data_loading"]["read_s"] == pytest.approx(read, rel=1e-6)
    assert slow.metrics["step_time_s"] == pytest.approx(read, rel=1e-6)   # prefetch: the read is the step
    assert slow.metrics["data_stall_share"] > 0.9 and slow.breakdown["data_stall"] > 0
    assert 0 <= fast.metrics["data_stall_share"] < slow.metrics["data_stall_share"]
    assert local.metrics["data_stall_share"] == 0 == text.metrics["data_stall_share"]
    assert text.metrics["step_time_s"] == nostall.metrics["step_time_s"]
    assert nostall.metrics["data_stall_share"] is None
    no_prefetch = fmsim.estimate(scenario(data={"bytes_per_token": "4 B", "prefetch": 0},
                                          **{"cluster.storage": small}))
    assert no_prefetch.metrics["step_time_s"] > nostall.metrics["step_time_s"]


def test_an_efa_file_system_shares_the_nics_with_the_collectives_in_the_engine():
    ck = {"every": "30 min", "async": True}
    big = {**FSX, "capacity": "2000 TiB"}
    sc = scenario(**{"cluster.storage": big, "checkpoint": ck, "parallelism.tp": 4, "parallelism.pp": 2})
    des = fmsim.simulate(sc)
    assert des.details["checkpoint"]["slowdown_beside_write"] > 1.0
    no_efa = scenario(**{"cluster.storage": {**big, "efa": False}, "checkpoint": ck, "parallelism.tp": 4,
                         "parallelism.pp": 2})
    plain = fmsim.simulate(no_efa)
    assert plain.details["checkpoint"]["slowdown_beside_write"] == 1.0
    # without EFA the client is the node's one ENA-capable NIC: slower writes
    assert plain.metrics["checkpoint_write_s"] > des.metrics["checkpoint_write_s"]


def test_s3_checkpoints_are_bounded_by_the_request_rate_and_priced_with_their_requests():
    s3 = {"kind": "s3", "tier": "s3-standard", "prefixes": 1}
    sc = scenario(**{"cluster.storage": s3, "checkpoint": {"every": "1 h", "keep": 2}})
    res = fmsim.estimate(sc)
    total = res.details["checkpoint"]["bytes"]
    assert res.metrics["checkpoint_write_s"] == pytest.approx(total / (3500 * 16 * 2**20), rel=1e-6)
    wide = fmsim.estimate(scenario(**{"cluster.storage": {**s3, "prefixes": 100},
                                      "checkpoint": {"every": "1 h"}}))
    assert wide.metrics["checkpoint_write_s"] < res.metrics["checkpoint_write_s"]
    assert res.metrics["storage_usd"] > 0


def test_fsx_storage_dollars_are_capacity_times_price_times_the_run():
    st = {**FSX, "tier": "fsx-lustre-persistent-2-125"}
    res = fmsim.estimate(scenario(**{"cluster.storage": st, "checkpoint": {"every": "1 h"}}))
    months = res.metrics["time_to_train_s"] / 3600 / 730
    assert res.metrics["storage_usd"] == pytest.approx(100 * 2**40 / 1e9 * 0.145 * months, rel=1e-9)
    unpriced = fmsim.estimate(scenario(**{"cluster.storage": FSX, "checkpoint": {"every": "1 h"}}))
    assert unpriced.metrics["storage_usd"] is None      # the 250 MB/s/TiB tier has no sourced price


BAD = [
    ({"data": {"prefetch": -1}}, "data.prefetch", "less than 0"),
    ({"data": {"source": "nfs"}}, "data.source", "'nfs' is not valid"),
    ({"data": {"bytes_per_token": "4 B", "sample_bytes": "1 MB"}}, "data.sample_bytes", "not both"),
    ({"data": {"sample_bytes": "-3 MB"}}, "data.sample_bytes", "must be > 0"),
    ({"data": {"sampels": 3}}, "data.sampels", "unknown key"),
    ({"data": 7}, "data", "expected a mapping"),
    ({"cluster.storage": {**FSX, "tier": "fsx-lustre-scratch-2-200", "efa": True}}, "cluster.storage.efa",
     "PERSISTENT_2"),
    ({"cluster.storage": {**FSX, "prefixes": 0}}, "cluster.storage.prefixes", "less than 1"),
    ({"cluster.storage": {**FSX, "throughput": "fast"}}, "cluster.storage.throughput", ""),
    ({"reliability": {"restart": "10 min", "fleet": "meta-rsc3"}}, "reliability.fleet",
     "unknown failure-rate"),
    ({"reliability": {"restart": "10 min", "rates": {"gpu": -1}}}, "reliability.rates.gpu", ">= 0"),
    ({"reliability": {"restart": "10 min", "node_mtbf": "100 h", "fleet": "meta-rsc-a100"}},
     "reliability.node_mtbf", "not both"),
    ({"reliability": {"restart": "10 min", "trials": 0}}, "reliability.trials", "less than 1"),
    ({"checkpoint": {"every": "1 h", "keep": 0}}, "checkpoint.keep", "less than 1"),
]


@pytest.mark.parametrize("change,field,message", BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_malformed_storage_sections_give_one_located_line_and_exit_2(tmp_path, capsys, change, field,
                                                                     message):
    data = copy.deepcopy(BASE)
    data.pop("expect", None)
    for path, value in change.items():
        node = data
        *head, last = path.split(".")
        for part in head:
            node = node[part]
        node[last] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["lint", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"{path}: {field}: ") and message in err[0], err[0]


def test_a_bad_fleet_rate_in_a_reliability_override_names_the_component():
    with pytest.raises(fmsim.ConfigError, match="reliability.rates.gpux"):
        fmsim.estimate(scenario(**{"reliability": {"restart": "1 min", "rates": {"gpux": 0.1},
                                                   "run_length": "1 day"}}))


def test_the_bundled_large_run_prints_its_storage_and_failure_figures(capsys):
    example = Path(__file__).resolve().parents[1] / "scenarios/examples/llama3.1-405b-p5en-storage.yaml"
    assert main(["run", "--estimate", str(example)]) == 0
    out = capsys.readouterr().out
    for text in ("storage and failures", "data loading", "stall", "checkpoint", "interruptions",
                 "expected (p10", "goodput           p10", "storage_usd", "$"):
        assert text in out, text


def test_a_restore_reads_the_checkpoint_back_and_a_slower_file_system_recovers_slower():
    rel = {"restart": "10 min", "run_length": "10 days", "trials": 40, "rates": {"gpu": 0.002}}
    fast = fmsim.estimate(scenario(**{"cluster.storage": {**FSX, "capacity": "1000 TiB"},
                                      "checkpoint": {"every": "1 h"}, "reliability": rel}))
    slow = fmsim.estimate(scenario(**{"cluster.storage": {**FSX, "capacity": "5 TiB"},
                                      "checkpoint": {"every": "1 h"}, "reliability": rel}))
    f, s = fast.details["checkpoint"], slow.details["checkpoint"]
    assert 0 < f["restore_s"] < s["restore_s"]
    # the same seeded interruptions: each costs the restart plus the restore
    assert s["restart_restore_s"] - f["restart_restore_s"] == pytest.approx(
        (s["restore_s"] - f["restore_s"]) * s["interruptions"], rel=0.35)
    assert slow.metrics["goodput"] < fast.metrics["goodput"]


def test_data_reads_over_efa_share_the_nics_in_the_engine():
    video = {"sample_bytes": "20 MB"}
    big = {**FSX, "capacity": "2000 TiB"}
    lay = {"parallelism.tp": 4, "parallelism.pp": 2}
    efa = fmsim.simulate(scenario(data=video, **{"cluster.storage": big}, **lay))
    ena = fmsim.simulate(scenario(data=video, **{"cluster.storage": {**big, "efa": False}}, **lay))
    assert efa.breakdown.get("data_stall", 0.0) > 0.0
    assert any("over EFA" in n for n in efa.details["data_loading"]["notes"])
    assert not any("over EFA" in n for n in ena.details["data_loading"]["notes"])


def test_every_catalog_fleet_parses_with_a_source_and_llama3s_rates_rebuild_table_5():
    from fmsim.workloads.reliability import fleet_rates

    fleets = fmsim.load_catalog().extra["failure_rates"]
    assert {"llama3-405b-h100", "meta-rsc-a100", "meta-rsc1-a100", "meta-rsc2-a100"} <= set(fleets)
    for name in fleets:
        rates, source = fleet_rates(name)
        assert rates and source
    rates, _ = fleet_rates("llama3-405b-h100")
    units = {"gpu": 16384 * 54, "node": 2048 * 54, "nic": 8 * 2048 * 54}
    counts = {c: rate * units[u] for c, (u, rate) in rates.items()}
    assert sum(counts.values()) == pytest.approx(419, abs=0.5)       # Table 5's unexpected interruptions
    assert counts["gpu"] + counts["hbm"] == pytest.approx(148 + 72 + 19 + 17 + 6 + 6, abs=0.5)


def test_a_run_too_flaky_to_replay_stays_bounded_and_says_so():
    sc = scenario(**{"cluster.storage": FSX, "checkpoint": {"every": "1 h"},
                     "reliability": {"restart": "10 min", "rates": {"gpu": 1.0}}})
    res = fmsim.estimate(sc)          # 128 GPU failures a day against hourly checkpoints: no progress
    notes = " ".join(res.details["checkpoint"]["notes"])
    assert "renewal closed form" in notes and "faster than the run can make progress" in notes
    assert 0 <= res.metrics["goodput"] < 0.05 and res.metrics["expected_interruptions"] > 1e6
