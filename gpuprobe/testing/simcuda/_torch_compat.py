"""The torch the simulated CUDA runs on: imported on first use only."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["import_torch"]


def import_torch() -> Any:
    """The torch module, imported on first use only."""
    mod = sys.modules.get("torch")
    if mod is None:
        import torch as mod  # noqa: PLC0415 (kept out of import time on purpose)
    return mod
