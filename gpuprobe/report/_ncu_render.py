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
from gpuprobe.report._render import FORMATS
from gpuprobe.report._tables import Column, Table, Unit, format_ns, write
from gpuprobe.report.sections.findings import findings_table

__all__ = ["render_ncu"]


def _classes(classes: list[str]) -> str:
    return ", ".join(classes) if classes else "-"


def _efficiency_columns() -> list[Column]:
    return [
        Column("SM %", "sm_sol_pct", Unit.FLOAT), Column("mem %", "memory_sol_pct", Unit.FLOAT),
        Column("DRAM %", "dram_pct", Unit.FLOAT), Column("occ %", "achieved_occupancy_pct", Unit.FLOAT),
        Column("occ theo %", "theoretical_occupancy_pct", Unit.FLOAT), Column("limiter", "limiter"),
        Column("regs", "registers_per_thread", Unit.INT), Column("block", "block_size", Unit.INT),
        Column("grid", "grid_size", Unit.INT), Column("waves", "waves_text"),
        Column("waves", "waves_per_sm", csv_only=True), Column("tensor %", "tensor_pct", Unit.FLOAT),
        Column("class", "classes_text"), Column("evidence", "evidence_text", csv_only=True, csv_header="evidence"),
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
        Column("category", "category"), Column("launches", "launches", Unit.INT),
        Column("time", "duration_ns", Unit.NS), Column("share", "share", Unit.SHARE),
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
                Column("family", "family", Unit.NAME), Column("category", "category"),
                Column("time", "timeline_ns", Unit.NS), Column("share", "timeline_share", Unit.SHARE),
                Column("kernels", "timeline_count", Unit.INT), Column("ncu launches", "ncu_launches", Unit.INT),
                Column("SM %", "sm_sol_pct", Unit.FLOAT), Column("mem %", "memory_sol_pct", Unit.FLOAT),
                Column("occ %", "achieved_occupancy_pct", Unit.FLOAT), Column("class", "classes_text"),
            ],
            rows=rows[:top],
            lines=[
                f"timeline: {report.timeline_path}; ncu: {report.path}",
                "a family without timeline figures is not in the timeline; one with 0 ncu launches was not profiled",
            ],
        ))
    name = Column("name", "name", Unit.NAME)
    tables.append(_rows_table(
        "ncu_kernels", "Kernels (ncu)",
        [Column("kernel", "short_name", Unit.NAME),
         Column("name", "name", csv_only=True), Column("family", "family", csv_only=True)],
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
                Column("family", "family", Unit.NAME), Column("category", "category"),
                Column("A launches", "a_launches", Unit.INT), Column("B launches", "b_launches", Unit.INT),
                Column("A time", "a_duration_ns", Unit.NS), Column("B time", "b_duration_ns", Unit.NS),
                Column("delta", "delta_ns", Unit.NS), Column("ratio", "ratio", Unit.RATIO),
                Column("A SM %", "a_sm_sol_pct", Unit.FLOAT), Column("B SM %", "b_sm_sol_pct", Unit.FLOAT),
                Column("A mem %", "a_memory_sol_pct", Unit.FLOAT), Column("B mem %", "b_memory_sol_pct", Unit.FLOAT),
                Column("A occ %", "a_achieved_occupancy_pct", Unit.FLOAT),
                Column("B occ %", "b_achieved_occupancy_pct", Unit.FLOAT), Column("A class", "a_class"),
                Column("B class", "b_class"),
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
