"""The analytical step time of a training plan: :func:`estimate_step`, the fast path ``fmsim.estimate`` and plan
search rank by, from the same stage costs as the discrete-event engine (:mod:`fmsim.workloads.pretrain`) and
mirroring what the engine does -- the pipeline's fill, drain and sends, the data-parallel traffic beside the
compute it overlaps, ZeRO-3/FSDP chains task by task (replayed whole where a stage waits on its traffic), the
slowest replica's wait. docs/design-notes.md, "the estimate and the simulation", gives the measured agreement.
"""
from __future__ import annotations

import functools
import math

from ..parallel.schedules import schedule_tasks
from ..parallel.strategy import Plan
from .fold import FOLD_ABOVE, _extrapolate, fold_counts

#: a ZeRO-3/FSDP pipeline whose critical stage waits on its traffic for more than this share of its
#: compute (beyond the first gather and the last reduce-scatter) is replayed whole (_fsdp_pipeline_s)
FSDP_REPLAY_ABOVE = 0.01
#: ... and has at most this many micro-batches per pipeline stage
FSDP_REPLAY_MAX_M = 4


#: the last plan :func:`_fwd_bwd` was asked about, with its answer (one entry: a plan is frozen)
_LAST_FWD_BWD: tuple = (None, (), ())


def _fwd_bwd(plan: Plan) -> tuple[list[float], list[float]]:
    """Every virtual stage's forward and backward seconds (``StageCost.fwd_s``/``bwd_s``, indexed chunk x pp +
    stage), worked out once per plan: an estimate reads them a few dozen times."""
    global _LAST_FWD_BWD
    last = _LAST_FWD_BWD
    if last[0] is plan:
        return last[1], last[2]
    fwd = [st.fwd_s for st in plan.stages]
    bwd = [st.bwd_s for st in plan.stages]
    _LAST_FWD_BWD = (plan, fwd, bwd)
    return fwd, bwd


def _straggle_wait_s(plan: Plan, s: int) -> float:
    """Stage ``s``'s wait for the slowest data-parallel replica over the step's micro-batches: the spread
    of a sum of m equal micro-batches is sqrt(m) times one's (no list of 2·vpp·m task times)."""
    fwd, bwd = _fwd_bwd(plan)
    pp = plan.pp
    one = [d for c in range(plan.vpp) for d in (fwd[c * pp + s], bwd[c * pp + s])]
    return plan.straggler_step_wait_s(one) * math.sqrt(plan.num_microbatches)


def _task_jitter_s(plan: Plan, stage: int) -> float:
    """Time a stage's tasks lose waiting for the slowest rank of their synchronising groups."""
    fwd, bwd, pp = *_fwd_bwd(plan), plan.pp
    work = sum(fwd[c * pp + stage] + bwd[c * pp + stage] for c in range(plan.vpp))
    return (plan.straggler_task_factor - 1.0) * plan.num_microbatches * work


class _SharedLink:
    """A ZeRO-3/FSDP stage's data-parallel links as the engine's flow network shares them between its two
    streams: the parameter gathers (one at a time, each issued by the caller) and the gradient
    reduce-scatters (one at a time, in arrival order), max-min fair -- half each while both run, the
    whole alone (they cross the same links). Work is in seconds at the links' full rate."""

    __slots__ = ("r", "eps", "waiting", "head", "rs_w", "rs_t", "rs_end")

    def __init__(self, r: float, eps: float):
        self.r, self.eps = r, eps
        self.waiting: list[float] = []        # reduce-scatter arrivals (backward ends), in order
        self.head = 0                          # the first not yet started
        self.rs_w = self.rs_t = self.rs_end = 0.0   # work left of the one in flight; its clock; last end

    def reduce(self, arrive: float) -> None:
        self.waiting.append(arrive)

    def gather(self, start: float, g: float) -> float:
        """A gather of ``g`` issued at ``start`` (after every reduce-scatter that arrives before it ends
        has been handed in); returns when it ends."""
        waiting, r, eps = self.waiting, self.r, self.eps
        rs_w, rs_t, head = self.rs_w, self.rs_t, self.head
        if rs_w <= 0.0 and g > eps:
            # nothing in flight: unless a reduce-scatter arrives before it would end, the gather runs
            # alone from when it may start (what the loops below give, in fewer steps)
            end = (rs_t if rs_t > start else start) + g
            if head == len(waiting) or waiting[head] >= end:
                self.rs_t = end
                return end
        # (max and min spelt as the comparisons they make: the same answers, fewer calls)
        # the reduce-scatters alone until the gather starts ...
        while rs_t < start:
            if rs_w <= 0.0:
                if head == len(waiting) or waiting[head] >= start:
                    rs_t = start
                    break
                w = waiting[head]
                rs_t, rs_w = (w if w > rs_t else rs_t), r
                head += 1
            dt = start - rs_t
            dt = dt if dt < rs_w else rs_w
            rs_w -= dt
            rs_t += dt
            if rs_w <= eps:
                rs_w, self.rs_end = 0.0, rs_t
        # ... then the gather, at half rate beside one
        left, now = g, (rs_t if rs_t > start else start)
        while left > eps:
            if rs_w > 0.0:
                dt = rs_w if rs_w < left else left
                left -= dt
                rs_w -= dt
                now += 2.0 * dt
                if rs_w <= eps:
                    rs_w, self.rs_end = 0.0, now
            elif head < len(waiting) and waiting[head] < now + left:
                w = waiting[head]
                arrive = w if w > now else now
                left -= arrive - now
                now, rs_w = arrive, r
                head += 1
            else:
                now += left
                left = 0.0
        self.rs_w, self.rs_t, self.head = rs_w, now, head
        return now

    def drain(self) -> float:
        """When the last reduce-scatter ends (the ones left run alone)."""
        rs_t, rs_end = self.rs_t + self.rs_w, self.rs_end
        if self.rs_w > 0.0:
            rs_end = rs_t
        for a in self.waiting[self.head:]:
            rs_t = rs_end = max(rs_t, a) + self.r
        return rs_end


@functools.lru_cache(maxsize=1024)
def _replay_tasks(schedule: str, pp: int, vpp: int, m: int, s: int) -> tuple:
    """Stage ``s``'s tasks as :func:`_fsdp_pipeline_s` replays them, worked out once per shape: (forward?,
    chunk, the task it waits for or -1, whether a send lies between, its own number, whether it sends on).
    Tasks are numbered micro-batch x virtual stage, forwards first, then backwards."""
    nv = pp * vpp
    out = []
    for t in schedule_tasks(schedule, pp, vpp, m, s):
        v = t.chunk * pp + s
        i = t.microbatch * nv + v
        if t.kind == "F":
            out.append((True, t.chunk, i - 1 if v > 0 else -1, True, i, v < nv - 1))
        elif v < nv - 1:
            out.append((False, t.chunk, m * nv + i + 1, True, m * nv + i, v > 0))
        else:
            out.append((False, t.chunk, i, False, m * nv + i, v > 0))
    return tuple(out)


def _fsdp_chain_s(plan: Plan, s: int, m: int | None = None, durs: tuple | None = None) -> float:
    """One stage's ZeRO-3/FSDP step as the engine runs it, task by task: each task waits for its own
    gather, issued when the task two back has finished (one task of prefetch); each backward's
    reduce-scatter follows it on a stream of its own; a task runs slower beside the traffic next to it;
    and the two streams share the group's links as the engine's flow network shares them
    (:class:`_SharedLink`), so a gather issued beside a reduce-scatter takes longer.
    Pipeline waits are left to the caller (:func:`_fsdp_pipeline_s` replays them). Past a few dozen
    micro-batches the chain's steady state is folded: it is replayed for fewer and extrapolated
    (:func:`fold_counts`), exactly. ``m``: the micro-batches replayed (the plan's by default); ``durs``:
    the stage's :func:`_fsdp_task_s`, where the caller has it."""
    if m is None:
        m = plan.num_microbatches
    vpp = plan.vpp
    g, r = plan.dp_gather_s[s] / vpp, sum(plan.dp_buckets[s]) / vpp
    # each chunk's task durations, worked out once (every task of a chunk lasts the same)
    fwd_dur, bwd_dur = durs if durs is not None else _fsdp_task_s(plan, s)
    if g + r <= min(min(fwd_dur), min(bwd_dur)):
        # every task outlasts a gather and a reduce-scatter back to back: what a task end hands the links
        # (the gather two tasks on, its own reduce-scatter) is done by the next task end, so no task but
        # the first waits (for the first gather) and the last reduce-scatter runs alone after the last
        # backward -- the replay below gives exactly this
        return g + m * sum(map(sum, (fwd_dur, bwd_dur))) + r
    counts = fold_counts(m, plan.pp)
    if m > FOLD_ABOVE and sum(counts) < m:
        chains = [_fsdp_chain_s(plan, s, k, (fwd_dur, bwd_dur)) for k in counts]
        return _extrapolate(counts, chains, m)
    link = _SharedLink(r, 1e-12 * (g + r))
    ag = comp = e1 = e2 = 0.0           # e1, e2: the last two tasks' ends (0: none yet)
    gather, waiting = link.gather, link.waiting
    for fwd, c, *_ in _replay_tasks(plan.schedule, plan.pp, vpp, m, s):
        if g > 0:
            ag = gather(e2 if e2 > ag else ag, g)          # max(ag, e2)
        comp = (ag if ag > comp else comp) + (fwd_dur if fwd else bwd_dur)[c]
        e2, e1 = e1, comp
        if not fwd and r > 0:
            waiting.append(comp)            # link.reduce(comp)
    return max(comp, link.drain())


def _fsdp_pipeline_s(plan: Plan, m: int | None = None,
                     durs: list | None = None) -> tuple[float, list[tuple[float, float, float]]]:
    """A ZeRO-3/FSDP pipeline's step as the engine runs it: every stage's chain (:func:`_fsdp_chain_s`)
    replayed together with the pipeline's own waits -- a forward waits for the previous virtual stage's
    activation, a backward for the next one's gradient, each a send later, and (without p2p overlap) a
    stage's next task for its own send -- then each stage's straggler wait and optimizer step. Where the
    stages wait on their traffic, these waits pass along the pipeline and lengthen its period beyond any
    one stage's chain. The sends take ``pp_send_s`` (their share of the links beside the gathers is not
    replayed). It replays 2·m·vpp tasks per stage: the caller keeps m to a few per stage
    (:data:`FSDP_REPLAY_MAX_M`). Returns (step, per stage (start of its first task, end of its last, start of
    its optimizer)). ``durs``: every stage's :func:`_fsdp_task_s`, where the caller has them."""
    if m is None:
        m = plan.num_microbatches
    pp = plan.pp
    vpp = plan.vpp
    nv = pp * vpp
    send = plan.pp_send_s
    own = not plan.overlap_pp_comm
    tasks = [_replay_tasks(plan.schedule, pp, vpp, m, s) for s in range(pp)]
    if durs is None:
        durs = [_fsdp_task_s(plan, s) for s in range(pp)]
    gs = [plan.dp_gather_s[s] / vpp for s in range(pp)]
    links = [_SharedLink(sum(plan.dp_buckets[s]) / vpp, 1e-12 * (gs[s] + sum(plan.dp_buckets[s]) + 1e-30))
             for s in range(pp)]
    done: list[float | None] = [None] * (2 * m * nv)    # each task's end (_replay_tasks' numbering)
    ptr = [0] * pp
    ag = [0.0] * pp
    comp = [0.0] * pp
    sent = [0.0] * pp          # when the stage's last task's send has gone (0: none to wait for)
    first = [0.0] * pp
    prev = [(0.0, 0.0)] * pp    # the ends of each stage's last two tasks (0: none yet)
    left = sum(len(t) for t in tasks)
    while left:
        moved = False
        for s in range(pp):
            ts, k = tasks[s], ptr[s]
            e1, e2 = prev[s]
            fwd_dur, bwd_dur = durs[s]
            g, link = gs[s], links[s]
            waiting = link.waiting
            lone = g > link.eps         # a gather _SharedLink.gather's first step may answer
            a_s, c_s, w_s = ag[s], comp[s], sent[s]
            n = len(ts)
            while k < n:
                fwd, c, dep_i, via_send, me, has_send = ts[k]
                if dep_i >= 0:
                    dep = done[dep_i]
                    if dep is None:
                        break
                    if via_send:
                        dep += send
                else:
                    dep = 0.0
                if g > 0:
                    start = e2 if e2 > a_s else a_s     # max(a_s, the task two back's end)
                    # _SharedLink.gather's first step inline (nothing in flight, nothing arriving before
                    # the gather ends: it runs alone), the call otherwise
                    if lone and link.rs_w <= 0.0:
                        rs_t = link.rs_t
                        a_s = (rs_t if rs_t > start else start) + g
                        if link.head == len(waiting) or waiting[link.head] >= a_s:
                            link.rs_t = a_s
                        else:
                            a_s = link.gather(start, g)
                    else:
                        a_s = link.gather(start, g)
                begin = c_s                     # max(c_s, a_s, dep, w_s)
                if a_s > begin:
                    begin = a_s
                if dep > begin:
                    begin = dep
                if w_s > begin:
                    begin = w_s
                if k == 0:
                    first[s] = begin
                if fwd:
                    c_s = begin + fwd_dur[c]
                else:
                    c_s = begin + bwd_dur[c]
                    waiting.append(c_s)         # link.reduce(c_s)
                done[me] = c_s
                w_s = c_s + send if (own and has_send) else 0.0
                e2, e1 = e1, c_s
                k += 1
            if k != ptr[s]:
                left -= k - ptr[s]
                moved = True
                ptr[s], ag[s], comp[s], sent[s], prev[s] = k, a_s, c_s, w_s, (e1, e2)
        if not moved:
            raise RuntimeError("FSDP pipeline replay: schedule deadlock")
    step = 0.0
    marks = []
    for s in range(pp):
        last = comp[s] + _straggle_wait_s(plan, s)
        opt_start = max(last, sent[s], links[s].drain())
        step = max(step, opt_start + plan.optimizer_s[s])
        marks.append((first[s], comp[s], opt_start))
    return step, marks


def _fsdp_task_s(plan: Plan, s: int) -> tuple[list[float], list[float]]:
    """ZeRO-3/FSDP: stage ``s``'s forward and backward durations per chunk as the engine runs them, slower
    beside the next task's gather (and the backward beside its own reduce-scatter too)."""
    vpp = plan.vpp
    g, r = plan.dp_gather_s[s] / vpp, sum(plan.dp_buckets[s]) / vpp
    sm, jit = plan.overlap_slowdown, plan.straggler_task_factor
    fwd_dur, bwd_dur = [], []
    fwd, bwd, pp = *_fwd_bwd(plan), plan.pp
    for c in range(vpp):
        f, b = fwd[c * pp + s], bwd[c * pp + s]
        fwd_dur.append(f * jit + (sm * min(f, g) if g > 0 else 0.0))
        bwd_dur.append(b * jit + (sm * min(b, g + r) if g > 0 or r > 0 else 0.0))
    return fwd_dur, bwd_dur


def _dp_tail_s(plan: Plan, s: int) -> tuple[float, float]:
    """Stage ``s``'s gradient reduce, not under ZeRO-3: (what is left of it when the stage's last backward
    ends, how much slower the backwards it runs beside take), as the engine runs it: the backward a
    chunk's buckets come out of (its last micro-batch's) is cut into one part per bucket, each bucket's
    reduce starts when its part ends and the stream's previous bucket is done, and each part but the first
    runs slower beside the previous bucket's reduce. A stream that is behind is not held up by the slower
    parts: the reduce ends a first part after the chunk's backward starts, plus the chunk's buckets."""
    pp, vpp = plan.pp, plan.vpp
    dp = sum(plan.dp_buckets[s])
    sm = plan.overlap_slowdown
    if not plan.overlap_grad_reduce:
        return dp, 0.0
    nb = max(1, len(plan.dp_buckets[s]) // vpp)
    r = dp / vpp
    # interleaved: chunk c's buckets are reduced from the last micro-batch's backward of chunk c on, and
    # the chunks finish in turn (vpp-1 first), a group of pp backwards apart: the stream works through
    # them behind the rest of the cool-down, and what it has left when the last backward ends is exposed
    bwd = _fwd_bwd(plan)[1]
    start = free = end = slowed = 0.0
    for c in reversed(range(vpp)):
        b_c = bwd[c * pp + s]
        slow = sm * min(b_c * (nb - 1) / nb, r * (nb - 1) / nb) if nb > 1 else 0.0
        free = max(free, start + b_c / nb) + r
        end = start + b_c + slow
        slowed += slow
        if c:
            start = end + (pp - 1) * bwd[(c - 1) * pp + s]
    return max(0.0, free - end), slowed


def _chunk_gather_wait_s(plan: Plan) -> float:
    """Interleaved, with the parameter gather overlapped: a stage gathers its chunks in turn, bucket by
    bucket, and the first forward of chunk c waits for chunk c's first bucket, behind all of the earlier
    chunks' -- the first micro-batch's way through the virtual stages, with those waits, against without
    (the first bucket of all, which it also waits for, is counted apart), as the engine runs it."""
    pp, vpp = plan.pp, plan.vpp
    if vpp == 1:
        return 0.0
    jit, send = plan.straggler_task_factor, plan.pp_send_s
    first = plan.dp_gather_s[0] / vpp / max(1, len(plan.dp_buckets[0]) // vpp)
    fwd = _fwd_bwd(plan)[0]
    free = waited = first
    for v in range(pp * vpp):
        s, c = v % pp, v // pp
        chunk = plan.dp_gather_s[s] / vpp
        waited = max(waited, c * chunk + chunk / max(1, len(plan.dp_buckets[s]) // vpp))
        step = jit * fwd[v] + send
        free += step
        waited += step
    return waited - free


def _gather_slowdown_s(plan: Plan, s: int) -> float:
    """How much slower stage ``s``'s first forwards run beside its overlapped parameter gather (all
    buckets but the first, which they wait for), as the engine slows them."""
    g, nb = plan.dp_gather_s[s], max(1, len(plan.dp_buckets[s]))
    fwd, pp = _fwd_bwd(plan)[0], plan.pp
    first_fwd = sum(fwd[c * pp + s] for c in range(plan.vpp))
    return plan.overlap_slowdown * min(first_fwd, g * (nb - 1) / nb)


def estimate_step(plan: Plan) -> tuple[float, dict[str, float]]:
    """Analytical step time from the same stage costs, no event queue.

    Pipeline: m micro-batches through the slowest stage plus the fill/drain of the others,
    divided by vpp when interleaved (Narayanan et al. 2021 §2.2: bubble (p-1)/(v·m)); pipeline
    sends as the engine's critical path has them (see below). Data-parallel: the gradient reduce that does
    not fit under the last micro-batch's backward when overlapped (interleaved: under the cool-down, the
    chunks' buckets reduced in turn), all of it otherwise; the optimizer; the parameter all-gather unless
    overlapped with the forward; with a pipeline, the other stages' slowdowns beside their own traffic,
    which lie on the first micro-batch's way down and the last one's way back. ZeRO-3/FSDP: the stage's
    tasks one by one, each behind its own gather (``_fsdp_chain_s``).
    """
    pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
    jit = plan.straggler_task_factor
    fsdp = plan.zero >= 3
    replayed = None             # the step of a replayed ZeRO-3/FSDP pipeline (_fsdp_pipeline_s)
    per_stage = []
    fwd, bwd = _fwd_bwd(plan)
    durs = [_fsdp_task_s(plan, s) for s in range(pp)] if fsdp else None
    for s in range(pp):
        if fsdp:
            # ZeRO-3/FSDP: every task runs slower beside the traffic next to it, on every stage (the fill
            # and drain included)
            per_stage.append(sum(sum(d) for d in durs[s]))
        else:
            per_stage.append(jit * sum(fwd[c * pp + s] + bwd[c * pp + s] for c in range(vpp)))
    slow = max(per_stage)
    crit = per_stage.index(slow)
    fill = (sum(per_stage) - slow) / vpp
    # point-to-point sends on the critical path. 1F1B keeps only p-1 micro-batches in flight, so a
    # stage's round trip p·(f+b) + 2(p-1)·send is paid per p micro-batches: each micro-batch adds
    # 2(p-1)/p sends, plus 2(p-2) on fill/drain (this is what the DES shows, tests/test_training.py).
    # Interleaving keeps enough chunks in flight to hide them except on fill and drain: 2(p·v-1).
    # Without p2p overlap a stage also waits for its own sends: a middle stage of 1F1B pays two per
    # micro-batch, 2m + 2p - 5 in all (m + 1 with two stages, 2(p-1) for one micro-batch), as the DES
    # shows on uniform stages; interleaved, about (2v-1)·m + 2p - 3 (the DES's count on uniform stages
    # up to pp·v = 16).
    own_sends = 0.0
    if pp == 1:
        sends = 0.0
    elif not plan.overlap_pp_comm:
        if m == 1:
            n = 2.0 * (pp - 1)
        elif vpp > 1:
            n = (2.0 * vpp - 1) * m + 2 * pp - 3
        else:
            n = m + 1.0 if pp == 2 else 2.0 * m + 2 * pp - 5
        sends = n * plan.pp_send_s
        # the critical stage's own sends, one after each task whose result goes on (forward out of every
        # virtual stage but the last, backward out of every one but the first); the rest of the sends'
        # time is waiting on its neighbours
        passes = sum((c * pp + crit > 0) + (c * pp + crit < pp * vpp - 1) for c in range(vpp))
        own_sends = min(sends, m * passes * plan.pp_send_s)
    elif vpp == 1:
        sends = (2.0 * (pp - 2) + 2.0 * m * (pp - 1) / pp) * plan.pp_send_s
    else:
        sends = 2.0 * (pp * vpp - 1) * plan.pp_send_s
    pipeline = m * slow + fill + sends
    dp = sum(plan.dp_buckets[crit])
    if plan.zero >= 3:
        # FSDP: per task one all-gather (forward and backward) and per backward one reduce-scatter,
        # on their own streams over the same links, replayed task by task (_fsdp_chain_s): what the
        # chain takes beyond the stage's compute is exposed data-parallel time
        dp_exposed = max(0.0, _fsdp_chain_s(plan, crit, None, durs[crit]) - m * per_stage[crit])
        gather = 0.0
        # the critical stage's own slowdown beside its traffic is data-parallel cost (as the DES's
        # breakdown counts it), not compute: moved from the pipeline term to the data-parallel one
        slowed = m * (per_stage[crit] - jit * sum(fwd[c * pp + crit] + bwd[c * pp + crit] for c in range(vpp)))
        pipeline -= slowed
        # beyond the first gather and the last reduce-scatter (exposed once whatever the pipeline), the
        # stage waits on its traffic: then the waits pass along the pipeline, which the stages' chains
        # alone do not show -- replay the whole pipeline (_fsdp_pipeline_s), only then and only while
        # the fill and drain weigh (a few micro-batches per stage: with many, the critical stage's
        # chain is the step within 3 %, bench/estimate_vs_des.py); it costs a replay of every stage
        once = (plan.dp_gather_s[crit] + sum(plan.dp_buckets[crit])) / vpp
        if 1 < pp and m <= FSDP_REPLAY_MAX_M * pp and dp_exposed - once > FSDP_REPLAY_ABOVE * m * per_stage[crit]:
            replayed, marks = _fsdp_pipeline_s(plan, None, durs)
            first, last, opt_start = marks[crit]
            dp_exposed = max(0.0, opt_start - last - _straggle_wait_s(plan, crit)) + (first if crit == 0 else 0.0)
        dp_exposed += slowed
    else:
        sm = plan.overlap_slowdown
        nb = max(1, len(plan.dp_buckets[crit]))
        tail, slowed = _dp_tail_s(plan, crit)
        dp_exposed = tail + slowed
        if plan.overlap_param_gather and plan.zero >= 1:
            # bucket by bucket ahead of the first forward: only the first bucket waits in the open
            g = plan.dp_gather_s[crit]
            gather = g / nb + _gather_slowdown_s(plan, crit) + _chunk_gather_wait_s(plan)
            if plan.overlap_grad_reduce:
                # the gathers and the gradient buckets take turns on one communication stream: the step
                # is at least both, back to back, whatever compute they hide behind (the engine's stream)
                dp_exposed = max(dp_exposed, g + dp - pipeline - gather)
        else:
            gather = plan.dp_gather_s[crit]
        if pp > 1:
            # every stage's first forwards and last backwards run slower beside its own gathers and
            # reduces, and those tasks lie on the first micro-batch's way down the pipeline and the
            # last one's way back: the other stages' slowdowns add to the critical stage's wait
            tails = [(tail, slowed) if s == crit else _dp_tail_s(plan, s) for s in range(pp)]
            for s in range(pp):
                if s == crit:
                    continue
                if plan.overlap_grad_reduce:
                    dp_exposed += tails[s][1]
                if plan.overlap_param_gather and plan.zero >= 1:
                    dp_exposed += _gather_slowdown_s(plan, s)
            # each stage's reduce tail, optimizer step and (not overlapped) parameter gather start when its
            # own last backward ends, which is earlier than the pipeline's by the backwards (and sends) of
            # the stages below it on the last micro-batch's way back: the step ends with the stage that
            # finishes last, not always the critical one (as in the engine)
            after = not (plan.overlap_param_gather and plan.zero >= 1)
            below, last = 0.0, -math.inf
            for s in range(pp):
                last = max(last, tails[s][0] + plan.optimizer_s[s]
                           + (plan.dp_gather_s[s] if after else 0.0) - below)
                below += jit * bwd[s] + plan.pp_send_s
            dp_exposed += last - (tail + plan.optimizer_s[crit] + (gather if after else 0.0))
    opt = plan.optimizer_s[crit]
    straggle = _straggle_wait_s(plan, crit)
    step = pipeline + dp_exposed + gather + opt + straggle if replayed is None else replayed
    cs = [plan.virtual_stage(crit, c) for c in range(vpp)]
    comp = sum(m * (st.fwd_compute_s + st.bwd_compute_s) for st in cs)
    rec = sum(m * st.recompute_s for st in cs)
    out = {"compute": comp, "recompute": rec}
    for k in ("tp", "cp", "ep", "offload"):
        v = sum(m * (st.fwd_comm.get(k, 0.0) + st.bwd_comm.get(k, 0.0)) for st in cs)
        if v:
            out[f"comm_{k}"] = v
    out["comm_dp"] = max(0.0, dp_exposed + gather) + sum(
        m * (st.fwd_comm.get("dp", 0.0) + st.bwd_comm.get("dp", 0.0)) for st in cs)
    if own_sends:
        out["comm_pp"] = own_sends
    if straggle or plan.straggler_cv:
        out["straggler"] = straggle + _task_jitter_s(plan, crit)
    out["optimizer"] = opt
    out["bubble"] = max(0.0, step - sum(out.values()))
    return step, out


__all__ = ["estimate_step"]
