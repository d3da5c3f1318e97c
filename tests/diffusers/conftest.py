"""Fixtures for the diffusers integration: tiny real pipelines built from configs (tests/diffusers/_pipes.py).

Pipelines have random weights (no download) and run diffusers' real code. Metrics are process-wide, so
every test starts from zeroed metrics (tests/conftest.py) and leaves no pipeline instrumented.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Why one thread: these pipelines' tensors are a few KB, and the 2-core test machine is shared; torch's
    # two threads then spin against other processes (a tiny SD call took 1.3 s with 2 threads, 0.1 s with 1).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _nothing_left_instrumented() -> Iterator[None]:
    yield
    from gpuprobe.integrations import diffusers as gd

    gd.uninstrument_all()
    for pipe in list(gd._instrumented):
        gd.uninstrument(pipe)
