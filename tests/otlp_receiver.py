"""Real OTLP/HTTP endpoints for the tests: a receiver that decodes what it is sent, and a slow-drip server.

:class:`Receiver` is an ``http.server`` on 127.0.0.1 that decodes every request with opentelemetry-proto
(``ExportMetricsServiceRequest``), as an OpenTelemetry Collector's OTLP/HTTP receiver does, and answers
as told. :class:`DripServer` reads a request whole and answers one byte at a time, the endpoint whose
per-read timeouts never fire. Run as a script, ``python otlp_receiver.py PORT OUT_DIR`` receives on
``PORT`` and writes each request's body to ``OUT_DIR/<n>.pb`` until it is stopped.
"""

from __future__ import annotations

import gzip
import http.server
import socket
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = ["Receiver", "DripServer", "attrs", "decode"]


def attrs(kvs: Any) -> dict[str, str]:
    """OTLP key-values as a dict of their string values."""
    return {kv.key: kv.value.string_value for kv in kvs}


def decode(body: bytes, signal: str = "metrics") -> Any:
    req = ExportTraceServiceRequest() if signal == "traces" else ExportMetricsServiceRequest()
    req.ParseFromString(body)
    return req


class Receiver:
    """An OTLP/HTTP metrics receiver on 127.0.0.1.

    Args:
        mode: ``ok`` (200), ``error`` (500) or ``slow`` (200 after 3 s).
        port: the port (0: any free one).
        statuses: answers to give first, in order (e.g. ``[503]``), before ``mode`` applies.
        out_dir: also write each request's body there, as ``<n>.pb``.
        signal: ``metrics`` (``ExportMetricsServiceRequest`` at /v1/metrics) or ``traces``
            (``ExportTraceServiceRequest`` at /v1/traces).
    """

    def __init__(self, mode: str = "ok", *, port: int = 0, statuses: list[int] | None = None,
                 out_dir: Path | None = None, signal: str = "metrics") -> None:
        self.mode = mode
        self.signal = signal
        self.statuses = list(statuses or [])
        self.requests: list[ExportMetricsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self.answered: list[int] = []
        self.out_dir = out_dir
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                status = outer.statuses.pop(0) if outer.statuses else (500 if outer.mode == "error" else 200)
                if outer.mode == "slow":
                    time.sleep(3)
                if status == 200:
                    outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                    outer.requests.append(decode(body, outer.signal))
                    if outer.out_dir is not None:
                        (outer.out_dir / f"{len(outer.requests):04d}.pb").write_bytes(body)
                outer.answered.append(status)
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/{signal}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def spans(self) -> list[tuple[Any, Any]]:
        """Every span received, with its resource: ``(span, resource)`` (traces)."""
        return [(span, rs.resource) for req in self.requests for rs in req.resource_spans for ss in rs.scope_spans
                for span in ss.spans]

    def metrics(self) -> dict[str, Any]:
        """Metric name → (the metric of the newest request that has it, its resource)."""
        out = {}
        for req in self.requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out[m.name] = (m, rm.resource)
        return out


class DripServer:
    """Reads each request whole, then answers one byte every ``gap`` seconds: ``200 OK`` and a header
    line that never ends, so no read ever waits longer than ``gap`` and the answer is never complete.

    ``cut_after`` gets, per connection, the seconds from the request's last byte to the moment the
    client closed the connection (None while it is open).
    """

    START = b"HTTP/1.1 200 OK\r\nX-Drip: "

    def __init__(self, gap: float = 0.05) -> None:
        self.gap = gap
        self.cut_after: list[float | None] = []
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1/metrics"
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        index = len(self.cut_after)
        self.cut_after.append(None)
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            start = time.monotonic()
            conn.settimeout(self.gap)
            sent = 0
            while not self._closed.is_set():
                byte = self.START[sent:sent + 1] or b"a"
                sent += 1
                try:
                    conn.send(byte)
                    if conn.recv(1) == b"":  # the client closed its side
                        raise ConnectionResetError
                except socket.timeout:
                    continue  # nothing to read: the client is still waiting; the next byte
                except OSError:
                    self.cut_after[index] = time.monotonic() - start
                    return

    def close(self) -> None:
        self._closed.set()
        self._sock.close()


def main(argv: list[str]) -> int:
    port, out_dir = int(argv[0]), Path(argv[1])
    receiver = Receiver(port=port, out_dir=out_dir)
    (out_dir / "ready").write_text(receiver.url)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
