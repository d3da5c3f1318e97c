"""The flops section: achieved FLOP/s by category and operator, of the CPU operators that record a
FLOP count (``torch.profiler`` with ``with_flops=True``)."""

from __future__ import annotations

import dataclasses

from gpuprobe._kernel_names import categorize_cpu_op
from gpuprobe.report._section import Context, Section
from gpuprobe.report._tables import Column, Table, Unit, format_flop_rate, format_ns

__all__ = ["FlopsRow", "FlopsCategory", "FlopsSection", "SECTION"]


@dataclasses.dataclass
class FlopsRow:
    """FLOPs of the CPU operators of one name that record a count (``with_flops=True``).

    ``time_ns`` is the GPU time of the work they launched (``clock`` ``gpu``), or their CPU time
    on a CPU trace (``clock`` ``cpu``); ``flops_per_s`` is ``flops`` over it.
    """

    operator: str
    category: str
    count: int
    flops: int
    time_ns: int
    flops_per_s: float | None


@dataclasses.dataclass
class FlopsCategory:
    """Achieved FLOP/s of one category."""

    category: str
    flops: int
    time_ns: int
    flops_per_s: float | None


@dataclasses.dataclass
class FlopsSection:
    """Achieved FLOP/s by category and operator."""

    clock: str
    total_flops: int
    categories: list[FlopsCategory]
    rows: list[FlopsRow]


def compute(ctx: Context) -> FlopsSection | None:
    scan, cols, gpu_known = ctx.scan, ctx.cols, ctx.gpu_known
    cpu_names = list(scan.cpu_ops)  # by first appearance: the name ids of the CPU operator rows
    cpu = scan.cpu_op_rows
    if not cpu.flops:
        return None
    by_op = cols.flops_by_operator(cpu, gpu_known)  # name id -> (count, flops, time ns)
    rows: list[FlopsRow] = []
    by_cat: dict[str, list[int]] = {}
    for nid, (count, flops, ns) in by_op.items():
        name = cpu_names[nid]
        category = categorize_cpu_op(name)
        rows.append(
            FlopsRow(
                operator=name,
                category=category,
                count=count,
                flops=flops,
                time_ns=ns,
                flops_per_s=flops * 1e9 / ns if ns else None,
            )
        )
        acc2 = by_cat.setdefault(category, [0, 0])
        acc2[0] += flops
        acc2[1] += ns
    rows.sort(key=lambda r: (-r.flops, r.operator))
    cats = [
        FlopsCategory(category=c, flops=f, time_ns=t, flops_per_s=f * 1e9 / t if t else None)
        for c, (f, t) in sorted(by_cat.items(), key=lambda item: (-item[1][0], item[0]))
    ]
    clock = "gpu" if gpu_known else "cpu"
    return FlopsSection(clock=clock, total_flops=sum(r.flops for r in rows), categories=cats, rows=rows)


def tables(fl: FlopsSection, markdown: bool) -> list[Table]:
    columns = [Column("category", "category"), Column("FLOPs", "flops", Unit.INT), Column("time", "time_ns", Unit.NS),
               Column("achieved", "flops_per_s", Unit.FLOP_RATE)]
    lines = [f"{fl.total_flops:,} FLOPs recorded; time on the {fl.clock.upper()} clock"] + [
        f"{r.operator}: {r.count:,} calls, {r.flops:,} FLOPs, {format_ns(r.time_ns)}, "
        + (format_flop_rate(r.flops_per_s) if r.flops_per_s is not None else "-")
        for r in fl.rows[:10]
    ]
    return [Table("flops", "Achieved FLOP/s by category", columns, fl.categories, lines)]


# its table comes last in text, Markdown and CSV, after the communication section's
SECTION = Section("flops", tables, compute=compute, table_last=True)
