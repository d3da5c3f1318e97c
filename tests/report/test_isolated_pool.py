"""The report's own executor (``IsolatedProcessPool``): a ``concurrent.futures.Executor`` whose workers are
real ``python -I`` processes in the folder holding this gpuprobe, each running calls one after another;
what a call returns comes back, a call that raises or a worker that dies fails its future alone, a worker
retired after a call is replaced, and no worker outlives a shutdown or a terminate."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from pathlib import Path

import pytest
from helpers import child_pids

from gpuprobe.report._executors import IsolatedProcessPool, TaskFailed, WorkerFailed

ROOT = Path(__file__).resolve().parents[2]


_before: set[int] = set()


@pytest.fixture(autouse=True)
def _children_before() -> None:
    """The children this process had before the test (another test's, e.g. torch.compile's worker pool)."""
    _before.clear()
    _before.update(child_pids())


def _children() -> set[int]:
    """The children this process started during the test and still has."""
    return child_pids() - _before


def test_a_call_runs_in_an_isolated_worker_in_the_folder_holding_gpuprobe(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with IsolatedProcessPool(1) as pool:
        isolated = pool.submit(eval, "__import__('sys').flags.isolated").result()
        first_path = pool.submit(eval, "__import__('sys').path[0]").result()
        cwd = pool.submit(os.getcwd).result()
        pid = pool.submit(os.getpid).result()
    assert (isolated, first_path, cwd) == (1, str(ROOT), str(ROOT))
    assert pid != os.getpid()
    assert _children() == set()


def test_two_workers_share_the_calls_and_each_result_comes_back_to_its_future() -> None:
    with IsolatedProcessPool(2) as pool:
        futures = [pool.submit(pow, 3, n) for n in range(12)]
        pids = {pool.submit(os.getpid).result() for _ in range(4)}
        assert [f.result() for f in futures] == [3 ** n for n in range(12)]
    assert 1 <= len(pids) <= 2
    assert _children() == set()


def test_what_a_call_prints_does_not_reach_its_answer() -> None:
    with IsolatedProcessPool(1) as pool:
        assert pool.submit(print, "noise on stdout").result() is None
        assert pool.submit(abs, -4).result() == 4


def test_a_call_runs_on_its_arguments_as_they_were_when_it_was_submitted() -> None:
    values = [1, 2, 3]
    with IsolatedProcessPool(1) as pool:
        future = pool.submit(sum, values)
        values.append(100)  # before the worker has started (an interpreter's start: tenths of a second)
        assert future.result() == 6


def test_a_call_that_cannot_be_pickled_fails_its_future_and_the_pool_goes_on() -> None:
    with IsolatedProcessPool(1) as pool:
        bad = pool.submit(id, threading.Lock())
        with pytest.raises(TypeError, match="pickle"):
            bad.result()
        assert pool.submit(abs, -2).result() == 2
    assert _children() == set()


def test_a_call_that_raises_fails_its_future_and_the_worker_goes_on() -> None:
    with IsolatedProcessPool(1) as pool:
        bad = pool.submit(int, "not a number")
        good = pool.submit(int, "12")
        with pytest.raises(TaskFailed, match=r"^ValueError: invalid literal for int\(\) with base 10: 'not a number'$"):
            bad.result()
        assert good.result() == 12


def test_a_worker_that_dies_fails_its_call_with_its_exit_status_and_a_fresh_one_runs_the_next() -> None:
    with IsolatedProcessPool(1) as pool:
        before = pool.submit(os.getpid).result()
        with pytest.raises(WorkerFailed, match=r"^exit status 3$"):
            pool.submit(os._exit, 3).result()
        after = pool.submit(os.getpid).result()
    assert after != before
    assert _children() == set()


def test_a_worker_whose_call_is_retired_exits_after_it() -> None:
    with IsolatedProcessPool(1, retire=lambda *args: args == ("retire",)) as pool:
        pids = [pool.submit(os.getpid).result() for _ in range(2)]
        pool.submit(str, "retire").result()
        pids.append(pool.submit(os.getpid).result())
    assert pids[0] == pids[1] != pids[2]


def test_terminate_kills_a_running_call_and_cancels_the_waiting_ones() -> None:
    pool = IsolatedProcessPool(1)
    pool.submit(abs, 1).result()  # the worker has started
    running = pool.submit(time.sleep, 60)
    waiting = pool.submit(time.sleep, 60)
    while not running.running():
        time.sleep(0.01)
    started = time.monotonic()
    pool.terminate()
    assert time.monotonic() - started < 10
    with pytest.raises(WorkerFailed, match=r"^exit status -9$"):
        running.result()
    assert waiting.cancelled()
    assert _children() == set()


def test_a_pool_that_was_shut_down_takes_no_more_calls() -> None:
    pool = IsolatedProcessPool(1)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(abs, 1)
    assert isinstance(pool, concurrent.futures.Executor)
