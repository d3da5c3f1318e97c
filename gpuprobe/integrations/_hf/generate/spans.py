"""A decoding step's device span as a record target, shared by generate() and continuous batching.

A leaf module: it imports nothing of gpuprobe.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DecodeSpan"]


class DecodeSpan:
    """A decoding step's device span: recorded to the step series and as the device inter-token latency
    of the step's token (``itl`` is set to None when the token turns out not to be an output token)."""

    __slots__ = ("step", "itl")

    def __init__(self, step: Any, itl: Any) -> None:
        self.step = step
        self.itl = itl

    def apply(self, ns: int) -> None:
        self.step.apply(ns)
        if self.itl is not None:
            self.itl(ns)
