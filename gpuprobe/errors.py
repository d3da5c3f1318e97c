"""Errors raised by gpuprobe."""

from __future__ import annotations

__all__ = ["GpuprobeError", "ConfigError", "MissingDependencyError"]


class GpuprobeError(Exception):
    """Base class of every error gpuprobe raises on purpose."""


class ConfigError(GpuprobeError, ValueError):
    """A setting (argument or ``GPUPROBE_*`` variable) has a bad value.

    The message always names the setting and the value it got.
    """


class MissingDependencyError(GpuprobeError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


def missing(module: str, extra: str) -> MissingDependencyError:
    """Build the error for a missing optional dependency."""
    return MissingDependencyError(
        f"gpuprobe needs the '{module}' package for this; install it with: pip install 'gpuprobe[{extra}]'"
    )
