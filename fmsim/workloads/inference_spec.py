"""The ``kind: inference`` scenario sections: ``traffic``, ``serving``, ``test_time_compute``, ``slo``.

Owns their keys, defaults, validation (located :class:`~fmsim.errors.ConfigError` with a "did you
mean" for unknown keys) and the frozen specs the serving simulator consumes. Length
distributions (fixed, uniform, normal, lognormal, empirical CSV) live here too, with their seeded
samplers. The field reference is ``docs/serving.md``.

``fmsim/scenario/`` hands these sections over raw (``Scenario.extra``); :func:`parse_inference_spec`
turns them into an :class:`InferenceSpec`.
"""
from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from ..errors import ConfigError, UnitError
from ..fields import _Section, suggest
from ..scenario.cluster import MAX_GPUS
from ..scenario.workload import MAX_SEQ_LEN
from ..units import parse_count, parse_time

ARRIVALS = ("poisson", "constant", "bursty", "closed-loop", "offline")
LENGTH_KINDS = ("fixed", "uniform", "normal", "lognormal", "empirical")
STRATEGIES = ("none", "best-of-n", "self-consistency", "sequential-revision")
ROUTERS = ("least-loaded", "round-robin", "random")
ADMISSIONS = ("optimistic", "reserve")
KV_DTYPES = ("auto", "bf16", "fp16", "fp8", "fp4")
SLO_METRICS = ("ttft", "tpot", "itl", "e2e", "question_latency")
SLO_STATS = ("p50", "p90", "p95", "p99", "mean")

TRAFFIC_KEYS = ("arrival", "rate", "burstiness", "concurrency", "requests", "duration", "horizon",
                "prompt_len", "output_len", "max_total_len", "think_time", "cached_prefix_len")
SERVING_KEYS = ("engine", "replicas", "max_seqs", "max_batch_tokens", "chunked_prefill", "mixed_batches",
                "prefix_caching", "kv_block_size", "memory_fraction", "kv_cache_dtype", "admission",
                "attention_dp", "router", "disaggregation", "attention_precision", "deepep",
                "two_batch_overlap")
DISAGG_KEYS = ("prefill_replicas", "decode_replicas", "prefill_tp", "decode_tp")
TTC_KEYS = ("samples", "strategy", "revision_rounds", "thinking", "verifier")
THINKING_KEYS = ("budget", "length")
VERIFIER_KEYS = ("model", "precision", "tp", "replicas", "output_len", "engine")
LENGTH_KEYS = ("dist", "value", "low", "high", "mean", "median", "sigma", "stdev", "file", "column",
               "min", "max", "outside")
OUTSIDE = ("clip", "redraw")
_STD_NORMAL = NormalDist()
REDRAW_ROUNDS = 200   # redraws of out-of-window lengths before a window is called (nearly) empty
# Bounds no real run comes near, so that a length, a spread or a count stays inside what the samplers'
# int64 arrays and the engine's float clock hold: a request's lengths (and every token count) at most the
# tokens of a training sequence (MAX_SEQ_LEN, 10^8), a lognormal's log-space sigma at most 10 (published
# response-length fits are 0.3-1.5; at 10 the far quantiles the estimate reads still fit a float), and
# GPU counts (tp, replicas) at most a cluster's (MAX_GPUS). A draw past MAX_TOKENS is clipped to it.
MAX_TOKENS = MAX_SEQ_LEN
MAX_SIGMA = 10.0


# ----------------------------------------------------------------------------------------------
# reading helpers


def _open(data: Any, file: str | None, where: str, allowed: tuple[str, ...]) -> _Section:
    """A section read by the shared reader (:class:`fmsim.fields._Section`, the one scenarios and
    catalogs use); a section left out (or null) reads as empty: every key at its default."""
    return _Section({} if data is None else data, file, where, allowed)


def _sub(s: _Section, key: str, allowed: tuple[str, ...]) -> _Section:
    """``s``'s mapping at ``key``, empty when the key is left out (or null)."""
    return s.section(key, allowed) or _open(None, s.file, s.path(key), allowed)


def _count_or_auto(s: _Section, key: str, maximum: int = MAX_TOKENS) -> int | None:
    """A count (``64``, ``"2k"``) in ``1..maximum``, or ``auto`` / left out: None (the engine's default)."""
    return None if s.raw(key, None) == "auto" else s.integer(key, None, counts=True, maximum=maximum)


def _tokens(s: _Section, key: str, default: Any = dataclasses.MISSING, *, minimum: int = 1,
            hint: str = "") -> Any:
    """A token count (``4096``, ``"2k"``) in ``minimum..MAX_TOKENS``."""
    return s.integer(key, default, minimum=minimum, maximum=MAX_TOKENS, counts=True, hint=hint)


def _parse_rate_per_s(v: Any) -> float:
    """Requests per second from ``12``, ``"12/s"``, ``"600/min"``, ``"inf"``."""
    if isinstance(v, bool):
        raise UnitError(f"{v!r} is not a rate")
    if isinstance(v, (int, float)):
        return float(v)
    s = str(v).strip().replace(" ", "")
    if s in ("inf", "infinity", "max"):
        return math.inf
    number, per = s, 1.0
    for suffix, scale in (("/s", 1.0), ("/min", 60.0), ("/h", 3600.0), ("qps", 1.0), ("rps", 1.0)):
        if s.endswith(suffix):
            number, per = s[: -len(suffix)], scale
            break
    try:
        return float(number) / per
    except ValueError:
        raise UnitError(
            f"cannot read {str(v).strip()!r} as a request rate (expected requests per second: 12, "
            "'12/s', '600/min', '2/h' or 'inf')"
        ) from None


# ----------------------------------------------------------------------------------------------
# length distributions


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthDist:
    """A token-length distribution, sampled with the scenario's seeded generator.

    ``fixed`` (``value``), ``uniform`` (``low``..``high`` inclusive), ``normal`` (``mean``,
    ``stdev``), ``lognormal`` (``median`` or arithmetic ``mean``, log-space ``sigma``) or
    ``empirical`` (``values`` read from a CSV column, drawn with replacement). Every sample is
    rounded; one outside ``[min, max]`` (``max`` 0 = no upper bound) is clipped to the bound
    (``outside: clip``) or drawn again (``outside: redraw``: the distribution truncated to the
    window, as a benchmark's dataset filter drops the requests outside its limits).
    """

    kind: str = "fixed"
    value: int = 0
    low: int = 0
    high: int = 0
    mean: float = 0.0
    median: float = 0.0
    sigma: float = 0.0
    stdev: float = 0.0
    values: tuple[int, ...] = ()
    min: int = 1
    max: int = 0
    outside: str = "clip"

    def __post_init__(self) -> None:
        assert self.kind in LENGTH_KINDS, self.kind
        assert self.outside in OUTSIDE, self.outside

    @property
    def _mu(self) -> float:
        if self.median > 0:
            return math.log(self.median)
        return math.log(self.mean) - self.sigma ** 2 / 2.0

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            x = np.full(n, float(self.value))
        elif self.kind == "uniform":
            x = rng.integers(self.low, self.high + 1, size=n).astype(float)
        elif self.kind == "normal":
            x = rng.normal(self.mean, self.stdev, size=n)
        elif self.kind == "lognormal":
            x = rng.lognormal(self._mu, self.sigma, size=n)
        else:
            x = rng.choice(np.asarray(self.values, dtype=float), size=n, replace=True)
        return np.rint(x)

    def _outside(self, x: np.ndarray) -> np.ndarray:
        bad = x < self.min
        return bad | (x > self.max) if self.max else bad

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths (int64)."""
        x = self._draw(rng, n)
        if self.outside == "redraw":
            bad = np.flatnonzero(self._outside(x))
            for _ in range(REDRAW_ROUNDS):
                if not bad.size:
                    break
                x[bad] = self._draw(rng, bad.size)
                bad = bad[self._outside(x[bad])]
            if bad.size:
                raise ConfigError(f"almost no draws of this {self.kind} length fall inside "
                                  f"[{self.min}, {self.max or 'inf'}] (outside: redraw)")
        x = np.clip(x, self.min, self.max or MAX_TOKENS)
        return x.astype(np.int64)

    def upper(self) -> float:
        """A practical maximum: the clip, or a far quantile (normal +4 sd, lognormal +4 sigma)."""
        if self.kind == "fixed":
            v = float(self.value)
        elif self.kind == "uniform":
            v = float(self.high)
        elif self.kind == "normal":
            v = self.mean + 4 * self.stdev
        elif self.kind == "lognormal":
            v = math.exp(self._mu + 4 * self.sigma)
        else:
            v = float(max(self.values))
        return min(v, float(self.max)) if self.max else v

    def smallest(self) -> int:
        """The shortest length a draw can give."""
        base = {"fixed": self.value, "uniform": self.low,
                "empirical": min(self.values) if self.values else self.min}.get(self.kind, self.min)
        low = max(self.min, int(base))
        return min(low, self.max) if self.max else low

    def expected(self) -> float:
        """Mean of the distribution as sampled (used by the analytical estimate): before clipping,
        or of the truncated distribution with ``outside: redraw``."""
        if self.outside == "redraw" and self.kind in ("normal", "lognormal", "empirical", "uniform"):
            return self._truncated_mean()
        if self.kind == "fixed":
            v = float(self.value)
        elif self.kind == "uniform":
            v = (self.low + self.high) / 2.0
        elif self.kind == "normal":
            v = self.mean
        elif self.kind == "lognormal":
            v = math.exp(self._mu + self.sigma ** 2 / 2.0)
        else:
            v = float(np.mean(self.values))
        v = max(v, float(self.min))
        return min(v, float(self.max)) if self.max else v

    def _truncated_mean(self) -> float:
        lo, hi = self.min - 0.5, (self.max + 0.5 if self.max else math.inf)   # rounding to whole tokens
        if self.kind == "uniform":
            a, b = max(self.low, self.min), min(self.high, self.max) if self.max else self.high
            return (a + b) / 2.0 if a <= b else float(self.min)
        if self.kind == "empirical":
            v = np.asarray(self.values, dtype=float)
            inside = v[~self._outside(v)]
            return float(inside.mean()) if inside.size else float(self.min)
        # normal, or lognormal as a normal in log space: E[X | lo < X < hi] (Johnson, Kotz and
        # Balakrishnan, "Continuous Univariate Distributions" vol. 1, truncated normal and lognormal)
        if self.kind == "normal":
            m, sd = self.mean, self.stdev
            if sd <= 0:
                return min(max(m, self.min), self.max or m)
            a, b = (lo - m) / sd, (hi - m) / sd
            z = _STD_NORMAL.cdf(b) - _STD_NORMAL.cdf(a)
            return m + sd * (_STD_NORMAL.pdf(a) - _STD_NORMAL.pdf(b)) / z if z > 0 else float(self.min)
        mu, s = self._mu, self.sigma
        if s <= 0:
            v = math.exp(mu)
            return min(max(v, self.min), self.max or v)
        a = (math.log(lo) - mu) / s if lo > 0 else -math.inf
        b = (math.log(hi) - mu) / s
        z = _STD_NORMAL.cdf(b) - _STD_NORMAL.cdf(a)
        if z <= 0:
            return float(self.min)
        return math.exp(mu + s * s / 2.0) * (_STD_NORMAL.cdf(b - s) - _STD_NORMAL.cdf(a - s)) / z


def fixed_length(n: int) -> LengthDist:
    return LengthDist(kind="fixed", value=int(n))


def parse_length(data: Any, *, file: str | None, where: str) -> LengthDist:
    """A :class:`LengthDist` from ``1000``, ``"2k"`` or a mapping ``{dist: lognormal, ...}``."""
    if isinstance(data, (int, float, str)) and not isinstance(data, bool):
        try:
            v = parse_count(data)
        except ConfigError as exc:
            raise ConfigError(exc.message, file=file, field=where) from None
        if not (1 <= v <= MAX_TOKENS) or not float(v).is_integer():
            raise ConfigError(f"{data!r} must be a whole number of tokens in 1..{MAX_TOKENS:,}", file=file,
                              field=where)
        return fixed_length(int(v))
    s = _Section(data, file, where, LENGTH_KEYS, what="a number of tokens, or a mapping with keys "
                 + ", ".join(LENGTH_KEYS))
    kind = s.choice("dist", LENGTH_KINDS, "fixed")
    lo = _tokens(s, "min", 1)
    hi = _tokens(s, "max", 0, minimum=0)
    if hi and hi < lo:
        raise s.err("max", f"{hi} is below min {lo}")
    outside = s.choice("outside", OUTSIDE, "clip")
    bounds: dict[str, Any] = {"min": lo, "max": hi, "outside": outside}
    if kind == "fixed":
        if not s.has("value"):
            raise s.err("value", "is required for dist: fixed")
        value = _tokens(s, "value")
        if outside == "redraw" and (value < lo or (hi and value > hi)):
            raise s.err("value", f"{value} is outside [min, max], so outside: redraw can never draw it")
        return LengthDist(kind=kind, value=value, **bounds)
    if kind == "uniform":
        for k in ("low", "high"):
            if not s.has(k):
                raise s.err(k, "is required for dist: uniform")
        low, high = _tokens(s, "low"), _tokens(s, "high")
        if high < low:
            raise s.err("high", f"{high} is below low {low}")
        if outside == "redraw" and (high < lo or (hi and low > hi)):
            raise s.err("low", f"{low}..{high} does not meet [min, max], so outside: redraw can never draw")
        return LengthDist(kind=kind, low=low, high=high, **bounds)
    if kind == "normal":
        if not s.has("mean"):
            raise s.err("mean", "is required for dist: normal")
        return LengthDist(kind=kind, mean=s.number("mean", maximum=MAX_TOKENS),
                          stdev=s.number("stdev", 0.0, inclusive=True, maximum=MAX_TOKENS), **bounds)
    if kind == "lognormal":
        if s.has("mean") == s.has("median"):
            raise s.err("median", "give exactly one of median or mean for dist: lognormal")
        if not s.has("sigma"):
            raise s.err("sigma", "is required for dist: lognormal (standard deviation of log length)")
        return LengthDist(kind=kind, mean=s.number("mean", 0.0, maximum=MAX_TOKENS),
                          median=s.number("median", 0.0, maximum=MAX_TOKENS),
                          sigma=s.number("sigma", inclusive=True, maximum=MAX_SIGMA), **bounds)
    # empirical
    if not s.has("file"):
        raise s.err("file", "is required for dist: empirical (a CSV file of lengths)")
    path = Path(str(s.raw("file")))
    if not path.is_absolute() and file:
        path = Path(file).parent / path
    column = s.raw("column", None)
    values = _read_lengths(path, column, s)
    d = LengthDist(kind=kind, values=values, **bounds)
    if outside == "redraw" and d._outside(np.asarray(values, dtype=float)).all():
        raise s.err("file", "has no length inside [min, max], so outside: redraw can never draw one")
    return d


MAX_LENGTHS_FILE_BYTES = 64 << 20   # an empirical lengths CSV: 64 MiB (millions of rows) is past any dataset


def _read_lengths(path: Path, column: Any, s: _Section) -> tuple[int, ...]:
    """The lengths in one column of the CSV at ``path``: a bounded regular text file of whole numbers
    in 1..MAX_TOKENS (blank cells and lengths below 1 skipped); every problem is a located error."""
    shown = repr(str(path)) if len(str(path)) <= 80 else repr(str(path)[:77] + "...")
    try:
        if not path.is_file():
            raise s.err("file", f"{shown} is not a regular file (expected a CSV file of lengths)")
        size = path.stat().st_size
        if size > MAX_LENGTHS_FILE_BYTES:
            raise s.err("file", f"{shown} is {size:,} bytes, over the {MAX_LENGTHS_FILE_BYTES:,}-byte limit "
                                "for a lengths file")
        with path.open("rb") as fh:
            raw = fh.read(MAX_LENGTHS_FILE_BYTES + 1)
    except OSError as exc:
        raise s.err("file", f"cannot read {shown}: {exc.strerror or exc}") from None
    if len(raw) > MAX_LENGTHS_FILE_BYTES:
        raise s.err("file", f"{shown} is over the {MAX_LENGTHS_FILE_BYTES:,}-byte limit for a lengths file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise s.err("file", f"{shown} is not UTF-8 text (byte {exc.start}) (expected a CSV file)") from None
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as exc:
        raise s.err("file", f"{shown} is not a readable CSV file ({exc})") from None
    if not rows:
        raise s.err("file", f"{shown} is empty")
    header = [h.strip() for h in rows[0]]
    has_header = not all(_is_number(h) for h in header)
    if column is None:
        idx = 0
    elif has_header and str(column) in header:
        idx = header.index(str(column))
    else:
        raise s.err("column",
                    f"no column {str(column)[:80]!r} in {shown}{suggest(str(column), header[:200])}")
    out = []
    for i, row in enumerate(rows[1:] if has_header else rows, start=2 if has_header else 1):
        if not row or idx >= len(row) or not row[idx].strip():
            continue
        cell = row[idx].strip()
        try:
            v = float(cell)
        except ValueError:
            v = math.nan
        if not math.isfinite(v) or v > MAX_TOKENS:
            what = cell if len(cell) <= 40 else cell[:37] + "..."
            raise s.err("file", f"{shown} line {i}: {what!r} is not a length (expected a number of tokens "
                                f"<= {MAX_TOKENS:,})") from None
        if v >= 1:
            out.append(round(v))
    if not out:
        raise s.err("file", f"{shown} has no lengths >= 1 in the chosen column")
    return tuple(out)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# ----------------------------------------------------------------------------------------------
# sections


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficSpec:
    """Arrivals and request sizes.

    ``arrival``: ``poisson`` / ``constant`` / ``bursty`` (gamma inter-arrivals whose coefficient of
    variation is ``burstiness``) at ``rate_per_s``; ``closed-loop`` (``concurrency`` clients, each
    sending its next request ``think_time_s`` after the previous one is answered); ``offline``
    (every request queued at t = 0, the max-load benchmark). The run stops issuing after
    ``num_requests`` requests or ``duration_s`` seconds; ``horizon_s`` ends the simulation (what is
    unfinished then is reported, never lost).
    """

    arrival: str = "poisson"
    rate_per_s: float = 1.0
    burstiness: float = 2.0
    concurrency: int = 0
    num_requests: int = 1000
    duration_s: float | None = None
    horizon_s: float | None = None
    think_time_s: float = 0.0
    prompt_len: LengthDist = field(default_factory=lambda: fixed_length(1000))
    output_len: LengthDist = field(default_factory=lambda: fixed_length(1000))
    max_total_len: int = 0          # > 0: a request whose prompt + output exceeds it is drawn again
    cached_prefix_len: int = 0

    def __post_init__(self) -> None:
        assert self.arrival in ARRIVALS


@dataclass(frozen=True, slots=True, kw_only=True)
class DisaggSpec:
    """Prefill/decode disaggregation: separate pools, KV moved from prefill to decode GPUs."""

    prefill_replicas: int
    decode_replicas: int
    prefill_tp: int | None = None      # None = parallelism.tp
    decode_tp: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingSpec:
    """Engine limits and features. ``None`` means: the engine profile's default, or ``auto``."""

    engine: str = "vllm"
    replicas: int | None = None            # None = gpus // (tp * pp) (after verifier GPUs)
    max_seqs: int | None = None            # None = engine default, or KV-derived for ``auto`` engines
    max_batch_tokens: int | None = None
    chunked_prefill: bool | None = None
    mixed_batches: bool | None = None
    prefix_caching: bool | None = None
    kv_block_size: int | None = None
    memory_fraction: float | None = None
    kv_cache_dtype: str = "auto"
    admission: str | None = None           # optimistic (preempt + recompute) | reserve (no eviction)
    attention_dp: bool = False
    router: str = "least-loaded"
    disaggregation: DisaggSpec | None = None
    #: the precision the checkpoint keeps its attention projections in (``auto``: the workload precision; NVIDIA's
    #: ModelOpt NVFP4 checkpoints often exclude ``self_attn`` from quantization)
    attention_precision: str = "auto"
    #: the MoE exchange as DeepEP's kernels run it (SGLang's --deepep-mode): none | normal | low_latency
    #: (fmsim.model.deepep); needs attention_dp
    deepep: str = "none"
    #: SGLang's --enable-two-batch-overlap (default off): the MoE layers as two micro-batches, one's DeepEP exchange
    #: behind the other's compute (fmsim.model.tbo); needs deepep
    two_batch_overlap: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierSpec:
    """A verifier / reward model scoring each sample (best-of-n). Runs on its own replicas."""

    model: Any                              # fmsim.model.architecture.ModelSpec
    precision: str | None = None            # None = workload precision
    tp: int = 1
    replicas: int = 1
    output_len: int = 1                     # 1 = a scalar reward head; more for a generative judge


@dataclass(frozen=True, slots=True, kw_only=True)
class TestTimeComputeSpec:
    """Several samples per question, how they become one answer, and long reasoning."""

    samples: int = 1
    strategy: str = "none"
    revision_rounds: int = 1
    thinking_budget: int = 0                # 0 = no thinking tokens
    thinking_len: LengthDist | None = None
    verifier: VerifierSpec | None = None

    __test__ = False   # not a pytest class despite the name


@dataclass(frozen=True, slots=True, kw_only=True)
class SLOSpec:
    """Latency limits: ``limits_s[("ttft", "p99")] = 2.0``."""

    limits_s: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def per_request_limit(self, metric: str) -> float:
        """The tightest limit on ``metric`` (a request meets the SLO when it is under it)."""
        vals = [v for (m, _), v in self.limits_s.items() if m == metric]
        return min(vals) if vals else math.inf


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceSpec:
    traffic: TrafficSpec = field(default_factory=TrafficSpec)
    serving: ServingSpec = field(default_factory=ServingSpec)
    ttc: TestTimeComputeSpec = field(default_factory=TestTimeComputeSpec)
    slo: SLOSpec = field(default_factory=SLOSpec)


# ----------------------------------------------------------------------------------------------
# parsing


def parse_traffic(data: Any, file: str | None) -> TrafficSpec:
    s = _open(data, file, "traffic", TRAFFIC_KEYS)
    arrival = s.choice("arrival", ARRIVALS, None)
    rate = s.parsed("rate", _parse_rate_per_s, None)
    concurrency = s.integer("concurrency", 0, minimum=1, counts=True)
    if arrival is None:
        if concurrency:
            arrival = "closed-loop"
        elif rate is not None and math.isinf(rate):
            arrival = "offline"
        else:
            arrival = "poisson"
    if arrival in ("poisson", "constant", "bursty"):
        if rate is None:
            raise s.err("rate", f"is required for arrival: {arrival} (requests per second, e.g. '12/s')")
        if math.isinf(rate):
            arrival = "offline"
        elif not rate > 0:
            raise s.err("rate", f"{rate:g} must be > 0")
    if arrival == "closed-loop" and not concurrency:
        raise s.err("concurrency", "is required for arrival: closed-loop (number of clients)")
    if arrival != "closed-loop" and concurrency:
        raise s.err("concurrency", f"only applies to arrival: closed-loop (not {arrival})")
    burst = s.number("burstiness", 2.0)
    if s.has("burstiness") and arrival != "bursty":
        raise s.err("burstiness", f"only applies to arrival: bursty (not {arrival})")
    duration = s.quantity("duration", parse_time, None, expected="a duration like '10 min'")
    horizon = s.quantity("horizon", parse_time, None, expected="a duration like '1 h'")
    default_n = 1000 if duration is None else MAX_REQUESTS
    n = s.integer("requests", default_n, counts=True)
    _at_most(s, "requests", n, MAX_REQUESTS, "requests")
    prompt = parse_length(s.raw("prompt_len", 1000), file=file, where="traffic.prompt_len")
    output = parse_length(s.raw("output_len", 1000), file=file, where="traffic.output_len")
    cached = _tokens(s, "cached_prefix_len", 0, minimum=0)
    max_total = _tokens(s, "max_total_len", 0, minimum=0)
    if max_total and max_total < prompt.min + output.min:
        raise s.err("max_total_len", f"{max_total} is below prompt_len min + output_len min "
                                     f"({prompt.min + output.min}), so no request fits")
    think = s.quantity("think_time", parse_time, 0.0, minimum=0.0, inclusive=True, expected="a time like '2 s'")
    return TrafficSpec(arrival=arrival, rate_per_s=rate if rate is not None else math.inf,
                       burstiness=burst, concurrency=concurrency, num_requests=n, duration_s=duration,
                       horizon_s=horizon, think_time_s=think,
                       prompt_len=prompt, output_len=output, max_total_len=max_total,
                       cached_prefix_len=cached)


def parse_serving(data: Any, file: str | None) -> ServingSpec:
    from ..model.serving_cost import ENGINES

    s = _open(data, file, "serving", SERVING_KEYS)
    engine = s.choice("engine", tuple(ENGINES), "vllm")
    mf = s.fraction("memory_fraction", None)
    disagg = None
    if s.has("disaggregation"):
        d = _sub(s, "disaggregation", DISAGG_KEYS)
        disagg = DisaggSpec(prefill_replicas=d.integer("prefill_replicas", counts=True, maximum=MAX_GPUS),
                            decode_replicas=d.integer("decode_replicas", counts=True, maximum=MAX_GPUS),
                            prefill_tp=d.integer("prefill_tp", None, counts=True, maximum=MAX_GPUS),
                            decode_tp=d.integer("decode_tp", None, counts=True, maximum=MAX_GPUS))
    bs = _tokens(s, "kv_block_size", None)
    deepep = _deepep(s)
    return ServingSpec(
        engine=engine,
        replicas=_count_or_auto(s, "replicas", MAX_GPUS),
        max_seqs=_count_or_auto(s, "max_seqs"),
        max_batch_tokens=_count_or_auto(s, "max_batch_tokens"),
        chunked_prefill=s.boolean("chunked_prefill", None),
        mixed_batches=s.boolean("mixed_batches", None),
        prefix_caching=s.boolean("prefix_caching", None),
        kv_block_size=bs,
        memory_fraction=mf,
        kv_cache_dtype=s.choice("kv_cache_dtype", KV_DTYPES, "auto"),
        admission=s.choice("admission", ADMISSIONS, None),
        attention_dp=s.boolean("attention_dp", False),
        router=s.choice("router", ROUTERS, "least-loaded"),
        disaggregation=disagg,
        attention_precision=s.choice("attention_precision", KV_DTYPES, "auto"),
        deepep=deepep,
        two_batch_overlap=_two_batch_overlap(s, deepep),
    )


def _two_batch_overlap(s: _Section, deepep: str) -> bool:
    """``serving.two_batch_overlap``: only over a DeepEP exchange (SGLang's TBO splits DeepEP's dispatch and combine
    from the compute; without one there is nothing for the other micro-batch to hide)."""
    on = s.boolean("two_batch_overlap", False)
    if on and deepep == "none":
        raise s.err("two_batch_overlap", "true needs serving.deepep: normal or low_latency (two-batch overlap hides "
                                         "one micro-batch's DeepEP dispatch/combine behind the other's compute)")
    return on


def _deepep(s: _Section) -> str:
    """``serving.deepep``: DeepEP's kernels move the tokens of an attention-DP engine's MoE layers."""
    from ..model.deepep import DEEPEP_MODES

    mode = s.choice("deepep", DEEPEP_MODES, "none")
    if mode != "none" and not s.boolean("attention_dp", False):
        raise s.err("deepep", f"{mode} needs attention_dp: true (DeepEP exchanges the tokens of data-parallel "
                              "attention ranks with the experts spread over all GPUs)")
    return mode


# Sizes no run could need, refused at load (the simulation runs a bounded sample of the requests anyway:
# fmsim.workloads.inference.MAX_SIMULATED_QUESTIONS); 10^9 is also what `duration:` alone stands for.
MAX_REQUESTS = 10**9
MAX_SAMPLES = 100_000
MAX_REVISION_ROUNDS = 1_000


def _at_most(s: _Section, key: str, value: int, bound: int, what: str) -> None:
    if value > bound:
        raise s.err(key, f"{value:,} {what} is past the {bound:,} any run could need")


def parse_ttc(data: Any, file: str | None, *, catalog: Any = None) -> TestTimeComputeSpec:
    s = _open(data, file, "test_time_compute", TTC_KEYS)
    samples = s.integer("samples", 1, counts=True)
    _at_most(s, "samples", samples, MAX_SAMPLES, "samples per prompt")
    strategy = s.choice("strategy", STRATEGIES, None)
    if strategy is None:
        strategy = "best-of-n" if s.has("verifier") else ("self-consistency" if samples > 1 else "none")
    rounds = s.integer("revision_rounds", 1, counts=True)
    _at_most(s, "revision_rounds", rounds, MAX_REVISION_ROUNDS, "revision rounds")
    if rounds > 1 and strategy != "sequential-revision":
        raise s.err("revision_rounds", f"only applies to strategy: sequential-revision (not {strategy})")
    if strategy == "sequential-revision" and not s.has("revision_rounds"):
        rounds = 2
    if strategy in ("best-of-n", "self-consistency") and samples < 2:
        raise s.err("samples", f"strategy {strategy} needs samples >= 2")
    budget, tlen = 0, None
    if s.has("thinking"):
        t = _sub(s, "thinking", THINKING_KEYS)
        budget = _tokens(t, "budget", hint="maximum thinking tokens per sample")
        length = t.raw("length", hint="distribution of thinking tokens, e.g. "
                       "{dist: lognormal, median: 4000, sigma: 1.0}")
        tlen = parse_length(length, file=file, where="test_time_compute.thinking.length")
    verifier = None
    if s.has("verifier"):
        if strategy != "best-of-n":
            raise s.err("verifier", f"a verifier scores samples for strategy: best-of-n (not {strategy})")
        v = _sub(s, "verifier", VERIFIER_KEYS)
        model = _resolve_model(v.raw("model", hint="a model_catalog name or an inline architecture"), file,
                               "test_time_compute.verifier.model", catalog)
        from ..catalog import PRECISIONS

        verifier = VerifierSpec(model=model, precision=v.choice("precision", PRECISIONS, None),
                                tp=v.integer("tp", 1, counts=True, maximum=MAX_GPUS),
                                replicas=v.integer("replicas", 1, counts=True, maximum=MAX_GPUS),
                                output_len=_tokens(v, "output_len", 1))
    elif strategy == "best-of-n":
        raise s.err("verifier", "strategy best-of-n needs a verifier: {model: ..., tp: ...}")
    return TestTimeComputeSpec(samples=samples, strategy=strategy, revision_rounds=rounds,
                               thinking_budget=budget, thinking_len=tlen, verifier=verifier)


def _resolve_model(raw: Any, file: str | None, where: str, catalog: Any) -> Any:
    from ..model.architecture import model_from_mapping

    if isinstance(raw, Mapping):
        return model_from_mapping(raw, file=file, where=where)
    if catalog is None:
        from ..catalog import load_catalog

        catalog = load_catalog()
    try:
        return catalog.model(str(raw))
    except ConfigError as exc:
        raise ConfigError(exc.message, file=file, field=where) from None


def parse_slo(data: Any, file: str | None) -> SLOSpec:
    """``{ttft_p99: 2 s, tpot_p50: 50 ms}`` or ``{ttft: {p99: 2 s}, tpot: {p50: 50 ms}}``."""
    allowed = tuple(f"{m}_{p}" for m in SLO_METRICS for p in SLO_STATS) + SLO_METRICS
    s = _open(data, file, "slo", allowed)
    limits: dict[tuple[str, str], float] = {}
    latency = "a latency like '2 s' or '50 ms'"
    for key in s.data:
        if key in SLO_METRICS:
            sub = _sub(s, key, SLO_STATS)
            for stat in sub.data:
                limits[(key, stat)] = sub.quantity(stat, parse_time, expected=latency)
        else:
            metric, stat = key.rsplit("_", 1)
            limits[(metric, stat)] = s.quantity(key, parse_time, expected=latency)
    return SLOSpec(limits_s=limits)


def parse_inference_spec(extra: Mapping[str, Any], *, file: str | None = None,
                         catalog: Any = None) -> InferenceSpec:
    """All four sections from ``Scenario.extra`` (missing sections take their defaults)."""
    return InferenceSpec(traffic=parse_traffic(extra.get("traffic"), file),
                         serving=parse_serving(extra.get("serving"), file),
                         ttc=parse_ttc(extra.get("test_time_compute"), file, catalog=catalog),
                         slo=parse_slo(extra.get("slo"), file))


def replace(spec: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` re-exported for callers building variants (sweeps, plan-capacity)."""
    return dataclasses.replace(spec, **changes)
