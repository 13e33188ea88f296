"""Scenario files, schema version 1: reading them safely, validating them, writing them back.

Owns the scenario contract of DESIGN.md ("The scenario file"): the frozen :class:`Scenario` the
simulators consume, the strict YAML reader (duplicate keys, alias bombs, oversize files and deep
nesting are refused before anything is built), ``--set key.path=value`` overrides, and every
check a file can fail with its located message ``FILE: field.path: what is wrong (expected ...)``.
Quantities are parsed once here through :mod:`fmsim.units`; everything past this module is SI.

The ``traffic``/``serving``/``test_time_compute``/``slo`` (``kind: inference``) and ``rl``
(``kind: rl``) sections are kept as raw mappings in :attr:`Scenario.extra`; the simulators of
those kinds validate them.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..catalog import Catalog, load_catalog
from ..errors import ConfigError
from ..stacks import SETTABLE, check_kind, lookup, stack_defaults
from .cluster import _check_precision, _cluster, _data
from .metrics import _expect, _measured
from .parallelism import _parallelism
from .reader import _Section, _relocate, _what
from .run import _checkpoint, _pricing, _reliability
from .schema import EXTRA_SECTIONS, TOP_KEYS
from .spec import Scenario
from .workload import _version, _workload
from .yaml_safe import _read_text, decode_text, load_yaml_text

# re-exported: the names callers import from fmsim.scenario
from .schema import FLOPS_FORMULAS, KINDS, PRECISIONS  # noqa: F401
from .yaml_safe import MAX_ALIASES, MAX_FILE_BYTES  # noqa: F401
from .metrics import Expect, FLOPS_METRICS, canonical_metric, metric_columns, parse_metric_value  # noqa: F401
from .workload import MAX_SEQ_LEN, MAX_TOKENS_PER_STEP, Workload  # noqa: F401
from .cluster import Cluster, MAX_GPUS  # noqa: F401
from .parallelism import (  # noqa: F401
    DEFAULT_GRAD_BUCKET,
    GRAD_BUCKET_MEGATRON,
    Overlap,
    Parallelism,
    RECOMPUTE,
    RECOMPUTE_MODULES,
    SCHEDULES,
)
from .run import Checkpoint, Pricing, Reliability  # noqa: F401
from .writer import scenario_to_mapping  # noqa: F401
from .variants import plan_cluster, with_plan  # noqa: F401

__all__ = [
    "FLOPS_FORMULAS",
    "KINDS",
    "MAX_ALIASES",
    "MAX_FILE_BYTES",
    "MAX_GPUS",
    "MAX_SEQ_LEN",
    "MAX_TOKENS_PER_STEP",
    "PRECISIONS",
    "RECOMPUTE",
    "RECOMPUTE_MODULES",
    "SCHEDULES",
    "Checkpoint",
    "Cluster",
    "Expect",
    "Overlap",
    "Parallelism",
    "Pricing",
    "Reliability",
    "Scenario",
    "Workload",
    "apply_overrides",
    "canonical_metric",
    "decode_text",
    "load_scenario",
    "load_yaml_text",
    "metric_columns",
    "parse_metric_value",
    "parse_set_option",
    "scenario_from_mapping",
    "plan_cluster",
    "scenario_to_mapping",
    "unknown_changes",
    "with_plan",
]


_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*$")


def parse_set_option(text: str) -> tuple[str, Any]:
    """``"parallelism.tp=4"`` -> ``("parallelism.tp", 4)``; the value is read as a YAML scalar/flow."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not _PATH.match(key):
        raise ConfigError(f"{text!r} is not key.path=value (expected e.g. parallelism.tp=4)", file="--set")
    if not value.strip():
        # an empty value would read as null, which a section takes as "not given": the field would
        # silently keep its default
        raise ConfigError(f"{text!r} has no value (expected {key}=VALUE; write {key}=null to drop the "
                          f"field, or {key}=\"\" for an empty string)", file="--set", field=key)
    parsed = load_yaml_text(value, file=f"--set {key}")
    return key, parsed


def apply_overrides(
    data: Mapping[str, Any], overrides: Mapping[str, Any], *, file: str | None = None
) -> dict[str, Any]:
    """A deep copy of ``data`` with each dotted ``key.path`` set to its value (mappings created)."""
    out: dict[str, Any] = copy.deepcopy(dict(data))
    for path, value in overrides.items():
        if not isinstance(path, str) or not _PATH.match(path):
            raise ConfigError(
                f"{path!r} is not a dotted key path (expected e.g. parallelism.tp)",
                file=file,
                field=str(path),
            )
        parts = path.split(".")
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif isinstance(nxt, Mapping) and not isinstance(nxt, dict):
                nxt = node[part] = dict(nxt)
            elif not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"cannot set {path}: {where} is {_what(nxt)}, not a mapping", file=file, field=path
                )
            node = nxt
        node[parts[-1]] = copy.deepcopy(value)
    return out


def _extra(top: _Section, kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, owner in EXTRA_SECTIONS.items():
        if not top.has(key):
            continue
        if kind != owner:
            raise top.err(key, f"is a section of kind: {owner} scenarios (this one is kind: {kind})")
        value = top.raw(key)
        if not isinstance(value, Mapping):
            raise top.err(key, f"got {_what(value)} (expected a mapping)")
        out[key] = copy.deepcopy(dict(value))
    return out


def scenario_from_mapping(
    data: Any,
    *,
    file: str = "<scenario>",
    overrides: Mapping[str, Any] | None = None,
    catalog: Catalog | None = None,
) -> Scenario:
    """Validate a scenario mapping (schema v1) and build the :class:`Scenario`.

    Parameters
    ----------
    data:
        The parsed YAML mapping.
    file:
        Name used in error messages and kept in :attr:`Scenario.file`.
    overrides:
        ``{"parallelism.tp": 4}``: dotted paths set on the raw mapping before validation.
    catalog:
        The catalog to resolve names in (default: :func:`fmsim.catalog.load_catalog`).

    Raises
    ------
    ConfigError, ParallelismError
        With ``file`` and the dotted ``field`` of the first problem.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the file holds {_what(data)} (expected a mapping: version, name, workload, ...)", file=file
        )
    if overrides:
        data = apply_overrides(data, overrides, file=file)
    cat = catalog if catalog is not None else load_catalog()
    stack, inherited = _stack(data, file, cat)
    top = _Section(data, file, "", TOP_KEYS, inherited=inherited, stack=stack)
    version = _version(top)
    name = top.text("name", nonempty=True)
    description = top.text("description", "")
    seed = top.integer("seed", 0, minimum=0)
    configuration, missing = _configuration(top)
    workload, wl_sec = _workload(top, cat)
    cluster = _cluster(top, cat)
    _check_precision(workload, wl_sec, cluster)
    parallelism = _parallelism(top, wl_sec, workload, cluster)
    pricing = _pricing(top)
    measured, measured_source, measured_notes = _measured(top, workload.kind)
    raw_conf = top.raw("configuration", None)
    listed = raw_conf.get("unknown") if isinstance(raw_conf, Mapping) else None
    return Scenario(
        name=name,
        description=description,
        version=version,
        file=file,
        seed=seed,
        workload=workload,
        parallelism=parallelism,
        cluster=cluster,
        pricing=pricing,
        checkpoint=_checkpoint(top),
        reliability=_reliability(top),
        data=_data(top),
        measured=measured,
        measured_source=measured_source,
        measured_notes=measured_notes,
        expect=_expect(top, workload.kind),
        extra=_extra(top, workload.kind),
        stack=stack,
        stated=tuple(p for p in SETTABLE if lookup(data, p) is not None or lookup(inherited, p) is not None),
        configuration=configuration,
        configuration_missing=missing,
        configuration_unknown=_unknowns(listed, data, file, cat) if listed is not None else {},
    )


def _stack(data: Mapping[str, Any], file: str, cat: Catalog) -> tuple[str, dict[str, Any]]:
    """The file's ``stack:`` name and the nested defaults it supplies (empty without one)."""
    name = data.get("stack")
    if name is None:
        return "", {}
    if not isinstance(name, str):
        raise ConfigError(f"got {_what(name)} (expected a stack_catalog name)", file=file, field="stack")
    try:
        profile = cat.stack(name)
    except ConfigError as exc:
        raise _relocate(exc, file, "stack") from None
    workload = data.get("workload")
    workload = workload if isinstance(workload, Mapping) else {}
    check_kind(profile, workload.get("kind"), file=file)
    return name, stack_defaults(profile, workload.get("precision", "bf16"))


def _configuration(top: _Section) -> tuple[str, str]:
    """``configuration: stated`` or ``configuration: {partial: what the source leaves out}``."""
    if not top.has("configuration"):
        return "", ""
    raw = top.raw("configuration")
    if raw == "stated":
        return "stated", ""
    sec = _Section(raw, top.file, "configuration", ("partial", "unknown"),
                   what="stated, or a mapping {partial: what the source leaves out[, unknown: ...]}")
    return "partial", sec.text("partial", nonempty=True)


#: top-level keys an unknown may not name: what the file measured or expects, its names and the mark itself
_NOT_SETTINGS = ("version", "name", "description", "seed", "measured", "expect", "configuration", "stack")
_DID_YOU_MEAN = re.compile(r"\(did you mean '([^']+)'\?\)")


def unknown_changes(path: str, value: Any) -> dict[str, Any]:
    """The dotted-path changes one value of ``configuration.unknown.PATH`` makes: the field set to it, or,
    for a whole section (``parallelism``), each field of the mapping it gives (fields that vary together,
    such as ``{vpp: 3, schedule: interleaved}``)."""
    if "." not in path and isinstance(value, Mapping):
        return {f"{path}.{k}": v for k, v in value.items()}
    return {path: value}


def _unknowns(raw: Any, data: Mapping[str, Any], file: str, cat: Catalog) -> dict[str, tuple[Any, ...]]:
    """``configuration.unknown``: each field the source leaves open (a dotted scenario field path) with the
    values the source gives it, at least two. Each value is checked as the field would be: the file with
    that one value set is read again (and its kind's own sections checked), so a path that is no field
    gets a "did you mean" and a value the field refuses gets the field's rule, both located here. A section's
    values are mappings of the fields that vary together (:func:`unknown_changes`)."""
    where = "configuration.unknown"
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(f"got {_what(raw)} (expected a mapping: field path -> the values the source gives, "
                          "e.g. {serving.memory_fraction: [0.90, 0.95]})", file=file, field=where)
    # the kind's own sections (serving, traffic, rl), which loading keeps raw
    from ..api import check_sections

    base = {k: v for k, v in data.items() if k != "configuration"}
    # the file's own sections first: an error of the file itself is its own, at its own field, not one value's
    check_sections(scenario_from_mapping(base, file=file, catalog=cat))
    out: dict[str, tuple[Any, ...]] = {}
    for path, values in raw.items():
        if not isinstance(path, str) or not _PATH.match(path):
            raise ConfigError(f"{path!r} is not a dotted field path (expected e.g. serving.memory_fraction)",
                              file=file, field=where)
        at = f"{where}.{path}"
        if path.split(".")[0] in _NOT_SETTINGS:
            raise ConfigError("is not a setting (expected a field of workload, parallelism, cluster, "
                              "serving, traffic, ...)", file=file, field=at)
        if not isinstance(values, list) or len(values) < 2:
            raise ConfigError(f"got {_what(values)} (expected a list of the values the source gives, at "
                              "least two)", file=file, field=at)
        for i, value in enumerate(values):
            if value in values[:i]:
                raise ConfigError(f"{value!r} is listed twice", file=file, field=f"{at}[{i}]")
            try:
                check_sections(scenario_from_mapping(apply_overrides(base, unknown_changes(path, value),
                                                                     file=file), file=file, catalog=cat))
            except ConfigError as exc:
                raise _unknown_error(exc, path, f"{at}[{i}]", file) from None
        out[path] = tuple(copy.deepcopy(values))
    return out


def _unknown_error(exc: ConfigError, path: str, at: str, file: str) -> ConfigError:
    """The reader's refusal of one unknown's value, located at ``configuration.unknown.PATH[i]``; a path that
    is no field is said so once, with the field it nearly names."""
    bad = exc.field or ""
    if exc.message.startswith("unknown key") and bad and (path == bad or path.startswith(bad + ".")):
        close = _DID_YOU_MEAN.search(exc.message)
        near = ""
        if close:
            near = ".".join([*bad.split(".")[:-1], close.group(1), *path[len(bad):].split(".")[1:]])
        hint = f" (did you mean {near!r}?)" if near else ""
        return ConfigError(f"{path!r} is not a scenario field{hint}", file=file,
                           field="configuration.unknown")
    if exc.message.startswith("cannot set"):
        return ConfigError(f"{path!r} is not a scenario field ({exc.message.partition(': ')[2]})", file=file,
                           field="configuration.unknown")
    return ConfigError(f"the field refuses this value: {bad + ': ' if bad else ''}{exc.message}", file=file,
                       field=at)


def load_scenario(
    path: str | os.PathLike[str],
    overrides: Mapping[str, Any] | None = None,
    *,
    catalog: Catalog | None = None,
) -> Scenario:
    """Read, check and build the scenario in ``path``.

    The file is refused before parsing when over :data:`MAX_FILE_BYTES`; duplicate keys, more than
    :data:`MAX_ALIASES` aliases and alias expansion past :data:`MAX_EXPANDED_NODES` are refused
    with the line. ``overrides`` (``{"parallelism.tp": 4}``) apply before validation.
    """
    file = os.fspath(path)
    text = _read_text(Path(file), file)
    if not text.strip():
        raise ConfigError(
            "the file is empty (expected a scenario mapping: version, name, workload, ...)", file=file
        )
    data = load_yaml_text(text, file=file)
    if data is None:
        raise ConfigError(
            "the file holds no YAML document, only comments (expected a scenario mapping: "
            "version, name, workload, ...)",
            file=file,
        )
    return scenario_from_mapping(data, file=file, overrides=overrides, catalog=catalog)
