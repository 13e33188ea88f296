"""Training predictions against published measurements (scenarios/validation/training).

Issue 4 sets the bar: median |error| <= 5 % and worst <= 15 % over the set, mean <= 4 % on the
eight Korthikanti et al. 2022 Table 5 runs. The Korthikanti bound is met and asserted. The set's
median (met until 2026-12-01, 5.6 % since the A100 GEMM figure stopped being read back from a table
with the layout of two of its rows) and the worst-case bound are not met: each is kept as a strict
xfail (it fails the suite the day it starts passing, so the marker is removed then), and a
regression guard holds today's level so that no change can quietly make the set worse.
"""
from __future__ import annotations

import statistics
from functools import lru_cache
from pathlib import Path

import pytest

import fmsim
from fmsim.scenario import load_scenario
from fmsim.validate import summarize, validate_scenarios

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "scenarios" / "validation" / "training").glob("*.yaml"))

#: Today's level (2026-12-02): median 5.7 %, worst 85.5 % (MEG21T2-12; 85.6 % before dropout was priced).
#: The median rose from 4.4 % when the A100 GEMM figure came from mamf-finder's measured sweep (0.87) instead
#: of Korthikanti et al.'s Table 4 (0.84), which has the layout of two of the rows checked here. The six 2021 DeepSpeed ZeRO-3 rows
#: (Narayanan et al. Table 2) run the DeepSpeed release of the paper's date (stack deepspeed-0.3, v0.3.13) with its
#: shipped defaults: 5e8-element gradient buckets, all-reduced (contiguous_gradients off), and the weights
#: gathered tensor by tensor with the device synchronised at each fetch (fmsim.parallel.zero3). fmsim predicts
#: them +44..+86 % too fast (2026-12-01, per-layer FSDP-style gathers: +45..+174 %; with the 40M buckets the
#: files used to assume: -26..+15 %), so they are guarded on their own and the rest of the set keeps its tail
#: guard (worst 25.5 %, MEG24-10; 25.2 % with dropout priced). Tighten when the physics improves.
#: 2026-12-02 (fourth session), Blackwell's own GEMM depth constant from TensorRT-LLM's K-sweeps (efficiency.gemm_k0,
#: docs/catalogs.md) and the B200/GB200 fp8/fp4 figures read back through it: median 5.76 -> 5.96 %, and the tail
#: outside the ZeRO-3 rows 25.2 -> 28.2 % (mb2511-gb200-04, bf16 MoE on GB200, +14.0 -> +28.2 %: its shallow expert
#: GEMMs now run at the sweeps' depth); kept as the better-sourced figure, the guard at that plus a margin.
#: 2026-12-02 (fifth session), mb2511-gb200-04/-05 dispatch through HybridEP as their preset sets it
#: (parallelism.ep_dispatch: hybridep): -04 +28.2 -> +23.8 %, so the tail outside the ZeRO-3 rows is MEG24-10's 25.2 %
#: again; the guard back to that plus a margin.
GUARD_MEDIAN_PCT = 6.5
GUARD_WORST_PCT = 88.0
ZERO3_2021 = {f"meg21t2-{i:02d}" for i in range(7, 13)}
GUARD_WORST_OTHERS_PCT = 26.5


@lru_cache(maxsize=1)
def rows():
    return tuple(validate_scenarios((load_scenario(p) for p in CASES), fmsim.simulate))


def test_the_set_covers_the_hardware_and_scale_the_issue_asks_for():
    scs = [load_scenario(p) for p in CASES]
    accels = {sc.cluster.instance.accelerator.name for sc in scs}
    assert len(scs) >= 40
    assert {"a100-80gb", "h100-sxm", "b200", "gb200"} <= accels
    assert any(sc.workload.model.moe for sc in scs) and any(not sc.workload.model.moe for sc in scs)
    gpus = [sc.cluster.gpus for sc in scs]
    assert min(gpus) <= 8 and max(gpus) >= 10_000
    assert {"bf16", "fp8"} <= {sc.workload.precision for sc in scs}


def test_every_validation_case_runs_and_is_compared():
    r = rows()
    assert not [x.error for x in r if x.error], "scenarios that raised"
    assert len([x for x in r if x.error_pct is not None]) == len(CASES)


def test_the_analytical_estimate_follows_the_engine_on_every_run():
    """The estimate (same stage costs, no event queue) predicts each published run within 5 points of
    the engine's error (measured 2026-11-30: within 4.1, median 0.25; 2026-12-02, with the estimate mirroring
    the engine's ZeRO-3 pipeline and per-stage reduce tails: within 3.45 (kor-07), median 0.12)."""
    est = {x.scenario: x.error_pct for x in validate_scenarios((load_scenario(p) for p in CASES), fmsim.estimate)}
    sim = {x.scenario: x.error_pct for x in rows()}
    gaps = {name: abs(est[name] - err) for name, err in sim.items()}
    worst = max(gaps, key=gaps.get)
    assert gaps[worst] <= 4.0, f"{worst}: engine {sim[worst]:+.1f} %, estimate {est[worst]:+.1f} %"
    assert statistics.median(gaps.values()) <= 0.3


def test_korthikanti_table5_mean_error_within_4_percent():
    kor = [abs(x.error_pct) for x in rows() if x.scenario.startswith("kor-")]
    assert len(kor) == 8
    assert statistics.mean(kor) <= 4.0, f"mean {statistics.mean(kor):.2f} % over Table 5"


#: Korthikanti et al. 2022 Table 4: forward and backward of one transformer layer of the 22B model
#: (TP8, 8 A100, the KOR-01/02 configuration), in ms, by (recompute, sequence parallelism).
KORTHIKANTI_TABLE4_MS = {
    ("none", False): (7.7, 11.9),
    ("none", True): (7.2, 11.8),
    ("full", False): (7.7, 19.5),
    ("selective", False): (7.7, 13.2),
    ("selective", True): (7.2, 13.1),
}


def _layer_ms(sc, recompute: str, sp: bool) -> tuple[float, float]:
    """One layer's forward and backward (recompute included) in ms: the 48-layer stage less a 47-layer one."""
    import dataclasses

    from fmsim.parallel.strategy import build_plan

    par = dataclasses.replace(sc.parallelism, recompute=recompute, sequence_parallel=sp,
                              recompute_modules=("core_attn",) if recompute == "selective" else ())

    def stage(layers):
        model = dataclasses.replace(sc.workload.model, layers=layers)
        return build_plan(dataclasses.replace(sc, parallelism=par,
                                              workload=dataclasses.replace(sc.workload, model=model))).stages[0]

    a, b = stage(sc.workload.model.layers), stage(sc.workload.model.layers - 1)
    return (a.fwd_s - b.fwd_s) * 1e3, (a.bwd_s - b.bwd_s) * 1e3


def test_korthikanti_table4_layer_times_within_4_5_percent():
    # the per-layer times behind Table 5: the backward with its asynchronous TP collectives behind the
    # weight-gradient GEMMs (the paper's §6.2 explains its 39 % full-recompute overhead by them) and the
    # unfused attention core's own backward. Since 2026-12-01 the A100 GEMM figure comes from mamf-finder's
    # sweep, not from this table, so this holds the operator model's level as well as its shape across the
    # five configurations: 2026-12-02, with the code's 0.1 hidden dropout priced, -0.1 .. -3.4 % each, +0.0 .. -2.6 %
    # per forward + backward (2026-12-01 without it: -0.9 .. -3.8 % each, -1.5 .. -2.9 %; with the
    # figure read back from this table, 0.84: -0.7 .. +0.4 %; flash's 2.5x rule and in-line TP backward:
    # +5.5 .. +10.5 %)
    sc = load_scenario(ROOT / "scenarios" / "validation" / "training" / "kor-01.yaml")
    for (recompute, sp), (fwd, bwd) in KORTHIKANTI_TABLE4_MS.items():
        f, b = _layer_ms(sc, recompute, sp)
        assert f == pytest.approx(fwd, rel=0.045), (recompute, sp, f)
        assert b == pytest.approx(bwd, rel=0.045), (recompute, sp, b)
        assert f + b == pytest.approx(fwd + bwd, rel=0.035), (recompute, sp, f + b)


def test_training_validation_does_not_regress_past_todays_level():
    s = summarize(rows())
    assert s.median_abs_pct <= GUARD_MEDIAN_PCT, f"median {s.median_abs_pct:.1f} %"
    assert s.worst_abs_pct <= GUARD_WORST_PCT, f"worst {s.worst_abs_pct:.1f} % ({s.worst.scenario})"
    others = summarize([x for x in rows() if x.scenario not in ZERO3_2021])
    assert others.worst_abs_pct <= GUARD_WORST_OTHERS_PCT, \
        f"worst outside the 2021 ZeRO-3 rows {others.worst_abs_pct:.1f} % ({others.worst.scenario})"


@pytest.mark.xfail(strict=True, reason="issue 4 target not met since 2026-12-01: median 5.6 % once the A100 "
                   "GEMM figure came from mamf-finder (0.87) rather than Korthikanti's Table 4 (0.84)")
def test_training_validation_median_meets_the_issue_target():
    assert summarize(rows()).median_abs_pct <= 5.0


@pytest.mark.xfail(strict=True, reason="issue 4 target not met yet: worst 85.6 % (meg21t2-12, 2026-12-02)")
def test_training_validation_worst_case_meets_the_issue_target():
    assert summarize(rows()).worst_abs_pct <= 15.0


#: Measured runs the memory model says do not fit (they ran, so each is a miss). None now: MLPerf's Llama 2
#: 70B LoRA on one B200 per replica fits since its file keeps the MLP activation's input in fp8 as its
#: submitter's configuration does (FP8_ACT=1, 2026-11-30); AutoModel's DeepSeek-V3 rows since their files
#: take the benchmark configuration's activation checkpointing.
KNOWN_NOT_FITTING: set[str] = set()


def test_measured_runs_fit_in_memory_but_the_known_misses():
    s = summarize(rows())
    assert set(s.not_fitting) <= KNOWN_NOT_FITTING, sorted(set(s.not_fitting) - KNOWN_NOT_FITTING)


def test_the_out_of_sample_runs_stay_outside_the_set_and_still_run():
    """scenarios/out_of_sample holds published runs kept out of the set (never used to choose a figure);
    they must keep loading and simulating so their table in its README can be reproduced."""
    oos = sorted((ROOT / "scenarios" / "out_of_sample").glob("*.yaml"))
    assert len(oos) >= 11
    names = {p.stem for p in CASES}
    out = validate_scenarios((load_scenario(p) for p in oos), fmsim.estimate)
    assert all(r.error is None and r.error_pct is not None for r in out)
    assert not names & {r.scenario for r in out}


#: MoE rows (issue 28 target: median <= 10 %, worst <= 25 %), 2026-12-01 with grouped expert GEMMs: median
#: 4.07 %, worst 16.1 % (MB2511-GB200-04) over the nine; bounds at that plus a margin. 2026-12-02 (second
#: session), with the dropless MoE host wait of the NeMo 2.x / Megatron-Bridge stacks: median 4.72 -> 4.52 %,
#: worst 16.13 -> 15.85 % (mb2511-gb200-04). 2026-12-02 (third session), NCCL's send/recv protocol latencies and
#: DeepEP's measured NVLink/RDMA rates (fmsim.hardware.dispatch): median 4.52 -> 4.72 %, worst 15.85 -> 15.72 %;
#: the bounds keep their margin. 2026-12-02 (third session), the grouped-GEMM kernel classes' measured rates
#: (kernels.GROUPED_KERNELS: Transformer Engine's multi-stream 0.96, TE PR #2045): median 4.72 -> 4.38 %, worst
#: 15.72 -> 14.25 % (mb2511-gb200-04); and each expert's rows as routing draws them (kernels.routed_grouped_gemm_efficiency,
#: shared with serving): with both (one local expert priced as one GEMM, no class rate), median 4.09 %, worst
#: 14.05 % (mb2511-gb200-04); the bounds tightened to that plus a margin. 2026-12-02 (fourth session), Blackwell's own
#: GEMM depth constant (efficiency.gemm_k0, fitted to TensorRT-LLM's B200/GB200 K-sweeps) and the fp8/fp4 figures read
#: back through it: median 4.09 -> 5.06 %, worst 14.05 -> 28.15 % (mb2511-gb200-04 +28.2 %, mb2511-b200-03 +7.2,
#: nemo2502-b200-03 +8.2, mb2511-gb200-05 +4.4, nemo2504-gb200-03 +2.3 %): the better-sourced figures are kept, so
#: issue 28's worst target (25 %) is no longer met by mb2511-gb200-04; the median target (10 %) still is.
#: 2026-12-02 (fifth session), HybridEP's GB200 dispatch for the two rows whose preset runs it
#: (parallelism.ep_dispatch: hybridep, DeepEP's Hybrid-EP table): worst 28.15 -> 23.81 % (mb2511-gb200-04), median
#: 5.06 % unchanged: both targets met again, the worst guarded at the target.
GUARD_MOE_MEDIAN_PCT = 5.5
GUARD_MOE_WORST_PCT = 25.0
MOE_TARGET_MEDIAN_PCT = 10.0


def test_training_moe_rows_meet_the_moe_target_and_hold_todays_level():
    moe = {sc.name for sc in (load_scenario(p) for p in CASES) if sc.workload.model.moe}
    errs = [abs(x.error_pct) for x in rows() if x.scenario in moe and x.error_pct is not None]
    assert len(errs) == len(moe) >= 9
    assert statistics.median(errs) <= min(GUARD_MOE_MEDIAN_PCT, MOE_TARGET_MEDIAN_PCT)
    assert max(errs) <= GUARD_MOE_WORST_PCT
