"""Small scenario mappings the tests of the stacks and the band (tests/test_stacks.py, tests/test_band.py)
start from."""

from __future__ import annotations

from typing import Any


def small_pretrain(instance: str, **top: Any) -> dict[str, Any]:
    """A fresh mapping of a small pretraining what-if (llama3-8b, fp8, 8k tokens, tp 2, two nodes of
    ``instance``) with ``top`` setting top-level keys (``stack=...``, ``configuration=...``)."""
    data: dict[str, Any] = {
        "version": 1,
        "name": "t",
        "workload": {"kind": "pretrain", "model": "llama3-8b", "precision": "fp8", "seq_len": 8192,
                     "global_batch": 128},
        "parallelism": {"tp": 2},
        "cluster": {"instance": instance, "nodes": 2},
    }
    data.update(top)
    return data
