"""The estimate's caches across plans (docs/search.md "Speed"): cached and uncached evaluations give the
same numbers, bit for bit, and every cache is bounded."""
from __future__ import annotations

import pytest

import fmsim
from fmsim.parallel import strategy
from fmsim.scenario import load_scenario, with_plan

#: varied plans: dense and MoE, ZeRO 1 and 3, 1F1B and interleaved, cp, ep, recompute modes, LoRA,
#: several instance types and node counts
FILES = ("scenarios/examples/llama3-70b-p5.yaml", "scenarios/examples/mixtral-8x22b-p6-b200.yaml",
         "scenarios/examples/llama3-8b-trn2.yaml", "scenarios/validation/training/mlpv40-lora-01.yaml",
         "scenarios/validation/training/automodel-01.yaml")
VARIANTS = ({}, {"zero": 3, "recompute": "full"}, {"pp": 2, "vpp": 2, "recompute": "selective"},
            {"zero": 3, "pp": 1, "recompute": "none"})


def _plans():
    out = []
    for f in FILES:
        sc = load_scenario(f)
        out.append(sc)
        for v in VARIANTS:
            try:
                schedule = "interleaved" if v.get("vpp", 1) > 1 else "1f1b"
                out.append(with_plan(sc, **v, schedule=schedule))
            except fmsim.FmsimError:
                pass          # a variant the scenario's rules refuse: nothing to cost
    return out


def _evaluate(sc):
    try:
        return fmsim.estimate(sc).to_json()
    except fmsim.FmsimError as e:
        return {"error": str(e)}


@pytest.fixture(scope="module")
def plans():
    got = _plans()
    assert len(got) >= 12
    return got


def test_cached_and_uncached_estimates_are_identical(plans):
    """Each plan costed from empty caches equals the same plan costed after all the others (warm caches),
    in either order: no cached piece leaks from one plan into another."""
    uncached = []
    for sc in plans:
        strategy.clear_caches()
        uncached.append(_evaluate(sc))
    strategy.clear_caches()
    forward = [_evaluate(sc) for sc in plans]
    backward = [_evaluate(sc) for sc in reversed(plans)][::-1]
    assert forward == uncached
    assert backward == uncached
    assert sum("error" not in r for r in uncached) >= 10


def test_caches_are_bounded(plans):
    """The shared collective costs keep at most _SHARED_CLUSTERS clusters and _SHARED_COSTS costs each;
    the memoised functions are LRU caches with a maxsize."""
    strategy.clear_caches()
    sc = plans[0]
    inst = sc.cluster.instance
    for nodes in range(1, 3 * strategy._SHARED_CLUSTERS):
        strategy._shared_costs(inst, nodes)
        assert len(strategy._SHARED) <= strategy._SHARED_CLUSTERS
    line, memo = strategy._shared_costs(inst, 1)
    memo.update((i, None) for i in range(strategy._SHARED_COSTS))
    _, memo2 = strategy._shared_costs(inst, 1)
    assert memo2 is memo and len(memo) == 0          # full: emptied before the next plan uses it
    for fn in strategy.CACHED:
        assert fn.cache_info().maxsize is not None and fn.cache_info().maxsize <= 100_000
    strategy.clear_caches()
    for fn in strategy.CACHED:
        assert fn.cache_info().currsize == 0
    assert not strategy._SHARED and not strategy._STAGES and not strategy._PLACED and not strategy._DP
    assert strategy._STAGES_MAX <= 10_000 and strategy._PLACED_MAX <= 10_000 and strategy._DP_MAX <= 10_000


def test_shared_stage_costs_stay_bounded(plans):
    """The stage costs and placements shared across plans are emptied when full."""
    strategy.clear_caches()
    strategy._STAGES.update(((i,), (None, ())) for i in range(strategy._STAGES_MAX))
    strategy._PLACED.update(((i,), (None, {})) for i in range(strategy._PLACED_MAX))
    strategy._DP.update(((i,), (None, ())) for i in range(strategy._DP_MAX))
    _evaluate(plans[0])
    assert len(strategy._STAGES) <= 1 and len(strategy._PLACED) <= 1 and len(strategy._DP) <= 1
    strategy.clear_caches()


def test_memo_keys_tell_apart_what_they_leave_out():
    """The per-plan memos key on what their pieces read: the stage memories leave the accelerator out
    except under torchtitan-op (whether SDPA's output is kept), the data-parallel costs leave the
    micro-batch and recompute out. Plans that differ only there, costed one after another, equal each
    costed from empty caches -- and the torchtitan-op pair's memory differs, so the test can fail."""
    sc = load_scenario("scenarios/examples/llama3-8b-trn2.yaml")
    pairs = []
    for inst in ("p5.48xlarge", "p6-b200.48xlarge"):
        pairs.append(with_plan(sc, instance=inst, nodes=1, tp=1, recompute="selective",
                               recompute_policy="torchtitan-op"))
        pairs.append(with_plan(sc, instance=inst, nodes=1, tp=1, recompute="none"))
    pairs += [with_plan(pairs[1], micro_batch=2), with_plan(pairs[1], recompute="full")]
    uncached = []
    for p in pairs:
        strategy.clear_caches()
        uncached.append(_evaluate(p))
    strategy.clear_caches()
    assert [_evaluate(p) for p in pairs] == uncached
    assert all("error" not in r for r in uncached)
    memory = [r["metrics"]["memory_per_gpu_bytes"] for r in uncached]
    assert memory[0] != memory[2]           # torchtitan-op: p5 recomputes SDPA's output, B200 keeps it
