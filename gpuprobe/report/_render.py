"""Renderers: the report's sections as tables in text, Markdown or CSV (through the table toolkit,
:mod:`gpuprobe.report._tables`), as JSON, and as a PNG plot.

The tables of a report are its sections' own (each section module's ``tables``), in the registry's
order (:func:`gpuprobe.report.sections.table_order`); a diff's are its own
(:meth:`gpuprobe.report._diff.DiffReport.tables`). Terminal and Markdown tables show human units and
short kernel names; CSV and JSON keep integer nanoseconds, bytes and full names.
"""

from __future__ import annotations

import io
import json
import os
from typing import TYPE_CHECKING, Any

from gpuprobe._files import write_file_atomic
from gpuprobe._kernel_names import CATEGORIES
from gpuprobe.errors import ConfigError
from gpuprobe.report._tables import Table, format_ns, write
from gpuprobe.report.sections import GPU_ONLY, table_order

if TYPE_CHECKING:
    from gpuprobe.report._diff import DiffReport
    from gpuprobe.report.schema import Report

__all__ = ["render_report", "render", "plot", "FORMATS", "format_ns"]

#: Output formats of :func:`render_report`.
FORMATS: tuple[str, ...] = ("text", "md", "json", "csv")


def no_gpu_activity(report: Report) -> bool:
    """Whether the trace holds no GPU activity at all: no GPU operation and no launch (a CPU trace, or the
    program's own profiler without CUDA activity). A trace with launches but no GPU records is a broken
    capture, whose launch tables still tell something."""
    return not report.summary.gpu_op_count and not report.summary.launch_count


def report_tables(report: Report, markdown: bool = False, every: bool = False) -> list[Table]:
    """The tables of every section the report holds, in table order.

    Without GPU activity, the sections made of GPU records (:data:`~gpuprobe.report.sections.GPU_ONLY`)
    are left out, unless ``every`` (CSV): the summary's warning says it once, instead of a table of
    "(none)" each.
    """
    tables: list[Table] = []
    skip = GPU_ONLY if not every and no_gpu_activity(report) else frozenset()
    for section in table_order():
        data = getattr(report, section.name)
        if data is not None and section.name not in skip:
            tables.extend(section.tables(data, markdown))
    return tables


def render_report(report: Report | DiffReport, fmt: str = "text", top: int = 20) -> str:
    """Render a report or a diff as text (public as :func:`gpuprobe.report.render`).

    Args:
        report: A :class:`~gpuprobe.report.Report` or :class:`~gpuprobe.report.DiffReport`.
        fmt: One of :data:`FORMATS`: ``text`` (terminal tables), ``md`` (Markdown), ``json``,
            ``csv`` (one table per section, each with a header row and a ``section`` column,
            separated by blank lines; pick one section for a single clean table).
        top: Rows of the per-step table shown by ``text`` and ``md``.

    Returns:
        The rendered text.

    Example:
        >>> from gpuprobe.report import analyze
        >>> print(render_report(analyze("tests/data/kineto_min.json"), "md"))  # doctest: +SKIP
    """
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=1) + "\n"  # to_dict() holds plain JSON values only
    from gpuprobe.report._diff import DiffReport

    markdown = fmt == "md"
    tables = (
        report.tables(markdown) if isinstance(report, DiffReport) else report_tables(report, markdown, fmt == "csv")
    )
    return write(tables, fmt, top)


#: The public name of :func:`render_report` (``from gpuprobe.report import render``).
render = render_report


def plot(report: Report, path: str | os.PathLike[str]) -> None:
    """Save a PNG with the category breakdown and the per-step timeline.

    Each step's bar stacks its GPU time by kernel category; in a trace without GPU activity, its CPU time
    by the ranges directly inside the step (a generation step's components: ``forward``, each logits
    processor, ...; ``other``: in none of them). matplotlib is imported here only
    (``pip install 'gpuprobe[report]'``).

    Args:
        report: A report with the ``categories`` and ``steps`` sections (others are not needed).
        path: The PNG file to write (atomically).

    Example:
        >>> from gpuprobe.report import analyze
        >>> plot(analyze("tests/data/kineto_min.json"), "/tmp/report.png")  # doctest: +SKIP
    """
    fig = figure(report)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_file_atomic(path, buf.getvalue())


def figure(report: Report) -> Any:
    """The matplotlib ``Figure`` that :func:`plot` saves: the breakdown above, the per-step stack below."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        from gpuprobe.errors import missing

        raise missing("matplotlib", "report") from exc
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, height_ratios=(1, 1.3))
    stack = step_range_stack(report) if no_gpu_activity(report) else None
    if stack:
        _plot_range_totals(top, stack)
        _plot_steps(bottom, report, stack)
    else:
        _plot_categories(top, report)
        _plot_steps(bottom, report)
    fig.suptitle(os.path.basename(report.summary.path), fontsize=11)
    return fig


#: Ranges a per-step stack shows by name; the others are summed into one bar segment.
_STACKED_RANGES = 9
#: The step's CPU time in none of the ranges directly inside it (as the metrics' ``component="other"``).
OTHER = "other (in no range)"
_MORE = "other ranges"


def step_range_stack(report: Report) -> dict[str, list[int]]:
    """Each step's CPU time by the ranges directly inside it: ``{name: [ns of step 0, step 1, ...]}``.

    The largest :data:`_STACKED_RANGES` ranges (by CPU time over all steps) keep their names, the others
    are summed as ``other ranges``; :data:`OTHER` is the time in none of them. Empty when no step holds a
    range.
    """
    steps = report.steps.rows if report.steps is not None else []
    if not any(s.ranges for s in steps):
        return {}
    totals: dict[str, int] = {}
    for s in steps:
        for name, ns in s.ranges.items():
            totals[name] = totals.get(name, 0) + ns
    named = sorted(totals, key=lambda n: -totals[n])[:_STACKED_RANGES]
    shown = [n for n in totals if n in named]  # in order of first appearance
    stack = {n: [s.ranges.get(n, 0) for s in steps] for n in shown}
    if len(totals) > len(shown):
        stack[_MORE] = [sum(ns for n, ns in s.ranges.items() if n not in named) for s in steps]
    stack[OTHER] = [max(0, s.cpu_ns - sum(s.ranges.values())) for s in steps]
    return stack


def _plot_range_totals(ax: Any, stack: dict[str, list[int]]) -> None:
    totals = sorted(((sum(v), name) for name, v in stack.items()), key=lambda t: t[0])
    whole = sum(t for t, _ in totals)
    ax.barh([name for _, name in totals], [t / 1e6 for t, _ in totals], color="#4c72b0")
    for i, (t, _) in enumerate(totals):
        ax.text(t / 1e6, i, f" {t / whole * 100 if whole else 0.0:.1f} %", va="center", fontsize=8)
    ax.set_xlabel("CPU time in steps (ms)")
    ax.set_title("CPU time by range (no GPU activity in this trace)", fontsize=10)


def _plot_categories(ax: Any, report: Report) -> None:
    rows = report.categories.rows if report.categories is not None else []
    if not rows:
        ax.text(0.5, 0.5, "no GPU activity in this trace", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    rows = sorted(rows, key=lambda r: r.total_ns)
    ax.barh([r.category for r in rows], [r.total_ns / 1e6 for r in rows], color="#4c72b0")
    for i, r in enumerate(rows):
        ax.text(r.total_ns / 1e6, i, f" {r.share * 100:.1f} %", va="center", fontsize=8)
    ax.set_xlabel("GPU time (ms)")
    ax.set_title("GPU time by category", fontsize=10)


def _plot_steps(ax: Any, report: Report, stack: dict[str, list[int]] | None = None) -> None:
    """Each step's bar: its GPU time by category, or (``stack``) its CPU time by range; the CPU line above."""
    steps = report.steps.rows if report.steps is not None else []
    if not steps:
        ax.text(0.5, 0.5, "no step ranges in this trace", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    x = [s.index for s in steps]
    gpu_known = steps[0].gpu_busy_ns is not None
    if stack:
        segments = stack
        title = "Per-step time (bars: CPU time by range)"
    elif gpu_known:
        cats = [c for c in CATEGORIES if any(c in s.categories for s in steps)]
        segments = {c: [s.categories.get(c, 0) for s in steps] for c in cats}
        title = "Per-step time (bars: GPU time by category)"
    else:
        segments = {}
        title = "Per-step time"
    bottom = [0.0] * len(steps)
    for name, values in segments.items():
        heights = [v / 1e6 for v in values]
        ax.bar(x, heights, bottom=bottom, width=1.0, label=name, linewidth=0)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.plot(x, [s.cpu_ns / 1e6 for s in steps], color="black", linewidth=1, label="CPU (range)")
    if gpu_known:
        ax.plot(x, [(s.gpu_busy_ns or 0) / 1e6 for s in steps], color="red", linewidth=1, label="GPU busy")
    ax.set_xlabel("step")
    ax.set_ylabel("time (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
