"""The model catalog and ModelSpec: published parameter totals, round-trips, located errors.

Catalog entries are read two ways: straight from ``model_catalog/*.yaml`` through
``model_from_mapping`` (independent of the hardware catalog), and through ``load_catalog``.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fmsim.catalog import data_root, load_catalog
from fmsim.errors import ConfigError
from fmsim.model.architecture import (
    ACTIVATIONS,
    MOE_KEYS,
    ModelSpec,
    model_from_mapping,
)

CATALOG_DIR = data_root() / "model_catalog"

# ids other engineers use (issue 2, item 5)
REQUIRED_IDS = (
    "gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18b", "gpt-39b", "gpt-76b", "gpt-145b", "gpt-310b",
    "gpt-530b", "gpt-1t", "gpt3-175b", "mt-nlg-530b", "gpt-22b", "gpt-175b",
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-8b", "llama3.1-70b",
    "llama3.1-405b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-32b",
    "qwen3-235b-a22b", "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-72b", "nemotron-4-340b", "mpt-7b",
    "mpt-70b", "bloom-176b",
)
# keys every entry states explicitly, even where a default would give the same value
STATED_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "activation", "vocab",
               "tied_embeddings", "attention", "source")


def _raw_entries() -> list[tuple[Path, str, dict[str, Any]]]:
    out = []
    for path in sorted(CATALOG_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert isinstance(data, dict) and set(data) == {"models"}, f"{path}: one top-level 'models:'"
        for name, entry in data["models"].items():
            out.append((path, str(name), entry))
    return out


ENTRIES = _raw_entries()
BY_NAME = {name: (path, entry) for path, name, entry in ENTRIES}


def _spec(name: str) -> ModelSpec:
    path, entry = BY_NAME[name]
    return model_from_mapping(entry, name=name, file=str(path), where=f"models.{name}", require_source=True)


def _stated_unit(text: Any) -> float:
    """One unit of the last digit a published figure states: ``"1.7B"`` -> 1e8, ``"37B"`` -> 1e9."""
    m = re.fullmatch(r"\s*\d+(?:\.(\d+))?\s*([kMGTB]?)\s*", str(text))
    assert m, f"unexpected published figure {text!r}"
    scale = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12}[m.group(2)]
    return 10.0 ** -len(m.group(1) or "") * scale


def _tolerance(text: Any, published: float) -> float:
    """1 % of the published figure, or one unit of its last stated digit where that is coarser.

    A size label ("1.7B" for 1.652B, Narayanan Table 1) or a truncated figure ("37B activated" for
    DeepSeek-V3's 37.55B) cannot be checked more finely than the digits it states.
    """
    return max(0.01 * published, _stated_unit(text))


# ----------------------------------------------------------------------------------------------
# the catalog


def test_catalog_has_every_required_id():
    missing = [n for n in REQUIRED_IDS if n not in BY_NAME]
    assert not missing


def test_catalog_ids_are_lower_case_hyphenated_and_unique():
    names = [name for _, name, _ in ENTRIES]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", name), name


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_entry_states_its_architecture_and_source(name):
    path, entry = BY_NAME[name]
    missing = [k for k in STATED_KEYS if k not in entry]
    assert not missing, f"{path}: models.{name} lacks {missing}"
    assert str(entry["source"]).strip()
    spec = _spec(name)
    if spec.moe is not None:
        assert "active_params" in entry or "notes" in entry


@pytest.mark.parametrize("name", sorted(n for n, (_, e) in BY_NAME.items() if "params" in e))
def test_computed_total_matches_published_total(name):
    """Catalog architectures reproduce the published total (1 %, or the figure's stated digits)."""
    _, entry = BY_NAME[name]
    spec = _spec(name)
    published = spec.published_params
    assert published
    assert abs(spec.num_params - published) <= _tolerance(entry["params"], published), (
        f"{name}: computed {spec.num_params / 1e9:.3f}B vs published {entry['params']}")


@pytest.mark.parametrize("name", sorted(n for n, (_, e) in BY_NAME.items() if "active_params" in e))
def test_computed_active_matches_published_active(name):
    _, entry = BY_NAME[name]
    spec = _spec(name)
    published = spec.published_active_params
    assert published
    assert abs(spec.num_active_params - published) <= _tolerance(entry["active_params"], published), (
        f"{name}: computed active {spec.num_active_params / 1e9:.3f}B vs published {entry['active_params']}")


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_moe_active_is_below_total_and_dense_active_equals_total(name):
    spec = _spec(name)
    total, active = spec.param_counts()
    if spec.moe is None:
        assert active == total
    else:
        assert 0 < active < total
        assert spec.num_moe_layers > 0


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_catalog_entry_round_trips_through_to_mapping(name):
    spec = _spec(name)
    assert model_from_mapping(spec.to_mapping()) == spec


def test_load_catalog_reads_every_model_file(tmp_path):
    """Through the real loader, with an empty hardware catalog so hardware files cannot interfere."""
    (tmp_path / "hardware_catalog").mkdir()
    shutil.copytree(CATALOG_DIR, tmp_path / "model_catalog")
    catalog = load_catalog(str(tmp_path))
    assert set(catalog.models) == set(BY_NAME)
    assert catalog.model("llama3-70b") == _spec("llama3-70b")


def test_load_catalog_of_the_checkout_serves_required_models():
    catalog = load_catalog()
    for name in REQUIRED_IDS:
        assert isinstance(catalog.model(name), ModelSpec)
    with pytest.raises(ConfigError, match="did you mean 'llama3-70b'"):
        catalog.model("llama3-70B")


# ----------------------------------------------------------------------------------------------
# hand-worked counts


@pytest.mark.parametrize("name", ["gpt-1.7b", "gpt-22b", "gpt-530b", "gpt-1t", "gpt3-175b"])
def test_megatron_gpt_count_is_narayanan_equation_2(name):
    """P = 12lh²(1 + 13/12h + (V+s)/12lh) (Narayanan et al. 2021 eq. 2) plus the final LayerNorm."""
    m = _spec(name)
    l, h, v, s = m.layers, m.hidden, m.vocab, m.max_seq_len
    assert m.num_params == 12 * l * h * h + 13 * l * h + (v + s) * h + 2 * h


def test_llama2_70b_count_equals_its_checkpoint():
    assert _spec("llama2-70b").num_params == 68_976_648_192


def test_llama31_405b_count_equals_its_checkpoint():
    assert _spec("llama3.1-405b").num_params == 405_853_388_800


def test_bloom_count_equals_model_card_less_embedding_layernorm():
    m = _spec("bloom-176b")
    assert m.num_params + 2 * m.hidden == 176_247_271_424


def test_deepseek_v3_mla_block_by_hand():
    m = _spec("deepseek-v3")
    q = 7168 * 1536 + 1536 + 1536 * 128 * (128 + 64)
    kv = 7168 * (512 + 64) + 512 + 512 * 128 * (128 + 128)
    o = 128 * 128 * 7168
    assert m.attention_params() == q + kv + o == 187_107_328


def test_deepseek_v3_moe_layer_by_hand():
    m = _spec("deepseek-v3")
    expert = 3 * 7168 * 2048
    common = m.attention_params() + 2 * 7168 + 256 * 7168 + expert      # norms, router, shared expert
    assert not m.is_moe_layer(2) and m.is_moe_layer(3)
    assert m.layer_params(3) == (common + 256 * expert, common + 8 * expert)
    assert m.layer_params(0)[0] == m.attention_params() + 2 * 7168 + 3 * 7168 * 18432


def test_deepseek_v3_published_total_excludes_mtp_module():
    m = _spec("deepseek-v3")
    total, active = m.param_counts()
    with_mtp, with_mtp_active = m.param_counts(include_mtp=True)
    module = m.layer_params(m.layers - 1)[0] + 2 * 7168 * 7168 + 3 * 7168
    assert with_mtp - total == m.num_mtp_params == module
    assert 11e9 < m.num_mtp_params < 14e9
    assert with_mtp_active > active
    assert abs(total - 671e9) < 0.001 * 671e9


def test_squared_relu_mlp_has_two_matrices_and_swiglu_three():
    nemotron = _spec("nemotron-4-340b")
    llama = _spec("llama3-70b")
    assert nemotron.mlp_params(73728) == 2 * 18432 * 73728
    assert llama.mlp_params(28672) == 3 * 8192 * 28672


def test_learned_positions_add_a_table_and_rope_does_not():
    m = _spec("gpt3-175b")
    rope = model_from_mapping({**m.to_mapping(), "position_embedding": "rope"})
    assert m.num_params - rope.num_params == 2048 * 12288


def test_layer_freq_makes_every_other_layer_moe():
    m = model_from_mapping({"name": "x", "layers": 6, "hidden": 64, "heads": 4, "vocab": 100,
                            "moe": {"experts": 4, "top_k": 1, "layer_freq": 2, "dense_layers": 1}})
    assert [m.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, True]
    assert m.num_moe_layers == 3


# ----------------------------------------------------------------------------------------------
# round-trip and invariants over generated architectures


@st.composite
def architectures(draw) -> dict[str, Any]:
    kv_heads = draw(st.integers(1, 8))
    heads = kv_heads * draw(st.integers(1, 8))
    head_dim = draw(st.sampled_from([16, 32, 64, 128]))
    out: dict[str, Any] = {
        "name": draw(st.from_regex(r"[a-z][a-z0-9\-]{0,12}", fullmatch=True)),
        "layers": draw(st.integers(1, 12)),
        "hidden": heads * head_dim * draw(st.sampled_from([1, 2])),
        "heads": heads,
        "kv_heads": kv_heads,
        "ffn_hidden": draw(st.integers(1, 4096)),
        "activation": draw(st.sampled_from(ACTIVATIONS)),
        "vocab": draw(st.integers(1, 300_000)),
        "tied_embeddings": draw(st.booleans()),
        "bias": draw(st.booleans()),
    }
    if draw(st.booleans()):
        out["head_dim"] = head_dim
    if draw(st.booleans()):
        out["norm"] = draw(st.sampled_from(["layernorm", "rmsnorm"]))
    pos = draw(st.sampled_from(["rope", "learned", "alibi", "none", None]))
    if pos is not None:
        out["position_embedding"] = pos
    if pos == "learned" or draw(st.booleans()):
        out["max_seq_len"] = draw(st.integers(1, 200_000))
    if draw(st.booleans()):
        out["attention"] = {"kind": "mla", "q_lora_rank": draw(st.integers(0, 2048)),
                            "kv_lora_rank": draw(st.integers(1, 1024)),
                            "qk_nope_dim": draw(st.integers(1, 256)),
                            "qk_rope_dim": draw(st.integers(1, 128)),
                            "v_head_dim": draw(st.integers(1, 256))}
    if draw(st.booleans()):
        experts = draw(st.integers(1, 512))
        out["moe"] = {"experts": experts, "top_k": draw(st.integers(1, experts)),
                      "expert_ffn_hidden": draw(st.integers(1, 4096)),
                      "shared_experts": draw(st.integers(0, 2)),
                      "shared_expert_ffn_hidden": draw(st.integers(0, 4096)),
                      "dense_layers": draw(st.integers(0, out["layers"] - 1)),
                      "dense_ffn_hidden": draw(st.integers(0, 8192)),
                      "capacity_factor": draw(st.sampled_from([0.0, 1.0, 1.25, 2])),
                      "layer_freq": draw(st.integers(1, 3))}
        if draw(st.booleans()):
            groups = draw(st.sampled_from([g for g in (1, 2, 4, 8) if experts % g == 0]))
            per_group = experts // groups
            group_topk = draw(st.integers(-(-out["moe"]["top_k"] // per_group), groups))
            out["moe"].update(router_groups=groups, router_group_topk=group_topk)
        out["mtp_layers"] = draw(st.integers(0, 2))
    if draw(st.booleans()):
        out["params"] = draw(st.sampled_from(["7B", "70.6B", 1.5e9, 123456789]))
    if draw(st.booleans()):
        out["source"] = draw(st.text(min_size=1, max_size=30))
    return out


@settings(max_examples=60, deadline=None)
@given(architectures())
def test_to_mapping_round_trips_through_model_from_mapping(data):
    spec = model_from_mapping(data)
    mapping = spec.to_mapping()
    again = model_from_mapping(mapping)
    assert again == spec
    assert again.to_mapping() == mapping
    assert again.param_counts(include_mtp=True) == spec.param_counts(include_mtp=True)


@settings(max_examples=40, deadline=None)
@given(architectures())
def test_active_never_exceeds_total_and_mtp_only_adds(data):
    spec = model_from_mapping(data)
    total, active = spec.param_counts()
    assert 0 < active <= total
    t_mtp, a_mtp = spec.param_counts(include_mtp=True)
    assert t_mtp - total == spec.num_mtp_params >= 0
    assert (t_mtp > total) == (spec.mtp_layers > 0)
    assert a_mtp >= active


@settings(max_examples=40, deadline=None)
@given(architectures(), st.integers(1, 64))
def test_more_experts_add_to_total_but_not_to_active(data, extra):
    data = {**data, "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 256}}
    few = model_from_mapping(data)
    many = model_from_mapping({**data, "moe": {**data["moe"], "experts": 8 + extra}})
    assert many.num_params > few.num_params
    # only the router grows with the expert count on the active path
    assert many.num_active_params - few.num_active_params == extra * data["hidden"] * many.num_moe_layers


# ----------------------------------------------------------------------------------------------
# malformed mappings: ConfigError at the right field path


BASE = {"name": "m", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "vocab": 1000,
        "activation": "swiglu", "ffn_hidden": 1024}


def _error(data: Any, **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        model_from_mapping(data, **kw)
    return info.value


def test_unknown_key_is_named_with_a_suggestion_and_the_file():
    err = _error({**BASE, "hiden": 512}, file="model_catalog/x.yaml", where="models.m")
    assert err.field == "models.m.hiden"
    assert "did you mean 'hidden'" in err.message
    assert str(err).startswith("model_catalog/x.yaml: models.m.hiden: unknown key")


def test_unknown_moe_key_is_located_under_moe():
    err = _error({**BASE, "moe": {"experts": 8, "top_k": 2, "expert_ffn": 64}})
    assert err.field == "model.moe.expert_ffn"
    assert "did you mean 'expert_ffn_hidden'" in err.message


def test_router_groups_must_divide_the_experts_and_hold_the_top_k():
    assert _error({**BASE, "moe": {"experts": 8, "top_k": 2, "router_groups": 3}}).field == "model.moe.router_groups"
    err = _error({**BASE, "moe": {"experts": 8, "top_k": 2, "router_groups": 4, "router_group_topk": 5}})
    assert err.field == "model.moe.router_group_topk" and "exceeds 4" in err.message
    err = _error({**BASE, "moe": {"experts": 8, "top_k": 4, "router_groups": 4, "router_group_topk": 1}})
    assert "cannot hold top_k 4" in err.message
    spec = model_from_mapping({**BASE, "moe": {"experts": 8, "top_k": 4, "router_groups": 4, "router_group_topk": 2}})
    assert spec.moe.token_groups() == 2
    assert model_from_mapping({**BASE, "moe": {"experts": 8, "top_k": 2}}).moe.token_groups() == 1


def test_kv_heads_not_dividing_heads_is_rejected():
    err = _error({**BASE, "kv_heads": 3})
    assert err.field == "model.kv_heads"
    assert "3 does not divide 8 heads" in err.message


def test_top_k_above_experts_is_rejected():
    err = _error({**BASE, "moe": {"experts": 4, "top_k": 8, "expert_ffn_hidden": 64}})
    assert err.field == "model.moe.top_k"
    assert "exceeds 4 experts" in err.message


def test_mla_without_dimensions_is_rejected():
    err = _error({**BASE, "attention": "mla"})
    assert err.field == "model.attention"
    assert "kv_lora_rank" in err.message


def test_mla_missing_one_dimension_names_it():
    err = _error({**BASE, "attention": {"kind": "mla", "kv_lora_rank": 512, "qk_nope_dim": 128,
                                        "qk_rope_dim": 64}})
    assert err.field == "model.attention.v_head_dim"
    assert err.message == "is required"


def test_mla_unknown_dimension_gets_a_suggestion():
    err = _error({**BASE, "attention": {"kind": "mla", "kv_lora": 512}})
    assert err.field == "model.attention.kv_lora"
    assert "did you mean 'kv_lora_rank'" in err.message


def test_attention_kind_contradicting_kv_heads_is_rejected():
    assert _error({**BASE, "kv_heads": 2, "attention": "mha"}).field == "model.kv_heads"
    assert _error({**BASE, "kv_heads": 2, "attention": "mqa"}).field == "model.kv_heads"
    assert model_from_mapping({**BASE, "kv_heads": 1, "attention": "mqa"}).kv_heads == 1
    assert model_from_mapping({k: v for k, v in BASE.items() if k != "kv_heads"} | {"attention": "mqa"}
                              ).kv_heads == 1


def test_unknown_activation_and_attention_get_suggestions():
    assert "did you mean 'swiglu'" in _error({**BASE, "activation": "swiglue"}).message
    err = _error({**BASE, "attention": "gqaa"})
    assert err.field == "model.attention" and "did you mean 'gqa'" in err.message


def test_learned_positions_need_max_seq_len():
    err = _error({**BASE, "position_embedding": "learned"})
    assert err.field == "model.max_seq_len"


def test_missing_required_and_malformed_values_are_located():
    assert _error({k: v for k, v in BASE.items() if k != "vocab"}).field == "model.vocab"
    assert _error({**BASE, "layers": 2.5}).field == "model.layers"
    assert _error({**BASE, "tied_embeddings": "yes"}).field == "model.tied_embeddings"
    assert _error({**BASE, "params": "lots"}).field == "model.params"
    assert _error({**BASE, "params": "1B", "active_params": "2B"}).field == "model.active_params"
    too_dense = {**BASE, "moe": {"experts": 4, "top_k": 1, "dense_layers": 4}}
    assert _error(too_dense).field == "model.moe.dense_layers"
    assert _error([1, 2]).field == "model"


def test_catalog_entries_require_a_source():
    err = _error({**BASE}, require_source=True, where="models.m", file="f.yaml")
    assert err.field == "models.m.source"


def test_moe_keys_are_all_emitted_by_to_mapping():
    spec = model_from_mapping({**BASE, "moe": {"experts": 4, "top_k": 2}})
    assert set(spec.to_mapping()["moe"]) == set(MOE_KEYS)
