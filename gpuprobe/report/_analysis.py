"""Analyses: :func:`analyze` reads a trace in one streaming pass, then computes the report sections.

The pass (:class:`~gpuprobe.report._scan.TraceScan`) keeps compact columns and per-name
aggregates; :func:`build_report` computes the sections from them through the column classes of
:mod:`gpuprobe.report._columns` (numpy for large traces, their plain-Python twin for small ones).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from gpuprobe._kernel_names import CATEGORIES, categorize_kernel, kernel_family, launch_api_kind, short_kernel_name
from gpuprobe.errors import ConfigError
from gpuprobe.report._columns import (
    ByThread,
    KernelGroup,
    NumpyColumns,
    PythonColumns,
    Spread,
    Windows,
    quantile,
    spread_of,
)
from gpuprobe.report._comm import communication
from gpuprobe.report._diagnosis import Evidence, StepSpan, gather
from gpuprobe.report._events import MEMSET, TraceInfo
from gpuprobe.report._findings import evaluate, parse_thresholds
from gpuprobe.report._scan import EVENT_KIND, GpuOpKind, TraceScan
from gpuprobe.report.loaders import Trace, load
from gpuprobe.report.schema import (
    SECTIONS,
    ApiStat,
    CategoriesSection,
    CategoryStat,
    CpuOpsSection,
    CpuOpStat,
    FamiliesSection,
    FamilyStat,
    KernelsSection,
    KernelStat,
    LaunchesSection,
    MemOpStat,
    MemorySection,
    RangesSection,
    RangeStat,
    Report,
    SmallOpsSection,
    StepRow,
    StepsSection,
    Summary,
    TimelineRow,
    TimelineSection,
)

__all__ = ["analyze", "build_report", "Options", "DEFAULT_STEP_PATTERN", "PROFILER_STEP_PATTERN", "BACKENDS"]

#: Names of gpuprobe step ranges and common generation phases; ``decode_step`` and ``prefill 3``
#: match, ``decoder_layer`` does not.
DEFAULT_STEP_PATTERN = r"^(?:gpuprobe\.step|decode|prefill|step)(?![A-Za-z])"
#: ``torch.profiler`` step ranges, used when nothing matches the step pattern.
PROFILER_STEP_PATTERN = r"^ProfilerStep#\d+$"
#: Column backends of :class:`Options`.
BACKENDS: tuple[str, ...] = ("auto", "numpy", "python")
_CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
_MAX_RANGE_PATHS = 200
_PYTHON_BELOW = 50_000  # GPU operations + launches + ranges under which "auto" takes the Python twin
_STEP_NUMBER = re.compile(r"#\d+$")


@dataclasses.dataclass(frozen=True)
class Options:
    """What to compute.

    Attributes:
        top: Rows per table.
        step_pattern: Regular expression (``re.search``) for step range names; ``None`` uses
            :data:`DEFAULT_STEP_PATTERN`, then :data:`PROFILER_STEP_PATTERN` if nothing matches.
        small_ns: Kernels with a mean below this are "small" (default 5 µs, about one launch call).
        sections: Sections to compute; empty means all.
        backend: ``"auto"`` (plain Python for small traces, numpy for large ones), ``"numpy"`` or
            ``"python"``; all give the same report.
        thresholds: Every finding threshold (defaults of
            :data:`~gpuprobe.report._findings.THRESHOLDS` with overrides); ``None`` for the defaults.
        timeline_top: Rows of the timeline, if not ``top`` (a rank's report for a merge keeps every
            row of its tables but only the longest events).
    """

    top: int = 20
    step_pattern: str | None = None
    small_ns: int = 5_000
    sections: tuple[str, ...] = ()
    backend: str = "auto"
    thresholds: Mapping[str, float] | None = None
    timeline_top: int | None = None

    def wants(self, section: str) -> bool:
        return not self.sections or section in self.sections


def analyze(
    path: str | os.PathLike[str] | Trace,
    *,
    top: int = 20,
    sections: Sequence[str] = (),
    step_pattern: str | None = None,
    small_us: float = 5.0,
    engine: str = "auto",
    backend: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
) -> Report:
    """Read a trace in one streaming pass and compute the report sections.

    Args:
        path: A kineto ``.json`` / ``.json.gz`` trace, an nsys SQLite export, or a :class:`Trace`.
        top: Rows per table.
        sections: Names from :data:`SECTIONS` to compute; empty for all (``summary`` is always there).
        step_pattern: Regular expression (``re.search``) naming step ranges; by default gpuprobe
            step ranges (``gpuprobe.step``, ``decode``, ``prefill``, ``step``), else ``ProfilerStep#N``.
        small_us: Kernels with a mean below this many microseconds count as small operations.
        engine: One of :data:`gpuprobe.report.loaders.ENGINES` (kineto JSON only; all give the same events).
        backend: ``"auto"``, ``"numpy"`` or ``"python"``: how columns are crunched after the pass
            (the same report either way; ``auto`` takes numpy for large traces).
        progress: Called with ``(done, total)`` bytes (rows for nsys) while reading.
        thresholds: Overrides of finding thresholds, ``{"host_sync.per_step": 2}`` or
            ``["host_sync.per_step=2"]`` (names: ``gpuprobe.report._findings.THRESHOLDS``).

    Returns:
        The :class:`Report`.

    Raises:
        ReportInputError: The file is missing, empty, truncated, invalid, or not a trace.
        ConfigError: An unknown section, backend, engine or threshold, or a bad step pattern (a
            ``ValueError``).

    Example:
        >>> report = analyze("tests/data/kineto_min.json")  # doctest: +SKIP
        >>> report.summary.kernel_ns  # 18.304 µs + 9.120 µs  # doctest: +SKIP
        27424
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ConfigError(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if step_pattern is not None:
        try:
            re.compile(step_pattern)
        except re.error as exc:
            raise ConfigError(f"bad step pattern {step_pattern!r}: {exc}") from None
    limits = parse_thresholds(thresholds if not isinstance(thresholds, str) else [thresholds])
    small_ns = small_ns_of(small_us)
    trace = path if isinstance(path, Trace) else load(path, engine=engine)
    wants_timeline = not sections or "timeline" in sections
    scan = TraceScan(
        correlation_by_process=trace.info.correlation_by_process,
        keep_longest=min(top, 10_000) if wants_timeline else 1,
    )
    scan.consume(trace.events(progress))
    options = Options(
        top=top,
        step_pattern=step_pattern,
        small_ns=small_ns,
        sections=tuple(sections),
        backend=backend,
        thresholds=limits,
    )
    return build_report(scan, options, trace.path, trace.info)  # trace.info is complete once events ran out


def small_ns_of(small_us: Any) -> int:
    """``small_us`` in nanoseconds; ConfigError unless it is a finite number, 0 or more.

    Example:
        >>> small_ns_of(5), small_ns_of(0.5)
        (5000, 500)
    """
    try:
        ok = not isinstance(small_us, bool) and math.isfinite(small_us) and small_us >= 0
    except TypeError:
        ok = False
    if not ok:
        raise ConfigError(f"small_us must be a finite number of microseconds, 0 or more, not {small_us!r}")
    return int(round(small_us * 1000))


def build_report(scan: TraceScan, options: Options, path: str, info: TraceInfo | None = None) -> Report:
    """Compute the report sections from a finished :class:`~gpuprobe.report._scan.TraceScan`.

    Args:
        scan: The pass over every event of the trace.
        options: What to compute.
        path: The trace file, as the summary names it.
        info: What the trace says about itself (source, devices, ...); a kineto trace without
            metadata if ``None``.

    Returns:
        The :class:`Report`.

    Example:
        >>> from gpuprobe.report._events import Event
        >>> scan = TraceScan()
        >>> scan.consume([Event("kernel", "k", 0, 10, 0, 7, 1), Event("runtime", "cudaLaunchKernel", -5, 2, 1, 1, 1)])
        >>> build_report(scan, Options(), "x").summary.kernel_ns
        10
    """
    return _Sections(scan, options).build(path, info if info is not None else TraceInfo("kineto"))


def _pick_columns(scan: TraceScan, backend: str, cat_of_name: list[int]) -> PythonColumns | NumpyColumns:
    size = len(scan.ops) + len(scan.launches) + len(scan.ranges)
    if backend == "auto":
        # why: below this size the Python twin is as fast, and skipping numpy saves its 16 MB import
        backend = "python" if size < _PYTHON_BELOW else "numpy"
    memcpy_cat, memset_cat = _CAT_INDEX["memcpy"], _CAT_INDEX["memset"]
    if backend == "numpy":
        try:
            return NumpyColumns(scan, cat_of_name, memcpy_cat, memset_cat)
        except ImportError:
            if size >= _PYTHON_BELOW:
                warnings.warn(
                    "numpy is not installed: a large trace is analysed in plain Python (slower, more "
                    "memory); pip install 'gpuprobe[report]'",
                    stacklevel=5,  # the caller of analyze()
                )
    return PythonColumns(scan, cat_of_name, memcpy_cat, memset_cat)


class _StepSpan(NamedTuple):
    """A step range; sorting step spans sorts steps by start."""

    start: int
    thread: int
    dur: int
    name_id: int


class _OpenRange(NamedTuple):
    """A range on the stack of enclosing ranges while ranges are walked in (thread, start) order."""

    end: int
    path: str
    in_step: bool


class _RangeTotals:
    """Totals of one range path over its occurrences."""

    __slots__ = (
        "path",
        "name",
        "depth",
        "first_start",
        "count",
        "cpu_ns",
        "gpu_busy_ns",
        "kernel_ns",
        "gpu_span_ns",
        "launches",
        "gpu_ops",
    )

    def __init__(self, path: str, name: str, depth: int, first_start: int) -> None:
        self.path = path
        self.name = name
        self.depth = depth
        self.first_start = first_start
        self.count = 0
        self.cpu_ns = 0
        self.gpu_busy_ns = 0
        self.kernel_ns = 0
        self.gpu_span_ns = 0
        self.launches = 0
        self.gpu_ops = 0


class _FamilyTotals:
    """Totals of the kernel names of one family."""

    __slots__ = ("variants", "count", "total_ns")

    def __init__(self) -> None:
        self.variants = 0
        self.count = 0
        self.total_ns = 0


class _StepWindows:
    """The rows of one (thread, start)-ordered table that fall in a step's time span.

    A step holds the rows of its own thread whose start lies in its span, and those of threads
    without step ranges (a second launching thread, for instance) whose start lies in it too.
    """

    __slots__ = ("index", "own", "others")

    def __init__(self, index: ByThread, step_threads: set[int]) -> None:
        self.index = index
        self.own: dict[int, tuple[int, int]] = {}
        self.others = [index.bounds(t) for t in index.threads() if t not in step_threads]

    def find(self, thread: int, start: int, end: int) -> Windows:
        bounds = self.own.get(thread)
        if bounds is None:
            bounds = self.own[thread] = self.index.bounds(thread)
        found = [self.index.window(bounds, start, end)]
        found += [self.index.window(b, start, end) for b in self.others]
        return [(lo, hi) for lo, hi in found if hi > lo]


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _step_spread(values: list[int]) -> Spread | None:
    return spread_of(sorted(values)) if values else None


class _Sections:
    """Computes the sections of a report from a finished scan, through one of the column classes.

    :meth:`build` runs the phases in order, and each phase gets what it needs from earlier ones as
    arguments: ranges (which also find the steps), steps, then the sections that read the steps.
    """

    def __init__(self, scan: TraceScan, options: Options) -> None:
        self.scan = scan
        self.options = options
        self.gpu_name_list = list(scan.gpu_names)
        self.range_name_list = list(scan.range_names)
        self.cat_of_name = [_CAT_INDEX[categorize_kernel(n)] for n in self.gpu_name_list]
        fam_index: dict[str, int] = {}
        self.fam_of_name = [fam_index.setdefault(kernel_family(n), len(fam_index)) for n in self.gpu_name_list]
        self.fam_names = list(fam_index)
        self.cols = _pick_columns(scan, options.backend, self.cat_of_name)
        self.gpu_known = self.cols.n_ops > 0
        self.origin = scan.first_ns if scan.first_ns is not None else 0

    def build(self, path: str, info: TraceInfo) -> Report:
        o = self.options
        # findings read every section: with findings asked for, all are computed, and those not
        # asked for are dropped at the end
        findings = o.wants("findings")

        def want(section: str) -> bool:
            return findings or o.wants(section)

        groups = self.cols.kernel_groups()
        regex, pattern = self._step_regex()
        ranges, step_spans = self._ranges(regex)
        steps, step_windows = self._steps(step_spans, pattern)
        report = Report(summary=self._summary(path, info, steps))
        if want("kernels"):
            report.kernels = self._kernels_section(groups, lambda cat: True)
        if want("categories"):
            report.categories = self._categories(steps)
        if want("families"):
            report.families = self._families(groups, self._family_spreads(steps, step_windows))
        if want("non_gemm"):
            report.non_gemm = self._kernels_section(groups, lambda cat: cat != "gemm")
        if want("attention"):
            report.attention = self._kernels_section(groups, lambda cat: cat == "attention")
        if want("launches"):
            report.launches = self._launches(steps)
        if want("memory"):
            report.memory = self._memory()
        if want("ranges"):
            report.ranges = ranges
        if want("steps"):
            report.steps = steps
        if want("small_ops"):
            report.small_ops = self._small_ops(groups)
        if want("timeline"):
            report.timeline = self._timeline()
        if want("cpu_ops"):
            report.cpu_ops = self._cpu_ops()
        if want("communication") and self.gpu_known:
            comm_ids = {i for i, c in enumerate(self.cat_of_name) if c == _CAT_INDEX["communication"]}
            report.communication = communication(
                self.scan, self.cols, step_windows, [r.index for r in steps.rows], comm_ids
            )
        if want("idle") or want("flops"):
            evidence = self._evidence(step_spans, steps, step_windows, regex, info.source)
            report.idle = evidence.idle
            report.flops = evidence.flops
            if findings:
                report.findings = evaluate(report, evidence, dict(o.thresholds or parse_thresholds(None)))
        if findings:
            for section in SECTIONS:
                if section != "summary" and not o.wants(section):
                    setattr(report, section, None)
        return report

    def _evidence(
        self,
        step_spans: list[_StepSpan],
        steps: StepsSection,
        step_windows: list[Windows],
        step_regex: re.Pattern[str],
        source: str,
    ) -> Evidence:
        spans = [
            StepSpan(
                index=row.index,
                phase=row.phase,
                thread=span.thread,
                start=span.start,
                end=span.start + span.dur,
                op_windows=wins,
            )
            for span, row, wins in zip(step_spans, steps.rows, step_windows)
        ]
        display = [_STEP_NUMBER.sub("#N", n) for n in self.range_name_list]
        return gather(
            self.scan,
            self.cols,
            spans,
            self.gpu_name_list,
            display,
            step_name_ids={i for i, n in enumerate(self.range_name_list) if step_regex.search(n)},
            source=source,
        )

    # -------------------------------------------------------------- summary

    def _summary(self, path: str, info: TraceInfo, steps: StepsSection) -> Summary:
        scan = self.scan
        cols = self.cols
        busy = cols.union_all() if self.gpu_known else None
        span = (scan.last_ns - scan.first_ns) if scan.first_ns is not None and scan.last_ns is not None else 0
        return Summary(
            path=path,
            source=info.source,
            devices=list(info.devices),
            base_time_ns=info.base_time_ns,
            span_ns=int(span),
            events={k: scan.event_counts[k] for k in sorted(scan.event_counts)},
            skipped_events=info.skipped_events,
            kernel_count=cols.kernel_count(),
            kernel_ns=cols.kernel_total() if self.gpu_known else None,
            gpu_op_count=cols.n_ops,
            gpu_busy_ns=busy,
            gpu_busy_share=(busy / span if span else None) if busy is not None else None,
            launch_count=cols.n_launches,
            launch_api_ns=cols.launch_api_total(),
            step_count=len(steps.rows),
            warnings=self._warnings(info.skipped_events, info.notes, steps, info.skipped_reasons),
        )

    def _warnings(
        self, skipped: int, notes: list[str], steps: StepsSection, reasons: dict[str, int] | None = None
    ) -> list[str]:
        out: list[str] = []
        n_launches = self.cols.n_launches
        n_ops = self.cols.n_ops
        if n_launches and not n_ops:
            out.append(
                f"broken capture: {n_launches} launch calls but no kernel, memcpy or memset records; the GPU "
                "side of the trace is missing (dropped CUPTI activity records, or CUDA not profiled), so GPU "
                "time is unknown, not 0 %"
            )
        elif not n_ops:
            out.append("no GPU activity in this trace (a CPU-only capture); GPU figures are left empty")
        else:
            join = self.cols.join_counts()
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
        if skipped:
            why = ", ".join(f"{n:,} {reason}" for reason, n in sorted((reasons or {}).items(), key=lambda kv: -kv[1]))
            were = "events were" if skipped != 1 else "event was"
            out.append(f"{skipped:,} malformed {were} left out" + (f": {why}" if why else ""))
        out.extend(notes)
        if not steps.rows:
            out.append(f"no range matched the step pattern {steps.pattern!r}; the per-step table is empty")
        return out

    # -------------------------------------------------------------- kernels

    def _kernel_stat(self, g: KernelGroup, whole: int) -> KernelStat:
        name = self.gpu_name_list[g.name_id]
        return KernelStat(
            name=name,
            short_name=short_kernel_name(name),
            category=categorize_kernel(name),
            count=g.count,
            total_ns=g.total_ns,
            mean_ns=g.total_ns // g.count,
            median_ns=g.median_ns,
            min_ns=g.min_ns,
            max_ns=g.max_ns,
            share=_share(g.total_ns, whole),
        )

    def _kernels_section(self, groups: list[KernelGroup], keep: Callable[[str], bool]) -> KernelsSection:
        whole = sum(g.total_ns for g in groups)
        chosen = [g for g in groups if keep(CATEGORIES[self.cat_of_name[g.name_id]])]
        chosen.sort(key=lambda g: (-g.total_ns, self.gpu_name_list[g.name_id]))
        return KernelsSection(
            total_ns=sum(g.total_ns for g in chosen),
            count=sum(g.count for g in chosen),
            distinct=len(chosen),
            rows=[self._kernel_stat(g, whole) for g in chosen[: self.options.top]],
        )

    def _small_ops(self, groups: list[KernelGroup]) -> SmallOpsSection:
        threshold = self.options.small_ns
        whole_ns = sum(g.total_ns for g in groups)
        whole_n = sum(g.count for g in groups)
        small = [g for g in groups if g.total_ns < g.count * threshold]
        small.sort(key=lambda g: (-g.count, -g.total_ns, self.gpu_name_list[g.name_id]))
        n = sum(g.count for g in small)
        t = sum(g.total_ns for g in small)
        return SmallOpsSection(
            threshold_ns=threshold,
            count=n,
            count_share=_share(n, whole_n),
            total_ns=t,
            time_share=_share(t, whole_ns),
            rows=[self._kernel_stat(g, whole_ns) for g in small[: self.options.top]],
        )

    def _family_spreads(self, steps: StepsSection, step_windows: list[Windows]) -> dict[int, Spread]:
        if not steps.rows or not self.gpu_known:
            return {}
        return self.cols.family_spreads(step_windows, self.fam_of_name, len(self.fam_names))

    def _families(self, groups: list[KernelGroup], spreads: dict[int, Spread]) -> FamiliesSection:
        whole = sum(g.total_ns for g in groups)
        totals: dict[int, _FamilyTotals] = {}
        for g in groups:
            fam = self.fam_of_name[g.name_id]
            t = totals.get(fam)
            if t is None:
                t = totals[fam] = _FamilyTotals()
            t.variants += 1
            t.count += g.count
            t.total_ns += g.total_ns
        order = sorted(totals, key=lambda f: (-totals[f].total_ns, self.fam_names[f]))[: self.options.top]
        rows = []
        for f in order:
            t = totals[f]
            spread = spreads.get(f)
            name = self.fam_names[f]
            rows.append(
                FamilyStat(
                    family=name,
                    category=categorize_kernel(name),
                    variants=t.variants,
                    count=t.count,
                    total_ns=t.total_ns,
                    share=_share(t.total_ns, whole),
                    step_median_ns=spread.median if spread else None,
                    step_p10_ns=spread.p10 if spread else None,
                    step_p90_ns=spread.p90 if spread else None,
                )
            )
        return FamiliesSection(total_ns=whole, rows=rows)

    def _categories(self, steps: StepsSection) -> CategoriesSection:
        counts, totals = self.cols.category_stats(len(CATEGORIES))
        whole = sum(totals)
        rows = []
        for i, cat in enumerate(CATEGORIES):
            if not counts[i]:
                continue
            spread = None
            if steps.rows and self.gpu_known:
                spread = _step_spread([r.categories.get(cat, 0) for r in steps.rows])
            rows.append(
                CategoryStat(
                    category=cat,
                    count=counts[i],
                    total_ns=totals[i],
                    share=_share(totals[i], whole),
                    step_median_ns=spread.median if spread else None,
                    step_p10_ns=spread.p10 if spread else None,
                    step_p90_ns=spread.p90 if spread else None,
                )
            )
        rows.sort(key=lambda r: (-r.total_ns, r.category))
        other = next((r.total_ns for r in rows if r.category == "other"), 0)
        return CategoriesSection(total_ns=whole, other_share=_share(other, whole), rows=rows)

    # ------------------------------------------------------------ launches

    def _launches(self, steps: StepsSection) -> LaunchesSection:
        cols = self.cols
        delays = cols.delay_stats()
        join = cols.join_counts()
        apis = sorted(self.scan.api_calls.items(), key=lambda item: (-item[1].total_ns, item[0]))[: self.options.top]
        per_step = None
        if steps.rows:
            launches = sorted(r.launches for r in steps.rows)
            per_step = quantile(launches, 0.5)
        return LaunchesSection(
            launch_count=cols.n_launches,
            api_ns=cols.launch_api_total(),
            sync_count=cols.n_syncs,
            sync_ns=cols.sync_total(),
            per_step_median=per_step,
            delay_count=delays.count,
            delay_mean_ns=delays.mean_ns,
            delay_median_ns=delays.median_ns,
            delay_p90_ns=delays.p90_ns,
            delay_max_ns=delays.max_ns,
            launches_without_gpu_op=cols.n_launches - join.launches_with_op,
            gpu_ops_without_launch=join.ops_without_launch,
            apis=[
                ApiStat(
                    name=name,
                    kind=launch_api_kind(name),
                    count=stat.count,
                    total_ns=stat.total_ns,
                    mean_ns=stat.total_ns // stat.count,
                    max_ns=stat.max_ns,
                )
                for name, stat in apis
            ],
        )

    def _memory(self) -> MemorySection:
        direction_names = list(self.scan.directions)
        rows = []
        for group in self.cols.memory_groups():
            kind_name = EVENT_KIND[group.kind]
            direction = direction_names[group.direction_id] or ("Device" if kind_name == MEMSET else "unknown")
            rows.append(
                MemOpStat(
                    kind=kind_name,
                    direction=direction,
                    count=group.count,
                    bytes=group.nbytes,
                    total_ns=group.total_ns,
                    bandwidth_gbps=group.nbytes / group.total_ns if group.total_ns else None,
                )
            )
        rows.sort(key=lambda r: (-r.total_ns, r.kind, r.direction))
        return MemorySection(total_bytes=sum(r.bytes for r in rows), total_ns=sum(r.total_ns for r in rows), rows=rows)

    # --------------------------------------------------------------- ranges

    def _step_regex(self) -> tuple[re.Pattern[str], str]:
        if self.options.step_pattern is not None:
            return re.compile(self.options.step_pattern), self.options.step_pattern
        default = re.compile(DEFAULT_STEP_PATTERN, re.IGNORECASE)
        if any(default.search(n) for n in self.range_name_list):
            return default, DEFAULT_STEP_PATTERN
        return re.compile(PROFILER_STEP_PATTERN), PROFILER_STEP_PATTERN

    def _ranges(self, step_regex: re.Pattern[str]) -> tuple[RangesSection, list[_StepSpan]]:
        """The ranges section, and the step ranges (outermost matches of the step pattern) by start."""
        cols = self.cols
        ops_index = cols.ops_by_launch
        launch_index = cols.launches_by_thread
        is_step_name = [bool(step_regex.search(n)) for n in self.range_name_list]
        display = [_STEP_NUMBER.sub("#N", n) for n in self.range_name_list]
        paths: dict[str, _RangeTotals] = {}
        step_spans: list[_StepSpan] = []
        stack: list[_OpenRange] = []  # the ranges enclosing the current one, innermost last
        current = None
        op_bounds = launch_bounds = (0, 0)
        gpu_known = self.gpu_known
        for i in cols.range_order():
            thread = cols.range_thread[i]
            start = cols.range_start[i]
            end = start + cols.range_dur[i]
            nid = cols.range_name_id[i]
            if thread != current:
                stack.clear()
                current = thread
                op_bounds = ops_index.bounds(thread)
                launch_bounds = launch_index.bounds(thread)
            while stack and stack[-1].end < end:
                stack.pop()
            parent = stack[-1] if stack else None
            path = f"{parent.path}/{display[nid]}" if parent else display[nid]
            in_step = parent.in_step if parent else False
            if is_step_name[nid] and not in_step:
                step_spans.append(_StepSpan(start=start, thread=thread, dur=end - start, name_id=nid))
                in_step = True
            stack.append(_OpenRange(end=end, path=path, in_step=in_step))
            op_lo, op_hi = ops_index.window(op_bounds, start, end)
            launch_lo, launch_hi = launch_index.window(launch_bounds, start, end)
            totals = paths.get(path)
            if totals is None:
                totals = paths[path] = _RangeTotals(path, display[nid], len(stack) - 1, start)
            totals.count += 1
            totals.cpu_ns += end - start
            if op_hi > op_lo:
                wins = [(op_lo, op_hi)]
                busy, span = cols.busy_span(wins)
                totals.gpu_busy_ns += busy
                totals.kernel_ns += cols.window_total(cols.cum_kernel_ns, wins)
                totals.gpu_span_ns += span
                totals.gpu_ops += op_hi - op_lo
            totals.launches += launch_hi - launch_lo
        kept = sorted(paths.values(), key=lambda t: (-t.cpu_ns, t.path))[:_MAX_RANGE_PATHS]
        kept.sort(key=lambda t: (t.first_start, t.depth, t.path))
        rows = [
            RangeStat(
                path=t.path,
                name=t.name,
                depth=t.depth,
                count=t.count,
                cpu_ns=t.cpu_ns,
                gpu_busy_ns=t.gpu_busy_ns if gpu_known else None,
                kernel_ns=t.kernel_ns if gpu_known else None,
                gpu_span_ns=t.gpu_span_ns if gpu_known else None,
                launches=t.launches,
                gpu_ops=t.gpu_ops,
            )
            for t in kept
        ]
        return RangesSection(distinct=len(paths), rows=rows), sorted(step_spans)

    def _steps(self, step_spans: list[_StepSpan], pattern: str) -> tuple[StepsSection, list[Windows]]:
        """The steps section, and per step the windows of its GPU operations in ``ops_by_launch``."""
        cols = self.cols
        n_cat = len(CATEGORIES)
        gpu_known = self.gpu_known
        step_threads = {s.thread for s in step_spans}
        op_windows = _StepWindows(cols.ops_by_launch, step_threads)
        launch_windows = _StepWindows(cols.launches_by_thread, step_threads)
        sync_windows = _StepWindows(cols.syncs_by_thread, step_threads)
        rows: list[StepRow] = []
        step_op_windows: list[Windows] = []
        for index, step in enumerate(step_spans):
            start, thread = step.start, step.thread
            end = start + step.dur
            op_wins = op_windows.find(thread, start, end)
            launch_wins = launch_windows.find(thread, start, end)
            sync_wins = sync_windows.find(thread, start, end)
            step_op_windows.append(op_wins)
            cats: dict[str, int] = {}
            busy = span = kernel_ns = None
            if gpu_known:
                busy, span = cols.busy_span(op_wins)
                kernel_ns = cols.window_total(cols.cum_kernel_ns, op_wins)
                per_cat = cols.categories(op_wins, n_cat)
                cats = {CATEGORIES[j]: v for j, v in enumerate(per_cat) if v}
            name = self.range_name_list[step.name_id]
            lower = name.lower()
            phase = "prefill" if "prefill" in lower else "decode" if "decode" in lower else ""
            rows.append(
                StepRow(
                    index=index,
                    name=name,
                    phase=phase,
                    start_ns=start - self.origin,
                    cpu_ns=step.dur,
                    gpu_busy_ns=busy,
                    gpu_span_ns=span,
                    kernel_ns=kernel_ns,
                    kernels=cols.window_total(cols.cum_kernels, op_wins),
                    launches=sum(hi - lo for lo, hi in launch_wins),
                    launch_api_ns=cols.window_total(cols.cum_launch_ns, launch_wins),
                    sync_ns=cols.window_total(cols.cum_sync_ns, sync_wins),
                    memcpy_bytes=cols.window_total(cols.cum_memcpy_bytes, op_wins),
                    categories=cats,
                )
            )
        cpu = _step_spread([r.cpu_ns for r in rows])
        gpu = _step_spread([r.gpu_busy_ns for r in rows if r.gpu_busy_ns is not None]) if gpu_known else None
        section = StepsSection(
            pattern=pattern,
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
        return section, step_op_windows

    # ------------------------------------------------------------ timeline

    def _timeline(self) -> TimelineSection:
        rows: list[TimelineRow] = []
        stream_keys = list(self.scan.streams)  # (device, stream) by stream id
        limit = self.options.timeline_top if self.options.timeline_top is not None else self.options.top
        for op in self.cols.longest_ops(limit):
            name = self.gpu_name_list[op.name_id]
            device, stream = stream_keys[op.stream_id]
            rows.append(
                TimelineRow(
                    kind=EVENT_KIND[op.kind],
                    name=short_kernel_name(name) if op.kind == GpuOpKind.KERNEL else name,
                    start_ns=op.start - self.origin,
                    dur_ns=op.dur,
                    where=f"device {device} stream {stream}",
                )
            )
        for dur, _arrival, kind, name, start, thread in self.scan.longest_cpu:
            rows.append(
                TimelineRow(kind=kind, name=name, start_ns=start - self.origin, dur_ns=dur, where=f"thread {thread}")
            )
        rows.sort(key=lambda r: (r.start_ns, -r.dur_ns, r.kind, r.name))
        return TimelineSection(rows=rows)

    def _cpu_ops(self) -> CpuOpsSection:
        items = sorted(self.scan.cpu_ops.items(), key=lambda item: (-item[1].total_ns, item[0]))
        rows = [
            CpuOpStat(
                name=name,
                count=stat.count,
                total_ns=stat.total_ns,
                mean_ns=stat.total_ns // stat.count,
                max_ns=stat.max_ns,
            )
            for name, stat in items[: self.options.top]
        ]
        return CpuOpsSection(count=sum(stat.count for stat in self.scan.cpu_ops.values()), rows=rows)
