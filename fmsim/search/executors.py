"""Where a search's plans are evaluated: this process, local worker processes, or a Dask cluster.

Owns :func:`run_chunks`: it evaluates chunks of plan keys and hands each chunk's records to a callback
as it completes (to cache them and move the progress bar), and returns every record in the order of the
keys, whatever order the workers finished in -- so the answer does not depend on the executor. The
executors:

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
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from ..errors import ConfigError
from .evaluate import Evaluator, evaluate_chunk, init_worker

Records = list[dict[str, Any]]
OnChunk = Callable[[int, Sequence, Records], None]


class SearchInterrupted(BaseException):
    """Raised (by the CLI's SIGTERM handler) to stop a search; a BaseException like KeyboardInterrupt."""


def run_chunks(chunks: Sequence[Sequence], base, *, jobs: int = 1, dask: Any = None,
               on_chunk: OnChunk | None = None) -> list[Records]:
    """Records of each chunk of plan keys, in chunk order (see the module docstring)."""
    if dask is not None:
        return _run_dask(chunks, base, dask, on_chunk)
    if jobs <= 1 or len(chunks) <= 1:
        ev = Evaluator(base)
        out: list[Records] = []
        for i, chunk in enumerate(chunks):
            recs = [ev(k) for k in chunk]
            if on_chunk:
                on_chunk(i, chunk, recs)
            out.append(recs)
        return out
    return _run_processes(chunks, base, jobs, on_chunk)


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


def _dask_client(dask: Any):
    """(client, cluster to close or None, whether the client is ours to close)."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise ConfigError("--dask needs dask.distributed (pip install 'fmsim[dist]')") from None
    if isinstance(dask, Client):
        return dask, None, False
    text = str(dask)
    if text.startswith("local:"):
        try:
            n = int(text.split(":", 1)[1])
            if n < 1:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--dask: {text!r} is not valid (expected local:N with N >= 1 workers, "
                              "or a scheduler address such as tcp://host:8786)") from None
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        return Client(cluster), cluster, True
    try:
        return Client(text, timeout="10s"), None, True
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"--dask: cannot reach a scheduler at {text!r} ({exc})") from None


def _run_dask(chunks: Sequence[Sequence], base, dask: Any, on_chunk: OnChunk | None) -> list[Records]:
    from dask.distributed import as_completed

    client, cluster, own = _dask_client(dask)
    out: list[Records | None] = [None] * len(chunks)
    futures = []
    try:
        base_f = client.scatter(base, broadcast=True)
        futures = client.map(evaluate_chunk, [list(c) for c in chunks], base=base_f, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        for fut, recs in as_completed(futures, with_results=True):
            i = index[fut.key]
            out[i] = recs
            if on_chunk:
                on_chunk(i, chunks[i], recs)
    finally:
        if any(r is None for r in out):
            client.cancel(futures)
        if own:
            client.close()
        if cluster is not None:
            cluster.close()
    return [r for r in out if r is not None]
