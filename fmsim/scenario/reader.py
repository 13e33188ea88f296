"""The validating reader every section is read with -- :class:`_Section`, :func:`_relocate`,
:func:`float_number` -- re-exported from :mod:`fmsim.fields`, where it lives so that the catalogs
(:mod:`fmsim.catalog`, which this package imports) read their entries with the same one.
"""

from __future__ import annotations

from ..fields import _MISSING, _Section, _relocate, _what, float_number, suggest

__all__ = ["_MISSING", "_Section", "_relocate", "_what", "float_number", "suggest"]
