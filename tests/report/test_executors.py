"""``gpuprobe report DIR --executor ...``: the ranks of a run as tasks of a real Dask cluster.

The cluster is Dask's own: a scheduler and two worker processes started with Dask's command-line
programs (``python -m distributed.cli.dask_scheduler`` / ``dask_worker``), bound to 127.0.0.1, the
workers in a directory of their own (so a relative trace path would not resolve there). Its report
must be the report of gpuprobe's own worker processes, byte for byte, and the scheduler must have run
one task per rank.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")
pytestmark = pytest.mark.slow

from gpuprobe.errors import ConfigError, MissingDependencyError  # noqa: E402
from gpuprobe.report import analyze_ranks  # noqa: E402
from gpuprobe.report import _executors  # noqa: E402
from gpuprobe.report.cli import main_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DLRM = "tests/data/kineto/param_dlrm_8rank"  # relative to ROOT, as a user would type it there
RANKS = 8


def _cli(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprobe", "report", *argv, "--no-progress"], cwd=ROOT, text=True,
                          capture_output=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Dask scheduler with two single-threaded worker processes: its address."""
    folder = tmp_path_factory.mktemp("dask")
    info = folder / "scheduler.json"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--no-dashboard", "--scheduler-file", str(info)],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )]
    try:
        deadline = time.monotonic() + 60
        while not info.exists() or not info.read_text().strip():
            assert time.monotonic() < deadline and procs[0].poll() is None, "the Dask scheduler did not start"
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "2", "--nthreads", "1",
             "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(folder)],
            cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
        from distributed import Client

        with Client(address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def local_report() -> str:
    """The report of gpuprobe's own worker processes (the default executor)."""
    done = _cli([DLRM, "--format", "json"])
    assert done.returncode == 0, done.stderr
    return done.stdout


def _rank_tasks(address: str) -> int:
    """How many rank_task tasks the scheduler has run so far (its per-prefix count of tasks that reached
    memory, i.e. finished)."""
    from distributed import Client

    def count(dask_scheduler: Any) -> int:
        prefix = dask_scheduler.task_prefixes.get("rank_task")
        return 0 if prefix is None else int(prefix.state_counts.get("memory", 0))

    with Client(address, timeout=30, set_as_default=False) as client:
        return int(client.run_on_scheduler(count))


@pytest.mark.parametrize("form", ["tcp", "dask"])
def test_a_dask_scheduler_address_runs_each_rank_as_a_task_and_gives_the_same_report(
    scheduler: str, local_report: str, form: str
) -> None:
    before = _rank_tasks(scheduler)
    spec = scheduler if form == "tcp" else "dask://" + scheduler.removeprefix("tcp://")
    done = _cli([DLRM, "--format", "json", "--executor", spec])
    assert done.returncode == 0, done.stderr
    assert done.stdout == local_report  # paths as given (relative), though the workers read absolute ones
    assert json.loads(done.stdout)["ranks"]["count"] == RANKS
    assert _rank_tasks(scheduler) - before == RANKS


def test_dask_alone_takes_the_scheduler_of_dask_configuration(scheduler: str, local_report: str) -> None:
    before = _rank_tasks(scheduler)
    done = _cli([DLRM, "--format", "json", "--executor", "dask"], env={"DASK_SCHEDULER_ADDRESS": scheduler})
    assert done.returncode == 0, done.stderr
    assert done.stdout == local_report
    assert _rank_tasks(scheduler) - before == RANKS


def test_dask_alone_without_a_configured_scheduler_starts_and_stops_a_local_cluster(local_report: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "report", DLRM, "--format", "json", "--executor", "dask",
                           "--no-progress"], cwd=ROOT, text=True, capture_output=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == local_report


def test_the_by_rank_reports_of_a_dask_run_show_the_paths_as_given(scheduler: str) -> None:
    done = _cli([DLRM, "--format", "json", "--by-rank", "--sections", "summary", "--executor", scheduler])
    assert done.returncode == 0, done.stderr
    ranks = json.loads(done.stdout)["ranks"]
    assert [r["path"] for r in ranks] == [f"{DLRM}/rank-{i}.json.gz" for i in range(RANKS)]
    assert [r["report"]["summary"]["path"] for r in ranks] == [f"{DLRM}/rank-{i}.json.gz" for i in range(RANKS)]


def test_a_rank_its_worker_cannot_read_names_the_file(scheduler: str, tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text('{"traceEvents": []}')
    (tmp_path / "rank-1.json").write_text('{"traceEvents": [')
    done = _cli([str(tmp_path), "--executor", scheduler])
    assert done.returncode == 2
    assert done.stderr == f"gpuprobe report: error: {tmp_path / 'rank-1.json'}: truncated JSON: the file ends where " \
                          "a value was expected\n"


def test_ranks_that_fail_together_leave_one_error_on_stderr(scheduler: str, tmp_path: Path) -> None:
    # The first failure ends the run while the other ranks finish on the workers: cancelling their tasks
    # then makes Dask's client log tracebacks (a result arriving at a future already cancelled, a gather of
    # a cancelled key), which say nothing about the traces; in about one run of three, here, before.
    for rank in range(32):
        (tmp_path / f"rank-{rank}.json").write_text('{"traceEvents": [')
    done = _cli([str(tmp_path), "--executor", scheduler])
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert re.fullmatch(rf"gpuprobe report: error: {re.escape(str(tmp_path))}/rank-\d+\.json: truncated JSON: the "
                        "file ends where a value was expected", lines[0]), lines[0]


def test_the_python_api_takes_the_clusters_executor(scheduler: str) -> None:
    from distributed import Client

    with Client(scheduler, timeout=30, set_as_default=False) as client:
        merged, results = analyze_ranks([ROOT / DLRM], executor=client.get_executor())
    serial, serial_results = analyze_ranks([ROOT / DLRM], jobs=1)  # in this process, one rank after another
    assert [r.rank for r in results] == list(range(RANKS))
    assert merged.to_dict() == serial.to_dict()
    assert [r.report.to_dict() for r in results] == [r.report.to_dict() for r in serial_results]


def _line(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main_report(argv)
    return code, err.getvalue()


def test_a_scheduler_that_cannot_be_reached_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_executors, "CONNECT_TIMEOUT_S", 1)
    code, err = _line([str(ROOT / DLRM), "--executor", "tcp://127.0.0.1:9", "--no-progress"])
    assert code == 2
    assert err.startswith("gpuprobe report: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("spec", ["ray", "spark://x:1", "127.0.0.1:8786"])
def test_an_unknown_executor_is_one_line_naming_the_accepted_forms(spec: str) -> None:
    code, err = _line([str(ROOT / DLRM), "--executor", spec, "--no-progress"])
    assert (code, err) == (2, f"gpuprobe report: error: unknown executor {spec!r}: 'processes', a Dask scheduler "
                              "address (tcp://HOST:PORT, dask://HOST:PORT) or 'dask'\n")


def test_an_executor_for_one_trace_is_refused() -> None:
    code, err = _line([str(ROOT / DLRM / "rank-0.json.gz"), "--executor", "dask", "--no-progress"])
    assert (code, err) == (2, "gpuprobe report: error: --executor runs the ranks of several traces (files, or a "
                              "directory of them), not one\n")


def test_without_distributed_installed_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed: ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'gpuprobe\[report-dask\]'"):
        with _executors.open_executor("dask"):
            pass
    with pytest.raises(ConfigError):
        with _executors.open_executor("nowhere"):
            pass
