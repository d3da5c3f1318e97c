"""Renderers: one table model, four text formats (text, md, json, csv), and PNG plots.

Sections are first turned into :class:`_Table` objects (columns with a unit each); a renderer
only decides how a unit looks. Terminal and Markdown tables show human units and short kernel
names; CSV and JSON keep integer nanoseconds, bytes and full names.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import TYPE_CHECKING, Any

from gpuprobe._files import write_file_atomic
from gpuprobe._kernel_names import CATEGORIES
from gpuprobe.errors import ConfigError
from gpuprobe.report._tables import Column, Table, Unit, format_flop_rate, format_ns, write

if TYPE_CHECKING:
    from gpuprobe.report._diff import DiffReport
    from gpuprobe.report.schema import Report

__all__ = ["render", "plot", "FORMATS", "format_ns"]

#: Output formats of :func:`render`.
FORMATS: tuple[str, ...] = ("text", "md", "json", "csv")


def _scalar_evidence(evidence: dict[str, Any], prefix: str = "") -> str:
    parts = []
    for key, value in evidence.items():
        if isinstance(value, dict) and not prefix:  # one level down: by_api.cudaStreamSynchronize=8
            inner = _scalar_evidence(value, f"{key}.")
            if inner:
                parts.append(inner)
            continue
        if isinstance(value, (dict, list)) or value is None:
            continue
        key = prefix + key
        if isinstance(value, float):
            text = f"{value:.3g}"
        elif isinstance(value, int) and key.endswith("_ns"):
            text = format_ns(value)
        else:
            text = str(value)
        parts.append(f"{key}={text}")
    return ", ".join(parts)


def _offender_lines(evidence: dict[str, Any]) -> list[str]:
    rows = evidence.get("top_offenders") or (evidence.get("would_sync_on_gpu") or {}).get("top_offenders") or []
    return [
        f"     {r['calls']:,} x {r['operator']} in {r['range']}"
        + (f" ({r['per_step']:g} per step)" if r.get("per_step") is not None else "")
        + (f": {r.get('function') or r['role'].replace('_', ' ')}" if r.get("role") else "")
        for r in rows
    ]


def findings_table(findings: list[Any], markdown: bool) -> Table:
    lines: list[str] = []
    for n, f in enumerate(findings, 1):
        if markdown:
            lines.append(f"- **{f.severity}** `{f.id}`: {f.title}")
            lines.append(f"  - evidence: {_scalar_evidence(f.evidence)}")
            lines.extend("  - " + line.strip() for line in _offender_lines(f.evidence))
            lines.append(f"  - remedy: {f.remedy}")
        else:
            lines.append(f"{n}. [{f.severity}] {f.id}: {f.title}")
            lines.append(f"   evidence: {_scalar_evidence(f.evidence)}")
            lines.extend(_offender_lines(f.evidence))
            lines.append(f"   remedy: {f.remedy}")
    rows = [
        {
            "id": f.id,
            "severity": f.severity,
            "title": f.title,
            "at_stake_ns": f.evidence.get("at_stake_ns", 0),
            "remedy": f.remedy,
            "evidence": json.dumps(f.evidence, sort_keys=True),
        }
        for f in findings
    ]
    columns = [
        Column(header=key, key=key, csv_only=True)
        for key in ("id", "severity", "title", "at_stake_ns", "remedy", "evidence")
    ]
    return Table(section="findings", title="Findings", columns=columns, rows=rows, lines=lines, listed=True)


# ---------------------------------------------------------------------------- report tables


def _report_tables(report: Report, markdown: bool = False) -> list[Table]:
    s = report.summary
    tables: list[Table] = []
    if report.findings is not None:
        tables.append(findings_table(report.findings, markdown))
    lines = [f"warning: {w}" for w in s.warnings]
    lines += [
        f"trace: {s.path} ({s.source}{', ' + ', '.join(sorted(set(s.devices))) if s.devices else ''})",
        f"span: {format_ns(s.span_ns)}; events: "
        + ", ".join(f"{k} {v:,}" for k, v in s.events.items())
        + (f"; skipped {s.skipped_events:,}" if s.skipped_events else ""),
        f"GPU: {s.gpu_op_count:,} operations, {s.kernel_count:,} kernels, kernel time {format_ns(s.kernel_ns)}, "
        f"busy {format_ns(s.gpu_busy_ns)}"
        + (f" ({s.gpu_busy_share * 100:.1f} % of the span)" if s.gpu_busy_share is not None else ""),
        f"launches: {s.launch_count:,} calls, {format_ns(s.launch_api_ns)} in the API; steps: {s.step_count:,}",
    ]
    tables.append(Table(section="summary", title="Summary", columns=[], rows=[], lines=lines))
    if report.ranks is not None:
        tables.extend(_rank_tables(report.ranks))
    step_spread_cols = [
        Column(header="per step (median)", key="step_median_ns", unit=Unit.NS),
        Column(header="p10", key="step_p10_ns", unit=Unit.NS),
        Column(header="p90", key="step_p90_ns", unit=Unit.NS),
    ]
    kernel_cols = [
        Column(header="kernel", key="short_name", unit=Unit.NAME),
        Column(header="category", key="category"),
        Column(header="count", key="count", unit=Unit.INT),
        Column(header="total", key="total_ns", unit=Unit.NS),
        Column(header="mean", key="mean_ns", unit=Unit.NS),
        Column(header="median", key="median_ns", unit=Unit.NS),
        Column(header="min", key="min_ns", unit=Unit.NS),
        Column(header="max", key="max_ns", unit=Unit.NS),
        Column(header="share", key="share", unit=Unit.SHARE),
        Column(header="name", key="name", unit=Unit.NAME, csv_only=True),
    ]
    if report.kernels is not None:
        k = report.kernels
        tables.append(
            Table(
                section="kernels",
                title="Top kernels",
                columns=kernel_cols,
                rows=k.rows,
                lines=[f"{k.count:,} kernels of {k.distinct:,} names, {format_ns(k.total_ns)} in all"],
            )
        )
    if report.categories is not None:
        c = report.categories
        tables.append(
            Table(
                section="categories",
                title="GPU time by category",
                columns=[
                    Column(header="category", key="category"),
                    Column(header="count", key="count", unit=Unit.INT),
                    Column(header="total", key="total_ns", unit=Unit.NS),
                    Column(header="share", key="share", unit=Unit.SHARE),
                    *step_spread_cols,
                ],
                rows=c.rows,
                lines=[f"'other' holds {c.other_share * 100:.1f} % of GPU time"],
            )
        )
    if report.families is not None:
        tables.append(
            Table(
                section="families",
                title="Kernel families (tile-shape variants together)",
                columns=[
                    Column(header="family", key="family", unit=Unit.NAME),
                    Column(header="category", key="category"),
                    Column(header="variants", key="variants", unit=Unit.INT),
                    Column(header="count", key="count", unit=Unit.INT),
                    Column(header="total", key="total_ns", unit=Unit.NS),
                    Column(header="share", key="share", unit=Unit.SHARE),
                    *step_spread_cols,
                ],
                rows=report.families.rows,
            )
        )
    if report.non_gemm is not None:
        n = report.non_gemm
        tables.append(
            Table(
                section="non_gemm",
                title="Non-GEMM kernels",
                columns=kernel_cols,
                rows=n.rows,
                lines=[f"{n.count:,} kernels, {format_ns(n.total_ns)} in all"],
            )
        )
    if report.attention is not None:
        a = report.attention
        tables.append(
            Table(
                section="attention",
                title="Attention kernels",
                columns=kernel_cols,
                rows=a.rows,
                lines=[f"{a.count:,} kernels, {format_ns(a.total_ns)} in all"],
            )
        )
    if report.launches is not None:
        la = report.launches
        tables.append(
            Table(
                section="launches",
                title="Launch overhead",
                columns=[
                    Column(header="API", key="name", unit=Unit.NAME),
                    Column(header="kind", key="kind"),
                    Column(header="count", key="count", unit=Unit.INT),
                    Column(header="total", key="total_ns", unit=Unit.NS),
                    Column(header="mean", key="mean_ns", unit=Unit.NS),
                    Column(header="max", key="max_ns", unit=Unit.NS),
                ],
                rows=la.apis,
                lines=[
                    f"{la.launch_count:,} launch calls, {format_ns(la.api_ns)} in the API"
                    + (f", {la.per_step_median:.1f} per step (median)" if la.per_step_median is not None else ""),
                    f"launch to GPU start: median {format_ns(la.delay_median_ns)}, mean {format_ns(la.delay_mean_ns)}, "
                    f"p90 {format_ns(la.delay_p90_ns)}, max {format_ns(la.delay_max_ns)} ({la.delay_count:,} linked)",
                    f"sync calls: {la.sync_count:,}, {format_ns(la.sync_ns)}; launches without GPU record: "
                    f"{la.launches_without_gpu_op:,}; GPU operations without launch: {la.gpu_ops_without_launch:,}",
                ],
            )
        )
    if report.memory is not None:
        m = report.memory
        tables.append(
            Table(
                section="memory",
                title="Memory operations",
                columns=[
                    Column(header="kind", key="kind"),
                    Column(header="direction", key="direction"),
                    Column(header="count", key="count", unit=Unit.INT),
                    Column(header="bytes", key="bytes", unit=Unit.BYTES),
                    Column(header="total", key="total_ns", unit=Unit.NS),
                    Column(header="bandwidth", key="bandwidth_gbps", unit=Unit.GBPS),
                ],
                rows=m.rows,
            )
        )
    if report.ranges is not None:
        r = report.ranges
        tables.append(
            Table(
                section="ranges",
                title="GPU time per range",
                columns=[
                    Column(header="range", key="path", unit=Unit.NAME),
                    Column(header="count", key="count", unit=Unit.INT),
                    Column(header="CPU", key="cpu_ns", unit=Unit.NS),
                    Column(header="GPU busy", key="gpu_busy_ns", unit=Unit.NS),
                    Column(header="kernels", key="kernel_ns", unit=Unit.NS),
                    Column(header="GPU span", key="gpu_span_ns", unit=Unit.NS),
                    Column(header="launches", key="launches", unit=Unit.INT),
                    Column(header="GPU ops", key="gpu_ops", unit=Unit.INT),
                ],
                rows=r.rows,
                lines=[f"{r.distinct:,} distinct range paths"] if r.distinct > len(r.rows) else [],
            )
        )
    if report.steps is not None:
        st = report.steps
        cats = [c for c in CATEGORIES if any(c in row.categories for row in st.rows)]
        cols = [
            Column(header="step", key="index", unit=Unit.INT),
            Column(header="name", key="name", unit=Unit.NAME),
            Column(header="phase", key="phase"),
            Column(header="start", key="start_ns", unit=Unit.NS),
            Column(header="CPU", key="cpu_ns", unit=Unit.NS),
            Column(header="GPU busy", key="gpu_busy_ns", unit=Unit.NS),
            Column(header="GPU span", key="gpu_span_ns", unit=Unit.NS),
            Column(header="kernels", key="kernels", unit=Unit.INT),
            Column(header="launches", key="launches", unit=Unit.INT),
            Column(header="launch API", key="launch_api_ns", unit=Unit.NS),
            Column(header="sync", key="sync_ns", unit=Unit.NS),
            Column(header="memcpy", key="memcpy_bytes", unit=Unit.BYTES),
        ] + [Column(header=c, key=f"cat:{c}", unit=Unit.NS, csv_only=True, csv_header=f"{c}_ns") for c in cats]
        lines = [
            f"{st.count:,} steps (pattern {st.pattern}); CPU median {format_ns(st.cpu_median_ns)} "
            f"(p10 {format_ns(st.cpu_p10_ns)}, p90 {format_ns(st.cpu_p90_ns)}); GPU busy median "
            f"{format_ns(st.gpu_busy_median_ns)} (p10 {format_ns(st.gpu_busy_p10_ns)}, "
            f"p90 {format_ns(st.gpu_busy_p90_ns)})"
        ]
        rows = [
            dict(dataclasses.asdict(row), **{f"cat:{c}": row.categories.get(c, 0) for c in cats}) for row in st.rows
        ]
        tables.append(Table(section="steps", title="Steps", columns=cols, rows=rows, lines=lines, cut=True))
    if report.small_ops is not None:
        so = report.small_ops
        tables.append(
            Table(
                section="small_ops",
                title=f"Small frequent kernels (mean < {format_ns(so.threshold_ns)})",
                columns=kernel_cols,
                rows=so.rows,
                lines=[
                    f"{so.count:,} small kernels: {so.count_share * 100:.1f} % of kernels, {format_ns(so.total_ns)} "
                    f"= {so.time_share * 100:.1f} % of kernel time"
                ],
            )
        )
    if report.timeline is not None:
        tables.append(
            Table(
                section="timeline",
                title="Long events, in time order",
                columns=[
                    Column(header="start", key="start_ns", unit=Unit.NS),
                    Column(header="duration", key="dur_ns", unit=Unit.NS),
                    Column(header="kind", key="kind"),
                    Column(header="where", key="where"),
                    Column(header="name", key="name", unit=Unit.NAME),
                ],
                rows=report.timeline.rows,
            )
        )
    if report.cpu_ops is not None:
        tables.append(
            Table(
                section="cpu_ops",
                title="CPU operators (inclusive time)",
                columns=[
                    Column(header="operator", key="name", unit=Unit.NAME),
                    Column(header="count", key="count", unit=Unit.INT),
                    Column(header="total", key="total_ns", unit=Unit.NS),
                    Column(header="mean", key="mean_ns", unit=Unit.NS),
                    Column(header="max", key="max_ns", unit=Unit.NS),
                ],
                rows=report.cpu_ops.rows,
                lines=[f"{report.cpu_ops.count:,} operator calls"],
            )
        )
    if report.idle is not None:
        idle = report.idle
        window = idle.window_ns

        def pct(ns: int) -> str:
            return f"{format_ns(ns)} ({ns / window * 100:.1f} %)" if window else format_ns(ns)

        tables.append(
            Table(
                section="idle",
                title="GPU idle time" + (" per step" if idle.scope == "steps" else ""),
                columns=[
                    Column(header="step", key="index", unit=Unit.INT),
                    Column(header="window", key="window_ns", unit=Unit.NS),
                    Column(header="busy", key="busy_ns", unit=Unit.NS),
                    Column(header="idle: host launching", key="idle_launch_ns", unit=Unit.NS),
                    Column(header="idle: host in sync", key="idle_sync_ns", unit=Unit.NS),
                    Column(header="idle: other", key="idle_other_ns", unit=Unit.NS),
                ],
                rows=idle.rows,
                lines=[
                    f"busy {pct(idle.busy_ns)}; idle while the host launches {pct(idle.idle_launch_ns)}, "
                    f"while it waits in a sync {pct(idle.idle_sync_ns)}, other {pct(idle.idle_other_ns)}"
                ],
            )
        )
    if report.communication is not None:
        cm = report.communication
        tables.append(
            Table(
                section="communication",
                title="Communication and computation overlap",
                columns=[
                    Column(header="step", key="index", unit=Unit.INT),
                    Column(header="communication", key="communication_ns", unit=Unit.NS),
                    Column(header="overlapped", key="overlap_ns", unit=Unit.NS),
                    Column(header="exposed", key="exposed_ns", unit=Unit.NS),
                ],
                rows=cm.rows,
                lines=[
                    f"{cm.collectives:,} communication kernels, {format_ns(cm.communication_ns)}; overlapped with "
                    f"other kernels {format_ns(cm.overlap_ns)}, exposed {format_ns(cm.exposed_ns)}"
                ],
            )
        )
    if report.flops is not None:
        fl = report.flops
        tables.append(
            Table(
                section="flops",
                title="Achieved FLOP/s by category",
                columns=[
                    Column(header="category", key="category"),
                    Column(header="FLOPs", key="flops", unit=Unit.INT),
                    Column(header="time", key="time_ns", unit=Unit.NS),
                    Column(header="achieved", key="flops_per_s", unit=Unit.FLOP_RATE),
                ],
                rows=fl.categories,
                lines=[f"{fl.total_flops:,} FLOPs recorded; time on the {fl.clock.upper()} clock"]
                + [
                    f"{r.operator}: {r.count:,} calls, {r.flops:,} FLOPs, {format_ns(r.time_ns)}, "
                    + (format_flop_rate(r.flops_per_s) if r.flops_per_s is not None else "-")
                    for r in fl.rows[:10]
                ],
            )
        )
    return tables


def _rank_tables(rk: Any) -> list[Table]:
    exposed = sum(r.exposed_communication_ns for r in rk.rows)
    comm = sum(r.communication_ns for r in rk.rows)
    tables = [
        Table(
            section="ranks",
            title=f"Ranks ({rk.count}, numbered by {rk.source})",
            columns=[
                Column(header="rank", key="rank", unit=Unit.INT),
                Column(header="kernels", key="kernel_ns", unit=Unit.NS),
                Column(header="communication", key="communication_ns", unit=Unit.NS),
                Column(header="overlapped", key="overlap_ns", unit=Unit.NS),
                Column(header="exposed", key="exposed_communication_ns", unit=Unit.NS),
                Column(header="GPU busy", key="busy_ns", unit=Unit.NS),
                Column(header="span", key="span_ns", unit=Unit.NS),
                Column(header="launches", key="launches", unit=Unit.INT),
                Column(header="steps", key="steps", unit=Unit.INT),
                Column(header="step (median)", key="step_median_ns", unit=Unit.NS),
                Column(header="path", key="path", unit=Unit.NAME, csv_only=True),
            ],
            rows=rk.rows,
            lines=[f"communication {format_ns(comm)} in all, of which exposed (no other kernel running) {format_ns(exposed)}"],
        )
    ]
    if rk.stragglers:
        tables.append(
            Table(
                section="stragglers",
                title="Stragglers: the slowest rank of each step",
                columns=[
                    Column(header="step", key="index", unit=Unit.INT),
                    Column(header="slowest rank", key="slowest_rank", unit=Unit.INT),
                    Column(header="its step", key="slowest_ns", unit=Unit.NS),
                    Column(header="median rank", key="median_ns", unit=Unit.NS),
                    Column(header="excess", key="excess_ns", unit=Unit.NS),
                    Column(header="explained by", key="category"),
                    Column(header="category excess", key="category_excess_ns", unit=Unit.NS),
                ],
                rows=rk.stragglers,
            )
        )
    if rk.skew:
        tables.append(
            Table(
                section="skew",
                title="Collective skew: how far apart the ranks start the same collective",
                columns=[
                    Column(header="collective", key="family", unit=Unit.NAME),
                    Column(header="count", key="occurrences", unit=Unit.INT),
                    Column(header="median skew", key="median_skew_ns", unit=Unit.NS),
                    Column(header="max skew", key="max_skew_ns", unit=Unit.NS),
                    Column(header="last rank", key="last_rank", unit=Unit.INT),
                    Column(header="last, share", key="last_rank_share", unit=Unit.SHARE),
                ],
                rows=rk.skew,
                lines=["on the traces' own clocks: meaningful for ranks of one node, or with synchronized clocks"],
            )
        )
    return tables


def _verdict_table(d: DiffReport) -> Table:
    """The verdict first: per-step medians of A and B, their spreads, and the judgement of each."""
    cols = [
        Column(header="figure", key="figure", unit=Unit.NAME),
        Column(header="metric", key="metric"),
        Column(header="A median", key="a", unit=Unit.BY_METRIC),
        Column(header="B median", key="b", unit=Unit.BY_METRIC),
        Column(header="A p10-p90", key="a_spread", unit=Unit.BY_METRIC),
        Column(header="B p10-p90", key="b_spread", unit=Unit.BY_METRIC),
        Column(header="change", key="change", unit=Unit.SHARE),
        Column(header="judgement", key="judgement"),
    ]
    title = f"Verdict: {d.verdict}"
    return Table(section="verdict", title=title, columns=cols, rows=d.verdict_rows)


def _diff_tables(d: DiffReport, markdown: bool = False) -> list[Table]:
    unit_word = {"step": "per step", "token": "per token", "none": "in all"}[d.normalize]
    tables = [_verdict_table(d)]
    tables += [findings_table(d.findings, markdown)] if d.findings is not None else []
    tables += [
        Table(
            section="summary",
            title="Diff",
            columns=[],
            rows=[],
            lines=[f"warning: {w}" for w in d.warnings]
            + [
                f"A: {d.a_path} ({d.a_units:g} {d.normalize if d.normalize != 'none' else 'trace'}s)",
                f"B: {d.b_path} ({d.b_units:g} {d.normalize if d.normalize != 'none' else 'trace'}s)",
                f"values are {unit_word}; delta = B - A; ratio = B / A; median and p10-p90 are across steps",
            ],
        )
    ]
    for section, title in (
        ("overview", "Overview"),
        ("categories", "GPU time by category"),
        ("families", "Kernel families"),
        ("ranges", "Ranges"),
        ("memory", "Memory operations"),
        ("cpu_ops", "CPU operators"),
    ):
        rows = getattr(d, section)
        cols = [
            Column(header="name", key="key", unit=Unit.NAME),
            Column(header="metric", key="metric"),
            Column(header="A", key="a", unit=Unit.BY_METRIC),
            Column(header="B", key="b", unit=Unit.BY_METRIC),
            Column(header="delta", key="delta", unit=Unit.BY_METRIC),
            Column(header="ratio", key="ratio", unit=Unit.RATIO),
            Column(header="A median", key="a_median", unit=Unit.BY_METRIC),
            Column(header="A p10-p90", key="a_spread", unit=Unit.BY_METRIC),
            Column(header="B median", key="b_median", unit=Unit.BY_METRIC),
            Column(header="B p10-p90", key="b_spread", unit=Unit.BY_METRIC),
        ]
        tables.append(Table(section=section, title=title, columns=cols, rows=rows))
    return tables


# ---------------------------------------------------------------------------- formats


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
    tables = _diff_tables(report, markdown) if isinstance(report, DiffReport) else _report_tables(report, markdown)
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
