"""The band's sourced components (fmsim.band_sources, fmsim.band.release_candidates): hardware figures vary by
their own sources' spreads, inherited settings by what the stack's other releases ship."""
from __future__ import annotations

from pathlib import Path

import pytest

from fmsim import estimate
from fmsim.band import DEFAULT, RELEASES, band, components, release_candidates
from fmsim.band_sources import SPREADS, applicable, perturb
from fmsim.catalog import load_catalog
from fmsim.scenario import load_scenario, scenario_from_mapping, scenario_to_mapping
from scenario_helpers import small_pretrain

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "scenarios/validation/training"


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def test_each_spread_names_its_source_and_brackets_one(cat):
    import fmsim.band_sources as bs

    doc = bs.__doc__
    for needle in ("@744d01e18b79", "5%+ MAMF spread", "828.6", "BabelStream", "436.95", "434.99", "#29"):
        assert needle in doc
    for inst in cat.instances.values():
        for key, factors in applicable(inst).items():
            assert min(factors) < 1.0 < max(factors) or key == "hardware.fabric", (inst.name, key)
            assert all(0.9 <= f <= 1.05 for f in factors), (inst.name, key, factors)


def test_chip_speed_scales_the_compute_figures_only(cat):
    inst = cat.instance("dgx-h100")
    sc = scenario_from_mapping(small_pretrain("dgx-h100"), catalog=cat)
    slow = perturb(sc, {"hardware.chip_speed": 0.95}).cluster.instance
    assert slow.accelerator.gemm_efficiency["bf16"] == pytest.approx(0.95 * inst.accelerator.gemm_efficiency["bf16"])
    assert slow.accelerator.attention_efficiency == pytest.approx(0.95 * inst.accelerator.attention_efficiency)
    assert slow.accelerator.hbm_efficiency == inst.accelerator.hbm_efficiency and slow.fabric == inst.fabric
    assert estimate(perturb(sc, {"hardware.chip_speed": 0.95})).metrics["step_time_s"] > estimate(sc).metrics["step_time_s"]
    assert perturb(sc, {}) is sc


def test_chips_and_links_without_a_second_measurement_take_no_spread(cat):
    trn = applicable(cat.instance("trn1.32xlarge"))
    assert "hardware.chip_speed" not in trn and "hardware.hbm" not in trn      # Neuron: no mamf/BabelStream
    assert set(applicable(cat.instance("dgx-h100"))) == {s.key for s in SPREADS}


def test_inherited_settings_vary_over_the_stack_s_other_releases(cat):
    sc = load_scenario(TRAINING / "nemo2504-gb200-02.yaml", catalog=cat)
    got = release_candidates(sc, cat)
    # NeMo 25.04 turns the data-parallel overlaps on; Megatron-Core 0.8's argument defaults leave them off
    assert False in got["parallelism.overlap.grad_reduce"]
    # the file states none of these itself: it inherits them, so no unstated variation names them
    assert not any(p in sc.stated and p + RELEASES not in components(sc, cat) for p in got)


def test_a_file_s_departure_from_its_stack_is_not_varied(cat):
    data = small_pretrain("dgx-h100")
    data["stack"] = "nemo-25.04"
    plain = scenario_from_mapping(data, catalog=cat)
    assert "parallelism.overlap.grad_reduce" in release_candidates(plain, cat)
    data["parallelism"].setdefault("overlap", {})["grad_reduce"] = False      # departs from the stack
    departed = scenario_from_mapping(data, catalog=cat)
    assert "parallelism.overlap.grad_reduce" not in release_candidates(departed, cat)


def test_a_release_that_states_nothing_gives_the_global_default(cat):
    # NeMo 24.07 states only two settings: for the others NeMo 25.04 sets, the global default is tried
    data = small_pretrain("dgx-h100")
    data["stack"] = "nemo-25.04"
    got = release_candidates(scenario_from_mapping(data, catalog=cat), cat)
    assert any(DEFAULT in values for values in got.values())


def test_a_stack_of_its_own_family_has_no_release_variation(cat):
    data = small_pretrain("dgx-h100")
    data["stack"] = "meta-llama3-2024"
    assert release_candidates(scenario_from_mapping(data, catalog=cat), cat) == {}


@pytest.mark.parametrize("name", ["nemo2504-gb200-02", "mb2511-h100-01", "meg21-03", "automodel-01"])
def test_the_stackless_mapping_the_band_varies_resolves_to_the_same_prediction(cat, name):
    sc = load_scenario(TRAINING / f"{name}.yaml", catalog=cat)
    data = scenario_to_mapping(sc, catalog=cat)
    data.pop("stack", None)
    again = scenario_from_mapping(data, file=sc.file, catalog=cat)
    assert estimate(again).metrics["step_time_s"] == estimate(sc).metrics["step_time_s"]


def test_the_band_holds_the_point_with_every_component(cat):
    sc = load_scenario(TRAINING / "mb2511-h100-01.yaml", catalog=cat)
    b = band(sc, catalog=cat)
    lo, hi = b.relative()
    assert lo < 1.0 < hi
    assert any(k.startswith("hardware.") for k in b.varied) and any(k.endswith(RELEASES) for k in b.varied)
    assert b.reason()
