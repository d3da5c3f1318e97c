"""Render Nsight Compute reports and diffs in the report's formats (text, md, json, csv).

The tables go through the report's table toolkit (:mod:`gpuprobe.report._tables`),
so an ncu report looks like the rest: findings first, then kernels, families, gpuprobe steps,
components and logits processors, and the timeline join when there is one.
"""

from __future__ import annotations

import json
from typing import Any

from gpuprobe.errors import ConfigError
from gpuprobe.report._ncu_analysis import NcuDiff, NcuReport, NcuRow
from gpuprobe.report._render import FORMATS, findings_table
from gpuprobe.report._tables import Column, Table, Unit, format_ns, write

__all__ = ["render_ncu"]


def _classes(classes: list[str]) -> str:
    return ", ".join(classes) if classes else "-"


def _efficiency_columns() -> list[Column]:
    return [
        Column(header="SM %", key="sm_sol_pct", unit=Unit.FLOAT),
        Column(header="mem %", key="memory_sol_pct", unit=Unit.FLOAT),
        Column(header="DRAM %", key="dram_pct", unit=Unit.FLOAT),
        Column(header="occ %", key="achieved_occupancy_pct", unit=Unit.FLOAT),
        Column(header="occ theo %", key="theoretical_occupancy_pct", unit=Unit.FLOAT),
        Column(header="limiter", key="limiter"),
        Column(header="regs", key="registers_per_thread", unit=Unit.INT),
        Column(header="block", key="block_size", unit=Unit.INT),
        Column(header="grid", key="grid_size", unit=Unit.INT),
        Column(header="waves", key="waves_text"),
        Column(header="waves", key="waves_per_sm", csv_only=True),
        Column(header="tensor %", key="tensor_pct", unit=Unit.FLOAT),
        Column(header="class", key="classes_text"),
        Column(header="evidence", key="evidence_text", csv_only=True, csv_header="evidence"),
    ]


def _row_dict(row: NcuRow) -> dict[str, Any]:
    out = dict(vars(row))
    for key in ("registers_per_thread", "block_size", "grid_size"):
        if out[key] is not None:
            out[key] = int(out[key])
    out["waves_text"] = "-" if row.waves_per_sm is None else f"{row.waves_per_sm:.2f}"  # 0.02 waves is not 0.0
    out["classes_text"] = _classes(row.classes)
    out["evidence_text"] = json.dumps(row.evidence, sort_keys=True)
    return out


def _rows_table(section: str, title: str, first: list[Column], rows: list[NcuRow], lines: list[str]) -> Table:
    columns = first + [
        Column(header="category", key="category"),
        Column(header="launches", key="launches", unit=Unit.INT),
        Column(header="time", key="duration_ns", unit=Unit.NS),
        Column(header="share", key="share", unit=Unit.SHARE),
    ] + _efficiency_columns()
    return Table(section=section, title=title, columns=columns, rows=[_row_dict(r) for r in rows], lines=lines)


def _report_tables(report: NcuReport, markdown: bool, top: int) -> list[Table]:
    tables = [findings_table(report.findings, markdown)]
    lines = [f"warning: {w}" for w in report.warnings]
    lines += [
        f"Nsight Compute export: {report.path} ({report.page} page); {report.launches:,} kernel launches, "
        f"{format_ns(report.duration_ns)} of kernel time as ncu measured it (each launch replayed alone)",
        "absent from this export: " + (", ".join(report.metrics_absent) or "nothing"),
        "SM % / mem %: speed of light, % of peak; occ %: achieved occupancy; classes: memory-bound / "
        "compute-bound (SOL >= {0:g} %), latency-bound (both below), under-occupied, tail-effect "
        "(docs/report.md)".format(report.thresholds["ncu.sol_high_pct"]),
    ]
    if not report.has_nvtx:
        lines.append("no NVTX column (profile with ncu --nvtx): no grouping by gpuprobe step or component")
    tables.append(Table(section="summary", title="Nsight Compute", columns=[], rows=[], lines=lines))
    if report.timeline is not None:
        rows = [dict(vars(r), classes_text=_classes(r.classes)) for r in report.timeline]
        tables.append(Table(
            section="ncu_timeline",
            title="Kernel families: share of GPU time (timeline) and efficiency (ncu)",
            columns=[
                Column(header="family", key="family", unit=Unit.NAME),
                Column(header="category", key="category"),
                Column(header="time", key="timeline_ns", unit=Unit.NS),
                Column(header="share", key="timeline_share", unit=Unit.SHARE),
                Column(header="kernels", key="timeline_count", unit=Unit.INT),
                Column(header="ncu launches", key="ncu_launches", unit=Unit.INT),
                Column(header="SM %", key="sm_sol_pct", unit=Unit.FLOAT),
                Column(header="mem %", key="memory_sol_pct", unit=Unit.FLOAT),
                Column(header="occ %", key="achieved_occupancy_pct", unit=Unit.FLOAT),
                Column(header="class", key="classes_text"),
            ],
            rows=rows[:top],
            lines=[
                f"timeline: {report.timeline_path}; ncu: {report.path}",
                "a family without timeline figures is not in the timeline; one with 0 ncu launches was not profiled",
            ],
        ))
    name = Column(header="name", key="name", unit=Unit.NAME)
    tables.append(_rows_table(
        "ncu_kernels", "Kernels (ncu)",
        [Column(header="kernel", key="short_name", unit=Unit.NAME),
         Column(header="name", key="name", csv_only=True), Column(header="family", key="family", csv_only=True)],
        report.kernels[:top], [],
    ))
    tables.append(_rows_table("ncu_families", "Kernel families (ncu)", [name], report.families[:top], []))
    if report.has_nvtx:
        tables.append(_rows_table("ncu_steps", "gpuprobe steps (NVTX)", [name], report.steps, []))
        tables.append(_rows_table(
            "ncu_components", "Inside the steps: components and logits processors (NVTX)", [name],
            report.components[:top], [],
        ))
        tables.append(_rows_table("ncu_processors", "Logits processors (NVTX)", [name], report.processors[:top], []))
    return tables


def _diff_tables(d: NcuDiff, top: int) -> list[Table]:
    rows = []
    for r in d.families[:top]:
        row = dict(vars(r))
        row["a_class"] = _classes(r.a_classes)
        row["b_class"] = _classes(r.b_classes)
        rows.append(row)
    lines = [f"warning: {w}" for w in d.warnings] + [
        f"A: {d.a_path} ({format_ns(d.a_duration_ns)} of kernel time)",
        f"B: {d.b_path} ({format_ns(d.b_duration_ns)} of kernel time)",
        "per kernel family, as ncu measured each launch; delta = B - A; ratio = B / A",
    ]
    return [
        Table(section="summary", title="Nsight Compute diff", columns=[], rows=[], lines=lines),
        Table(
            section="ncu_families",
            title="Kernel families",
            columns=[
                Column(header="family", key="family", unit=Unit.NAME),
                Column(header="category", key="category"),
                Column(header="A launches", key="a_launches", unit=Unit.INT),
                Column(header="B launches", key="b_launches", unit=Unit.INT),
                Column(header="A time", key="a_duration_ns", unit=Unit.NS),
                Column(header="B time", key="b_duration_ns", unit=Unit.NS),
                Column(header="delta", key="delta_ns", unit=Unit.NS),
                Column(header="ratio", key="ratio", unit=Unit.RATIO),
                Column(header="A SM %", key="a_sm_sol_pct", unit=Unit.FLOAT),
                Column(header="B SM %", key="b_sm_sol_pct", unit=Unit.FLOAT),
                Column(header="A mem %", key="a_memory_sol_pct", unit=Unit.FLOAT),
                Column(header="B mem %", key="b_memory_sol_pct", unit=Unit.FLOAT),
                Column(header="A occ %", key="a_achieved_occupancy_pct", unit=Unit.FLOAT),
                Column(header="B occ %", key="b_achieved_occupancy_pct", unit=Unit.FLOAT),
                Column(header="A class", key="a_class"),
                Column(header="B class", key="b_class"),
            ],
            rows=rows,
        ),
    ]


def render_ncu(report: NcuReport | NcuDiff, fmt: str = "text", top: int = 20) -> str:
    """Render an ncu report or diff.

    Args:
        report: What :func:`~gpuprobe.report._ncu_analysis.analyze_ncu` or ``diff_ncu`` returned.
        fmt: One of the report's formats (text, md, json, csv).
        top: Rows per table in every format (the findings are all shown).

    Returns:
        The rendered text.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=1) + "\n"
    markdown = fmt == "md"
    tables = _diff_tables(report, top) if isinstance(report, NcuDiff) else _report_tables(report, markdown, top)
    return write(tables, fmt, top)
