"""Layering (DESIGN.md "Layers", STYLE.md habit 8): ``fmsim/`` never imports streamlit, and ``app/``
reaches fmsim only through the package-root API and the scenario round trip, with the API calls
in one module (``app/explorer/logic.py``) and none in the pages.

The sources are read with ``ast`` (imports, ``importlib.import_module("...")`` and ``__import__``
with a literal name, and ``fmsim.<name>`` attribute chains), so a violation is found without
running the code; one check also imports every fmsim module in a fresh interpreter and looks
at ``sys.modules``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fmsim

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fmsim"
APP = ROOT / "app"
UI_MODULES = ("streamlit", "altair")

# What app/ may use of fmsim: the package root's API, plus these names of these modules.
ROOT_API = set(fmsim.__all__) | {"scenario", "export"}
ALLOWED_FROM = {
    "fmsim": set(fmsim.__all__),
    "fmsim.scenario": {"scenario_from_mapping", "scenario_to_mapping", "load_yaml_text", "MAX_FILE_BYTES",
                       "decode_text"},   # an upload's bytes checked as a file's are
    "fmsim.export": {"csv_text"},
    "fmsim.catalog": {"data_root"},
    "fmsim.stacks": {"SETTABLE", "lookup", "stack_defaults"},   # the stack picker: which fields a stack sets
    "fmsim.band": {"band"},   # the Training page's prediction band, computed on demand (issue 27 item 3)
}
API_CALLS = ("simulate", "estimate")
API_MODULE = APP / "explorer" / "logic.py"


def _sources(root: Path, skip: tuple[str, ...] = ()) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*.py")
        if "__pycache__" not in p.parts and not any(part in skip for part in p.relative_to(root).parts)
    )


def imported_modules(tree: ast.AST) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, module, names)`` of every import in ``tree``, including ``importlib.import_module("x")``
    and ``__import__("x")`` with a literal name (relative imports are resolved by the caller)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            prefix = "." * node.level
            out.append((node.lineno, prefix + (node.module or ""), tuple(a.name for a in node.names)))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value, ()))
    return out


def ui_imports(source: str, filename: str) -> list[str]:
    """Lines of ``source`` that import a UI library (streamlit, altair)."""
    bad = []
    for line, module, _ in imported_modules(ast.parse(source, filename)):
        if module.split(".")[0] in UI_MODULES:
            bad.append(f"{filename}:{line}: imports {module}")
    return bad


def fmsim_misuse(source: str, filename: str) -> list[str]:
    """Uses of fmsim in an app/ source that bypass the package-root API."""
    tree = ast.parse(source, filename)
    bad = []
    for line, module, names in imported_modules(tree):
        if module != "fmsim" and not module.startswith("fmsim."):
            continue
        if module not in ALLOWED_FROM:
            bad.append(f"{filename}:{line}: imports {module} (use the package root: import fmsim)")
            continue
        for n in names:
            if n not in ALLOWED_FROM[module]:
                bad.append(
                    f"{filename}:{line}: from {module} import {n} (not part of the API the app may use)"
                )
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fmsim"
                and node.attr not in ROOT_API and not node.attr.startswith("__")):
            bad.append(f"{filename}:{node.lineno}: fmsim.{node.attr} is not in the package-root API")
    return bad


def api_calls(source: str, filename: str) -> list[str]:
    """Calls of ``fmsim.simulate`` / ``fmsim.estimate`` (or a bare ``simulate(...)`` imported from fmsim)."""
    tree = ast.parse(source, filename)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr in API_CALLS
                and isinstance(f.value, ast.Name)
                and f.value.id == "fmsim"
            ):
                out.append(f"{filename}:{node.lineno}: fmsim.{f.attr}")
            elif isinstance(f, ast.Name) and f.id in API_CALLS:
                out.append(f"{filename}:{node.lineno}: {f.id}")
    return out


# ----------------------------------------------------------------------------------------------


def test_the_fmsim_package_never_imports_streamlit_or_altair():
    files = _sources(PACKAGE, skip=("data",))  # fmsim/data/ is the wheel's copy of app/ (data, not code)
    assert len(files) > 20
    bad = [line for f in files for line in ui_imports(f.read_text(), str(f.relative_to(ROOT)))]
    assert bad == []


def test_importing_every_fmsim_module_leaves_streamlit_unloaded():
    code = (
        "import importlib, pkgutil, sys, fmsim\n"
        "for m in pkgutil.walk_packages(fmsim.__path__, 'fmsim.'):\n"
        "    if '.data' not in m.name: importlib.import_module(m.name)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in ('streamlit', 'altair')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_app_uses_fmsim_only_through_the_package_root_api():
    files = _sources(APP)
    assert {f.name for f in files} >= {
        "Home.py",
        "1_Training.py",
        "2_Serving.py",
        "3_Compare.py",
        "4_Catalog.py",
    }
    bad = [line for f in files for line in fmsim_misuse(f.read_text(), str(f.relative_to(ROOT)))]
    assert bad == []


def test_the_simulation_is_called_in_one_app_module_and_never_from_a_page():
    calls = {f: api_calls(f.read_text(), str(f.relative_to(ROOT))) for f in _sources(APP)}
    assert {f for f, c in calls.items() if c} == {API_MODULE}


def test_the_checks_catch_what_they_are_for():
    assert ui_imports("import streamlit as st", "x.py") == ["x.py:1: imports streamlit"]
    assert ui_imports("from altair import Chart", "x.py") == ["x.py:1: imports altair"]
    assert ui_imports("import importlib\nimportlib.import_module('streamlit.web')", "x.py") == [
        "x.py:2: imports streamlit.web"
    ]
    assert fmsim_misuse("from fmsim.workloads.pretrain import build_jobs", "a.py") == [
        "a.py:1: imports fmsim.workloads.pretrain (use the package root: import fmsim)"
    ]
    assert fmsim_misuse("from fmsim.scenario import apply_overrides", "a.py") == [
        "a.py:1: from fmsim.scenario import apply_overrides (not part of the API the app may use)"
    ]
    assert fmsim_misuse("import fmsim\nfmsim.api.simulate(x)", "a.py") == [
        "a.py:2: fmsim.api is not in the package-root API"
    ]
    assert fmsim_misuse("import fmsim\nfmsim.simulate(x)\nfmsim.load_scenario(p)", "a.py") == []
    assert api_calls("import fmsim\nr = fmsim.estimate(sc)", "p.py") == ["p.py:2: fmsim.estimate"]


# The scenario reader's submodules, in the one direction they may import each other (docs/design-notes.md).
SCENARIO_ORDER = ("schema", "yaml_safe", "reader", "metrics", "workload", "cluster", "parallelism", "run",
                  "spec", "writer", "variants", "__init__")


def scenario_back_imports(source: str, module: str) -> list[str]:
    """``module``'s imports of sibling modules of fmsim.scenario that do not come before it."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            sibling = (node.module or "").split(".")[0]
            if sibling and SCENARIO_ORDER.index(sibling) >= SCENARIO_ORDER.index(module):
                out.append(f"{module}.py:{node.lineno}: imports .{sibling}")
    return out


def test_the_scenario_package_imports_its_modules_one_way():
    files = sorted((PACKAGE / "scenario").glob("*.py"))
    assert {p.stem for p in files} == set(SCENARIO_ORDER)
    assert [v for p in files for v in scenario_back_imports(p.read_text(), p.stem)] == []
    back = scenario_back_imports("from .variants import with_plan\nfrom .reader import _Section", "workload")
    assert back == ["workload.py:1: imports .variants"]
