"""Pre-training step: build the job graph of one optimizer step and simulate or estimate it.

Owns turning a :class:`fmsim.parallel.strategy.Plan` into engine jobs -- one representative rank
per pipeline stage (symmetric TP/DP/CP ranks folded, DESIGN.md principle 5), its compute stream in
schedule order, pipeline sends between stages, data-parallel gradient buckets on a separate
communication stream (overlapped with the last micro-batch's backward when enabled), optimizer
step and parameter all-gather -- and turning the simulated timeline into a :class:`Result`:
step time and its breakdown, throughput, MFU/HFU, memory against HBM, time and cost to train.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.des import Job, RunResult, run_jobs
from ..engine.trace import span_events, write_chrome_trace
from ..errors import OutOfMemoryError
from ..model.flops import attention_flops_per_token, lora_flops_per_token, model_flops_per_step
from ..parallel.schedules import get_schedule
from ..parallel.strategy import Plan, build_plan
from ..results import Result
from ..units import format_bytes
from .storage_run import run_figures
from .fold import FOLD_ABOVE, _extrapolate, fold_counts
from .training_estimate import _straggle_wait_s, _task_jitter_s, estimate_step


def link_capacities(plan: Plan) -> dict[tuple[str, int], float]:
    """Per-GPU scale-out capacity (rail-optimized: each GPU owns num_nics / gpus NICs) and scale-up
    (NVLink/NeuronLink) capacity per stage."""
    inst = plan.instance
    per_gpu = inst.num_nics * inst.nic_bytes_per_s / inst.num_accelerators * inst.fabric.efficiency
    up = inst.accelerator.scale_up_bytes_per_s or per_gpu
    caps = {}
    for s in range(plan.pp):
        caps[("tx", s)] = per_gpu
        caps[("rx", s)] = per_gpu
        caps[("up-tx", s)] = up
        caps[("up-rx", s)] = up
    return caps


def build_jobs(plan: Plan, *, overlap: bool = True, step_wait_s: Sequence[float] | None = None) -> list[Job]:
    """Jobs of one training step (see module docstring). ``overlap=False`` serialises the
    data-parallel communication after the backward passes (the analytical reference).
    ``step_wait_s``: each stage's wait for the slowest data-parallel replica, when it is not this
    plan's own (a folded run simulates fewer micro-batches than the step waits for)."""
    pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
    nv = pp * vpp
    sched = get_schedule(plan.schedule)
    dp_cross = plan.dp_cross_node
    jobs: list[Job] = []
    jit = plan.straggler_task_factor
    sm = plan.overlap_slowdown
    fsdp = plan.zero >= 3
    grad_overlap = overlap and plan.overlap_grad_reduce and not fsdp
    gather_overlap = overlap and plan.overlap_param_gather and plan.zero >= 1 and not fsdp
    for s in range(pp):
        comp, comm = f"stage{s}", f"dp{s}"
        # the group's traffic crosses the node's NICs, or stays on the GPU's scale-up ports; either way
        # what runs at once on the two FSDP streams (gather, reduce-scatter) shares them
        dp_links = (("tx", s), ("rx", s)) if dp_cross else (("up-tx", s), ("up-rx", s))
        gathers_per_chunk = plan.dp_gather_s[s] / vpp
        reduce_per_chunk = sum(plan.dp_buckets[s]) / vpp
        buckets = list(plan.dp_buckets[s])
        # buckets are reduced as the last micro-batch's backward of each chunk produces them;
        # chunks finish in reverse order (chunk vpp-1 first), so hand buckets out per chunk
        per_chunk = [[] for _ in range(vpp)]
        for i, b in enumerate(buckets):
            per_chunk[min(vpp - 1, i * vpp // max(1, len(buckets)))].append(b)
        if gather_overlap and gathers_per_chunk > 0:
            # the parameter all-gather runs bucket by bucket ahead of the forward that needs it: the
            # first micro-batch of a chunk waits for the chunk's first bucket only (Megatron-Core
            # overlap_param_gather)
            for c in range(vpp):
                nb = max(1, len(per_chunk[c]))
                for i in range(nb):
                    jobs.append(Job(f"gather{s}.{c}.{i}", comm, gathers_per_chunk / nb, links=dp_links,
                                    category="dp", label=f"param all-gather chunk {c} bucket {i}"))
        tasks = sched(pp, vpp, m, s)
        reduce_keys: list[str] = []
        task_keys: list[str] = []
        # without p2p overlap a stage waits for its own send before its next task (Megatron's 1F1B:
        # send_forward_recv_backward and the like wait on their requests)
        own_send: list[str] = []
        for k, t in enumerate(tasks):
            v = t.chunk * pp + s
            st = plan.stages[v]
            waits: list[str] = list(own_send)
            own_send = []
            if fsdp and gathers_per_chunk > 0:
                # ZeRO-3/FSDP: every forward and backward gathers its chunk's weights first, on their
                # own stream, prefetched one task ahead (Rajbhandari et al. 2020 §5.3; PyTorch FSDP)
                gk = f"ag{s}.{k}"
                jobs.append(Job(gk, f"ag{s}", gathers_per_chunk, (task_keys[k - 2],) if k >= 2 else (),
                                links=dp_links, category="dp", label=f"param all-gather {t.kind}{t.microbatch}"))
                waits.append(gk)
            if t.kind == "F":
                after = ([f"F{t.microbatch}.{v - 1}>"] if v > 0 else []) + waits
                # FSDP: the next task's gather runs beside this one
                slow = sm * min(st.fwd_s, gathers_per_chunk) if fsdp else 0.0
                if gather_overlap and t.microbatch == 0 and gathers_per_chunk > 0:
                    after.append(f"gather{s}.{t.chunk}.0")
                    nb = max(1, len(per_chunk[t.chunk]))
                    slow = sm * min(st.fwd_s, gathers_per_chunk * (nb - 1) / nb)
                key = f"F{t.microbatch}.{v}"
                jobs.append(Job(key, comp, st.fwd_s * jit + slow, tuple(after), category="forward",
                                label=f"F mb{t.microbatch} v{v}", overlap_s=slow))
                task_keys.append(key)
                if v < nv - 1:
                    nxt = (v + 1) % pp
                    links = (("tx", s), ("rx", nxt)) if plan.pp_cross_node else ()
                    jobs.append(Job(key + ">", None, plan.pp_send_s, (key,), links=links, category="pp",
                                    label=f"send act mb{t.microbatch} v{v}"))
                    own_send = [] if plan.overlap_pp_comm else [key + ">"]
            else:
                after = ([f"B{t.microbatch}.{v + 1}>"] if v < nv - 1 else [f"F{t.microbatch}.{v}"]) + waits
                key = f"B{t.microbatch}.{v}"
                mine = per_chunk[t.chunk] if (t.microbatch == m - 1 and grad_overlap) else []
                if mine:
                    # split the last backward so each bucket's reduce starts when its grads exist
                    part = st.bwd_s * jit / len(mine)
                    prev = tuple(after)
                    for j, b in enumerate(mine):
                        sub = f"{key}/{j}" if j < len(mine) - 1 else key
                        # the previous bucket's reduce runs beside this part, on SMs it takes
                        slow = sm * min(part, mine[j - 1]) if j > 0 else 0.0
                        jobs.append(Job(sub, comp, part + slow, prev, category="backward",
                                        label=f"B mb{t.microbatch} v{v}", overlap_s=slow))
                        rk = f"reduce{s}.{t.chunk}.{j}"
                        jobs.append(Job(rk, comm, b, (sub,), links=dp_links, category="dp",
                                        label=f"grad reduce-scatter bucket {j}"))
                        reduce_keys.append(rk)
                        prev = (sub,)
                else:
                    # FSDP: the next gather and this micro-batch's reduce-scatter run beside it
                    slow = sm * min(st.bwd_s, gathers_per_chunk + reduce_per_chunk) if fsdp else 0.0
                    jobs.append(Job(key, comp, st.bwd_s * jit + slow, tuple(after), category="backward",
                                    label=f"B mb{t.microbatch} v{v}", overlap_s=slow))
                task_keys.append(key)
                if fsdp and reduce_per_chunk > 0:
                    # each micro-batch's gradients are reduce-scattered as its backward ends
                    rk = f"rs{s}.{k}"
                    jobs.append(Job(rk, f"rs{s}", reduce_per_chunk, (key,), links=dp_links, category="dp",
                                    label=f"grad reduce-scatter mb{t.microbatch}"))
                    reduce_keys.append(rk)
                if v > 0:
                    prv = (v - 1) % pp
                    links = (("tx", s), ("rx", prv)) if plan.pp_cross_node else ()
                    jobs.append(Job(key + ">", None, plan.pp_send_s, (key,), links=links, category="pp",
                                    label=f"send grad mb{t.microbatch} v{v}"))
                    own_send = [] if plan.overlap_pp_comm else [key + ">"]
        last_key = task_keys[-1]
        wait = _straggle_wait_s(plan, s) if step_wait_s is None else step_wait_s[s]
        if wait > 0:
            jobs.append(Job(f"straggle{s}", comp, wait, (last_key,), category="straggler",
                            label="wait for the slowest data-parallel replica"))
            last_key = f"straggle{s}"
        if not grad_overlap and not fsdp:
            prev = last_key
            for j, b in enumerate(buckets):
                rk = f"reduce{s}.x.{j}"
                jobs.append(Job(rk, comm, b, (prev,), links=dp_links, category="dp",
                                label=f"grad reduce bucket {j}"))
                reduce_keys.append(rk)
                prev = rk
        jobs.append(Job(f"opt{s}", comp, plan.optimizer_s[s], (last_key, *own_send, *reduce_keys),
                        category="optimizer", label="optimizer step"))
        if plan.dp_gather_s[s] > 0 and not gather_overlap and not fsdp:
            jobs.append(Job(f"gather{s}", comm, plan.dp_gather_s[s], (f"opt{s}",), links=dp_links,
                            category="dp", label="param all-gather"))
    return jobs


def _breakdown(plan: Plan, run: RunResult, jobs: Sequence[Job] = ()) -> tuple[dict[str, float], int]:
    """Split the step, as the busiest stage sees it, into compute, exposed comm, bubble ...

    The busiest stage (most work per micro-batch) is the one whose idle time is pipeline bubble
    proper; a lighter stage also waits on the busiest one, which is imbalance, not bubble. Compute
    slowed by data-parallel communication running beside it counts as data-parallel cost, as the
    analytical estimate counts it."""
    step = run.makespan_s
    crit = max(range(plan.pp), key=lambda s: (sum(plan.virtual_stage(s, c).fwd_s + plan.virtual_stage(s, c).bwd_s
                                                  for c in range(plan.vpp)), -s))
    m = plan.num_microbatches
    comp = 0.0
    comm: dict[str, float] = {}
    recompute = 0.0
    for c in range(plan.vpp):
        st = plan.virtual_stage(crit, c)
        comp += m * (st.fwd_compute_s + st.bwd_compute_s)
        recompute += m * st.recompute_s
        for d in (st.fwd_comm, st.bwd_comm):
            for k, v in d.items():
                comm[k] = comm.get(k, 0.0) + m * v
    opt = plan.optimizer_s[crit]
    last_bwd = max(e for k, e in run.end_s.items() if k.startswith("B") and not k.endswith(">")
                   and _stage_of(plan, k) == crit)
    opt_start = run.start_s.get(f"opt{crit}", last_bwd)
    dp_exposed = max(0.0, opt_start - last_bwd) + max(0.0, run.end_s.get(f"gather{crit}", 0.0)
                                                       - run.end_s.get(f"opt{crit}", 0.0))
    first_fwd = run.start_s.get(f"F0.{crit}", 0.0) if crit == 0 else 0.0
    dp_exposed += first_fwd
    dp_exposed += sum(j.overlap_s for j in jobs if j.stream == f"stage{crit}")
    out = {"compute": comp, "recompute": recompute}
    for k in ("tp", "cp", "ep", "offload"):
        if comm.get(k):
            out[f"comm_{k}"] = comm[k]
    straggle = run.end_s.get(f"straggle{crit}", 0.0) - run.start_s.get(f"straggle{crit}", 0.0)
    task_jitter = _task_jitter_s(plan, crit)
    if straggle or task_jitter:
        out["straggler"] = straggle + task_jitter
        dp_exposed = max(0.0, dp_exposed - straggle)
    # data-parallel traffic inside the passes (DeepSpeed ZeRO-3's fetch)
    out["comm_dp"] = dp_exposed + comm.get("dp", 0.0)
    pp_exposed = _own_send_waits(run, jobs, f"stage{crit}")
    if pp_exposed:
        out["comm_pp"] = pp_exposed
    out["optimizer"] = opt
    bubble = step - sum(out.values())
    if plan.pp == 1 and bubble > 0:
        # no pipeline: the one stage can only have waited on data-parallel traffic (FSDP gathers)
        out["comm_dp"] += bubble
        bubble = 0.0
    out["bubble"] = bubble if bubble > 1e-9 * step else 0.0     # rounding residue is no bubble
    return out, crit


def _own_send_waits(run: RunResult, jobs: Sequence[Job], stream: str) -> float:
    """Time a stage spends blocked on its own pipeline sends (``overlap.pp_comm: false``): after a task,
    until its send has gone or the next task starts, whichever is first. What it waits for beyond that
    -- the next stage's gradient, the previous one's activation -- stays bubble."""
    mine = {j.key for j in jobs if j.stream == stream}
    waited = 0.0
    for j in jobs:
        if j.stream != stream:
            continue
        for dep in j.after:
            if dep.endswith(">") and dep[:-1] in mine and dep in run.end_s:
                waited += max(0.0, min(run.start_s[j.key], run.end_s[dep]) - run.end_s[dep[:-1]])
    return waited


def _stage_of(plan: Plan, key: str) -> int:
    v = int(key.split(".")[1].split("/")[0].rstrip(">"))
    return v % plan.pp


def bottleneck_sentence(breakdown: Mapping[str, float], step: float, plan: Plan, fits: bool,
                        mem_total: float) -> tuple[str, str]:
    """(short name, one sentence) of what limits the step and what would relieve it."""
    if not fits and mem_total <= plan.hbm_bytes:
        return "memory", "does not fit: the offloaded activations exceed the node's host memory"
    if not fits:
        return "memory", (f"does not fit: {format_bytes(mem_total)} needed per GPU of "
                          f"{format_bytes(plan.hbm_bytes)}; raise tp/pp, use recompute or ZeRO")
    parts = {k: v for k, v in breakdown.items() if k not in ("compute",)}
    worst = max(parts, key=parts.get) if parts else "compute"
    share = parts.get(worst, 0.0) / step if step else 0.0
    if share < 0.10:
        return "compute", "compute-bound: faster math (fp8, newer GPU) is what shortens the step"
    advice = {
        "bubble": "pipeline bubble: more micro-batches per step, interleaving (vpp) or fewer stages",
        "comm_tp": "tensor-parallel communication: smaller tp, TP comm overlap or a larger scale-up domain",
        "comm_dp": ("exposed sharded data-parallel traffic: hybrid sharding over fewer ranks (parallelism.dp_shard), "
                    "larger gradient buckets (grad_bucket), 16-bit gradients or faster EFA") if plan.zero >= 3 else
                   ("exposed data-parallel communication: overlap grad reduce, larger gradient buckets (grad_bucket), "
                    "16-bit gradients or faster EFA"),
        "comm_ep": "expert all-to-all: smaller ep, EP inside the scale-up domain, or faster scale-out",
        "comm_cp": "context-parallel exchange: smaller cp or longer attention blocks to hide it",
        "comm_pp": "pipeline sends the stages wait on: the interleaved schedule with p2p overlap, fewer stages, "
                   "or stages inside the scale-up domain",
        "comm_offload": "activation copies to host memory: offload fewer layers, or a faster host link (Grace C2C)",
        "optimizer": "optimizer step: shard it wider (ZeRO over more ranks)",
        "recompute": "activation recompute: selective instead of full, or more memory per GPU",
        "data_stall": "data loading: a faster or larger file system (cluster.storage), or a node-local copy",
    }.get(worst, worst)
    return worst, f"{share:.0%} of the step is {advice}"


@functools.lru_cache(maxsize=256)
def _full_attention_flops(model, seq_len: int) -> float:
    """:func:`attention_flops_per_token` over the whole score square, memoised (bounded) on its frozen
    inputs: a search's plans ask it of one model and sequence length thousands of times."""
    return attention_flops_per_token(model, seq_len, causal=False)


def make_result(sc, plan: Plan, step: float, breakdown: dict[str, float], *, details: dict[str, Any],
                lean: bool = False) -> Result:
    """The result of ``sc`` run with ``plan`` at ``step`` seconds. ``lean`` (the plan search): every
    metric (the CSV row) and breakdown as in full, but ``details`` holds only what the search reads --
    ``engine``, ``bottleneck`` and, for a plan that does not fit, ``memory_error`` -- not the per-stage
    memory, checkpoint, storage, offload and price-source figures it would throw away."""
    from ..cost import price_for

    # storage and failures (storage_run.py): the data-loading stall joins the step, the run's goodput
    run = run_figures(sc, plan, step, train_tokens=getattr(sc.workload, "train_tokens", None),
                      contention=details.get("engine") == "des")
    if run.stall_s:
        step, breakdown = run.step_s, {**breakdown, "data_stall": run.stall_s}
    tokens = plan.tokens_per_step
    mem = plan.memory
    worst = max(range(plan.pp), key=lambda s: mem[s].total)
    mem_total = mem[worst].total
    fits = mem_total <= plan.hbm_bytes
    # offloaded activations live in the node's host memory, shared by its accelerators
    host_need = mem[worst].host_offload * plan.instance.num_accelerators
    host_have = plan.instance.host_memory_bytes
    host_fits = not (host_need and host_have) or host_need <= host_have
    hbm_fits = fits
    fits = fits and host_fits
    # model FLOPs: every weight's matmuls and the full attention square (NeMo/Meta accounting);
    # hardware FLOPs add what recompute runs again: the whole forward (full), or the attention
    # score and value products (selective, Korthikanti et al. 2022 §5)
    w = sc.workload
    if w.lora_rank:
        # frozen base weights: their backward is the data gradient alone (flops.lora_flops_per_token)
        fwd_tok, step_tok = lora_flops_per_token(plan.model, plan.seq_len, w.lora_rank, w.lora_modules)
        forward_flops, model_flops = tokens * fwd_tok, tokens * step_tok
    else:
        model_flops = model_flops_per_step(plan.model, plan.seq_len, plan.global_batch, "nemo")
        forward_flops = model_flops / 3.0
    if plan.recompute == "full":
        hw_flops = model_flops + forward_flops * plan.recompute_share
    elif plan.recompute == "selective":
        core = "core_attn" in plan.recompute_modules
        hw_flops = model_flops + (plan.tokens_per_step * _full_attention_flops(plan.model, plan.seq_len)
                                  if core else 0.0)
        # the other recompute modules: their forward FLOPs on every rank of a replica, per micro-batch
        ranks = plan.tp * plan.cp * plan.dp
        hw_flops += sum(st.recompute_extra_flops for st in plan.stages) * plan.num_microbatches * ranks
    else:
        hw_flops = model_flops
    # MFU/HFU against the dense peak of the precision the GEMMs run in (fp8 runs: the fp8 peak)
    peak = plan.instance.accelerator.peak(plan.precision)
    tflops = model_flops / step / plan.gpus / 1e12
    price = price_for(sc)
    nodes = plan.nodes
    usd_per_step = price.usd_per_hour * nodes * step / 3600.0 if price.usd_per_hour else None
    train_tokens = getattr(sc.workload, "train_tokens", None)
    good = run.good
    # wall-clock time to train: useful steps divided by the goodput (checkpoints, failures)
    time_to_train = train_tokens / tokens * step / good.goodput if (train_tokens and good.goodput) else None
    gpu_hours = plan.gpus * time_to_train / 3600.0 if time_to_train else None
    cost = price.usd_per_hour * nodes * time_to_train / 3600.0 if (time_to_train and price.usd_per_hour) else None
    bname, sentence = bottleneck_sentence(breakdown, step, plan, fits, mem_total)
    metrics = {
        "tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "cp": plan.cp, "ep": plan.ep,
        "step_time_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_gpu": tokens / step / plan.gpus,
        "model_tflops_per_gpu": tflops, "mfu": model_flops / step / plan.gpus / peak,
        "hfu": hw_flops / step / plan.gpus / peak,
        "memory_per_gpu_bytes": mem_total, "hbm_per_gpu_bytes": plan.hbm_bytes, "fits": fits,
        "usd_per_step": usd_per_step, "time_to_train_s": time_to_train, "gpu_hours": gpu_hours,
        "cost_usd": cost, "bottleneck": bname, "pricing_option": price.option,
        "goodput": good.goodput, "checkpoint_write_s": good.checkpoint_write_s,
        "vpp": plan.vpp, "zero": plan.zero, "dp_shard": sc.parallelism.shard_width if plan.zero else None,
        "micro_batch": plan.micro_batch, "global_batch": plan.global_batch,
        "num_microbatches": plan.num_microbatches, "precision": plan.precision, "recompute": plan.recompute,
        "recompute_layers": sc.parallelism.recompute_layers or None,
        **run.metrics(sc, time_to_train, train_tokens / tokens if train_tokens else None),
    }
    det = dict(details)
    det["bottleneck"] = sentence
    if not lean:
        det.update(run.details())
    if not hbm_fits:
        # the typed error a strict caller would raise (plan.memory[s].require_fit); kept as text so
        # what-if faces can still show the step time of a plan that needs a bigger GPU
        try:
            mem[worst].require_fit(plan.hbm_bytes, where=f"pipeline stage {worst}")
        except OutOfMemoryError as exc:
            det["memory_error"] = str(exc)
    elif not host_fits:
        det["memory_error"] = (f"offloaded activations need {format_bytes(host_need)} of host memory per node "
                               f"of {format_bytes(host_have)} (expected fewer offloaded layers)")
    if host_need and not lean:
        det["activation_offload"] = {"layers": plan.offload_layers, "host_bytes_per_gpu": mem[worst].host_offload,
                                     "host_bytes_per_node": host_need, "host_memory_per_node": host_have}
    if not lean:
        det["memory_by_stage"] = [m.as_dict() for m in mem]
        det["price_source"] = price.source
    return Result(scenario=sc.name, kind=sc.workload.kind, instance=plan.instance.name, nodes=nodes,
                  gpus=plan.gpus, usd_per_hour=price.usd_per_hour * nodes if price.usd_per_hour else None,
                  price_date=price.date, metrics=metrics, breakdown=breakdown, memory=mem[worst].as_dict(),
                  details=det)


def _simulate_step(plan: Plan, *, contention: bool, overlap: bool, record: bool,
                   step_wait_s: Sequence[float] | None = None
                   ) -> tuple[RunResult, list[Job], dict[str, float], int]:
    jobs = build_jobs(plan, overlap=overlap, step_wait_s=step_wait_s)
    run = run_jobs(jobs, link_capacities(plan), contention=contention, record=record)
    breakdown, crit = _breakdown(plan, run, jobs)
    return run, jobs, breakdown, crit


def simulate_folded(plan: Plan, *, contention: bool = True, overlap: bool = True,
                    record: bool = True) -> tuple[float, dict[str, float], int, dict[str, Any], RunResult]:
    """One step's makespan and breakdown, simulating the micro-batches in full up to
    :data:`FOLD_ABOVE` and folding the steady state beyond (DESIGN.md principle 5 folds ranks that do
    the same work; this folds micro-batches that do): the warm-up, a few steady-state micro-batches
    and the drain are simulated for two counts past the warm-up, and every figure, affine in the
    micro-batch count from there on, is extrapolated to the step's. A third count checks the
    slope; where it disagrees (a steady state longer in coming), the counts double until it agrees or
    the step is simulated in full. Returns (step, breakdown, critical stage, fold details, the run
    whose timeline a trace shows)."""
    m = plan.num_microbatches
    counts = fold_counts(m, plan.pp)
    waits = [_straggle_wait_s(plan, s) for s in range(plan.pp)]
    while m > FOLD_ABOVE and sum(counts) < m:
        runs = [_simulate_step(dataclasses.replace(plan, num_microbatches=k), contention=contention,
                               overlap=overlap, record=record and k == counts[0], step_wait_s=waits)
                for k in counts]
        steps = [r[0].makespan_s for r in runs]
        if abs((steps[2] - steps[1]) - (steps[1] - steps[0])) <= 1e-9 * steps[2]:
            keys = dict.fromkeys(k for r in runs for k in r[2])
            bd = {k: _extrapolate(counts, [r[2].get(k, 0.0) for r in runs], m) for k in keys}
            if bd.get("bubble", 0.0) < 1e-9 * _extrapolate(counts, steps, m):
                bd["bubble"] = max(0.0, bd.get("bubble", 0.0))
            fold = {"microbatches": m, "simulated": list(counts), "jobs": sum(len(r[1]) for r in runs)}
            return _extrapolate(counts, steps, m), bd, runs[0][3], fold, runs[0][0]
        counts = tuple(2 * k - m % plan.pp for k in counts)  # type: ignore[assignment]
    run, jobs, breakdown, crit = _simulate_step(plan, contention=contention, overlap=overlap, record=record)
    return run.makespan_s, breakdown, crit, {"microbatches": m, "simulated": [m], "jobs": len(jobs)}, run


def simulate_pretrain(sc, *, trace_path: str | None = None, contention: bool = True,
                      overlap: bool = True) -> Result:
    """Discrete-event simulation of one step (``fmsim.simulate`` for training kinds); past
    :data:`FOLD_ABOVE` micro-batches the steady state is folded (:func:`simulate_folded`)."""
    plan = build_plan(sc)
    # the spans of a run are kept for its trace only
    step, breakdown, crit, fold, run = simulate_folded(plan, contention=contention, overlap=overlap,
                                                       record=bool(trace_path))
    if trace_path:
        write_trace(run, trace_path, plan, folded=fold)
    details = {"engine": "des", "critical_stage": crit, "num_jobs": fold["jobs"]}
    if len(fold["simulated"]) > 1:
        details["folded"] = fold
    return make_result(sc, plan, step, breakdown, details=details)


def estimate_pretrain(sc, *, lean: bool = False) -> Result:
    """Analytical estimate (``fmsim.estimate``): same cost functions, no event queue. ``lean``: the
    plan search's record (:func:`make_result`)."""
    plan = build_plan(sc)
    step, breakdown = estimate_step(plan)
    return make_result(sc, plan, step, breakdown, details={"engine": "analytical"}, lean=lean)


def write_trace(run: RunResult, path: str, plan: Plan, folded: Mapping[str, Any] | None = None) -> None:
    """Chrome/Perfetto trace (JSON array format): one thread per stream, µs timestamps. A folded step
    shows the shortest of its simulated runs, named so."""
    tids: dict[str, int] = {}
    events = span_events(run, tids)
    for name, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}})
    name = plan.name
    if folded and len(folded.get("simulated", ())) > 1:
        name += (f" (steady state folded: {folded['simulated'][0]} of {folded['microbatches']} micro-batches "
                 "shown)")
    events.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}})
    write_chrome_trace(path, events)


__all__ = [
    "FOLD_ABOVE",
    "build_jobs",
    "fold_counts",
    "simulate_folded",
    "estimate_pretrain",
    "estimate_step",
    "link_capacities",
    "simulate_pretrain",
    "write_trace",
]
