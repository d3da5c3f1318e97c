"""The timeline section: the longest GPU operations and CPU events, in time order."""

from __future__ import annotations

import dataclasses

from gpuprobe._kernel_names import short_kernel_name
from gpuprobe.report._context import EVENT_KIND, Context, GpuOpKind, Section
from gpuprobe.report._tables import Column, Table, Unit

__all__ = ["TimelineRow", "TimelineSection", "SECTION"]


@dataclasses.dataclass
class TimelineRow:
    """One long event; ``start_ns`` is relative to the trace start."""

    kind: str
    name: str
    start_ns: int
    dur_ns: int
    where: str


@dataclasses.dataclass
class TimelineSection:
    """The longest GPU operations and CPU events, in time order."""

    rows: list[TimelineRow]


def compute(ctx: Context) -> TimelineSection:
    rows: list[TimelineRow] = []
    stream_keys = list(ctx.scan.streams)  # (device, stream) by stream id
    options = ctx.options
    limit = options.timeline_top if options.timeline_top is not None else options.top
    for op in ctx.cols.longest_ops(limit):
        name = ctx.gpu_names[op.name_id]
        device, stream = stream_keys[op.stream_id]
        rows.append(
            TimelineRow(
                kind=EVENT_KIND[op.kind],
                name=short_kernel_name(name) if op.kind == GpuOpKind.KERNEL else name,
                start_ns=op.start - ctx.origin,
                dur_ns=op.dur,
                where=f"device {device} stream {stream}",
            )
        )
    for dur, _arrival, kind, name, start, thread in ctx.scan.longest_cpu:
        rows.append(
            TimelineRow(kind=kind, name=name, start_ns=start - ctx.origin, dur_ns=dur, where=f"thread {thread}")
        )
    rows.sort(key=lambda r: (r.start_ns, -r.dur_ns, r.kind, r.name))
    return TimelineSection(rows=rows)


def tables(t: TimelineSection, markdown: bool) -> list[Table]:
    columns = [Column("start", "start_ns", Unit.NS), Column("duration", "dur_ns", Unit.NS), Column("kind", "kind"),
               Column("where", "where"), Column("name", "name", Unit.NAME)]
    return [Table("timeline", "Long events, in time order", columns, t.rows)]


SECTION = Section("timeline", tables, compute=compute)
