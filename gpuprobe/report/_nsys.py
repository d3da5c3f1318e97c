"""Events from an Nsight Systems SQLite export (``nsys export --type sqlite``).

The schema drifts between nsys versions, so every table and column is checked before use and a
missing optional column reads as NULL. Rows are streamed from cursors; names are joined from
``StringIds`` by SQLite (through its primary key), so no table is held in memory.
Facts used: times are integer ns since session start; ``globalPid = pid << 24 | 1 << 48`` style
packing (pid in bits 24-47, tid in bits 0-23); runtime API names carry a version suffix;
``NVTX_EVENTS.eventType`` 59 is a push/pop range, 60 a start/end range, 34 a mark.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator

from gpuprobe._kernel_names import strip_api_version
from gpuprobe.report._events import KERNEL, LIMIT, MEMCPY, MEMSET, RANGE, RUNTIME, Event, TraceInfo, int_or

__all__ = ["iter_events", "NsysFormatError"]

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX_TABLE = "NVTX_EVENTS"
_ACTIVITY_TABLES = (KERNEL_TABLE, RUNTIME_TABLE, MEMCPY_TABLE, MEMSET_TABLE, NVTX_TABLE)
_NVTX_PUSH_POP = 59
_NVTX_START_END = 60
# cudaMemcpyKind-like values of CUPTI_ACTIVITY_KIND_MEMCPY.copyKind (CUpti_ActivityMemcpyKind)
_COPY_KIND = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
# Memory kinds of a copy's source and destination (the ENUM_CUDA_MEM_KIND table of the export,
# when present, takes precedence); the labels are kineto's, so that both name copies alike.
_MEMORY_KIND = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
}


class NsysFormatError(Exception):
    """The database is not a usable Nsight Systems export; the message says why."""


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f'PRAGMA table_info("{table}")')}


def _col(cols: set[str], name: str, prefix: str = "") -> str:
    return f"{prefix}{name}" if name in cols else "NULL"


def _pid(global_id: object) -> int:
    return (global_id >> 24) & 0xFFFFFF if type(global_id) is int else 0  # type: ignore[operator]


def _tid(global_tid: object) -> int:
    return global_tid & 0xFFFFFF if type(global_tid) is int else 0  # type: ignore[operator]


def _only(process: int | None, column: str, joiner: str = " WHERE ") -> str:
    """The SQL condition keeping the rows of one process (its id is bits 24-47 of a global id), or ""."""
    return "" if process is None else f"{joiner}(({column} >> 24) & 16777215) = {int(process)}"


def _span(start: object, end: object) -> bool:
    """Whether a row has integer times in range (rows without are skipped)."""
    return type(start) is int and type(end) is int and -LIMIT < start <= end < LIMIT  # type: ignore[operator]


def kernel_processes(con: sqlite3.Connection) -> list[int]:
    """The process ids of the export's kernels, sorted ([] without a kernel table)."""
    tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    if KERNEL_TABLE not in tables or "globalPid" not in _columns(con, KERNEL_TABLE):
        return []
    return sorted({_pid(g) for (g,) in con.execute(f"SELECT DISTINCT globalPid FROM {KERNEL_TABLE}")})


def iter_events(
    con: sqlite3.Connection,
    info: TraceInfo,
    progress: Callable[[int, int], None] | None = None,
    process: int | None = None,
) -> Iterator[Event]:
    """Yield the events of an opened export.

    Args:
        con: A read-only connection.
        info: Filled with devices, base time and notes.
        progress: Called with ``(rows_done, rows_total)`` every 64k rows.
        process: Only the events of this process id (one rank of an export holding several); the
            environment's ``RANK`` is then not the process's and is not read.

    Raises:
        NsysFormatError: No nsys activity table, or a needed table or column is missing.
    """
    tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    present = [t for t in _ACTIVITY_TABLES if t in tables]
    if not present:
        raise NsysFormatError(
            "not an Nsight Systems export: none of the tables " + ", ".join(_ACTIVITY_TABLES) + " exist"
        )
    needs_strings = any(t in tables for t in (KERNEL_TABLE, RUNTIME_TABLE))
    if needs_strings and "StringIds" not in tables:
        raise NsysFormatError("missing table StringIds (names of kernels and API calls)")
    cols = {t: _columns(con, t) for t in present}
    for table in present:
        missing = {"start", "end"} - cols[table]
        if missing:
            raise NsysFormatError(f"table {table} lacks column {sorted(missing)[0]}")
    if KERNEL_TABLE not in tables:
        info.notes.append(f"no {KERNEL_TABLE} table: the export holds no kernel records")
    _read_target_info(con, tables, info)
    if process is not None:
        info.rank = info.rank_source = None

    total = 0
    if progress is not None:
        for table in present:
            total += con.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
    done = 0

    def rows(sql: str) -> Iterator[tuple]:
        nonlocal done
        for row in con.execute(sql):
            yield row
            done += 1
            if progress is not None and not done & 0xFFFF:
                progress(done, total)

    if NVTX_TABLE in tables:
        c = cols[NVTX_TABLE]
        if "eventType" not in c:
            raise NsysFormatError(f"table {NVTX_TABLE} lacks column eventType")
        text_id = "s.value" if "textId" in c and "StringIds" in tables else "NULL"
        join = "LEFT JOIN StringIds s ON s.id = n.textId" if text_id != "NULL" else ""
        sql = (
            f"SELECT n.start, n.end, {_col(c, 'text', 'n.')}, {text_id}, {_col(c, 'globalTid', 'n.')} "
            f"FROM {NVTX_TABLE} n {join} WHERE n.eventType IN ({_NVTX_PUSH_POP}, {_NVTX_START_END})"
            + _only(process, _col(c, "globalTid", "n."), " AND ")
        )
        unclosed = 0
        for start, end, text, text2, gtid in rows(sql):
            if not _span(start, end):
                unclosed += 1
                continue
            name = text if isinstance(text, str) else text2 if isinstance(text2, str) else "(unnamed)"
            yield Event(RANGE, name, start, end - start, _pid(gtid), _tid(gtid))
        if unclosed:
            info.notes.append(f"{unclosed} NVTX ranges without a valid end were left out")

    if RUNTIME_TABLE in tables:
        c = cols[RUNTIME_TABLE]
        if "nameId" not in c:
            raise NsysFormatError(f"table {RUNTIME_TABLE} lacks column nameId")
        sql = (
            f"SELECT r.start, r.end, {_col(c, 'correlationId', 'r.')}, {_col(c, 'globalTid', 'r.')}, s.value "
            f"FROM {RUNTIME_TABLE} r LEFT JOIN StringIds s ON s.id = r.nameId" + _only(process, _col(c, "globalTid", "r."))
        )
        for start, end, corr, gtid, name in rows(sql):
            if not _span(start, end):
                info.skipped_events += 1
                continue
            api = strip_api_version(name) if isinstance(name, str) else "(unknown API)"
            yield Event(RUNTIME, api, start, end - start, _pid(gtid), _tid(gtid), int_or(corr))

    if KERNEL_TABLE in tables:
        c = cols[KERNEL_TABLE]
        name_col = next((n for n in ("demangledName", "shortName", "mangledName") if n in c), None)
        if name_col is None:
            raise NsysFormatError(f"table {KERNEL_TABLE} lacks a name column (demangledName or shortName)")
        sql = (
            f"SELECT k.start, k.end, {_col(c, 'correlationId', 'k.')}, {_col(c, 'globalPid', 'k.')}, "
            f"{_col(c, 'deviceId', 'k.')}, {_col(c, 'streamId', 'k.')}, s.value "
            f"FROM {KERNEL_TABLE} k LEFT JOIN StringIds s ON s.id = k.{name_col}" + _only(process, _col(c, "globalPid", "k."))
        )
        for start, end, corr, gpid, device, stream, name in rows(sql):
            if not _span(start, end):
                info.skipped_events += 1
                continue
            kname = name if isinstance(name, str) else "(unnamed kernel)"
            stream = int_or(stream)
            device = int_or(device)
            # positional, in Event's field order, as in _kineto.to_event; nbytes -1: unknown
            yield Event(KERNEL, kname, start, end - start, _pid(gpid), stream, int_or(corr), -1, stream, device)

    directions = dict(_COPY_KIND)
    if "ENUM_CUDA_MEMCPY_OPER" in tables:
        for key, label in con.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER"):
            if type(key) is int and isinstance(label, str) and label.startswith("CUDA_MEMCPY_KIND_"):
                code = label[len("CUDA_MEMCPY_KIND_") :]
                if len(code) == 4 and code[1:3] == "TO":
                    directions[key] = f"{code[0]}to{code[3]}"
    memory_kinds = dict(_MEMORY_KIND)
    if "ENUM_CUDA_MEM_KIND" in tables:
        for key, label in con.execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND"):
            if type(key) is int and isinstance(label, str) and label:
                memory_kinds[key] = label
    for table, kind in ((MEMCPY_TABLE, MEMCPY), (MEMSET_TABLE, MEMSET)):
        if table not in tables:
            continue
        c = cols[table]
        sql = (
            f"SELECT start, end, {_col(c, 'correlationId')}, {_col(c, 'globalPid')}, {_col(c, 'deviceId')}, "
            f"{_col(c, 'streamId')}, {_col(c, 'bytes')}, {_col(c, 'copyKind')}, {_col(c, 'srcKind')}, "
            f"{_col(c, 'dstKind')} FROM {table}" + _only(process, _col(c, "globalPid"))
        )
        for start, end, corr, gpid, device, stream, nbytes, copy_kind, src_kind, dst_kind in rows(sql):
            if not _span(start, end):
                info.skipped_events += 1
                continue
            stream = int_or(stream)
            if kind == MEMCPY:
                direction = directions.get(copy_kind, "unknown")  # type: ignore[arg-type]
                src, dst = memory_kinds.get(src_kind), memory_kinds.get(dst_kind)  # type: ignore[arg-type]
                # named as kineto names copies, "Memcpy HtoD (Pageable -> Device)", where the kinds are known
                name = f"Memcpy {direction} ({src} -> {dst})" if src and dst else f"Memcpy {direction}"
            else:
                direction = ""
                name = "Memset"
            yield Event(
                kind,
                name,
                start,
                end - start,
                _pid(gpid),
                stream,
                int_or(corr),
                int_or(nbytes),
                stream,
                int_or(device),
                direction,
            )


def _read_target_info(con: sqlite3.Connection, tables: set[str], info: TraceInfo) -> None:
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        if "utcEpochNs" in _columns(con, "TARGET_INFO_SESSION_START_TIME"):
            row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
            if row and type(row[0]) is int:
                info.base_time_ns = row[0]
    for table in ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE"):
        if table in tables and "name" in _columns(con, table):
            info.devices = [r[0] for r in con.execute(f"SELECT name FROM {table}") if isinstance(r[0], str)]
            if info.devices:
                break
    if "TARGET_INFO_SYSTEM_ENV" in tables and {"name", "value"} <= _columns(con, "TARGET_INFO_SYSTEM_ENV"):
        _read_rank(con, info)


# A variable in the environment text nsys records (one property holding every `NAME=value`, separated
# by line breaks, NULs or semicolons depending on the version), or a property of its own.
_ENV_VARIABLE = r"(?:^|[\s;\x00]){name}=(\d+)(?=$|[\s;\x00])"


def _read_rank(con: sqlite3.Connection, info: TraceInfo) -> None:
    """``RANK`` and ``WORLD_SIZE`` from the environment nsys recorded (only those two are read)."""
    found: dict[str, int] = {}
    for name, value in con.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV"):
        if not isinstance(value, str):
            continue
        for var in ("RANK", "WORLD_SIZE"):
            if var in found:
                continue
            if name == var and value.strip().isdigit():
                found[var] = int(value.strip())
            elif var + "=" in value:
                m = re.search(_ENV_VARIABLE.format(name=var), value)
                if m:
                    found[var] = int(m.group(1))
    if "RANK" in found:
        info.rank = found["RANK"]
        info.rank_source = "RANK"
    if "WORLD_SIZE" in found:
        info.world_size = found["WORLD_SIZE"]
