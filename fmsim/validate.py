"""``fmsim check`` and ``fmsim validate``: predictions against bands and against measurements.

Owns the comparison rules. *check* runs scenarios that carry ``expect:`` and says which metric
left its band (``|predicted - value| <= max(rel_tol * |value|, abs_tol)``). *validate* runs
scenarios that carry ``measured:`` and reports, per scenario and measured key, the prediction,
the measurement and the signed error ``100 * (predicted - measured) / measured``, then the median
and worst absolute error over every compared key. ``model_tflops_per_gpu``, ``mfu`` and ``hfu``
are predicted with the FLOPs formula the source used (``measured.flops_formula``):
``model_flops_per_step / step_time_s / gpus``, divided by the source's peak (``measured.peak``,
else the accelerator's dense peak in the scenario's precision) for MFU and HFU.

A scenario whose simulation raises a :class:`FmsimError` becomes one error row; the others go on.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import FmsimError
from .results import Result
from .scenario import FLOPS_METRICS, Expect, Scenario

__all__ = [
    "CheckRow",
    "ValidationRow",
    "ValidationSummary",
    "check_scenarios",
    "error_line",
    "predicted_value",
    "summarize",
    "validate_scenarios",
]

Runner = Callable[[Scenario], Result]


def error_line(sc: Scenario, exc: BaseException) -> str:
    """``FILE: message`` for an error raised while running ``sc`` (no double file prefix)."""
    msg = str(exc)
    where = sc.file or sc.name
    return msg if msg.startswith(f"{where}:") else f"{where}: {msg}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRow:
    """One ``expect:`` entry of one scenario, checked (or the scenario's error)."""

    scenario: str
    file: str | None
    key: str
    predicted: float | None
    expect: Expect | None
    ok: bool
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRow:
    """One measured key of one scenario: prediction, measurement and signed error in %."""

    scenario: str
    file: str | None
    key: str
    predicted: float | None
    measured: float | None
    error_pct: float | None
    source: str
    formula: str | None = None
    error: str | None = None
    #: whether the plan fits in HBM by the memory model (None: the result does not say). The run
    #: was measured, so it did fit: False is a miss of the memory model, reported beside the error.
    fits: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "file": self.file,
            "key": self.key,
            "predicted": self.predicted,
            "measured": self.measured,
            "error_pct": self.error_pct,
            "flops_formula": self.formula,
            "source": self.source,
            "error": self.error,
            "fits": self.fits,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationSummary:
    compared: int  # keys with a numeric error
    errors: int  # scenarios that raised
    median_abs_pct: float | None
    worst_abs_pct: float | None
    worst: ValidationRow | None
    not_fitting: tuple[str, ...] = ()  # measured runs the memory model says do not fit


def _as_float(value: Any) -> float | None:
    if value is None or isinstance(value, str):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def predicted_value(sc: Scenario, result: Result, key: str) -> float | None:
    """The prediction compared with ``measured[key]`` (see the module docstring for FLOP metrics)."""
    if key not in FLOPS_METRICS:
        return _as_float(result.get(key))
    formula = sc.flops_formula
    if formula is None:  # the loader requires it; keep the rule in one place
        raise FmsimError(f"measured.{key} needs measured.flops_formula")
    step = _as_float(result.get("step_time_s"))
    if step is None or step <= 0:
        return None
    from .model.flops import model_flops_per_step  # model layer; imported when needed

    wl = sc.workload
    if key == "hfu":  # hardware FLOPs: the recomputed forward counts
        flops = model_flops_per_step(
            wl.model, wl.seq_len, wl.global_batch, formula, recompute=sc.parallelism.recompute
        )
    else:
        flops = model_flops_per_step(wl.model, wl.seq_len, wl.global_batch, formula)
    flop_per_s_per_gpu = flops / step / sc.cluster.gpus
    if key == "model_tflops_per_gpu":
        return flop_per_s_per_gpu / 1e12
    peak = sc.measured_peak_flop_per_s or sc.cluster.instance.accelerator.peak(wl.precision)
    return flop_per_s_per_gpu / peak


def _run_one(run: Runner, sc: Scenario) -> tuple[Result | None, str | None]:
    try:
        return run(sc), None
    except FmsimError as exc:
        return None, error_line(sc, exc)


def run_all(scenarios: Sequence[Scenario], run: Runner, jobs: int = 1, *,
            progress: bool = False) -> list[tuple[Result | None, str | None]]:
    """``(result, None)`` or ``(None, error line)`` per scenario, in order; ``jobs`` worker processes.

    Scenarios are independent, so a validation or check run spreads over the machine's cores; each
    result is what a serial run gives, byte for byte (every run is seeded from its scenario).
    ``progress`` draws a tqdm bar on stderr as scenarios finish. Interrupted (Ctrl-C, or SIGTERM
    turned into ``KeyboardInterrupt`` by the CLI), the worker processes are stopped before the
    exception goes on; a worker whose parent has gone stops by itself."""
    from tqdm import tqdm

    with tqdm(total=len(scenarios), disable=not progress, file=sys.stderr, unit="scenario",
              dynamic_ncols=True) as bar:
        if jobs <= 1 or len(scenarios) <= 1:
            out = []
            for sc in scenarios:
                out.append(_run_one(run, sc))
                bar.update()
            return out
        return _run_pool(scenarios, run, jobs, bar)


def _run_pool(scenarios: Sequence[Scenario], run: Runner, jobs: int,
              bar: Any) -> list[tuple[Result | None, str | None]]:
    import concurrent.futures
    import functools

    # longest first, so the workers finish together; results come back in the given order
    order = sorted(range(len(scenarios)), key=lambda i: -_work(scenarios[i]))
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(scenarios)),
                                                  initializer=_worker_init, initargs=(os.getpid(),))
    try:
        # the workers are forked while submitting: an interrupt then would land inside the fork's
        # bookkeeping (a lock held, the pool half built), so it waits until they are all started
        with _signals_held():
            futures = {i: pool.submit(functools.partial(_run_one, run), scenarios[i]) for i in order}
        for _ in concurrent.futures.as_completed(futures.values()):
            bar.update()
        out = [futures[i].result() for i in range(len(scenarios))]
    except BaseException:
        _stop_workers(pool)
        raise
    pool.shutdown()
    return out


_HELD = ("SIGINT", "SIGTERM")


class _signals_held:
    """Ctrl-C and SIGTERM held back (delivered on exit) where the platform can block signals."""

    def __enter__(self) -> None:
        import signal

        self.sigs = {getattr(signal, n) for n in _HELD if hasattr(signal, n)}
        self.ok = hasattr(signal, "pthread_sigmask")
        if self.ok:
            signal.pthread_sigmask(signal.SIG_BLOCK, self.sigs)

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self.ok:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.sigs)


def _worker_init(parent_pid: int) -> None:
    """In each worker: Ctrl-C is the parent's to handle (it stops the workers), and a worker left
    behind by a parent that died without stopping it (SIGKILL) exits within a second."""
    import signal
    import threading
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):      # forked while the parent held them (_signals_held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="fmsim-parent-watch").start()


def _stop_workers(pool: Any) -> None:
    """Terminate a process pool's workers now (queued scenarios are dropped) and reap them."""
    # the executor keeps its workers in ``_processes`` (CPython 3.9-3.13; 3.14 adds terminate_workers)
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        p.join(timeout=5.0)
        if p.is_alive():  # pragma: no cover - SIGTERM is not ignored in workers
            p.kill()
            p.join(timeout=5.0)


def _work(sc: Scenario) -> float:
    """A rough size of a scenario's simulation (events), to schedule the big ones first."""
    w, p = sc.workload, sc.parallelism
    if w.global_batch and w.micro_batch and p.dp:
        return w.global_batch / (p.dp * w.micro_batch) * p.pp * p.vpp
    return 5_000.0


def check_scenarios(scenarios: Iterable[Scenario], run: Runner, *, jobs: int = 1,
                    progress: bool = False) -> list[CheckRow]:
    """Run each scenario with ``expect:`` and compare every expected key with its band."""
    rows: list[CheckRow] = []
    todo = [sc for sc in scenarios if sc.expect]
    for sc, (result, err) in zip(todo, run_all(todo, run, jobs, progress=progress)):
        if err is not None:
            rows.append(
                CheckRow(
                    scenario=sc.name,
                    file=sc.file,
                    key="-",
                    predicted=None,
                    expect=None,
                    ok=False,
                    error=err,
                )
            )
            continue
        for key, band in sc.expect.items():
            value = result.get(key)
            predicted = (1.0 if value else 0.0) if isinstance(value, bool) else _as_float(value)
            rows.append(
                CheckRow(
                    scenario=sc.name,
                    file=sc.file,
                    key=key,
                    predicted=predicted,
                    expect=band,
                    ok=band.contains(predicted),
                    error=None if predicted is not None else f"the result has no {key}",
                )
            )
    return rows


def validate_scenarios(scenarios: Iterable[Scenario], run: Runner, *, jobs: int = 1,
                       progress: bool = False) -> list[ValidationRow]:
    """Run each scenario with ``measured:``; one row per measured key (or one error row)."""
    rows: list[ValidationRow] = []
    todo = [sc for sc in scenarios if sc.measured]
    for sc, (result, err) in zip(todo, run_all(todo, run, jobs, progress=progress)):
        formula = sc.flops_formula
        predictions: dict[str, float | None] = {}
        if err is None:
            try:
                predictions = {key: predicted_value(sc, result, key) for key in sc.measured}
            except FmsimError as exc:
                err = error_line(sc, exc)
        if err is not None:
            rows.append(
                ValidationRow(
                    scenario=sc.name,
                    file=sc.file,
                    key="-",
                    predicted=None,
                    measured=None,
                    error_pct=None,
                    source=sc.measured_source,
                    formula=formula,
                    error=err,
                )
            )
            continue
        fits = result.get("fits")
        fits = fits if isinstance(fits, bool) else None
        for key, measured in sc.measured.items():
            pred = predictions[key]
            pct = None if pred is None else 100.0 * (pred - measured) / measured
            rows.append(
                ValidationRow(
                    scenario=sc.name,
                    file=sc.file,
                    key=key,
                    predicted=pred,
                    measured=measured,
                    error_pct=pct,
                    source=sc.measured_source,
                    formula=formula if key in FLOPS_METRICS else None,
                    error=None if pred is not None else f"the result has no {key}",
                    fits=fits,
                )
            )
    return rows


def summarize(rows: Sequence[ValidationRow]) -> ValidationSummary:
    """Median and worst absolute error (%) over the rows that have one; count of error rows; the
    measured runs the memory model says do not fit."""
    scored = [r for r in rows if r.error_pct is not None]
    errors = len({(r.file, r.scenario) for r in rows if r.error is not None and r.key == "-"})
    if not scored:
        return ValidationSummary(
            compared=0, errors=errors, median_abs_pct=None, worst_abs_pct=None, worst=None
        )
    worst = max(scored, key=lambda r: abs(r.error_pct or 0.0))
    return ValidationSummary(
        compared=len(scored),
        errors=errors,
        median_abs_pct=statistics.median(abs(r.error_pct or 0.0) for r in scored),
        worst_abs_pct=abs(worst.error_pct or 0.0),
        worst=worst,
        not_fitting=tuple(dict.fromkeys(r.scenario for r in scored if r.fits is False)),
    )


def by_configuration(scenarios: Sequence[Scenario],
                     rows: Sequence[ValidationRow]) -> dict[str, ValidationSummary]:
    """:func:`summarize` per ``configuration:`` mark (stated, partial; unmarked files as ``-``)."""
    marks = {(sc.file, sc.name): sc.configuration or "-" for sc in scenarios}
    groups: dict[str, list[ValidationRow]] = {}
    for r in rows:
        groups.setdefault(marks.get((r.file, r.scenario), "-"), []).append(r)
    return {mark: summarize(group) for mark, group in sorted(groups.items())}


@dataclass(frozen=True, slots=True, kw_only=True)
class BandRow:
    """A measured key against its prediction's band (fmsim.band): inside or not, and the band's width."""

    scenario: str
    configuration: str
    key: str
    low: float
    high: float
    measured: float
    inside: bool
    half_width_pct: float       # (high - low) / 2 over the prediction, in %
    most: str = ""              # what moves the band most (fmsim.band.Band.reason)
    kind: str = ""              # training | serving (the band's stack kind)
    unknowns: int = 0           # fields the file's configuration.unknown lists


def band_rows(scenarios: Sequence[Scenario], rows: Sequence[ValidationRow]) -> list[BandRow]:
    """Each compared row's band: the estimate's band of its metric, relative to the estimate's point,
    applied to the row's prediction (``fmsim validate --band``; a few dozen estimates per scenario)."""
    from .band import HEADLINE, METRIC_ALIASES, band

    by_name = {(sc.file, sc.name): sc for sc in scenarios}
    out: list[BandRow] = []
    cache: dict[tuple[str | None, str], Any] = {}
    for r in rows:
        sc = by_name.get((r.file, r.scenario))
        if sc is None or r.predicted is None or r.measured is None or r.error_pct is None:
            continue
        key = (r.file, r.scenario)
        if key not in cache:
            cache[key] = band(sc)
        b = cache[key]
        metric = METRIC_ALIASES.get(r.key, r.key) if r.key not in b.point else r.key
        p = b.point.get(metric)
        if not p:
            continue
        low, high = r.predicted * b.low[metric] / p, r.predicted * b.high[metric] / p
        out.append(BandRow(scenario=r.scenario, configuration=sc.configuration or "-", key=r.key, low=low,
                           high=high, measured=r.measured, inside=low <= r.measured <= high,
                           half_width_pct=100 * (high - low) / 2 / abs(r.predicted), most=b.reason(),
                           kind="serving" if b.headline == HEADLINE["serving"] else "training",
                           unknowns=len(sc.configuration_unknown)))
    return out


def band_summary(brs: Sequence[BandRow]) -> list[str]:
    """``fmsim validate --band``'s tally lines: inside share and median half-width per ``configuration:``
    mark, per kind, over the files with ``configuration.unknown`` lists and over all, then what moved the
    bands."""
    groups: dict[str, list[BandRow]] = {}
    for b in brs:
        for name in (b.configuration, b.kind, *(["with unknown lists"] if b.unknowns else []), "all"):
            groups.setdefault(name, []).append(b)
    marks = [*sorted({b.configuration for b in brs}), *sorted({b.kind for b in brs}), "with unknown lists",
             "all"]
    lines = []
    for name in (m for m in marks if m in groups):
        sel = groups[name]
        inside = sum(b.inside for b in sel)
        lines.append(f"band ({name}): {inside} of {len(sel)} measured values inside their band "
                     f"({100 * inside / len(sel):.0f} %), median width +-"
                     f"{statistics.median(b.half_width_pct for b in sel):.1f} %")
    tally = Counter(b.most for b in brs).most_common(4)
    lines.append("band moved most by: " + ", ".join(f"{why} ({n})" for why, n in tally))
    return lines
