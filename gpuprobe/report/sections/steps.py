"""The steps section: one row per step (a range matching the step pattern, outermost match only),
for generation: its CPU time, GPU time by category, launches, syncs and copies."""

from __future__ import annotations

import bisect
import dataclasses
import re
import statistics

from gpuprobe._kernel_names import CATEGORIES
from gpuprobe.report._section import (
    Context,
    MergeContext,
    Section,
    StepWindows,
    group_by,
    median_int,
    quantile,
    step_spread,
)
from gpuprobe.report._tables import Column, Table, Unit, format_ns

__all__ = ["StepRow", "StepsSection", "SECTION"]

#: A range name that says a generation phase: ``prefill``, ``decode``, ``decode_step``, not ``decoder_layer``.
_PHASE_WORD = re.compile(r"(?<![A-Za-z])(prefill|decode)(?![A-Za-z])", re.IGNORECASE)
#: gpuprobe's own step ranges (a profile window's, or the transformers integration's in your profiler).
_GPUPROBE_STEP = re.compile(r"^gpuprobe\.step#\d+$")


@dataclasses.dataclass
class StepRow:
    """One step: a range matching the step pattern (outermost match only).

    ``categories`` is the step's GPU time by kernel category; ``ranges`` the CPU time of each range directly
    inside the step's own range, by name (a generation step's components: ``forward``, each logits
    processor, ``stopping_criteria``, ``streamer``); the rest of the step's CPU time is in none of them.
    """

    index: int
    name: str
    phase: str
    start_ns: int
    cpu_ns: int
    gpu_busy_ns: int | None
    gpu_span_ns: int | None
    kernel_ns: int | None
    kernels: int
    launches: int
    launch_api_ns: int
    sync_ns: int
    memcpy_bytes: int
    categories: dict[str, int]
    ranges: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepsSection:
    """Per-step table for generation; ``start_ns`` is relative to the trace start."""

    pattern: str
    count: int
    cpu_median_ns: int | None
    cpu_p10_ns: int | None
    cpu_p90_ns: int | None
    gpu_busy_median_ns: int | None
    gpu_busy_p10_ns: int | None
    gpu_busy_p90_ns: int | None
    launches_median: float | None
    rows: list[StepRow]


def compute(ctx: Context) -> StepsSection:
    cols = ctx.cols
    n_cat = len(CATEGORIES)
    gpu_known = ctx.gpu_known
    steps = ctx.steps
    step_threads = {s.thread for s in steps}
    launch_windows = StepWindows(cols.launches_by_thread, step_threads)
    sync_windows = StepWindows(cols.syncs_by_thread, step_threads)
    rows: list[StepRow] = []
    inside = _phases_inside(ctx)
    components = _components(ctx)
    for step in steps:
        op_wins = step.op_windows
        launch_wins = launch_windows.find(step.thread, step.start, step.end)
        sync_wins = sync_windows.find(step.thread, step.start, step.end)
        cats: dict[str, int] = {}
        busy = span = kernel_ns = None
        if gpu_known:
            busy, span = cols.busy_span(op_wins)
            kernel_ns = cols.window_total(cols.cum_kernel_ns, op_wins)
            per_cat = cols.categories(op_wins, n_cat)
            cats = {CATEGORIES[j]: v for j, v in enumerate(per_cat) if v}
        rows.append(
            StepRow(
                index=step.index,
                name=step.name,
                phase=step.phase or inside.get(step.index, ""),
                start_ns=step.start - ctx.origin,
                cpu_ns=step.end - step.start,
                gpu_busy_ns=busy,
                gpu_span_ns=span,
                kernel_ns=kernel_ns,
                kernels=cols.window_total(cols.cum_kernels, op_wins),
                launches=sum(hi - lo for lo, hi in launch_wins),
                launch_api_ns=cols.window_total(cols.cum_launch_ns, launch_wins),
                sync_ns=cols.window_total(cols.cum_sync_ns, sync_wins),
                memcpy_bytes=cols.window_total(cols.cum_memcpy_bytes, op_wins),
                categories=cats,
                ranges=components.get(step.index, {}),
            )
        )
    cpu = step_spread([r.cpu_ns for r in rows])
    gpu = step_spread([r.gpu_busy_ns for r in rows if r.gpu_busy_ns is not None]) if gpu_known else None
    return StepsSection(
        pattern=ctx.step_regex[1],
        count=len(rows),
        cpu_median_ns=cpu.median if cpu else None,
        cpu_p10_ns=cpu.p10 if cpu else None,
        cpu_p90_ns=cpu.p90 if cpu else None,
        gpu_busy_median_ns=gpu.median if gpu else None,
        gpu_busy_p10_ns=gpu.p10 if gpu else None,
        gpu_busy_p90_ns=gpu.p90 if gpu else None,
        launches_median=quantile(sorted(r.launches for r in rows), 0.5) if rows else None,
        rows=rows,
    )


_COLUMNS = [
    Column("step", "index", Unit.INT), Column("name", "name", Unit.NAME), Column("phase", "phase"),
    Column("start", "start_ns", Unit.NS), Column("CPU", "cpu_ns", Unit.NS), Column("GPU busy", "gpu_busy_ns", Unit.NS),
    Column("GPU span", "gpu_span_ns", Unit.NS), Column("kernels", "kernels", Unit.INT),
    Column("launches", "launches", Unit.INT), Column("launch API", "launch_api_ns", Unit.NS),
    Column("sync", "sync_ns", Unit.NS), Column("memcpy", "memcpy_bytes", Unit.BYTES),
]


def _components(ctx: Context) -> dict[int, dict[str, int]]:
    """The CPU time of each range directly inside a step's own range, by step index and range name (the
    names in order of first appearance)."""
    out: dict[int, dict[str, int]] = {}
    paths = ctx.range_walk.paths.values()
    inside = sorted((t for t in paths if t.in_step_range), key=lambda t: (t.first_start, t.path))
    for t in inside:
        for index, ns in t.step_cpu_ns.items():
            by_name = out.setdefault(index, {})
            by_name[t.name] = by_name.get(t.name, 0) + ns
    return out


def _phases_inside(ctx: Context) -> dict[int, str]:
    """The phase of each step whose own name says none, from a range inside it that does (a program's
    ``record_function("prefill")`` inside gpuprobe's ``gpuprobe.step#N``): ``prefill``, ``decode``, or
    ``mixed`` when both are inside. Steps by index; none when no range name says a phase."""
    phase_of = {i: m.group(1).lower() for i, n in enumerate(ctx.range_names) if (m := _PHASE_WORD.search(n))}
    blank = [s for s in ctx.steps if not s.phase]
    if not phase_of or not blank:
        return {}
    by_thread: dict[int, list[tuple[int, int, int]]] = {}
    for s in blank:
        by_thread.setdefault(s.thread, []).append((s.start, s.end, s.index))
    for spans in by_thread.values():
        spans.sort()
    found: dict[int, set[str]] = {}
    r = ctx.scan.ranges
    for k, name_id in enumerate(r.name_id):
        phase = phase_of.get(name_id)
        spans = by_thread.get(r.thread_id[k]) if phase is not None else None
        if not spans:
            continue
        start = r.start[k]
        i = bisect.bisect_right(spans, (start, 1 << 62, 0)) - 1  # the last step starting at or before it
        if i >= 0 and start + r.dur[k] <= spans[i][1]:
            found.setdefault(spans[i][2], set()).add(phase)
    return {index: phases.pop() if len(phases) == 1 else "mixed" for index, phases in found.items()}


def _notes(st: StepsSection) -> list[str]:
    """What the numbering and the phase of gpuprobe's own steps mean, where they are in the table."""
    ours = [r for r in st.rows if _GPUPROBE_STEP.match(r.name)]
    if not ours:
        return []
    lines = ["step: the order in this trace; the N of gpuprobe.step#N counts the steps of the whole process "
             "(every generate() call since it started), so it need not start at 0 nor restart with each call"]
    if any(not r.phase for r in ours):
        lines.append("phase: blank where the trace does not say it: gpuprobe's step ranges in a torch.profiler trace "
                     "do not name the phase (its prefill and decode ranges are NVTX ones, which Nsight Systems "
                     "records), and no range inside the step names prefill or decode")
    return lines


def tables(st: StepsSection, markdown: bool) -> list[Table]:
    """The steps, with each category's time per step in CSV (text and Markdown show ``top`` rows)."""
    cats = [c for c in CATEGORIES if any(c in row.categories for row in st.rows)]
    columns = _COLUMNS + [Column(c, f"cat:{c}", Unit.NS, csv_only=True, csv_header=f"{c}_ns") for c in cats]
    lines = [
        f"{st.count:,} steps (pattern {st.pattern}); CPU median {format_ns(st.cpu_median_ns)} "
        f"(p10 {format_ns(st.cpu_p10_ns)}, p90 {format_ns(st.cpu_p90_ns)}); GPU busy median "
        f"{format_ns(st.gpu_busy_median_ns)} (p10 {format_ns(st.gpu_busy_p10_ns)}, "
        f"p90 {format_ns(st.gpu_busy_p90_ns)})"
    ] + _notes(st)
    rows = [dict(dataclasses.asdict(row), **{f"cat:{c}": row.categories.get(c, 0) for c in cats}) for row in st.rows]
    return [Table("steps", "Steps", columns, rows, lines, cut=True)]


def merge(mctx: MergeContext) -> StepsSection | None:
    """Steps side by side: step *i* of the merged report sums step *i* of every rank."""
    sections = mctx.parts("steps")
    if not sections:
        return None
    rows = []
    for index, group in sorted(group_by([r for s in sections for r in s.rows], lambda r: r.index).items()):
        def total(field: str) -> int | None:
            vals = [getattr(g, field) for g in group if getattr(g, field) is not None]
            return sum(vals) if vals else None
        cats: dict[str, int] = {}
        components: dict[str, int] = {}
        for g in group:
            for k, v in g.categories.items():
                cats[k] = cats.get(k, 0) + v
            for k, v in g.ranges.items():
                components[k] = components.get(k, 0) + v
        rows.append(StepRow(index=index, name=group[0].name, phase=group[0].phase,
                            start_ns=min(g.start_ns for g in group), cpu_ns=sum(g.cpu_ns for g in group),
                            gpu_busy_ns=total("gpu_busy_ns"), gpu_span_ns=total("gpu_span_ns"),
                            kernel_ns=total("kernel_ns"),
                            kernels=sum(g.kernels for g in group), launches=sum(g.launches for g in group),
                            launch_api_ns=sum(g.launch_api_ns for g in group), sync_ns=sum(g.sync_ns for g in group),
                            memcpy_bytes=sum(g.memcpy_bytes for g in group), categories=cats,
                            ranges=components))

    def spread(values: list[int]) -> tuple[int | None, int | None, int | None]:
        if not values:
            return None, None, None
        q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
        return int(round(q[0])), median_int(values), int(round(q[-1]))

    cpu = spread([r.cpu_ns for r in rows])
    gpu = spread([r.gpu_busy_ns for r in rows if r.gpu_busy_ns is not None])
    launches = [r.launches for r in rows]
    return StepsSection(pattern=sections[0].pattern, count=len(rows), cpu_median_ns=cpu[1], cpu_p10_ns=cpu[0],
                        cpu_p90_ns=cpu[2], gpu_busy_median_ns=gpu[1], gpu_busy_p10_ns=gpu[0], gpu_busy_p90_ns=gpu[2],
                        launches_median=statistics.median(launches) if launches else None, rows=rows)


SECTION = Section("steps", tables, compute=compute, merge=merge)
