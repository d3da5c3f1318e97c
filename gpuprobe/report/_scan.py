"""The streaming pass of a report: events into compact columns and per-name aggregates.

A :class:`TraceScan` keeps, per GPU operation, launch call, sync call and range, a few integers in
:class:`array.array` columns (about 90 bytes per GPU operation with its launch), and per CPU
operator or API name a running :class:`NameStat`; nothing else of an event outlives the pass. The
columns are what the correlation join, the per-range unions and exact medians need; the column
classes of :mod:`gpuprobe.report._columns` take them from there.
"""

from __future__ import annotations

import bisect
import enum
import heapq
from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from gpuprobe._kernel_names import graph_launch_api, host_sync_api, launch_api_kind
from gpuprobe.report._events import (
    CPU_OP,
    GPU_SYNC,
    KERNEL,
    MEMCPY,
    MEMSET,
    RANGE,
    RUNTIME,
    Event,
    EventFields,
    event_fields,
)

__all__ = [
    "GpuOpKind",
    "EVENT_KIND",
    "GpuOps",
    "SparseColumn",
    "Launches",
    "Syncs",
    "Ranges",
    "GraphLaunches",
    "CpuOps",
    "NameStat",
    "LongEvent",
    "TraceScan",
]


class GpuOpKind(enum.IntEnum):
    """The kind of a GPU operation, as stored in the 8-bit :attr:`GpuOps.kind` column."""

    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2


#: The event kind (``kernel``, ``memcpy``, ``memset``) of each :class:`GpuOpKind`.
EVENT_KIND: dict[int, str] = {GpuOpKind.KERNEL: KERNEL, GpuOpKind.MEMCPY: MEMCPY, GpuOpKind.MEMSET: MEMSET}
# plain ints, not members: the scan appends one per GPU operation
_OP_KIND_OF_EVENT: dict[str, int] = {
    KERNEL: GpuOpKind.KERNEL.value,
    MEMCPY: GpuOpKind.MEMCPY.value,
    MEMSET: GpuOpKind.MEMSET.value,
}
#: Launch API kinds (of :func:`~gpuprobe._kernel_names.launch_api_kind`) that enqueue GPU work.
_LAUNCH_KINDS = frozenset({"kernel", "memcpy", "memset"})
_SYNC = "sync"
_CHUNK_EVENTS = 4096  # events of one batch of consume(): what the GPU operations of a batch wait in, at most

# Why typed arrays of the narrowest width: the tables hold one entry per GPU operation and launch
# of traces up to several GB; times, byte counts and correlation keys need 64 bits ("q"), indexes
# into the name/thread/stream tables fit 32 bits ("i"), copy directions 16 ("h"), kinds 8 ("b").


class GpuOps:
    """GPU operations (kernels, copies, sets), one typed-array column per field.

    Attributes:
        kind: :class:`GpuOpKind` values.
        name_id: Index into :attr:`TraceScan.gpu_names`.
        start: Start time, ns.
        dur: Duration, ns.
        corr: Correlation key of the launch (see :attr:`TraceScan.correlation_by_process`); -1 if none.
        nbytes: Bytes copied or set; -1 if unknown.
        direction_id: Index into :attr:`TraceScan.directions`.
        stream_id: Index into :attr:`TraceScan.streams`.
    """

    __slots__ = ("kind", "name_id", "start", "dur", "corr", "nbytes", "direction_id", "stream_id")

    def __init__(self) -> None:
        self.kind = array("b")
        self.name_id = array("i")
        self.start = array("q")
        self.dur = array("q")
        self.corr = array("q")
        self.nbytes = array("q")
        self.direction_id = array("h")
        self.stream_id = array("i")

    def __len__(self) -> int:
        return len(self.kind)


class Launches:
    """API calls that enqueue GPU work (kernel launches, copies, sets), one column per field.

    Attributes:
        start: Start time, ns.
        dur: Duration, ns.
        corr: Correlation key, as :attr:`GpuOps.corr`.
        thread_id: Index into :attr:`TraceScan.threads`.
    """

    __slots__ = ("start", "dur", "corr", "thread_id")

    def __init__(self) -> None:
        self.start = array("q")
        self.dur = array("q")
        self.corr = array("q")
        self.thread_id = array("i")

    def __len__(self) -> int:
        return len(self.start)


class Syncs:
    """API calls that block the host until the GPU catches up, one column per field.

    Attributes:
        start: Start time, ns.
        dur: Duration, ns.
        thread_id: Index into :attr:`TraceScan.threads`.
        name_id: Index into :attr:`TraceScan.api_names`.
    """

    __slots__ = ("start", "dur", "thread_id", "name_id")

    def __init__(self) -> None:
        self.start = array("q")
        self.dur = array("q")
        self.thread_id = array("i")
        self.name_id = array("i")

    def __len__(self) -> int:
        return len(self.start)


class GraphLaunches:
    """Graph launch calls (``cudaGraphLaunch``, ``cuGraphLaunch``, ``hipGraphLaunch``).

    Attributes:
        start: Start time, ns.
        thread_id: Index into :attr:`TraceScan.threads`.
        corr: Correlation key, as :attr:`GpuOps.corr` (the graph's node kernels carry it).
    """

    __slots__ = ("start", "thread_id", "corr")

    def __init__(self) -> None:
        self.start = array("q")
        self.thread_id = array("i")
        self.corr = array("q")

    def __len__(self) -> int:
        return len(self.start)


class Ranges:
    """CPU-side ranges (user annotations, NVTX), one column per field.

    Attributes:
        name_id: Index into :attr:`TraceScan.range_names`.
        start: Start time, ns.
        dur: Duration, ns.
        thread_id: Index into :attr:`TraceScan.threads`.
    """

    __slots__ = ("name_id", "start", "dur", "thread_id")

    def __init__(self) -> None:
        self.name_id = array("i")
        self.start = array("q")
        self.dur = array("q")
        self.thread_id = array("i")

    def __len__(self) -> int:
        return len(self.start)


class SparseColumn:
    """The values of some rows of a column, rows ascending: 12 bytes a value (a dict takes ~100).

    Example:
        >>> col = SparseColumn()
        >>> col.add(3, 30); col.add(7, 70)
        >>> col.get(7), col.get(4), len(col), list(col.items())
        (70, -1, 2, [(3, 30), (7, 70)])
    """

    __slots__ = ("rows", "values")

    def __init__(self) -> None:
        self.rows = array("i")
        self.values = array("q")

    def add(self, row: int, value: int) -> None:
        """Set the value of ``row``, a row after every row set so far."""
        self.rows.append(row)
        self.values.append(value)

    def get(self, row: int, default: int = -1) -> int:
        j = bisect.bisect_left(self.rows, row)
        return self.values[j] if j < len(self.rows) and self.rows[j] == row else default

    def items(self) -> Iterator[tuple[int, int]]:
        return zip(self.rows, self.values)

    def __len__(self) -> int:
        return len(self.rows)


class CpuOps:
    """CPU operators, one column per field (the few with a FLOP count in a side table).

    Attributes:
        name_id: Index of the name in :attr:`TraceScan.cpu_ops` (by first appearance).
        start: Start time, ns.
        dur: Duration, ns.
        thread_id: Index into :attr:`TraceScan.threads`.
        flops: FLOP count by row, for the operators that have one.
        elements: Input elements by row, for the concatenation operators recorded with shapes.

    Memory: the side tables hold a value for about a quarter of the operators of a decode trace;
    as dicts they took 65 MB of a 2 GB trace's report, as sparse columns 9 MB.
    """

    __slots__ = ("name_id", "start", "dur", "thread_id", "flops", "elements")

    def __init__(self) -> None:
        self.name_id = array("i")
        self.start = array("q")
        self.dur = array("q")
        self.thread_id = array("i")
        self.flops = SparseColumn()
        self.elements = SparseColumn()

    def __len__(self) -> int:
        return len(self.start)


class NameStat:
    """Count, total and longest duration of the events of one name (updated by the scan, inline).

    Example:
        >>> s = NameStat(5); (s.count, s.total_ns, s.max_ns)
        (1, 5, 5)
    """

    __slots__ = ("count", "total_ns", "max_ns", "id")

    def __init__(self, dur_ns: int, id: int = 0) -> None:
        self.count = 1
        self.total_ns = dur_ns
        self.max_ns = dur_ns
        self.id = id  # the name's index in its table, by first appearance


#: A long CPU-side event: (duration ns, arrival number, kind, name, start ns, "pid/tid"); tuples,
#: so that the heap of :attr:`TraceScan.longest_cpu` orders them by duration, then arrival.
LongEvent = tuple[int, int, str, str, int, str]


class TraceScan:
    """The streaming pass: events, in any order, into typed columns and per-name aggregates.

    Call :meth:`consume` once or more; the tables and aggregates below are then what the report
    sections are computed from (:func:`gpuprobe.report._analysis.build_report`).

    Attributes:
        correlation_by_process: Correlation ids are unique per process only (nsys): the process id
            goes into the high bits of each correlation key.
        keep_longest: How many of the longest CPU-side events to keep.
        gpu_names: Kernel and copy names, by first appearance (the value is the name id).
        range_names: Range names, by first appearance.
        threads: ``(pid, tid)`` of launch, sync, range and CPU operator events, by first appearance.
        api_names: Names of sync API calls, by first appearance.

        streams: ``(device, stream)`` of GPU operations, by first appearance.
        directions: Copy directions (``""`` for kernels and sets), by first appearance.
        ops: :class:`GpuOps`.
        launches: :class:`Launches`.
        syncs: :class:`Syncs`.
        ranges: :class:`Ranges`.
        cpu_op_rows: :class:`CpuOps`.
        graph_launches: :class:`GraphLaunches`.
        gpu_syncs: Count and total duration of GPU-side sync records (kineto ``cuda_sync``).
        api_calls: Runtime and driver API calls by name.
        cpu_ops: CPU operators by name.
        longest_cpu: A heap of the longest runtime calls and CPU operators (:data:`LongEvent`).
        event_counts: Events by kind.
        first_ns: Earliest start of any event; ``None`` before the first event.
        last_ns: Latest end of any event; ``None`` before the first event.

    Example:
        >>> scan = TraceScan()
        >>> scan.consume([Event("kernel", "k", 0, 10, 0, 7, 1), Event("runtime", "cudaLaunchKernel", -5, 2, 1, 1, 1)])
        >>> len(scan.ops), len(scan.launches), scan.first_ns, scan.last_ns
        (1, 1, -5, 10)
    """

    def __init__(self, correlation_by_process: bool = False, keep_longest: int = 20) -> None:
        self.correlation_by_process = correlation_by_process
        self.keep_longest = max(1, keep_longest)
        self.gpu_names: dict[str, int] = {}
        self.range_names: dict[str, int] = {}
        self.threads: dict[tuple[object, object], int] = {}
        self.streams: dict[tuple[int, int], int] = {}
        self.directions: dict[str, int] = {}
        self.ops = GpuOps()
        self.launches = Launches()
        self.syncs = Syncs()
        self.ranges = Ranges()
        self.api_names: dict[str, int] = {}
        self.cpu_op_rows = CpuOps()
        self.graph_launches = GraphLaunches()
        self.gpu_syncs = [0, 0]
        self.api_calls: dict[str, NameStat] = {}
        self.cpu_ops: dict[str, NameStat] = {}
        self.longest_cpu: list[LongEvent] = []
        self.event_counts: dict[str, int] = {}
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self._seq = 0  # arrivals numbered in longest_cpu so far

    def consume(self, events: Iterable[Event | EventFields]) -> None:
        """Fold events into the columns and aggregates (any order)."""
        self.consume_batches(_chunks(events, _CHUNK_EVENTS))

    def consume_batches(self, batches: Iterable[Iterable[Event | EventFields]]) -> None:
        """Fold lists of events, in any order: each an :class:`Event`, or its :data:`EventFields` (a reader's
        fast path makes those without building the Event: :meth:`gpuprobe.report._trace.Trace.feed`)."""
        range_names, threads, api_names = self.range_names, self.threads, self.api_names
        counts, api_calls, cpu_ops = self.event_counts, self.api_calls, self.cpu_ops
        longest, keep_longest, by_process = self.longest_cpu, self.keep_longest, self.correlation_by_process
        # why: bound methods in locals; the loop below runs once per event (millions of times)
        launch_start, launch_dur, launch_corr, launch_thread = _appends(self.launches)
        sync_start, sync_dur, sync_thread, sync_name = _appends(self.syncs)
        range_name, range_start, range_dur, range_thread = _appends(self.ranges)
        graph_start, graph_thread, graph_corr = _appends(self.graph_launches)
        cpu = self.cpu_op_rows
        cpu_name, cpu_start, cpu_dur, cpu_thread = _appends(cpu, 4)
        cpu_flops, cpu_elements, gpu_syncs = cpu.flops.add, cpu.elements.add, self.gpu_syncs
        apis: dict[str, tuple[bool, bool, int]] = {}  # API name -> _api_role(name)
        last_pid: object = None
        last_tid: object = None
        last_thread = -1
        first: int = self.first_ns if self.first_ns is not None else 1 << 62
        last: int = self.last_ns if self.last_ns is not None else -(1 << 62)
        seq = self._seq
        op_kinds, fields_of = _OP_KIND_OF_EVENT, event_fields
        batch_ops: list[EventFields] = []  # the GPU operations of a batch, folded after it (_fold_ops)
        gpu_ops = batch_ops.append
        for batch in batches:
            for ev in batch:
                if type(ev) is not tuple:
                    ev = fields_of(ev)  # type: ignore[arg-type]
                kind, name, start, dur, pid, tid, corr, nbytes, stream, device, direction, flops, elements = ev
                if start < first:
                    first = start
                if start + dur > last:
                    last = start + dur
                counts[kind] = counts.get(kind, 0) + 1
                if kind in op_kinds:
                    gpu_ops(ev)
                elif kind == RUNTIME or kind == CPU_OP:
                    # Runtime calls and CPU operators: count, total and longest per name, and the
                    # longest events overall. Inline, not a helper: this loop runs once per event.
                    table = api_calls if kind == RUNTIME else cpu_ops
                    stat = table.get(name)
                    if stat is None:
                        stat = table[name] = NameStat(dur, len(table))
                    else:
                        stat.count += 1
                        stat.total_ns += dur
                        if dur > stat.max_ns:
                            stat.max_ns = dur
                    # The keep_longest largest (duration, arrival): a tie goes to the later event, so that what
                    # is kept depends on the events only, not on the order of their passes (see merge()).
                    if len(longest) < keep_longest:
                        seq += 1
                        heapq.heappush(longest, (dur, seq, kind, name, start, _thread_label(pid, tid)))
                    elif dur >= longest[0][0]:  # as long as the shortest kept, or longer
                        seq += 1
                        heapq.heapreplace(longest, (dur, seq, kind, name, start, _thread_label(pid, tid)))
                    if pid != last_pid or tid != last_tid:  # why: events of a thread come in runs
                        thread = threads.get((pid, tid))
                        if thread is None:
                            thread = threads[(pid, tid)] = len(threads)
                        last_pid, last_tid, last_thread = pid, tid, thread
                    else:
                        thread = last_thread
                    if kind == CPU_OP:
                        if flops >= 0:
                            cpu_flops(len(cpu.start), flops)
                        if elements >= 0:
                            cpu_elements(len(cpu.start), elements)
                        cpu_name(stat.id)
                        cpu_start(start)
                        cpu_dur(dur)
                        cpu_thread(thread)
                        continue
                    role = apis.get(name)
                    if role is None:
                        role = apis[name] = _api_role(name, api_names)
                    enqueues, graph, sync_id = role
                    if enqueues:
                        if by_process and 0 <= corr < 0x80000000 and type(pid) is int:
                            corr |= (pid & 0x3FFFFFFF) << 32
                        launch_start(start)
                        launch_dur(dur)
                        launch_corr(corr)
                        launch_thread(thread)
                        if graph:
                            graph_start(start)
                            graph_thread(thread)
                            graph_corr(corr)
                    if sync_id >= 0:
                        sync_start(start)
                        sync_dur(dur)
                        sync_thread(thread)
                        sync_name(sync_id)
                elif kind == GPU_SYNC:
                    gpu_syncs[0] += 1
                    gpu_syncs[1] += dur
                elif kind == RANGE:
                    nid = range_names.get(name)
                    if nid is None:
                        nid = range_names[name] = len(range_names)
                    thread = threads.get((pid, tid))
                    if thread is None:
                        thread = threads[(pid, tid)] = len(threads)
                    range_name(nid)
                    range_start(start)
                    range_dur(dur)
                    range_thread(thread)
            if batch_ops:
                self._fold_ops(batch_ops)
                batch_ops.clear()
        self._seq = seq
        if counts:
            self.first_ns, self.last_ns = first, last

    def _fold_ops(self, batch: list[EventFields]) -> None:
        """Fold the GPU operations (kernels, copies, sets) of a batch of :meth:`consume_batches`.

        Why apart: the GPU operations use tables of their own only (names, directions, streams), so that
        folding them after the rest of their batch fills every table as one loop would, and keeps each loop
        short enough to read.
        """
        gpu_names, streams, directions = self.gpu_names, self.streams, self.directions
        op_kind, op_name, op_start, op_dur, op_corr, op_bytes, op_direction, op_stream = _appends(self.ops)
        op_kinds, by_process = _OP_KIND_OF_EVENT, self.correlation_by_process
        for kind, name, start, dur, pid, _, corr, nbytes, stream, device, direction, _, _ in batch:
            nid = gpu_names.get(name)
            if nid is None:
                nid = gpu_names[name] = len(gpu_names)
            if by_process and 0 <= corr < 0x80000000 and type(pid) is int:
                corr |= (pid & 0x3FFFFFFF) << 32  # the process in the high bits
            op_kind(op_kinds[kind])
            op_name(nid)
            op_start(start)
            op_dur(dur)
            op_corr(corr)
            op_bytes(nbytes)
            did = directions.get(direction)
            if did is None:
                did = directions[direction] = len(directions)
            op_direction(did)
            sid = streams.get((device, stream))
            if sid is None:
                sid = streams[(device, stream)] = len(streams)
            op_stream(sid)

    def merge(self, later: TraceScan) -> None:
        """Fold in the scan of the events that come after this scan's (the tail of a trace split in two):
        the result is what one pass over both parts in order would hold, table for table.

        Names, threads, streams and directions new in ``later`` get the next ids of this scan's tables
        (first appearance stays first), ``later``'s columns are appended with their ids renumbered,
        per-name statistics add up, and the longest events are the longest of both (``later``'s arriving
        after this scan's).

        Raises:
            ValueError: the two scans were made with different settings.

        Example:
            >>> a, b, whole = TraceScan(), TraceScan(), TraceScan()
            >>> e1, e2 = Event("kernel", "k", 0, 10, 0, 7, 1), Event("kernel", "j", 20, 5, 0, 7, 2)
            >>> a.consume([e1]); b.consume([e2]); whole.consume([e1, e2]); a.merge(b)
            >>> a.gpu_names == whole.gpu_names and list(a.ops.name_id) == list(whole.ops.name_id)
            True
        """
        if (later.correlation_by_process, later.keep_longest) != (self.correlation_by_process, self.keep_longest):
            raise ValueError("cannot merge scans made with different settings")

        def renumber(table: dict[Any, int], theirs: dict[Any, int]) -> array:
            ids = array("i", bytes(4 * len(theirs)))
            for key, their_id in theirs.items():
                own = table.get(key)
                if own is None:
                    own = table[key] = len(table)
                ids[their_id] = own
            return ids

        def append(column: array, values: array, ids: array | None = None) -> None:
            if ids is None or ids == array("i", range(len(ids))):  # the same numbering: as they are
                column.extend(values)
            else:
                column.extend(_renumbered(values, ids))

        gpu = renumber(self.gpu_names, later.gpu_names)
        threads = renumber(self.threads, later.threads)
        renumbered: list[tuple[Any, Any, dict[str, array]]] = [
            (self.ops, later.ops, {"name_id": gpu, "direction_id": renumber(self.directions, later.directions),
                                   "stream_id": renumber(self.streams, later.streams)}),
            (self.launches, later.launches, {"thread_id": threads}),
            (self.syncs, later.syncs, {"thread_id": threads, "name_id": renumber(self.api_names, later.api_names)}),
            (self.graph_launches, later.graph_launches, {"thread_id": threads}),
            (self.ranges, later.ranges, {"thread_id": threads, "name_id": renumber(self.range_names, later.range_names)}),
        ]
        for mine, theirs, ids in renumbered:
            for field in mine.__slots__:
                append(getattr(mine, field), getattr(theirs, field), ids.get(field))
        stat_ids = {}
        for table, their_table in ((self.api_calls, later.api_calls), (self.cpu_ops, later.cpu_ops)):
            for name, their in their_table.items():
                own = table.get(name)
                if own is None:
                    table[name] = own = NameStat(their.max_ns, len(table))
                    own.count, own.total_ns = their.count, their.total_ns
                else:
                    own.count += their.count
                    own.total_ns += their.total_ns
                    own.max_ns = max(own.max_ns, their.max_ns)
                if table is self.cpu_ops:
                    stat_ids[their.id] = own.id
        cpu, their_cpu = self.cpu_op_rows, later.cpu_op_rows
        offset = len(cpu)
        append(cpu.name_id, their_cpu.name_id, array("i", [stat_ids[i] for i in range(len(stat_ids))]))
        append(cpu.start, their_cpu.start)
        append(cpu.dur, their_cpu.dur)
        append(cpu.thread_id, their_cpu.thread_id, threads)
        for side in ("flops", "elements"):
            mine_side, their_side = getattr(cpu, side), getattr(their_cpu, side)
            mine_side.rows.extend(array("i", [r + offset for r in their_side.rows]))
            mine_side.values.extend(their_side.values)
        self.gpu_syncs[0] += later.gpu_syncs[0]
        self.gpu_syncs[1] += later.gpu_syncs[1]
        for kind, n in later.event_counts.items():
            self.event_counts[kind] = self.event_counts.get(kind, 0) + n
        if later.first_ns is not None:
            self.first_ns = later.first_ns if self.first_ns is None else min(self.first_ns, later.first_ns)
            self.last_ns = later.last_ns if self.last_ns is None else max(self.last_ns, later.last_ns)  # type: ignore[type-var]
        shifted = [(e[0], e[1] + self._seq, *e[2:]) for e in later.longest_cpu]
        kept = heapq.nlargest(self.keep_longest, [*self.longest_cpu, *shifted])
        heapq.heapify(kept)
        self.longest_cpu[:] = kept  # type: ignore[assignment]
        self._seq += later._seq


def _renumbered(values: array, ids: array) -> array:
    """``ids[v]`` for each of ``values``, in an array of the same type."""
    try:
        import numpy as np
    except ImportError:
        return array(values.typecode, [ids[v] for v in values])
    # why numpy where it is installed: the tail of a 2 GB trace renumbers millions of ids; 2 million took
    # 0.028 s as one gather against 0.42 s as a list comprehension (15x, measured on the 2-CPU machine)
    out = array(values.typecode)
    if len(values):
        out.frombytes(np.asarray(ids, dtype=np.int64)[np.frombuffer(values, dtype=values.typecode)]
                      .astype(values.typecode).tobytes())
    return out


def _appends(columns: Any, n: int | None = None) -> list[Callable[[Any], None]]:
    """The ``append`` of each column of ``columns`` (one of the column classes above), in slot order; the
    first ``n`` only, if given."""
    return [getattr(columns, field).append for field in columns.__slots__[:n]]


def _api_role(name: str, sync_names: dict[str, int]) -> tuple[bool, bool, int]:
    """What a runtime or driver API call of this name is to the scan: whether it enqueues GPU work, whether
    it replays a graph, and its name's id in ``sync_names`` (given one on first sight) when it blocks the
    host until the GPU catches up, else -1. A synchronous copy (``cudaMemcpy``) enqueues and blocks."""
    kind = launch_api_kind(name)
    sync_id = -1
    if kind == _SYNC or (kind == "memcpy" and host_sync_api(name)):
        found = sync_names.get(name)
        sync_id = found if found is not None else sync_names.setdefault(name, len(sync_names))
    return kind in _LAUNCH_KINDS, kind == "kernel" and graph_launch_api(name), sync_id


def _chunks(events: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``events`` in lists of ``size`` (the last one shorter)."""
    it = iter(events)
    while chunk := list(islice(it, size)):
        yield chunk


def _thread_label(pid: object, tid: object) -> str:
    return f"{pid}/{tid}"
