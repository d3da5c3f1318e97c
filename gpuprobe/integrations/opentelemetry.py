"""An OpenTelemetry instrumentor: ``opentelemetry-instrument python app.py`` picks gpuprobe up.

:class:`GpuprobeInstrumentor` is registered under the ``opentelemetry_instrumentor`` entry point
(name ``gpuprobe``), so OpenTelemetry's auto-instrumentation loads it with the others, once the
library of any integration is installed in a supported version (the ``instruments-any`` extra: one
requirement per row of :mod:`gpuprobe.integrations.registry`). Its :meth:`instrument` calls
``instrument_all()`` of every integration whose library is installed (each library's objects are
instrumented at first use; each library is imported then, as OpenTelemetry's instrumentors import
theirs: a few seconds for diffusers on the 2-core test machine) and feeds gpuprobe's metrics into a ``MeterProvider``: the one passed as
``meter_provider=``, else the global one (which the OpenTelemetry distro or your code sets;
instruments made on it before it is set follow it once it is). The settings (``GPUPROBE_*``) apply as
usual: ``GPUPROBE_PROMETHEUS_PORT``, on-demand captures, and so on. :meth:`uninstrument` undoes both.

Example:
    >>> from gpuprobe.integrations.opentelemetry import GpuprobeInstrumentor
    >>> GpuprobeInstrumentor().instrument()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from .._seams import declare
from ..errors import GpuprobeError, missing
from ..runtime import DISABLED_AT_IMPORT, runtime
from . import registry

try:
    from opentelemetry import metrics
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise missing("opentelemetry-instrumentation", "otel") from exc

__all__ = ["GpuprobeInstrumentor"]

_log = logging.getLogger("gpuprobe")

SEAM = declare("opentelemetry.instrumentor", library="opentelemetry", scenario="otel",
               target="GpuprobeInstrumentor._instrument, called by opentelemetry-instrument at start-up")

# Keywords of instrument() passed on to each integration's instrument_all(); an integration that does
# not know one refuses it (warned), the others are instrumented.
_OPTIONS = ("layers", "layer_every", "layer_index", "memory", "kv_cache", "memory_every")


class GpuprobeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instrument every integrated library and feed gpuprobe's metrics into a ``MeterProvider``.

    ``instrument(meter_provider=None, **options)``: ``options`` are keywords of the integrations'
    ``instrument_all()`` (``layers=True``, ``memory_every=4``, ...). A problem (an unsupported version,
    a bad option) is warned about and leaves that library uninstrumented and the program running:
    ``opentelemetry-instrument`` would otherwise stop the program.

    Example:
        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> instrumentor = GpuprobeInstrumentor()
        >>> instrumentor.instrument(meter_provider=MeterProvider())  # doctest: +SKIP
        >>> instrumentor.uninstrument()  # doctest: +SKIP
    """

    _bridge: Any = None
    _instrumented: tuple[registry.Integration, ...] = ()

    def instrumentation_dependencies(self) -> Collection[str]:
        """Each integration's library and the versions it supports (``"<distribution> <versions>"``, one
        per row of :mod:`gpuprobe.integrations.registry`); any one of them installed is enough."""
        return tuple(f"{row.distribution} {row.versions}" for row in registry.INTEGRATIONS)

    def _check_dependency_conflicts(self) -> Any:
        """None when any integration's library is installed in a supported version, else the first
        conflict. OpenTelemetry's own check asks for every dependency, as its ``instruments`` extra does;
        gpuprobe's are alternatives (its ``instruments-any`` extra)."""
        conflicts = [get_dependency_conflicts([dependency]) for dependency in self.instrumentation_dependencies()]
        if not conflicts or any(conflict is None for conflict in conflicts):
            return None
        return conflicts[0]

    def _instrument(self, **kwargs: Any) -> None:
        from ..exporters.otlp import MeterProviderBridge

        if DISABLED_AT_IMPORT:
            return  # GPUPROBE_DISABLE=1: nothing is patched, nothing is exported
        provider = kwargs.get("meter_provider") or metrics.get_meter_provider()
        options = {key: kwargs[key] for key in _OPTIONS if key in kwargs}
        done: list[registry.Integration] = []
        for row in registry.INTEGRATIONS:
            if not registry.installed(row):
                continue
            try:
                registry.load(row).instrument_all(**options)
            except GpuprobeError as exc:
                _log.warning("gpuprobe: %s is not instrumented: %s", row.name, exc)
                SEAM.refuse(str(exc), quiet=True)
                continue
            except Exception as exc:  # gpuprobe's own failure never stops the program opentelemetry-instrument runs
                _log.warning("gpuprobe: %s is not instrumented: %s: %s", row.name, type(exc).__name__, exc)
                SEAM.fail(exc)
                self._undo(done)  # the seam is off: nothing of it stays in place
                return
            done.append(row)
        if not done:
            return
        self._instrumented = tuple(done)
        try:
            self._bridge = MeterProviderBridge(provider).attach(runtime(), owner="user")
        except Exception as exc:
            _log.warning("gpuprobe: metrics are not fed to the MeterProvider: %s: %s", type(exc).__name__, exc)
            SEAM.fail(exc)

    def _uninstrument(self, **kwargs: Any) -> None:
        done, self._instrumented = self._instrumented, ()
        self._undo(done)
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()  # writes what is queued, then stops receiving
            runtime().remove(bridge)

    @staticmethod
    def _undo(rows: Collection[registry.Integration]) -> None:
        for row in rows:
            try:
                registry.load(row).uninstrument_all()
            except Exception as exc:  # never into the program
                _log.warning("gpuprobe: %s could not be uninstrumented: %s: %s", row.name, type(exc).__name__, exc)

    @property
    def bridge(self) -> Any:
        """The :class:`~gpuprobe.exporters.otlp.MeterProviderBridge` feeding the provider (None when not instrumented)."""
        return self._bridge
