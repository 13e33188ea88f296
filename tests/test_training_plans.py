"""Any training plan the loader accepts runs to a finite, self-consistent result -- or is refused with
a located error. Plans are drawn over the whole catalog (every model, every instance with a 16-bit
peak) and the parallelism and overlap knobs; derandomized, so the same plans every run.

A sweep of this kind found an interleaved schedule that deadlocked the engine, FSDP streams that ran
without contention, an estimate that hid ZeRO gathers, and LoRA runs above an MFU of 1."""
from __future__ import annotations

import math

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import fmsim
from fmsim.errors import FmsimError
from fmsim.scenario import scenario_from_mapping

CATALOG = fmsim.load_catalog()
MODELS = sorted(CATALOG.models)
INSTANCES = sorted(n for n, i in CATALOG.instances.items() if i.accelerator.peak_flop_per_s.get("bf16"))


@st.composite
def plans(draw):
    model = draw(st.sampled_from(MODELS))
    moe = CATALOG.models[model].moe is not None
    pp = draw(st.sampled_from([1, 2, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    par = {"tp": tp, "pp": pp, "vpp": vpp, "cp": draw(st.sampled_from([1, 2])),
           "ep": draw(st.sampled_from([1, 2, 8])) if moe else 1, "dp": "auto",
           "zero": draw(st.sampled_from([0, 1, 2, 3])), "recompute": recompute,
           "sequence_parallel": tp > 1 and draw(st.booleans()),
           "schedule": "interleaved" if vpp > 1 else draw(st.sampled_from(["1f1b", "gpipe"])),
           "overlap": {k: draw(st.booleans()) for k in ("grad_reduce", "param_gather", "tp_comm", "pp_comm")},
           "dp_shard": draw(st.sampled_from(["auto", "auto", 1, 2, 8])),
           "cp_comm": draw(st.sampled_from(["ring", "all-gather", "a2a"])),
           "grad_bucket": draw(st.sampled_from(["40M", "40M", "500M", "unit"]))}
    workload = {"kind": "pretrain", "model": model, "precision": draw(st.sampled_from(["bf16", "fp8", "fp16"])),
                "seq_len": draw(st.sampled_from([2048, 8192])), "global_batch": draw(st.sampled_from([64, 512])),
                "micro_batch": draw(st.sampled_from([1, 2]))}
    if moe and par["ep"] > 1 and draw(st.booleans()):
        workload.update(moe_imbalance=draw(st.sampled_from([1.0, 1.3, 2.0])))
        if draw(st.booleans()):
            workload.update(moe_capacity_factor=draw(st.sampled_from([0.8, 1.25])),
                            moe_pad_to_capacity=draw(st.booleans()))
    if draw(st.integers(0, 9)) == 0:
        workload.update(kind="finetune", lora={"rank": 16, "modules": draw(st.sampled_from(["all", "attention"]))})
    return {"version": 1, "name": "drawn", "workload": workload, "parallelism": par,
            "cluster": {"instance": draw(st.sampled_from(INSTANCES)), "nodes": draw(st.sampled_from([1, 2, 8]))}}


@settings(max_examples=100)
@given(plan=plans())
def test_every_accepted_plan_gives_a_finite_self_consistent_step(plan):
    try:
        sc = scenario_from_mapping(plan)
        results = (fmsim.simulate(sc), fmsim.estimate(sc))
    except FmsimError as exc:                 # refused: one located line, never a traceback
        assert str(exc) and "\n" not in str(exc)
        event("refused")
        return
    event("simulated")
    tokens = plan["workload"]["global_batch"] * plan["workload"]["seq_len"]
    for r in results:
        step = r.get("step_time_s")
        assert math.isfinite(step) and step > 0
        assert all(v >= -1e-9 * step for v in r.breakdown.values())
        assert sum(r.breakdown.values()) == pytest.approx(step, rel=1e-6)
        assert r.get("tokens_per_s") == pytest.approx(tokens / step, rel=1e-9)
        assert 0 < r.get("mfu") <= r.get("hfu") and r.get("mfu") < 1.0
        assert r.get("memory_per_gpu_bytes") > 0
        if r.get("memory_per_gpu_bytes") > r.get("hbm_per_gpu_bytes"):
            assert not r.get("fits")
