"""Weight sync against checkpoint-engine's published updates (scenarios/validation/rl/ckpt-engine-*.yaml)
and the properties of the host-memory broadcast update (:func:`fmsim.workloads.rl_phases.host_broadcast`).

Issue 26's bar: weight sync median |error| <= 15 %. Not met: on 2026-12-02 the six updates are predicted
25-54 % short (median 44.5 %, worst 54.0 %); docs/rl.md "Weight sync validation" says what is not priced.
The guard below fails if the set gets worse than that plus a small margin; the target is a strict xfail.
"""

from __future__ import annotations

import dataclasses
import statistics
from functools import lru_cache
from pathlib import Path

import pytest

import fmsim
from fmsim.scenario import load_scenario
from fmsim.validate import validate_scenarios
from fmsim.workloads import rl_phases as ph

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "scenarios" / "validation" / "rl").glob("ckpt-engine-*.yaml"))
#: today's level (2026-12-02): median 44.5 %, worst 54.0 % (ckpt-engine-034), every update too short
MEDIAN_BOUND, WORST_BOUND = 46.5, 56.0


@lru_cache(maxsize=1)
def errors() -> tuple[tuple[str, float], ...]:
    rows = validate_scenarios((load_scenario(p) for p in CASES), fmsim.simulate, jobs=1)
    assert not [r.error for r in rows if r.error], [r.error for r in rows if r.error]
    return tuple((r.scenario, r.error_pct) for r in rows if r.error_pct is not None)


def test_every_checkpoint_engine_row_is_a_file_that_validates():
    assert [p.stem for p in CASES] == [f"ckpt-engine-0{i}" for i in range(32, 38)]
    assert len(errors()) == 6


def test_weight_sync_stays_at_todays_level():
    vals = [abs(e) for _, e in errors()]
    assert statistics.median(vals) <= MEDIAN_BOUND and max(vals) <= WORST_BOUND, errors()


@pytest.mark.xfail(strict=True, reason="issue 26 target not met: checkpoint-engine updates predicted 25-54 % short")
def test_weight_sync_meets_the_issue_target():
    assert statistics.median(abs(e) for _, e in errors()) <= 15.0


def _scenario(stem: str = "ckpt-engine-034"):
    return load_scenario(ROOT / "scenarios" / "validation" / "rl" / f"{stem}.yaml")


def _update(sc, bucket: float = 4 * 2**30) -> float:
    return ph.host_broadcast(sc, bucket, gpus=sc.cluster.gpus, nodes=sc.cluster.nodes, engine_gpus=16).time_s


def _with_instance(sc, **changes):
    inst = sc.cluster.instance
    su = changes.pop("scale_up", None)
    if su is not None:
        inst = dataclasses.replace(inst, scale_up=dataclasses.replace(inst.scale_up, **su))
    inst = dataclasses.replace(inst, **changes)
    return dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, instance=inst))


def test_the_update_is_monotone_in_the_bytes_moved():
    sc = _scenario()
    times = []
    for prec in ("fp8", "bf16"):
        times.append(_update(dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, precision=prec))))
    assert times[0] < times[1]
    small = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, model=_scenario("ckpt-engine-032").workload.model))
    assert _update(small) < _update(sc)


@pytest.mark.parametrize("change", [
    {"num_nics": 4},
    {"num_nics": 2},
    {"scale_up": {"bytes_per_s": 200e9}},
    {"scale_up": {"bytes_per_s": 100e9}, "num_nics": 4},
], ids=["4 NICs", "2 NICs", "H800-class NVLink", "both"])
def test_fewer_or_slower_links_never_make_the_update_faster(change):
    sc = _scenario()
    assert _update(_with_instance(sc, **change)) >= _update(sc)


@pytest.mark.parametrize("bucket_gib", [0.25, 1.0, 5.39, 64.0])
def test_the_update_is_bounded_and_priced_for_any_bucket(bucket_gib):
    sc = _scenario()
    hb = ph.host_broadcast(sc, bucket_gib * 2**30, gpus=16, nodes=2, engine_gpus=16)
    import math

    share = hb.weight_bytes / 16
    assert hb.buckets_per_owner == max(1, math.ceil(share / (bucket_gib * 2**30)))
    assert hb.broadcasts == 16 * hb.buckets_per_owner
    # every owner's turn ends with a barrier, and every byte is broadcast once
    assert hb.time_s >= hb.broadcasts * hb.barrier_s + share / min(share, bucket_gib * 2**30) * hb.broadcast_s * 0.99


def test_the_estimate_and_the_simulation_agree_and_the_step_is_the_update():
    sc = _scenario("ckpt-engine-036")
    a, b = fmsim.simulate(sc), fmsim.estimate(sc)
    assert a.get("weight_sync_s") == b.get("weight_sync_s") == a.get("step_time_s") > 0
    assert a.get("generation_tp") == 16 and a.details["engines"] == 16


def test_a_full_rl_step_prices_a_host_broadcast_the_same_way():
    from fmsim.scenario import scenario_from_mapping

    base = {
        "version": 1, "name": "x",
        "workload": {"kind": "rl", "model": "llama3.1-8b", "precision": "bf16"},
        "cluster": {"instance": "p5.48xlarge", "nodes": 1},
        "parallelism": {"tp": 2, "zero": 1},
        "rl": {"prompts": 8, "samples_per_prompt": 2, "response_len": 64, "prompt_len": 64,
               "weight_sync": {"method": "broadcast", "source": "host", "bucket": "1 GiB"}},
    }
    full = fmsim.estimate(scenario_from_mapping(base, file="x.yaml"))
    alone = fmsim.estimate(scenario_from_mapping({**base, "rl": {**base["rl"], "only": "weight_sync"}}, file="x.yaml"))
    assert full.get("weight_sync_s") == pytest.approx(alone.get("weight_sync_s"))
    assert full.get("step_time_s") > alone.get("step_time_s")


def test_an_update_alone_has_a_trace_and_a_row(tmp_path, capsys):
    import json

    from fmsim.cli import main

    trace = tmp_path / "t.json"
    assert main(["run", str(CASES[0]), "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "weight update" in out and "weight_sync_s" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "weight_sync" and e.get("dur", 0) > 0 for e in events)


@pytest.mark.parametrize("source", ["device", "host"])
def test_a_disaggregated_broadcast_is_monotone_in_bytes_and_links(source):
    from fmsim.scenario import scenario_from_mapping
    from fmsim.workloads.rl_spec import parse_rl_spec

    def sync(model="llama3.1-8b", **inst_changes):
        sc = scenario_from_mapping({
            "version": 1, "name": "x", "workload": {"kind": "rl", "model": model, "precision": "bf16"},
            "cluster": {"instance": "p5.48xlarge", "nodes": 3},
            "rl": {"prompts": 8, "samples_per_prompt": 2, "generation": {"tp": 8},
                   "placement": {"disaggregated": {"generation_nodes": 2, "training_nodes": 1}},
                   "weight_sync": {"method": "broadcast", "source": source, "bucket": "1 GiB"}},
        }, file="x.yaml")
        sc = _with_instance(sc, **inst_changes) if inst_changes else sc
        spec = parse_rl_spec(sc.extra, file=sc.file, policy=sc.workload.model)
        ro = ph.draw_rollouts(spec, 0, sc.file)
        gen = ph.build_generation(sc, spec, 16, ro)
        return ph.weight_sync_s(sc, spec, gen=gen, train_gpus=8, gen_nodes=2)[0]

    base = sync()
    assert sync("llama3.1-70b") > base
    assert sync(num_nics=8) >= base and sync(num_nics=8, scale_up={"bytes_per_s": 200e9}) >= sync(num_nics=8)


def test_an_update_whose_buffers_do_not_fit_beside_the_engine_is_refused_naming_them():
    from fmsim.errors import OutOfMemoryError
    from fmsim.scenario import scenario_from_mapping

    def update(bucket):
        return fmsim.simulate(scenario_from_mapping({
            "version": 1, "name": "x", "workload": {"kind": "rl", "model": "kimi-k2", "precision": "fp8"},
            "cluster": {"instance": "hgx-h20", "nodes": 2}, "pricing": {"usd_per_hour": 0.0001},
            "rl": {"only": "weight_sync", "generation": {"tp": 16},
                   "weight_sync": {"method": "broadcast", "source": "host", "bucket": bucket}},
        }, file="x.yaml"))

    ok = update("8 GiB")
    assert ok.get("fits") and ok.memory["update_buffers"] == 3 * 8 * 2**30
    with pytest.raises(OutOfMemoryError) as exc:
        update("13 GiB")
    assert "rl.weight_sync.bucket" in str(exc.value) and "3 buffers" in str(exc.value)
    assert exc.value.breakdown["update_buffers"] == 3 * 13 * 2**30
