"""Typed errors of fmsim: every failure a user can cause is one of these.

Faces (CLI, app) turn them into one line -- ``FILE: field.path: what is wrong (expected)`` -- and
exit code 2 or ``st.error``; they never show a traceback. ``assert`` is kept for bugs only.
"""
from __future__ import annotations


class FmsimError(Exception):
    """Base of every error fmsim raises on purpose."""


class ConfigError(FmsimError):
    """A scenario, catalog entry or option is malformed.

    Parameters
    ----------
    message:
        What is wrong and what was expected.
    file:
        The file it came from, if any.
    field:
        Dotted field path inside that file (``parallelism.tp``), if any.
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.message = message
        self.file = file
        self.field = field
        super().__init__(self.__str__())

    def __str__(self) -> str:
        parts = [p for p in (self.file, self.field) if p]
        return ": ".join([*parts, self.message])

    def located(self, *, file: str | None = None, prefix: str | None = None) -> ConfigError:
        """Return a copy with a file name and/or a field-path prefix added."""
        field = self.field
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        err = type(self)(self.message, file=file or self.file, field=field)
        return err


class UnitError(ConfigError):
    """A quantity string could not be parsed in the expected dimension."""


class InfeasibleError(FmsimError):
    """A well-formed plan that cannot run (does not divide, does not fit)."""


class ParallelismError(InfeasibleError, ConfigError):
    """Parallel sizes do not divide the model or the cluster."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        ConfigError.__init__(self, message, file=file, field=field)


class OutOfMemoryError(InfeasibleError):
    """A plan needs more memory per device than it has; names what overflows."""

    def __init__(self, message: str, *, breakdown: dict[str, float] | None = None):
        self.breakdown = dict(breakdown or {})
        super().__init__(message)


class NotBuiltError(FmsimError):
    """A workload kind whose simulator is not built yet."""
