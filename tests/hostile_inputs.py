"""Hostile scenario files shared by tests/test_hostile_scenarios.py (the reader and the CLI) and
tests/test_hostile_app.py (the explorer's upload path): each is the file's bytes and a phrase its one
located error line contains."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_TEXT = (ROOT / "scenarios" / "examples" / "llama3-70b-p5.yaml").read_text(encoding="utf-8")


def _bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 7):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


HOSTILE_FILES: dict[str, tuple[bytes, str]] = {   # name: (bytes, what the one line says)
    "duplicate top-level key": ((BASE_TEXT + "name: again\n").encode(), "duplicate key 'name'"),
    "duplicate nested key": (BASE_TEXT.replace("  tp: 8\n", "  tp: 8\n  tp: 4\n").encode(), "duplicate key 'tp'"),
    "non-UTF-8 byte": (BASE_TEXT.encode() + b"# \xff\xfe\n", "not UTF-8"),
    "UTF-16": (BASE_TEXT.encode("utf-16"), "not UTF-8"),
    "NUL byte": ((BASE_TEXT + "\x00").encode(), "NUL byte"),
    "billion laughs": (_bomb().encode(), "alias bomb"),
    "recursive alias": (b"a: &a [*a]\n", "containing itself"),
    "deep flow nesting": (("version: 1\nworkload: " + "[" * 50_000 + "]" * 50_000 + "\n").encode(), "nesting"),
    "deep block nesting": (("version: 1\nroot:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 900))).encode(),
                           "nested deeper than 64"),
    "deep mapping nesting": (("version: 1\nworkload: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n").encode(),
                             "nested deeper than 64"),
    "python tag": ((BASE_TEXT + "x: !!python/object/apply:os.system ['true']\n").encode(), "constructor"),
    "binary tag": (BASE_TEXT.replace("name: llama3-70b-p5", "name: !!binary aGk=").encode(), "name: got a bytes"),
    "a 5,000-digit integer": (BASE_TEXT.replace("global_batch: 128", "global_batch: " + "9" * 5000).encode(),
                              "an integer of 5,000 characters"),
    ".nan": (BASE_TEXT.replace("global_batch: 128", "global_batch: .nan").encode(), "workload.global_batch"),
    ".inf": (BASE_TEXT.replace("nodes: 8", "nodes: .inf").encode(), "cluster.nodes"),
    "-.inf quantity": (BASE_TEXT.replace("train_tokens: 15T", "train_tokens: -.inf").encode(),
                       "workload.train_tokens"),
    "1e300T tokens": (BASE_TEXT.replace("train_tokens: 15T", "train_tokens: 1e300T").encode(), "not a finite"),
    "a second document": ((BASE_TEXT + "---\nversion: 1\n").encode(), "another document"),
    "a list at the top": (b"- 1\n- 2\n", "expected a mapping"),
    "an unhashable key": ((BASE_TEXT + "? [a, b]\n: 1\n").encode(), "unhashable"),
}
