"""Model entries (a ``model_catalog/`` entry, an inline ``workload.model``) are read by the one validating
reader of scenarios and catalogs (:class:`fmsim.fields._Section`): every catalog model reads to the same
:class:`ModelSpec` as the architecture's own reader made before it moved onto it, and every hostile model
entry is one located line ``FILE: field.path: rule (got ...)`` and exit 2 from the CLI, never a traceback.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from fmsim.catalog import data_root, entries, load_catalog, read_folder
from fmsim.cli import main
from fmsim.model.architecture import MODEL_KEYS
from test_catalog_reader import GOOD, _cli_error, tree  # noqa: F401 (tree: a fixture)

ROOT = Path(__file__).resolve().parents[1]
# repr(ModelSpec) of every catalog model as the architecture's own reader made it (main @ df3873b), with
# a hash of the entry it was read from: an entry edited since is skipped, not compared.
BEFORE = json.loads((ROOT / "tests" / "golden" / "model_specs_before_reader.json").read_text())


def _entry_hash(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_every_catalog_model_reads_to_the_same_spec_as_before_the_reader_moved():
    cat = load_catalog()
    compared = 0
    for name, entry in entries(read_folder(data_root() / "model_catalog"), "models", MODEL_KEYS, "model"):
        before = BEFORE.get(name)
        if before is None or before["entry"] != _entry_hash(entry.data):
            continue
        assert repr(cat.model(name)) == before["spec"], name
        compared += 1
    assert compared >= len(BEFORE) // 2 > 0      # most entries are unchanged: the comparison is not empty


# ------------------------------------------------------------------------------------------------
# hostile model entries, through the CLI

BASE = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "source": "test"}

# (what is wrong, the entry's keys on top of BASE, the field, the rule the one line states)
HOSTILE = [
    ("unknown key", {"hiden": 64}, "hiden", "unknown key 'hiden' (did you mean 'hidden'?)"),
    ("unknown moe key", {"moe": {"experts": 4, "top_k": 2, "topk": 2}}, "moe.topk",
     "unknown key 'topk' (did you mean 'top_k'?)"),
    ("unknown mla key", {"attention": {"kind": "mla", "kv_lora": 8}}, "attention.kv_lora",
     "unknown key 'kv_lora' (did you mean 'kv_lora_rank'?)"),
    ("wrong type", {"layers": "eight"}, "layers", "got a string ('eight') (expected an integer >= 1)"),
    ("boolean count", {"heads": True}, "heads", "got a boolean (true) (expected an integer >= 1)"),
    ("fractional", {"hidden": 64.5}, "hidden", "got a number (64.5) (expected an integer >= 1)"),
    ("not a mapping", {"moe": 8}, "moe", "got a number (8) (expected a mapping {experts, top_k, "
                                         "expert_ffn_hidden, ...})"),
    ("wrong type flag", {"tied_embeddings": "yes"}, "tied_embeddings",
     "got a string ('yes') (expected true or false)"),
    ("unknown choice", {"activation": "swiglue"}, "activation", "'swiglue' is not valid (did you mean 'swiglu'?)"),
    ("negative", {"heads": -4}, "heads", "-4 is less than 1 (expected an integer >= 1)"),
    ("negative experts", {"moe": {"experts": -1, "top_k": 1}}, "moe.experts",
     "-1 is less than 1 (expected an integer >= 1)"),
    ("negative capacity", {"moe": {"experts": 4, "top_k": 1, "capacity_factor": -1}}, "moe.capacity_factor",
     "must be a number in 0..4 (0 = dropless; past the expert count a capacity pads nothing more) (got -1)"),
    ("negative params", {"params": "-7B"}, "params", "must be a parameter count in (0, 1e+14] (got '-7B')"),
    ("huge layers", {"layers": 10**12}, "layers", "1,000,000,000,000 is more than 4,096 (expected 1..4,096)"),
    ("huge vocab", {"vocab": 10**30}, "vocab", "is more than 16,777,216"),
    ("huge window", {"attention_window": {"size": 1e300}}, "attention_window.size", "is more than 100,000,000"),
    ("huge params", {"params": "1e300T"}, "params", "must be a parameter count in (0, 1e+14] (got '1e300T')"),
    ("huge model", {"layers": 4096, "hidden": 2**20, "heads": 4}, "",
     "parameters is past the 1e+14 any run could train"),
]


@pytest.fixture
def models(tree):
    """test_catalog_reader's catalog tree (the CLI reads it; errors name ``model_catalog/m.yaml``) with its
    good hardware file and an empty model folder."""
    (tree / "hardware_catalog" / "hw.yaml").write_text(GOOD)
    (tree / "model_catalog").mkdir()
    return tree


def _located(file: str, where: str, field: str, rule: str) -> str:
    return f"{file}: {where}.{field}: " if field else f"{file}: {where}: "


@pytest.mark.parametrize("what, keys, field, rule", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_catalog_model_entry_is_one_located_line_and_exit_2(models, capsys, what, keys, field, rule):
    (models / "model_catalog" / "m.yaml").write_text(yaml.safe_dump({"models": {"m": {**BASE, **keys}}}))
    line = _cli_error(capsys, ("catalog", "show", "box"))
    assert line.startswith(_located("model_catalog/m.yaml", "models.m", field, rule)), line
    assert rule in line, line


@pytest.mark.parametrize("what, keys, field, rule", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_inline_model_is_one_located_line_and_exit_2(tmp_path, capsys, what, keys, field, rule):
    doc = yaml.safe_load((ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml").read_text())
    doc["workload"]["model"] = {"name": "m", **BASE, **keys}
    doc.pop("expect", None)
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(doc))
    line = _cli_error(capsys, ("run", str(path)))
    assert line.startswith(_located(str(path), "workload.model", field, rule)), line
    assert rule in line, line


def test_a_catalog_model_that_is_not_a_mapping_or_has_a_key_that_is_no_name_is_refused(models, capsys):
    (models / "model_catalog" / "m.yaml").write_text("models:\n  m: 7\n")
    assert _cli_error(capsys, ("catalog", "show", "box")).startswith("model_catalog/m.yaml: models.m: got a "
                                                                      "number (7) (expected a mapping")
    (models / "model_catalog" / "m.yaml").write_text("models:\n  m: {layers: 2, 1: 2}\n")
    assert "models.m.1: key 1 is not a name" in _cli_error(capsys, ("catalog", "show", "box"))
