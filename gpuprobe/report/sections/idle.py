"""The idle section: where the GPU idles in each step window (or the whole trace), while the host
launches the next operation, while it waits in a sync, or otherwise."""

from __future__ import annotations

import bisect
import dataclasses

from gpuprobe.report._section import Context, MergeContext, Section, group_by, merge_intervals, overlap_length
from gpuprobe.report._tables import Column, Table, Unit, format_ns

__all__ = ["IdleRow", "IdleSection", "idle_row", "SECTION"]


@dataclasses.dataclass
class IdleRow:
    """GPU time of one step window: busy, and idle split by what the host was doing.

    ``window_ns`` runs from the step's start (or its first GPU operation, if earlier) to its end
    (or its last GPU operation's end, if later); ``index`` is -1 for a trace without steps.
    """

    index: int
    window_ns: int
    busy_ns: int
    idle_launch_ns: int
    idle_sync_ns: int
    idle_other_ns: int


@dataclasses.dataclass
class IdleSection:
    """Where the GPU idles: while the host launches the next operation, while it waits in a sync,
    or otherwise (launched, not started yet). ``scope`` is ``steps`` or ``trace``."""

    scope: str
    window_ns: int
    busy_ns: int
    idle_launch_ns: int
    idle_sync_ns: int
    idle_other_ns: int
    rows: list[IdleRow]


def idle_row(
    index: int,
    window: tuple[int, int],
    ops: list[tuple[int, int, int]],
    syncs: list[tuple[int, int]],
) -> IdleRow:
    """Split a window of GPU time into busy and three kinds of idle.

    Args:
        index: The step index (-1 for the whole trace).
        window: ``(start, end)``.
        ops: ``(start, end, launch_end)`` of the GPU operations, any order.
        syncs: ``(start, end)`` of the host's sync calls.

    Idle time is split, in this order of precedence: while the host is in a sync call (``sync``);
    while the next GPU operation has not been launched yet, the host still working towards it
    (``launch``); the rest (launched, not yet started: launch latency, waits on other streams).

    Example:
        >>> r = idle_row(0, (0, 100), [(10, 30, 5), (60, 80, 50)], [(85, 95)])
        >>> (r.busy_ns, r.idle_launch_ns, r.idle_sync_ns, r.idle_other_ns)
        (40, 35, 10, 15)
    """
    w0, w1 = window
    # one pass over the operations by start: busy time, the gaps, and for each gap the launch of
    # the operation that ends it (the window holds every operation, so nothing needs clipping)
    gaps: list[tuple[int, int]] = []
    launch_part: list[tuple[int, int]] = []
    busy = 0
    cover = w0
    for start, end, launch_end in sorted(ops):
        if start > cover:
            gaps.append((cover, start))
            if launch_end > cover:
                launch_part.append((cover, min(start, launch_end)))
            busy += end - start
            cover = end
        elif end > cover:
            busy += end - cover
            cover = end
    if w1 > cover:  # after the last operation: nothing more launched in this step
        gaps.append((cover, w1))
        launch_part.append((cover, w1))
    sync_cut = merge_intervals([(max(s, w0), min(e, w1)) for s, e in syncs if min(e, w1) > max(s, w0)])
    if sync_cut:
        sync_idle = overlap_length(gaps, sync_cut)
        launch_idle = _length(launch_part) - overlap_length(launch_part, sync_cut)
    else:
        sync_idle, launch_idle = 0, _length(launch_part)
    idle = _length(gaps)
    return IdleRow(
        index=index,
        window_ns=w1 - w0,
        busy_ns=busy,
        idle_launch_ns=launch_idle,
        idle_sync_ns=sync_idle,
        idle_other_ns=idle - launch_idle - sync_idle,
    )


def compute(ctx: Context) -> IdleSection | None:
    """The steps' windows (or the whole trace's, without steps) split into busy and idle time."""
    if not ctx.gpu_known:
        return None
    cols = ctx.cols
    steps = ctx.steps
    step_threads = {s.thread for s in steps}
    syncs_of = ctx.scan.syncs
    sync_by_thread: dict[int, list[tuple[int, int]]] = {}
    for t, s, d in zip(syncs_of.thread_id, syncs_of.start, syncs_of.dur):
        sync_by_thread.setdefault(t, []).append((s, s + d))
    rows: list[IdleRow] = []
    sync_index: dict[int, tuple[list[int], list[int]]] = {}
    for t, pairs in sync_by_thread.items():
        pairs.sort()
        sync_index[t] = ([a for a, _ in pairs], [b for _, b in pairs])
    if steps:
        for st in steps:
            ops = cols.window_ops(st.op_windows)
            triples = list(zip(ops.start, ops.end, ops.launch_end))
            w0 = min(st.start, min(ops.start, default=st.start))
            w1 = max(st.end, max(ops.end, default=st.end))
            syncs: list[tuple[int, int]] = []
            for t, (starts, ends) in sync_index.items():
                if t == st.thread or t not in step_threads:
                    # a thread's calls do not overlap: sorted by start, their ends are sorted too
                    lo = bisect.bisect_right(ends, w0)
                    hi = bisect.bisect_left(starts, w1)
                    syncs.extend(zip(starts[lo:hi], ends[lo:hi]))
            rows.append(idle_row(st.index, (w0, w1), triples, syncs))
        scope = "steps"
    else:
        wins = [cols.ops_by_launch.bounds(t) for t in cols.ops_by_launch.threads()]
        ops = cols.window_ops(wins)
        if ops.start:
            w = (min(ops.start), max(ops.end))
            syncs = [p for pairs in sync_by_thread.values() for p in pairs]
            rows.append(idle_row(-1, w, list(zip(ops.start, ops.end, ops.launch_end)), syncs))
        scope = "trace"
    return IdleSection(
        scope=scope,
        window_ns=sum(r.window_ns for r in rows),
        busy_ns=sum(r.busy_ns for r in rows),
        idle_launch_ns=sum(r.idle_launch_ns for r in rows),
        idle_sync_ns=sum(r.idle_sync_ns for r in rows),
        idle_other_ns=sum(r.idle_other_ns for r in rows),
        rows=rows,
    )


def _length(pairs: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in pairs)


def tables(idle: IdleSection, markdown: bool) -> list[Table]:
    window = idle.window_ns

    def pct(ns: int) -> str:
        return f"{format_ns(ns)} ({ns / window * 100:.1f} %)" if window else format_ns(ns)

    columns = [Column("step", "index", Unit.INT), Column("window", "window_ns", Unit.NS),
               Column("busy", "busy_ns", Unit.NS), Column("idle: host launching", "idle_launch_ns", Unit.NS),
               Column("idle: host in sync", "idle_sync_ns", Unit.NS), Column("idle: other", "idle_other_ns", Unit.NS)]
    lines = [
        f"busy {pct(idle.busy_ns)}; idle while the host launches {pct(idle.idle_launch_ns)}, "
        f"while it waits in a sync {pct(idle.idle_sync_ns)}, other {pct(idle.idle_other_ns)}"
    ]
    return [Table("idle", "GPU idle time" + (" per step" if idle.scope == "steps" else ""), columns, idle.rows, lines)]


_FIGURES = ("window_ns", "busy_ns", "idle_launch_ns", "idle_sync_ns", "idle_other_ns")


def merge(mctx: MergeContext) -> IdleSection | None:
    """Step *i* of the merged report sums step *i* of every rank."""
    idles = mctx.parts("idle")
    if not idles:
        return None
    rows = []
    for index, group in group_by([r for i in idles for r in i.rows], lambda r: r.index).items():
        rows.append(IdleRow(index=index, **{f: sum(getattr(g, f) for g in group) for f in _FIGURES}))
    rows.sort(key=lambda r: r.index)
    return IdleSection(scope=idles[0].scope, rows=rows, **{f: sum(getattr(i, f) for i in idles) for f in _FIGURES})


SECTION = Section("idle", tables, compute=compute, merge=merge)
