"""OpenTelemetry export, two ways, both off the hot path:

- :class:`OtlpExporter`: a periodic OTLP/HTTP push of gpuprobe's aggregates (cumulative temporality,
  gpuprobe's explicit buckets) through the OpenTelemetry SDK's own ``OTLPMetricExporter``;
- :class:`MeterProviderBridge`: replays each aggregated observation into instruments of a
  ``MeterProvider`` the user already runs, on gpuprobe's background thread.

Failures (endpoint down, slow, HTTP 500) never raise into user code: the push runs on its own thread
with a timeout, memory stays bounded (each push sends the current aggregates; nothing queues up),
one warning is given, and failed pushes are counted in ``gpuprobe.telemetry.dropped``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .._lifecycle import Owner
from .._metrics import SPECS, MetricData, MetricSpec
from .._version import __version__
from ..errors import missing
from ..runtime import Runtime, runtime
from ._queued import Observation, QueuedSink

try:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricExportResult,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise missing("opentelemetry-sdk", "otel") from exc

__all__ = ["OtlpExporter", "MeterProviderBridge", "to_metrics_data"]

_SCOPE = InstrumentationScope("gpuprobe", None)


def to_metrics_data(data: list[MetricData], start_ns: int, now_ns: int, resource: Resource) -> MetricsData:
    """Turn a :meth:`Registry.snapshot` into OpenTelemetry ``MetricsData`` (cumulative)."""
    cumulative = AggregationTemporality.CUMULATIVE
    metrics = []
    for md in data:
        spec = md.spec
        if spec.instrument == "histogram":
            points: list[Any] = [
                HistogramDataPoint(attributes=p.labels, start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                                   count=p.count, sum=p.sum, bucket_counts=list(p.bucket_counts),
                                   explicit_bounds=list(spec.buckets or ()), min=p.min, max=p.max)
                for p in md.points
            ]
            body: Any = Histogram(data_points=points, aggregation_temporality=cumulative)
        else:
            points = [NumberDataPoint(attributes=p.labels, start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                                      value=p.value) for p in md.points]
            if spec.instrument == "gauge":
                body = Gauge(data_points=points)
            else:
                body = Sum(data_points=points, aggregation_temporality=cumulative,
                           is_monotonic=spec.instrument == "counter")
        metrics.append(Metric(name=spec.name, description=spec.description, unit=spec.unit, data=body))
    scope = ScopeMetrics(scope=_SCOPE, metrics=metrics, schema_url="")
    return MetricsData(resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")])


class _QuietOnThread(logging.Filter):
    """Drops the SDK exporter's log records made on one thread (gpuprobe's pusher warns once itself).

    Why a filter and not a level: the logger is the SDK's, shared by the whole process; a filter
    scoped to one thread leaves every other user of it untouched, and is added once, not per push.
    """

    def __init__(self, thread_id: int) -> None:
        super().__init__()
        self.thread_id = thread_id

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread_id


_SDK_LOGGER = "opentelemetry.exporter.otlp.proto.http.metric_exporter"


class OtlpExporter:
    """Push gpuprobe's aggregates to an OTLP/HTTP endpoint every ``interval`` seconds.

    Pushes run on a thread of the exporter's own, every ``interval`` seconds, so a slow or dead
    endpoint never delays collection or the program.

    Args:
        endpoint: the full metrics URL, e.g. ``http://127.0.0.1:4318/v1/metrics``.
        interval: seconds between pushes.
        timeout: seconds one push may take (the SDK exporter's own retries included).
        headers: extra HTTP headers.
        resource_attributes: added to the OTel resource (``service.name`` defaults to ``gpuprobe``).

    Example:
        >>> exp = OtlpExporter("http://127.0.0.1:4318/v1/metrics").attach()  # doctest: +SKIP
    """

    def __init__(self, endpoint: str, *, interval: float = 5.0, timeout: float = 2.0,
                 headers: dict[str, str] | None = None, resource_attributes: dict[str, str] | None = None) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError as exc:  # pragma: no cover
            raise missing("opentelemetry-exporter-otlp-proto-http", "otel") from exc
        self.endpoint = endpoint
        self.interval = interval
        self.timeout = timeout
        self._exporter = OTLPMetricExporter(endpoint=endpoint, timeout=timeout, headers=headers)
        attrs = {"service.name": "gpuprobe", "telemetry.sdk.name": "gpuprobe"}
        attrs.update(resource_attributes or {})
        self._resource_attrs = attrs
        self._rt: Runtime | None = None
        self._wake = threading.Event()  # set: stop
        self._thread: threading.Thread | None = None
        self._filter: _QuietOnThread | None = None
        self._start_ns = time.time_ns()
        self.pushes = 0
        self.failures = 0

    def attach(self, rt: Runtime | None = None, *, owner: Owner = "user") -> OtlpExporter:
        """Start pushing from ``rt`` (the process's runtime by default)."""
        self._rt = rt or runtime()
        self._thread = threading.Thread(target=self._run, name="gpuprobe-otlp", daemon=True)
        self._thread.start()
        assert self._thread.ident is not None
        self._filter = _QuietOnThread(self._thread.ident)
        logging.getLogger(_SDK_LOGGER).addFilter(self._filter)
        self._rt.add_closeable(self, owner=owner)
        return self

    def _run(self) -> None:
        # Its own schedule (like OpenTelemetry's PeriodicExportingMetricReader): a push may wait on a
        # slow endpoint for up to `timeout` without delaying the background round.
        while not self._wake.wait(self.interval):
            self.push()

    def push(self) -> bool:
        """Send the current aggregates now; True on success. Never raises."""
        rt = self._rt or runtime()
        data: list[MetricData] = []
        err: Exception | None = None
        try:
            data = rt.collect()
            if not data:
                return True
            resource = Resource.create({**self._resource_attrs, **rt.registry.const_labels})
            payload = to_metrics_data(data, self._start_ns, time.time_ns(), resource)
            ok = self._exporter.export(payload, timeout_millis=self.timeout * 1000) == MetricExportResult.SUCCESS
        except Exception as exc:  # endpoint down, refused, bad response: never into user code
            ok, err = False, exc
        if ok:
            self.pushes += 1
            return True
        self.failures += 1
        rt.drop("otlp_export_failed", sum(len(md.points) for md in data) or 1)
        rt.warn_once("otlp", f"gpuprobe: OTLP push to {self.endpoint} failed"
                     + (f": {err!r}" if err else "") + "; will keep trying every "
                     f"{self.interval:g} s (this warning is shown once)")
        return False

    def stop(self, timeout: float | None = None) -> None:
        """Stop the pusher without a last push (waits up to ``timeout`` for a push under way)."""
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.timeout + 1 if timeout is None else timeout)
        if self._filter is not None:
            logging.getLogger(_SDK_LOGGER).removeFilter(self._filter)
            self._filter = None

    def close(self) -> None:
        """Stop the pusher and make a last push of the final aggregates (once; later calls do nothing)."""
        if self._wake.is_set():
            return
        self.stop()
        self.push()
        try:
            self._exporter.shutdown()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<gpuprobe OTLP exporter {self.endpoint}>"


class MeterProviderBridge(QueuedSink):
    """Feed gpuprobe's observations into the user's own OpenTelemetry ``MeterProvider``.

    Instruments are created on ``meter_provider.get_meter("gpuprobe")`` with gpuprobe's names, units
    and bucket boundaries (as advice). Observations are queued (bounded, ``max_queue``; overflow is
    counted in ``gpuprobe.telemetry.dropped``) and recorded on gpuprobe's background thread.

    Example:
        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> bridge = MeterProviderBridge(MeterProvider()).attach()
    """

    name = "meter_provider"

    def __init__(self, meter_provider: Any, *, max_queue: int = 100_000) -> None:
        super().__init__(max_queue=max_queue)
        self._meter = meter_provider.get_meter("gpuprobe", __version__)
        self._instruments: dict[str, Any] = {}

    def _instrument(self, spec: MetricSpec) -> Any:
        inst = self._instruments.get(spec.name)
        if inst is None:
            m = self._meter
            if spec.instrument == "histogram":
                inst = m.create_histogram(spec.name, unit=spec.unit, description=spec.description,
                                          explicit_bucket_boundaries_advisory=list(spec.buckets or ()))
                inst = inst.record
            elif spec.instrument == "counter":
                inst = m.create_counter(spec.name, unit=spec.unit, description=spec.description).add
            elif spec.instrument == "updown":
                inst = m.create_up_down_counter(spec.name, unit=spec.unit, description=spec.description).add
            else:
                inst = m.create_gauge(spec.name, unit=spec.unit, description=spec.description).set
            self._instruments[spec.name] = inst
        return inst

    def write_batch(self, batch: list[Observation], rt: Runtime | None) -> None:
        const = rt.registry.const_labels if rt is not None else {}
        for _, name, labels, value in batch:
            attrs = dict(const)
            attrs.update(labels)
            self._instrument(SPECS[name])(value, attrs)

    def __repr__(self) -> str:
        return f"<gpuprobe MeterProvider bridge {self._meter!r}>"
