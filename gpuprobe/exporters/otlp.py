"""OpenTelemetry export, two ways, both off the hot path:

- :class:`OtlpExporter`: a periodic OTLP/HTTP push of gpuprobe's aggregates (cumulative temporality,
  gpuprobe's explicit buckets), encoded by the OpenTelemetry exporter's own ``encode_metrics``, with a
  last push when it is closed (at exit, or when ``configure()`` restarts it);
- :class:`MeterProviderBridge`: replays each aggregated observation into instruments of a
  ``MeterProvider`` the user already runs, on gpuprobe's background thread, and before that
  provider's own exit handler at exit.

Failures (endpoint down, slow, HTTP 500) never raise into user code: a push runs on a thread of its
own and ends by its deadline (``timeout`` seconds for the whole exchange, every read included),
memory stays bounded (each push sends the current aggregates; nothing queues up), one warning is
given, and failed pushes are counted in ``gpuprobe.telemetry.dropped{reason="otlp_export_failed"}``.

Why gpuprobe sends the request itself rather than through the SDK's ``OTLPMetricExporter``: that
exporter's timeout bounds each socket read, so an endpoint answering one byte at a time holds a push
for ever, and up to opentelemetry-exporter-otlp-proto-http 1.27 a 503 holds it for 63 s of retries
whatever the timeout; a deadline cannot be added from outside without its private transport, which
changed completely between 1.27 and 1.45. The request is what the SDK sends (the same encoder,
``Content-Type: application/x-protobuf``), and the SDK's environment variables for headers,
compression and certificates (``OTEL_EXPORTER_OTLP[_METRICS]_HEADERS``, ``_COMPRESSION``,
``_CERTIFICATE``, ``_CLIENT_CERTIFICATE``, ``_CLIENT_KEY``) apply as they do there.
"""

from __future__ import annotations

import atexit
import gzip
import http.client
import io
import os
import select
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from .._lifecycle import Owner
from .._metrics import SPECS, MetricData, MetricSpec, Point
from .._version import __version__
from ..errors import ConfigError, missing
from ..runtime import Runtime, runtime
from ._queued import Observation, QueuedSink

try:
    from opentelemetry.sdk import environment_variables as otel_env
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.util.re import parse_env_headers
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise missing("opentelemetry-sdk", "otel") from exc

try:  # exemplars on data points: opentelemetry-sdk 1.28 and later (the otel extra allows 1.27, which has none)
    from opentelemetry.sdk.metrics import Exemplar as OtelExemplar
except ImportError:  # pragma: no cover - exercised under the otel floor (scripts/test-otel-floor)
    OtelExemplar = None

__all__ = ["OtlpExporter", "MeterProviderBridge", "to_metrics_data", "EXEMPLARS"]

EXEMPLARS = OtelExemplar is not None and "exemplars" in getattr(HistogramDataPoint, "__dataclass_fields__", {})
"""Whether the installed OpenTelemetry SDK carries exemplars on histogram data points (1.28 and later): where
it does not, :func:`to_metrics_data` sends the points without them."""

_SCOPE = InstrumentationScope("gpuprobe", None)


def to_metrics_data(data: list[MetricData], start_ns: int, now_ns: int, resource: Resource) -> MetricsData:
    """Turn a :meth:`Registry.snapshot` into OpenTelemetry ``MetricsData`` (cumulative)."""
    cumulative = AggregationTemporality.CUMULATIVE
    metrics = []
    for md in data:
        spec = md.spec
        if spec.instrument == "histogram":
            points: list[Any] = []
            for p in md.points:
                point = HistogramDataPoint(attributes=p.labels, start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                                           count=p.count, sum=p.sum, bucket_counts=list(p.bucket_counts),
                                           explicit_bounds=list(spec.buckets or ()), min=p.min, max=p.max,
                                           **({"exemplars": _exemplars(p)} if EXEMPLARS else {}))
                points.append(point)
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


def _exemplars(point: Point) -> list[Any]:
    """A histogram point's exemplars (one per bucket that has one) as the SDK's, span and trace ids included."""
    return [OtelExemplar({}, ex.value, int(ex.time * 1e9), int(ex.span_id, 16), int(ex.trace_id, 16))
            for ex in point.exemplars if ex is not None]


# -- one OTLP/HTTP request under one deadline -----------------------------------------------------

_RETRYABLE = frozenset({429, 502, 503, 504})  # the statuses OTLP/HTTP clients retry (the OTLP specification)
_MAX_ANSWER = 1 << 16  # an ExportMetricsServiceResponse is a few bytes; more is read no further


class _DeadlineExceeded(TimeoutError):
    """The push's deadline passed before the exchange ended."""


class _DeadlineSocket:
    """A connected socket whose every write and read ends by one deadline (``time.monotonic()``).

    Why: a socket timeout bounds each read, so an endpoint answering one byte at a time keeps a push
    going for ever; here each read is given only what is left of the push's time. ``http.client``
    uses ``sendall``, ``makefile`` and ``close`` of a connection's socket (``sendall`` with a timeout
    bounds the whole send since Python 3.5); the socket itself is closed by its owner.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _DeadlineExceeded()
        return left

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._left())
        self._sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self._sock.settimeout(self._left())
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self))

    def close(self) -> None:
        # http.client closes its connection as soon as it has the response's headers, before the body
        # is read (a real socket stays open while its makefile() stream does): the socket is closed by
        # _Endpoint.post once the answer is read.
        pass


class _DeadlineReader(io.RawIOBase):
    """The response stream ``http.client`` reads, each read through :meth:`_DeadlineSocket.recv_into`."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)


def _env(metrics_name: str, general_name: str) -> str | None:
    """An OTLP exporter variable: the metrics-specific one first, as the SDK reads them."""
    return os.environ.get(metrics_name) or os.environ.get(general_name) or None


class _Endpoint:
    """Where pushes go and how: URL parts, headers, compression, TLS; made once per exporter.

    A variable of the environment it cannot use (an unknown compression, a certificate file that
    cannot be loaded) is left out and described in ``problems``, for the exporter to warn about.

    Raises:
        ConfigError: the URL is not an http:// or https:// URL with a host.
    """

    def __init__(self, url: str, headers: Mapping[str, str] | None, signal: str = "METRICS") -> None:
        self._signal = signal  # whose OTEL_EXPORTER_OTLP_<SIGNAL>_* variables apply first: METRICS or TRACES
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise ConfigError(f"the OTLP endpoint must be an http:// or https:// URL with a host, got {url!r}")
        self.problems: list[str] = []
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.headers = {"Content-Type": "application/x-protobuf", "User-Agent": f"gpuprobe/{__version__}"}
        env_headers = self._var("HEADERS")
        if env_headers:
            self.headers.update(parse_env_headers(env_headers, liberal=True))
        self.headers.update(headers or {})
        compression = (self._var("COMPRESSION")
                       or "none").strip().lower()
        compressors: dict[str, Callable[[bytes], bytes] | None] = {
            "none": None, "gzip": gzip.compress, "deflate": zlib.compress}
        if compression not in compressors:
            self.problems.append(f"gpuprobe: OTEL_EXPORTER_OTLP_[METRICS_]COMPRESSION must be none, gzip or deflate, "
                                 f"got {compression!r}: OTLP pushes are not compressed")
            compression = "none"
        self.compress = compressors[compression]
        if self.compress is not None:
            self.headers["Content-Encoding"] = compression
        self.tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.tls = self._tls_context()

    def _var(self, name: str) -> str | None:
        """``OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME>``, else ``OTEL_EXPORTER_OTLP_<NAME>``."""
        return _env(f"OTEL_EXPORTER_OTLP_{self._signal}_{name}", f"OTEL_EXPORTER_OTLP_{name}")

    def _tls_context(self) -> ssl.SSLContext:
        ca = self._var("CERTIFICATE")
        try:
            context = ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            self.problems.append(f"gpuprobe: the OTLP certificate file {ca!r} (OTEL_EXPORTER_OTLP_[METRICS_]"
                                 f"CERTIFICATE) cannot be loaded: {exc}; the system's certificates are used")
            context = ssl.create_default_context()
        cert = self._var("CLIENT_CERTIFICATE")
        if cert:
            key = self._var("CLIENT_KEY")
            try:
                context.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                self.problems.append(f"gpuprobe: the OTLP client certificate {cert!r} (OTEL_EXPORTER_OTLP_[METRICS_]"
                                     f"CLIENT_CERTIFICATE, _CLIENT_KEY) cannot be loaded: {exc}; none is sent")
        return context

    def post(self, body: bytes, deadline: float) -> tuple[int, str | None]:
        """POST ``body``; returns the status and the Retry-After header. Every step ends by ``deadline``.

        Raises:
            TimeoutError: the deadline passed (connecting, in the TLS handshake, sending or reading).
            OSError, http.client.HTTPException: the connection failed or the answer is not HTTP.
        """
        left = deadline - time.monotonic()
        if left <= 0:
            raise _DeadlineExceeded()
        sock = socket.create_connection((self.host, self.port), timeout=left)
        try:
            if self.tls is not None:
                sock = self._handshake(sock, deadline)
            conn = http.client.HTTPConnection(self.host, self.port)
            conn.sock = _DeadlineSocket(sock, deadline)  # type: ignore[assignment]  # what http.client uses of it
            conn.request("POST", self.target, body=body, headers=self.headers)
            response = conn.getresponse()
            response.read(_MAX_ANSWER)
            return response.status, response.getheader("Retry-After")
        finally:
            sock.close()

    def _handshake(self, sock: socket.socket, deadline: float) -> ssl.SSLSocket:
        """The TLS handshake, non-blocking so that it too ends by ``deadline``."""
        assert self.tls is not None
        tls = self.tls.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
        tls.setblocking(False)
        wanted: tuple[list[ssl.SSLSocket], list[ssl.SSLSocket]]
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                wanted = ([tls], [])
            except ssl.SSLWantWriteError:
                wanted = ([], [tls])
            left = deadline - time.monotonic()
            if left <= 0 or not any(select.select(wanted[0], wanted[1], [], left)[:2]):
                tls.close()
                raise _DeadlineExceeded()
        tls.setblocking(True)
        return tls


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delay form; an HTTP date is ignored)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 3600 else None


_SUPERSEDED = "superseded"  # a periodic push given up because the exporter is closing: its last push follows


class OtlpExporter:
    """Push gpuprobe's aggregates to an OTLP/HTTP endpoint every ``interval`` seconds, and once more
    when closed.

    Pushes run on a thread of the exporter's own, so a slow or dead endpoint never delays collection
    or the program. Each push ends by its deadline, ``timeout`` seconds for the whole exchange
    (connecting, sending, every read of the answer, retries of a 429/502/503/504 answer); a push
    cut at its deadline or failing otherwise is warned about once and counted as
    ``gpuprobe.telemetry.dropped{reason="otlp_export_failed"}`` (its data points); the next push
    sends the cumulative values again. :meth:`close` (run at exit) makes the last push, so a program
    shorter than one interval delivers what it measured; closing waits for at most about
    ``2 × timeout`` (a push under way, then the last one).

    Args:
        endpoint: the full metrics URL, e.g. ``http://127.0.0.1:4318/v1/metrics``.
        interval: seconds between pushes.
        timeout: seconds one push may take, all of it.
        headers: extra HTTP headers (over ``OTEL_EXPORTER_OTLP[_METRICS]_HEADERS``).
        resource_attributes: added to the OTel resource (``service.name`` defaults to ``gpuprobe``).

    Raises:
        ConfigError: ``endpoint`` is not an http(s) URL, or ``interval`` / ``timeout`` is not positive.

    Example:
        >>> exp = OtlpExporter("http://127.0.0.1:4318/v1/metrics").attach()  # doctest: +SKIP
    """

    def __init__(self, endpoint: str, *, interval: float = 5.0, timeout: float = 2.0,
                 headers: dict[str, str] | None = None, resource_attributes: dict[str, str] | None = None) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
        except ImportError as exc:  # pragma: no cover
            raise missing("opentelemetry-exporter-otlp-proto-http", "otel") from exc
        for name, value in (("interval", interval), ("timeout", timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ConfigError(f"the OTLP exporter's {name} must be a positive number of seconds, got {value!r}")
        self._encode = encode_metrics
        self._endpoint = _Endpoint(endpoint, headers)
        self.endpoint = endpoint
        self.interval = float(interval)
        self.timeout = float(timeout)
        attrs = {"service.name": "gpuprobe", "telemetry.sdk.name": "gpuprobe"}
        attrs.update(resource_attributes or {})
        # Resource.create() runs the SDK's resource detectors in a thread pool (opentelemetry-sdk 1.27
        # to 1.45): made once here, never in a push, since the last push runs at interpreter exit,
        # where no thread can be started.
        self._base_resource = Resource.create(attrs)
        self._resource = self._base_resource
        self._resource_labels: dict[str, str] | None = None
        self._rt: Runtime | None = None
        self._lock = threading.Lock()  # one push at a time
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._start_ns = time.time_ns()
        self.pushes = 0
        self.failures = 0

    def attach(self, rt: Runtime | None = None, *, owner: Owner = "user") -> OtlpExporter:
        """Start pushing from ``rt`` (the process's runtime by default)."""
        self._rt = rt or runtime()
        for problem in self._endpoint.problems:  # variables of the environment it could not use
            self._rt.warn_once(f"otlp:{problem}", problem, where="<environment>")
        self._thread = threading.Thread(target=self._run, name="gpuprobe-otlp", daemon=True)
        self._thread.start()
        self._rt.add_closeable(self, owner=owner)
        return self

    def _run(self) -> None:
        # Its own schedule (like OpenTelemetry's PeriodicExportingMetricReader): a push may wait on a
        # slow endpoint for up to `timeout` without delaying the background round.
        while not self._stop.wait(self.interval):
            self._push(last=False)

    def push(self) -> bool:
        """Send the current aggregates now, within ``timeout`` seconds; True on success. Never raises."""
        return self._push(last=False)

    def _resource_for(self, rt: Runtime) -> Resource:
        labels = rt.registry.const_labels  # rank and device: the device is known once the program uses one
        if labels != self._resource_labels:
            self._resource = self._base_resource.merge(Resource(dict(labels)))
            self._resource_labels = dict(labels)
        return self._resource

    def _push(self, *, last: bool) -> bool:
        rt = self._rt or runtime()
        points = 0
        why: str | None
        with self._lock:
            try:
                data = rt.collect()
                if not data:
                    return True
                points = sum(len(md.points) for md in data)
                payload = to_metrics_data(data, self._start_ns, time.time_ns(), self._resource_for(rt))
                why = self._deliver(self._encode(payload).SerializeToString(), last=last)
            except Exception as exc:  # never into user code
                why = repr(exc)
        if why is None:
            self.pushes += 1
            return True
        if why == _SUPERSEDED:
            return False
        self.failures += 1
        rt.drop("otlp_export_failed", points or 1)
        if last:
            rt.warn_once("otlp:last", f"gpuprobe: the last OTLP push to {self.endpoint}, as the exporter closes, "
                         f"failed: {why}; what was measured since the previous push is not delivered")
        else:
            rt.warn_once("otlp", f"gpuprobe: OTLP push to {self.endpoint} failed: {why}; the next push, in "
                         f"{self.interval:g} s, sends the cumulative values again (this warning is shown once)")
        return False

    def _deliver(self, body: bytes, *, last: bool) -> str | None:
        """Send ``body`` by the deadline, retrying a 429/502/503/504; None when delivered, else why not."""
        deadline = time.monotonic() + self.timeout
        if self._endpoint.compress is not None:
            body = self._endpoint.compress(body)
        attempt = 0
        while True:
            try:
                status, retry_after = self._endpoint.post(body, deadline)
            except TimeoutError:
                return (f"no complete answer within the push's deadline of {self.timeout:g} s (otlp_timeout), "
                        "so it was cut")
            except (OSError, http.client.HTTPException) as exc:
                return repr(exc)
            if 200 <= status < 300:
                return None
            if status not in _RETRYABLE:
                return f"HTTP {status}"
            delay = _retry_after(retry_after)
            delay = 0.1 * 2 ** attempt if delay is None else delay
            if time.monotonic() + delay >= deadline:
                return f"HTTP {status}, and no time left to try again within the deadline of {self.timeout:g} s"
            if last:
                time.sleep(delay)
            elif self._stop.wait(delay):
                return _SUPERSEDED
            attempt += 1

    def stop(self, timeout: float | None = None) -> None:
        """Stop the pusher without a last push (waits up to ``timeout`` for a push under way)."""
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.timeout + 1 if timeout is None else timeout)

    def close(self) -> None:
        """Stop the pusher and push the final aggregates (once; later calls, or after :meth:`stop`, do nothing)."""
        if self._closed:
            return
        self.stop()  # a push under way ends by its deadline
        self._push(last=True)

    def __repr__(self) -> str:
        return f"<gpuprobe OTLP exporter {self.endpoint}>"


class MeterProviderBridge(QueuedSink):
    """Feed gpuprobe's observations into the user's own OpenTelemetry ``MeterProvider``.

    Instruments are created on ``meter_provider.get_meter("gpuprobe")`` with gpuprobe's names, units
    and bucket boundaries (as advice, where the installed opentelemetry-api takes it: 1.28 and later;
    before, the provider's own buckets apply, with one warning). Observations are queued (bounded,
    ``max_queue``; overflow is counted in ``gpuprobe.telemetry.dropped``) and recorded on gpuprobe's
    background thread. At exit, what is queued is recorded before the provider's own exit handler
    shuts it down (an exit handler of the bridge's, registered after the provider's, runs first).

    Args:
        meter_provider: an OpenTelemetry ``MeterProvider`` (anything with ``get_meter()``).
        max_queue: observations held before new ones are dropped and counted.

    Example:
        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> bridge = MeterProviderBridge(MeterProvider()).attach()
        >>> bridge.close()
    """

    name = "meter_provider"

    def __init__(self, meter_provider: Any, *, max_queue: int = 100_000) -> None:
        super().__init__(max_queue=max_queue)
        self.meter_provider = meter_provider
        self._meter = meter_provider.get_meter("gpuprobe", __version__)
        self._instruments: dict[str, Any] = {}
        self._pid = os.getpid()

    def attach(self, rt: Runtime | None = None, *, owner: Owner = "user") -> MeterProviderBridge:
        """Start feeding the provider from ``rt`` (the process's runtime by default)."""
        super().attach(rt, owner=owner)
        atexit.register(self._record_before_provider_exits)
        return self

    def _record_before_provider_exits(self) -> None:
        # An SDK MeterProvider shuts down in an exit handler registered when it was made, before this
        # one: handlers run newest first, so this records the last observations while it still takes them.
        if os.getpid() != self._pid or self._closed:
            return  # a forked child: the parent's bridge is the parent's
        try:
            if self._rt is not None:
                self._rt.drain()
            self.flush()
        except Exception:  # pragma: no cover - flush guards the writes itself
            pass

    def _histogram(self, spec: MetricSpec) -> Any:
        m = self._meter
        try:
            return m.create_histogram(spec.name, unit=spec.unit, description=spec.description,
                                      explicit_bucket_boundaries_advisory=list(spec.buckets or ()))
        except TypeError:  # opentelemetry-api before 1.28 takes no bucket advice
            if self._rt is not None:
                self._rt.warn_once("meter_provider:buckets", (
                    "gpuprobe: this opentelemetry-api takes no bucket boundaries as advice (1.28 and later do): "
                    "gpuprobe's histograms in your MeterProvider get its default buckets unless a View sets them"))
            return m.create_histogram(spec.name, unit=spec.unit, description=spec.description)

    def _instrument(self, spec: MetricSpec) -> Any:
        inst = self._instruments.get(spec.name)
        if inst is None:
            m = self._meter
            if spec.instrument == "histogram":
                inst = self._histogram(spec).record
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

    def close(self) -> None:
        """Record what is left and stop receiving (once; later calls do nothing)."""
        super().close()
        atexit.unregister(self._record_before_provider_exits)

    def __repr__(self) -> str:
        return f"<gpuprobe MeterProvider bridge {self._meter!r}>"
