"""The builder: :func:`analyze` reads a trace in one streaming pass, then :func:`build_report`
computes the sections of the registry (:mod:`gpuprobe.report.sections`) from it.

The pass (:class:`~gpuprobe.report._scan.TraceScan`) keeps compact columns and per-name
aggregates; each section computes from a :class:`~gpuprobe.report._section.Context` over them
(numpy columns for large traces, their plain-Python twin for small ones). With findings asked for,
every section is computed, the rules read them and the evidence of :mod:`gpuprobe.report._evidence`,
and the sections not asked for are dropped.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuprobe.errors import ConfigError
from gpuprobe.report._events import TraceInfo
from gpuprobe.report._evidence import gather
from gpuprobe.report._executors import usable_cpus
from gpuprobe.report._findings import evaluate, parse_thresholds
from gpuprobe.report._scan import TraceScan
from gpuprobe.report._section import BACKENDS, DEFAULT_STEP_PATTERN, PROFILER_STEP_PATTERN, Context, Options
from gpuprobe.report.loaders import Trace, load
from gpuprobe.report.schema import Report
from gpuprobe.report.sections import REGISTRY, SECTIONS

__all__ = ["analyze", "build_report", "Options", "DEFAULT_STEP_PATTERN", "PROFILER_STEP_PATTERN", "BACKENDS"]

_COMPUTES = {s.name: s.compute for s in REGISTRY if s.compute is not None}


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
    jobs: int | None = None,
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
        jobs: Processes that may read the trace at once: with 2 or more, a plain kineto JSON trace of
            256 MB or more is read by two (its head here, its tail in a second process; the same report).
            Default: the CPUs this process may use.

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
        # three times the rows shown: the timeline lists a call once, leaving out the events nested in it
        keep_longest=min(3 * top, 30_000) if wants_timeline else 1,
    )
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"jobs must be a whole number of at least 1, not {jobs!r}")
    trace.feed(scan, progress, processes=jobs if jobs is not None else usable_cpus())
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
    info = info if info is not None else TraceInfo("kineto")
    ctx = Context(scan, options, path, info, _COMPUTES)
    named = options.sections
    # findings read every section: with findings asked for, all are computed, and those not asked
    # for are dropped once the rules have run
    findings = not named or "findings" in named
    computed = {
        s.name: ctx.section(s.name)
        for s in REGISTRY
        if s.compute is not None and (s.always or s.name in named or (s.default and (findings or not named)))
    }
    report = Report(**computed)
    if findings:
        step_regex = ctx.step_regex[0]
        evidence = gather(
            scan,
            ctx.cols,
            ctx.steps,
            ctx.gpu_names,
            ctx.range_display,
            step_name_ids={i for i, n in enumerate(ctx.range_names) if step_regex.search(n)},
            source=info.source,
        )
        report.findings = evaluate(report, evidence, dict(options.thresholds or parse_thresholds(None)))
        for section in SECTIONS:
            if section != "summary" and not options.wants(section):
                setattr(report, section, None)
    return report
