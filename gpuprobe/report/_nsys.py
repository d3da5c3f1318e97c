"""Events from an Nsight Systems SQLite export (``nsys export --type sqlite``).

The schema drifts between nsys versions, so every table and column is checked before use and a
missing optional column reads as NULL. Rows are streamed from cursors; a kernel's or API call's
name is looked up in ``StringIds`` (through its primary key) once per distinct id, and NVTX texts
are joined by SQLite, so no table is held in memory, only the names in use.
Facts used: times are integer ns since session start; ``globalPid = pid << 24 | 1 << 48`` style
packing (pid in bits 24-47, tid in bits 0-23); runtime API names carry a version suffix;
``NVTX_EVENTS.eventType`` 59 is a push/pop range, 60 a start/end range, 34 a mark.

Only the activity tables' times, ids, sizes and kinds make the figures (kernels, launches, copies,
ranges). Everything else is ancillary: names (``StringIds``, NVTX text), device names, the session's
wall-clock start, the recorded environment (``TARGET_INFO_*``), enumeration labels. Real exports
store raw bytes in text columns (a protobuf blob in ``TARGET_INFO_SYSTEM_ENV.value``, a non-UTF-8
environment, a name cut inside a multi-byte character), so text is decoded with U+FFFD for what is
not UTF-8, and an ancillary table or column that is missing, unreadable, NULL or undecodable
becomes a warning in ``TraceInfo.notes``, never an error.

A hostile file costs bounded time and memory (:func:`open_export`, :func:`iter_events`): the
export is opened read-only; every table read must be a plain table of stored columns (a view, a
virtual table or a generated column would run code of the file's choosing: a 4 KB file with a
recursive view spins forever) or the export is refused; so a row costs what its stored bytes cost,
and one text or BLOB value may hold :data:`MAX_VALUE_BYTES` at most (a row read holds ten values at
most); the whole read may cost :data:`STEPS_PER_BYTE` SQLite steps per byte of the file (at least
:data:`MIN_STEPS`), which bounds its time by the file's size whatever the tables hold.

:class:`NsysTrace` is the format's reader (see :mod:`gpuprobe.report._trace`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator

from gpuprobe._kernel_names import strip_api_version
from gpuprobe.report._events import KERNEL, LIMIT, MEMCPY, MEMSET, RANGE, RUNTIME, Event, TraceInfo, int_or
from gpuprobe.report._trace import Progress, Trace

__all__ = ["NsysTrace", "iter_events", "NsysFormatError", "open_export", "MAX_VALUE_BYTES", "STEPS_PER_BYTE", "MIN_STEPS"]

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
_SCHEMA = "the schema (table and column names)"
#: Every table a report reads: each must be a plain table of stored columns.
_READ_TABLES = _ACTIVITY_TABLES + (
    "StringIds",
    "TARGET_INFO_SESSION_START_TIME",
    "TARGET_INFO_GPU",
    "TARGET_INFO_CUDA_DEVICE",
    "TARGET_INFO_SYSTEM_ENV",
    "ENUM_CUDA_MEMCPY_OPER",
    "ENUM_CUDA_MEM_KIND",
)
#: Bytes of one text or BLOB value at most (SQLite's length limit on the connection): 4 MiB. The
#: longest value of the real exports in tests/data is 97 KB (the environment nsys recorded, which
#: Linux caps at about 2 MiB).
MAX_VALUE_BYTES = 4 << 20
#: SQLite virtual-machine steps the whole read may cost per byte of the file (the real exports in
#: tests/data: 0.12 or less), and at least MIN_STEPS (about 10 s): reading plain tables is linear in
#: their size, so only a file built to be slow (a name table without its key, looked up once per
#: name) comes near.
STEPS_PER_BYTE = 200
MIN_STEPS = 1_000_000_000
_TICK = 10_000  # steps between two calls of the progress handler
_NO_SPAN = "without integer start and end times in range and in order"


class NsysTrace(Trace):
    """An Nsight Systems SQLite export (``nsys-sqlite``), of every process or of one."""

    source = "nsys"

    def __init__(self, path: str, fmt: str = "nsys-sqlite", process: int | None = None) -> None:
        super().__init__(path, fmt)
        self.process = process  # only this process's events (None: all)

    def events(self, progress: Progress | None = None) -> Iterator[Event]:
        self.info = TraceInfo(self.source)
        try:
            con = open_export(self.path)
        except sqlite3.Error as exc:
            raise self._fail(f"cannot open as SQLite: {exc}") from None
        with contextlib.closing(con):
            try:
                yield from iter_events(con, self.info, progress, process=self.process)
            except NsysFormatError as exc:
                raise self._fail(str(exc)) from None
            except sqlite3.Error as exc:
                raise self._fail(f"SQLite error: {exc}") from None


class NsysFormatError(Exception):
    """The database is not a usable Nsight Systems export; the message says why."""


def open_export(path: str) -> sqlite3.Connection:
    """A read-only connection to an export, with a value length limit and untrusted schema.

    Raises:
        sqlite3.Error: It cannot be opened.
    """
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    con = sqlite3.connect(uri, uri=True)
    try:
        setlimit = getattr(con, "setlimit", None)  # Python 3.11 and later; before, a value is bounded by the file
        if setlimit is not None:
            setlimit(getattr(sqlite3, "SQLITE_LIMIT_LENGTH", 0), MAX_VALUE_BYTES)
        con.execute("PRAGMA query_only = ON")
        con.execute("PRAGMA trusted_schema = OFF")  # no function of the schema's choosing (SQLite >= 3.31)
    except sqlite3.Error:
        con.close()
        raise
    return con


class _Budget:
    """The progress handler of a read: stops SQLite past the steps the file's size allows;
    ``exceeded`` then says so."""

    __slots__ = ("ticks", "max_ticks", "exceeded")

    def __init__(self, con: sqlite3.Connection) -> None:
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        size = pages * con.execute("PRAGMA page_size").fetchone()[0]
        self.ticks = 0
        self.max_ticks = max(MIN_STEPS, STEPS_PER_BYTE * size) // _TICK
        self.exceeded = ""

    def __call__(self) -> int:
        self.ticks += 1
        if self.ticks > self.max_ticks:
            self.exceeded = f"reading it costs SQLite more than {self.max_ticks * _TICK:,} steps"
            return 1
        return 0

    def error(self, exc: sqlite3.Error, where: str) -> Exception:
        """The error to raise for a failed query: what the budget or the length limit stopped, or ``exc``."""
        if self.exceeded:
            return NsysFormatError(f"{self.exceeded} ({where}), far more than its size explains: refused")
        if "too big" in str(exc):
            return NsysFormatError(
                f"a value longer than {MAX_VALUE_BYTES >> 20} MiB ({where}), far more than any real export holds: refused"
            )
        return exc


def _plain_tables(con: sqlite3.Connection) -> set[str]:
    """The tables of the export; NsysFormatError if one a report reads is a view, a virtual table or
    has a generated column (reading those runs SQL of the file's choosing)."""
    tables = set()
    read = {name.lower(): name for name in _READ_TABLES}
    for kind, name, sql in con.execute("SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view')"):
        if not isinstance(name, str):
            continue
        wanted = read.get(name.lower())
        if wanted is not None:
            if kind == "view":
                raise NsysFormatError(
                    f"{wanted} is a view, not a table: an Nsight Systems export holds plain tables only, and a view "
                    "runs a query of the file's choosing; refused"
                )
            if isinstance(sql, str) and sql.lstrip()[:20].upper().replace(" ", "").startswith("CREATEVIRTUAL"):
                raise NsysFormatError(f"{wanted} is a virtual table, not a plain table: refused")
            for row in con.execute(f'PRAGMA table_xinfo("{name}")'):
                if row[6] in (2, 3):  # hidden: 2 a virtual generated column, 3 a stored one
                    raise NsysFormatError(
                        f"column {row[1]} of table {wanted} is generated (computed by an expression), not stored: "
                        "refused"
                    )
        if kind == "table":
            tables.add(name)
    return tables


class _Text:
    """The connection's text factory: UTF-8, with U+FFFD where the bytes are not UTF-8.

    SQLite hands text columns over as they were stored, and nsys stores raw bytes in some of them;
    sqlite3's default factory then fails the whole query. This one never fails, and counts the
    undecodable values under ``where``, the label of what is being read (set before each query),
    so that the report can warn about them.

    Why a factory and not ``CAST(x AS BLOB)`` in each query: it covers every text value the
    connection returns (joined names, ``PRAGMA`` answers, tables added later) in one place, leaves
    the SQL as it is, and decodes strictly first, which tells a damaged value from a clean one.
    Its cost: +0.09 µs of CPU per text value (1M kernel rows joined with their names: 0.82 µs per
    row fetched against 0.73 µs with the default factory), paid once per distinct kernel or API
    name (see :func:`_string`) and once per NVTX range.
    """

    __slots__ = ("where", "undecodable")

    def __init__(self) -> None:
        self.where = _SCHEMA
        self.undecodable: dict[str, int] = {}

    def __call__(self, raw: bytes) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            self.undecodable[self.where] = self.undecodable.get(self.where, 0) + 1
            return raw.decode("utf-8", "replace")

    def other(self, value: object) -> str | None:
        """Text from a value that is not a str: a BLOB decoded as above, a number's digits, else None."""
        if isinstance(value, bytes):
            return self(value)
        if isinstance(value, (int, float)):
            return str(value)
        return None

    def notes(self) -> list[str]:
        """One warning per source that held undecodable text."""
        return [
            f"{where}: {n:,} value{'s are' if n != 1 else ' is'} not valid UTF-8; read with U+FFFD in place "
            "of the bytes that are not"
            for where, n in self.undecodable.items()
        ]


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
    con.text_factory = _Text()
    tables = _plain_tables(con)
    if KERNEL_TABLE not in tables or "globalPid" not in _columns(con, KERNEL_TABLE):
        return []
    budget = _Budget(con)
    con.set_progress_handler(budget, _TICK)
    try:
        return sorted({_pid(g) for (g,) in con.execute(f"SELECT DISTINCT globalPid FROM {KERNEL_TABLE}")})
    except sqlite3.Error as exc:
        raise budget.error(exc, f"the processes of {KERNEL_TABLE}") from None
    finally:
        con.set_progress_handler(None, 0)


def iter_events(
    con: sqlite3.Connection,
    info: TraceInfo,
    progress: Callable[[int, int], None] | None = None,
    process: int | None = None,
) -> Iterator[Event]:
    """Yield the events of an opened export.

    Text is decoded with U+FFFD where it is not UTF-8 (the connection's ``text_factory`` is set
    for the iteration and restored after). Ancillary data that cannot be read (a missing
    ``StringIds`` table or name column, an unreadable ``TARGET_INFO_*`` table, NULL or undecodable
    names) is a note in ``info.notes``, and the events are yielded without it.

    Args:
        con: A read-only connection.
        info: Filled with devices, base time and notes.
        progress: Called with ``(rows_done, rows_total)`` every 64k rows.
        process: Only the events of this process id (one rank of an export holding several); the
            environment's ``RANK`` is then not the process's and is not read.

    Raises:
        NsysFormatError: No nsys activity table, an activity table without ``start`` or ``end``, a
            table read that is not a plain table of stored columns, a value longer than
            :data:`MAX_VALUE_BYTES`, or a read costing more steps than the file's size allows.
    """
    text = _Text()
    factory = con.text_factory
    con.text_factory = text
    budget = _Budget(con)
    con.set_progress_handler(budget, _TICK)
    try:
        yield from _events(con, info, progress, process, text)
    except sqlite3.Error as exc:
        raise budget.error(exc, text.where) from None
    finally:
        con.text_factory = factory
        con.set_progress_handler(None, 0)


class _Read:
    """One read of an export's activity tables: what every table's reader shares."""

    def __init__(self, con: sqlite3.Connection, info: TraceInfo, progress: Progress | None, process: int | None,
                 text: _Text, tables: set[str], cols: dict[str, set[str]], names_known: bool) -> None:
        self.con = con
        self.info = info
        self.notes = info.notes
        self.progress = progress
        self.process = process
        self.text = text
        self.tables = tables
        self.cols = cols
        self.names_known = names_known  # StringIds can be read
        self.done = 0
        self.total = 0
        if progress is not None:
            for table in cols:
                self.total += con.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]

    def rows(self, sql: str) -> Iterator[tuple]:
        progress = self.progress
        for row in self.con.execute(sql):
            yield row
            self.done += 1
            if progress is not None and not self.done & 0xFFFF:
                progress(self.done, self.total)


def _events(
    con: sqlite3.Connection, info: TraceInfo, progress: Progress | None, process: int | None, text: _Text,
) -> Iterator[Event]:
    tables = _plain_tables(con)
    present = [t for t in _ACTIVITY_TABLES if t in tables]
    if not present:
        raise NsysFormatError(
            "not an Nsight Systems export: none of the tables " + ", ".join(_ACTIVITY_TABLES) + " exist"
        )
    cols = {t: _columns(con, t) for t in present}
    for table in present:
        missing = {"start", "end"} - cols[table]
        if missing:
            raise NsysFormatError(f"table {table} lacks column {sorted(missing)[0]}")
    notes = info.notes
    strings = _usable_strings(con, tables)
    uses_strings = KERNEL_TABLE in tables or RUNTIME_TABLE in tables or "textId" in cols.get(NVTX_TABLE, ())
    if strings is not None and uses_strings:
        notes.append(
            f"{strings}: the names of kernels and API calls are unknown, so no call counts as a launch"
        )
    if KERNEL_TABLE not in tables:
        notes.append(f"no {KERNEL_TABLE} table: the export holds no kernel records")
    _read_target_info(con, tables, info, text)
    if process is not None:
        info.rank = info.rank_source = None
    read = _Read(con, info, progress, process, text, tables, cols, names_known=strings is None)
    for read_by, reader in _TABLE_READERS:
        if any(t in tables for t in read_by):
            yield from reader(read)
    info.notes.extend(text.notes())


def _nvtx_ranges(r: _Read) -> Iterator[Event]:
    c, notes, text = r.cols[NVTX_TABLE], r.notes, r.text
    if "eventType" not in c:
        notes.append(f"table {NVTX_TABLE} lacks column eventType (range or mark): its NVTX ranges are left out")
        return
    if "text" not in c and "textId" not in c:
        notes.append(f"table {NVTX_TABLE} lacks columns text and textId: NVTX ranges are named '(unnamed)'")
    text_id = "s.value" if "textId" in c and r.names_known else "NULL"
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if text_id != "NULL" else ""
    sql = (
        f"SELECT n.start, n.end, {_col(c, 'text', 'n.')}, {text_id}, {_col(c, 'globalTid', 'n.')} "
        f"FROM {NVTX_TABLE} n {join} WHERE n.eventType IN ({_NVTX_PUSH_POP}, {_NVTX_START_END})"
        + _only(r.process, _col(c, "globalTid", "n."), " AND ")
    )
    text.where = f"NVTX range names ({NVTX_TABLE}.text, StringIds.value)"
    unclosed = unnamed = 0
    for start, end, label, label2, gtid in r.rows(sql):
        if not _span(start, end):
            unclosed += 1
            continue
        if type(label) is str:
            name = label
        elif type(label2) is str:
            name = label2
        else:
            name = text.other(label) or text.other(label2)  # type: ignore[assignment]
            if name is None:
                unnamed += 1
                name = "(unnamed)"
        yield Event(RANGE, name, start, end - start, _pid(gtid), _tid(gtid))
    if unclosed:
        notes.append(f"{unclosed} NVTX ranges without a valid end were left out")
    if unnamed and ("text" in c or "textId" in c):
        notes.append(
            f"{unnamed:,} NVTX ranges have no text ({NVTX_TABLE}.text and textId NULL or not in "
            "StringIds): named '(unnamed)'"
        )


def _api_calls(r: _Read) -> Iterator[Event]:
    c, notes, text, info = r.cols[RUNTIME_TABLE], r.notes, r.text, r.info
    named = r.names_known and "nameId" in c
    if "nameId" not in c:
        notes.append(
            f"table {RUNTIME_TABLE} lacks column nameId: API names are unknown, so no call counts as a launch"
        )
    sql = (
        f"SELECT r.start, r.end, {_col(c, 'correlationId', 'r.')}, {_col(c, 'globalTid', 'r.')}, "
        + ("r.nameId " if named else "NULL ")
        + f"FROM {RUNTIME_TABLE} r"
        + _only(r.process, _col(c, "globalTid", "r."))
    )
    text.where = f"API names (StringIds.value of {RUNTIME_TABLE}.nameId)"
    unnamed = 0
    apis: dict[object, str] = {}  # nameId -> API name without its version suffix; "" if none
    for start, end, corr, gtid, name_id in r.rows(sql):
        if not _span(start, end):
            info.skip(_NO_SPAN)
            continue
        name = apis.get(name_id)
        if not name:
            if name is None:
                found = _string(r.con, text, name_id) if named else None
                name = apis[name_id] = strip_api_version(found) if found else ""
            if not name:
                unnamed += 1
                name = "(unknown API)"
        yield Event(RUNTIME, name, start, end - start, _pid(gtid), _tid(gtid), int_or(corr))
    if unnamed and named:
        notes.append(
            f"{unnamed:,} API calls have no name ({RUNTIME_TABLE}.nameId NULL or not in StringIds): shown as "
            "'(unknown API)' and not counted as launches"
        )


def _kernels(r: _Read) -> Iterator[Event]:
    c, notes, text, info = r.cols[KERNEL_TABLE], r.notes, r.text, r.info
    name_col = next((n for n in ("demangledName", "shortName", "mangledName") if n in c), None)
    if name_col is None:
        notes.append(
            f"table {KERNEL_TABLE} lacks a name column (demangledName, shortName or mangledName): kernel names "
            "are unknown"
        )
    named = r.names_known and name_col is not None
    sql = (
        f"SELECT k.start, k.end, {_col(c, 'correlationId', 'k.')}, {_col(c, 'globalPid', 'k.')}, "
        f"{_col(c, 'deviceId', 'k.')}, {_col(c, 'streamId', 'k.')}, "
        + (f"k.{name_col} " if named else "NULL ")
        + f"FROM {KERNEL_TABLE} k"
        + _only(r.process, _col(c, "globalPid", "k."))
    )
    text.where = f"kernel names (StringIds.value of {KERNEL_TABLE}.{name_col})"
    unnamed = 0
    kernels: dict[object, str] = {}  # name id -> kernel name; "" if none
    for start, end, corr, gpid, device, stream, name_id in r.rows(sql):
        if not _span(start, end):
            info.skip(_NO_SPAN)
            continue
        name = kernels.get(name_id)
        if not name:
            if name is None:
                name = kernels[name_id] = (_string(r.con, text, name_id) if named else None) or ""
            if not name:
                unnamed += 1
                name = "(unnamed kernel)"
        stream = int_or(stream)
        device = int_or(device)
        # positional, in Event's field order, as in _kineto.to_event; nbytes -1: unknown
        yield Event(KERNEL, name, start, end - start, _pid(gpid), stream, int_or(corr), -1, stream, device)
    if unnamed and named:
        notes.append(
            f"{unnamed:,} kernels have no name ({KERNEL_TABLE}.{name_col} NULL or not in StringIds): named "
            "'(unnamed kernel)'"
        )


def _copies(r: _Read) -> Iterator[Event]:
    """Copies and sets (both tables, after the labels of their kinds are read once)."""
    directions = dict(_COPY_KIND)
    memory_kinds = dict(_MEMORY_KIND)
    if MEMCPY_TABLE in r.tables:
        _read_labels(r.con, r.tables, r.text, r.notes, directions, memory_kinds)
    r.text.where = _SCHEMA
    for table, kind in ((MEMCPY_TABLE, MEMCPY), (MEMSET_TABLE, MEMSET)):
        if table not in r.tables:
            continue
        c = r.cols[table]
        sql = (
            f"SELECT start, end, {_col(c, 'correlationId')}, {_col(c, 'globalPid')}, {_col(c, 'deviceId')}, "
            f"{_col(c, 'streamId')}, {_col(c, 'bytes')}, {_col(c, 'copyKind')}, {_col(c, 'srcKind')}, "
            f"{_col(c, 'dstKind')} FROM {table}" + _only(r.process, _col(c, "globalPid"))
        )
        for start, end, corr, gpid, device, stream, nbytes, copy_kind, src_kind, dst_kind in r.rows(sql):
            if not _span(start, end):
                r.info.skip(_NO_SPAN)
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
            yield Event(kind, name, start, end - start, _pid(gpid), stream, int_or(corr), int_or(nbytes), stream,
                        int_or(device), direction)


#: The activity tables' readers, in the order their events are yielded, each run when one of its
#: tables is in the export.
_TABLE_READERS: tuple[tuple[tuple[str, ...], Callable[[_Read], Iterator[Event]]], ...] = (
    ((NVTX_TABLE,), _nvtx_ranges),
    ((RUNTIME_TABLE,), _api_calls),
    ((KERNEL_TABLE,), _kernels),
    ((MEMCPY_TABLE, MEMSET_TABLE), _copies),
)


def _string(con: sqlite3.Connection, text: _Text, string_id: object) -> str | None:
    """The ``StringIds`` value of an id, or None (no such id, a NULL, an id that is not a number).

    Kernels and API calls name themselves by id, and a trace has few distinct names: looking each
    id up once, instead of joining every row with ``StringIds``, shares one ``str`` between the
    events of a name, decodes it once and strips an API's version suffix once. Measured, CPU time
    of the whole report: 1M kernels of 200 names 2.60 s (2.86 s with the join and this decoding,
    2.63 s with the join and sqlite3's strict decoding); with 1M launch calls beside them 5.53 s
    (5.71 s with the strict join).
    """
    if string_id is None:
        return None
    row = con.execute("SELECT value FROM StringIds WHERE id = ?", (string_id,)).fetchone()
    if row is None:
        return None
    value = row[0]
    return value if type(value) is str else text.other(value)


def _usable_strings(con: sqlite3.Connection, tables: set[str]) -> str | None:
    """None when ``StringIds`` can be joined on (``id`` and ``value``), else what is wrong with it."""
    if "StringIds" not in tables:
        return "no StringIds table"
    try:
        missing = sorted({"id", "value"} - _columns(con, "StringIds"))
    except sqlite3.Error as exc:
        return f"StringIds cannot be read ({exc})"
    return f"table StringIds lacks column {missing[0]}" if missing else None


def _ancillary(con: sqlite3.Connection, notes: list[str], table: str, columns: str, lost: str) -> list[tuple]:
    """``columns`` of every row of an ancillary table, or [] and a note saying what is ``lost``."""
    try:
        return con.execute(f"SELECT {columns} FROM {table}").fetchall()
    except sqlite3.Error as exc:
        if "interrupted" in str(exc):  # the read's budget is spent: the whole read stops (iter_events says why)
            raise
        notes.append(f"table {table} cannot be read ({exc}): {lost}")
        return []


def _read_labels(
    con: sqlite3.Connection,
    tables: set[str],
    text: _Text,
    notes: list[str],
    directions: dict[int, str],
    memory_kinds: dict[int, str],
) -> None:
    """Copy directions and memory kinds from the export's enumerations, over the built-in ones."""
    if "ENUM_CUDA_MEMCPY_OPER" in tables:
        text.where = "ENUM_CUDA_MEMCPY_OPER.name (copy directions)"
        lost = "the built-in copy directions are used"
        for key, label in _ancillary(con, notes, "ENUM_CUDA_MEMCPY_OPER", "id, name", lost):
            if type(key) is int and isinstance(label, str) and label.startswith("CUDA_MEMCPY_KIND_"):
                code = label[len("CUDA_MEMCPY_KIND_") :]
                if len(code) == 4 and code[1:3] == "TO":
                    directions[key] = f"{code[0]}to{code[3]}"
    if "ENUM_CUDA_MEM_KIND" in tables:
        text.where = "ENUM_CUDA_MEM_KIND.label (memory kinds)"
        lost = "the built-in memory kinds are used"
        for key, label in _ancillary(con, notes, "ENUM_CUDA_MEM_KIND", "id, label", lost):
            if type(key) is int and isinstance(label, str) and label and "\ufffd" not in label:
                memory_kinds[key] = label


def _read_target_info(con: sqlite3.Connection, tables: set[str], info: TraceInfo, text: _Text) -> None:
    notes = info.notes
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        text.where = "TARGET_INFO_SESSION_START_TIME"
        lost = "the wall-clock time of the trace's start is unknown"
        rows = _ancillary(con, notes, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs", lost)
        if rows and type(rows[0][0]) is int:
            info.base_time_ns = rows[0][0]
    for table in ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE"):
        if table not in tables:
            continue
        text.where = f"{table}.name (device names)"
        try:
            if "name" not in _columns(con, table):
                continue
        except sqlite3.Error:
            pass  # the query below says what is wrong
        devices = _ancillary(con, notes, table, "name", "device names are unknown")
        info.devices = [r[0] for r in devices if isinstance(r[0], str) and r[0]]
        if info.devices:
            break
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        text.where = "TARGET_INFO_SYSTEM_ENV (the recorded environment)"
        lost = "RANK and WORLD_SIZE are not read from the environment"
        try:
            missing = sorted({"name", "value"} - _columns(con, "TARGET_INFO_SYSTEM_ENV"))
        except sqlite3.Error:
            missing = []
        if missing:
            notes.append(f"table TARGET_INFO_SYSTEM_ENV lacks column {missing[0]}: {lost}")
            return
        _read_rank(_ancillary(con, notes, "TARGET_INFO_SYSTEM_ENV", "name, value", lost), info)


# A variable in the environment text nsys records (one property holding every `NAME=value`, separated
# by line breaks, NULs or semicolons depending on the version), or a property of its own. ASCII
# digits only, nine at most: a rank, not whatever int() accepts ("²", 5,000 digits).
_ENV_VARIABLE = r"(?:^|[\s;\x00]){name}=([0-9]{{1,9}})(?=$|[\s;\x00])"
_RANK_VALUE = re.compile(r"\s*([0-9]{1,9})\s*")


def _read_rank(rows: list[tuple], info: TraceInfo) -> None:
    """``RANK`` and ``WORLD_SIZE`` from the environment nsys recorded (only those two are read)."""
    found: dict[str, int] = {}
    for name, value in rows:
        if not isinstance(value, str):
            continue
        for var in ("RANK", "WORLD_SIZE"):
            if var in found:
                continue
            m = _RANK_VALUE.fullmatch(value) if name == var else None
            if m is None and var + "=" in value:
                m = re.search(_ENV_VARIABLE.format(name=var), value)
            if m:
                found[var] = int(m.group(1))
    if "RANK" in found:
        info.rank = found["RANK"]
        info.rank_source = "RANK"
    if "WORLD_SIZE" in found:
        info.world_size = found["WORLD_SIZE"]
