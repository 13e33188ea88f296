"""Pipeline schedules: the order in which each stage runs its forward and backward chunks.

A schedule is a function ``(pp, vpp, num_microbatches, stage) -> list[Task]`` registered under
its YAML name. Tasks name a micro-batch and a *virtual* stage (``chunk * pp + stage``); the
engine adds the data dependencies (forward of virtual stage v needs v-1's output; backward of v
needs v+1's gradient). Sources: GPipe (Huang et al. 2019); 1F1B / PipeDream-Flush (Narayanan et
al. 2021, §2.2.1, Fig. 3); interleaved 1F1B (Narayanan et al. 2021, §2.2.2, Fig. 4, and
Megatron-LM's ``forward_backward_pipelining_with_interleaving``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

from ..errors import ConfigError


class Task(NamedTuple):
    kind: str          # "F" or "B"
    microbatch: int
    chunk: int         # model chunk on this stage (0..vpp-1)


Schedule = Callable[[int, int, int, int], list[Task]]
SCHEDULES: dict[str, Schedule] = {}


def register(name: str) -> Callable[[Schedule], Schedule]:
    def deco(fn: Schedule) -> Schedule:
        if name in SCHEDULES:
            raise ValueError(f"schedule {name!r} registered twice")
        SCHEDULES[name] = fn
        return fn
    return deco


def get_schedule(name: str) -> Schedule:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ConfigError(f"unknown schedule {name!r} (known: {', '.join(sorted(SCHEDULES))})",
                          field="parallelism.schedule") from None


@register("gpipe")
def gpipe(pp: int, vpp: int, m: int, stage: int) -> list[Task]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    fwd = [Task("F", i, c) for c in range(vpp) for i in range(m)]
    bwd = [Task("B", i, c) for c in reversed(range(vpp)) for i in range(m)]
    return fwd + bwd


def _chunk_order(pp: int, vpp: int, m: int, backward: bool) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in Megatron's interleaved order: groups of pp micro-batches sweep the
    chunks (forward: 0..v-1, backward: v-1..0)."""
    out = []
    chunks = list(reversed(range(vpp))) if backward else list(range(vpp))
    for g in range(0, m, pp):
        for c in chunks:
            for i in range(g, min(g + pp, m)):
                out.append((i, c))
    return out


@register("1f1b")
def one_f_one_b(pp: int, vpp: int, m: int, stage: int) -> list[Task]:
    """PipeDream-Flush: pp-stage-1 warm-up forwards, then alternate, then drain backwards.

    With ``vpp > 1`` it is the interleaved schedule (Megatron names both 1F1B)."""
    if vpp > 1:
        return interleaved(pp, vpp, m, stage)
    warm = min(pp - stage - 1, m)
    tasks = [Task("F", i, 0) for i in range(warm)]
    for i in range(m - warm):
        tasks.append(Task("F", warm + i, 0))
        tasks.append(Task("B", i, 0))
    tasks += [Task("B", i, 0) for i in range(m - warm, m)]
    return tasks


@register("interleaved")
def interleaved(pp: int, vpp: int, m: int, stage: int) -> list[Task]:
    """Interleaved 1F1B: warm-up (pp-stage-1)·2 + (vpp-1)·pp chunk-forwards (Megatron-LM)."""
    fwd = _chunk_order(pp, vpp, m, backward=False)
    bwd = _chunk_order(pp, vpp, m, backward=True)
    total = len(fwd)
    if vpp == 1:
        warm = min(pp - stage - 1, m)
    else:
        warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    tasks = [Task("F", *fwd[k]) for k in range(warm)]
    for k in range(total - warm):
        tasks.append(Task("F", *fwd[warm + k]))
        tasks.append(Task("B", *bwd[k]))
    tasks += [Task("B", *bwd[k]) for k in range(total - warm, total)]
    return tasks


@functools.lru_cache(maxsize=2048)
def schedule_tasks(name: str, pp: int, vpp: int, m: int, stage: int) -> tuple[Task, ...]:
    """Schedule ``name``'s tasks of ``stage``, as a tuple, memoised (bounded): a pure function of its
    integers, which the plans of a search repeat (the analytical ZeRO-3 chain replays it per plan)."""
    return tuple(get_schedule(name)(pp, vpp, m, stage))
