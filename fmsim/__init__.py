"""fmsim: capacity-planning simulator for foundation-model work on AWS.

The facade (DESIGN.md "Python API"): ``load_scenario``, ``simulate``, ``estimate``, ``search``; and
``format_quantity`` / ``format_bytes``, the one number formatter every face (CLI, app, CSV notes) uses. Imports are
lazy so that ``import fmsim`` stays cheap for the CLI.
"""
from __future__ import annotations

from .errors import (
    ConfigError,
    FmsimError,
    InfeasibleError,
    NotBuiltError,
    OutOfMemoryError,
    ParallelismError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "FmsimError",
    "InfeasibleError",
    "NotBuiltError",
    "OutOfMemoryError",
    "ParallelismError",
    "__version__",
    "estimate",
    "format_bytes",
    "format_quantity",
    "load_catalog",
    "load_scenario",
    "search",
    "simulate",
]


def __getattr__(name: str):
    if name == "load_scenario":
        from .scenario import load_scenario
        return load_scenario
    if name in ("simulate", "estimate"):
        from . import api
        return getattr(api, name)
    if name == "search":  # the plan-search package, callable as fmsim.search(sc, ...) (fmsim.api.search)
        import importlib
        return importlib.import_module(".search", __name__)
    if name in ("format_quantity", "format_bytes"):   # the one number formatter every face uses
        from . import units
        return getattr(units, name)
    if name == "load_catalog":
        from .catalog import load_catalog
        return load_catalog
    raise AttributeError(f"module 'fmsim' has no attribute {name!r}")
