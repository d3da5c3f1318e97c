"""Where the ranks of a multi-rank report are read: in the report's process when their text is small in
all, else by a pool of reused worker processes, isolated from the folder the report runs in.

Everything here is real: the real 8-rank DLRM traces and other real traces of tests/data/kineto (copied),
real worker processes, the real command line in a child process (the ``gpuprobe`` console script, as a
user runs it), and modules planted beside the traces that would leave a marker file if imported.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import child_pids
from tracefiles import read_trace

from gpuprobe.report import ReportInputError
from gpuprobe.report import _executors, _ranks
from gpuprobe.report import _split as split
from gpuprobe.report._ranks import analyze_ranks, text_bytes

KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto"
DLRM = KINETO / "param_dlrm_8rank"
#: Real traces with more than IN_PROCESS_BYTES of text together: one rank, and one without a rank.
LARGE = ("hta_cudagraph_nccl_rank0.json.gz", "kineto_tb_resnet50_v100_2021.json.gz")
#: Standard modules a report's process or its workers import: planted beside the traces.
PLANTED = ("bisect", "zlib", "json", "gzip")


def _plant(folder: Path, markers: Path) -> None:
    """Modules named as standard ones, each writing a marker file when imported (then failing)."""
    for name in PLANTED:
        (folder / f"{name}.py").write_text(
            f"import pathlib\npathlib.Path({str(markers / name)!r}).write_text('imported')\n"
            f"raise ImportError('the planted {name}.py was imported')\n"
        )


_before: set[int] = set()


@pytest.fixture(autouse=True)
def _children_before() -> None:
    """The children this process had before the test (another test's, e.g. torch.compile's worker pool)."""
    _before.clear()
    _before.update(child_pids())


def _children() -> set[int]:
    """The children this process started during the test and still has."""
    return child_pids() - _before


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command line of every worker process the report starts (they still start, for real)."""
    seen: list[list[str]] = []
    real = subprocess.Popen

    def spy(args: Any, *rest: Any, **kwargs: Any) -> Any:
        seen.append(list(args))
        return real(args, *rest, **kwargs)

    monkeypatch.setattr(_executors.subprocess, "Popen", spy)
    return seen


def test_the_text_of_a_gzip_trace_is_its_uncompressed_size(tmp_path: Path) -> None:
    path = DLRM / "rank-0.json.gz"
    with gzip.open(path, "rb") as f:
        expected = len(f.read())
    assert text_bytes(path) == expected > path.stat().st_size
    plain = tmp_path / "plain.json"
    plain.write_bytes(b'{"traceEvents": []}')
    assert text_bytes(plain) == 19
    assert text_bytes(tmp_path / "missing.json") == 0


def test_small_ranks_are_read_in_this_process(started: list[list[str]]) -> None:
    assert sum(text_bytes(p) for p in DLRM.iterdir()) < _ranks.IN_PROCESS_BYTES  # 8 ranks, 4 MB of text
    merged, results = analyze_ranks([DLRM], jobs=2)
    assert started == []
    assert [r.rank for r in results] == list(range(8))
    assert merged.to_dict() == analyze_ranks([DLRM], jobs=1)[0].to_dict()


def test_a_pool_of_workers_reads_many_ranks_each_and_gives_the_report_of_one_process(
    monkeypatch: pytest.MonkeyPatch, started: list[list[str]]
) -> None:
    serial, serial_results = analyze_ranks([DLRM], jobs=1)
    monkeypatch.setattr(_ranks, "IN_PROCESS_BYTES", 0)
    seen: list[tuple[int, int]] = []
    merged, results = analyze_ranks([DLRM], jobs=2, progress=lambda done, total: seen.append((done, total)))
    assert len(started) == 2  # two workers for eight ranks
    assert all(argv[1] == "-I" for argv in started)
    assert merged.to_dict() == serial.to_dict()
    assert [r.report.to_dict() for r in results] == [r.report.to_dict() for r in serial_results]
    assert [r.path for r in results] == [str(p) for p in sorted(DLRM.iterdir())]
    assert seen == [(i, 8) for i in range(1, 9)]
    assert _children() == set()  # no worker outlives the report


def test_a_worker_that_read_a_large_trace_is_replaced_by_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch, started: list[list[str]]
) -> None:
    serial, _ = analyze_ranks([DLRM], jobs=1)
    monkeypatch.setattr(_ranks, "IN_PROCESS_BYTES", 0)
    monkeypatch.setattr(_ranks, "RECYCLE_BYTES", 0)  # every trace is large
    merged, _ = analyze_ranks([DLRM], jobs=2)
    assert len(started) == 8  # one worker per rank, each gone after its trace
    assert merged.to_dict() == serial.to_dict()
    assert _children() == set()


def test_a_rank_a_worker_cannot_read_names_the_file_and_no_worker_is_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for i in (0, 1, 2):
        shutil.copy(DLRM / f"rank-{i}.json.gz", tmp_path / f"rank-{i}.json.gz")
    (tmp_path / "rank-3.json").write_text('{"traceEvents": [{"ph": "X"')
    monkeypatch.setattr(_ranks, "IN_PROCESS_BYTES", 0)
    with pytest.raises(ReportInputError) as caught:
        analyze_ranks([tmp_path], jobs=2)
    assert caught.value.path == str(tmp_path / "rank-3.json")
    assert "truncated JSON" in caught.value.problem
    assert _children() == set()


def test_workers_import_nothing_from_the_folder_the_report_runs_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, started: list[list[str]]
) -> None:
    folder, markers = tmp_path / "ranks", tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()
    for p in DLRM.iterdir():
        shutil.copy(p, folder / p.name)
    monkeypatch.chdir(folder)
    serial, _ = analyze_ranks(["."], jobs=1)
    _plant(folder, markers)
    monkeypatch.setenv("PYTHONPATH", str(folder))  # isolated workers ignore it too
    monkeypatch.setattr(_ranks, "IN_PROCESS_BYTES", 0)
    merged, results = analyze_ranks(["."], jobs=2)
    assert len(started) == 2 and list(markers.iterdir()) == []
    assert [r.path for r in results] == [f"rank-{i}.json.gz" for i in range(8)]  # as given, relative
    assert merged.to_dict() == serial.to_dict()


def test_the_second_process_of_a_large_trace_imports_nothing_from_the_folder_the_report_runs_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpuprobe.report import analyze, render

    folder, markers = tmp_path / "trace", tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()
    with gzip.open(DLRM / "rank-2.json.gz", "rb") as src:
        (folder / "rank-2.json").write_bytes(src.read())
    one = render(analyze(folder / "rank-2.json", jobs=1), "json").replace(str(folder / "rank-2.json"), "rank-2.json")
    _plant(folder, markers)
    made: list[bool] = []
    real = split.feed_in_two
    monkeypatch.setattr(split, "feed_in_two", lambda *args: made.append(real(*args)) or made[-1])
    monkeypatch.setattr(split, "MIN_BYTES", 0)  # split whatever the size
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PYTHONPATH", str(folder))
    two = render(analyze("rank-2.json", jobs=2), "json")
    assert made == [True], "the second process read the tail"
    assert list(markers.iterdir()) == []
    assert two == one


def _console_script() -> Path:
    script = Path(sys.executable).with_name("gpuprobe")
    if not script.exists():
        pytest.skip(f"no gpuprobe console script beside {sys.executable} (gpuprobe not installed there)")
    return script


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_the_command_line_in_a_folder_of_traces_with_planted_modules_imports_none_of_them(tmp_path: Path) -> None:
    """``cd traces && gpuprobe report .``: the report's own process (the console script puts its own folder
    first on the path, not the current one) and its worker processes import nothing from the folder.
    (``python -m gpuprobe`` would: Python puts the current folder first for ``-m``, before gpuprobe runs.)"""
    script = _console_script()
    folder, markers = tmp_path / "ranks", tmp_path / "markers"
    folder.mkdir()
    markers.mkdir()
    for name in LARGE:
        shutil.copy(KINETO / name, folder / name)
    assert sum(text_bytes(folder / n) for n in LARGE) > _ranks.IN_PROCESS_BYTES  # read by worker processes
    _plant(folder, markers)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = {}
    for jobs in ("2", "1"):  # two workers; then one after another in the report's process
        done = subprocess.run([str(script), "report", ".", "--format", "json", "--no-progress", "--jobs", jobs],
                              cwd=folder, env=env, capture_output=True, text=True, timeout=240)
        assert (done.returncode, done.stderr) == (0, ""), jobs
        runs[jobs] = done.stdout
    assert list(markers.iterdir()) == []
    assert runs["2"] == runs["1"]
    report = json.loads(runs["2"])
    assert [Path(r["path"]).name for r in report["ranks"]["rows"]] == list(LARGE)
    kernels = sum(1 for name in LARGE for e in read_trace(KINETO / name)["traceEvents"]
                  if e.get("ph") == "X" and str(e.get("cat")).lower() == "kernel")  # "Kernel" in 2021
    assert report["summary"]["kernel_count"] == kernels


def test_a_worker_killed_while_the_ranks_are_read_is_an_error_naming_a_rank_and_no_worker_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the system's out-of-memory killer would: after the first rank, every worker is killed."""
    import signal

    monkeypatch.setattr(_ranks, "IN_PROCESS_BYTES", 0)

    def kill_workers(done: int, total: int) -> None:
        if done == 1:
            for pid in _children():
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(RuntimeError, match=r"^the worker for .*rank-\d\.json\.gz failed: exit status -9$"):
        analyze_ranks([DLRM], jobs=2, progress=kill_workers)
    assert _children() == set()
