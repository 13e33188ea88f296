"""Where a search's plans are evaluated: this process, local worker processes, or a Dask cluster.

Owns :func:`run_groups`: it cuts groups of plan keys (the plans that share work, side by side) into
chunks for the executor, evaluates them and hands each chunk's records to a callback as it completes (to
cache them and move the progress bar), and returns each chunk with its records -- the caller puts them
back in plan order, so the answer does not depend on the executor or the chunking. The chunks: one
process takes the groups in order, an eighth of the plans at a time (32 to :data:`SERIAL_CHUNK`); worker
processes get :data:`TASKS_PER_WORKER` chunks each (more for large searches, at most :data:`MAX_CHUNK` plans
a chunk), the groups dealt round-robin so that every chunk holds a like mix of cheap and costly plans and the
workers finish together, with few tasks to schedule and few results to send back; Dask workers get
:func:`affinity_chunks` (each worker its own run of shard shapes, and a tail for whoever is free). The executors:

* ``jobs == 1``: this process, chunk by chunk;
* ``jobs > 1``: a :class:`concurrent.futures.ProcessPoolExecutor` whose workers hold the base scenario
  once (initializer) and ignore Ctrl-C (the parent handles it);
* ``dask``: an address (``tcp://host:8786``), ``local:N`` (a ``LocalCluster`` of N single-threaded worker
  processes, started and stopped here) or a ``dask.distributed.Client`` the caller owns. dask is
  imported only here (the ``dist`` extra).

Stopping (Ctrl-C, or SIGTERM turned into :class:`SearchInterrupted` by the CLI) cancels what is queued
and terminates the worker processes before the exception goes on, so no worker outlives the search.
"""
from __future__ import annotations

import multiprocessing
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from itertools import zip_longest
from typing import Any

from ..errors import ConfigError
from .evaluate import Evaluator, evaluate_chunk, evaluate_chunk_packed, init_worker

Records = list[dict[str, Any]]
OnChunk = Callable[[int, Sequence, Records], None]


class SearchInterrupted(BaseException):
    """Raised (by the CLI's SIGTERM handler) to stop a search; a BaseException like KeyboardInterrupt."""


#: plans per chunk on one process (how often the cache is written and the progress bar moves)
SERIAL_CHUNK = 512
#: chunks per worker process or Dask worker, and the most plans in one chunk
TASKS_PER_WORKER = 4
MAX_CHUNK = 1024


def deal(groups: Sequence[Sequence], tasks: int) -> list[list]:
    """``groups`` dealt round-robin into at most ``tasks`` chunks (each group whole, in order)."""
    out: list[list] = [[] for _ in range(max(1, min(tasks, len(groups))))]
    for i, g in enumerate(groups):
        out[i % len(out)].extend(g)
    return [c for c in out if c]


def _worker_chunks(groups: Sequence[Sequence], workers: int) -> list[list]:
    n = sum(len(g) for g in groups)
    return deal(groups, max(TASKS_PER_WORKER * workers, -(-n // MAX_CHUNK)))


#: the axes of a plan key whose values fix its shard shapes (the estimate's caches key on them)
SHARD_AXES = ("tp", "pp", "cp", "ep")
#: the share of a Dask search's plans left as a tail of small chunks for whichever worker is free first
TAIL_SHARE = 0.25


def shard_key(key: Sequence) -> tuple:
    """The shard shape of plan ``key``: its (tp, pp, cp, ep)."""
    from .space import AXES

    return tuple(key[AXES.index(a)] for a in SHARD_AXES)


def affinity_chunks(groups: Sequence[Sequence], workers: int) -> list[tuple[list, int | None]]:
    """``groups`` (each whole) as (chunk, worker index) for ``workers`` workers, or (chunk, None) for the
    tail: the groups ordered by :func:`shard_key` (stable) and cut into ``workers`` runs of like plan count,
    so that each worker warms the estimate's caches of its own shard shapes only; the last
    :data:`TAIL_SHARE` of each run's plans is cut into :data:`TASKS_PER_WORKER` small chunks any worker
    takes (dealt, so every tail chunk is a like mix), which evens out what the plan counts do not. A
    worker's own part is dealt into ``TASKS_PER_WORKER - 1`` chunks (more past :data:`MAX_CHUNK` plans)."""
    ordered = sorted(groups, key=lambda g: shard_key(g[0]))
    total = sum(len(g) for g in ordered)
    runs: list[list] = [[] for _ in range(max(1, workers))]
    seen = 0
    for g in ordered:
        runs[min(len(runs) - 1, seen * len(runs) // max(1, total))].append(g)
        seen += len(g)
    own: list[tuple[list, int | None]] = []
    tails: list[list] = []
    for w, run in enumerate(runs):
        n = sum(len(g) for g in run)
        cut, kept = 0, 0
        while cut < len(run) and kept + len(run[cut]) <= n * (1 - TAIL_SHARE):
            kept += len(run[cut])
            cut += 1
        head, tail = run[:cut], run[cut:]
        tasks = max(TASKS_PER_WORKER - 1, -(-kept // MAX_CHUNK))
        own.extend((c, w) for c in deal(head, tasks))
        tails.append(deal(tail, max(TASKS_PER_WORKER, -(-(n - kept) // MAX_CHUNK))))
    # the tails interleaved by run: whichever worker is free takes the next, from any run
    tail_chunks = [c for row in zip_longest(*tails) for c in row if c is not None]
    return [*own, *((c, None) for c in tail_chunks)]


def run_groups(groups: Sequence[Sequence], base, *, jobs: int = 1, dask: Any = None,
               on_chunk: OnChunk | None = None) -> list[tuple[list, Records]]:
    """(chunk of plan keys, their records) for every plan of ``groups`` (see the module docstring)."""
    if dask is not None:
        return _run_dask(groups, base, dask, on_chunk)
    if jobs <= 1:
        keys = [k for g in groups for k in g]
        size = max(32, min(SERIAL_CHUNK, len(keys) // 8))
        chunks = [keys[i:i + size] for i in range(0, len(keys), size)]
        ev = Evaluator(base)
        out: list[tuple[list, Records]] = []
        for i, chunk in enumerate(chunks):
            recs = [ev(k) for k in chunk]
            if on_chunk:
                on_chunk(i, chunk, recs)
            out.append((chunk, recs))
        return out
    chunks = _worker_chunks(groups, jobs)
    return list(zip(chunks, _run_processes(chunks, base, jobs, on_chunk)))


def _mp_context():
    # fork shares the loaded catalogs with the workers at no cost; elsewhere spawn (macOS, Windows)
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _run_processes(chunks: Sequence[Sequence], base, jobs: int, on_chunk: OnChunk | None) -> list[Records]:
    out: list[Records | None] = [None] * len(chunks)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=_mp_context(), initializer=init_worker,
                               initargs=(base,))
    clean = False
    try:
        futures = {pool.submit(evaluate_chunk, list(chunk)): i for i, chunk in enumerate(chunks)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=futures.get):
                i = futures[fut]
                out[i] = fut.result()
                if on_chunk:
                    on_chunk(i, chunks[i], out[i])
        clean = True
    finally:
        if clean:
            pool.shutdown(wait=True)
        else:
            _terminate(pool)
    return [r for r in out if r is not None]


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool`` now: cancel queued chunks, terminate its workers, wait for them to go."""
    # the executor offers no terminate(); its worker processes are in _processes (CPython 3.9+)
    procs = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


#: the settings of a LocalCluster started for a search (``local:N``): none of its housekeeping is wanted
#: by a search of a few CPU-bound tasks, and on a machine of few cores it competes with the workers --
#: no dashboard, no statistical profiler sampling each task's stack every 10 ms, and the event-loop tick,
#: the system monitor and each nanny's look at its worker's memory every second instead of every 20, 500
#: and 100 ms (a worker over its memory limit is still stopped, within a second). Measured here, idle:
#: 0.11 CPU s per second for the scheduler, client and 2 workers together by default, 0.02 so.
QUIET_CLUSTER = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                 "distributed.admin.system-monitor.interval": "1s",
                 "distributed.worker.memory.monitor-interval": "1s"}


def local_cluster(workers: int):
    """A ``LocalCluster`` of ``workers`` single-threaded worker processes, as ``--dask local:N`` starts it
    (:data:`QUIET_CLUSTER`; the workers take the settings from their nanny).

    Ctrl-C is this process's to handle (it stops the workers): a terminal sends it to the whole process
    group, and a worker interrupted as it starts prints a traceback and leaves the cluster half made. So
    the workers start with SIGINT ignored -- a disposition they inherit, and their preload
    (:func:`fmsim.search.evaluate.dask_setup`) keeps it -- which means that while they start (a second or
    two) this process ignores Ctrl-C too; the first one after stops the search."""
    import dask
    from dask.distributed import LocalCluster

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        with dask.config.set(QUIET_CLUSTER):
            # no dashboard; the scheduler's bare HTTP server (health, metrics) on any free port, not on
            # 8787, which another cluster on the machine may hold (a warning on stderr each time)
            return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                                preload=["fmsim.search.evaluate"])
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def _dask_client(dask: Any):
    """(client, cluster to close or None, whether the client is ours to close, workers expected or 0)."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise ConfigError("--dask needs dask.distributed (pip install 'fmsim[dist]')") from None
    if isinstance(dask, Client):
        return dask, None, False, 0
    text = str(dask)
    if text.startswith("local:"):
        try:
            n = int(text.split(":", 1)[1])
            if n < 1:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--dask: {text!r} is not valid (expected local:N with N >= 1 workers, "
                              "or a scheduler address such as tcp://host:8786)") from None
        cluster = local_cluster(n)
        return Client(cluster), cluster, True, n
    try:
        return Client(text, timeout="10s"), None, True, 0
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"--dask: cannot reach a scheduler at {text!r} ({exc})") from None


#: how long a search waits for a scheduler's first worker (a cluster may start its workers on demand)
DASK_WORKER_WAIT_S = 60.0
#: once the first worker is there, how long the count may keep growing before the chunks are cut
DASK_SETTLE_S = 2.0


def _dask_threads(client, expected: int = 0) -> int:
    """Worker threads to cut chunks for: all ``expected`` workers of a cluster we started; on a scheduler
    with none yet, the first to join (at most :data:`DASK_WORKER_WAIT_S`) and those that join within
    :data:`DASK_SETTLE_S` of it -- not one worker's share of chunks for a cluster still starting. Workers
    that join later still get chunks (each at most :data:`MAX_CHUNK` plans) and the base from a peer."""
    threads = sum(client.nthreads().values())
    if expected and len(client.nthreads()) < expected:
        client.wait_for_workers(expected, timeout=DASK_WORKER_WAIT_S)
        return sum(client.nthreads().values())
    if threads:
        return threads
    try:
        client.wait_for_workers(1, timeout=DASK_WORKER_WAIT_S)
    except TimeoutError:
        raise ConfigError(f"--dask: no worker joined the scheduler at {client.scheduler.address} within "
                          f"{DASK_WORKER_WAIT_S:.0f} s (expected a cluster with workers)") from None
    end = time.monotonic() + DASK_SETTLE_S
    while time.monotonic() < end:
        time.sleep(0.25)
        now = sum(client.nthreads().values())
        if now == threads:
            break       # the count held still for a quarter second: the workers started together are in
        threads = now
    return max(1, sum(client.nthreads().values()))


def _run_dask(groups: Sequence[Sequence], base, dask: Any,
              on_chunk: OnChunk | None) -> list[tuple[list, Records]]:
    from dask.distributed import as_completed

    client, cluster, own, expected = _dask_client(dask)
    futures = []
    done = 0
    try:
        _dask_threads(client, expected)
        slots = [a for a, n in sorted(client.nthreads().items()) for _ in range(max(1, n))]
        placed = affinity_chunks(groups, len(slots))
        chunks = [c for c, _w in placed]
        out: list[Records | None] = [None] * len(chunks)
        # once per worker: the tasks carry plan keys only, and each worker builds one Evaluator on it
        base_f = client.scatter(base, broadcast=True, hash=False)
        # a worker's own chunks go to it (loosely: elsewhere if it is gone); the tail to whoever is free
        futures = [client.submit(evaluate_chunk_packed, pickle.dumps(c, protocol=pickle.HIGHEST_PROTOCOL),
                                 base=base_f, pure=False,
                                 workers=[slots[w]] if w is not None and slots else None,
                                 allow_other_workers=w is not None and bool(slots))
                   for c, w in placed]
        index = {f.key: i for i, f in enumerate(futures)}
        for fut, blob in as_completed(futures, with_results=True):
            i = index[fut.key]
            out[i] = recs = pickle.loads(blob)
            done += 1
            if on_chunk:
                on_chunk(i, chunks[i], recs)
    except BaseException as exc:
        # stopped (Ctrl-C, SIGTERM) or failed: what is queued is cancelled; the workers of a cluster we
        # started end now, not after their running chunk (a graceful close waits for it, 4 s, then kills)
        if futures:
            client.cancel(futures)
        if cluster is not None:
            _stop_workers(cluster)
        if isinstance(exc, Exception) and _other_environment(exc):
            from .. import __version__

            first = str(exc).strip().split("\n")[0].split(". ")[0].rstrip(".") or type(exc).__name__
            raise ConfigError(f"--dask: the cluster at {client.scheduler.address} cannot run this fmsim's "
                              f"tasks ({first}): expected its scheduler and workers to import the same fmsim "
                              f"({__version__}, from this checkout) and dask as this machine") from None
        raise
    finally:
        if own:
            client.close()
        if cluster is not None:
            cluster.close()
    return [(c, r) for c, r in zip(chunks, out) if r is not None]


def _other_environment(exc: Exception) -> bool:
    """Whether ``exc`` says the cluster's Python is not this one (Dask's own words for it, or a task that
    names what its fmsim lacks)."""
    text = str(exc)
    return (isinstance(exc, ImportError) or "Can't get attribute" in text
            or "different environments" in text or "Error during deserialization" in text)


def _stop_workers(cluster) -> None:
    """The worker processes of our ``cluster`` ended at once, together, quietly: each nanny closed (so it
    does not start its worker again) with half a second's grace before the kill, not the 4 s a graceful
    close waits for a running chunk; distributed's warning per killed worker is not for a stop asked for.
    The client and the cluster close after (then at once: measured 0.5 s from Ctrl-C, was 4-6 s)."""
    import asyncio
    import contextlib
    import logging

    async def kill_all():
        nannies = list(cluster.workers.values())
        await asyncio.gather(*(n.close(timeout=0.5, reason="search stopped") for n in nannies),
                             return_exceptions=True)

    log = logging.getLogger("distributed")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with contextlib.suppress(Exception):
            cluster.sync(kill_all)
    finally:
        log.setLevel(level)
