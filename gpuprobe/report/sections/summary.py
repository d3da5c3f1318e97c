"""The summary section: what the trace holds, and the warnings a reader must see first."""

from __future__ import annotations

import dataclasses
import os

from gpuprobe.report._section import Context, MergeContext, Section, StreamOverlaps, known_sum
from gpuprobe.report._tables import Table, format_ns

__all__ = ["Summary", "SECTION"]


@dataclasses.dataclass
class Summary:
    """What the trace holds, and the warnings a reader must see first."""

    path: str
    source: str
    devices: list[str]
    base_time_ns: int | None
    span_ns: int
    events: dict[str, int]
    skipped_events: int
    kernel_count: int
    kernel_ns: int | None
    gpu_op_count: int
    gpu_busy_ns: int | None
    gpu_busy_share: float | None
    launch_count: int
    launch_api_ns: int
    step_count: int
    warnings: list[str]


def compute(ctx: Context) -> Summary:
    scan = ctx.scan
    cols = ctx.cols
    info = ctx.info
    steps = ctx.section("steps")
    busy = cols.union_all() if ctx.gpu_known else None
    span = (scan.last_ns - scan.first_ns) if scan.first_ns is not None and scan.last_ns is not None else 0
    return Summary(
        path=ctx.path,
        source=info.source,
        devices=list(info.devices),
        base_time_ns=info.base_time_ns,
        span_ns=int(span),
        events={k: scan.event_counts[k] for k in sorted(scan.event_counts)},
        skipped_events=info.skipped_events,
        kernel_count=cols.kernel_count(),
        kernel_ns=cols.kernel_total() if ctx.gpu_known else None,
        gpu_op_count=cols.n_ops,
        gpu_busy_ns=busy,
        gpu_busy_share=(busy / span if span else None) if busy is not None else None,
        launch_count=cols.n_launches,
        launch_api_ns=cols.launch_api_total(),
        step_count=len(steps.rows),
        warnings=_warnings(ctx, steps.rows, steps.pattern),
    )


def _warnings(ctx: Context, step_rows: list[object], pattern: str) -> list[str]:
    info = ctx.info
    skipped = info.skipped_events
    out: list[str] = []
    n_launches = ctx.cols.n_launches
    n_ops = ctx.cols.n_ops
    if n_launches and not n_ops:
        out.append(
            f"broken capture: {n_launches} launch calls but no kernel, memcpy or memset records; the GPU "
            "side of the trace is missing (dropped CUPTI activity records, or CUDA not profiled), so GPU "
            "time is unknown, not 0 %"
        )
    elif not n_ops:
        out.append("no GPU activity in this trace (a CPU-only capture); GPU figures are left empty and the GPU "
                   "sections have nothing to show")
    else:
        join = ctx.cols.join_counts()
        without_launch = join.ops_without_launch
        if without_launch and without_launch * 10 > n_ops:
            out.append(
                f"{without_launch} of {n_ops} GPU operations have no launch record with the same "
                "correlation id; they count in totals but not in ranges or steps"
            )
        without_op = n_launches - join.launches_with_op
        if n_launches and without_op * 10 > n_launches:
            out.append(
                f"{without_op} of {n_launches} launch calls have no GPU record: GPU activity records "
                "may have been dropped"
            )
    phases = info.skipped_phases
    unread = sum(phases.values())
    malformed = skipped - unread
    if malformed:
        reasons = info.skipped_reasons
        why = ", ".join(f"{n:,} {reason}" for reason, n in sorted((reasons or {}).items(), key=lambda kv: -kv[1]))
        were = "events were" if malformed != 1 else "event was"
        out.append(f"{malformed:,} malformed {were} left out" + (f": {why}" if why else ""))
    if unread:
        which = ", ".join(f"{n:,} {phase}" for phase, n in sorted(phases.items(), key=lambda kv: -kv[1]))
        were = "events were" if unread != 1 else "event was"
        out.append(f"{unread:,} {were} left out for their phase ({which}): only complete events (\"ph\": \"X\") "
                   "are read, so kernels or ranges written as begin and end events (B/E) count nowhere")
    if ctx.gpu_known:
        overlaps = ctx.cols.stream_overlaps()
        if overlaps.kernels:
            out.append(_overlap_warning(overlaps, list(ctx.scan.streams)))
    out.extend(info.notes)
    if not step_rows:
        out.append(f"no range matched the step pattern {pattern!r}; the per-step table is empty")
    return out


def _overlap_warning(found: StreamOverlaps, streams: list[tuple[int, int]]) -> str:
    """The warning for kernels that overlap on one stream: how many, where, and the time counted twice."""
    where = [f"device {streams[sid][0]} stream {streams[sid][1]}" for sid in found.stream_ids]
    shown = ", ".join(where[:3]) + (f" and {len(where) - 3:,} more streams" if len(where) > 3 else "")
    n = found.kernels
    dup = (f", {found.duplicates:,} of them the same kernel twice (name, start and duration)"
           if found.duplicates else "")
    return (f"{n:,} kernel{'s' if n != 1 else ''} overlap{'' if n != 1 else 's'} an earlier kernel of the same "
            f"stream ({shown}){dup}: {format_ns(found.extra_ns)} of kernel time is counted more than once (kernel "
            "time and the kernel tables include it, GPU busy time does not); one stream runs its kernels one after "
            "another, so the trace holds some kernels twice (written or merged twice) unless they overlap by design "
            "(programmatic dependent launch, graph nodes)")


def tables(s: Summary, markdown: bool) -> list[Table]:
    lines = [f"warning: {w}" for w in s.warnings]
    lines += [
        f"trace: {s.path} ({s.source}{', ' + ', '.join(sorted(set(s.devices))) if s.devices else ''})",
        f"span: {format_ns(s.span_ns)}; events: "
        + ", ".join(f"{k} {v:,}" for k, v in s.events.items())
        + (f"; skipped {s.skipped_events:,}" if s.skipped_events else ""),
    ]
    if not s.gpu_op_count and not s.launch_count:  # the warning says there is no GPU activity: no GPU lines
        lines.append(f"steps: {s.step_count:,}")
    else:
        lines += [
            f"GPU: {s.gpu_op_count:,} operations, {s.kernel_count:,} kernels, kernel time {format_ns(s.kernel_ns)}, "
            f"busy {format_ns(s.gpu_busy_ns)}"
            + (f" ({s.gpu_busy_share * 100:.1f} % of the span)" if s.gpu_busy_share is not None else ""),
            f"launches: {s.launch_count:,} calls, {format_ns(s.launch_api_ns)} in the API; steps: {s.step_count:,}",
        ]
    return [Table("summary", "Summary", [], [], lines)]


def merge(mctx: MergeContext) -> Summary:
    results = mctx.results
    s = [r.report.summary for r in results]
    events: dict[str, int] = {}
    for x in s:
        for k, v in x.events.items():
            events[k] = events.get(k, 0) + v
    span = max(x.span_ns for x in s)
    busy = known_sum(x.gpu_busy_ns for x in s)
    paths = sorted({os.path.dirname(r.path) or "." for r in results})
    return Summary(
        path=f"{len(results)} ranks in {', '.join(paths)} (ranks from {mctx.source})",
        source=s[0].source,
        devices=sorted({d for x in s for d in x.devices}),
        base_time_ns=min((x.base_time_ns for x in s if x.base_time_ns is not None), default=None),
        span_ns=span,
        events=dict(sorted(events.items())),
        skipped_events=sum(x.skipped_events for x in s),
        kernel_count=sum(x.kernel_count for x in s),
        kernel_ns=known_sum(x.kernel_ns for x in s),
        gpu_op_count=sum(x.gpu_op_count for x in s),
        gpu_busy_ns=busy,
        gpu_busy_share=busy / (span * len(s)) if busy is not None and span else None,
        launch_count=sum(x.launch_count for x in s),
        launch_api_ns=sum(x.launch_api_ns for x in s),
        step_count=max(x.step_count for x in s),
        warnings=[f"rank {r.rank}: {w}" for r in results for w in r.report.summary.warnings],
    )


SECTION = Section("summary", tables, compute=compute, merge=merge, always=True)
