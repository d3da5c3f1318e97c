"""``--executor`` addresses checked before anything connects: a malformed Dask scheduler address is one
line and exit status 2, at once, from the real command line (a child process, bounded in time), with no
traceback on the way out; well-formed addresses pass the check."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuprobe.errors import ConfigError
from gpuprobe.report._executors import check_address

ROOT = Path(__file__).resolve().parents[2]
DLRM = ROOT / "tests" / "data" / "kineto" / "param_dlrm_8rank"
LIMIT_S = 5.0


def _cli(executor: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "report", str(DLRM), "--executor", executor,
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})
    return done, time.monotonic() - t0


@pytest.mark.subprocess_only
@pytest.mark.parametrize(("executor", "problem"), [
    ("tcp://127.0.0.1:notaport", "the port must be a whole number from 1 to 65535, not 'notaport'"),
    ("tcp://127.0.0.1:99999", "the port must be a whole number from 1 to 65535, not '99999'"),
    ("tcp://127.0.0.1:0", "the port must be a whole number from 1 to 65535, not '0'"),
    ("dask://localhost:-1", "the port must be a whole number from 1 to 65535, not '-1'"),
    ("tcp://127.0.0.1", "no port: tcp://HOST:PORT"),
    ("tls://:8786", "no host name or IP address before the port"),
    ("tcp://[::1]8786", "an IPv6 host in brackets must be followed by ':PORT'"),
    ("inproc://127.0.0.1/42/1", "an inproc:// address names a scheduler inside one process"),
])
def test_a_malformed_scheduler_address_is_one_line_and_exit_2_at_once(executor: str, problem: str) -> None:
    done, wall = _cli(executor)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"gpuprobe report: error: bad Dask scheduler address {executor!r}: {problem}")
    assert done.stderr.count("\n") == 1 and done.stderr.endswith("\n")  # one line: no traceback after it
    assert done.stdout == ""
    assert wall < LIMIT_S, f"{wall:.1f} s"


@pytest.mark.subprocess_only
def test_a_malformed_address_in_dasks_configuration_is_one_line_and_exit_2_at_once() -> None:
    pytest.importorskip("distributed")
    done, wall = _cli("dask", env={"DASK_SCHEDULER_ADDRESS": "tcp://127.0.0.1:notaport"})
    assert done.returncode == 2
    assert done.stderr == ("gpuprobe report: error: bad Dask scheduler address 'tcp://127.0.0.1:notaport': the port "
                           "must be a whole number from 1 to 65535, not 'notaport' (in Dask's configuration, "
                           "DASK_SCHEDULER_ADDRESS or scheduler-address)\n")
    assert wall < LIMIT_S, f"{wall:.1f} s"


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:8786", "tls://scheduler.example:1", "tcp://[::1]:65535",
                                     "ws://node-3:8786", "ucx://10.0.0.2:13337"])
def test_a_well_formed_address_passes(address: str) -> None:
    check_address(address)


def test_the_message_shows_the_address_as_given() -> None:
    with pytest.raises(ConfigError, match=r"^bad Dask scheduler address 'dask://h:x': the port"):
        check_address("tcp://h:x", "dask://h:x")
