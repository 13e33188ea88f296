"""What the explorer computes, without a widget: scenario text + knob overrides -> outcome.

Owns the what-if model of the app (DESIGN.md "faces"): a *base* scenario (a bundled file or an
upload, kept as its YAML text), the knobs as dotted overrides applied to the base's canonical
mapping (``fmsim.scenario.scenario_to_mapping``), one call of the fmsim API, and the packaging
of its answer (or its error, with what to change) into a frozen :class:`Outcome` that the pages
render and ``app/explorer/cache.py`` caches; what to change when a plan cannot run (a
neighbouring plan that fits, a global batch for a new node count); the load curve and the
comparison table. The number formats (``formats.py``), the link's parameters (``links.py``) and
the chart rows (``views.py``) are re-exported here, so a page imports one module.

Everything here goes through the package root API (``fmsim.load_catalog``, ``fmsim.estimate``,
``fmsim.simulate``) and the scenario round trip of ``fmsim.scenario``; nothing imports
streamlit, so the tests call it directly. ``tests/test_layering.py`` checks both.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import fmsim
from fmsim.catalog import data_root
from fmsim.export import csv_text
from fmsim.scenario import (MAX_FILE_BYTES, decode_text, load_yaml_text, scenario_from_mapping,
                            scenario_to_mapping)
from fmsim.stacks import SETTABLE, lookup, stack_defaults

from .formats import (  # noqa: F401 - re-exported: the pages and tests use logic.<name>
    finite,
    delta_text,
    _CHART_UNITS,
    chart_value,
    _MARKDOWN_SPECIAL,
    article,
    md_escape,
    _LABELS,
    label_of,
    fmt_time,
    fmt_bytes,
    fmt_pair,
    fmt_fit,
    fmt_usd,
    fmt_count,
    fmt_pct,
    fmt_column,
    fmt_tokens,
)
from .links import (  # noqa: F401 - re-exported: the pages and tests use logic.<name>
    URL_SCENARIO,
    URL_ENGINE,
    url_params,
    AtLeast,
    knobs_from_url,
)
from .views import (  # noqa: F401 - re-exported: the pages and tests use logic.<name>
    TIMELINE_MAX_ROWS,
    _lane,
    timeline_rows,
    latency_cdf,
    memory_rows,
    hbm_bytes,
    breakdown_rows,
    serving_parts,
)

TRAINING_KINDS = ("pretrain", "finetune")
SERVING_KINDS = ("inference",)
PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "fp32")
PRICING_OPTIONS = ("on-demand", "capacity-block", "savings-plan-1yr", "savings-plan-3yr")

# The discrete-event step costs about 40 us per engine job on one core (bench/bench_app.py);
# above this many jobs the page shows the analytical estimate unless asked to simulate anyway,
# so that a knob change stays under one second.
DES_JOB_LIMIT = 12_000
DES_S_PER_JOB = 40e-6  # the figure above, for the time a large step would take
# Serving: the load curve's rates, as fractions of the saturation throughput.
LOAD_FRACTIONS = (0.1, 0.25, 0.4, 0.55, 0.7, 0.8, 0.9, 0.95, 1.0, 1.1, 1.25)


# ----------------------------------------------------------------------------------------------
# scenario sources


@dataclass(frozen=True, slots=True, kw_only=True)
class Bundled:
    """A scenario file shipped with fmsim (``scenarios/**.yaml``)."""

    label: str  # path under scenarios/, e.g. examples/llama3-70b-p5.yaml
    path: str
    kind: str  # workload.kind as written ("" when the file does not say)


def scenarios_dir() -> Path:
    """``scenarios/`` of the checkout, or of the installed wheel."""
    return data_root() / "scenarios"


def bundled_signature() -> tuple[tuple[str, int, int], ...]:
    """``(path, mtime_ns, size)`` of every bundled scenario file: cheap, and changes with any edit."""
    out = []
    for p in sorted(scenarios_dir().rglob("*.yaml")):
        st = p.stat()
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


def bundled_scenarios() -> tuple[Bundled, ...]:
    """Every bundled scenario with its kind; examples first, then the rest, each sorted."""
    root = scenarios_dir()
    out = []
    for p in sorted(root.rglob("*.yaml")):
        rel = p.relative_to(root).as_posix()
        kind = ""
        try:
            if p.stat().st_size <= MAX_FILE_BYTES:
                data = load_yaml_text(p.read_text(encoding="utf-8-sig"), file=rel)
                wl = data.get("workload") if isinstance(data, Mapping) else None
                kind = str(wl.get("kind", "")) if isinstance(wl, Mapping) else ""
        except (fmsim.FmsimError, OSError, UnicodeDecodeError):
            kind = ""
        out.append(Bundled(label=rel, path=str(p), kind=kind))
    return tuple(sorted(out, key=lambda b: (not b.label.startswith("examples/"), b.label)))


def read_bundled(label: str) -> str:
    """The text of bundled scenario ``label`` (a path under ``scenarios/``)."""
    root = scenarios_dir().resolve()
    p = (root / label).resolve()
    if root not in p.parents or not p.is_file():
        raise fmsim.ConfigError("no such bundled scenario", file=label)
    return p.read_text(encoding="utf-8-sig")


def decode_upload(name: str, data: bytes) -> str:
    """An uploaded scenario's text, checked as a scenario file's bytes are (fmsim.yaml_safe.decode_text):
    refused over the size limit, when not UTF-8 or when it holds a NUL byte."""
    return decode_text(data, name, "scenario")


# ----------------------------------------------------------------------------------------------
# scenario text -> what-if scenario


def load_base(text: str, file: str) -> Any:
    """The base scenario in ``text`` (named ``file`` in messages); raises ``FmsimError``."""
    if not text.strip():
        raise fmsim.ConfigError(
            "the file is empty (expected a scenario mapping: version, name, workload, ...)", file=file
        )
    data = load_yaml_text(text, file=file)
    if data is None:
        raise fmsim.ConfigError("the file holds no YAML document, only comments", file=file)
    return scenario_from_mapping(data, file=file)


def whatif_scenario(text: str, file: str, overrides: Sequence[tuple[str, Any]] = ()) -> Any:
    """The base scenario with the knobs' ``overrides`` (dotted paths) applied and re-validated.

    The overrides apply to the base's canonical mapping (``scenario_to_mapping``: ``nodes`` not
    ``gpus``, ``global_batch`` in sequences, ``dp`` written out), so every knob has one key.
    """
    base = load_base(text, file)
    if not overrides:
        return base
    data = scenario_to_mapping(base)
    knobs = dict(overrides)
    par = data.get("parallelism", {})
    if knobs.get("parallelism.recompute", base.parallelism.recompute) != "selective":
        # the modules (or torchtitan's op policy) belong to selective recompute: a knob that leaves it drops them
        par.pop("recompute_modules", None)
        par.pop("recompute_policy", None)
    if (knobs.get("parallelism.recompute", base.parallelism.recompute) != "full"
            or knobs.get("parallelism.pp", base.parallelism.pp) != base.parallelism.pp
            or knobs.get("parallelism.vpp", base.parallelism.vpp) != base.parallelism.vpp):
        # a layer count per virtual stage of full recompute: a knob that leaves full recompute or changes
        # the virtual stages drops it (every layer recomputes again)
        par.pop("recompute_layers", None)
    if knobs.get("workload.precision", base.workload.precision) not in ("fp8", "fp4"):
        # an fp8 weight copy belongs to an fp8/fp4 recipe: a precision knob that leaves one drops it
        par.pop("param_gather_precision", None)
    if (knobs.get("parallelism.pp", base.parallelism.pp) != 1
            or knobs.get("parallelism.recompute", base.parallelism.recompute) != "none"
            or str(knobs.get("cluster.instance", base.cluster.instance.name)) != base.cluster.instance.name):
        # activation offloading needs pp 1, no recompute and the base's host link: a knob that
        # leaves any of them drops it (Megatron-Core refuses the combinations)
        par.pop("offload_activations", None)
    if knobs.get("stack"):
        drop_inherited(data, load_yaml_text(text, file=file) or {})
    return scenario_from_mapping(data, file=file, overrides=knobs)


def training_band(text: str, file: str, overrides: Sequence[tuple[str, Any]] = ()) -> tuple[float, float, str, int]:
    """The what-if's band (fmsim.band, analytical): (low, high) as fractions of the point, what moves it most,
    and how many components were varied; raises ``FmsimError`` like the what-if itself."""
    from fmsim.band import band

    b = band(whatif_scenario(text, file, overrides))
    lo, hi = b.relative()
    return lo, hi, b.reason(), len(b.varied)


#: the stack picker's first choice: the base file's own ``stack:`` (or none)
FILE_STACK = "(file's own)"


def drop_inherited(data: dict[str, Any], raw: Mapping[str, Any]) -> None:
    """Drop from the canonical mapping ``data`` every stack-settable field (``fmsim.stacks.SETTABLE``) the
    base file's own YAML ``raw`` does not state: those came from its stack or the global default, and a
    stack picked in the what-if should supply them instead (the file's own fields still win)."""
    for path in SETTABLE:
        if lookup(raw, path) is not None:
            continue
        *parents, leaf = path.split(".")
        chain = [data]
        for part in parents:
            node = chain[-1].get(part)
            if not isinstance(node, dict):
                break
            chain.append(node)
        else:
            chain[-1].pop(leaf, None)
            for parent, part in zip(reversed(chain[:-1]), reversed(parents)):  # no empty section left
                if not parent[part]:
                    parent.pop(part)


def stack_sets(name: str, precision: str) -> list[str]:
    """What training stack ``name`` sets for a file of ``precision``: ``field: value`` strings."""
    defaults = stack_defaults(fmsim.load_catalog().stack(name), precision)
    return [f"{p.split('.')[-1]}: {lookup(defaults, p)}" for p in SETTABLE if lookup(defaults, p) is not None]


def training_stacks() -> list[str]:
    """The stack picker's choices: the file's own, then the catalog's training stacks."""
    return [FILE_STACK] + sorted(n for n, p in fmsim.load_catalog().stacks.items() if p.kind == "training")


def scenario_yaml(sc: Any) -> str:
    """The scenario as YAML that loads back to an equal scenario (SI numbers, explicit values)."""
    head = "# fmsim scenario saved by the what-if explorer (fmsim app); run it with: fmsim run FILE\n"
    return head + yaml.safe_dump(scenario_to_mapping(sc), sort_keys=False, allow_unicode=True, width=100)


def whatif_name(base_name: str, typed: Any, changed: bool) -> str:
    """The what-if's scenario name: the one typed, else the base's with ``-whatif`` once a knob
    moved (so a downloaded or kept what-if is never mistaken for its base), else the base's."""
    typed = str(typed or "").strip()
    return typed or (f"{base_name}-whatif" if changed else base_name)


def whatif_yaml(sc: Any, result: Any, engine: str, changed: bool) -> str:
    """The what-if as the scenario file the page offers for download, fit for ``fmsim check``.

    Unchanged, it is the base scenario. Once a knob moved, the base's ``measured:`` values (a
    published run of the base layout) are dropped, and its ``expect:`` bands (the base's numbers)
    are re-derived: each column the base checked gets this what-if's own simulated value with the
    base's tolerance, so ``fmsim check FILE`` re-runs the simulation and passes while fmsim's
    numbers stay. When the page showed the analytical estimate the bands are dropped instead
    (``fmsim check`` runs the simulation, whose numbers the page did not compute).
    """
    data = scenario_to_mapping(sc)
    head = "# fmsim scenario saved by the what-if explorer (fmsim app); run it with: fmsim run FILE\n"
    if changed:
        data.pop("measured", None)
        base_expect = data.pop("expect", None) or {}
        bands = {}
        if engine == "des" and result is not None:
            for col, band in base_expect.items():
                v = finite(result.metrics.get(col))
                if v is not None and not isinstance(result.metrics.get(col), bool):
                    bands[col] = {
                        "value": v, "rel_tol": band.get("rel_tol", 0.03), "abs_tol": band.get("abs_tol", 0.0)
                    }
        if bands:
            data["expect"] = bands
            head += (
                f"# expect: this what-if's own simulated numbers (fmsim {fmsim.__version__}), with the base\n"
                "# scenario's tolerances: a regression check, not a measurement\n"
            )
        elif base_expect:
            head += "# expect: the base scenario's bands were dropped (they checked the base's numbers)\n"
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


_MAP = "__mapping__"


def parse_knob_text(text: str) -> Any:
    """A text knob's value read as YAML (``1000``, ``{dist: lognormal, median: 800}``, ``2/s``);
    empty text is None; text that is not YAML is kept as text (the scenario check then says what is
    wrong with it, located)."""
    text = text.strip()
    if not text:
        return None
    try:
        return load_yaml_text(text, file="knob")
    except fmsim.FmsimError:
        return text


def as_overrides(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Knob values as a hashable, ordered override tuple (the cache key); a mapping value (a
    whole ``slo:`` section, say) travels as ``("__mapping__", its JSON text)``."""
    out = []
    for k in sorted(values):
        v = values[k]
        if isinstance(v, Mapping):
            v = (_MAP, json.dumps(v, sort_keys=True))
        out.append((k, v))
    return tuple(out)


def _unfreeze(overrides: Sequence[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    out = []
    for k, v in overrides:
        if isinstance(v, tuple) and len(v) == 2 and v[0] == _MAP:
            v = json.loads(v[1])
        out.append((k, v))
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# outcomes


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One run of the API for the page: the result, or the error and what to change."""

    result: Any = None  # fmsim.results.Result shown (DES or analytical)
    estimate: Any = None  # the analytical estimate (training: always computed)
    engine: str = ""  # "des" | "analytical"
    note: str = ""  # why the engine differs from the one asked for, and the like
    error: str = ""  # FILE: field: message
    error_kind: str = ""  # the error's class name
    hint: str = ""  # what to change
    yaml_text: str = ""  # the what-if scenario as YAML (when it validated)
    timeline: tuple[tuple[str, float, float, str, str], ...] = ()  # (lane, start_s, end_s, category, label)
    timeline_note: str = ""
    offered_requests_per_s: float | None = None  # serving: the open-loop rate the what-if offers

    @property
    def ok(self) -> bool:
        return self.result is not None and not self.error

    def csv(self) -> str:
        """The result as the CSV of ``fmsim run --csv`` (one row)."""
        return csv_text([self.result.to_dict()]) if self.result is not None else ""


# What to change, by the field an error names (the first prefix that matches).
_HINTS_BY_FIELD = {
    "parallelism.tp": (
        "Pick a tp that divides the model's attention heads (and its KV heads, or is a multiple of "
        "them); keep tp inside one scale-up domain for fast all-reduces."
    ),
    "parallelism.dp": (
        "Make the GPU count (nodes x GPUs per node) a multiple of tp x pp x cp: change the node count "
        "or one of tp, pp, cp."
    ),
    "parallelism.pp": (
        "Use at most as many pipeline stages (pp x vpp) as the model has layers, and a GPU count that "
        "tp x pp x cp divides."
    ),
    "parallelism.vpp": "Virtual stages need pp > 1 and pp x vpp <= layers; set vpp to 1 without a pipeline.",
    "parallelism.schedule": "Use schedule 'interleaved' with vpp >= 2, and '1f1b' or 'gpipe' with vpp 1.",
    "parallelism.cp": "Pick a cp with seq_len a multiple of 2 x cp.",
    "parallelism.cp_comm": (
        "The a2a exchange splits a TP rank's heads over cp: pick a cp that divides them, or the ring exchange."
    ),
    "parallelism.dp_shard": (
        "Pick a shard group that divides dp (GPUs / (tp x pp x cp)), with ZeRO 1-3 and ep 1, or 0 for "
        "all of dp."
    ),
    "parallelism.recompute_layers": (
        "Recompute layers apply with full recompute: pick at most the layers of one virtual stage "
        "(layers / (pp x vpp)), or 0 for every layer."
    ),
    "parallelism.ep": (
        "Expert parallelism needs an MoE model: pick an ep that divides the experts and the tp x cp x "
        "dp ranks of a stage (ep 1 for dense models)."
    ),
    "workload.global_batch": (
        "Make the global batch a multiple of dp x micro batch: change the global batch, the micro "
        "batch, or the node count (which sets dp)."
    ),
    "workload.moe_imbalance": (
        "MoE load settings apply to MoE models with ep > 1 (trained, or served with attention DP): set the "
        "imbalance back to 1, or pick an MoE model and an expert-parallel width."
    ),
    "workload.precision": (
        "Pick a precision the accelerator has (listed above) or an instance whose accelerator has it."
    ),
    "workload.model": "Pick a model from the catalog (Catalog page).",
    "cluster.instance": "Pick an instance from the catalog (Catalog page).",
    "cluster.nodes": "Use a whole number of nodes, at least 1.",
    "pricing": "Pick a pricing option the catalog has for this instance (Catalog page, prices).",
    "traffic": (
        "Check the traffic settings: a rate > 0 for poisson/constant/bursty arrivals, clients for "
        "closed-loop."
    ),
    "test_time_compute": (
        "best-of-n needs a verifier in the scenario; self-consistency needs samples >= 2; revision "
        "rounds apply to sequential-revision only."
    ),
    "serving": "Check the serving engine limits (replicas, max sequences, batch tokens).",
    "slo": "SLO limits are times > 0.",
}


OOM_HINT = (
    "Make it fit: raise tp or pp, turn on recompute (selective or full), use a higher ZeRO "
    "stage, a smaller micro batch, or an instance with more HBM per GPU."
)


def hint_for(exc: BaseException) -> str:
    """What to change, for an error of the API (shown under the error)."""
    if isinstance(exc, fmsim.OutOfMemoryError):
        return OOM_HINT
    if isinstance(exc, fmsim.NotBuiltError):
        return "This workload kind has no simulator yet; pick a training or serving scenario."
    field = getattr(exc, "field", None) or ""
    for prefix, hint in _HINTS_BY_FIELD.items():
        if field == prefix or field.startswith((prefix + ".", prefix + "[")):
            return hint
    if isinstance(exc, fmsim.InfeasibleError):
        return "This plan cannot run as set: change the setting the message names."
    if isinstance(exc, fmsim.ConfigError):
        return "Fix the setting the message names (the scenario file or the knob)."
    return "Change the setting the message names."


def failure(exc: BaseException, *, yaml_text: str = "", file: str = "") -> Outcome:
    """An :class:`Outcome` for an error: fmsim's own message (``file: ...`` first, as the CLI's line, when
    the error does not name it: a plan that does not fit, say), or a one-line internal error."""
    if isinstance(exc, fmsim.FmsimError):
        text = " ".join(str(exc).split("\n"))
        if file and not text.startswith(f"{file}:"):
            text = f"{file}: {text}"
        return Outcome(error=text, error_kind=type(exc).__name__, hint=hint_for(exc), yaml_text=yaml_text)
    first = str(exc).splitlines()[0] if str(exc) else ""
    return Outcome(
        error=f"internal error in fmsim ({type(exc).__name__}: {first})",
        error_kind="InternalError",
        hint="This is a bug, not your input: try other settings, and report the scenario.",
        yaml_text=yaml_text,
    )


def infeasible_reason(result: Any, offered: float | None = None, saturation: float | None = None) -> str:
    """Why the plan of ``result`` cannot run as asked ("" when it can): it does not fit in
    memory, misses an SLO, leaves requests unserved, never finishes its run (goodput 0) or serves less
    than the ``offered`` rate (see :func:`overload`). A page then shows no "better" deltas."""
    if result is None:
        return ""
    m = result.metrics
    if m.get("fits") is False:
        return "it does not fit in memory"
    if m.get("unfinished_requests") or m.get("rejected_requests"):
        return "it is overloaded: requests are left unserved"
    if m.get("slo_met") is False:
        return "it misses its SLOs"
    if m.get("goodput") == 0:
        return "the run never finishes: it is interrupted faster than its checkpoints keep progress (goodput 0)"
    if offered and overload(result, offered, saturation):
        return "it is overloaded: it serves less than the offered load"
    return ""


def greyed_reason(result: Any, base: Any = None, offered: float | None = None,
                  saturation: float | None = None, base_offered: float | None = None) -> str:
    """Why the what-if's changes against ``base`` are shown neither better nor worse ("" when both
    plans run as asked): the what-if cannot run (:func:`infeasible_reason`), or the base cannot, so
    that a change against it is no improvement either way. A page greys its deltas then."""
    bad = infeasible_reason(result, offered, saturation)
    if bad:
        return f"the what-if cannot run as asked: {bad}"
    base_bad = infeasible_reason(base, base_offered) if base is not None else ""
    if base_bad:
        return f"the base cannot run as asked ({base_bad}), so it is no reference"
    return ""


# Neighbouring plans tried, in order, when a plan does not fit: (name, change of the scenario).
def _neighbours(sc: Any) -> list[tuple[str, dict[str, Any]]]:
    par, wl = sc.parallelism, sc.workload
    out: list[tuple[str, dict[str, Any]]] = [
        (f"tp {par.tp * 2} (now {par.tp})", {"parallelism.tp": par.tp * 2}),
        (f"pp {par.pp * 2} (now {par.pp})", {"parallelism.pp": par.pp * 2}),
    ]
    nxt = {"none": "selective", "selective": "full"}.get(par.recompute)
    if nxt:
        out.append((f"recompute {nxt} (now {par.recompute})", {"parallelism.recompute": nxt}))
    if par.zero < 3:
        out.append((f"ZeRO stage {par.zero + 1} (now {par.zero})", {"parallelism.zero": par.zero + 1}))
    if wl.micro_batch > 1:
        mb = wl.micro_batch // 2
        out.append((f"micro batch {mb} (now {wl.micro_batch})", {"workload.micro_batch": mb}))
    return out


def fit_suggestion(text: str, file: str, overrides: Sequence[tuple[str, Any]] = ()) -> str:
    """A concrete change that makes a plan that does not fit in memory fit: the neighbouring plans
    (tp or pp doubled, more recompute, the next ZeRO stage, half the micro batch; then two of them
    at once) are evaluated with ``fmsim.estimate`` in that order and the first that fits is named
    with its memory and step time. "" when the plan fits or none of them does."""
    base = dict(_unfreeze(overrides))
    try:
        sc = whatif_scenario(text, file, tuple(base.items()))
        if fmsim.estimate(sc).metrics.get("fits", True):
            return ""
    except Exception:  # noqa: BLE001 - no suggestion for a plan that does not load
        return ""
    singles = _neighbours(sc)
    tries = [[s] for s in singles] + [[a, b] for i, a in enumerate(singles) for b in singles[i + 1:]]
    for combo in tries:
        change: dict[str, Any] = {}
        for _, c in combo:
            change.update(c)
        try:
            cand = whatif_scenario(text, file, tuple({**base, **change, "parallelism.dp": "auto"}.items()))
            est = fmsim.estimate(cand)
        except Exception:  # noqa: BLE001 - a neighbour that is not a valid plan is skipped
            continue
        m = est.metrics
        if m.get("fits"):
            what = " and ".join(name for name, _ in combo)
            return (
                f"Try {what}: it fits, {fmt_fit(m['memory_per_gpu_bytes'], m['hbm_per_gpu_bytes'])} per GPU, "
                f"step {fmt_time(m['step_time_s'])} (analytical estimate, dp {m['dp']})."
            )
    return ""


def approx_des_jobs(sc: Any, est: Any) -> int:
    """Engine jobs of a simulated training step: forward, backward and two sends per micro-batch
    and virtual stage (``fmsim/workloads/pretrain.py`` build_jobs), plus the DP buckets."""
    m = int(est.metrics.get("num_microbatches") or 1)
    vpp = int(est.metrics.get("vpp") or sc.parallelism.vpp or 1)
    return 4 * sc.parallelism.pp * vpp * m + 64 * sc.parallelism.pp


def _wrong_kind(file: str, kind: str, what: str, other_page: str, yaml_text: str) -> Outcome:
    """The outcome of a scenario opened on the page of another kind."""
    return Outcome(
        error=f"{file}: workload.kind: {kind} is not a {what} kind",
        error_kind="KindError",
        yaml_text=yaml_text,
        hint=f"Open this scenario on the {other_page} page (or the Compare page).",
    )


def _opened(
    text: str,
    file: str,
    overrides: Sequence[tuple[str, Any]],
    kinds: tuple[str, ...],
    what: str,
    other_page: str,
) -> tuple[Any, str, Outcome | None]:
    """The what-if scenario, its YAML and, when its kind is not one of ``kinds``, the outcome to show
    instead (:func:`_wrong_kind`): the first steps of every ``run_*``. Raises what the reader raises."""
    sc = whatif_scenario(text, file, _unfreeze(overrides))
    yaml_text = scenario_yaml(sc)
    if sc.workload.kind not in kinds:
        return sc, yaml_text, _wrong_kind(file, sc.workload.kind, what, other_page, yaml_text)
    return sc, yaml_text, None


def batch_offers(text: str, file: str, overrides: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, int]]:
    """Global batches that make a changed node count work, when the what-if's global batch is no
    longer a multiple of dp x micro batch: ``[(label, global_batch)]`` keeping the base's tokens
    per step (the nearest multiple) and its tokens per GPU (scaled with the GPU count, then the
    nearest multiple). Empty when the node count is the base's or the what-if does not load."""
    knobs = dict(_unfreeze(overrides))
    try:
        base = load_base(text, file)
        nodes = int(knobs.get("cluster.nodes", base.cluster.nodes))
        if nodes == base.cluster.nodes:
            return []
        mb = int(knobs.get("workload.micro_batch", base.workload.micro_batch))
        inst = knobs.get("cluster.instance")
        instance = fmsim.load_catalog().instances[str(inst)] if inst else base.cluster.instance
        gpus = nodes * int(instance.num_accelerators)
        # a global batch every dp divides (dp divides the GPU count): the plan's dp, as the API derives it
        probe = whatif_scenario(text, file, tuple({**knobs, "workload.global_batch": gpus * mb}.items()))
    except Exception:  # noqa: BLE001 - no offer for a what-if that does not load for another reason
        return []
    unit = int(probe.parallelism.dp) * mb
    b0 = int(base.workload.global_batch)
    base_gpus = base.cluster.nodes * base.cluster.instance.num_accelerators
    per_step = max(unit, round(b0 / unit) * unit)
    per_gpu = max(unit, round(b0 * gpus / base_gpus / unit) * unit)
    seq = int(knobs.get("workload.seq_len", base.workload.seq_len))
    return [
        (f"Keep tokens per step: global batch {per_step:,} ({fmt_count(per_step * seq)} tokens; "
         f"was {b0:,}), a multiple of dp x micro batch = {unit:,}", per_step),
        (f"Keep tokens per GPU: global batch {per_gpu:,} ({fmt_count(per_gpu * seq / gpus)} tokens a GPU "
         f"on {gpus:,} GPUs)", per_gpu),
    ]


def _oom_hint(res: Any, text: str, file: str, overrides: Sequence[tuple[str, Any]]) -> str:
    """What to change for a result that does not fit: a neighbouring plan that fits, else the list."""
    if res.metrics.get("fits", True):
        return ""
    return fit_suggestion(text, file, overrides) or (
        "None of the neighbouring plans (tp or pp doubled, more recompute, the next ZeRO stage, half the "
        "micro batch, or two of these) fits: " + OOM_HINT[0].lower() + OOM_HINT[1:]
    )


def run_training(
    text: str,
    file: str,
    overrides: Sequence[tuple[str, Any]] = (),
    *,
    engine: str = "des",
    des_job_limit: int | None = DES_JOB_LIMIT,
) -> Outcome:
    """Run a training what-if: the analytical estimate always, the DES when ``engine == "des"``
    and the step has at most ``des_job_limit`` jobs (``None``: no limit). Never raises."""
    yaml_text = ""
    try:
        sc, yaml_text, wrong = _opened(text, file, overrides, TRAINING_KINDS, "training", "Serving")
        if wrong is not None:
            return wrong
        est = fmsim.estimate(sc)
        changed = bool(overrides)
        if engine != "des":
            return Outcome(
                result=est,
                estimate=est,
                engine="analytical",
                yaml_text=whatif_yaml(sc, est, "analytical", changed),
                hint=_oom_hint(est, text, file, overrides),
                timeline_note="The timeline comes from the discrete-event simulation: "
                "choose it in the sidebar.",
            )
        jobs = approx_des_jobs(sc, est)
        if des_job_limit is not None and jobs > des_job_limit:
            return Outcome(
                result=est,
                estimate=est,
                engine="analytical",
                yaml_text=whatif_yaml(sc, est, "analytical", changed),
                hint=_oom_hint(est, text, file, overrides),
                note=(
                    "Showing the analytical estimate (fmsim run --estimate), not the simulation you chose: "
                    f"this step would be about {jobs:,} engine jobs "
                    f"({est.metrics.get('num_microbatches')} micro-batches per pipeline), past the "
                    f"explorer's limit of {des_job_limit:,} that keeps a knob change under a second "
                    f"(about {jobs * DES_S_PER_JOB:.0f} s to simulate). Tick 'Simulate large steps' in the "
                    "sidebar to run the simulation."
                ),
                timeline_note="No timeline: the step was not simulated (see above).",
            )
        with tempfile.TemporaryDirectory(prefix="fmsim-app-") as tmp:
            trace = Path(tmp) / "trace.json"
            res = fmsim.simulate(sc, trace_path=str(trace))
            events = json.loads(trace.read_text())["traceEvents"] if trace.is_file() else []
        rows, tnote = timeline_rows(events)
        return Outcome(
            result=res, estimate=est, engine="des", yaml_text=whatif_yaml(sc, res, "des", changed),
            timeline=rows, timeline_note=tnote,
            hint=_oom_hint(res, text, file, overrides),
        )
    except Exception as exc:  # noqa: BLE001 - a page never shows a traceback (issue 6)
        return failure(exc, yaml_text=yaml_text, file=file)


def run_serving(
    text: str, file: str, overrides: Sequence[tuple[str, Any]] = (), *, engine: str = "des"
) -> Outcome:
    """Run a serving what-if with the DES (``fmsim.simulate``) or the estimate. Never raises."""
    yaml_text = ""
    try:
        sc, yaml_text, wrong = _opened(text, file, overrides, SERVING_KINDS, "serving", "Training")
        if wrong is not None:
            return wrong
        changed = bool(overrides)
        offered = offered_rate(sc)
        if engine == "des":
            res = fmsim.simulate(sc)
            return Outcome(result=res, engine="des", yaml_text=whatif_yaml(sc, res, "des", changed),
                           offered_requests_per_s=offered)
        est = fmsim.estimate(sc)
        return Outcome(
            result=est,
            estimate=est,
            engine="analytical",
            yaml_text=whatif_yaml(sc, est, "analytical", changed),
            offered_requests_per_s=offered,
        )
    except Exception as exc:  # noqa: BLE001
        return failure(exc, yaml_text=yaml_text, file=file)


def run_any(
    text: str, file: str, *, engine: str = "des", des_job_limit: int | None = DES_JOB_LIMIT
) -> Outcome:
    """Run a scenario of any kind as it is (the Compare page): training or serving."""
    try:
        sc = load_base(text, file)
    except Exception as exc:  # noqa: BLE001
        return failure(exc, file=file)
    if sc.workload.kind in SERVING_KINDS:
        return run_serving(text, file, engine=engine)
    if sc.workload.kind == "rl":   # the Compare table holds training and serving figures; RL has its page
        return Outcome(error=f"{file}: workload.kind: rl is not a training or serving kind",
                       error_kind="KindError", hint="Open this scenario on the RL page.")
    return run_training(text, file, engine=engine, des_job_limit=des_job_limit)


_RATE = re.compile(r"([0-9.eE+-]+)(/s|/min|/h|qps|rps)?")
_PER = {None: 1.0, "/s": 1.0, "qps": 1.0, "rps": 1.0, "/min": 60.0, "/h": 3600.0}


def offered_rate(sc: Any) -> float | None:
    """Requests per second the what-if's open-loop traffic offers (``traffic.rate``: 12, ``'12/s'``,
    ``'600/min'``, ``'2/h'``, the forms of ``kind: inference``); None for closed-loop or offline
    traffic, or a rate the scenario check refuses (it then says why)."""
    tr = sc.extra.get("traffic") if isinstance(sc.extra, Mapping) else None
    if not isinstance(tr, Mapping) or tr.get("concurrency"):
        return None
    if tr.get("arrival") in ("closed-loop", "offline"):
        return None
    v = tr.get("rate")
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return finite(v)
    m = _RATE.fullmatch(str(v).strip().replace(" ", ""))
    return finite(float(m.group(1)) / _PER[m.group(2)]) if m else None


def overload(result: Any, offered: float | None, saturation: float | None = None) -> str:
    """A sentence when the plan serves less than it is offered (else ""): requests left unserved
    by the simulation, or an offered rate past the saturation rate of the analytical estimate
    (where its served rate falls short of the offered one). A finite simulated run's own served
    rate is no test: its fill and drain put it below the offered rate even with room to spare."""
    m = result.metrics
    left = (m.get("unfinished_requests") or 0) + (m.get("rejected_requests") or 0)
    if left:
        return (f"Overloaded: {m.get('unfinished_requests') or 0} requests unfinished and "
                f"{m.get('rejected_requests') or 0} rejected within the simulated horizon.")
    if offered and saturation and offered > saturation:
        return (f"Overloaded: {fmt_count(offered, '/s')} offered, past the {fmt_count(saturation, '/s')} "
                "this plan serves at saturation (analytical estimate): the queue grows without bound.")
    return ""


def load_curve(
    text: str,
    file: str,
    overrides: Sequence[tuple[str, Any]] = (),
    fractions: Sequence[float] = LOAD_FRACTIONS,
) -> tuple[list[dict[str, Any]], str]:
    """Throughput and latency against offered load, from the analytical serving estimate.

    The saturation rate comes from the same scenario with ``traffic.arrival: offline``; the curve
    is Poisson traffic at ``fractions`` of it, each point flagged ``overloaded`` when the offered
    rate passes the saturation rate. Returns ``(points, error)``; never raises.
    """
    base = dict(_unfreeze(overrides))
    free = {"traffic.concurrency": None, "traffic.burstiness": None, "traffic.think_time": None}
    try:
        sc = whatif_scenario(
            text, file, tuple({**base, **free, "traffic.arrival": "offline", "traffic.rate": None}.items())
        )
        cap = fmsim.estimate(sc).metrics.get("requests_per_s") or 0.0
        if not cap > 0:
            return [], "the estimate gives no throughput at saturation"
        points = []
        for f in fractions:
            rate = cap * f
            sc = whatif_scenario(
                text,
                file,
                tuple({**base, **free, "traffic.arrival": "poisson", "traffic.rate": rate}.items()),
            )
            m = fmsim.estimate(sc).metrics
            points.append(
                {
                    "saturation_requests_per_s": cap,
                    "overloaded": f > 1.0,
                    "offered_requests_per_s": rate,
                    "requests_per_s": finite(m.get("requests_per_s")),
                    "output_tokens_per_s": finite(m.get("output_tokens_per_s")),
                    "ttft_p99_s": finite(m.get("ttft_p99_s")),
                    "tpot_p50_s": finite(m.get("tpot_p50_s")),
                    "e2e_p99_s": finite(m.get("e2e_p99_s")),
                }
            )
        return points, ""
    except Exception as exc:  # noqa: BLE001
        return [], str(exc) if isinstance(exc, fmsim.FmsimError) else f"internal error: {type(exc).__name__}"


def mfu_help(result: Any) -> str:
    """Which peak the MFU divides by: the dense peak of the precision the GEMMs run in (fp8 runs:
    the fp8 peak, twice the bf16 one on Hopper), with the MFU against the bf16 peak beside it."""
    m = result.metrics
    tflops, mfu = finite(m.get("model_tflops_per_gpu")), finite(m.get("mfu"))
    prec = str(m.get("precision") or "")
    if tflops is None or not mfu:
        return "model FLOPs / peak FLOPs"
    peak = tflops / mfu
    out = (f"model FLOPs / the {prec} dense peak of the GPU ({peak:,.0f} TFLOP/s); "
           f"{tflops:,.0f} TFLOP/s per GPU achieved")
    if prec not in ("bf16", "fp16"):
        try:
            bf16 = fmsim.load_catalog().instances[result.instance].accelerator.peak("bf16") / 1e12
            out += f"; against the bf16 peak ({bf16:,.0f} TFLOP/s) it would be {fmt_pct(tflops / bf16)}"
        except Exception:  # noqa: BLE001 - an inline instance, or no bf16 math: the first part stands
            pass
    return out


def over_hbm(metrics: Mapping[str, Any]) -> float | None:
    """Bytes per GPU a plan needs beyond its HBM (None when it fits)."""
    need, have = finite(metrics.get("memory_per_gpu_bytes")), finite(metrics.get("hbm_per_gpu_bytes"))
    if metrics.get("fits", True) or need is None or have is None or need <= have:
        return None
    return need - have


def price_note(result: Any) -> str:
    """Why a result has no cost, in the words of ``fmsim.cost`` (which pricing the instance does
    have), or "" when it has a price."""
    if result is None or result.usd_per_hour is not None:
        return ""
    det = result.details if isinstance(result.details, Mapping) else {}
    return str(det.get("price_source") or f"{result.instance} has no price for this pricing option")


# ----------------------------------------------------------------------------------------------
# comparison

COMPARE_TRAINING = (
    "gpus",
    "step_time_s",
    "mfu",
    "tokens_per_s",
    "memory_per_gpu_bytes",
    "fits",
    "usd_per_hour",
    "time_to_train_s",
    "cost_usd",
    "bottleneck",
)
COMPARE_SERVING = (
    "gpus",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "e2e_p99_s",
    "output_tokens_per_s",
    "requests_per_s",
    "usd_per_hour",
    "usd_per_million_output_tokens",
    "usd_per_query",
    "bottleneck",
)


def plan_summary(sc: Any, result: Any) -> dict[str, str]:
    """What a plan is, as the Compare page's first rows show it: model, instance, nodes, the
    parallel layout, precision and pricing (from the result where it says, else the scenario)."""
    m = result.metrics if result is not None else {}
    det = result.details if result is not None and isinstance(result.details, Mapping) else {}
    par = sc.parallelism
    axes = " · ".join(f"{a} {m.get(a) if m.get(a) is not None else getattr(par, a)}"
                      for a in ("tp", "pp", "dp", "cp", "ep"))
    if (m.get("vpp") or 1) > 1:
        axes += f" (vpp {m['vpp']})"
    option = m.get("pricing_option") or det.get("pricing_option") or sc.pricing.option or "explicit"
    date = getattr(result, "price_date", "") or ""
    return {
        "Model": sc.workload.model.name,
        "Instance": result.instance if result is not None else sc.cluster.instance.name,
        "Nodes": (f"{result.nodes:,} ({result.gpus:,} GPUs)" if result is not None
                  else f"{sc.cluster.nodes:,}"),
        "Parallelism": axes,
        "Precision": str(m.get("precision") or sc.workload.precision),
        "Pricing": f"{option} ({date})" if date else f"{option} (no price)",
    }


def compare_table(
    runs: Sequence[tuple[str, Any]], plans: Sequence[Mapping[str, str]] | None = None
) -> list[dict[str, Any]]:
    """Rows ``{metric, <run>: shown value, Δ <run>: change against the first run}``, side by side;
    with ``plans`` (one :func:`plan_summary` a run) the first rows say what each plan is."""
    if not runs:
        return []
    head: list[dict[str, Any]] = []
    if plans is not None and len(plans) == len(runs):
        for what in plans[0]:
            row: dict[str, Any] = {"metric": what}
            for (name, _), plan in zip(runs, plans):
                row[name] = plan.get(what, "-")
            for (name, _), plan in zip(runs[1:], plans[1:]):
                row[f"Δ {name}"] = "same" if plan.get(what) == plans[0].get(what) else "changed"
            head.append(row)
    kinds = {r.kind for _, r in runs}
    cols: list[str] = []
    if kinds & set(TRAINING_KINDS):
        cols += COMPARE_TRAINING
    if kinds & set(SERVING_KINDS):
        cols += [c for c in COMPARE_SERVING if c not in cols]
    first = runs[0][1]
    first_bad = infeasible_reason(first)
    # a run that cannot run as asked (or a reference that cannot) is compared with nothing: its changes
    # would read as improvements (a plan that does not fit is often the fastest)
    feasible: dict[str, Any] = {"metric": "Runs as asked"}
    not_compared: dict[str, str] = {}
    for name, res in runs:
        why = infeasible_reason(res)
        feasible[name] = f"no: {why}" if why else "yes"
    for name, res in runs[1:]:
        why = infeasible_reason(res)
        feasible[f"Δ {name}"] = "same" if feasible[name] == feasible[runs[0][0]] else "changed"
        if why or first_bad:
            not_compared[name] = "n/a (cannot run)" if why else "n/a (reference cannot run)"
    table = [feasible]
    for col in cols:
        row: dict[str, Any] = {"metric": label_of(col)}
        for name, res in runs:
            row[name] = fmt_column(col, _value(res, col))
        for name, res in runs[1:]:
            row[f"Δ {name}"] = not_compared.get(name) or delta_text(_value(first, col), _value(res, col))
        table.append(row)
    return head + table


def _value(res: Any, col: str) -> Any:
    if col in ("gpus", "nodes", "usd_per_hour"):
        return getattr(res, col)
    if col == "bottleneck":  # the short name (training: comm_tp, bubble ...) where there is one
        v = res.metrics.get(col)
        return v or (res.details.get("bottleneck") if isinstance(res.details, Mapping) else None)
    return res.metrics.get(col)


# ----------------------------------------------------------------------------------------------
# RL post-training (kind: rl; the RL page, app/pages/5_RL.py)

RL_KINDS = ("rl",)


def run_rl(
    text: str, file: str, overrides: Sequence[tuple[str, Any]] = (), *, engine: str = "des"
) -> Outcome:
    """Run an RL what-if with the DES (``fmsim.simulate``) or the estimate; the timeline is the step's
    phases per GPU pool (``Result.details["timeline"]``). Never raises."""
    yaml_text = ""
    try:
        sc, yaml_text, wrong = _opened(text, file, overrides, RL_KINDS, "RL", "Training or Serving")
        if wrong is not None:
            return wrong
        res = fmsim.simulate(sc) if engine == "des" else fmsim.estimate(sc)
        rows = tuple(
            (str(p), float(a), float(b), str(c), str(lab)) for p, a, b, c, lab in res.details.get("timeline", ())
        )
        return Outcome(result=res, estimate=None if engine == "des" else res,
                       engine="des" if engine == "des" else "analytical", yaml_text=yaml_text, timeline=rows)
    except Exception as exc:  # noqa: BLE001 - a page never shows a traceback
        return failure(exc, yaml_text=yaml_text, file=file)
