"""``fmsim collective``: the fabric model's answer to one nccl-tests run.

Owns the ``collective`` sub-command: ``fmsim collective OP --instance NAME --nodes N --size 1GiB
[--algo auto|ring|tree|...] [--per-node K] [--sweep] [--json]`` prints the time, algorithm
bandwidth and bus bandwidth (GB/s = 1e9 B/s, nccl-tests units and definitions) of collective OP
over all accelerators of N nodes, so users can hold it against their own nccl-tests output.
``--sweep`` prints a table over sizes 8 B .. 16 GiB (×2 steps), like ``all_reduce_perf -b 8 -e 16G
-f 2``. ``--json`` prints one object (a list of them with ``--sweep``).

:func:`add_parser` registers the sub-command; :func:`run` executes it and raises
:class:`~fmsim.errors.ConfigError` on bad input (the CLI turns it into one line and exit code 2).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from .catalog import load_catalog, with_in_network_reduction
from .errors import ConfigError
from .hardware.collectives import ALGORITHMS, OPS, CollectiveCost, GroupShape, collective_time
from .units import format_quantity, parse_bytes

SWEEP_SIZES = tuple(2.0 ** k for k in range(3, 35))     # 8 B .. 16 GiB


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``collective`` on an ``argparse`` sub-parsers object and return its parser."""
    p = subparsers.add_parser(
        "collective",
        help="time, algbw and busbw of one collective on an instance type (nccl-tests style)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("op", help=f"collective: {', '.join(OPS)}")
    p.add_argument("--instance", required=True, help="hardware_catalog instance, e.g. p5.48xlarge")
    p.add_argument("--nodes", default="1", help="nodes (instances) in the group [1]")
    p.add_argument("--size", default="1GiB",
                   help="message size in nccl-tests convention, e.g. 16GiB, 256MiB [1GiB]")
    p.add_argument("--algo", default="auto",
                   help=f"algorithm: auto, {', '.join(ALGORITHMS)} [auto = fastest, as NCCL's tuner]")
    p.add_argument("--per-node", default=None, dest="per_node",
                   help="group members per node [all accelerators]; "
                        "1 = one GPU per node (nccl-tests split 0x7)")
    p.add_argument("--sharp", action="store_true",
                   help="the InfiniBand switches reduce (NVIDIA SHARP: in-network all-reduce, reduce-scatter "
                        "and all-gather between nodes); InfiniBand instances only")
    p.add_argument("--sweep", action="store_true", help="table over sizes 8 B .. 16 GiB (x2 steps)")
    p.add_argument("--json", action="store_true", help="print JSON (a list of objects with --sweep)")
    p.set_defaults(func=run)
    return p


def _positive_int(text: Any, field: str) -> int:
    try:
        v = int(str(text), 10)
    except ValueError:
        raise ConfigError(f"expected a positive integer, got {text!r}", field=field) from None
    if v < 1:
        raise ConfigError(f"expected a positive integer, got {text!r}", field=field)
    return v


def _row(op: str, size: float, c: CollectiveCost) -> dict[str, Any]:
    return {"op": op, "size_bytes": size, "time_s": c.time_s, "algbw_bytes_per_s": c.algbw_bytes_per_s,
            "busbw_bytes_per_s": c.busbw_bytes_per_s, "algorithm": c.algorithm}


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Execute ``fmsim collective`` for parsed ``args``; returns the exit code (0)."""
    out = out or sys.stdout
    op = str(args.op)
    if op not in OPS:
        from .catalog import suggest
        raise ConfigError(f"unknown collective {op!r}{suggest(op, OPS)}", field="op")
    inst = load_catalog().instance(str(args.instance))
    if getattr(args, "sharp", False):
        try:
            inst = with_in_network_reduction(inst)
        except ConfigError as exc:
            raise ConfigError(exc.message, field="sharp") from None
    nodes = _positive_int(args.nodes, "nodes")
    acc = inst.num_accelerators
    raw_per_node = getattr(args, "per_node", None)
    per_node = acc if raw_per_node in (None, "") else _positive_int(raw_per_node, "per-node")
    if per_node > acc or acc % per_node:
        raise ConfigError(f"{per_node} per node does not divide the {acc} accelerators of {inst.name}",
                          field="per-node")
    from .scenario import MAX_GPUS

    if nodes * per_node > MAX_GPUS:  # the cost of the group's topology grows with its ranks
        raise ConfigError(f"{nodes:,} nodes x {per_node} = {nodes * per_node:,} ranks is past the "
                          f"{MAX_GPUS:,} any cluster could have", field="nodes")
    shape = GroupShape(size=nodes * per_node, per_node=per_node, stride=acc // per_node)
    algo = str(getattr(args, "algo", "auto") or "auto")
    if getattr(args, "sweep", False):
        sizes = SWEEP_SIZES
    else:
        size = parse_bytes(args.size)
        if size < 0:
            raise ConfigError(f"size must be >= 0, got {args.size!r}", field="size")
        sizes = (size,)
    rows = [_row(op, s, collective_time(op, s, inst, shape, algo=algo, nodes=nodes)) for s in sizes]
    if getattr(args, "json", False):
        json.dump(rows if args.sweep else rows[0], out, indent=None if args.sweep else 2)
        out.write("\n")
        return 0
    sharp = ", SHARP" if inst.fabric.in_network_reduction else ""
    head = (f"{op} over {nodes} x {inst.name}: {shape.size} ranks, {per_node} per node "
            f"({inst.fabric.name}{sharp}, {inst.scale_up.kind} domain of {inst.scale_up.domain_size})")
    if args.sweep:
        out.write(f"# {head}\n")
        out.write(f"# {'size (B)':>12} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"
                  "  algorithm\n")
        for r in rows:
            out.write(f"  {int(r['size_bytes']):>12d} {r['time_s'] * 1e6:>11.2f} "
                      f"{r['algbw_bytes_per_s'] / 1e9:>13.2f} {r['busbw_bytes_per_s'] / 1e9:>13.2f}  "
                      f"{r['algorithm']}\n")
        return 0
    r = rows[0]
    out.write(f"{head}, size {format_quantity(r['size_bytes'], 'bytes')}\n")
    out.write(f"  time       {format_quantity(r['time_s'], 's', 4)}\n")
    out.write(f"  algbw      {r['algbw_bytes_per_s'] / 1e9:.2f} GB/s\n")
    out.write(f"  busbw      {r['busbw_bytes_per_s'] / 1e9:.2f} GB/s\n")
    out.write(f"  algorithm  {r['algorithm']}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m fmsim.cli_collective ...``); ``fmsim collective`` is the usual one."""
    parser = argparse.ArgumentParser(prog="fmsim")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["collective", *(argv if argv is not None else sys.argv[1:])])
    try:
        return run(args)
    except ConfigError as exc:
        print(f"fmsim collective: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["SWEEP_SIZES", "add_parser", "main", "run"]
