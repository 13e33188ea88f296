"""The catalogs are read by the scenario reader: the strict YAML loader (fmsim.yaml_safe) and the section
getters (fmsim.fields). Every catalog file of the repository loads; every hostile catalog input is one
located line and exit 2 from the CLI (``fmsim catalog show``, ``fmsim run``), never a traceback; the keys
each catalog kind declares are the keys docs/catalogs.md documents.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

import fmsim.catalog as catalog_pkg
from fmsim.catalog import data_root, load_catalog
from fmsim.catalog.files import FOLDER_SECTIONS, read_folder
from fmsim.catalog.hardware import (
    ACCELERATOR_KEYS, EFFICIENCY_KEYS, FABRIC_KEYS, INSTANCE_KEYS, LINK_KEYS, NETWORK_KEYS, SCALE_UP_KEYS,
)
from fmsim.catalog.offers import (
    COMPONENT_KEYS, FAILURE_RATE_KEYS, PRICE_ROW_KEYS, STORAGE_KEYS, ULTRACLUSTER_KEYS,
)
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.yaml_safe import MAX_FILE_BYTES, read_yaml_file
from test_catalog_hardware import _minimal as _hardware_minimal

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "catalogs.md"


# ------------------------------------------------------------------------------------------------
# every catalog file of the repository


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for folder in FOLDER_SECTIONS
                                        for p in (ROOT / folder).glob("*.yaml")))
def test_every_catalog_file_of_the_repository_is_read_strictly_and_holds_only_known_sections(path):
    data = read_yaml_file(ROOT / path, path, what="catalog")   # duplicate keys, NUL bytes ... would raise
    folder = path.split("/")[0]
    assert isinstance(data, dict) and set(data) <= set(FOLDER_SECTIONS[folder])


def test_the_repository_catalog_loads_every_entry_of_every_file():
    cat = load_catalog()
    counted = {name: sum(len(body) for _, body in read_folder(data_root() / folder).get(name, []))
               for folder, names in FOLDER_SECTIONS.items() for name in names}
    assert counted["accelerators"] == len(cat.accelerators) > 0
    assert counted["instances"] == len(cat.instances) > 0
    assert counted["fabrics"] == len(cat.fabrics) and counted["storage"] == len(cat.storage)
    assert counted["prices"] == len(cat.prices) and counted["models"] == len(cat.models) > 0
    assert counted["stacks"] == len(cat.stacks) > 0
    assert counted["failure_rates"] == len(cat.extra["failure_rates"]) > 0
    assert counted["ultracluster"] == len(cat.extra["ultracluster"]) > 0


# ------------------------------------------------------------------------------------------------
# hostile catalogs, through the CLI


def _minimal() -> dict:
    """test_catalog_hardware's minimal tree (one of each hardware kind), plus a fleet and an UltraCluster."""
    data = _hardware_minimal()
    data["failure_rates"] = {"fleet": {"period_days": 54, "gpus": 16, "nodes": 2,
                                       "components": {"gpu": {"per": "gpu", "rate": 2e-4}}, "source": "test"}}
    data["ultracluster"] = {"default": {"oversubscription": 1.0, "source": "test"}}
    return data


def _set(data: dict, path: str, value) -> dict:
    """``data`` with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    out = copy.deepcopy(data)
    *parents, leaf = path.split("/")
    node = out
    for p in parents:
        node = node[p]
    if value is ...:
        del node[leaf]
    else:
        node[leaf] = value
    return out


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A catalog tree the CLI reads (``fmsim.catalog.data_root``), with the working directory at its root so
    that errors name ``hardware_catalog/hw.yaml``; the real catalog's cache is emptied before and after."""
    (tmp_path / "hardware_catalog").mkdir()
    monkeypatch.setattr(catalog_pkg, "data_root", lambda: tmp_path)
    monkeypatch.chdir(tmp_path)
    load_catalog.cache_clear()
    yield tmp_path
    load_catalog.cache_clear()


def _cli_error(capsys, argv=("catalog", "show", "box")) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_minimal_tree_loads_through_the_cli(tree, capsys):
    (tree / "hardware_catalog" / "hw.yaml").write_text(yaml.safe_dump(_minimal()))
    assert main(["catalog", "show", "box"]) == 0
    assert "instance box" in capsys.readouterr().out


HW = "hardware_catalog/hw.yaml"

# (what is wrong, a change to the minimal catalog, the one line the CLI says)
HOSTILE = [
    ("negative quantity", ("accelerators/chip/hbm_bandwidth", "-2 TB/s"),
     f"{HW}: accelerators.chip.hbm_bandwidth: '-2 TB/s' must be > 0 (expected e.g. '3.35 TB/s')"),
    ("negative number", ("instances/box/accelerators", -8),
     f"{HW}: instances.box.accelerators: -8 is less than 1 (expected an integer >= 1)"),
    ("negative price", ("prices/box/on-demand", [{"usd_per_hour": -1, "date": "2026-01-01", "source": "t"}]),
     f"{HW}: prices.box.on-demand[0].usd_per_hour: must be a positive number (got -1)"),
    ("negative failure rate", ("failure_rates/fleet/components/gpu/rate", -1e-4),
     f"{HW}: failure_rates.fleet.components.gpu.rate: must be a number >= 0 (got -0.0001)"),
    ("efficiency above one", ("fabrics/net/efficiency", 1.5),
     f"{HW}: fabrics.net.efficiency: must be a fraction in (0, 1] (got 1.5)"),
    ("wrong type: a list for a size", ("accelerators/chip/hbm", [80]),
     f"{HW}: accelerators.chip.hbm: expected a size in bytes (number or string with unit), got list"),
    ("wrong type: text for a count", ("instances/box/network/nics", "four"),
     f"{HW}: instances.box.network.nics: got a string ('four') (expected an integer >= 1)"),
    ("wrong type: text for a flag", ("fabrics/net/in_network_reduction", "yes"),
     f"{HW}: fabrics.net.in_network_reduction: got a string ('yes') (expected true or false)"),
    ("wrong type: a number for a source", ("instances/box/source", 42),
     f"{HW}: instances.box.source: got a number (42) (expected text naming the document and table, or the "
     "repository, file and commit)"),
    ("not a date", ("prices/box/on-demand", [{"usd_per_hour": 1, "date": "last June", "source": "t"}]),
     f"{HW}: prices.box.on-demand[0].date: must be a date, YYYY-MM-DD or YYYY-MM "
     "(got a string ('last June'))"),
    ("empty GEMM fractions", ("accelerators/chip/efficiency/gemm", {}),
     f"{HW}: accelerators.chip.efficiency.gemm: names no precision (expected a fraction per precision, "
     "e.g. {bf16: 0.8})"),
    ("a price without an option", ("prices/box", {"source": "t"}),
     f"{HW}: prices.box: has no pricing option (expected one or more of on-demand, capacity-block, "
     "savings-plan-1yr, savings-plan-3yr)"),
    ("unknown choice", ("instances/box/scale_up/kind", "nvswich"),
     f"{HW}: instances.box.scale_up.kind: 'nvswich' is not valid (did you mean 'nvswitch'?)"),
    ("unknown key", ("instances/box/host_memroy", "1 TiB"),
     f"{HW}: instances.box.host_memroy: unknown key 'host_memroy' (did you mean 'host_memory'?)"),
    ("unknown nested key", ("accelerators/chip/efficiency/atention", 0.5),
     f"{HW}: accelerators.chip.efficiency.atention: unknown key 'atention' (did you mean 'attention'?)"),
    ("unknown section", ("instanecs", {}),
     f"{HW}: instanecs: unknown section 'instanecs' (did you mean 'instances'?)"),
    ("unknown reference", ("instances/box/accelerator", "chipp"),
     f"{HW}: instances.box.accelerator: unknown accelerator 'chipp' (did you mean 'chip'?)"),
    ("missing required field", ("accelerators/chip/hbm", ...),
     f"{HW}: accelerators.chip.hbm: is required (device memory, e.g. '81920 MiB')"),
    ("missing source", ("storage/fsx/source", ...),
     f"{HW}: storage.fsx.source: is required (every catalog number needs a source)"),
    ("missing failure components", ("failure_rates/fleet/components", ...),
     f"{HW}: failure_rates.fleet.components: is required (component: {{per: gpu | node | nic, "
     "rate: interruptions per unit per day})"),
    ("non-mapping entry", ("instances/box", "p5.48xlarge"),
     f"{HW}: instances.box: got a string ('p5.48xlarge') (expected a mapping of instance fields "
     "(docs/catalogs.md))"),
    ("non-mapping section", ("storage", ["fsx"]),
     f"{HW}: storage: got a list (expected a mapping of named entries)"),
    ("non-mapping part", ("instances/box/network", 4),
     f"{HW}: instances.box.network: got a number (4) (expected a mapping with keys fabric, nics, "
     "nic_bandwidth, notes)"),
]


@pytest.mark.parametrize("what, change, line", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_catalog_entry_is_one_located_line_and_exit_2(tree, capsys, what, change, line):
    (tree / "hardware_catalog" / "hw.yaml").write_text(yaml.safe_dump(_set(_minimal(), *change)))
    assert _cli_error(capsys) == line


GOOD = yaml.safe_dump(_minimal())

# (what is wrong, the file's text, the one line the CLI says, as a regular expression)
HOSTILE_TEXT = [
    ("duplicate key", GOOD.replace("  box:\n", "  box:\n    vcpus: 8\n    vcpus: 16\n", 1),
     rf"{HW}: line \d+, column 5: duplicate key 'vcpus' \(first given at line \d+\)"),
    ("NUL byte", GOOD.replace("vendor: X", "vendor: X\x00"),
     rf"{HW}: line \d+, column 14: a NUL byte \(expected a YAML text file\)"),
    ("huge file", GOOD + "#" * (MAX_FILE_BYTES + 1) + "\n",
     rf"{HW}: file is [\d,]+ bytes, over the 1,048,576-byte limit for catalog files "
     r"\(refused before parsing\)"),
    ("non-mapping file", "- accelerators\n- instances\n",
     rf"{HW}: got a list \(expected a mapping of sections: accelerators, fabrics, links, instances, prices, "
     r"storage, ultracluster, failure_rates, nccl_protocols, nccl_p2p, fabric_protocols, deepep, hybridep\)"),
    ("not YAML", "accelerators: {chip: [\n",
     rf"{HW}: line \d+, column \d+: invalid YAML: .*"),
    ("not UTF-8", "accelerators: {}\n# \xff\n",
     rf"{HW}: not UTF-8 text \(byte \d+\) \(expected a YAML text file\)"),
    ("nested too deep", "failure_rates: " + "[" * 80 + "]" * 80 + "\n",
     rf"{HW}: line 1, column \d+: nested deeper than 64 levels"),
    ("alias bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
     + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdef", "bcdefg")),
     rf"{HW}: line \d+, column \d+: aliases expand to more than 200,000 values "
     r"\(refused: alias bomb guard\)"),
]


@pytest.mark.parametrize("what, text, pattern", HOSTILE_TEXT, ids=[h[0] for h in HOSTILE_TEXT])
def test_a_hostile_catalog_file_is_one_located_line_and_exit_2(tree, capsys, what, text, pattern):
    path = tree / "hardware_catalog" / "hw.yaml"
    if what == "not UTF-8":
        path.write_bytes(text.encode("latin-1"))
    else:
        path.write_text(text)
    assert re.fullmatch(pattern, _cli_error(capsys)), _cli_error(capsys)


def test_an_entry_given_in_two_files_names_both(tree, capsys):
    (tree / "hardware_catalog" / "a.yaml").write_text(yaml.safe_dump(_minimal()))
    (tree / "hardware_catalog" / "b.yaml").write_text(yaml.safe_dump({"fabrics": _minimal()["fabrics"]}))
    assert _cli_error(capsys) == "hardware_catalog/b.yaml: fabrics.net: duplicate entry (also in " \
                                 "hardware_catalog/a.yaml)"


def test_a_bad_model_or_stack_catalog_file_is_refused_the_same_way(tree, capsys):
    (tree / "hardware_catalog" / "hw.yaml").write_text(GOOD)
    (tree / "model_catalog").mkdir()
    (tree / "model_catalog" / "m.yaml").write_text("models:\n  m: {layers: 2, layers: 3}\n")
    assert re.fullmatch(r"model_catalog/m\.yaml: line 2, column \d+: duplicate key 'layers' .*",
                        _cli_error(capsys))
    (tree / "model_catalog" / "m.yaml").write_text("modles: {}\n")
    assert _cli_error(capsys) == ("model_catalog/m.yaml: modles: unknown section 'modles' "
                                  "(did you mean 'models'?)")
    (tree / "model_catalog" / "m.yaml").write_text(
        "models:\n  m: {layers: 2, hidden: 64, heads: 4, vocab: 100, source: 7}\n")
    assert _cli_error(capsys) == ("model_catalog/m.yaml: models.m.source: got a number (7) (expected text "
                                  "naming the document and table, or the repository, file and commit)")
    (tree / "model_catalog" / "m.yaml").unlink()
    (tree / "stack_catalog").mkdir()
    (tree / "stack_catalog" / "s.yaml").write_text(
        "stacks:\n  s: {framework: x, release: '1', kind: training, settings: {}, descripton: y}\n")
    assert _cli_error(capsys) == ("stack_catalog/s.yaml: stacks.s.descripton: unknown key 'descripton' "
                                  "(did you mean 'description'?)")


def test_a_run_that_loads_a_bad_catalog_exits_2_with_the_located_line(tree, capsys):
    bad = _set(_minimal(), "links/lnk/latency", "-2 us")
    (tree / "hardware_catalog" / "hw.yaml").write_text(yaml.safe_dump(bad))
    scenario = ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml"
    line = _cli_error(capsys, ("run", str(scenario), "--estimate"))
    assert line == f"{HW}: links.lnk.latency: '-2 us' must be > 0 (expected one hop, e.g. '3 us')"


def test_lint_over_a_folder_says_a_catalog_error_once(tree, capsys):
    bad = _set(_minimal(), "instances/box/network/nics", -4)
    (tree / "hardware_catalog" / "hw.yaml").write_text(yaml.safe_dump(bad))
    line = _cli_error(capsys, ("lint", str(ROOT / "scenarios" / "examples")))   # one line, not one per file
    assert line == f"{HW}: instances.box.network.nics: -4 is less than 1 (expected an integer >= 1)"


def test_the_explorer_shows_a_catalog_error_with_st_error_not_a_traceback(tree):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    bad = _set(_minimal(), "fabrics/net/efficiency", 0)
    (tree / "hardware_catalog" / "hw.yaml").write_text(yaml.safe_dump(bad))
    st.cache_resource.clear()   # the explorer keeps the catalog per server
    try:
        at = AppTest.from_file(str(ROOT / "app" / "pages" / "4_Catalog.py"), default_timeout=60).run()
    finally:
        st.cache_resource.clear()
    assert not at.exception
    shown = " ".join(e.value for e in at.error).replace("\\", "")
    assert "hardware_catalog/hw.yaml: fabrics.net.efficiency: must be a fraction in (0, 1] (got 0)" in shown


def test_outside_the_working_directory_errors_name_the_full_path(tree, monkeypatch, tmp_path_factory):
    bad = _set(_minimal(), "fabrics/net/kind", "efaa")
    (tree / "hardware_catalog" / "hw.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError) as err:
        load_catalog(str(tree))
    assert err.value.file == "hardware_catalog/hw.yaml"
    load_catalog.cache_clear()
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    with pytest.raises(ConfigError) as err:
        load_catalog(str(tree))
    assert err.value.file == str(tree / "hardware_catalog" / "hw.yaml")
    assert str(err.value).endswith("fabrics.net.kind: 'efaa' is not valid (did you mean 'efa'?)")


# ------------------------------------------------------------------------------------------------
# the docs list what the schema declares


KINDS = {
    "accelerators": ACCELERATOR_KEYS, "accelerators.efficiency": EFFICIENCY_KEYS, "fabrics": FABRIC_KEYS,
    "links": LINK_KEYS, "instances": INSTANCE_KEYS, "instances.scale_up": SCALE_UP_KEYS,
    "instances.network": NETWORK_KEYS, "prices": PRICE_ROW_KEYS, "storage": STORAGE_KEYS,
    "ultracluster": ULTRACLUSTER_KEYS, "failure_rates": FAILURE_RATE_KEYS,
    "failure_rates.components": COMPONENT_KEYS,
}


@pytest.mark.parametrize("kind", KINDS)
def test_docs_catalogs_md_documents_every_key_the_kind_declares_and_no_other(kind):
    text = DOCS.read_text()
    head = f"### `{kind}`"
    assert head in text, f"docs/catalogs.md has no {head} table"
    table = text.split(head, 1)[1].split("\n### ", 1)[0]
    documented = re.findall(r"^\| `([a-z0-9_-]+)` \|", table, flags=re.M)
    assert documented == list(KINDS[kind])
