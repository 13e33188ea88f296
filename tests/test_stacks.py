"""Software stacks (stack_catalog/, fmsim.stacks): sources, resolution file -> stack -> global, errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.scenario import load_scenario, scenario_from_mapping, scenario_to_mapping
from fmsim.stacks import SETTABLE, lookup
from scenario_helpers import small_pretrain

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "scenarios" / "validation" / "training"
GOLDEN = Path(__file__).resolve().parent / "golden" / "validation_training_settings.json"


def _with(**top):
    return small_pretrain("p5.48xlarge", **top)


def test_every_stack_value_names_its_source():
    stacks = load_catalog().stacks
    assert len(stacks) >= 20
    for name, profile in stacks.items():
        for s in profile.settings:
            assert s.path in SETTABLE and SETTABLE[s.path] == profile.kind, (name, s.path)
            # a repository/file (or a paper's section) and a commit or release tag
            assert "/" in s.source or "arXiv" in s.source, (name, s.path, s.source)
            ref = r"@[0-9a-f]{7,}|\bv?\d+\.\d+|_v\d+\.\d+|core_r\d"
            assert re.search(ref, s.source), (name, s.path, s.source)


def test_the_issue_s_stacks_are_in_the_catalog():
    names = set(load_catalog().stacks)
    for needed in ("megatron-lm-2021", "megatron-lm-2022", "megatron-core-0.8", "nemo-24.07", "nemo-25.04",
                   "megatron-bridge-25.11", "mlperf-v4.0-gpt3", "mlperf-v5.1-llama31-405b", "deepspeed-0.5",
                   "deepspeed-0.16", "torchtitan-0.2", "llm-foundry-2023", "olmo-core-2.5", "nanotron-0.5",
                   "accelerate-1.14", "lightning-2.6", "pytorch-fsdp2-example", "vllm-0.6", "vllm-v1",
                   "sglang-0.4", "trtllm-0.17"):
        assert needed in names


def test_the_pytorch_native_trainers_resolve_their_own_defaults_per_recipe():
    """Issue 27 item 2's PyTorch-native trainers: each sets only what its own code's defaults determine."""
    def resolved(stack, precision):
        data = _with(stack=stack)
        data["workload"]["precision"] = precision
        return scenario_from_mapping(data)
    olmo = resolved("olmo-core-2.5", "bf16")
    assert (olmo.parallelism.grad_bucket, olmo.parallelism.grad_reduce_precision) == (0, "fp32")   # 0: one bucket per FSDP unit
    assert (olmo.workload.attention_kernel, olmo.workload.cross_entropy) == ("flash2", "torch")
    nanotron = resolved("nanotron-0.5", "bf16")
    assert (nanotron.workload.attention_kernel, nanotron.workload.cross_entropy) == ("flash2", "unfused")
    assert "parallelism.grad_bucket" not in nanotron.stated      # not determined by its code: left unstated
    for stack in ("accelerate-1.14", "lightning-2.6"):
        # FSDP's MixedPrecision reduce_dtype follows the mixed-precision dtype
        assert resolved(stack, "bf16").parallelism.grad_reduce_precision == "bf16"
        assert resolved(stack, "fp16").parallelism.grad_reduce_precision == "fp16"
        assert "workload.attention_kernel" not in resolved(stack, "bf16").stated   # the user's model's
    assert "parallelism.grad_reduce_precision" not in resolved("lightning-2.6", "fp8").stated
    plain = resolved("pytorch-fsdp2-example", "bf16")
    assert (plain.parallelism.grad_bucket, plain.parallelism.grad_reduce_precision) == (0, "fp32")
    assert plain.workload.attention_kernel == "flash2" and "workload.cross_entropy" not in plain.stated


def test_a_stack_supplies_what_the_file_leaves_out_and_the_file_wins():
    plain = scenario_from_mapping(_with())
    stacked = scenario_from_mapping(_with(stack="megatron-bridge-25.11"))
    assert plain.parallelism.grad_reduce_precision == "fp32"
    assert stacked.parallelism.grad_reduce_precision == "bf16"
    assert stacked.parallelism.param_gather_precision == "fp8"          # fp8 recipe: applies
    assert stacked.parallelism.overlap.tp_comm is True
    assert stacked.stack == "megatron-bridge-25.11"
    assert "parallelism.overlap.tp_comm" in stacked.stated
    assert "parallelism.overlap.tp_comm" not in plain.stated
    data = _with(stack="megatron-bridge-25.11")
    data["parallelism"]["grad_reduce_precision"] = "fp32"
    data["parallelism"]["overlap"] = {"tp_comm": False}
    own = scenario_from_mapping(data)
    assert own.parallelism.grad_reduce_precision == "fp32" and own.parallelism.overlap.tp_comm is False
    assert own.parallelism.overlap.grad_reduce is True                   # the rest of overlap: the stack's


def test_a_recipe_only_setting_is_left_out_for_other_recipes():
    data = _with(stack="megatron-bridge-25.11")
    data["workload"]["precision"] = "bf16"
    sc = scenario_from_mapping(data)
    assert sc.parallelism.param_gather_precision == "bf16"   # fp8 gather exists only with an fp8 recipe
    assert sc.parallelism.grad_reduce_precision == "bf16"


def test_repeating_a_stack_s_values_predicts_the_same():
    import fmsim

    for file, stack in (("meg21-01.yaml", "megatron-lm-2021"), ("nemo2504-gb200-01.yaml", "nemo-25.04")):
        path = TRAINING / file
        sc = load_scenario(path)
        assert sc.stack == stack
        profile = load_catalog().stack(stack)
        explicit = {s.path: (list(s.value) if isinstance(s.value, tuple) else s.value)
                    for s in profile.settings if s.applies(sc.workload.precision)}
        spelled = load_scenario(path, overrides=explicit)
        assert scenario_to_mapping(spelled) == scenario_to_mapping(sc)
        assert fmsim.estimate(spelled).to_dict() == fmsim.estimate(sc).to_dict()


def test_validation_files_resolve_the_settings_they_had_before_naming_stacks():
    """Every validation file names its stack and resolves each stack-settable field as the golden says. The
    golden was written from the files before the stacks refactor (no prediction moved) and changed once on
    purpose (2026-12-01): the gradient buckets the stacks ship (NeMo 2.x / Megatron-Bridge 128 Mi parameters,
    torchtitan and llm-foundry one per FSDP unit, DeepSpeed's 5e8 on the 2021 ZeRO-3 rows, the NEMO2407 files'
    per-model buckets of NeMo-Framework-Launcher), and once more (2026-12-02) where a source re-read replaced an
    assumed value: the MLPerf v4.0 configs' NCCL_NVLS_ENABLE=0 (cluster.network.nvls), GPT-3's BUCKET_CAP_MB=200
    and FP8_PARAMS=True, the H200 LoRA config's FP8_ACTIVATION=True, NEMO2407-02's ub_tp_comm_overlap: True,
    the v5.1 LoRA implementations' DDP overlaps off and the B200 config's NCCL_NVLS_ENABLE=0; and (2026-12-02,
    issue 27 item 2) AWS-TT-02's ``kernel_fusion: compiled``, the run's torch.compile against its stack's eager; and (2026-12-02, the
    fp8 recipe) torchtitan's current scaling and the Megatron-Bridge rows' own recipes (FP8-CS, FP8-MX, and
    mb2509-h100-01's blockwise from its notes); and (2026-12-02, dropout) Megatron-LM's argument defaults of 0.1
    hidden and attention dropout on the rows of its stacks, NEMO2407-01..04's GPT-3 launcher configs and the 2021
    ZeRO-3 rows' Megatron-LM v1.1.5; and (2026-12-02, grouped-GEMM kernels) AWS-TT-02's torch._grouped_mm from
    torchtitan-0.1 (a dense model: no prediction moves)."""
    golden = json.loads(GOLDEN.read_text())
    files = sorted(TRAINING.glob("*.yaml"))
    assert sorted(f.name for f in files) == sorted(golden)
    for f in files:
        sc = load_scenario(f)
        assert sc.stack, f.name
        assert sc.configuration in ("stated", "partial"), f.name
        m = scenario_to_mapping(sc)
        got = {p: lookup(m, p) for p in SETTABLE if lookup(m, p) is not None}
        assert got == golden[f.name], f.name


def test_unknown_stack_gets_did_you_mean_and_exit_2(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"stack: unknown stack 'nemo-25.4' \(did you mean 'nemo-25.04'\?"):
        scenario_from_mapping(_with(stack="nemo-25.4"), file="x.yaml")
    import yaml

    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(_with(stack="megatron-brige-25.11")))
    assert main(["run", "--estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'megatron-bridge-25.11'" in err[0] and "stack" in err[0]


def test_stack_kind_must_match_the_workload():
    with pytest.raises(ConfigError, match="is a serving stack"):
        scenario_from_mapping(_with(stack="vllm-v1"), file="x.yaml")
    with pytest.raises(ConfigError, match=r"stack: got a number"):
        scenario_from_mapping(_with(stack=3), file="x.yaml")


def test_configuration_field():
    assert scenario_from_mapping(_with(configuration="stated")).configuration == "stated"
    sc = scenario_from_mapping(_with(configuration={"partial": "micro-batch"}))
    assert (sc.configuration, sc.configuration_missing) == ("partial", "micro-batch")
    with pytest.raises(ConfigError, match=r"configuration: got a string"):
        scenario_from_mapping(_with(configuration="partial"), file="x.yaml")
    round_trip = scenario_from_mapping(scenario_to_mapping(sc))
    assert round_trip == sc


def test_catalog_commands_list_stacks_with_sources(capsys):
    assert main(["catalog", "stacks"]) == 0
    out = capsys.readouterr().out
    assert "megatron-lm-2021" in out and "vllm-0.6" in out
    assert main(["catalog", "show", "megatron-core-0.8"]) == 0
    out = capsys.readouterr().out
    assert "parallelism.grad_bucket: megatron" in out and "source: NVIDIA/Megatron-LM" in out
    assert main(["catalog", "show", "megatron-core-08"]) == 2
    assert "did you mean 'megatron-core-0.8'" in capsys.readouterr().err


def test_a_stack_value_a_plan_refuses_gives_the_reader_s_error_naming_the_stack():
    data = _with(stack="llm-foundry-2023")          # Triton FlashAttention-1: a figure for A100 and H100 only
    data["cluster"] = {"instance": "p6-b200.48xlarge", "nodes": 2}
    with pytest.raises(ConfigError, match=r"workload\.attention_kernel: flash1 on p6-b200.48xlarge: .*"
                                          r"\(set by stack 'llm-foundry-2023'\)"):
        scenario_from_mapping(data, file="x.yaml")
    data["workload"]["attention_kernel"] = "flash"  # stating the field wins, and the error is gone
    assert scenario_from_mapping(data).workload.attention_kernel == "flash"


def test_serving_validation_files_that_name_a_stack_agree_with_it():
    """A serving file that names its engine release's stack (scenarios/validation/inference) keeps the engine
    that stack sets, and is marked by how completely its source states the configuration."""
    files = sorted((ROOT / "scenarios" / "validation" / "inference").glob("*.yaml"))
    named = [f for f in files if load_scenario(f).stack]
    assert len(named) >= 43
    catalog = load_catalog()
    for f in named:
        sc = load_scenario(f)
        assert sc.configuration in ("stated", "partial"), f.name
        assert sc.configuration == "stated" or sc.configuration_missing, f.name
        engine = scenario_to_mapping(sc)["serving"]["engine"]
        assert catalog.stacks[sc.stack].setting("serving.engine").value == engine, f.name


# vLLM's shipped batch limits per release and entry point (issue 27: serving stacks; issue 26: NeMo RL on vLLM 0.11)
V011 = "vllm-project/vllm vllm/engine/arg_utils.py @f71952c1c (tag v0.11.0)"


def test_vllm_release_profiles_state_the_limits_their_source_lines_give():
    """Each vLLM 0.11 engine profile's limits, per entry point and device class, are the ones its source quotes
    (arg_utils.py _set_default_args at tag v0.11.0), and the stack naming the release points at that profile."""
    from fmsim.model.serving_cost import ENGINES
    expected = {   # name: (large device, small device, the source's own words for them)
        "vllm-0.11": ((1024, 8192), (256, 2048),
                      "OPENAI_API_SERVER max_num_seqs 1024, max_num_batched_tokens 8192 on a device of >= 70 GiB "
                      "not named A100, else 256 and 2048"),
        "vllm-0.11-llm": ((1024, 16384), (256, 8192),
                          "LLM_CLASS max_num_seqs 1024, max_num_batched_tokens 16384 on a device of >= 70 GiB "
                          "not named A100, else 256 and 8192"),
        "vllm-0.11-async": ((128, 2048), None, "max_num_seqs 128 and, with chunked prefill, "
                            "DEFAULT_MAX_NUM_BATCHED_TOKENS 2048"),
    }
    stacks = load_catalog().stacks
    for name, (large, small, words) in expected.items():
        e = ENGINES[name]
        assert (e.max_seqs, e.max_batch_tokens) == large and e.small_device_limits == small, name
        assert V011 in e.source and words in e.source, name
        assert e.chunked_prefill and e.graph_batch_sizes[:4] == (1, 2, 4, 8) and e.graph_batch_sizes[-1] == 512
        assert all(b - a == 8 for a, b in zip(e.graph_batch_sizes[3:], e.graph_batch_sizes[4:]))
        assert e.large_device_bytes == 70 * 2 ** 30
        if name in stacks:
            setting = stacks[name].setting("serving.engine")
            assert setting.value == name and V011 in setting.source and words.replace(
                "OPENAI_API_SERVER ", "").replace("LLM_CLASS ", "") in setting.source.replace(
                "OPENAI_API_SERVER ", "").replace("LLM_CLASS ", "")
    assert "max_num_seqs 256 (vllm-project/vllm vllm/engine/arg_utils.py L90 @32e7db2536, tag v0.6.0)" in \
        ENGINES["vllm-0.6"].source and ENGINES["vllm-0.6"].max_seqs == 256


def _serving_file(stack: str | None, instance: str, **serving):
    data = {"version": 1, "name": "v", "seed": 1,
            "workload": {"kind": "inference", "model": "llama3.1-8b", "precision": "bf16"},
            "parallelism": {"tp": 1}, "cluster": {"instance": instance, "nodes": 1},
            "traffic": {"arrival": "poisson", "rate": "5/s", "requests": 20, "prompt_len": 256, "output_len": 64},
            "serving": dict(serving)}
    if stack:
        data["stack"] = stack
    return scenario_from_mapping(data)


@pytest.mark.parametrize("stack, instance, limits", [
    ("vllm-0.11", "p5.48xlarge", (1024, 8192)),          # H100 80 GB
    ("vllm-0.11", "p4de.24xlarge", (256, 2048)),         # A100 80 GB: excluded by name
    ("vllm-0.11", "g6e.48xlarge", (256, 2048)),          # L40S 48 GB: under 70 GiB
    ("vllm-0.11-llm", "p5.48xlarge", (1024, 16384)),
    ("vllm-0.11-llm", "g6e.48xlarge", (256, 8192)),
])
def test_a_file_naming_the_vllm_release_inherits_its_limits_and_a_stated_limit_wins(stack, instance, limits):
    from fmsim.workloads.inference import plan_from_scenario
    cfg = plan_from_scenario(_serving_file(stack, instance)).pools[0].cfg
    assert (cfg.max_seqs, cfg.max_batch_tokens, cfg.chunked_prefill) == (*limits, True)
    cfg = plan_from_scenario(_serving_file(stack, instance, max_seqs=64, max_batch_tokens=4096)).pools[0].cfg
    assert (cfg.max_seqs, cfg.max_batch_tokens) == (64, 4096)


def test_nemo_rl_files_run_vllm_0_11_through_the_entry_point_their_recipe_uses():
    """rl-*.yaml: async_engine false builds vllm.LLM (LLM_CLASS limits), true an AsyncLLM (ENGINE_CONTEXT)."""
    from fmsim.workloads.rl_spec import parse_rl_spec
    files = sorted((ROOT / "scenarios" / "validation" / "rl").glob("rl-*.yaml"))
    seen = set()
    for f in files:
        sc = load_scenario(f)
        engine = parse_rl_spec(sc.extra, file=sc.file, policy=sc.workload.model).generation.serving.engine
        text = f.read_text()
        if "vLLM 0.11.0" not in text:
            continue
        want = "vllm-0.11-llm" if "vllm.LLM (async_engine: false)" in text else "vllm-0.11-async"
        assert engine == want, f.name
        seen.add(engine)
    assert seen == {"vllm-0.11-llm", "vllm-0.11-async"}
