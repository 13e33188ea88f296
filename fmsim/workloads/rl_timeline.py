"""The timeline of RL steps: the phases of a compiled :class:`~fmsim.workloads.rl.RLPlan` as jobs on one
stream per GPU pool on the discrete-event engine (:func:`fmsim.engine.des.run_jobs`), ``off_policy``
letting generation of step n+k run beside training of step n; the steady-state step time it settles to
and the same in closed form (the estimate; a test checks the two agree); the timeline as rows for the
explorer and as a Chrome/Perfetto trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.des import Job, RunResult, run_jobs
from ..engine.trace import span_events, write_chrome_trace

if TYPE_CHECKING:
    from .rl import RLPlan


# ----------------------------------------------------------------------------------------------
# the step timeline


def timeline_jobs(plan: RLPlan, steps: int) -> list[Job]:
    """The phases of ``steps`` RL steps as jobs: one stream per GPU pool (one for a colocated
    cluster), a rule reward on the CPUs (a reward model on the training pool). Generation of step i uses the weights of step i-1-k
    (``off_policy`` k): it waits for that sync only, so it runs beside the training of the steps between."""
    p, k = plan.phases, plan.spec.off_policy
    gen_s, train_s = ("gpus", "gpus") if plan.colocated else ("generation pool", "training pool")
    jobs: list[Job] = []
    for i in range(steps):
        sync_dep = (f"sync{i - 1 - k}",) if i - 1 - k >= 0 else ()
        if plan.colocated:
            jobs.append(
                Job(
                    f"trans{i}",
                    gen_s,
                    p["transition"],
                    sync_dep,
                    category="transition",
                    label="offload / reload state",
                )
            )
            sync_dep = (f"trans{i}",)
        jobs.append(
            Job(f"gen{i}", gen_s, p["generation"], sync_dep, category="generation", label=f"generation {i}")
        )
        jobs.append(
            Job(
                f"rew{i}",
                train_s if plan.reward_on_gpus else "reward",
                p["reward"],
                (f"gen{i}",),
                category="reward",
                label=f"reward {i}",
            )
        )
        jobs.append(
            Job(f"lp{i}", train_s, p["logprob"], (f"rew{i}",), category="logprob", label=f"log-probs {i}")
        )
        jobs.append(
            Job(f"tr{i}", train_s, p["training"], (f"lp{i}",), category="training", label=f"update {i}")
        )
        jobs.append(
            Job(
                f"sync{i}",
                train_s,
                p["weight_sync"] if plan.colocated else plan.weight_send_s,
                (f"tr{i}",),
                category="weight_sync",
                label=f"weight sync {i}",
            )
        )
        if not plan.colocated:
            # the generation engines take the new weights when they are done with the batch in flight
            # (generation of later steps was queued on their stream ahead of this, by off_policy)
            jobs.append(
                Job(
                    f"recv{i}",
                    gen_s,
                    p["weight_sync"],
                    (f"tr{i}",),
                    category="weight_sync",
                    label=f"weight sync {i}",
                )
            )
    return _order_generation_stream(jobs, k, plan.colocated)


def _order_generation_stream(jobs: list[Job], k: int, colocated: bool) -> list[Job]:
    """Stream order is creation order: put each step's weight receipt after the k generations that run
    ahead of it (gen i+k is queued before recv i)."""
    if colocated:
        return jobs
    gen = [j for j in jobs if j.key.startswith("gen")]
    recv = [j for j in jobs if j.key.startswith("recv")]
    order: list[Job] = []
    for i, g in enumerate(gen):
        order.append(g)
        if i - k >= 0:
            order.append(recv[i - k])
    order += recv[len(gen) - k :] if k else []
    rest = [j for j in jobs if not (j.key.startswith("gen") or j.key.startswith("recv"))]
    return order + rest


def _sim_steps(k: int) -> int:
    return 2 * (k + 1) + 3


def step_time_des(plan: RLPlan) -> tuple[float, RunResult]:
    """Steady-state step time: the mean spacing of the last k+1 syncs of a run long enough to settle."""
    n = _sim_steps(plan.spec.off_policy)
    run = run_jobs(timeline_jobs(plan, n), record=True)
    k1 = plan.spec.off_policy + 1
    ends = [run.end_s[f"sync{i}"] for i in range(n)]
    return (ends[-1] - ends[-1 - k1]) / k1, run


def step_time_estimate(plan: RLPlan) -> float:
    """The same timeline in closed form: serial when colocated or on-policy; with off-policy depth k
    the busier pool, or the loop generation -> update -> sync -> generation k+1 steps later."""
    p, k = plan.phases, plan.spec.off_policy
    # generation of the next step waits for the engines to hold the weights and the trainers to be done
    chain = (
        sum(p.values())
        - p["weight_sync"]
        + (p["weight_sync"] if plan.colocated else max(p["weight_sync"], plan.weight_send_s))
    )
    if plan.colocated or k == 0:
        return chain
    gen_pool = p["generation"] + p["weight_sync"]
    train_pool = p["logprob"] + p["training"] + plan.weight_send_s
    if plan.reward_on_gpus:  # a reward model scores on the training pool; a rule on the CPUs beside it
        return max(gen_pool, train_pool + p["reward"], chain / (k + 1))
    return max(gen_pool, train_pool, p["reward"], chain / (k + 1))


def timeline_rows(run: RunResult) -> list[tuple[str, float, float, str, str]]:
    """(pool, start_s, end_s, phase, label) of every simulated phase: the step timeline per pool."""
    return [
        (sp.stream, sp.start_s, sp.end_s, sp.category, sp.label)
        for sp in sorted(run.spans, key=lambda x: (x.start_s, x.stream))
    ]


def write_trace(run: RunResult, path: str, name: str, engine_trace: list | None = None) -> None:
    """Chrome/Perfetto trace: one track per GPU pool (phases of every simulated step), and the
    simulated generation engines' iterations on tracks of their own (first step's timing)."""
    tids: dict[str, int] = {}
    events = span_events(run, tids)
    for ename, kind, start, dt, n, tokens, steps in engine_trace or []:
        tid = tids.setdefault(ename, len(tids))
        events.append(
            {
                "name": kind,
                "cat": "engine",
                "ph": "X",
                "pid": 1,
                "tid": tid,
                "ts": start * 1e6,
                "dur": dt * 1e6,
                "args": {"seqs": n, "tokens": tokens, "steps": steps},
            }
        )
    for tname, tid in tids.items():
        pid = 1 if tname.startswith("generation engine") else 0
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": tname}})
    events.append(
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{name}: RL steps by pool"}}
    )
    events.append(
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "generation engines (one step)"}}
    )
    write_chrome_trace(path, events)


__all__ = ["step_time_des", "step_time_estimate", "timeline_jobs", "timeline_rows", "write_trace"]
