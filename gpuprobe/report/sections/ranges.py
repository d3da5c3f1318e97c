"""The ranges section: GPU time per CPU-side range (``record_function``, NVTX), nested ranges as paths."""

from __future__ import annotations

import dataclasses

from gpuprobe.report._context import Context, DiffRow, MergeContext, Section, diff_row, group_by, known_sum
from gpuprobe.report._tables import Column, Table, Unit

__all__ = ["RangeStat", "RangesSection", "SECTION"]

_MAX_RANGE_PATHS = 200


@dataclasses.dataclass
class RangeStat:
    """One range path (``decode_step/forward``) over all its occurrences.

    ``gpu_busy_ns`` sums, over occurrences, the union of the intervals of the GPU work launched
    inside the occurrence (through launch correlation); ``gpu_span_ns`` sums first start to last end.
    """

    path: str
    name: str
    depth: int
    count: int
    cpu_ns: int
    gpu_busy_ns: int | None
    kernel_ns: int | None
    gpu_span_ns: int | None
    launches: int
    gpu_ops: int


@dataclasses.dataclass
class RangesSection:
    """GPU time per CPU-side range, nested ranges as paths."""

    distinct: int
    rows: list[RangeStat]


def compute(ctx: Context) -> RangesSection:
    """The range paths of most CPU time (at most 200), in order of first appearance."""
    paths = ctx.range_walk.paths
    gpu_known = ctx.gpu_known
    kept = sorted(paths.values(), key=lambda t: (-t.cpu_ns, t.path))[:_MAX_RANGE_PATHS]
    kept.sort(key=lambda t: (t.first_start, t.depth, t.path))
    rows = [
        RangeStat(
            path=t.path,
            name=t.name,
            depth=t.depth,
            count=t.count,
            cpu_ns=t.cpu_ns,
            gpu_busy_ns=t.gpu_busy_ns if gpu_known else None,
            kernel_ns=t.kernel_ns if gpu_known else None,
            gpu_span_ns=t.gpu_span_ns if gpu_known else None,
            launches=t.launches,
            gpu_ops=t.gpu_ops,
        )
        for t in kept
    ]
    return RangesSection(distinct=len(paths), rows=rows)


def tables(r: RangesSection, markdown: bool) -> list[Table]:
    columns = [Column("range", "path", Unit.NAME), Column("count", "count", Unit.INT), Column("CPU", "cpu_ns", Unit.NS),
               Column("GPU busy", "gpu_busy_ns", Unit.NS), Column("kernels", "kernel_ns", Unit.NS),
               Column("GPU span", "gpu_span_ns", Unit.NS), Column("launches", "launches", Unit.INT),
               Column("GPU ops", "gpu_ops", Unit.INT)]
    lines = [f"{r.distinct:,} distinct range paths"] if r.distinct > len(r.rows) else []
    return [Table("ranges", "GPU time per range", columns, r.rows, lines)]


def merge(mctx: MergeContext) -> RangesSection | None:
    """Range paths summed over ranks."""
    if not mctx.any_has("ranges"):
        return None
    rows = []
    for path, group in group_by((r for part in mctx.parts("ranges") for r in part.rows), lambda r: r.path).items():
        rows.append(RangeStat(path=path, name=group[0].name, depth=group[0].depth,
                              count=sum(g.count for g in group), cpu_ns=sum(g.cpu_ns for g in group),
                              gpu_busy_ns=known_sum(g.gpu_busy_ns for g in group),
                              kernel_ns=known_sum(g.kernel_ns for g in group),
                              gpu_span_ns=known_sum(g.gpu_span_ns for g in group),
                              launches=sum(g.launches for g in group), gpu_ops=sum(g.gpu_ops for g in group)))
    return RangesSection(distinct=len(rows), rows=rows)


def diff(a: RangesSection | None, b: RangesSection | None, ua: float, ub: float) -> list[DiffRow]:
    """CPU time and GPU busy time of each range path in A and B."""
    pa = {r.path: r for r in (a.rows if a else [])}
    pb = {r.path: r for r in (b.rows if b else [])}
    rows = []
    for path in set(pa) | set(pb):
        x, y = pa.get(path), pb.get(path)
        rows.append(diff_row(path, "cpu_ns", x.cpu_ns if x else 0, y.cpu_ns if y else 0, ua, ub))
        gx = x.gpu_busy_ns if x else 0
        gy = y.gpu_busy_ns if y else 0
        if gx is not None or gy is not None:
            rows.append(diff_row(path, "gpu_busy_ns", gx, gy, ua, ub))
    return rows


SECTION = Section("ranges", tables, compute=compute, merge=merge, diff=diff, diff_title="Ranges", diff_cut=True)
