"""The streams section: each GPU stream's work, and how much of it ran while another stream of the same
device was busy too (copies hidden behind compute, a side stream's kernels beside the main one's).

Computed when asked for (``--sections streams``, for one trace or the ranks of several): most
single-model traces run one stream per device, where the kernels section says it all. ``gpuprobe diff``
compares the default sections and leaves it out.
"""

from __future__ import annotations

import dataclasses

from gpuprobe.report._section import Context, GpuOpKind, MergeContext, Section, merge_intervals
from gpuprobe.report._tables import Column, Table, Unit, format_ns

__all__ = ["StreamRow", "StreamsSection", "stream_overlap", "SECTION"]

_KERNEL = GpuOpKind.KERNEL.value


@dataclasses.dataclass
class StreamRow:
    """One stream of one device (``rank`` is None in a one-trace report).

    ``busy_ns`` is the union of the stream's operations' intervals; ``concurrent_ns`` the part of it
    during which at least one other stream of the device was busy as well; ``share`` is ``busy_ns``
    over the device's busy time (the union over its streams).
    """

    device: int
    stream: int
    kernels: int
    copies: int
    busy_ns: int
    concurrent_ns: int
    share: float
    rank: int | None = None


@dataclasses.dataclass
class StreamsSection:
    """GPU streams: ``busy_ns`` sums each device's busy time; ``concurrent_ns`` sums the time two or more
    streams of a device were busy at once."""

    streams: int
    busy_ns: int
    concurrent_ns: int
    rows: list[StreamRow]


def stream_overlap(intervals: dict[int, list[tuple[int, int]]]) -> tuple[int, int, dict[int, tuple[int, int]]]:
    """The busy and concurrent time of one device's streams.

    Args:
        intervals: ``(start, end)`` of each stream's operations, by stream key, any order.

    Returns:
        The device's busy time (the union), the time two or more streams ran at once, and for each
        stream its own busy time and the part of it during which another stream ran.

    Example:
        >>> busy, both, per = stream_overlap({7: [(0, 10), (20, 30)], 9: [(5, 25)]})
        >>> busy, both, per[7], per[9]
        (30, 10, (20, 10), (20, 10))
    """
    merged = {key: merge_intervals(pairs) for key, pairs in intervals.items()}
    # One sweep over every stream's merged intervals: while exactly one stream is busy, the running sum
    # of the keys of the busy streams is that stream's key, so its time alone is found without a set.
    keys = list(merged)
    marks: list[tuple[int, int, int]] = []  # (time, +1 start / -1 end, stream index); ends sort first
    for index, pairs in enumerate(merged.values()):
        for a, b in pairs:
            if b > a:  # an operation of no duration is busy for no time (and its marks would cross)
                marks.append((a, 1, index))
                marks.append((b, -1, index))
    marks.sort()
    alone = [0] * len(keys)
    busy = concurrent = 0
    active = index_sum = 0
    last = 0
    for t, delta, index in marks:
        if active:
            span = t - last
            busy += span
            if active == 1:
                alone[index_sum] += span
            else:
                concurrent += span
        active += delta
        index_sum += delta * index
        last = t
    per = {}
    for index, (key, pairs) in enumerate(merged.items()):
        own = sum(b - a for a, b in pairs)
        per[key] = (own, own - alone[index])
    return busy, concurrent, per


def compute(ctx: Context) -> StreamsSection | None:
    """Every stream of the trace's GPU operations; None without any."""
    if not ctx.gpu_known:
        return None
    ops = ctx.scan.ops
    where = list(ctx.scan.streams)  # (device, stream) of each stream id
    intervals: dict[int, list[tuple[int, int]]] = {}
    kernels: dict[int, int] = {}
    copies: dict[int, int] = {}
    for kind, start, dur, sid in zip(ops.kind, ops.start, ops.dur, ops.stream_id):
        intervals.setdefault(sid, []).append((start, start + dur))
        if kind == _KERNEL:
            kernels[sid] = kernels.get(sid, 0) + 1
        else:
            copies[sid] = copies.get(sid, 0) + 1
    by_device: dict[int, dict[int, list[tuple[int, int]]]] = {}
    for sid, pairs in intervals.items():
        by_device.setdefault(where[sid][0], {})[sid] = pairs
    rows = []
    busy_total = concurrent_total = 0
    for device in sorted(by_device):
        busy, concurrent, per = stream_overlap(by_device[device])
        busy_total += busy
        concurrent_total += concurrent
        for sid in sorted(per, key=lambda s: where[s][1]):
            own, both = per[sid]
            rows.append(StreamRow(device=device, stream=where[sid][1], kernels=kernels.get(sid, 0),
                                  copies=copies.get(sid, 0), busy_ns=own, concurrent_ns=both,
                                  share=own / busy if busy else 0.0))
    return StreamsSection(streams=len(rows), busy_ns=busy_total, concurrent_ns=concurrent_total, rows=rows)


def tables(sec: StreamsSection, markdown: bool) -> list[Table]:
    columns = [Column("device", "device", Unit.INT), Column("stream", "stream", Unit.INT),
               Column("kernels", "kernels", Unit.INT), Column("copies", "copies", Unit.INT),
               Column("busy", "busy_ns", Unit.NS), Column("share", "share", Unit.SHARE),
               Column("beside another", "concurrent_ns", Unit.NS)]
    if any(r.rank is not None for r in sec.rows):
        columns.insert(0, Column("rank", "rank", Unit.INT))
    line = (f"{sec.streams:,} stream{'s' if sec.streams != 1 else ''}; the GPU busy {format_ns(sec.busy_ns)}, "
            f"of it {format_ns(sec.concurrent_ns)} with two or more streams at once")
    return [Table("streams", "GPU streams", columns, sec.rows, [line])]


def merge(mctx: MergeContext) -> StreamsSection | None:
    """Every rank's streams, each row with its rank (devices are the rank's own)."""
    rows = []
    busy = concurrent = 0
    for result in mctx.results:
        part = result.report.streams
        if part is None:
            continue
        busy += part.busy_ns
        concurrent += part.concurrent_ns
        rows.extend(dataclasses.replace(r, rank=result.rank) for r in part.rows)
    if not rows:
        return None
    return StreamsSection(streams=len(rows), busy_ns=busy, concurrent_ns=concurrent, rows=rows)


SECTION = Section("streams", tables, compute=compute, merge=merge, default=False)
