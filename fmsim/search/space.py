"""What a training plan search enumerates: the axes, their default values, and the candidate plans.

Owns :class:`SearchSpace` (the values tried on each axis, the instances, node counts and pricing
options) and :func:`candidates`, the deterministic, lazily generated product of the axes in a fixed
order (instance, nodes, tp, pp, vpp, cp, ep, micro-batch, ZeRO, recompute, offload, global batch). Only pairings
that are refused by construction whatever the model are skipped here (``vpp > 1`` with ``pp == 1``,
``ep > 1`` on a dense model, offloading with pipeline stages or recompute: the scenario reader's own
rules, so skipping them changes no answer); every other rule is the reader's, applied in
:mod:`fmsim.search.prune`. Pricing is not an axis of the plan: it changes no step time, so each
costed plan is priced under every option afterwards.

The global batch (sequences per optimizer step) is an axis of the plan, last in its key, the scenario's
value alone unless told otherwise: a plan's time to train is ``train_tokens`` over its tokens per second
whatever its batch (a larger batch is fewer, longer steps), and the search models no effect of the batch
on convergence (the critical batch size: past it, more tokens are needed to reach the same loss).
"""
from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..errors import ConfigError

#: the plan axes, in key order (a plan key is one value per axis)
AXES = ("instance", "nodes", "tp", "pp", "vpp", "cp", "ep", "micro_batch", "zero", "recompute",
        "offload_activations", "global_batch")


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The values a search tries on each axis (each a non-empty tuple, in the order tried)."""

    instance: tuple[str, ...]
    nodes: tuple[int, ...]
    pricing: tuple[str, ...]
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8, 16)
    vpp: tuple[int, ...] = (1, 2)
    cp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    micro_batch: tuple[int, ...] = (1, 2)
    zero: tuple[int, ...] = (1, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    offload_activations: tuple[int, ...] = (0,)
    global_batch: tuple[int, ...] = ()      # sequences per step; default_space: the scenario's alone

    def axis(self, name: str) -> tuple:
        return getattr(self, name)

    @property
    def size(self) -> int:
        """Number of candidate plans before any rule (instances x nodes x the plan axes)."""
        n = 1
        for name in AXES:
            n *= len(self.axis(name))
        return n


def default_space(sc, *, instances: Sequence[str] | None = None, nodes: Sequence[int] | None = None,
                  pricing: Sequence[str] | None = None, **axes: Sequence) -> SearchSpace:
    """The space searched for scenario ``sc`` unless told otherwise.

    Defaults: the scenario's instance, node count and pricing option; tp over powers of two up to the
    accelerators of one node (tensor parallelism stays inside the scale-up domain, as every mainstream
    recipe keeps it); pp 1..16; vpp 1-2; cp 1 (1, 2, 4 from 16K-token sequences); ep over powers of two
    dividing the experts up to 64 (MoE only); micro-batch 1-2; ZeRO 1 (distributed optimizer) and 3
    (FSDP); every recompute mode; no offloading; the scenario's global batch. ``axes`` replace any of
    them; ``global_batch`` may also be its ``--global-batch`` text (``"1024,2048"``).
    """
    cl = sc.cluster
    wl = sc.workload
    model = wl.model
    per_node = cl.instance.num_accelerators
    space: dict = {
        "instance": tuple(instances) if instances else (cl.instance.name,),
        "nodes": tuple(nodes) if nodes else (cl.nodes,),
        "pricing": tuple(pricing) if pricing else (sc.pricing.option or "on-demand",),
        "tp": tuple(t for t in (1, 2, 4, 8, 16, 32, 64) if t <= per_node and t <= model.heads),
        "pp": tuple(p for p in (1, 2, 4, 8, 16) if p <= model.layers),
        "cp": (1, 2, 4) if wl.seq_len >= 16384 else (1,),
        "global_batch": (wl.global_batch,),
    }
    if model.moe is not None:
        space["ep"] = tuple(e for e in (1, 2, 4, 8, 16, 32, 64) if model.moe.experts % e == 0)
    for name, values in axes.items():
        if values is None:
            continue
        if name not in AXES or name in ("instance", "nodes"):
            raise ConfigError(f"unknown search axis {name!r} (expected one of {', '.join(AXES[2:])})")
        option = f"--{name.replace('_', '-')}"
        if name == "global_batch":
            values = global_batches(values)
        values = tuple(values)
        if not values:
            raise ConfigError(f"{option}: no values (expected a comma-separated list)")
        space[name] = values
    return SearchSpace(**space)


def _ruled_out(model_moe: bool, pp: int, vpp: int, ep: int, recompute: str, offload: int) -> bool:
    """Pairings the scenario reader refuses for any model (see the module docstring)."""
    if vpp > 1 and pp == 1:
        return True
    if ep > 1 and not model_moe:
        return True
    return bool(offload) and (pp != 1 or recompute != "none")


def candidates(space: SearchSpace, *, moe: bool) -> Iterator[tuple]:
    """Every plan key of ``space`` (a tuple of values in :data:`AXES` order), deterministic order."""
    for inst in space.instance:
        for nodes in space.nodes:
            for tp in space.tp:
                for pp in space.pp:
                    for vpp in space.vpp:
                        for cp in space.cp:
                            for ep in space.ep:
                                for mb in space.micro_batch:
                                    for zero in space.zero:
                                        for rc in space.recompute:
                                            for off in space.offload_activations:
                                                if _ruled_out(moe, pp, vpp, ep, rc, off):
                                                    continue
                                                for gb in space.global_batch:
                                                    yield (inst, nodes, tp, pp, vpp, cp, ep, mb, zero, rc,
                                                           off, gb)


def plan_dict(key: tuple) -> dict:
    """A plan key as ``{axis: value}``."""
    return dict(zip(AXES, key))


def parse_nodes(text: str) -> tuple[int, ...]:
    """``--nodes``: ``8..1024`` (8, 16, 32 ... 1024: doubling) or a list ``8,12,16``."""
    text = text.strip()
    try:
        if ".." in text:
            lo_s, hi_s = text.split("..", 1)
            lo, hi = int(lo_s), int(hi_s)
            if lo < 1 or hi < lo:
                raise ValueError
            out, n = [], lo
            while n <= hi:
                out.append(n)
                n *= 2
            return tuple(out)
        values = tuple(int(v) for v in text.split(",") if v.strip())
        if not values or min(values) < 1:
            raise ValueError
        return tuple(dict.fromkeys(values))
    except ValueError:
        raise ConfigError(f"--nodes: {text!r} is not valid (expected LO..HI, doubling from LO, e.g. 8..1024, "
                          "or a list such as 8,16,32 of positive integers)") from None


def global_batches(values: str | Sequence) -> tuple[int, ...]:
    """The ``global_batch`` axis: its ``--global-batch`` text (``"1024,2048,4096"``) or values, each a
    positive integer (sequences per step), in the order given, repeats dropped."""
    if isinstance(values, str):
        return parse_ints("--global-batch", values)
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ConfigError(f"--global-batch: {v!r} is not valid (expected positive integers: sequences per "
                              "step, e.g. 1024,2048,4096)")
        out.append(int(v))
    return tuple(dict.fromkeys(out))


def parse_ints(option: str, text: str, *, minimum: int = 1) -> tuple[int, ...]:
    """A comma-separated list of integers >= ``minimum`` for ``option``."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < minimum:
        raise ConfigError(f"{option}: {text!r} is not valid (expected a comma-separated list of integers "
                          f">= {minimum}, e.g. 1,2,4)")
    return tuple(dict.fromkeys(values))


def parse_names(option: str, text: str, known: Sequence[str]) -> tuple[str, ...]:
    """A comma-separated list of names from ``known`` for ``option``."""
    from ..catalog import suggest

    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if not values:
        raise ConfigError(f"{option}: no values (expected a comma-separated list of: {', '.join(known)})")
    for v in values:
        if v not in known:
            raise ConfigError(f"{option}: unknown value {v!r}{suggest(v, list(known))}")
    return values
