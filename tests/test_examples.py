"""The core and report examples run and print what they promise."""

from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

from helpers import ROOT

# What these tests check runs in processes of their own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only


def run_example(name: str) -> str:
    env = {"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(Path(ROOT) / "examples" / name)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_probes_example() -> None:
    out = run_example("probes.py")
    assert 'probe="tokenize"' in out and 'probe="fetch"' in out and 'probe="stream"' in out
    count = next(line for line in out.splitlines() if 'probe="step"' in line)
    assert count.endswith(" 20.0")


def test_report_example_finds_the_window_steps() -> None:
    out = run_example("report_trace.py")
    assert "trace: /tmp/gpuprobe-example.json.gz" in out
    assert "steps: 5" in out
