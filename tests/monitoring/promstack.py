"""Processes for the monitoring tests: Debian's Prometheus, the workload, torchrun; started and stopped by PID.

Every process is started in a session of its own (``start_new_session``), so stopping it stops its
children too (torchrun's workers): SIGTERM to the process group, then SIGKILL if it lingers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuprobe import dashboards as dash
from gpuprobe._files import write_file_atomic
from gpuprobe.dashboards import to_yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
WORKLOAD = os.path.join(HERE, "workload.py")
DASHBOARD_DIR = os.path.join(ROOT, "deploy", "grafana", "dashboards")
PROMETHEUS_DIR = os.path.join(ROOT, "deploy", "prometheus")
SIM_INSTANCE = "otel-collector-sim:8889"


def ensure_prometheus() -> None:
    """Install Debian's ``prometheus`` package (both binaries) if missing; skip only without apt."""
    if os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK):
        return
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.skip("apt-get is not available here, so Debian's prometheus package cannot be installed "
                    f"({PROMETHEUS} and {PROMTOOL} are missing)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    policy = "/usr/sbin/policy-rc.d"
    added_policy = False
    try:
        if not os.path.exists(policy) and os.access(os.path.dirname(policy), os.W_OK):
            # The package's postinst would otherwise start a system Prometheus on :9090.
            with open(policy, "w") as f:
                f.write("#!/bin/sh\nexit 101\n")
            os.chmod(policy, 0o755)
            added_policy = True
        for cmd in ([apt, "update"], [apt, "install", "-y", "--no-install-recommends", "prometheus"]):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"`{' '.join(cmd)}` failed ({done.returncode}); Debian's prometheus package is needed "
                            f"for these tests:\n{(done.stdout + done.stderr)[-3000:]}")
    finally:
        if added_policy:
            os.remove(policy)
    if not (os.access(PROMETHEUS, os.X_OK) and os.access(PROMTOOL, os.X_OK)):
        pytest.fail(f"the prometheus package is installed but {PROMETHEUS} or {PROMTOOL} is missing")


def free_port(consecutive: int = 1) -> int:
    """A free local TCP port whose next ``consecutive - 1`` ports are free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + consecutive - 1 > 65535:
            continue
        if all(_is_free(base + i) for i in range(1, consecutive)):
            return base
    raise RuntimeError(f"no {consecutive} consecutive free ports found")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Proc:
    """A process this test started: its command, log file and Popen."""

    def __init__(self, name: str, cmd: list[str], log_path: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
        full_env.update({"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        # The workloads are CPU runs (the GPU-only series come from --gpu-fixture): on a machine with
        # GPUs they must not see them, or their series would be labelled and sampled as a GPU run's.
        full_env["CUDA_VISIBLE_DEVICES"] = ""
        full_env.update(env or {})
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the process's output."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-chars:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        """Fail the test, with the log, if the process has exited."""
        code = self.popen.poll()
        if code is not None:
            pytest.fail(f"{self.name} (pid {self.pid}) exited with {code}:\n{self.log_tail()}")

    def stop(self, grace: float = 8.0) -> None:
        """SIGTERM its process group, then SIGKILL what is left."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # workers of a launcher that exited first
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        self._log.close()


def wait_until(what: str, check: Callable[[], bool], timeout: float, procs: tuple[Proc, ...] = (),
               interval: float = 0.5) -> None:
    """Poll ``check`` until true; fail naming ``what`` on timeout or if one of ``procs`` dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            p.check_alive()
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(interval)
    logs = "\n".join(f"--- {p.name} ---\n{p.log_tail(1500)}" for p in procs)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}\n{logs}")


def http_ok(url: str) -> bool:
    """Whether a GET of ``url`` answers 200."""
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def start_prometheus(config: dict[str, Any], workdir: str, port: int) -> Proc:
    """Write ``config`` as YAML and start Debian's Prometheus on 127.0.0.1:``port`` with temporary storage."""
    path = os.path.join(workdir, "prometheus.yml")
    write_file_atomic(path, to_yaml(config))
    cmd = [PROMETHEUS, f"--config.file={path}", f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--storage.tsdb.retention.time=1h"]
    return Proc("prometheus", cmd, os.path.join(workdir, "prometheus.log"))


def start_workload(name: str, workdir: str, *args: str, env: dict[str, str] | None = None) -> Proc:
    """Start ``workload.py`` with ``args``."""
    return Proc(name, [sys.executable, WORKLOAD, *args], os.path.join(workdir, f"{name}.log"), env)


def start_torchrun(workdir: str, nproc: int, *args: str) -> Proc:
    """Start ``python -m torch.distributed.run --standalone --nproc_per_node=N workload.py --distributed ...``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           WORKLOAD, "--distributed", *args]
    return Proc("torchrun", cmd, os.path.join(workdir, "torchrun.log"))


@contextlib.contextmanager
def temp_dir() -> Iterator[str]:
    """A temporary directory removed afterwards."""
    path = tempfile.mkdtemp(prefix="gpuprobe-monitoring-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclasses.dataclass
class Stack:
    """What the session's monitoring stack runs, and where."""

    prom: dash.Prometheus
    single: str  # instance label of the one-process workload
    gpu_fixture: str  # instance label of the synthetic GPU-only series
    ranks: list[str]  # instance labels of torchrun's local ranks 0 and 1
    sim: str  # the one-process workload as seen through simulated OpenTelemetry Collector labels
    procs: list[Proc]
    single_port: int


def shipped_dashboards() -> list[dict]:
    """The dashboard JSON files in deploy/grafana/dashboards."""
    out = []
    for name in sorted(os.listdir(DASHBOARD_DIR)):
        if name.endswith(".json"):
            with open(os.path.join(DASHBOARD_DIR, name), encoding="utf-8") as f:
                out.append(json.load(f))
    return out
