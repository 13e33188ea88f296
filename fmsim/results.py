"""Typed results: one flat record per scenario (the CSV row) plus nested breakdowns.

The column names below are a contract (DESIGN.md "Outputs"): more may be added at the end of a
group, none renamed. Units are in the names; values are SI floats.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

COMMON_COLUMNS = ("scenario", "kind", "instance", "nodes", "gpus", "usd_per_hour", "price_date")

TRAINING_COLUMNS = (
    "tp", "pp", "dp", "cp", "ep", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
    "model_tflops_per_gpu", "mfu", "hfu", "memory_per_gpu_bytes", "hbm_per_gpu_bytes", "fits",
    "usd_per_step", "time_to_train_s", "gpu_hours", "cost_usd",
    # added after v1's first list (appended, never renamed)
    "bottleneck", "pricing_option", "goodput", "checkpoint_write_s",
    # the rest of the plan, so a spreadsheet row says which plan it prices (2026-11-30)
    "vpp", "zero", "dp_shard", "micro_batch", "global_batch", "num_microbatches", "precision", "recompute",
    # layers per virtual stage full recompute covers (parallelism.recompute_layers), empty when every one
    "recompute_layers",
    # the prediction's band over the settings the file and its stack leave unstated (fmsim.band,
    # `fmsim run --band`), empty without one
    "step_time_low_s", "step_time_high_s",
    # storage and failures over the run (docs/storage.md): storage dollars, the data-loading stall's share of
    # the step, training time lost per checkpoint, interruptions expected over the run, goodput's p10 / p90
    "storage_usd", "data_stall_share", "checkpoint_downtime_s", "expected_interruptions", "goodput_p10",
    "goodput_p90",
)

INFERENCE_COLUMNS = (
    "output_tokens_per_s", "output_tokens_per_s_per_gpu", "requests_per_s",
    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s",
    "usd_per_million_output_tokens", "usd_per_query",
    # added after v1's first list (appended, never renamed): the plan the row prices, and its SLO verdict
    "tp", "pp", "ep", "precision", "pricing_option", "slo_met",
    # the whole run's rates, drain included (what a benchmark of a fixed request count reports; the
    # columns above are the steady state's); empty from the analytical estimate
    "run_output_tokens_per_s", "run_requests_per_s",
    # the band (fmsim.band, `fmsim run --band`), empty without one
    "output_tokens_per_s_low", "output_tokens_per_s_high",
    # requests the run did not serve: rejected (prompt and output fit no engine's KV cache) and left
    # unfinished at the horizon; a run without an SLO exits 0 with them, so the row says how many
    "rejected_requests", "unfinished_requests",
)

#: kind: rl (docs/rl.md "Results"): the step, its phases and pools, NeMo RL's tokens/s/GPU, cost per step
#: and per million trained tokens; the training plan's sizes and the columns shared with training keep
#: their training names (2026-12-01)
RL_COLUMNS = (
    "tp", "pp", "dp", "cp", "ep", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
    "memory_per_gpu_bytes", "hbm_per_gpu_bytes", "fits", "usd_per_step", "time_to_train_s", "gpu_hours",
    "cost_usd", "bottleneck", "pricing_option",
    "algorithm", "placement", "off_policy", "rollouts_per_step", "generated_sequences_per_step",
    "optimizer_steps", "generation_gpus", "training_gpus", "generation_tp",
    "generation_s", "reward_s", "logprob_s", "training_s", "weight_sync_s", "transition_s",
    "generated_tokens_per_s", "trained_tokens_per_step", "generation_utilization", "training_utilization",
    "usd_per_million_trained_tokens", "rl_steps",
    "validation_s", "checkpoint_s", "mean_step_time_s",
)

COLUMNS_BY_KIND = {
    "pretrain": TRAINING_COLUMNS,
    "finetune": TRAINING_COLUMNS,
    "inference": INFERENCE_COLUMNS,
    "rl": RL_COLUMNS,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """What one simulated scenario gives.

    ``metrics`` holds the kind's CSV columns (``COLUMNS_BY_KIND[kind]``) plus any extra scalar
    metrics; ``breakdown`` the step-time (or latency) split in seconds; ``memory`` bytes per GPU
    by part; ``details`` everything else (bottleneck sentence, per-stage timings, trace events).
    """

    scenario: str
    kind: str
    instance: str
    nodes: int
    gpus: int
    usd_per_hour: float
    price_date: str
    metrics: Mapping[str, Any] = field(default_factory=dict)
    breakdown: Mapping[str, float] = field(default_factory=dict)
    memory: Mapping[str, float] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)

    def columns(self) -> tuple[str, ...]:
        return COMMON_COLUMNS + COLUMNS_BY_KIND.get(self.kind, ())

    def to_dict(self) -> dict[str, Any]:
        """The CSV row: common columns, then the kind's columns, in contract order."""
        row: dict[str, Any] = {c: getattr(self, c) for c in COMMON_COLUMNS}
        for c in COLUMNS_BY_KIND.get(self.kind, ()):
            row[c] = self.metrics.get(c)
        return row

    def to_json(self) -> dict[str, Any]:
        """Everything: the row plus breakdowns, memory and details (JSON-serialisable)."""
        out = self.to_dict()
        out["metrics"] = dict(self.metrics)
        out["breakdown_s"] = dict(self.breakdown)
        out["memory_bytes"] = dict(self.memory)
        out["details"] = {k: v for k, v in self.details.items() if k != "trace"}
        return out

    def get(self, key: str) -> Any:
        """A column or metric by name (``step_time_s``, ``mfu`` ...), ``None`` if absent."""
        if key in COMMON_COLUMNS:
            return getattr(self, key)
        return self.metrics.get(key)
