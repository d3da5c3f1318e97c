"""Column arithmetic behind the report, twice: numpy (fast path) and plain Python (its twin).

Both classes take the tables a :class:`~gpuprobe.report._scan.TraceScan` filled and answer the
same questions (joins, group-bys, windows, unions) with plain Python values, so the report code
above them is shared. The Python twin serves small traces (it needs no numpy, whose import alone
costs 16 MB of RSS) and is the reference the numpy path is tested against.

Three tables are kept in (thread, start) order, each behind a :class:`ByThread` index, so that the
rows of one thread inside a time window are a contiguous run of positions (a window):

- GPU operations linked to a launch call, by their launch's thread and start;
- launch calls;
- sync calls.

Running sums over those orders (``cum_*``) turn the total of a window into two lookups.
"""

from __future__ import annotations

import bisect
import itertools
import math
from array import array
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Protocol

from gpuprobe.report._scan import CpuOps, GpuOpKind, TraceScan

__all__ = [
    "ByThread",
    "DelayStats",
    "JoinCounts",
    "KernelGroup",
    "MemoryGroup",
    "NumpyColumns",
    "OpRow",
    "OpRows",
    "PythonColumns",
    "Spread",
    "Windows",
    "quantile",
    "spread_of",
    "union_of",
    "merge_intervals",
    "overlap_length",
]

#: Runs ``[lo, hi)`` of positions in one :class:`ByThread` order.
Windows = list[tuple[int, int]]

_KERNEL = GpuOpKind.KERNEL.value
_MEMCPY = GpuOpKind.MEMCPY.value
_MEMSET = GpuOpKind.MEMSET.value


# The results below are small classes with __slots__ rather than dataclasses. Why: a frozen, slotted
# dataclass costs 0.9 ms to define at import (a class with __slots__ under 0.01 ms), and this module is
# imported by every `gpuprobe report` run. Their constructors take keywords only.


class KernelGroup:
    """The kernels of one name."""

    __slots__ = ("name_id", "count", "total_ns", "median_ns", "min_ns", "max_ns")

    def __init__(self, *, name_id: int, count: int, total_ns: int, median_ns: int, min_ns: int, max_ns: int) -> None:
        self.name_id = name_id
        self.count = count
        self.total_ns = total_ns
        self.median_ns = median_ns
        self.min_ns = min_ns
        self.max_ns = max_ns


class Spread:
    """p10, median and p90 of some values (linear interpolation, rounded to whole numbers)."""

    __slots__ = ("p10", "median", "p90")

    def __init__(self, *, p10: int, median: int, p90: int) -> None:
        self.p10 = p10
        self.median = median
        self.p90 = p90


class DelayStats:
    """Launch-to-start delays of the GPU operations linked to a launch call; ``None`` when there are none."""

    __slots__ = ("count", "mean_ns", "median_ns", "p90_ns", "max_ns")

    def __init__(
        self, *, count: int, mean_ns: int | None, median_ns: int | None, p90_ns: int | None, max_ns: int | None
    ) -> None:
        self.count = count
        self.mean_ns = mean_ns
        self.median_ns = median_ns
        self.p90_ns = p90_ns
        self.max_ns = max_ns


class JoinCounts:
    """How well launch calls and GPU operations matched through their correlation keys."""

    __slots__ = ("ops_without_launch", "launches_with_op")

    def __init__(self, *, ops_without_launch: int, launches_with_op: int) -> None:
        self.ops_without_launch = ops_without_launch
        self.launches_with_op = launches_with_op


class MemoryGroup:
    """Copies or sets of one direction; ``kind`` is a :class:`~gpuprobe.report._scan.GpuOpKind`."""

    __slots__ = ("kind", "direction_id", "count", "nbytes", "total_ns")

    def __init__(self, *, kind: int, direction_id: int, count: int, nbytes: int, total_ns: int) -> None:
        self.kind = kind
        self.direction_id = direction_id
        self.count = count
        self.nbytes = nbytes
        self.total_ns = total_ns


class OpRow:
    """One GPU operation; ``kind`` is a :class:`~gpuprobe.report._scan.GpuOpKind`."""

    __slots__ = ("kind", "name_id", "start", "dur", "stream_id")

    def __init__(self, *, kind: int, name_id: int, start: int, dur: int, stream_id: int) -> None:
        self.kind = kind
        self.name_id = name_id
        self.start = start
        self.dur = dur
        self.stream_id = stream_id


class OpRows:
    """GPU operations of some windows, as plain lists (``launch_end``: when their launch call returned;
    ``launch``: the position of that call in :attr:`TraceScan.launches`)."""

    __slots__ = ("start", "end", "launch_end", "name_id", "kind", "category", "stream_id", "launch")

    def __init__(
        self,
        *,
        start: list[int],
        end: list[int],
        launch_end: list[int],
        name_id: list[int],
        kind: list[int],
        category: list[int],
        stream_id: list[int],
        launch: list[int],
    ) -> None:
        self.start = start
        self.end = end
        self.launch_end = launch_end
        self.name_id = name_id
        self.kind = kind
        self.category = category
        self.stream_id = stream_id
        self.launch = launch


class ByThread(Protocol):
    """Rows of one table in (thread, start) order: the rows of a thread, and of a time window."""

    def threads(self) -> list[int]:
        """The distinct threads, in order."""

    def bounds(self, thread: int) -> tuple[int, int]:
        """Positions ``[lo, hi)`` of the rows of ``thread``."""

    def window(self, bounds: tuple[int, int], start: int, end: int) -> tuple[int, int]:
        """Positions, within ``bounds``, of the rows whose start lies in ``[start, end)``."""


def quantile(sorted_values: Sequence[Any], q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default method).

    Example:
        >>> quantile([1, 2, 3, 4], 0.5), quantile([10, 20], 0.9)
        (2.5, 19.0)
    """
    n = len(sorted_values)
    pos = (n - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    a = int(sorted_values[lo])
    b = int(sorted_values[hi])
    return a + (b - a) * (pos - lo)


def spread_of(sorted_values: Sequence[Any]) -> Spread:
    """p10, median and p90 of sorted values, rounded to whole numbers.

    Example:
        >>> s = spread_of([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]); (s.p10, s.median, s.p90)
        (10, 50, 90)
    """
    p10, median, p90 = (int(round(quantile(sorted_values, q))) for q in (0.1, 0.5, 0.9))
    return Spread(p10=p10, median=median, p90=p90)


def union_of(pairs: list[tuple[int, int]]) -> int:
    """Length of the union of ``(start, end)`` intervals.

    Example:
        >>> union_of([(0, 10), (5, 12), (20, 25)])
        17
    """
    total = 0
    cover = None
    for start, end in sorted(pairs):
        if cover is None or start >= cover:
            total += end - start
            cover = end
        elif end > cover:
            total += end - cover
            cover = end
    return total


def merge_intervals(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of ``(start, end)`` intervals, as sorted disjoint intervals.

    Example:
        >>> merge_intervals([(5, 12), (0, 10), (20, 25)])
        [(0, 12), (20, 25)]
    """
    merged: list[tuple[int, int]] = []
    for a, b in sorted(pairs):
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def overlap_length(x: Sequence[tuple[int, int]], y: Sequence[tuple[int, int]]) -> int:
    """Length of ``x`` ∩ ``y``, both sorted and disjoint (one merge pass).

    Example:
        >>> overlap_length([(0, 10), (20, 30)], [(5, 25)])
        10
    """
    if len(y) < 8 < len(x):
        # why: a step's few sync calls against its hundreds of gaps: bisect to each call's gaps
        # instead of walking them all (0.13 s -> 0.02 s over 400 steps of the synthetic trace)
        total = 0
        ends = [b for _, b in x]
        for c, d in y:
            i = bisect.bisect_right(ends, c)
            while i < len(x) and x[i][0] < d:
                total += max(0, min(d, x[i][1]) - max(c, x[i][0]))
                i += 1
        return total
    total = 0
    i = j = 0
    while i < len(x) and j < len(y):
        a = max(x[i][0], y[j][0])
        b = min(x[i][1], y[j][1])
        if b > a:
            total += b - a
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _delay_stats(sorted_delays: Any, total: int) -> DelayStats:
    n = len(sorted_delays)
    if not n:
        return DelayStats(count=0, mean_ns=None, median_ns=None, p90_ns=None, max_ns=None)
    return DelayStats(
        count=n,
        mean_ns=total // n,
        median_ns=int(round(quantile(sorted_delays, 0.5))),
        p90_ns=int(round(quantile(sorted_delays, 0.9))),
        max_ns=int(sorted_delays[-1]),
    )


class _ListByThread:
    """A :class:`ByThread` over lists, searched with :mod:`bisect`."""

    __slots__ = ("thread", "start")

    def __init__(self, thread: list[int], start: list[int]) -> None:
        self.thread = thread
        self.start = start

    def threads(self) -> list[int]:
        return sorted(set(self.thread))

    def bounds(self, thread: int) -> tuple[int, int]:
        return bisect.bisect_left(self.thread, thread), bisect.bisect_right(self.thread, thread)

    def window(self, bounds: tuple[int, int], start: int, end: int) -> tuple[int, int]:
        lo, hi = bounds
        return bisect.bisect_left(self.start, start, lo, hi), bisect.bisect_left(self.start, end, lo, hi)


class _ArrayByThread:
    """A :class:`ByThread` over numpy arrays, searched with ``searchsorted``."""

    __slots__ = ("np", "thread", "start")

    def __init__(self, np: Any, thread: Any, start: Any) -> None:
        self.np = np
        self.thread = thread
        self.start = start

    def threads(self) -> list[int]:
        return self.np.unique(self.thread).tolist()

    def bounds(self, thread: int) -> tuple[int, int]:
        np = self.np
        return int(np.searchsorted(self.thread, thread, "left")), int(np.searchsorted(self.thread, thread, "right"))

    def window(self, bounds: tuple[int, int], start: int, end: int) -> tuple[int, int]:
        lo, hi = bounds
        if lo == hi:
            return lo, lo
        col = self.start[lo:hi]
        np = self.np
        return lo + int(np.searchsorted(col, start, "left")), lo + int(np.searchsorted(col, end, "left"))


def _in_thread_order(np: Any, thread: Any, start: Any) -> bool:
    """Whether rows are sorted by (thread, start) already (ties in row order, as a stable sort keeps them)."""
    if len(thread) < 2:
        return True
    same = thread[1:] == thread[:-1]
    return bool(np.all((thread[1:] > thread[:-1]) | (same & (start[1:] >= start[:-1]))))


class PythonColumns:
    """The report's column arithmetic with lists, ``sorted`` and ``bisect``.

    Args:
        scan: The finished pass.
        cat_of_name: Category index of each kernel name id.
        memcpy_cat: Category index of copies.
        memset_cat: Category index of sets.
    """

    def __init__(self, scan: TraceScan, cat_of_name: list[int], memcpy_cat: int, memset_cat: int) -> None:
        ops, launches, syncs, ranges = scan.ops, scan.launches, scan.syncs, scan.ranges
        self.op_kind = list(ops.kind)
        self.op_name_id = list(ops.name_id)
        self.op_start = list(ops.start)
        self.op_dur = list(ops.dur)
        self.op_end = [s + d for s, d in zip(self.op_start, self.op_dur)]
        self.op_nbytes = list(ops.nbytes)
        self.op_direction_id = list(ops.direction_id)
        self.op_stream_id = list(ops.stream_id)
        cat_of_kind = {_MEMCPY: memcpy_cat, _MEMSET: memset_cat}
        self.op_category = [
            cat_of_name[n] if k == _KERNEL else cat_of_kind[k] for k, n in zip(self.op_kind, self.op_name_id)
        ]
        self.launch_start = list(launches.start)
        self.launch_dur = list(launches.dur)
        self.launch_thread = list(launches.thread_id)
        self.n_ops = len(self.op_kind)
        self.n_launches = len(self.launch_start)
        self.n_syncs = len(syncs)
        # join: the first launch of each correlation key
        first: dict[int, int] = {}
        for i, key in enumerate(launches.corr):
            if key >= 0:
                first.setdefault(key, i)
        #: Per GPU operation, the position of its launch call; -1 if none.
        self.op_launch = [first.get(key, -1) if key >= 0 else -1 for key in ops.corr]
        op_launch, launch_thread, launch_start = self.op_launch, self.launch_thread, self.launch_start
        linked = sorted(
            (i for i in range(self.n_ops) if op_launch[i] >= 0),
            key=lambda i: (launch_thread[op_launch[i]], launch_start[op_launch[i]]),
        )
        #: The GPU operations with a launch call, in their launch's (thread, start) order.
        self.linked_ops = linked
        self.ops_by_launch = _ListByThread(
            [launch_thread[op_launch[i]] for i in linked], [launch_start[op_launch[i]] for i in linked]
        )
        kind = self.op_kind
        self.cum_kernel_ns = [0, *itertools.accumulate(self.op_dur[i] if kind[i] == _KERNEL else 0 for i in linked)]
        self.cum_kernels = [0, *itertools.accumulate(1 if kind[i] == _KERNEL else 0 for i in linked)]
        self.cum_memcpy_bytes = [
            0,
            *itertools.accumulate(max(self.op_nbytes[i], 0) if kind[i] == _MEMCPY else 0 for i in linked),
        ]
        lorder = sorted(range(self.n_launches), key=lambda i: (launch_thread[i], launch_start[i]))
        self.launches_by_thread = _ListByThread([launch_thread[i] for i in lorder], [launch_start[i] for i in lorder])
        self.cum_launch_ns = [0, *itertools.accumulate(self.launch_dur[i] for i in lorder)]
        s_start, s_dur, s_thread = list(syncs.start), list(syncs.dur), list(syncs.thread_id)
        sorder = sorted(range(len(s_start)), key=lambda i: (s_thread[i], s_start[i]))
        self.syncs_by_thread = _ListByThread([s_thread[i] for i in sorder], [s_start[i] for i in sorder])
        self.cum_sync_ns = [0, *itertools.accumulate(s_dur[i] for i in sorder)]
        self.range_name_id = list(ranges.name_id)
        self.range_start = list(ranges.start)
        self.range_dur = list(ranges.dur)
        self.range_thread = list(ranges.thread_id)

    # ------------------------------------------------------------------ totals

    def kernel_count(self) -> int:
        return sum(1 for k in self.op_kind if k == _KERNEL)

    def kernel_total(self) -> int:
        return sum(d for k, d in zip(self.op_kind, self.op_dur) if k == _KERNEL)

    def launch_api_total(self) -> int:
        return sum(self.launch_dur)

    def sync_total(self) -> int:
        return self.cum_sync_ns[-1]

    def union_all(self) -> int:
        return union_of(list(zip(self.op_start, self.op_end)))

    def kernel_groups(self) -> list[KernelGroup]:
        """One group per kernel name, by name id."""
        by_name: dict[int, list[int]] = {}
        for k, n, d in zip(self.op_kind, self.op_name_id, self.op_dur):
            if k == _KERNEL:
                by_name.setdefault(n, []).append(d)
        out = []
        for name in sorted(by_name):
            durs = sorted(by_name[name])
            count = len(durs)
            out.append(
                KernelGroup(
                    name_id=name,
                    count=count,
                    total_ns=sum(durs),
                    median_ns=(durs[(count - 1) // 2] + durs[count // 2]) // 2,
                    min_ns=durs[0],
                    max_ns=durs[-1],
                )
            )
        return out

    def category_stats(self, n_cat: int) -> tuple[list[int], list[int]]:
        """(count, total ns) per category index."""
        counts = [0] * n_cat
        totals = [0] * n_cat
        for cat, d in zip(self.op_category, self.op_dur):
            counts[cat] += 1
            totals[cat] += d
        return counts, totals

    def join_counts(self) -> JoinCounts:
        return JoinCounts(
            ops_without_launch=sum(1 for x in self.op_launch if x < 0),
            launches_with_op=len({x for x in self.op_launch if x >= 0}),
        )

    def delay_stats(self) -> DelayStats:
        delays = sorted(self.op_start[i] - self.launch_start[self.op_launch[i]] for i in self.linked_ops)
        return _delay_stats(delays, sum(delays))

    def memory_groups(self) -> list[MemoryGroup]:
        """Copies and sets by (kind, direction id)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for k, d, b, dur in zip(self.op_kind, self.op_direction_id, self.op_nbytes, self.op_dur):
            if k != _KERNEL:
                count_bytes_ns = groups.setdefault((k, d), [0, 0, 0])
                count_bytes_ns[0] += 1
                count_bytes_ns[1] += max(b, 0)
                count_bytes_ns[2] += dur
        return [
            MemoryGroup(kind=k, direction_id=d, count=count, nbytes=nbytes, total_ns=total)
            for (k, d), (count, nbytes, total) in sorted(groups.items())
        ]

    def longest_ops(self, n: int) -> list[OpRow]:
        """The ``n`` longest GPU operations, the earliest recorded first among equals."""
        idx = sorted(range(self.n_ops), key=lambda i: (-self.op_dur[i], i))[:n]
        return [
            OpRow(
                kind=self.op_kind[i],
                name_id=self.op_name_id[i],
                start=self.op_start[i],
                dur=self.op_dur[i],
                stream_id=self.op_stream_id[i],
            )
            for i in idx
        ]

    # ---------------------------------------------------------------- windows

    def window_total(self, cum: list[int], wins: Windows) -> int:
        """Sum over windows of the values behind the running sum ``cum``."""
        return sum(cum[hi] - cum[lo] for lo, hi in wins)

    def _ops(self, wins: Windows) -> list[int]:
        return [self.linked_ops[j] for lo, hi in wins for j in range(lo, hi)]

    def busy_span(self, wins: Windows) -> tuple[int, int]:
        """Union of the intervals, and first start to last end, of the GPU operations in the windows."""
        ops = self._ops(wins)
        if not ops:
            return 0, 0
        pairs = [(self.op_start[i], self.op_end[i]) for i in ops]
        return union_of(pairs), max(e for _, e in pairs) - min(s for s, _ in pairs)

    def categories(self, wins: Windows, n_cat: int) -> list[int]:
        """GPU ns per category index of the GPU operations in the windows (of :attr:`ops_by_launch`)."""
        out = [0] * n_cat
        for i in self._ops(wins):
            out[self.op_category[i]] += self.op_dur[i]
        return out

    def family_spreads(self, step_wins: list[Windows], fam_of_name: list[int], n_fam: int) -> dict[int, Spread]:
        """Per family: the spread over steps of its GPU time in the step."""
        per_step: list[dict[int, int]] = []
        seen: set[int] = set()
        for wins in step_wins:
            sums: dict[int, int] = {}
            for i in self._ops(wins):
                f = fam_of_name[self.op_name_id[i]]
                sums[f] = sums.get(f, 0) + self.op_dur[i]
            per_step.append(sums)
            seen.update(f for f, v in sums.items() if v)
        return {f: spread_of(sorted(s.get(f, 0) for s in per_step)) for f in seen}

    def kernel_ns_between(self, thread: int, starts: list[int], ends: list[int]) -> list[int]:
        """Per ``[start, end]``: kernel ns of the GPU operations launched from ``thread`` in it."""
        lo_b, hi_b = self.ops_by_launch.bounds(thread)
        col, cum = self.ops_by_launch.start, self.cum_kernel_ns
        return [
            cum[bisect.bisect_right(col, e, lo_b, hi_b)] - cum[bisect.bisect_left(col, s, lo_b, hi_b)]
            for s, e in zip(starts, ends)
        ]

    def rows_named(self, name_ids: Sequence[int], wanted: Collection[int]) -> Iterable[int]:
        """The positions of ``name_ids`` holding one of the ``wanted`` name ids, in order."""
        return [i for i, nid in enumerate(name_ids) if nid in wanted]

    def flops_by_operator(self, cpu: CpuOps, gpu_known: bool) -> dict[int, tuple[int, int, int]]:
        """Per CPU operator name id with FLOP counts: (operators, FLOPs, time ns); the time is the
        kernel time each operator launched from its thread while it ran (``gpu_known``), else its
        own duration."""
        time_ns: dict[int, int] = {}
        if gpu_known:
            by_thread: dict[int, list[int]] = {}
            for i in cpu.flops.rows:
                by_thread.setdefault(cpu.thread_id[i], []).append(i)
            for thread, members in by_thread.items():
                ends = [cpu.start[i] + cpu.dur[i] for i in members]
                time_ns.update(zip(members, self.kernel_ns_between(thread, [cpu.start[i] for i in members], ends)))
        else:
            time_ns = {i: cpu.dur[i] for i in cpu.flops.rows}
        by_op: dict[int, list[int]] = {}
        for i, flops in cpu.flops.items():
            acc = by_op.get(cpu.name_id[i])
            if acc is None:
                acc = by_op[cpu.name_id[i]] = [0, 0, 0]
            acc[0] += 1
            acc[1] += flops
            acc[2] += time_ns[i]
        return {nid: (count, flops, ns) for nid, (count, flops, ns) in by_op.items()}

    def window_ops(self, wins: Windows) -> OpRows:
        """The GPU operations in the windows (of :attr:`ops_by_launch`), as lists."""
        ops = self._ops(wins)
        launch = [self.op_launch[i] for i in ops]
        return OpRows(
            start=[self.op_start[i] for i in ops],
            end=[self.op_end[i] for i in ops],
            launch_end=[self.launch_start[j] + self.launch_dur[j] for j in launch],
            name_id=[self.op_name_id[i] for i in ops],
            kind=[self.op_kind[i] for i in ops],
            category=[self.op_category[i] for i in ops],
            stream_id=[self.op_stream_id[i] for i in ops],
            launch=launch,
        )

    def range_order(self) -> list[int]:
        """Range positions by (thread, start, longest first)."""
        return sorted(
            range(len(self.range_start)), key=lambda i: (self.range_thread[i], self.range_start[i], -self.range_dur[i])
        )


_FLOPS_ROWS = 1 << 18  # operators with a FLOP count crunched at a time: 12 MB of temporaries at most


class NumpyColumns:
    """The same arithmetic vectorised with numpy (8 bytes per value, no Python object per value)."""

    _MAX_FAMILY_CELLS = 20_000_000  # steps x families kept for per-step spreads (8 bytes each)

    def __init__(self, scan: TraceScan, cat_of_name: list[int], memcpy_cat: int, memset_cat: int) -> None:
        import numpy as np

        self.np = np
        i64 = np.int64
        ops, launches, syncs, ranges = scan.ops, scan.launches, scan.syncs, scan.ranges

        def col(arr: Any) -> Any:
            # Zero-copy view of the scan's typed array (its width: see gpuprobe.report._scan).
            return np.frombuffer(arr, dtype=np.dtype(arr.typecode)) if len(arr) else np.zeros(0, dtype=arr.typecode)

        # Memory: these columns live for the whole report, one entry per GPU operation or launch of
        # traces up to several GB, so only what the sections read is kept, in its narrowest type;
        # per-window values are gathered through linked_ops when asked for.
        self.op_kind = col(ops.kind)
        self.op_name_id = col(ops.name_id)
        self.op_start = col(ops.start)
        self.op_dur = col(ops.dur)
        self.op_nbytes = col(ops.nbytes)
        self.op_direction_id = col(ops.direction_id)
        self.op_stream_id = col(ops.stream_id)
        cats = np.array(cat_of_name or [0], dtype=np.int8)
        self.op_category = cats[self.op_name_id] if len(self.op_name_id) else np.zeros(0, dtype=np.int8)
        self.op_category[self.op_kind == _MEMCPY] = memcpy_cat
        self.op_category[self.op_kind == _MEMSET] = memset_cat
        self.is_kernel = self.op_kind == _KERNEL
        self.launch_start = col(launches.start)
        self.launch_dur = col(launches.dur)
        self.launch_thread = col(launches.thread_id)
        self.n_ops = len(self.op_kind)
        self.n_launches = len(self.launch_start)
        # join: sort launches by correlation key; a stable sort keeps the first of equal keys first
        # why int32 positions (op_launch, linked_ops, cum_kernels): 12 bytes less per GPU operation,
        # 18 MB of a 2 GB trace's report; a trace holds fewer than 2**31 operations
        op_launch = np.full(self.n_ops, -1, dtype=np.int32)
        if self.n_launches and self.n_ops:
            launch_corr = col(launches.corr)
            op_corr = col(ops.corr)
            order = np.argsort(launch_corr, kind="stable")
            pos = np.searchsorted(launch_corr[order], op_corr)
            np.minimum(pos, self.n_launches - 1, out=pos)
            pos = order[pos]  # the first launch with the nearest key at or above each operation's
            hit = (op_corr >= 0) & (launch_corr[pos] == op_corr)
            op_launch[hit] = pos[hit]
            del order, pos, hit, launch_corr, op_corr
        #: Per GPU operation, the position of its launch call; -1 if none.
        self.op_launch = op_launch
        linked = np.flatnonzero(op_launch >= 0)
        linked_thread = self.launch_thread[op_launch[linked]]
        linked_start = self.launch_start[op_launch[linked]]
        order = np.lexsort((linked, linked_start, linked_thread))
        #: The GPU operations with a launch call, in their launch's (thread, start) order.
        self.linked_ops = linked[order].astype(np.int32)
        self.ops_by_launch = _ArrayByThread(np, linked_thread[order], linked_start[order])
        del linked, linked_thread, linked_start, order
        idx = self.linked_ops

        def cum(values: Any, dtype: Any = i64) -> Any:
            out = np.zeros(len(values) + 1, dtype=dtype)
            np.cumsum(values, dtype=dtype, out=out[1:])
            return out

        kernel = self.is_kernel[idx]
        self.cum_kernel_ns = cum(np.where(kernel, self.op_dur[idx], 0))
        self.cum_kernels = cum(kernel, np.int32)
        self.cum_memcpy_bytes = cum(np.where(self.op_kind[idx] == _MEMCPY, np.maximum(self.op_nbytes[idx], 0), 0))
        del kernel
        if _in_thread_order(np, self.launch_thread, self.launch_start):
            # why: launches mostly come in (thread, start) order already; views spare 12 bytes a launch
            self.launches_by_thread = _ArrayByThread(np, self.launch_thread, self.launch_start)
            self.cum_launch_ns = cum(self.launch_dur)
        else:
            lo = np.lexsort((np.arange(self.n_launches), self.launch_start, self.launch_thread))
            self.launches_by_thread = _ArrayByThread(np, self.launch_thread[lo], self.launch_start[lo])
            self.cum_launch_ns = cum(self.launch_dur[lo])
            del lo
        s_start, s_thread = col(syncs.start), col(syncs.thread_id)
        so = np.lexsort((np.arange(len(s_start)), s_start, s_thread))
        self.syncs_by_thread = _ArrayByThread(np, s_thread[so], s_start[so])
        self.cum_sync_ns = cum(col(syncs.dur)[so])
        self.n_syncs = len(s_start)
        self.range_name_id = list(ranges.name_id)
        self.range_start = list(ranges.start)
        self.range_dur = list(ranges.dur)
        self.range_thread = list(ranges.thread_id)

    # ------------------------------------------------------------------ totals

    def kernel_count(self) -> int:
        return int(self.is_kernel.sum())

    def kernel_total(self) -> int:
        return int(self.op_dur[self.is_kernel].sum())

    def launch_api_total(self) -> int:
        return int(self.launch_dur.sum())

    def sync_total(self) -> int:
        return int(self.cum_sync_ns[-1])

    def _union(self, starts: Any, ends: Any) -> int:
        np = self.np
        if not len(starts):
            return 0
        order = np.argsort(starts, kind="stable")
        cover = ends[order]
        np.maximum.accumulate(cover, out=cover)
        s = starts[order]
        del order
        # Interval i adds what its running end passes beyond both its start and the cover so far
        # (the running end of i - 1). In place: on a whole trace these are its largest temporaries.
        np.maximum(s[1:], cover[:-1], out=s[1:])
        np.subtract(cover, s, out=cover)
        np.maximum(cover, 0, out=cover)
        return int(cover.sum())

    def union_all(self) -> int:
        return self._union(self.op_start, self.op_start + self.op_dur)

    def kernel_groups(self) -> list[KernelGroup]:
        np = self.np
        names = self.op_name_id[self.is_kernel]
        durs = self.op_dur[self.is_kernel]
        if not len(names):
            return []
        order = np.lexsort((durs, names))
        names = names[order]
        durs = durs[order]
        starts = np.flatnonzero(np.concatenate(([True], names[1:] != names[:-1])))
        counts = np.diff(np.concatenate((starts, [len(names)])))
        totals = np.add.reduceat(durs, starts)
        median = (durs[starts + (counts - 1) // 2] + durs[starts + counts // 2]) // 2
        return [
            KernelGroup(name_id=n, count=c, total_ns=t, median_ns=m, min_ns=low, max_ns=high)
            for n, c, t, m, low, high in zip(
                names[starts].tolist(),
                counts.tolist(),
                totals.tolist(),
                median.tolist(),
                durs[starts].tolist(),
                durs[starts + counts - 1].tolist(),
            )
        ]

    def category_stats(self, n_cat: int) -> tuple[list[int], list[int]]:
        np = self.np
        counts = np.bincount(self.op_category, minlength=n_cat)
        totals = np.zeros(n_cat, dtype=np.int64)
        np.add.at(totals, self.op_category, self.op_dur)  # exact int64 sums (bincount weights are float64)
        return counts.tolist(), totals.tolist()

    def join_counts(self) -> JoinCounts:
        # why a mask, not np.unique: 0.5 s less per call on a 1 GB trace (a hash of 750k positions)
        has_op = self.np.zeros(self.n_launches, dtype=bool)
        has_op[self.op_launch[self.linked_ops]] = True
        return JoinCounts(
            ops_without_launch=self.n_ops - len(self.linked_ops), launches_with_op=int(self.np.count_nonzero(has_op))
        )

    def delay_stats(self) -> DelayStats:
        delays = self.np.sort(self.op_start[self.linked_ops] - self.launch_start[self.op_launch[self.linked_ops]])
        return _delay_stats(delays, int(delays.sum()))

    def memory_groups(self) -> list[MemoryGroup]:
        np = self.np
        out = []
        for k in (_MEMCPY, _MEMSET):
            sel = self.op_kind == k
            if not sel.any():
                continue
            dirs = self.op_direction_id[sel]
            nbytes = np.maximum(self.op_nbytes[sel], 0)
            durs = self.op_dur[sel]
            for d in np.unique(dirs).tolist():
                pick = dirs == d
                out.append(
                    MemoryGroup(
                        kind=k,
                        direction_id=d,
                        count=int(pick.sum()),
                        nbytes=int(nbytes[pick].sum()),
                        total_ns=int(durs[pick].sum()),
                    )
                )
        return out

    def longest_ops(self, n: int) -> list[OpRow]:
        np = self.np
        if not self.n_ops:
            return []
        idx = np.lexsort((np.arange(self.n_ops), -self.op_dur))[:n]
        return [
            OpRow(kind=k, name_id=name, start=start, dur=dur, stream_id=stream)
            for k, name, start, dur, stream in zip(
                self.op_kind[idx].tolist(),
                self.op_name_id[idx].tolist(),
                self.op_start[idx].tolist(),
                self.op_dur[idx].tolist(),
                self.op_stream_id[idx].tolist(),
            )
        ]

    # ---------------------------------------------------------------- windows

    def window_total(self, cum: Any, wins: Windows) -> int:
        return sum(int(cum[hi] - cum[lo]) for lo, hi in wins)

    def _sel(self, wins: Windows) -> Any:
        if len(wins) == 1:
            return slice(*wins[0])
        return self.np.concatenate([self.np.arange(lo, hi) for lo, hi in wins])

    def busy_span(self, wins: Windows) -> tuple[int, int]:
        if not wins:
            return 0, 0
        idx = self.linked_ops[self._sel(wins)]
        starts = self.op_start[idx]
        ends = starts + self.op_dur[idx]
        return self._union(starts, ends), int(ends.max() - starts.min())

    def categories(self, wins: Windows, n_cat: int) -> list[int]:
        if not wins:
            return [0] * n_cat
        idx = self.linked_ops[self._sel(wins)]
        out = self.np.zeros(n_cat, dtype=self.np.int64)
        self.np.add.at(out, self.op_category[idx], self.op_dur[idx])
        return out.tolist()

    def family_spreads(self, step_wins: list[Windows], fam_of_name: list[int], n_fam: int) -> dict[int, Spread]:
        np = self.np
        if not step_wins or not n_fam:
            return {}
        fam_of = np.array(fam_of_name, dtype=np.int64)
        keep = np.arange(n_fam)
        if len(step_wins) * n_fam > self._MAX_FAMILY_CELLS:
            # why: bound the steps x families matrix; the biggest families are the ones a diff shows
            idx = self.linked_ops
            totals = np.bincount(fam_of[self.op_name_id[idx]], weights=self.op_dur[idx], minlength=n_fam)
            keep = np.argsort(-totals, kind="stable")[: max(1, self._MAX_FAMILY_CELLS // len(step_wins))]
        column = np.full(n_fam, len(keep), dtype=np.int64)
        column[keep] = np.arange(len(keep))
        matrix = np.zeros((len(step_wins), len(keep) + 1), dtype=np.int64)
        for row, wins in enumerate(step_wins):
            if wins:
                idx = self.linked_ops[self._sel(wins)]
                np.add.at(matrix[row], column[fam_of[self.op_name_id[idx]]], self.op_dur[idx])
        present = matrix[:, :-1].any(axis=0)
        return {int(keep[j]): spread_of(np.sort(matrix[:, j])) for j in np.flatnonzero(present).tolist()}

    def kernel_ns_between(self, thread: int, starts: list[int], ends: list[int]) -> list[int]:
        np = self.np
        return self._kernel_ns_between(thread, np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)).tolist()

    def _kernel_ns_between(self, thread: int, starts: Any, ends: Any) -> Any:
        np = self.np
        lo_b, hi_b = self.ops_by_launch.bounds(thread)
        col = self.ops_by_launch.start[lo_b:hi_b]
        lo = lo_b + np.searchsorted(col, starts, "left")
        hi = lo_b + np.searchsorted(col, ends, "right")
        return self.cum_kernel_ns[hi] - self.cum_kernel_ns[lo]

    def rows_named(self, name_ids: Sequence[int], wanted: Collection[int]) -> Iterable[int]:
        # why: one vectorised pass instead of a Python loop over every CPU operator (0.4 s per GB)
        np = self.np
        if not len(name_ids) or not wanted:
            return []
        ids = np.frombuffer(name_ids, dtype=np.int32) if isinstance(name_ids, array) else np.asarray(name_ids)
        return np.flatnonzero(np.isin(ids, np.fromiter(wanted, dtype=np.int64))).tolist()

    def flops_by_operator(self, cpu: CpuOps, gpu_known: bool) -> dict[int, tuple[int, int, int]]:
        # Memory: vectorised over the operators with a FLOP count (a quarter of them in a decode
        # trace), _FLOPS_ROWS at a time, no Python value per operator; the Python twin's lists and
        # dicts took 125 MB of a 2 GB trace's report.
        np = self.np
        i32, i64 = np.int32, np.int64
        all_rows = np.frombuffer(cpu.flops.rows, dtype=i32)
        all_flops = np.frombuffer(cpu.flops.values, dtype=i64)
        starts, durs = np.frombuffer(cpu.start, dtype=i64), np.frombuffer(cpu.dur, dtype=i64)
        threads, name_ids = np.frombuffer(cpu.thread_id, dtype=i32), np.frombuffer(cpu.name_id, dtype=i32)
        acc: dict[int, list[int]] = {}
        for at in range(0, len(all_rows), _FLOPS_ROWS):
            rows = all_rows[at : at + _FLOPS_ROWS]
            if gpu_known:
                start = starts[rows]
                end = start + durs[rows]
                thread = threads[rows]
                time = np.empty(len(rows), dtype=i64)
                for t in np.unique(thread).tolist():
                    mine = np.flatnonzero(thread == t)
                    time[mine] = self._kernel_ns_between(t, start[mine], end[mine])
                del start, end, thread
            else:
                time = durs[rows]
            names = name_ids[rows]
            order = np.argsort(names, kind="stable")
            names, flops, time = names[order], all_flops[at : at + _FLOPS_ROWS][order], time[order]
            first = np.flatnonzero(np.concatenate(([True], names[1:] != names[:-1])))
            counts = np.diff(np.concatenate((first, [len(names)])))
            times = np.add.reduceat(time, first)
            for nid, lo, n, ns in zip(names[first].tolist(), first.tolist(), counts.tolist(), times.tolist()):
                part = flops[lo : lo + n]
                # exact: an int64 sum cannot overflow while every value is below 2**62 // n, else Python ints
                total = int(part.sum()) if int(part.max()) < (1 << 62) // n else sum(part.tolist())
                sums = acc.setdefault(nid, [0, 0, 0])
                sums[0] += n
                sums[1] += total
                sums[2] += ns
        return {nid: (count, flops, ns) for nid, (count, flops, ns) in acc.items()}

    def window_ops(self, wins: Windows) -> OpRows:
        if not wins:
            return OpRows(start=[], end=[], launch_end=[], name_id=[], kind=[], category=[], stream_id=[], launch=[])
        idx = self.linked_ops[self._sel(wins)]
        starts = self.op_start[idx]
        launch = self.op_launch[idx]
        return OpRows(
            start=starts.tolist(),
            end=(starts + self.op_dur[idx]).tolist(),
            launch_end=(self.launch_start[launch] + self.launch_dur[launch]).tolist(),
            name_id=self.op_name_id[idx].tolist(),
            kind=self.op_kind[idx].tolist(),
            category=self.op_category[idx].tolist(),
            stream_id=self.op_stream_id[idx].tolist(),
            launch=launch.tolist(),
        )

    def range_order(self) -> list[int]:
        np = self.np
        if not self.range_start:
            return []
        start = np.array(self.range_start, dtype=np.int64)
        return np.lexsort(
            (
                np.arange(len(start)),
                -np.array(self.range_dur, dtype=np.int64),
                start,
                np.array(self.range_thread, dtype=np.int64),
            )
        ).tolist()
