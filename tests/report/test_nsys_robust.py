"""Nsight Systems exports with damaged ancillary data, and every real trace of tests/data.

Real exports store raw bytes in text columns (tests/data/nsys/pipit_saxpy_mpi_a100: a protobuf
blob in ``TARGET_INFO_SYSTEM_ENV.value``), leave names NULL, and drift in schema. The report must
complete with its main figures (kernels, launches, copies, ranges) intact, computed here from the
raw rows, and warn about what it could not read: targeted cases first, then a fuzz over the text
columns (invalid UTF-8, NULLs, huge values, dropped tables and columns) through the command, then
the real exports and kineto traces of tests/data.
"""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracefiles import read_trace, to_ns
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuprobe.report import analyze, load, render
from gpuprobe.report._nsys import iter_events
from gpuprobe.report._events import TraceInfo
from gpuprobe.report.cli import main_report

DATA = Path(__file__).resolve().parents[1] / "data"
NSYS_DATA = DATA / "nsys"
KERNEL, RUNTIME, MEMCPY, MEMSET, NVTX = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "NVTX_EVENTS",
)
# the launch calls of nsys_min.sql, as stored; cudaStreamSynchronize_v3020 is a call but no launch
LAUNCH_NAMES = {b"cudaLaunchKernel_v7000", b"cudaMemcpyAsync_v3020", b"cudaMemsetAsync_v3020"}
ENV_TABLE = """
CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL,
  nameEnum INTEGER NOT NULL, value TEXT NOT NULL);
INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (72057594037927936, 'RuntimeVars', 'Hostname', 619, 'node7'),
  (72057594037927936, 'RuntimeVars', 'DeviceEnvironment', 610, 'PATH=/usr/bin
WORLD_SIZE=4
RANK=3
LANG=C.UTF-8');
"""
BASE_SQL = ((DATA / "nsys_min.sql").read_text() + ENV_TABLE).replace("NOT NULL", "")  # NULLs allowed everywhere


def build(path: Path, sql: str = BASE_SQL) -> Path:
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")  # why: no fsync per example
    con.executescript(sql)
    con.commit()
    con.close()
    return path


def set_text(path: Path, table: str, column: str, rowid: int, raw: bytes | None) -> None:
    """Store ``raw`` as TEXT, bytes as they are (SQLite does not check UTF-8), or NULL."""
    con = sqlite3.connect(path)
    con.execute(f'UPDATE "{table}" SET "{column}" = CAST(? AS TEXT) WHERE rowid = ?', (raw, rowid))
    con.commit()
    con.close()


def drop_column(path: Path, table: str, column: str) -> None:
    """Rebuild ``table`` without ``column`` (as an export of a version without it would be)."""
    con = sqlite3.connect(path)
    cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")') if r[1] != column]
    if cols:
        keep = ", ".join(f'"{c}"' for c in cols)
        con.executescript(
            f'CREATE TABLE rebuilt AS SELECT {keep} FROM "{table}"; DROP TABLE "{table}"; '
            f'ALTER TABLE rebuilt RENAME TO "{table}";'
        )
    con.commit()
    con.close()


def report_through_the_command(path: Path, out: Path) -> dict[str, Any]:
    """``gpuprobe report PATH --format json``: exit 0, nothing on stderr, the report tree."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main_report([str(path), "--format", "json", "--no-progress", "-o", str(out)])
    assert code == 0, err.getvalue()
    assert err.getvalue() == ""
    return json.loads(out.read_text(encoding="utf-8"))


def raw_db(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path)
    con.text_factory = bytes  # the stored bytes, decoded by nobody
    return con


def undecodable(value: object) -> bool:
    if not isinstance(value, bytes):
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def expected_figures(path: Path) -> dict[str, int]:
    """The main figures from the raw rows: no name, label or environment is used."""
    con = raw_db(path)
    tables = {n.decode() for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    cols = {t: {r[1].decode() for r in con.execute(f'PRAGMA table_info("{t}")')} for t in tables}
    out: dict[str, int] = {}
    out["kernels"], out["kernel_ns"] = con.execute(f"SELECT COUNT(*), TOTAL(end - start) FROM {KERNEL}").fetchone()
    out["runtime"] = con.execute(f"SELECT COUNT(*) FROM {RUNTIME}").fetchone()[0]
    for table, key in ((MEMCPY, "memcpy"), (MEMSET, "memset")):
        out[key], out[key + "_bytes"] = con.execute(f"SELECT COUNT(*), TOTAL(bytes) FROM {table}").fetchone()
    if "eventType" in cols[NVTX]:
        out["ranges"], out["range_ns"] = con.execute(
            f"SELECT COUNT(*), TOTAL(end - start) FROM {NVTX} WHERE eventType IN (59, 60) AND end >= start"
        ).fetchone()
    else:
        out["ranges"] = out["range_ns"] = 0
    strings = "StringIds" in tables and {"id", "value"} <= cols["StringIds"]
    out["launches"] = 0
    if strings and "nameId" in cols[RUNTIME]:
        for (name_id,) in con.execute(f"SELECT nameId FROM {RUNTIME}"):
            row = con.execute("SELECT value FROM StringIds WHERE id = ?", (name_id,)).fetchone()
            out["launches"] += bool(row and row[0] in LAUNCH_NAMES)
    con.close()
    return {k: int(v) for k, v in out.items()}


def expected_warnings(path: Path) -> list[tuple[str, ...]]:
    """What the report reads and cannot: each tuple's words must all be in one warning."""
    con = raw_db(path)
    tables = {n.decode() for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    cols = {t: {r[1].decode() for r in con.execute(f'PRAGMA table_info("{t}")')} for t in tables}
    strings = "StringIds" in tables and {"id", "value"} <= cols["StringIds"]

    def string(string_id: object) -> object:
        if not strings or string_id is None:
            return None
        row = con.execute("SELECT value FROM StringIds WHERE id = ?", (string_id,)).fetchone()
        return row[0] if row else None

    out: list[tuple[str, ...]] = []
    if not strings:
        out.append(("StringIds", "names of kernels and API calls are unknown"))
    name_col = next((c for c in ("demangledName", "shortName", "mangledName") if c in cols.get(KERNEL, ())), None)
    if KERNEL in tables and name_col is None:
        out.append((KERNEL, "lacks a name column"))
    elif KERNEL in tables and strings:
        names = [string(i) for (i,) in con.execute(f"SELECT {name_col} FROM {KERNEL}")]
        if any(not n for n in names):
            out.append(("kernels have no name", name_col))
        if any(undecodable(n) for n in names):
            out.append(("kernel names", "StringIds", "UTF-8"))
    if RUNTIME in tables and "nameId" not in cols[RUNTIME]:
        out.append((RUNTIME, "lacks column nameId"))
    elif RUNTIME in tables and strings:
        names = [string(i) for (i,) in con.execute(f"SELECT nameId FROM {RUNTIME}")]
        if any(not n for n in names):
            out.append(("API calls have no name",))
        if any(undecodable(n) for n in names):
            out.append(("API names", "UTF-8"))
    c = cols.get(NVTX, {"eventType", "text"})
    if NVTX not in tables:
        pass
    elif "eventType" not in c:
        out.append((NVTX, "lacks column eventType"))
    elif "text" not in c and "textId" not in c:
        out.append((NVTX, "lacks columns text and textId"))
    else:
        text = "text" if "text" in c else "NULL"
        text_id = "textId" if "textId" in c else "NULL"
        rows = con.execute(f"SELECT {text}, {text_id} FROM {NVTX} WHERE eventType IN (59, 60) AND end >= start")
        pairs = [(t, string(i)) for t, i in rows]
        if any(t is None and s is None for t, s in pairs):
            out.append(("NVTX ranges have no text",))
        if any(undecodable(t) or undecodable(s) for t, s in pairs):
            out.append(("NVTX range names", "UTF-8"))
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        if not {"name", "value"} <= cols["TARGET_INFO_SYSTEM_ENV"]:
            out.append(("TARGET_INFO_SYSTEM_ENV", "lacks column"))
        elif any(undecodable(v) for row in con.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV") for v in row):
            out.append(("TARGET_INFO_SYSTEM_ENV", "UTF-8"))
    if "TARGET_INFO_GPU" in tables and "name" in cols["TARGET_INFO_GPU"]:
        if any(undecodable(v) for (v,) in con.execute("SELECT name FROM TARGET_INFO_GPU")):
            out.append(("TARGET_INFO_GPU", "UTF-8"))
    if "ENUM_CUDA_MEMCPY_OPER" in tables:
        if not {"id", "name"} <= cols["ENUM_CUDA_MEMCPY_OPER"]:
            out.append(("ENUM_CUDA_MEMCPY_OPER", "cannot be read"))
        elif any(undecodable(v) for (v,) in con.execute("SELECT name FROM ENUM_CUDA_MEMCPY_OPER")):
            out.append(("ENUM_CUDA_MEMCPY_OPER", "UTF-8"))
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" not in cols["TARGET_INFO_SESSION_START_TIME"]:
        out.append(("TARGET_INFO_SESSION_START_TIME", "cannot be read"))
    con.close()
    return out


def check(report: dict[str, Any], path: Path) -> None:
    """The report's main figures are the raw rows', and every expected warning is there."""
    want = expected_figures(path)
    s = report["summary"]
    assert (s["kernel_count"], s["kernel_ns"] or 0) == (want["kernels"], want["kernel_ns"])
    assert s["events"].get("runtime", 0) == want["runtime"]
    assert s["launch_count"] == want["launches"]
    memory = {r["kind"]: (0, 0) for r in report["memory"]["rows"]}
    for r in report["memory"]["rows"]:
        count, nbytes = memory[r["kind"]]
        memory[r["kind"]] = (count + r["count"], nbytes + r["bytes"])
    assert memory.get("memcpy", (0, 0)) == (want["memcpy"], want["memcpy_bytes"])
    assert memory.get("memset", (0, 0)) == (want["memset"], want["memset_bytes"])
    assert s["events"].get("range", 0) == want["ranges"]
    ranges = report["ranges"]["rows"] if report.get("ranges") else []
    assert sum(r["count"] for r in ranges) == want["ranges"]  # every range is under one path
    assert sum(r["cpu_ns"] for r in ranges) == want["range_ns"]
    warnings = s["warnings"]
    for words in expected_warnings(path):
        assert any(all(w in line for w in words) for line in warnings), (words, warnings)


# ---------------------------------------------------------------------------------------- targeted


def test_the_reported_failure_a_byte_that_is_not_utf8_in_the_environment(tmp_path: Path) -> None:
    path = build(tmp_path / "env.sqlite")
    set_text(path, "TARGET_INFO_SYSTEM_ENV", "value", 2, b"PATH=/usr/bin\nLANG=\xff\xfe\nWORLD_SIZE=4\nRANK=3\n")
    with pytest.raises(sqlite3.OperationalError, match="Could not decode to UTF-8"):  # sqlite3's own reading
        sqlite3.connect(path).execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV").fetchall()
    report = report_through_the_command(path, tmp_path / "r.json")
    check(report, path)
    assert any("TARGET_INFO_SYSTEM_ENV" in w and "UTF-8" in w for w in report["summary"]["warnings"])
    trace = load(path)
    list(trace.events())
    assert (trace.info.rank, trace.info.world_size, trace.info.rank_source) == (3, 4, "RANK")  # read around the byte


def test_a_kernel_name_that_is_not_utf8_is_kept_with_a_replacement_character(tmp_path: Path) -> None:
    path = build(tmp_path / "name.sqlite")
    set_text(path, "StringIds", "value", 6, b"nvjet_tst_64x8\xe2\x82_splitK")  # cut inside a 3-byte character
    report = analyze(path)
    names = {k.name for k in report.kernels.rows}
    assert "nvjet_tst_64x8\ufffd_splitK" in names
    warning = [w for w in report.summary.warnings if "kernel names" in w]
    assert len(warning) == 1 and "StringIds" in warning[0] and "1 value is not valid UTF-8" in warning[0]
    for fmt in ("text", "md"):
        assert f"warning: {warning[0]}" in render(report, fmt)
    assert warning[0] in json.loads(render(report, "json"))["summary"]["warnings"]


def test_without_string_ids_kernels_and_copies_are_counted_and_no_call_is_a_launch(tmp_path: Path) -> None:
    path = build(tmp_path / "nostrings.sqlite", BASE_SQL + "DROP TABLE StringIds;")
    report = report_through_the_command(path, tmp_path / "r.json")
    check(report, path)
    assert report["summary"]["kernel_count"] == 2 and report["summary"]["launch_count"] == 0
    assert {k["name"] for k in report["kernels"]["rows"]} == {"(unnamed kernel)"}


def test_a_null_name_and_an_unknown_name_id_are_warned(tmp_path: Path) -> None:
    path = build(tmp_path / "nulls.sqlite")
    set_text(path, "StringIds", "value", 7, None)  # the softmax kernel's demangled name
    con = sqlite3.connect(path)
    con.execute(f"UPDATE {RUNTIME} SET nameId = 999 WHERE correlationId = 104")  # the sync call
    con.commit()
    con.close()
    report = report_through_the_command(path, tmp_path / "r.json")
    check(report, path)
    warnings = report["summary"]["warnings"]
    assert any(w.startswith("1 kernels have no name") for w in warnings)
    assert any(w.startswith("1 API calls have no name") for w in warnings)


def test_unreadable_ancillary_tables_are_warnings_not_errors(tmp_path: Path) -> None:
    path = build(tmp_path / "enum.sqlite")
    drop_column(path, "ENUM_CUDA_MEMCPY_OPER", "name")
    drop_column(path, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs")
    report = report_through_the_command(path, tmp_path / "r.json")
    check(report, path)
    assert report["summary"]["base_time_ns"] is None
    assert {r["direction"] for r in report["memory"]["rows"] if r["kind"] == "memcpy"} == {"DtoH"}  # built-in kinds


@pytest.mark.parametrize(
    ("name", "value", "rank"),
    [
        (b"RANK", b"\xc2\xb2", None),  # a superscript two: a digit to str.isdigit, not to int()
        (b"RANK", b" 12 ", 12),
        (b"DeviceEnvironment", b"RANK=" + b"7" * 5000, None),  # more digits than int() converts
        (b"DeviceEnvironment", b"\xffRANK=5\xff", None),  # glued to undecodable bytes: no variable of its own
        (b"DeviceEnvironment", b"\xff\nRANK=5\n\xff", 5),
    ],
)
def test_odd_rank_values_give_a_rank_or_none_never_an_error(
    tmp_path: Path, name: bytes, value: bytes, rank: int | None
) -> None:
    path = build(tmp_path / "rank.sqlite")
    set_text(path, "TARGET_INFO_SYSTEM_ENV", "value", 2, b"PATH=/usr/bin")  # no RANK but the case's
    set_text(path, "TARGET_INFO_SYSTEM_ENV", "name", 1, name)
    set_text(path, "TARGET_INFO_SYSTEM_ENV", "value", 1, value)
    trace = load(path)
    list(trace.events())
    assert trace.info.rank == rank
    report_through_the_command(path, tmp_path / "r.json")


def test_the_connection_gets_its_text_factory_back(tmp_path: Path) -> None:
    path = build(tmp_path / "factory.sqlite")
    want = expected_figures(path)
    con = sqlite3.connect(path)
    events = list(iter_events(con, TraceInfo("nsys")))
    assert len(events) == want["kernels"] + want["runtime"] + want["memcpy"] + want["memset"] + want["ranges"]
    assert con.text_factory is str
    con.close()


# -------------------------------------------------------------------------------------------- fuzz

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None)
TEXT_COLUMNS = [  # table, column, rowids to damage
    ("StringIds", "value", (6, 7)),  # kernel names (demangledName)
    ("StringIds", "value", (8,)),  # a kernel's shortName
    ("StringIds", "value", (2, 3, 4, 5)),  # API names
    ("StringIds", "value", (1,)),  # the process name: not read
    (NVTX, "text", (1, 2, 3)),
    ("TARGET_INFO_SYSTEM_ENV", "name", (1, 2)),
    ("TARGET_INFO_SYSTEM_ENV", "value", (1, 2)),
    ("TARGET_INFO_GPU", "name", (1,)),
    ("ENUM_CUDA_MEMCPY_OPER", "name", (1, 2, 3)),
    # not read by the report
    ("PROCESSES", "name", (1,)),
    ("META_DATA_EXPORT", "value", (1, 2)),
    ("ENUM_CUDA_MEMCPY_OPER", "label", (1, 2, 3)),
    ("TARGET_INFO_SESSION_START_TIME", "utcTime", (1,)),
]
TABLES = [
    "StringIds",
    "TARGET_INFO_SYSTEM_ENV",
    "TARGET_INFO_GPU",
    "TARGET_INFO_SESSION_START_TIME",
    "ENUM_CUDA_MEMCPY_OPER",
    "PROCESSES",
    "ThreadNames",
    "META_DATA_EXPORT",
]
COLUMNS = [
    (NVTX, "text"),
    (NVTX, "textId"),
    (NVTX, "eventType"),
    ("StringIds", "value"),
    ("StringIds", "id"),
    ("TARGET_INFO_SYSTEM_ENV", "value"),
    ("TARGET_INFO_SYSTEM_ENV", "name"),
    ("TARGET_INFO_GPU", "name"),
    (KERNEL, "demangledName"),
    (KERNEL, "shortName"),
    (RUNTIME, "nameId"),
    ("ENUM_CUDA_MEMCPY_OPER", "name"),
    ("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"),
]


# bytes that no UTF-8 text holds, whatever surrounds them
NEVER_UTF8 = [b"\xff", b"\xfe", b"\xc0\x80", b"\xc1\xbf", b"\xf5\x80\x80\x80", b"\xed\xa0\x80", b"\x0a\xdf\x01\x08\xff"]


@st.composite
def text_values(draw: st.DrawFn) -> bytes | None:
    """Text as nsys may store it: not UTF-8, NULL, huge, or plain."""
    kind = draw(st.sampled_from(["invalid", "invalid", "cut", "null", "huge", "text"]))
    if kind == "null":
        return None
    if kind == "text":
        return draw(st.text(max_size=12)).encode("utf-8", "surrogatepass")
    if kind == "cut":  # a multi-byte character cut by the end of the value
        return draw(st.text(max_size=6)).encode("utf-8", "surrogatepass") + draw(st.sampled_from([b"\xe2\x82", b"\xc3", b"\xf0\x9f\x98"]))
    bad = draw(st.sampled_from(NEVER_UTF8))
    if kind == "invalid":
        return draw(st.binary(max_size=6)) + bad + draw(st.binary(max_size=6))
    size = draw(st.sampled_from([1 << 16, 1 << 20]))
    at = draw(st.integers(0, size))
    return b"x" * at + (bad if draw(st.booleans()) else b"") + b"y" * (size - at)


text_mutation = st.sampled_from(TEXT_COLUMNS).flatmap(
    lambda target: st.tuples(st.just("text"), st.just(target[:2]), st.sampled_from(target[2]), text_values())
)
mutation = st.one_of(
    text_mutation,  # three times as likely as each other kind
    text_mutation,
    text_mutation,
    st.tuples(st.just("nvtx_text_id"), st.integers(1, 3), st.sampled_from([1, 6, 7, 99])),
    st.tuples(st.just("extra_string"), text_values()),
    st.tuples(st.just("drop_table"), st.sampled_from(TABLES)),
    st.tuples(st.just("drop_column"), st.sampled_from(COLUMNS)),
)


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def schema(path: Path) -> dict[str, set[str]]:
    """Each table of the database and its columns."""
    con = sqlite3.connect(path)
    tables = [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    out = {t: {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')} for t in tables}
    con.close()
    return out


def execute(path: Path, sql: str, *params: object) -> None:
    con = sqlite3.connect(path)
    con.execute(sql, params)
    con.commit()
    con.close()


def mutate(path: Path, op: tuple) -> None:
    """Apply one mutation; one whose table or column is gone by now does nothing."""
    cols = schema(path)
    if op[0] == "text":
        (table, column), rowid, raw = op[1], op[2], op[3]
        if column in cols.get(table, ()):
            set_text(path, table, column, rowid, raw)
    elif op[0] == "nvtx_text_id":
        if {"text", "textId"} <= cols[NVTX]:
            execute(path, f"UPDATE {NVTX} SET text = NULL, textId = ? WHERE rowid = ?", op[2], op[1])
    elif op[0] == "extra_string":
        if {"id", "value"} <= cols.get("StringIds", set()):  # an id no row refers to: never read
            execute(path, "INSERT OR REPLACE INTO StringIds (id, value) VALUES (100, CAST(? AS TEXT))", op[1])
    elif op[0] == "drop_table":
        execute(path, f'DROP TABLE IF EXISTS "{op[1]}"')
    elif op[1][1] in cols.get(op[1][0], ()):
        drop_column(path, *op[1])


@settings(FUZZ, max_examples=200)
@given(ops=st.lists(mutation, min_size=2, max_size=8))
def test_damaged_ancillary_data_never_fails_the_report_nor_changes_its_main_figures(folder: Path, ops: list) -> None:
    path = build(folder / "fuzz.sqlite")
    for op in ops:
        mutate(path, op)
    report = report_through_the_command(path, folder / "fuzz.json")
    check(report, path)
    for words in expected_warnings(path):
        event(" ".join(words))  # which losses the examples cover (pytest --hypothesis-show-statistics)
    trace = load(path)
    list(trace.events())
    assert all(note in report["summary"]["warnings"] for note in trace.info.notes)
    if not expected_warnings(path):  # nothing the report reads was lost: the loader has nothing to say
        assert trace.info.notes == []


@settings(FUZZ, max_examples=40)
@given(ops=st.lists(mutation, min_size=1, max_size=5))
def test_damaged_ancillary_data_renders_in_every_format(folder: Path, ops: list) -> None:
    path = build(folder / "render.sqlite")
    for op in ops:
        mutate(path, op)
    report = analyze(path)
    for fmt in ("text", "md", "csv"):
        out = render(report, fmt)
        out.encode("utf-8")  # valid text whatever the export held
        if fmt != "csv":
            assert all(f"warning: {w}" in out for w in report.summary.warnings)
    assert json.loads(render(report, "json"))["summary"]["warnings"] == report.summary.warnings


# ------------------------------------------------------------------------------- real exports, traces

REAL_NSYS = sorted(NSYS_DATA.glob("*.sqlite.xz"))
REAL_KINETO = sorted(
    p for p in DATA.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")) and p.parent != DATA
) + [DATA / "kineto_min.json"]


def test_there_are_real_exports_and_traces_to_read() -> None:
    assert len(REAL_NSYS) >= 3 and len(REAL_KINETO) >= 10
    readme = (NSYS_DATA / "README.md").read_text()
    assert all(p.name in readme for p in REAL_NSYS)


@pytest.fixture(scope="module")
def real_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("nsys")
    out = {}
    for packed in REAL_NSYS:
        path = folder / packed.name[: -len(".xz")]
        path.write_bytes(lzma.decompress(packed.read_bytes()))
        out[packed.name] = path
    return out


@pytest.mark.parametrize("name", [p.name for p in REAL_NSYS])
def test_every_real_nsys_export_is_reported_with_the_raw_rows_figures(
    real_exports: dict[str, Path], tmp_path: Path, name: str
) -> None:
    path = real_exports[name]
    report = report_through_the_command(path, tmp_path / "r.json")
    con = raw_db(path)
    tables = {n.decode() for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    count, total = con.execute(f"SELECT COUNT(*), SUM(end - start) FROM {KERNEL}").fetchone()
    assert count > 0
    assert (report["summary"]["kernel_count"], report["summary"]["kernel_ns"]) == (count, total)
    if MEMCPY in tables:
        copies, nbytes = con.execute(f"SELECT COUNT(*), SUM(bytes) FROM {MEMCPY}").fetchone()
        rows = [r for r in report["memory"]["rows"] if r["kind"] == "memcpy"]
        assert (sum(r["count"] for r in rows), sum(r["bytes"] for r in rows)) == (copies, nbytes)
    ranges = 0
    if NVTX in tables:
        ranges = con.execute(f"SELECT COUNT(*) FROM {NVTX} WHERE eventType IN (59, 60) AND end >= start").fetchone()[0]
    assert report["summary"]["events"].get("range", 0) == ranges
    expected = expected_warnings(path)
    for words in expected:
        assert any(all(w in line for w in words) for line in report["summary"]["warnings"]), words
    con.close()


def test_the_real_export_with_a_protobuf_blob_in_its_environment(real_exports: dict[str, Path]) -> None:
    path = real_exports["pipit_saxpy_mpi_a100.sqlite.xz"]
    con = raw_db(path)
    blobs = [n for n, v in con.execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV") if undecodable(v)]
    con.close()
    assert blobs == [b"GpuInfo"]
    with pytest.raises(sqlite3.OperationalError, match="Could not decode to UTF-8"):
        sqlite3.connect(path).execute("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV").fetchall()
    warnings = analyze(path).summary.warnings
    assert any(w.startswith("TARGET_INFO_SYSTEM_ENV (the recorded environment): 1 value is not valid UTF-8") for w in warnings)


def kineto_kernels(path: Path) -> tuple[int, int]:
    """Kernel count and time from the raw events: complete events of category kernel."""
    count = total = 0
    for e in read_trace(path)["traceEvents"]:
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel"):
            count += 1
            total += max(to_ns(e.get("dur", 0)), 0)
    return count, total


@pytest.mark.parametrize("path", REAL_KINETO, ids=lambda p: str(p.relative_to(DATA)))
def test_every_kineto_trace_is_reported_with_the_raw_events_figures(path: Path, tmp_path: Path) -> None:
    report = report_through_the_command(path, tmp_path / "r.json")
    count, total = kineto_kernels(path)
    assert report["summary"]["kernel_count"] == count
    assert (report["summary"]["kernel_ns"] or 0) == total

