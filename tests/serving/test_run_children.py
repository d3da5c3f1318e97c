"""``gpuprobe run`` never breaks the processes its command starts.

Every Python process of the command inherits ``GPUPROBE_PROMETHEUS_PORT``. The rule (docs/serving.md): the
first process that switches gpuprobe on serves ``/metrics`` there; torchrun's workers add their
``LOCAL_RANK`` to it (one port each); any other process that finds the port taken warns once and runs on
without an endpoint (its probes still record, and its other exporters still export).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _servekit import GPUPROBE, child_env, free_port

# What these tests check runs in processes of their own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only

PY = sys.executable

PROBED = """\
import os, sys
import gpuprobe
from gpuprobe import probe

@probe
def work(x):
    return 2 * x

def served():
    return [e for e in gpuprobe.info()["exporters"] if "/metrics" in e]
"""

PARENT = PROBED + """
import multiprocessing, subprocess


def spawned():
    assert work(3) == 6
    print("spawned", len(served()), flush=True)

if __name__ == "__main__":
    assert work(1) == 2
    print("parent", served(), flush=True)
    done = subprocess.run([sys.executable, "child.py"])
    print("subprocess exit", done.returncode, flush=True)
    proc = multiprocessing.get_context("spawn").Process(target=spawned)
    proc.start()
    proc.join()
    print("spawn exit", proc.exitcode, flush=True)
"""

CHILD = PROBED + """
assert work(2) == 4
print("child", len(served()), flush=True)
"""


def _write(tmp_path: Path, **files: str) -> None:
    for name, body in files.items():
        (tmp_path / name).write_text(textwrap.dedent(body))


def test_probed_children_of_a_probed_parent_all_run(tmp_path: Path) -> None:
    _write(tmp_path, **{"parent.py": PARENT, "child.py": CHILD})
    port = free_port()
    done = subprocess.run([GPUPROBE, "run", "--port", str(port), "--", PY, "parent.py"], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert re.fullmatch(rf"parent \['<gpuprobe /metrics at http://127\.0\.0\.1:{port}/metrics, "
                        r"answered by front process \d+>'\]", lines[0]), lines[0]
    # The children find the port taken: no endpoint, one warning each, and they run to the end.
    assert lines[1:] == ["child 0", "subprocess exit 0", "spawned 0", "spawn exit 0"]
    warned = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 2 and all(f"port {port}" in line and "runs without /metrics" in line for line in warned)


def test_a_port_another_program_holds_leaves_the_command_running(tmp_path: Path) -> None:
    _write(tmp_path, **{"child.py": CHILD})
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([GPUPROBE, "run", "--port", str(port), "--", PY, "child.py"], cwd=tmp_path,
                              env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "child 0\n", done.stderr[-3000:]
    assert f"port {port}" in done.stderr and "runs without /metrics" in done.stderr


WORKER = PROBED + """
assert work(int(os.environ["LOCAL_RANK"])) == 2 * int(os.environ["LOCAL_RANK"])
print("worker", os.environ["LOCAL_RANK"], served(), flush=True)
"""


@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(GPUPROBE)) is None, reason="no torchrun")
def test_torchrun_workers_each_serve_on_the_port_plus_their_local_rank(tmp_path: Path) -> None:
    _write(tmp_path, **{"worker.py": WORKER})
    port = free_port()
    torchrun = os.path.join(os.path.dirname(GPUPROBE), "torchrun")
    done = subprocess.run([GPUPROBE, "run", "--port", str(port), "--", torchrun, "--standalone", "--nproc-per-node",
                           "2", "worker.py"], cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    workers = sorted(line for line in done.stdout.splitlines() if line.startswith("worker"))
    assert [re.sub(r"front process \d+", "front process N", w) for w in workers] == [
        f"worker {rank} ['<gpuprobe /metrics at http://127.0.0.1:{port + rank}/metrics, answered by front process N>']"
        for rank in (0, 1)]
    assert "RuntimeWarning" not in done.stderr
