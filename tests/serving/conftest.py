"""Fixtures of the serving tests: one tiny model on disk per session; in-process tests leave no model
instrumented. Metrics are zeroed around every test by tests/conftest.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("prometheus_client")

from _servekit import build_tiny_model  # noqa: E402

from gpuprobe.integrations import transformers as hf  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder ``tiny`` holding a 2-layer Llama and its chat-template tokenizer (``save_pretrained``)."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(autouse=True)
def _nothing_instrumented() -> Iterator[None]:
    yield
    hf.uninstrument_all()
