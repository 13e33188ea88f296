"""The strict YAML reader scenario files are parsed with -- :func:`load_yaml_text`, :func:`_read_text`
and the size limits -- re-exported from :mod:`fmsim.yaml_safe`, where it lives so that the catalogs
(:mod:`fmsim.catalog`, which this package imports) are parsed by the same one.
"""

from __future__ import annotations

from ..yaml_safe import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_EXPANDED_NODES,
    MAX_FILE_BYTES,
    _read_text,
    decode_text,
    load_yaml_text,
    read_yaml_file,
)

__all__ = ["MAX_ALIASES", "MAX_DEPTH", "MAX_EXPANDED_NODES", "MAX_FILE_BYTES", "_read_text", "decode_text",
           "load_yaml_text", "read_yaml_file"]
