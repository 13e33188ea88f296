"""The band's hardware components: the spread each hardware figure's own source shows (data layer).

:mod:`fmsim.band` varies the settings a file leaves unstated; this module adds what the figures the model
runs on could be, each by the spread *its own source* publishes -- never by how the validation rows scored.
Each :class:`Spread` scales some catalog efficiencies of the run's instance by a low and a high factor:

* **chip speed** (every NVIDIA GEMM and fused-attention rate, all precisions): the catalog's GEMM figures are
  one GPU's best-shape mamf-finder mean (stas00/ml-engineering compute/accelerator/README.md @744d01e18b79,
  "Maximum Achievable Matmul FLOPS comparison table"). The same page, section "Not all accelerators are
  created equal": "you can see 5%+ MAMF spread between GPUs [of an 8-GPU node]" and "what you want is the
  slowest performance as when used in an ensemble that slowest accelerator (struggler) will set the speed"
  -- low 0.95. Its table's other rows of the same GH100 die run faster: GH200 828.6 against H100 794.5
  TFLOP/s bf16 (+4.3 %), H200 1453.4 against H100 1402.6 fp8 (+3.6 %) -- high 1.043.
* **HBM streaming** (``hbm_efficiency``): BabelStream's four kernels on one node each (Azure/AI-benchmarking-
  guide, the catalog's source): A100-80GB Copy/Mul 1.61, Add/Triad 1.70 of 2.039 TB/s (0.79-0.83 around 0.81),
  H100 2.90-2.97 of 3.35 (0.87-0.89 around 0.88), H200 4.00-4.15 of 4.8 (0.83-0.86 around 0.85). Blackwell
  parts, whose figure is the H100's, take the H100's spread; chips with no measurement take none.
* **fabric bandwidth** (``Fabric.efficiency`` and ``ring_efficiency``): the two independent nccl-tests runs of
  the calibrating configuration, 2 nodes of 8 H100 over 3.2 Tb/s at 1 GiB: 436.95 GB/s busbw
  (aws-samples/awsome-distributed-training @7217859f67bc micro-benchmarks/nccl-tests/README.md) against
  434.99 (the ib-ndr figure's third-party run), +-0.45 %; the InfiniBand/RoCE ring figure 0.96 is the
  four-adapter DGX-1 figure of NVIDIA/nccl-tests issue #29 (2019-12-06), whose one-adapter figure is 0.976
  (+1.7 %). EFA v1: 0.86 calibrated against S16's "~340 Gbps effective" of 400 (0.85, -1.2 %).

Scale-up links (NVLink 4 from one run, NVLink 3 from one third-party run, NVLink 5 assumed), EFA v3 (one
run) and v4 (assumed) and the Neuron figures have no second measurement, so no spread is taken for them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SPREADS", "Spread", "applicable", "perturb"]

_ATTENTION = ("attention_efficiency", "attention_flash2_efficiency", "attention_flash1_efficiency",
              "attention_forward_efficiency", "attention_fp8_efficiency")
#: BabelStream kernel range / the figure, per chip (Blackwell parts: the H100's, their figure being its)
_HBM = {"a100-40gb": (0.79 / 0.81, 0.83 / 0.81), "a100-80gb": (0.79 / 0.81, 0.83 / 0.81),
        "h100-sxm": (0.87 / 0.88, 0.89 / 0.88), "h200": (0.83 / 0.85, 0.86 / 0.85),
        "b200": (0.87 / 0.88, 0.89 / 0.88), "gb200": (0.87 / 0.88, 0.89 / 0.88),
        "b300": (0.87 / 0.88, 0.89 / 0.88)}
_FABRIC = {"efa-v1": (0.85 / 0.86, 1.0), "efa-v2": (434.99 / 436.95, 436.95 / 434.99)}
_IB_KINDS = ("infiniband", "roce")


@dataclass(frozen=True, slots=True)
class Spread:
    """One hardware figure's sourced spread: which instances it applies to and how a factor changes one."""

    key: str                                     # band component name (Band.varied / Band.most)
    label: str
    factors: Callable[[Any], tuple[float, ...]]  # instance -> the factors to try (empty: no source)
    apply: Callable[[Any, float], Any]           # (instance, factor) -> instance


def _cap(x: float) -> float:
    return min(1.0, x)


def _chip_factors(inst: Any) -> tuple[float, ...]:
    return (0.95, 1.043) if inst.accelerator.vendor == "NVIDIA" else ()


def _chip(inst: Any, f: float) -> Any:
    acc = inst.accelerator
    changes: dict[str, Any] = {"gemm_efficiency": {k: _cap(v * f) for k, v in acc.gemm_efficiency.items()}}
    for name in _ATTENTION:
        v = getattr(acc, name)
        if v:
            changes[name] = _cap(v * f)
    return dataclasses.replace(inst, accelerator=dataclasses.replace(acc, **changes))


def _hbm_factors(inst: Any) -> tuple[float, ...]:
    return _HBM.get(inst.accelerator.name, ())


def _hbm(inst: Any, f: float) -> Any:
    acc = inst.accelerator
    return dataclasses.replace(inst, accelerator=dataclasses.replace(acc, hbm_efficiency=_cap(acc.hbm_efficiency * f)))


def _fabric_range(fab: Any) -> tuple[float, float]:
    if fab.name in _FABRIC:
        return _FABRIC[fab.name]
    if fab.kind in _IB_KINDS:          # calibrated on (or assumed equal to) the ib-ndr run
        return _FABRIC["efa-v2"]
    return 1.0, 1.0


def _fabric_factors(inst: Any) -> tuple[float, ...]:
    lo, hi = _fabric_range(inst.fabric)
    return tuple(f for f in (lo, hi) if f != 1.0)


def _fabric(inst: Any, f: float) -> Any:
    fab = inst.fabric
    ring = fab.ring_efficiency
    if ring and f > 1.0 and fab.kind in _IB_KINDS:
        ring = _cap(ring * 0.976 / 0.96)        # one adapter's ring figure (nccl-tests #29)
    elif ring:
        ring = _cap(ring * f)
    return dataclasses.replace(inst, fabric=dataclasses.replace(fab, efficiency=_cap(fab.efficiency * f),
                                                                ring_efficiency=ring))


SPREADS: tuple[Spread, ...] = (
    Spread("hardware.chip_speed", "chip speed (mamf-finder spread)", _chip_factors, _chip),
    Spread("hardware.hbm", "HBM bandwidth (BabelStream spread)", _hbm_factors, _hbm),
    Spread("hardware.fabric", "fabric bandwidth (nccl-tests spread)", _fabric_factors, _fabric),
)


def applicable(inst: Any) -> dict[str, tuple[float, ...]]:
    """The spreads that apply to ``inst``, with the factors each tries."""
    out = {}
    for s in SPREADS:
        fs = s.factors(inst)
        if fs:
            out[s.key] = fs
    return out


def perturb(sc: Any, factors: dict[str, float]) -> Any:
    """``sc`` with its instance's figures scaled by ``factors`` (component key -> factor)."""
    if not factors:
        return sc
    inst = sc.cluster.instance
    for s in SPREADS:
        if s.key in factors:
            inst = s.apply(inst, factors[s.key])
    return dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, instance=inst))
