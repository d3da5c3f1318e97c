"""Helpers for testing code that uses gpuprobe (and for gpuprobe's own tests).

- :class:`InMemoryExporter` — every observation, as aggregated, kept in a list;
- :func:`reset` — zero every metric and stop exporters between tests;
- :mod:`gpuprobe.testing.nvtx_capture` — record NVTX ranges for real through an injection library;
- :mod:`gpuprobe.testing.simcuda` — a simulated CUDA (devices, streams, asynchronous events, graph
  capture, memory) for testing GPU code paths on a machine without a GPU;
- :mod:`gpuprobe.testing.simnvml` — a simulated NVML (a stand-in for nvidia-ml-py's ``pynvml``: GPUs with
  UUIDs, PCI bus ids, readings, "not supported" and failing calls) for the GPU health gauges;
- :mod:`gpuprobe.testing.budget` — counts of a block of generation (host syncs, launches, recompiles,
  cache concatenations, Python calls, peak memory), checked against budgets and baseline files: what the
  pytest plugin's ``gpuprobe_budget`` fixture runs (``docs/testing.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

from .. import _probe, _seams, config
from .._metrics import MetricData
from ..runtime import DISABLED_AT_IMPORT, Runtime, runtime

__all__ = ["InMemoryExporter", "Observation", "reset", "seam_fault", "seams"]


@dataclasses.dataclass(frozen=True)
class Observation:
    """One value as it reached the aggregates (durations in seconds, memory in bytes)."""

    metric: str
    attrs: dict[str, str]
    value: float


class InMemoryExporter:
    """Keep every observation in memory; use as a context manager or call :meth:`attach` / :meth:`detach`.

    Example:
        >>> import gpuprobe
        >>> from gpuprobe.testing import InMemoryExporter
        >>> with InMemoryExporter() as exp:
        ...     with gpuprobe.probe("work"):
        ...         pass
        >>> len(exp.values("gpuprobe.probe.duration", probe="work"))
        1
    """

    def __init__(self) -> None:
        self._items: list[Observation] = []
        self._lock = threading.Lock()
        self._rt: Runtime | None = None

    def _sink(self, name: str, labels: Any, value: float) -> None:
        with self._lock:
            self._items.append(Observation(name, dict(labels), value))

    def attach(self) -> InMemoryExporter:
        """Start receiving observations."""
        self._rt = runtime()
        self._rt.add_sink(self._sink)
        return self

    def detach(self) -> None:
        """Stop receiving (what was received stays)."""
        if self._rt is not None:
            self._rt.drain()
            self._rt.remove_sink(self._sink)
            self._rt = None

    def __enter__(self) -> InMemoryExporter:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def observations(self, metric: str | None = None, **attrs: str) -> list[Observation]:
        """Observations so far (buffers are drained first), filtered by metric name and attributes.

        Attribute keys with dots can be given with underscores: ``error_type`` matches ``error.type``.
        """
        if self._rt is not None:
            self._rt.drain()
        want = {k: str(v) for k, v in attrs.items()}
        with self._lock:
            items = list(self._items)
        out = []
        for ob in items:
            if metric is not None and ob.metric != metric:
                continue
            if all(ob.attrs.get(k, ob.attrs.get(k.replace("_", "."))) == v for k, v in want.items()):
                out.append(ob)
        return out

    def values(self, metric: str, **attrs: str) -> list[float]:
        """The values of :meth:`observations`."""
        return [ob.value for ob in self.observations(metric, **attrs)]

    def metrics(self) -> list[MetricData]:
        """The aggregates, as exporters see them."""
        return runtime().collect()

    def clear(self) -> None:
        """Forget what was received."""
        with self._lock:
            self._items.clear()


def reset(**settings: Any) -> None:
    """Zero every metric, stop exporters, re-enable probes and re-read settings from the environment.

    Args:
        **settings: settings to apply on top of the environment (the keywords of :class:`gpuprobe.Config`).

    Example:
        >>> from gpuprobe.testing import reset
        >>> reset()
    """
    base, problems = config.from_environment()
    cfg = config.replace(base, **settings) if settings else base
    rt = runtime()
    rt.reset(cfg, frozenset(settings))
    rt.report_problems(problems)
    if not DISABLED_AT_IMPORT:
        _probe.enable()


def seams() -> list[str]:
    """The names of every seam gpuprobe can put into another library (declared by the modules imported).

    Example:
        >>> import gpuprobe.integrations.transformers
        >>> from gpuprobe.testing import seams
        >>> "transformers.generate" in seams()
        True
    """
    return [s.name for s in _seams.registry()]


@contextlib.contextmanager
def seam_fault(name: str, fault: BaseException | None = None) -> Iterator[None]:
    """While entered, gpuprobe's own work inside seam ``name`` raises ``fault`` (a ``RuntimeError`` by
    default): the seam must switch itself off and leave the program's results as they were.

    Only for the seams built from gpuprobe's seam template (see ``docs/architecture.md``).

    Example:
        >>> import gpuprobe.integrations.transformers  # declares the seams of the transformers integration
        >>> from gpuprobe.testing import seam_fault
        >>> with seam_fault("transformers.generate"):
        ...     pass  # model.generate(...) returns what it returns without gpuprobe
    """
    _seams.inject_fault(name, fault if fault is not None else RuntimeError(f"a fault injected into {name}"))
    try:
        yield
    finally:
        _seams.inject_fault(name, None)
