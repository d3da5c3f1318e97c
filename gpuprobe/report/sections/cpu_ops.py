"""The cpu_ops section: the top CPU operators by inclusive time."""

from __future__ import annotations

import dataclasses

from gpuprobe.report._section import Context, DiffRow, MergeContext, Section, diff_row, group_by
from gpuprobe.report._tables import Column, Table, Unit

__all__ = ["CpuOpStat", "CpuOpsSection", "SECTION"]


@dataclasses.dataclass
class CpuOpStat:
    """CPU operators by name (inclusive time)."""

    name: str
    count: int
    total_ns: int
    mean_ns: int
    max_ns: int


@dataclasses.dataclass
class CpuOpsSection:
    """Top CPU operators by inclusive time."""

    count: int
    rows: list[CpuOpStat]


def compute(ctx: Context) -> CpuOpsSection:
    cpu_ops = ctx.scan.cpu_ops
    items = sorted(cpu_ops.items(), key=lambda item: (-item[1].total_ns, item[0]))
    rows = [
        CpuOpStat(name=name, count=stat.count, total_ns=stat.total_ns, mean_ns=stat.total_ns // stat.count,
                  max_ns=stat.max_ns)
        for name, stat in items[: ctx.options.top]
    ]
    return CpuOpsSection(count=sum(stat.count for stat in cpu_ops.values()), rows=rows)


def tables(c: CpuOpsSection, markdown: bool) -> list[Table]:
    columns = [Column("operator", "name", Unit.NAME), Column("count", "count", Unit.INT),
               Column("total", "total_ns", Unit.NS), Column("mean", "mean_ns", Unit.NS),
               Column("max", "max_ns", Unit.NS)]
    return [Table("cpu_ops", "CPU operators (inclusive time)", columns, c.rows, [f"{c.count:,} operator calls"])]


def merge(mctx: MergeContext) -> CpuOpsSection | None:
    """Operators summed over ranks."""
    parts = mctx.parts("cpu_ops")
    if not parts:
        return None
    rows = []
    for name, group in group_by((o for part in parts for o in part.rows), lambda o: o.name).items():
        count, total_ns = sum(g.count for g in group), sum(g.total_ns for g in group)
        rows.append(CpuOpStat(name=name, count=count, total_ns=total_ns, mean_ns=total_ns // count if count else 0,
                              max_ns=max(g.max_ns for g in group)))
    rows.sort(key=lambda r: (-r.total_ns, r.name))
    return CpuOpsSection(count=sum(part.count for part in parts), rows=rows[: mctx.top])


def diff(a: CpuOpsSection | None, b: CpuOpsSection | None, ua: float, ub: float) -> list[DiffRow]:
    """Each operator's time in A and B."""
    oa = {r.name: r for r in (a.rows if a else [])}
    ob = {r.name: r for r in (b.rows if b else [])}
    return [
        diff_row(name, "ns", oa[name].total_ns if name in oa else 0, ob[name].total_ns if name in ob else 0, ua, ub)
        for name in set(oa) | set(ob)
    ]


SECTION = Section("cpu_ops", tables, compute=compute, merge=merge, diff=diff, diff_title="CPU operators",
                  diff_cut=True)
