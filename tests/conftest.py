"""Shared fixtures: every test starts from zeroed metrics and default settings."""

from __future__ import annotations

import pytest

import gpuprobe
from gpuprobe.testing import InMemoryExporter, reset


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_gpuprobe() -> None:
    reset()
    yield
    reset()


@pytest.fixture
def exporter() -> InMemoryExporter:
    with InMemoryExporter() as exp:
        yield exp




@pytest.fixture
def simcuda():  # type: ignore[no-untyped-def]
    """``simcuda(devices=2, cpu_tensors_on=None)`` → a simulated CUDA installed for the test.

    No GPU exists on the machines these tests run on: the simulation (gpuprobe.testing.simcuda) stands
    in for torch.cuda with its real semantics. gpuprobe's backends are picked again once it is
    installed, and again after it is removed.
    """
    pytest.importorskip("torch")
    from gpuprobe.testing.simcuda import simulated_cuda

    stack = []

    def install(devices: int = 2, **options):  # type: ignore[no-untyped-def]
        ctx = simulated_cuda(devices, **options)
        sim = ctx.__enter__()
        stack.append(ctx)
        reset()
        return sim

    yield install
    while stack:
        stack.pop().__exit__(None, None, None)
    reset()


@pytest.fixture
def sim(simcuda):  # type: ignore[no-untyped-def]
    """Two simulated CUDA devices, CUDA already initialized by 'the program'."""
    import torch

    s = simcuda(2)
    torch.cuda.current_device()
    return s


@pytest.fixture(params=["cpu", "simcuda"])
def device_backend(request):  # type: ignore[no-untyped-def]
    """Runs a test twice: on the CPU, and on two simulated CUDA devices where every CPU tensor counts
    as living on cuda:0 and CUDA is initialized (so probes and the integration take device spans too)."""
    if request.param == "cpu":
        yield None
        return
    pytest.importorskip("torch")
    import torch

    from gpuprobe.testing.simcuda import simulated_cuda

    with simulated_cuda(2, cpu_tensors_on=0) as sim:
        reset()
        torch.cuda.current_device()
        yield sim
    reset()
