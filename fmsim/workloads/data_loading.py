"""Data loading: the bytes a training step reads and the stall when the storage cannot keep up.

Owns :func:`data_stall`. A step reads its global batch once: ``global_batch x seq_len x bytes_per_token``
for pre-tokenised text (int32 token ids by default: Megatron's indexed datasets use int32 for
vocabularies past 65,536 ids) or ``global_batch x sample_bytes`` for whole samples (images, video,
audio). Each data-parallel replica reads its own share, spread over the nodes. The reads run ahead of
the step on the loader's workers (``prefetch`` batches, PyTorch DataLoader's ``prefetch_factor`` 2 by
default): in steady state a prefetching loader stalls the step only by what the read takes beyond the
step, ``max(0, read - step)``; without prefetch (0) the whole read stalls. Prefetch depth beyond one
absorbs bursts, which a steady model does not have: it changes nothing here (said in docs/storage.md).
The read time is the file system's aggregate read rate shared by the nodes
(:meth:`fmsim.hardware.storage.FileSystem.transfer_s`), the S3 GET request rate for its parts, and with
``samples_per_file`` one metadata operation (open) per file against the FSx metadata IOPS.
``source: local`` (a node-local copy) reads nothing from the shared storage.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hardware.storage import FileSystem


@dataclass(frozen=True, slots=True, kw_only=True)
class DataLoad:
    bytes_per_step: float
    read_s: float | None           # one step's batch from the storage (None: no storage to read from)
    stall_s: float                 # added to each step
    notes: tuple[str, ...] = ()


def bytes_per_step(sc) -> float:
    d, w = sc.data, sc.workload
    per_sample = d.sample_bytes if d.sample_bytes else w.seq_len * d.bytes_per_token
    return w.global_batch * per_sample


def data_stall(sc, fs: FileSystem | None, nodes: int, step_s: float) -> DataLoad | None:
    """The data-loading figures of ``sc``'s step, or None without a ``data:`` section."""
    d = sc.data
    if d is None:
        return None
    total = bytes_per_step(sc)
    if d.source == "local":
        return DataLoad(bytes_per_step=total, read_s=0.0, stall_s=0.0,
                        notes=("data read from a node-local copy: no shared-storage reads",))
    if fs is None:
        return DataLoad(bytes_per_step=total, read_s=None, stall_s=0.0,
                        notes=("data: no cluster.storage to read from; the read is not costed",))
    read = fs.transfer_s(total, nodes, write=False)
    notes = []
    if d.samples_per_file and fs.metadata_iops != float("inf"):
        opens = sc.workload.global_batch / d.samples_per_file
        read = max(read, opens / fs.metadata_iops)
    stall = max(0.0, read - step_s) if d.prefetch >= 1 else read
    if stall > 0:
        notes.append(f"the storage reads a batch in {read:.3g} s, slower than the {step_s:.3g} s step: "
                     "a faster or larger file system, or a node-local copy of the data")
    return DataLoad(bytes_per_step=total, read_s=read, stall_s=stall, notes=tuple(notes))


__all__ = ["DataLoad", "bytes_per_step", "data_stall"]
