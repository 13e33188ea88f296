"""Hybrid sharding (``parallelism.dp_shard``): ZeRO over a shard group, replicas across the groups."""
from __future__ import annotations

from pathlib import Path

import pytest

import fmsim
from fmsim.errors import ParallelismError
from fmsim.hardware.collectives import GroupShape, collective_time
from fmsim.parallel.strategy import _hybrid_groups, _local_trainable, build_plan
from fmsim.scenario import scenario_from_mapping, scenario_to_mapping

ROOT = Path(__file__).resolve().parent.parent
BASE = {
    "version": 1, "name": "fsdp",
    "workload": {"kind": "pretrain", "model": "llama3-8b", "precision": "bf16", "seq_len": 8192,
                 "global_batch": 512, "micro_batch": 1},
    "parallelism": {"tp": 1, "pp": 1, "dp": "auto", "zero": 3, "recompute": "full"},
    "cluster": {"instance": "p5.48xlarge", "nodes": 32},
}


def scenario(**par):
    data = {**BASE, "parallelism": {**BASE["parallelism"], **par}}
    return scenario_from_mapping(data)


def test_a_shard_group_of_all_of_dp_is_plain_zero():
    plain, full = fmsim.simulate(scenario()), fmsim.simulate(scenario(dp_shard=256))
    assert full.metrics == plain.metrics
    assert scenario(dp_shard=256).parallelism.dp_shard == 0          # stored as "all of dp"


def test_the_shard_and_replica_groups_split_the_data_parallel_group_where_its_ranks_sit():
    dp = GroupShape(size=256, per_node=8, per_domain=8, stride=1)
    inner, outer = _hybrid_groups(dp, 8)
    assert (inner.size, inner.per_node, inner.stride) == (8, 8, 1)          # one node
    assert (outer.size, outer.per_node, outer.stride) == (32, 1, 8)         # one member per node
    inner, outer = _hybrid_groups(dp, 32)
    assert (inner.size, inner.per_node) == (32, 8) and (outer.size, outer.per_node) == (8, 1)
    inner, outer = _hybrid_groups(dp, 4)
    assert (inner.size, inner.per_node) == (4, 4) and (outer.size, outer.per_node, outer.stride) == (64, 2, 4)


def test_gathers_run_over_the_shard_group_and_each_bucket_adds_an_all_reduce_across_replicas():
    sc = scenario(dp_shard=32)
    plan, full = build_plan(sc), build_plan(scenario())
    inst, w = sc.cluster.instance, sc.workload
    dense, expert = _local_trainable(w.model, w, list(range(w.model.layers)), True, True, pp=1, tp=1, ep=1, etp=1)
    nb = len(plan.dp_buckets[0])
    assert nb == len(full.dp_buckets[0]) == round((dense + expert) / sc.parallelism.grad_bucket)
    bucket_bytes = (dense + expert) / nb * 4.0                   # fp32 gradients (bf16 run, Megatron's default)
    shard, reps = GroupShape(size=32, per_node=8), GroupShape(size=8, per_node=1, stride=32)
    rs = collective_time("reduce-scatter", bucket_bytes, inst, shard).time_s
    ar = collective_time("all-reduce", bucket_bytes / 32, inst, reps).time_s
    assert plan.dp_buckets[0][0] == pytest.approx(rs + ar, rel=1e-9)
    assert plan.dp_gather_s[0] < full.dp_gather_s[0]             # a 32-rank ring, not a 256-rank one
    assert plan.dp_cross_node


def test_a_smaller_shard_group_holds_more_state_per_gpu_and_stops_fitting():
    mems = {w: fmsim.simulate(scenario(dp_shard=w)).get("memory_per_gpu_bytes") for w in (256, 64, 8, 1)}
    assert mems[256] < mems[64] < mems[8] < mems[1]
    one = fmsim.simulate(scenario(dp_shard=1))                   # nothing sharded: 16 B per parameter
    assert one.memory["optimizer"] == pytest.approx(12.0 * 8.03e9, rel=0.01)
    assert fmsim.simulate(scenario(dp_shard=8)).get("fits") and not one.get("fits")


def test_hybrid_sharding_inside_the_node_beats_a_full_shard_over_thousands_of_ranks():
    # a reduce-scatter ring over every rank pays a hop per rank (NCCL has no two-level form of it);
    # a shard group inside the node pays 7 NVLink hops and all-reduces a 1/8 shard across nodes
    big = {"cluster": {"instance": "p5.48xlarge", "nodes": 256}, "workload": {**BASE["workload"], "global_batch": 2048}}
    full = fmsim.simulate(scenario_from_mapping({**BASE, **big}))
    hsdp = fmsim.simulate(scenario_from_mapping({**BASE, **big,
                                                      "parallelism": {**BASE["parallelism"], "dp_shard": 8}}))
    assert hsdp.get("step_time_s") < full.get("step_time_s")
    assert hsdp.breakdown["comm_dp"] < full.breakdown["comm_dp"]
    assert "sharded data-parallel traffic: hybrid sharding" in full.details["bottleneck"]     # the advice names it


@pytest.mark.parametrize("par, says", [
    ({"dp_shard": 7}, "7 does not divide dp = 256"),
    ({"dp_shard": 8, "zero": 0}, "expected zero >= 1"),
    ({"dp_shard": "half"}, "expected auto or an integer"),
    ({"dp_shard": 0}, "expected an integer >= 1"),
])
def test_a_bad_shard_group_is_refused_in_one_line_naming_the_field(par, says):
    with pytest.raises(fmsim.FmsimError) as err:
        scenario(**par)
    assert "parallelism.dp_shard" in str(err.value) and says in str(err.value) and "\n" not in str(err.value)


def test_hybrid_sharding_of_expert_parallel_weights_is_refused():
    data = {**BASE, "workload": {**BASE["workload"], "model": "mixtral-8x7b"},
            "parallelism": {**BASE["parallelism"], "ep": 8, "dp_shard": 8}}
    with pytest.raises(ParallelismError, match="parallelism.dp_shard.*ep"):
        scenario_from_mapping(data)


def test_the_shard_group_survives_the_round_trip_through_a_mapping():
    sc = scenario(dp_shard=32)
    again = scenario_from_mapping(scenario_to_mapping(sc))
    assert again.parallelism.dp_shard == 32
    assert "dp_shard" not in scenario_to_mapping(scenario())["parallelism"]


def test_the_cli_refuses_a_bad_shard_group_with_exit_code_2(tmp_path, capsys):
    from fmsim.cli import main
    path = ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml"
    assert main(["run", str(path), "--set", "parallelism.dp_shard=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "parallelism.dp_shard: 3 does not divide dp" in err


def test_the_gradient_bucket_sets_how_many_reduce_scatters_pay_the_rings_latency():
    small, large = build_plan(scenario()), build_plan(scenario(grad_bucket="500M"))
    assert len(large.dp_buckets[0]) == round(len(small.dp_buckets[0]) * 40 / 500)
    assert sum(large.dp_buckets[0]) < sum(small.dp_buckets[0])          # fewer latencies, the same bytes
    assert fmsim.simulate(scenario(grad_bucket="500M")).get("step_time_s") < fmsim.simulate(scenario()).get("step_time_s")
    again = scenario_from_mapping(scenario_to_mapping(scenario(grad_bucket="500M")))
    assert again.parallelism.grad_bucket == 500_000_000
    with pytest.raises(fmsim.FmsimError, match="parallelism.grad_bucket: 1000 is less than 1000000.*or unit"):
        scenario(grad_bucket=1000)


def test_a_bucket_per_layer_reduces_each_unit_as_pytorch_fsdp_does():
    sc = scenario(grad_bucket="unit")
    plan, inst, w = build_plan(sc), sc.cluster.instance, sc.workload
    layers = w.model.layers
    assert len(plan.dp_buckets[0]) == layers + 1                          # every block, then embedding + head
    layer, _ = _local_trainable(w.model, w, [0], False, False, pp=1, tp=1, ep=1, etp=1)
    rs = collective_time("reduce-scatter", layer * 4.0, inst, GroupShape(size=256, per_node=8)).time_s
    assert plan.dp_buckets[0][0] == pytest.approx(rs, rel=1e-9)
    assert sum(plan.dp_buckets[0]) < sum(build_plan(scenario()).dp_buckets[0])     # 33 latencies, not 201
    again = scenario_from_mapping(scenario_to_mapping(sc))
    assert again.parallelism.grad_bucket == 0 and scenario_to_mapping(sc)["parallelism"]["grad_bucket"] == "unit"
    with pytest.raises(fmsim.FmsimError, match="cannot read 'layers' as a count; or unit"):
        scenario(grad_bucket="layers")


def test_megatron_buckets_grow_with_the_data_parallel_group_as_megatron_core_sizes_them():
    """``grad_bucket: megatron`` is Megatron-Core's default, max(40M, 1M x dp): 256 ranks -> 256M parameters."""
    zero1 = {"zero": 1, "recompute": "none"}
    sc = scenario(grad_bucket="megatron", **zero1)
    plan, at40 = build_plan(sc), build_plan(scenario(**zero1))
    w = sc.workload
    dense, _ = _local_trainable(w.model, w, list(range(w.model.layers)), True, True, pp=1, tp=1, ep=1, etp=1)
    assert len(plan.dp_buckets[0]) == max(1, round(dense / 256_000_000))
    assert len(at40.dp_buckets[0]) == round(dense / 40_000_000)
    small = scenario_from_mapping({**BASE, "parallelism": {**BASE["parallelism"], **zero1, "grad_bucket": "megatron"},
                                   "cluster": {"instance": "p5.48xlarge", "nodes": 2}})
    assert build_plan(small).dp_buckets == build_plan(scenario_from_mapping(
        {**BASE, "parallelism": {**BASE["parallelism"], **zero1}, "cluster": {"instance": "p5.48xlarge", "nodes": 2}}
    )).dp_buckets                                                        # 16 ranks: the 40M floor
    assert scenario_to_mapping(sc)["parallelism"]["grad_bucket"] == "megatron"
    assert scenario_from_mapping(scenario_to_mapping(sc)).parallelism.grad_bucket == sc.parallelism.grad_bucket
