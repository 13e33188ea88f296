"""The on-disk result cache that makes a search resumable.

Owns one SQLite file (``search-cache.sqlite`` under the cache directory: ``--cache DIR``, or
``$XDG_CACHE_HOME/fmsim``, ``~/.cache/fmsim``). A record is stored under a *context* -- a hash of the
fmsim version, the fmsim source files, the catalogs and the base scenario (as
:func:`fmsim.scenario.scenario_to_mapping` writes it) -- and its plan key, so a record is reused only
for the same plan of the same scenario by the same code and data, and an interrupted search picks up
every plan it had finished. Records are written in batches as they arrive, each batch one transaction.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

FILE_NAME = "search-cache.sqlite"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fmsim``, or ``~/.cache/fmsim``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fmsim"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the fmsim version, its source files and the catalogs' YAML (what a result depends on)."""
    from .. import __version__
    from ..catalog import data_root

    h = hashlib.sha256(__version__.encode())
    pkg = Path(__file__).resolve().parent.parent
    root = data_root()
    files = sorted(pkg.rglob("*.py")) + sorted((root / "hardware_catalog").rglob("*.yaml")) + \
        sorted((root / "model_catalog").rglob("*.yaml"))
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def context_key(base) -> str:
    """The cache context of a search over ``base`` (see the module docstring)."""
    from ..scenario import scenario_to_mapping

    doc = json.dumps(scenario_to_mapping(base), sort_keys=True, default=repr)
    return hashlib.sha256((code_fingerprint() + "\n" + doc).encode()).hexdigest()


def plan_text(key: Sequence) -> str:
    return json.dumps(list(key), separators=(",", ":"))


class ResultCache:
    """Records by (context, plan key) in one SQLite file; ``None`` directory = no cache (it holds nothing
    and stores nothing: a search without a cache pays no encoding of its records)."""

    def __init__(self, directory: str | os.PathLike[str] | None, context: str):
        self.context = context
        self.path = None if directory is None else Path(directory) / FILE_NAME
        self._db: sqlite3.Connection | None = None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30)
        self._db.execute("CREATE TABLE IF NOT EXISTS records (context TEXT NOT NULL, plan TEXT NOT NULL, "
                         "record TEXT NOT NULL, PRIMARY KEY (context, plan))")
        self._db.commit()

    def load(self) -> dict[str, dict[str, Any]]:
        """Every record of this context, by plan text."""
        if self._db is None:
            return {}
        cur = self._db.execute("SELECT plan, record FROM records WHERE context = ?", (self.context,))
        return {plan: json.loads(rec) for plan, rec in cur}

    def put_many(self, items: Iterable[tuple[Sequence, Mapping[str, Any]]]) -> None:
        if self._db is None:
            return
        rows = [(self.context, plan_text(k), json.dumps(rec, allow_nan=True)) for k, rec in items]
        if rows:
            with self._db:
                self._db.executemany("INSERT OR REPLACE INTO records VALUES (?, ?, ?)", rows)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
