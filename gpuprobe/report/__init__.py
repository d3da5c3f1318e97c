"""Reports from PyTorch profiler (kineto) and Nsight Systems traces, read in one streaming pass.

trace file → :func:`load` (streaming loader) → :class:`Event` (typed, integer ns) →
:func:`analyze` (sections) → :class:`Report` (dataclasses, JSON-ready) → :func:`render`
(text, Markdown, JSON, CSV) or :func:`plot` (PNG).

Example:
    >>> from gpuprobe.report import analyze, render
    >>> report = analyze("tests/data/kineto_min.json", top=5)  # doctest: +SKIP
    >>> print(render(report, "md"))  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuprobe.report._errors import ReportInputError
from gpuprobe.report._events import Event, us_to_ns
from gpuprobe.report._names import CATEGORIES, categorize_kernel, kernel_family, short_kernel_name

if TYPE_CHECKING:
    from gpuprobe.report._analysis import BACKENDS, DEFAULT_STEP_PATTERN, PROFILER_STEP_PATTERN
    from gpuprobe.report._diff import DiffReport, diff
    from gpuprobe.report._render import plot, render
    from gpuprobe.report.loaders import Trace, load
    from gpuprobe.report.model import SECTIONS, Report

# why: categorize_kernel is also used on the live path; the model, loaders and analyses load on
# first use, so importing it costs about 6 ms instead of 65 ms
_LAZY = {
    "BACKENDS": "gpuprobe.report._analysis",
    "DEFAULT_STEP_PATTERN": "gpuprobe.report._analysis",
    "PROFILER_STEP_PATTERN": "gpuprobe.report._analysis",
    "DiffReport": "gpuprobe.report._diff",
    "diff": "gpuprobe.report._diff",
    "plot": "gpuprobe.report._render",
    "render": "gpuprobe.report._render",
    "Trace": "gpuprobe.report.loaders",
    "load": "gpuprobe.report.loaders",
    "Report": "gpuprobe.report.model",
    "SECTIONS": "gpuprobe.report.model",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuprobe.report' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BACKENDS",
    "CATEGORIES",
    "DEFAULT_STEP_PATTERN",
    "PROFILER_STEP_PATTERN",
    "SECTIONS",
    "DiffReport",
    "Event",
    "Report",
    "ReportInputError",
    "Trace",
    "analyze",
    "categorize_kernel",
    "diff",
    "kernel_family",
    "load",
    "plot",
    "render",
    "short_kernel_name",
    "us_to_ns",
]


def analyze(
    path: str | os.PathLike[str] | Trace,
    *,
    top: int = 20,
    sections: Sequence[str] = (),
    step_pattern: str | None = None,
    small_us: float = 5.0,
    engine: str = "stdlib",
    backend: str = "auto",
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Read a trace in one streaming pass and compute the report sections.

    Args:
        path: A kineto ``.json`` / ``.json.gz`` trace, an nsys SQLite export, or a :class:`Trace`.
        top: Rows per table.
        sections: Names from :data:`SECTIONS` to compute; empty for all (``summary`` is always there).
        step_pattern: Regular expression (``re.search``) naming step ranges; by default gpuprobe
            step ranges (``gpuprobe.step``, ``decode``, ``prefill``, ``step``), else ``ProfilerStep#N``.
        small_us: Kernels with a mean below this many microseconds count as small operations.
        engine: ``"stdlib"`` or ``"ijson"`` (kineto JSON only; both give the same events).
        backend: ``"auto"``, ``"numpy"`` or ``"python"``: how columns are crunched after the pass
            (the same report either way; ``auto`` takes numpy for large traces).
        progress: Called with ``(done, total)`` bytes (rows for nsys) while reading.

    Returns:
        The :class:`Report`.

    Raises:
        ReportInputError: The file is missing, empty, truncated, invalid, or not a trace.
        ValueError: An unknown section name or a bad step pattern.

    Example:
        >>> report = analyze("tests/data/kineto_min.json")  # doctest: +SKIP
        >>> report.summary.kernel_ns  # 18.304 µs + 9.120 µs  # doctest: +SKIP
        27424
    """
    from gpuprobe.report._analysis import BACKENDS, Collector, Options
    from gpuprobe.report.loaders import Trace, load
    from gpuprobe.report.model import SECTIONS

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if step_pattern is not None:
        import re

        try:
            re.compile(step_pattern)
        except re.error as exc:
            raise ValueError(f"bad step pattern {step_pattern!r}: {exc}") from None
    trace = path if isinstance(path, Trace) else load(path, engine=engine)
    wants_timeline = not sections or "timeline" in sections
    keep_long = min(top, 10_000) if wants_timeline else 1
    collector = Collector(correlation_by_process=trace.info.correlation_by_process, keep_long=keep_long)
    collector.consume(trace.events(progress))
    info = trace.info
    options = Options(
        top=top,
        step_pattern=step_pattern,
        small_ns=int(round(small_us * 1000)),
        sections=tuple(sections),
        backend=backend,
    )
    return collector.build(
        trace.path,
        options,
        source=info.source,
        devices=info.devices,
        base_time_ns=info.base_time_ns,
        skipped_events=info.skipped_events,
        notes=info.notes,
    )
