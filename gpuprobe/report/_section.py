"""What a report section computes from, and what sections share.

A section (a module of :mod:`gpuprobe.report.sections`) imports this module and the table toolkit
(:mod:`gpuprobe.report._tables`), never the builder nor another section:

- :class:`Context`: the options, the scan of one trace and its columns, names and categories, and
  the steps (found in one walk over the ranges); :meth:`Context.section` hands a section the data of
  another, computed once.
- :class:`MergeContext`: the reports of several ranks, for a section's ``merge``.
- :class:`Section`: what a section module declares (its name, compute, tables, merge, diff).
- Helpers: shares, spreads, medians, rows grouped by key, and the rows of a diff.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from gpuprobe._kernel_names import CATEGORIES, categorize_kernel, kernel_family
from gpuprobe._stats import median
from gpuprobe.report._columns import (
    ByThread,
    KernelGroup,
    Spread,
    StreamOverlaps,
    Windows,
    merge_intervals,
    overlap_length,
    quantile,
    spread_of,
)
from gpuprobe.report._columns_numpy import NumpyColumns
from gpuprobe.report._columns_python import PythonColumns
from gpuprobe.report._events import MEMSET, TraceInfo
from gpuprobe.report._scan import EVENT_KIND, GpuOpKind, TraceScan
from gpuprobe.report._tables import Table

__all__ = [
    # what sections read of the scan and its columns, from here only
    "EVENT_KIND",
    "MEMSET",
    "GpuOpKind",
    "KernelGroup",
    "Spread",
    "StreamOverlaps",
    "TraceScan",
    "Windows",
    "merge_intervals",
    "overlap_length",
    "quantile",
    # the context
    "BACKENDS",
    "CAT_INDEX",
    "DEFAULT_STEP_PATTERN",
    "PROFILER_STEP_PATTERN",
    "Columns",
    "Context",
    "DiffRow",
    "MergeContext",
    "Options",
    "RangeTotals",
    "RankPart",
    "Section",
    "StepSpan",
    "StepWindows",
    "diff_row",
    "diff_of_totals",
    "group_by",
    "known_sum",
    "median_int",
    "share",
    "spread_width",
    "step_spread",
]

#: Names of gpuprobe step ranges and common generation phases; ``decode_step`` and ``prefill 3``
#: match, ``decoder_layer`` does not.
DEFAULT_STEP_PATTERN = r"^(?:gpuprobe\.step|decode|prefill|step)(?![A-Za-z])"
#: ``torch.profiler`` step ranges, used when nothing matches the step pattern.
PROFILER_STEP_PATTERN = r"^ProfilerStep#\d+$"
#: Column backends of :class:`Options`.
BACKENDS: tuple[str, ...] = ("auto", "numpy", "python")
#: Category name -> its index in :data:`gpuprobe._kernel_names.CATEGORIES`.
CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
_PYTHON_BELOW = 50_000  # GPU operations + launches + ranges under which "auto" takes the Python twin
_STEP_NUMBER = re.compile(r"#\d+$")

Columns = PythonColumns | NumpyColumns


@dataclasses.dataclass(frozen=True)
class Options:
    """What to compute.

    Attributes:
        top: Rows per table.
        step_pattern: Regular expression (``re.search``) for step range names; ``None`` uses
            :data:`DEFAULT_STEP_PATTERN`, then :data:`PROFILER_STEP_PATTERN` if nothing matches.
        small_ns: Kernels with a mean below this are "small" (default 5 µs, about one launch call).
        sections: Sections to compute; empty means every section shown by default.
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


class StepSpan(NamedTuple):
    """A step: a range matching the step pattern (outermost match only), and the windows of its GPU
    operations in ``ops_by_launch`` (launched from its thread, or from a thread without steps)."""

    index: int
    phase: str
    thread: int
    start: int
    end: int
    op_windows: Windows
    name: str = ""


class _StepStart(NamedTuple):
    """A step range as the walk finds it; sorting sorts steps by start."""

    start: int
    thread: int
    dur: int
    name_id: int


class _OpenRange(NamedTuple):
    """A range on the stack of enclosing ranges while ranges are walked in (thread, start) order.

    ``step`` is the step it lies in (its position in the walk's list of step starts; -1 outside steps),
    ``is_step`` whether it is that step's own range.
    """

    end: int
    path: str
    step: int
    is_step: bool


class RangeTotals:
    """Totals of one range path over its occurrences (GPU figures sum 0 when no GPU operation is known).

    ``step_cpu_ns`` is the path's CPU time in each step that holds it (by step index, as
    :attr:`Context.steps` numbers them); ``in_step_range`` says the path lies directly inside a step's own
    range (a step's component: ``gpuprobe.step#N/forward``).
    """

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
        "step_cpu_ns",
        "in_step_range",
    )

    def __init__(self, path: str, name: str, depth: int, first_start: int, in_step_range: bool = False) -> None:
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
        self.step_cpu_ns: dict[int, int] = {}
        self.in_step_range = in_step_range


class StepWindows:
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


class RangeWalk(NamedTuple):
    """One walk over the ranges: the totals of every range path, and the steps by start."""

    paths: dict[str, RangeTotals]
    steps: list[_StepStart]


def pick_columns(scan: TraceScan, backend: str, cat_of_name: list[int]) -> Columns:
    """The column class for a finished scan: ``python``, ``numpy``, or (``auto``) by the trace's size."""
    size = len(scan.ops) + len(scan.launches) + len(scan.ranges)
    if backend == "auto":
        # why: below this size the Python twin is as fast, and skipping numpy saves its 16 MB import
        backend = "python" if size < _PYTHON_BELOW else "numpy"
    memcpy_cat, memset_cat = CAT_INDEX["memcpy"], CAT_INDEX["memset"]
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


class Context:
    """What the sections of one trace's report compute from.

    Attributes:
        scan: The pass over every event of the trace.
        options: What to compute.
        path: The trace file, as the summary names it.
        info: What the trace says about itself.
        cols: The scan's columns (numpy or the plain-Python twin).
        gpu_names: GPU operation names by id; ``cat_of_name`` their category indexes,
            ``fam_of_name`` their family indexes into ``fam_names``.
        range_names: Range names by id; ``range_display`` as tables show them (``#N`` for numbers).
        gpu_known: Whether the trace holds GPU operations (else GPU figures are ``None``).
        origin: The trace's first time: tables show times relative to it.
    """

    def __init__(
        self,
        scan: TraceScan,
        options: Options,
        path: str,
        info: TraceInfo,
        computes: Mapping[str, Callable[[Context], Any]],
    ) -> None:
        self.scan = scan
        self.options = options
        self.path = path
        self.info = info
        self.gpu_names = list(scan.gpu_names)
        self.range_names = list(scan.range_names)
        self.range_display = [_STEP_NUMBER.sub("#N", n) for n in self.range_names]
        self.cat_of_name = [CAT_INDEX[categorize_kernel(n)] for n in self.gpu_names]
        fam_index: dict[str, int] = {}
        self.fam_of_name = [fam_index.setdefault(kernel_family(n), len(fam_index)) for n in self.gpu_names]
        self.fam_names = list(fam_index)
        self.cols = pick_columns(scan, options.backend, self.cat_of_name)
        self.gpu_known = self.cols.n_ops > 0
        self.origin = scan.first_ns if scan.first_ns is not None else 0
        self._computes = computes
        self._done: dict[str, Any] = {}
        self._busy: set[str] = set()
        self._kernel_groups: list[KernelGroup] | None = None
        self._step_regex: tuple[re.Pattern[str], str] | None = None
        self._walk: RangeWalk | None = None
        self._steps: list[StepSpan] | None = None

    def section(self, name: str) -> Any:
        """The data of section ``name`` (computed once, on first use)."""
        if name not in self._done:
            if name in self._busy:
                raise RuntimeError(f"section {name!r} needs itself")
            self._busy.add(name)
            try:
                self._done[name] = self._computes[name](self)
            finally:
                self._busy.discard(name)
        return self._done[name]

    @property
    def kernel_groups(self) -> list[KernelGroup]:
        """Kernels grouped by name."""
        if self._kernel_groups is None:
            self._kernel_groups = self.cols.kernel_groups()
        return self._kernel_groups

    @property
    def step_regex(self) -> tuple[re.Pattern[str], str]:
        """The step pattern, compiled, and as the steps section names it."""
        if self._step_regex is None:
            pattern = self.options.step_pattern
            if pattern is not None:
                self._step_regex = re.compile(pattern), pattern
            else:
                default = re.compile(DEFAULT_STEP_PATTERN, re.IGNORECASE)
                if any(default.search(n) for n in self.range_names):
                    self._step_regex = default, DEFAULT_STEP_PATTERN
                else:
                    self._step_regex = re.compile(PROFILER_STEP_PATTERN), PROFILER_STEP_PATTERN
        return self._step_regex

    @property
    def range_walk(self) -> RangeWalk:
        """Every range path's totals and the steps (outermost matches of the step pattern), in one walk."""
        if self._walk is None:
            self._walk = self._walk_ranges()
        return self._walk

    @property
    def steps(self) -> list[StepSpan]:
        """The steps by start, each with the windows of its GPU operations."""
        if self._steps is None:
            starts = self.range_walk.steps
            op_windows = StepWindows(self.cols.ops_by_launch, {s.thread for s in starts})
            self._steps = []
            for index, step in enumerate(starts):
                end = step.start + step.dur
                name = self.range_names[step.name_id]
                lower = name.lower()
                phase = "prefill" if "prefill" in lower else "decode" if "decode" in lower else ""
                self._steps.append(StepSpan(
                    index=index, name=name, phase=phase, thread=step.thread, start=step.start, end=end,
                    op_windows=op_windows.find(step.thread, step.start, end),
                ))
        return self._steps

    def _walk_ranges(self) -> RangeWalk:
        cols = self.cols
        ops_index = cols.ops_by_launch
        launch_index = cols.launches_by_thread
        step_regex = self.step_regex[0]
        is_step_name = [bool(step_regex.search(n)) for n in self.range_names]
        display = self.range_display
        paths: dict[str, RangeTotals] = {}
        step_starts: list[_StepStart] = []
        stack: list[_OpenRange] = []  # the ranges enclosing the current one, innermost last
        current = None
        op_bounds = launch_bounds = (0, 0)
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
            step = parent.step if parent else -1
            is_step = is_step_name[nid] and step < 0
            if is_step:
                step = len(step_starts)
                step_starts.append(_StepStart(start=start, thread=thread, dur=end - start, name_id=nid))
            # why: positional arguments, not keywords: 0.09 s less per million ranges (timeit: 0.65 s against 0.74 s)
            stack.append(_OpenRange(end, path, step, is_step))
            op_lo, op_hi = ops_index.window(op_bounds, start, end)
            launch_lo, launch_hi = launch_index.window(launch_bounds, start, end)
            totals = paths.get(path)
            if totals is None:
                totals = paths[path] = RangeTotals(path, display[nid], len(stack) - 1, start,
                                                   in_step_range=parent is not None and parent.is_step)
            totals.count += 1
            totals.cpu_ns += end - start
            if step >= 0:
                totals.step_cpu_ns[step] = totals.step_cpu_ns.get(step, 0) + end - start
            if op_hi > op_lo:
                wins = [(op_lo, op_hi)]
                busy, span = cols.busy_span(wins)
                totals.gpu_busy_ns += busy
                totals.kernel_ns += cols.window_total(cols.cum_kernel_ns, wins)
                totals.gpu_span_ns += span
                totals.gpu_ops += op_hi - op_lo
            totals.launches += launch_hi - launch_lo
        # the steps were numbered as the walk met them (thread by thread); they are indexed by start
        by_start = sorted(range(len(step_starts)), key=step_starts.__getitem__)
        index_of = [0] * len(by_start)
        for index, found in enumerate(by_start):
            index_of[found] = index
        for totals in paths.values():
            if totals.step_cpu_ns:
                totals.step_cpu_ns = {index_of[k]: v for k, v in totals.step_cpu_ns.items()}
        return RangeWalk(paths=paths, steps=[step_starts[k] for k in by_start])


class RankPart(Protocol):
    """One rank's result, as a merge reads it."""

    rank: int
    path: str
    report: Any
    collectives: dict[str, list[int]]


class MergeContext:
    """What a section merges from: the report of each rank (in rank order), and the merged table size.

    Attributes:
        results: Each rank's result (its rank, path, report and collectives' starts).
        reports: Each rank's report.
        source: Where the ranks come from (``distributedInfo.rank``, ``file order``, ...).
        top: Rows per table of the merged report.
    """

    def __init__(self, results: Sequence[RankPart], source: str, top: int) -> None:
        self.results = list(results)
        self.reports = [r.report for r in self.results]
        self.source = source
        self.top = top
        self._gpu_time: int | None = None

    def parts(self, section: str) -> list[Any]:
        """The section's data of every rank that has it."""
        return [part for part in (getattr(rep, section) for rep in self.reports) if part is not None]

    def any_has(self, section: str) -> bool:
        return any(getattr(rep, section) is not None for rep in self.reports)

    @property
    def gpu_time(self) -> int:
        """GPU time of every rank (their categories' totals): what the merged shares are of."""
        if self._gpu_time is None:
            self._gpu_time = sum(c.total_ns for part in self.parts("categories") for c in part.rows)
        return self._gpu_time


@dataclasses.dataclass
class DiffRow:
    """One compared value.

    ``a`` and ``b`` are normalised (per step, per token, or totals); ``delta = b - a`` and
    ``ratio = b / a``. ``*_median`` and ``*_spread`` (p90 - p10) are across steps, where the
    section has per-step values.
    """

    key: str
    metric: str
    a: float | None
    b: float | None
    delta: float | None
    ratio: float | None
    a_median: float | None = None
    a_spread: float | None = None
    b_median: float | None = None
    b_spread: float | None = None


class Section(NamedTuple):
    """What a section module declares: its name and what it does.

    Attributes:
        name: The section's name (the report's field, JSON key and ``--sections`` word).
        tables: ``(data, markdown) -> tables`` to show it.
        compute: ``(context) -> data`` (or ``None`` for none) from one trace; ``None`` for a section
            the builder fills itself (findings) or that only a merge makes (ranks).
        merge: ``(merge context) -> data`` across ranks; ``None``: the merged report has none.
        diff: ``(a, b, units of A, units of B) -> rows`` comparing two reports' data of the section.
        diff_title: The diff table's title.
        diff_cut: The diff shows the largest changes first, ``top`` of them.
        always: Computed whatever sections are asked for (the summary).
        default: Computed when no section is named; otherwise only when named.
        table_last: Its table comes after every other section's.
    """

    name: str
    tables: Callable[[Any, bool], list[Table]]
    compute: Callable[[Context], Any] | None = None
    merge: Callable[[MergeContext], Any] | None = None
    diff: Callable[[Any, Any, float, float], list[DiffRow]] | None = None
    diff_title: str = ""
    diff_cut: bool = False
    always: bool = False
    default: bool = True
    table_last: bool = False


# ---------------------------------------------------------------------------------------- helpers


def share(part: int, whole: int) -> float:
    """``part / whole``, 0 when ``whole`` is 0.

    Example:
        >>> share(1, 4), share(3, 0)
        (0.25, 0.0)
    """
    return part / whole if whole else 0.0


def step_spread(values: list[int]) -> Spread | None:
    """The p10, median and p90 of per-step values (``None`` without steps)."""
    return spread_of(sorted(values)) if values else None


def median_int(values: list[int]) -> int:
    """The median, rounded to an integer.

    Example:
        >>> median_int([1, 2, 3, 4])
        2
    """
    return int(round(median(values)))


def group_by(rows: Iterable[Any], key: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    """Rows by key, in first-seen order of the keys.

    Example:
        >>> group_by([3, 4, 5], lambda n: n % 2)
        {1: [3, 5], 0: [4]}
    """
    out: dict[Any, list[Any]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def known_sum(values: Iterable[int | None]) -> int | None:
    """The sum of the values that are known; ``None`` if none is.

    Example:
        >>> known_sum([1, None, 2]), known_sum([None])
        (3, None)
    """
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def diff_row(key: str, metric: str, a: float | None, b: float | None, ua: float, ub: float, **extra: Any) -> DiffRow:
    """A compared value: ``a`` over ``ua`` units of A against ``b`` over ``ub`` units of B."""
    na = a / ua if a is not None else None
    nb = b / ub if b is not None else None
    delta = nb - na if na is not None and nb is not None else None
    ratio = nb / na if na and nb is not None else None
    return DiffRow(key=key, metric=metric, a=na, b=nb, delta=delta, ratio=ratio, **extra)


def spread_width(p10: int | None, p90: int | None) -> float | None:
    """``p90 - p10`` as a float, ``None`` if either is unknown."""
    return float(p90 - p10) if p10 is not None and p90 is not None else None


def _total(stat: Any) -> int:
    return stat.total_ns if stat is not None else 0


def _median(stat: Any) -> float | None:
    return float(stat.step_median_ns) if stat is not None and stat.step_median_ns is not None else None


def _width(stat: Any) -> float | None:
    return spread_width(stat.step_p10_ns, stat.step_p90_ns) if stat is not None else None


def diff_of_totals(key: str, x: Any, y: Any, ua: float, ub: float) -> DiffRow:
    """The total time of a row (``total_ns``, with per-step ``step_median_ns``, ``step_p10_ns`` and
    ``step_p90_ns``) in A against B; a row absent from one side counts 0 there."""
    return diff_row(
        key, "ns", _total(x), _total(y), ua, ub,
        a_median=_median(x), a_spread=_width(x), b_median=_median(y), b_spread=_width(y),
    )
