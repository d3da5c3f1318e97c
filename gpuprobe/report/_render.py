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

__all__ = ["render", "plot", "FORMATS", "format_ns"]

#: Output formats of :func:`render`.
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


def render(report: Report | DiffReport, fmt: str = "text", top: int = 20) -> str:
    """Render a report or a diff as text.

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
        >>> print(render(analyze("tests/data/kineto_min.json"), "md"))  # doctest: +SKIP
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


def plot(report: Report, path: str | os.PathLike[str]) -> None:
    """Save a PNG with the category breakdown and the per-step timeline.

    matplotlib is imported here only (``pip install 'gpuprobe[report]'``).

    Args:
        report: A report with the ``categories`` and ``steps`` sections (others are not needed).
        path: The PNG file to write (atomically).

    Example:
        >>> from gpuprobe.report import analyze
        >>> plot(analyze("tests/data/kineto_min.json"), "/tmp/report.png")  # doctest: +SKIP
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        from gpuprobe.errors import missing

        raise missing("matplotlib", "report") from exc
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(2, 1, height_ratios=(1, 1.3))
    _plot_categories(left, report)
    _plot_steps(right, report)
    fig.suptitle(os.path.basename(report.summary.path), fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_file_atomic(path, buf.getvalue())


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


def _plot_steps(ax: Any, report: Report) -> None:
    steps = report.steps.rows if report.steps is not None else []
    if not steps:
        ax.text(0.5, 0.5, "no step ranges in this trace", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    x = [s.index for s in steps]
    gpu_known = steps[0].gpu_busy_ns is not None
    if gpu_known:
        bottom = [0.0] * len(steps)
        cats = [c for c in CATEGORIES if any(c in s.categories for s in steps)]
        for cat in cats:
            heights = [s.categories.get(cat, 0) / 1e6 for s in steps]
            ax.bar(x, heights, bottom=bottom, width=1.0, label=cat, linewidth=0)
            bottom = [b + h for b, h in zip(bottom, heights)]
    ax.plot(x, [s.cpu_ns / 1e6 for s in steps], color="black", linewidth=1, label="CPU (range)")
    if gpu_known:
        ax.plot(x, [(s.gpu_busy_ns or 0) / 1e6 for s in steps], color="red", linewidth=1, label="GPU busy")
    ax.set_xlabel("step")
    ax.set_ylabel("time (ms)")
    ax.set_title("Per-step time (bars: GPU time by category)", fontsize=10)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
