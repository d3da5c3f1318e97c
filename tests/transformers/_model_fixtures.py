"""Fixtures of the tests that generate with tiny real models (``_hfkit``): every test starts from zeroed
metrics and a fixed seed and leaves no model instrumented; ``make_model`` builds the models.

tests/transformers/conftest.py brings them to its folder; a test module elsewhere that generates imports
them by name (pytest takes the fixtures a test module holds), with tests/transformers on ``sys.path``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _hfkit import build, torch

from gpuprobe.integrations import transformers as hf
from gpuprobe.testing import reset

__all__ = ["isolated_models", "make_model"]


@pytest.fixture(autouse=True)
def isolated_models() -> Iterator[None]:
    """Zeroed metrics and a fixed seed before; nothing instrumented after."""
    reset()
    torch.manual_seed(0)
    yield
    hf.uninstrument_all()
    reset()


@pytest.fixture
def make_model() -> Iterator[Callable[..., Any]]:
    """``make_model("llama")`` → a tiny model in eval mode, uninstrumented at teardown."""
    made: list[Any] = []

    def make(family: str = "llama") -> Any:
        model = build(family).eval()
        made.append(model)
        return model

    yield make
    for m in made:
        hf.uninstrument(m)
