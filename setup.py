"""Build hook: ship the catalogs and bundled scenarios inside the wheel.

The catalogs live at the repository's top level (``hardware_catalog/``, ``model_catalog/``,
``scenarios/``) so that they are easy to read and edit; a plain ``pip install .`` copies them
into ``fmsim/data/`` where :mod:`fmsim.catalog` finds them when no checkout is around. The
Streamlit explorer (``app/``) travels the same way, as data: ``fmsim app`` finds it there and
runs it with streamlit; the fmsim package never imports it.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_DIRS = ("hardware_catalog", "model_catalog", "stack_catalog", "scenarios", "app")


class BuildWithCatalogs(build_py):
    def run(self):
        super().run()
        root = Path(__file__).resolve().parent
        target = Path(self.build_lib) / "fmsim" / "data"
        for name in DATA_DIRS:
            src = root / name
            if src.is_dir():
                dst = target / name
                if dst.exists():
                    shutil.rmtree(dst)
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildWithCatalogs})
