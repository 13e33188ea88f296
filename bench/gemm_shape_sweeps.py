"""The GEMM shape model (kernels.gemm_efficiency) against every measured GEMM sweep the catalog holds.

Prints measured / predicted per point set, by chip and precision, for the shipped structure, the depth rule it
replaced and the two alternatives weighed in docs/catalogs.md ("How the gemm figure meets the shape model"):

* ``waves``       -- the shipped model: CUTLASS tiles, wave quantization over the SMs, split-K below one wave,
                     depth k / (k + K0) with the chip's K0 (kernels.chip_gemm_k0: Blackwell's own, fitted below
                     from the TensorRT-LLM K-depth sweeps; every other chip DeepGEMM's H800 K0 scaled by the math rate);
* ``math-rate``   -- the same with every chip's K0 scaled by the math rate (kernels.gemm_k0, the rule before
                     2026-12-02), the b200 fp8/fp4 figures read back through it (0.555 / 0.589, as they were);
* ``stream-k``    -- the same, but the last partial wave split over all SMs (CUTLASS's data-parallel + stream-K
                     hybrid, sm90 PersistentTileSchedulerSm90StreamK; Osama et al., "Stream-K", PPoPP 2023);
* ``normalised``  -- each mamf-finder catalog figure divided by the model's shape efficiency at the shape it
                     was measured (figure / shape_eff(best shape)).

Point sets: mamf-finder's best shapes (hardware_catalog/measurements/mamf_finder_{bf16,fp8}.csv), OpenXLA's
measured H100 table (h100_xla_matmul.csv, 125 shapes), TensorRT-LLM's B200 and GB200 GEMMs
({b200,gb200}_trtllm_gemm.csv, m 8192, n and k 4096..16384), TensorRT-LLM's B200 and GB200 K-depth sweeps (blackwell_trtllm_gemm_ksweep.csv, k 512..16384)
and DeepGEMM's dense FP8 rows on H800 (h800_deepgemm_grouped.csv, layout dense); last, FlashInfer's sm100 masked
grouped nvfp4 GEMM at DeepSeek-V3 expert shapes (b200_flashinfer_masked_grouped.csv, ``grouped_masked_fp4``: does the
Blackwell depth constant, fitted on ~28-wave GEMMs, hold for experts of few rows and few waves?). Each time is priced as the
operator model prices a GEMM: max(compute, operand traffic) plus the fixed kernel cost.

It also derives the Blackwell figures the catalog states: the depth constant per precision (``depth_fit`` pooled
over the B200 and GB200 sweeps -> efficiency.gemm_k0 of b200, gb200, b300) and the figures read back through it
(``readback``: b200 fp8/fp4 from b200_trtllm_gemm.csv, gb200 fp8/fp4 from gb200_trtllm_gemm.csv, the same 32 shapes).

Run: ``python bench/gemm_shape_sweeps.py`` (a few seconds; prints, asserts nothing).
"""
from __future__ import annotations

import csv
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fmsim.catalog import load_catalog  # noqa: E402
from fmsim.model import kernels  # noqa: E402
from fmsim.model.kernels import GEMM_TILES, KERNEL_FIXED_S, chip_gemm_k0, gemm_k0  # noqa: E402

MEAS = ROOT / "hardware_catalog" / "measurements"
CAT = load_catalog()
MAMF_CHIPS = {"A100 SXM": "a100-80gb", "H100 SXM": "h100-sxm", "H200 SXM": "h200", "B200 SXM": "b200",
              "B300 SXM": "b300", "GB200 SXM": "gb200"}
BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}
Shape = Callable[[float, float, float, int, float], float]
DTYPES = {"float16": "bf16", "fp8": "fp8", "nvfp4": "fp4"}
#: K0 rules: the shipped one (the chip's own where its entry states it) and the math-rate rule it replaced
K0_RULES: dict[str, Callable[[str, str], float]] = {
    "chip": lambda chip, prec: chip_gemm_k0(CAT.accelerator(chip), prec),
    "math-rate": lambda chip, prec: gemm_k0(CAT.accelerator(chip).peak(prec)),
}
#: figures the catalog reads back from TensorRT-LLM's GEMM rows through the model (``readback``)
READ_BACK = {("b200", "fp8"), ("b200", "fp4"), ("gb200", "fp8"), ("gb200", "fp4")}


def _rows(name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(line for line in (MEAS / name).open() if not line.startswith("#")))


def waves(m: float, n: float, k: float, sms: int, k0: float) -> float:
    return kernels.gemm_efficiency(m, n, k, sms, k0)


def stream_k(m: float, n: float, k: float, sms: int, k0: float) -> float:
    """Full waves data-parallel, the remainder tiles' depth split over the SMs they leave (best split)."""
    best = 0.0
    for tm, tn in GEMM_TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        used = m * n / (tiles * tm * tn)
        full, rest = divmod(tiles, sms)
        steps = full * (k + k0)
        if rest:
            steps += min(k / s + k0 for s in range(1, sms // rest + 1))
        best = max(best, used * (tiles * k / sms) / steps)
    return min(1.0, best)


def mamf_points() -> list[tuple[str, str, float, int, int, int]]:
    out = []
    for name, prec in (("mamf_finder_bf16.csv", "bf16"), ("mamf_finder_fp8.csv", "fp8")):
        for r in _rows(name):
            out.append((MAMF_CHIPS[r["accelerator"]], prec, float(r["mamf_tflops"]) / float(r["theory_tflops"]),
                        int(r["best_m"]), int(r["best_n"]), int(r["best_k"])))
    return out


def readback_rows(chip: str, prec: str) -> list[tuple[int, int, int, float]]:
    """TensorRT-LLM's deep-K rows a figure is read back from: the chip's table ({b200,gb200}_trtllm_gemm.csv, the same
    32 shapes: m 8192, n and k 4096..16384); (m, n, k, seconds)."""
    dtype = {v: k for k, v in DTYPES.items()}[prec]
    rows = [r for r in _rows(f"{chip}_trtllm_gemm.csv") if r["gemm_dtype"] == dtype]
    return [(int(r["m"]), int(r["n"]), int(r["k"]), float(r["latency_ms"]) * 1e-3) for r in rows]


def readback(chip: str, prec: str, k0: float) -> float:
    """The large-GEMM figure that reproduces TensorRT-LLM's deep-K rows: the median over them of the measured rate,
    less the fixed kernel cost, over peak x the shape model (waves, depth ``k0``)."""
    acc = CAT.accelerator(chip)
    return statistics.median(2.0 * m * n * k / (acc.peak(prec) * waves(m, n, k, acc.compute_units, k0)
                                                  * (t - KERNEL_FIXED_S))
                             for m, n, k, t in readback_rows(chip, prec))


def figure(chip: str, prec: str, shape: Shape, normalised: bool, rule: str = "chip") -> float:
    """The catalog figure, or (normalised) mamf-finder's measurement over the shape model at its best shape. The
    figures read back from TensorRT-LLM's GEMMs are kept; under the math-rate rule b200's are read back through it
    (as the catalog had them) and gb200's are the assumption it had (bf16 - 0.10)."""
    acc = CAT.accelerator(chip)
    fig = acc.gemm_efficiency[prec]
    if rule == "math-rate" and (chip, prec) in READ_BACK:
        return readback(chip, prec, gemm_k0(acc.peak(prec))) if chip == "b200" else acc.gemm_efficiency["bf16"] - 0.10
    if normalised and (chip, prec) not in READ_BACK:
        for c, p, e, m, n, k in mamf_points():
            if (c, p) == (chip, prec):
                fig = e / shape(m, n, k, acc.compute_units, K0_RULES[rule](chip, prec))
    return fig


def seconds(chip: str, prec: str, m: float, n: float, k: float, shape: Shape, normalised: bool,
            rule: str = "chip") -> float:
    acc = CAT.accelerator(chip)
    eff = figure(chip, prec, shape, normalised, rule) * shape(m, n, k, acc.compute_units, K0_RULES[rule](chip, prec))
    compute = 2.0 * m * n * k / (acc.peak(prec) * eff)
    traffic = (m * k + k * n) * BYTES[prec] + m * n * 2.0
    return max(compute, traffic / (acc.hbm_bytes_per_s * acc.hbm_efficiency)) + KERNEL_FIXED_S


def point_sets() -> dict[str, list[tuple[str, str, int, int, int, float]]]:
    """name -> [(chip, precision, m, n, k, measured seconds)]."""
    sets: dict[str, list[tuple[str, str, int, int, int, float]]] = {}
    sets["openxla h100 bf16 (125)"] = [
        ("h100-sxm", "bf16", int(r["m"]), int(r["n"]), int(r["k"]),
         2.0 * int(r["m"]) * int(r["n"]) * int(r["k"]) / (float(r["tflops"]) * 1e12))
        for r in _rows("h100_xla_matmul.csv")]
    for chip in ("b200", "gb200"):
        for dt, p in DTYPES.items():
            sets[f"trtllm {chip} {dt} k>=4096"] = [(chip, p, *row) for row in readback_rows(chip, p)]
    for dev in ("B200", "GB200"):
        for dt, p in DTYPES.items():
            sets[f"trtllm {dev.lower()} {dt} k 512..16k"] = [
                (dev.lower(), p, int(r["m"]), int(r["n"]), int(r["k"]), float(r["latency_ms"]) * 1e-3)
                for r in _rows("blackwell_trtllm_gemm_ksweep.csv")
                if r["device"] == dev and r["gemm_dtype"] == dt and 512 <= int(r["k"]) <= 16384]
    sets["deepgemm h800 fp8 dense m=4096"] = [
        ("h100-sxm", "fp8", int(r["m_per_group"]), int(r["n"]), int(r["k"]),
         2.0 * int(r["m_per_group"]) * int(r["n"]) * int(r["k"]) / (float(r["tflops"]) * 1e12))
        for r in _rows("h800_deepgemm_grouped.csv") if r["layout"] == "dense" and r["m_per_group"] == "4096"]
    return sets


def log_errors(points, shape: Shape, normalised: bool, rule: str = "chip") -> list[float]:
    """log(predicted time / measured time): > 0 where the model is slow."""
    return [math.log(seconds(c, p, m, n, k, shape, normalised, rule) / t) for c, p, m, n, k, t in points]


def rms(xs: list[float]) -> float:
    return math.sqrt(statistics.mean(x * x for x in xs))


def depth_fit(points) -> tuple[float, float]:
    """(e_max, K0) of e = e_max k / (k + K0), least squares on 1/e against 1/k (the GEMM_K0 method), with e the
    measured rate less the fixed kernel cost, over the dense peak."""
    ks, inv = [], []
    for c, p, m, n, k, t in points:
        acc = CAT.accelerator(c)
        ks.append(1.0 / k)
        inv.append(acc.peak(p) * (t - KERNEL_FIXED_S) / (2.0 * m * n * k))
    slope, icept = np.polyfit(ks, inv, 1)
    return 1.0 / icept, slope / icept


def architecture_k0(dtype: str) -> tuple[float, float]:
    """(e_max, K0) of the Blackwell (sm100) depth term in TensorRT-LLM's ``dtype``: :func:`depth_fit` over the B200
    and GB200 K-depth sweeps together (k 512..16384), each point over its own chip's peak -- the catalog's
    efficiency.gemm_k0 of b200, gb200 and b300 (rounded to a k-step)."""
    sweeps = point_sets()
    return depth_fit(sweeps[f"trtllm b200 {dtype} k 512..16k"] + sweeps[f"trtllm gb200 {dtype} k 512..16k"])


def main() -> None:
    variants = {"waves": (waves, False, "chip"), "math-rate": (waves, False, "math-rate"),
                "stream-k": (stream_k, False, "chip"), "normalised": (waves, True, "chip")}
    print("mamf-finder best shapes: measured / predicted (1.00 = the model reproduces the figure's own shape)")
    print(f"{'chip':10s} {'prec':4s} {'shape':>20s} " + " ".join(f"{v:>13s}" for v in variants))
    for c, p, e, m, n, k in mamf_points():
        t = 2.0 * m * n * k / (CAT.accelerator(c).peak(p) * e)
        cells = [math.exp(log_errors([(c, p, m, n, k, t)], s, nrm, rule)[0]) for s, nrm, rule in variants.values()]
        print(f"{c:10s} {p:4s} {f'{m}x{n}x{k}':>20s} " + " ".join(f"{x:13.3f}" for x in cells))
    print("\nnormalised figures (mamf / shape efficiency at its best shape), waves model:")
    for c, p, e, m, n, k in mamf_points():
        fig = CAT.accelerator(c).gemm_efficiency[p]
        print(f"  {c:10s} {p:4s} catalog {fig:.3f} -> {figure(c, p, waves, True):.3f}")
    print("\nsweeps: rms log error (mean: > 0 model slow)")
    print(f"{'set':34s} {'n':>4s} " + " ".join(f"{v:>19s}" for v in variants))
    for name, pts in point_sets().items():
        cells = []
        for s, nrm, rule in variants.values():
            le = log_errors(pts, s, nrm, rule)
            cells.append(f"{rms(le):.3f} ({statistics.mean(le):+.3f})")
        print(f"{name:34s} {len(pts):4d} " + " ".join(f"{x:>19s}" for x in cells))
    print("\ndepth term read from the K-depth sweeps (e = e_max k / (k + K0), k 512..16384) vs the math-rate rule:")
    for name, pts in point_sets().items():
        if "512..16k" in name:
            emax, k0 = depth_fit(pts)
            c, p = pts[0][0], pts[0][1]
            print(f"  {name:34s} e_max {emax:.3f}  K0 {k0:6.0f}   math-rate K0 {gemm_k0(CAT.accelerator(c).peak(p)):6.0f}")
    print("\nBlackwell (sm100) depth constant, both chips' sweeps pooled, vs the catalog's efficiency.gemm_k0:")
    for dtype, p in DTYPES.items():
        emax, k0 = architecture_k0(dtype)
        cat = {c: chip_gemm_k0(CAT.accelerator(c), p) for c in ("b200", "gb200", "b300")}
        print(f"  {dtype:8s} e_max {emax:.3f}  K0 {k0:6.1f}   catalog " + " ".join(f"{c} {v:g}" for c, v in cat.items()))
    print("\nfigures read back from TensorRT-LLM's deep-K rows (median of measured / (peak x shape model)):")
    for c, p in sorted(READ_BACK) + [("b200", "bf16"), ("gb200", "bf16")]:
        acc = CAT.accelerator(c)
        print(f"  {c:6s} {p:4s} ({len(readback_rows(c, p))} rows): chip K0 {readback(c, p, chip_gemm_k0(acc, p)):.3f}"
              f"  math-rate K0 {readback(c, p, gemm_k0(acc.peak(p))):.3f}   catalog {acc.gemm_efficiency[p]:.3f}")


# --- Blackwell grouped GEMMs at expert shapes (few tiles, few waves) --------------------------------------------

def _uniform_tiles(mean: float, low: float = 0.7, high: float = 1.3) -> Callable[[int], float]:
    """``tm -> E[ceil(X / tm)]`` for X = int(mean * U(low, high)), the valid rows DeepGEMM's masked-layout benchmark
    gives each group (its ``masked_m``), by quadrature over 2001 points."""
    xs = np.floor(mean * np.linspace(low, high, 2001))
    return lambda tm: float(np.mean(np.ceil(xs / tm)))


def grouped_masked_fp4(draw: bool = True) -> list[tuple[int, int, int, int, float, float, float]]:
    """FlashInfer's sm100 masked grouped nvfp4 GEMM (b200_flashinfer_masked_grouped.csv) against the model as the
    serving path prices a fused grouped kernel: b200's fp4 figure x the grouped tile/wave/depth model (one kernel,
    no split-K, Blackwell K0), max(compute, weights + activations + output over the HBM rate) + the fixed kernel
    cost. ``draw``: each group's row tiles as the benchmark draws them (:func:`_uniform_tiles`); else every group
    the mean. Returns (groups, m, n, k, measured s, predicted s, compute share of the predicted time)."""
    acc = CAT.accelerator("b200")
    peak, fig, k0, sms = acc.peak("fp4"), acc.gemm_efficiency["fp4"], chip_gemm_k0(acc, "fp4"), acc.compute_units
    out = []
    for r in _rows("b200_flashinfer_masked_grouped.csv"):
        g, m, n, k = int(r["num_groups"]), int(r["expected_m_per_group"]), int(r["n"]), int(r["k"])
        t = float(r["us"]) * 1e-6
        rows = float(r["tflops"]) * 1e12 * t / (2.0 * n * k)              # sum of the valid rows, as counted
        mean = rows / g
        if draw:
            e = kernels._tile_round_efficiency(mean, n, k, g, sms, k0, False, m_tiles=_uniform_tiles(m))
        else:
            e = kernels.grouped_gemm_efficiency(g, mean, n, k, sms, k0)
        e = min(e, kernels.gemm_efficiency(rows, n, k, sms, k0))
        compute = 2.0 * rows * n * k / (peak * fig * e)
        traffic = (g * n * k + rows * k) * BYTES["fp4"] + rows * n * 2.0
        memory = traffic / (acc.hbm_bytes_per_s * acc.hbm_efficiency)
        out.append((g, m, n, k, t, max(compute, memory) + KERNEL_FIXED_S, compute / max(compute, memory)))
    return out


def grouped_main() -> None:
    acc = CAT.accelerator("b200")
    print("\nBlackwell grouped GEMM at expert shapes: FlashInfer sm100 masked nvfp4 (b200_flashinfer_masked_grouped.csv)")
    print("measured / predicted time with each group's drawn rows (mean rows in brackets); C compute-bound, M memory-bound"
          " in the model; hbm: the weights + activations the model counts over the measured time, share of 7.7 TB/s")
    mean_rows = {(g, m, n, k): p for g, m, n, k, _, p, _ in grouped_masked_fp4(draw=False)}
    buckets: dict[str, list[float]] = {}
    for g, m, n, k, t, p, share in grouped_masked_fp4():
        bound = "C" if share >= 1.0 else "M"
        rows = "<= 128" if m <= 128 else ("129-256" if m <= 256 else ">= 341")
        buckets.setdefault(f"{bound} rows/expert {rows}", []).append(t / p)
        traffic = (g * n * k + g * m * k) * BYTES["fp4"] + g * m * n * 2.0
        hbm = traffic / (t - KERNEL_FIXED_S) / acc.hbm_bytes_per_s
        print(f"  {g:3d} x {m:5d} x {n:5d} x {k:5d}  {t * 1e6:6.1f} us  {t / p:5.2f} ({t / mean_rows[(g, m, n, k)]:5.2f})"
              f"  {bound}  hbm {hbm:.2f}")
    for key, ratios in sorted(buckets.items()):
        print(f"  {key:24s} {len(ratios):2d} rows: median {statistics.median(ratios):.2f}, "
              f"range {min(ratios):.2f}-{max(ratios):.2f}")

if __name__ == "__main__":
    main()
    grouped_main()
