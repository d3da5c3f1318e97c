"""The table toolkit: a section describes its tables (columns with a unit each, rows, lines of text
above them) and one writer turns them into text, Markdown or CSV.

A writer only decides how a unit looks: terminal and Markdown tables show human units and short
names; CSV keeps integer nanoseconds, bytes and full names. JSON is not a table format: it is the
report's own ``to_dict()``.

Example:
    >>> rows = [{"name": "gemm", "total_ns": 18304}]
    >>> columns = [Column("kernel", "name", Unit.NAME), Column("total", "total_ns", Unit.NS)]
    >>> table = Table("kernels", "Top kernels", columns, rows)
    >>> print(write([table], "csv"), end="")
    section,name,total_ns
    kernels,gemm,18304
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
from collections.abc import Callable
from typing import Any

__all__ = [
    "Unit",
    "Column",
    "Table",
    "TABLE_FORMATS",
    "STEP_SPREAD_COLUMNS",
    "write",
    "format_ns",
    "format_bytes",
    "format_flop_rate",
]

#: What :func:`write` writes.
TABLE_FORMATS: tuple[str, ...] = ("text", "md", "csv")
_NAME_WIDTH = 72


class Unit(enum.Enum):
    """How the values of a column look in text and Markdown tables (CSV keeps raw values)."""

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


_LEFT_ALIGNED = (Unit.TEXT, Unit.NAME)
_COUNT_METRICS = ("count", "launches", "kernels")


@dataclasses.dataclass
class Column:
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
    unit: Unit = Unit.TEXT
    csv_only: bool = False
    csv_header: str | None = None


@dataclasses.dataclass
class Table:
    """One table: its rows (dataclasses or dicts), and lines of text shown above them.

    Attributes:
        section: The name in the CSV ``section`` column.
        title: The heading in text and Markdown.
        columns: The columns; none for a table of lines only (the summary).
        rows: Dataclasses or dicts holding each column's ``key``.
        lines: Text above the rows.
        cut: Text and Markdown show the first ``top`` rows only (a per-step table can have thousands).
        listed: The lines are Markdown list items already (findings); otherwise each becomes one.
    """

    section: str
    title: str
    columns: list[Column]
    rows: list[Any]
    lines: list[str] = dataclasses.field(default_factory=list)
    cut: bool = False
    listed: bool = False


#: A row's time per step across steps: median, p10 and p90 (``step_median_ns``, ``step_p10_ns``, ``step_p90_ns``).
STEP_SPREAD_COLUMNS = [Column("per step (median)", "step_median_ns", Unit.NS), Column("p10", "step_p10_ns", Unit.NS),
                       Column("p90", "step_p90_ns", Unit.NS)]


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


def format_bytes(n: int | float | None) -> str:
    """Format a byte count for people.

    Example:
        >>> format_bytes(1536), format_bytes(2_500_000_000)
        ('1.54 kB', '2.50 GB')
    """
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_flop_rate(value: float) -> str:
    """Format FLOP/s for people.

    Example:
        >>> format_flop_rate(3.2e12)
        '3.20 TFLOP/s'
    """
    for unit, size in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} FLOP/s"


#: How a value of each unit looks for people (TEXT and NAME: as it is).
_HUMAN: dict[Unit, Callable[[Any], str]] = {
    Unit.NS: format_ns,
    Unit.SHARE: lambda v: f"{v * 100:.1f} %",
    Unit.BYTES: format_bytes,
    Unit.GBPS: lambda v: f"{v:.2f} GB/s",
    Unit.RATIO: lambda v: f"{v:.2f}x",
    Unit.FLOP_RATE: format_flop_rate,
    Unit.FLOAT: lambda v: f"{v:.1f}",
    Unit.INT: lambda v: f"{v:,}",
}


def _human(value: Any, unit: Unit, width: int | None) -> str:
    if value is None:
        return "-"
    shown = _HUMAN.get(unit)
    if shown is not None:
        return shown(value)
    text = str(value)
    if unit is Unit.NAME and width and len(text) > width:
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


def _cell(row: Any, col: Column, human: bool, width: int | None) -> Any:
    value = _get(row, col.key)
    unit = col.unit
    if unit is Unit.BY_METRIC:
        metric = _get(row, "metric")
        unit = Unit.BYTES if metric.endswith("bytes") else Unit.INT if metric in _COUNT_METRICS else Unit.NS
        if isinstance(value, float) and unit is Unit.INT:
            unit = Unit.FLOAT
    return _human(value, unit, width) if human else _raw(value)


def _pad(text: str, width: int, col: Column) -> str:
    return text.ljust(width) if col.unit in _LEFT_ALIGNED else text.rjust(width)


def _text(tables: list[Table], top: int, markdown: bool) -> str:
    out: list[str] = []
    for table in tables:
        if markdown:
            out.append(f"## {table.title}\n")
            out.extend(table.lines if table.listed else (f"- {line}" for line in table.lines))
        else:
            out.append(table.title)
            out.append("=" * len(table.title))
            out.extend(table.lines)
        cols = [c for c in table.columns if not c.csv_only]
        if cols and table.rows:
            rows = table.rows
            limit = top if table.cut and len(rows) > top else None
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


def _csv(tables: list[Table]) -> str:
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


def write(tables: list[Table], fmt: str, top: int = 20) -> str:
    """Write tables as text.

    Args:
        tables: The tables, in order.
        fmt: One of :data:`TABLE_FORMATS`: ``text`` (terminal tables), ``md`` (Markdown), ``csv``
            (one table per section, each with a header row and a ``section`` column, separated by
            blank lines; tables without columns are left out).
        top: Rows shown of a table marked ``cut`` (text and Markdown).

    Returns:
        The text, valid UTF-8 (a lone surrogate of a trace's names is written as ``\\ud800``).
    """
    text = _csv(tables) if fmt == "csv" else _text(tables, top, markdown=fmt == "md")
    # names from a trace may hold lone surrogates (JSON "\\ud800"): keep the output valid UTF-8
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
