"""``gpuprobe doctor`` on a real GPU (skipped without CUDA): the device lines and the timing of a real
kernel, the names checked against torch's own answers in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda
ROOT = Path(__file__).resolve().parents[2]


def test_doctor_names_every_device_and_reads_events_around_a_real_kernel() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "gpuprobe", "doctor", "--json"], env=env, capture_output=True,
                          text=True, timeout=300)
    report = json.loads(proc.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    count = torch.cuda.device_count()
    assert checks["cuda"]["state"] == "ok" and checks["cuda"]["details"]["devices"] == count
    for i in range(count):
        assert checks[f"cuda:{i}"]["details"]["name"] == torch.cuda.get_device_name(i)
    timing = checks["device timing"]
    assert timing["state"] == "ok", timing["reason"]
    for i in range(count):
        # doctor spins ~0.1 ms of the device's clock: the events must see a positive span of that order.
        assert 0.01 < timing["details"][f"cuda:{i}"]["elapsed_ms"] < 100
