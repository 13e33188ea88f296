"""A search's records are what the unshared path gives, plan by plan (docs/search.md "Speed").

The search shares work across plans (stage pieces, stage costs, collective costs, memory, schedules,
prices: ``fmsim.parallel.strategy`` caches, ``fmsim.cost``'s price memo) and derives variants from one
validated scenario. Here every plan of a few small spaces is evaluated again the slow way -- the file
loaded with the plan's values by the full reader, every shared cache emptied first, ``fmsim.estimate``
-- and every record must be equal: the same status, the same row to the last bit (every column), the same
bottleneck sentence, and a refused plan refused with the same field and message.
"""
from __future__ import annotations

import pytest

import fmsim
from fmsim import cost
from fmsim.errors import FmsimError
from fmsim.parallel import strategy
from fmsim.scenario import load_scenario
from fmsim.search.space import plan_dict

CASES = {
    # dense GQA model, 1F1B and interleaved, ZeRO 1 and 3, every recompute mode, two instance types
    "llama3-70b-p5": ("scenarios/examples/llama3-70b-p5.yaml", {},
                      dict(instances=("p5.48xlarge", "p6-b200.48xlarge"), nodes=(8, 16),
                           axes={"tp": (4, 8), "pp": (1, 2, 4), "vpp": (1, 2), "micro_batch": (1, 2),
                                 "recompute": ("none", "selective", "full")})),
    # MoE: expert parallelism, the experts' own groups
    "mixtral-8x22b": ("scenarios/examples/mixtral-8x22b-p6-b200.yaml", {},
                      dict(nodes=(8, 16), axes={"tp": (2, 4), "pp": (1, 4), "vpp": (1,), "ep": (1, 8),
                                                "micro_batch": (1,), "recompute": ("selective", "full")})),
    # the global batch as an axis: batches dp x micro-batch divides, and those it does not (refused)
    "llama3-70b-batches": ("scenarios/examples/llama3-70b-p5.yaml", {},
                           dict(nodes=(8,), axes={"tp": (4, 8), "pp": (1, 2, 4), "vpp": (1, 2),
                                                  "micro_batch": (1, 2), "recompute": ("selective",),
                                                  "zero": (1,), "global_batch": (96, 128, 1000)})),
    # hybrid sharding, context parallelism and offloaded activations
    "llama3-70b-hsdp": ("scenarios/examples/llama3-70b-hsdp-p5.yaml", {},
                        dict(nodes=(8, 16), axes={"tp": (4, 8), "pp": (1, 2), "vpp": (1,), "cp": (1, 2),
                                                  "micro_batch": (1,), "offload_activations": (0, 4),
                                                  "recompute": ("none", "full")})),
}


def _overrides(key, extra) -> dict:
    p = plan_dict(key)
    return {**extra, "cluster.instance": p["instance"], "cluster.nodes": p["nodes"], "parallelism.tp": p["tp"],
            "parallelism.pp": p["pp"], "parallelism.vpp": p["vpp"], "parallelism.cp": p["cp"],
            "parallelism.ep": p["ep"], "workload.micro_batch": p["micro_batch"], "parallelism.zero": p["zero"],
            "parallelism.recompute": p["recompute"], "parallelism.offload_activations": p["offload_activations"],
            "parallelism.schedule": "interleaved" if p["vpp"] > 1 else "1f1b", "parallelism.dp": "auto",
            "parallelism.dp_shard": "auto", "workload.global_batch": p["global_batch"], "expect": None,
            "measured": None}


def _unshared(path, key, extra) -> dict:
    """Plan ``key``'s record the slow way: the file loaded in full, no cache shared with any other plan."""
    strategy.clear_caches()
    cost._APPLIED.clear()
    try:
        res = fmsim.estimate(load_scenario(path, overrides=_overrides(key, extra)))
    except FmsimError as exc:
        return {"status": "rule", "field": getattr(exc, "field", None) or "",
                "reason": getattr(exc, "message", None) or str(exc)}
    row = res.to_dict()
    if not row.get("fits", True):
        return {"status": "memory", "row": row,
                "reason": res.details.get("memory_error") or res.details.get("bottleneck", "does not fit")}
    return {"status": "ok", "row": row, "why": res.details.get("bottleneck", "")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_record_is_the_unshared_path_s(case):
    path, extra, opts = CASES[case]
    sc = load_scenario(path, overrides=extra or None)
    if not sc.workload.train_tokens:
        extra = {**extra, "workload.train_tokens": "1T"}
        sc = load_scenario(path, overrides=extra)
    strategy.clear_caches()
    res = fmsim.search(sc, top=0, cache_dir=False, **opts)
    statuses = {rec["status"] for _, rec in res.records}
    assert {"ok", "memory"} <= statuses, statuses        # the spaces hold both kinds of costed plan
    for key, rec in res.records:
        want = _unshared(path, key, extra)
        if rec["status"] == "rule" or want["status"] == "rule":
            assert (rec["status"], rec.get("field"), rec.get("reason")) == \
                (want["status"], want.get("field"), want.get("reason")), key
            continue
        # the scenario's name and file are the same; everything else is the plan's
        assert rec == want, key
