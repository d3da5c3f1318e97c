"""``pytest --simulate-gpu`` (tests/conftest.py): the whole run sees a simulated GPU machine.

Each check runs a pytest of its own over tests/_simulated_machine_check.py, whose tests pass only on a
machine with CUDA."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ROOT, cuda_present

# What these tests check runs in processes of their own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only

CHECKS = os.path.join("tests", "_simulated_machine_check.py")


def _pytest(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", CHECKS, *args],
                          capture_output=True, text=True, env=full_env, cwd=ROOT, timeout=300)


def test_the_option_installs_a_simulated_machine_for_the_whole_run() -> None:
    proc = _pytest("--simulate-gpu", "--simulate-gpu-devices", "3", env={"EXPECTED_SIMULATED_DEVICES": "3"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout


def test_the_environment_variable_does_the_same_and_bad_values_are_refused() -> None:
    proc = _pytest(env={"EXPECTED_SIMULATED_DEVICES": "2", "GPUPROBE_TEST_SIMULATE_GPU": "2"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout
    proc = _pytest(env={"EXPECTED_SIMULATED_DEVICES": "1", "GPUPROBE_TEST_SIMULATE_GPU": "yes"})
    assert proc.returncode == 4  # pytest's usage error
    assert "GPUPROBE_TEST_SIMULATE_GPU must be a number of devices (0 = off), got 'yes'" in proc.stderr


@pytest.mark.no_cuda
def test_without_the_option_the_checks_fail() -> None:
    assert not cuda_present()
    proc = _pytest(env={"EXPECTED_SIMULATED_DEVICES": "1"})
    # A test's own simulation needs no machine; the two checks of the machine fail.
    assert proc.returncode == 1 and "2 failed, 1 passed" in proc.stdout, proc.stdout
