"""Dump, then compare, every scenario's ``estimate`` and ``simulate`` results and the loaded catalog.

Used to show that a refactor changes no number: run it once on the old tree and once on the new one,
then compare the two dumps (``repr`` of every float, so "identical" means bit-identical).

    python bench/compare_results.py dump OUT.json [FOLDER ...]   # default: scenarios/examples scenarios/validation
    python bench/compare_results.py diff OLD.json NEW.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's fmsim, not an installed one


def _catalog_text() -> dict[str, str]:
    from fmsim.catalog import load_catalog

    cat = load_catalog()
    out = {}
    for table in ("accelerators", "fabrics", "instances", "prices", "storage", "models", "extra", "stacks"):
        for name, obj in getattr(cat, table).items():
            out[f"{table}.{name}"] = repr(obj)
    return out


def dump(target: str, folders: list[str]) -> None:
    import fmsim

    print(f"fmsim from {Path(fmsim.__file__).parent}")
    from fmsim.errors import FmsimError

    rows: dict[str, str] = {"catalog." + k: v for k, v in _catalog_text().items()}
    files = sorted(p for f in folders for p in Path(f).rglob("*.yaml"))
    for path in files:
        for how in ("estimate", "simulate"):
            try:
                sc = fmsim.load_scenario(str(path))
                res = getattr(fmsim, how)(sc)
                rows[f"{path}:{how}"] = repr(res.to_json())
            except FmsimError as exc:
                rows[f"{path}:{how}"] = f"error: {exc}"
    Path(target).write_text(json.dumps(rows, indent=0, sort_keys=True))
    print(f"{len(files)} scenario files, {len(rows)} entries -> {target}")


def diff(old: str, new: str) -> int:
    a, b = json.loads(Path(old).read_text()), json.loads(Path(new).read_text())
    bad = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    scen = [k for k in a if not k.startswith("catalog.")]
    print(f"{len(scen)} scenario results and {len(a) - len(scen)} catalog entries compared; "
          f"{len(bad)} differ")
    for k in bad[:20]:
        print(f"  {k}\n    old: {str(a.get(k))[:300]}\n    new: {str(b.get(k))[:300]}")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "dump":
        dump(sys.argv[2], sys.argv[3:] or ["scenarios/examples", "scenarios/validation"])
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        sys.exit(diff(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
