"""The report's column arithmetic in plain Python: lists, ``sorted`` and ``bisect`` (the reference twin
of :mod:`gpuprobe.report._columns_numpy`; it serves small traces without importing numpy)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Iterable, Sequence

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
    union_of,
)
from gpuprobe.report._scan import CpuOps, TraceScan

__all__ = ["PythonColumns"]


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
        cat_of_kind = {MEMCPY_KIND: memcpy_cat, MEMSET_KIND: memset_cat}
        self.op_category = [
            cat_of_name[n] if k == KERNEL_KIND else cat_of_kind[k] for k, n in zip(self.op_kind, self.op_name_id)
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
        self.cum_kernel_ns = [0, *itertools.accumulate(self.op_dur[i] if kind[i] == KERNEL_KIND else 0 for i in linked)]
        self.cum_kernels = [0, *itertools.accumulate(1 if kind[i] == KERNEL_KIND else 0 for i in linked)]
        self.cum_memcpy_bytes = [
            0,
            *itertools.accumulate(max(self.op_nbytes[i], 0) if kind[i] == MEMCPY_KIND else 0 for i in linked),
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
        return sum(1 for k in self.op_kind if k == KERNEL_KIND)

    def kernel_total(self) -> int:
        return sum(d for k, d in zip(self.op_kind, self.op_dur) if k == KERNEL_KIND)

    def launch_api_total(self) -> int:
        return sum(self.launch_dur)

    def sync_total(self) -> int:
        return self.cum_sync_ns[-1]

    def union_all(self) -> int:
        return union_of(list(zip(self.op_start, self.op_end)))

    def stream_overlaps(self) -> StreamOverlaps:
        """Kernels that overlap an earlier one of their stream, in time."""
        by_stream: dict[int, list[tuple[int, int, int]]] = {}
        for k, sid, start, end, name in zip(self.op_kind, self.op_stream_id, self.op_start, self.op_end,
                                            self.op_name_id):
            if k == KERNEL_KIND and end > start:
                by_stream.setdefault(sid, []).append((start, end, name))
        kernels = duplicates = extra = 0
        streams = []
        for sid in sorted(by_stream):
            rows = sorted(by_stream[sid])
            cover = None
            found = 0
            for start, end, _ in rows:
                if cover is not None and start < cover:
                    found += 1
                    extra += min(end, cover) - start  # the part already covered, counted again
                    cover = max(cover, end)
                else:
                    cover = end if cover is None else max(cover, end)
            if found:
                kernels += found
                duplicates += len(rows) - len(set(rows))
                streams.append(sid)
        return StreamOverlaps(kernels=kernels, duplicates=duplicates, extra_ns=extra, stream_ids=streams)

    def kernel_groups(self) -> list[KernelGroup]:
        """One group per kernel name, by name id."""
        by_name: dict[int, list[int]] = {}
        for k, n, d in zip(self.op_kind, self.op_name_id, self.op_dur):
            if k == KERNEL_KIND:
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
        return delay_stats(delays, sum(delays))

    def memory_groups(self) -> list[MemoryGroup]:
        """Copies and sets by (kind, direction id)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for k, d, b, dur in zip(self.op_kind, self.op_direction_id, self.op_nbytes, self.op_dur):
            if k != KERNEL_KIND:
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
