"""The report's column arithmetic vectorised with numpy (the fast path; :mod:`gpuprobe.report._columns_python`
is its twin and answers the same questions)."""

from __future__ import annotations

from array import array
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from gpuprobe.report._columns import (
    DelayStats,
    JoinCounts,
    KernelGroup,
    MemoryGroup,
    OpRow,
    OpRows,
    Spread,
    StreamOverlaps,
    Windows,
    KERNEL_KIND,
    MEMCPY_KIND,
    MEMSET_KIND,
    delay_stats,
    spread_of,
)
from gpuprobe.report._scan import CpuOps, TraceScan

__all__ = ["NumpyColumns"]


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
        self.op_category[self.op_kind == MEMCPY_KIND] = memcpy_cat
        self.op_category[self.op_kind == MEMSET_KIND] = memset_cat
        self.is_kernel = self.op_kind == KERNEL_KIND
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
        self.cum_memcpy_bytes = cum(np.where(self.op_kind[idx] == MEMCPY_KIND, np.maximum(self.op_nbytes[idx], 0), 0))
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

    def stream_overlaps(self) -> StreamOverlaps:
        np = self.np
        sel = self.is_kernel & (self.op_dur > 0)
        stream = self.op_stream_id[sel]
        n = len(stream)
        none = StreamOverlaps(kernels=0, duplicates=0, extra_ns=0, stream_ids=[])
        if n < 2:
            return none
        start = self.op_start[sel]
        dur = self.op_dur[sel]
        name = self.op_name_id[sel]
        order = np.lexsort((start, stream))
        stream, start, dur, name = stream[order], start[order], dur[order], name[order]
        end = start + dur
        del order
        same = stream[1:] == stream[:-1]
        # why first: a kernel that overlaps an earlier one of its stream overlaps the one just before it
        # (their starts ascend), so one comparison says "none", as in every real trace but two of tests/data;
        # the sort and this take 1 to 8 ms for the 152,064 kernels of a 200 MB synthetic trace (a 3 s report),
        # the running end below three sorts more
        if not np.any(same & (start[1:] < end[:-1])):
            return none
        # The running end of each stream: a maximum that starts again with each stream, as one accumulate
        # over (stream, rank of the end) keys, the stream in the high part.
        by_end = np.argsort(end, kind="stable")
        rank = np.empty(n, dtype=np.int64)
        rank[by_end] = np.arange(n, dtype=np.int64)
        segment = np.concatenate(([0], np.cumsum(~same, dtype=np.int64)))
        key = segment * n + rank
        np.maximum.accumulate(key, out=key)
        cover = end[by_end[key - segment * n]][:-1]  # the running end before each kernel but the first
        del by_end, rank, key
        over = same & (start[1:] < cover)
        covered = np.where(over, np.minimum(end[1:], cover) - start[1:], 0)  # the part counted again
        rows = np.lexsort((name, dur, start, stream))  # equal kernels side by side
        twice = np.ones(n - 1, dtype=bool)
        for column in (stream, start, dur, name):
            ordered = column[rows]
            twice &= ordered[1:] == ordered[:-1]
        return StreamOverlaps(kernels=int(over.sum()), duplicates=int(twice.sum()), extra_ns=int(covered.sum()),
                              stream_ids=np.unique(stream[1:][over]).tolist())

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
        return delay_stats(delays, int(delays.sum()))

    def memory_groups(self) -> list[MemoryGroup]:
        np = self.np
        out = []
        for k in (MEMCPY_KIND, MEMSET_KIND):
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
