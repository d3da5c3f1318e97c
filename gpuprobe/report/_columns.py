"""Column arithmetic behind the report, twice: numpy (fast path, :mod:`._columns_numpy`) and plain
Python (its twin, :mod:`._columns_python`); this module holds what both return and share.

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
from collections.abc import Sequence
from typing import Any, Protocol

from gpuprobe._stats import Spread, quantile, spread
from gpuprobe.report._scan import GpuOpKind

__all__ = [
    "ByThread",
    "DelayStats",
    "JoinCounts",
    "KernelGroup",
    "MemoryGroup",
    "OpRow",
    "OpRows",
    "Spread",
    "StreamOverlaps",
    "Windows",
    "quantile",
    "spread_of",
    "union_of",
    "merge_intervals",
    "overlap_length",
    "delay_stats",
    "KERNEL_KIND",
    "MEMCPY_KIND",
    "MEMSET_KIND",
]

#: Runs ``[lo, hi)`` of positions in one :class:`ByThread` order.
Windows = list[tuple[int, int]]

KERNEL_KIND = GpuOpKind.KERNEL.value
MEMCPY_KIND = GpuOpKind.MEMCPY.value
MEMSET_KIND = GpuOpKind.MEMSET.value


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


class StreamOverlaps:
    """Kernels that overlap in time an earlier one of their stream (the same device and stream), which a
    CUDA or HIP stream never runs: a trace holding some kernels twice, or kernels that overlap by design
    (programmatic dependent launch, graph nodes). Kernels of no duration take no part.

    Attributes:
        kernels: Kernels that start before the end of one of their stream that started no later.
        duplicates: Of those, the kernels equal to another of their stream (name, start and duration).
        extra_ns: Kernel time counted more than once: the durations' sum less their union, per stream.
        stream_ids: The streams where they are (ids of :attr:`TraceScan.streams`), ascending.
    """

    __slots__ = ("kernels", "duplicates", "extra_ns", "stream_ids")

    def __init__(self, *, kernels: int, duplicates: int, extra_ns: int, stream_ids: list[int]) -> None:
        self.kernels = kernels
        self.duplicates = duplicates
        self.extra_ns = extra_ns
        self.stream_ids = stream_ids


class ByThread(Protocol):
    """Rows of one table in (thread, start) order: the rows of a thread, and of a time window."""

    def threads(self) -> list[int]:
        """The distinct threads, in order."""

    def bounds(self, thread: int) -> tuple[int, int]:
        """Positions ``[lo, hi)`` of the rows of ``thread``."""

    def window(self, bounds: tuple[int, int], start: int, end: int) -> tuple[int, int]:
        """Positions, within ``bounds``, of the rows whose start lies in ``[start, end)``."""


def spread_of(sorted_values: Sequence[Any]) -> Spread:
    """The spread of sorted values (a numpy array too), rounded to whole numbers: the report reads its
    p10, median and p90.

    Example:
        >>> s = spread_of([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]); (s.p10, s.median, s.p90)
        (10, 50, 90)
    """
    return spread(sorted_values, ordered=True).rounded()


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


def delay_stats(sorted_delays: Any, total: int) -> DelayStats:
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
