"""The search's two speed-ups that must not change an answer (docs/search.md "Speed"): the lean result the
search asks the training estimate for, and the memoised hash of the model and workload records."""
from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest

import fmsim
from fmsim.scenario import load_scenario
from fmsim.workloads.pretrain import estimate_pretrain

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "scenarios/examples/llama3-70b-p5.yaml"

#: a plan that fits, one that does not (the memory_error path), one offloading activations (pp 1)
PLANS = [
    {},
    {"parallelism.tp": 1, "parallelism.pp": 1, "parallelism.dp": 64, "parallelism.vpp": 1,
     "parallelism.schedule": "1f1b"},
    {"parallelism.tp": 8, "parallelism.pp": 1, "parallelism.dp": 8, "parallelism.vpp": 1,
     "parallelism.schedule": "1f1b", "parallelism.recompute": "none", "parallelism.offload_activations": 4},
]


@pytest.mark.parametrize("overrides", PLANS, ids=["fits", "too-big", "offload"])
def test_the_lean_result_has_every_column_and_the_search_s_details(overrides):
    try:
        sc = load_scenario(EXAMPLE, overrides=overrides)
    except fmsim.FmsimError as exc:       # pragma: no cover - the example's plan space moved
        pytest.fail(f"plan no longer loads: {exc}")
    full, lean = fmsim.estimate(sc), estimate_pretrain(sc, lean=True)
    assert lean.to_dict() == full.to_dict()           # the CSV row, every column, bit for bit
    assert dict(lean.metrics) == dict(full.metrics)
    assert dict(lean.breakdown) == dict(full.breakdown)
    assert dict(lean.memory) == dict(full.memory)
    for k in ("engine", "bottleneck", "memory_error"):
        assert lean.details.get(k) == full.details.get(k)
    assert set(lean.details) <= set(full.details)
    assert "memory_by_stage" in full.details and "memory_by_stage" not in lean.details
    if "parallelism.offload_activations" in overrides:
        assert "activation_offload" in full.details and "activation_offload" not in lean.details
    if overrides.get("parallelism.tp") == 1:
        assert "memory_error" in lean.details and not lean.metrics["fits"]


def test_the_memoised_hash_is_the_fields_hash_and_travels_nowhere():
    sc = load_scenario(EXAMPLE)
    for obj in (sc.workload.model, sc.workload):
        fields = tuple(getattr(obj, f.name) for f in dataclasses.fields(obj)
                       if (f.compare if f.hash is None else f.hash))
        assert hash(obj) == hash(fields) == hash(obj)
        assert "_hash_memo" not in {f.name for f in dataclasses.fields(obj)}
        assert "_hash_memo" not in repr(obj)
        for other in (pickle.loads(pickle.dumps(obj)), copy.copy(obj), copy.deepcopy(obj)):
            assert other == obj and not hasattr(other, "_hash_memo")   # computed afresh where it lands
            assert hash(other) == hash(obj)
    model = sc.workload.model
    changed = dataclasses.replace(model, layers=model.layers + 1)
    assert not hasattr(changed, "_hash_memo") and changed != model
    assert hash(changed) == hash(tuple(getattr(changed, f.name) for f in dataclasses.fields(changed)
                                       if (f.compare if f.hash is None else f.hash)))
