"""Prometheus exposition: a custom ``prometheus_client`` collector that reads gpuprobe's aggregates at
scrape time, and :func:`serve`, the /metrics endpoint (127.0.0.1 unless asked otherwise), which also
takes on-demand profile captures (``POST /gpuprobe/profile?steps=N``, see :mod:`gpuprobe._on_demand`),
answers ``/requests`` with the live requests table (JSON, :func:`requests_table`: the requests running now
and the most recent finished ones, rendered at most once per ``collect_interval`` like a scrape) and
serves the live page at ``/`` to a browser (charts computed in the page from /metrics, and its history,
see :mod:`gpuprobe.exporters._page`).

Names follow the OpenTelemetry-to-Prometheus rules (see :func:`gpuprobe._metrics.prometheus_name`),
so a dashboard written against an OTel Collector's Prometheus exporter reads the same series.

What a scrape shows from the start: ``gpuprobe_build_info`` (1, labelled with the versions and the
device) and, at 0, every counter whose labels are known before anything is counted (the reasons of
``gpuprobe.telemetry.dropped``, every declared seam of ``gpuprobe.seam.disabled``, and the series an
integration prepared, such as a model's preemptions and finished requests), so a dashboard reads 0
rather than no data and ``increase()`` counts the first event.

Under load (see :mod:`gpuprobe.exporters._http` and ``benchmarks/metrics_load.py``): the body is
rendered at most once per ``collect_interval`` (0.5 s by default) and reused by every scrape in
between, compressed only for a scraper that asks for gzip; a cached scrape is answered without a
thread of its own; the server's threads, connections, time per request and CPU are bounded
(:class:`Limits`). By default the port is answered by a front process of its own
(:mod:`gpuprobe.exporters._front`), so that scrapes cost the program one rendering per interval and
nothing more; ``serve(in_process=True)``, or a platform where that process cannot start, serves from
the program's own threads.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip as _gzip
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .. import _on_demand, _seams
from .._lifecycle import Owner
from .._metrics import MetricData, build_info_labels, cumulative, prometheus_label, prometheus_name
from ..errors import ConfigError, missing
from ..runtime import Runtime
from ..runtime import runtime as _runtime
from . import _front, _page
from ._http import Access, HttpServer, Limits, Rendered, _close, is_scrape, response

try:
    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.core import Metric
    from prometheus_client.samples import Exemplar as PrometheusExemplar
    from prometheus_client.exposition import choose_encoder, generate_latest, gzip_accepted
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    from prometheus_client.utils import floatToGoString
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise missing("prometheus_client", "prometheus") from exc

__all__ = ["GpuprobeCollector", "Limits", "serve", "Server", "to_metrics", "render"]

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
                exemplars = p.exemplars or (None,) * len(p.bucket_counts)
                for le, c, ex in zip([*bounds, float("inf")], cumulative(p.bucket_counts), exemplars):
                    fam.add_sample(name + "_bucket", {**labels, "le": floatToGoString(le)}, c,
                                   exemplar=None if ex is None else PrometheusExemplar(
                                       {"trace_id": ex.trace_id, "span_id": ex.span_id}, ex.value, ex.time))
                fam.add_sample(name + "_count", labels, p.count)
                fam.add_sample(name + "_sum", labels, p.sum)
            elif typ == "counter":
                fam.add_sample(name + "_total", labels, p.value)
            else:
                fam.add_sample(name, labels, p.value)
        yield fam


class _Family:
    """What the exposition writes for every series of one metric, worked out once per metric."""

    __slots__ = ("name", "type", "help_text", "help_openmetrics", "les")

    def __init__(self, spec: Any) -> None:
        self.name = prometheus_name(spec)
        self.type = _TYPES[spec.instrument]
        doc = f"{spec.description} ({spec.name}, unit {spec.unit})"
        self.help_text = doc.replace("\\", r"\\").replace("\n", r"\n")
        self.help_openmetrics = self.help_text.replace('"', r'\"')
        self.les = [floatToGoString(b) for b in (*(spec.buckets or ()), float("inf"))]


_families: dict[Any, _Family] = {}  # by MetricSpec
_label_names: dict[str, str] = {}


def _escape(value: str) -> str:
    """A label value as both formats write it (backslash, newline and double quote escaped)."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    return value


def _count(c: int) -> str:
    """``floatToGoString(c)`` of a count: Python's ``repr`` of the float below a million (Go switches to an
    exponent from seven digits on), without the float. Why: a body's bucket lines are most of its samples."""
    return f"{c}.0" if 0 <= c < 1_000_000 else floatToGoString(c)


def _labels(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs)


def render(data: list[MetricData], *, openmetrics: bool = False) -> bytes:
    """``data`` in the Prometheus text format 0.0.4, or in OpenMetrics 1.0: what prometheus_client's
    ``generate_latest`` writes for :func:`to_metrics` of ``data`` (its twin, tested against it). In
    OpenMetrics, a histogram bucket that has an exemplar (a request's span, while traces are on) is
    followed by it: ``# {span_id="...",trace_id="..."} VALUE TIMESTAMP``; the text format has none.

    Why not ``generate_latest``: it validates and escapes every label name of every sample, about 20 µs
    a sample (25 ms for a body of a thousand samples, on the development machine); this writes the
    labels of a series once and its bucket lines from prepared pieces, about 1 µs a sample.

    Example:
        >>> import gpuprobe
        >>> render(gpuprobe.collect()).startswith(b"# HELP") or render([]) == b""
        True
    """
    out: list[str] = []
    for md in data:
        fam = _families.get(md.spec)
        if fam is None:
            fam = _families[md.spec] = _Family(md.spec)
        name, typ = fam.name, fam.type
        head = name + "_total" if typ == "counter" and not openmetrics else name
        out.append(f"# HELP {head} {fam.help_openmetrics if openmetrics else fam.help_text}\n# TYPE {head} {typ}\n")
        sample = name + "_total" if typ == "counter" else name
        for p in md.points:
            labels: dict[str, str] = {}
            for k, v in p.labels.items():
                key = _label_names.get(k)
                if key is None:
                    key = _label_names[k] = prometheus_label(k)
                labels[key] = _escape(v)
            pairs = sorted(labels.items())
            if typ == "histogram":
                before = _labels([kv for kv in pairs if kv[0] < "le"])
                after = _labels([kv for kv in pairs if kv[0] > "le"])
                prefix = f'{name}_bucket{{{before + "," if before else ""}le="'
                suffix = f'"{"," + after if after else ""}}} '
                total = 0
                exemplars = p.exemplars if openmetrics else ()
                if exemplars:  # OpenMetrics 1.0: a bucket's exemplar follows its value (the text format has none)
                    for le, c, ex in zip(fam.les, p.bucket_counts, exemplars):
                        total += c
                        if ex is None:
                            out.append(f"{prefix}{le}{suffix}{_count(total)}\n")
                        else:
                            out.append(f'{prefix}{le}{suffix}{_count(total)} # {{span_id="{_escape(ex.span_id)}",'
                                       f'trace_id="{_escape(ex.trace_id)}"}} {floatToGoString(ex.value)} {ex.time}\n')
                else:
                    for le, c in zip(fam.les, p.bucket_counts):
                        total += c
                        out.append(f"{prefix}{le}{suffix}{_count(total)}\n")
                both = f"{{{_labels(pairs)}}}" if pairs else ""
                out.append(f"{name}_count{both} {_count(p.count)}\n{name}_sum{both} {floatToGoString(p.sum)}\n")
            else:
                both = f"{{{_labels(pairs)}}}" if pairs else ""
                out.append(f"{sample}{both} {floatToGoString(p.value)}\n")
    if openmetrics:
        out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def _device_name(device: str) -> str | None:
    """A GPU's name for ``cuda:N`` once the program has initialized CUDA (never initializes it), else None."""
    torch = sys.modules.get("torch")
    if torch is None or not device.startswith("cuda:"):
        return None
    try:
        if torch.cuda.is_initialized():
            return str(torch.cuda.get_device_name(int(device[5:])))
    except Exception:  # a reading that fails names the device by its label
        pass
    return None


class GpuprobeCollector:
    """A ``prometheus_client`` collector: each scrape drains buffers and reads the aggregates.

    Besides what was recorded, it shows ``gpuprobe_build_info`` and every counter series whose labels
    are known, at 0 until something is counted (see the module docstring).
    """

    def __init__(self, rt: Runtime | None = None) -> None:
        self._rt = rt
        self._build: tuple[Any, dict[str, str]] | None = None  # (series, labels) of gpuprobe.build_info
        self._names: dict[str, str] = {}  # device label -> GPU name, once read

    def collect(self) -> Iterator[Metric]:
        yield from to_metrics(self.data())

    def data(self) -> list[MetricData]:
        """Drain the buffers, then copy the aggregates with the known series and build info."""
        rt = self._rt or _runtime()
        with rt.lock:
            rt.drain()
            self.prepare(rt)
            return rt.registry.snapshot(zeros=True)

    def prepare(self, rt: Runtime) -> None:
        """Prepare the known series and set ``gpuprobe.build_info`` (under the runtime's lock)."""
        registry = rt.registry
        registry.prepare_known()
        seams = registry.family("gpuprobe.seam.disabled")
        for declared in _seams.registry():
            seams.child(seam=declared.name)
        device = registry.const_labels.get("gpuprobe.device", "cpu")
        name = self._names.get(device)
        if name is None:
            name = _device_name(device)
            if name is not None:
                self._names[device] = name
        labels = build_info_labels(name or device)
        if self._build is None or self._build[1] != labels or not self._build[0].touched:  # touched: not reset
            series = registry.family("gpuprobe.build_info").child(**labels)
            if self._build is not None and self._build[0] is not series:
                self._build[0].forget()  # the device became known: one series, not two
            series.apply(1)
            self._build = (series, labels)

    def describe(self) -> list[Any]:
        return []  # families appear as probes run; no fixed description


class _Job:
    """A scrape (or a read of ``/requests``): what renders the body, the format asked for, gzip or not, and
    whether it is a HEAD request; ``key`` names its cached rendering (the content type of a scrape)."""

    __slots__ = ("encoder", "content_type", "gzip", "head", "key", "headers")

    def __init__(self, encoder: Callable[[], bytes], content_type: str, gzipped: bool, head: bool,
                 key: str | None = None, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.encoder = encoder
        self.content_type = content_type
        self.gzip = gzipped
        self.head = head
        self.key = key or content_type
        self.headers = headers


REQUESTS_SHOWN = 100
"""Finished requests ``/requests`` lists at most (the newest)."""

IN_FLIGHT_SHOWN = 200
"""Running and waiting requests ``/requests`` lists at most (the oldest; ``in_flight_total`` counts them all)."""

_MAX_TEXT = 256  # characters of a string field /requests writes (ids are at most 128 already)
_MAX_ITEMS = 64  # items of a list field (a record's prefill steps)


def _bounded(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as /requests writes it: strings and lists cut, numbers that JSON cannot hold (NaN, infinity) None.

    Why a copy changed only where needed, by exact type: a hundred records' rows take 0.3 ms so, 1.4 ms with
    an ``isinstance`` chain building every value anew (measured on the two-core development machine).
    """
    out = dict(row)
    for key, value in row.items():
        kind = type(value)
        if kind is float:
            if value - value != 0.0:  # NaN or an infinity (x - x is 0.0 for every finite x)
                out[key] = None
        elif kind is str:
            if len(value) > _MAX_TEXT:
                out[key] = value[:_MAX_TEXT]
        elif kind is list or kind is tuple:
            if kind is tuple or len(value) > _MAX_ITEMS:
                out[key] = list(value[:_MAX_ITEMS])
    return out


def requests_table(rt: Runtime) -> dict[str, Any]:
    """What ``/requests`` answers: the requests running now (``in_flight``: state, age, tokens so far,
    tokens/s, KV blocks; at most :data:`IN_FLIGHT_SHOWN`, the oldest, and ``in_flight_total`` of them in
    all), the most recent finished records (``finished``: :meth:`~gpuprobe.RequestRecord.as_dict`, oldest
    first, at most :data:`REQUESTS_SHOWN`), how many requests have ended (``ended``) and how many records
    the program keeps (``kept``, the ``requests_kept`` setting). Drains first, so that the continuous-
    batching shares of the finished requests are filled.

    Example:
        >>> import gpuprobe
        >>> from gpuprobe.runtime import runtime
        >>> sorted(requests_table(runtime()))
        ['ended', 'finished', 'in_flight', 'in_flight_total', 'kept']
    """
    rt.drain()
    log = rt.requests
    running = log.in_flight()
    finished = log.finished()[-REQUESTS_SHOWN:]
    return {"in_flight": [_bounded(row) for row in running[:IN_FLIGHT_SHOWN]], "in_flight_total": len(running),
            "finished": [_bounded(record.as_dict()) for record in finished], "ended": log.ended,
            "kept": rt.settings.requests_kept}


def _requests_body(rt: Runtime) -> bytes:
    # ensure_ascii: nothing but ASCII goes out, whatever a model's name holds.
    return json.dumps(requests_table(rt), allow_nan=False, separators=(",", ":")).encode()


# Name escapings under which gpuprobe's names (already Prometheus-legal) are written as they are.
_NAMES_UNCHANGED = ("underscores", "allow-utf-8", "values")


def _renderer(encoder: Any, collector: GpuprobeCollector, registry: Any) -> Callable[[], bytes]:
    """The body for one of ``choose_encoder``'s answers: :func:`render` for the two formats it writes,
    prometheus_client's encoder over the registry for anything else."""
    func = getattr(encoder, "func", encoder)
    escaping = getattr(encoder, "keywords", {}).get("escaping", "underscores")
    if escaping in _NAMES_UNCHANGED and func in (generate_latest, generate_openmetrics):
        openmetrics = func is generate_openmetrics
        return lambda: render(collector.data(), openmetrics=openmetrics)
    return lambda: encoder(registry)  # type: ignore[no-any-return]


def _sample_names(md: MetricData) -> tuple[str, ...]:
    """The names a family's samples go by (what prometheus_client's ``name[]`` query matches)."""
    name = prometheus_name(md.spec)
    typ = _TYPES[md.spec.instrument]
    if typ == "histogram":
        return name, name + "_bucket", name + "_count", name + "_sum"
    if typ == "counter":
        return name, name + "_total"
    return (name,)


def _series_query(app: Callable[..., Any], collector: GpuprobeCollector) -> Callable[..., Any]:
    """``app`` with ``GET ...?name[]=N`` answered with the families N names (as prometheus_client's own
    application does for collectors that describe themselves; gpuprobe's families appear as probes run)."""
    from urllib.parse import parse_qs

    def query_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        if environ.get("REQUEST_METHOD") != "GET" or not names:
            return app(environ, start_response)
        try:
            encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        except Exception:  # e.g. "version=abc": as route() does
            encoder, content_type = choose_encoder("")
        wanted = set(names)
        data = [md for md in collector.data() if wanted.intersection(_sample_names(md))]
        body = render(data, openmetrics=getattr(encoder, "func", encoder) is generate_openmetrics)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = _gzip.compress(body, compresslevel=6)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return query_app


def _json_error(status: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return response(status, body, (("Content-Type", "application/json"), *_page.JSON_HEADERS))


_NO_HISTORY = _json_error("404 Not Found", "gpuprobe: the page's history is kept by whoever answers the port")
_NO_HISTORY_HEAD = _NO_HISTORY[: _NO_HISTORY.index(b"\r\n\r\n") + 4]


class _Exposition:
    """The /metrics body, rendered at most once per ``collect_interval`` and reused in between (the
    :class:`~gpuprobe.exporters._http.Site` of the endpoint).

    Why: rendering reads every series and formats it in Python, milliseconds of the interpreter a
    generating thread waits for; fifty scrapers a second then cost one rendering per interval, not fifty.
    """

    def __init__(self, rt: Runtime, collector: GpuprobeCollector, registry: Any) -> None:
        self._rt = rt
        self._collector = collector
        self._registry = registry
        self._lock = threading.Lock()
        self._rendered: dict[str, Rendered] = {}  # by content type (and "requests": the table)
        self._negotiated: dict[str, tuple[Callable[[], bytes], str]] = {}  # Accept header -> choice
        self.renders = 0
        # False behind a front process: it asks at most once per interval, and wants a body rendered now.
        self.reuse = True
        self.history: _page.History | None = None  # kept here while the program answers the port itself
        self.tables = 0  # renderings of /requests

    def _fresh(self, rendered: Rendered | None, now: float) -> bool:
        return self.reuse and rendered is not None and now - rendered.at < self._rt.settings.collect_interval

    def route(self, method: str, target: str, headers: Mapping[str, str]
              ) -> _Job | _page.HistoryRequest | bytes | None:
        """Scrapes (:func:`~._http.is_scrape`: GET or HEAD, not the capture endpoint) and reads of
        ``/requests`` are the exposition's; the live page (``/`` for a browser, and its files) is
        :mod:`._page`'s: a response made beforehand; its history is :attr:`history`'s."""
        page = _page.route(method, target, headers)
        if page is not None:
            return page.head if method == "HEAD" else page.full
        wanted = _page.history_request(method, target, headers)
        if wanted is not None:
            if self.history is None:  # behind a front process, the front keeps the history
                return _NO_HISTORY_HEAD if method == "HEAD" else _NO_HISTORY
            return wanted
        if method in ("GET", "HEAD") and target.split("?", 1)[0] == _page.REQUESTS_PATH:
            return _Job(lambda: _requests_body(self._rt), "application/json",
                        gzip_accepted(headers.get("accept-encoding", "")), method == "HEAD", key="requests",
                        headers=_page.JSON_HEADERS)
        if not is_scrape(method, target, _on_demand.PATH):
            return None
        accept = headers.get("accept", "")
        chosen = self._negotiated.get(accept)
        if chosen is None:
            try:
                encoder, content_type = choose_encoder(accept)
            except Exception:  # e.g. "version=abc": prometheus_client compares it as a number
                encoder, content_type = choose_encoder("")  # the text format, as for no Accept header
            chosen = (_renderer(encoder, self._collector, self._registry), content_type)
            if len(self._negotiated) < 16:  # scrapers send one or two distinct headers
                self._negotiated[accept] = chosen
        return _Job(chosen[0], chosen[1], gzip_accepted(headers.get("accept-encoding", "")), method == "HEAD")

    def ready(self, job: _Job | _page.HistoryRequest | bytes) -> bytes | None:
        """The cached response, when it is fresh and made already (no lock: a dict read)."""
        if isinstance(job, bytes):
            return job
        if isinstance(job, _page.HistoryRequest):
            return self.history.ready(job) if self.history is not None else _NO_HISTORY
        rendered = self._rendered.get(job.key)
        if not self._fresh(rendered, time.monotonic()):
            return None
        return rendered.responses.get((job.gzip, job.head))  # type: ignore[union-attr]

    def answer(self, job: _Job | _page.HistoryRequest | bytes) -> bytes:
        """Render if the cached body is stale (one rendering at a time; others wait and reuse it)."""
        if isinstance(job, bytes):
            return job
        if isinstance(job, _page.HistoryRequest):
            return self.history.answer(job) if self.history is not None else _NO_HISTORY
        with self._lock:
            rendered = self._rendered.get(job.key)
            now = time.monotonic()
            if not self._fresh(rendered, now):
                rendered = Rendered(now, job.content_type, job.encoder(), job.headers)
                self._rendered[job.key] = rendered
                if job.key != "requests":
                    self.renders += 1
                else:
                    self.tables += 1
            assert rendered is not None
            return rendered.get(job.gzip, job.head)

    def recent_body(self, max_age: float) -> bytes | None:
        """A /metrics body rendered at most ``max_age`` seconds ago: the newest one rendered for a scraper if
        it is that recent, else one rendered now in the page's format (the history's sampler asks)."""
        now = time.monotonic()
        newest = max((r for k, r in list(self._rendered.items()) if k != "requests"), key=lambda r: r.at, default=None)
        if newest is not None and now - newest.at < max_age:
            return newest.body
        job = self.route("GET", "/metrics", {"accept": _page.PAGE_ACCEPT})
        assert isinstance(job, _Job)
        with self._lock:
            rendered = Rendered(now, job.content_type, job.encoder())
            self._rendered[job.key] = rendered
            self.renders += 1
        return rendered.body


class _Endpoint:
    """The HTTP server behind one address and port, shared by every :class:`Server` handle on it.

    With a front process (:mod:`._front`), ``server`` is the program's own server on a loopback port that
    only the front asks, and ``listener`` the public socket the front answers on; if the front ends by
    itself, the program serves ``listener`` in-process from then on (:meth:`_front_ended`).
    """

    def __init__(self, server: HttpServer, exposition: _Exposition, addr: str, port: int, *,
                 rt: Runtime, listener: socket.socket | None = None, front: _front.Front | None = None,
                 make_server: Callable[[socket.socket], HttpServer] | None = None) -> None:
        self.server = server
        self.exposition = exposition
        self.addr = addr
        self.port = port
        self.users = 0
        self.front = front
        self._rt = rt
        self._listener = listener
        self._make_server = make_server
        self._watcher: threading.Thread | None = None
        self._pid = os.getpid()  # a forked child's copy belongs to the parent: see forget_in_child
        self.sampler: _page.HistorySampler | None = None
        if front is not None:
            self._watcher = threading.Thread(target=self._front_ended, name="gpuprobe-metrics-front", daemon=True)
            self._watcher.start()
        else:
            self.keep_history()

    def keep_history(self) -> None:
        """The program answers the port: it keeps the page's history (a front process keeps its own)."""
        history = _page.History(every=_page.HISTORY_EVERY_S)
        self.exposition.history = history
        self.sampler = _page.HistorySampler(history, self.exposition.recent_body)

    def _front_ended(self) -> None:
        front = self.front
        assert front is not None
        status = front.wait_for_end()
        if front.closing or self.front is not front:
            return
        # Said before the program takes the port over, so that whoever finds it answered in-process was told.
        self._rt.warn_once("metrics-front", f"gpuprobe: the /metrics front process ended (exit status {status}); "
                                            "the program answers scrapes itself from now on")
        with _lock:
            if front.closing or self.front is not front:
                return
            listener, make = self._listener, self._make_server
            assert listener is not None and make is not None
            self.front = None
            self.exposition.reuse = True
            internal, self.server = self.server, make(listener)
            self.keep_history()  # the front's is gone with it: the history starts again here
        front.close()  # its pipes (it has ended)
        internal.close()

    def release(self) -> None:
        if self._pid != os.getpid():  # a forked child's handle: the parent's endpoint is not the child's to stop
            return
        with _lock:
            self.users -= 1
            if self.users > 0:
                return
            _servers.pop((self.addr, self.port), None)
            front, self.front = self.front, None
            sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.close()
        if front is not None:
            front.close()
            if self._watcher is not None and self._watcher is not threading.current_thread():
                self._watcher.join(2.0)
        self.server.close()
        if self._listener is not None:
            _close(self._listener)

    def forget_in_child(self) -> None:
        """In a forked child: none of the endpoint's threads runs here; close what the child inherited.
        The parent's front process is neither waited for nor signalled (it is not the child's)."""
        front, self.front = self.front, None
        if front is not None:
            front.forget_in_child()
        self.sampler = None  # its thread does not run here
        self.server.forget_in_child()
        if self._listener is not None:
            _close(self._listener)


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
        return f"{self.page_url}metrics"

    @property
    def page_url(self) -> str:
        """The live page's URL (``/``: live charts of the metrics, for a browser)."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/"

    @property
    def requests_url(self) -> str:
        """The live requests table's URL (``/requests``: JSON, see :func:`requests_table`)."""
        return f"{self.page_url}requests"

    @property
    def limits(self) -> Limits:
        """The bounds the endpoint serves under (those of the :func:`serve` call that started it)."""
        return self._endpoint.server.limits

    def stats(self) -> dict[str, int]:
        """What the endpoint has done so far: ``threads`` it runs now, ``renders`` of the body, requests
        ``answered``, ``refused`` (503: every worker busy and ``Limits.waiting`` requests waiting),
        ``timed_out`` (not sent, or not taken, within ``Limits.read_timeout``), ``evicted`` (cut while
        sending a request, past ``Limits.connections``), ``malformed`` (answered 400), ``forbidden`` (answered
        403: a ``Host`` the endpoint is not known by, or an acting request from another site; see
        :class:`~gpuprobe.exporters._http.Access`), ``expired`` (answered 503 after waiting
        ``Limits.read_timeout`` for a worker), ``paced`` (forwarded requests a front process answered 503 to
        keep the program within ``Limits.cpu_share``; 0 in-process), ``tables`` (renderings of
        ``/requests`` in the program), ``history`` and ``history_bytes`` (the scrapes the live page's
        history holds, and its bytes, wherever it is kept).

        Example:
            >>> import gpuprobe
            >>> server = gpuprobe.serve(port=0)
            >>> server.stats()["refused"]
            0
            >>> server.close()
        """
        endpoint = self._endpoint
        front = endpoint.front
        counts = front.stats() if front is not None else None
        exposition = endpoint.exposition
        if counts is not None:  # the front's threads and counts: the requests it answered
            return {"threads": int(counts.get("threads", 0)), "renders": exposition.renders,
                    **{k: int(counts.get(k, 0)) for k in endpoint.server.counts}, "paced": int(counts.get("paced", 0)),
                    "tables": exposition.tables, "history": int(counts.get("history", 0)),
                    "history_bytes": int(counts.get("history_bytes", 0))}
        history = exposition.history
        return {"threads": endpoint.server.threads(), "renders": exposition.renders,
                **endpoint.server.counts, "paced": 0, "tables": exposition.tables,
                "history": len(history) if history is not None else 0,
                "history_bytes": history.bytes if history is not None else 0}

    @property
    def front_pid(self) -> int | None:
        """The process id of the front process answering the port (None when the program answers it)."""
        front = self._endpoint.front
        return front.pid if front is not None else None

    def close(self) -> None:
        """Release this handle; the port is freed when the last handle on it is closed."""
        if self._closed:
            return
        self._closed = True
        self._endpoint.release()

    def __repr__(self) -> str:
        pid = self.front_pid
        return f"<gpuprobe /metrics at {self.url}, " + (f"answered by front process {pid}>" if pid else "answered in-process>")


_servers: dict[tuple[str, int], _Endpoint] = {}
_lock = threading.Lock()


def _bind(addr: str, port: int) -> socket.socket:
    """A TCP socket bound to ``addr:port`` (IPv4 or IPv6 as the address says), not listening yet."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As http.server: a restarted program binds its port again while old connections linger.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
    except OSError:
        sock.close()
        raise
    return sock


def serve(port: int | None = None, addr: str | None = None, *, runtime: Runtime | None = None,
          owner: Owner = "user", limits: Limits | None = None, in_process: bool = False) -> Server:
    """Serve gpuprobe's metrics for Prometheus at ``http://addr:port/metrics``, and the live page at
    ``http://addr:port/`` (:attr:`Server.page_url`): live charts of them in a browser, polling /metrics.

    Args:
        port: TCP port; default the ``prometheus_port`` setting (``GPUPROBE_PROMETHEUS_PORT``) or 9464.
            Under torchrun, ``LOCAL_RANK`` is added (one port per local rank) unless
            ``port_by_local_rank`` (``GPUPROBE_PORT_BY_LOCAL_RANK``) is off. Port 0 picks a free port.
        addr: address to bind; default ``127.0.0.1`` (``GPUPROBE_PROMETHEUS_ADDR``).
        runtime: the runtime to serve (the process's by default).
        owner: ``"user"`` (kept across ``configure()``) or ``"settings"`` (started by the settings).
        limits: how much the server may take from the program (:class:`Limits`: threads, requests
            waiting, connections, read timeout, listen backlog, CPU share); the defaults suit a
            Prometheus scraping every few seconds and hold under a flood of scrapers.
        in_process: answer the port from the program's own threads. By default a front process of its
            own answers it (:mod:`gpuprobe.exporters._front`: a scrape then costs the program nothing but
            one rendering per ``collect_interval``), and the program answers it only where that process
            cannot start (it warns once then). The endpoint works the same either way.

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
        collector = GpuprobeCollector(rt)
        registry.register(collector)  # type: ignore[arg-type]
        with rt.lock:
            collector.prepare(rt)  # the known series and build info, from now on
        exposition = _Exposition(rt, collector, registry)
        app = _on_demand.wrap_wsgi(_series_query(make_wsgi_app(registry), collector), rt, addr)
        access = Access.for_address(addr, tuple(h for h in (cfg.allowed_hosts or "").split(",") if h))
        try:
            listener = _bind(addr, port)
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
        limits = limits or Limits()

        def on_error(exc: BaseException) -> None:
            rt.warn_once("metrics-server", f"gpuprobe: the /metrics server could not answer a request: {exc!r}")

        def in_program(sock: socket.socket) -> HttpServer:
            return HttpServer(sock, exposition, app, limits, on_error, access)

        front = None
        if not in_process and _front.available():
            front, httpd = _start_front(rt, listener, exposition, app, limits, access, on_error)
        if front is None:
            httpd = in_program(listener)
            endpoint = _Endpoint(httpd, exposition, addr, listener.getsockname()[1], rt=rt)
        else:
            assert httpd is not None
            endpoint = _Endpoint(httpd, exposition, addr, listener.getsockname()[1], rt=rt, listener=listener,
                                 front=front, make_server=in_program)
        endpoint.users = 1
        _servers[(addr, endpoint.port)] = endpoint
    server = Server(endpoint)
    rt.add_closeable(server, owner=owner)
    return server


def _start_front(rt: Runtime, listener: socket.socket, exposition: _Exposition, app: Any, limits: Limits,
                 access: Access, on_error: Callable[[BaseException], None],
                 ) -> tuple[_front.Front | None, HttpServer | None]:
    """The front process answering ``listener``, and the program's own server on a loopback port it asks;
    (None, None) with one warning if the front cannot start (the caller then serves in-process)."""
    internal = None
    try:
        listener.listen(limits.backlog)  # connections wait in the kernel while the front starts
        upstream = _bind("127.0.0.1", 0)
        # The front's bounds protect the program: it fetches a body at most once per interval and format, and
        # paces what it forwards (a capture, a query of some series) to the CPU share by the time the program
        # takes to answer. It forwards each request's Host, so the same access applies here too.
        internal = HttpServer(upstream, exposition, app, dataclasses.replace(limits, cpu_share=1.0, rate=1e6),
                              on_error, access)
        exposition.reuse = False
        front = _front.Front(listener, upstream.getsockname()[1], limits, rt.settings.collect_interval,
                             _on_demand.PATH, access, history_every=_page.HISTORY_EVERY_S)
        return front, internal
    except Exception as exc:  # fail open: the program answers the port itself
        exposition.reuse = True
        if internal is not None:
            internal.close()
        rt.warn_once("metrics-front", f"gpuprobe: the /metrics front process could not start ({exc}); the "
                                      "program answers scrapes itself (serve(in_process=True) says so quietly)")
        return None, None


def _forget_after_fork() -> None:
    """In a forked child: the endpoints' threads do not exist here; close the inherited listening
    sockets (the parent keeps serving on them) and forget them, so the child can serve anew."""
    global _lock
    _lock = threading.Lock()
    for endpoint in list(_servers.values()):
        endpoint.forget_in_child()
    _servers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
