"""Evaluating one candidate plan: the reader's rules, then the analytical estimate.

Owns :class:`Evaluator`, which a worker process (or the search's own process) holds: the validated
base scenario, the catalog, and the clusters it has checked already (one per instance and node count).
For a plan key it derives the variant as :func:`fmsim.scenario.with_plan` does (one
:class:`~fmsim.scenario.variants.PlanVariants` per evaluator) -- the scenario reader's own
checks of what changed, so a plan refused here is refused when its file is loaded, with the same
message -- and costs it with :func:`fmsim.estimate`'s training estimate, asked for its lean result
(every column and the bottleneck; not the per-stage details the record would drop). What comes back is a plain, JSON-able record:

* ``{"status": "ok", "row": ..., "why": ...}``: the result columns (``Result.to_dict()``, as
  ``fmsim run --csv`` writes them, priced under the base scenario's pricing) and the bottleneck sentence;
* ``{"status": "memory", "row": ..., "reason": ...}``: costed, but the memory model says it does not fit;
* ``{"status": "rule", "field": ..., "reason": ...}``: refused by a rule of the reader or the planner
  (divisibility, batch, schedule) before anything was costed.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import FmsimError
from .space import plan_dict


class Evaluator:
    """Evaluates plan keys against one base scenario (see the module docstring)."""

    def __init__(self, base, catalog=None):
        from ..catalog import load_catalog

        from ..scenario.variants import PlanVariants

        self.base = base
        self.catalog = catalog if catalog is not None else load_catalog()
        self._variants = PlanVariants(base, catalog=self.catalog)
        self._clusters: dict[tuple[str, int], Any] = {}

    def _cluster(self, instance: str, nodes: int):
        from ..scenario import plan_cluster

        key = (instance, nodes)
        if key not in self._clusters:
            try:
                self._clusters[key] = plan_cluster(self.base, instance=instance, nodes=nodes,
                                                   catalog=self.catalog)
            except FmsimError as exc:
                self._clusters[key] = exc
        return self._clusters[key]

    def variant(self, key: Sequence):
        """The scenario of plan ``key`` (raises the reader's error when a rule refuses it)."""
        p = plan_dict(tuple(key))
        cluster = self._cluster(p["instance"], p["nodes"])
        if isinstance(cluster, Exception):
            raise cluster.with_traceback(None)
        return self._variants.derive(cluster=cluster, micro_batch=p["micro_batch"],
                                     global_batch=p["global_batch"],
                                     tp=p["tp"], pp=p["pp"], vpp=p["vpp"], cp=p["cp"], ep=p["ep"],
                                     zero=p["zero"],
                                     recompute=p["recompute"], offload_activations=p["offload_activations"],
                                     dp_shard="auto")

    def __call__(self, key: Sequence) -> dict[str, Any]:
        # fmsim.estimate asked for the lean result: the same row and bottleneck, without the details a record
        # leaves out
        from ..api import estimate

        try:
            sc = self.variant(key)
            res = estimate(sc, lean=True)
        except FmsimError as exc:
            return {"status": "rule", "field": getattr(exc, "field", None) or "",
                    "reason": getattr(exc, "message", None) or str(exc)}
        row = res.to_dict()
        if not row.get("fits", True):
            reason = res.details.get("memory_error") or res.details.get("bottleneck", "does not fit")
            return {"status": "memory", "row": row, "reason": reason}
        return {"status": "ok", "row": row, "why": res.details.get("bottleneck", "")}


# worker-process state: one Evaluator per process, set by the pool's initializer
_WORKER: Evaluator | None = None


def init_worker(base, ignore_sigint: bool = True) -> None:
    """Process-pool initializer: hold ``base`` once per worker; leave Ctrl-C to the parent."""
    global _WORKER
    import gc
    import signal

    from .driver import GC_YOUNG_THRESHOLD

    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a forked worker inherits the CLI's SIGTERM handler (which raises SearchInterrupted to stop the search):
    # the parent ends its workers with SIGTERM, so a worker keeps the default action -- it ends, with no
    # traceback on the search's stderr
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # the pool's process costs plans and nothing else: collected as the search's own process is while it
    # costs them (driver.GC_YOUNG_THRESHOLD)
    if 0 < gc.get_threshold()[0] < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    _WORKER = Evaluator(base)


def dask_setup(worker=None) -> None:
    """Preload of the worker processes of a cluster started for a search (``--dask local:N``,
    :func:`fmsim.search.executors.local_cluster`): Ctrl-C, which a terminal sends to the whole process
    group, is left to the search's own process, which stops the workers (as :func:`init_worker` does);
    and the worker's own log stays quiet: what a search needs from it comes back as a chunk's records or
    its exception, while a stop made it log a cancelled chunk, or a heartbeat lost as the scheduler went
    (the nanny, in the search's process, still reports a worker that dies)."""
    import logging
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("distributed").setLevel(logging.CRITICAL)


def evaluate_chunk(keys: Sequence[Sequence], base=None) -> list[dict[str, Any]]:
    """Records of ``keys``, in order (in a worker: its :class:`Evaluator`; or one built on ``base``)."""
    global _WORKER
    if base is not None and (_WORKER is None or _WORKER.base is not base):
        _WORKER = Evaluator(base)
    assert _WORKER is not None, "evaluate_chunk needs init_worker or a base scenario"
    return [_WORKER(k) for k in keys]


def evaluate_chunk_packed(keys: bytes | Sequence[Sequence], base=None) -> bytes:
    """:func:`evaluate_chunk` for a Dask task, its plan keys and its records each pickled whole: Dask sends
    a returned list element by element (its protocol serialises each item of a list apart: 5,185 frames and
    unpicklings in the client's event loop for 5,184 records, measured), one blob is one frame; and it walks
    a task's arguments item by item looking for futures to resolve (dask ``_task_spec.parse_input``: 0.26
    CPU s of the client's 0.45 for a 5,184-plan search, measured 2026-12-02), a blob is one item."""
    import pickle

    if isinstance(keys, bytes):
        keys = pickle.loads(keys)
    return pickle.dumps(evaluate_chunk(keys, base), protocol=pickle.HIGHEST_PROTOCOL)
