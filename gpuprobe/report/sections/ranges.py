"""The ranges section: GPU time per CPU-side range (``record_function``, NVTX), nested ranges as paths."""

from __future__ import annotations

import dataclasses

from gpuprobe.report._section import (
    Context,
    DiffRow,
    MergeContext,
    Section,
    diff_row,
    group_by,
    known_sum,
    spread_width,
    step_spread,
)
from gpuprobe.report._tables import Column, Table, Unit

__all__ = ["RangeStat", "RangesSection", "SECTION"]

_MAX_RANGE_PATHS = 200


@dataclasses.dataclass
class RangeStat:
    """One range path (``decode_step/forward``) over all its occurrences.

    ``gpu_busy_ns`` sums, over occurrences, the union of the intervals of the GPU work launched
    inside the occurrence (through launch correlation); ``gpu_span_ns`` sums first start to last end.
    The ``cpu_step_*`` figures are the path's CPU time per step, across the trace's steps (0 in a step
    without it): ``None`` for a path outside steps, and in a merge of ranks.
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
    cpu_step_median_ns: int | None = None
    cpu_step_p10_ns: int | None = None
    cpu_step_p90_ns: int | None = None


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
    n_steps = len(ctx.steps)
    rows = []
    for t in kept:
        spread = step_spread([t.step_cpu_ns.get(i, 0) for i in range(n_steps)]) if t.step_cpu_ns else None
        rows.append(RangeStat(
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
            cpu_step_median_ns=spread.median if spread else None,
            cpu_step_p10_ns=spread.p10 if spread else None,
            cpu_step_p90_ns=spread.p90 if spread else None,
        ))
    return RangesSection(distinct=len(paths), rows=rows)


def _columns(gpu: bool) -> list[Column]:
    """The table's columns: with GPU activity its GPU figures, else each range's CPU time per step; CSV has
    every column either way (the same header whatever the trace)."""
    return [
        Column("range", "path", Unit.NAME), Column("count", "count", Unit.INT), Column("CPU", "cpu_ns", Unit.NS),
        *(Column(header, key, unit, csv_only=not gpu) for header, key, unit in (
            ("GPU busy", "gpu_busy_ns", Unit.NS), ("kernels", "kernel_ns", Unit.NS),
            ("GPU span", "gpu_span_ns", Unit.NS), ("launches", "launches", Unit.INT), ("GPU ops", "gpu_ops", Unit.INT))),
        *(Column(header, key, Unit.NS, csv_only=gpu) for header, key in (
            ("per step (median)", "cpu_step_median_ns"), ("p10", "cpu_step_p10_ns"), ("p90", "cpu_step_p90_ns"))),
    ]


def gpu_less(r: RangesSection) -> bool:
    """Whether no range launched or ran GPU work that the trace holds (a CPU trace): its table is CPU time only."""
    return all(row.gpu_busy_ns is None and not row.launches for row in r.rows)


def tables(r: RangesSection, markdown: bool) -> list[Table]:
    """GPU time per range; without GPU activity, CPU time per range, with each range's time per step."""
    lines = [f"{r.distinct:,} distinct range paths"] if r.distinct > len(r.rows) else []
    if r.rows and gpu_less(r):
        lines.append("no GPU activity: each range's CPU time; per step: its CPU time in each step, across the "
                     "steps (0 in a step without it), - outside steps")
        return [Table("ranges", "CPU time per range", _columns(gpu=False), r.rows, lines)]
    return [Table("ranges", "GPU time per range", _columns(gpu=True), r.rows, lines)]


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


def _cpu_median(r: RangeStat | None) -> float | None:
    return float(r.cpu_step_median_ns) if r is not None and r.cpu_step_median_ns is not None else None


def _cpu_width(r: RangeStat | None) -> float | None:
    return spread_width(r.cpu_step_p10_ns, r.cpu_step_p90_ns) if r is not None else None


def diff(a: RangesSection | None, b: RangesSection | None, ua: float, ub: float) -> list[DiffRow]:
    """CPU time (with its median and spread across steps) and GPU busy time of each range path in A and B.

    A path one trace lacks counts 0 there; its GPU busy time is compared only where a trace knows GPU time.
    """
    pa = {r.path: r for r in (a.rows if a else [])}
    pb = {r.path: r for r in (b.rows if b else [])}
    rows = []
    for path in set(pa) | set(pb):
        x, y = pa.get(path), pb.get(path)
        rows.append(diff_row(path, "cpu_ns", x.cpu_ns if x else 0, y.cpu_ns if y else 0, ua, ub,
                             a_median=_cpu_median(x), a_spread=_cpu_width(x),
                             b_median=_cpu_median(y), b_spread=_cpu_width(y)))
        gx = x.gpu_busy_ns if x else None
        gy = y.gpu_busy_ns if y else None
        if gx is not None or gy is not None:
            rows.append(diff_row(path, "gpu_busy_ns", gx if x else 0, gy if y else 0, ua, ub))
    return rows


SECTION = Section("ranges", tables, compute=compute, merge=merge, diff=diff, diff_title="Ranges", diff_cut=True)
