"""The v1 vocabulary every section shares: the schema version, the kinds, the precisions, the top-level
keys and the sections a kind adds (kept raw in ``Scenario.extra``). Each section's own keys and choices
live in that section's module.
"""

from __future__ import annotations


SCHEMA_VERSION = 1
KINDS = ("pretrain", "finetune", "rl", "inference")
TRAINING_KINDS = ("pretrain", "finetune")
PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "fp32")
AXES = ("tp", "cp", "ep", "pp", "dp")
FLOPS_FORMULAS = ("megatron-2021", "korthikanti-2022", "palm", "nemo", "llama3")
# Sections a kind adds; kept raw in Scenario.extra and validated by that kind's simulator.
EXTRA_SECTIONS = {
    "traffic": "inference",
    "serving": "inference",
    "test_time_compute": "inference",
    "slo": "inference",
    "rl": "rl",
}
TOP_KEYS = (
    "version",
    "name",
    "description",
    "seed",
    "workload",
    "parallelism",
    "cluster",
    "pricing",
    "checkpoint",
    "reliability",
    "data",
    "measured",
    "expect",
    "stack",
    "configuration",
    *EXTRA_SECTIONS,
)
#: the low-precision recipes whose Transformer Engine copies (fp8 weights, fp8 attention, fp8 saved inputs) exist
LOW_PRECISIONS = ("fp8", "fp4")
