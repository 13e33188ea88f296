"""Flow-level network for the discrete-event engine: concurrent transfers share link bandwidth.

Owns :class:`FlowNetwork` (transfers over named links inside a simpy environment) and the pure
function :func:`max_min_rates` it calls. A transfer is a *flow*: a fixed set of links and a
number of bytes. Flows that overlap in time share every link max-min fairly (progressive
filling: raise all rates together, freeze the flows of a link as soon as it saturates; Bertsekas
& Gallager, "Data Networks", 2nd ed., 1992, §6.5 max-min fairness). Rates are recomputed whenever a flow starts
or ends -- once per instant, however many flows start or end in it -- and each flow's remaining
bytes drain at its current rate. The model is fluid (no packets, no congestion control), the
standard flow-level abstraction of SimGrid and of the ASTRA-sim analytical network backend.

Same inputs, same outputs: flows are kept in creation order and ties are broken by it.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import simpy

from ..errors import ConfigError

# A flow finishes when less than this fraction of its bytes (or 1e-6 bytes) remains: float drift
_DONE_REL = 1e-9
_DONE_ABS = 1e-6


def max_min_rates(flows: Mapping[Hashable, Sequence[Hashable]],
                  capacities: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Max-min fair rate of every flow (bytes/s) given the links each one crosses.

    Progressive filling with a heap of fair shares: the link offering the smallest share
    ``remaining capacity / unfrozen flows`` saturates first; its flows are frozen at that share,
    their bandwidth is taken off their other links, and the next link is considered. A flow with
    no links is unconstrained (``inf``). Runs in O((F·P + L) log L) for F flows of P links each.

    Raises
    ------
    ConfigError
        If a flow names a link that ``capacities`` lacks.
    """
    if len(flows) == 1:                                 # the common case: a flow alone gets its bottleneck
        ((fid, links),) = flows.items()
        for lk in links:
            if lk not in capacities:
                raise ConfigError(f"flow {fid!r} crosses unknown link {lk!r}")
        return {fid: min((float(capacities[lk]) for lk in links), default=math.inf)}
    rates: dict[Hashable, float] = {}
    on_link: dict[Hashable, list[Hashable]] = {}
    paths: dict[Hashable, tuple[Hashable, ...]] = {}
    for fid, links in flows.items():
        path = tuple(dict.fromkeys(links))          # a flow uses a link once
        if not path:
            rates[fid] = math.inf
            continue
        paths[fid] = path
        for lk in path:
            if lk not in capacities:
                raise ConfigError(f"flow {fid!r} crosses unknown link {lk!r}")
            on_link.setdefault(lk, []).append(fid)
    remaining = {lk: float(capacities[lk]) for lk in on_link}
    count = {lk: len(fs) for lk, fs in on_link.items()}
    order = {lk: i for i, lk in enumerate(on_link)}     # deterministic tie-break
    heap = [(remaining[lk] / count[lk], order[lk], lk) for lk in on_link]
    heapq.heapify(heap)
    while heap:
        share, _, lk = heapq.heappop(heap)
        if count[lk] == 0 or share != remaining[lk] / count[lk]:
            continue                                   # stale entry
        share = max(share, 0.0)
        touched = set()
        for fid in on_link[lk]:
            if fid in rates:
                continue
            rates[fid] = share
            for other in paths[fid]:
                remaining[other] -= share
                count[other] -= 1
                touched.add(other)
        for other in touched:
            if other != lk and count[other] > 0:
                heapq.heappush(heap, (remaining[other] / count[other], order[other], other))
    return {fid: rates[fid] for fid in flows}


@dataclass(slots=True)
class _Flow:
    links: tuple[Hashable, ...]
    size: float
    remaining: float
    done: simpy.Event
    rate: float = 0.0
    close: float = 0.0       # remaining bytes at or under which the flow is done (_DONE_REL, _DONE_ABS)


class FlowNetwork:
    """Links of given capacity (bytes/s) shared max-min fairly by the transfers in flight.

    Parameters
    ----------
    env:
        The simpy environment the transfers live in.
    capacities:
        Capacity of every link, keyed by any hashable id (a directed edge ``(u, v)`` of
        :class:`fmsim.hardware.topology.Topology`, a NIC name ...).
    """

    def __init__(self, env: simpy.Environment, capacities: Mapping[Hashable, float]):
        for lk, c in capacities.items():
            if not (isinstance(c, (int, float)) and math.isfinite(c) and c > 0):
                raise ConfigError(f"link {lk!r} capacity must be a positive finite number of bytes/s, "
                                  f"got {c!r}")
        self.env = env
        self.capacities = dict(capacities)
        self._flows: dict[int, _Flow] = {}
        self._ids = 0
        self._last = env.now
        self._version = 0
        self._pending = False
        self._on_link: dict[Hashable, dict[int, None]] = {}    # link -> flows on it, ordered
        self._dirty: dict[Hashable, None] = {}                  # links whose flows changed
        self._paths: dict[tuple[Hashable, ...], tuple[Hashable, ...]] = {}  # links -> checked, each once
        self._alone: dict[tuple[Hashable, ...], float] = {}     # links -> rate of a flow alone on them
        self.num_recomputes = 0

    @property
    def active(self) -> int:
        """Flows in flight."""
        return len(self._flows)

    def rates(self) -> dict[int, float]:
        """Current rate of each flow in flight, by creation order id."""
        return {fid: f.rate for fid, f in self._flows.items()}

    def transfer(self, links: Sequence[Hashable], size_bytes: float, latency_s: float = 0.0) -> simpy.Event:
        """Move ``size_bytes`` over ``links``; the returned event fires when the last byte arrives.

        The transfer starts to take bandwidth after ``latency_s`` (α-β: latency, then bytes at the
        fair-share rate). An empty transfer or one over no links completes after its latency.
        """
        path = self._paths.get(links) if isinstance(links, tuple) else None
        if path is None:
            path = tuple(dict.fromkeys(links))
            for lk in path:
                if lk not in self.capacities:
                    raise ConfigError(f"transfer over unknown link {lk!r}")
            if isinstance(links, tuple):
                self._paths[links] = path
        links = path
        if not (math.isfinite(size_bytes) and size_bytes >= 0):
            raise ConfigError(f"transfer size must be a finite number of bytes >= 0, got {size_bytes!r}")
        if not (math.isfinite(latency_s) and latency_s >= 0):
            raise ConfigError(f"transfer latency must be >= 0 s, got {latency_s!r}")
        done = self.env.event()
        if latency_s > 0:
            t = self.env.timeout(latency_s)
            t.callbacks.append(lambda _ev: self._start(links, float(size_bytes), done))
        else:
            self._start(links, float(size_bytes), done)
        return done

    # ------------------------------------------------------------------------------------------

    def _start(self, links: tuple[Hashable, ...], size: float, done: simpy.Event) -> None:
        if size <= 0 or not links:
            done.succeed()
            return
        self._advance()
        fid = self._ids
        self._ids += 1
        self._flows[fid] = _Flow(links, size, size, done, close=max(_DONE_REL * size, _DONE_ABS))
        for lk in links:
            self._on_link.setdefault(lk, {})[fid] = None
            self._dirty[lk] = None
        self._schedule_recompute()

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for f in self._flows.values():
                f.remaining -= f.rate * dt
        self._last = self.env.now

    def _schedule_recompute(self) -> None:
        # one recomputation per instant: every flow starting or ending at `now` is in it
        if not self._pending:
            self._pending = True
            ev = self.env.timeout(0)
            ev.callbacks.append(self._recompute)

    def _affected(self) -> list[int]:
        """Flows connected to a changed link through shared links: only their rates can change
        (max-min fairness decomposes over the connected components of the flow-link graph)."""
        seen: dict[int, None] = {}
        links = list(self._dirty)
        seen_links = set(links)
        while links:
            lk = links.pop()
            for fid in self._on_link.get(lk, ()):
                if fid not in seen:
                    seen[fid] = None
                    for other in self._flows[fid].links:
                        if other not in seen_links:
                            seen_links.add(other)
                            links.append(other)
        self._dirty.clear()
        return sorted(seen)

    def _recompute(self, _ev: simpy.Event | None = None) -> None:
        self._pending = False
        self._advance()
        self._version += 1
        self.num_recomputes += 1
        if not self._flows:
            self._dirty.clear()
            return
        affected = self._affected()
        if len(affected) == 1:                          # a flow alone: its bottleneck, once per set of links
            f = self._flows[affected[0]]
            rate = self._alone.get(f.links)
            if rate is None:
                rate = self._alone[f.links] = max_min_rates({affected[0]: f.links}, self.capacities)[affected[0]]
            f.rate = rate
        elif affected:
            rates = max_min_rates({fid: self._flows[fid].links for fid in affected}, self.capacities)
            for fid in affected:
                self._flows[fid].rate = rates[fid]
        t_next = math.inf
        for f in self._flows.values():
            if f.rate > 0:
                r = f.remaining
                t = (0.0 if 0.0 > r else r) / f.rate          # max(r, 0.0), as fast
                if t < t_next:
                    t_next = t
        if math.isfinite(t_next):
            ev = self.env.timeout(t_next)
            version = self._version
            ev.callbacks.append(lambda _e: self._on_finish(version))

    def _on_finish(self, version: int) -> None:
        if version != self._version:
            return                                     # rates changed since: a newer timer exists
        self._advance()
        soon = 1e-12 * max(1.0, self.env.now)
        finished = [fid for fid, f in self._flows.items()
                    if f.remaining <= f.close or (f.rate > 0 and f.remaining / f.rate <= soon)]
        for fid in finished:
            f = self._flows.pop(fid)
            for lk in f.links:
                del self._on_link[lk][fid]
                self._dirty[lk] = None
            f.done.succeed()
        self._schedule_recompute()


__all__ = ["FlowNetwork", "max_min_rates"]
