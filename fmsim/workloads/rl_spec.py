"""The ``kind: rl`` scenario section ``rl:``: its keys, defaults, validation and frozen spec.

Owns what an RL post-training step is made of, as the file says it: the algorithm (which models
run), the rollout batch (prompts, samples per prompt, prompt and response lengths with a cap that
truncates the tail, DAPO's dynamic sampling), the models beside the policy (reference, critic,
reward model or a rule), the optimizer batch, the generation engine (the ``serving:`` fields, read
by the serving reader), the placement of generation and training on GPU pools, off-policy depth and
how trained weights reach the generation engines. Errors are one located line
(``file: rl.prompts: ...``). The field reference is ``docs/rl.md``.

``fmsim/scenario/`` keeps the section raw in ``Scenario.extra``; :func:`parse_rl_spec` turns it
into an :class:`RLSpec`. The training parallelism is the scenario's own ``parallelism:``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..fields import _Section, suggest
from ..units import parse_bytes, parse_time
from .inference_spec import (
    SERVING_KEYS,
    LengthDist,
    ServingSpec,
    _open,
    _resolve_model,
    _sub,
    parse_length,
    parse_serving,
)

ALGORITHMS = ("grpo", "ppo", "dapo", "rloo")
PLACEMENTS = ("colocated", "disaggregated")
SYNC_METHODS = ("reshard", "broadcast", "storage")
SYNC_SOURCES = ("device", "host")
TRAINING_STATE = ("offload", "keep")
#: ``rl.only``: price one phase alone (a benchmark that times only it, e.g. checkpoint-engine's update)
ONLY_PHASES = ("weight_sync",)

RL_KEYS = (
    "algorithm",
    "prompts",
    "samples_per_prompt",
    "prompt_len",
    "response_len",
    "max_response_len",
    "reference",
    "critic",
    "reward_model",
    "train_global_batch",
    "packed_seq_len",
    "logprob_batch",
    "generation",
    "placement",
    "off_policy",
    "weight_sync",
    "dynamic_sampling",
    "validation",
    "checkpoint",
    "steps",
    "only",
)
#: the ``serving:`` fields that mean something for one rollout engine (no router, replicas or P/D split)
GENERATION_SERVING_KEYS = tuple(k for k in SERVING_KEYS if k not in ("replicas", "router", "disaggregation"))
GENERATION_KEYS = ("tp", "ep", *GENERATION_SERVING_KEYS)
REWARD_KEYS = ("model", "cpu_time", "workers")
COLOCATED_KEYS = ("training_state",)
DISAGG_KEYS = ("generation_nodes", "training_nodes")
SYNC_KEYS = ("method", "source", "bucket")
DYNAMIC_KEYS = ("filtered_share", "over_generate")
VALIDATION_KEYS = ("every", "samples", "batch")
CHECKPOINT_KEYS = ("every",)

#: which models run beside the policy, per algorithm: (reference, critic). GRPO and RLOO keep a KL
#: term to a frozen reference (NeMo RL grpo_math_1B.yaml: reference_policy_kl_penalty 0.01; RLOO,
#: Ahmadian et al. 2024 §3, the same KL-regularised reward); PPO adds a value model (Ouyang et al.
#: 2022 §3.5); DAPO drops the KL term and so the reference (Yu et al. 2025, arXiv 2503.14476 §2.3).
ALGORITHM_MODELS = {"grpo": (True, False), "ppo": (True, True), "dapo": (False, False), "rloo": (True, False)}
#: bounds that keep a step's memory and run time bounded whatever the file says (a step of the largest
#: published runs holds ~10^4 sequences: DAPO's 512 prompts x 16 samples, generated 3x)
MAX_PROMPTS = 1_000_000
MAX_SAMPLES = 4096
MAX_SEQUENCES = 262_144
#: NeMo RL's math environment scores with 8 workers (examples/configs/grpo_math_1B.yaml, env.math.num_workers)
DEFAULT_REWARD_WORKERS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardSpec:
    """A reward model (a forward pass over each sequence) or a rule (CPU time per sample)."""

    model: Any = None  # ModelSpec, or None for a rule
    cpu_time_s: float = 0.0  # rule: CPU seconds per sample
    workers: int = DEFAULT_REWARD_WORKERS

    @property
    def is_rule(self) -> bool:
        return self.model is None


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationSpec:
    """One rollout engine: its TP (and, with ``attention_dp``, EP) width and its ``serving:`` limits."""

    tp: int = 1
    ep: int = 1
    serving: ServingSpec = field(default_factory=lambda: ServingSpec(replicas=1))


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementSpec:
    """``colocated`` (both engines time-share every GPU) or ``disaggregated`` pools of nodes."""

    kind: str = "colocated"
    training_state: str = "offload"  # colocated: the training state leaves HBM while generating, or stays
    generation_nodes: int = 0
    training_nodes: int = 0

    def __post_init__(self) -> None:
        assert self.kind in PLACEMENTS and self.training_state in TRAINING_STATE


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightSyncSpec:
    """How trained weights reach the generation engines."""

    method: str = "reshard"
    source: str = "device"  # broadcast from the trainers' HBM, or from host memory (checkpoint-engine)
    bucket_bytes: float = 1 << 30

    def __post_init__(self) -> None:
        assert self.method in SYNC_METHODS and self.source in SYNC_SOURCES


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationSpec:
    """Every ``every`` steps, ``samples`` prompts answered once each, in rounds of ``batch`` (each round
    waits for its longest response) -- NeMo RL's ``grpo.val_period``, ``max_val_samples`` and
    ``val_batch_size``, with ``max_val_samples // val_batch_size`` rounds (grpo.py ``validate``)."""

    every: int
    samples: int
    batch: int

    @property
    def rounds(self) -> int:
        return self.samples // self.batch


@dataclass(frozen=True, slots=True, kw_only=True)
class RLSpec:
    """Everything the ``rl:`` section says, validated; see ``docs/rl.md``."""

    algorithm: str = "grpo"
    prompts: int = 64
    samples_per_prompt: int = 8
    prompt_len: LengthDist = field(default_factory=lambda: LengthDist(kind="fixed", value=256))
    response_len: LengthDist = field(default_factory=lambda: LengthDist(kind="fixed", value=1024))
    max_response_len: int = 0  # 0 = none; else every response is cut there (the tail truncated)
    reference: Any = None  # ModelSpec or None
    critic: Any = None  # ModelSpec or None
    reward: RewardSpec = field(default_factory=RewardSpec)
    train_global_batch: int = 0  # sequences per optimizer step (0 = all rollouts in one step)
    packed_seq_len: int = 0  # tokens per packed training sequence (0 = max prompt + max response)
    logprob_batch: int = 1  # packed sequences per micro-batch of the forward-only (log-prob) passes
    generation: GenerationSpec = field(default_factory=GenerationSpec)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    off_policy: int = 0
    weight_sync: WeightSyncSpec = field(default_factory=WeightSyncSpec)
    filtered_share: float = 0.0  # DAPO: share of groups dynamic sampling drops (all rewards equal)
    over_generate: float = 1.0  # groups generated per group trained
    steps: int = 0  # RL steps of the run (0: per-step figures only)
    validation: ValidationSpec | None = None  # generation of held-out prompts every few steps
    checkpoint_every: int = 0  # steps between synchronous checkpoints of the training state (0: none)
    only: str = ""  # "weight_sync": the step is the weight update alone (no rollouts, no training)

    def __post_init__(self) -> None:
        assert self.algorithm in ALGORITHMS

    @property
    def rollouts(self) -> int:
        """Sequences trained per RL step."""
        return self.prompts * self.samples_per_prompt

    @property
    def generated_prompts(self) -> int:
        """Prompt groups generated per RL step (more than ``prompts`` under dynamic sampling)."""
        return max(self.prompts, -(-round(self.prompts * self.over_generate * 1e6) // 1_000_000))

    @property
    def optimizer_steps(self) -> int:
        return max(1, -(-self.rollouts // self.train_global_batch)) if self.train_global_batch else 1


def _model_or_none(s: _Section, key: str, default_on: bool, policy: Any, catalog: Any) -> Any:
    """``policy`` (a copy of the policy's architecture), ``none``, a catalog name or an inline mapping."""
    if not s.has(key):
        return policy if default_on else None
    raw = s.raw(key)
    if isinstance(raw, bool):
        raise s.err(key, f"{raw!r} is not a model (expected policy, none, a model_catalog name or a mapping)")
    if raw in ("none", "off"):
        return None
    if raw == "policy":
        return policy
    return _resolve_model(raw, s.file, f"rl.{key}", catalog)


def _reward(s: _Section, catalog: Any) -> RewardSpec:
    if not s.has("reward_model"):
        return RewardSpec()
    raw = s.raw("reward_model")
    if raw == "rule":
        return RewardSpec()
    if isinstance(raw, Mapping) and not ({"layers", "hidden"} & set(raw)):
        r = _sub(s, "reward_model", REWARD_KEYS)
        model = (
            _resolve_model(r.raw("model"), s.file, "rl.reward_model.model", catalog)
            if r.has("model")
            else None
        )
        cpu = r.quantity("cpu_time", parse_time, 0.0, inclusive=True,
                         expected="CPU time per sample, e.g. '5 ms'")
        if model is not None and r.has("cpu_time"):
            raise r.err("cpu_time", "is the cost of a rule reward (give model or cpu_time, not both)")
        workers = r.integer("workers", DEFAULT_REWARD_WORKERS, counts=True)
        return RewardSpec(model=model, cpu_time_s=cpu, workers=workers)
    if isinstance(raw, bool) or not isinstance(raw, (str, Mapping)):
        raise s.err(
            "reward_model", f"{raw!r} is not a reward (expected rule, {{cpu_time: 5 ms}}, or a model)"
        )
    return RewardSpec(model=_resolve_model(raw, s.file, "rl.reward_model", catalog))


def _generation(s: _Section) -> GenerationSpec:
    g = _sub(s, "generation", GENERATION_KEYS)
    serving_raw = {k: v for k, v in g.data.items() if k in GENERATION_SERVING_KEYS}
    try:
        sv = parse_serving(serving_raw, g.file)
    except ConfigError as exc:
        fld = (exc.field or "").removeprefix("serving")
        raise ConfigError(exc.message, file=exc.file, field=f"rl.generation{fld}") from None
    return GenerationSpec(
        tp=g.integer("tp", 1, counts=True),
        ep=g.integer("ep", 1, counts=True),
        serving=dataclasses.replace(sv, replicas=1),
    )


def _placement(s: _Section) -> PlacementSpec:
    raw = s.raw("placement", "colocated")
    if isinstance(raw, str):
        if raw == "disaggregated":
            raise s.err(
                "placement",
                "disaggregated needs its pools: {disaggregated: {generation_nodes: N, training_nodes: M}}",
            )
        s.choice("placement", PLACEMENTS, "colocated")
        return PlacementSpec()
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise s.err(
            "placement",
            f"{raw!r} is not a placement (expected colocated, {{colocated: {{...}}}} or "
            "{disaggregated: {generation_nodes: N, training_nodes: M}})",
        )
    kind = str(next(iter(raw)))
    if kind not in PLACEMENTS:
        raise s.err(f"placement.{kind}", f"unknown placement{suggest(kind, PLACEMENTS)}")
    p = _sub(s, "placement", PLACEMENTS)
    if kind == "colocated":
        c = _sub(p, "colocated", COLOCATED_KEYS)
        return PlacementSpec(training_state=c.choice("training_state", TRAINING_STATE, "offload"))
    d = _sub(p, "disaggregated", DISAGG_KEYS)
    return PlacementSpec(
        kind="disaggregated",
        generation_nodes=d.integer("generation_nodes", counts=True, hint="nodes of this pool"),
        training_nodes=d.integer("training_nodes", counts=True, hint="nodes of this pool"),
    )


def _weight_sync(s: _Section, placement: PlacementSpec) -> WeightSyncSpec:
    default = "reshard" if placement.kind == "colocated" else "broadcast"
    raw = s.raw("weight_sync", default)
    if isinstance(raw, str):
        method = s.choice("weight_sync", SYNC_METHODS, default)
        spec = WeightSyncSpec(method=method)
        where = "weight_sync"
    else:
        w = _sub(s, "weight_sync", SYNC_KEYS)
        method = w.choice("method", SYNC_METHODS, default)
        source = w.choice("source", SYNC_SOURCES, "device")
        if w.has("source") and method != "broadcast":
            raise w.err("source", f"applies to method: broadcast (not {method})")
        bucket = w.quantity("bucket", parse_bytes, float(1 << 30),
                            expected="bytes per broadcast bucket, e.g. 1 GiB")
        spec = WeightSyncSpec(method=method, source=source, bucket_bytes=bucket)
        where = "weight_sync.method"
    if method == "reshard" and placement.kind == "disaggregated":
        raise s.err(
            where,
            "reshard moves weights between layouts on the same GPUs; disaggregated pools "
            "need broadcast or storage",
        )
    return spec


def _only(s: _Section, placement: PlacementSpec, ws: WeightSyncSpec) -> str:
    """``only: weight_sync`` prices the weight update alone. The update then has no trainers to start
    from: it needs the weights waiting in host memory on the generation GPUs (checkpoint-engine's
    colocated parameter server: ``weight_sync: {method: broadcast, source: host}``, placement colocated)."""
    only = s.choice("only", ONLY_PHASES, "")
    if not only:
        return ""
    if not (ws.method == "broadcast" and ws.source == "host"):
        raise s.err(
            "only",
            "weight_sync alone starts from weights in host memory (expected weight_sync: {method: "
            "broadcast, source: host, bucket: ...})",
        )
    if placement.kind != "colocated":
        raise s.err("only", "weight_sync alone updates the engines on every GPU (expected placement: colocated)")
    return only


def _validation(s: _Section) -> ValidationSpec | None:
    if not s.has("validation"):
        return None
    v = _sub(s, "validation", VALIDATION_KEYS)
    hint = "validation: {every: steps, samples: prompts, batch: prompts a round}"
    every = v.integer("every", counts=True, hint=hint)
    samples = v.integer("samples", counts=True, hint=hint)
    if samples > MAX_SEQUENCES:
        raise v.err("samples", f"{samples:,} must be <= {MAX_SEQUENCES:,}")
    batch = v.integer("batch", samples, counts=True)
    if batch > samples:
        raise v.err("batch", f"{batch} exceeds samples {samples} (no round would run: rounds = samples // batch)")
    return ValidationSpec(every=every, samples=samples, batch=batch)


def _checkpoint_every(s: _Section) -> int:
    if not s.has("checkpoint"):
        return 0
    c = _sub(s, "checkpoint", CHECKPOINT_KEYS)
    return c.integer("every", counts=True, hint="steps between checkpoints")


def parse_rl_spec(
    extra: Mapping[str, Any], *, file: str | None = None, policy: Any = None, catalog: Any = None
) -> RLSpec:
    """The ``rl:`` section of ``Scenario.extra`` as an :class:`RLSpec` (a missing section takes the
    defaults). ``policy``: the scenario's ``workload.model``, which ``reference``/``critic`` copy."""
    s = _open(extra.get("rl"), file, "rl", RL_KEYS)
    algo = s.choice("algorithm", ALGORITHMS, "grpo")
    with_ref, with_critic = ALGORITHM_MODELS[algo]
    samples = s.integer("samples_per_prompt", 1 if algo == "ppo" else 8, counts=True)
    if algo in ("grpo", "dapo", "rloo") and samples < 2:
        raise s.err(
            "samples_per_prompt",
            f"{samples} with algorithm {algo} (expected >= 2: the group's other samples are its baseline)",
        )
    if samples > MAX_SAMPLES:
        raise s.err("samples_per_prompt", f"{samples} must be <= {MAX_SAMPLES:,}")
    prompts = s.integer("prompts", 64, counts=True)
    if prompts > MAX_PROMPTS:
        raise s.err("prompts", f"{prompts:,} must be <= {MAX_PROMPTS:,} prompt groups per step")
    max_resp = s.integer("max_response_len", 0, minimum=1, counts=True)
    response = parse_length(s.raw("response_len", 1024), file=file, where="rl.response_len")
    if max_resp:
        # the cap truncates every longer response (a generation's max_new_tokens): clip at it
        response = dataclasses.replace(
            response, max=min(response.max, max_resp) if response.max else max_resp
        )
        if response.min > response.max:
            raise s.err("max_response_len", f"{max_resp} is below response_len min {response.min}")
    prompt = parse_length(s.raw("prompt_len", 256), file=file, where="rl.prompt_len")
    critic = _model_or_none(s, "critic", with_critic, policy, catalog)
    if critic is not None and algo != "ppo":
        raise s.err("critic", f"a value model is PPO's (algorithm {algo} has none; expected critic: none)")
    if algo == "ppo" and critic is None:
        raise s.err("critic", "ppo needs a value model (policy, or a model name)")
    filtered, over = 0.0, 1.0
    if s.has("dynamic_sampling"):
        if algo != "dapo":
            raise s.err(
                "dynamic_sampling", f"is DAPO's group filter (algorithm {algo}; expected algorithm: dapo)"
            )
        d = _sub(s, "dynamic_sampling", DYNAMIC_KEYS)
        if d.has("filtered_share") == d.has("over_generate"):
            raise d.err("filtered_share", "give exactly one of filtered_share or over_generate")
        if d.has("filtered_share"):
            filtered = d.number("filtered_share", inclusive=True, maximum=0.95)
            over = 1.0 / (1.0 - filtered)
        else:
            over = d.number("over_generate", minimum=1.0, inclusive=True, maximum=20.0)
            filtered = 1.0 - 1.0 / over
    generated = prompts * over * samples
    if generated > MAX_SEQUENCES:
        raise s.err(
            "prompts" if not s.has("dynamic_sampling") else "dynamic_sampling",
            f"{prompts:,} prompts x {samples} samples"
            + (f" x {over:g} (dynamic sampling)" if over > 1 else "")
            + f" = {generated:,.0f} sequences a step; at most {MAX_SEQUENCES:,} are simulated",
        )
    placement = _placement(s)
    off = s.integer("off_policy", 0, minimum=0, counts=True)
    if off > 8:
        raise s.err("off_policy", f"{off} must be <= 8 (steps of staleness)")
    if off and placement.kind == "colocated":
        raise s.err(
            "off_policy",
            f"{off} needs disaggregated placement (colocated generation and training "
            "share the GPUs, so they cannot overlap)",
        )
    tgb = s.integer("train_global_batch", 0, minimum=1, counts=True)
    if tgb and tgb > prompts * samples:
        raise s.err(
            "train_global_batch",
            f"{tgb} exceeds the {prompts * samples} rollouts of a step (prompts x samples_per_prompt)",
        )
    packed = s.integer("packed_seq_len", 0, minimum=1, counts=True)
    if packed and packed < prompt.smallest() + response.smallest():
        raise s.err(
            "packed_seq_len",
            f"{packed} is shorter than the shortest sequence "
            f"({prompt.smallest() + response.smallest()} tokens)",
        )
    sync = _weight_sync(s, placement)
    return RLSpec(
        algorithm=algo,
        prompts=prompts,
        samples_per_prompt=samples,
        prompt_len=prompt,
        response_len=response,
        max_response_len=max_resp,
        reference=_model_or_none(s, "reference", with_ref, policy, catalog),
        critic=critic,
        reward=_reward(s, catalog),
        train_global_batch=tgb,
        packed_seq_len=packed,
        logprob_batch=s.integer("logprob_batch", 1, minimum=1, counts=True),
        generation=_generation(s),
        placement=placement,
        off_policy=off,
        weight_sync=sync,
        filtered_share=filtered,
        over_generate=over,
        steps=s.integer("steps", 0, minimum=1, counts=True),
        validation=_validation(s),
        checkpoint_every=_checkpoint_every(s),
        only=_only(s, placement, sync),
    )


__all__ = [
    "ALGORITHMS",
    "GenerationSpec",
    "PlacementSpec",
    "RLSpec",
    "RewardSpec",
    "ValidationSpec",
    "WeightSyncSpec",
    "parse_rl_spec",
]
