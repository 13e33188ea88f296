"""The ``fmsim`` command line: catalog browsing, run, check, validate, lint.

Owns argument parsing, expanding paths to scenario files, and turning every user error into exit
code 2 and one line on stderr (``FILE: field.path: what is wrong (expected ...)``), never a
traceback. Simulation goes through the package facade (``fmsim.simulate`` / ``fmsim.estimate``),
imported when a command needs it. Sub-commands of other modules (``collective``,
``plan-capacity``) are registered when those modules import.

Exit codes: 0 success; 1 ``check`` found a prediction outside its band; 2 bad input (a file, an
option, a path with no scenario file, a plan that cannot be built, a kind whose simulator is not
built); 3 ``run`` simulated a plan that does not fit in memory or misses its SLO (its row is still
written); 130 interrupted (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, FmsimError
from .units import format_quantity

__all__ = ["build_parser", "expand_paths", "format_column", "main"]

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INFEASIBLE = 0, 1, 2, 3
CATALOG_TABLES = ("instances", "accelerators", "models", "storage", "prices", "fabrics")
# Modules of other engineers that add sub-commands: add_parser(subparsers) and run(args) -> int.
PLUGIN_MODULES = ("fmsim.cli_collective", "fmsim.cli_plan", "fmsim.cli_search")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), like every other error."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _say_error(line: str) -> None:
    print(" ".join(str(line).split("\n")), file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# formatting


def format_column(col: str, value: Any) -> str:
    """A result column for people: units from the column name (``step_time_s`` -> ``12.3 s``)."""
    if value is None:
        return "-"
    if isinstance(value, bool) or col == "fits":    # check: fits arrives as 1.0 / 0.0
        return "yes" if value else "no"
    if isinstance(value, str):
        return value or "-"
    if isinstance(value, int) and not col.endswith(("_s", "_bytes", "usd")):
        return f"{value:,}" if col not in ("seed",) else str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return "-"
    if col in ("mfu", "hfu"):
        return f"{100 * v:.1f} %"
    if "tflops" in col:
        return f"{v:.1f} TFLOP/s"
    if col.startswith("usd") or col.endswith("usd"):
        return f"${v:,.2f}" if abs(v) >= 1 or v == 0 else f"${v:.4g}"
    if col == "gpu_hours":
        return f"{format_quantity(v, 'count')} GPU-h"
    if col.endswith("_per_s") or "_per_s_" in col:
        return f"{format_quantity(v, 'count')}/s"
    if col.endswith("_s"):
        return format_quantity(v, "s")
    if col.endswith("_bytes"):
        return format_quantity(v, "bytes")
    if abs(v) >= 1e4:     # a count held as a float (trained tokens per step): 2.6 M, not 2.6e+06
        return format_quantity(v, "count")
    return f"{v:.4g}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    cells = [[str(c) for c in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _gb(n_bytes: float) -> str:
    """Memory as the catalog writes it: whole GiB (80 GiB H100) or else decimal GB (192 GB B200)."""
    gib = n_bytes / 2**30
    if abs(gib - round(gib)) < 0.01:
        return f"{gib:,.0f} GiB"
    return f"{n_bytes / 1e9:,.0f} GB"


# ----------------------------------------------------------------------------------------------
# paths and loading


def expand_paths(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """Files named, and directories expanded to their ``*.yaml`` recursively (sorted).

    Returns ``(files, error_lines)``; a path that does not exist is an error line.
    """
    files: list[str] = []
    errors: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.rglob("*.yaml") if f.is_file())
            files.extend(found)
        elif path.exists():
            files.append(p)
        else:
            errors.append(f"{p}: no such file or directory (expected a scenario .yaml file or a directory)")
    return list(dict.fromkeys(files)), errors


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from .scenario import parse_set_option

    out: dict[str, Any] = {}
    for item in getattr(args, "set", None) or ():
        key, value = parse_set_option(item)
        out[key] = value
    return out


def _load_all(args: argparse.Namespace) -> tuple[list[Any], list[str], int]:
    """Load every scenario named by ``args.paths``: (scenarios, error lines, number of files)."""
    from .scenario import load_scenario

    overrides = _overrides(args)
    files, errors = expand_paths(args.paths)
    if files:  # a broken catalog file is one line (exit 2), not the same line once per scenario file
        from .catalog import load_catalog

        load_catalog()
    scenarios = []
    for f in files:
        try:
            scenarios.append(load_scenario(f, overrides=overrides or None))
        except FmsimError as exc:
            errors.append(str(exc))
    return scenarios, errors, len(files)


def max_jobs() -> int:
    """The most worker processes ``-j`` may ask for: 4 per core (at least 8); each holds a copy of fmsim."""
    return max(8, 4 * (os.cpu_count() or 1))


def jobs_problem(n: int) -> str:
    """Why ``-j n`` is refused, or ""."""
    if n < 1:
        return f"{n} must be >= 1"
    if n > max_jobs():
        return (f"{n:,} worker processes is more than {max_jobs()} (4 per core of this machine's "
                f"{os.cpu_count() or 1})")
    return ""


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of worker processes") from None
    if jobs_problem(n):
        raise argparse.ArgumentTypeError(jobs_problem(n))
    return n


def _add_jobs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", "-j", type=_jobs, default=os.cpu_count() or 1, metavar="N",
                   help="scenarios run in N worker processes (default: the machine's cores); same numbers")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: only when stderr is a terminal)")


def _progress(args: argparse.Namespace) -> bool:
    if args.progress is not None:
        return bool(args.progress)
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _runner(estimate: bool, trace_path: str | None = None) -> Callable[[Any], Any]:
    """``fmsim.simulate`` or ``fmsim.estimate`` from the facade, looked up when first needed."""
    import fmsim

    name = "estimate" if estimate else "simulate"
    try:
        fn = getattr(fmsim, name)
    except (ImportError, AttributeError):
        fn = None
    if not callable(fn):
        raise FmsimError(f"fmsim.{name} is not built yet (the simulation facade is missing)")
    if trace_path is None:
        return fn
    return lambda sc: fn(sc, trace_path=trace_path)


#: longest file name part a scenario name becomes (file systems allow 255 bytes; room for the rest)
MAX_NAME_IN_FILE = 80


def safe_file_part(name: str, limit: int = MAX_NAME_IN_FILE) -> str:
    """``name`` as part of a file name: characters other than letters, digits and ``-_.`` become
    ``_``, and a name longer than ``limit`` is cut, with a short hash of the whole name kept so that
    two long names sharing a start still give two files."""
    safe = "".join(ch if (ch.isascii() and ch.isalnum()) or ch in "-_." else "_" for ch in name)
    if len(safe) <= limit:
        return safe
    import hashlib

    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe[:limit - 9]}-{digest}"


def _trace_path(base: str | None, sc: Any, many: bool) -> str | None:
    if base is None or not many:
        return base
    p = Path(base)
    return str(p.with_name(f"{p.stem}-{safe_file_part(sc.name)}{p.suffix}"))


def _write(kind: str, path: str, write: Callable[[], None]) -> None:
    try:
        write()
    except OSError as exc:
        raise ConfigError(f"cannot write the {kind}: {exc.strerror or exc}", file=path) from None


def check_writable(kind: str, path: str | None) -> None:
    """Refuse an output path that cannot be written -- a missing folder, a directory, a read-only
    file -- before any simulation runs, as one :class:`ConfigError` line (``-`` is stdout)."""
    if path is None or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"cannot write the {kind}: is a directory (expected a file path)", file=path)
    parent = p.parent
    if not parent.is_dir():
        what = "is a file, not a folder" if parent.exists() else "does not exist"
        raise ConfigError(f"cannot write the {kind}: the folder {parent} {what}", file=path)
    existed = p.exists()
    try:
        with open(p, "a"):       # opened to append: an existing file keeps its bytes
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write the {kind}: {exc.strerror or exc}", file=path) from None
    if not existed:
        try:
            p.unlink()
        except OSError:          # pragma: no cover - we just created it
            pass


# ----------------------------------------------------------------------------------------------
# commands


def cmd_lint(args: argparse.Namespace) -> int:
    scenarios, errors, n_files = _load_all(args)
    scenarios = [sc for sc in scenarios if _sections_ok(sc, errors)]
    for line in errors:
        _say_error(line)
    if _no_files(args, n_files, errors):
        return EXIT_USAGE
    print(f"{len(scenarios)} of {n_files} scenario file{'s' if n_files != 1 else ''} OK")
    return EXIT_USAGE if errors else EXIT_OK


def _no_files(args: argparse.Namespace, n_files: int, errors: list[str]) -> bool:
    """True (and one line said) when the paths held no scenario file: a CI job given a mistyped
    or emptied folder must fail, not pass having checked nothing."""
    if n_files or errors:
        return False
    _say_error(f"{' '.join(args.paths)}: no scenario files found (expected *.yaml files)")
    return True


def _infeasible(sc: Any, res: Any) -> str | None:
    """Why a simulated plan cannot be used as it stands (does not fit, misses its SLO), or None."""
    if res.get("fits") is False:
        details = res.details if isinstance(res.details, Mapping) else {}
        why = details.get("memory_error") or "the plan does not fit in memory"
        return f"{sc.file or sc.name}: does not fit: {why}"
    if res.get("slo_met") is False:
        return f"{sc.file or sc.name}: misses its SLO (slo_met false: see the latency figures)"
    return None


def _unserved(sc: Any, res: Any) -> str | None:
    """A warning naming the requests a serving run did not serve (rejected, left unfinished), or None: the
    exit code does not change for them (without an SLO the run exits 0), so stderr says it in one line."""
    rejected, unfinished = res.get("rejected_requests") or 0, res.get("unfinished_requests") or 0
    if res.kind != "inference" or not (rejected or unfinished):
        return None
    offered = res.get("requests_offered") or res.get("requests_simulated")
    of = f" of {offered:,}" if offered else ""
    parts = ([f"{rejected:,}{of} requests rejected (their prompt and output fit no engine's KV cache)"]
             if rejected else []) + ([f"{unfinished:,} left unfinished at the horizon"] if unfinished else [])
    verdict = ("no SLO was given, so the run exits 0 all the same" if res.get("slo_met") is None
               else "they count as a missed SLO")
    return f"{sc.file or sc.name}: warning: {'; '.join(parts)}; {verdict}"


def _report_to_stderr_if(machine_stdout: bool) -> Any:
    """While the human report prints: stdout as it is, or -- when ``--csv -`` / ``--json -`` put the
    machine-readable output there -- stderr, so that stdout holds that output alone."""
    import contextlib

    return contextlib.redirect_stdout(sys.stderr) if machine_stdout else contextlib.nullcontext()


def _sections_ok(sc: Any, errors: list[str]) -> bool:
    """Validate the sections a kind's own simulator reads (``traffic``, ``serving``, ... of
    ``kind: inference``), which loading keeps raw; a problem becomes one error line."""
    from .api import check_sections

    try:
        check_sections(sc)
    except FmsimError as exc:
        errors.append(str(exc))
        return False
    return True


def _print_result(sc: Any, res: Any, extra: Sequence[str] = ()) -> None:
    print(f"== {res.scenario}  ({sc.file})")
    row = res.to_dict()
    width = max((len(k) for k in row), default=10) + 2
    for col, value in row.items():
        print(f"  {col.ljust(width)}{format_column(col, value)}")
    step = row.get("step_time_s") or row.get("e2e_p50_s")
    if res.breakdown:
        print("  breakdown")
        for part, seconds in res.breakdown.items():
            share = ""
            if isinstance(step, (int, float)) and step and isinstance(seconds, (int, float)):
                share = f"  ({100 * seconds / step:.1f} %)"
            print(f"    {str(part).ljust(width - 2)}{format_column('x_s', seconds)}{share}")
    if res.memory:
        print("  memory per GPU")
        for part, n_bytes in res.memory.items():
            print(f"    {str(part).ljust(width - 2)}{format_column('x_bytes', n_bytes)}")
    details = res.details if isinstance(res.details, Mapping) else {}
    offload = details.get("activation_offload")
    if isinstance(offload, Mapping):
        print(f"  host memory (activation offload, {offload.get('layers')} layers)")
        for label, key in (("per GPU", "host_bytes_per_gpu"), ("per node", "host_bytes_per_node"),
                           ("node has", "host_memory_per_node")):
            print(f"    {label.ljust(width - 2)}{format_column('x_bytes', offload.get(key))}")
    from .workloads.storage_run import summary_lines    # storage and failures (docs/storage.md)
    for line in summary_lines(details, format_column):
        print(line)
    if res.kind == "inference":
        _print_serving_lines(res, details)
    sentence = details.get("bottleneck_sentence") or details.get("bottleneck")
    if isinstance(sentence, str) and sentence:
        print(f"  {sentence}")
    if res.usd_per_hour is None and details.get("price_source"):  # fmsim.cost says which pricing exists
        print(f"  no cost: {details['price_source']}")
    for line in extra:
        print(f"  {line}")
    print()


def _print_serving_lines(res: Any, details: Mapping[str, Any]) -> None:
    """Whether the SLOs are met, limit by limit, and how many requests the run simulated."""
    slo = details.get("slo")
    if isinstance(slo, list) and slo:
        met = res.get("slo_met")
        parts = []
        for v in slo:
            sign = "<=" if v.get("met") else ">" if v.get("met") is False else "vs"
            parts.append(f"{v.get('slo')} {format_column('x_s', v.get('value_s'))} {sign} "
                         f"{format_column('x_s', v.get('limit_s'))}")
        why = ""
        if met is False and all(v.get("met") for v in slo):
            why = " (requests rejected or left unfinished)"
        print(f"  SLO {'met' if met else 'NOT met'}{why}: {'; '.join(parts)}")
    else:
        print("  SLO: none given (add slo: to check latency targets)")
    cap = details.get("request_cap")
    if isinstance(cap, Mapping):
        print(f"  simulated {cap.get('simulated'):,} of {cap.get('requests'):,} requests (the cap, "
              f"{cap.get('cap'):,}): the figures are the steady state's")


def _with_band(sc: Any, res: Any) -> tuple[Any, list[str]]:
    """``run --band``: the result with its band columns, and the line that says it (fmsim.band)."""
    import dataclasses

    from .band import BAND_COLUMNS, band, band_columns

    b = band(sc)
    cols = band_columns(sc.workload.kind, b, res.metrics)
    res = dataclasses.replace(res, metrics={**res.metrics, **cols})
    metric = b.headline
    lo_col, hi_col = BAND_COLUMNS["serving" if metric == "output_tokens_per_s" else "training"][metric]
    lo, hi = cols.get(lo_col), cols.get(hi_col)
    name = "step" if metric == "step_time_s" else "output"
    point = format_column(metric, res.metrics.get(metric))
    why = b.reason() if b.most else "every setting it varies is stated"
    return res, [f"band: {name} {point}, {format_column(metric, lo)}-{format_column(metric, hi)}: {why} "
                 f"({len(b.varied)} component{_s(len(b.varied))} varied, {b.runs} estimates)"]


def cmd_run(args: argparse.Namespace) -> int:
    if args.trace and args.estimate:
        raise ConfigError("--trace needs the simulation (drop --estimate)", file="--trace")
    scenarios, errors, n_files = _load_all(args)
    for line in errors:
        _say_error(line)
    if _no_files(args, n_files, errors):
        return EXIT_USAGE
    if args.csv == "-" and args.json == "-":
        raise ConfigError("--csv - and --json - would share stdout (expected one of them on stdout, "
                          "the other to a file)", file="--json")
    many = len(scenarios) > 1
    check_writable("CSV", args.csv)
    check_writable("JSON", args.json)
    for sc in scenarios:
        check_writable("trace", _trace_path(args.trace, sc, many))
    results = []
    failed = bool(errors)
    infeasible = False
    for sc in scenarios:
        trace = _trace_path(args.trace, sc, many)
        run = _runner(args.estimate, trace)
        try:
            res = run(sc)
        except FmsimError as exc:
            from .validate import error_line

            _say_error(error_line(sc, exc))
            failed = True
            continue
        except OSError as exc:
            if trace is None:
                raise
            _say_error(f"{trace}: cannot write the trace: {exc.strerror or exc}")
            failed = True
            continue
        extra: list[str] = []
        if getattr(args, "band", False):
            res, extra = _with_band(sc, res)
        results.append(res)
        with _report_to_stderr_if(args.csv == "-" or args.json == "-"):
            _print_result(sc, res, extra)
        unserved = _unserved(sc, res)
        if unserved:
            _say_error(unserved)
        why = _infeasible(sc, res)
        if why:
            _say_error(why)
            infeasible = True
    from .export import write_csv, write_json

    if args.csv:
        _write("CSV", args.csv, lambda: write_csv(results, args.csv))
    if args.json:
        _write("JSON", args.json, lambda: write_json(results, args.json))
    if failed:
        return EXIT_USAGE
    return EXIT_INFEASIBLE if infeasible else EXIT_OK


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _band_text(col: str, e: Any) -> str:
    if col == "fits":
        return format_column(col, e.value)
    lo, hi = e.band()
    return f"{format_column(col, lo)} .. {format_column(col, hi)}"


def cmd_check(args: argparse.Namespace) -> int:
    from .validate import check_scenarios

    scenarios, errors, n_files = _load_all(args)
    for line in errors:
        _say_error(line)
    if _no_files(args, n_files, errors):
        return EXIT_USAGE
    with_expect = [sc for sc in scenarios if sc.expect]
    skipped = len(scenarios) - len(with_expect)
    rows = check_scenarios(with_expect, _runner(args.estimate), jobs=args.jobs,
                                                 progress=_progress(args)) if with_expect else []
    table = []
    for r in rows:
        if r.expect is None:
            table.append([r.scenario, "-", "-", "-", "-", "ERROR"])
            continue
        table.append(
            [
                r.scenario,
                r.key,
                format_column(r.key, r.predicted),
                format_column(r.key, r.expect.value),
                _band_text(r.key, r.expect),
                "ok" if r.ok else "OUT OF BAND",
            ]
        )
    if table:
        print(_table(["scenario", "metric", "predicted", "expected", "band", "status"], table))
    for r in rows:
        if r.error:
            _say_error(r.error)
    n_bad = sum(not r.ok for r in rows)
    checked = f"{len(with_expect)} scenario{_s(len(with_expect))} checked"
    in_band = f"{len(rows) - n_bad} of {len(rows)} metrics in band"
    skip = f"{skipped} scenario{_s(skipped)} without expect: skipped"
    not_loaded = f"; {len(errors)} file{_s(len(errors))} not loaded" if errors else ""
    print(f"{checked}, {in_band}; {skip}{not_loaded}")
    if errors or any(r.expect is None for r in rows):
        return EXIT_USAGE
    return EXIT_CHECK_FAILED if n_bad else EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from .validate import validate_scenarios

    check_writable("CSV", args.csv)
    scenarios, errors, n_files = _load_all(args)
    for line in errors:
        _say_error(line)
    if _no_files(args, n_files, errors):
        return EXIT_USAGE
    with_measured = [sc for sc in scenarios if sc.measured]
    rows = validate_scenarios(with_measured, _runner(args.estimate), jobs=args.jobs,
                                                          progress=_progress(args)) if with_measured else []
    with _report_to_stderr_if(args.csv == "-"):
        _print_validation(rows, scenarios, with_measured, errors)
        _validate_by_configuration(with_measured, rows, band=getattr(args, "band", False))
    if args.csv:
        from .export import write_rows_csv

        _write("CSV", args.csv, lambda: write_rows_csv([r.as_dict() for r in rows], args.csv))
    return EXIT_USAGE if errors else EXIT_OK


def _print_validation(rows: Sequence[Any], scenarios: Sequence[Any], with_measured: Sequence[Any],
                      errors: Sequence[str]) -> None:
    from .validate import summarize

    table = []
    for r in rows:
        if r.key == "-":
            table.append([r.scenario, "-", "-", "-", "ERROR", r.error])
            continue
        err = "-" if r.error_pct is None else f"{r.error_pct:+.1f} %"
        table.append(
            [
                r.scenario,
                r.key,
                format_column(r.key, r.predicted),
                format_column(r.key, r.measured),
                err,
                r.error or "; ".join(x for x in (r.formula, "does not fit" if r.fits is False else None) if x),
            ]
        )
    if table:
        print(_table(["scenario", "metric", "predicted", "measured", "error", "note"], table, right=(4,)))
    s = summarize(rows)
    skipped = len(scenarios) - len(with_measured)
    if s.compared:
        assert s.worst is not None and s.median_abs_pct is not None and s.worst_abs_pct is not None
        print(
            f"{s.compared} compared metrics over {len(with_measured) - s.errors} scenarios: median |error| "
            f"{s.median_abs_pct:.1f} %, worst {s.worst_abs_pct:.1f} % ({s.worst.scenario} {s.worst.key})"
        )
        if s.not_fitting:
            print(f"{len(s.not_fitting)} measured run{'s' if len(s.not_fitting) != 1 else ''} predicted not to fit "
                  f"in HBM (a memory-model miss: they ran): {', '.join(s.not_fitting)}")
    else:
        print("no metric compared")
    print(
        f"{s.errors} scenario{'s' if s.errors != 1 else ''} raised an error; {skipped} without measured: "
        "skipped" + (f"; {len(errors)} file{'s' if len(errors) != 1 else ''} not loaded" if errors else "")
    )


def _validate_by_configuration(scenarios: Sequence[Any], rows: Sequence[Any], *, band: bool) -> None:
    """The errors of rows whose source states the configuration and of partial ones, side by side, and
    with ``--band`` how often the measurement lies in its prediction's band (fmsim.band), and its width."""
    from .validate import band_rows, band_summary, by_configuration

    groups = by_configuration(scenarios, rows)
    if set(groups) != {"-"}:
        parts = [f"{mark}: {g.compared} rows, median |error| {g.median_abs_pct:.1f} %, "
                 f"worst {g.worst_abs_pct:.1f} %" for mark, g in groups.items()
                 if g.compared and g.median_abs_pct is not None and g.worst_abs_pct is not None]
        print("by configuration -- " + "; ".join(parts))
    if band:
        brs = band_rows(scenarios, rows)
        print(_table(["scenario", "metric", "band", "measured", "inside", "moved most by"],
                     [[b.scenario, b.key, f"{format_column(b.key, b.low)}-{format_column(b.key, b.high)}",
                       format_column(b.key, b.measured), "yes" if b.inside else "no", b.most] for b in brs]))
        for line in band_summary(brs):
            print(line)


APP_ENTRY = "Home.py"


def app_entry() -> Path:
    """The explorer's entry script: ``app/Home.py`` of a checkout, or the wheel's ``fmsim/data/app``.

    Found through :func:`fmsim.catalog.data_root` like the catalogs; fmsim itself never imports
    streamlit (tests/test_layering.py), it only starts it.
    """
    from .catalog import data_root

    entry = data_root() / "app" / APP_ENTRY
    if not entry.is_file():
        raise ConfigError(f"the explorer is not installed here (no {entry})", file="fmsim app")
    return entry


APP_ADDRESS = "127.0.0.1"


def app_command(port: int, address: str | None = APP_ADDRESS) -> list[str]:
    """``streamlit run`` of the explorer, headless (no browser opened, no usage statistics sent),
    listening on this machine only unless ``address`` says otherwise (``0.0.0.0``: every interface)."""
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        raise ConfigError("streamlit is not installed (install fmsim with the app extra: "
                          "pip install 'fmsim[app]')", file="fmsim app")
    if not 0 < port < 65536:
        raise ConfigError(f"{port} is not a TCP port (expected 1 .. 65535)", file="fmsim app", field="--port")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app_entry()),
           "--server.headless", "true", "--server.port", str(port),
           "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer",
           # uploads are scenario files: the scenario reader refuses more than 1 MiB anyway
           "--server.maxUploadSize", "1"]
    cmd += ["--server.address", address or APP_ADDRESS]
    return cmd


def cmd_app(args: argparse.Namespace) -> int:
    cmd = app_command(args.port, args.address)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name != "posix":  # pragma: no cover - Windows has no exec: wait for the server instead
        import subprocess

        return subprocess.call(cmd)
    os.execv(cmd[0], cmd)  # the server replaces this process: stopping it stops the server
    return EXIT_OK  # not reached (execv does not return)


# -- catalog -------------------------------------------------------------------------------------


def _usd_with_date(cat: Any, instance: str) -> str:
    price = cat.price(instance, "on-demand")
    return "-" if price is None else f"${price.usd_per_hour:,.2f} ({price.date})"


def _catalog_table(cat: Any, what: str) -> str:
    if what == "instances":
        rows = []
        for name, i in sorted(cat.instances.items()):
            a = i.accelerator
            rows.append(
                [
                    name,
                    i.provider,
                    f"{i.num_accelerators} x {a.name}",
                    _gb(a.hbm_bytes),
                    f"{i.scale_up.kind} {i.scale_up.domain_size}",
                    i.fabric.name,
                    f"{i.num_nics * i.nic_bytes_per_s * 8 / 1e9:,.0f}",
                    _usd_with_date(cat, name),
                ]
            )
        return _table(
            [
                "instance",
                "provider",
                "accelerators",
                "HBM/GPU",
                "scale-up",
                "fabric",
                "EFA/net Gbps",
                "on-demand $/h (date)",
            ],
            rows,
            right=(3, 6),
        )
    if what == "accelerators":
        rows = []
        for name, a in sorted(cat.accelerators.items()):
            peaks = [
                f"{a.peak_flop_per_s[p] / 1e12:,.0f}" if p in a.peak_flop_per_s else "-"
                for p in ("bf16", "fp8", "fp4")
            ]
            rows.append(
                [
                    name,
                    a.vendor,
                    *peaks,
                    _gb(a.hbm_bytes),
                    f"{a.hbm_bytes_per_s / 1e12:.2f}",
                    f"{a.scale_up_bytes_per_s / 1e9:,.0f}",
                ]
            )
        return _table(
            ["accelerator", "vendor", "bf16 TFLOP/s", "fp8", "fp4", "HBM", "HBM TB/s", "scale-up GB/s"],
            rows,
            right=(2, 3, 4, 5, 6, 7),
        )
    if what == "models":
        rows = []
        for name, m in sorted(cat.models.items()):
            total, active = m.param_counts()
            moe = f"{m.moe.experts}e top{m.moe.top_k}" if m.moe else "-"
            rows.append(
                [
                    name,
                    m.layers,
                    m.hidden,
                    f"{m.heads}/{m.kv_heads}",
                    m.ffn_hidden,
                    m.vocab,
                    m.attention,
                    moe,
                    f"{total / 1e9:,.1f}B",
                    f"{active / 1e9:,.1f}B",
                ]
            )
        return _table(
            ["model", "layers", "hidden", "heads/kv", "ffn", "vocab", "attention", "moe", "params", "active"],
            rows,
            right=(1, 2, 4, 5, 8, 9),
        )
    if what == "storage":
        rows = []

        def rate(v: float) -> str:
            return "-" if not v else format_quantity(v, "bytes_per_s")

        for name, s in sorted(cat.storage.items()):
            price = (
                "-"
                if s.usd_per_gb_month is None
                else f"${s.usd_per_gb_month:g}/GB-mo ({s.price_date or '?'})"
            )
            rows.append(
                [
                    name,
                    s.kind,
                    rate(s.throughput_per_tib_bytes_per_s),
                    rate(s.burst_per_tib_bytes_per_s),
                    rate(s.per_client_bytes_per_s),
                    rate(s.per_client_efa_bytes_per_s),
                    price,
                ]
            )
        return _table(
            ["storage", "kind", "per TiB", "burst/TiB", "per client", "per client (EFA)", "price"], rows
        )
    if what == "prices":
        rows = []
        for inst, prices in sorted(cat.prices.items()):
            for p in sorted(prices, key=lambda p: (p.option, p.date)):
                rows.append([inst, p.option, f"${p.usd_per_hour:,.2f}", p.date, p.region, p.note])
        return _table(["instance", "option", "$/h", "date", "region", "note"], rows, right=(2,))
    if what == "fabrics":
        rows = []
        for name, f in sorted(cat.fabrics.items()):
            rows.append(
                [
                    name,
                    f.kind,
                    f"{f.nic_bytes_per_s * 8 / 1e9:,.0f}",
                    format_quantity(f.latency_s, "s"),
                    f"{f.efficiency:.2f}",
                    "yes" if f.in_network_reduction else "no",
                ]
            )
        return _table(
            ["fabric", "kind", "NIC Gbps", "latency", "efficiency", "in-network reduction"], rows, right=(2,)
        )
    raise AssertionError(what)  # pragma: no cover - argparse restricts the choices


def _describe(obj: Any, indent: str = "  ") -> list[str]:
    lines = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            name = getattr(value, "name", None)
            if name is not None and f.name in ("accelerator", "fabric"):
                lines.append(f"{indent}{f.name}: {name}")
                continue
            lines.append(f"{indent}{f.name}:")
            lines.extend(_describe(value, indent + "  "))
            continue
        if isinstance(value, Mapping):
            shown = ", ".join(f"{k}: {_field_text(f.name, v)}" for k, v in value.items())
            lines.append(f"{indent}{f.name}: {{{shown}}}")
            continue
        lines.append(f"{indent}{f.name}: {_field_text(f.name, value)}")
    return lines


def _field_text(name: str, value: Any) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return "-" if value is None else str(value)
    if isinstance(value, float):
        if name.endswith("bytes_per_s") or name == "bytes_per_s":
            return format_quantity(value, "bytes_per_s")
        if name.endswith("_bytes"):
            return format_quantity(value, "bytes")
        if "flop_per_s" in name:        # before the "_s" of durations: a rate, not seconds
            return format_quantity(value, "flop_per_s")
        if name.endswith("_s"):
            return format_quantity(value, "s")
        return f"{value:g}"
    return str(value)


def _catalog_show(cat: Any, name: str) -> str:
    tables = [
        ("instance", cat.instances),
        ("accelerator", cat.accelerators),
        ("model", cat.models),
        ("fabric", cat.fabrics),
        ("storage tier", cat.storage),
        ("stack", cat.stacks),
    ]
    for kind, table in tables:
        if name in table:
            obj = table[name]
            lines = [f"{kind} {name}"]
            lines.extend(_describe(obj))
            if kind == "instance":
                for p in sorted(cat.prices.get(name, ()), key=lambda p: (p.option, p.date)):
                    lines.append(
                        f"  price {p.option}: ${p.usd_per_hour:,.2f}/h ({p.date}, {p.region}) "
                        f"{p.note}".rstrip()
                    )
                    lines.append(f"    source: {p.source}")
            if kind == "model":
                total, active = obj.param_counts()
                lines.append(f"  parameters (computed): {total:,} total, {active:,} active per token")
            return "\n".join(lines)
    from .catalog import suggest

    known = [n for _, t in tables for n in t]
    raise ConfigError(f"{name!r} is not in the catalog{suggest(name, known)}", file="catalog")


def cmd_catalog(args: argparse.Namespace) -> int:
    from .catalog import load_catalog

    cat = load_catalog()
    # software stacks (stack_catalog/, fmsim.stacks): the table, and show STACK with each value's source
    if args.what == "stacks" and not args.name:
        from .stacks import stacks_table
        print(_table(["stack", "kind", "framework", "sets"], stacks_table(cat.stacks)))
        return EXIT_OK
    if args.what == "show" and args.name in cat.stacks:
        from .stacks import describe
        print("\n".join(describe(cat.stacks[args.name])))
        return EXIT_OK
    if args.what == "show":
        if not args.name:
            raise ConfigError(
                "show needs a NAME (an instance, accelerator, model, fabric or storage tier)", file="catalog"
            )
        print(_catalog_show(cat, args.name))
        return EXIT_OK
    if args.name:
        raise ConfigError(
            f"unexpected {args.name!r} after {args.what} (expected: catalog show NAME)", file="catalog"
        )
    print(_catalog_table(cat, args.what or "instances"))
    return EXIT_OK


# ----------------------------------------------------------------------------------------------
# parser


def _add_scenario_args(p: argparse.ArgumentParser, *, estimate: bool = True) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="scenario .yaml files or directories (recursive)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY.PATH=VALUE",
        default=[],
        help="override a field before validation, e.g. --set parallelism.tp=4 (repeatable)",
    )
    if estimate:
        p.add_argument(
            "--estimate",
            action="store_true",
            help="use the analytical estimate instead of the discrete-event simulation",
        )


def _register_plugins(sub: Any) -> None:
    for module_name in PLUGIN_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        before = set(sub.choices)
        module.add_parser(sub)
        for name in set(sub.choices) - before:
            sub.choices[name].set_defaults(_handler=module.run)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="fmsim",
        description="Capacity-planning simulator for foundation-model training and serving on AWS.",
    )
    parser.add_argument("--version", action="version", version=f"fmsim {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    p = sub.add_parser("catalog", help="browse the hardware and model catalogs")
    p.add_argument(
        "what",
        nargs="?",
        default="instances",
        choices=CATALOG_TABLES + ("stacks", "show"),
        help="which table (default: instances), or show NAME",
    )
    p.add_argument(
        "name", nargs="?", help="with show: an instance, accelerator, model, fabric or storage tier"
    )
    p.set_defaults(_handler=cmd_catalog)

    p = sub.add_parser("run", help="simulate scenarios and print their results")
    _add_scenario_args(p)
    p.add_argument("--csv", metavar="F", help="write one CSV row per scenario to F ('-' = stdout)")
    p.add_argument("--json", metavar="F", help="write the full results as JSON to F ('-' = stdout)")
    p.add_argument(
        "--trace",
        metavar="F",
        help="write a Chrome/Perfetto trace of the simulated timeline to F "
        "(one file per scenario when several: F-<name>.json)",
    )
    p.add_argument("--band", action="store_true",
                   help="also vary the settings the file and its stack leave unstated (analytical estimates) "
                        "and report the low-high band and the setting that moves it most")
    p.set_defaults(_handler=cmd_run)

    p = sub.add_parser("check", help="run scenarios with expect: bands; exit 1 when one leaves its band")
    _add_scenario_args(p)
    _add_jobs_arg(p)
    p.set_defaults(_handler=cmd_check)

    p = sub.add_parser("validate", help="run scenarios with measured: values; predicted vs measured")
    _add_scenario_args(p)
    _add_jobs_arg(p)
    p.add_argument("--csv", metavar="F", help="write the comparison rows as CSV to F ('-' = stdout)")
    p.add_argument("--band", action="store_true",
                   help="also report how often the measurement lies in its prediction's band (fmsim.band)")
    p.set_defaults(_handler=cmd_validate)

    p = sub.add_parser("lint", help="validate scenario files without running them")
    _add_scenario_args(p, estimate=False)
    p.set_defaults(_handler=cmd_lint)

    p = sub.add_parser("app", help="serve the Streamlit what-if explorer (headless; open the URL it prints)")
    p.add_argument("--port", type=int, default=8501, help="TCP port to serve on (default 8501)")
    p.add_argument(
        "--address",
        default=APP_ADDRESS,
        help=f"address to listen on (default {APP_ADDRESS}: this machine only; 0.0.0.0: every interface)",
    )
    p.set_defaults(_handler=cmd_app)

    _register_plugins(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fmsim`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler = getattr(args, "_handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    previous = _stop_on_sigterm()
    try:
        return int(handler(args) or 0)
    except FmsimError as exc:
        _say_error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fmsim catalog | head`
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return EXIT_OK
    finally:
        if previous is not None:
            import signal

            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop_on_sigterm() -> Any:
    """SIGTERM (``kill``, a CI job's timeout) unwinds like Ctrl-C, so that worker processes are
    stopped too (fmsim.validate.run_all); returns the handler it replaced (None off the main thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
