"""The communication section: communication kernels against computation. Per device, the union of
communication kernels, the union of the other kernels, their overlap and the exposed rest; for the
whole trace and per step. Also the start of each collective, by family and occurrence, for comparing
ranks."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from gpuprobe._kernel_names import kernel_family
from gpuprobe.report._section import CAT_INDEX, Context, GpuOpKind, Section, TraceScan, merge_intervals, overlap_length
from gpuprobe.report._tables import Column, Table, Unit, format_ns

__all__ = ["CommStepRow", "CommunicationSection", "communication", "collective_starts", "split_overlap", "SECTION"]

_KERNEL = GpuOpKind.KERNEL.value


@dataclasses.dataclass
class CommStepRow:
    """Communication of one step (``index`` as in the steps section)."""

    index: int
    communication_ns: int
    overlap_ns: int
    exposed_ns: int


@dataclasses.dataclass
class CommunicationSection:
    """Communication kernels (NCCL, RCCL, custom all-reduce, ...) and how much compute hides them.

    ``communication_ns`` sums their durations; ``overlap_ns`` is, per device, the union of their
    intervals intersected with the union of the other kernels' intervals, summed over devices;
    ``exposed_ns`` is the union of communication minus the overlap: time only communication ran.
    """

    kernel_ns: int
    collectives: int
    communication_ns: int
    overlap_ns: int
    exposed_ns: int
    rows: list[CommStepRow]




def split_overlap(kernels: Iterable[tuple[int, int, int, bool]]) -> tuple[int, int, int]:
    """``(communication ns, overlap ns, exposed ns)`` of kernels ``(device, start, end, is_comm)``.

    Example:
        >>> split_overlap([(0, 0, 10, True), (0, 5, 20, False), (1, 0, 4, True)])
        (14, 5, 9)
    """
    comm: dict[int, list[tuple[int, int]]] = {}
    other: dict[int, list[tuple[int, int]]] = {}
    total = 0
    for device, start, end, is_comm in kernels:
        if is_comm:
            comm.setdefault(device, []).append((start, end))
            total += end - start
        else:
            other.setdefault(device, []).append((start, end))
    overlap = exposed = 0
    for device, pairs in comm.items():
        merged = merge_intervals(pairs)
        both = overlap_length(merged, merge_intervals(other.get(device, [])))
        overlap += both
        exposed += sum(b - a for a, b in merged) - both
    return total, overlap, exposed


def communication(
    scan: TraceScan,
    cols: object,
    step_windows: list[list[tuple[int, int]]],
    step_indexes: list[int],
    comm_names: set[int],
) -> CommunicationSection | None:
    """The communication section of a trace; None without communication kernels."""
    if not comm_names:
        return None
    ops = scan.ops
    devices = [device for device, _ in scan.streams]
    kernels = [
        (devices[sid], s, s + d, nid in comm_names)
        for k, nid, s, d, sid in zip(ops.kind, ops.name_id, ops.start, ops.dur, ops.stream_id)
        if k == _KERNEL
    ]
    total, overlap, exposed = split_overlap(kernels)
    rows = []
    for index, wins in zip(step_indexes, step_windows):
        w = cols.window_ops(wins)  # type: ignore[attr-defined]
        step = [
            (devices[sid], a, b, nid in comm_names)
            for k, nid, a, b, sid in zip(w.kind, w.name_id, w.start, w.end, w.stream_id)
            if k == _KERNEL
        ]
        c, o, e = split_overlap(step)
        rows.append(CommStepRow(index=index, communication_ns=c, overlap_ns=o, exposed_ns=e))
    return CommunicationSection(
        kernel_ns=sum(e - s for _, s, e, _ in kernels),
        collectives=sum(1 for k in kernels if k[3]),
        communication_ns=total,
        overlap_ns=overlap,
        exposed_ns=exposed,
        rows=rows,
    )


def collective_starts(scan: TraceScan, gpu_names: list[str], comm_names: set[int]) -> dict[str, list[int]]:
    """Start times of the communication kernels, by kernel family, in time order (the k-th of a
    family on each rank is taken for the same collective)."""
    ops = scan.ops
    family = {nid: kernel_family(gpu_names[nid]) for nid in comm_names}
    out: dict[str, list[int]] = {}
    for k, nid, s in zip(ops.kind, ops.name_id, ops.start):
        if k == _KERNEL and nid in comm_names:
            out.setdefault(family[nid], []).append(s)
    for starts in out.values():
        starts.sort()
    return out


def compute(ctx: Context) -> CommunicationSection | None:
    """The section of a trace with GPU operations; None without communication kernels."""
    if not ctx.gpu_known:
        return None
    comm_ids = {i for i, c in enumerate(ctx.cat_of_name) if c == CAT_INDEX["communication"]}
    steps = ctx.steps
    return communication(ctx.scan, ctx.cols, [s.op_windows for s in steps], [s.index for s in steps], comm_ids)


def tables(cm: CommunicationSection, markdown: bool) -> list[Table]:
    columns = [Column("step", "index", Unit.INT), Column("communication", "communication_ns", Unit.NS),
               Column("overlapped", "overlap_ns", Unit.NS), Column("exposed", "exposed_ns", Unit.NS)]
    line = (f"{cm.collectives:,} communication kernels, {format_ns(cm.communication_ns)}; overlapped with "
            f"other kernels {format_ns(cm.overlap_ns)}, exposed {format_ns(cm.exposed_ns)}")
    return [Table("communication", "Communication and computation overlap", columns, cm.rows, [line])]


SECTION = Section("communication", tables, compute=compute)
