"""The frozen :class:`Scenario` the simulators consume: one validated object per section, plus the
measured figures, the expectations and the raw sections a kind adds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .cluster import Cluster, DataSpec
from .metrics import Expect
from .parallelism import Parallelism
from .run import Checkpoint, Pricing, Reliability
from .schema import SCHEMA_VERSION
from .workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One scenario file, validated and in SI units."""

    name: str
    description: str = ""
    version: int = SCHEMA_VERSION
    file: str | None = None
    seed: int = 0
    workload: Workload
    parallelism: Parallelism
    cluster: Cluster
    pricing: Pricing = field(default_factory=Pricing)
    checkpoint: Checkpoint | None = None
    reliability: Reliability | None = None
    data: DataSpec | None = None
    measured: Mapping[str, float] = field(default_factory=dict)  # column -> value (column's unit)
    measured_source: str = ""
    measured_notes: Mapping[str, str] = field(default_factory=dict)  # flops_formula, peak, notes
    expect: Mapping[str, Expect] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # raw kind-specific sections
    # software stack (stack_catalog/): its name, and the stack-settable fields (fmsim.stacks.SETTABLE) the
    # file or its stack states -- the others are fmsim's global defaults, which fmsim.band varies
    stack: str = ""
    stated: tuple[str, ...] = field(default=(), compare=False)
    configuration: str = ""              # stated | partial (how completely the source states the settings)
    configuration_missing: str = ""      # with partial: what the source leaves out
    # with partial: the fields the source leaves open, each with the values it gives (fmsim.band varies them)
    configuration_unknown: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def measured_peak_flop_per_s(self) -> float | None:
        """The peak FLOP/s the measurement's source divided by (``measured.peak``), if given."""
        peak = self.measured_notes.get("peak")
        return float(peak) if peak else None

    @property
    def flops_formula(self) -> str | None:
        return self.measured_notes.get("flops_formula") or None
