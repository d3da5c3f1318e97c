"""Shared fixtures: every test starts from zeroed metrics and default settings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import gpuprobe
from gpuprobe.testing import InMemoryExporter, reset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (for import-time behaviour); returns the finished process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    full_env["PYTHONPATH"] = ROOT
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


__all__ = ["run_python", "gpuprobe"]
