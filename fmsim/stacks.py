"""Software stacks: named framework releases and the defaults each ships (data layer).

A scenario names one with a top-level ``stack: nemo-25.09``; every setting the stack states is then a
default of that file, between the file's own fields (which always win) and fmsim's global defaults
(what the reader falls back to). This module owns the stack catalog (``stack_catalog/*.yaml``): its
entries, their validation, and :func:`stack_defaults`, the one place a scenario's stack becomes the
nested mapping of inherited values the scenario reader consults before its global default
(``fmsim.scenario._Section``).

Each profile's every setting carries its ``source`` (the framework's argument default or recipe file:
repository, file and commit). A setting may apply only to some recipes (``recipes: [fp8, fp4]``: the
Transformer Engine fp8 weight copy exists only there); the others are left to the global default.

The settings a stack may state are existing scenario fields (:data:`SETTABLE`); which values the
profiles give each of them is what :mod:`fmsim.band` varies where a file states neither the field nor a
stack.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["SETTABLE", "StackProfile", "StackSetting", "load_stacks", "stack_defaults", "stack_values"]

#: Scenario fields a stack may state, by dotted path, with the kinds of stack that may state them.
SETTABLE: Mapping[str, str] = {
    "workload.attention_kernel": "training",
    "workload.cross_entropy": "training",
    "workload.fp8_attention": "training",
    "workload.kernel_fusion": "training",
    "workload.cuda_graphs": "training",
    "workload.fp8_recipe": "training",
    "workload.hidden_dropout": "training",
    "workload.attention_dropout": "training",
    "parallelism.grad_reduce_precision": "training",
    "parallelism.param_gather_precision": "training",
    "parallelism.grad_bucket": "training",
    "parallelism.param_fetch": "training",
    "parallelism.grad_reduce_op": "training",
    "parallelism.gradient_accumulation_fusion": "training",
    "parallelism.activation_fp8_input": "training",
    "parallelism.fp8_transpose_cache": "training",
    "parallelism.cp_comm": "training",
    "parallelism.ep_dispatch": "training",
    "parallelism.moe_host_sync": "training",
    "parallelism.moe_grouped_gemm": "training",
    "parallelism.order": "training",
    "parallelism.overlap.grad_reduce": "training",
    "parallelism.overlap.param_gather": "training",
    "parallelism.overlap.tp_comm": "training",
    "parallelism.overlap.tp_backward": "training",
    "parallelism.overlap.tp_qkv": "training",
    "parallelism.overlap.tp_rs_dgrad": "training",
    "parallelism.overlap.ep_comm": "training",
    "cluster.network.in_network_reduction": "training",
    "cluster.network.nvls": "training",
    "serving.engine": "serving",
    "serving.chunked_prefill": "serving",
    "serving.mixed_batches": "serving",
    "serving.prefix_caching": "serving",
    "serving.kv_block_size": "serving",
    "serving.memory_fraction": "serving",
}
KINDS = ("training", "serving")
#: workload kinds a stack kind serves
WORKLOAD_KINDS = {"training": ("pretrain", "finetune", "rl"), "serving": ("inference",)}
PROFILE_KEYS = ("framework", "release", "kind", "description", "settings", "lineage")
SETTING_KEYS = ("value", "source", "recipes")
RECIPES = ("bf16", "fp16", "fp8", "fp4", "fp32")
#: a source names a commit (``@1a2b3c4``, ``commit 1a2b3c4``) or a release tag (``v0.5.0``, ``core_r0.8.0``)
_SOURCE_REF = re.compile(r"@[0-9a-f]{7,40}\b|@v\d|(?<![\w.])v?\d+\.\d+(\.\d+)?\b|_v\d+\.\d+|core_r\d")


@dataclass(frozen=True, slots=True, kw_only=True)
class StackSetting:
    """One default a stack ships: a scenario field (dotted path), its value and where that is written."""

    path: str
    value: Any
    source: str
    recipes: tuple[str, ...] = ()   # empty: every recipe

    def applies(self, precision: Any) -> bool:
        return not self.recipes or precision in self.recipes


@dataclass(frozen=True, slots=True, kw_only=True)
class StackProfile:
    """A named framework release (``nemo-25.09``) and the scenario defaults it ships."""

    name: str
    framework: str
    release: str
    kind: str                        # training | serving
    description: str
    settings: tuple[StackSetting, ...]
    file: str = ""
    #: the code base whose releases this is one of (``megatron-core``: Megatron-Core as Megatron-LM, NeMo and
    #: Megatron-Bridge ship it); empty: the framework's own releases only
    lineage: str = ""

    @property
    def family(self) -> str:
        """Profiles of one family are releases of one code base (fmsim.band varies inherited settings
        over the values the family's other releases ship)."""
        return self.lineage or self.framework

    def setting(self, path: str) -> StackSetting | None:
        return next((s for s in self.settings if s.path == path), None)


def _load_profile(name: str, entry: Any) -> StackProfile:
    """One ``stacks:`` entry (a catalog ``_Entry``) checked: known keys, settable paths, a source each."""
    kind = entry.get("kind")
    if kind not in KINDS:
        raise entry.err("kind", f"{kind!r} is not valid (expected one of {', '.join(KINDS)})")
    raw = entry.get("settings")
    if not isinstance(raw, Mapping):
        raise entry.err("settings", "expected a mapping of scenario field paths to {value, source}")
    settings = []
    for path, alternatives in raw.items():
        where = f"settings.{path}"
        if SETTABLE.get(str(path)) != kind:
            known = [p for p, k in SETTABLE.items() if k == kind]
            from .catalog import suggest
            raise entry.err(where, f"not a field a {kind} stack may set{suggest(str(path), known)}")
        # one {value, source[, recipes]}, or a list of them for a rule that depends on the recipe
        for i, body in enumerate(alternatives if isinstance(alternatives, list) else [alternatives]):
            settings.append(_setting(entry, str(path), body, f"{where}[{i}]" if isinstance(alternatives, list)
                                     else where))
    profile = StackProfile(name=name, framework=str(entry.get("framework")),
                           release=str(entry.get("release")), kind=kind,
                           description=str(entry.get("description", "")),
                           settings=tuple(settings), file=str(entry.file),
                           lineage=str(entry.get("lineage", "") or ""))
    entry.check_unknown()
    return profile


def _setting(entry: Any, path: str, body: Any, where: str) -> StackSetting:
    """One ``{value, source[, recipes]}`` of a profile, checked (every value needs its source)."""
    if not isinstance(body, Mapping) or "value" not in body:
        raise entry.err(where, "expected a mapping with value and source")
    for key in body:
        if key not in SETTING_KEYS:
            raise entry.err(f"{where}.{key}", f"unknown key (expected {', '.join(SETTING_KEYS)})")
    source = str(body.get("source") or "").strip()
    if not source:
        raise entry.err(f"{where}.source", "is empty (every stack value needs its source)")
    if not _SOURCE_REF.search(source):
        raise entry.err(f"{where}.source", "names no commit or release (expected repository, file "
                        "and @commit or a release tag)")
    recipes = body.get("recipes") or ()
    if not isinstance(recipes, (list, tuple)) or any(r not in RECIPES for r in recipes):
        raise entry.err(f"{where}.recipes", f"expected a list of {', '.join(RECIPES)}")
    value = body["value"]
    if isinstance(value, list):
        value = tuple(value)
    return StackSetting(path=path, value=value, source=source, recipes=tuple(recipes))


def load_stacks(directory: Path) -> dict[str, StackProfile]:
    """Every profile in ``directory/*.yaml`` (section ``stacks:``), each file read strictly and each entry
    checked for :data:`PROFILE_KEYS` by the catalogs' reader (:mod:`fmsim.catalog.files`); an absent
    folder holds none."""
    if not directory.is_dir():
        return {}
    from .catalog.files import entries, read_folder
    return {n: _load_profile(n, e) for n, e in entries(read_folder(directory, ("stacks",)), "stacks",
                                                         PROFILE_KEYS, "stack profile")}


def _nest(out: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = list(value) if isinstance(value, tuple) else value


def stack_defaults(profile: StackProfile, precision: Any) -> dict[str, Any]:
    """The nested mapping of what ``profile`` sets for a file of ``precision`` (its raw value)."""
    out: dict[str, Any] = {}
    for s in profile.settings:
        if s.applies(precision) and lookup(out, s.path) is None:   # the first alternative that applies
            _nest(out, s.path, s.value)
    return out


def check_kind(profile: StackProfile, workload_kind: Any, *, file: str | None) -> None:
    """A training stack on a serving file (or the reverse) is refused at ``stack``."""
    if workload_kind in WORKLOAD_KINDS[profile.kind]:
        return
    raise ConfigError(f"{profile.name!r} is a {profile.kind} stack, this is a workload.kind: {workload_kind} "
                      f"scenario (expected a stack of kind "
                      f"{'serving' if profile.kind == 'training' else 'training'})", file=file, field="stack")


def stack_values(stacks: Mapping[str, StackProfile], path: str) -> tuple[Any, ...]:
    """The values the profiles give ``path``, in catalog order, each once."""
    seen: list[Any] = []
    for p in stacks.values():
        for s in p.settings:
            if s.path == path and s.value not in seen:
                seen.append(s.value)
    return tuple(seen)


def lookup(data: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a nested mapping, or None."""
    node = data
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def stacks_table(stacks: Mapping[str, StackProfile]) -> list[list[str]]:
    """Rows for ``fmsim catalog stacks``: name, kind, framework, what it sets."""
    return [[n, p.kind, p.framework,
             ", ".join(s.path.split(".", 1)[1] for s in p.settings) or "(nothing the schema has)"]
            for n, p in stacks.items()]


def describe(profile: StackProfile) -> list[str]:
    """Lines for ``fmsim catalog show STACK``: each setting with its value, recipes and source."""
    lines = [f"stack {profile.name}  ({profile.kind}: {profile.framework}, {profile.release})",
             f"  {profile.description}".rstrip()]
    for s in profile.settings:
        value = list(s.value) if isinstance(s.value, tuple) else s.value
        only = f"  [with {', '.join(s.recipes)} recipes]" if s.recipes else ""
        lines.append(f"  {s.path}: {value}{only}")
        lines.append(f"    source: {s.source}")
    if not profile.settings:
        lines.append("  (states no field the scenario schema has: the global defaults apply)")
    return lines
