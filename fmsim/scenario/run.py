"""The sections about running and paying for a job: ``pricing:`` (:class:`Pricing`), ``checkpoint:``
(:class:`Checkpoint`) and ``reliability:`` (:class:`Reliability`), their keys and readers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..catalog import PRICING_OPTIONS, load_catalog, suggest
from ..units import parse_time
from .reader import _Section, _what, float_number


CHECKPOINT_KEYS = ("every", "async", "grads", "keep", "staging", "writers", "master_only")
#: how an asynchronous save copies each rank's shard to host memory (fmsim.workloads.checkpointing)
STAGING_MODES = ("pinned", "pageable", "overlapped")
#: which ranks write: all (replicated tensors spread over their replicas) or the first replica only
CHECKPOINT_WRITERS = ("all", "first-replica")
RELIABILITY_KEYS = ("node_mtbf", "restart", "fleet", "rates", "run_length", "trials")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pricing:
    """A catalog purchase option, or a fixed price per instance-hour; exactly one is set."""

    option: str | None = "on-demand"
    usd_per_hour: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    every_s: float
    async_: bool = False
    grads: bool = False          # save the fp32 gradients too
    keep: int = 1                # checkpoints kept on the storage (priced)
    staging: str = "pinned"      # async device -> host copy: pinned | pageable | overlapped
    writers: str = "all"         # all | first-replica (only the first data-parallel replica writes)
    master_only: bool = False    # the parameters are the fp32 masters (FSDP): no separate bf16 copy saved


@dataclass(frozen=True, slots=True, kw_only=True)
class Reliability:
    restart_s: float
    node_mtbf_s: float | None = None       # v1: every node alike; else per-component fleet rates
    fleet: str | None = None               # hardware_catalog/failure_rates.yaml [llama3-405b-h100]
    rates: Mapping[str, float] = field(default_factory=dict)  # component -> interruptions per unit per day
    run_length_s: float | None = None      # wall-clock length to replay (else until train_tokens are done)
    trials: int = 200


def _pricing(top: _Section) -> Pricing:
    raw = top.raw("pricing", "on-demand")
    if isinstance(raw, str):
        if raw not in PRICING_OPTIONS:
            raise top.err("pricing", f"{raw!r} is not a pricing option{suggest(raw, PRICING_OPTIONS)}")
        return Pricing(option=raw, usd_per_hour=None)
    if isinstance(raw, Mapping):
        sec = _Section(raw, top.file, "pricing", ("usd_per_hour",))
        price = sec.quantity("usd_per_hour", float_number, expected="US dollars per instance-hour, e.g. 40")
        return Pricing(option=None, usd_per_hour=price)
    raise top.err(
        "pricing", f"got {_what(raw)} (expected one of {', '.join(PRICING_OPTIONS)} or {{usd_per_hour: N}})"
    )


def _checkpoint(top: _Section) -> Checkpoint | None:
    sec = top.section("checkpoint", CHECKPOINT_KEYS)
    if sec is None:
        return None
    return Checkpoint(
        every_s=sec.quantity("every", parse_time, expected="a duration like '30 min'"),
        async_=sec.boolean("async", False),
        grads=sec.boolean("grads", False),
        keep=sec.integer("keep", 1, minimum=1, maximum=10_000),
        staging=sec.choice("staging", STAGING_MODES, "pinned"),
        writers=sec.choice("writers", CHECKPOINT_WRITERS, "all"),
        master_only=sec.boolean("master_only", False),
    )


def _reliability(top: _Section) -> Reliability | None:
    sec = top.section("reliability", RELIABILITY_KEYS)
    if sec is None:
        return None
    restart = sec.quantity("restart", parse_time, minimum=0.0, inclusive=True,
                           expected="a duration like '10 min'")
    if sec.has("node_mtbf") and (sec.has("fleet") or sec.has("rates")):
        raise sec.err("node_mtbf", "give node_mtbf (every node alike) or fleet/rates (per component), "
                                   "not both")
    fleet = sec.text("fleet", None, nonempty=True)
    if fleet is not None:
        fleets = load_catalog().extra.get("failure_rates", {})
        if fleet not in fleets:
            raise sec.err("fleet", f"unknown failure-rate fleet {fleet!r}{suggest(fleet, list(fleets))}")
    rates: dict[str, float] = {}
    if sec.has("rates"):
        rs = sec.raw("rates")
        if not isinstance(rs, Mapping) or not rs:
            raise sec.err("rates", f"got {_what(rs)} (expected a mapping component: interruptions per "
                                   "unit per day)")
        for comp, v in rs.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise sec.err(f"rates.{comp}",
                              f"got {_what(v)} (expected interruptions per unit per day, >= 0)")
            rates[str(comp)] = float(v)
    return Reliability(
        node_mtbf_s=sec.quantity("node_mtbf", parse_time, None, expected="a duration like '1000 h'"),
        restart_s=restart,
        fleet=fleet,
        rates=rates,
        run_length_s=sec.quantity("run_length", parse_time, None, expected="a duration like '54 days'"),
        trials=sec.integer("trials", 200, minimum=1, maximum=10_000),
    )
