"""Renderers: one table model, four text formats (text, md, json, csv), and PNG plots.

Sections are first turned into :class:`_Table` objects (columns with a unit each); a renderer
only decides how a unit looks. Terminal and Markdown tables show human units and short kernel
names; CSV and JSON keep integer nanoseconds, bytes and full names.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
import json
import os
from typing import TYPE_CHECKING, Any

from gpuprobe._files import write_file_atomic
from gpuprobe._kernel_names import CATEGORIES
from gpuprobe.errors import ConfigError

if TYPE_CHECKING:
    from gpuprobe.report._diff import DiffReport
    from gpuprobe.report.schema import Report

__all__ = ["render", "plot", "FORMATS", "format_ns"]

#: Output formats of :func:`render`.
FORMATS: tuple[str, ...] = ("text", "md", "json", "csv")
_NAME_WIDTH = 72


class _Unit(enum.Enum):
    """How the values of a column look in text and Markdown tables (CSV and JSON keep raw values)."""

    TEXT = "text"  # as it is, left-aligned
    NAME = "name"  # as it is, left-aligned, cut to the name width in terminal tables
    INT = "int"
    FLOAT = "float"
    NS = "ns"  # nanoseconds, shown in ns, µs, ms or s
    SHARE = "share"
    BYTES = "bytes"
    GBPS = "gbps"
    RATIO = "ratio"
    FLOP_RATE = "flop/s"
    BY_METRIC = "by metric"  # diff values: bytes, a count or ns, after the row's ``metric``


_LEFT_ALIGNED = (_Unit.TEXT, _Unit.NAME)
_COUNT_METRICS = ("count", "launches", "kernels")


@dataclasses.dataclass
class _Column:
    """One column of a table.

    Attributes:
        header: The column title in text and Markdown tables.
        key: The field (or dict key) of a row holding the value; also the CSV header by default.
        unit: How values look in text and Markdown.
        csv_only: Shown in CSV only (full kernel names, per-category step times).
        csv_header: The CSV header, when it is not ``key``.
    """

    header: str
    key: str
    unit: _Unit = _Unit.TEXT
    csv_only: bool = False
    csv_header: str | None = None


@dataclasses.dataclass
class _Table:
    """One section as a table: its rows (dataclasses or dicts), and lines of text shown above them."""

    section: str
    title: str
    columns: list[_Column]
    rows: list[Any]
    lines: list[str] = dataclasses.field(default_factory=list)


def format_ns(ns: int | float | None) -> str:
    """Format nanoseconds for people.

    Example:
        >>> format_ns(18304), format_ns(1_500_000), format_ns(None)
        ('18.304 µs', '1.500 ms', '-')
    """
    if ns is None:
        return "-"
    a = abs(ns)
    if a < 1_000:
        return f"{ns:.0f} ns"
    if a < 1_000_000:
        return f"{ns / 1e3:.3f} µs"
    if a < 1_000_000_000:
        return f"{ns / 1e6:.3f} ms"
    return f"{ns / 1e9:.3f} s"


def _format_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _format_flop_rate(value: float) -> str:
    for unit, size in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} FLOP/s"


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


def _findings_table(findings: list[Any], markdown: bool) -> _Table:
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
        _Column(header=key, key=key, csv_only=True)
        for key in ("id", "severity", "title", "at_stake_ns", "remedy", "evidence")
    ]
    return _Table(section="findings", title="Findings", columns=columns, rows=rows, lines=lines)


def _human(value: Any, unit: _Unit, width: int | None) -> str:
    if value is None:
        return "-"
    if unit is _Unit.NS:
        return format_ns(value)
    if unit is _Unit.SHARE:
        return f"{value * 100:.1f} %"
    if unit is _Unit.BYTES:
        return _format_bytes(value)
    if unit is _Unit.GBPS:
        return f"{value:.2f} GB/s"
    if unit is _Unit.RATIO:
        return f"{value:.2f}x"
    if unit is _Unit.FLOP_RATE:
        return _format_flop_rate(value)
    if unit is _Unit.FLOAT:
        return f"{value:.1f}"
    if unit is _Unit.INT:
        return f"{value:,}"
    text = str(value)
    if unit is _Unit.NAME and width and len(text) > width:
        return text[: width - 1] + "…"
    return text


def _raw(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def _get(row: Any, key: str) -> Any:
    return row[key] if isinstance(row, dict) else getattr(row, key)


# ---------------------------------------------------------------------------- report tables


def _report_tables(report: Report, markdown: bool = False) -> list[_Table]:
    s = report.summary
    tables: list[_Table] = []
    if report.findings is not None:
        tables.append(_findings_table(report.findings, markdown))
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
    tables.append(_Table(section="summary", title="Summary", columns=[], rows=[], lines=lines))
    if report.ranks is not None:
        tables.extend(_rank_tables(report.ranks))
    step_spread_cols = [
        _Column(header="per step (median)", key="step_median_ns", unit=_Unit.NS),
        _Column(header="p10", key="step_p10_ns", unit=_Unit.NS),
        _Column(header="p90", key="step_p90_ns", unit=_Unit.NS),
    ]
    kernel_cols = [
        _Column(header="kernel", key="short_name", unit=_Unit.NAME),
        _Column(header="category", key="category"),
        _Column(header="count", key="count", unit=_Unit.INT),
        _Column(header="total", key="total_ns", unit=_Unit.NS),
        _Column(header="mean", key="mean_ns", unit=_Unit.NS),
        _Column(header="median", key="median_ns", unit=_Unit.NS),
        _Column(header="min", key="min_ns", unit=_Unit.NS),
        _Column(header="max", key="max_ns", unit=_Unit.NS),
        _Column(header="share", key="share", unit=_Unit.SHARE),
        _Column(header="name", key="name", unit=_Unit.NAME, csv_only=True),
    ]
    if report.kernels is not None:
        k = report.kernels
        tables.append(
            _Table(
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
            _Table(
                section="categories",
                title="GPU time by category",
                columns=[
                    _Column(header="category", key="category"),
                    _Column(header="count", key="count", unit=_Unit.INT),
                    _Column(header="total", key="total_ns", unit=_Unit.NS),
                    _Column(header="share", key="share", unit=_Unit.SHARE),
                    *step_spread_cols,
                ],
                rows=c.rows,
                lines=[f"'other' holds {c.other_share * 100:.1f} % of GPU time"],
            )
        )
    if report.families is not None:
        tables.append(
            _Table(
                section="families",
                title="Kernel families (tile-shape variants together)",
                columns=[
                    _Column(header="family", key="family", unit=_Unit.NAME),
                    _Column(header="category", key="category"),
                    _Column(header="variants", key="variants", unit=_Unit.INT),
                    _Column(header="count", key="count", unit=_Unit.INT),
                    _Column(header="total", key="total_ns", unit=_Unit.NS),
                    _Column(header="share", key="share", unit=_Unit.SHARE),
                    *step_spread_cols,
                ],
                rows=report.families.rows,
            )
        )
    if report.non_gemm is not None:
        n = report.non_gemm
        tables.append(
            _Table(
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
            _Table(
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
            _Table(
                section="launches",
                title="Launch overhead",
                columns=[
                    _Column(header="API", key="name", unit=_Unit.NAME),
                    _Column(header="kind", key="kind"),
                    _Column(header="count", key="count", unit=_Unit.INT),
                    _Column(header="total", key="total_ns", unit=_Unit.NS),
                    _Column(header="mean", key="mean_ns", unit=_Unit.NS),
                    _Column(header="max", key="max_ns", unit=_Unit.NS),
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
            _Table(
                section="memory",
                title="Memory operations",
                columns=[
                    _Column(header="kind", key="kind"),
                    _Column(header="direction", key="direction"),
                    _Column(header="count", key="count", unit=_Unit.INT),
                    _Column(header="bytes", key="bytes", unit=_Unit.BYTES),
                    _Column(header="total", key="total_ns", unit=_Unit.NS),
                    _Column(header="bandwidth", key="bandwidth_gbps", unit=_Unit.GBPS),
                ],
                rows=m.rows,
            )
        )
    if report.ranges is not None:
        r = report.ranges
        tables.append(
            _Table(
                section="ranges",
                title="GPU time per range",
                columns=[
                    _Column(header="range", key="path", unit=_Unit.NAME),
                    _Column(header="count", key="count", unit=_Unit.INT),
                    _Column(header="CPU", key="cpu_ns", unit=_Unit.NS),
                    _Column(header="GPU busy", key="gpu_busy_ns", unit=_Unit.NS),
                    _Column(header="kernels", key="kernel_ns", unit=_Unit.NS),
                    _Column(header="GPU span", key="gpu_span_ns", unit=_Unit.NS),
                    _Column(header="launches", key="launches", unit=_Unit.INT),
                    _Column(header="GPU ops", key="gpu_ops", unit=_Unit.INT),
                ],
                rows=r.rows,
                lines=[f"{r.distinct:,} distinct range paths"] if r.distinct > len(r.rows) else [],
            )
        )
    if report.steps is not None:
        st = report.steps
        cats = [c for c in CATEGORIES if any(c in row.categories for row in st.rows)]
        cols = [
            _Column(header="step", key="index", unit=_Unit.INT),
            _Column(header="name", key="name", unit=_Unit.NAME),
            _Column(header="phase", key="phase"),
            _Column(header="start", key="start_ns", unit=_Unit.NS),
            _Column(header="CPU", key="cpu_ns", unit=_Unit.NS),
            _Column(header="GPU busy", key="gpu_busy_ns", unit=_Unit.NS),
            _Column(header="GPU span", key="gpu_span_ns", unit=_Unit.NS),
            _Column(header="kernels", key="kernels", unit=_Unit.INT),
            _Column(header="launches", key="launches", unit=_Unit.INT),
            _Column(header="launch API", key="launch_api_ns", unit=_Unit.NS),
            _Column(header="sync", key="sync_ns", unit=_Unit.NS),
            _Column(header="memcpy", key="memcpy_bytes", unit=_Unit.BYTES),
        ] + [_Column(header=c, key=f"cat:{c}", unit=_Unit.NS, csv_only=True, csv_header=f"{c}_ns") for c in cats]
        lines = [
            f"{st.count:,} steps (pattern {st.pattern}); CPU median {format_ns(st.cpu_median_ns)} "
            f"(p10 {format_ns(st.cpu_p10_ns)}, p90 {format_ns(st.cpu_p90_ns)}); GPU busy median "
            f"{format_ns(st.gpu_busy_median_ns)} (p10 {format_ns(st.gpu_busy_p10_ns)}, "
            f"p90 {format_ns(st.gpu_busy_p90_ns)})"
        ]
        rows = [
            dict(dataclasses.asdict(row), **{f"cat:{c}": row.categories.get(c, 0) for c in cats}) for row in st.rows
        ]
        tables.append(_Table(section="steps", title="Steps", columns=cols, rows=rows, lines=lines))
    if report.small_ops is not None:
        so = report.small_ops
        tables.append(
            _Table(
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
            _Table(
                section="timeline",
                title="Long events, in time order",
                columns=[
                    _Column(header="start", key="start_ns", unit=_Unit.NS),
                    _Column(header="duration", key="dur_ns", unit=_Unit.NS),
                    _Column(header="kind", key="kind"),
                    _Column(header="where", key="where"),
                    _Column(header="name", key="name", unit=_Unit.NAME),
                ],
                rows=report.timeline.rows,
            )
        )
    if report.cpu_ops is not None:
        tables.append(
            _Table(
                section="cpu_ops",
                title="CPU operators (inclusive time)",
                columns=[
                    _Column(header="operator", key="name", unit=_Unit.NAME),
                    _Column(header="count", key="count", unit=_Unit.INT),
                    _Column(header="total", key="total_ns", unit=_Unit.NS),
                    _Column(header="mean", key="mean_ns", unit=_Unit.NS),
                    _Column(header="max", key="max_ns", unit=_Unit.NS),
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
            _Table(
                section="idle",
                title="GPU idle time" + (" per step" if idle.scope == "steps" else ""),
                columns=[
                    _Column(header="step", key="index", unit=_Unit.INT),
                    _Column(header="window", key="window_ns", unit=_Unit.NS),
                    _Column(header="busy", key="busy_ns", unit=_Unit.NS),
                    _Column(header="idle: host launching", key="idle_launch_ns", unit=_Unit.NS),
                    _Column(header="idle: host in sync", key="idle_sync_ns", unit=_Unit.NS),
                    _Column(header="idle: other", key="idle_other_ns", unit=_Unit.NS),
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
            _Table(
                section="communication",
                title="Communication and computation overlap",
                columns=[
                    _Column(header="step", key="index", unit=_Unit.INT),
                    _Column(header="communication", key="communication_ns", unit=_Unit.NS),
                    _Column(header="overlapped", key="overlap_ns", unit=_Unit.NS),
                    _Column(header="exposed", key="exposed_ns", unit=_Unit.NS),
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
            _Table(
                section="flops",
                title="Achieved FLOP/s by category",
                columns=[
                    _Column(header="category", key="category"),
                    _Column(header="FLOPs", key="flops", unit=_Unit.INT),
                    _Column(header="time", key="time_ns", unit=_Unit.NS),
                    _Column(header="achieved", key="flops_per_s", unit=_Unit.FLOP_RATE),
                ],
                rows=fl.categories,
                lines=[f"{fl.total_flops:,} FLOPs recorded; time on the {fl.clock.upper()} clock"]
                + [
                    f"{r.operator}: {r.count:,} calls, {r.flops:,} FLOPs, {format_ns(r.time_ns)}, "
                    + (_format_flop_rate(r.flops_per_s) if r.flops_per_s is not None else "-")
                    for r in fl.rows[:10]
                ],
            )
        )
    return tables


def _rank_tables(rk: Any) -> list[_Table]:
    exposed = sum(r.exposed_communication_ns for r in rk.rows)
    comm = sum(r.communication_ns for r in rk.rows)
    tables = [
        _Table(
            section="ranks",
            title=f"Ranks ({rk.count}, numbered by {rk.source})",
            columns=[
                _Column(header="rank", key="rank", unit=_Unit.INT),
                _Column(header="kernels", key="kernel_ns", unit=_Unit.NS),
                _Column(header="communication", key="communication_ns", unit=_Unit.NS),
                _Column(header="overlapped", key="overlap_ns", unit=_Unit.NS),
                _Column(header="exposed", key="exposed_communication_ns", unit=_Unit.NS),
                _Column(header="GPU busy", key="busy_ns", unit=_Unit.NS),
                _Column(header="span", key="span_ns", unit=_Unit.NS),
                _Column(header="launches", key="launches", unit=_Unit.INT),
                _Column(header="steps", key="steps", unit=_Unit.INT),
                _Column(header="step (median)", key="step_median_ns", unit=_Unit.NS),
                _Column(header="path", key="path", unit=_Unit.NAME, csv_only=True),
            ],
            rows=rk.rows,
            lines=[f"communication {format_ns(comm)} in all, of which exposed (no other kernel running) {format_ns(exposed)}"],
        )
    ]
    if rk.stragglers:
        tables.append(
            _Table(
                section="stragglers",
                title="Stragglers: the slowest rank of each step",
                columns=[
                    _Column(header="step", key="index", unit=_Unit.INT),
                    _Column(header="slowest rank", key="slowest_rank", unit=_Unit.INT),
                    _Column(header="its step", key="slowest_ns", unit=_Unit.NS),
                    _Column(header="median rank", key="median_ns", unit=_Unit.NS),
                    _Column(header="excess", key="excess_ns", unit=_Unit.NS),
                    _Column(header="explained by", key="category"),
                    _Column(header="category excess", key="category_excess_ns", unit=_Unit.NS),
                ],
                rows=rk.stragglers,
            )
        )
    if rk.skew:
        tables.append(
            _Table(
                section="skew",
                title="Collective skew: how far apart the ranks start the same collective",
                columns=[
                    _Column(header="collective", key="family", unit=_Unit.NAME),
                    _Column(header="count", key="occurrences", unit=_Unit.INT),
                    _Column(header="median skew", key="median_skew_ns", unit=_Unit.NS),
                    _Column(header="max skew", key="max_skew_ns", unit=_Unit.NS),
                    _Column(header="last rank", key="last_rank", unit=_Unit.INT),
                    _Column(header="last, share", key="last_rank_share", unit=_Unit.SHARE),
                ],
                rows=rk.skew,
                lines=["on the traces' own clocks: meaningful for ranks of one node, or with synchronized clocks"],
            )
        )
    return tables


def _verdict_table(d: DiffReport) -> _Table:
    """The verdict first: per-step medians of A and B, their spreads, and the judgement of each."""
    cols = [
        _Column(header="figure", key="figure", unit=_Unit.NAME),
        _Column(header="metric", key="metric"),
        _Column(header="A median", key="a", unit=_Unit.BY_METRIC),
        _Column(header="B median", key="b", unit=_Unit.BY_METRIC),
        _Column(header="A p10-p90", key="a_spread", unit=_Unit.BY_METRIC),
        _Column(header="B p10-p90", key="b_spread", unit=_Unit.BY_METRIC),
        _Column(header="change", key="change", unit=_Unit.SHARE),
        _Column(header="judgement", key="judgement"),
    ]
    title = f"Verdict: {d.verdict}"
    return _Table(section="verdict", title=title, columns=cols, rows=d.verdict_rows)


def _diff_tables(d: DiffReport, markdown: bool = False) -> list[_Table]:
    unit_word = {"step": "per step", "token": "per token", "none": "in all"}[d.normalize]
    tables = [_verdict_table(d)]
    tables += [_findings_table(d.findings, markdown)] if d.findings is not None else []
    tables += [
        _Table(
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
            _Column(header="name", key="key", unit=_Unit.NAME),
            _Column(header="metric", key="metric"),
            _Column(header="A", key="a", unit=_Unit.BY_METRIC),
            _Column(header="B", key="b", unit=_Unit.BY_METRIC),
            _Column(header="delta", key="delta", unit=_Unit.BY_METRIC),
            _Column(header="ratio", key="ratio", unit=_Unit.RATIO),
            _Column(header="A median", key="a_median", unit=_Unit.BY_METRIC),
            _Column(header="A p10-p90", key="a_spread", unit=_Unit.BY_METRIC),
            _Column(header="B median", key="b_median", unit=_Unit.BY_METRIC),
            _Column(header="B p10-p90", key="b_spread", unit=_Unit.BY_METRIC),
        ]
        tables.append(_Table(section=section, title=title, columns=cols, rows=rows))
    return tables


# ---------------------------------------------------------------------------- formats


def _cell(row: Any, col: _Column, human: bool, width: int | None) -> Any:
    value = _get(row, col.key)
    unit = col.unit
    if unit is _Unit.BY_METRIC:
        metric = _get(row, "metric")
        unit = _Unit.BYTES if metric.endswith("bytes") else _Unit.INT if metric in _COUNT_METRICS else _Unit.NS
        if isinstance(value, float) and unit is _Unit.INT:
            unit = _Unit.FLOAT
    return _human(value, unit, width) if human else _raw(value)


def _text(tables: list[_Table], top: int, markdown: bool) -> str:
    out: list[str] = []
    for table in tables:
        if markdown:
            out.append(f"## {table.title}\n")
            # findings are a list already; other sections' lines become one
            out.extend(table.lines if table.section == "findings" else (f"- {line}" for line in table.lines))
        else:
            out.append(table.title)
            out.append("=" * len(table.title))
            out.extend(table.lines)
        cols = [c for c in table.columns if not c.csv_only]
        if cols and table.rows:
            rows = table.rows
            # the per-step table can have thousands of rows: text and md show the first ``top``
            limit = top if table.section == "steps" and len(rows) > top else None
            shown = rows[:limit] if limit else rows
            cells = [[_cell(r, c, True, None if markdown else _NAME_WIDTH) for c in cols] for r in shown]
            headers = [c.header for c in cols]
            if markdown:
                out.append("")
                out.append("| " + " | ".join(headers) + " |")
                out.append("|" + "|".join("---" if c.unit in _LEFT_ALIGNED else "---:" for c in cols) + "|")
                for row in cells:
                    out.append("| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |")
            else:
                widths = [max(len(h), *(len(str(r[i])) for r in cells)) for i, h in enumerate(headers)]
                out.append("")
                out.append("  ".join(_pad(h, w, c) for h, w, c in zip(headers, widths, cols)))
                out.append("  ".join("-" * w for w in widths))
                for row in cells:
                    out.append("  ".join(_pad(str(v), w, c) for v, w, c in zip(row, widths, cols)))
            if limit:
                out.append(f"({len(rows) - limit:,} more rows in --format csv or json)")
        elif table.columns and not table.rows:
            out.append("(none)")
        out.append("")
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"


def _pad(text: str, width: int, col: _Column) -> str:
    return text.ljust(width) if col.unit in _LEFT_ALIGNED else text.rjust(width)


def _csv(tables: list[_Table]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    first = True
    for table in tables:
        if not table.columns:
            continue
        if not first:
            buf.write("\n")
        first = False
        cols = table.columns
        writer.writerow(["section"] + [c.csv_header or c.key for c in cols])
        for row in table.rows:
            writer.writerow([table.section] + [_cell(row, c, False, None) for c in cols])
    return buf.getvalue()


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
    text = _csv(tables) if fmt == "csv" else _text(tables, top, markdown=fmt == "md")
    # names from a trace may hold lone surrogates (JSON "\\ud800"): keep the output valid UTF-8
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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
