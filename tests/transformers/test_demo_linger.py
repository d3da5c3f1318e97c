"""The demo's URL still answers once its requests are done: in a terminal it serves until Ctrl-C, and
``--linger SECONDS`` keeps it up that long anywhere; run by a script (no terminal) it ends on its own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

# What these tests check runs in processes of their own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only

pytest.importorskip("transformers")
pytest.importorskip("prometheus_client")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_the_url_answers_while_the_demo_lingers_and_ctrl_c_ends_it(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gpuprobe", "demo", "--quick", "--port", "0", "--plot", "",
                             "--linger", "600"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url, lines = None, []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"serving metrics at (http://\S+)", line)
            url = found.group(1) if found else url
            if "stays up" in line:
                break
        assert url is not None and any(f"{url} stays up; for 600 s" in line for line in lines), lines
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = resp.read().decode()
        assert resp.status == 200 and "gen_ai_server_time_to_first_token_seconds_count" in body
        proc.send_signal(signal.SIGINT)
        # communicate, not wait: the demo's output goes on after the lines read here, and a full pipe would
        # hold it up; what it printed is there when it fails
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, ("".join(lines) + err)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_without_a_terminal_the_demo_ends_when_its_requests_are_done(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "demo", "--quick", "--port", "0", "--plot", ""],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "stays up" not in done.stderr
