"""Every malformed scenario gets one precise line -- ``FILE: field.path: what is wrong`` -- and exit
code 2 from ``fmsim lint``, never a traceback.

Each file in ``tests/malformed/`` starts with two comments: ``# expect-field: dotted.path`` (``-``
when the problem has no field: YAML syntax, empty file, not a mapping, alias bombs, duplicate keys)
and ``# expect-message: text the message contains``.
"""

from pathlib import Path

import pytest

from fmsim.cli import main
from fmsim.errors import ConfigError
from fmsim.scenario import MAX_FILE_BYTES, load_scenario

MALFORMED = Path(__file__).parent / "malformed"
FILES = sorted(MALFORMED.glob("*.yaml"))


def expectation(path: Path) -> tuple[str | None, str]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# expect-field:") and lines[1].startswith("# expect-message:"), path
    field = lines[0].split(":", 1)[1].strip()
    return (None if field == "-" else field), lines[1].split(":", 1)[1].strip()


def lint_one(path: Path, capsys) -> tuple[int, list[str]]:
    code = main(["lint", str(path)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    return code, captured.err.splitlines()


def test_there_are_at_least_thirty_distinct_malformed_files():
    assert len(FILES) >= 30
    assert len({p.read_text() for p in FILES}) == len(FILES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_malformed_file_is_rejected_with_its_field_path(path, capsys):
    field, message = expectation(path)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.field == field, str(info.value)
    assert info.value.file == str(path)
    assert message in str(info.value)

    code, err = lint_one(path, capsys)
    assert code == 2
    assert len(err) == 1, err
    prefix = f"{path}: {field}: " if field else f"{path}: "
    assert err[0].startswith(prefix), err[0]
    assert message in err[0]


def test_zero_byte_file(tmp_path, capsys):
    f = tmp_path / "zero.yaml"
    f.write_bytes(b"")
    code, err = lint_one(f, capsys)
    assert (
        code == 2
        and len(err) == 1
        and err[0] == f"{f}: the file is empty (expected a scenario mapping: version, name, workload, ...)"
    )


def test_oversize_file(tmp_path, capsys):
    f = tmp_path / "huge.yaml"
    f.write_text("version: 1\n" + "# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    code, err = lint_one(f, capsys)
    assert code == 2 and len(err) == 1 and "limit" in err[0] and err[0].startswith(f"{f}: ")


def test_binary_file(tmp_path, capsys):
    f = tmp_path / "bin.yaml"
    f.write_bytes(bytes(range(256)))
    code, err = lint_one(f, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"{f}: ")


def test_lint_reports_every_bad_file_one_line_each(capsys):
    picked = FILES[:5]
    code = main(["lint", *map(str, picked)])
    captured = capsys.readouterr()
    assert code == 2
    assert len(captured.err.splitlines()) == len(picked)
    assert "0 of 5 scenario files OK" in captured.out
