"""Kernel-level facts the training and serving cost models share.

Owns the bytes per element of each number format, the fixed cost of one GPU kernel, the GEMM
reduction-depth efficiency ``k / (k + K0)``, fused attention's sequence-length efficiency
``s / (s + S0)`` and a GEMM's shape efficiency (tiles, waves, split-K over the depth) --
one set of figures, each with its source, so that a training step and a serving iteration price
the same kernel the same way.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from ..catalog.specs import Accelerator

# Bytes per element. NVFP4 packs 16 four-bit values with one FP8 (E4M3) scale:
# 0.5 + 1/16 bytes per element (NVIDIA, "Introducing NVFP4 for efficient and accurate
# low-precision inference", developer blog 2025, block size 16 with an FP8 scale).
BYTES_PER_ELEMENT = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5625}
# Fixed time of one GPU kernel beyond its roofline (launch, pipeline fill, tail wave). Derived
# from DeepGEMM's published FP8 GEMM table on H800 (README, 2025-02: M=64/128 rows, e.g.
# 64x2112x7168 at 206 TFLOP/s = 9.4 us vs a 5.1 us roofline at 0.88 x 3.35 TB/s): measured minus
# roofline is 2.4-5.9 us over the four small-M rows, mean 4.2 us. Global, applied per kernel.
KERNEL_FIXED_S = 4.2e-6
# Compute efficiency of a GEMM as a function of its reduction depth K: every output tile pays a
# fixed prologue/epilogue (pipeline fill, accumulator promotion, writing the tile) worth about K0
# elements of K, so a GEMM reaches e_max * K / (K + K0) of peak. Fitted (least squares on 1/e vs
# 1/K) to the six M=4096 rows of DeepGEMM's FP8 GEMM table on H800 (deepseek-ai/DeepGEMM README
# @7a70b43, 2025-02: K=512..16384 at 590..1358 TFLOP/s of 1979): K0 = 640, e_max = 0.68 -- the same
# asymptote as the catalog's large-GEMM FP8 efficiency (0.71 on H100, mamf-finder), so the catalog figure is
# used as e_max and K / (K + K0) scales it. Tensor parallelism shortens K of the row-parallel
# GEMMs (attention output, MLP down) to K / tp, which is where this bites. Scaled by the math rate
# (gemm_k0) on every chip but those whose catalog entry states its own (Blackwell: chip_gemm_k0).
GEMM_K0 = 640.0


#: Dense FP8 peak of the H800/H100 SXM (NVIDIA H100 datasheet): the math rate GEMM_K0 was fitted at.
H800_FP8_PEAK_FLOP_PER_S = 1979e12


def gemm_k0(peak_flop_per_s: float) -> float:
    """K0 at another math rate: the fixed time per output tile is worth K0 k-steps at the fitted rate,
    and proportionally more k-steps on faster math. The rule for every chip whose catalog entry states no
    ``efficiency.gemm_k0`` of its own (:func:`chip_gemm_k0`)."""
    return GEMM_K0 * peak_flop_per_s / H800_FP8_PEAK_FLOP_PER_S


def chip_gemm_k0(acc: Accelerator, precision: str) -> float:
    """K0 of ``acc``'s GEMMs in ``precision``: the chip's own ``efficiency.gemm_k0`` where its catalog entry
    states one (an unlisted precision takes bf16's), else :func:`gemm_k0` at the chip's peak.

    Blackwell (sm100: B200, GB200; B300 assumed alike) states its own: TensorRT-LLM's K-depth sweeps on B200 and
    GB200 (hardware_catalog/measurements/blackwell_trtllm_gemm_ksweep.csv, k 512..16384), fitted by GEMM_K0's
    method pooled over both chips, give K0 51 (16-bit), 389 (fp8), 623 (nvfp4) k-steps -- a fourteenth to a
    quarter of the math-rate rule's 728-3234 (bench/gemm_shape_sweeps.py; docs/catalogs.md "How the gemm figure
    meets the shape model"). Its tensor-memory accumulators let a persistent kernel's epilogue of one tile
    overlap the next tile's k-loop, so little of the per-tile fixed cost is left exposed."""
    own = acc.gemm_k0_steps
    if own and (precision in own or "bf16" in own):
        return own.get(precision, own.get("bf16", 0.0))
    return gemm_k0(acc.peak(precision))


def gemm_k_efficiency(k: float, k0: float = GEMM_K0) -> float:
    """Share of the large-GEMM efficiency a GEMM of reduction depth ``k`` reaches, ``k / (k + K0)``."""
    return k / (k + k0) if k > 0 else 1.0


# Fused (flash) attention as a function of sequence length: each query tile pays a fixed cost
# (loading Q, the softmax epilogue, writing O and its statistics) worth about S0 key positions of
# its K/V loop, so a kernel reaches e_max * s / (s + S0) of its long-sequence rate -- the same form
# as GEMM_K0. Fitted (least squares on 1/e vs 1/s) to the H100 head-dim-128 series the FlashAttention-3
# authors' sizing reproduces in pytorch/benchmark PR #2391 (commit ff65cb6, 2024-07: B*S = 16k,
# H*D = 2048, s = 512..16k): FA3 430..621 TFLOP/s gives S0 = 235, the Triton tutorial kernel
# 329..477 gives S0 = 243; the cuDNN causal end points the FlashAttention-3 paper prints (Fig. 5,
# 484 at 2k, 539 at 16k) give 270. 240 taken. The catalog's attention efficiencies are the
# long-sequence rate e_max.
ATTENTION_S0 = 240.0


def attention_length_efficiency(seq_len: float) -> float:
    """Share of the long-sequence rate a fused attention kernel over ``seq_len`` tokens reaches."""
    return seq_len / (seq_len + ATTENTION_S0) if seq_len > 0 else 1.0


#: Output tile shapes (rows × columns) the GEMM library chooses among: CUTLASS's 128×256, 256×128
#: and 128×128 threadblock tiles for 16- and 8-bit tensor-core GEMMs on SM80/SM90/SM100.
GEMM_TILES = ((128, 256), (256, 128), (128, 128))


def gemm_efficiency(m: float, n: float, k: float, compute_units: int, k0: float) -> float:
    """Share of the large-GEMM rate an (m×k)·(k×n) GEMM reaches: its shape's tiles, waves and depth.

    The output is cut into tiles; an edge tile computes rows and columns outside the matrix
    (tile quantization), and tiles run one per SM at a time, the last wave partly empty (wave
    quantization) -- NVIDIA, "Matrix Multiplication Background User's Guide", §"Tile
    quantization" and §"Wave quantization". Each tile walks the reduction depth and pays a fixed
    prologue/epilogue worth ``k0`` k-steps (:func:`gemm_k_efficiency`). When a GEMM has fewer tiles
    than SMs the library splits K over ``s`` SMs per tile (cuBLAS/CUTLASS split-K): ``s × tiles``
    of the SMs work, each over a depth of only ``k / s``, so each pays its fixed cost over a
    shorter walk -- the split that does best is taken, as is the tile shape. Read against OpenXLA's
    measured H100 table (hardware_catalog/measurements/h100_xla_matmul.csv), this split-K rule with
    the catalog's unchanged figures (0.80, K0 = 320) takes the rms log error over its 125 shapes from
    0.24 (split-K at full depth on every SM) to 0.14, within 0.005 of the best-fitting pair on a grid
    (0.86, K0 = 400: 0.136; tests/test_catalog_hardware.py checks the 0.14). The catalog's large-GEMM
    efficiency is used as the rate of a full wave at deep K (a full wave counts as 1). It is mamf-finder's best
    shape, which does not fill its waves exactly: at those shapes this model prices the GEMM 1.04-1.09x slow in
    16-bit on A100/H100, 1.22-1.36x in fp8 on H100/H200 (2.2-2.4 waves) and 1.06-1.11x in 16-bit on Blackwell
    with its own depth constant (1.28-1.73x with the math-rate K0); normalising the figures or a stream-K last
    wave fit the measured sweeps no better (docs/catalogs.md "How the gemm figure meets the shape model";
    tests/test_gemm_shape_sweeps.py).
    ``compute_units`` 0: no wave model, depth only.
    """
    if compute_units <= 0:
        return gemm_k_efficiency(k, k0)
    return min(1.0, _tile_round_efficiency(m, n, k, 1, compute_units, k0, split_k=True))


#: Compute streams Transformer Engine spreads the per-expert GEMMs of a ``GroupedLinear`` over
#: (transformer_engine/common/util/multi_stream.cpp ``num_compute_streams = 4``, NVIDIA/TransformerEngine
#: v2.9 @70f536662a). Its ``nvte_multi_tensor_gemm`` runs one cuBLAS GEMM per expert, round-robin over
#: these streams (``multi_stream_cublas_gemm``), unless ``NVTE_USE_CUTLASS_GROUPED_GEMM`` is set on Hopper
#: for 16-bit inputs (common/gemm/cublaslt_gemm.cu, same commit) -- so every FP8 run and every
#: Blackwell run of Megatron-Core's ``TEGroupedMLP`` takes the multi-stream path.
TE_GROUPED_GEMM_STREAMS = 4


def _tile_round_efficiency(m: float, n: float, k: float, gemms: int, compute_units: int, k0: float,
                           split_k: bool, m_tiles: Callable[[int], float] | None = None) -> float:
    """Efficiency of ``gemms`` equal (m×k)·(k×n) GEMMs whose tiles share the SMs at once: each GEMM
    cut into its own tiles (an edge tile of one expert cannot take rows of the next), the tiles of all
    of them in waves over the SMs, split-K (when ``split_k``) where they do not fill one wave.
    ``m_tiles(tm)``: the expected row tiles of one GEMM when its rows vary (``m`` is then their mean);
    ``None``: ``ceil(m / tm)``."""
    best = 0.0
    for tm, tn in GEMM_TILES:
        mt = math.ceil(m / tm) if m_tiles is None else m_tiles(tm)
        nt = math.ceil(n / tn)
        if mt <= 0:
            continue
        tiles = gemms * mt * nt
        used = (m * n) / (mt * tm * nt * tn)
        if tiles >= compute_units or not split_k:
            waves = math.ceil(tiles / compute_units)
            best = max(best, used * tiles / (waves * compute_units) * gemm_k_efficiency(k, k0))
        else:
            # expected tiles may be fractional (m_tiles); never more splits than SMs
            for split in range(1, min(compute_units, int(compute_units // tiles)) + 1):
                best = max(best, used * split * tiles / compute_units * gemm_k_efficiency(k / split, k0))
    return best


def grouped_gemm_efficiency(groups: int, m: float, n: float, k: float, compute_units: int, k0: float, *,
                            concurrent: int | None = None) -> float:
    """Share of the large-GEMM rate ``groups`` GEMMs of (m×k)·(k×n) reach: the experts of an MoE layer,
    ``m`` the rows (token-expert pairs) each expert receives, ``n`` and ``k`` one expert's widths.

    Every expert's rows are cut into tiles of their own -- DeepGEMM's contiguous layout aligns each
    expert's segment to the GEMM's M block, its masked layout covers each group's rows up to the block
    (deepseek-ai/DeepGEMM README @7a70b439), CUTLASS grouped GEMM schedules each problem's tiles -- so
    ``ceil(m / tile)`` per expert, not per layer: few tokens per expert leave its edge tiles empty.

    ``concurrent`` is how many of the GEMMs share the SMs at once: ``None`` (all: one fused grouped
    kernel, DeepGEMM / CUTLASS grouped / the serving engines' fused MoE, no split-K) or
    :data:`TE_GROUPED_GEMM_STREAMS` (Transformer Engine's cuBLAS GEMM per expert on 4 streams, each able
    to split K as cuBLAS does): the GEMMs then run in rounds, each round's tiles in their own waves.

    The result never exceeds :func:`gemm_efficiency` of the concatenated (groups·m)×n×k GEMM: any
    tiling the grouped kernel may use is one the single GEMM could use too. Read against DeepGEMM's
    grouped tables (hardware_catalog/measurements/h800_deepgemm_grouped.csv; tests/test_moe_grouped_gemm.py
    re-derives the agreement) with the catalog's unchanged figures and no figure of its own.
    """
    dense = gemm_efficiency(groups * m, n, k, compute_units, k0)
    if compute_units <= 0 or groups <= 1 or m <= 0:
        return dense if groups > 1 or m <= 0 else gemm_efficiency(m, n, k, compute_units, k0)
    return min(dense, _rounds_efficiency(groups, m, n, k, compute_units, k0, concurrent), 1.0)


def _rounds_efficiency(groups: int, m: float, n: float, k: float, compute_units: int, k0: float,
                       concurrent: int | None, m_tiles: Callable[[int], float] | None = None) -> float:
    """``groups`` GEMMs in rounds of ``concurrent`` (``None``: all in one fused kernel, no split-K), the
    efficiency time-weighted over the rounds; ``m_tiles`` as in :func:`_tile_round_efficiency`."""
    c = groups if concurrent is None else max(1, min(int(concurrent), groups))
    split_k = concurrent is not None
    full, rest = divmod(groups, c)
    # time-weighted over the rounds: each round of c GEMMs, the last of the remainder
    inv = full * c / _tile_round_efficiency(m, n, k, c, compute_units, k0, split_k, m_tiles)
    if rest:
        inv += rest / _tile_round_efficiency(m, n, k, rest, compute_units, k0, split_k, m_tiles)
    return groups / inv


def grouped_gemm_launches(groups: int, concurrent: int | None = None) -> int:
    """Kernels on the critical path of a grouped GEMM: one fused kernel, or one per round of
    ``concurrent`` streams (the launches and fills of GEMMs on parallel streams overlap)."""
    if concurrent is None or groups <= 1:
        return 1
    return math.ceil(groups / max(1, int(concurrent)))


def _binomial_tile_counter(tokens: int, p: float, capacity: float = 0.0) -> Callable[[int], float]:
    """``tm -> E[ceil(X / tm)]`` for ``X ~ Binomial(tokens, p)``: the row tiles one expert's GEMM expects when
    each of ``tokens`` tokens picks it with probability ``p`` (an expert with no rows launches no tile).
    ``capacity`` > 0: an expert keeps at most that many rows and drops the rest, ``min(X, capacity)``; the
    counter's ``rows`` attribute is the expected rows kept."""
    mean = tokens * p
    sd = math.sqrt(max(mean * (1.0 - p), 0.0))
    lo = max(0, int(mean - 12.0 * sd) - 1)
    hi = min(tokens, int(mean + 12.0 * sd) + 2)
    x = np.arange(lo, hi + 1, dtype=float)
    if 0.0 < p < 1.0:
        from scipy.special import gammaln

        logpmf = (math.lgamma(tokens + 1) - gammaln(x + 1) - gammaln(tokens - x + 1)
                  + x * math.log(p) + (tokens - x) * math.log1p(-p))
        pmf = np.exp(logpmf)
    else:
        pmf = (x == round(mean)).astype(float)
    pmf = pmf / pmf.sum()
    if capacity > 0:
        x = np.minimum(x, math.floor(capacity))
    cache: dict[int, float] = {}

    def tiles(tm: int) -> float:
        if tm not in cache:
            cache[tm] = float(np.dot(pmf, np.ceil(x / tm)))
        return cache[tm]

    tiles.rows = float(np.dot(pmf, x))  # type: ignore[attr-defined]
    tiles.draw = (x, pmf)  # type: ignore[attr-defined]
    return tiles


def _drawn_rounds_efficiency(groups: int, mean: float, n: float, k: float, compute_units: int, k0: float,
                             concurrent: int, draw: tuple[np.ndarray, np.ndarray]) -> float:
    """:func:`_rounds_efficiency` for GEMMs on parallel streams whose rows are drawn: a round of ``c`` GEMMs (each
    its own cuBLAS call, which sees its rows and picks its tile and split) takes the waves of the tiles its GEMMs
    actually have, so the expectation is taken over the round's whole tile count -- the sum of ``c`` independent
    experts' ``ceil(X / tile)`` -- not the waves of the expected count, which a sum of four draws is too spread
    for. ``draw``: the rows ``x`` one expert may receive and their probabilities. Time per outcome in tile-depth
    units, as :func:`_tile_round_efficiency` prices a wave (``tile * (k + k0)``) or a split (``tile * (k / s +
    k0)``, one wave of the split tiles); the efficiency is the expected useful work over the expected time."""
    x, pmf = draw
    c = max(1, min(int(concurrent), groups))
    full, rest = divmod(groups, c)

    def round_time(gemms: int) -> float:
        best_t = math.inf
        for tm, tn in GEMM_TILES:
            nt = math.ceil(n / tn)
            tiles_of = np.ceil(x / tm).astype(np.int64)
            low = int(tiles_of.min())
            per = np.bincount(tiles_of - low, weights=pmf)          # one expert's row-tile pmf, from ``low`` up
            total = np.ones(1)
            for _ in range(gemms):
                total = np.convolve(total, per)
            s = (np.arange(total.size) + gemms * low) * nt                        # the round's tiles
            t = np.zeros(total.size)
            for i in np.nonzero(total > 1e-15)[0]:
                tiles = int(s[i])
                if tiles == 0:
                    continue
                if tiles >= compute_units:
                    t[i] = math.ceil(tiles / compute_units) * (k + k0)
                else:
                    t[i] = min(k / split + k0 for split in range(1, compute_units // tiles + 1))
            best_t = min(best_t, float(np.dot(total, t)) * tm * tn)
        return best_t

    time = full * round_time(c) + (round_time(rest) if rest else 0.0)
    work = groups * mean * n * k / compute_units
    return work / time if time > 0 else 0.0


@functools.lru_cache(maxsize=4096)
def routed_grouped_gemm_efficiency(tokens: int, top_k: int, experts: int, local_experts: int, n: float, k: float,
                                   compute_units: int, k0: float, *, concurrent: int | None = None,
                                   load: float = 1.0, capacity: float = 0.0, pad: bool = False,
                                   spread: bool = True) -> float:
    """Share of the large-GEMM rate one fused grouped GEMM over a GPU's ``local_experts`` reaches when ``tokens``
    tokens are routed top-``top_k`` of ``experts``: :func:`grouped_gemm_efficiency` with each expert's rows as routing
    draws them rather than their mean.

    Under uniform routing (the balls-into-bins assumption the serving model's touched-expert count already makes)
    an expert receives ``Binomial(tokens, top_k / experts)`` rows, and its GEMM is cut into ``ceil(rows / tile)``
    row tiles of its own (DeepGEMM's masked layout covers each group's valid rows in whole blocks; CUTLASS grouped
    GEMM schedules each problem's tiles; TensorRT-LLM's Hopper MoE GEMMs tile the tokens in 128s, its kernel
    generator's ``M_TILES = [128]  # Currently M tile must be 128 for Grouped GEMM`` plus 256 x 128,
    cpp/tensorrt_llm/kernels/cutlass_kernels/python/generate_kernels.py -- :data:`GEMM_TILES`): the expected tiles ``E[ceil(X / tile)]`` differ from ``ceil(E[X] / tile)``
    wherever the mean sits near a tile edge -- more when the mean just fills its last tile (half the experts spill
    into one more), fewer when it barely spills -- which is where decode runs, experts seeing one or two tiles of
    rows; and an expert that draws no row launches no tile. Measured tables with balanced routing (every expert
    the same rows: aiconfigurator's ``balanced`` distribution, DeepGEMM's README benchmark) are the mean case,
    :func:`grouped_gemm_efficiency`. Never above the dense GEMM of the same rows.

    The serving engines call it with the defaults (one fused kernel, balanced load, dropless). A training step
    (fmsim.model.ops.moe_mlp_forward) passes how its stack runs the experts: ``concurrent`` as in
    :func:`grouped_gemm_efficiency` (Transformer Engine's per-expert cuBLAS GEMMs on
    :data:`TE_GROUPED_GEMM_STREAMS` streams, each able to split K: each round's waves taken in expectation over the
    tiles its four draws actually have, :func:`_drawn_rounds_efficiency`; one fused kernel keeps the waves of the
    expected tiles, as serving prices it, the sum over many experts being concentrated); ``load`` the busiest
    expert-parallel rank's rows over the balanced share, which scales each of its experts' draw
    (``Binomial(tokens, load * top_k / experts)``:
    the stated rank load carries the skew between ranks, the draw only the spread of each expert's rows around it
    -- the one figure is not applied twice); ``capacity`` an expert's capacity in rows (Megatron-Core
    ``--moe-expert-capacity-factor`` times the mean share): each expert keeps ``min(X, capacity)`` (the cap is
    on the expert's sum over the source ranks, where Megatron-Core caps each source's share -- sum of minima <=
    minimum of sums, so at most the rows kept are over-counted); ``pad`` (``--moe-pad-expert-input-to-capacity``):
    every expert computes exactly ``capacity`` rows, the draw gone; ``spread`` False: every expert gets exactly
    the mean rows (a deterministic benchmark gate such as NeMo AutoModel's ``FakeBalancedGate``, token t taking
    experts t*k .. t*k+k-1), which is :func:`grouped_gemm_efficiency` at those rows."""
    t = max(1, int(math.ceil(tokens)))
    p = min(1.0, top_k / experts) if experts > 0 else 1.0
    if load != 1.0:
        p = min(1.0, p * load)
    mean = t * p
    if pad and capacity > 0:
        return grouped_gemm_efficiency(local_experts, capacity, n, k, compute_units, k0, concurrent=concurrent)
    if not spread:
        m = min(mean, capacity) if capacity > 0 else mean
        return grouped_gemm_efficiency(local_experts, m, n, k, compute_units, k0, concurrent=concurrent)
    counter = _binomial_tile_counter(t, p, capacity)
    if capacity > 0:
        mean = counter.rows  # type: ignore[attr-defined]
    dense = gemm_efficiency(local_experts * mean, n, k, compute_units, k0)
    if compute_units <= 0 or mean <= 0:
        return dense
    if concurrent is None:
        e = _tile_round_efficiency(mean, n, k, local_experts, compute_units, k0, False, m_tiles=counter)
    else:
        e = _drawn_rounds_efficiency(local_experts, mean, n, k, compute_units, k0, concurrent,
                                     counter.draw)  # type: ignore[attr-defined]
    return min(dense, e, 1.0) if e > 0 else dense


class GroupedKernel(NamedTuple):
    """One grouped-GEMM implementation a stack runs its experts with: how many expert GEMMs share the SMs at
    once (``concurrent``, as :func:`grouped_gemm_efficiency` takes it) and the share of the shared
    tile/wave/depth model's rate its authors' own micro-benchmark reaches (``rate``), with the table it was
    read from (rows in hardware_catalog/measurements/grouped_gemm_kernels.csv; tests/test_grouped_kernels.py
    re-derives each ``rate``)."""

    concurrent: int | None
    rate: float
    source: str


#: The grouped-GEMM kernel classes (``parallelism.moe_grouped_gemm``). Each ``rate`` is the median over its
#: table of measured TFLOP/s over the model's (:func:`grouped_kernel_efficiency` with the catalog's H100/H200
#: figures: 16-bit large-GEMM 0.80, 132 SMs, K0 at the 16-bit rate, 4.2 us per kernel on the critical path).
GROUPED_KERNELS: dict[str, GroupedKernel] = {
    # Transformer Engine GroupedLinear: one cuBLAS GEMM per expert round-robin over 4 streams.
    "multi-stream": GroupedKernel(TE_GROUPED_GEMM_STREAMS, 0.96, (
        "NVIDIA/TransformerEngine PR #2045 (merged, 2.8.0), the TE 2.7 + CUDA 12.9 rerun of general_grouped_gemm "
        "on H100 BF16: (8, 4096, 768, 2048) 627.9 and (16, 2048, 768, 2048) 553.9 TFLOP/s, measured / model "
        "1.00 and 0.93, median 0.96")),
    # One grouped kernel for every expert at the model's own rate: DeepGEMM, which the model reproduces.
    "fused": GroupedKernel(None, 1.0, (
        "deepseek-ai/DeepGEMM README @7a70b439 grouped tables on H800 (hardware_catalog/measurements/"
        "h800_deepgemm_grouped.csv): the model reproduces them with no figure of its own (contiguous rms log "
        "error 0.04, tests/test_moe_grouped_gemm.py)")),
    # CUTLASS SM90 grouped GEMM (TE's NVTE_USE_CUTLASS_GROUPED_GEMM=1 on Hopper 16-bit).
    "cutlass-grouped": GroupedKernel(None, 1.0, (
        "NVIDIA/TransformerEngine PR #2045, the TE 2.7 rerun's CUTLASS column on H100 BF16: (8, 4096, 768, 2048) "
        "650.6 and (16, 2048, 768, 2048) 636.9 TFLOP/s, measured / model 1.01 and 0.99, median 1.00")),
    # PyTorch's torch._grouped_mm (CUTLASS), torchtitan's MoE experts.
    "torch-grouped-mm": GroupedKernel(None, 0.92, (
        "tile-ai/TileOPs PR #1567 framework sweep on H200 BF16 (kernel-only CUPTI timing): torch._grouped_mm "
        "over DeepGEMM's bf16 grouped GEMM at 256 experts of 4096 x 6144, 1024-8192 rows each: 603/658, "
        "624/670, 617/666, 597/657 = 0.92, 0.93, 0.93, 0.91, median 0.92 (DeepGEMM-grade = the 'fused' class)")),
}


def grouped_kernel(kernel: str) -> GroupedKernel:
    """The :data:`GROUPED_KERNELS` entry of ``kernel``; ValueError naming the classes otherwise."""
    try:
        return GROUPED_KERNELS[kernel]
    except KeyError:
        raise ValueError(f"unknown grouped-GEMM kernel {kernel!r} (one of {', '.join(GROUPED_KERNELS)})") from None


def grouped_kernel_efficiency(kernel: str, groups: int, m: float, n: float, k: float, compute_units: int,
                              k0: float, draw: dict | None = None) -> float:
    """Share of the large-GEMM rate ``groups`` expert GEMMs of (m×k)·(k×n) reach under the grouped-GEMM
    ``kernel`` class: the shared tile/wave/depth model with the class's concurrency times the class's measured
    ``rate``. ``draw``: how routing spreads the rows over the experts (the keywords of
    :func:`routed_grouped_gemm_efficiency`, ``tokens``, ``top_k`` and ``experts`` among them), each expert's rows
    as routing draws them -- the function serving prices its experts with; ``None``: every expert the mean ``m``
    rows (:func:`grouped_gemm_efficiency`). Never above the dense GEMM of the same rows."""
    g = grouped_kernel(kernel)
    dense = gemm_efficiency(max(1, groups) * m, n, k, compute_units, k0)
    if draw is None:
        shape = grouped_gemm_efficiency(groups, m, n, k, compute_units, k0, concurrent=g.concurrent)
    else:
        d = dict(draw)
        shape = routed_grouped_gemm_efficiency(d.pop("tokens"), d.pop("top_k"), d.pop("experts"), groups, n, k,
                                               compute_units, k0, concurrent=g.concurrent, **d)
    # one local expert is one cuBLAS GEMM whatever the class (the classes' rates were measured over 8-256 groups)
    return min(dense, (g.rate if groups > 1 else 1.0) * shape)
