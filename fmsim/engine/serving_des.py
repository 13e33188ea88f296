"""Discrete-event simulation of continuous-batching serving engines (vLLM / TensorRT-LLM / SGLang-like).

Owns the engine loop (one simpy process per engine), its paged KV cache (block accounting,
admission, recompute preemption), chunked prefill, shared-prefix sample groups, the router that
spreads jobs over engines, and the KV hand-off of disaggregated prefill -> decode pools. It knows
no model: an engine prices its iterations through a cost model exposing ``iteration_time`` and
``decode_coeffs`` (:class:`fmsim.model.serving_cost.ServingCostModel`).

Speed: an engine does not step token by token. Between scheduling events (a completion, an
admissible arrival, the KV cache filling) a decode-only batch is homogeneous: every sequence
gains one token per step, so step ``j`` costs ``c0 + c1 * (C + n*j)`` and ``k`` steps cost a
closed-form sum. The engine jumps ``k`` steps in one simpy timeout (interrupted, and truncated to
the in-flight step, when an admissible job arrives) and updates its numpy state vectors once.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from ..model.serving_cost import IterationWork, kv_stream_tokens, windowed_tokens

_NAN = float("nan")

#: A request evicted this often means the engine cycles without progress (a bug, not a workload).
MAX_PREEMPTIONS_PER_JOB = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Scheduler limits and KV pool of one engine."""

    max_seqs: int
    max_batch_tokens: int
    chunked_prefill: bool
    mixed_batches: bool
    block_size: int
    total_blocks: int
    admission: str              # optimistic | reserve
    prefix_caching: bool
    #: local-attention layers whose KV the engine keeps for the window only (vLLM's hybrid KV cache
    #: manager): their share of the layers, and the tokens one of them keeps per sequence (the window
    #: plus the block being filled)
    window_share: float = 0.0
    window_keep: int = 0

    def kv_slots(self, total: Any) -> Any:
        """Token slots of the whole model a sequence of ``total`` tokens takes in the KV pool."""
        if not self.window_share:
            return total
        return windowed_tokens(total, total, self.window_share, self.window_keep)

    def blocks(self, own: Any, total: Any) -> Any:
        """Blocks a sequence holds: ``own`` tokens in its own blocks (past a shared prefix), ``total``
        in all. A local layer's share of them is capped at its window, and is not shared."""
        B = self.block_size
        if not self.window_share:
            return -(-np.asarray(own) // B)
        slots = windowed_tokens(own, total, self.window_share, self.window_keep)
        return np.ceil(slots / B - 1e-9).astype(np.int64)

    def shared_blocks(self, ctx: int) -> int:
        """Blocks of a prompt's full blocks that its samples share (full-attention layers' part)."""
        full = ctx // self.block_size
        return full if not self.window_share else math.ceil((1.0 - self.window_share) * full - 1e-9)


class Job:
    """A prompt and its samples (1 for plain requests; N sharing the prompt's prefill and KV).

    ``prompt`` counts every context token at admission (including ``cached`` tokens whose KV is
    already in the prefix cache and need no compute). Per-sample arrays hold output lengths,
    tokens generated so far (kept across a preemption) and finish times.
    """

    __slots__ = (
        "admit_seq",
        "arrival_s",
        "blocks",
        "cached",
        "engine",
        "finish_s",
        "first_token_s",
        "gen",
        "jid",
        "n",
        "on_done",
        "on_first_token",
        "out",
        "preemptions",
        "prefill_done_s",
        "prefill_left",
        "prefill_only",
        "prefill_past",
        "prompt",
        "rejected",
        "samples_left",
        "shared_blocks",
        "tag",
    )

    def __init__(self, *, jid: int, arrival_s: float, prompt: int, out: np.ndarray, cached: int = 0,
                 prefill_only: bool = False, decode_only: bool = False,
                 on_first_token: Callable[[Job, float], None] | None = None,
                 on_done: Callable[[Job, float], None] | None = None, tag: Any = None):
        self.jid = jid
        self.arrival_s = arrival_s
        self.prompt = int(prompt)
        self.cached = int(min(cached, prompt - 1)) if prompt > 1 else 0
        self.out = np.asarray(out, dtype=np.int64)
        self.n = len(self.out)
        self.gen = np.zeros(self.n, dtype=np.int64)
        self.prefill_left = 0 if decode_only else self.prompt - self.cached
        self.prefill_past = self.prompt if decode_only else self.cached
        self.first_token_s = _NAN
        self.prefill_done_s = _NAN
        self.finish_s = np.full(self.n, _NAN)
        self.samples_left = self.n
        self.shared_blocks = 0
        self.prefill_only = prefill_only
        self.on_first_token = on_first_token
        self.on_done = on_done
        self.tag = tag
        self.admit_seq = -1
        self.preemptions = 0
        self.engine: ReplicaEngine | None = None
        self.rejected = False
        self.blocks: np.ndarray | None = None    # per-sample blocks while admitted
        if decode_only:
            self.gen[:] = 1          # the prefill pool produced the first token

    @property
    def done(self) -> bool:
        return self.samples_left == 0


@dataclass(slots=True)
class EngineStats:
    """What an engine accumulates while it runs (plain sums and lists; summarised at the end)."""

    iterations: int = 0
    macro_steps: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions: int = 0
    rejected: int = 0
    kv_block_seconds: float = 0.0
    kv_peak_blocks: int = 0
    batch_seq_seconds: float = 0.0   # sum of (decoding sequences x step time)
    # inter-token gaps as arithmetic runs: (first gap, increment, count, weight = sequences)
    itl_runs: list[tuple[float, float, int, int]] = field(default_factory=list)


def _live_samples(job: Job) -> int:
    """Samples of a job still to generate (a prefill-only job counts as one)."""
    if job.prefill_only:
        return 1
    if job.n == 1:                   # the common case, without an array's worth of numpy calls
        return int(job.gen[0] < job.out[0])
    return int(np.count_nonzero(job.gen < job.out))


def busiest_rank(cost: Any, chunks: Sequence[tuple[int, int, bool]], n: int) -> dict[str, float]:
    """With data-parallel attention: the busiest rank's share of an iteration (IterationWork.rank_*).

    ``chunks``: the iteration's prefill chunks as (new tokens, tokens already in KV, finishing); ``n``: its
    decodes. New requests go to the ranks round-robin after sorting by their tokens (TensorRT-LLM's baseline
    attention-DP scheduler, tech blog 10 "ADP Balance Strategy", NVIDIA/TensorRT-LLM@011cfc2c), so rank 0
    takes the largest chunk of every round of ``ranks`` chunks; the decodes are spread evenly. Counts are
    returned as engine equivalents (the rank's own times the ranks); ``{}`` without attention DP. Used by the
    engine's iterations and by the analytical estimate's batched prefill (fmsim.workloads.inference)."""
    g = cost.dp_groups
    if g <= 1 or not chunks:
        return {}
    mine = sorted(chunks, key=lambda ch: -ch[0])[0::g]
    tok = sum(c for c, _, _ in mine)
    fin = sum(1 for _, _, f in mine if f)
    pairs = sum(cost.prefill_pairs(c, past) for c, past, _ in mine)
    reads = sum(kv_stream_tokens(c, past) for c, past, _ in mine)
    return {"rank_tokens": n + g * tok, "rank_logits": n + g * fin, "rank_prefill_pairs": g * pairs,
            "rank_prefill_kv_reads": g * reads}


class ReplicaEngine:
    """One engine: a batch stepping together on ``cost.engine_gpus`` GPUs.

    Submit jobs with :meth:`submit`; the engine admits them FCFS as its sequence limit, token
    budget and KV blocks allow, runs prefill (chunked or whole) and decode iterations, preempts
    the most recently admitted job (recompute) when the KV cache runs out under optimistic
    admission, and calls the job's callbacks at its first token and at completion.
    """

    def __init__(self, env: simpy.Environment, name: str, cost: Any, cfg: EngineConfig,
                 trace: list | None = None):
        self.env = env
        self.name = name
        self.cost = cost
        self.cfg = cfg
        self.stats = EngineStats()
        self.trace = trace
        self.waiting: deque[Job] = deque()
        self.prefilling: list[Job] = []
        self.admitted: list[Job] = []          # in admission order (preemption victims from the end)
        self._admit_counter = 0
        self.used_blocks = 0
        # decode state, one entry per running sequence
        self.seq_job: list[Job] = []
        self.seq_idx = np.zeros(0, dtype=np.int64)
        self.ctx = np.zeros(0, dtype=np.int64)
        self.rem = np.zeros(0, dtype=np.int64)
        self.own = np.zeros(0, dtype=np.int64)      # tokens in the sequence's own blocks
        self.blk = np.zeros(0, dtype=np.int64)      # blocks the sequence holds
        self._coeff_cache: dict[int, tuple[float, float]] = {}
        self._interruptible = False
        self._sleeping: simpy.Event | None = None
        self.outstanding = 0                       # jobs submitted and not finished (router load)
        self.process = env.process(self._run())

    # -- public ---------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        job.engine = self
        self.waiting.append(job)
        self.outstanding += 1
        if self._sleeping is not None and not self._sleeping.triggered:
            self._sleeping.succeed()
        elif self._interruptible and len(self.waiting) == 1 and self._could_admit(job):
            self._interruptible = False
            self.process.interrupt()

    @property
    def num_running(self) -> int:
        return len(self.seq_job)

    @property
    def free_blocks(self) -> int:
        return self.cfg.total_blocks - self.used_blocks

    # -- block arithmetic ------------------------------------------------------------------
    def _job_blocks(self, job: Job, *, full: bool = False) -> tuple[int, np.ndarray]:
        """(shared blocks, per-sample blocks) the job holds once admitted.

        Samples of a group share the prompt's full blocks when prefix caching is on (each copies
        the partial last block). Optimistic admission allocates what is in the KV now (prompt and
        tokens generated before a preemption) and grows per step; ``reserve`` (and ``full``)
        allocates every sample's whole output up front.
        """
        cfg = self.cfg
        ctx = job.prompt
        tail = self._tail(job)
        shared = cfg.shared_blocks(ctx) if tail < ctx else 0
        if job.prefill_only:
            per = np.zeros(job.n, dtype=np.int64)
            per[0] = int(cfg.blocks(tail, ctx))
            if shared == 0 and job.n > 1:
                per[:] = int(cfg.blocks(tail, ctx))
            return shared, per
        grown = np.maximum(job.out, job.gen) if (full or cfg.admission == "reserve") else job.gen
        per = cfg.blocks(tail + grown, ctx + grown)
        if not full:
            # a sample that finished before a preemption needs no KV when its job comes back
            per = np.where((job.gen >= job.out) & (job.gen > 0), 0, per)
        return shared, per

    def _tail(self, job: Job) -> int:
        """Prompt tokens in each sample's own blocks: past the shared full blocks (prefix caching with
        several samples), or the whole prompt."""
        if job.n > 1 and self.cfg.prefix_caching:
            return job.prompt % self.cfg.block_size
        return job.prompt

    def _job_block_total(self, job: Job) -> int:
        shared, per = self._job_blocks(job)
        return int(shared + per.sum())

    def _could_admit(self, job: Job, prefilling_seqs: int | None = None, step_blocks: int | None = None) -> bool:
        """``prefilling_seqs`` / ``step_blocks``: :meth:`_prefilling_seqs` and ``_new_blocks(1)`` when the caller
        keeps them (one schedule admitting thousands of jobs would otherwise recompute both per admission)."""
        live = _live_samples(job)
        pf = self._prefilling_seqs() if prefilling_seqs is None else prefilling_seqs
        if self.num_running + pf + live > self.cfg.max_seqs:
            return False
        need = self._job_block_total(job)
        if self.cfg.admission == "optimistic":
            # keep room for the next decode step of the running batch and of this job's own live
            # samples (one block each at most): without the latter a job admitted into the last
            # free blocks is preempted again at its first step, re-admitted, and so on forever
            need += (self._new_blocks(1) if step_blocks is None else step_blocks) + live
        return need <= self.free_blocks

    def _prefilling_seqs(self) -> int:
        return sum(_live_samples(j) for j in self.prefilling)

    # -- the loop --------------------------------------------------------------------------
    def _run(self):
        env = self.env
        while True:
            if not self.waiting and not self.prefilling and not self.seq_job:
                self._sleeping = env.event()
                yield self._sleeping
                self._sleeping = None
                continue
            chunks = self._schedule()
            if not chunks and not self.seq_job:
                if self.prefilling:          # pragma: no cover - budget rules always admit one chunk
                    raise AssertionError("prefilling jobs but no chunk scheduled")
                # the waiting head cannot be admitted and nothing runs: wait for a change
                self._sleeping = env.event()
                yield self._sleeping
                self._sleeping = None
                continue
            if chunks:
                yield from self._mixed_iteration(chunks)
            else:
                yield from self._decode_macro_step()

    def _schedule(self) -> list[tuple[Job, int]]:
        """Pick this iteration's prefill chunks (continuing prefills first, then FCFS admissions)."""
        cfg = self.cfg
        decode_n = len(self.seq_job)
        budget = cfg.max_batch_tokens - (decode_n if cfg.mixed_batches else 0)
        chunks: list[tuple[Job, int]] = []
        for job in self.prefilling:
            if budget <= 0:
                break
            c = self._chunk(job, budget, first=not chunks)
            if c == 0:
                break
            chunks.append((job, c))
            budget -= c
        pf_seqs = self._prefilling_seqs()
        step_blocks = self._new_blocks(1) if cfg.admission == "optimistic" else 0
        while self.waiting and budget > 0:
            job = self.waiting[0]
            shared, per = self._job_blocks(job, full=True)
            if shared + int(per.sum()) > cfg.total_blocks:
                self.waiting.popleft()      # can never fit, even alone
                self._reject(job)
                continue
            if not self._could_admit(job, pf_seqs, step_blocks):
                break
            if job.prefill_left == 0:
                # decode-only job (KV arrived from a prefill pool): joins the batch directly
                self.waiting.popleft()
                self._admit(job)
                self._start_decoding(job, self.env.now, first_token=False)
                if cfg.admission == "optimistic":
                    step_blocks = self._new_blocks(1)       # the running batch grew
                continue
            c = self._chunk(job, budget, first=not chunks)
            if c == 0:
                break
            self.waiting.popleft()
            self._admit(job)
            self.prefilling.append(job)
            pf_seqs += _live_samples(job)
            chunks.append((job, c))
            budget -= c
        return chunks

    def _chunk(self, job: Job, budget: int, *, first: bool) -> int:
        if self.cfg.chunked_prefill:
            return min(job.prefill_left, budget)
        if job.prefill_left <= budget:
            return job.prefill_left
        # a whole prompt larger than the budget runs alone (engines refuse it; we let it pass
        # when nothing else is scheduled so that no request is lost)
        if first and (not self.cfg.mixed_batches or not self.seq_job):
            return job.prefill_left
        return 0

    def _admit(self, job: Job) -> None:
        shared, per = self._job_blocks(job)
        job.shared_blocks = shared
        self.used_blocks += int(shared + per.sum())
        job.admit_seq = self._admit_counter
        self._admit_counter += 1
        self.admitted.append(job)
        job.blocks = per

    def _reject(self, job: Job) -> None:
        job.rejected = True
        self.stats.rejected += 1
        self.outstanding -= 1
        if job.on_done is not None:
            job.on_done(job, self.env.now)

    # -- iterations ------------------------------------------------------------------------
    def _mixed_iteration(self, chunks: list[tuple[Job, int]]):
        env, cost = self.env, self.cost
        with_decode = bool(self.seq_job) and self.cfg.mixed_batches
        if with_decode and self.cfg.admission == "optimistic":
            while self.seq_job and self._new_blocks(1) > self.free_blocks:
                if not self._preempt_one():
                    break
            with_decode = bool(self.seq_job)
            chunks = [(j, c) for j, c in chunks if j in self.prefilling]
            if not chunks and not with_decode:
                return
        n = len(self.seq_job) if with_decode else 0
        tokens = n
        logits = n
        pairs = reads = 0.0
        for job, c in chunks:
            tokens += c
            finishing = c == job.prefill_left
            logits += 1 if finishing else 0
            pairs += cost.prefill_pairs(c, job.prefill_past)
            reads += kv_stream_tokens(c, job.prefill_past)
        dec_ctx = cost.effective_context(self.ctx) if n else 0.0
        work = IterationWork(tokens=tokens, logits=logits, decode_seqs=n, decode_ctx=dec_ctx,
                             prefill_pairs=pairs, prefill_kv_reads=reads, **self._busiest_rank(chunks, n))
        dt = cost.iteration_time(work)
        start = env.now
        self._interruptible = False
        yield env.timeout(dt)
        self._account(dt, n, start, "mixed" if n else "prefill", tokens)
        self.stats.prefill_tokens += tokens - n
        now = env.now
        if n:
            self.stats.itl_runs.append((dt, 0.0, 1, n))
            self._advance(1, now)
        for job, c in chunks:
            job.prefill_left -= c
            job.prefill_past += c
            if job.prefill_left == 0:
                self.prefilling.remove(job)
                self._prefill_finished(job, now)

    def _busiest_rank(self, chunks: list[tuple[Job, int]], n: int) -> dict[str, float]:
        return busiest_rank(self.cost, [(c, j.prefill_past, c == j.prefill_left) for j, c in chunks], n)

    def _decode_macro_step(self):
        env = self.env
        n = len(self.seq_job)
        kmax = int(self.rem.min())
        if self.cfg.admission == "optimistic":
            free = self.free_blocks
            if self._new_blocks(kmax) > free:
                lo, hi = 0, kmax          # largest k with new_blocks(k) <= free
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if self._new_blocks(mid) <= free:
                        lo = mid
                    else:
                        hi = mid - 1
                kmax = lo
                if kmax == 0:
                    if not self._preempt_one():   # pragma: no cover - admission rejects what cannot fit
                        raise AssertionError("KV cache full with a single job that was admitted")
                    return
        c0, c1 = self._coeffs(n)
        # local-attention layers stop growing once a sequence passes the window; the run is costed
        # at the growth of its first step (sequences crossing the window mid-run: at most `window`
        # keys of those layers each, an overestimate)
        C = self.cost.effective_context(self.ctx)
        first = c0 + c1 * C
        inc = c1 * self.cost.context_growth(self.ctx)

        def elapsed(k: int) -> float:
            return k * first + inc * k * (k - 1) / 2.0

        total = elapsed(kmax)
        start = env.now
        admissible = bool(self.waiting) and self._could_admit(self.waiting[0])
        if admissible:
            k = 1
            total = first
            self._interruptible = False
            yield env.timeout(total)
        else:
            self._interruptible = True
            k = kmax
            try:
                yield env.timeout(total)
            except simpy.Interrupt:
                t = env.now - start
                # steps fully done by t, then the in-flight one completes
                if inc > 0:
                    a, b = inc / 2.0, first - inc / 2.0
                    j = int((-b + math.sqrt(b * b + 4 * a * t)) / (2 * a)) if a > 0 else int(t / first)
                else:
                    j = int(t / first)
                j = max(0, min(j, kmax - 1))
                while j < kmax - 1 and elapsed(j + 1) <= t:
                    j += 1
                while j > 0 and elapsed(j) > t:
                    j -= 1
                k = j + 1
                rest = elapsed(k) - t
                self._interruptible = False
                if rest > 0:
                    yield env.timeout(rest)
            self._interruptible = False
        dt = elapsed(k)
        self._account(dt, n, start, "decode", n * k, steps=k)
        self.stats.itl_runs.append((first, inc, k, n))
        self._advance(k, env.now)

    def _coeffs(self, n: int) -> tuple[float, float]:
        c = self._coeff_cache.get(n)
        if c is None:
            c = self.cost.decode_coeffs(n)
            self._coeff_cache[n] = c
        return c

    def _account(self, dt: float, n: int, start: float, kind: str, tokens: int, steps: int = 1) -> None:
        st = self.stats
        st.iterations += steps
        st.macro_steps += 1
        st.busy_s += dt
        st.kv_block_seconds += self.used_blocks * dt
        st.kv_peak_blocks = max(st.kv_peak_blocks, self.used_blocks)
        st.batch_seq_seconds += n * dt
        if self.trace is not None and len(self.trace) < 200_000:
            self.trace.append((self.name, kind, start, dt, n, tokens, steps))

    # -- state updates ---------------------------------------------------------------------
    def _new_blocks(self, k: int) -> int:
        """Blocks the running sequences need to grow by ``k`` tokens each (optimistic admission)."""
        if k <= 0 or not len(self.own):
            return 0
        return int((self.cfg.blocks(self.own + k, self.ctx + k) - self.blk).clip(min=0).sum())

    def _advance(self, k: int, now: float) -> None:
        """Every running sequence gains ``k`` tokens; finished ones leave."""
        self.ctx += k
        self.rem -= k
        self.own += k
        self.stats.decode_tokens += k * len(self.seq_job)
        if self.cfg.admission == "optimistic":
            need = self.cfg.blocks(self.own, self.ctx)
            grow = need - self.blk
            self.used_blocks += int(grow.clip(min=0).sum())
            self.blk = np.maximum(self.blk, need)
        done = np.flatnonzero(self.rem <= 0)
        if done.size:
            self._finish_seqs(done, now)

    def _finish_seqs(self, idx: np.ndarray, now: float) -> None:
        self.used_blocks -= int(self.blk[idx].sum())
        jobs = self.seq_job
        finished_jobs = []
        for i in idx.tolist():
            job = jobs[i]
            s = int(self.seq_idx[i])
            job.finish_s[s] = now
            job.gen[s] = job.out[s]
            job.samples_left -= 1
            if job.samples_left == 0:
                finished_jobs.append(job)
        keep = np.ones(len(jobs), dtype=bool)
        keep[idx] = False
        # the survivors in order, copied a run at a time (a few leave a batch of thousands)
        kept: list[Job] = []
        prev = 0
        for i in sorted(set(idx.tolist())):
            kept.extend(jobs[prev:i])
            prev = i + 1
        kept.extend(jobs[prev:])
        self.seq_job = kept
        self.seq_idx, self.ctx, self.rem = self.seq_idx[keep], self.ctx[keep], self.rem[keep]
        self.own, self.blk = self.own[keep], self.blk[keep]
        for job in finished_jobs:
            self._job_done(job, now)

    def _job_done(self, job: Job, now: float) -> None:
        self.used_blocks -= job.shared_blocks
        job.shared_blocks = 0
        self.admitted.remove(job)
        self.outstanding -= 1
        job.blocks = None
        if job.on_done is not None:
            job.on_done(job, now)
        if self._sleeping is not None and not self._sleeping.triggered:
            self._sleeping.succeed()

    def _prefill_finished(self, job: Job, now: float) -> None:
        job.prefill_done_s = now
        if job.prefill_only:
            # disaggregated prefill pool: first token out, KV handed to the decode pool
            first = math.isnan(job.first_token_s)
            if first:
                job.first_token_s = now
            self.used_blocks -= job.shared_blocks + int(job.blocks.sum())
            job.shared_blocks = 0
            job.blocks = None
            self.admitted.remove(job)
            self.outstanding -= 1
            if first and job.on_first_token is not None:
                job.on_first_token(job, now)
            if self._sleeping is not None and not self._sleeping.triggered:
                self._sleeping.succeed()
            return
        self._start_decoding(job, now, first_token=math.isnan(job.first_token_s))

    def _start_decoding(self, job: Job, now: float, *, first_token: bool) -> None:
        """The job's samples join the decode batch (after its prefill, or on arrival of its KV)."""
        per = job.blocks
        assert per is not None
        if first_token:
            job.first_token_s = now
            job.gen = np.maximum(job.gen, 1)      # the prefill's logits give every sample its first token
            if job.on_first_token is not None:
                job.on_first_token(job, now)
        live = np.flatnonzero(job.gen < job.out)
        done = job.gen >= job.out
        # samples done now (the prefill's token was their last); those done before a preemption were
        # counted then and keep their finish time
        for s in np.flatnonzero(done & np.isnan(job.finish_s)).tolist():
            job.finish_s[s] = now
            job.samples_left -= 1
        if done.any():
            self.used_blocks -= int(per[done].sum())
            per[done] = 0
        if live.size:
            base = self._tail(job)
            self.seq_job.extend([job] * live.size)
            self.seq_idx = np.concatenate([self.seq_idx, live])
            self.ctx = np.concatenate([self.ctx, job.prompt + job.gen[live]])
            self.rem = np.concatenate([self.rem, job.out[live] - job.gen[live]])
            # the first token's KV is written by the next step: own tokens = tail + generated - 1
            own = base + job.gen[live] - 1 if first_token else base + job.gen[live]
            self.own = np.concatenate([self.own, np.maximum(own, 0)])
            self.blk = np.concatenate([self.blk, per[live]])
        if job.samples_left == 0:
            self._job_done(job, now)

    def sync_generated(self) -> None:
        """Write the running sequences' progress back to their jobs (``Job.gen``), as a preemption does,
        so that a run stopped at its horizon can count the tokens generated by requests still running."""
        for i, job in enumerate(self.seq_job):
            job.gen[self.seq_idx[i]] = self.ctx[i] - job.prompt

    def _preempt_one(self) -> bool:
        """Evict the most recently admitted job (recompute later). False if no other job can go."""
        victims = [j for j in self.admitted if not j.prefill_only]
        if len(victims) <= 1:
            return False
        job = victims[-1]
        self.stats.preemptions += 1
        job.preemptions += 1
        if job.preemptions > MAX_PREEMPTIONS_PER_JOB:
            raise RuntimeError(f"{self.name}: request {job.jid} preempted {job.preemptions} times -- the engine "
                               "makes no progress (an admission rule lets a request in that cannot take a step)")
        if job in self.prefilling:
            self.prefilling.remove(job)
        mask = np.fromiter((j is job for j in self.seq_job), dtype=bool, count=len(self.seq_job))
        if mask.any():
            idx = np.flatnonzero(mask)
            job.gen[self.seq_idx[idx]] = self.ctx[idx] - job.prompt
            self.used_blocks -= int(self.blk[idx].sum())
            keep = ~mask
            self.seq_job = [j for j, kp in zip(self.seq_job, keep.tolist()) if kp]
            self.seq_idx, self.ctx, self.rem = self.seq_idx[keep], self.ctx[keep], self.rem[keep]
            self.own, self.blk = self.own[keep], self.blk[keep]
        else:
            self.used_blocks -= int(job.blocks.sum()) if job.blocks is not None else 0
        self.used_blocks -= job.shared_blocks
        job.shared_blocks = 0
        job.blocks = None
        self.admitted.remove(job)
        # recompute: the prompt once plus every live sample's generated tokens
        live = job.gen < job.out
        job.prefill_left = job.prompt + int(job.gen[live].sum()) - job.cached
        job.prefill_past = job.cached
        self.waiting.appendleft(job)
        return True


class Router:
    """Spreads jobs over engines: ``least-loaded`` (fewest outstanding jobs, lowest index on a
    tie), ``round-robin`` or ``random`` (seeded)."""

    def __init__(self, engines: list[ReplicaEngine], policy: str, rng: np.random.Generator):
        self.engines = engines
        self.policy = policy
        self.rng = rng
        self._next = 0

    def pick(self) -> ReplicaEngine:
        if len(self.engines) == 1:
            return self.engines[0]
        if self.policy == "round-robin":
            e = self.engines[self._next % len(self.engines)]
            self._next += 1
            return e
        if self.policy == "random":
            return self.engines[int(self.rng.integers(len(self.engines)))]
        return min(self.engines, key=lambda e: e.outstanding)

    def submit(self, job: Job) -> ReplicaEngine:
        e = self.pick()
        e.submit(job)
        return e


def itl_samples(runs: list[tuple[float, float, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Expand arithmetic runs of inter-token gaps into (gap values, weights) arrays."""
    if not runs:
        return np.zeros(0), np.zeros(0)
    arr = np.asarray(runs, dtype=float)
    counts = arr[:, 2].astype(np.int64)
    total = int(counts.sum())
    run_id = np.repeat(np.arange(len(runs)), counts)
    offset = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    gaps = arr[run_id, 0] + arr[run_id, 1] * offset
    weights = arr[run_id, 3]
    return gaps, weights


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` with sample ``weights`` (lower value at ties)."""
    if values.size == 0:
        return _NAN
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cw = np.cumsum(w)
    target = q / 100.0 * cw[-1]
    i = int(np.searchsorted(cw, target, side="left"))
    return float(v[min(i, v.size - 1)])
