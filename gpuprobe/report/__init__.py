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
from typing import TYPE_CHECKING, Any

from gpuprobe._kernel_names import CATEGORIES, categorize_kernel, kernel_family, short_kernel_name
from gpuprobe.report._errors import ReportInputError
from gpuprobe.report._events import Event, us_to_ns

if TYPE_CHECKING:
    from gpuprobe.report._analysis import BACKENDS, DEFAULT_STEP_PATTERN, PROFILER_STEP_PATTERN, analyze
    from gpuprobe.report._diff import DiffReport, diff
    from gpuprobe.report._ranks import analyze_ranks
    from gpuprobe.report._ncu_analysis import NcuReport, analyze_ncu, diff_ncu
    from gpuprobe.report._ncu_render import render_ncu
    from gpuprobe.report._render import plot, render
    from gpuprobe.report.loaders import Trace, load
    from gpuprobe.report.schema import SECTIONS, Report

# why: the schema, loaders, analyses and renderers load on first use, so `import gpuprobe.report`
# costs about 3 ms on top of `import gpuprobe` instead of 40 ms
_LAZY = {
    "BACKENDS": "gpuprobe.report._analysis",
    "DEFAULT_STEP_PATTERN": "gpuprobe.report._analysis",
    "PROFILER_STEP_PATTERN": "gpuprobe.report._analysis",
    "analyze": "gpuprobe.report._analysis",
    "analyze_ranks": "gpuprobe.report._ranks",
    "DiffReport": "gpuprobe.report._diff",
    "diff": "gpuprobe.report._diff",
    "NcuReport": "gpuprobe.report._ncu_analysis",
    "analyze_ncu": "gpuprobe.report._ncu_analysis",
    "diff_ncu": "gpuprobe.report._ncu_analysis",
    "render_ncu": "gpuprobe.report._ncu_render",
    "plot": "gpuprobe.report._render",
    "render": "gpuprobe.report._render",
    "Trace": "gpuprobe.report.loaders",
    "load": "gpuprobe.report.loaders",
    "Report": "gpuprobe.report.schema",
    "SECTIONS": "gpuprobe.report.schema",
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
    "NcuReport",
    "Report",
    "ReportInputError",
    "Trace",
    "analyze",
    "analyze_ranks",
    "analyze_ncu",
    "categorize_kernel",
    "diff",
    "diff_ncu",
    "kernel_family",
    "load",
    "plot",
    "render",
    "render_ncu",
    "short_kernel_name",
    "us_to_ns",
]
