"""RL post-training (``kind: rl``): one RL step -- rollouts, scoring, log-probs, update, weight sync --
over GPU pools, simulated or estimated, and its :class:`~fmsim.results.Result`.

Owns the compile step (:func:`build_rl_plan`: the pools ``placement`` makes, each phase's seconds
from :mod:`fmsim.workloads.rl_phases`, the colocated memory fit), the metrics (``RL_COLUMNS``) and the
bottleneck sentence; the step timeline and its trace are :mod:`fmsim.workloads.rl_timeline`'s. Entry
points for the facade: :func:`simulate_rl` and :func:`estimate_rl`. Field reference and method:
``docs/rl.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.des import RunResult
from ..errors import ConfigError, OutOfMemoryError
from ..results import Result
from ..units import format_bytes
from . import rl_phases as ph
from .rl_spec import RLSpec, parse_rl_spec
from .rl_timeline import step_time_des, step_time_estimate, timeline_rows, write_trace

PHASES = ("transition", "generation", "reward", "logprob", "training", "weight_sync")


@dataclass(frozen=True, slots=True, kw_only=True)
class RLPlan:
    """One RL step compiled: pools, each phase's seconds (per step), memory and price."""

    name: str
    spec: RLSpec
    gen_gpus: int
    train_gpus: int
    gen_nodes: int
    train_nodes: int
    colocated: bool
    engines: int
    engine_gpus: int
    phases: dict[str, float]  # seconds per step, by phase (PHASES)
    weight_send_s: float  # of weight_sync: what the trainers spend sending
    reward_on_gpus: bool = False  # a reward model scores on the training pool; a rule on the CPUs
    rollouts: ph.Rollouts
    optimizer_steps: int
    packed_seq_len: int
    train_plan: Any  # fmsim.parallel.strategy.Plan of one optimizer step
    memory: dict[str, float]
    hbm_bytes: float
    validation_s: float = 0.0  # one validation (all its rounds), on the generation engines
    checkpoint_s: float = 0.0  # one synchronous checkpoint of the training state
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def run_overhead_s(self) -> float:
        """Seconds a step spends, on average over a run, in validation and checkpoints (both block the
        training loop: NeMo RL runs them inside its step, grpo.py ``grpo_train``/``async_grpo_train``)."""
        sp = self.spec
        v = self.validation_s / sp.validation.every if sp.validation else 0.0
        c = self.checkpoint_s / sp.checkpoint_every if sp.checkpoint_every else 0.0
        return v + c

    def run_time_s(self, step: float, steps: int) -> float:
        """``steps`` RL steps: each at ``step``, plus every validation and checkpoint they reach."""
        sp = self.spec
        t = step * steps
        if sp.validation:
            t += (steps // sp.validation.every) * self.validation_s
        if sp.checkpoint_every:
            t += (steps // sp.checkpoint_every) * self.checkpoint_s
        return t


def _pools(sc: Any, spec: RLSpec) -> tuple[int, int, int, int]:
    """(generation GPUs, training GPUs, generation nodes, training nodes)."""
    cl = sc.cluster
    per = cl.instance.num_accelerators
    p = spec.placement
    if p.kind == "colocated":
        return cl.gpus, cl.gpus, cl.nodes, cl.nodes
    if p.generation_nodes + p.training_nodes > cl.nodes:
        raise ConfigError(
            f"generation_nodes + training_nodes = {p.generation_nodes + p.training_nodes} exceed the "
            f"cluster's {cl.nodes} nodes",
            file=sc.file,
            field="rl.placement.disaggregated",
        )
    return p.generation_nodes * per, p.training_nodes * per, p.generation_nodes, p.training_nodes


def build_rl_plan(sc: Any, *, estimate: bool = False, trace: list | None = None) -> RLPlan:
    """Compile ``sc`` (``kind: rl``) and price every phase of its step (the DES, or the estimate)."""
    spec = parse_rl_spec(sc.extra, file=sc.file, policy=sc.workload.model)
    if spec.checkpoint_every:
        ph.check_checkpoint_storage(sc)
    gen_gpus, train_gpus, gen_nodes, train_nodes = _pools(sc, spec)
    ro = ph.draw_rollouts(spec, sc.seed, sc.file)
    gen = ph.build_generation(sc, spec, gen_gpus, ro)
    shares = ph.deal_groups(ro, gen.engines)
    crit = ph.critical_engines(shares)
    if estimate:
        memo: dict = {}
        generation = max(ph.estimate_engine(gen, shares[e], memo) for e in crit)
    else:
        generation = max(
            ph.simulate_engine(gen, shares[e], file=sc.file, trace=trace, name=f"generation engine {e}")
            for e in crit
        )
    # training side: packed sequences of the trained groups, split over optimizer steps
    seq = ph.packed_seq_len(sc, spec)
    n_opt = spec.optimizer_steps
    trained = ro.trained_tokens
    tp_kw = {"gpus": train_gpus, "nodes": train_nodes, "seq_len": seq}
    step_plan = ph.training_plan(sc, tokens=trained / n_opt, **tp_kw)
    # the forward-only passes run logprob_batch packed sequences a micro-batch (NeMo RL
    # logprob_mb_tokens = max_total_sequence_length x logprob_batch_size with sequence packing)
    lp_sc = ph.logprob_scenario(sc, spec)
    lp_plan = step_plan if lp_sc is sc else ph.training_plan(lp_sc, tokens=trained, where="rl.logprob_batch", **tp_kw)
    policy_fwd = ph.forward_s(lp_plan, trained)
    logprob = policy_fwd  # the policy's log-probs before the update
    if spec.reference is not None:
        logprob += (
            policy_fwd + ph.reference_swap_s(sc, step_plan)
            if spec.reference is sc.workload.model
            else ph.forward_s(
                ph.training_plan(lp_sc, tokens=trained, model=spec.reference, where="rl.reference", **tp_kw)
            )
        )
    training = ph.update_s(step_plan, estimate=estimate) * n_opt
    if spec.critic is not None:
        critic_step = (
            step_plan
            if spec.critic is sc.workload.model
            else ph.training_plan(sc, tokens=trained / n_opt, model=spec.critic, where="rl.critic", **tp_kw)
        )
        critic_fwd = (
            lp_plan
            if spec.critic is sc.workload.model
            else ph.training_plan(lp_sc, tokens=trained, model=spec.critic, where="rl.critic", **tp_kw)
        )
        logprob += ph.forward_s(critic_fwd, trained)  # values of every token
        training += ph.update_s(critic_step, estimate=estimate) * n_opt
    rw = spec.reward
    if rw.is_rule:
        reward = len(ro.prompts) * spec.samples_per_prompt * rw.cpu_time_s / rw.workers
    else:
        # a reward model scores every generated sequence (dynamic sampling filters on its scores)
        reward = ph.forward_s(
            ph.training_plan(sc, tokens=ro.all_tokens, model=rw.model, where="rl.reward_model", **tp_kw)
        )
    sync, send = ph.weight_sync_s(sc, spec, gen=gen, train_gpus=train_gpus, gen_nodes=gen_nodes)
    memory, transition = _memory_fit(sc, spec, gen, step_plan)
    validation = ph.validation_s(sc, spec, gen, estimate=estimate) if spec.validation else 0.0
    checkpoint = ph.checkpoint_s(sc, step_plan) if spec.checkpoint_every else 0.0
    phases = {
        "transition": transition,
        "generation": generation,
        "reward": reward,
        "logprob": logprob,
        "training": training,
        "weight_sync": sync,
    }
    details = {
        "engines": gen.engines,
        "engine_gpus": gen.engine_gpus,
        "simulated_engines": crit,
        "kv_capacity_tokens_per_engine": gen.pool.kv_capacity_tokens,
        "max_seqs": gen.pool.cfg.max_seqs,
        "generation_engine": spec.generation.serving.engine,
        "packed_seq_len": seq,
        "packed_sequences_per_optimizer_step": step_plan.global_batch,
        "training_plan": {
            "tp": step_plan.tp,
            "pp": step_plan.pp,
            "dp": step_plan.dp,
            "cp": step_plan.cp,
            "ep": step_plan.ep,
            "num_microbatches": step_plan.num_microbatches,
        },
        "longest_response": int(ro.outs.max()),
        "validation_rounds": spec.validation.rounds if spec.validation else 0,
        "mean_response": float(ro.outs.mean()),
        "method": "analytical" if estimate else "discrete-event",
    }
    return RLPlan(
        name=sc.name,
        spec=spec,
        gen_gpus=gen_gpus,
        train_gpus=train_gpus,
        gen_nodes=gen_nodes,
        train_nodes=train_nodes,
        colocated=spec.placement.kind == "colocated",
        engines=gen.engines,
        engine_gpus=gen.engine_gpus,
        phases=phases,
        reward_on_gpus=not rw.is_rule,
        weight_send_s=send,
        rollouts=ro,
        optimizer_steps=n_opt,
        packed_seq_len=seq,
        train_plan=step_plan,
        memory=memory,
        hbm_bytes=sc.cluster.instance.accelerator.hbm_bytes,
        validation_s=validation,
        checkpoint_s=checkpoint,
        details=details,
    )


def _memory_fit(sc: Any, spec: RLSpec, gen: ph.GenerationPool, plan: Any) -> tuple[dict[str, float], float]:
    """HBM per GPU at its fullest, and the seconds a colocated step spends moving state between phases.

    Training alone must fit. Colocated, the generation engine takes its memory fraction of HBM while
    generating (weights, KV cache, workspace); the training state (weights, gradients, optimizer)
    either waits in host memory meanwhile (``training_state: offload``: out and back over the host
    link once a step, and the engine's weights likewise, as vLLM's sleep mode does) or stays, and
    then both must fit at once. Raises :class:`OutOfMemoryError` naming what overflows."""
    acc = sc.cluster.instance.accelerator
    hbm = acc.hbm_bytes
    worst = max(plan.memory, key=lambda m: m.total)
    if worst.total > hbm:
        parts = worst.as_dict()
        big = max(parts, key=parts.get)
        raise OutOfMemoryError(
            f"{sc.file}: training needs {format_bytes(worst.total)} per GPU of "
            f"{format_bytes(hbm)} (largest: {big} {format_bytes(parts[big])}); raise "
            "parallelism.tp/pp/ep, use recompute or ZeRO",
            breakdown=parts,
        )
    cfg_frac = spec.generation.serving.memory_fraction or _engine_fraction(spec)
    gen_bytes = cfg_frac * hbm
    weights = gen.pool.cost.weight_bytes_per_gpu
    mem = {
        "training": worst.total,
        "training_static": ph.static_bytes(plan),
        "generation_engine": gen_bytes,
        "generation_weights": weights,
        "hbm": hbm,
    }
    if spec.placement.kind != "colocated":
        return mem, 0.0
    if spec.placement.training_state == "keep":
        need = gen_bytes + mem["training_static"]
        if need > hbm:
            raise OutOfMemoryError(
                f"{sc.file}: rl.placement.colocated: generation ({format_bytes(gen_bytes)}, "
                f"memory_fraction {cfg_frac:g}) and the kept training state "
                f"({format_bytes(mem['training_static'])}: weights, gradients, optimizer) need "
                f"{format_bytes(need)} per GPU of {format_bytes(hbm)}; offload the training state or "
                "lower rl.generation.memory_fraction",
                breakdown=mem,
            )
        return mem, 0.0
    link = acc.host_link_bytes_per_s
    if not link:
        raise ConfigError(
            f"the catalog has no host_link for {acc.name}, which offloading needs (expected "
            "training_state: keep)",
            file=sc.file,
            field="rl.placement.colocated.training_state",
        )
    moved = mem["training_static"] + weights
    host_need = moved * sc.cluster.instance.num_accelerators
    host = sc.cluster.instance.host_memory_bytes
    if host and host_need > host:
        raise OutOfMemoryError(
            f"{sc.file}: rl.placement.colocated: the offloaded training state and engine weights "
            f"need {format_bytes(host_need)} of host memory per node of {format_bytes(host)}",
            breakdown={"host_needed": host_need, "host": host},
        )
    return mem, 2.0 * moved / link


def _engine_fraction(spec: RLSpec) -> float:
    from ..model.serving_cost import engine_profile

    return engine_profile(spec.generation.serving.engine).memory_fraction


# ----------------------------------------------------------------------------------------------
# results


def _bottleneck(plan: RLPlan, step: float, busy: dict[str, float]) -> tuple[str, str]:
    p = plan.phases
    top = max(p, key=p.get)
    share = p[top] / step if step else 0.0
    advice = {
        "generation": (
            "rollout generation: more generation GPUs, a smaller max_response_len (the step waits for "
            "its longest response), off_policy overlap or fp8 rollouts"
        ),
        "training": "the policy update: more training GPUs, fp8 training or fewer optimizer steps a step",
        "logprob": "log-prob passes: fold the reference into the policy pass or drop the KL term (DAPO)",
        "weight_sync": "weight sync: a faster fabric, colocation (in-place reshard) or fewer weights to move",
        "reward": "the reward: more reward workers or a cheaper verifier",
        "transition": "offloading state between phases: keep the training state resident if it fits",
    }[top]
    if not plan.colocated:
        idle = {pool: 1.0 - b for pool, b in busy.items()}
        worst = max(idle, key=idle.get)
        if idle[worst] > 0.3:
            advice += f"; the {worst} pool idles {idle[worst]:.0%} of the step (rebalance the node split)"
    return top, f"{share:.0%} of the RL step is {advice}"


def make_result(sc: Any, plan: RLPlan, step: float, run: RunResult | None = None) -> Result:
    from ..cost import price_for

    p = plan.phases
    k = plan.spec.off_policy
    cl = sc.cluster
    if plan.colocated:
        cpu = 0.0 if plan.reward_on_gpus else p["reward"]
        busy = {"gpus": min(1.0, (sum(p.values()) - cpu) / step)}
    else:
        busy = {
            "generation": min(1.0, (p["generation"] + p["weight_sync"]) / step),
            "training": min(
                1.0,
                (
                    p["logprob"]
                    + p["training"]
                    + plan.weight_send_s
                    + (p["reward"] if plan.reward_on_gpus else 0.0)
                )
                / step,
            ),
        }
    ro = plan.rollouts
    trained = ro.trained_tokens
    price = price_for(sc)
    usd_h = price.usd_per_hour * cl.nodes if price.usd_per_hour else None
    usd_step = usd_h * step / 3600.0 if usd_h else None
    steps = plan.spec.steps or None
    run_s = plan.run_time_s(step, steps) if steps else None
    top, sentence = _bottleneck(plan, step, busy)
    tplan = plan.train_plan
    gen_sample = ro.generated_tokens
    metrics: dict[str, Any] = {
        "tp": tplan.tp,
        "pp": tplan.pp,
        "dp": tplan.dp,
        "cp": tplan.cp,
        "ep": tplan.ep,
        "step_time_s": step,
        "tokens_per_s": trained / step,
        # NeMo RL's definition: training tokens of a batch / step time / every GPU of the job
        "tokens_per_s_per_gpu": trained / step / cl.gpus,
        "memory_per_gpu_bytes": plan.memory["training"],
        "hbm_per_gpu_bytes": plan.hbm_bytes,
        "fits": True,
        "usd_per_step": usd_step,
        "time_to_train_s": run_s,
        "gpu_hours": cl.gpus * run_s / 3600.0 if run_s else None,
        "cost_usd": usd_h * run_s / 3600.0 if (run_s and usd_h) else None,
        "bottleneck": top,
        "pricing_option": price.option,
        "algorithm": plan.spec.algorithm,
        "placement": plan.spec.placement.kind,
        "off_policy": k,
        "rollouts_per_step": plan.spec.rollouts,
        "generated_sequences_per_step": int(ro.outs.size),
        "optimizer_steps": plan.optimizer_steps,
        "generation_gpus": plan.gen_gpus,
        "training_gpus": plan.train_gpus,
        "generation_tp": plan.engine_gpus,
        "generation_s": p["generation"],
        "reward_s": p["reward"],
        "logprob_s": p["logprob"],
        "training_s": p["training"],
        "weight_sync_s": p["weight_sync"],
        "transition_s": p["transition"],
        "generated_tokens_per_s": gen_sample / p["generation"] if p["generation"] else None,
        "trained_tokens_per_step": trained,
        "generation_utilization": busy.get("generation", busy.get("gpus")),
        "training_utilization": busy.get("training", busy.get("gpus")),
        "usd_per_million_trained_tokens": usd_step / trained * 1e6 if usd_step else None,
        "rl_steps": plan.spec.steps or None,
        "validation_s": plan.validation_s if plan.spec.validation else None,
        "checkpoint_s": plan.checkpoint_s if plan.spec.checkpoint_every else None,
        "mean_step_time_s": step + plan.run_overhead_s,
    }
    breakdown = {f"{k_}_s": v for k_, v in p.items() if v or k_ != "transition"}
    for pool, b in busy.items():
        idle = (1.0 - b) * step
        breakdown[f"idle_{pool}_pool_s"] = idle if idle > 1e-9 * step else 0.0  # rounding residue is no idle
    det = dict(plan.details)
    det["bottleneck"] = sentence
    det["price_source"] = price.source
    if run is not None:
        det["timeline"] = timeline_rows(run)  # the simulated steps, phase by phase, per pool
    det["pools"] = (
        {"gpus": {"gpus": cl.gpus, "busy_fraction": busy["gpus"]}}
        if plan.colocated
        else {
            "generation": {
                "gpus": plan.gen_gpus,
                "nodes": plan.gen_nodes,
                "busy_fraction": busy["generation"],
            },
            "training": {
                "gpus": plan.train_gpus,
                "nodes": plan.train_nodes,
                "busy_fraction": busy["training"],
            },
        }
    )
    return Result(
        scenario=sc.name,
        kind="rl",
        instance=cl.instance.name,
        nodes=cl.nodes,
        gpus=cl.gpus,
        usd_per_hour=usd_h,
        price_date=price.date,
        metrics=metrics,
        breakdown=breakdown,
        memory=plan.memory,
        details=det,
    )


def _weight_sync_alone(sc: Any) -> Result | None:
    """The result of ``rl.only: weight_sync`` (the update priced alone, :mod:`.rl_sync`), else None."""
    spec = parse_rl_spec(sc.extra, file=sc.file, policy=sc.workload.model)
    if spec.only != "weight_sync":
        return None
    from .rl_sync import weight_sync_result

    return weight_sync_result(sc, spec)


def simulate_rl(sc: Any, *, trace_path: str | None = None) -> Result:
    """Discrete-event simulation of an RL step (``fmsim.simulate`` for ``kind: rl``)."""
    alone = _weight_sync_alone(sc)
    if alone is not None:
        if trace_path:
            from .rl_sync import write_sync_trace

            write_sync_trace(alone, trace_path)
        return alone
    engine_trace: list | None = [] if trace_path else None
    plan = build_rl_plan(sc, estimate=False, trace=engine_trace)
    step, run = step_time_des(plan)
    if trace_path:
        write_trace(run, trace_path, sc.name, engine_trace)
    return make_result(sc, plan, step, run)


def estimate_rl(sc: Any) -> Result:
    """Analytical estimate of an RL step (``fmsim.estimate``): same phase costs, no event queue."""
    alone = _weight_sync_alone(sc)
    if alone is not None:
        return alone
    plan = build_rl_plan(sc, estimate=True)
    # the phases laid out on their pools (the timeline the closed form summarises; a test checks they agree)
    _, run = step_time_des(plan)
    return make_result(sc, plan, step_time_estimate(plan), run)


def check_rl_sections(sc: Any) -> None:
    """Validate the ``rl:`` section and the pools it makes without running (``fmsim lint``)."""
    spec = parse_rl_spec(sc.extra, file=sc.file, policy=sc.workload.model)
    gen_gpus, train_gpus, _, _ = _pools(sc, spec)
    ph.check_generation_layout(sc, spec, gen_gpus)
    ph.check_training_layout(sc, train_gpus)
    if spec.checkpoint_every:
        ph.check_checkpoint_storage(sc)


__all__ = [
    "RLPlan",
    "build_rl_plan",
    "check_rl_sections",
    "estimate_rl",
    "simulate_rl",
    "step_time_des",
    "step_time_estimate",
]
