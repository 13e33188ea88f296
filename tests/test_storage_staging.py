"""How an asynchronous checkpoint reaches host memory (``checkpoint.staging``) and which ranks write it
(``checkpoint.writers``): fmsim/workloads/checkpointing.py, docs/storage.md."""

from __future__ import annotations

import pytest
import yaml

import fmsim
from fmsim.cli import main
from fmsim.hardware.storage import file_system
from fmsim.parallel.strategy import build_plan
from fmsim.scenario import scenario_from_mapping, scenario_to_mapping
from fmsim.workloads.checkpointing import (PAGEABLE_SLOWDOWN, checkpoint_cost, rank_shard_bytes,
                                           total_state_bytes)

from test_storage import BASE, FSX, scenario

HSDP = {"parallelism.tp": 8, "parallelism.pp": 1, "parallelism.zero": 3, "parallelism.dp_shard": 2,
        "parallelism.recompute": "full", "cluster.storage": FSX}


def cost(sc, **kw):
    plan = build_plan(sc)
    fs = file_system(sc.cluster.storage, plan.instance)
    return plan, checkpoint_cost(plan, fs, interval_s=3600.0, shard_width=sc.parallelism.shard_width, **kw)


def test_first_replica_writers_save_the_whole_state_from_fewer_ranks_and_nodes():
    sc = scenario(**HSDP)
    plan = build_plan(sc)
    spread = rank_shard_bytes(plan, shard_width=2)
    first = rank_shard_bytes(plan, shard_width=2, writers="first-replica")
    # the same full state either way (replicated shards written once)
    assert total_state_bytes(plan, shard_width=2, writers="first-replica") == pytest.approx(
        total_state_bytes(plan, shard_width=2))
    # a first-replica rank writes its whole ZeRO shard: dp / dp_shard times a spread rank's part
    assert max(first) == pytest.approx(max(spread) * plan.dp / 2)
    _, all_ranks = cost(sc, async_=False)
    _, one = cost(sc, async_=False, writers="first-replica")
    # fewer writing nodes can never write faster, and each writer's copy to the host takes longer
    assert one.write_s >= all_ranks.write_s and one.copy_s > all_ranks.copy_s


def test_master_only_saves_the_fp32_parameters_and_moments_without_a_bf16_copy():
    plan = build_plan(scenario(**HSDP))
    for writers in ("all", "first-replica"):
        full = total_state_bytes(plan, shard_width=2, writers=writers)
        fsdp = total_state_bytes(plan, shard_width=2, writers=writers, master_only=True)
        assert fsdp == pytest.approx(full * 12.0 / 14.0, rel=1e-6)
        assert fsdp == pytest.approx(12.0 * plan.model.num_params, rel=0.01)


def test_pageable_staging_is_slower_by_the_sourced_factor_and_only_for_the_copy():
    sc = scenario(**HSDP)
    _, pinned = cost(sc, async_=True)
    _, pageable = cost(sc, async_=True, staging="pageable")
    assert pageable.copy_s == pytest.approx(pinned.copy_s * PAGEABLE_SLOWDOWN)
    assert pageable.write_s == pinned.write_s and pageable.total_bytes == pinned.total_bytes
    assert pageable.downtime_s - pinned.downtime_s == pytest.approx(pageable.copy_s - pinned.copy_s)


@pytest.mark.parametrize("step_s", [1e-4, 0.5, 100.0])
def test_overlapped_staging_blocks_only_for_the_copy_the_next_step_does_not_hide(step_s):
    sc = scenario(**HSDP)
    _, pinned = cost(sc, async_=True, contention=False, step_s=step_s)
    _, over = cost(sc, async_=True, contention=False, step_s=step_s, staging="overlapped")
    assert over.copy_s == pinned.copy_s
    assert over.downtime_s == pytest.approx(pinned.downtime_s - min(step_s, pinned.copy_s))
    assert 0.0 <= over.downtime_s <= pinned.downtime_s


def test_the_scenario_fields_reach_the_run_and_round_trip():
    ck = {"every": "1 h", "async": True, "staging": "pageable", "writers": "first-replica",
          "master_only": True}
    sc = scenario(**{**HSDP, "checkpoint": ck})
    assert (sc.checkpoint.staging, sc.checkpoint.writers) == ("pageable", "first-replica")
    back = scenario_from_mapping(scenario_to_mapping(sc), file="t.yaml")
    assert back.checkpoint == sc.checkpoint
    plain = fmsim.estimate(scenario(**{**HSDP, "checkpoint": {"every": "1 h", "async": True}}))
    slow = fmsim.estimate(sc)
    assert slow.details["checkpoint"]["stall_s"] > plain.details["checkpoint"]["stall_s"]


@pytest.mark.parametrize("field,value,message", [
    ("staging", "paged", "'paged' is not valid"),
    ("writers", "rank0", "'rank0' is not valid"),
    ("staging", 3, "not valid"),
])
def test_a_bad_staging_or_writers_value_is_one_located_line_and_exit_2(tmp_path, capsys, field, value,
                                                                       message):
    data = {k: v for k, v in BASE.items() if k != "expect"}
    data["checkpoint"] = {"every": "1 h", "async": True, field: value}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["run", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"{path}: checkpoint.{field}: ") and message in err[0], err[0]


def test_a_checkpoint_of_many_files_is_bounded_by_the_metadata_rate():
    # one create per writing rank plus the .metadata file, against the FSx metadata IOPS
    sc = scenario(**{**HSDP, "cluster.storage": {**FSX, "throughput": "100 TB/s", "metadata_iops": 10}})
    plan, c = cost(sc, async_=False)
    files = plan.tp * plan.cp * plan.dp * plan.pp + 1
    assert c.write_s == pytest.approx(files / 10)
    _, one = cost(sc, async_=False, writers="first-replica")
    assert one.write_s < c.write_s                      # fewer writers, fewer files
    fast = scenario(**{**HSDP, "cluster.storage": {**FSX, "throughput": "100 TB/s", "metadata_iops": 192000}})
    assert cost(fast, async_=False)[1].write_s < c.write_s
