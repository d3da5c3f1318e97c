"""Checks run by tests/test_simulate_gpu_option.py in a pytest of their own, under ``--simulate-gpu``
(the file's name keeps it out of the suite). ``EXPECTED_SIMULATED_DEVICES`` is the devices asked for."""

from __future__ import annotations

import os

import torch

import gpuprobe

DEVICES = int(os.environ["EXPECTED_SIMULATED_DEVICES"])


def test_the_run_sees_a_machine_with_cuda() -> None:
    assert torch.cuda.is_available() and torch.cuda.device_count() == DEVICES
    info = gpuprobe.info()
    assert info["timing"] == "host+cuda-events" and info["memory"] == "cuda-allocator" and info["device"] == "cuda"
    assert not any(k.startswith("GPUPROBE_") for k in os.environ)  # the switch is not left for the tests


def test_a_tests_own_simulation_goes_over_the_machine(simcuda) -> None:  # type: ignore[no-untyped-def]
    simcuda(DEVICES + 1)
    assert torch.cuda.device_count() == DEVICES + 1


def test_and_gives_the_machine_back() -> None:
    assert torch.cuda.device_count() == DEVICES
