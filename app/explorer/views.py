"""The plain rows the explorer's charts draw, from a result: the pipeline timeline (Gantt rows
from the Chrome trace), latency CDF points, memory per GPU by part and stage, step-time and
serving breakdowns. No fmsim call, no widget; re-exported by :mod:`explorer.logic`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .formats import finite

# A timeline with more rows than this is simplified (see timeline_rows).
TIMELINE_MAX_ROWS = 4_000



def _lane(name: str) -> tuple[tuple[int, int, str], str]:
    """Sort key and display name of a trace thread (stage N compute, its DP stream, sends)."""
    for prefix, rank, shown in (("stage", 0, "stage {} compute"), ("dp", 1, "stage {} DP comm")):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            n = int(name[len(prefix) :])
            return (n, rank, ""), shown.format(n)
    if name == "async":
        return (1 << 30, 0, name), "pipeline sends"
    return (1 << 30, 1, name), name


def timeline_rows(
    events: Sequence[Mapping[str, Any]], max_rows: int = TIMELINE_MAX_ROWS
) -> tuple[tuple[tuple[str, float, float, str, str], ...], str]:
    """Gantt rows ``(lane, start_s, end_s, category, label)`` from Chrome-trace events.

    Spans of one category that touch on a lane are merged. When that leaves more than
    ``max_rows`` rows the pipeline sends' lane is left out first; then, if still too many, each
    lane is cut into equal time bins; a bin at least 30 % busy shows the category that fills most
    of it (runs of equal bins merged), so the chart stays small whatever the step's size. The
    note says what was simplified.
    """
    names = {
        e.get("tid"): str(e.get("args", {}).get("name", e.get("tid")))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    spans = [e for e in events if e.get("ph") == "X" and float(e.get("dur", 0)) > 0]
    if not spans:
        return (), "The simulation recorded no timeline."
    by_lane: dict[str, list[tuple[float, float, str, str]]] = {}
    keys: dict[str, tuple[int, int, str]] = {}
    for e in spans:
        key, lane = _lane(names.get(e.get("tid"), str(e.get("tid"))))
        keys[lane] = key
        t0 = float(e["ts"]) * 1e-6
        by_lane.setdefault(lane, []).append(
            (t0, t0 + float(e["dur"]) * 1e-6, str(e.get("cat", "")), str(e.get("name", "")))
        )
    end = max(b for v in by_lane.values() for _, b, _, _ in v)
    tol = end * 1e-6
    merged: dict[str, list[tuple[float, float, str, str]]] = {}
    for lane, items in by_lane.items():
        out: list[list[Any]] = []
        for a, b, cat, label in sorted(items):
            if out and out[-1][2] == cat and a - out[-1][1] <= tol and b >= out[-1][1]:
                out[-1][1] = b
                out[-1][4] += 1
            else:
                out.append([a, b, cat, label, 1])
        merged[lane] = [(a, b, cat, label if n == 1 else f"{n} {cat} spans") for a, b, cat, label, n in out]
    notes = []
    if sum(len(v) for v in merged.values()) > max_rows and "pipeline sends" in merged:
        n = len(by_lane["pipeline sends"])
        del merged["pipeline sends"]
        notes.append(f"the {n:,} pipeline sends are left out")
    lanes = sorted(merged, key=lambda n: keys[n])
    if sum(len(v) for v in merged.values()) <= max_rows:
        rows = [(lane, a, b, c, lab) for lane in lanes for a, b, c, lab in merged[lane]]
        return tuple(rows), (f"{len(spans):,} simulated spans; " + "; ".join(notes) + ".") if notes else ""
    nbins = max(20, max_rows // len(lanes))
    width = end / nbins
    rows = []
    for lane in lanes:
        fill: list[dict[str, float]] = [{} for _ in range(nbins)]
        for a, b, cat, _ in merged[lane]:
            i0, i1 = int(a / width), min(nbins - 1, int(b / width))
            for i in range(max(0, i0), i1 + 1):
                lo, hi = max(a, i * width), min(b, (i + 1) * width)
                if hi > lo:
                    fill[i][cat] = fill[i].get(cat, 0.0) + (hi - lo)
        run: tuple[str, int] | None = None
        for i in range(nbins + 1):
            cat = ""
            if i < nbins and fill[i]:
                top = max(fill[i], key=lambda c: (fill[i][c], c))
                if sum(fill[i].values()) >= 0.3 * width:  # a mostly idle bin stays empty
                    cat = top
            if run is not None and cat != run[0]:
                n = i - run[1]
                rows.append((lane, run[1] * width, i * width, run[0], f"{run[0]} ({n} bin{'s' * (n > 1)})"))
                run = None
            if cat and run is None:
                run = (cat, i)
    notes.append(f"drawn in {nbins} time bins per lane, each showing what fills most of it")
    note = (
        f"{len(spans):,} simulated spans; "
        + "; ".join(notes)
        + ". `fmsim run --trace FILE` writes every span for Perfetto."
    )
    return tuple(rows), note


def latency_cdf(result: Any) -> tuple[list[dict[str, Any]], str]:
    """CDF points ``{metric, latency_s, quantile}`` of TTFT, TPOT and end-to-end latency.

    Uses the samples the serving simulator leaves in ``details["latency_samples"]`` (a mapping
    metric -> list of seconds) when there are any, else the percentiles among the metrics
    (p50/p90/p99). Returns ``(points, source)`` with ``source`` "samples" or "percentiles".
    """
    det = result.details if isinstance(getattr(result, "details", None), Mapping) else {}
    samples = det.get("latency_samples")
    points: list[dict[str, Any]] = []
    if isinstance(samples, Mapping) and samples:
        for metric in ("ttft", "tpot", "e2e"):
            xs = sorted(float(x) for x in samples.get(metric, ()) if finite(x) is not None)
            if not xs:
                continue
            n = len(xs)
            step = max(1, n // 200)
            for i in list(range(0, n, step)) + [n - 1]:
                points.append({"metric": metric, "latency_s": xs[i], "quantile": (i + 1) / n})
        if points:
            return points, "samples"
    for metric in ("ttft", "tpot", "e2e"):
        for q in (50, 90, 99):
            v = finite(result.metrics.get(f"{metric}_p{q}_s"))
            if v is not None:
                points.append({"metric": metric, "latency_s": v, "quantile": q / 100})
    return points, "percentiles"


def memory_rows(result: Any) -> list[dict[str, Any]]:
    """Bytes per GPU by part, per pipeline stage when the result has them (training)."""
    det = result.details if isinstance(result.details, Mapping) else {}
    stages = det.get("memory_by_stage")
    rows = []
    if isinstance(stages, Sequence) and stages and not isinstance(stages, str):
        for i, st in enumerate(stages):
            for part, b in st.items():
                if part != "total" and finite(b) and b > 0:
                    rows.append({"stage": f"stage {i}", "part": str(part), "bytes": float(b)})
        return rows
    for part, b in result.memory.items():
        if part not in ("hbm", "total") and finite(b) and b > 0:
            rows.append({"stage": "per GPU", "part": str(part), "bytes": float(b)})
    return rows


def hbm_bytes(result: Any) -> float | None:
    """HBM per GPU of the result's accelerator."""
    return finite(result.metrics.get("hbm_per_gpu_bytes")) or finite(result.memory.get("hbm"))


def breakdown_rows(results: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Step-time parts ``{run, part, seconds}`` of each ``(name, result)`` (training)."""
    rows = []
    for name, res in results:
        for part, s in res.breakdown.items():
            if finite(s) and s > 0:
                rows.append({"run": name, "part": str(part), "seconds": float(s)})
    return rows


def serving_parts(result: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Serving breakdowns as bar rows ``{run, part, seconds}``: where a request's time goes
    (``Result.breakdown``: queue, prefill, decode ...) and what one decode step is made of
    (``details["decode_step_s"]``, or older ``decode_step_*`` breakdown entries)."""
    request, step = [], []
    det = result.details if isinstance(result.details, Mapping) else {}
    parts = det.get("decode_step_s")
    if isinstance(parts, Mapping):
        for k, v in parts.items():
            if finite(v) and v > 0 and k not in ("step_s", "total_s", "step", "total"):
                step.append({"run": "decode step", "part": str(k).removesuffix("_s"), "seconds": float(v)})
    for k, v in result.breakdown.items():
        if not (finite(v) and v > 0):
            continue
        if k.startswith("decode_step_"):
            if k != "decode_step_s" and not isinstance(parts, Mapping):
                step.append(
                    {
                        "run": "decode step",
                        "part": k.removeprefix("decode_step_").removesuffix("_s"),
                        "seconds": float(v),
                    }
                )
        elif k != "prefill_alone_s":
            request.append({"run": "mean request", "part": k.removesuffix("_s"), "seconds": float(v)})
    return request, step
