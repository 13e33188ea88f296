"""The Search page's tables (pure functions of a :class:`fmsim.search.SearchResult`; no widgets).

Owns what the page shows from one search: the time/cost points with the frontier marked, the best plan
per instance type, a tp x pp grid of step time for one instance type and node count (each cell the best
plan over the other axes, the global batch included; a cell with none says why: the rule that refused its plans, or memory), how
many nodes each instance type needs to train N tokens in D days (time to train scales with the tokens:
same step, more steps), and the Training page's knob values of a plan (to open it there as a what-if).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pandas as pd

DAY_S = 86400.0


def plan_dict(key: tuple) -> dict[str, Any]:
    """A plan key as ``{axis: value}`` (the search result's own reading of its keys)."""
    import fmsim

    return fmsim.search.SearchResult.plan(key)


def plan_label(key: tuple, option: str) -> str:
    p = plan_dict(key)
    text = f"{p['instance']} x{p['nodes']} tp{p['tp']} pp{p['pp']}"
    for axis in ("vpp", "cp", "ep"):
        if p[axis] > 1:
            text += f" {axis}{p[axis]}"
    return text + f" mb{p['micro_batch']} zero{p['zero']} {p['recompute']} gb{p['global_batch']} · {option}"


def points_frame(res) -> pd.DataFrame:
    """Every costed plan that fits, under every pricing option: days and dollars to train, frontier flag."""
    on_frontier = {(r.key, r.row["pricing_option"]) for r in res.frontier}
    rows = []
    for r in res.ranked:
        if not (math.isfinite(r.time_s) and math.isfinite(r.cost)):
            continue
        opt = r.row["pricing_option"]
        rows.append({"plan": plan_label(r.key, opt), "instance": r.row["instance"], "nodes": r.row["nodes"],
                     "pricing": opt, "days": r.time_s / DAY_S, "cost_usd": r.cost,
                     "step_time_s": r.row["step_time_s"], "mfu": r.row["mfu"],
                     "frontier": (r.key, opt) in on_frontier, "bottleneck": r.why})
    return pd.DataFrame(rows, columns=["plan", "instance", "nodes", "pricing", "days", "cost_usd",
                                       "step_time_s", "mfu", "frontier", "bottleneck"])


def winners_frame(res) -> pd.DataFrame:
    rows = [{"instance": name, "plan": plan_label(r.key, r.row["pricing_option"]), "days": r.time_s / DAY_S,
             "cost_usd": r.cost, "step_time_s": r.row["step_time_s"], "mfu": r.row["mfu"], "why": r.why}
            for name, r in res.winners.items()]
    return pd.DataFrame(rows, columns=["instance", "plan", "days", "cost_usd", "step_time_s", "mfu", "why"])


def heatmap_frame(res, instance: str, nodes: int) -> pd.DataFrame:
    """tp x pp cells for one instance type and node count: the fastest fitting plan's step time, or why
    none."""
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    why: dict[tuple[int, int], Counter] = {}
    for key, rec in res.records:
        p = plan_dict(key)
        if p["instance"] != instance or p["nodes"] != nodes:
            continue
        cell = (p["tp"], p["pp"])
        if rec["status"] == "ok":
            step = rec["row"]["step_time_s"]
            if cell not in cells or step < cells[cell]["step_time_s"]:
                cells[cell] = {"step_time_s": step, "plan": plan_label(key, rec["row"]["pricing_option"])}
        else:
            why.setdefault(cell, Counter())["does not fit in memory" if rec["status"] == "memory"
                                            else f"refused: {rec.get('field') or 'rule'}"] += 1
    rows = []
    for tp in res.space.tp:
        for pp in res.space.pp:
            c = cells.get((tp, pp))
            if c is not None:
                rows.append({"tp": tp, "pp": pp, "step_time_s": c["step_time_s"], "status": "fits",
                             "plan": c["plan"]})
            else:
                reason = why[(tp, pp)].most_common(1)[0][0] if (tp, pp) in why else "not enumerated"
                rows.append({"tp": tp, "pp": pp, "step_time_s": None, "status": reason, "plan": ""})
    return pd.DataFrame(rows, columns=["tp", "pp", "step_time_s", "status", "plan"])


def nodes_needed(res, tokens: float, days: float) -> pd.DataFrame:
    """Per instance type: the fewest searched nodes whose plan trains ``tokens`` within ``days``, its cost.

    A plan's time to train is its steps over the goodput: the tokens it was searched for are
    ``time_to_train * tokens_per_s * goodput``, and other token counts scale its time and cost alike."""
    best: dict[str, tuple] = {}
    for r in res.ranked:
        t, rate, good = r.time_s, r.row.get("tokens_per_s"), r.row.get("goodput")
        if not (math.isfinite(t) and rate and good):
            continue
        scale = tokens / (t * rate * good)
        need_days, cost = t * scale / DAY_S, r.cost * scale
        if need_days > days:
            continue
        cand = (r.row["nodes"], cost, need_days, plan_label(r.key, r.row["pricing_option"]))
        name = r.row["instance"]
        if name not in best or cand[:2] < best[name][:2]:
            best[name] = cand
    rows = [{"instance": k, "nodes": v[0], "plan": v[3], "days": v[2], "cost_usd": v[1]}
            for k, v in sorted(best.items())]
    return pd.DataFrame(rows, columns=["instance", "nodes", "plan", "days", "cost_usd"])


def training_knobs(key: tuple, option: str) -> dict[str, Any]:
    """The Training page's knob values (``train.<knob>``) giving plan ``key`` under pricing ``option``."""
    p = plan_dict(key)
    knobs = {"instance": p["instance"], "nodes": int(p["nodes"]), "tp": p["tp"], "pp": p["pp"],
             "vpp": p["vpp"], "cp": p["cp"], "ep": p["ep"], "micro_batch": int(p["micro_batch"]),
             "global_batch": int(p["global_batch"]),
             "zero": p["zero"],
             "recompute": p["recompute"], "recompute_layers": 0, "dp_shard": 0,
             "schedule": "interleaved" if p["vpp"] > 1 else "1f1b"}
    if option != "explicit":
        knobs["pricing"] = option
    return knobs
