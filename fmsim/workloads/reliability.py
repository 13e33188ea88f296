"""Interruptions and goodput over a whole training run: failure rates, a seeded simulated run, the
checkpoint interval that maximises goodput.

Owns the run-level figures of a training scenario's ``checkpoint:`` and ``reliability:`` sections:

* **Failure rate.** ``reliability.node_mtbf`` (v1: every node alike, ``nodes / node_mtbf``), or per
  component -- GPU, HBM, NIC, switch, host, software -- from a fleet study in
  ``hardware_catalog/failure_rates.yaml`` (``reliability.fleet``, default ``llama3-405b-h100``, Llama 3's
  Table 5), scaled by the cluster's parts (GPUs, nodes, NICs), with ``reliability.rates`` overriding
  single components (interruptions per unit per day). A fleet's ``counts`` says which interruptions its
  rates count (``all``, or ``hardware``-attributed only: the result's notes say so).
* **Checkpoint cost** from :mod:`fmsim.workloads.checkpointing` (sharded as the plan shards the state).
* **The run.** Failures arrive as a Poisson process; each one loses the work since the last completed
  checkpoint, then costs the restart (``reliability.restart``) and the restore read. The run is replayed
  ``reliability.trials`` times (default 200), trial k with ``numpy.random.default_rng([scenario seed, k])``
  -- the same file gives the same figures, and every rate and interval meets the same random gaps -- until the useful work (``train_tokens``) is done, or for
  ``reliability.run_length`` of wall-clock time: interruptions, lost work, restart and restore time, and
  goodput (useful / wall-clock time) as mean and p10 / p50 / p90.
* **The interval.** Young's ``sqrt(2 C M)`` (Young 1974, CACM 17(9)) and Daly's higher-order optimum
  (Daly 2006, FGCS 22(3)) for checkpoint downtime C and mean time between interruptions M, and the
  simulated optimum: the interval of highest mean goodput on a grid around Young's, same random numbers
  for every interval.

Without failures the goodput is the closed form ``interval / (interval + downtime)``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..catalog import load_catalog, suggest
from ..errors import ConfigError
DEFAULT_FLEET = "llama3-405b-h100"
DEFAULT_TRIALS = 200
DAY = 86400.0
#: at most this many simulated interruptions over all trials of one replay (time and memory bound); beyond
#: it the trials are cut (to 8 at least) and past 8 x this the renewal-theory closed form is used instead
MAX_EVENTS = 400_000


@dataclass(frozen=True, slots=True)
class Goodput:
    goodput: float                       # useful step time / wall-clock time, in (0, 1] (the mean of the run)
    checkpoint_bytes: float
    checkpoint_write_s: float | None     # one full write at the storage's rate (None: no storage given)
    checkpoint_stall_s: float            # training time lost per checkpoint
    failures_per_s: float
    young_interval_s: float | None       # Young's optimum checkpoint interval
    notes: tuple[str, ...]
    # the simulated run (None / empty without a reliability section or a run length)
    daly_interval_s: float | None = None
    best_interval_s: float | None = None          # simulated optimum
    interval_curve: tuple[tuple[float, float], ...] = ()   # (interval s, mean goodput)
    restore_s: float | None = None
    interruptions: float | None = None            # expected over the run
    interruptions_p10: float | None = None
    interruptions_p90: float | None = None
    goodput_p10: float | None = None
    goodput_p50: float | None = None
    goodput_p90: float | None = None
    lost_work_s: float | None = None              # mean, whole run
    restart_restore_s: float | None = None        # mean, whole run
    wall_s: float | None = None                   # mean wall-clock time of the run
    by_component: Mapping[str, float] = field(default_factory=dict)   # interruptions per second


def _fleet(name: str) -> Mapping[str, Any]:
    fleets = load_catalog().extra.get("failure_rates", {})
    if name not in fleets:
        raise ConfigError(f"unknown failure-rate fleet {name!r}{suggest(name, list(fleets))}")
    return fleets[name]


def fleet_counts(name: str) -> str:
    """Which interruptions catalog fleet ``name``'s rates count: ``all`` or ``hardware`` (catalog ``counts``)."""
    return str(_fleet(name).get("counts") or "all")


def fleet_rates(name: str) -> tuple[dict[str, tuple[str, float]], str]:
    """``{component: (unit, interruptions per unit per day)}`` and the source of catalog fleet ``name``."""
    entry = _fleet(name)
    out = {}
    for comp, spec in (entry.get("components") or {}).items():   # checked at load (catalog.offers)
        out[str(comp)] = (spec["per"], float(spec["rate"]))
    return out, str(entry.get("source", ""))


def component_rates(sc, gpus: int, nodes: int, nics_per_node: int) -> dict[str, float]:
    """Interruptions per second of each component over the scenario's cluster."""
    rel = sc.reliability
    if rel is None:
        return {}
    if rel.node_mtbf_s:
        return {"node": nodes / rel.node_mtbf_s}
    rates, _ = fleet_rates(rel.fleet or DEFAULT_FLEET)
    count = {"gpu": gpus, "node": nodes, "nic": nodes * nics_per_node}
    out = {}
    for comp, (unit, per_day) in rates.items():
        per_day = rel.rates.get(comp, per_day)
        out[comp] = per_day * count[unit] / DAY
    for comp, per_day in rel.rates.items():
        if comp not in out:
            raise ConfigError(f"reliability.rates.{comp}: the fleet has no component {comp!r} "
                              f"(expected one of {', '.join(rates)})")
    return out


def young_interval(downtime_s: float, mtbi_s: float) -> float:
    return math.sqrt(2.0 * downtime_s * mtbi_s)


def daly_interval(downtime_s: float, mtbi_s: float) -> float:
    """Daly 2006 eq. (37): the higher-order optimum, ``mtbi`` past twice the downtime."""
    c, m = downtime_s, mtbi_s
    if c >= 2.0 * m:
        return m
    r = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - c


@dataclass(frozen=True, slots=True)
class RunStats:
    goodput: np.ndarray          # per trial
    interruptions: np.ndarray
    lost_s: np.ndarray
    recover_s: np.ndarray
    wall_s: np.ndarray


def simulate_run(*, rate: float, interval: float | None, downtime: float, recover: float,
                 useful: float = math.inf, wall_limit: float = math.inf, trials: int, seed: int,
                 max_events: int = 8 * MAX_EVENTS) -> RunStats | None:
    """Replay a run ``trials`` times: Poisson interruptions at ``rate`` per second of running time; a
    checkpoint of ``downtime`` after every ``interval`` of useful work; each interruption loses the work
    and checkpoint time since the last completed checkpoint and costs ``recover`` (restart + restore).
    Stops at ``useful`` seconds of work done or ``wall_limit`` of wall-clock time, whichever first.
    None when the trials together would take more than ``max_events`` interruptions (time bound).

    Each trial draws from its own stream, ``default_rng([seed, trial])``: the same trial sees the same
    standard exponential gaps whatever the rate, interval or downtime (common random numbers), so a higher
    rate never gives a trial fewer interruptions in the same window, and two intervals are compared on the
    same failures."""
    events = 0
    cycle = (interval + downtime) if interval else math.inf
    out = np.zeros((5, trials))
    for t in range(trials):
        rng = np.random.default_rng([seed, t])
        done = wall = lost = rec = 0.0
        n = 0
        while True:
            x = rng.exponential(1.0 / rate) if rate > 0 else math.inf
            left = useful - done
            ckpts = math.floor(left / interval) if interval and math.isfinite(left) else 0
            need = left + downtime * ckpts
            cap = wall_limit - wall
            if need <= x and need <= cap:
                wall += need
                done = useful
                break
            if cap <= x:
                # the wall-clock window closes before the next interruption: the work since the last
                # checkpoint is not lost (the run goes on past the window)
                if interval:
                    k = math.floor(cap / cycle)
                    done += k * interval + min(cap - k * cycle, interval)
                else:
                    done += cap
                wall = wall_limit
                break
            if interval:
                k = math.floor(x / cycle)
                done += k * interval
                lost += x - k * cycle
            else:
                done += x                 # no checkpoint section: the lost work is not known, none counted
            n += 1
            events += 1
            if events > max_events:
                return None
            step = min(recover, wall_limit - wall - x)
            wall += x + step
            rec += step
            if wall >= wall_limit:
                break
        out[:, t] = (done / wall if wall else 1.0, n, lost, rec, wall)
    return RunStats(*out)


def _renewal_goodput(rate: float, interval: float, downtime: float, recover: float) -> float:
    """Expected goodput of the same process in closed form (renewal reward), for runs too long to replay:
    a cycle of interval + downtime survives with p = exp(-rate x cycle); a failed attempt costs its
    expected running time before the failure plus the recovery."""
    cyc = interval + downtime
    p = math.exp(-rate * cyc)
    if p <= 0:
        return 0.0
    fail_cost = (1.0 / rate - cyc * p / (1.0 - p)) + recover if p < 1 else 0.0
    expected_wall = cyc + (1.0 - p) / p * fail_cost
    return interval / expected_wall


def run_goodput(sc, *, ckpt_bytes: float, write_s: float | None, downtime_s: float, restore_s: float | None,
                gpus: int, nodes: int, nics_per_node: int, useful_s: float | None,
                min_interval_s: float = 0.0) -> Goodput:
    """Goodput and interruption figures of ``sc``'s whole run (see the module docstring)."""
    notes: list[str] = []
    ck, rel = sc.checkpoint, sc.reliability
    interval = ck.every_s if ck is not None else None
    stall = downtime_s if ck is not None else 0.0
    if ck is not None and write_s is None:
        notes.append("checkpoint cost unknown: cluster.storage names no throughput (tier or capacity)")
    if ck is not None and ck.async_ and write_s and interval and write_s > interval:
        notes.append("asynchronous checkpoint writes outlast the interval and stall training")
    comps = component_rates(sc, gpus, nodes, nics_per_node)
    lam = sum(comps.values())
    if rel is not None and not rel.node_mtbf_s and fleet_counts(rel.fleet or DEFAULT_FLEET) == "hardware":
        notes.append(f"fleet {rel.fleet or DEFAULT_FLEET} counts interruptions attributed to hardware only: "
                     "software faults without a hardware signal are not in the expected interruptions")
    base = 1.0 / (1.0 + stall / interval) if interval else 1.0
    young = young_interval(stall, 1.0 / lam) if (lam and stall) else None
    if not lam:
        return Goodput(base, ckpt_bytes, write_s, stall, 0.0, None, tuple(notes), restore_s=restore_s,
                       goodput_p10=base if rel else None, goodput_p50=base if rel else None,
                       goodput_p90=base if rel else None)
    if not interval:
        notes.append("no checkpoint section: failures cost the restart only (lost work unknown)")
    recover = rel.restart_s + (restore_s or 0.0)
    wall_limit = rel.run_length_s or math.inf
    useful = useful_s if (useful_s and not rel.run_length_s) else math.inf
    if not math.isfinite(useful) and not math.isfinite(wall_limit):
        # no length to replay: one expected interval of the renewal process stands for the run
        g = _renewal_goodput(lam, interval, stall, recover) if interval else 1.0 / (1.0 + lam * recover)
        notes.append("run length unknown (no workload.train_tokens or reliability.run_length): goodput "
                     "from the renewal closed form, no interruption count")
        return Goodput(g, ckpt_bytes, write_s, stall, lam, young, tuple(notes), restore_s=restore_s,
                       by_component=comps)
    renewal = _renewal_goodput(lam, interval, stall, recover) if interval else 1.0 / (1.0 + lam * recover)
    horizon = min(useful / max(renewal, 1e-12), wall_limit)
    expected = lam * horizon
    trials = rel.trials
    stats = None
    if expected * trials > MAX_EVENTS:
        trials = max(8, int(MAX_EVENTS / max(expected, 1.0)))
    if expected <= MAX_EVENTS:
        stats = simulate_run(rate=lam, interval=interval, downtime=stall, recover=recover, useful=useful,
                             wall_limit=wall_limit, trials=trials, seed=sc.seed)
    if stats is None:
        # too many interruptions to replay in bounded time: the renewal closed form stands for the run
        notes.append(f"{expected:.3g} interruptions expected: too many to replay, renewal closed form used")
        if renewal < 0.05:
            notes.append("failures arrive faster than the run can make progress")
        return Goodput(renewal, ckpt_bytes, write_s, stall, lam, young, tuple(notes), restore_s=restore_s,
                       interruptions=expected, by_component=comps)
    if trials < rel.trials:
        notes.append(f"{trials} trials replayed (bounded by {MAX_EVENTS} simulated interruptions)")
    if stats.goodput.mean() <= 0.05:
        notes.append("failures arrive faster than the run can make progress")
    daly = daly_interval(stall, 1.0 / lam) if stall else None
    curve: list[tuple[float, float]] = []
    best = None
    if young:
        lo = max(min_interval_s, young / 8.0)
        grid = sorted({max(lo, young * 2.0 ** (k / 2.0)) for k in range(-6, 7)})
        # the sweep gets the same event budget as the replay, spread over the grid
        sweep_trials = max(1, min(48, trials // 4 or 1, int(MAX_EVENTS / (len(grid) * max(expected, 1.0)))))
        for iv in grid:
            st = simulate_run(rate=lam, interval=iv, downtime=stall, recover=recover, useful=useful,
                              wall_limit=wall_limit, trials=sweep_trials, seed=sc.seed,
                              max_events=MAX_EVENTS // len(grid))
            curve.append((iv, float(st.goodput.mean()) if st is not None
                           else _renewal_goodput(lam, iv, stall, recover)))
        best = max(curve, key=lambda c: c[1])[0]
    p10, p50, p90 = (float(v) for v in np.percentile(stats.goodput, [10, 50, 90]))
    i10, i90 = (float(v) for v in np.percentile(stats.interruptions, [10, 90]))
    return Goodput(float(stats.goodput.mean()), ckpt_bytes, write_s, stall, lam, young, tuple(notes),
                   daly_interval_s=daly, best_interval_s=best, interval_curve=tuple(curve),
                   restore_s=restore_s, interruptions=float(stats.interruptions.mean()),
                   interruptions_p10=i10, interruptions_p90=i90,
                   goodput_p10=p10, goodput_p50=p50, goodput_p90=p90, lost_work_s=float(stats.lost_s.mean()),
                   restart_restore_s=float(stats.recover_s.mean()), wall_s=float(stats.wall_s.mean()),
                   by_component=comps)


def as_details(g: Goodput) -> dict[str, Any]:
    """The result's ``details['checkpoint']`` record."""
    return {"bytes": g.checkpoint_bytes, "write_s": g.checkpoint_write_s, "stall_s": g.checkpoint_stall_s,
            "restore_s": g.restore_s, "failures_per_s": g.failures_per_s,
            "young_interval_s": g.young_interval_s, "daly_interval_s": g.daly_interval_s,
            "best_interval_s": g.best_interval_s, "interval_curve": [list(c) for c in g.interval_curve],
            "interruptions": g.interruptions, "interruptions_p10": g.interruptions_p10,
            "interruptions_p90": g.interruptions_p90, "goodput_p10": g.goodput_p10,
            "goodput_p50": g.goodput_p50, "goodput_p90": g.goodput_p90, "lost_work_s": g.lost_work_s,
            "restart_restore_s": g.restart_restore_s, "wall_s": g.wall_s,
            "interruptions_per_s_by_component": dict(g.by_component), "notes": list(g.notes)}
