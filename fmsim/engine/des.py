"""Discrete-event engine: ordered jobs on streams, dependencies, transfers over a flow network.

The engine knows no model (DESIGN.md principle 4). A workload hands it :class:`Job` records:
each runs on a *stream* (a compute or communication queue that executes its jobs in the given
order, like a CUDA stream) or, with ``stream=None``, as soon as its dependencies are met (an
asynchronous transfer). A job waits for the events named in ``after``, then takes
``duration_s`` -- or, when it names network ``links`` and contention is on, moves
``duration_s × bottleneck capacity`` bytes through :class:`fmsim.engine.network.FlowNetwork`, so
that transfers overlapping in time share bandwidth max-min fairly and alone take ``duration_s``.
Completion triggers the event named ``key``. Same jobs, same result: simpy runs same-time events
in scheduling order and the jobs are created in a fixed order.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import simpy

from .network import FlowNetwork


@dataclass(frozen=True, slots=True)
class Job:
    key: str                               # event fired on completion (unique)
    stream: str | None                     # None = asynchronous (starts when ready)
    duration_s: float = 0.0
    after: tuple[str, ...] = ()
    links: tuple[Hashable, ...] = ()       # network links this job's bytes cross (transfers only)
    category: str = "compute"              # breakdown bucket / trace category
    label: str = ""
    overlap_s: float = 0.0                 # part of duration_s: compute slowed by communication beside it


@dataclass(slots=True)
class Span:
    stream: str
    label: str
    category: str
    start_s: float
    end_s: float


@dataclass(slots=True)
class RunResult:
    makespan_s: float
    start_s: dict[str, float] = field(default_factory=dict)
    end_s: dict[str, float] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    num_events: int = 0


def run_jobs(jobs: Sequence[Job], capacities: Mapping[Hashable, float] | None = None, *,
             contention: bool = True, record: bool = True) -> RunResult:
    """Simulate ``jobs`` and return when each started and ended.

    Parameters
    ----------
    capacities:
        Link capacities in bytes/s for jobs that name ``links``.
    contention:
        When false, transfers take their ``duration_s`` regardless of what else is in flight
        (the "no contention" reference the analytical estimate equals).
    record:
        Keep a :class:`Span` per job (for traces and breakdowns).
    """
    env = simpy.Environment()
    caps = dict(capacities or {})
    net = FlowNetwork(env, caps) if (contention and caps) else None
    res = RunResult(makespan_s=0.0)
    index = {j.key: i for i, j in enumerate(jobs)}
    if len(index) != len(jobs):
        raise ValueError("job keys must be unique")
    # a job starts when its `after` events and the job before it on its stream have completed;
    # completions are simpy events whose callbacks release the jobs waiting on them (no process
    # per job: the event queue alone orders the run, same-time events in scheduling order)
    pending = [0] * len(jobs)
    waiters: list[list[int]] = [[] for _ in jobs]
    last_on_stream: dict[str, int] = {}
    for i, j in enumerate(jobs):
        for dep in j.after:
            d = index.get(dep)
            if d is None:
                raise KeyError(f"job {j.key!r} waits for unknown event {dep!r}")
            waiters[d].append(i)
            pending[i] += 1
        if j.stream is not None:
            prev = last_on_stream.get(j.stream)
            if prev is not None:
                waiters[prev].append(i)
                pending[i] += 1
            last_on_stream[j.stream] = i
    done = [False] * len(jobs)
    start_s, end_s, spans = res.start_s, res.end_s, res.spans
    # a transfer's bottleneck capacity, worked out once per distinct set of links
    bottleneck: dict[tuple[Hashable, ...], float] = {}

    def finish(i: int, start: float) -> None:
        job = jobs[i]
        end = env.now
        start_s[job.key] = start
        end_s[job.key] = end
        if record and job.duration_s > 0:
            spans.append(Span(job.stream or "async", job.label or job.key, job.category, start, end))
        done[i] = True
        for w in waiters[i]:
            pending[w] -= 1
            if pending[w] == 0:
                launch(w)

    def launch(i: int) -> None:
        job = jobs[i]
        start = env.now
        if job.duration_s <= 0:
            finish(i, start)
            return
        if net is not None and job.links:
            links = job.links
            cap = bottleneck.get(links)
            if cap is None:
                cap = bottleneck[links] = min(caps[link] for link in links)
            ev = net.transfer(links, job.duration_s * cap)
        else:
            ev = env.timeout(job.duration_s)
        ev.callbacks.append(lambda _ev, i=i, start=start: finish(i, start))

    ready = [i for i in range(len(jobs)) if pending[i] == 0]
    for i in ready:                          # job order: deterministic
        launch(i)
    env.run()
    if not all(done):
        first = next(j.key for j, d in zip(jobs, done) if not d)
        raise RuntimeError(f"deadlock: {done.count(False)} jobs never ran (first: {first})")
    res.makespan_s = max(res.end_s.values(), default=0.0)
    res.num_events = len(jobs)
    return res
