"""The rl: section: defaults per algorithm, the reuse of serving fields and length distributions, and a
one-line located error (exit 2) for every malformed field, from ``fmsim lint`` and ``fmsim run`` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.scenario import load_scenario, scenario_from_mapping
from fmsim.workloads.rl_spec import parse_rl_spec

MALFORMED = sorted((Path(__file__).parent / "malformed_rl").glob("*.yaml"))


def _spec(rl):
    sc = scenario_from_mapping(
        {
            "version": 1,
            "name": "x",
            "workload": {"kind": "rl", "model": "llama3.1-8b"},
            "cluster": {"instance": "p5.48xlarge", "nodes": 2},
            "rl": rl,
        },
        file="x.yaml",
    )
    return parse_rl_spec(sc.extra, file=sc.file, policy=sc.workload.model), sc


def test_algorithms_decide_which_models_run():
    grpo, sc = _spec({"algorithm": "grpo"})
    assert grpo.reference is sc.workload.model and grpo.critic is None and grpo.reward.is_rule
    dapo, _ = _spec({"algorithm": "dapo"})
    assert dapo.reference is None and dapo.critic is None
    ppo, _ = _spec({"algorithm": "ppo", "reward_model": "llama3.1-8b"})
    assert ppo.critic is sc.workload.model and ppo.samples_per_prompt == 1 and not ppo.reward.is_rule
    none, _ = _spec({"algorithm": "grpo", "reference": "none"})
    assert none.reference is None


def test_dynamic_sampling_over_generates_and_the_cap_truncates_the_tail():
    s, _ = _spec(
        {
            "algorithm": "dapo",
            "prompts": 512,
            "samples_per_prompt": 16,
            "dynamic_sampling": {"filtered_share": 0.5},
            "max_response_len": 8192,
            "response_len": {"dist": "lognormal", "median": 3000, "sigma": 1.0},
        }
    )
    assert s.over_generate == pytest.approx(2.0) and s.generated_prompts == 1024 and s.rollouts == 8192
    assert s.response_len.max == 8192 and s.response_len.outside == "clip"


def test_generation_reuses_the_serving_fields_and_placement_defaults_the_sync():
    s, _ = _spec(
        {
            "generation": {"engine": "sglang", "tp": 2, "max_seqs": 128, "memory_fraction": 0.5},
            "placement": {"disaggregated": {"generation_nodes": 1, "training_nodes": 1}},
        }
    )
    assert s.generation.tp == 2 and s.generation.serving.engine == "sglang"
    assert s.generation.serving.max_seqs == 128 and s.generation.serving.memory_fraction == 0.5
    assert s.placement.kind == "disaggregated" and s.weight_sync.method == "broadcast"
    c, _ = _spec({})
    assert c.placement.kind == "colocated" and c.weight_sync.method == "reshard" and c.off_policy == 0


def test_a_missing_rl_section_takes_the_defaults():
    s, _ = _spec(None)
    assert s.algorithm == "grpo" and s.prompts == 64


@pytest.mark.parametrize("path", MALFORMED, ids=[p.stem for p in MALFORMED])
@pytest.mark.parametrize("command", ["lint", "run"])
def test_a_malformed_rl_section_is_one_located_line_and_exit_2(command, path, capsys):
    lines = path.read_text().splitlines()
    field, message = (line.split(":", 1)[1].strip() for line in lines[:2])
    code = main([command, str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"{path}: {field}: ") and message in err, err
    assert "Traceback" not in err


def test_errors_are_config_errors_with_file_and_field():
    path = next(p for p in MALFORMED if p.stem == "prompts_negative")
    sc = load_scenario(path)
    with pytest.raises(ConfigError) as exc:
        parse_rl_spec(sc.extra, file=sc.file, policy=sc.workload.model)
    assert exc.value.field == "rl.prompts" and exc.value.file == str(path)
