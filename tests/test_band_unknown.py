"""``configuration.unknown``: the reader checks each listed value as its field, the band varies exactly those
values, names the field, and a list never narrows the band."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from scenario_helpers import small_pretrain

from fmsim.band import UNKNOWN, band, candidates, components
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.scenario import load_scenario, scenario_from_mapping, scenario_to_mapping
from fmsim.validate import BandRow, band_summary

ROOT = Path(__file__).resolve().parent.parent
TP_COMM = "parallelism.overlap.tp_comm"


def _data(unknown=None, **top):
    data = small_pretrain("dgx-h100", **top)
    data["parallelism"]["zero"] = 1
    data["configuration"] = {"partial": "TP overlap not stated"}
    if unknown is not None:
        data["configuration"]["unknown"] = unknown
    return data


def test_the_reader_keeps_the_unknowns_and_writes_them_back():
    sc = scenario_from_mapping(_data({TP_COMM: [True, False], "workload.precision": ["fp8", "bf16"]}))
    assert sc.configuration == "partial"
    assert sc.configuration_unknown == {TP_COMM: (True, False), "workload.precision": ("fp8", "bf16")}
    again = scenario_from_mapping(scenario_to_mapping(sc))
    assert again.configuration_unknown == sc.configuration_unknown
    assert scenario_from_mapping(_data()).configuration_unknown == {}


@pytest.mark.parametrize("unknown, field, words", [
    ({"parallelism.overlap.tp_comn": [True, False]}, "configuration.unknown",
     "'parallelism.overlap.tp_comn' is not a scenario field (did you mean 'parallelism.overlap.tp_comm'?)"),
    ({"workload.precison": ["fp8", "bf16"]}, "configuration.unknown", "did you mean 'workload.precision'?"),
    ({"cluster.instance.fabric": [1, 2]}, "configuration.unknown", "is not a scenario field"),
    ({"parallelism.tp": [2, 3]}, "configuration.unknown.parallelism.tp[1]", "refuses this value: parallelism.tp"),
    ({TP_COMM: ["yes", False]}, f"configuration.unknown.{TP_COMM}[0]", "refuses this value"),
    ({TP_COMM: True}, f"configuration.unknown.{TP_COMM}", "expected a list of the values the source gives"),
    ({TP_COMM: [True]}, f"configuration.unknown.{TP_COMM}", "at least two"),
    ({TP_COMM: [True, True]}, f"configuration.unknown.{TP_COMM}[1]", "listed twice"),
    ({"measured.step_time_s": [1, 2]}, "configuration.unknown.measured.step_time_s", "is not a setting"),
    ([TP_COMM], "configuration.unknown", "expected a mapping"),
])
def test_a_bad_unknown_is_one_located_line(unknown, field, words):
    with pytest.raises(ConfigError) as err:
        scenario_from_mapping(_data(unknown), file="f.yaml")
    assert err.value.file == "f.yaml" and err.value.field == field, str(err.value)
    assert words in err.value.message


def test_unknowns_need_the_partial_mark(tmp_path, capsys):
    data = _data()
    data["configuration"] = {"unknown": {TP_COMM: [True, False]}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["lint", str(path)]) == 2
    assert "configuration.partial: is required" in capsys.readouterr().err
    data["configuration"] = {"partial": "x", "unknown": {"serving.memory_fraction": [0.9, 0.95]}}
    path.write_text(yaml.safe_dump(data))
    assert main(["lint", str(path)]) == 2      # a serving field on a training file
    err = capsys.readouterr().err
    assert "configuration.unknown.serving.memory_fraction[0]" in err and "Traceback" not in err


def test_the_band_varies_exactly_the_listed_values_and_names_the_field():
    cat = load_catalog()
    plain = scenario_from_mapping(_data())
    listed = scenario_from_mapping(_data({TP_COMM: [False, True]}))
    comps = components(listed, cat)
    assert comps[TP_COMM + UNKNOWN] == (True,)             # the file's own value (the default, off) is the point
    assert TP_COMM not in comps and TP_COMM in candidates(plain, cat)  # the list replaces the catalog's values
    b = band(listed)
    assert TP_COMM + UNKNOWN in b.varied and TP_COMM + UNKNOWN not in b.refused
    lo, hi = b.swings[TP_COMM + UNKNOWN]
    assert lo < b.point["step_time_s"] <= hi               # TP overlap on: a faster step
    assert b.label(TP_COMM + UNKNOWN) == TP_COMM
    if b.most == TP_COMM + UNKNOWN:
        assert b.reason() == f"{TP_COMM} unknown (per the file's source)"


def test_listing_unknowns_never_narrows_the_band():
    plain = band(scenario_from_mapping(_data()))
    listed = band(scenario_from_mapping(_data({TP_COMM: [True, False], "workload.precision": ["fp8", "bf16"]})))
    m = "step_time_s"
    assert listed.point[m] == plain.point[m]
    assert listed.low[m] <= plain.low[m] and listed.high[m] >= plain.high[m]
    assert not [k for k in listed.refused if k.endswith(UNKNOWN)]


def test_a_precision_unknown_takes_the_stack_s_settings_for_that_precision():
    # aws-tt-02's stack ships fp8-only settings (fp8 weight gather): its bf16 variant must drop them, not be
    # refused, and run slower (its notes: "run as bf16 this row would read -13.3 %")
    sc = load_scenario(ROOT / "scenarios/validation/training/aws-tt-02.yaml")
    assert sc.configuration_unknown == {"workload.precision": ("fp8", "bf16")}
    b = band(sc)
    assert "workload.precision" + UNKNOWN not in b.refused
    _, hi = b.swings["workload.precision" + UNKNOWN]
    assert hi / b.point["step_time_s"] > 1.05


def test_the_validation_files_unknowns_are_accepted_by_the_band():
    for name in ("inference/inf-062", "training/nemo2407-04", "training/trn1-02"):
        sc = load_scenario(ROOT / f"scenarios/validation/{name}.yaml")
        assert sc.configuration == "partial" and sc.configuration_unknown, name
        b = band(sc)
        assert not [k for k in b.refused if k.endswith(UNKNOWN)], (name, b.refused)
        assert all(k + UNKNOWN in b.varied for k in sc.configuration_unknown), name


def test_stated_files_list_no_unknowns():
    for path in sorted((ROOT / "scenarios/validation").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if raw.get("configuration") == "stated":
            assert "unknown" not in str(raw["configuration"]), path


def test_the_summary_splits_by_mark_kind_and_unknown_lists():
    def row(conf, kind, inside, unknowns=0):
        return BandRow(scenario="s", configuration=conf, key="k", low=1, high=2, measured=1.5, inside=inside,
                       half_width_pct=10.0, most="chip speed", kind=kind, unknowns=unknowns)
    lines = band_summary([row("stated", "training", True), row("partial", "serving", False, 2),
                          row("partial", "training", True)])
    assert lines[0].startswith("band (partial): 1 of 2") and lines[1].startswith("band (stated): 1 of 1")
    assert "band (serving): 0 of 1" in lines[2] and "band (training): 2 of 2" in lines[3]
    assert lines[4].startswith("band (with unknown lists): 0 of 1") and lines[5].startswith("band (all): 2 of 3")
    assert lines[6] == "band moved most by: chip speed (3)"


def test_a_section_s_unknown_varies_its_fields_together():
    # kor-05: Calculon's transcription interleaves 530B's pipeline 3 ways, the file runs 1F1B (measured.notes)
    sc = load_scenario(ROOT / "scenarios/validation/training/kor-05.yaml")
    pair = ({"vpp": 1, "schedule": "1f1b"}, {"vpp": 3, "schedule": "interleaved"})
    assert sc.configuration_unknown["parallelism"] == pair
    assert components(sc, load_catalog())["parallelism" + UNKNOWN] == pair[1:]   # the file's own pair is the point
    b = band(sc)
    lo, _ = b.swings["parallelism" + UNKNOWN]
    assert lo < b.point["step_time_s"] and "parallelism" + UNKNOWN not in b.refused
    assert b.label("parallelism" + UNKNOWN) == "parallelism.vpp and parallelism.schedule"
    with pytest.raises(ConfigError) as err:        # a pair the reader refuses alone is refused at load
        scenario_from_mapping(_data({"parallelism": [{"tp": 2}, {"tp": 3}]}), file="f.yaml")
    assert err.value.field == "configuration.unknown.parallelism[1]"
