"""Analyses: one streaming pass into compact columns, then vectorised sections.

The pass keeps, per GPU operation, launch call, sync call and range, a few 64-bit integers in
:class:`array.array` columns (about 90 bytes per GPU operation with its launch), and per CPU
operator or API name a running aggregate; nothing else of an event outlives it. The columns are
what the correlation join, the per-range unions and exact medians need; everything after the pass
is done by the column classes of :mod:`gpuprobe.report._columns` (numpy for large traces, their
plain-Python twin for small ones).
"""

from __future__ import annotations

import dataclasses
import heapq
import re
import warnings
from array import array
from collections.abc import Iterable
from typing import Any

from gpuprobe.report._columns import NumpyColumns, PythonColumns, quantile, union_of
from gpuprobe.report._events import CPU_OP, KERNEL, MEMCPY, MEMSET, RANGE, RUNTIME, Event
from gpuprobe.report._names import CATEGORIES, categorize_kernel, kernel_family, launch_api_kind, short_kernel_name
from gpuprobe.report.model import (
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

__all__ = ["Collector", "Options", "DEFAULT_STEP_PATTERN", "PROFILER_STEP_PATTERN", "BACKENDS", "union_ns"]

#: Names of gpuprobe step ranges and common generation phases; ``decode_step`` and ``prefill 3``
#: match, ``decoder_layer`` does not.
DEFAULT_STEP_PATTERN = r"^(?:gpuprobe\.step|decode|prefill|step)(?![A-Za-z])"
#: ``torch.profiler`` step ranges, used when nothing matches the step pattern.
PROFILER_STEP_PATTERN = r"^ProfilerStep#\d+$"
#: Column backends of :class:`Options`.
BACKENDS: tuple[str, ...] = ("auto", "numpy", "python")
_GPU_CODE = {KERNEL: 0, MEMCPY: 1, MEMSET: 2}
_LAUNCH_CODE = {"kernel": 0, "memcpy": 1, "memset": 2}
_CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
#: (name id, count, total, median, min, max) of the kernels of one name
Group = tuple[int, int, int, int, int, int]
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
    """

    top: int = 20
    step_pattern: str | None = None
    small_ns: int = 5_000
    sections: tuple[str, ...] = ()
    backend: str = "auto"

    def wants(self, section: str) -> bool:
        return not self.sections or section in self.sections


def union_ns(starts: Iterable[int], ends: Iterable[int]) -> int:
    """Total length of the union of intervals ``[start, end)``.

    Args:
        starts: Start times.
        ends: End times, same length.

    Returns:
        Covered nanoseconds; overlaps count once.

    Example:
        >>> union_ns([0, 5, 20], [10, 12, 25])
        17
    """
    return union_of(list(zip(starts, ends)))


def _q3(values: list[int]) -> tuple[int | None, int | None, int | None]:
    """p10, median, p90 (linear interpolation, rounded to whole ns)."""
    if not values:
        return None, None, None
    ordered = sorted(values)
    p10, p50, p90 = (int(round(quantile(ordered, q))) for q in (0.1, 0.5, 0.9))
    return p10, p50, p90


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _where(pid: object, tid: object) -> str:
    return f"{pid}/{tid}"


class Collector:
    """Streaming pass over events into compact columns and per-name aggregates.

    Example:
        >>> from gpuprobe.report._events import Event
        >>> c = Collector()
        >>> c.consume([Event("kernel", "k", 0, 10, 0, 7, 1), Event("runtime", "cudaLaunchKernel", -5, 2, 1, 1, 1)])
        >>> c.build("x", Options()).summary.kernel_ns
        10
    """

    def __init__(self, correlation_by_process: bool = False, keep_long: int = 20) -> None:
        self.by_process = correlation_by_process
        self.keep_long = max(1, keep_long)
        self.gpu_names: dict[str, int] = {}
        self.other_names: dict[str, int] = {}
        self.threads: dict[tuple[object, object], int] = {}
        self.streams: dict[tuple[int, int], int] = {}
        self.dirs: dict[str, int] = {}
        # Why typed arrays of the narrowest width: they hold one entry per GPU operation and launch
        # of traces up to several GB; times, byte counts and correlation keys need 64 bits, indexes
        # into the name/thread/stream tables fit 32 bits ("i"), copy directions 16 ("h"), kinds 8 ("b").
        # GPU operations
        self.g_kind = array("b")
        self.g_name = array("i")
        self.g_start = array("q")
        self.g_dur = array("q")
        self.g_corr = array("q")
        self.g_bytes = array("q")
        self.g_dir = array("h")
        self.g_where = array("i")
        # launch calls (kernel, memcpy, memset)
        self.l_kind = array("b")
        self.l_start = array("q")
        self.l_dur = array("q")
        self.l_corr = array("q")
        self.l_thread = array("i")
        # sync calls
        self.s_start = array("q")
        self.s_dur = array("q")
        self.s_thread = array("i")
        # ranges
        self.r_name = array("i")
        self.r_start = array("q")
        self.r_dur = array("q")
        self.r_thread = array("i")
        self.api: dict[str, list[int]] = {}
        self.cpu: dict[str, list[int]] = {}
        self.long_cpu: list[tuple[int, int, str, str, int, str]] = []
        self.counts: dict[str, int] = {}
        self.first_ns: int | None = None
        self.last_ns: int | None = None

    def consume(self, events: Iterable[Event]) -> None:
        """Fold events into the columns and aggregates (any order)."""
        gpu_names = self.gpu_names
        other_names = self.other_names
        threads = self.threads
        streams = self.streams
        dirs = self.dirs
        counts = self.counts
        api = self.api
        cpu = self.cpu
        long_cpu = self.long_cpu
        keep_long = self.keep_long
        by_process = self.by_process
        g_kind, g_name, g_start, g_dur = self.g_kind.append, self.g_name.append, self.g_start.append, self.g_dur.append
        g_corr, g_bytes, g_dir, g_where = (
            self.g_corr.append,
            self.g_bytes.append,
            self.g_dir.append,
            self.g_where.append,
        )
        l_kind, l_start, l_dur = self.l_kind.append, self.l_start.append, self.l_dur.append
        l_corr, l_thread = self.l_corr.append, self.l_thread.append
        s_start, s_dur, s_thread = self.s_start.append, self.s_dur.append, self.s_thread.append
        r_name, r_start, r_dur, r_thread = (
            self.r_name.append,
            self.r_start.append,
            self.r_dur.append,
            self.r_thread.append,
        )
        first: int = self.first_ns if self.first_ns is not None else 1 << 62
        last: int = self.last_ns if self.last_ns is not None else -(1 << 62)
        seq = len(long_cpu)
        gpu_code = _GPU_CODE
        launch_code = _LAUNCH_CODE
        for ev in events:
            kind = ev.kind
            start = ev.start_ns
            dur = ev.dur_ns
            if start < first:
                first = start
            if start + dur > last:
                last = start + dur
            counts[kind] = counts.get(kind, 0) + 1
            code = gpu_code.get(kind)
            if code is not None:
                name = ev.name
                nid = gpu_names.get(name)
                if nid is None:
                    nid = gpu_names[name] = len(gpu_names)
                corr = ev.correlation
                if by_process and 0 <= corr < 0x80000000 and type(ev.pid) is int:
                    corr |= (ev.pid & 0x3FFFFFFF) << 32
                g_kind(code)
                g_name(nid)
                g_start(start)
                g_dur(dur)
                g_corr(corr)
                g_bytes(ev.nbytes)
                direction = ev.direction
                did = dirs.get(direction)
                if did is None:
                    did = dirs[direction] = len(dirs)
                g_dir(did)
                where = (ev.device, ev.stream)
                sid = streams.get(where)
                if sid is None:
                    sid = streams[where] = len(streams)
                g_where(sid)
            elif kind == RUNTIME or kind == CPU_OP:
                # Runtime calls and CPU operators: count, total and longest per name, and the
                # longest events overall. Inline, not a helper: this loop runs once per event.
                name = ev.name
                table = api if kind == RUNTIME else cpu
                agg = table.get(name)
                if agg is None:
                    table[name] = [1, dur, dur]
                else:
                    agg[0] += 1
                    agg[1] += dur
                    if dur > agg[2]:
                        agg[2] = dur
                if len(long_cpu) < keep_long:
                    seq += 1
                    heapq.heappush(long_cpu, (dur, seq, kind, name, start, _where(ev.pid, ev.tid)))
                elif dur > long_cpu[0][0]:
                    seq += 1
                    heapq.heapreplace(long_cpu, (dur, seq, kind, name, start, _where(ev.pid, ev.tid)))
                if kind == CPU_OP:
                    continue
                api_kind = launch_api_kind(name)
                key = (ev.pid, ev.tid)
                tid = threads.get(key)
                if tid is None:
                    tid = threads[key] = len(threads)
                lc = launch_code.get(api_kind)
                if lc is not None:
                    corr = ev.correlation
                    if by_process and 0 <= corr < 0x80000000 and type(ev.pid) is int:
                        corr |= (ev.pid & 0x3FFFFFFF) << 32
                    l_kind(lc)
                    l_start(start)
                    l_dur(dur)
                    l_corr(corr)
                    l_thread(tid)
                elif api_kind == "sync":
                    s_start(start)
                    s_dur(dur)
                    s_thread(tid)
            elif kind == RANGE:
                name = ev.name
                nid = other_names.get(name)
                if nid is None:
                    nid = other_names[name] = len(other_names)
                key = (ev.pid, ev.tid)
                tid = threads.get(key)
                if tid is None:
                    tid = threads[key] = len(threads)
                r_name(nid)
                r_start(start)
                r_dur(dur)
                r_thread(tid)
        if counts:
            self.first_ns, self.last_ns = first, last

    # ------------------------------------------------------------------ build

    def build(
        self,
        path: str,
        options: Options,
        source: str = "kineto",
        devices: list[str] | None = None,
        base_time_ns: int | None = None,
        skipped_events: int = 0,
        notes: list[str] | None = None,
    ) -> Report:
        """Compute the report sections from what :meth:`consume` gathered."""
        return _Builder(self, options).build(path, source, devices or [], base_time_ns, skipped_events, notes or [])


def _columns(c: Collector, backend: str, cat_of_name: list[int]) -> PythonColumns | NumpyColumns:
    size = len(c.g_kind) + len(c.l_start) + len(c.r_start)
    if backend == "auto":
        # why: below this size the Python twin is as fast, and skipping numpy saves its 16 MB import
        backend = "python" if size < _PYTHON_BELOW else "numpy"
    memcpy_cat, memset_cat = _CAT_INDEX["memcpy"], _CAT_INDEX["memset"]
    if backend == "numpy":
        try:
            return NumpyColumns(c, cat_of_name, memcpy_cat, memset_cat)
        except ImportError:
            if size >= _PYTHON_BELOW:
                warnings.warn(
                    "numpy is not installed: a large trace is analysed in plain Python (slower, more "
                    "memory); pip install 'gpuprobe[report]'",
                    stacklevel=3,
                )
    return PythonColumns(c, cat_of_name, memcpy_cat, memset_cat)


class _Builder:
    """Turns a :class:`Collector` into a :class:`Report` through one of the column classes."""

    def __init__(self, c: Collector, options: Options) -> None:
        self.c = c
        self.o = options
        self.gpu_name_list = list(c.gpu_names)
        self.other_name_list = list(c.other_names)
        self.cat_of_name = [_CAT_INDEX[categorize_kernel(n)] for n in self.gpu_name_list]
        fam_index: dict[str, int] = {}
        self.fam_of_name = [fam_index.setdefault(kernel_family(n), len(fam_index)) for n in self.gpu_name_list]
        self.fam_names = list(fam_index)
        self.cols = _columns(c, options.backend, self.cat_of_name)
        self.gpu_known = self.cols.n_gpu > 0
        self.origin = c.first_ns if c.first_ns is not None else 0
        self.step_family_q: dict[int, tuple[int, int, int]] = {}

    def build(
        self, path: str, source: str, devices: list[str], base_time_ns: int | None, skipped: int, notes: list[str]
    ) -> Report:
        o = self.o
        c = self.c
        cols = self.cols
        groups = cols.kernel_groups()
        ranges, steps = self._ranges_and_steps()
        busy = cols.union_all() if self.gpu_known else None
        span = (c.last_ns - c.first_ns) if c.first_ns is not None and c.last_ns is not None else 0
        summary = Summary(
            path=path,
            source=source,
            devices=devices,
            base_time_ns=base_time_ns,
            span_ns=int(span),
            events={k: c.counts[k] for k in sorted(c.counts)},
            skipped_events=skipped,
            kernel_count=cols.kernel_count(),
            kernel_ns=cols.kernel_total() if self.gpu_known else None,
            gpu_op_count=cols.n_gpu,
            gpu_busy_ns=busy,
            gpu_busy_share=(busy / span if span else None) if busy is not None else None,
            launch_count=cols.n_launch,
            launch_api_ns=cols.launch_api_total(),
            step_count=len(steps.rows),
            warnings=self._warnings(skipped, notes, steps),
        )
        report = Report(summary=summary)
        if o.wants("kernels"):
            report.kernels = self._kernels_section(groups, lambda cat: True)
        if o.wants("categories"):
            report.categories = self._categories(steps)
        if o.wants("families"):
            report.families = self._families(groups)
        if o.wants("non_gemm"):
            report.non_gemm = self._kernels_section(groups, lambda cat: cat != "gemm")
        if o.wants("attention"):
            report.attention = self._kernels_section(groups, lambda cat: cat == "attention")
        if o.wants("launches"):
            report.launches = self._launches(steps)
        if o.wants("memory"):
            report.memory = self._memory()
        if o.wants("ranges"):
            report.ranges = ranges
        if o.wants("steps"):
            report.steps = steps
        if o.wants("small_ops"):
            report.small_ops = self._small_ops(groups)
        if o.wants("timeline"):
            report.timeline = self._timeline()
        if o.wants("cpu_ops"):
            report.cpu_ops = self._cpu_ops()
        return report

    def _warnings(self, skipped: int, notes: list[str], steps: StepsSection) -> list[str]:
        out: list[str] = []
        n_launch = self.cols.n_launch
        n_gpu = self.cols.n_gpu
        if n_launch and not n_gpu:
            out.append(
                f"broken capture: {n_launch} launch calls but no kernel, memcpy or memset records; the GPU "
                "side of the trace is missing (dropped CUPTI activity records, or CUDA not profiled), so GPU "
                "time is unknown, not 0 %"
            )
        elif not n_gpu:
            out.append("no GPU activity in this trace (a CPU-only capture); GPU figures are left empty")
        else:
            without_launch, linked = self.cols.join_counts()
            if without_launch and without_launch * 10 > n_gpu:
                out.append(
                    f"{without_launch} of {n_gpu} GPU operations have no launch record with the same "
                    "correlation id; they count in totals but not in ranges or steps"
                )
            if n_launch and (n_launch - linked) * 10 > n_launch:
                out.append(
                    f"{n_launch - linked} of {n_launch} launch calls have no GPU record: GPU activity records "
                    "may have been dropped"
                )
        if skipped:
            out.append(f"{skipped} malformed events were left out")
        out.extend(notes)
        if not steps.rows:
            out.append(f"no range matched the step pattern {steps.pattern!r}; the per-step table is empty")
        return out

    # -------------------------------------------------------------- kernels

    def _kernel_stat(self, g: Group, whole: int) -> KernelStat:
        nid, count, total, median, low, high = g
        name = self.gpu_name_list[nid]
        return KernelStat(
            name=name,
            short_name=short_kernel_name(name),
            category=categorize_kernel(name),
            count=count,
            total_ns=total,
            mean_ns=total // count,
            median_ns=median,
            min_ns=low,
            max_ns=high,
            share=_share(total, whole),
        )

    def _kernels_section(self, groups: list[Group], keep: Any) -> KernelsSection:
        whole = sum(g[2] for g in groups)
        chosen = [g for g in groups if keep(CATEGORIES[self.cat_of_name[g[0]]])]
        chosen.sort(key=lambda g: (-g[2], self.gpu_name_list[g[0]]))
        return KernelsSection(
            total_ns=sum(g[2] for g in chosen),
            count=sum(g[1] for g in chosen),
            distinct=len(chosen),
            rows=[self._kernel_stat(g, whole) for g in chosen[: self.o.top]],
        )

    def _small_ops(self, groups: list[Group]) -> SmallOpsSection:
        threshold = self.o.small_ns
        whole_ns = sum(g[2] for g in groups)
        whole_n = sum(g[1] for g in groups)
        small = [g for g in groups if g[2] < g[1] * threshold]
        small.sort(key=lambda g: (-g[1], -g[2], self.gpu_name_list[g[0]]))
        n = sum(g[1] for g in small)
        t = sum(g[2] for g in small)
        return SmallOpsSection(
            threshold_ns=threshold,
            count=n,
            count_share=_share(n, whole_n),
            total_ns=t,
            time_share=_share(t, whole_ns),
            rows=[self._kernel_stat(g, whole_ns) for g in small[: self.o.top]],
        )

    def _families(self, groups: list[Group]) -> FamiliesSection:
        whole = sum(g[2] for g in groups)
        agg: dict[int, list[int]] = {}
        for g in groups:
            a = agg.setdefault(self.fam_of_name[g[0]], [0, 0, 0])
            a[0] += 1
            a[1] += g[1]
            a[2] += g[2]
        order = sorted(agg, key=lambda f: (-agg[f][2], self.fam_names[f]))[: self.o.top]
        rows = []
        for f in order:
            variants, count, total = agg[f]
            q = self.step_family_q.get(f, (None, None, None))
            name = self.fam_names[f]
            rows.append(
                FamilyStat(
                    name, categorize_kernel(name), variants, count, total, _share(total, whole), q[1], q[0], q[2]
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
            q: tuple[int | None, int | None, int | None] = (None, None, None)
            if steps.rows and self.gpu_known:
                q = _q3([r.categories.get(cat, 0) for r in steps.rows])
            rows.append(CategoryStat(cat, counts[i], totals[i], _share(totals[i], whole), q[1], q[0], q[2]))
        rows.sort(key=lambda r: (-r.total_ns, r.category))
        other = next((r.total_ns for r in rows if r.category == "other"), 0)
        return CategoriesSection(total_ns=whole, other_share=_share(other, whole), rows=rows)

    # ------------------------------------------------------------ launches

    def _launches(self, steps: StepsSection) -> LaunchesSection:
        cols = self.cols
        delay_n, delay_mean, delay_median, delay_p90, delay_max = cols.delay_stats()
        without_launch, linked = cols.join_counts()
        apis = sorted(self.c.api.items(), key=lambda kv: (-kv[1][1], kv[0]))[: self.o.top]
        per_step = None
        if steps.rows:
            launches = sorted(r.launches for r in steps.rows)
            per_step = quantile(launches, 0.5)
        return LaunchesSection(
            launch_count=cols.n_launch,
            api_ns=cols.launch_api_total(),
            sync_count=cols.n_sync,
            sync_ns=int(cols.cum["sync_ns"][-1]),
            per_step_median=per_step,
            delay_count=delay_n,
            delay_mean_ns=delay_mean,
            delay_median_ns=delay_median,
            delay_p90_ns=delay_p90,
            delay_max_ns=delay_max,
            launches_without_gpu_op=cols.n_launch - linked,
            gpu_ops_without_launch=without_launch,
            apis=[ApiStat(name, launch_api_kind(name), a[0], a[1], a[1] // a[0], a[2]) for name, a in apis],
        )

    def _memory(self) -> MemorySection:
        dir_names = list(self.c.dirs)
        rows = []
        for kind, d, count, nbytes, total_ns in self.cols.memory_groups():
            kind_name = MEMCPY if kind == 1 else MEMSET
            direction = dir_names[d] or ("Device" if kind_name == MEMSET else "unknown")
            rows.append(
                MemOpStat(kind_name, direction, count, nbytes, total_ns, nbytes / total_ns if total_ns else None)
            )
        rows.sort(key=lambda r: (-r.total_ns, r.kind, r.direction))
        return MemorySection(total_bytes=sum(r.bytes for r in rows), total_ns=sum(r.total_ns for r in rows), rows=rows)

    # --------------------------------------------------------------- ranges

    def _step_regex(self) -> tuple[re.Pattern[str], str]:
        if self.o.step_pattern is not None:
            return re.compile(self.o.step_pattern), self.o.step_pattern
        default = re.compile(DEFAULT_STEP_PATTERN, re.IGNORECASE)
        if any(default.search(n) for n in self.other_name_list):
            return default, DEFAULT_STEP_PATTERN
        return re.compile(PROFILER_STEP_PATTERN), PROFILER_STEP_PATTERN

    def _ranges_and_steps(self) -> tuple[RangesSection, StepsSection]:
        cols = self.cols
        regex, pattern = self._step_regex()
        is_step_name = [bool(regex.search(n)) for n in self.other_name_list]
        display = [_STEP_NUMBER.sub("#N", n) for n in self.other_name_list]
        paths: dict[str, list[Any]] = {}
        step_rows: list[tuple[int, int, int, int]] = []  # (start, thread, dur, name)
        stack: list[tuple[int, str, bool]] = []  # (end, path, inside a step)
        current = None
        m_bounds = l_bounds = (0, 0)
        gpu_known = self.gpu_known
        for i in cols.range_order():
            thread = cols.r_thread[i]
            start = cols.r_start[i]
            end = start + cols.r_dur[i]
            nid = cols.r_name[i]
            if thread != current:
                stack.clear()
                current = thread
                m_bounds = cols.bounds("m", thread)
                l_bounds = cols.bounds("l", thread)
            while stack and stack[-1][0] < end:
                stack.pop()
            parent = stack[-1] if stack else None
            path = f"{parent[1]}/{display[nid]}" if parent else display[nid]
            in_step = parent[2] if parent else False
            if is_step_name[nid] and not in_step:
                step_rows.append((start, thread, end - start, nid))
                in_step = True
            stack.append((end, path, in_step))
            m_win = [w for w in [cols.window("m", m_bounds, start, end)] if w[1] > w[0]]
            l_lo, l_hi = cols.window("l", l_bounds, start, end)
            agg = paths.get(path)
            if agg is None:
                # path, name, depth, count, cpu, busy, kernel, span, launches, gpu ops, first start
                agg = paths[path] = [path, display[nid], len(stack) - 1, 0, 0, 0, 0, 0, 0, 0, start]
            agg[3] += 1
            agg[4] += end - start
            if m_win:
                busy, span = cols.busy_span(m_win)
                agg[5] += busy
                agg[6] += cols.total("kernel_ns", m_win)
                agg[7] += span
                agg[9] += m_win[0][1] - m_win[0][0]
            agg[8] += l_hi - l_lo
        kept = sorted(paths.values(), key=lambda a: (-a[4], a[0]))[:_MAX_RANGE_PATHS]
        kept.sort(key=lambda a: (a[10], a[2], a[0]))
        rows = [
            RangeStat(
                path=a[0],
                name=a[1],
                depth=a[2],
                count=a[3],
                cpu_ns=a[4],
                gpu_busy_ns=a[5] if gpu_known else None,
                kernel_ns=a[6] if gpu_known else None,
                gpu_span_ns=a[7] if gpu_known else None,
                launches=a[8],
                gpu_ops=a[9],
            )
            for a in kept
        ]
        return RangesSection(distinct=len(paths), rows=rows), self._steps(sorted(step_rows), pattern)

    def _steps(self, step_rows: list[tuple[int, int, int, int]], pattern: str) -> StepsSection:
        cols = self.cols
        n_cat = len(CATEGORIES)
        gpu_known = self.gpu_known
        # Work launched from a thread without step ranges (a second launching thread, for
        # instance) belongs to the step whose time window holds the launch.
        step_threads = {thread for _, thread, _, _ in step_rows}
        others = {t: [cols.bounds(t, x) for x in cols.threads(t) if x not in step_threads] for t in ("m", "l", "s")}
        own: dict[tuple[str, int], tuple[int, int]] = {}

        def windows(table: str, thread: int, start: int, end: int) -> list[tuple[int, int]]:
            key = (table, thread)
            if key not in own:
                own[key] = cols.bounds(table, thread)
            found = [cols.window(table, own[key], start, end)]
            found += [cols.window(table, b, start, end) for b in others[table]]
            return [(lo, hi) for lo, hi in found if hi > lo]

        rows: list[StepRow] = []
        step_wins = []
        for index, (start, thread, dur, nid) in enumerate(step_rows):
            end = start + dur
            m_wins = windows("m", thread, start, end)
            l_wins = windows("l", thread, start, end)
            s_wins = windows("s", thread, start, end)
            step_wins.append(m_wins)
            cats: dict[str, int] = {}
            busy = span = kernel_ns = None
            if gpu_known:
                busy, span = cols.busy_span(m_wins)
                kernel_ns = cols.total("kernel_ns", m_wins)
                per_cat = cols.categories(m_wins, n_cat)
                cats = {CATEGORIES[j]: v for j, v in enumerate(per_cat) if v}
            name = self.other_name_list[nid]
            lower = name.lower()
            phase = "prefill" if "prefill" in lower else "decode" if "decode" in lower else ""
            rows.append(
                StepRow(
                    index=index,
                    name=name,
                    phase=phase,
                    start_ns=start - self.origin,
                    cpu_ns=dur,
                    gpu_busy_ns=busy,
                    gpu_span_ns=span,
                    kernel_ns=kernel_ns,
                    kernels=cols.total("kernels", m_wins),
                    launches=sum(hi - lo for lo, hi in l_wins),
                    launch_api_ns=cols.total("launch_ns", l_wins),
                    sync_ns=cols.total("sync_ns", s_wins),
                    memcpy_bytes=cols.total("memcpy_bytes", m_wins),
                    categories=cats,
                )
            )
        if rows and gpu_known:
            self.step_family_q = cols.family_quantiles(step_wins, self.fam_of_name, len(self.fam_names))
        cpu_q = _q3([r.cpu_ns for r in rows])
        gpu_q = _q3([r.gpu_busy_ns for r in rows if r.gpu_busy_ns is not None]) if gpu_known else (None, None, None)
        return StepsSection(
            pattern=pattern,
            count=len(rows),
            cpu_median_ns=cpu_q[1],
            cpu_p10_ns=cpu_q[0],
            cpu_p90_ns=cpu_q[2],
            gpu_busy_median_ns=gpu_q[1],
            gpu_busy_p10_ns=gpu_q[0],
            gpu_busy_p90_ns=gpu_q[2],
            launches_median=quantile(sorted(r.launches for r in rows), 0.5) if rows else None,
            rows=rows,
        )

    # ------------------------------------------------------------ timeline

    def _timeline(self) -> TimelineSection:
        rows: list[TimelineRow] = []
        where_names = {v: k for k, v in self.c.streams.items()}
        kinds = (KERNEL, MEMCPY, MEMSET)
        for kind, nid, start, dur, where in self.cols.top_gpu(self.o.top):
            name = self.gpu_name_list[nid]
            device, stream = where_names[where]
            rows.append(
                TimelineRow(
                    kind=kinds[kind],
                    name=short_kernel_name(name) if kind == 0 else name,
                    start_ns=start - self.origin,
                    dur_ns=dur,
                    where=f"device {device} stream {stream}",
                )
            )
        for dur, _seq, kind_name, name, start, where_cpu in self.c.long_cpu:
            rows.append(
                TimelineRow(
                    kind=kind_name, name=name, start_ns=start - self.origin, dur_ns=dur, where=f"thread {where_cpu}"
                )
            )
        rows.sort(key=lambda r: (r.start_ns, -r.dur_ns, r.kind, r.name))
        return TimelineSection(rows=rows)

    def _cpu_ops(self) -> CpuOpsSection:
        items = sorted(self.c.cpu.items(), key=lambda kv: (-kv[1][1], kv[0]))
        rows = [CpuOpStat(name, a[0], a[1], a[1] // a[0], a[2]) for name, a in items[: self.o.top]]
        return CpuOpsSection(count=sum(a[0] for a in self.c.cpu.values()), rows=rows)
