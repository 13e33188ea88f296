"""The phases of one RL step, each priced by a simulator that already exists (no new cost physics).

* rollouts: the prompt and response lengths of a step, drawn once with the scenario's seeded
  generator (the response cap truncates the tail);
* generation: the serving compile step (:func:`fmsim.workloads.inference.build_plan`: engine profile,
  KV capacity) and its continuous-batching engine (:class:`fmsim.engine.serving_des.ReplicaEngine`),
  fed a step's offline batch of sample groups. Identical engines are folded: groups are dealt to
  the engines round-robin (as NeMo RL / OpenRLHF shard a batch over their vLLM workers) and only the
  engines that can be the slowest -- the one holding the longest response, the one with the most
  tokens -- are simulated; the step waits for the slower;
* log-prob, value and reward-model passes: forward-only pipelines over the training plan's stage
  costs (:mod:`fmsim.parallel.strategy`), on the generated sequences packed into training sequences;
* the policy (and critic) update: the training step of :mod:`fmsim.workloads.pretrain` (its job graph
  on the DES, or its estimate), once per optimizer step;
* weight sync: the fabric's collectives (:func:`fmsim.hardware.collectives.collective_time`) over the
  placed group, the host link, HBM and storage bandwidths of the catalog.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from ..engine.des import run_jobs
from ..engine.serving_des import Job, ReplicaEngine
from ..errors import ConfigError, InfeasibleError, OutOfMemoryError, ParallelismError
from ..hardware.collectives import GroupShape, collective_time
from ..model.kernels import BYTES_PER_ELEMENT
from ..parallel.strategy import Plan, build_plan
from .inference import Pool
from .inference import build_plan as build_serving_plan
from .inference_spec import InferenceSpec, TestTimeComputeSpec, TrafficSpec
from .pretrain import build_jobs, estimate_step, link_capacities
from .rl_spec import RLSpec

# ----------------------------------------------------------------------------------------------
# rollouts


@dataclass(frozen=True, slots=True)
class Rollouts:
    """Lengths of one step's generated groups: ``prompts[i]`` and ``outs[i, j]`` (sample j)."""

    prompts: np.ndarray  # (groups,)
    outs: np.ndarray  # (groups, samples)
    trained_groups: int  # the first this many groups are trained on (dynamic sampling drops the rest)

    @property
    def trained_tokens(self) -> float:
        p, o = self.prompts[: self.trained_groups], self.outs[: self.trained_groups]
        return float(p.sum() * o.shape[1] + o.sum())

    @property
    def generated_tokens(self) -> float:
        return float(self.outs.sum())

    @property
    def all_tokens(self) -> float:
        return float(self.prompts.sum() * self.outs.shape[1] + self.outs.sum())


def draw_rollouts(spec: RLSpec, seed: int, file: str | None) -> Rollouts:
    rng = np.random.default_rng(seed)
    n, g = spec.generated_prompts, spec.samples_per_prompt
    out = []
    for where, dist, size in (
        ("rl.prompt_len", spec.prompt_len, n),
        ("rl.response_len", spec.response_len, n * g),
    ):
        try:
            out.append(dist.sample(rng, size))
        except ConfigError as exc:
            raise ConfigError(exc.message, file=file, field=where) from None
    return Rollouts(prompts=out[0], outs=out[1].reshape(n, g), trained_groups=spec.prompts)


# ----------------------------------------------------------------------------------------------
# generation


@dataclass(frozen=True, slots=True)
class GenerationPool:
    pool: Pool  # one engine's cost model and scheduler limits (serving compile step)
    engines: int
    gpus: int
    engine_gpus: int


def check_generation_layout(sc: Any, spec: RLSpec, gpus: int) -> int:
    """GPUs of one generation engine, checked against the model and the pool (ConfigError)."""
    g = spec.generation
    model = sc.workload.model
    if g.ep > 1 and not (g.serving.attention_dp and model.moe is not None):
        raise ConfigError(
            f"ep {g.ep} spreads experts under attention_dp (expected attention_dp: true with an "
            "MoE model, or ep: 1: TP shards the experts)",
            file=sc.file,
            field="rl.generation.ep",
        )
    if model.heads % g.tp:
        raise ConfigError(
            f"{g.tp} does not divide the {model.heads} attention heads of {model.name}",
            file=sc.file,
            field="rl.generation.tp",
        )
    engine_gpus = g.tp * g.ep
    if gpus % engine_gpus:
        raise ConfigError(
            f"{gpus} generation GPUs are not a whole number of {engine_gpus}-GPU engines "
            f"(expected tp x ep to divide {gpus})",
            file=sc.file,
            field="rl.generation.tp",
        )
    return engine_gpus


def build_generation(sc: Any, spec: RLSpec, gpus: int, rollouts: Rollouts) -> GenerationPool:
    """The generation engines of ``gpus`` GPUs, compiled by the serving workload."""
    g = spec.generation
    model, inst = sc.workload.model, sc.cluster.instance
    engine_gpus = check_generation_layout(sc, spec, gpus)
    per_node = inst.num_accelerators
    nodes = max(1, -(-engine_gpus // per_node))
    traffic = TrafficSpec(
        arrival="offline",
        rate_per_s=math.inf,
        num_requests=len(rollouts.prompts),
        prompt_len=spec.prompt_len,
        output_len=spec.response_len,
    )
    samples = spec.samples_per_prompt
    ttc = TestTimeComputeSpec(samples=samples, strategy="self-consistency" if samples > 1 else "none")
    ispec = InferenceSpec(traffic=traffic, serving=g.serving, ttc=ttc)
    try:
        plan = build_serving_plan(
            name=sc.name,
            model=model,
            instance=inst,
            precision=sc.workload.precision,
            tp=g.tp,
            pp=1,
            ep=g.ep,
            nodes=nodes,
            spec=ispec,
            seed=sc.seed,
            file=sc.file,
        )
    except OutOfMemoryError as exc:
        raise OutOfMemoryError(f"{sc.file}: rl.generation: {exc}", breakdown=exc.breakdown) from None
    except ParallelismError as exc:
        raise ConfigError(exc.message, file=sc.file, field="rl.generation.tp") from None
    pool = plan.pool("serve")
    assert pool is not None
    return GenerationPool(pool=pool, engines=gpus // engine_gpus, gpus=gpus, engine_gpus=engine_gpus)


def deal_groups(rollouts: Rollouts, engines: int) -> list[list[tuple[int, np.ndarray]]]:
    """Each engine's (prompt, sample lengths) groups. The step's sequences are split evenly over the
    engines in batch order (NeMo RL shards a generation batch over its vLLM workers so); whole groups
    when they divide evenly, else a group's samples may land on two engines (each then prefills the
    prompt)."""
    n, g = rollouts.outs.shape
    if n % engines == 0:
        return [
            [(int(rollouts.prompts[i]), rollouts.outs[i]) for i in range(e, n, engines)]
            for e in range(engines)
        ]
    bounds = np.linspace(0, n * g, engines + 1).round().astype(int)
    shares: list[list[tuple[int, np.ndarray]]] = []
    for a, b in itertools.pairwise(bounds):
        share = []
        for i in range(a // g, -(-b // g)):
            lo, hi = max(a, i * g) - i * g, min(b, (i + 1) * g) - i * g
            if hi > lo:
                share.append((int(rollouts.prompts[i]), rollouts.outs[i, lo:hi]))
        shares.append(share)
    return shares


def critical_engines(shares: list[list[tuple[int, np.ndarray]]]) -> list[int]:
    """The engines that can finish last: the one with the longest response, the one with most tokens."""
    longest, work = [], []
    for s in shares:
        outs = np.concatenate([o for _, o in s]) if s else np.zeros(1, dtype=np.int64)
        longest.append(int(outs.max()))
        work.append(int(outs.sum()) + sum(p * o.size for p, o in s))
    return sorted({int(np.argmax(longest)), int(np.argmax(work))})


def _fitting_sets(cfg: Any, prompt: int, outs: np.ndarray) -> list[np.ndarray]:
    """The samples of one group as the engine's jobs: one job sharing the prompt's KV blocks (prefix
    caching), cut into consecutive pieces where the whole group would not fit the KV cache at once.

    vLLM schedules every sample as a request of its own (the group shares only its cached prompt
    blocks), so a group larger than the cache runs in pieces rather than being refused; a single
    sample that does not fit is still refused by the engine.
    """
    if not cfg.prefix_caching:
        return [outs[i : i + 1] for i in range(len(outs))]
    own = np.asarray(cfg.blocks(prompt % cfg.block_size + outs, prompt + outs), dtype=np.int64)
    shared = cfg.shared_blocks(prompt)
    if shared + int(own.sum()) <= cfg.total_blocks:
        return [outs]
    sets, start, used = [], 0, shared
    for i, b in enumerate(own):
        if used + int(b) > cfg.total_blocks and i > start:
            sets.append(outs[start:i])
            start, used = i, shared
        used += int(b)
    sets.append(outs[start:])
    return sets


def simulate_engine(
    gen: GenerationPool,
    groups: list[tuple[int, np.ndarray]],
    *,
    file: str | None,
    trace: list | None = None,
    name: str = "engine",
) -> float:
    """Makespan of one engine's offline batch on the serving DES (continuous batching, paged KV)."""
    env = simpy.Environment()
    eng = ReplicaEngine(env, name, gen.pool.cost, gen.pool.cfg, trace)
    jobs = []
    jid = 0
    for prompt, outs in groups:
        sets = _fitting_sets(gen.pool.cfg, prompt, outs)
        for o in sets:
            jid += 1
            job = Job(jid=jid, arrival_s=0.0, prompt=prompt, out=o)
            jobs.append(job)
            eng.submit(job)
    env.run()
    if any(j.rejected for j in jobs):
        raise InfeasibleError(
            f"{file}: rl.generation: a prompt and its longest response do not fit one engine's KV "
            f"cache ({gen.pool.kv_capacity_tokens:,} tokens); raise tp, memory_fraction or "
            "lower max_response_len"
        )
    return max(float(np.nanmax(j.finish_s)) for j in jobs) if jobs else 0.0


def estimate_engine(
    gen: GenerationPool, groups: list[tuple[int, np.ndarray]], memo: dict | None = None
) -> float:
    """Makespan of one engine's batch without the event queue, from the same iteration costs.

    The engine runs at the batch ``b`` its sequence limit and KV cache allow until the queue drains,
    then its last ``b`` sequences -- taken as the longest ones -- finish one by one, the batch shrinking
    as each ends: ``sum over k = b..1`` of (the steps run with k alive) x the step at k sequences
    and their mean context then. The step cost ``c0(k) + c1 k ctx`` comes from the engine's cost model at
    a few batch sizes (interpolated in k); the prompts' prefill adds on. ``memo`` keeps the costs
    between the engines of one plan."""
    if not groups:
        return 0.0
    memo = {} if memo is None else memo
    cost, cfg, pool = gen.pool.cost, gen.pool.cfg, gen.pool
    outs = np.concatenate([o for _, o in groups]).astype(float)
    prompts = np.array([p for p, _ in groups], dtype=float)
    sizes = np.array([o.size for _, o in groups], dtype=float)
    n = outs.size
    share = cfg.prefix_caching
    prompt_slots = float((prompts if share else prompts * sizes).sum()) / n
    per_seq = float(cfg.kv_slots(prompt_slots + outs.mean() / 2.0))
    b = max(1, round(min(cfg.max_seqs, n, pool.kv_capacity_tokens / max(1.0, per_seq))))
    pbar = float((prompts * sizes).sum() / n)

    def coeffs(k: int) -> tuple[float, float]:
        if ("decode", k) not in memo:
            memo["decode", k] = cost.decode_coeffs(k)
        return memo["decode", k]

    # c0 is close to linear in the batch (weight reads, then per-token work); four sizes pin it down
    grid = sorted({1, max(1, b // 4), max(1, b // 2), b})
    c0s = [coeffs(k)[0] for k in grid]
    c1 = coeffs(b)[1]

    def eff(ctx: np.ndarray) -> np.ndarray:
        """Attention context of one sequence at each mean context (local layers see their window)."""
        if not cost.window_share:
            return ctx
        return np.array([cost.effective_context(c) for c in ctx])

    longest = np.sort(outs)[::-1][:b]
    rest = float(outs.sum() - longest.sum())
    t = 0.0
    if rest > 0:  # the queue: the other sequences' tokens at the full batch
        full = float(np.interp(b, grid, c0s)) + c1 * b * float(eff(np.array([pbar + outs.mean() / 2.0]))[0])
        t += rest / b * full
    # the shrinking batch: k sequences alive between the k-th and (k+1)-th longest response lengths
    hi = longest
    lo = np.append(longest[1:], 0.0)
    k = np.arange(1, len(longest) + 1, dtype=float)
    span = hi - lo
    t += float(np.sum(span * (np.interp(k, grid, c0s) + c1 * k * eff(pbar + (lo + hi) / 2.0))))
    pre = 0.0
    for p, size in zip(prompts, sizes, strict=True):
        if ("prefill", p) not in memo:
            memo["prefill", p] = cost.prefill_time(int(p))
        pre += memo["prefill", p] * (1 if share else size)
    return t + pre


def validation_s(sc: Any, spec: RLSpec, gen: GenerationPool, *, estimate: bool) -> float:
    """One validation on the generation engines: ``rounds`` batches of ``batch`` held-out prompts, one
    response each, drawn from the step's length distributions (its own seeded stream); each round waits
    for its longest response (NeMo RL ``validate``: a rollout per ``val_batch_size`` batch). The rounds
    are priced as one drawn batch, ``rounds`` times."""
    v = spec.validation
    assert v is not None
    one = dataclasses.replace(spec, prompts=v.batch, samples_per_prompt=1, over_generate=1.0)
    ro = draw_rollouts(one, sc.seed + 1, sc.file)
    shares = deal_groups(ro, gen.engines)
    memo: dict = {}
    t = max(
        (estimate_engine(gen, shares[e], memo) if estimate else simulate_engine(gen, shares[e], file=sc.file))
        for e in critical_engines(shares)
    )
    return v.rounds * t


def checkpoint_s(sc: Any, plan: Plan) -> float:
    """One synchronous checkpoint of the policy's training state (weights, fp32 master weights, Adam
    moments, as the plan shards them) through ``cluster.storage`` (:func:`fmsim.workloads.checkpointing.
    checkpoint_cost`). Synchronous: NeMo RL's Megatron worker saves with ``async_save=False`` ("This
    doesn't work right now", nemo_rl/models/policy/megatron_policy_worker.py @06beed91)."""
    from ..hardware.storage import file_system
    from .checkpointing import checkpoint_cost

    check_checkpoint_storage(sc)
    fs = file_system(sc.cluster.storage, plan.instance)
    write = checkpoint_cost(plan, fs, async_=False, interval_s=None).write_s
    return float(write or 0.0)


def check_checkpoint_storage(sc: Any) -> None:
    """``rl.checkpoint`` needs the file system it writes to (ConfigError)."""
    if not sc.cluster.storage:
        raise ConfigError(
            "a checkpoint is written to a file system (expected cluster.storage, e.g. {kind: fsx-lustre, "
            "capacity: 1.2 TB})",
            file=sc.file,
            field="rl.checkpoint",
        )


# ----------------------------------------------------------------------------------------------
# training-side passes


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def check_training_layout(sc: Any, gpus: int) -> None:
    """The policy's parallelism on the training pool's ``gpus`` (the scenario reader leaves it to the
    workload): tp*pp*cp divides the pool, and ep the tp*cp*dp ranks of a stage (ParallelismError)."""
    par = sc.parallelism
    mp = par.tp * par.pp * par.cp
    if gpus % mp:
        raise ParallelismError(
            f"tp*pp*cp = {par.tp}*{par.pp}*{par.cp} = {mp} does not divide the {gpus} GPUs of the training "
            "pool (expected a pool that is a multiple of it)",
            file=sc.file,
            field="parallelism",
        )
    ranks = par.tp * par.cp * (gpus // mp)
    if par.ep > 1 and ranks % par.ep:
        raise ParallelismError(
            f"{par.ep} does not divide the tp*cp*dp = {ranks} ranks of a pipeline stage of the training pool",
            file=sc.file,
            field="parallelism.ep",
        )


def training_scenario(
    sc: Any, *, gpus: int, nodes: int, seq_len: int, global_batch: int, model: Any = None
) -> Any:
    """The scenario of a training pass on the training pool: the policy's parallelism over ``gpus``,
    ``global_batch`` packed sequences of ``seq_len`` tokens."""
    check_training_layout(sc, gpus)
    par = sc.parallelism
    mp = par.tp * par.pp * par.cp
    wl = dataclasses.replace(
        sc.workload,
        kind="finetune",
        seq_len=seq_len,
        global_batch=global_batch,
        model=model if model is not None else sc.workload.model,
    )
    return dataclasses.replace(
        sc,
        workload=wl,
        cluster=dataclasses.replace(sc.cluster, nodes=nodes, gpus=gpus),
        parallelism=dataclasses.replace(par, dp=gpus // mp),
    )


def packed_seq_len(sc: Any, spec: RLSpec) -> int:
    """Tokens per packed training sequence: the file's, else the longest prompt + response, rounded
    to what tensor and context parallelism split (NeMo RL make_sequence_length_divisible_by)."""
    par = sc.parallelism
    n = spec.packed_seq_len or int(spec.prompt_len.upper() + spec.response_len.upper())
    return _round_up(max(n, 1), par.tp * 2 * par.cp if par.cp > 1 else par.tp)


def packed_batch(tokens: float, seq_len: int, dp: int, micro_batch: int) -> int:
    """Packed sequences that hold ``tokens`` (sequence packing fills each to ``seq_len``), a whole
    number of micro-batches per data-parallel rank."""
    return _round_up(max(1, math.ceil(tokens / seq_len)), dp * micro_batch)


def training_plan(
    sc: Any,
    *,
    gpus: int,
    nodes: int,
    seq_len: int,
    tokens: float,
    model: Any = None,
    where: str = "parallelism",
) -> Plan:
    par = sc.parallelism
    dp = gpus // (par.tp * par.pp * par.cp) if gpus % (par.tp * par.pp * par.cp) == 0 else 1
    batch = packed_batch(tokens, seq_len, dp, sc.workload.micro_batch)
    if par.vpp > 1:
        batch = _round_up(batch, dp * sc.workload.micro_batch * par.pp)
    tsc = training_scenario(sc, gpus=gpus, nodes=nodes, seq_len=seq_len, global_batch=batch, model=model)
    try:
        return build_plan(tsc)
    except ConfigError as exc:
        raise ConfigError(
            exc.message, file=sc.file, field=where if where != "parallelism" else exc.field
        ) from None


def logprob_scenario(sc: Any, spec: RLSpec) -> Any:
    """``sc`` with the micro-batch of the forward-only passes: ``logprob_batch`` packed sequences
    (``sc`` itself when it is 1)."""
    if spec.logprob_batch == 1:
        return sc
    return dataclasses.replace(sc, workload=dataclasses.replace(
        sc.workload, micro_batch=sc.workload.micro_batch * spec.logprob_batch))


def forward_s(plan: Plan, tokens: float | None = None) -> float:
    """One forward-only pass through the plan's pipeline of its batch -- or of ``tokens`` packed the
    same way (the stage costs are per micro-batch): the busiest stage for every micro-batch plus the
    fill of the others and their sends (no backward, no optimizer); under ZeRO-3/FSDP the weights are
    gathered once more."""
    pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
    if tokens is not None:
        m = packed_batch(tokens, plan.seq_len, plan.dp, plan.micro_batch) // (plan.dp * plan.micro_batch)
    per_stage = [sum(plan.virtual_stage(s, c).fwd_s for c in range(vpp)) for s in range(pp)]
    slow = max(per_stage)
    t = m * slow + (sum(per_stage) - slow) / vpp + (pp * vpp - 1) * plan.pp_send_s
    if plan.zero >= 3:
        t += max(plan.dp_gather_s)
    return t


def update_s(plan: Plan, *, estimate: bool) -> float:
    """One optimizer step of the plan: the training DES of :mod:`fmsim.workloads.pretrain`, or its
    estimate."""
    if estimate:
        return estimate_step(plan)[0]
    return run_jobs(build_jobs(plan), link_capacities(plan), record=False).makespan_s


def reference_swap_s(sc: Any, plan: Plan) -> float:
    """The frozen reference copy of the policy waits in host memory and is swapped in for its pass: the
    policy's weight shard copied to the host, the reference's loaded, the policy's loaded back -- three
    copies of the busiest stage's weights over the host link (NeMo RL's Megatron worker,
    ``use_reference_model`` in nemo_rl/models/policy/megatron_policy_worker.py @06beed91, keeps
    ``reference_state_dict`` on the CPU). No host link in the catalog: no swap priced."""
    link = sc.cluster.instance.accelerator.host_link_bytes_per_s
    return 3.0 * max(m.weights for m in plan.memory) / link if link else 0.0


def static_bytes(plan: Plan) -> float:
    """Weights, gradients and optimizer state per GPU (the busiest stage): what offloading moves."""
    return max(m.weights + m.gradients + m.optimizer for m in plan.memory)


# ----------------------------------------------------------------------------------------------
# weight sync


def _group(size: int, per_node: int) -> GroupShape:
    return GroupShape(size=size, per_node=max(1, min(size, per_node)))


def weight_bytes(sc: Any, *, stored: bool = False) -> float:
    """Bytes of the policy's weights as the generation engines hold them; ``stored``: as its checkpoint
    holds them, multi-token-prediction modules included (a checkpoint-engine update moves every tensor of
    the checkpoint, MTP layers too)."""
    prec = sc.workload.precision
    model = sc.workload.model
    n = model.num_params + (model.num_mtp_params if stored else 0)
    return n * min(2.0, BYTES_PER_ELEMENT.get(prec, 2.0))


def gather_s(sc: Any, train_gpus: int) -> float:
    """The trainers assemble full tensors from their TP/PP/EP shards (NeMo RL's refit gathers each
    parameter bucket over the model-parallel ranks): an all-gather of the weights over that group."""
    par, inst = sc.parallelism, sc.cluster.instance
    mp = min(train_gpus, par.tp * par.pp * max(1, par.ep))
    if mp <= 1:
        return 0.0
    return collective_time("all-gather", weight_bytes(sc), inst, _group(mp, inst.num_accelerators)).time_s


def weight_sync_s(
    sc: Any, spec: RLSpec, *, gen: GenerationPool, train_gpus: int, gen_nodes: int
) -> tuple[float, float]:
    """(seconds until every generation engine holds the trained weights, seconds the trainers spend
    sending them) -- the two differ for a broadcast, whose source is done once the data has left it
    while the last receiver waits for the chain to fill (see docs/rl.md)."""
    ws = spec.weight_sync
    inst = sc.cluster.instance
    acc = inst.accelerator
    w = weight_bytes(sc)
    hbm = acc.hbm_bytes_per_s * acc.hbm_efficiency
    # every generation GPU writes its shard into the engine's buffers (CUDA IPC copy in HBM)
    load = w / gen.engine_gpus / hbm
    if ws.method == "reshard":
        t = gather_s(sc, train_gpus) + load
        return t, t
    if ws.method == "storage":
        st = sc.cluster.storage or {}
        if not (st.get("throughput_per_tib") and st.get("capacity")):
            raise ConfigError(
                "storage needs cluster.storage with throughput_per_tib and capacity",
                file=sc.file,
                field="rl.weight_sync",
            )
        bw = st["throughput_per_tib"] * st["capacity"] / 2**40
        # the trainers write one copy; every engine reads the whole checkpoint
        send = gather_s(sc, train_gpus) + w / bw
        return send + w * gen.engines / bw + load, send
    if ws.source == "host":
        # checkpoint-engine: the weights wait in host memory on the generation GPUs (host_broadcast)
        t = host_broadcast(sc, ws.bucket_bytes, gpus=gen.gpus, nodes=gen_nodes, engine_gpus=gen.engine_gpus).time_s
        return t, t
    # broadcast: buckets pipelined through their source -> every generation GPU (NCCL broadcast)
    group = _group(gen.gpus + 1, inst.num_accelerators)
    nodes = gen_nodes + 1
    nb = max(1, math.ceil(w / ws.bucket_bytes))
    bucket = w / nb
    bcast = collective_time("broadcast", bucket, inst, group, nodes=nodes).time_s
    # the source pushes every bucket once over its first hop (out of the training node)
    hop = collective_time("broadcast", bucket, inst, _group(2, 1), nodes=2).time_s
    gather = gather_s(sc, train_gpus)
    return gather + nb * bcast + load, gather + nb * hop


# ----------------------------------------------------------------------------------------------
# checkpoint-engine: the weights wait in host memory and are broadcast to every engine in buckets


#: torch.distributed.barrier on NCCL is an all-reduce of a one-element tensor
BARRIER_BYTES = 4.0


@dataclass(frozen=True, slots=True)
class HostBroadcast:
    """One checkpoint-engine update (``weight_sync: {method: broadcast, source: host}``), priced."""

    time_s: float
    weight_bytes: float
    owners: int  # ranks that own a share of the checkpoint (every GPU of the update)
    buckets_per_owner: int
    broadcasts: int
    h2d_s: float  # one full bucket host-to-device
    broadcast_s: float  # one full bucket over the whole group
    copy_s: float  # one full bucket device-to-device into the IPC buffer
    reload_s: float  # one full bucket loaded by an engine rank (its 1/tp share)
    barrier_s: float


def host_broadcast(sc: Any, bucket_bytes: float, *, gpus: int, nodes: int, engine_gpus: int) -> HostBroadcast:
    """The broadcast update of MoonshotAI/checkpoint-engine as its code runs it (``ParameterServer.
    _update_per_bucket`` with no ``ranks``, checkpoint_engine/ps.py @415c3205):

    * every one of the ``gpus`` ranks owns an equal share of the checkpoint in pinned host memory
      (examples/update.py ``split_tensors`` deals the tensors over the world) and cuts it into buckets
      of ``bucket_bytes`` (``_gen_h2d_buckets``: full buckets, then the remainder);
    * round i: every rank copies its i-th bucket host-to-device at once (the h2d buffer, each over its
      own host link), then the owners take turns: the owner copies its bucket into one half of a
      double IPC buffer (device to device), broadcasts it over the whole group (one NCCL communicator
      of every GPU, every vLLM instance), waits for the engine to finish loading the previous bucket,
      and a barrier ends the turn; the engine then loads this bucket (vLLM ``load_weights``: each TP rank
      copies its 1/tp share) while the next one is broadcast;
    * the update ends with the last bucket's load.

    Each piece is priced by what exists: the broadcast and the barrier by
    :func:`fmsim.hardware.collectives.collective_time` over the placed group, the copies by the host
    link and the HBM bandwidth (a copy reads and writes each byte). Not priced: Python, ZeroMQ and the
    per-tensor work of ``load_weights``, ``process_weights_after_loading``, the bucket-size probe."""
    inst = sc.cluster.instance
    acc = inst.accelerator
    w = weight_bytes(sc, stored=True)
    hbm = acc.hbm_bytes_per_s * acc.hbm_efficiency
    link = acc.host_link_bytes_per_s
    if not link:
        raise ConfigError(
            f"the catalog has no host_link for {acc.name}, which a host-memory broadcast copies over "
            "(expected source: device)",
            file=sc.file,
            field="rl.weight_sync.source",
        )
    group = _group(gpus, inst.num_accelerators)
    share = w / gpus
    full_rounds = int(share // bucket_bytes)
    rest = share - full_rounds * bucket_bytes
    if rest <= 1e-9 * share:
        rest = 0.0
    if not full_rounds:
        bucket_bytes, full_rounds, rest = share, 1, 0.0

    def bcast(b: float) -> float:
        return collective_time("broadcast", b, inst, group, nodes=nodes).time_s

    barrier = collective_time("all-reduce", BARRIER_BYTES, inst, group, nodes=nodes).time_s

    def round_s(b: float, prev_load: float) -> tuple[float, float]:
        """One round of ``b``-byte buckets: (seconds, the load of its last bucket, still running). The
        round's host-to-device copies (all ranks at once) lead the first owner's turn; every turn waits
        for the previous bucket's load."""
        h2d, copy, send, load = b / link, 2.0 * b / hbm, bcast(b), 2.0 * b / engine_gpus / hbm
        first = max(h2d + copy + send, prev_load) + barrier
        return first + (gpus - 1) * (max(copy + send, load) + barrier), load

    t, load = round_s(bucket_bytes, 0.0)
    if full_rounds > 1:
        t_full, _ = round_s(bucket_bytes, load)
        t += (full_rounds - 1) * t_full
    if rest:
        t_rest, load = round_s(rest, load)
        t += t_rest
    t += load  # the last bucket's load ends the update
    k = full_rounds + (1 if rest else 0)
    full = bucket_bytes
    return HostBroadcast(
        time_s=t,
        weight_bytes=w,
        owners=gpus,
        buckets_per_owner=k,
        broadcasts=k * gpus,
        h2d_s=full / link,
        broadcast_s=bcast(full),
        copy_s=2.0 * full / hbm,
        reload_s=2.0 * full / engine_gpus / hbm,
        barrier_s=barrier,
    )
