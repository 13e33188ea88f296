"""The command line as scripts and CI jobs use it (issue 31, items 11-18): the explorer bound to
localhost, no traceback for hostile paths and files, exit codes, machine-readable stdout,
progress and clean shutdown of worker processes, lint agreeing with run, and the serving block."""

import sys
from pathlib import Path

import pytest

from fmsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
LLAMA = DATA / "llama3-70b-p5.yaml"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


# -- 11: fmsim app listens on this machine only unless told otherwise ---------------------------


def _app_argv(monkeypatch, *extra) -> dict[str, str]:
    calls = []
    monkeypatch.setattr("os.execv", lambda path, argv: calls.append(argv))
    assert main(["app", *extra]) == 0
    argv = calls[0]
    return dict(zip(argv[5::2], argv[6::2]))


def test_app_binds_to_localhost_by_default(monkeypatch):
    opts = _app_argv(monkeypatch)
    assert opts["--server.address"] == "127.0.0.1"


def test_app_address_option_overrides_the_default(monkeypatch):
    opts = _app_argv(monkeypatch, "--address", "0.0.0.0", "--port", "8700")
    assert opts["--server.address"] == "0.0.0.0" and opts["--server.port"] == "8700"
