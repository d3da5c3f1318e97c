"""An OpenTelemetry instrumentor: ``opentelemetry-instrument python app.py`` picks gpuprobe up.

:class:`GpuprobeInstrumentor` is registered under the ``opentelemetry_instrumentor`` entry point
(name ``gpuprobe``), so OpenTelemetry's auto-instrumentation loads it with the others, once the
packages of ``gpuprobe[instruments]`` (transformers) are installed. Its :meth:`instrument`
instruments every transformers model at its first ``generate()``
(:func:`gpuprobe.integrations.transformers.instrument_all`) and feeds gpuprobe's metrics into a
``MeterProvider``: the one passed as ``meter_provider=``, else the global one (which the
OpenTelemetry distro or your code sets; instruments made on it before it is set follow it once it
is). The settings (``GPUPROBE_*``) apply as usual: ``GPUPROBE_PROMETHEUS_PORT``, on-demand captures,
and so on. :meth:`uninstrument` undoes both.

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

try:
    from opentelemetry import metrics
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise missing("opentelemetry-instrumentation", "otel") from exc

__all__ = ["GpuprobeInstrumentor"]

_log = logging.getLogger("gpuprobe")

SEAM = declare("opentelemetry.instrumentor", library="opentelemetry", scenario="otel",
               target="GpuprobeInstrumentor._instrument, called by opentelemetry-instrument at start-up")

# Keywords of instrument() passed on to instrument_all() (see gpuprobe.integrations.transformers.instrument).
_OPTIONS = ("layers", "layer_every", "layer_index", "memory", "kv_cache", "memory_every")


class GpuprobeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instrument transformers generation and feed gpuprobe's metrics into a ``MeterProvider``.

    ``instrument(meter_provider=None, **options)``: ``options`` are keywords of
    :func:`gpuprobe.integrations.transformers.instrument` (``layers=True``, ``memory_every=4``, ...).
    A problem (an unsupported transformers version, a bad option) is warned about and leaves the
    program running uninstrumented: ``opentelemetry-instrument`` would otherwise stop the program.

    Example:
        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> instrumentor = GpuprobeInstrumentor()
        >>> instrumentor.instrument(meter_provider=MeterProvider())  # doctest: +SKIP
        >>> instrumentor.uninstrument()  # doctest: +SKIP
    """

    _bridge: Any = None
    _patched = False

    def instrumentation_dependencies(self) -> Collection[str]:
        """The transformers versions the integration supports (``transformers >=5.18,<6``)."""
        from .transformers import SUPPORTED_VERSIONS

        return (f"transformers {SUPPORTED_VERSIONS}",)

    def _instrument(self, **kwargs: Any) -> None:
        from ..exporters.otlp import MeterProviderBridge
        from .transformers import instrument_all

        if DISABLED_AT_IMPORT:
            return  # GPUPROBE_DISABLE=1: nothing is patched, nothing is exported
        provider = kwargs.get("meter_provider") or metrics.get_meter_provider()
        options = {key: kwargs[key] for key in _OPTIONS if key in kwargs}
        try:
            instrument_all(**options)
        except GpuprobeError as exc:
            _log.warning("gpuprobe: transformers is not instrumented: %s", exc)
            SEAM.refuse(str(exc), quiet=True)
            return
        except Exception as exc:  # gpuprobe's own failure never stops the program opentelemetry-instrument runs
            _log.warning("gpuprobe: transformers is not instrumented: %s: %s", type(exc).__name__, exc)
            SEAM.fail(exc)
            return
        self._patched = True
        try:
            self._bridge = MeterProviderBridge(provider).attach(runtime(), owner="user")
        except Exception as exc:
            _log.warning("gpuprobe: metrics are not fed to the MeterProvider: %s: %s", type(exc).__name__, exc)
            SEAM.fail(exc)

    def _uninstrument(self, **kwargs: Any) -> None:
        from .transformers import uninstrument_all

        if self._patched:
            uninstrument_all()
            self._patched = False
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()  # writes what is queued, then stops receiving
            runtime().remove(bridge)

    @property
    def bridge(self) -> Any:
        """The :class:`~gpuprobe.exporters.otlp.MeterProviderBridge` feeding the provider (None when not instrumented)."""
        return self._bridge
