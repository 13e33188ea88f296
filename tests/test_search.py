"""Training plan search: variants, pruning, ranking, caching, executors (fmsim.search, docs/search.md)."""
from __future__ import annotations

import itertools
import math
import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fmsim
from fmsim.errors import ConfigError, FmsimError
from fmsim.scenario import load_scenario, plan_cluster, scenario_from_mapping, scenario_to_mapping, with_plan
from fmsim.search.rank import pareto_frontier
from fmsim.search.space import AXES, plan_dict

EXAMPLE = "scenarios/examples/llama3-70b-p5.yaml"
SMALL = {"tp": (4, 8), "pp": (1, 2, 4), "vpp": (1, 2), "micro_batch": (1, 3), "zero": (1, 3),
         "recompute": ("selective", "full")}


@pytest.fixture(scope="module")
def sc():
    return load_scenario(EXAMPLE)


@pytest.fixture(scope="module")
def small(sc):
    """A small search over two instance types and two node counts, no cache, no DES re-check."""
    return fmsim.search(sc, instances=("p5.48xlarge", "p5en.48xlarge"), nodes=(8, 16),
                        pricing=("on-demand", "capacity-block"), axes=SMALL, top=0, cache_dir=False)


def _overrides(key) -> dict:
    """The ``--set`` overrides that give plan ``key`` from the example file (what a user would write)."""
    p = plan_dict(key)
    return {"cluster.instance": p["instance"], "cluster.nodes": p["nodes"], "parallelism.tp": p["tp"],
            "parallelism.pp": p["pp"], "parallelism.vpp": p["vpp"], "parallelism.cp": p["cp"],
            "parallelism.ep": p["ep"], "workload.micro_batch": p["micro_batch"],
            "parallelism.zero": p["zero"], "parallelism.recompute": p["recompute"],
            "parallelism.offload_activations": p["offload_activations"],
            "parallelism.schedule": "interleaved" if p["vpp"] > 1 else "1f1b", "parallelism.dp": "auto",
            "expect": None}


# ------------------------------------------------------------------------------------------------
# with_plan: the reader's own checks, cheaply


def test_with_plan_equals_loading_the_changed_file(sc):
    """A variant is accepted or refused exactly as the file with those values, with the same message."""
    base = scenario_to_mapping(sc)
    for tp, pp, vpp, mb, nodes in itertools.product((3, 4, 8), (1, 3, 4), (1, 2), (1, 3), (8, 12)):
        m = scenario_to_mapping(sc)
        m["cluster"]["nodes"] = nodes
        m["workload"]["micro_batch"] = mb
        m["parallelism"].update(tp=tp, pp=pp, vpp=vpp, dp="auto",
                                schedule="interleaved" if vpp > 1 else "1f1b")
        try:
            want = scenario_from_mapping(m, file=sc.file)
        except ConfigError as exc:
            want = exc
        try:
            got = with_plan(sc, nodes=nodes, micro_batch=mb, tp=tp, pp=pp, vpp=vpp)
        except ConfigError as exc:
            got = exc
        if isinstance(want, Exception):
            assert isinstance(got, type(want)) and str(got) == str(want), (tp, pp, vpp, mb, nodes)
        else:
            assert got == want, (tp, pp, vpp, mb, nodes)
    assert base == scenario_to_mapping(sc)     # the base scenario is untouched


@given(tp=st.sampled_from((1, 2, 3, 4, 8, 16)), pp=st.sampled_from((1, 2, 4, 5, 80, 81)),
       vpp=st.sampled_from((1, 2, 3)), cp=st.sampled_from((1, 2, 3)), mb=st.sampled_from((1, 2, 3, 128)),
       zero=st.sampled_from((0, 1, 2, 3)), recompute=st.sampled_from(("none", "selective", "full")),
       offload=st.sampled_from((0, 1, 80)), instance=st.sampled_from(("p5.48xlarge", "p4d.24xlarge",
                                                                        "trn2.48xlarge")),
       nodes=st.sampled_from((1, 2, 3, 8)))
def test_with_plan_is_the_reader_on_any_plan(tp, pp, vpp, cp, mb, zero, recompute, offload, instance, nodes):
    """Property: for any plan, with_plan and loading the mapping with those values agree (value or message)."""
    sc = _EXAMPLE_SC
    m = scenario_to_mapping(sc)
    m["cluster"] = {**m["cluster"], "instance": instance, "nodes": nodes}
    m["workload"]["micro_batch"] = mb
    par = m["parallelism"]
    par.pop("recompute_modules", None)
    par.pop("recompute_layers", None)
    par.update(tp=tp, pp=pp, vpp=vpp, cp=cp, dp="auto", zero=zero, recompute=recompute,
               offload_activations=offload, schedule="interleaved" if vpp > 1 else "1f1b")
    try:
        want = scenario_from_mapping(m, file=sc.file)
    except ConfigError as exc:
        want = exc
    try:
        got = with_plan(sc, instance=instance, nodes=nodes, micro_batch=mb, tp=tp, pp=pp, vpp=vpp, cp=cp,
                        zero=zero, recompute=recompute, offload_activations=offload)
    except ConfigError as exc:
        got = exc
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want)
    else:
        assert got == want


_EXAMPLE_SC = load_scenario(EXAMPLE)


def test_with_plan_checks_cluster_precision_and_pricing(sc):
    c = plan_cluster(sc, instance="p5en.48xlarge", nodes=4)
    v = with_plan(sc, cluster=c, tp=8, pp=1, vpp=1, pricing="capacity-block")
    assert (v.cluster.instance.name, v.cluster.gpus, v.parallelism.dp, v.pricing.option) == \
        ("p5en.48xlarge", 32, 4, "capacity-block")
    with pytest.raises(ConfigError, match="pricing"):
        with_plan(sc, pricing="spot-ish")
    with pytest.raises(ConfigError, match="did you mean"):
        with_plan(sc, tpp=2)
    fp8 = load_scenario(EXAMPLE, overrides={"workload.precision": "fp8"})
    with pytest.raises(ConfigError, match="workload.precision: fp8 is not supported"):
        with_plan(fp8, instance="p4d.24xlarge", tp=8, pp=1, vpp=1)


def test_plan_variants_answer_as_with_plan_every_time(sc):
    """PlanVariants keeps each micro-batch's workload and each cluster's precision check: a variant it
    derives equals with_plan's, and a refusal it has kept is raised again with the same message."""
    from fmsim.scenario.variants import PlanVariants

    fp8 = load_scenario(EXAMPLE, overrides={"workload.precision": "fp8"})
    pv = PlanVariants(fp8)
    a100 = plan_cluster(fp8, instance="p4d.24xlarge", nodes=4)
    h100 = plan_cluster(fp8, instance="p5.48xlarge", nodes=4)
    messages = []
    for _ in range(3):
        with pytest.raises(ConfigError) as info:
            pv.derive(cluster=a100, micro_batch=1, tp=8, pp=1, vpp=1)
        messages.append(str(info.value))
    assert len(set(messages)) == 1 and "workload.precision: fp8 is not supported" in messages[0]
    with pytest.raises(ConfigError) as direct:
        with_plan(fp8, cluster=a100, micro_batch=1, tp=8, pp=1, vpp=1)
    assert str(direct.value) == messages[0]
    for mb in (1, 2, 1):
        got = pv.derive(cluster=h100, micro_batch=mb, tp=8, pp=2, vpp=1)
        assert got == with_plan(fp8, cluster=h100, micro_batch=mb, tp=8, pp=2, vpp=1)
        assert got.workload.micro_batch == mb


def test_deal_keeps_groups_whole_and_chunks_alike():
    from fmsim.search.executors import MAX_CHUNK, TASKS_PER_WORKER, _worker_chunks, deal

    groups = [[(g, i) for i in range(1 + g % 5)] for g in range(23)]
    chunks = deal(groups, 4)
    assert len(chunks) == 4
    assert sorted(k for c in chunks for k in c) == sorted(k for g in groups for k in g)
    for c in chunks:       # each group lies whole in one chunk, in order
        for g in {k[0] for k in c}:
            assert [k for k in c if k[0] == g] == groups[g]
    assert deal(groups[:2], 8) == [groups[0], groups[1]]
    assert deal([], 3) == []
    big = [[(g, i) for i in range(100)] for g in range(60)]
    assert len(_worker_chunks(big, 1)) == max(TASKS_PER_WORKER, -(-6000 // MAX_CHUNK))


# ------------------------------------------------------------------------------------------------
# the search


def test_rule_pruned_plans_are_refused_when_loaded(small):
    """A plan refused before costing is refused by the reader (or the planner) when loaded as a file."""
    refused = [k for k, rec in small.records if rec["status"] == "rule"]
    assert refused
    for key in refused[:: max(1, len(refused) // 12)]:
        with pytest.raises(FmsimError):
            fmsim.estimate(load_scenario(EXAMPLE, overrides=_overrides(key)))


def test_memory_pruned_plans_do_not_fit_when_run(small):
    tight = [k for k, rec in small.records if rec["status"] == "memory"]
    assert tight
    for key in tight[:: max(1, len(tight) // 6)]:
        assert fmsim.estimate(load_scenario(EXAMPLE, overrides=_overrides(key))).metrics["fits"] is False
    assert fmsim.simulate(load_scenario(EXAMPLE, overrides=_overrides(tight[0]))).metrics["fits"] is False


def test_costed_rows_are_what_the_file_gives(small):
    """A searched row equals fmsim.estimate of the same plan loaded from the file, under each pricing."""
    ok = [r for r in small.ranked]
    for r in ok[:: max(1, len(ok) // 8)]:
        over = _overrides(r.key) | {"pricing": r.row["pricing_option"]}
        want = fmsim.estimate(load_scenario(EXAMPLE, overrides=over)).to_dict()
        for col in ("step_time_s", "mfu", "memory_per_gpu_bytes", "time_to_train_s", "usd_per_hour",
                    "cost_usd", "usd_per_step", "price_date", "pricing_option", "dp", "num_microbatches"):
            assert r.row[col] == pytest.approx(want[col], rel=1e-12) if isinstance(want[col], float) \
                else r.row[col] == want[col], col


def test_best_plan_is_never_worse_than_any_evaluated(sc):
    res = fmsim.search(sc, nodes=(8, 16, 32), axes=SMALL, deadline_s=2000 * 86400, top=0, cache_dir=False)
    assert res.ordered
    best = res.ordered[0]
    for r in res.ranked:
        if r.time_s <= res.deadline_s:
            assert best.cost <= r.cost
    fast = fmsim.search(sc, nodes=(8, 16, 32), axes=SMALL, budget_usd=40e6, top=0, cache_dir=False)
    for r in fast.ranked:
        if r.cost <= 40e6:
            assert fast.ordered[0].time_s <= r.time_s


def test_frontier_is_the_pareto_set(small):
    fr = small.frontier
    assert fr and fr == pareto_frontier(small.ranked)
    for f in fr:        # nothing evaluated beats a frontier point on both counts
        assert not any(r.time_s < f.time_s and r.cost < f.cost for r in small.ranked)
    for r in small.ranked:   # every evaluated plan is matched or beaten by a frontier point
        assert any(f.time_s <= r.time_s and f.cost <= r.cost for f in fr)
    times = [f.time_s for f in fr]
    assert times == sorted(times)


def test_des_recheck_decides_the_winner(sc):
    axes = {"tp": (8,), "pp": (4,), "vpp": (1, 2), "micro_batch": (1,), "zero": (1,),
            "recompute": ("selective",)}
    res = fmsim.search(sc, nodes=(16,), axes=axes, top=2, cache_dir=False)
    assert res.checked and res.winner is not None
    again = fmsim.simulate(load_scenario(EXAMPLE, overrides=_overrides(res.winner.estimate.key)))
    assert res.winner.simulated.row["step_time_s"] == pytest.approx(again.metrics["step_time_s"])


def test_resuming_gives_the_same_frontier(sc, tmp_path):
    """An interrupted search continues from its cache and ends where an uninterrupted one does."""
    opts = dict(nodes=(8, 16), axes=SMALL, top=0)
    full = fmsim.search(sc, cache_dir=False, **opts)
    calls = []

    def stop_after_first(done, total):
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fmsim.search(sc, cache_dir=tmp_path, progress=stop_after_first, **opts)
    again = fmsim.search(sc, cache_dir=tmp_path, **opts)
    assert 0 < again.cached < len(full.records)
    assert again.records == full.records
    assert [(r.key, r.row) for r in again.frontier] == [(r.key, r.row) for r in full.frontier]
    third = fmsim.search(sc, cache_dir=tmp_path, **opts)
    assert third.cached == len(full.records)


def _same_answer(res, serial):
    """The records, and everything ranked from them, equal to the serial search's."""
    assert res.records == serial.records
    for name in ("ranked", "ordered", "frontier"):
        assert [(r.key, r.row) for r in getattr(res, name)] == [(r.key, r.row) for r in getattr(serial, name)]
    assert {i: r.key for i, r in res.winners.items()} == {i: r.key for i, r in serial.winners.items()}


DASK_OPTS = dict(nodes=(8, 16), axes=SMALL, top=0, cache_dir=False, deadline_s=400 * 86400.0)


@pytest.fixture(scope="module")
def serial(sc):
    return fmsim.search(sc, jobs=1, **DASK_OPTS)


def test_processes_and_dask_give_the_local_answer(sc, serial):
    distributed = pytest.importorskip("dask.distributed")
    _same_answer(fmsim.search(sc, jobs=2, **DASK_OPTS), serial)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        _same_answer(fmsim.search(sc, dask=client, **DASK_OPTS), serial)


def _live_children() -> set[int]:
    """This process's live child processes, but multiprocessing's resource tracker (it lives as long as
    its parent, whatever started it)."""
    import os
    from pathlib import Path

    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"resource_tracker" not in cmd:
                out.add(int(entry))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_dask_local_workers_give_the_local_answer_and_stop(sc, serial):
    """``--dask local:2``: two worker processes (plans and records pickled across), quiet housekeeping, the
    local answer, and no worker process left once the search returns."""
    pytest.importorskip("dask.distributed")
    from fmsim.search import executors

    before = _live_children()
    seen = []
    real = executors.affinity_chunks

    def spy(groups, workers):
        seen.append(workers)
        return real(groups, workers)

    executors.affinity_chunks, saved = spy, executors.affinity_chunks
    try:
        _same_answer(fmsim.search(sc, dask="local:2", **DASK_OPTS), serial)
    finally:
        executors.affinity_chunks = saved
    assert seen == [2]          # chunks cut for both workers
    assert _live_children() <= before


def test_dask_waits_for_a_scheduler_s_first_workers(sc, serial, monkeypatch):
    """A scheduler with no worker yet: the search waits for the workers (it does not cut one worker's
    chunks, nor scatter to nobody), then gives the local answer; with none at all, one located error."""
    distributed = pytest.importorskip("dask.distributed")
    from fmsim.search import executors

    seen = []
    real = executors.affinity_chunks
    monkeypatch.setattr(executors, "affinity_chunks", lambda groups, workers: seen.append(workers) or
                        real(groups, workers))
    with distributed.LocalCluster(n_workers=0, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        monkeypatch.setattr(executors, "DASK_WORKER_WAIT_S", 0.3)
        with pytest.raises(ConfigError, match="no worker joined"):
            fmsim.search(sc, dask=client, **DASK_OPTS)
        monkeypatch.setattr(executors, "DASK_WORKER_WAIT_S", 60.0)
        timer = threading.Timer(0.5, cluster.scale, args=(2,))
        timer.start()
        try:
            _same_answer(fmsim.search(sc, dask=client, **DASK_OPTS), serial)
        finally:
            timer.join()
    assert seen and seen[-1] >= 1


def test_plan_keys_cover_the_axes(small):
    assert len(small.records[0][0]) == len(AXES)
    assert small.counts["ok"] + small.counts["memory"] + small.counts["rule"] == len(small.records)
    assert all(math.isfinite(r.time_s) for r in small.ranked)


def test_search_refuses_what_it_cannot_answer(sc):
    with pytest.raises(ConfigError, match="train_tokens"):
        fmsim.search(load_scenario(EXAMPLE, overrides={"workload.train_tokens": None}), cache_dir=False)
    with pytest.raises(ConfigError, match="did you mean"):
        fmsim.search(sc, pricing=("on-demnd",), cache_dir=False)
    with pytest.raises(ConfigError, match="unknown"):
        fmsim.search(sc, instances=("p5.48xlarg",), cache_dir=False)
    with pytest.raises(ConfigError, match="more than"):
        fmsim.search(sc, nodes=tuple(range(1, 2000)), axes={"tp": tuple(range(1, 65))}, cache_dir=False)


def _missing_module(keys, base=None):
    raise ModuleNotFoundError("No module named 'fmsim.search.evaluate'")


def test_dask_cluster_of_another_fmsim_is_one_located_error(sc, monkeypatch):
    """A cluster whose workers import another fmsim (or none): one line naming --dask and the fix."""
    distributed = pytest.importorskip("dask.distributed")
    from fmsim.search import executors

    monkeypatch.setattr(executors, "evaluate_chunk_packed", _missing_module)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(ConfigError, match=r"--dask: the cluster at .* cannot run this fmsim's tasks "
                                              r"\(No module named 'fmsim.search.evaluate'\)"):
            fmsim.search(sc, dask=client, **DASK_OPTS)
