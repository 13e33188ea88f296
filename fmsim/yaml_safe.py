"""The strict YAML reader every fmsim input file is parsed with -- scenarios and the catalogs
(``hardware_catalog/``, ``model_catalog/``, ``stack_catalog/``) alike: duplicate keys, tags, NUL bytes,
alias bombs, deep nesting and oversize files are refused before anything is built (:func:`load_yaml_text`,
:func:`_read_text`, :func:`read_yaml_file`), each with a located :class:`~fmsim.errors.ConfigError`.
Owns the input size limits (``MAX_FILE_BYTES`` and the rest) and :func:`decode_text` (a file's or an
upload's bytes as text). libyaml scans and parses when PyYAML has it (a 0.8 MB file: 1 s, not 17 s); PyYAML's
Python composer and safe constructor build the document either way, so every check sees every node.
Data layer: imports only ``fmsim.errors``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError


# Input safety limits (the reader refuses files beyond them before building anything).
MAX_FILE_BYTES = 1 << 20  # 1 MiB
MAX_ALIASES = 100  # YAML aliases (*name) per file
MAX_EXPANDED_NODES = 200_000  # nodes after expanding aliases (billion-laughs guard)
MAX_DEPTH = 64  # nesting of mappings/sequences


class _Refused(yaml.MarkedYAMLError):
    """The reader refuses this input (aliases, nesting, duplicate keys)."""


MAX_INT_DIGITS = 100  # characters of one integer scalar (Python refuses to read past 4,300 digits)

try:  # libyaml's scanner and parser, when PyYAML was built with it: the same events, many times faster
    from yaml._yaml import CParser as _CParser
except ImportError:  # pragma: no cover - PyYAML without libyaml: the pure-Python parser
    _CParser = None


class _Strict:
    """The checks of the strict loader, over whichever parser gives the events: duplicate keys, too many
    aliases, too deep nesting and integers too long to read are refused with their line. Composing and
    constructing stay PyYAML's Python code, so these hooks see every node whichever parser scans."""

    _num_aliases: int
    _depth: int

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._num_aliases += 1
            if self._num_aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise _Refused(
                    None, None, f"more than {MAX_ALIASES} YAML aliases (refused: alias bomb guard)", mark
                )
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Refused(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:  # unhashable key: the base constructor says so
                    continue
                if seen:
                    raise _Refused(
                        None,
                        None,
                        f"duplicate key {key!r} (first given at line {first_line[key]})",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> Any:
        if len(str(node.value)) > MAX_INT_DIGITS:
            raise _Refused(None, None, f"an integer of {len(str(node.value)):,} characters (refused: at most "
                                       f"{MAX_INT_DIGITS})", node.start_mark)
        return super().construct_yaml_int(node)


if _CParser is not None:
    class _StrictLoader(_Strict, yaml.composer.Composer, _CParser, yaml.constructor.SafeConstructor,
                        yaml.resolver.Resolver):
        """libyaml scans and parses; PyYAML's composer and safe constructor build, with the checks."""

        def __init__(self, stream: str):
            _CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._num_aliases = 0
            self._depth = 0
else:  # pragma: no cover
    class _StrictLoader(_Strict, yaml.SafeLoader):  # type: ignore[no-redef]
        """A SafeLoader with the checks."""

        def __init__(self, stream: str):
            super().__init__(stream)
            self._num_aliases = 0
            self._depth = 0

_StrictLoader.add_constructor("tag:yaml.org,2002:int", _Strict.construct_yaml_int)


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: Any) -> None:
    """Refuse node graphs whose alias expansion is huge or cyclic (iterative: no recursion limit)."""
    cap = MAX_EXPANDED_NODES + 1
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            size[key] = min(cap, 1 + sum(size[id(c)] for c in _children(node)))
            on_path.discard(key)
            continue
        if key in size:
            continue
        if key in on_path:
            raise _Refused(None, None, "a YAML alias refers to a node containing itself", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    if size[id(root)] > MAX_EXPANDED_NODES:
        raise _Refused(
            None,
            None,
            f"aliases expand to more than {MAX_EXPANDED_NODES:,} values (refused: alias bomb guard)",
            root.start_mark,
        )


def load_yaml_text(text: str, *, file: str | None = None) -> Any:
    """Parse one YAML document strictly; errors are :class:`ConfigError` naming the line."""
    try:
        loader = _StrictLoader(text)    # the pure-Python reader checks the characters here
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"invalid YAML: {first}", file=file) from None
    except UnicodeError as exc:  # a lone surrogate (a non-UTF-8 command-line argument, say)
        raise ConfigError(f"not UTF-8 text (character {getattr(exc, 'start', '?')}) (expected text)",
                          file=file) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if loader._num_aliases:  # without aliases the node count is bounded by the file's size already
            _check_expansion(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "cannot parse"
        if isinstance(exc, _Refused):
            raise ConfigError(f"{where}{problem}", file=file) from None
        context = ""
        if exc.context and exc.problem:
            cm = exc.context_mark
            started = f" started at line {cm.line + 1}" if cm is not None and cm is not mark else ""
            context = f" ({exc.context}{started})"
        raise ConfigError(
            f"{where}invalid YAML: {problem}{context} (expected valid YAML)", file=file
        ) from None
    except yaml.YAMLError as exc:  # reader errors (bad characters) and the like
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"invalid YAML: {first}", file=file) from None
    except RecursionError:  # pragma: no cover - MAX_DEPTH comes first
        raise ConfigError("nested too deeply", file=file) from None
    finally:
        loader.dispose()


def decode_text(raw: bytes, file: str, what: str = "scenario") -> str:
    """``raw`` (a file's bytes, or an upload's) as text, refused when over :data:`MAX_FILE_BYTES`, not
    UTF-8 or holding a NUL byte -- one located :class:`ConfigError` each."""
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"file is {len(raw):,} bytes, over the {MAX_FILE_BYTES:,}-byte limit for {what} "
                          "files", file=file)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not UTF-8 text (byte {exc.start}) (expected a YAML text file)", file=file
        ) from None
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        column = nul - (text.rfind("\n", 0, nul) + 1) + 1
        raise ConfigError(f"line {line}, column {column}: a NUL byte (expected a YAML text file)", file=file)
    return text


def _read_text(path: Path, file: str, what: str = "scenario") -> str:
    """The text of ``path`` (a ``what`` file: "scenario", "catalog"), refused when it is not bounded text."""
    try:
        if path.is_dir():
            raise ConfigError(f"is a directory (expected a {what} .yaml file)", file=file)
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(
                f"file is {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit for {what} "
                "files (refused before parsing)",
                file=file,
            )
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)    # a device or a growing file stops here too
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=file) from None
    return decode_text(raw, file, what)


def read_yaml_file(path: Path, file: str | None = None, what: str = "scenario") -> Any:
    """Read and strictly parse one YAML file (:func:`_read_text` then :func:`load_yaml_text`); errors name
    ``file`` (default: the path as given)."""
    name = str(path) if file is None else file
    return load_yaml_text(_read_text(Path(path), name, what), file=name)
