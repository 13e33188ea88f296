"""Reading a catalog folder: every ``*.yaml`` file parsed by the strict YAML reader every fmsim input goes
through (:mod:`fmsim.yaml_safe`: size, depth, aliases, duplicate keys, NUL bytes), its top-level sections
checked against the folder's known ones, and each named entry handed out as an :class:`_Entry` -- the
scenario reader's :class:`~fmsim.fields._Section` (typed getters, unknown keys refused with a "did you
mean", the one-line ``FILE: section.entry.field: rule (got ...)``) plus a ``source`` getter.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..fields import _MISSING, _Section, _what, suggest
from ..yaml_safe import read_yaml_file

#: the top-level sections each catalog folder may hold (a file holds any of its folder's sections)
FOLDER_SECTIONS: Mapping[str, tuple[str, ...]] = {
    "hardware_catalog": ("accelerators", "fabrics", "links", "instances", "prices", "storage", "ultracluster",
                         "failure_rates", "nccl_protocols", "nccl_p2p", "fabric_protocols", "deepep",
                         "hybridep"),
    "model_catalog": ("models",),
    "stack_catalog": ("stacks",),
}

Sections = Mapping[str, list[tuple[str, Mapping[str, Any]]]]


class _Entry(_Section):
    """One catalog mapping (an entry, or a part of one) with the scenario reader's getters, plus
    :meth:`source`. :meth:`get` and :meth:`check_unknown` are the two calls the stack catalog's profile
    reader (:func:`fmsim.stacks._load_profile`) makes: a raw value, and a check that is already done (an
    ``_Entry`` refuses unknown keys when it is made)."""

    def source(self, key: str = "source") -> str:
        """The entry's ``source:`` -- text, or a list of texts joined with "; " -- required and non-empty."""
        value = self.raw(key, hint="every catalog number needs a source")
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = "; ".join(value)
        if not isinstance(value, str):
            raise self.err(key, f"got {_what(value)} (expected text naming the document and table, or the "
                                "repository, file and commit)")
        if not value.strip():
            raise self.err(key, "is empty (every catalog number needs a source)")
        return value

    def notes(self, key: str = "notes") -> str:
        """Free text kept beside the figures (``notes:``, ``note:``); a list of texts is joined."""
        return self.joined_text(key, " ")

    def get(self, key: str, default: Any = _MISSING) -> Any:
        return self.raw(key, default)

    def check_unknown(self) -> None:
        """Nothing left to check: unknown keys were refused when this entry was made."""


def display_name(path: Path) -> str:
    """How errors name a catalog file: relative to the working directory when it lies below it
    (``hardware_catalog/instances.yaml`` in a checkout), else its full path."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)
    return str(path) if rel.startswith("..") else rel


def read_folder(directory: Path, known: tuple[str, ...] | None = None) -> Sections:
    """All top-level sections of all ``*.yaml`` files in ``directory`` (sorted by name), by section name;
    each file is read strictly, must be a mapping of ``known`` sections, each a mapping of named entries."""
    known = known if known is not None else FOLDER_SECTIONS.get(directory.name, ())
    out: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for path in sorted(directory.glob("*.yaml")):
        file = display_name(path)
        data = read_yaml_file(path, file, what="catalog")
        if data is None:
            continue
        if not isinstance(data, Mapping):
            raise ConfigError(f"got {_what(data)} (expected a mapping of sections: {', '.join(known)})",
                              file=file)
        for section, body in data.items():
            if not isinstance(section, str) or section not in known:
                raise ConfigError(f"unknown section {section!r}{suggest(str(section), known)}", file=file,
                                  field=str(section))
            if not isinstance(body, Mapping):
                raise ConfigError(f"got {_what(body)} (expected a mapping of named entries)", file=file,
                                  field=section)
            out.setdefault(section, []).append((file, body))
    return out


def entries(sections: Sections, name: str, allowed: tuple[str, ...],
            what: str) -> Iterator[tuple[str, _Entry]]:
    """The entries of section ``name`` over all files, each an :class:`_Entry` of keys ``allowed``; a name
    given twice (in one folder) is refused, naming both files."""
    seen: dict[str, str] = {}
    for file, body in sections.get(name, []):
        for key, value in body.items():
            key = str(key)
            if key in seen:
                raise ConfigError(f"duplicate entry (also in {seen[key]})", file=file, field=f"{name}.{key}")
            seen[key] = file
            yield key, _Entry(value, file, f"{name}.{key}", allowed,
                              what=f"a mapping of {what} fields (docs/catalogs.md)")
