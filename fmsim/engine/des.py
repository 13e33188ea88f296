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
    events: dict[str, simpy.Event] = {j.key: env.event() for j in jobs}
    caps = dict(capacities or {})
    net = FlowNetwork(env, caps) if (contention and caps) else None
    res = RunResult(makespan_s=0.0)

    def execute(job: Job):
        for dep in job.after:
            ev = events.get(dep)
            if ev is None:
                raise KeyError(f"job {job.key!r} waits for unknown event {dep!r}")
            if not ev.triggered:
                yield ev
        start = env.now
        if job.duration_s > 0:
            if net is not None and job.links:
                cap = min(caps[link] for link in job.links)
                yield net.transfer(job.links, job.duration_s * cap)
            else:
                yield env.timeout(job.duration_s)
        end = env.now
        res.start_s[job.key] = start
        res.end_s[job.key] = end
        if record and job.duration_s > 0:
            res.spans.append(Span(job.stream or "async", job.label or job.key, job.category, start, end))
        events[job.key].succeed()

    def stream_proc(queue: list[Job]):
        for job in queue:
            yield from execute(job)

    def async_proc(job: Job):
        yield from execute(job)

    streams: dict[str, list[Job]] = {}
    for j in jobs:
        if j.stream is None:
            env.process(async_proc(j))
        else:
            streams.setdefault(j.stream, []).append(j)
    for name in streams:                    # insertion order: deterministic
        env.process(stream_proc(streams[name]))
    env.run()
    missing = [k for k, e in events.items() if not e.triggered]
    if missing:
        raise RuntimeError(f"deadlock: {len(missing)} jobs never ran (first: {missing[0]})")
    res.makespan_s = max(res.end_s.values(), default=0.0)
    res.num_events = len(jobs)
    return res
