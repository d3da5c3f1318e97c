"""Fixtures for the transformers integration: tiny real models built from configs, a live /metrics.

Models have random weights (no download) and run transformers' real generation code. Metrics are
process-wide, so every test starts from zeroed metrics and leaves no model instrumented.
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _hfkit import Scrape  # noqa: E402
from _model_fixtures import isolated_models, make_model  # noqa: E402,F401 (fixtures of this folder)

import gpuprobe  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # tests/conftest.py skips tests marked cuda when no CUDA device is present.
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")


@pytest.fixture
def scrape() -> Iterator[Callable[[], Scrape]]:
    """``scrape()`` → the current /metrics of a server started with ``gpuprobe.serve(port=0)``."""
    server = gpuprobe.serve(port=0)

    def get() -> Scrape:
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            return Scrape(resp.read().decode())

    yield get
    server.close()
