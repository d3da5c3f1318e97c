"""The timeline section: the longest GPU operations and CPU events, in time order."""

from __future__ import annotations

import dataclasses

from gpuprobe._kernel_names import short_kernel_name
from gpuprobe.report._section import EVENT_KIND, Context, GpuOpKind, Section
from gpuprobe.report._tables import Column, Table, Unit

__all__ = ["TimelineRow", "TimelineSection", "SAME_CALL", "SECTION"]

#: A CPU event nested in a longer one of its thread, taking at least this share of its time, is the same
#: call (``aten::linear`` > ``aten::matmul`` > ``aten::mm``; a ``record_function`` around one operator).
SAME_CALL = 0.8
#: A long CPU-side event as the scan keeps it: (duration ns, arrival number, kind, name, start ns, "pid/tid").
LongEvent = tuple[int, int, str, str, int, str]
#: The kinds of GPU operations' rows: a timeline without them is a trace without GPU records.
_GPU_KINDS = frozenset(EVENT_KIND.values())


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
    longest = sorted(ctx.scan.longest_cpu, reverse=True)  # longest first; a tie to the later, as the scan's heap
    # A trace without GPU records lists each call once. A GPU trace keeps every event, as it always has: the
    # runtime call nested in an operator (cudaStreamSynchronize in aten::item) says what the operator waited on.
    cpu = longest[:limit] if ctx.gpu_known else _calls(longest, limit)
    for dur, _arrival, kind, name, start, thread in cpu:
        rows.append(
            TimelineRow(kind=kind, name=name, start_ns=start - ctx.origin, dur_ns=dur, where=f"thread {thread}")
        )
    rows.sort(key=lambda r: (r.start_ns, -r.dur_ns, r.kind, r.name))
    return TimelineSection(rows=rows)


def _calls(longest: list[LongEvent], limit: int) -> list[LongEvent]:
    """The ``limit`` longest CPU-side events (given longest first), one per call.

    An event nested in a longer one of its thread and taking most of its time (:data:`SAME_CALL`) is that
    call's own work (``aten::linear`` holds ``aten::matmul``, which holds ``aten::mm``) and is left out;
    the outermost is kept: the call the program made, whose duration holds the others'.
    """
    kept: list[LongEvent] = []
    for event in longest:
        if len(kept) >= limit:
            break
        dur, _arrival, _kind, _name, start, thread = event
        if not any(k[5] == thread and k[4] <= start and start + dur <= k[4] + k[0] and dur >= k[0] * SAME_CALL
                   for k in kept):
            kept.append(event)
    return kept


def tables(t: TimelineSection, markdown: bool) -> list[Table]:
    columns = [Column("start", "start_ns", Unit.NS), Column("duration", "dur_ns", Unit.NS), Column("kind", "kind"),
               Column("where", "where"), Column("name", "name", Unit.NAME)]
    cpu_only = t.rows and not any(r.kind in _GPU_KINDS for r in t.rows)
    lines = ["one row per call: an event nested in a listed one of its thread and taking most of its time (an "
             "operator it called, a range around it) is left out; the outermost is listed"] if cpu_only else []
    return [Table("timeline", "Long events, in time order", columns, t.rows, lines)]


SECTION = Section("timeline", tables, compute=compute)
