"""Chrome / Perfetto traces (JSON object format, µs timestamps) of simulated runs: the events of a
:class:`~fmsim.engine.des.RunResult`'s spans and the file they go to. Shared by the training and RL
workloads' ``--trace`` (and the serving engine's file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .des import RunResult


def span_events(run: RunResult, tids: dict[str, int], pid: int = 0) -> list[dict[str, Any]]:
    """One complete ("X") event per span of ``run`` in start order; each stream gets the next thread id
    in ``tids`` (which the caller keeps, to name the threads)."""
    events = []
    for sp in sorted(run.spans, key=lambda x: (x.start_s, x.stream)):
        tid = tids.setdefault(sp.stream, len(tids))
        events.append({"name": sp.label, "cat": sp.category, "ph": "X", "pid": pid, "tid": tid,
                       "ts": sp.start_s * 1e6, "dur": (sp.end_s - sp.start_s) * 1e6})
    return events


def write_chrome_trace(path: str, events: list[dict[str, Any]]) -> None:
    """Write ``events`` as a trace file Perfetto and chrome://tracing open (milliseconds shown)."""
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


__all__ = ["span_events", "write_chrome_trace"]
