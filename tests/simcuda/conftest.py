"""Fixtures for the simulated CUDA's tests: a simulation installed for the test, removed after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from gpuprobe.testing.simcuda import SimulatedCuda, simulated_cuda  # noqa: E402


@pytest.fixture
def sim() -> Iterator[SimulatedCuda]:
    """Two simulated devices of 80 GiB."""
    with simulated_cuda(devices=2) as s:
        yield s


@pytest.fixture
def small_sim() -> Iterator[SimulatedCuda]:
    """One simulated device of 64 MiB, for memory limits."""
    with simulated_cuda(devices=1, memory_per_device=64 * 2**20) as s:
        yield s
