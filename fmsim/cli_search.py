"""``fmsim search SCENARIO``: the cheapest or fastest training plan across plans, instance types and prices.

Owns the command's options, its report (the search's counts, the time/cost frontier, the best plan per
instance type with its bottleneck, the discrete-event re-check and the winner), the CSV of every costed
plan (the columns of ``fmsim run --csv``) and the winners written as runnable scenario files. The search
itself is :func:`fmsim.search` (:mod:`fmsim.search`). Stopping it (Ctrl-C, SIGTERM) keeps what it had
finished in the cache and leaves no worker process behind; the same command continues.

``add_parser(subparsers)`` / ``run(args) -> int`` are the plug-in contract of ``fmsim/cli.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from .errors import ConfigError

EXIT_OK, EXIT_USAGE, EXIT_STOPPED = 0, 2, 130
FRONTIER_ROWS = 12


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "search",
        help="search training plans x instance types x node counts x pricing for the cheapest or fastest",
        description="Enumerate training plans (tp, pp, vpp, cp, ep, micro-batch, ZeRO, recompute, "
                    "offloading, global batch) over instance types, node counts and pricing options; refuse "
                    "what cannot run, cost the rest with the analytical estimate, re-check the best with the "
                    "simulation. --deadline: the cheapest plan that trains workload.train_tokens in time; "
                    "--budget: the fastest within the money; neither: the Pareto frontier of time to train "
                    "against cost. Time to train is train_tokens over tokens per second at any global batch "
                    "(a larger batch is fewer steps): the search does not model the effect of the batch size "
                    "on convergence (past the critical batch size more tokens are needed for the same "
                    "loss). See docs/search.md.")
    p.add_argument("scenario", help="a kind: pretrain or finetune scenario file (with workload.train_tokens)")
    p.add_argument("--instances", help="comma-separated instance types (default: the scenario's)")
    p.add_argument("--nodes", help="node counts: LO..HI (doubling: 8..1024) or a list 8,12,16 "
                                   "(default: the scenario's)")
    p.add_argument("--pricing", help="comma-separated pricing options, e.g. on-demand,capacity-block "
                                     "(default: the scenario's)")
    p.add_argument("--deadline", help="time to train at most this, e.g. 60d: the cheapest such plan wins")
    p.add_argument("--budget", help="cost at most this many US dollars, e.g. 5M: the fastest such plan wins")
    for axis, what in (("tp", "tensor-parallel sizes"), ("pp", "pipeline stages"), ("vpp", "virtual stages"),
                       ("cp", "context-parallel sizes"), ("ep", "expert-parallel sizes"),
                       ("micro-batch", "micro-batch sizes"), ("zero", "ZeRO stages 0..3"),
                       ("offload", "activation-offloaded layers")):
        p.add_argument(f"--{axis}", metavar="LIST",
                       help=f"{what} to try, comma-separated (default: docs/search.md)")
    p.add_argument("--global-batch", metavar="LIST",
                   help="global batches to try, sequences per step, comma-separated, e.g. 1024,2048,4096 "
                        "(default: the scenario's workload.global_batch). Not modelled: the batch size's "
                        "effect on convergence -- every batch is taken to need the same train_tokens")
    p.add_argument("--recompute", metavar="LIST",
                   help="recompute modes to try: none,selective,full (default: all)")
    p.add_argument("--top", type=int, default=3, metavar="K",
                   help="re-check the best K plans with the discrete-event simulation (default 3; 0: none)")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="local worker processes (default: all cores)")
    p.add_argument("--dask", metavar="ADDRESS", help="run on a Dask cluster: a scheduler address, or local:N")
    p.add_argument("--cache", metavar="DIR",
                   help="result cache directory (default: the user cache, ~/.cache/fmsim)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    p.add_argument("--csv", metavar="F", help="write every costed plan (the columns of fmsim run --csv) to F")
    p.add_argument("--yaml-dir", metavar="DIR", help="write the winners as runnable scenario files into DIR")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: when stderr is a terminal)")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", default=[],
                   help="override a field of the scenario before validation (repeatable)")


def _money(v: float | None) -> str:
    from .units import format_quantity

    return "-" if v is None else "$" + format_quantity(v, "count").replace(" ", "")


def _days(v: float | None) -> str:
    from .units import format_quantity

    return "-" if v is None else format_quantity(v, "s")


def _plan_text(key: tuple) -> str:
    from .search.space import plan_dict

    p = plan_dict(key)
    out = f"tp{p['tp']} pp{p['pp']}"
    for axis, tag in (("vpp", "vpp"), ("cp", "cp"), ("ep", "ep")):
        if p[axis] > 1:
            out += f" {tag}{p[axis]}"
    out += f" mb{p['micro_batch']} zero{p['zero']} {p['recompute']}"
    if p["offload_activations"]:
        out += f" offload{p['offload_activations']}"
    return out + f" gb{p['global_batch']}"


def _line(r, *, why: bool = True) -> str:
    row = r.row
    text = (f"{row['instance']} x{row['nodes']}  {_plan_text(r.key)}  {row['pricing_option']}  "
            f"step {_days(row['step_time_s'])}  MFU {100 * row['mfu']:.1f}%  "
            f"train {_days(row['time_to_train_s'])}  {_money(row['cost_usd'])}")
    return text + (f"  -- {r.why}" if why and r.why else "")


def _ints(args: argparse.Namespace, name: str, option: str, minimum: int = 1):
    from .search.space import parse_ints

    text = getattr(args, name)
    return None if text is None else parse_ints(option, text, minimum=minimum)


def search_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`fmsim.search` from the parsed options (bad ones: ConfigError)."""
    from .catalog import PRICING_OPTIONS, load_catalog
    from .scenario import RECOMPUTE
    from .search.space import parse_names, parse_nodes
    from .units import parse_count, parse_time

    out: dict[str, Any] = {}
    if args.instances is not None:
        out["instances"] = parse_names("--instances", args.instances, sorted(load_catalog().instances))
    if args.nodes is not None:
        out["nodes"] = parse_nodes(args.nodes)
    if args.pricing is not None:
        out["pricing"] = parse_names("--pricing", args.pricing, PRICING_OPTIONS)
    try:
        out["deadline_s"] = parse_time(args.deadline) if args.deadline is not None else None
    except ConfigError as exc:
        raise ConfigError(f"--deadline: {exc.message} (expected a duration such as 60d or 1440 h)") from None
    try:
        out["budget_usd"] = parse_count(args.budget.lstrip("$")) if args.budget is not None else None
    except ConfigError as exc:
        raise ConfigError(f"--budget: {exc.message} (expected US dollars such as 5M or 750k)") from None
    axes = {"tp": _ints(args, "tp", "--tp"), "pp": _ints(args, "pp", "--pp"),
            "vpp": _ints(args, "vpp", "--vpp"),
            "cp": _ints(args, "cp", "--cp"), "ep": _ints(args, "ep", "--ep"),
            "micro_batch": _ints(args, "micro_batch", "--micro-batch"),
            "zero": _ints(args, "zero", "--zero", minimum=0),
            "offload_activations": _ints(args, "offload", "--offload", minimum=0),
            "global_batch": _ints(args, "global_batch", "--global-batch")}
    if axes["zero"] and max(axes["zero"]) > 3:
        raise ConfigError(f"--zero: {args.zero!r}: ZeRO stages are 0..3")
    if args.recompute is not None:
        axes["recompute"] = parse_names("--recompute", args.recompute, RECOMPUTE)
    out["axes"] = {k: v for k, v in axes.items() if v is not None}
    if args.top < 0:
        raise ConfigError(f"--top: {args.top} must be >= 0")
    out["top"] = args.top
    from .cli import jobs_problem

    if args.jobs is not None and jobs_problem(args.jobs):
        raise ConfigError(f"-j: {jobs_problem(args.jobs)}")
    out["jobs"] = args.jobs or (os.cpu_count() or 1)
    out["dask"] = args.dask
    out["cache_dir"] = False if args.no_cache else (args.cache or None)
    return out


def refuted(res) -> set[tuple]:
    """(plan key, pricing option) of the re-checked plans the simulation finds missing the goal (or over
    memory): the estimate ranked them, but they are no winner."""
    from .search.rank import goal_order

    return {(ch.estimate.key, ch.estimate.row["pricing_option"]) for ch in res.checked
            if not goal_order([ch.simulated], deadline_s=res.deadline_s, budget_usd=res.budget_usd)}


def render(res, sc) -> str:
    """The report of a search (see the module docstring)."""
    c = res.counts
    sp = res.space
    reasons = ", ".join(f"{f} {n:,}" for f, n in res.rule_reasons.most_common(4))
    batches = f" x {len(sp.global_batch)} global batches" if len(sp.global_batch) > 1 else ""
    lines = [f"search {sc.name}: {len(res.records):,} plans over {len(sp.instance)} instance type(s) x "
             f"{len(sp.nodes)} node count(s){batches}, priced {', '.join(sp.pricing)}; {c['ok']:,} fit and were "
             f"costed, "
             f"{c['memory']:,} do not fit in memory, {c['rule']:,} refused before costing"
             + (f" ({reasons})" if reasons else "")
             + f"; {res.elapsed_s:.1f} s, {res.plans_per_s:,.0f} plans/s, {res.cached:,} from the cache"]
    tokens = sc.workload.train_tokens
    from .units import format_quantity

    goal = {"deadline": f"the cheapest plan training {format_quantity(tokens, 'count')} tokens within "
                        f"{_days(res.deadline_s)}",
            "budget": f"the fastest plan training {format_quantity(tokens, 'count')} tokens within "
                      f"{_money(res.budget_usd)}",
            "deadline+budget": f"the cheapest plan within {_days(res.deadline_s)} and "
                               f"{_money(res.budget_usd)}",
            "frontier": f"the time/cost frontier of training {format_quantity(tokens, 'count')} tokens",
            }[res.goal]
    lines.append(f"goal: {goal}")
    lines.append("")
    fr = res.frontier
    shown = fr if len(fr) <= FRONTIER_ROWS else [fr[round(i * (len(fr) - 1) / (FRONTIER_ROWS - 1))]
                                                 for i in range(FRONTIER_ROWS)]
    lines.append(f"frontier, time to train against cost (estimate; {len(fr)} plan{'' if len(fr) == 1 else 's'}"
                 + (f", {len(shown)} shown" if len(shown) < len(fr) else "") + "):")
    lines += [f"  {_line(r, why=False)}" for r in shown] or ["  (no costed plan has a price)"]
    lines.append("")
    if not res.ordered:
        if res.goal == "frontier":
            lines.append("no plan meets the goal")
            return "\n".join(lines)
        lines.append(f"no plan meets the goal (widen --nodes, --instances or the goal; {_batch_hint(res, sc)}); "
                     "nearest per instance type:")
        lines += [f"  {text}" for text in _missed(res)]
        return "\n".join(lines)
    label = "cheapest in time" if res.goal.startswith("deadline") else "fastest"
    missed = refuted(res)
    note = "  [misses the goal when simulated: no winner]"
    lines.append(f"best per instance type ({label}, estimate):")
    lines += [f"  {_line(r)}" + (note if (r.key, r.row["pricing_option"]) in missed else "")
              for r in res.winners.values()]
    lines += [f"  {text}" for text in _missed(res)]
    if res.checked:
        lines.append("")
        lines.append("re-checked by the discrete-event simulation (estimate -> simulation):")
        for ch in res.checked:
            e, s = ch.estimate.row, ch.simulated.row
            lines.append(f"  {e['instance']} x{e['nodes']}  {_plan_text(ch.estimate.key)}  "
                         f"{e['pricing_option']}: "
                         f"train {_days(e['time_to_train_s'])} -> {_days(s['time_to_train_s'])}, "
                         f"{_money(e['cost_usd'])} -> {_money(s['cost_usd'])}"
                         + (note if (ch.estimate.key, e["pricing_option"]) in missed else ""))
    lines.append("")
    if res.winner is not None:
        lines.append(f"winner (simulated): {_line(res.winner.simulated)}")
    elif res.checked:
        lines.append("winner: none of the re-checked plans meets the goal when simulated "
                     f"(best by estimate: {_line(res.ordered[0])})")
    else:
        lines.append(f"winner (estimate): {_line(res.ordered[0])}")
    return "\n".join(lines)


def _batch_hint(res, sc) -> str:
    """Where the global batch stood: the scenario's alone (``--global-batch`` tries others) or those tried."""
    tried = res.space.global_batch
    if tried == (sc.workload.global_batch,):
        gb = sc.workload.global_batch
        return (f"the global batch is held at the scenario's {gb:,} sequences: --global-batch "
                f"{gb},{2 * gb},{4 * gb} tries others")
    return f"global batches tried: {', '.join(f'{g:,}' for g in tried)} sequences (widen --global-batch)"


def _missed(res) -> list[str]:
    """A line for each searched instance type with no plan meeting the goal: its nearest plan (the
    fastest for a deadline, the cheapest for a budget), or why it has none."""
    from .search.rank import runnable

    out = []
    for inst in sorted(set(res.space.instance) - set(res.winners)):
        mine = [r for r in runnable(res.ranked) if r.row["instance"] == inst]
        if not mine:
            out.append(f"{inst}: no plan fits and has a price")
            continue
        by_cost = res.goal == "budget"
        near = min(mine, key=lambda r: (r.cost, r.time_s) if by_cost else (r.time_s, r.cost))
        out.append(f"{inst}: none meets the goal; {'cheapest' if by_cost else 'fastest'}: "
                   f"{_line(near, why=False)}")
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def write_winners(res, base, directory: str) -> list[Path]:
    """The overall winner and each instance's winner as runnable scenario files in ``directory`` (not those
    the discrete-event re-check finds missing the goal)."""
    import yaml

    from .scenario import scenario_to_mapping, with_plan
    from .search.evaluate import Evaluator

    ev = Evaluator(base)
    picks = []
    if res.winner is not None:
        picks.append(res.winner.simulated)
    missed = refuted(res)     # a per-instance winner the simulation finds missing the goal is not written
    picks += [r for r in res.winners.values() if (r.key, r.row["pricing_option"]) not in missed
              and all(r.key != p.key or r.row["pricing_option"] != p.row["pricing_option"] for p in picks)]
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in picks:
        row = r.row
        name = _slug(f"{base.name}-{row['instance']}-x{row['nodes']}-{_plan_text(r.key)}-"
                     f"{row['pricing_option']}".replace(" ", "-"))
        option = row["pricing_option"]
        pricing = {"usd_per_hour": base.pricing.usd_per_hour} if option == "explicit" else option
        sc = with_plan(ev.variant(r.key), pricing=pricing)
        sc = dataclasses.replace(sc, name=name,
                                 description=f"found by fmsim search from {base.file or base.name}: {r.why}")
        path = out_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(scenario_to_mapping(sc), sort_keys=False), encoding="utf-8")
        paths.append(path)
    return paths


def _progress_bar(enabled: bool | None):
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=0, unit="plan", file=sys.stderr, dynamic_ncols=True, mininterval=0.5, smoothing=0.1)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
            bar.n = done
            bar.refresh()
            return
        bar.update(done - bar.n)

    return bar, update


def run(args: argparse.Namespace) -> int:
    from . import api
    from .scenario import load_scenario, parse_set_option
    from .search.executors import SearchInterrupted

    overrides = dict(parse_set_option(s) for s in args.set)
    sc = load_scenario(args.scenario, overrides=overrides or None)
    if sc.workload.kind not in ("pretrain", "finetune"):
        raise ConfigError(f"fmsim search plans training (kind pretrain or finetune), not "
                          f"{sc.workload.kind!r} (serving: fmsim plan-capacity SCENARIO --qps Q)",
                          file=sc.file, field="workload.kind")
    kwargs = search_args(args)

    stops: list[int] = []

    def stop(signum, _frame):
        # raised where the signal lands; if that is a callback whose exceptions Python ignores (distributed's
        # gc diagnosis), the next chunk's progress call raises it again, so a stop is never lost
        stops.append(signum)
        raise SearchInterrupted(signum)

    bar, update = _progress_bar(args.progress)

    def progress(done: int, total: int) -> None:
        if stops:
            raise SearchInterrupted(stops[0])
        if update is not None:
            update(done, total)

    hook = sys.unraisablehook

    def quiet(unraisable) -> None:    # a stop swallowed by such a callback: the progress call raises it again
        if not isinstance(unraisable.exc_value, SearchInterrupted):
            hook(unraisable)

    sys.unraisablehook = quiet
    previous = signal.signal(signal.SIGTERM, stop)
    previous_int = signal.signal(signal.SIGINT, stop)
    try:
        res = api.search(sc, progress=progress, **kwargs)
        if stops:                      # swallowed after the last chunk: still a stop
            raise SearchInterrupted(stops[0])
    except (KeyboardInterrupt, SearchInterrupted):
        if bar is not None:
            bar.close()
        print("search stopped; " + ("nothing kept (--no-cache)" if args.no_cache else
                                    "the plans it finished are cached: run the same command to continue"),
              file=sys.stderr)
        return EXIT_STOPPED
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        sys.unraisablehook = hook
        if bar is not None:
            bar.close()
    # with --csv - the CSV owns stdout: the report goes to stderr
    print(render(res, sc), file=sys.stderr if args.csv == "-" else sys.stdout)
    if args.csv:
        from .export import write_rows_csv

        write_rows_csv(res.rows(), args.csv)
    if args.yaml_dir:
        from .search.driver import _base

        paths = write_winners(res, _base(sc), args.yaml_dir)
        print(f"wrote {len(paths)} scenario file(s) to {args.yaml_dir}")
    return EXIT_OK
