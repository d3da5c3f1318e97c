"""Where a tensor lives, as gpuprobe sees it: the one place gpuprobe reads a tensor's device.

On a real machine this is ``tensor.device``. A simulated CUDA (``gpuprobe.testing.simcuda``) cannot
put a tensor on a device in a CPU build of torch, so while one is installed it tells gpuprobe where a
CPU tensor would live instead, through :func:`set_device_resolver`. Nothing else in gpuprobe reads
``.device`` to decide where work runs.

A leaf module: it imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["tensor_device", "set_device_resolver"]

_resolver: Callable[[Any], Any] | None = None


def tensor_device(tensor: Any) -> Any:
    """The ``torch.device`` of ``tensor`` (or of anything with a ``.device``)."""
    resolver = _resolver
    if resolver is not None:
        return resolver(tensor)
    return tensor.device


def set_device_resolver(resolver: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    """Install ``resolver`` (``tensor -> torch.device``) in place of ``tensor.device``; returns the previous one.

    For simulated devices in tests; ``None`` restores ``tensor.device``.
    """
    global _resolver
    previous, _resolver = _resolver, resolver
    return previous
