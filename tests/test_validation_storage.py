"""Storage and interruption predictions against published figures (scenarios/validation/storage).

Issue 30 sets targets of 25 % on interruption counts and on checkpoint downtime. Measured 2026-12-02
after re-reading every source (signed errors; each count is the subset of its source that the rate it is
predicted from counts, and no rate comes from the run it is checked on):

* Llama 3 405B, 54 days: 356 hardware-attributed interruptions (Table 5 less software bug, dependency and
  NCCL watchdog timeouts) from Meta's A100 research-cluster rate, which counts hardware-attributed job
  failures only: +47.8 % (was +26.2 % against all 419, every cause);
* OPT-175B, two months: 35 manual + an estimated 70 automatic hardware restarts (paper s2.5) from the same
  A100 fleet rate (same generation and node): -64.8 % (was -34.0 % against the manual 35 alone, from Llama
  3's H100 rates);
* BLOOM-176B, 117 days, from Llama 3's GPU and HBM rates (the only fleet breaking the GPU out): -47.0 %
  (1-2 GPU failures a week);
* PyTorch DCP 7B, synchronous save: +271 % -- the source names no storage; the one assumed decides it;
* PyTorch DCP 7B, asynchronous save: -76.4 % -- the blocking pageable copy of the DCP of the blog's time;
  the rest of the 6.3 s is what no source quantifies (building the sharded state dict, per-tensor copies);
* NeMo Automodel Llama 3 8B on 8 H100, asynchronous save: -100 % -- its DCP DefaultStager copies behind the
  next step, so the model blocks for nothing; the measured 0.54 s is software set-up.

None meets the targets; the tests below guard today's level (each error within its figure plus a margin)
so a change that moves them is seen, that no row is predicted from its own run's rates, and the FSx
throughput rule against AWS's worked examples and Llama 3's per-GPU checkpoint sizes.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

import fmsim
from fmsim.catalog import load_catalog
from fmsim.hardware.storage import file_system
from fmsim.parallel.strategy import build_plan
from fmsim.scenario import load_scenario
from fmsim.validate import validate_scenarios
from fmsim.workloads.checkpointing import rank_shard_bytes
from fmsim.workloads.reliability import fleet_counts

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "scenarios" / "validation" / "storage"
CASES = sorted(DIR.glob("*.yaml"))
#: today's signed error in % per scenario, and the margin (points) it may move before the test fails
TODAY = {
    "llama3-405b-interruptions": (47.8, 6.0),
    "opt-175b-restarts": (-64.8, 6.0),
    "bloom-176b-gpu-failures": (-47.0, 6.0),
    "dcp-7b-sync-checkpoint": (271.0, 15.0),
    "dcp-7b-async-checkpoint": (-76.4, 6.0),
    "automodel-8b-async-checkpoint": (-100.0, 1.0),
}


@lru_cache(maxsize=1)
def rows():
    out = validate_scenarios((load_scenario(p) for p in CASES), fmsim.simulate, jobs=1)
    assert not [r.error for r in out if r.error], [r.error for r in out if r.error]
    return {r.scenario: r.error_pct for r in out}


def test_every_storage_validation_file_is_compared():
    assert set(rows()) == set(TODAY) == {p.stem for p in CASES}


@pytest.mark.parametrize("name", sorted(TODAY))
def test_storage_validation_errors_stay_at_todays_level(name):
    err, margin = TODAY[name]
    assert rows()[name] == pytest.approx(err, abs=margin)


def test_interruption_counts_median_error_is_guarded():
    errs = sorted(abs(rows()[n]) for n in ("llama3-405b-interruptions", "opt-175b-restarts",
                                            "bloom-176b-gpu-failures"))
    assert errs[1] <= 47.8 + 6.0          # median of the three counts
    assert errs[-1] <= 64.8 + 6.0         # worst


COUNT_ROWS = [p for p in CASES if "expected_interruptions" in yaml.safe_load(p.read_text())["measured"]]


@pytest.mark.parametrize("path", COUNT_ROWS, ids=lambda p: p.stem)
def test_no_interruption_row_is_predicted_from_its_own_runs_rates(path):
    # issue 30: take the rates from one fleet and validate on another. The run's paper (its arXiv id in
    # measured.source) must not be the source of the fleet the file predicts from.
    data = yaml.safe_load(path.read_text())
    fleet = data["reliability"].get("fleet") or "llama3-405b-h100"
    fleet_source = load_catalog().extra["failure_rates"][fleet]["source"]
    own = set(re.findall(r"\d{4}\.\d{4,5}", data["measured"]["source"].split(";")[0]))
    assert own and not own & set(re.findall(r"\d{4}\.\d{4,5}", fleet_source)), (fleet, own)


def test_a_hardware_only_fleet_is_compared_with_a_hardware_only_count():
    # the rows predicted from a fleet that counts hardware-attributed failures only say so in the result
    for path in COUNT_ROWS:
        sc = load_scenario(path)
        if fleet_counts(sc.reliability.fleet or "llama3-405b-h100") != "hardware":
            continue
        assert "hardware" in yaml.safe_load(path.read_text())["measured"]["source"]
        notes = " ".join(fmsim.estimate(sc).details["checkpoint"]["notes"])
        assert "attributed to hardware only" in notes


@pytest.mark.parametrize("tier,capacity_tib,measured_mb_s,tol", [
    # STO-011: FSx API example, 2.4 TiB x 50 MB/s/TiB = 120 MB/s
    ("fsx-lustre-persistent-1-50", 2.4, 120.0, 0.001),
    # STO-012: archived FSx guide, 4.8 TiB at 50 MB/s/TiB: 'aggregate baseline 234 MB/s' (+2.6 %: the
    # guide's own rounding of the capacity)
    ("fsx-lustre-persistent-1-50", 4.8, 234.0, 0.03),
])
def test_fsx_throughput_follows_awss_worked_examples(tier, capacity_tib, measured_mb_s, tol):
    inst = load_catalog().instance("p5.48xlarge")
    fs = file_system({"kind": "fsx-lustre", "tier": tier, "capacity": capacity_tib * 2**40}, inst)
    assert fs.read_bytes_per_s / 1e6 == pytest.approx(measured_mb_s, rel=tol)


def test_a_one_pib_class_file_system_reaches_a_terabyte_per_second():
    # STO-016: AWS HPC blog, a 1.1 PiB FSx file system above 1 TB/s (tier not given: the 1,000 MB/s/TiB one)
    inst = load_catalog().instance("p5.48xlarge")
    fs = file_system({"kind": "fsx-lustre", "tier": "fsx-lustre-persistent-2-1000",
                      "capacity": 1.1 * 2**50}, inst)
    assert fs.read_bytes_per_s > 1e12
    # ... which 2,048 p5 nodes reach over EFA (each up to 1,200 Gbps)
    assert fs.aggregate_bytes_per_s(2048, write=True) == pytest.approx(fs.write_bytes_per_s)


def test_llama3_per_gpu_checkpoint_shards_fall_in_the_published_range():
    # STO-028: 'each GPU's model state', 1 MB to 4 GB per GPU, on 16k H100
    sc = load_scenario(DIR / "llama3-405b-interruptions.yaml")
    plan = build_plan(sc)
    shards = rank_shard_bytes(plan, shard_width=sc.parallelism.shard_width)
    assert all(1e6 <= b <= 4e9 for b in shards), shards
