"""The one validating reader every YAML input of fmsim is read with -- scenario sections
(:mod:`fmsim.scenario`) and catalog entries (:mod:`fmsim.catalog`, :mod:`fmsim.stacks`) alike.

:class:`_Section` is one mapping, its file and field path, its allowed keys (anything else is refused
with a "did you mean"), and typed getters that check a value and raise the one-line located
``FILE: field.path: rule (got ...)``; :func:`_relocate` re-points an error at the field that caused it,
:func:`float_number` reads a plain number and :func:`suggest` writes the "did you mean". It sits in the
data layer (it imports only :mod:`fmsim.errors` and :mod:`fmsim.units`), below both readers; the
files themselves are parsed by :mod:`fmsim.yaml_safe`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError
from .units import parse_count


_MISSING: Any = dataclasses.MISSING

# The largest integer any field takes when its getter names no tighter bound: 2**53, the largest a float
# holds exactly (counts go through numpy int64 and float arithmetic downstream, where 10**20 would overflow
# or round). Fields with a natural bound (GPUs, requests, tokens per sequence) set their own, lower one.
MAX_INTEGER = 2**53


def suggest(name: str, known: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` or, failing a close match, the list of known names."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known: {', '.join(sorted(known))})"


def _what(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


#: each allowed-keys tuple as a set, for the key check of every section read (a plan search reads thousands)
_KNOWN: dict[tuple, frozenset] = {}


class _Section:
    """One mapping of a scenario or catalog file: typed getters whose errors carry ``file`` and ``field``.

    Defaults resolve in one place, file -> stack -> global: a key the file leaves out is looked up in
    ``inherited`` (this section's part of the scenario's stack, :func:`fmsim.stacks.stack_defaults`)
    before a getter falls back to its global default, and a stack's value is checked by the same getter as
    a file's (its errors name the stack).
    """

    def __init__(self, data: Any, file: str | None, where: str, allowed: tuple[str, ...], *, what: str = "",
                 inherited: Mapping[str, Any] | None = None, stack: str = ""):
        if not isinstance(data, Mapping):
            expected = what or f"a mapping with keys {', '.join(allowed)}"
            raise ConfigError(f"got {_what(data)} (expected {expected})", file=file, field=where or None)
        self.data, self.file, self.where, self.allowed = data, file, where, allowed
        self.inherited, self.stack = (inherited or {}), stack
        known = _KNOWN.get(allowed) if type(allowed) is tuple else None
        if known is None:
            known = frozenset(allowed)
            if type(allowed) is tuple and len(_KNOWN) < 256:
                _KNOWN[allowed] = known
        for key in data:
            if not isinstance(key, str):
                raise self.err(str(key), f"key {key!r} is not a name (expected one of {', '.join(allowed)})")
            if key not in known:
                raise self.err(key, f"unknown key {key!r}{suggest(key, allowed)}")
        for key in self.inherited:
            if key not in allowed:  # a stack catalog path the reader does not know: a catalog bug
                raise self.err(key, f"unknown key {key!r}{suggest(key, allowed)}")

    def _value(self, key: str) -> Any:
        """The file's value of ``key``, else the stack's (mappings merged, the file's on top), else None."""
        own, inherited = self.data.get(key), self.inherited.get(key)
        if own is None:
            return inherited
        if inherited is None:       # (most keys: no isinstance against the Mapping ABC, which is slow)
            return own
        if isinstance(own, Mapping) and isinstance(inherited, Mapping):
            return {**inherited, **own}
        return own

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def err(self, key: str, message: str, cls: type[ConfigError] = ConfigError) -> ConfigError:
        head = key.split(".")[0].split("[")[0]
        if head and self.data.get(head) is None and self.inherited.get(head) is not None:
            message = f"{message} (set by stack {self.stack!r})"
        return cls(message, file=self.file, field=self.path(key) if key else (self.where or None))

    def has(self, key: str) -> bool:
        return self._value(key) is not None

    def raw(self, key: str, default: Any = _MISSING, *, hint: str = "") -> Any:
        value = self._value(key)
        if value is None:
            if default is _MISSING:
                raise self.err(key, f"is required{f' ({hint})' if hint else ''}")
            return default
        return value

    def joined_text(self, key: str, sep: str) -> str:
        """Free text (``notes``, ``source``, ``family``): a string, or a list of strings joined with ``sep``;
        "" when absent."""
        value = self.raw(key, "")
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return sep.join(value)
        if not isinstance(value, str):
            raise self.err(key, f"got {_what(value)} (expected text, or a list of texts)")
        return value

    def text(self, key: str, default: Any = _MISSING, *, nonempty: bool = False) -> Any:
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key)
        if not isinstance(value, str):
            raise self.err(key, f"got {_what(value)} (expected a string; quote it)")
        if nonempty and not value.strip():
            raise self.err(key, "is empty (expected a non-empty string)")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> Any:
        value = self._value(key)        # (one lookup: has() then raw() made three)
        if value is None:
            if default is not _MISSING:
                return default
            self.raw(key, hint=f"one of {', '.join(choices)}")      # raises: is required
        if not isinstance(value, str) or value not in choices:
            shown = repr(value) if isinstance(value, str) else _what(value)
            sugg = (
                suggest(value, choices)
                if isinstance(value, str)
                else f" (expected one of {', '.join(choices)})"
            )
            if "known:" in sugg:
                sugg = f" (expected one of {', '.join(choices)})"
            raise self.err(key, f"{shown} is not valid{sugg}")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        value = self._value(key)
        if value is None:
            if default is not _MISSING:
                return default
            self.raw(key)       # raises: is required
        if not isinstance(value, bool):
            raise self.err(key, f"got {_what(value)} (expected true or false)")
        return value

    def integer(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        minimum: int = 1,
        maximum: int | None = None,
        counts: bool = False,
        hint: str = "",
    ) -> Any:
        """An integer in ``minimum..maximum`` (``maximum`` None: :data:`MAX_INTEGER`); ``counts`` also accepts
        count strings (``"2k"``, ``"16Ki"``)."""
        value = self._value(key)
        if value is None:
            if default is not _MISSING:
                return default
            self.raw(key, hint=hint)        # raises: is required
        number: float | int
        if isinstance(value, bool):
            raise self.err(key, f"got {_what(value)} (expected an integer >= {minimum})")
        if isinstance(value, int):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif counts and isinstance(value, str):
            try:
                parsed = parse_count(value)
            except ConfigError as exc:
                raise self.err(key, exc.message) from None
            if not float(parsed).is_integer():
                raise self.err(key, f"{value!r} = {parsed:g} is not a whole number (expected an integer)")
            number = int(parsed)
        else:
            raise self.err(key, f"got {_what(value)} (expected an integer >= {minimum})")
        if number < minimum:
            raise self.err(key, f"{number} is less than {minimum} (expected an integer >= {minimum})")
        if maximum is not None and number > maximum:
            raise self.err(key, f"{number:,} is more than {maximum:,} (expected {minimum:,}..{maximum:,})")
        if number > MAX_INTEGER:
            raise self.err(key, f"{number:,} is past 2**53 = {MAX_INTEGER:,}, the most any count fmsim reads "
                                "can be (expected a count a run could need)")
        return int(number)

    def quantity(
        self,
        key: str,
        parse: Callable[[Any], float],
        default: Any = _MISSING,
        *,
        minimum: float = 0.0,
        inclusive: bool = False,
        expected: str = "",
    ) -> Any:
        """A unit quantity through :mod:`fmsim.units`, required to be > ``minimum`` (or >=)."""
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key, hint=expected)
        try:
            out = parse(value)
        except ConfigError as exc:
            raise self.err(key, exc.message) from None
        if not math.isfinite(out):
            raise self.err(key, f"{value!r} is not a finite quantity"
                                f"{f' (expected {expected})' if expected else ''}")
        ok = out >= minimum if inclusive else out > minimum
        if not ok:
            rel = ">=" if inclusive else ">"
            raise self.err(
                key, f"{value!r} must be {rel} {minimum:g}{f' (expected {expected})' if expected else ''}"
            )
        return float(out)

    def parsed(
        self, key: str, parse: Callable[[Any], Any], default: Any = _MISSING, *, expected: str = ""
    ) -> Any:
        """The value read through ``parse`` (a :mod:`fmsim.units` parser, or any callable raising
        :class:`~fmsim.errors.ConfigError`), its error located, with no bound: for values whose rule the
        caller checks itself (a request rate may be ``inf``; a bound may depend on another key)."""
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key, hint=expected)
        try:
            return parse(value)
        except ConfigError as exc:
            raise self.err(key, exc.message) from None

    def number(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        minimum: float = 0.0,
        inclusive: bool = False,
        maximum: float | None = None,
        rule: str = "",
    ) -> Any:
        """A plain finite number (int or float, not a boolean or a string) > ``minimum`` (or >=) and <=
        ``maximum``, as float; ``rule`` words the range in the error (default: from the bounds)."""
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key)
        if not rule:
            rel = ">=" if inclusive else ">"
            rule = "a positive number" if (minimum == 0 and not inclusive) else f"a number {rel} {minimum:g}"
            rule += f" and <= {maximum:g}" if maximum is not None else ""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.err(key, f"must be {rule} (got {_what(value)})")
        ok = value >= minimum if inclusive else value > minimum
        if not ok or (maximum is not None and value > maximum):
            raise self.err(key, f"must be {rule} (got {value!r})")
        return float(value)

    def fraction(self, key: str, default: Any = _MISSING) -> Any:
        """A number in (0, 1] (an efficiency, a share), as float."""
        return self.number(key, default, maximum=1.0, rule="a fraction in (0, 1]")

    def date(self, key: str, default: Any = _MISSING) -> Any:
        """An ISO date, ``YYYY-MM-DD`` or ``YYYY-MM``, as the string written (a YAML date: ``YYYY-MM-DD``)."""
        if not self.has(key) and default is not _MISSING:
            return default
        value = self.raw(key)
        if isinstance(value, (_dt.date, _dt.datetime)):
            return value.isoformat()[:10]
        if isinstance(value, str):
            try:
                _dt.date.fromisoformat(value if len(value) != 7 else value + "-01")
                return value
            except ValueError:
                pass
        raise self.err(key, f"must be a date, YYYY-MM-DD or YYYY-MM (got {_what(value)})")

    def section(
        self, key: str, allowed: tuple[str, ...], *, required: bool = False, what: str = ""
    ) -> _Section | None:
        if not self.has(key):
            if required:
                raise self.err(key, f"is required (expected a mapping with keys {', '.join(allowed)})")
            return None
        own = self.data.get(key)
        inherited = self.inherited.get(key)
        return type(self)({} if own is None else own, self.file, self.path(key), allowed, what=what,
                          inherited=inherited if isinstance(inherited, Mapping) else None, stack=self.stack)


def _relocate(exc: ConfigError, file: str | None, field_path: str) -> ConfigError:
    """``exc`` (raised without a location, e.g. by the catalog) placed at ``file``/``field_path``."""
    return type(exc)(exc.message, file=file, field=field_path)


def float_number(value: Any) -> float:
    """A plain number (int or float, not a boolean) as float, for ratios and tolerances."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"got {_what(value)} (expected a number)")
    return float(value)
