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


