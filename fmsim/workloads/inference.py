"""Serving and test-time-compute workloads: scenario -> serving plan -> DES (or estimate) -> Result.

Owns the compile step (:func:`build_plan`: engine profile and limits, KV capacity, GPU pools for
plain, disaggregated and verifier serving, price), the traffic generator (open-loop Poisson /
constant / bursty, closed-loop clients, offline), the question logic of test-time compute
(N samples sharing a prompt, best-of-N with a verifier, self-consistency voting, sequential
revision rounds, thinking budgets), the metrics (``INFERENCE_COLUMNS`` plus KV utilisation,
goodput, per-question cost and latency) and the analytical fast path.

Entry point for ``fmsim.simulate``: :func:`simulate_inference`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from ..cost import price_of
from ..engine.serving_des import EngineConfig, Job, ReplicaEngine, Router, itl_samples, weighted_percentile
from ..engine.trace import write_chrome_trace
from ..errors import ConfigError, InfeasibleError, ParallelismError
from ..model.serving_cost import (
    EngineProfile,
    IterationWork,
    ServingCostModel,
    auto_limits,
    build_cost_model,
    engine_profile,
    kv_dtype_for,
    transfer_time,
    trtllm_bench_kv_tokens,
)
from ..results import Result
from .inference_spec import MAX_REQUESTS, REDRAW_ROUNDS, InferenceSpec, parse_inference_spec
from .serving_prefill import prefill_batch_time, prompts_per_iteration

PERCENTILES = (50, 90, 99)
#: questions one run simulates at most: a serving run's figures are its steady state's, which a few
#: thousand requests reach (bench/bench_serving.py: 10,000 requests in about a second); more requests
#: than this are served by the same steady state, so the run simulates this many and says so
MAX_SIMULATED_QUESTIONS = 20_000
#: and sequences at most, over a question's samples and revision rounds: a sequence, not a question, is
#: what the engines schedule, so a best-of-8 run at 10^9 requests simulates 2,500 questions (it simulated
#: 20,000, 160,000 sequences: 8x the work of any single-sample run, over a minute on a laptop)
MAX_SIMULATED_SEQUENCES = MAX_SIMULATED_QUESTIONS
#: the steady-state window must hold at least this share of the run's output tokens (else: the whole run)
STEADY_MIN_SHARE = 0.25


# ----------------------------------------------------------------------------------------------
# the compiled plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """A group of identical engines: all serving, a disaggregated prefill or decode pool, or verifiers."""

    role: str                       # serve | prefill | decode | verifier
    cost: ServingCostModel
    cfg: EngineConfig
    engines: int                    # engines (replicas x pipeline stages)
    replicas: int
    gpus: int
    kv_capacity_tokens: int         # per engine
    activation_bytes: float         # per GPU


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingPlan:
    """Everything the serving simulation needs, derived and validated once."""

    name: str
    file: str | None
    model: Any
    instance: Any
    precision: str
    tp: int
    pp: int
    ep: int
    nodes: int
    gpus: int
    spec: InferenceSpec
    profile: EngineProfile
    pools: tuple[Pool, ...]
    seed: int = 0
    usd_per_hour: float | None = None      # whole fleet
    price_date: str = ""
    pricing_option: str = ""
    price_source: str = ""                 # fmsim.cost: the price's source, or which pricing exists
    hbm_bytes: float = 0.0

    def pool(self, role: str) -> Pool | None:
        for p in self.pools:
            if p.role == role:
                return p
        return None


def _mean_lengths(spec: InferenceSpec) -> tuple[float, float]:
    """Expected prompt and output tokens of one sample (thinking included)."""
    out = spec.traffic.output_len.expected()
    t = spec.ttc
    if t.thinking_len is not None:
        out += min(t.thinking_len.expected(), t.thinking_budget)
    return spec.traffic.prompt_len.expected(), out


def captured_graph_sizes(sizes: tuple[int, ...], max_batch: int, max_tokens: int) -> tuple[int, ...]:
    """The decode batch sizes an engine captures CUDA graphs for, from the configured list (sorted) and one
    (rank's) batch and token limits: those within ``min(max_batch, max_tokens)``, and -- padding enabled, as the
    TensorRT-LLM profile's list is -- that bound itself when the list holds a larger size, so every decode batch
    up to the limit pads into a graph (TensorRT-LLM ``_filter_cuda_graph_batch_sizes``,
    tensorrt_llm/_torch/pyexecutor/model_engine.py, NVIDIA/TensorRT-LLM@001e67005b: "padding to
    max_cuda_graph_bs is acceptable"). A larger decode batch than the bound cannot occur."""
    bound = min(max_batch, max_tokens)
    kept = [g for g in sizes if g <= bound]
    if bound >= 1 and any(g > bound for g in sizes) and (not kept or kept[-1] != bound):
        kept.append(bound)
    return tuple(kept)


def _attention_precision(sv: Any, precision: str) -> str | None:
    """``serving.attention_precision``: ``auto`` (None) is the workload's precision."""
    return None if sv.attention_precision in ("auto", precision) else sv.attention_precision


def _make_pool(role: str, *, model: Any, instance: Any, precision: str, kv_dtype: str, tp: int, pp: int,
               ep: int, attention_dp: bool, replicas: int, spec: InferenceSpec, profile: EngineProfile,
               collective: Any, file: str | None, isl: float, osl: float, max_isl: float,
               attention_precision: str | None = None, moe_imbalance: float = 1.0) -> Pool:
    sv = spec.serving
    tbo = sv.two_batch_overlap and role != "verifier"
    if tbo and (model.moe is None or not attention_dp or ep <= 1):
        raise ConfigError("true needs an MoE model with its experts spread over attention-DP ranks (parallelism.ep "
                          "> 1): two-batch overlap hides DeepEP's dispatch/combine", file=file,
                          field="serving.two_batch_overlap")
    try:
        cost = build_cost_model(model, instance, precision=precision, kv_dtype=kv_dtype, tp=tp, pp=pp, ep=ep,
                                attention_dp=attention_dp, overhead_s=profile.iteration_overhead_s,
                                collective=collective, graph_batch_sizes=profile.graph_batch_sizes,
                                cpu_overhead_fraction=profile.cpu_overhead_fraction,
                                moe_comm=profile.moe_comm, attention_precision=attention_precision,
                                moe_impl=profile.moe_impl, deepep=sv.deepep if attention_dp else "none",
                                two_batch_overlap=tbo,
                                tbo_decode_context=isl + osl / 2.0, moe_imbalance=moe_imbalance)
    except ParallelismError as exc:     # the cost model knows no file: place it at the pool's own layout
        where = {"verifier": "test_time_compute.verifier.tp", "prefill": "serving.disaggregation.prefill_tp",
                 "decode": "serving.disaggregation.decode_tp"}.get(role)
        if exc.file or where is None:   # the serving pool's layout: its callers know where it came from
            raise
        raise ParallelismError(f"the {role} engines: {exc.message}", file=file, field=where) from None
    chunked = sv.chunked_prefill if sv.chunked_prefill is not None else profile.chunked_prefill
    frac = sv.memory_fraction if sv.memory_fraction is not None else profile.memory_fraction
    hbm = instance.accelerator.hbm_bytes
    # an engine whose limits hold per attention-DP rank (TensorRT-LLM) runs `ranks` such batches at once
    ranks = cost.dp_groups if profile.limits_per_rank else 1
    default_seqs, default_tokens = profile.limits_on(instance.accelerator)
    max_seqs = sv.max_seqs if sv.max_seqs is not None else default_seqs
    max_tokens = sv.max_batch_tokens if sv.max_batch_tokens is not None else default_tokens
    # a first KV estimate with a provisional workspace sizes any ``auto`` limit, then the real one
    logits = profile.sizing_counts_logits
    prov = cost.activation_bytes(max_tokens or 8192, max_seqs or 256, model, logits=logits)
    cap = cost.kv_capacity_tokens(hbm_bytes=hbm, memory_fraction=frac, fraction_of=profile.memory_fraction_of,
                                  activation_bytes=prov) // pp
    if max_seqs is None or max_tokens is None:
        if profile.auto_limits_from == "trtllm-bench":
            # its estimate over the `--tp` GPUs it is given (an attention-DP engine's GPUs of one stage), applied
            # per rank by the engine (limits_per_rank)
            est = trtllm_bench_kv_tokens(model, precision=precision, kv_dtype=kv_dtype, tp=cost.engine_gpus // pp,
                                         pp=pp, device_bytes=hbm, memory_fraction=frac,
                                         attention_precision=attention_precision)
            bs, tok = auto_limits(est, isl, osl, chunked_prefill=chunked, max_prompt_len=max_isl, pp=pp)
        else:
            bs, tok = auto_limits(cap // ranks, isl, osl, chunked_prefill=chunked, max_prompt_len=max_isl)
        max_seqs = max_seqs or bs
        max_tokens = max_tokens or tok
    max_seqs, max_tokens = max_seqs * ranks, max_tokens * ranks
    act = cost.activation_bytes(max_tokens, max_seqs, model, logits=logits)
    cap = cost.kv_capacity_tokens(hbm_bytes=hbm, memory_fraction=frac, fraction_of=profile.memory_fraction_of,
                                  activation_bytes=act) // pp
    if cost.graph_batch_sizes:
        cost = dataclasses.replace(cost, graphs_per_rank=ranks > 1, graph_batch_sizes=captured_graph_sizes(
            cost.graph_batch_sizes, max_seqs // ranks, max_tokens // ranks))
    block = sv.kv_block_size or profile.kv_block_size
    blocks = cap // block
    if blocks < 1:
        raise InfeasibleError(f"{file or ''}: the KV cache holds {cap} tokens, less than one {block}-token block")
    cfg = EngineConfig(
        max_seqs=int(max_seqs), max_batch_tokens=int(max_tokens),
        chunked_prefill=chunked,
        mixed_batches=sv.mixed_batches if sv.mixed_batches is not None else profile.mixed_batches,
        block_size=int(block), total_blocks=int(blocks),
        admission=sv.admission or profile.admission,
        prefix_caching=sv.prefix_caching if sv.prefix_caching is not None else profile.prefix_caching,
        window_share=cost.window_share if profile.window_kv else 0.0,
        window_keep=cost.window + int(block) if profile.window_kv else 0,
    )
    return Pool(role=role, cost=cost, cfg=cfg, engines=replicas * pp, replicas=replicas,
                gpus=replicas * cost.engine_gpus, kv_capacity_tokens=int(blocks * block), activation_bytes=act)


def build_plan(*, name: str, model: Any, instance: Any, precision: str, tp: int, pp: int = 1, ep: int = 1,
               nodes: int, spec: InferenceSpec, seed: int = 0, pricing: Any = None, file: str | None = None,
               collective: Any = "fabric", moe_imbalance: float = 1.0) -> ServingPlan:
    """Compile a serving scenario's pieces into a :class:`ServingPlan` (validates GPU budgets).

    ``moe_imbalance`` (``workload.moe_imbalance``): the busiest expert-parallel rank's routed rows over the mean, for
    the model's engines (not a verifier's); it needs the experts spread over attention-DP ranks."""
    sv = spec.serving
    if moe_imbalance != 1.0 and not (sv.attention_dp and model.moe is not None and ep > 1):
        raise ConfigError(f"{moe_imbalance:g} without experts spread over attention-DP ranks (expected "
                          "serving.attention_dp: true with ep > 1: under plain TP every GPU holds a slice of every "
                          "expert and carries the mean)", file=file, field="workload.moe_imbalance")
    profile = engine_profile(sv.engine)
    gpus = nodes * instance.num_accelerators
    kv_dtype = kv_dtype_for(precision, sv.kv_cache_dtype, profile)
    isl, osl = _mean_lengths(spec)
    max_isl = spec.traffic.prompt_len.upper()
    max_osl = spec.traffic.output_len.upper() + (spec.ttc.thinking_budget if spec.ttc.thinking_len else 0)
    pools: list[Pool] = []
    used = 0
    ver = spec.ttc.verifier
    if ver is not None:
        vprec = ver.precision or precision
        vpool = _make_pool("verifier", model=ver.model, instance=instance, precision=vprec,
                           kv_dtype=kv_dtype_for(vprec, sv.kv_cache_dtype, profile), tp=ver.tp, pp=1, ep=1,
                           attention_dp=False, replicas=ver.replicas, spec=spec, profile=profile,
                           collective=collective, file=file, isl=isl + osl, osl=ver.output_len,
                           max_isl=max_isl + max_osl)
        pools.append(vpool)
        used += vpool.gpus
    if sv.disaggregation is not None:
        d = sv.disaggregation
        for role, reps, dtp in (("prefill", d.prefill_replicas, d.prefill_tp or tp),
                                ("decode", d.decode_replicas, d.decode_tp or tp)):
            p = _make_pool(role, model=model, instance=instance, precision=precision, kv_dtype=kv_dtype,
                           tp=dtp, pp=pp, ep=ep, attention_dp=sv.attention_dp, replicas=reps, spec=spec,
                           profile=profile, collective=collective, file=file, isl=isl,
                           osl=1 if role == "prefill" else osl, max_isl=max_isl,
                           attention_precision=_attention_precision(sv, precision), moe_imbalance=moe_imbalance)
            pools.append(p)
            used += p.gpus
        if used > gpus:
            raise ConfigError(f"the pools need {used} GPUs (prefill, decode{', verifier' if ver else ''}) but "
                              f"the cluster has {gpus} ({nodes} x {instance.num_accelerators})",
                              file=file, field="serving.disaggregation")
    else:
        per_replica = tp * (ep if (sv.attention_dp and model.moe is not None) else 1) * pp
        replicas = sv.replicas
        if replicas is None:
            replicas = (gpus - used) // per_replica
            if replicas < 1:
                raise ConfigError(f"one replica needs {per_replica} GPUs (tp={tp}, pp={pp}"
                                  f"{f', ep={ep} with attention_dp' if per_replica != tp * pp else ''}) but "
                                  f"{gpus - used} are left of the cluster's {gpus}", file=file, field="cluster")
        elif replicas * per_replica + used > gpus:
            raise ConfigError(f"{replicas} replicas x {per_replica} GPUs{' + verifier' if used else ''} = "
                              f"{replicas * per_replica + used} exceed the cluster's {gpus} GPUs",
                              file=file, field="serving.replicas")
        pools.append(_make_pool("serve", model=model, instance=instance, precision=precision, kv_dtype=kv_dtype,
                                tp=tp, pp=pp, ep=ep, attention_dp=sv.attention_dp, replicas=replicas,
                                spec=spec, profile=profile, collective=collective, file=file, isl=isl, osl=osl,
                                max_isl=max_isl, attention_precision=_attention_precision(sv, precision),
                                moe_imbalance=moe_imbalance))
    price = price_of(instance.name, pricing)
    usd = price.usd_per_hour
    return ServingPlan(name=name, file=file, model=model, instance=instance, precision=precision, tp=tp, pp=pp,
                       ep=ep, nodes=nodes, gpus=gpus, spec=spec, profile=profile, pools=tuple(pools), seed=seed,
                       usd_per_hour=usd * nodes if usd is not None else None, price_date=price.date,
                       pricing_option=price.option, price_source=price.source,
                       hbm_bytes=instance.accelerator.hbm_bytes)


def plan_from_scenario(sc: Any, *, collective: Any = "fabric") -> ServingPlan:
    """The :class:`ServingPlan` of a loaded ``kind: inference`` scenario."""
    spec = parse_inference_spec(sc.extra, file=sc.file)
    par = sc.parallelism
    return build_plan(name=sc.name, model=sc.workload.model, instance=sc.cluster.instance,
                      precision=sc.workload.precision, tp=par.tp, pp=par.pp, ep=par.ep, nodes=sc.cluster.nodes,
                      spec=spec, seed=sc.seed, pricing=sc.pricing, file=sc.file, collective=collective,
                      moe_imbalance=sc.workload.moe_imbalance)


# ----------------------------------------------------------------------------------------------
# the simulation


class _Question:
    __slots__ = (
        "arrival_s",
        "client",
        "done_s",
        "jobs",
        "jobs_left",
        "outs",
        "prompt",
        "qid",
        "round",
        "stage",
        "verifier_jobs",
    )

    def __init__(self, qid: int, arrival_s: float, prompt: int, outs: np.ndarray, client: int = -1):
        self.qid = qid
        self.arrival_s = arrival_s
        self.round = 0
        self.prompt = prompt
        self.outs = outs                   # (rounds, samples) output tokens
        self.jobs_left = 0
        self.jobs: list[Job] = []
        self.done_s = math.nan
        self.client = client
        self.stage = "generate"
        self.verifier_jobs: list[Job] = []


class _Simulation:
    """Traffic, questions and pools wired together on one simpy environment."""

    def __init__(self, plan: ServingPlan, *, trace: bool = False):
        self.plan = plan
        self.spec = plan.spec
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(plan.seed)
        self.trace: list | None = [] if trace else None
        self.routers: dict[str, Router] = {}
        self.engines: dict[str, list[ReplicaEngine]] = {}
        for pool in plan.pools:
            engines = [ReplicaEngine(self.env, f"{pool.role}{i}", pool.cost, pool.cfg, self.trace)
                       for i in range(pool.engines)]
            self.engines[pool.role] = engines
            self.routers[pool.role] = Router(engines, plan.spec.serving.router, self.rng)
        self.questions: list[_Question] = []
        self.gen_jobs: list[Job] = []
        self.decode_jobs: dict[int, Job] = {}
        self._jid = 0
        self.issued = 0
        self._draw_lengths()

    # -- traffic ------------------------------------------------------------------------------
    def _draw_lengths(self) -> None:
        tr, ttc = self.spec.traffic, self.spec.ttc
        explicit = tr.duration_s is None or tr.num_requests < MAX_REQUESTS
        n = tr.num_requests if explicit else self._n_for_duration()
        self.n_offered = n
        per_question = ttc.samples * ttc.revision_rounds
        if per_question > MAX_SIMULATED_SEQUENCES:
            raise ConfigError(f"{ttc.samples:,} samples x {ttc.revision_rounds:,} revision rounds = {per_question:,} "
                              f"sequences per question is more than the {MAX_SIMULATED_SEQUENCES:,} one simulation "
                              "runs (expected fewer samples or rounds, or --estimate)", file=self.plan.file,
                              field="test_time_compute.samples")
        cap = min(MAX_SIMULATED_QUESTIONS, MAX_SIMULATED_SEQUENCES // per_question)
        n = min(n, cap)
        self.request_cap = cap if self.n_offered > cap else None
        self.n_questions = n
        self.prompts, self.outs = self._questions(n)
        if tr.max_total_len:
            # a benchmark's dataset filter drops requests whose prompt + output is too long; draw
            # those questions again (vLLM / SGLang bench_serving ShareGPT: prompt + output <= 2048)
            bad = np.flatnonzero(self.prompts + self.outs.max(axis=(1, 2)) > tr.max_total_len)
            for _ in range(REDRAW_ROUNDS):
                if not bad.size:
                    break
                p, o = self._questions(bad.size)
                self.prompts[bad], self.outs[bad] = p, o
                bad = bad[self.prompts[bad] + self.outs[bad].max(axis=(1, 2)) > tr.max_total_len]
            if bad.size:
                raise ConfigError(f"almost no drawn request fits max_total_len {tr.max_total_len}",
                                  file=self.plan.file, field="traffic.max_total_len")
        self.arrivals = self._arrival_times(n)

    def _questions(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Prompt lengths (n,) and output lengths (n, rounds, samples) of ``n`` questions."""
        tr, ttc, rng = self.spec.traffic, self.spec.ttc, self.rng
        shape = (n, ttc.revision_rounds, ttc.samples)
        fields = ("traffic.prompt_len", "traffic.output_len", "test_time_compute.thinking.length")
        dists = (tr.prompt_len, tr.output_len, ttc.thinking_len)
        drawn = []
        for where, dist, size in zip(fields, dists, (n, math.prod(shape), math.prod(shape)), strict=True):
            if dist is None:
                continue
            try:
                drawn.append(dist.sample(rng, size))
            except ConfigError as exc:
                raise ConfigError(exc.message, file=self.plan.file, field=where) from None
        prompts, outs = drawn[0], drawn[1].reshape(shape)
        if len(drawn) > 2:
            outs = outs + np.minimum(drawn[2].reshape(shape), ttc.thinking_budget)
        return prompts, outs

    def _n_for_duration(self) -> int:
        tr = self.spec.traffic
        if tr.arrival in ("closed-loop", "offline") or not math.isfinite(tr.rate_per_s):
            raise ConfigError("traffic.duration needs an open-loop arrival with a rate (or give requests:)",
                              file=self.plan.file, field="traffic.duration")
        return math.ceil(tr.rate_per_s * tr.duration_s * 1.5) + 10

    def _arrival_times(self, n: int) -> np.ndarray:
        tr = self.spec.traffic
        rng = self.rng
        if tr.arrival in ("offline", "closed-loop"):
            return np.zeros(n)
        mean = 1.0 / tr.rate_per_s
        if tr.arrival == "poisson":
            gaps = rng.exponential(mean, n)
        elif tr.arrival == "constant":
            gaps = np.full(n, mean)
        else:
            # gamma inter-arrivals with coefficient of variation cv: shape 1/cv^2, same mean
            shape = 1.0 / tr.burstiness ** 2
            gaps = rng.gamma(shape, mean / shape, n)
        t = np.cumsum(gaps) - gaps[0]
        if tr.duration_s is not None:
            t = t[t < tr.duration_s]
        return t

    def _arrivals_process(self):
        env = self.env
        times = self.arrivals
        tr = self.spec.traffic
        if tr.arrival == "offline":
            for q in range(len(self.prompts)):
                self._new_question(q, 0.0)
            return
            yield  # pragma: no cover - makes this a generator
        if tr.arrival == "closed-loop":
            for c in range(min(tr.concurrency, len(self.prompts))):
                self._new_question(self.issued, env.now, client=c)
            return
        for q, t in enumerate(times.tolist()):
            if t > env.now:
                yield env.timeout(t - env.now)
            self._new_question(q, env.now)

    def _new_question(self, q: int, now: float, client: int = -1) -> None:
        qu = _Question(q, now, int(self.prompts[q]), self.outs[q], client)
        self.questions.append(qu)
        self.issued += 1
        cached = self.spec.traffic.cached_prefix_len if self._prefix_caching() else 0
        self._start_round(qu, now, qu.prompt, min(cached, qu.prompt - 1))

    def _prefix_caching(self) -> bool:
        pool = self.plan.pool("serve") or self.plan.pool("prefill")
        return bool(pool and pool.cfg.prefix_caching)

    # -- jobs -----------------------------------------------------------------------------------
    def _next_jid(self) -> int:
        self._jid += 1
        return self._jid

    def _start_round(self, qu: _Question, now: float, prompt: int, cached: int) -> None:
        outs = qu.outs[qu.round]
        groups = [outs] if (len(outs) > 1 and self._prefix_caching()) else [outs[i:i + 1] for i in range(len(outs))]
        qu.jobs_left = len(groups)
        qu.stage = "generate"
        disagg = "prefill" in self.routers
        for g in groups:
            if disagg:
                job = Job(jid=self._next_jid(), arrival_s=now, prompt=prompt, out=g, cached=cached,
                          prefill_only=True, on_first_token=self._handoff, tag=qu)
            else:
                job = Job(jid=self._next_jid(), arrival_s=now, prompt=prompt, out=g, cached=cached,
                          on_done=self._gen_done, tag=qu)
            qu.jobs.append(job)
            self.gen_jobs.append(job)
            self.routers["prefill" if disagg else "serve"].submit(job)

    def _handoff(self, job: Job, now: float) -> None:
        """Disaggregated: move the prompt's KV to a decode engine, then decode there."""
        cost = self.plan.pool("prefill").cost
        dec = self.plan.pool("decode")
        # what the decode engine keeps is what moves: local layers' window only, where it keeps that
        size = float(dec.cfg.kv_slots(job.prompt)) * cost.kv_bytes_per_token_total
        same_node = self.plan.nodes == 1
        delay = transfer_time(size, self.plan.instance, same_node=same_node,
                              streams=min(cost.engine_gpus, dec.cost.engine_gpus), collective=cost.collective)
        djob = Job(jid=self._next_jid(), arrival_s=job.arrival_s, prompt=job.prompt, out=job.out,
                   decode_only=True, on_done=self._gen_done, tag=job.tag)
        djob.first_token_s = job.first_token_s
        self.decode_jobs[job.jid] = djob
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _ev, j=djob: self.routers["decode"].submit(j))

    def _gen_done(self, job: Job, now: float) -> None:
        qu: _Question = job.tag
        qu.jobs_left -= 1
        if qu.jobs_left > 0:
            return
        ttc = self.spec.ttc
        if qu.round + 1 < ttc.revision_rounds:
            # next revision round: the previous context is in the prefix cache (when enabled)
            prev_ctx = qu.prompt + int(qu.outs[qu.round].max())
            qu.round += 1
            qu.prompt = prev_ctx
            cached = prev_ctx - 1 if self._prefix_caching() else 0
            self._start_round(qu, now, prev_ctx, cached)
            return
        if ttc.verifier is not None and qu.stage == "generate":
            qu.stage = "verify"
            outs = qu.outs[qu.round]
            qu.jobs_left = len(outs)
            for o in outs.tolist():
                vj = Job(jid=self._next_jid(), arrival_s=now, prompt=qu.prompt + int(o),
                         out=np.array([ttc.verifier.output_len]), on_done=self._gen_done, tag=qu)
                qu.verifier_jobs.append(vj)
                self.routers["verifier"].submit(vj)
            return
        qu.done_s = now
        tr = self.spec.traffic
        if qu.client >= 0 and self.issued < len(self.prompts):
            nxt = self.issued
            self.issued += 1
            if tr.think_time_s > 0:
                ev = self.env.timeout(tr.think_time_s)
                ev.callbacks.append(lambda _ev, q=nxt, c=qu.client: self._closed_loop_next(q, c))
            else:
                self._closed_loop_next(nxt, qu.client)

    def _closed_loop_next(self, q: int, client: int) -> None:
        self.issued -= 1
        self._new_question(q, self.env.now, client=client)

    # -- run ------------------------------------------------------------------------------------
    def run(self) -> None:
        self.env.process(self._arrivals_process())
        horizon = self.spec.traffic.horizon_s
        if horizon is not None:
            self.env.run(until=horizon)
            for engines in self.engines.values():
                for e in engines:
                    e.sync_generated()
        else:
            self.env.run()


# ----------------------------------------------------------------------------------------------
# metrics


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else math.nan


def _collect(sim: _Simulation, wall_events: int = 0) -> dict[str, Any]:
    plan, spec = sim.plan, sim.spec
    qs = sim.questions
    def _rejected(j: Job) -> bool:
        d = sim.decode_jobs.get(j.jid)
        return j.rejected or (d is not None and d.rejected)

    rejected_q = [q for q in qs if any(_rejected(j) for j in q.jobs + q.verifier_jobs)]
    rejected_ids = {q.qid for q in rejected_q}
    done_q = [q for q in qs if not math.isnan(q.done_s) and q.qid not in rejected_ids]
    jobs = sim.gen_jobs
    disagg = "prefill" in sim.routers
    # per-sample records of generation jobs (decode side for disaggregated serving)
    ttft, tpot, e2e, outs = [], [], [], []
    first_s: list[float] = []            # per finished sample: its first token's time, its finish, arrival
    finish_s: list[float] = []
    arrival_s: list[float] = []
    total_prompt = 0
    # the samples of every job with a first token, gathered once: the per-sample figures are worked out
    # over all of them together, element by element as per job (same values, same order)
    fins: list[np.ndarray] = []
    gen_outs: list[np.ndarray] = []
    firsts: list[float] = []
    arrivals: list[float] = []
    for j in jobs:
        src = sim.decode_jobs.get(j.jid, j) if disagg else j
        if math.isnan(j.first_token_s):
            continue
        ttft.append(j.first_token_s - j.arrival_s)
        total_prompt += j.prompt - j.cached
        fins.append(src.finish_s)
        gen_outs.append(src.out)
        firsts.append(j.first_token_s)
        arrivals.append(j.arrival_s)
    if fins:
        sizes = [len(f) for f in fins]
        fin_all = np.concatenate(fins)
        m = ~np.isnan(fin_all)
        fin = fin_all[m]
        o = np.concatenate(gen_outs)[m]
        first = np.repeat(np.array(firsts, dtype=float), sizes)[m]
        arrival = np.repeat(np.array(arrivals, dtype=float), sizes)[m]
        e2e = (fin - arrival).tolist()
        outs = o.tolist()
        first_s, arrival_s, finish_s = first.tolist(), arrival.tolist(), fin.tolist()
        multi = o > 1
        tpot = ((fin[multi] - first[multi]) / np.maximum(o[multi] - 1, 1)).tolist()
    ttft_a, tpot_a, e2e_a = np.array(ttft), np.array(tpot), np.array(e2e)
    out_tokens = float(np.sum(outs)) if outs else 0.0
    t0 = min((q.arrival_s for q in qs), default=0.0)
    t1 = max((q.done_s for q in done_q), default=t0)
    unfinished = len(qs) - len(done_q) - len(rejected_q)
    horizon = spec.traffic.horizon_s
    if horizon is not None and unfinished:
        # stopped at the horizon with requests in flight: the rates are over the window, and the tokens
        # those requests generated in it count (a run that drains before its horizon keeps the span of
        # its finished requests)
        t1 = horizon
        out_tokens = float(sum(int(np.sum((sim.decode_jobs.get(j.jid, j) if disagg else j).gen)) for j in jobs))
    duration = max(t1 - t0, 1e-12)
    # the rates are the steady state's: the run's tokens over the time they take at the rate of the
    # window between the ramp-up and the drain (the whole run when there is no such window)
    span, window = duration, None
    if outs and not (horizon is not None and unfinished):
        open_loop = spec.traffic.arrival not in ("offline", "closed-loop")
        span, window = _steady_span(np.array(first_s), np.array(finish_s), np.array(arrival_s),
                                    np.array(outs, dtype=float), out_tokens, duration, t0=t0,
                                    open_loop=open_loop)
    qlat = np.array([q.done_s - q.arrival_s for q in done_q])
    n_done = len(done_q)
    gpus_used = sum(p.gpus for p in plan.pools)

    # inter-token latency from the engines' step records
    gaps, weights = [], []
    for role in ("serve", "decode"):
        for e in sim.engines.get(role, []):
            g, w = itl_samples(e.stats.itl_runs)
            gaps.append(g)
            weights.append(w)
    gaps_a = np.concatenate(gaps) if gaps else np.zeros(0)
    w_a = np.concatenate(weights) if weights else np.zeros(0)

    m: dict[str, Any] = {}
    m["output_tokens_per_s"] = out_tokens / span
    m["output_tokens_per_s_per_gpu"] = m["output_tokens_per_s"] / gpus_used
    m["requests_per_s"] = n_done / span
    for q in PERCENTILES:
        m[f"ttft_p{q}_s"] = _pct(ttft_a, q)
        m[f"tpot_p{q}_s"] = _pct(tpot_a, q)
        m[f"e2e_p{q}_s"] = _pct(e2e_a, q)
        m[f"itl_p{q}_s"] = weighted_percentile(gaps_a, w_a, q)
        m[f"question_latency_p{q}_s"] = _pct(qlat, q)
    # the latency distributions as 201 quantiles each (0, 0.5, ..., 100 %): enough to draw a CDF
    qs_grid = np.linspace(0.0, 100.0, 201)
    m["_latency_quantiles"] = {name: (np.percentile(a, qs_grid).tolist() if a.size else [])
                               for name, a in (("ttft", ttft_a), ("tpot", tpot_a), ("e2e", e2e_a))}
    m["ttft_mean_s"] = float(ttft_a.mean()) if ttft_a.size else math.nan
    m["tpot_mean_s"] = float(tpot_a.mean()) if tpot_a.size else math.nan
    m["e2e_mean_s"] = float(e2e_a.mean()) if e2e_a.size else math.nan
    m["total_tokens_per_s"] = (out_tokens + total_prompt) / span
    m["total_tokens_per_s_per_gpu"] = m["total_tokens_per_s"] / gpus_used
    m["samples_per_s"] = len(outs) / span
    m["questions_per_s"] = n_done / span
    m["mean_output_tokens"] = out_tokens / len(outs) if outs else math.nan
    # KV cache and batches
    kv_util, kv_peak, busy, batch = [], [], [], []
    preempt = rejected = iters = 0
    for pool in plan.pools:
        for e in sim.engines[pool.role]:
            st = e.stats
            kv_util.append(st.kv_block_seconds / (pool.cfg.total_blocks * duration))
            kv_peak.append(st.kv_peak_blocks / pool.cfg.total_blocks)
            busy.append(st.busy_s / duration)
            if pool.role in ("serve", "decode") and st.busy_s > 0:
                batch.append(st.batch_seq_seconds / st.busy_s)
            preempt += st.preemptions
            rejected += st.rejected
            iters += st.iterations
    m["kv_utilization_mean"] = float(np.mean(kv_util)) if kv_util else math.nan
    m["kv_utilization_peak"] = float(np.max(kv_peak)) if kv_peak else math.nan
    m["gpu_busy_fraction"] = float(np.mean(busy)) if busy else math.nan
    m["decode_batch_mean"] = float(np.mean(batch)) if batch else math.nan
    m["preemptions"] = preempt
    m["rejected_requests"] = len(rejected_q)
    m["unfinished_requests"] = unfinished
    m["not_issued_requests"] = max(0, sim.n_questions - len(qs)) if spec.traffic.arrival != "closed-loop" else 0
    m["engine_iterations"] = iters
    m["replicas"] = sum(p.replicas for p in plan.pools if p.role in ("serve", "decode"))
    m["gpus_used"] = gpus_used
    m["tp"], m["pp"], m["ep"] = plan.tp, plan.pp, plan.ep
    # SLOs and goodput
    slo = spec.slo
    lim_ttft, lim_tpot = slo.per_request_limit("ttft"), slo.per_request_limit("tpot")
    lim_e2e, lim_q = slo.per_request_limit("e2e"), slo.per_request_limit("question_latency")
    good = 0
    for q in done_q:
        ok = q.done_s - q.arrival_s <= lim_q
        for j in q.jobs:
            if not ok:
                break
            src = sim.decode_jobs.get(j.jid, j) if disagg else j
            if j.first_token_s - j.arrival_s > lim_ttft:
                ok = False
                break
            o = src.out
            fin = src.finish_s
            if np.any(fin - j.arrival_s > lim_e2e):
                ok = False
                break
            multi = o > 1
            if multi.any() and np.any((fin[multi] - j.first_token_s) / (o[multi] - 1) > lim_tpot):
                ok = False
        good += ok
    m["goodput_requests_per_s"] = good / span
    m["goodput_fraction"] = good / n_done if n_done else math.nan
    met = True
    for (metric, stat), limit in slo.limits_s.items():
        key = f"{metric}_{stat}_s" if stat != "mean" else f"{metric}_mean_s"
        val = m.get(key)
        if val is None:
            arr = {"ttft": ttft_a, "tpot": tpot_a, "e2e": e2e_a, "question_latency": qlat}.get(metric)
            if metric == "itl":
                val = weighted_percentile(gaps_a, w_a, float(stat[1:])) if stat != "mean" else \
                    float(np.average(gaps_a, weights=w_a)) if gaps_a.size else math.nan
            elif arr is not None:
                val = float(arr.mean()) if stat == "mean" else _pct(arr, float(stat[1:]))
        if val is None or not (val <= limit):
            met = False
    m["slo_met"] = met if slo.limits_s else None
    if m["unfinished_requests"] or rejected:
        m["slo_met"] = False if slo.limits_s else None
    # cost
    usd_s = plan.usd_per_hour / 3600.0 if plan.usd_per_hour else None
    m["usd_per_million_output_tokens"] = usd_s * span / out_tokens * 1e6 if usd_s and out_tokens else None
    m["usd_per_query"] = usd_s * span / n_done if usd_s and n_done else None
    m["usd_per_question"] = m["usd_per_query"]
    m["sim_duration_s"] = duration
    m["steady_state_window_s"] = (window[1] - window[0]) if window else None
    # the whole run's rates, ramp-up and drain included: what a benchmark of exactly the offered requests
    # reports (trtllm-bench, bench_serving: all output tokens over first start to last finish). A capped run
    # stands for k times its requests: the ramp-up and drain once, the rest at the steady state's rate
    capped = sim.request_cap is not None and not (horizon is not None and unfinished)
    k = sim.n_offered / sim.n_questions if capped else 1.0
    run_s = duration + (k - 1.0) * span
    m["run_output_tokens_per_s"] = k * out_tokens / run_s
    m["run_requests_per_s"] = k * n_done / run_s
    m["requests_simulated"] = len(qs)
    m["requests_offered"] = sim.n_offered
    m["_request_cap"] = sim.request_cap
    return m


def _steady_span(first: np.ndarray, finish: np.ndarray, arrival: np.ndarray, out: np.ndarray, total: float,
                 whole: float, *, t0: float, open_loop: bool) -> tuple[float, tuple[float, float] | None]:
    """(seconds the run's ``total`` output tokens take at the steady state's rate, the window).

    The window closes when the last request starts generating: after that only the drain is left, the
    batch emptying. It opens when the engines hold their steady cohort: at once for offline and
    closed-loop traffic (the whole concurrency is there from the start), and for open-loop traffic
    once its slow requests have had time to build up (the 99th percentile of arrival-to-finish
    after the first arrival). Each sample's tokens count in the window pro rata of its decode time.
    Without such a window, or when it holds under :data:`STEADY_MIN_SHARE` of the tokens (a run too
    short to settle, a single wave), the whole run's span."""
    t_a = t0 + float(np.percentile(finish - arrival, 99)) if open_loop else t0
    t_b = float(first.max())
    if not t_b > t_a:
        return whole, None

    def generated(t: float) -> np.ndarray:
        frac = np.clip((t - first) / np.maximum(finish - first, 1e-300), 0.0, 1.0)
        return np.where(t >= first, 1.0 + (out - 1.0) * frac, 0.0)

    tokens = float((generated(t_b) - generated(t_a)).sum())
    if tokens < STEADY_MIN_SHARE * total or tokens <= 0:
        return whole, None
    return total * (t_b - t_a) / tokens, (t_a, t_b)


def _decode_step_parts(plan: ServingPlan, m: Mapping[str, Any]) -> dict[str, float]:
    """A decode step at the mean simulated batch and context, split into its parts (seconds)."""
    pool = plan.pool("serve") or plan.pool("decode")
    if pool is None:
        return {}
    b = m.get("decode_batch_mean")
    n = max(1, round(b)) if b is not None and math.isfinite(b) else 1
    isl, osl = _mean_lengths(plan.spec)
    ctx = pool.cost.effective_context(isl + osl / 2)
    w = IterationWork(tokens=n, logits=n, decode_seqs=n, decode_ctx=n * ctx)
    out = dict(pool.cost.breakdown(w))
    out["step_s"] = pool.cost.iteration_time(w)
    return out


def _breakdown(plan: ServingPlan, m: Mapping[str, Any]) -> dict[str, float]:
    """Latency of the median request: queueing + prefill = TTFT p50, then decoding to e2e p50."""
    isl, _ = _mean_lengths(plan.spec)
    pf_pool = plan.pool("prefill") or plan.pool("serve")
    prefill = pf_pool.cost.prefill_time(int(isl), plan.spec.traffic.cached_prefix_len) if pf_pool else 0.0
    ttft, e2e = m.get("ttft_p50_s"), m.get("e2e_p50_s")
    if ttft is None or e2e is None or not (math.isfinite(ttft) and math.isfinite(e2e)):
        return {}
    prefill = min(prefill, ttft)
    return {"queue_s": ttft - prefill, "prefill_s": prefill, "decode_s": max(0.0, e2e - ttft)}


def _memory(plan: ServingPlan) -> dict[str, float]:
    pool = plan.pool("serve") or plan.pool("decode")
    assert pool is not None
    c = pool.cost
    # an engine's tokens are split over its attention groups; each GPU holds its stage's layers
    kv = pool.kv_capacity_tokens * c.pp / c.kv_tokens_split * c.kv_bytes_per_token_per_gpu
    return {"weights": c.weight_bytes_per_gpu, "kv_cache": float(kv), "activations": pool.activation_bytes,
            "hbm": plan.hbm_bytes}


def _details(plan: ServingPlan) -> dict[str, Any]:
    pools = []
    for p in plan.pools:
        pools.append({"role": p.role, "replicas": p.replicas, "engines": p.engines, "gpus": p.gpus,
                      "tp": p.cost.tp, "pp": p.cost.pp, "attention_dp": p.cost.attention_dp,
                      "kv_capacity_tokens_per_engine": p.kv_capacity_tokens, "max_seqs": p.cfg.max_seqs,
                      "max_batch_tokens": p.cfg.max_batch_tokens, "kv_block_size": p.cfg.block_size,
                      "chunked_prefill": p.cfg.chunked_prefill, "mixed_batches": p.cfg.mixed_batches,
                      "admission": p.cfg.admission, "prefix_caching": p.cfg.prefix_caching,
                      "kv_dtype": p.cost.kv_dtype, "precision": p.cost.precision})
    return {"engine": plan.profile.name, "engine_source": plan.profile.source, "pools": pools,
            "pricing_option": plan.pricing_option, "price_source": plan.price_source}


def _bottleneck(plan: ServingPlan, m: Mapping[str, Any], step: Mapping[str, float]) -> str:
    if m.get("rejected_requests"):
        pool = plan.pool("serve") or plan.pool("decode")
        cap = f"{pool.kv_capacity_tokens:,} tokens" if pool else "its tokens"
        return (f"KV cache too small: {m['rejected_requests']} requests rejected, their prompt and output do "
                f"not fit one engine's KV cache ({cap}) -- raise tp/pp, lower the precision or the lengths")
    if m.get("unfinished_requests"):
        return "overloaded: requests still queued at the horizon"
    if (m.get("kv_utilization_peak") or 0) > 0.97 or m.get("preemptions"):
        return "KV cache capacity (batch limited by memory)"
    parts = {k: v for k, v in step.items() if k != "step_s"}
    if not parts:
        return ""
    top = max(parts, key=parts.get)
    return {"linear_s": "weight reads / GEMMs in decode",
            "attention_decode_s": "KV-cache reads in decode attention",
            "communication_s": "tensor/expert-parallel communication",
            "kernel_fixed_s": "kernel launch and fill latency (small batches)",
            "overhead_s": "engine CPU overhead"}.get(top, top)


def simulate_plan(plan: ServingPlan, *, estimate: bool = False, trace_path: str | None = None) -> dict[str, Any]:
    """Run (or estimate) a plan; returns ``{"metrics", "breakdown", "memory", "details"}``."""
    if estimate:
        m = estimate_metrics(plan)
        det = _details(plan)
        det["method"] = "analytical"
    else:
        sim = _Simulation(plan, trace=trace_path is not None)
        sim.run()
        m = _collect(sim)
        det = _details(plan)
        det["method"] = "discrete-event"
        det["latency_samples"] = m.pop("_latency_quantiles")   # quantiles, for CDF plots
        cap = m.pop("_request_cap")
        if cap is not None:
            det["request_cap"] = {"requests": m["requests_offered"], "simulated": m["requests_simulated"],
                                  "cap": cap, "note": "the steady state of the first requests; the rest are "
                                  "served by the same state"}
        if trace_path is not None:
            _write_trace(sim, trace_path)
    m["precision"], m["pricing_option"] = plan.precision, plan.pricing_option
    det["slo"] = _slo_verdicts(plan, m)
    bd = _breakdown(plan, m)
    det["decode_step_s"] = _decode_step_parts(plan, m)
    det["bottleneck"] = _bottleneck(plan, m, det["decode_step_s"])
    m["bottleneck"] = det["bottleneck"]
    return {"metrics": m, "breakdown": bd, "memory": _memory(plan), "details": det}


def _slo_verdicts(plan: ServingPlan, m: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each SLO limit beside the figure it bounds (None where the run does not give that figure):
    what the human report prints under ``slo_met``."""
    out = []
    for (metric, stat), limit in plan.spec.slo.limits_s.items():
        key = f"{metric}_{stat}_s" if stat != "mean" else f"{metric}_mean_s"
        value = m.get(key)
        value = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        out.append({"slo": f"{metric}_{stat}", "limit_s": limit, "value_s": value,
                    "met": None if value is None else bool(value <= limit)})
    return out


def _write_trace(sim: _Simulation, path: str) -> None:
    """Chrome / Perfetto trace: one track per engine, one slice per (macro) iteration."""
    events = []
    tids: dict[str, int] = {}
    for name, kind, start, dt, n, tokens, steps in sim.trace or []:
        tid = tids.setdefault(name, len(tids))
        events.append({"name": kind, "ph": "X", "ts": start * 1e6, "dur": dt * 1e6, "pid": 0, "tid": tid,
                       "args": {"seqs": n, "tokens": tokens, "steps": steps}})
    for name, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}})
    write_chrome_trace(path, events)


# ----------------------------------------------------------------------------------------------
# analytical estimate


def estimate_metrics(plan: ServingPlan) -> dict[str, Any]:
    """Steady state without an event queue: same cost functions, Little's law for the batch.

    Per engine, requests arrive at ``lambda`` (samples/s). A decode batch of ``B`` sequences steps
    in ``t(B)`` (at mean context) and every admitted prompt adds its prefill to the iterations,
    so ``B = lambda * (n_out * t(B) + t_prefill)`` (Little's law) is solved by fixed point,
    capped by the sequence limit and the KV cache. Offline traffic runs at that cap. Prompts are
    prefilled in batches as the engine forms them (fmsim.workloads.serving_prefill): ``t_prefill``
    is a batched iteration's time over its prompts (in a mixed batch: what they add to the decode
    iteration they ride in), and a prompt's first token waits for its iteration.
    """
    spec = plan.spec
    pool = plan.pool("serve") or plan.pool("decode")
    assert pool is not None
    cost, cfg = pool.cost, pool.cfg
    isl, osl = _mean_lengths(spec)
    n_samples = spec.ttc.samples * spec.ttc.revision_rounds
    share = n_samples > 1 and cfg.prefix_caching
    # KV slots of one sequence: the prompt (its share of it, when samples share it) and, growing,
    # half the output on average -- or all of it, reserved (local layers keep their window only)
    prompt_kv = isl / (spec.ttc.samples if share else 1)
    per_token_kv = float(cfg.kv_slots(prompt_kv + (osl / 2.0 if cfg.admission == "optimistic" else osl)))
    b_kv = pool.kv_capacity_tokens / max(1.0, per_token_kv)
    if cfg.admission == "reserve":
        # an engine that reserves each sequence's whole output admits whole sequences only: 256.8 sequences'
        # worth of KV runs 256 (rounding up would price a batch that does not fit -- and pad it to the next
        # CUDA-graph size)
        b_kv = math.floor(b_kv)
    b_max = max(1.0, min(cfg.max_seqs, b_kv))
    pf_pool = plan.pool("prefill")
    pf = pf_pool or pool
    cached = spec.traffic.cached_prefix_len
    per_prompt = spec.ttc.samples if share else 1      # samples one prompt's prefill serves
    spread = pool.engines / pf.engines                 # decoding engines feeding one prefilling engine
    ctx = cost.effective_context(isl + osl / 2.0)
    batch_time: dict[tuple[int, int], tuple[float, float]] = {}

    def step(b: float) -> float:
        nb = max(1, round(b))
        c0, c1 = cost.decode_coeffs(nb)
        return c0 + c1 * nb * ctx

    def prefill(entering: float, b: float) -> tuple[float, float]:
        """(seconds per sample, seconds of the iteration) of prefilling ``entering`` samples a decode step: the
        iteration's time over its prompts, less the decode step's own where the decodes ride along (mixed batches)."""
        budget = pf.cfg.max_batch_tokens - (b if pf.cfg.mixed_batches and not pf_pool else 0.0)
        n = prompts_per_iteration(entering * spread / per_prompt, int(isl), cached, budget_tokens=budget,
                                  batch=max(1.0, b * spread / per_prompt))
        d = max(1, round(b)) if pf.cfg.mixed_batches and not pf_pool else 0
        key = (n, d)
        if key not in batch_time:
            t = prefill_batch_time(pf.cost, n, int(isl), cached, decodes=d, decode_ctx=d * ctx)
            t0 = pf.cost.iteration_time(IterationWork(tokens=d, logits=d, decode_seqs=d, decode_ctx=d * ctx))
            batch_time[key] = (max(0.0, t - t0), t)
        t_add, t = batch_time[key]
        return t_add / n / per_prompt, t

    tr = spec.traffic
    if tr.arrival == "offline" or tr.arrival == "closed-loop":
        # offline: every request queued at the start, so no engine runs more sequences than it is given
        live = (tr.num_requests * spec.ttc.samples if tr.arrival == "offline" else tr.concurrency * n_samples)
        b = min(b_max, live / pool.engines)
        lam = None
    else:
        lam = tr.rate_per_s * spec.ttc.samples / pool.engines
        b = 1.0
        for _ in range(200):
            nb = lam * (osl * step(b) + (prefill(lam * step(b), b)[0] if not pf_pool else 0.0))
            if nb > b_max:
                b = b_max
                break
            if abs(nb - b) < 1e-6:
                b = nb
                break
            b = 0.5 * (b + nb)
    ts = step(b)
    # samples entering a decode step: about as many as leave it (b / osl) when saturated, lambda * t(B) when not;
    # an offline run whose requests all fit one batch admits them all at once (one wave: the budget's worth)
    one_wave = tr.arrival == "offline" and tr.num_requests * spec.ttc.samples <= b_max * pool.engines
    t_pf, t_pf_iter = prefill(b if one_wave else b / osl if lam is None else lam * ts, b)
    # per engine cycle: B sequences each need osl steps plus their prefill
    cycle = osl * ts + (b * t_pf if not pf_pool else 0.0)
    cap_rate = b / cycle                            # samples per second per engine at batch b
    rate = cap_rate if lam is None else min(lam, cap_rate)
    overloaded = lam is not None and b >= b_max and lam > cap_rate * 1.0001
    out_tps = rate * osl * pool.engines
    # prefills interleaved into the decode iterations stretch every step by 1 / (1 - prefill share)
    rho_pf = 0.0 if pf_pool else min(0.95, rate * t_pf)
    tpot = ts / (1.0 - rho_pf)
    ttft = t_pf_iter                                   # a prompt's first token waits for its batched iteration
    if lam is not None and not overloaded:
        rho = min(0.99, lam * t_pf)
        ttft += ts / 2.0 + rho * t_pf / (2 * (1 - rho))   # wait for the iteration in flight (M/D/1-like)
    elif lam is None:
        ttft += 0.5 * (b * t_pf)                         # offline: half the batch's prefills ahead
    m: dict[str, Any] = {}
    m["output_tokens_per_s"] = out_tps
    m["output_tokens_per_s_per_gpu"] = out_tps / sum(p.gpus for p in plan.pools)
    m["requests_per_s"] = rate * pool.engines / spec.ttc.samples
    e2e = ttft + (osl - 1) * tpot
    for q in PERCENTILES:
        m[f"ttft_p{q}_s"] = ttft if not overloaded else math.inf
        m[f"tpot_p{q}_s"] = tpot
        m[f"e2e_p{q}_s"] = e2e if not overloaded else math.inf
        m[f"itl_p{q}_s"] = ts
        m[f"question_latency_p{q}_s"] = e2e * spec.ttc.revision_rounds if not overloaded else math.inf
    m["decode_batch_mean"] = b
    m["kv_utilization_mean"] = min(1.0, b * per_token_kv / max(1, pool.kv_capacity_tokens))
    m["total_tokens_per_s"] = out_tps * (1 + isl / osl)
    m["questions_per_s"] = m["requests_per_s"]
    m["unfinished_requests"] = 0 if not overloaded else None
    m["preemptions"] = 0
    m["rejected_requests"] = 0
    m["replicas"] = sum(p.replicas for p in plan.pools if p.role in ("serve", "decode"))
    m["tp"], m["pp"], m["ep"] = plan.tp, plan.pp, plan.ep
    usd_s = plan.usd_per_hour / 3600.0 if plan.usd_per_hour else None
    m["usd_per_million_output_tokens"] = usd_s / out_tps * 1e6 if usd_s and out_tps else None
    m["usd_per_query"] = usd_s / m["requests_per_s"] if usd_s and m["requests_per_s"] else None
    m["usd_per_question"] = m["usd_per_query"]
    met = not overloaded
    for (metric, stat), limit in spec.slo.limits_s.items():
        key = f"{metric}_{stat}_s" if stat != "mean" else f"{metric}_p50_s"
        v = m.get(key, m.get(f"{metric}_p50_s"))
        if v is None or not v <= limit:
            met = False
    m["slo_met"] = met if spec.slo.limits_s else None
    m["goodput_requests_per_s"] = m["requests_per_s"] if met else 0.0
    # a steady state has no ramp-up or drain: the whole run's rates are the event simulation's alone
    m["run_output_tokens_per_s"] = m["run_requests_per_s"] = None
    # the engine refuses a request whose prompt and whole output (every sample's) cannot sit in its KV
    # cache; when even the shortest request the lengths allow is too long, it refuses them all
    samples = spec.ttc.samples
    p_min = spec.traffic.prompt_len.smallest()
    o_min = spec.traffic.output_len.smallest() + (min(spec.ttc.thinking_len.smallest(), spec.ttc.thinking_budget)
                                                  if spec.ttc.thinking_len is not None else 0)
    whole = (float(cfg.kv_slots(p_min + samples * o_min)) if share
             else samples * float(cfg.kv_slots(p_min + o_min)))
    if whole > pool.kv_capacity_tokens:
        for k in ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "requests_per_s", "questions_per_s",
                  "total_tokens_per_s", "goodput_requests_per_s", "decode_batch_mean"):
            m[k] = 0.0
        m["rejected_requests"], m["unfinished_requests"] = spec.traffic.num_requests, 0
        m["usd_per_million_output_tokens"] = m["usd_per_query"] = m["usd_per_question"] = None
        m["slo_met"] = False if spec.slo.limits_s else None
    return m


# ----------------------------------------------------------------------------------------------
# entry point


def result_from_outcome(plan: ServingPlan, out: Mapping[str, Any]) -> Result:
    return Result(scenario=plan.name, kind="inference", instance=plan.instance.name, nodes=plan.nodes,
                  gpus=plan.gpus, usd_per_hour=plan.usd_per_hour, price_date=plan.price_date,
                  metrics=out["metrics"], breakdown=out["breakdown"], memory=out["memory"],
                  details=out["details"])


def simulate_inference(scenario: Any, *, estimate: bool = False, trace_path: str | None = None) -> Result:
    """Simulate (or, with ``estimate``, estimate) a ``kind: inference`` scenario."""
    plan = plan_from_scenario(scenario)
    return result_from_outcome(plan, simulate_plan(plan, estimate=estimate, trace_path=trace_path))


def with_rate(plan: ServingPlan, qps: float) -> ServingPlan:
    """The same plan under Poisson traffic at ``qps`` questions per second (for capacity planning)."""
    tr = plan.spec.traffic
    arrival = tr.arrival if tr.arrival in ("poisson", "constant", "bursty") else "poisson"
    traffic = dataclasses.replace(tr, arrival=arrival, rate_per_s=float(qps), concurrency=0)
    return dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, traffic=traffic))


__all__ = [
    "Pool",
    "ServingPlan",
    "build_plan",
    "estimate_metrics",
    "plan_from_scenario",
    "result_from_outcome",
    "simulate_inference",
    "simulate_plan",
    "with_rate",
]
