"""The HTTP server behind /metrics: bounded in threads, connections, time and CPU, so that scrapes, however
many and however slow, cost the program it runs in little and never pin it down.

It runs inside the program being measured, whose threads share one interpreter lock with it: every
microsecond of Python the server runs is a microsecond a generating thread may wait. Hence its shape:

- One thread (``gpuprobe-metrics``) accepts connections and reads requests without blocking. A
  half-sent request holds no thread: it is cut when :attr:`Limits.read_timeout` has passed since its
  connection was accepted, and past :attr:`Limits.connections` open at once the oldest connection still
  sending its request is cut.
- A request whose response the :class:`Site` has at hand (a cached /metrics body) is answered by that
  thread at once, from bytes prepared beforehand. Why: the standard library's ``wsgiref`` server takes
  0.5–0.9 ms of CPU per request before any rendering (a thread started, headers parsed by ``email``, a
  WSGI environ), this path about 0.2 ms, the kernel's TCP work included (measured side by side on the
  two-core development machine, CPython 3.11).
- Everything else (rendering a body, the WSGI application: on-demand captures, queries) goes to at most
  :attr:`Limits.threads` worker threads; a request that finds :attr:`Limits.waiting` others already
  waiting for them is answered ``503`` with ``Retry-After`` at once.
- The server accepts at most :attr:`Limits.rate` connections a second, and its threads use at most
  :attr:`Limits.cpu_share` of one core over time: past either, new connections wait in the kernel's
  listen queue, so a flood of scrapers takes a bounded share of the interpreter from the program. Why
  both: what a request costs the program is mostly not the server's CPU time but the interpreter lock
  changing hands, four or five times a request (each socket call releases it); a loaded two-core
  machine measured about 1 ms of the generating thread's time a request for 0.13 ms of the server's.
- The listen backlog is :attr:`Limits.backlog` (Linux caps it at ``net.core.somaxconn``), so a burst of
  connections waits in the kernel instead of being dropped into TCP retransmits (a second or more each).

- A request is read whole by the I/O thread, its body included (at most :data:`MAX_BODY` bytes),
  within the one deadline of :attr:`Limits.read_timeout`: a client that drips its body holds no worker.
  Workers never touch a socket: what they answer goes back to the I/O thread, which sends it as the
  client takes it, within the same timeout. A request that waited :attr:`Limits.read_timeout` for a
  worker is answered ``503`` instead of being served late.
- :class:`Access` says whom the server answers: a ``Host`` the endpoint is known by (a page of another
  site reaching the port through DNS rebinding names its own), and, for requests that act (any method
  but GET, HEAD and OPTIONS), no other site's ``Origin`` or ``Sec-Fetch-Site``. Refused: ``403``.

Each response closes its connection (``Connection: close``), as prometheus_client's own server does.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import io
import ipaddress
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler

from ..errors import ConfigError

__all__ = ["Access", "Limits", "Site", "HttpServer", "Rendered", "response", "is_scrape", "MAX_BODY"]

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 16384  # bytes of request line and headers; past it: 431
MAX_BODY = 65536
"""Bytes of a request body the server reads (a capture request sends a few); past it: 413."""
_ACCEPTS_PER_ROUND = 64  # connections accepted before the others get a turn
_BURST = 0.05  # CPU seconds the server may spend at once before the share applies
_IDLE_WAIT = 0.25  # longest select() wait: deadlines are checked at least this often


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much the /metrics server may take from the program it runs in.

    Attributes:
        threads: worker threads that render bodies and answer requests other than a cached scrape.
        waiting: complete requests that may wait for a worker; past it a request gets 503 at once.
        connections: connections open at once while they send their request; past it the oldest one is cut.
        read_timeout: seconds a connection has to send its whole request, and a worker to send a response.
        backlog: the listen backlog (connections the kernel holds before they are accepted).
        rate: connections accepted a second at most, over time (a burst of half that is taken at once).
        cpu_share: the fraction of one core the server's threads may use over time (0 < share <= 1).

    Example:
        >>> Limits(threads=4).threads
        4
    """

    threads: int = 2
    waiting: int = 64
    connections: int = 256
    read_timeout: float = 5.0
    backlog: int = 1024
    rate: float = 100.0
    cpu_share: float = 0.1

    def __post_init__(self) -> None:
        for name in ("threads", "waiting", "connections", "backlog"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Limits.{name} must be a whole number of at least 1, got {value!r}")
        for name, most in (("read_timeout", None), ("rate", None), ("cpu_share", 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf") or (
                    most is not None and value > most):
                bound = f"a number above 0 and at most {most}" if most else "a finite number above 0"
                raise ConfigError(f"Limits.{name} must be {bound}, got {value!r}")


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SAME_SITE = frozenset({"same-origin", "none"})  # Sec-Fetch-Site values of a request a page of this site, or a person, made


@dataclasses.dataclass(frozen=True)
class Access:
    """Whom the server answers.

    A request is refused (``403``) when its ``Host`` header names a host the endpoint is not known by
    (what a page of another site sends after rebinding its own DNS name to this address), or, for a
    request that acts (a method other than GET, HEAD and OPTIONS), when it comes from another site:
    an ``Origin`` other than the endpoint's own, or a ``Sec-Fetch-Site`` other than ``same-origin`` and
    ``none``. A request without a ``Host`` (HTTP/1.0 tools) is answered; a browser always sends one.

    Attributes:
        hosts: lower-case names (and IP addresses) a ``Host`` header may carry, besides ``localhost``,
            names under ``.localhost`` and loopback addresses, which are always answered.
        any_address: any IP address in ``Host`` is answered (the server binds every address).
        any_host: every ``Host`` is answered (``*`` among the allowed hosts: behind a proxy that checks).

    Example:
        >>> Access.for_address("127.0.0.1").allows_host("localhost:9464")
        True
        >>> Access.for_address("127.0.0.1").allows_host("attacker.example:9464")
        False
    """

    hosts: frozenset[str] = frozenset()
    any_address: bool = False
    any_host: bool = False

    @classmethod
    def for_address(cls, addr: str, extra: tuple[str, ...] = ()) -> Access:
        """The access of a server bound to ``addr``: its own address, its machine's name, and ``extra``
        (the ``allowed_hosts`` setting; ``*`` answers every host)."""
        import socket as _socket

        names = {_host_name(h) for h in extra if h.strip() and h.strip() != "*"}
        wildcard = addr.strip("[]") in ("0.0.0.0", "::", "")
        names.add(_host_name(addr))
        if not _is_loopback_name(addr):
            try:  # a non-loopback bind is reached by the machine's name too
                names.add(_host_name(_socket.gethostname()))
            except OSError:
                pass
        names.discard("")
        return cls(frozenset(names), any_address=wildcard, any_host=any(h.strip() == "*" for h in extra))

    def allows_host(self, header: str) -> bool:
        """Whether a request with this ``Host`` header is answered."""
        if self.any_host:
            return True
        name = _host_name(_split_host(header)[0])
        if name in self.hosts or _is_loopback_name(name):
            return True
        return self.any_address and _is_address(name)

    def refusal(self, method: str, headers: Mapping[str, str]) -> str | None:
        """Why a request is refused, or None when it is answered (``headers`` with lower-case names)."""
        host = headers.get("host")
        if host is not None and not self.allows_host(host):
            shown = _shown(host)
            return (f"this server does not answer for Host {shown}: it is known as localhost and its own address; "
                    "name other hosts with GPUPROBE_ALLOWED_HOSTS")
        if method in _SAFE_METHODS:
            return None
        site = headers.get("sec-fetch-site")
        if site is not None and site.strip().lower() not in _SAME_SITE:
            return f"a {method} from another site (Sec-Fetch-Site: {_shown(site)}) is refused"
        origin = headers.get("origin")
        if origin is not None and (host is None or not _same_origin(origin, host)):
            return f"a {method} from another origin ({_shown(origin)}) is refused"
        return None


def _shown(value: str) -> str:
    """A header's value as a message may show it: printable ASCII, at most 80 characters, quoted."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in value[:80])
    return repr(clean + ("..." if len(value) > 80 else ""))


def _split_host(value: str) -> tuple[str, str]:
    """``host:port`` (or ``[v6]:port``) → (host, port); the port is '' when absent."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, ""
        rest = value[end + 1:]
        return value[1:end], rest[1:] if rest.startswith(":") else ""
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host, port
    return value, ""


def _host_name(value: str) -> str:
    return value.strip().strip("[]").rstrip(".").lower()


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _is_loopback_name(name: str) -> bool:
    name = _host_name(name)
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: always the loopback interface
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _same_origin(origin: str, host: str) -> bool:
    """Whether ``Origin: http://h:p`` names the same host and port as ``Host: h:p``."""
    scheme, sep, rest = origin.strip().partition("://")
    if not sep or scheme.lower() not in ("http", "https") or "/" in rest:
        return False
    default = "443" if scheme.lower() == "https" else "80"
    o_host, o_port = _split_host(rest)
    h_host, h_port = _split_host(host)
    return _host_name(o_host) == _host_name(h_host) and (o_port or default) == (h_port or "80")


class Site(Protocol):
    """What the server asks of the application it serves fast (the /metrics exposition)."""

    def route(self, method: str, target: str, headers: Mapping[str, str]) -> Any:
        """On the I/O thread: a job for :meth:`ready`/:meth:`answer`, or None to hand the request to
        the WSGI application. ``headers`` has lower-case names."""

    def ready(self, job: Any) -> bytes | None:
        """On the I/O thread, without blocking: the whole response when it is at hand, else None."""

    def answer(self, job: Any) -> bytes:
        """On a worker thread: the whole response."""


def is_scrape(method: str, target: str, capture_path: str) -> bool:
    """Whether a request is a plain scrape, answered from the cached body: GET or HEAD of any path but the
    capture endpoint's, with no query or one that does not change the body. prometheus_client's own
    application reads only ``name[]`` from a query (a subset of the series), so any other query is the
    same scrape, and a flood of queries costs one rendering per interval like any other scrape.

    Example:
        >>> is_scrape("GET", "/metrics?cache-buster=1", "/gpuprobe/profile"), is_scrape("GET", "/metrics?name[]=x", "")
        (True, False)
    """
    if method not in ("GET", "HEAD"):
        return False
    path, _, query = target.partition("?")
    if path.rstrip("/") in (capture_path, "/favicon.ico"):
        return False
    return not query or "name[]" not in parse_qs(query)


def response(status: str, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole HTTP/1.1 response that closes its connection.

    Example:
        >>> response("503 Service Unavailable", b"busy").split(b"\\r\\n")[0]
        b'HTTP/1.1 503 Service Unavailable'
    """
    head = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers), f"Content-Length: {len(body)}",
            "Connection: close", "", ""]
    return "\r\n".join(head).encode("latin-1") + body


class Rendered:
    """One rendering of a /metrics body in one format (or of another cached answer: ``/requests``), and the
    whole responses made of it (plain or gzip, GET or HEAD), with ``headers`` besides its content type."""

    __slots__ = ("at", "content_type", "body", "responses", "headers")

    def __init__(self, at: float, content_type: str, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.at = at
        self.content_type = content_type
        self.body = body
        self.headers = headers
        self.responses: dict[tuple[bool, bool], bytes] = {}  # (gzip, head only) -> whole response
        self._add(False, body)

    def _add(self, gzipped: bool, body: bytes) -> None:
        headers = ((("Content-Type", self.content_type), *self.headers)
                   + ((("Content-Encoding", "gzip"),) if gzipped else ()))
        whole = response("200 OK", body, headers)
        self.responses[(gzipped, False)] = whole
        self.responses[(gzipped, True)] = whole[: len(whole) - len(body)]

    def get(self, gzipped: bool, head: bool) -> bytes:
        """The response (compressed now if it was not yet: once per rendering; the caller holds the lock)."""
        found = self.responses.get((gzipped, head))
        if found is None:
            # Level 6: a third of level 9's time for a body a few percent larger; zlib releases the GIL.
            self._add(True, gzip.compress(self.body, compresslevel=6))
            found = self.responses[(gzipped, head)]
        return found


def _plain(status: str, text: str, *extra: tuple[str, str]) -> bytes:
    return response(status, text.encode(), (("Content-Type", "text/plain; charset=utf-8"), *extra))


_BAD_REQUEST = _plain("400 Bad Request", "gpuprobe: a malformed HTTP request\n")
_TIMEOUT = _plain("408 Request Timeout", "gpuprobe: the request was not sent in time\n")
_TOO_LARGE = _plain("431 Request Header Fields Too Large", "gpuprobe: the request head is too large\n")
_BUSY = _plain("503 Service Unavailable", "gpuprobe: the metrics server is busy; retry in a second\n",
               ("Retry-After", "1"))
_FAILED = _plain("500 Internal Server Error", "gpuprobe: the metrics could not be rendered\n")
_BODY_TOO_LARGE = _plain("413 Content Too Large", f"gpuprobe: a request body is at most {MAX_BODY} bytes\n")
_NO_LENGTH = _plain("411 Length Required", "gpuprobe: a request body needs a Content-Length\n")


def _forbidden(why: str) -> bytes:
    return _plain("403 Forbidden", f"gpuprobe: {why}\n")


class _Conn:
    """One accepted connection, on the I/O thread."""

    __slots__ = ("sock", "fd", "peer", "buf", "deadline", "out", "watched", "head", "need")

    def __init__(self, sock: socket.socket, peer: Any, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.buf = bytearray()
        self.deadline = deadline  # for the whole request, head and body; then for sending the answer
        self.out: memoryview | None = None  # what is left to send, once answering
        self.watched = False  # registered with the selector
        self.head: tuple[str, str, dict[str, str]] | None = None  # method, target, headers, once read
        self.need = 0  # bytes of the whole request (head and body), once the head is read


class _Work:
    """A whole request handed to a worker: answered by the site (``job``) or the WSGI application (None)."""

    __slots__ = ("conn", "request", "job", "expires")

    def __init__(self, conn: _Conn, request: bytes, job: Any, expires: float) -> None:
        self.conn = conn
        self.request = request
        self.job = job
        self.expires = expires  # past it, the request has waited too long: 503


class _Collected(io.BufferedIOBase):
    """What wsgiref writes, kept in memory (the I/O thread sends it)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.parts.append(bytes(b))
        return len(b)


class _WsgiRequest(WSGIRequestHandler):
    """wsgiref's handler on a whole request the I/O thread has read; its answer is kept in ``out``."""

    def __init__(self, request: bytes, peer: Any, server: HttpServer) -> None:
        self._whole = request
        self.out = _Collected()
        # Duck-typed: wsgiref reads its server's base_environ and get_app() only; the "socket" is unused.
        super().__init__(None, peer, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = None
        self.rfile = io.BytesIO(self._whole)
        self.wfile = self.out

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No access log on stderr."""


class HttpServer:
    """The server: an I/O thread, a bounded pool of workers, a CPU share (see the module docstring).

    Args:
        listener: a bound socket (listening starts here, with :attr:`Limits.backlog`).
        site: what answers scrapes fast (:class:`Site`).
        app: the WSGI application for every other request.
        limits: the bounds.
        on_error: called with an exception the server caught outside the WSGI application (never raises).
    """

    def __init__(self, listener: socket.socket, site: Site, app: Callable[..., Any], limits: Limits,
                 on_error: Callable[[BaseException], None], access: Access | None = None) -> None:
        self._listener = listener
        self._site = site
        self._app = app
        self.limits = limits
        self._on_error = on_error
        self.access = access if access is not None else Access.for_address(str(listener.getsockname()[0]))
        host, port = listener.getsockname()[:2]
        # What wsgiref's handler reads from its server (WSGIServer.setup_environ, without its DNS lookup).
        self.base_environ = {"SERVER_NAME": str(host), "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_PORT": str(port),
                             "REMOTE_HOST": "", "CONTENT_LENGTH": "", "SCRIPT_NAME": ""}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._reading: dict[int, _Conn] = {}  # in accept order, which is deadline order
        self._writing: dict[int, _Conn] = {}
        self._jobs: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()  # at most limits.waiting (_hand_over)
        # What the workers answered, for the I/O thread to send; False: a request that waited too long (503).
        self._answers: queue.SimpleQueue[tuple[_Conn, bytes, bool]] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._stopping = False
        self._spent = 0.0  # CPU seconds the workers used since the I/O thread last looked
        self._spent_lock = threading.Lock()
        self._credit = _BURST
        self._burst = max(1.0, limits.rate / 2)
        self._tokens = self._burst  # connections the server may accept now (see _pace)
        self._paused_until = 0.0
        self._listening = False
        self.counts = {"answered": 0, "refused": 0, "timed_out": 0, "evicted": 0, "malformed": 0, "forbidden": 0,
                       "expired": 0}
        listener.setblocking(False)
        listener.listen(limits.backlog)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._listen(True)
        self._thread = threading.Thread(target=self._run, name="gpuprobe-metrics", daemon=True)
        self._thread.start()

    # -- what WSGIRequestHandler asks of its server -------------------------------------------
    def get_app(self) -> Callable[..., Any]:
        """The WSGI application."""
        return self._app

    # -- the outside ------------------------------------------------------------------------------
    def threads(self) -> int:
        """Threads the server runs now (its I/O thread and the workers started so far)."""
        return int(self._thread.is_alive()) + sum(t.is_alive() for t in self._workers)

    def close(self) -> None:
        """Stop the threads, close every connection and the listening socket (the port is free after)."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(2)
        while True:  # requests still waiting are not answered: their connections close
            try:
                work = self._jobs.get_nowait()
            except queue.Empty:
                break
            if work is not None:
                _close(work.conn.sock)
        for _ in self._workers:
            self._jobs.put(None)
        for worker in self._workers:
            worker.join(0.5)
        while True:  # answers the I/O thread did not send
            try:
                conn, _, _ = self._answers.get_nowait()
            except queue.Empty:
                break
            _close(conn.sock)
        self._close_all()

    def forget_in_child(self) -> None:
        """In a forked child: no thread of this server runs here; close what the child inherited."""
        self._close_all()

    def _close_all(self) -> None:
        for conn in [*self._reading.values(), *self._writing.values()]:
            _close(conn.sock)
        self._reading.clear()
        self._writing.clear()
        for sock in (self._listener, self._wake_r, self._wake_w):
            _close(sock)
        try:
            self._sel.close()
        except (OSError, RuntimeError):
            pass

    # -- the I/O thread ------------------------------------------------------------------------
    def _run(self) -> None:
        clock, cpu = time.monotonic, time.thread_time
        last, last_cpu = clock(), cpu()
        while not self._stopping:
            try:
                events = self._sel.select(self._wait(clock()))
            except (OSError, ValueError):  # closed under us at shutdown
                return
            for key, _ in events:
                if self._stopping:
                    return
                conn = key.data
                try:
                    if conn is None:
                        self._drain_wake()
                    elif conn is self._listener:
                        self._accept(clock())
                    elif conn.out is None:
                        self._read(conn, clock())
                    else:
                        self._write(conn)
                except Exception as exc:  # a request this code did not foresee: that connection only
                    self._on_error(exc)
                    if isinstance(conn, _Conn):
                        self._drop(conn)
            now, now_cpu = clock(), cpu()
            self._expire(now)
            self._pace(now, now - last, now_cpu - last_cpu)
            last, last_cpu = now, now_cpu

    def _wait(self, now: float) -> float:
        wait = _IDLE_WAIT
        if self._reading:
            wait = min(wait, next(iter(self._reading.values())).deadline - now)
        if not self._listening:
            wait = min(wait, self._paused_until - now)
        return max(wait, 0.0)

    def _drain_wake(self) -> None:
        try:
            self._wake_r.recv(4096)
        except OSError:
            pass
        now = time.monotonic()
        while True:  # what the workers answered, sent from here as each client takes it
            try:
                conn, data, answered = self._answers.get_nowait()
            except queue.Empty:
                return
            conn.deadline = now + self.limits.read_timeout
            self.counts["answered" if answered else "expired"] += 1
            self._send(conn, data, now)

    def _listen(self, on: bool) -> None:
        if on != self._listening:
            if on:
                self._sel.register(self._listener, selectors.EVENT_READ, self._listener)
            else:
                self._sel.unregister(self._listener)
            self._listening = on

    def _pace(self, now: float, elapsed: float, own_cpu: float) -> None:
        """Keep to ``rate`` and ``cpu_share``: connections the server may accept grow with time at
        ``rate`` (up to a burst); a credit of CPU seconds grows at ``cpu_share`` (up to a small burst) and
        shrinks by what the threads used. While either is spent, the listening socket is not watched."""
        with self._spent_lock:
            spent, self._spent = self._spent, 0.0
        limits = self.limits
        self._credit = min(_BURST, self._credit + limits.cpu_share * elapsed) - spent - own_cpu
        self._tokens = min(self._burst, self._tokens + limits.rate * elapsed)
        wait = max(-self._credit / limits.cpu_share, (1 - self._tokens) / limits.rate)
        if wait > 0:
            self._paused_until = now + min(wait, 1.0)
            self._listen(False)
        elif not self._listening and now >= self._paused_until:
            self._listen(True)

    def _accept(self, now: float) -> None:
        limit = self.limits
        for _ in range(_ACCEPTS_PER_ROUND):
            if self._tokens < 1:
                return  # the rest wait in the listen queue (see _pace)
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and self._reading:
                    self._evict()  # out of descriptors: the oldest half-sent request gives its own back
                return
            self._tokens -= 1
            sock.setblocking(False)
            if len(self._reading) >= limit.connections:
                self._evict()
            conn = _Conn(sock, peer, now + limit.read_timeout)
            self._reading[conn.fd] = conn
            # The request has often arrived with the connection: read it now, and watch the connection
            # only if more is to come (two system calls fewer per scrape).
            self._read(conn, now)
            if conn.fd in self._reading and not conn.watched:
                self._sel.register(sock, selectors.EVENT_READ, conn)
                conn.watched = True

    def _evict(self) -> None:
        fd = next(iter(self._reading))
        self.counts["evicted"] += 1
        self._finish(self._reading[fd], _TIMEOUT)

    def _expire(self, now: float) -> None:
        while self._reading:
            conn = next(iter(self._reading.values()))
            if conn.deadline > now:
                break
            self.counts["timed_out"] += 1
            self._finish(conn, _TIMEOUT)
        for conn in [c for c in self._writing.values() if c.deadline <= now]:
            self.counts["timed_out"] += 1
            self._drop(conn)

    def _read(self, conn: _Conn, now: float) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
            return
        conn.buf += data
        if conn.head is None:
            end = conn.buf.find(_HEAD_END)
            if end > _MAX_HEAD or (end < 0 and len(conn.buf) > _MAX_HEAD):
                self._finish(conn, _TOO_LARGE)
                return
            if end < 0:
                return
            if not self._parse(conn, end):
                return
        if len(conn.buf) >= conn.need:  # the whole request, body included: within the one deadline
            self._request(conn, now)

    def _parse(self, conn: _Conn, end: int) -> bool:
        """Read the head; False when the connection was answered for it (malformed, refused, too large)."""
        lines = bytes(conn.buf[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self.counts["malformed"] += 1
            self._finish(conn, _BAD_REQUEST)
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self.counts["malformed"] += 1
                self._finish(conn, _BAD_REQUEST)
                return False
            key = name.strip().lower()
            headers[key] = f"{headers[key]},{value.strip()}" if key in headers else value.strip()
        why = self.access.refusal(parts[0], headers)
        if why is not None:
            self.counts["forbidden"] += 1
            self._finish(conn, _forbidden(why))
            return False
        if "transfer-encoding" in headers:
            self._finish(conn, _NO_LENGTH)
            return False
        length = headers.get("content-length", "0").strip()
        if not (length.isascii() and length.isdigit()) or len(length) > 12:
            self.counts["malformed"] += 1
            self._finish(conn, _BAD_REQUEST)
            return False
        if int(length) > MAX_BODY:
            self._finish(conn, _BODY_TOO_LARGE)
            return False
        conn.head = (parts[0], parts[1], headers)
        conn.need = end + len(_HEAD_END) + int(length)
        return True

    def _request(self, conn: _Conn, now: float) -> None:
        assert conn.head is not None
        method, target, headers = conn.head
        job = None
        if "content-length" not in headers:
            job = self._site.route(method, target, headers)
        if job is not None:
            ready = self._site.ready(job)
            if ready is not None:
                self._answer(conn, ready, now)
                return
        self._hand_over(conn, job, now)

    def _answer(self, conn: _Conn, data: bytes, now: float) -> None:
        self.counts["answered"] += 1
        self._send(conn, data, now)

    def _send(self, conn: _Conn, data: bytes, now: float) -> None:
        """Send what the socket takes now; the rest as the client takes it, by ``conn.deadline``."""
        try:
            sent = conn.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(conn)
            return
        if sent == len(data):
            self._drop(conn)
            return
        self._reading.pop(conn.fd, None)
        conn.out = memoryview(data)[sent:]
        conn.deadline = now + self.limits.read_timeout
        self._writing[conn.fd] = conn
        if conn.watched:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        else:
            self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)
            conn.watched = True

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._drop(conn)

    def _hand_over(self, conn: _Conn, job: Any, now: float) -> None:
        """Give a whole request to a worker: ``job`` for the site, or None for the WSGI application."""
        self._forget(conn)
        if self._jobs.qsize() >= self.limits.waiting:
            self.counts["refused"] += 1
            _send_and_close(conn.sock, _BUSY)
            return
        self._jobs.put(_Work(conn, bytes(conn.buf[:conn.need]), job, now + self.limits.read_timeout))
        if self._idle == 0 and len(self._workers) < self.limits.threads:
            worker = threading.Thread(target=self._work, name=f"gpuprobe-metrics-{len(self._workers) + 1}",
                                      daemon=True)
            self._workers.append(worker)
            worker.start()

    def _finish(self, conn: _Conn, data: bytes) -> None:
        """Send a short answer (as much as the socket takes now) and close."""
        self._forget(conn)
        _send_and_close(conn.sock, data)

    def _drop(self, conn: _Conn) -> None:
        self._forget(conn)
        _close(conn.sock)

    def _forget(self, conn: _Conn) -> None:
        self._reading.pop(conn.fd, None)
        self._writing.pop(conn.fd, None)
        if conn.watched:
            conn.watched = False
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass

    # -- the workers ------------------------------------------------------------------------------
    def _work(self) -> None:
        cpu = time.thread_time
        # All of the worker's CPU is charged, from one job's end to the next one's: taking a job from the
        # queue and handing its answer over cost it time too (~10 % more than the answers alone, under a
        # flood of queries: benchmarks/RESULTS-metrics-hostile.md).
        last = cpu()
        while True:
            self._idle += 1
            work = self._jobs.get()
            self._idle -= 1
            if work is None:
                return
            data, answered = _FAILED, True
            try:
                if time.monotonic() > work.expires:  # waited too long: the client has a retry, not a late answer
                    data, answered = _BUSY, False
                elif work.job is None:
                    handler = _WsgiRequest(work.request, work.conn.peer, self)
                    data = b"".join(handler.out.parts)
                else:
                    data = self._site.answer(work.job)
            except Exception as exc:  # wsgiref answers the application's own errors; this is the site's
                self._on_error(exc)
            finally:
                now_cpu = cpu()
                with self._spent_lock:
                    self._spent += now_cpu - last
                last = now_cpu
                self._answers.put((work.conn, data, answered))
                try:
                    self._wake_w.send(b"x")
                except OSError:  # the wake-up pipe is full (the I/O thread wakes anyway) or closed
                    pass


def _send_and_close(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
