"""Prometheus exposition: a custom ``prometheus_client`` collector that reads gpuprobe's aggregates at
scrape time, and :func:`serve`, the /metrics endpoint (127.0.0.1 unless asked otherwise), which also
takes on-demand profile captures (``POST /gpuprobe/profile?steps=N``, see :mod:`gpuprobe._on_demand`).

Names follow the OpenTelemetry-to-Prometheus rules (see :func:`gpuprobe._metrics.prometheus_name`),
so a dashboard written against an OTel Collector's Prometheus exporter reads the same series.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .. import _on_demand
from .._lifecycle import Owner
from .._metrics import MetricData, cumulative, prometheus_label, prometheus_name
from ..errors import ConfigError, missing
from ..runtime import Runtime
from ..runtime import runtime as _runtime

try:
    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.core import Metric
    from prometheus_client.utils import floatToGoString
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise missing("prometheus_client", "prometheus") from exc

__all__ = ["GpuprobeCollector", "serve", "Server", "to_metrics"]

_TYPES = {"histogram": "histogram", "counter": "counter", "updown": "gauge", "gauge": "gauge"}


def to_metrics(data: list[MetricData]) -> Iterator[Metric]:
    """Turn a :meth:`Registry.snapshot` into ``prometheus_client`` metric families."""
    for md in data:
        spec = md.spec
        name = prometheus_name(spec)
        typ = _TYPES[spec.instrument]
        fam = Metric(name, f"{spec.description} ({spec.name}, unit {spec.unit})", typ)
        for p in md.points:
            labels = {prometheus_label(k): v for k, v in p.labels.items()}
            if typ == "histogram":
                bounds = spec.buckets or ()
                for le, c in zip([*bounds, float("inf")], cumulative(p.bucket_counts)):
                    fam.add_sample(name + "_bucket", {**labels, "le": floatToGoString(le)}, c)
                fam.add_sample(name + "_count", labels, p.count)
                fam.add_sample(name + "_sum", labels, p.sum)
            elif typ == "counter":
                fam.add_sample(name + "_total", labels, p.value)
            else:
                fam.add_sample(name, labels, p.value)
        yield fam


class GpuprobeCollector:
    """A ``prometheus_client`` collector: each scrape drains buffers and reads the aggregates."""

    def __init__(self, rt: Runtime | None = None) -> None:
        self._rt = rt

    def collect(self) -> Iterator[Metric]:
        rt = self._rt or _runtime()
        yield from to_metrics(rt.collect())

    def describe(self) -> list[Any]:
        return []  # families appear as probes run; no fixed description


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request, none kept at exit (as prometheus_client's own server)."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No access log on stderr."""


def _start_http_server(port: int, addr: str, registry: Any, rt: Runtime) -> tuple[Any, threading.Thread]:
    """prometheus_client's ``start_http_server`` with :data:`gpuprobe._on_demand.PATH` answered too."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server_class = type("_Server", (_ThreadingServer,), {"address_family": family})
    app = _on_demand.wrap_wsgi(make_wsgi_app(registry), rt, addr)
    httpd: Any = make_server(str(sockaddr[0]), port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="gpuprobe-metrics", daemon=True)
    thread.start()
    return httpd, thread


class _Endpoint:
    """The HTTP server behind one address and port, shared by every :class:`Server` handle on it."""

    def __init__(self, httpd: Any, thread: threading.Thread, addr: str, port: int) -> None:
        self.httpd = httpd
        self.thread = thread
        self.addr = addr
        self.port = port
        self.users = 0

    def release(self) -> None:
        with _lock:
            self.users -= 1
            if self.users > 0:
                return
            _servers.pop((self.addr, self.port), None)
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(2)


class Server:
    """A handle on a running /metrics endpoint; :meth:`close` releases it.

    :func:`serve` on a port already served in this process hands back a new handle on the same
    endpoint; the endpoint stops when every handle is closed, so one caller's ``close()`` never
    stops metrics another caller still serves.
    """

    def __init__(self, endpoint: _Endpoint) -> None:
        self._endpoint = endpoint
        self.addr = endpoint.addr
        self.port = endpoint.port
        self._closed = False

    @property
    def url(self) -> str:
        """The scrape URL."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Release this handle; the port is freed when the last handle on it is closed."""
        if self._closed:
            return
        self._closed = True
        self._endpoint.release()

    def __repr__(self) -> str:
        return f"<gpuprobe /metrics at {self.url}>"


_servers: dict[tuple[str, int], _Endpoint] = {}
_lock = threading.Lock()


def serve(port: int | None = None, addr: str | None = None, *, runtime: Runtime | None = None,
          owner: Owner = "user") -> Server:
    """Serve gpuprobe's metrics for Prometheus at ``http://addr:port/metrics``.

    Args:
        port: TCP port; default the ``prometheus_port`` setting (``GPUPROBE_PROMETHEUS_PORT``) or 9464.
            Under torchrun, ``LOCAL_RANK`` is added (one port per local rank) unless
            ``port_by_local_rank`` (``GPUPROBE_PORT_BY_LOCAL_RANK``) is off. Port 0 picks a free port.
        addr: address to bind; default ``127.0.0.1`` (``GPUPROBE_PROMETHEUS_ADDR``).
        runtime: the runtime to serve (the process's by default).
        owner: ``"user"`` (kept across ``configure()``) or ``"settings"`` (started by the settings).

    Returns:
        A handle on the running endpoint (a new handle on the same endpoint if this process already
        serves there). Every handle is closed by ``gpuprobe.testing.reset()`` and at exit.

    Raises:
        ConfigError: the port is in use or the address cannot be bound; the message names both and
            the setting.

    Example:
        >>> import gpuprobe
        >>> server = gpuprobe.serve(port=0)
        >>> server.url.startswith("http://127.0.0.1:")
        True
        >>> server.close()
    """
    rt = runtime or _runtime()
    cfg = rt.settings
    setting = "port=" if port is not None else "GPUPROBE_PROMETHEUS_PORT"
    if port is None:
        port = cfg.prometheus_port if cfg.prometheus_port is not None else 9464
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{setting} must be a TCP port between 0 and 65535, got {port!r}")
    if port and cfg.port_by_local_rank:
        port += cfg.local_rank
    addr = addr or cfg.prometheus_addr
    with _lock:
        found = _servers.get((addr, port))
        if found is not None and port:
            found.users += 1
            handle = Server(found)
            rt.add_closeable(handle, owner=owner)
            return handle
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GpuprobeCollector(rt))  # type: ignore[arg-type]
        try:
            httpd, thread = _start_http_server(port, addr, registry, rt)
        except OSError as exc:
            rank = f" (base port + LOCAL_RANK={cfg.local_rank})" if cfg.local_rank and cfg.port_by_local_rank else ""
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"gpuprobe cannot serve /metrics: port {port}{rank} on {addr} is already in use; "
                    f"choose another with {setting} (or GPUPROBE_PROMETHEUS_PORT)"
                ) from None
            raise ConfigError(
                f"gpuprobe cannot serve /metrics on {addr}:{port}{rank}: {exc.strerror or exc}; "
                f"check {setting} and GPUPROBE_PROMETHEUS_ADDR"
            ) from None
        endpoint = _Endpoint(httpd, thread, addr, httpd.server_address[1])
        endpoint.users = 1
        _servers[(addr, endpoint.port)] = endpoint
    server = Server(endpoint)
    rt.add_closeable(server, owner=owner)
    return server


def _forget_after_fork() -> None:
    """In a forked child: the endpoints' threads do not exist here; close the inherited listening
    sockets (the parent keeps serving on them) and forget them, so the child can serve anew."""
    global _lock
    _lock = threading.Lock()
    for endpoint in list(_servers.values()):
        try:
            endpoint.httpd.socket.close()
        except OSError:
            pass
    _servers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
