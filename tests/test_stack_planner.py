"""Issue 27's "done when": a scenario with ``stack:`` and only the plan a planner knows reproduces the fully
specified prediction of the same run -- the same file with every setting the stack ships spelled out and no
stack named. The spelled-out file is written from the profile's own settings (not from what the reader
resolved), so the test fails if resolution and the catalog ever disagree."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from fmsim import estimate
from fmsim.catalog import load_catalog
from fmsim.scenario import load_scenario, scenario_from_mapping, scenario_to_mapping
from fmsim.stacks import SETTABLE, lookup

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "scenarios/validation/training"


def _nest(data, path, value):
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = list(value) if isinstance(value, tuple) else value


def _spelled_out(planner: dict, cat) -> dict:
    """``planner`` without its stack, every setting the stack ships for its precision written in the file
    (the first alternative that applies, as a release's rule reads; a file's own value wins)."""
    full = copy.deepcopy(planner)
    profile = cat.stack(full.pop("stack"))
    precision = full["workload"].get("precision", "bf16")
    done = set()
    for s in profile.settings:
        if s.path in done or not s.applies(precision):
            continue
        done.add(s.path)
        if lookup(planner, s.path) is None:
            _nest(full, s.path, s.value)
    return full


def _plan(model, precision, *, tp=1, pp=1, zero=1, nodes=2, instance="dgx-h100", seq=4096, gbs=64):
    return {"version": 1, "name": "planner",
            "workload": {"kind": "pretrain", "model": model, "precision": precision, "seq_len": seq,
                         "global_batch": gbs},
            "parallelism": {"tp": tp, "pp": pp, "zero": zero, **({"schedule": "1f1b"} if pp > 1 else {})},
            "cluster": {"instance": instance, "nodes": nodes}}


CASES = {
    "megatron-lm-2021": _plan("gpt3-5b", "fp16", tp=2, pp=2, zero=0, instance="dgx-a100-80gb"),
    "megatron-lm-2022": _plan("gpt3-5b", "bf16", tp=2, zero=0, instance="dgx-a100-80gb"),
    "nemo-24.07": _plan("llama3-8b", "fp8", tp=2),
    "nemo-25.04": _plan("llama3-8b", "fp8", tp=2),
    "megatron-bridge-25.11": _plan("llama3-8b", "fp8", tp=2),
    "mlperf-v4.0-gpt3": _plan("gpt3-5b", "fp8", tp=2),
    "torchtitan-0.2": _plan("llama3-8b", "bf16", zero=3),
    "olmo-core-2.5": _plan("llama3-8b", "bf16", zero=3),
    "pytorch-fsdp2-example": _plan("llama3-8b", "bf16", zero=3),
    "llm-foundry-0.9": _plan("llama3-8b", "bf16", zero=3, instance="dgx-a100-80gb"),
    "accelerate-1.14": _plan("llama3-8b", "bf16", zero=3),
    "nanotron-0.5": _plan("llama3-8b", "bf16", tp=2),
}


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


@pytest.mark.parametrize("stack", sorted(CASES))
def test_a_planner_s_file_with_a_stack_reproduces_the_fully_specified_prediction(cat, stack):
    planner = {**copy.deepcopy(CASES[stack]), "stack": stack}
    full = _spelled_out(planner, cat)
    assert "stack" not in full
    a = scenario_from_mapping(planner, catalog=cat)
    b = scenario_from_mapping(full, catalog=cat)
    assert a.stated == b.stated                    # every setting it ships counts as stated either way
    ma, mb = scenario_to_mapping(a, catalog=cat), scenario_to_mapping(b, catalog=cat)
    ma.pop("stack")
    assert ma == mb
    assert estimate(a).to_dict() == estimate(b).to_dict()
    # and the stack matters: without it the same plan predicts something else (or the stack states nothing
    # that moves it -- then this run would not show resolution at all, so such a case is not listed)
    bare = copy.deepcopy(planner)
    bare.pop("stack")
    assert estimate(scenario_from_mapping(bare, catalog=cat)).to_dict() != estimate(a).to_dict()


def _writes_no_setting(path: Path) -> bool:
    raw = yaml.safe_load(path.read_text())
    return all(lookup(raw, p) is None for p in SETTABLE)


def test_validation_files_that_keep_only_the_plan_reproduce_their_spelled_out_prediction(cat):
    files = [f for f in sorted(TRAINING.glob("*.yaml")) if _writes_no_setting(f)]
    stacks = set()
    for f in files:
        raw = yaml.safe_load(f.read_text())
        sc = load_scenario(f, catalog=cat)
        full = scenario_from_mapping(_spelled_out(raw, cat), file=str(f), catalog=cat)
        assert estimate(full).to_dict() == estimate(sc).to_dict(), f.name
        stacks.add(raw["stack"])
    assert len(files) >= 10 and len(stacks) >= 4, (len(files), stacks)
