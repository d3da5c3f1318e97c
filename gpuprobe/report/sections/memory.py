"""The memory section: copies and sets by kind and direction, with their bandwidth."""

from __future__ import annotations

import dataclasses

from gpuprobe.report._section import EVENT_KIND, MEMSET, Context, DiffRow, MergeContext, Section, diff_row, group_by
from gpuprobe.report._tables import Column, Table, Unit

__all__ = ["MemOpStat", "MemorySection", "SECTION"]


@dataclasses.dataclass
class MemOpStat:
    """Copies or sets of one direction; bandwidth is bytes over summed duration (GB/s)."""

    kind: str
    direction: str
    count: int
    bytes: int
    total_ns: int
    bandwidth_gbps: float | None


@dataclasses.dataclass
class MemorySection:
    """Memory operations by direction."""

    total_bytes: int
    total_ns: int
    rows: list[MemOpStat]


def compute(ctx: Context) -> MemorySection:
    direction_names = list(ctx.scan.directions)
    rows = []
    for group in ctx.cols.memory_groups():
        kind_name = EVENT_KIND[group.kind]
        direction = direction_names[group.direction_id] or ("Device" if kind_name == MEMSET else "unknown")
        rows.append(
            MemOpStat(
                kind=kind_name,
                direction=direction,
                count=group.count,
                bytes=group.nbytes,
                total_ns=group.total_ns,
                bandwidth_gbps=group.nbytes / group.total_ns if group.total_ns else None,
            )
        )
    return _section(rows)


def _section(rows: list[MemOpStat]) -> MemorySection:
    rows.sort(key=lambda r: (-r.total_ns, r.kind, r.direction))
    return MemorySection(total_bytes=sum(r.bytes for r in rows), total_ns=sum(r.total_ns for r in rows), rows=rows)


def tables(m: MemorySection, markdown: bool) -> list[Table]:
    columns = [Column("kind", "kind"), Column("direction", "direction"), Column("count", "count", Unit.INT),
               Column("bytes", "bytes", Unit.BYTES), Column("total", "total_ns", Unit.NS),
               Column("bandwidth", "bandwidth_gbps", Unit.GBPS)]
    return [Table("memory", "Memory operations", columns, m.rows)]


def merge(mctx: MergeContext) -> MemorySection | None:
    if not mctx.any_has("memory"):
        return None
    rows = []
    mem = [m for part in mctx.parts("memory") for m in part.rows]
    for (kind, direction), group in group_by(mem, lambda m: (m.kind, m.direction)).items():
        nbytes, ns = sum(g.bytes for g in group), sum(g.total_ns for g in group)
        rows.append(MemOpStat(kind=kind, direction=direction, count=sum(g.count for g in group), bytes=nbytes,
                              total_ns=ns, bandwidth_gbps=nbytes / ns if ns else None))
    return _section(rows)


def diff(a: MemorySection | None, b: MemorySection | None, ua: float, ub: float) -> list[DiffRow]:
    """Bytes and time of each kind and direction in A and B."""
    ma = {(r.kind, r.direction): r for r in (a.rows if a else [])}
    mb = {(r.kind, r.direction): r for r in (b.rows if b else [])}
    rows = []
    for key in sorted(set(ma) | set(mb)):
        x, y = ma.get(key), mb.get(key)
        label = f"{key[0]} {key[1]}"
        rows.append(diff_row(label, "bytes", x.bytes if x else 0, y.bytes if y else 0, ua, ub))
        rows.append(diff_row(label, "ns", x.total_ns if x else 0, y.total_ns if y else 0, ua, ub))
    return rows


SECTION = Section("memory", tables, compute=compute, merge=merge, diff=diff, diff_title="Memory operations")
