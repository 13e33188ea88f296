"""Wall and CPU seconds of ``fmsim validate`` on a folder, for this checkout and optionally another.

The machine is shared: each figure is printed with the load average beside it, and two checkouts
are run back to back (base, this, per setting) so that their ratio is taken under like loads.
The CSVs the runs write are compared byte for byte: a speed-up must not change a number.

    python bench/bench_validate.py                          # this checkout, -j default and -j 1
    python bench/bench_validate.py --base /path/to/old/tree # and the old tree, with ratios
    python bench/bench_validate.py --jobs default --folder scenarios/validation/rl
"""
from __future__ import annotations

import argparse
import filecmp
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _load() -> str:
    try:
        return "load %.2f" % os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on every platform
        return "load ?"


def run_once(tree: Path, folder: str, jobs: str, csv: str) -> tuple[float, float, str]:
    """(wall s, CPU s of the run and its workers, load average before) of one validate run in ``tree``."""
    cmd = [sys.executable, "-m", "fmsim.cli", "validate", folder, "--csv", csv]
    if jobs != "default":
        cmd += ["-j", jobs]
    load = _load()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=tree, check=True, stdout=subprocess.DEVNULL)   # cwd first on sys.path
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, load


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="another checkout (the old tree) to run back to back")
    ap.add_argument("--folder", default="scenarios/validation")
    ap.add_argument("--jobs", action="append", help="'default' or a number (repeatable; default: both)")
    args = ap.parse_args(argv)
    settings = args.jobs or ["default", "1"]
    trees = ([("base", args.base.resolve())] if args.base else []) + [("this", HERE)]
    folder = args.folder        # relative: each tree runs its own copy (the CSV names files as given)
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in settings:
            figs = {}
            for name, tree in trees:
                csv = os.path.join(tmp, f"{name}-{jobs}.csv")
                wall, cpu, load = run_once(tree, folder, jobs, csv)
                figs[name] = (wall, cpu)
                print(f"{name:>4} -j {jobs:<7} wall {wall:6.1f} s  CPU {cpu:6.1f} s  ({load} before)")
            if "base" in figs:
                (bw, bc), (tw, tc) = figs["base"], figs["this"]
                identical = filecmp.cmp(os.path.join(tmp, f"base-{jobs}.csv"),
                                        os.path.join(tmp, f"this-{jobs}.csv"), shallow=False)
                same &= identical
                print(f"     -j {jobs:<7} base/this: wall x{bw / tw:.2f}, CPU x{bc / tc:.2f}; "
                      f"CSV {'byte-identical' if identical else 'DIFFERS'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
