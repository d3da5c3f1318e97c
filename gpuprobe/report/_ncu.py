"""Read Nsight Compute exports: ``--csv --page raw``, ``--csv --page details`` and ``.ncu-rep``.

Each profiled kernel becomes one :class:`NcuKernel` holding the figures gpuprobe reads (under
the names of :data:`METRICS`, whatever the ncu version called them), the NVTX push/pop stack
of its launch and ncu's own rule results. A figure the file lacks is absent from
``NcuKernel.metrics`` (never 0).

CSV exports are read as ``ncu`` writes them to stdout: the program's own output and ncu's
``==PROF==`` lines before the table, numbers with thousands separators (``"10,776,576"``), the
units row of the raw page, empty cells, ``n/a``, rows shorter than the header. ``.ncu-rep`` files
are read with NVIDIA's ``ncu_report`` module when it imports, else with
``ncu --import FILE --csv``, else they are refused with an error saying what to install.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import re
import shutil
import subprocess
from typing import Any, NamedTuple

from gpuprobe.report._errors import ReportInputError, read_input

__all__ = [
    "METRICS",
    "MetricSpec",
    "NvtxRange",
    "NcuRule",
    "NcuKernel",
    "NcuExport",
    "sniff",
    "read_ncu",
    "parse_nvtx_stack",
]

#: The first bytes of a ``.ncu-rep`` file (``NVR`` and a NUL).
NCU_REP_MAGIC = b"NVR\x00"
#: The header of every ncu CSV table starts with this cell.
_HEADER_START = '"ID",'
#: How far into a file to look for ncu's lines: the program's output may come before the table.
SNIFF_BYTES = 1 << 20
_PUSH_POP_COLUMN = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
_NAME_COLUMNS = ("Kernel Name", "Demangled Name", "Function Name")
_TIME_UNITS = {
    "ns": 1.0, "nsecond": 1.0, "nanosecond": 1.0,
    "us": 1e3, "usecond": 1e3, "microsecond": 1e3,
    "ms": 1e6, "msecond": 1e6, "millisecond": 1e6,
    "s": 1e9, "second": 1e9,
}


class MetricSpec(NamedTuple):
    """One figure gpuprobe reads, and the names ncu versions give it.

    Attributes:
        key: gpuprobe's name for it (the JSON key).
        kind: ``time`` (converted to ns), ``pct`` (percent, 0-100) or ``number``.
        raw: Metric names (raw page, ``--metrics``, ``ncu_report``), newest first; legacy 2019.x
            names last.
        details: ``(Section Name, Metric Name)`` pairs of the details page.
        meaning: What it is, for the docs.
    """

    key: str
    kind: str
    raw: tuple[str, ...]
    details: tuple[tuple[str, str], ...]
    meaning: str


_SOL = "GPU Speed Of Light Throughput"
_OCC = "Occupancy"
_LAUNCH = "Launch Statistics"

#: What gpuprobe reads from an ncu export. The tests check each legacy name against the 2019.x
#: export in tests/data/ncu and each details pair against the 2023-2025 exports.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("duration_ns", "time", ("gpu__time_duration.sum", "gpu__time_duration"),
               ((_SOL, "Duration"),), "kernel duration (gpu__time_duration.sum)"),
    MetricSpec("sm_sol_pct", "pct", ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__sol_pct"),
               ((_SOL, "Compute (SM) Throughput"), (_SOL, "SM [%]")),
               "compute (SM) speed of light, % of peak"),
    MetricSpec("memory_sol_pct", "pct",
               ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "gpu__compute_memory_sol_pct"),
               ((_SOL, "Memory Throughput"), (_SOL, "Memory [%]")),
               "memory speed of light (the busiest of DRAM, L2, L1), % of peak"),
    MetricSpec("dram_pct", "pct", ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "fbpa__sol_pct"),
               ((_SOL, "DRAM Throughput"),),
               "DRAM throughput, % of peak (2019.x Pascal: frame-buffer SOL, fbpa__sol_pct)"),
    MetricSpec("achieved_occupancy_pct", "pct",
               ("sm__warps_active.avg.pct_of_peak_sustained_active", "sm__active_warps_avg_per_active_cycle_pct"),
               ((_OCC, "Achieved Occupancy"),), "achieved occupancy, % of the SM's warp slots"),
    MetricSpec("theoretical_occupancy_pct", "pct", ("sm__maximum_warps_per_active_cycle_pct",),
               ((_OCC, "Theoretical Occupancy"),), "theoretical occupancy, % of the SM's warp slots"),
    MetricSpec("block_limit_registers", "number", ("launch__occupancy_limit_registers",),
               ((_OCC, "Block Limit Registers"),), "blocks per SM the registers allow"),
    MetricSpec("block_limit_shared_mem", "number", ("launch__occupancy_limit_shared_mem",),
               ((_OCC, "Block Limit Shared Mem"),), "blocks per SM the shared memory allows"),
    MetricSpec("block_limit_warps", "number", ("launch__occupancy_limit_warps",),
               ((_OCC, "Block Limit Warps"),), "blocks per SM the warp slots allow"),
    MetricSpec("block_limit_blocks", "number", ("launch__occupancy_limit_blocks",),
               ((_OCC, "Block Limit SM"),), "blocks per SM the hardware allows"),
    MetricSpec("registers_per_thread", "number", ("launch__registers_per_thread",),
               ((_LAUNCH, "Registers Per Thread"),), "registers per thread"),
    MetricSpec("block_size", "number", ("launch__block_size",), ((_LAUNCH, "Block Size"),),
               "threads per block (else the product of the Block Size column)"),
    MetricSpec("grid_size", "number", ("launch__grid_size",), ((_LAUNCH, "Grid Size"),),
               "blocks in the grid (else the product of the Grid Size column)"),
    MetricSpec("waves_per_sm", "number", ("launch__waves_per_multiprocessor",), ((_LAUNCH, "Waves Per SM"),),
               "waves of blocks per SM (full waves and a fraction)"),
    MetricSpec("tensor_pct", "pct",
               ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active",
                "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"),
               (), "tensor pipe activity, % of peak (where the export holds it)"),
)
_BY_RAW = {name: spec for spec in METRICS for name in spec.raw}
_RAW_RANK = {name: i for spec in METRICS for i, name in enumerate(spec.raw)}
_BY_DETAILS = {pair: spec for spec in METRICS for pair in spec.details}


@dataclasses.dataclass(frozen=True)
class NvtxRange:
    """One push/pop range of a kernel's NVTX stack.

    Attributes:
        domain: The NVTX domain (``<default domain>`` when none).
        name: The range's message.
        payload: Its payload value as ncu prints it (gpuprobe: the step index), None if none.
    """

    domain: str
    name: str
    payload: str | None = None


@dataclasses.dataclass
class NcuRule:
    """One rule result of ncu's details page (a hint about a kernel).

    Attributes:
        section: The section the rule belongs to (``Occupancy``, ``SpeedOfLight``, ...).
        name: The rule (``TheoreticalOccupancy``, ``SOLBottleneck``, ...).
        type: ``OPT`` (an optimization), ``INF`` (information), ``WRN``, ``ERR``.
        description: ncu's text.
        speedup_type: ``local`` or ``global`` (ncu's estimate's kind), None if none.
        speedup_pct: ncu's estimated speedup, % of the kernel's time; None if none.
    """

    section: str
    name: str
    type: str
    description: str
    speedup_type: str | None
    speedup_pct: float | None


@dataclasses.dataclass
class NcuKernel:
    """One profiled kernel launch.

    Attributes:
        id: ncu's launch ID.
        name: The kernel name as ncu prints it.
        metrics: The figures of :data:`METRICS` the export holds (time in ns, percent as 0-100).
        nvtx: Its NVTX push/pop stack, outermost first.
        rules: ncu's rule results for it (details page).
        process_id: The process that launched it, if given.
        device: The device column, if given.
    """

    id: int
    name: str
    metrics: dict[str, float]
    nvtx: list[NvtxRange] = dataclasses.field(default_factory=list)
    rules: list[NcuRule] = dataclasses.field(default_factory=list)
    process_id: str | None = None
    device: str | None = None


@dataclasses.dataclass
class NcuExport:
    """An ncu export, read.

    Attributes:
        path: The file.
        page: ``raw`` or ``details`` (``.ncu-rep`` files read as ``raw``).
        kernels: The kernel launches, in file order.
        has_nvtx: The export has an NVTX push/pop column (``ncu --nvtx``).
        warnings: Things a reader must know (ncu's own ``==WARNING==`` lines among them).
    """

    path: str
    page: str
    kernels: list[NcuKernel]
    has_nvtx: bool
    warnings: list[str]


def sniff(head: bytes) -> str | None:
    """The ncu format of a file from its first bytes: ``ncu-rep``, ``ncu-csv`` or None.

    A CSV export is recognised by ncu's own lines (``==PROF==``, ``==ERROR==``, ``==WARNING==``)
    or by the header of its table, wherever it starts after the program's output.

    Example:
        >>> sniff(b'==PROF== Connected to process 1\\n"ID","Process ID","Process Name"')
        'ncu-csv'
        >>> sniff(b'{"traceEvents": []}') is None
        True
    """
    if head.startswith(NCU_REP_MAGIC):
        return "ncu-rep"
    if head.startswith(b"\x1f\x8b") or head.startswith(b"SQLite format 3"):
        return None
    text = head.decode("utf-8", "replace").removeprefix("\ufeff")  # a byte-order mark (ncu on Windows)
    for line in text.splitlines():
        if line.startswith(("==PROF==", "==ERROR==", "==WARNING==")) or (
            line.startswith(_HEADER_START) and '"Kernel Name"' in line
        ):
            return "ncu-csv"
    return None


def _number(text: str | None) -> float | None:
    """A CSV cell as a number: thousands separators dropped; empty, ``n/a`` or text → None."""
    if text is None:
        return None
    text = text.strip().replace(",", "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _dims(text: str | None) -> float | None:
    """``"(32, 4, 1)"`` → 128.0 (a block or grid size column); None if not such a tuple."""
    if not text:
        return None
    parts = re.findall(r"\d+", text)
    if not parts or not text.strip().startswith("("):
        return None
    return float(math.prod(int(p) for p in parts))


def _convert(spec: MetricSpec, value: float, unit: str) -> float | None:
    if spec.kind == "time":
        scale = _TIME_UNITS.get(unit.strip().lower())
        return None if scale is None else value * scale
    if spec.kind == "pct" and unit.strip() not in ("%", ""):
        return None  # e.g. the Memory Workload Analysis "Memory Throughput" in Gbyte/s
    return value


_ENTRY = re.compile(r'"([^"]*)"')


def parse_nvtx_stack(cell: str) -> list[NvtxRange]:
    """Parse ncu's push/pop NVTX column: ``TID  "DOMAIN:RANGE:PL_Type:PL_Value:...:Msg"  "..."``.

    Each entry is ``Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg``,
    outermost first; a range message holding ``:`` is recognised by its repetition in ``Msg``.

    Example:
        >>> parse_nvtx_stack('1  "gpuprobe:decode:Int64:1:RGB:0xf28e2b:REGISTERED:decode" ')
        [NvtxRange(domain='gpuprobe', name='decode', payload='1')]
    """
    entries = _ENTRY.findall(cell or "")
    if not entries:
        entries = [p for p in re.split(r"\s{2,}", (cell or "").strip()) if p and not p.isdigit()]
    out = []
    for entry in entries:
        fields = entry.split(":")
        if len(fields) < 2:
            continue
        domain = fields[0]
        body = fields[1:]
        name = None
        payload = None
        if len(body) >= 7:
            # RANGE (maybe with colons), PL_Type, PL_Value, CLR_Type, Color, Msg_Type, Msg (= RANGE)
            for cut in range(1, len(body) - 5):
                candidate = ":".join(body[:cut])
                if ":".join(body[cut + 5:]) == candidate:
                    name, payload = candidate, body[cut + 1]
                    break
            if name is None:
                name, payload = ":".join(body[: len(body) - 6]), body[-5]
        else:
            name = ":".join(body)
        if payload is not None and payload.strip().lower() in ("", "none"):
            payload = None
        out.append(NvtxRange(domain, name, payload))
    return out


def _csv_rows(path: str, text: str) -> tuple[list[list[str]], list[str]]:
    """The table rows (header first) of an ncu CSV export, and ncu's warnings before it."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(_HEADER_START)), None)
    before = lines if start is None else lines[:start]
    errors = [line for line in before if line.startswith("==ERROR==")]
    warnings = [line[len("==WARNING=="):].strip() for line in lines if line.startswith("==WARNING==")]
    if start is None:
        if any("No kernels were profiled" in w for w in warnings):
            raise ReportInputError(
                path, "Nsight Compute profiled no kernels ('No kernels were profiled'): its filters "
                "(--nvtx-include, --kernel-name, --launch-skip) selected none",
            )
        if errors:
            raise ReportInputError(path, "Nsight Compute reported errors and wrote no table: " + errors[0][9:].strip())
        raise ReportInputError(path, "not an Nsight Compute CSV export: no table header starting with '\"ID\",'")
    body = [line for line in lines[start:] if not line.startswith("==")]
    _check_whole(path, text, lines, body)
    try:
        return list(csv.reader(body)), warnings
    except csv.Error as exc:  # a NUL byte (Python < 3.11), a field over the csv module's limit
        raise ReportInputError(path, f"not a readable CSV table: {exc}") from None


def _check_whole(path: str, text: str, lines: list[str], body: list[str]) -> None:
    """Refuse a table cut short inside a row: ncu quotes every cell and ends every line with a line
    break, so a last row without its closing quote, or a table row with no line break after it at the
    end of the file, is a truncated file (whose last kernel would be read with figures missing)."""
    rows = [line for line in body if line.strip()]
    if not rows:
        return
    quoted = rows[0].rstrip().endswith('"')  # ncu's quoting (an edited file may have none)
    last = rows[-1].rstrip()
    cut_cell = quoted and len(rows) > 1 and not last.endswith('"')
    cut_line = not text.endswith(("\n", "\r")) and bool(lines) and lines[-1] == rows[-1]
    if cut_cell or cut_line:
        where = "inside a cell" if cut_cell else "without the line break ncu ends every line with"
        row = "header" if len(rows) == 1 else "last row"
        raise ReportInputError(
            path, f"truncated: the table's {row} (line {len(lines) - lines[::-1].index(rows[-1])}) ends {where}; "
            "export it again"
        )


def _row_dict(header: list[str], row: list[str]) -> dict[str, str]:
    return dict(zip(header, row))  # a ragged row lacks its trailing cells: those are absent


def _kernel_name(cells: dict[str, str]) -> str:
    for column in _NAME_COLUMNS:
        if cells.get(column):
            return cells[column]
    return "<unnamed kernel>"


def _id(path: str, cells: dict[str, str], line: int) -> int:
    value = _number(cells.get("ID"))
    if value is None:
        raise ReportInputError(path, f"table row {line}: the ID cell is {cells.get('ID', '')!r}, not a number")
    return int(value)


def _new_kernel(path: str, cells: dict[str, str], line: int, nvtx_column: str | None) -> NcuKernel:
    kernel = NcuKernel(
        id=_id(path, cells, line),
        name=_kernel_name(cells),
        metrics={},
        process_id=cells.get("Process ID") or None,
        device=cells.get("Device") or None,
    )
    if nvtx_column:
        kernel.nvtx = parse_nvtx_stack(cells.get(nvtx_column, ""))
    for key, column in (("block_size", "Block Size"), ("grid_size", "Grid Size")):
        size = _dims(cells.get(column))
        if size is not None:
            kernel.metrics[key] = size
    return kernel


def _put_raw(
    kernel: NcuKernel, name: str, value: str, unit: str, ranks: dict[str, int], negative: dict[str, int]
) -> None:
    spec = _BY_RAW.get(name)
    if spec is None:
        return
    number = _number(value)
    if number is None:
        return
    if number < 0:  # no figure gpuprobe reads can be negative: a damaged file, counted and said
        negative[spec.key] = negative.get(spec.key, 0) + 1
        return
    converted = _convert(spec, number, unit)
    rank = _RAW_RANK[name]
    if converted is not None and rank <= ranks.get(spec.key, rank):
        kernel.metrics[spec.key] = converted
        ranks[spec.key] = rank


def _read_raw(path: str, rows: list[list[str]], negative: dict[str, int]) -> list[NcuKernel]:
    header = rows[0]
    units: dict[str, str] = {}
    kernels = []
    nvtx_column = _PUSH_POP_COLUMN if _PUSH_POP_COLUMN in header else None
    for line, row in enumerate(rows[1:], 2):
        cells = _row_dict(header, row)
        if not any(c.strip() for c in row):
            continue
        if not cells.get("ID", "").strip():  # the units row
            units = cells
            continue
        kernel = _new_kernel(path, cells, line, nvtx_column)
        ranks: dict[str, int] = {}
        for column, value in cells.items():
            _put_raw(kernel, column, value, units.get(column, ""), ranks, negative)
        kernels.append(kernel)
    return kernels


def _read_details(path: str, rows: list[list[str]], negative: dict[str, int]) -> list[NcuKernel]:
    header = rows[0]
    nvtx_column = _PUSH_POP_COLUMN if _PUSH_POP_COLUMN in header else None
    by_id: dict[int, NcuKernel] = {}
    ranks: dict[int, dict[str, int]] = {}
    for line, row in enumerate(rows[1:], 2):
        if not any(c.strip() for c in row):
            continue
        cells = _row_dict(header, row)
        kid = _id(path, cells, line)
        kernel = by_id.get(kid)
        if kernel is None:
            kernel = by_id[kid] = _new_kernel(path, cells, line, nvtx_column)
            ranks[kid] = {}
        section = cells.get("Section Name", "")
        rule = cells.get("Rule Name", "")
        if rule:
            speedup = _number(cells.get("Estimated Speedup"))
            kernel.rules.append(NcuRule(
                section=section,
                name=rule,
                type=cells.get("Rule Type", ""),
                description=" ".join(cells.get("Rule Description", "").split()),
                speedup_type=cells.get("Estimated Speedup Type") or None,
                speedup_pct=speedup,
            ))
            continue
        name = cells.get("Metric Name", "")
        unit = cells.get("Metric Unit", "")
        value = cells.get("Metric Value", "")
        spec = _BY_DETAILS.get((section, name))
        if spec is not None:
            number = _number(value)
            if number is not None and number < 0:
                negative[spec.key] = negative.get(spec.key, 0) + 1
                number = None
            converted = None if number is None else _convert(spec, number, unit)
            # a section's own figure outranks a command-line metric of the same meaning
            if converted is not None:
                kernel.metrics[spec.key] = converted
                ranks[kid][spec.key] = -1
        else:
            _put_raw(kernel, name, value, unit, ranks[kid], negative)
    return list(by_id.values())


def _short_last_kernel(header: list[str], rows: list[list[str]]) -> list[str]:
    """A warning when the last kernel of a details page has fewer metric rows than every other: ncu
    writes the same sections for each, so the file was likely cut at a line break."""
    counts: dict[str, int] = {}
    rule = header.index("Rule Name") if "Rule Name" in header else -1
    id_at = header.index("ID")
    for row in rows[1:]:
        if len(row) > id_at and row[id_at].strip() and not (0 <= rule < len(row) and row[rule].strip()):
            counts[row[id_at]] = counts.get(row[id_at], 0) + 1
    if len(counts) < 2:
        return []
    *others, last = counts.items()
    fewest = min(n for _, n in others)
    if last[1] >= fewest:
        return []
    return [f"the last kernel (ID {last[0]}) has {last[1]} metric rows, the others {fewest} or more: the export may "
            "be cut short (its figures for that kernel are incomplete)"]


def _negative_warning(negative: dict[str, int]) -> list[str]:
    """The warning for negative figures left out (none, or one line naming them)."""
    if not negative:
        return []
    n = sum(negative.values())
    names = ", ".join(f"{key} ({count:,})" for key, count in sorted(negative.items()))
    return [f"{n:,} negative figure{'s' if n != 1 else ''} left out ({names}): ncu writes none, so the export is "
            "damaged or edited"]


def _read_csv_text(path: str, text: str) -> NcuExport:
    rows, warnings = _csv_rows(path, text)
    header = rows[0]
    if "ID" not in header or not any(c in header for c in _NAME_COLUMNS):
        raise ReportInputError(path, "not an Nsight Compute CSV export: the table has no 'Kernel Name' column")
    details = "Metric Name" in header and "Metric Value" in header
    negative: dict[str, int] = {}
    kernels = _read_details(path, rows, negative) if details else _read_raw(path, rows, negative)
    warnings.extend(_negative_warning(negative))
    if details:
        warnings.extend(_short_last_kernel(header, rows))
    if not kernels:
        raise ReportInputError(path, "an Nsight Compute CSV export with no kernel rows (no kernel was profiled)")
    return NcuExport(
        path=path,
        page="details" if details else "raw",
        kernels=kernels,
        has_nvtx=_PUSH_POP_COLUMN in header,
        warnings=warnings,
    )


# ---------------------------------------------------------------------------- .ncu-rep


def _import_ncu_report() -> Any:
    try:
        import ncu_report  # type: ignore[import-not-found]  # NVIDIA's, in <Nsight Compute>/extras/python

        return ncu_report
    except ImportError:
        return None


def _read_with_module(path: str, module: Any) -> NcuExport:
    """Read a report through ``ncu_report`` (not run here: no Nsight Compute on the test machines).

    Metrics and NVTX push/pop ranges only (no payloads, no rule results: ``ncu --import FILE --csv
    --page details`` has those).
    """
    negative: dict[str, int] = {}
    try:
        context = module.load_report(path)
        kernels: list[NcuKernel] = []
        has_nvtx = False
        for r in range(context.num_ranges()):
            rng = context.range_by_idx(r)
            for a in range(rng.num_actions()):
                action = rng.action_by_idx(a)
                kernel = NcuKernel(id=len(kernels), name=str(action.name()), metrics={})
                ranks: dict[str, int] = {}
                for name in action.metric_names():
                    if name in _BY_RAW:
                        metric = action.metric_by_name(name)
                        unit = metric.unit() if hasattr(metric, "unit") else ""
                        _put_raw(kernel, name, str(metric.as_double()), str(unit), ranks, negative)
                state = action.nvtx_state()
                if state is not None:
                    for domain_id in state.domains():
                        domain = state.domain_by_id(domain_id)
                        for message in domain.push_pop_ranges():
                            has_nvtx = True
                            kernel.nvtx.append(NvtxRange(str(domain.name()), str(message)))
                kernels.append(kernel)
    except Exception as exc:  # the module's own errors (a report of a newer version, a damaged file)
        raise ReportInputError(path, f"ncu_report cannot read it: {type(exc).__name__}: {exc}") from None
    if not kernels:
        raise ReportInputError(path, "an Nsight Compute report with no kernel results")
    warnings = ["read through ncu_report: no rule results and no NVTX payloads (ncu --import FILE --csv "
                "--page details has the rules)"] + _negative_warning(negative)
    return NcuExport(path=path, page="raw", kernels=kernels, has_nvtx=has_nvtx, warnings=warnings)


def _read_with_cli(path: str, ncu: str) -> NcuExport:
    outputs = {}
    for page in ("raw", "details"):
        try:
            done = subprocess.run(
                [ncu, "--import", path, "--csv", "--page", page],
                capture_output=True, text=True, errors="replace", timeout=600, check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise ReportInputError(path, f"'{ncu} --import' failed: {exc}") from None
        if done.returncode != 0 and _HEADER_START not in done.stdout:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise ReportInputError(
                path, f"'{ncu} --import' exited with {done.returncode}" + (f": {detail[-1]}" if detail else "")
            )
        outputs[page] = done.stdout
    export = _read_csv_text(path, outputs["raw"])
    try:
        rules = {k.id: k.rules for k in _read_csv_text(path, outputs["details"]).kernels}
    except ReportInputError:
        rules = {}
    for kernel in export.kernels:
        kernel.rules = rules.get(kernel.id, [])
    return export


def read_ncu(path: str | os.PathLike[str], fmt: str | None = None) -> NcuExport:
    """Read an Nsight Compute export (raw or details CSV, or ``.ncu-rep``).

    Args:
        path: The file.
        fmt: ``ncu-csv`` or ``ncu-rep`` when already sniffed; None to sniff here.

    Returns:
        The kernels it holds.

    Raises:
        ReportInputError: Not an ncu export, only ``==ERROR==`` lines, no kernel rows, or a
            ``.ncu-rep`` with neither ``ncu_report`` nor ``ncu`` at hand.

    Example:
        >>> export = read_ncu("tests/data/ncu/esmm_sgemm_a10g_details.csv")  # doctest: +SKIP
        >>> len(export.kernels)  # doctest: +SKIP
        9
    """
    path = os.fspath(path)
    data = read_input(path, what="an Nsight Compute export")
    fmt = fmt or sniff(data[:SNIFF_BYTES])
    if fmt == "ncu-rep":
        module = _import_ncu_report()
        if module is not None:
            return _read_with_module(path, module)
        ncu = shutil.which("ncu")
        if ncu is not None:
            return _read_with_cli(path, ncu)
        raise ReportInputError(
            path,
            "an Nsight Compute report (.ncu-rep): reading it needs NVIDIA's ncu_report Python module "
            "(add <Nsight Compute>/extras/python to PYTHONPATH) or the ncu command on PATH; or export it "
            "where ncu is installed: ncu --import FILE --csv --page raw > FILE.csv",
        )
    if fmt != "ncu-csv":
        raise ReportInputError(path, "not an Nsight Compute export (neither a .ncu-rep nor ncu's CSV output)")
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark, if any, is not part of the header
    except UnicodeDecodeError as exc:
        raise ReportInputError(path, f"not UTF-8 text at byte {exc.start}: not an Nsight Compute CSV export") from None
    return _read_csv_text(path, text)

