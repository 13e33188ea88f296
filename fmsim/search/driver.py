"""The training plan search, start to end: enumerate, look up the cache, evaluate, rank, re-check.

Owns :func:`search_training` (``fmsim.search`` for training kinds) and :class:`SearchResult`. The
steps: the candidate plans of the :class:`~fmsim.search.space.SearchSpace`; the records the cache holds
for them already; the rest evaluated in chunks (:mod:`fmsim.search.executors`), each chunk cached as it
completes; every costed plan that fits priced under each pricing option; the goal's order, the
time/cost Pareto frontier and the best plan of each instance type (:mod:`fmsim.search.rank`); and the
best ``top`` plans (and each instance's winner) simulated with the discrete-event engine, whose numbers
then decide the winner.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .cache import ResultCache, context_key, default_cache_dir, plan_text
from .evaluate import Evaluator
from .executors import run_groups
from .rank import EXPLICIT, PriceBook, Ranked, goal_order, pareto_frontier, priced, winners_by_instance
from .space import AXES, SearchSpace, candidates, default_space, parse_nodes, plan_dict

#: refuse a search space larger than this (memory and time stay bounded; narrow the axes instead)
MAX_PLANS = 5_000_000


@dataclass(frozen=True, slots=True)
class Checked:
    """A plan the discrete-event simulation re-checked: the estimate's ranking entry and the DES's."""

    estimate: Ranked
    simulated: Ranked


@dataclass(slots=True, kw_only=True)
class SearchResult:
    """What a search found (see the module docstring); ``records`` in plan-key order."""

    space: SearchSpace
    goal: str                                   # deadline | budget | deadline+budget | frontier
    deadline_s: float | None
    budget_usd: float | None
    records: list[tuple[tuple, dict[str, Any]]]
    cached: int                                 # records found in the cache
    elapsed_s: float
    ranked: list[Ranked] = field(default_factory=list)     # every costed, fitting plan x pricing option
    ordered: list[Ranked] = field(default_factory=list)    # those meeting the goal, best first
    frontier: list[Ranked] = field(default_factory=list)
    winners: dict[str, Ranked] = field(default_factory=dict)   # by instance, estimate's order
    checked: list[Checked] = field(default_factory=list)
    winner: Checked | None = None
    catalog: Any = field(default=None, repr=False)              # prices the rows
    explicit_usd_per_hour: float | None = None                  # the scenario's fixed price, if it has one
    _book: Any = field(default=None, repr=False, compare=False)  # the catalog's prices, memoised (PriceBook)

    @property
    def counts(self) -> Counter:
        """Plans by status: ok, memory (does not fit), rule (refused before costing)."""
        return Counter(rec["status"] for _, rec in self.records)

    @property
    def rule_reasons(self) -> Counter:
        """Refused plans by the field whose rule refused them."""
        return Counter(rec.get("field") or "?" for _, rec in self.records if rec["status"] == "rule")

    @property
    def plans_per_s(self) -> float:
        evaluated = len(self.records) - self.cached
        return evaluated / self.elapsed_s if self.elapsed_s > 0 else math.inf

    @staticmethod
    def plan(key: Sequence) -> dict[str, Any]:
        """A plan key as ``{axis: value}`` (axes: :data:`fmsim.search.AXES`)."""
        return plan_dict(tuple(key))

    def rows(self) -> list[dict[str, Any]]:
        """Every costed plan's result row (fitting or not) under each pricing option, plan-key order."""
        out = []
        for _key, rec in self.records:
            if "row" in rec:
                out.extend(self._priced(rec["row"], opt) for opt in self.space.pricing)
        return out

    def _priced(self, row: Mapping[str, Any], option: str) -> dict[str, Any]:
        if not isinstance(self._book, PriceBook) or self._book.catalog is not self.catalog:
            self._book = PriceBook(self.catalog)
        return priced(row, option, self._book, self.explicit_usd_per_hour)


def _base(sc):
    """The scenario searched: without its measurement and regression bands (they describe its own plan)."""
    return dataclasses.replace(sc, measured={}, measured_source="", measured_notes={}, expect={})


#: the plan key's layout axes (tp .. micro_batch) and modes (recompute, offloading): what a group shares
_LAYOUT, _MODES = slice(AXES.index("tp"), AXES.index("zero")), slice(AXES.index("recompute"),
                                                                     AXES.index("global_batch"))
assert AXES[_LAYOUT] == ("tp", "pp", "vpp", "cp", "ep", "micro_batch")
assert AXES[_MODES] == ("recompute", "offload_activations")


def _by_shared_work(keys: Sequence) -> list[list]:
    """``keys`` in groups of the plans that share work, in order of first appearance: the same layout (tp,
    pp, vpp, cp, ep, micro-batch, recompute, offloading) on every instance type, node count, ZeRO stage and
    global batch (a micro-batch's work is the same whatever the batch; only the micro-batches per step
    change). Plans on one instance share their stage costs and all of them their activation memory (the
    estimate's caches live in each process), so a worker that gets a group whole costs each piece once
    instead of every worker costing every layout again. The records are put back in plan order after."""
    groups: dict[tuple, list] = {}
    for k in keys:
        groups.setdefault((*k[_LAYOUT], *k[_MODES]), []).append(k)
    return list(groups.values())


#: the young generation's collection threshold while a search costs its plans (CPython's default is 700
#: allocations): the search keeps thousands of memo entries alive (the estimate's caches), which every
#: older-generation collection walks again; collecting less often, at a bounded 10,000 allocations, cost
#: the bench's cold search 2-3 % of its CPU time in collections instead of 5-7 % (gc callbacks, measured
#: 2026-12-02). Restored after.
GC_YOUNG_THRESHOLD = 10_000


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    old = gc.get_threshold()
    if old[0] == 0 or old[0] >= GC_YOUNG_THRESHOLD:     # collection off, or already as rare
        yield
        return
    gc.set_threshold(GC_YOUNG_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def search_training(sc, *, instances: Sequence[str] | None = None, nodes: Sequence[int] | None = None,
                    pricing: Sequence[str] | None = None, deadline_s: float | None = None,
                    budget_usd: float | None = None, top: int = 3, jobs: int = 1, dask: Any = None,
                    cache_dir: Any = None, progress: Callable[[int, int], None] | None = None,
                    axes: Mapping[str, Sequence] | None = None) -> SearchResult:
    """Search training plans of ``sc`` (see the module docstring and docs/search.md).

    ``nodes``: node counts, or their ``--nodes`` text (``"8..1024"``, ``"8,12,16"``).
    ``axes``: values of the plan axes (:data:`fmsim.search.AXES` past instance and nodes), e.g.
    ``{"tp": (4, 8), "global_batch": (1024, 2048)}``; ``global_batch`` (sequences per step; default the
    scenario's) may be its ``--global-batch`` text. The batch's effect on convergence is not modelled:
    every batch trains the same ``train_tokens`` (docs/search.md).
    ``cache_dir``: a directory, ``None`` for the default user cache, or ``False`` for none.
    ``progress(done, total)`` is called as chunks complete (and once for the cached records).
    """
    from .. import api
    from ..catalog import PRICING_OPTIONS, load_catalog

    t0 = time.perf_counter()
    if isinstance(nodes, str):
        nodes = parse_nodes(nodes)
    if sc.workload.kind not in ("pretrain", "finetune"):
        raise ConfigError(f"training plan search needs kind pretrain or finetune, not {sc.workload.kind!r} "
                          "(serving: fmsim plan-capacity)", file=sc.file, field="workload.kind")
    if not sc.workload.train_tokens:
        raise ConfigError("is needed to compare plans by time and cost to train (expected e.g. "
                          "--set workload.train_tokens=15T)", file=sc.file, field="workload.train_tokens")
    for name, value in (("deadline", deadline_s), ("budget", budget_usd)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--{name}: {value!r} must be a positive number")
    cat = load_catalog()
    for inst in instances or ():
        cat.instance(inst)          # unknown names: ConfigError with a suggestion
    explicit = sc.pricing.usd_per_hour if sc.pricing.option is None else None
    if pricing:
        for opt in pricing:
            if opt not in PRICING_OPTIONS:
                from ..catalog import suggest
                raise ConfigError(f"--pricing: unknown option {opt!r}{suggest(opt, PRICING_OPTIONS)}")
    elif explicit is not None:
        pricing = (EXPLICIT,)
    base = _base(sc)
    space = default_space(base, instances=instances, nodes=nodes, pricing=pricing, **dict(axes or {}))
    if space.size > MAX_PLANS:
        raise ConfigError(f"the search space holds {space.size:,} plans, more than {MAX_PLANS:,} (expected "
                          "fewer instances, node counts or axis values)")
    keys = list(candidates(space, moe=base.workload.model.moe is not None))
    if not keys:
        raise ConfigError("the search space is empty (no plan passes the axes' pairing rules)")

    directory = None if cache_dir is False else (cache_dir or default_cache_dir())
    cache = ResultCache(directory, context_key(base) if directory is not None else "")
    try:
        known = cache.load()
        found: dict[int, dict[str, Any]] = {}       # by position in keys
        if known:
            for i, k in enumerate(keys):
                rec = known.get(plan_text(k))
                if rec is not None:
                    found[i] = rec
        todo = [k for i, k in enumerate(keys) if i not in found] if found else keys
        done = len(found)
        # each costed plan priced as its record arrives (while the workers cost the rest), put in order after
        ranks: dict[tuple, list[Ranked]] = {}
        book = PriceBook(cat)

        def rank(pairs):
            for k, rec in pairs:
                if rec["status"] == "ok":
                    ranks[k] = [Ranked(k, priced(rec["row"], opt, book, explicit), rec.get("why", ""))
                                for opt in space.pricing]

        rank((keys[i], rec) for i, rec in found.items())
        if progress:
            progress(done, len(keys))

        def on_chunk(_i, chunk, recs):
            nonlocal done
            cache.put_many(zip(chunk, recs))
            rank(zip(chunk, recs))
            done += len(chunk)
            if progress:
                progress(done, len(keys))

        with _fewer_collections():
            new = run_groups(_by_shared_work(todo), base, jobs=jobs, dask=dask, on_chunk=on_chunk) if todo else []
    finally:
        cache.close()
    with _fewer_collections():      # the records in plan order and the rankings: many small objects at once
        fresh = {k: r for chunk, recs in new for k, r in zip(chunk, recs)}
        records = [(k, found[i] if i in found else fresh[k]) for i, k in enumerate(keys)]
        goals = (("deadline", deadline_s), ("budget", budget_usd))
        goal = "+".join(g for g, v in goals if v is not None) or "frontier"
        out = SearchResult(space=space, goal=goal, deadline_s=deadline_s, budget_usd=budget_usd, records=records,
                           cached=len(found), elapsed_s=0.0, catalog=cat, explicit_usd_per_hour=explicit,
                           _book=book)
        out.ranked = [r for k in keys if k in ranks for r in ranks[k]]
        out.ordered = goal_order(out.ranked, deadline_s=deadline_s, budget_usd=budget_usd)
        out.frontier = pareto_frontier(out.ranked)
        out.winners = winners_by_instance(out.ordered)
    out.elapsed_s = time.perf_counter() - t0

    # the discrete-event re-check: the best `top` plans and each instance's winner
    if top > 0 and out.ordered:
        ev = Evaluator(base, cat)
        picks: list[Ranked] = []
        for r in [*out.ordered[:top], *out.winners.values()]:
            if r not in picks:
                picks.append(r)
        for r in picks:
            res = api.simulate(ev.variant(r.key))
            row = out._priced(res.to_dict(), r.row["pricing_option"])
            out.checked.append(Checked(r, Ranked(r.key, row, res.details.get("bottleneck", r.why))))
        sims = goal_order([c.simulated for c in out.checked[:min(top, len(out.checked))]],
                          deadline_s=deadline_s, budget_usd=budget_usd)
        if sims:
            out.winner = next(c for c in out.checked if c.simulated is sims[0])
    return out
