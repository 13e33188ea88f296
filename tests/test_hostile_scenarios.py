"""Hostile input, systematically: every field of every bundled example is deleted in turn and set to each
value of a fixed table (wrong types, negative, zero, NaN and infinities, huge, empty, null, ordinary but
odd), every mapping gets an unknown key, and the reader, the kind's own sections and the estimate (and,
for the examples whose steps are a few milliseconds, the simulation) run in-process. The only outcomes
allowed are a result -- whose figures are finite unless the result itself says the plan cannot run -- or
one of fmsim's own errors as the one line a face prints (``FILE: field.path: rule``, the file first; a
:class:`~fmsim.errors.ConfigError` names its field). Any other exception is a bug of the reader or of the
layer below it, listed with the mutation that caused it.

File-level hostility (duplicate keys, non-UTF-8 bytes, an alias bomb, deep nesting, a 50 MB file, NUL
bytes, YAML tags, integers too long to read, ``.nan``/``.inf``), the empirical length files a scenario can
point at, and the CLI end to end (exit 2, one stderr line, no traceback) have their own tests below.
Deterministic: the table is fixed, nothing is drawn at random.
"""
from __future__ import annotations

import copy
import math
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import fmsim
from fmsim.api import check_sections
from fmsim.catalog import load_catalog
from fmsim.cli import main
from fmsim.errors import ConfigError, FmsimError
from fmsim.scenario import MAX_FILE_BYTES, load_scenario, scenario_from_mapping

from hostile_inputs import BASE_TEXT, HOSTILE_FILES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "scenarios" / "examples").glob("*.yaml"))

# the value table every field is set to, in turn
VALUES: dict[str, Any] = {
    "a string": "x", "a list": [1], "a mapping": {"a": 1}, "a boolean": True,
    "negative": -1, "a negative fraction": -0.5, "zero": 0,
    "NaN": math.nan, "inf": math.inf, "-inf": -math.inf,
    "huge float": 1e30, "huge int": 10**20, "an empty string": "", "null": None,
    "three": 3, "a thousand": 1000,
}
# examples whose DES step costs a few milliseconds: their mutants are simulated too
SIMULATED = {"llama3-70b-hsdp-p5", "llama3-8b-trn2"}
CASE_BOUND_S = 120      # a hang guard per case (generous on a loaded machine), not a timing assertion
MEMORY_BOUND = 1 << 30  # the peak resident memory the whole table may add (bytes)
CATALOG = load_catalog()


def fields(node: Any, prefix: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every (path, value) of a parsed document, depth first."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield (*prefix, k), v
        yield from fields(v, (*prefix, k))


def mutants(base: dict, values: tuple[str, ...] | None = None) -> Iterator[tuple[str, dict]]:
    """(what was done, the mutated document) for every field and every mutation of the table (or of the
    ``values`` named)."""
    table = [(k, v) for k, v in VALUES.items() if values is None or k in values]
    for path, value in list(fields(base)):
        where = ".".join(map(str, path))
        for name, new in [("deleted", ...), *table]:
            doc = copy.deepcopy(base)
            node = doc
            for k in path[:-1]:
                node = node[k]
            if new is ...:
                del node[path[-1]]
            else:
                node[path[-1]] = copy.deepcopy(new)
            yield f"{where} {name}", doc
        if isinstance(value, dict):
            doc = copy.deepcopy(base)
            node = doc
            for k in path:
                node = node[k]
            node["zz_unknown_key"] = 1
            yield f"{where} + an unknown key", doc


def flagged(res: Any) -> bool:
    """The result itself says the plan cannot run as asked (the faces then show no improvement)."""
    m = res.metrics
    return (m.get("fits") is False or m.get("slo_met") is False or bool(m.get("unfinished_requests"))
            or bool(m.get("rejected_requests")))


def result_problem(res: Any) -> str:
    """Why a result is not an honest answer ("" when it is)."""
    row = res.to_dict()
    bad = [k for k, v in row.items() if isinstance(v, float) and math.isnan(v)]
    if bad and not flagged(res):
        return f"NaN in {bad[:4]} of a plan said to run"
    head = "output_tokens_per_s" if res.kind == "inference" else "step_time_s"
    v = row.get(head)
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
        return f"{head} is {v!r}"
    return ""


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def outcome(doc: dict, file: str, simulate: bool) -> str:
    """"" when ``doc`` gives a result or fmsim's located one-line error; else what went wrong."""
    sc = None
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_BOUND_S)
    try:
        sc = scenario_from_mapping(doc, file=file, catalog=CATALOG)
        check_sections(sc)
        results = [fmsim.estimate(sc)] + ([fmsim.simulate(sc)] if simulate else [])
    except FmsimError as exc:
        from fmsim.validate import error_line

        line = error_line(sc, exc) if sc is not None else str(exc)
        if "\n" in line or not line.startswith(f"{file}: "):
            return f"{type(exc).__name__} not one located line: {line!r}"
        if isinstance(exc, ConfigError) and exc.file != file:
            return f"ConfigError without its file: {line!r}"
        return ""
    except _Hang:
        return f"no outcome within {CASE_BOUND_S} s"
    except Exception as exc:  # noqa: BLE001 - the test lists every bug with its mutation
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return "; ".join(p for p in (result_problem(r) for r in results) if p)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_field_of_an_example_mutated_gives_a_result_or_a_located_error(path):
    with path.open(encoding="utf-8") as fh:
        base = yaml.safe_load(fh)
    base.pop("expect", None)   # a band describes the unmutated file
    file = str(path.relative_to(ROOT))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    bugs, n = [], 0
    for what, doc in mutants(base):
        n += 1
        problem = outcome(doc, file, path.stem in SIMULATED)
        if problem:
            bugs.append(f"{what}: {problem}")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert n > 300                     # each example has dozens of fields, each mutated 17 ways
    assert bugs == []
    assert grown < MEMORY_BOUND, f"the mutants raised the peak memory by {grown / 2**20:.0f} MiB"


@pytest.mark.parametrize("name", ["llama3-70b-p5", "serving-deepseek-v3-ep-p6-b200"])
def test_every_field_of_an_inline_model_mutated_gives_a_result_or_a_located_error(name):
    """The example's catalog model written inline (dense GQA; MLA with experts), each architecture field
    mutated: a 10^20-wide layer made a 10^20-element bucket list before the bounds."""
    path = EXAMPLES[0].parent / f"{name}.yaml"
    with path.open(encoding="utf-8") as fh:
        base = yaml.safe_load(fh)
    base.pop("expect", None)
    model = CATALOG.model(base["workload"]["model"]).to_mapping()
    model.pop("source", None)
    base["workload"]["model"] = model
    file = str(path.relative_to(ROOT))
    assert outcome(copy.deepcopy(base), file, simulate=False) == ""
    bugs = []
    for what, doc in mutants({"model": model}):
        mutated = {**copy.deepcopy(base), "workload": {**base["workload"], "model": doc.get("model")}}
        problem = outcome(mutated, file, simulate=False)
        if problem:
            bugs.append(f"workload.{what}: {problem}")
    assert bugs == []


def test_the_unmutated_examples_give_results_so_the_table_tests_the_mutations():
    for path in EXAMPLES:
        with path.open(encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
        assert outcome(doc, str(path), simulate=False) == ""
        sc = scenario_from_mapping(doc, file=str(path), catalog=CATALOG)
        assert not flagged(fmsim.estimate(sc)), path.stem


# -- limits that keep time and memory bounded, each a located error naming it -------------------------

SERVING = EXAMPLES[0].parent / "serving-reasoning-best-of-8-p5en.yaml"


@pytest.mark.parametrize("override, field, rule", [
    ({"traffic.output_len": 10**9}, "traffic.output_len", "100,000,000"),
    ({"traffic.prompt_len": {"dist": "lognormal", "median": 1000, "sigma": 50}}, "traffic.prompt_len.sigma",
     "<= 10"),
    ({"traffic.prompt_len": {"dist": "normal", "mean": 1e12}}, "traffic.prompt_len.mean", "<= 1e+08"),
    ({"test_time_compute.thinking.budget": 10**12}, "test_time_compute.thinking.budget", "100,000,000"),
    ({"test_time_compute.verifier.output_len": 10**12}, "test_time_compute.verifier.output_len", "100,000,000"),
    ({"test_time_compute.verifier.tp": 10**9}, "test_time_compute.verifier.tp", "16,777,216"),
    ({"seed": 10**30}, "seed", "2**53"),
])
def test_a_size_no_run_could_need_is_refused_with_its_limit(override, field, rule):
    with pytest.raises(ConfigError) as info:
        sc = load_scenario(SERVING, overrides=override)
        check_sections(sc)
    assert info.value.field == field and rule in info.value.message, str(info.value)


@pytest.mark.parametrize("override, field, rule", [
    ({"workload.lora": {"rank": 2**40}}, "workload.lora.rank", "8,192"),        # was a MemoryError
    ({"parallelism.grad_bucket": 1_000_000, "workload.model": {
        "name": "wide", "layers": 4096, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672,
        "vocab": 128256}}, "parallelism.grad_bucket", "10,000"),               # 80,000 engine jobs a pass
    ({"workload.model": {"name": "deep", "layers": 10**8, "hidden": 8192, "heads": 64, "vocab": 32000}},
     "workload.model.layers", "4,096"),                                         # ran past two minutes
    ({"workload.model": {"name": "vast", "layers": 800, "hidden": 200_000, "heads": 800, "vocab": 32000}},
     "workload.model", "parameters"),
])
def test_a_training_size_no_run_could_need_is_refused_with_its_limit(override, field, rule):
    with pytest.raises(ConfigError) as info:
        fmsim.estimate(load_scenario(EXAMPLES[0].parent / "llama3-70b-p5.yaml", overrides=override))
    assert info.value.field == field and rule in info.value.message, str(info.value)


def test_a_verifier_layout_that_does_not_divide_its_model_names_the_verifier():
    sc = load_scenario(SERVING, overrides={"test_time_compute.verifier.tp": 3})
    with pytest.raises(ConfigError) as info:
        fmsim.estimate(sc)
    assert info.value.file == str(SERVING) and info.value.field == "test_time_compute.verifier.tp"
    assert "does not divide" in info.value.message


def test_a_long_tail_draw_stays_a_whole_number_of_tokens_below_the_ceiling():
    """A lognormal at the widest sigma allowed draws lengths far past any context: they are clipped to the
    ceiling, never cast to garbage integers."""
    import numpy as np

    from fmsim.workloads.inference_spec import MAX_TOKENS, parse_length

    d = parse_length({"dist": "lognormal", "median": 10**7, "sigma": 10}, file="x.yaml", where="traffic.output_len")
    x = d.sample(np.random.default_rng(0), 10_000)
    assert x.min() >= 1 and x.max() == MAX_TOKENS and math.isfinite(d.expected()) and math.isfinite(d.upper())


# -- hostile files ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(HOSTILE_FILES))
def test_a_hostile_file_is_one_located_line(tmp_path, name):
    data, says = HOSTILE_FILES[name]
    f = tmp_path / "hostile.yaml"
    f.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        load_scenario(f)
    line = str(info.value)
    assert info.value.file == str(f) and line.startswith(f"{f}: ") and "\n" not in line
    assert says in line, line


def test_a_50_mb_file_is_refused_by_its_size_before_it_is_read(tmp_path):
    f = tmp_path / "huge.yaml"
    with f.open("wb") as fh:
        fh.write(BASE_TEXT.encode())
        fh.truncate(50 << 20)   # 50 MB on disk by its size (sparse: the reader refuses it unread)
    with pytest.raises(ConfigError, match=f"over the {MAX_FILE_BYTES:,}-byte limit"):
        load_scenario(f)


def test_a_file_of_many_keys_just_under_the_limit_is_parsed_by_the_fast_parser(tmp_path):
    """60,000 keys (0.8 MB) took the pure-Python scanner 17 s on this machine, libyaml's about 1 s; here
    20,000 of them, and the first unknown key is the error."""
    from fmsim.yaml_safe import _CParser

    f = tmp_path / "keys.yaml"
    f.write_text(BASE_TEXT + "".join(f"k{i}: {i}\n" for i in range(20_000)))
    assert f.stat().st_size < MAX_FILE_BYTES and _CParser is not None
    with pytest.raises(ConfigError, match="k0: unknown key 'k0'"):
        load_scenario(f)


# -- the files a scenario points at: empirical length distributions -----------------------------------

LENGTHS_CASES = {
    "a directory": (None, "is not a regular file"),
    "non-UTF-8": (b"len\n12\n\xff\xfe\n", "not UTF-8"),
    "an infinite length": (b"len\n12\ninf\n", "'inf' is not a length"),
    "a length past the ceiling": (b"len\n12\n1e30\n", "is not a length"),
    "a word": (b"len\n12\nlots\n", "'lots' is not a length"),
    "a 200 kB cell": (b"len\n" + b"9" * 200_000 + b"\n", "is not"),
}


@pytest.mark.parametrize("name", list(LENGTHS_CASES))
def test_a_hostile_lengths_file_is_a_located_error_on_its_field(tmp_path, name):
    data, says = LENGTHS_CASES[name]
    target = tmp_path / "lengths.csv"
    if data is None:
        target.mkdir()
    else:
        target.write_bytes(data)
    sc = load_scenario(SERVING, overrides={"traffic.prompt_len": {"dist": "empirical", "file": str(target),
                                                                  "column": "len"}})
    with pytest.raises(ConfigError) as info:
        check_sections(sc)
    assert info.value.field == "traffic.prompt_len.file" and says in info.value.message, str(info.value)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_lengths_file_that_never_ends_is_refused_unread():
    sc = load_scenario(SERVING, overrides={"traffic.prompt_len": {"dist": "empirical", "file": "/dev/zero"}})
    with pytest.raises(ConfigError, match="not a regular file"):
        check_sections(sc)


# -- the CLI, end to end -------------------------------------------------------------------------------

def _cli(capsys, *argv) -> tuple[int, list[str]]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "Traceback" not in out.out
    return code, out.err.splitlines()


@pytest.mark.parametrize("name", ["billion laughs", "a 5,000-digit integer", "non-UTF-8 byte", ".nan"])
def test_fmsim_run_on_a_hostile_file_exits_2_with_one_line(tmp_path, capsys, name):
    f = tmp_path / "hostile.yaml"
    f.write_bytes(HOSTILE_FILES[name][0])
    code, err = _cli(capsys, "run", f, "--estimate")
    assert code == 2 and len(err) == 1 and err[0].startswith(f"{f}: "), err


@pytest.mark.parametrize("argv, says", [
    (["run", SERVING, "--estimate", "--set", "test_time_compute.verifier.tp=3"], "test_time_compute.verifier.tp"),
    (["run", SERVING, "--estimate", "--set", "traffic.output_len={dist: lognormal, median: 9, sigma: 1e9}"],
     "traffic.output_len.sigma"),
    (["run", SERVING, "--estimate", "--set", "name=\udcff"], "not UTF-8"),   # a non-UTF-8 argv byte
    (["collective", "all-reduce", "--instance", "p5.48xlarge", "--nodes", "100000000"], "past the"),
    (["search", EXAMPLES[0], "-j", "100000"], "worker processes"),
    (["plan-capacity", SERVING, "--qps", "nan"], "--qps"),
])
def test_hostile_command_lines_exit_2_with_one_line(capsys, argv, says):
    code, err = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1 and says in err[0], err


def test_the_console_command_on_a_hostile_file_prints_one_line_and_no_traceback(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_bytes(HOSTILE_FILES["billion laughs"][0])
    p = subprocess.run([sys.executable, "-m", "fmsim.cli", "run", str(f)], capture_output=True, text=True,
                       cwd=ROOT, timeout=300, check=False)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith(f"{f}: ") and "alias bomb" in p.stderr
