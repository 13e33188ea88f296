"""Scenario files (schema v1): valid files load with every field, rules are enforced with located
errors, the reader refuses unsafe input, overrides apply before validation, and specs round-trip."""

import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

import fmsim
from fmsim.catalog import load_catalog
from fmsim.errors import ConfigError, ParallelismError
from fmsim.scenario import (
    MAX_ALIASES,
    MAX_FILE_BYTES,
    Expect,
    apply_overrides,
    load_scenario,
    load_yaml_text,
    parse_set_option,
    scenario_from_mapping,
    scenario_to_mapping,
)

DATA = Path(__file__).parent / "data"
LLAMA = DATA / "llama3-70b-p5.yaml"
MOE = DATA / "moe-finetune-inline.yaml"


def base() -> dict:
    """The Llama 3 70B example as a mapping, to vary one field at a time."""
    return yaml.safe_load(LLAMA.read_text())


def build(data: dict, **kw):
    return scenario_from_mapping(data, file="x.yaml", **kw)


def rejected(data, field: str, match: str = "", **kw) -> ConfigError:
    with pytest.raises(ConfigError, match=match) as info:
        build(data, **kw)
    assert info.value.field == field, str(info.value)
    assert info.value.file == "x.yaml"
    return info.value


# -- valid files ---------------------------------------------------------------------------------


def test_llama_example_loads_through_the_package_facade():
    sc = fmsim.load_scenario(LLAMA)
    assert sc.name == "llama3-70b-pretrain-p5" and sc.version == 1 and sc.file == str(LLAMA)
    assert sc.workload.model.name == "llama3-70b" and sc.workload.model.heads == 64
    assert sc.workload.kind == "pretrain" and sc.workload.precision == "bf16"
    assert (sc.workload.seq_len, sc.workload.global_batch, sc.workload.micro_batch) == (8192, 2048, 1)
    assert sc.workload.train_tokens == 15e12
    assert sc.cluster.instance.name == "p5.48xlarge" and (sc.cluster.nodes, sc.cluster.gpus) == (16, 128)
    p = sc.parallelism
    assert (p.tp, p.pp, p.dp, p.cp, p.ep, p.vpp) == (8, 4, 4, 1, 1, 1)  # dp: auto = 128 / 32
    assert p.schedule == "1f1b" and p.recompute == "selective" and p.zero == 1 and p.sequence_parallel
    assert p.order == ("tp", "cp", "ep", "dp", "pp")  # Megatron-Core default, PP outermost
    assert sc.pricing.option == "on-demand" and sc.pricing.usd_per_hour is None
    assert sc.checkpoint.every_s == 1800 and sc.checkpoint.async_
    assert sc.reliability.node_mtbf_s == 3.6e6 and sc.reliability.restart_s == 600
    assert sc.expect == {"step_time_s": Expect(value=12.3, rel_tol=0.05)}  # short name step_time
    assert sc.seed == 0 and sc.measured == {} and sc.extra == {}


def test_pipeline_sends_wait_by_default_only_in_the_1f1b_schedule():
    # Megatron-Core overlaps p2p with compute in its interleaved schedule (overlap_p2p_comm); its 1F1B
    # waits on each send and receive; GPipe-style schedules post them asynchronously
    one = load_scenario(LLAMA, overrides={"parallelism.vpp": 1, "parallelism.schedule": "1f1b"})
    inter = load_scenario(LLAMA, overrides={"parallelism.vpp": 2, "parallelism.schedule": "interleaved"})
    gpipe = load_scenario(LLAMA, overrides={"parallelism.vpp": 1, "parallelism.schedule": "gpipe"})
    assert not one.parallelism.overlap.pp_comm and inter.parallelism.overlap.pp_comm
    assert gpipe.parallelism.overlap.pp_comm
    forced = load_scenario(LLAMA, overrides={"parallelism.vpp": 1, "parallelism.schedule": "1f1b",
                                               "parallelism.overlap": {"pp_comm": True}})
    assert forced.parallelism.overlap.pp_comm
    # the canonical mapping keeps a departure from the default, and leaves the default to the schedule
    assert scenario_from_mapping(scenario_to_mapping(forced)).parallelism.overlap.pp_comm
    data = scenario_to_mapping(one)
    assert "pp_comm" not in data["parallelism"]["overlap"]
    data["parallelism"].update(vpp=2, schedule="interleaved")
    assert scenario_from_mapping(data).parallelism.overlap.pp_comm


def test_every_field_of_the_contract_is_accepted():
    sc = load_scenario(MOE)
    wl, p, cl = sc.workload, sc.parallelism, sc.cluster
    assert sc.seed == 7 and wl.kind == "finetune" and wl.precision == "fp8"
    assert wl.model.moe.experts == 16 and wl.model.kv_heads == 4
    assert wl.global_batch == 256  # global_batch_tokens: 1M -> 2^20 / 4096
    assert wl.train_tokens == 2e9
    assert (p.tp, p.pp, p.dp, p.ep, p.vpp, p.schedule) == (2, 2, 8, 4, 2, "interleaved")
    assert p.zero == 3 and p.recompute == "full"
    assert p.overlap == fmsim.scenario.Overlap(grad_reduce=True, param_gather=False, tp_comm=True, tp_backward=False,
                                               pp_comm=False)
    assert p.order == ("tp", "ep", "cp", "pp", "dp")
    assert (cl.nodes, cl.gpus, cl.oversubscription) == (4, 32, 2.0)
    assert cl.instance.num_nics == 16 and cl.instance.nic_bytes_per_s == 25e9  # 200 Gbps
    assert cl.instance.fabric.name == "efa-v2"
    assert cl.storage == {
        "kind": "fsx-lustre",
        "deployment": "persistent-2",
        "throughput_per_tib": 250e6,
        "capacity": 480 * 2.0**40,
    }
    assert sc.pricing.option is None and sc.pricing.usd_per_hour == 40
    assert sc.checkpoint.every_s == 7200 and not sc.checkpoint.async_
    assert sc.reliability.node_mtbf_s == 50 * 86400 and sc.reliability.restart_s == 600
    assert sc.measured == {
        "step_time_s": 1.9,
        "tokens_per_s_per_gpu": 17200.0,
        "model_tflops_per_gpu": 310.0,
        "mfu": 0.31,
    }
    assert sc.measured_source.startswith("made-up") and sc.flops_formula == "palm"
    assert sc.measured_peak_flop_per_s == 989e12 and sc.measured_notes["notes"]
    assert sc.expect["step_time_s"].value == pytest.approx(1.9)
    assert sc.expect["mfu"] == Expect(value=0.31, rel_tol=0.0, abs_tol=0.02)
    assert sc.expect["fits"].value == 1.0


def test_scenario_specs_are_frozen():
    sc = load_scenario(LLAMA)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.name = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.parallelism.tp = 4


def test_gpus_is_an_alternative_to_nodes():
    d = base()
    del d["cluster"]["nodes"]
    d["cluster"]["gpus"] = 128
    assert build(d).cluster.nodes == 16


def test_dp_given_explicitly_must_match_the_cluster():
    d = base()
    d["parallelism"]["dp"] = 4
    assert build(d).parallelism.dp == 4


def test_global_batch_tokens_divides_exactly_or_by_the_binary_reading():
    d = base()
    del d["workload"]["global_batch"]
    d["workload"]["global_batch_tokens"] = 8192 * 512
    assert build(d).workload.global_batch == 512
    d["workload"]["global_batch_tokens"] = "16M"  # 16,000,000 is not whole; 2^24 = 2048 x 8192
    assert build(d).workload.global_batch == 2048
    d["workload"]["global_batch_tokens"] = "16Mi"
    assert build(d).workload.global_batch == 2048


def test_kv_heads_fewer_than_tp_are_replicated_not_an_error():
    d = base()  # llama3-70b: 64 heads, 8 KV heads
    d["parallelism"].update(tp=16, pp=2)
    assert build(d).parallelism.tp == 16


def test_uneven_pipeline_splits_are_allowed():
    d = base()  # 80 layers over 3 x 7 = 21 virtual stages
    d["parallelism"].update(pp=3, vpp=7, schedule="interleaved")
    d["cluster"]["nodes"] = 12
    d["workload"]["global_batch"] = 2040
    p = build(d).parallelism
    assert (p.pp, p.vpp, p.dp) == (3, 7, 4)


def test_vpp_implies_the_interleaved_schedule():
    d = base()
    d["parallelism"]["vpp"] = 5
    del d["parallelism"]["schedule"]
    assert build(d).parallelism.schedule == "interleaved"
    d["parallelism"]["schedule"] = "1f1b"
    rejected(d, "parallelism.schedule", "expected interleaved")


def _moe_mapping() -> dict:
    return yaml.safe_load(MOE.read_text())


def test_expert_parallelism_may_fold_over_tensor_parallel_ranks():
    d = _moe_mapping()  # tp 2, dp 8: ep 16 > dp*cp but divides tp*cp*dp
    d["parallelism"]["ep"] = 16
    assert build(d).parallelism.ep == 16
    d["parallelism"]["ep"] = 32  # but not beyond tp*cp*dp (and not the 16 experts)
    rejected(d, "parallelism.ep", "does not divide the 16 experts")


def test_cp_needs_seq_len_divisible_by_twice_cp():
    d = base()
    d["parallelism"]["cp"] = 2
    d["parallelism"]["pp"] = 2
    assert build(d).parallelism.cp == 2


def test_fp8_on_an_a100_names_the_accelerator():
    d = base()
    d["cluster"]["instance"] = "p4d.24xlarge"
    d["workload"]["precision"] = "fp8"
    err = rejected(d, "workload.precision", "not supported")
    assert "a100" in str(err)


def test_network_fabric_may_be_a_kind_keeping_the_nodes_nics():
    d = base()
    d["cluster"]["instance"] = "dgx-h100"
    d["cluster"]["network"] = {"fabric": "roce"}
    cl = build(d).cluster
    dgx = load_catalog().instance("dgx-h100")
    assert cl.instance.fabric.kind == "roce"
    assert cl.instance.num_nics == dgx.num_nics and cl.instance.nic_bytes_per_s == dgx.nic_bytes_per_s


def test_network_fabric_by_name_takes_its_nic_rate():
    d = base()
    d["cluster"]["network"] = {"fabric": "efa-v4", "nics_per_node": 8}
    inst = build(d).cluster.instance
    cat = load_catalog()
    assert inst.fabric == cat.fabric("efa-v4")
    assert inst.nic_bytes_per_s == cat.fabric("efa-v4").nic_bytes_per_s and inst.num_nics == 8


def test_in_network_reduction_turns_on_sharp_for_an_infiniband_fabric_and_survives_the_round_trip():
    d = base()
    d["cluster"]["instance"] = "dgx-h100"
    d["cluster"]["network"] = {"in_network_reduction": True}
    sc = build(d)
    assert sc.cluster.instance.fabric.in_network_reduction
    assert not load_catalog().fabric(sc.cluster.instance.fabric.name).in_network_reduction
    again = scenario_from_mapping(scenario_to_mapping(sc))
    assert again.cluster.instance.fabric.in_network_reduction


def test_in_network_reduction_on_efa_is_refused_naming_the_fabric():
    d = base()
    d["cluster"]["network"] = {"in_network_reduction": True}
    err = rejected(d, "cluster.network.in_network_reduction", "InfiniBand")
    assert "efa" in str(err)


def test_inference_kind_keeps_its_sections_raw_and_needs_no_batch_geometry():
    d = base()
    d["workload"] = {"kind": "inference", "model": "llama3-70b", "precision": "fp8"}
    del d["expect"]
    d["traffic"] = {"arrival": "poisson", "rate": "10/s"}
    d["serving"] = {"max_batch_tokens": 8192}
    d["slo"] = {"ttft_p99": "2 s"}
    d["measured"] = {"ttft_p50": "120 ms", "output_tokens_per_s": "12k", "source": "a benchmark"}
    sc = build(d)
    assert sc.workload.seq_len == 0 and sc.workload.global_batch == 0
    assert sc.extra == {
        "traffic": {"arrival": "poisson", "rate": "10/s"},
        "serving": {"max_batch_tokens": 8192},
        "slo": {"ttft_p99": "2 s"},
    }
    assert sc.measured == {"ttft_p50_s": pytest.approx(0.12), "output_tokens_per_s": 12000.0}


def test_rl_kind_accepts_its_rl_section():
    d = base()
    d["workload"]["kind"] = "rl"
    d["rl"] = {"algorithm": "grpo"}
    assert build(d).extra == {"rl": {"algorithm": "grpo"}}


def test_metrics_of_another_kind_are_rejected():
    d = base()
    d["expect"] = {"ttft_p50_s": {"value": 1, "rel_tol": 0.1}}
    rejected(d, "expect.ttft_p50_s", "not a metric of a pretrain run")


def test_measured_accepts_the_short_names_and_unit_strings():
    d = base()
    d["measured"] = {
        "step_time": "12 s",
        "tflops_per_gpu": "400 TFLOP/s",
        "hfu": "52%",
        "source": "x",
        "flops_formula": "megatron-2021",
        "peak": "989 TFLOP/s",
    }
    sc = build(d)
    assert sc.measured == {"step_time_s": 12.0, "model_tflops_per_gpu": 400.0, "hfu": 0.52}
    d["measured"]["step_time_s"] = 12
    rejected(d, "measured.step_time_s", "given twice")


def test_unknown_measured_key_gets_a_suggestion():
    d = base()
    d["measured"] = {"tokens_per_sec": 100, "source": "x"}
    rejected(d, "measured.tokens_per_sec", "did you mean 'tokens_per_s'")


def test_expect_band_follows_the_isclose_rule():
    e = Expect(value=10.0, rel_tol=0.05, abs_tol=0.0)
    assert e.band() == (9.5, 10.5)
    assert e.contains(10.5) and e.contains(9.5) and not e.contains(10.51) and not e.contains(None)
    assert not e.contains(math.nan)
    assert Expect(value=0.3, rel_tol=0.0, abs_tol=0.02).contains(0.315)


def test_nodes_of_an_ultraserver_come_in_whole_units():
    cat = load_catalog()
    units = [i for i in cat.instances.values() if i.provider == "aws" and i.nodes_per_unit > 1]
    if not units:
        pytest.skip("no UltraServer in the catalog")
    inst = units[0]
    d = {
        "version": 1,
        "name": "u",
        "workload": {"kind": "inference", "model": "llama3-70b"},
        "cluster": {"instance": inst.name, "nodes": inst.nodes_per_unit + 1},
    }
    if 64 % inst.num_accelerators:
        pytest.skip("accelerator count does not divide the model's heads")
    rejected(d, "cluster.nodes", f"units of {inst.nodes_per_unit} nodes")


# -- overrides -----------------------------------------------------------------------------------


def test_overrides_apply_before_validation():
    sc = load_scenario(LLAMA, overrides={"parallelism.tp": 4, "workload.precision": "fp8"})
    assert sc.parallelism.tp == 4 and sc.parallelism.dp == 8 and sc.workload.precision == "fp8"


def test_overrides_are_validated_like_the_file():
    with pytest.raises(ParallelismError) as info:
        load_scenario(LLAMA, overrides={"parallelism.tp": 12})
    assert info.value.field == "parallelism.tp" and info.value.file == str(LLAMA)


def test_overrides_create_missing_sections_and_leave_the_input_alone():
    d = base()
    out = apply_overrides(d, {"cluster.network.oversubscription": 2, "seed": 3})
    assert out["cluster"]["network"] == {"oversubscription": 2} and out["seed"] == 3
    assert "network" not in d["cluster"] and "seed" not in d


def test_override_through_a_scalar_is_an_error():
    with pytest.raises(ConfigError, match="workload.model is a string") as info:
        apply_overrides(base(), {"workload.model.layers": 40}, file="x.yaml")
    assert info.value.field == "workload.model.layers"


@pytest.mark.parametrize(
    "text, key, value",
    [
        ("parallelism.tp=4", "parallelism.tp", 4),
        ("workload.precision=fp8", "workload.precision", "fp8"),
        ("parallelism.sequence_parallel=false", "parallelism.sequence_parallel", False),
        ("checkpoint.every=30 min", "checkpoint.every", "30 min"),
        ("pricing={usd_per_hour: 40}", "pricing", {"usd_per_hour": 40}),
        ("parallelism.order=[tp, pp, cp, ep, dp]", "parallelism.order", ["tp", "pp", "cp", "ep", "dp"]),
        ("description=null", "description", None),
    ],
)
def test_set_options_are_read_as_yaml_values(text, key, value):
    assert parse_set_option(text) == (key, value)


@pytest.mark.parametrize("text", ["tp4", "=4", "a..b=1", "parallelism.tp=[4", "parallelism.tp=", "description= "])
def test_malformed_set_options_are_config_errors(text):
    with pytest.raises(ConfigError):
        parse_set_option(text)


# -- reader safety -------------------------------------------------------------------------------


def test_files_over_the_size_limit_are_refused_before_parsing(tmp_path, monkeypatch):
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_FILE_BYTES + "\nversion: 1\n")

    def never(*a, **k):
        raise AssertionError("parsed an oversize file")

    monkeypatch.setattr(fmsim.scenario, "load_yaml_text", never)
    with pytest.raises(ConfigError, match="limit") as info:
        load_scenario(big)
    assert info.value.file == str(big)


def test_empty_file_is_refused(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_bytes(b"")
    with pytest.raises(ConfigError, match="the file is empty"):
        load_scenario(f)


def test_missing_file_directory_and_binary_file_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_scenario(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_scenario(tmp_path)
    b = tmp_path / "b.yaml"
    b.write_bytes(b"version: 1\nname: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_scenario(b)


def test_duplicate_keys_name_both_lines():
    with pytest.raises(ConfigError, match=r"line 3, column 1: duplicate key 'a' \(first given at line 1\)"):
        load_yaml_text("a: 1\nb: 2\na: 3\n")


def test_merge_keys_are_not_duplicates():
    assert load_yaml_text("base: &b {x: 1}\nc:\n  <<: *b\n  y: 2\n") == {
        "base": {"x": 1},
        "c": {"x": 1, "y": 2},
    }


def test_a_few_aliases_are_fine_but_many_are_refused():
    ok = "a: &a 1\n" + "".join(f"k{i}: *a\n" for i in range(MAX_ALIASES))
    assert load_yaml_text(ok)["k0"] == 1
    with pytest.raises(ConfigError, match="aliases"):
        load_yaml_text(ok + "one_more: *a\n")


def test_billion_laughs_is_refused():
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    prev = "a"
    for name in "bcdefghij":
        text += f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
        prev = name
    with pytest.raises(ConfigError, match="alias bomb"):
        load_yaml_text(text)


def test_deep_nesting_is_refused():
    with pytest.raises(ConfigError, match="nested deeper"):
        load_yaml_text("[" * 200 + "]" * 200)


def test_unsafe_tags_are_refused_with_their_line():
    with pytest.raises(ConfigError, match="line 2"):
        load_yaml_text("a: 1\nb: !!python/object/apply:os.system ['true']\n")


def test_multiple_documents_are_refused():
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_yaml_text("a: 1\n---\nb: 2\n")


# -- round trips ---------------------------------------------------------------------------------


def roundtrip(sc):
    text = yaml.safe_dump(scenario_to_mapping(sc), sort_keys=False)
    return scenario_from_mapping(load_yaml_text(text), file=sc.file)


@pytest.mark.parametrize("path", [LLAMA, MOE])
def test_example_files_round_trip(path):
    sc = load_scenario(path)
    assert roundtrip(sc) == sc


def test_catalog_models_are_written_by_name():
    assert scenario_to_mapping(load_scenario(LLAMA))["workload"]["model"] == "llama3-70b"


NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-_."


@st.composite
def scenario_mappings(draw) -> dict:
    heads = draw(st.sampled_from([8, 16, 32]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8, 16, 32) if heads % k == 0]))
    layers = draw(st.integers(4, 40))
    moe = draw(st.booleans())
    model = {
        "name": draw(st.text(NAME_CHARS, min_size=1, max_size=12)),
        "layers": layers,
        "hidden": heads * 64,
        "heads": heads,
        "kv_heads": kv,
        "head_dim": draw(st.sampled_from([64, 128])),
        "ffn_hidden": draw(st.integers(64, 8192)),
        "activation": draw(st.sampled_from(["gelu", "swiglu", "geglu", "relu2"])),
        "vocab": draw(st.integers(1000, 256000)),
        "tied_embeddings": draw(st.booleans()),
    }
    if moe:
        model["moe"] = {
            "experts": 8,
            "top_k": draw(st.integers(1, 8)),
            "expert_ffn_hidden": draw(st.integers(64, 4096)),
            "shared_experts": draw(st.integers(0, 2)),
            "dense_layers": draw(st.integers(0, 2)),
        }
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if p <= layers]))
    cp = draw(st.sampled_from([1, 2]))
    nodes = draw(st.integers(1, 8))
    gpus = nodes * 8
    assume(gpus % (tp * pp * cp) == 0)
    dp = gpus // (tp * pp * cp)
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (tp * cp * dp) % e == 0])) if moe else 1
    vpp = draw(st.sampled_from([v for v in (1, 2, 3) if pp > 1 and pp * v <= layers] or [1]))
    micro = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["pretrain", "finetune"]))
    data = {
        "version": 1,
        "name": draw(st.text(NAME_CHARS, min_size=1, max_size=30)),
        "workload": {
            "kind": kind,
            "model": model,
            "precision": draw(st.sampled_from(["bf16", "fp16", "fp8", "fp32"])),
            "seq_len": draw(st.sampled_from([1024, 2048, 8192])),
            "micro_batch": micro,
            # interleaved: micro-batches in whole groups of pp (refused at load otherwise)
            "global_batch": dp * micro * (pp if vpp > 1 else 1) * draw(st.integers(1, 64)),
        },
        "parallelism": {
            "tp": tp,
            "pp": pp,
            "dp": draw(st.sampled_from(["auto", dp])),
            "cp": cp,
            "ep": ep,
            "vpp": vpp,
            "schedule": "interleaved" if vpp > 1 else draw(st.sampled_from(["gpipe", "1f1b"])),
            "sequence_parallel": draw(st.booleans()),
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "zero": draw(st.integers(0, 3)),
            "gradient_accumulation_fusion": draw(st.booleans()),
            "overlap": {
                "grad_reduce": draw(st.booleans()),
                "param_gather": draw(st.booleans()),
                "tp_comm": draw(st.booleans()),
                "tp_backward": draw(st.booleans()),
                "pp_comm": draw(st.booleans()),
            },
            "order": draw(st.permutations(["tp", "cp", "ep", "pp", "dp"])),
        },
        "cluster": {"instance": "p5.48xlarge", "nodes": nodes},
    }
    if draw(st.booleans()):
        data["description"] = draw(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40))
    if draw(st.booleans()):
        data["seed"] = draw(st.integers(0, 2**32))
    if draw(st.booleans()):
        data["workload"]["train_tokens"] = draw(st.sampled_from(["15T", "2B", 1e12, 123456789]))
    if draw(st.booleans()):
        data["cluster"]["network"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "fabric": st.sampled_from(["efa-v2", "efa-v3", "efa-v4", "ib-ndr", "roce", "infiniband"]),
                    "nics_per_node": st.integers(1, 32),
                    "nic_bandwidth": st.sampled_from(["100 Gbps", "400 Gb/s", 5e10]),
                    "oversubscription": st.floats(1.0, 8.0),
                },
            )
        )
    if draw(st.booleans()):
        data["cluster"]["storage"] = {
            "kind": "fsx-lustre",
            "throughput_per_tib": "250 MB/s",
            "capacity": draw(st.sampled_from(["480 TiB", 1.2e12])),
        }
    data["pricing"] = draw(
        st.sampled_from(
            [
                "on-demand",
                "capacity-block",
                "savings-plan-1yr",
                "savings-plan-3yr",
                {"usd_per_hour": 40},
                {"usd_per_hour": 12.5},
            ]
        )
    )
    if draw(st.booleans()):
        data["checkpoint"] = {
            "every": draw(st.sampled_from(["30 min", 600, "1.5 h"])),
            "async": draw(st.booleans()),
        }
    if draw(st.booleans()):
        data["reliability"] = {"node_mtbf": "1000 h", "restart": draw(st.sampled_from(["10 min", 0, 42.5]))}
    if draw(st.booleans()):
        value = st.floats(1e-3, 1e6, allow_nan=False)
        data["measured"] = {
            "step_time_s": draw(value),
            "tokens_per_s": draw(value),
            "mfu": draw(st.floats(0.01, 1.0)),
            "source": "paper, table 1",
            "flops_formula": draw(st.sampled_from(["megatron-2021", "palm", "nemo"])),
            "peak": "989 TFLOP/s",
            "notes": draw(st.text(NAME_CHARS, max_size=20)),
        }
    if draw(st.booleans()):
        data["expect"] = {
            "step_time": {"value": draw(st.floats(0.01, 100.0)), "rel_tol": draw(st.floats(0, 0.5))},
            "fits": {"value": draw(st.booleans())},
        }
    return data


@given(scenario_mappings())
def test_scenarios_round_trip_through_yaml(data):
    sc = scenario_from_mapping(data, file="gen.yaml")
    mapping = scenario_to_mapping(sc)
    again = scenario_from_mapping(load_yaml_text(yaml.safe_dump(mapping)), file="gen.yaml")
    assert again == sc
    assert scenario_to_mapping(again) == mapping


def test_neuroncore_ranks_split_each_chip_and_round_trip():
    path = Path(__file__).resolve().parent.parent / "scenarios" / "validation" / "training" / "trn1-01.yaml"
    sc = load_scenario(path)
    chip = load_catalog().instance("trn1.32xlarge")
    core = sc.cluster.instance
    assert sc.cluster.rank_unit == "core" and core.num_accelerators == 2 * chip.num_accelerators == 32
    assert core.accelerator.peak("bf16") == pytest.approx(chip.accelerator.peak("bf16") / 2)
    assert core.accelerator.hbm_bytes == pytest.approx(chip.accelerator.hbm_bytes / 2)
    assert core.scale_up.domain_size == 32 and core.num_nics == chip.num_nics
    assert sc.cluster.gpus == 32 * sc.cluster.nodes
    assert "network" not in scenario_to_mapping(sc)["cluster"]
    assert roundtrip(sc) == sc


def test_core_ranks_on_a_chip_without_cores_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"cluster\.rank_unit: core needs an accelerator split into cores"):
        load_scenario(LLAMA, overrides={"cluster.rank_unit": "core"})
