"""Hostile inputs (tests/report/hostile.py) through ``gpuprobe report``, on every engine, under a
memory limit: each is refused (exit status 2, one line naming the file and the problem) or read with
what it left out or changed said in the report's warnings; in bounded time and memory.

Each shape runs in a child process whose address space is capped (``RLIMIT_AS``, 1 GiB: a shape
that took 2.7 GB before would die of a MemoryError there, an internal error, exit status 1) and
that reports each engine's exit status, stderr, report, time and the child's peak RSS. Before
these limits, the gzip bombs took 1.4 to 2.7 GB and minutes, 200 KB of nested arrays 23.7 GB under
ijson, and a 4 KB SQLite file with a recursive view spun for over a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.report import ReportInputError, load
from gpuprobe.report import _nsys
from gpuprobe.report._kineto import MAX_DEPTH, MAX_VALUE_CHARS
from gpuprobe.report._ncu import read_ncu
from gpuprobe.report.cli import main_diff, main_report

sys.path.insert(0, str(Path(__file__).parent))
import hostile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ("msgspec", "stdlib", "ijson")
ADDRESS_SPACE = 1 << 30  # RLIMIT_AS of the child: the report of a shape must fit in 1 GiB of address space
PEAK_MB = 400  # and its resident memory stay below this (a fresh child with the report loaded: ~25 MB)
SECONDS = 30.0  # per engine (a second or less on a quiet machine; the slowest, ijson on a bomb: 3.5 s)

# The child: the address space capped first, then each run of main_report in turn.
CHILD = r"""
import contextlib, io, json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
from gpuprobe.report.cli import main_report
out = []
for argv in json.loads(sys.argv[1]):
    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main_report(argv)
    out.append({"rc": rc, "stderr": stderr.getvalue(), "stdout": stdout.getvalue(),
                "seconds": time.perf_counter() - start})
# VmHWM is this process's own high-water mark: ru_maxrss keeps the parent's at exec, so a child of a
# large test process would report the parent's resident size (999 MB once the report tests had run).
hwm = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")]
peak = int(hwm[0]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"runs": out, "peak_mb": peak / 1024}))
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


def run_limited(runs: list[list[str]]) -> tuple[list[dict[str, Any]], float]:
    """Each argv through main_report in one child under the memory limit: the results and the peak RSS (MB)."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(runs), str(ADDRESS_SPACE)], capture_output=True,
                          text=True, cwd=ROOT, timeout=SECONDS * len(runs) + 60)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    return result["runs"], result["peak_mb"]


def check(shape: hostile.Shape, path: Path, result: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The run's outcome is the shape's: refused with its problem on one line, or read with its warning."""
    assert result["seconds"] < SECONDS, (label, result["seconds"])
    stderr = result["stderr"]
    if shape.refused is not None:
        assert result["rc"] == 2, (label, result["rc"], stderr)
        assert stderr.startswith(f"gpuprobe report: error: {path}: ") and stderr.count("\n") == 1, (label, stderr)
        assert shape.refused in stderr, (label, stderr)
        return None
    assert result["rc"] == 0, (label, stderr)
    report = json.loads(result["stdout"])
    warnings = report["warnings"] if shape.kind == "ncu" else report["summary"]["warnings"]
    if shape.warning is not None:
        assert any(shape.warning in w for w in warnings), (label, warnings)
    return report  # type: ignore[no-any-return]


JSON_SHAPES = [s for s in hostile.SHAPES if s.kind == "json"]
OTHER_SHAPES = [s for s in hostile.SHAPES if s.kind != "json"]


@pytest.mark.parametrize("shape", JSON_SHAPES, ids=[s.name for s in JSON_SHAPES])
def test_a_hostile_json_trace_is_refused_or_counted_on_every_engine_in_bounded_memory(
    folder: Path, shape: hostile.Shape
) -> None:
    path = shape.write(folder)
    runs, peak_mb = run_limited([[str(path), "--engine", e, "--format", "json", "--no-progress"] for e in ENGINES])
    reports = [check(shape, path, result, engine) for engine, result in zip(ENGINES, runs)]
    assert peak_mb < PEAK_MB
    if reports[0] is not None:  # read: the engines give the same report
        assert reports[1] == reports[0] and reports[2] == reports[0]


@pytest.mark.parametrize("shape", OTHER_SHAPES, ids=[s.name for s in OTHER_SHAPES])
def test_a_hostile_export_is_refused_or_counted_in_bounded_memory(folder: Path, shape: hostile.Shape) -> None:
    path = shape.write(folder)
    runs, peak_mb = run_limited([[str(path), "--format", "json", "--no-progress"]])
    check(shape, path, runs[0], shape.kind)
    assert peak_mb < PEAK_MB


# ------------------------------------------------------------------------------- the limits' edges


def _events_of(path: Path, engine: str) -> Any:
    try:
        return list(load(path, engine=engine).events())
    except ReportInputError as exc:
        return exc


@pytest.mark.parametrize("depth", [MAX_DEPTH // 2, MAX_DEPTH + 1, 5 * MAX_DEPTH])
def test_nesting_under_half_the_limit_is_read_and_past_the_limit_refused_by_every_engine(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "nested.json"
    event = json.dumps({**hostile.KERNEL, "args": {"correlation": 1, "Input Dims": "@"}})
    path.write_text('{"traceEvents": [' + event.replace('"@"', "[" * depth + "]" * depth) + "]}")
    outcomes = [_events_of(path, engine) for engine in ENGINES]
    if depth <= MAX_DEPTH // 2:
        assert all(isinstance(o, list) and len(o) == 1 for o in outcomes)
    else:
        assert all(isinstance(o, ReportInputError) and "nested too deeply" in o.problem for o in outcomes)


@pytest.mark.parametrize("digits", [4_300, 4_301])
def test_an_integer_at_the_digit_limit_is_a_time_out_of_range_and_past_it_refused(tmp_path: Path, digits: int) -> None:
    path = tmp_path / "digits.json"
    path.write_text(json.dumps({"traceEvents": [{**hostile.KERNEL, "ts": "@"}]}).replace('"@"', "9" * digits))
    for engine in ENGINES:
        trace = load(path, engine=engine)
        if digits <= sys.get_int_max_str_digits():
            assert list(trace.events()) == [] and trace.info.skipped_reasons == {
                "with a time that is not a number in range": 1}
        else:
            with pytest.raises(ReportInputError, match="more than 4,300 digits"):
                list(trace.events())


@pytest.mark.parametrize("extra", [0, 1 << 18])
def test_a_name_of_the_limit_is_read_and_one_past_it_refused_by_every_engine(tmp_path: Path, extra: int) -> None:
    name = "k" * (MAX_VALUE_CHARS - 200 + extra)  # the element around it takes about 100 characters more
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"traceEvents": [{**hostile.KERNEL, "name": name}]}))
    for engine in ENGINES:
        outcome = _events_of(path, engine)
        if extra == 0:
            assert isinstance(outcome, list) and [e.name for e in outcome] == [name], engine
        else:
            assert isinstance(outcome, ReportInputError) and "more than 16 MiB of text" in outcome.problem, engine
        del outcome


def test_a_byte_order_mark_before_a_trace_gives_the_trace_without_it(tmp_path: Path) -> None:
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(hostile.MIN_DOC))
    marked = tmp_path / "marked.json"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    expected = list(load(plain, engine="stdlib").events())
    assert len(expected) > 5
    for engine in ENGINES:
        assert list(load(marked, engine=engine).events()) == expected, engine


def test_each_reason_to_leave_an_event_out_is_counted_apart(tmp_path: Path) -> None:
    events = [1, None, {**hostile.KERNEL, "name": 7}, {**hostile.KERNEL, "ts": "soon"},
              {**hostile.KERNEL, "pid": [0]}, {**hostile.KERNEL, "dur": -1.5}, {**hostile.KERNEL, "dur": None}]
    path = tmp_path / "reasons.json"
    path.write_text(json.dumps({"traceEvents": events}))
    for engine in ENGINES:
        trace = load(path, engine=engine)
        read = list(trace.events())
        assert [e.dur_ns for e in read] == [0, 0]  # the negative and the null duration, read as 0 ns
        assert trace.info.skipped_reasons == {
            "not a JSON object": 2, "without a name": 1, "with a time that is not a number in range": 1,
            "with a pid or tid that is neither an integer nor a string": 1}
        assert trace.info.skipped_events == 5
        assert trace.info.notes == ["1 event has a negative duration: read as 0 ns",
                                    "1 event has no duration (dur missing or null): read as 0 ns"]


# ---------------------------------------------------------------------- Nsight Systems: the budget


def test_an_export_built_to_be_slow_is_stopped_by_the_step_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A name table without its key: each distinct kernel name is then a scan of the whole table.
    # 3,000 names x 3,000 strings: ~9M rows visited; the budget, lowered to 2M steps, stops it.
    path = tmp_path / "slow.sqlite"
    con = sqlite3.connect(path)
    con.executescript(hostile.NSYS_SQL.replace("id INTEGER NOT NULL PRIMARY KEY", "id INTEGER NOT NULL"))
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1000 + i, f"kernel_{i}") for i in range(3000)])
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, correlationId, globalPid, demangledName, deviceId, "
        "contextId, streamId, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
        "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
        "VALUES (?, ?, 0, 0, ?, 0, 0, 7, ?, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)",
        [(i * 10, i * 10 + 5, 1000 + i, 1000 + i) for i in range(3000)],
    )
    con.commit()
    con.close()
    assert len(list(load(path).events())) > 3000  # within the real budget: read whole
    monkeypatch.setattr(_nsys, "MIN_STEPS", 2_000_000)
    monkeypatch.setattr(_nsys, "STEPS_PER_BYTE", 1)
    with pytest.raises(ReportInputError, match=r"reading it costs SQLite more than 2,000,000 steps \(kernel names"):
        list(load(path).events())


def test_the_real_exports_cost_far_less_than_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lzma

    calls: list[int] = []
    counted = _nsys._Budget.__call__
    monkeypatch.setattr(_nsys._Budget, "__call__", lambda self: calls.append(1) or counted(self))
    for packed in sorted((hostile.DATA / "nsys").glob("*.sqlite.xz")):
        path = tmp_path / packed.name[: -len(".xz")]
        path.write_bytes(lzma.decompress(packed.read_bytes()))
        calls.clear()
        assert sum(1 for _ in load(path).events()) > 0
        spent = len(calls) * _nsys._TICK  # steps, to the handler's granularity
        assert spent <= path.stat().st_size * _nsys.STEPS_PER_BYTE / 100, (path.name, spent)


# ------------------------------------------------------------------------ files that are not files


def _report_line(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main_report(argv)
    return code, err.getvalue()


def test_a_named_pipe_is_refused_at_once_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    result: list[tuple[int, str]] = []
    worker = threading.Thread(target=lambda: result.append(_report_line([str(fifo), "--no-progress"])), daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():  # blocked in open(): let it go, then fail
        with open(fifo, "wb"):
            pass
        worker.join(timeout=5)
        pytest.fail("the report waited for a writer of the named pipe")
    code, err = result[0]
    assert code == 2 and err == f"gpuprobe report: error: {fifo}: a pipe, not a file: a trace file is read from a file " \
                                 "(its format is sniffed first, then it is read); save it to a file and pass that\n"


def test_a_pipe_on_standard_input_is_refused_with_the_reason(kineto_min: Path) -> None:
    # `cat trace.json | gpuprobe report /dev/stdin`: said to be a pipe, not "empty file"
    with open(kineto_min, "rb") as f:
        data = f.read()
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "report", "/dev/stdin", "--no-progress"], input=data,
                          capture_output=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert done.stderr.decode().startswith("gpuprobe report: error: /dev/stdin: a pipe, not a file")
    assert done.stderr.count(b"\n") == 1


def test_a_character_device_is_refused() -> None:
    code, err = _report_line(["/dev/zero", "--no-progress"])
    assert code == 2 and err.startswith("gpuprobe report: error: /dev/zero: a character device, not a file")


def test_a_file_redirected_to_standard_input_is_read(kineto_min: Path) -> None:
    with open(kineto_min, "rb") as f:
        done = subprocess.run([sys.executable, "-m", "gpuprobe", "report", "/dev/stdin", "--format", "json",
                               "--no-progress"], stdin=f, capture_output=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["kernel_count"] == 2


# ------------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--small-us", "nan"], "argument --small-us: must be a finite number of microseconds, 0 or more, not 'nan'"),
        (["--small-us", "inf"], "argument --small-us: must be a finite number of microseconds, 0 or more, not 'inf'"),
        (["--small-us", "-1"], "argument --small-us: must be a finite number of microseconds, 0 or more, not '-1'"),
        (["--small-us", "fast"], "argument --small-us: not a number: 'fast'"),
        (["--format", "xml"], "argument --format: invalid choice: 'xml'"),
        (["--top", "0"], "argument --top: must be positive: 0"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--engine"], "argument --engine: expected one argument"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it(kineto_min: Path, argv: list[str], problem: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        main_report([str(kineto_min), *argv])
    assert exited.value.code == 2
    line = err.getvalue()
    assert line.startswith(f"gpuprobe report: error: {problem}") and line.endswith(" (see gpuprobe report --help)\n")
    assert line.count("\n") == 1


def test_a_missing_argument_of_diff_is_one_line() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        main_diff(["only-one.json"])
    assert exited.value.code == 2
    assert err.getvalue() == "gpuprobe diff: error: the following arguments are required: b (see gpuprobe diff --help)\n"


def test_small_us_that_is_not_a_finite_number_is_refused_from_python(kineto_min: Path) -> None:
    from gpuprobe.errors import ConfigError
    from gpuprobe.report import analyze

    for bad in (float("nan"), float("inf"), -1.0, "5"):
        with pytest.raises(ConfigError, match="small_us must be a finite number"):
            analyze(kineto_min, small_us=bad)  # type: ignore[arg-type]


# -------------------------------------------------------------------- Nsight Compute: cut exports


def _exports() -> Iterator[Path]:
    for path in sorted((hostile.DATA / "ncu").iterdir()):
        if path.name != "README.md" and "error_only" not in path.name:
            yield path


@pytest.mark.parametrize("source", list(_exports()), ids=lambda p: p.name)
def test_an_export_cut_inside_a_line_is_refused(tmp_path: Path, source: Path) -> None:
    data = source.read_bytes()
    full = read_ncu(source)
    start = data.index(b'"ID",')
    cuts = random.Random(source.name).sample(range(start + 1, len(data) - 1), 40)
    path = tmp_path / source.name
    for cut in cuts:
        if data[cut - 1 : cut] == b"\n":
            continue  # a cut at a line break: a shorter export of fewer kernels (or the last one short)
        path.write_bytes(data[:cut])
        in_header = cut < data.index(b"\n", start)  # maybe not even recognised as ncu's: refused all the same
        with pytest.raises(ReportInputError, match=".*" if in_header else "truncated: the table's (header|last row)"):
            read_ncu(path)
    assert read_ncu(source).kernels == full.kernels  # the whole export is read as before


def test_a_details_export_cut_between_two_metric_rows_is_said_to_be_short(tmp_path: Path) -> None:
    import csv

    data = hostile.NCU_DETAILS.read_bytes()
    full = read_ncu(hostile.NCU_DETAILS)
    assert not any("cut short" in w for w in full.warnings)
    lines = data.splitlines(keepends=True)
    path = tmp_path / "short.csv"
    path.write_bytes(b"".join(lines[:-3]))  # the last kernel without its last three figures
    rows = list(csv.reader(io.StringIO(b"".join(lines).decode())))
    per_kernel: dict[str, int] = {}
    for row in rows[1:]:
        per_kernel[row[0]] = per_kernel.get(row[0], 0) + 1
    last = rows[-1][0]
    others = min(n for k, n in per_kernel.items() if k != last)
    export = read_ncu(path)
    assert len(export.kernels) == len(full.kernels)
    assert [w for w in export.warnings if "cut short" in w] == [
        f"the last kernel (ID {last}) has {per_kernel[last] - 3} metric rows, the others {others} or more: the export "
        "may be cut short (its figures for that kernel are incomplete)"
    ]
