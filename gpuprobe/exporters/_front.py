"""The front process: a small process of its own that answers /metrics scrapes, so that scrapes cost the
program being measured nothing but one rendering per ``collect_interval``.

Why: a server inside the program shares the interpreter lock with the program's generating threads. Each
socket call of a server thread releases the lock and takes it back, and the generating thread waits for
it: measured on the two-core development machine with a tiny model generating in a loop, 50 scrapes a
second of an in-process server that answers from a cached body took 1.16 ms of the program's time a
scrape (its generating thread off CPU, and the server threads' CPU), for 0.71 ms of the server's own CPU;
answered by this process, 0.27 ms (the renderings, twice a second), and the generating thread kept 99 %
of its time on CPU (benchmarks/RESULTS-metrics.md). No Python run in the program can avoid the
hand-overs; a process of its own does.

How: :func:`~gpuprobe.exporters.prometheus.serve` binds the port in the program (so that a port in use is
the same clear error), then starts ``python -I`` on :func:`main` of this module (the folder holding this
gpuprobe first on its path) with the listening socket.
The front is the same :class:`~._http.HttpServer` (same :class:`~._http.Limits`: threads, read timeout,
connections, rate, CPU share), in front of a second one that the program serves on a loopback port of
its own (the *upstream*):

- a scrape (:func:`~._http.is_scrape`: GET or HEAD, no query that changes the body) is answered from
  the front's copy of the body, fetched from
  the upstream at most once per ``collect_interval`` for each format asked (the text format or
  OpenMetrics) and compressed there for a scraper that asks for gzip;
- the live page's files are answered by the front from bytes read once;
- ``/requests`` (the live requests table) is answered from the front's copy, fetched from the upstream at
  most once per ``collect_interval``, like a scrape;
- the live page's history (:class:`~._page.History`) is kept here: every ``HISTORY_EVERY_S`` seconds the
  front adds the newest body it holds, or fetches one if it holds none that recent, so the history costs
  the program at most one rendering per period, none while something scrapes more often;
- every other request (on-demand captures, queries of some series) is forwarded to the upstream as it
  came, its ``Host`` included, and its answer sent back as it came, at most
  :attr:`~._http.Limits.cpu_share` of the time (:class:`_Pace`: the time the program takes to answer
  them, over time); past it, ``503`` with ``Retry-After``, so that a flood of them costs the program
  no more than the same flood would cost a server in the program.

The program talks to the front over a pipe: a line ``stats`` is answered with one JSON line of the
front's counts (:meth:`Front.stats`), and the end of the pipe (the program closed it or ended) stops the
front. If the front cannot start or ends by itself, the program serves on the same socket in-process, as
before, and says so once (:mod:`gpuprobe.exporters.prometheus`).
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import math
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from . import _page
from ._http import Access, HttpServer, Limits, Rendered, is_scrape, response

__all__ = ["Front", "available"]

_READY = b"ready\n"
_START_TIMEOUT = 10.0  # seconds for the front to say it serves (a cold interpreter on a busy machine)
_STATS_TIMEOUT = 2.0
_UPSTREAM_TIMEOUT = 600.0  # an on-demand capture's answer waits for its steps
_MAX_FORWARDED_BODY = 1 << 20  # bytes of a request body the front forwards (captures send a few bytes)
# Not forwarded. Host is: the program's server checks it as the front did (the endpoint's access).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade", "content-length"}


def available() -> bool:
    """Whether this platform can hand a listening socket to another process (POSIX)."""
    return os.name == "posix" and bool(sys.executable)


class Front:
    """The front process of one endpoint, seen from the program.

    Args:
        listener: the bound public socket (listening already); the front answers on it.
        upstream_port: the loopback port of the program's own server.
        limits: the front's bounds.
        interval: seconds a body is reused (the ``collect_interval`` setting).
        capture_path: the on-demand capture endpoint's path (never cached).
        access: whom the front answers (the endpoint's :class:`~._http.Access`).
        history_every: seconds between two scrapes the live page's history keeps.

    Raises:
        OSError: the front could not start or did not say it serves within ``_START_TIMEOUT`` seconds
            (it is stopped then).
    """

    def __init__(self, listener: socket.socket, upstream_port: int, limits: Limits, interval: float,
                 capture_path: str, access: Access | None = None, history_every: float = 5.0) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # -I: no PYTHONPATH, no user site, no current folder, so no sitecustomize of `gpuprobe run` starts
        # gpuprobe again in the front; the folder holding this gpuprobe goes first on its path instead.
        code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
                "from gpuprobe.exporters._front import main; main(sys.argv[1:])")
        fd = listener.fileno()
        args = [sys.executable, "-I", "-c", code, root, "--fd", str(fd), "--upstream", str(upstream_port),
                "--interval", repr(float(interval)), "--capture-path", capture_path,
                "--history-every", repr(float(history_every)),
                "--limits", json.dumps(dataclasses.asdict(limits))]
        if access is not None:
            args += ["--access", json.dumps({"hosts": sorted(access.hosts), "any_address": access.any_address,
                                             "any_host": access.any_host})]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, pass_fds=(fd,), env=env, close_fds=True,
                                      start_new_session=True)
        self._lock = threading.Lock()
        self._pending = b""
        self._closing = False
        self.pid = self._proc.pid
        self._parent = os.getpid()  # only this process stops the front: never a forked child
        line = self._line(_START_TIMEOUT)
        if line != _READY:
            self._stop()
            raise OSError(f"the /metrics front process did not start (it said {line!r}, "
                          f"exit status {self._proc.poll()})")

    def _line(self, timeout: float) -> bytes:
        """The front's next line on its stdout ('' at its end or after ``timeout``)."""
        out = self._proc.stdout
        assert out is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                return b""
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                return b""
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line + b"\n"

    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait_for_end(self) -> int:
        """Block until the front ends (on a thread of its own: ``waitpid`` holds no lock)."""
        status = self._proc.wait()
        # A program that ignores SIGCHLD has its children reaped for it: wait() returns at once then, and
        # whether the front still runs is for the process table to say.
        while not self._closing and _exists(self.pid):
            time.sleep(0.5)
        return status

    def stats(self) -> dict[str, int] | None:
        """The front's counts (``threads``, ``answered``, ``refused``, ...), or None if it does not answer."""
        with self._lock:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(b"stats\n")
                self._proc.stdin.flush()
            except (OSError, ValueError):
                return None
            line = self._line(_STATS_TIMEOUT)
        try:
            found = json.loads(line)
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def close(self) -> None:
        """Stop the front and wait for it (the port is free after)."""
        self._closing = True
        self._stop()

    @property
    def closing(self) -> bool:
        return self._closing

    def _stop(self) -> None:
        if os.getpid() != self._parent:  # a forked child's copy: the front is the parent's
            self.forget_in_child()
            return
        for pipe in (self._proc.stdin, self._proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        try:
            self._proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            try:
                self._proc.wait(2.0)
            except subprocess.TimeoutExpired:
                pass

    def forget_in_child(self) -> None:
        """In a forked child: close the child's copies of the pipes (the parent's front serves on)."""
        self._closing = True
        for pipe in (self._proc.stdin, self._proc.stdout):
            try:
                if pipe is not None:
                    os.close(pipe.fileno())
            except (OSError, ValueError):
                pass


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:  # ended but not yet reaped
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


# -- the front process itself ------------------------------------------------------------------------

class _Scrape:
    """A request the front answers from a copy: of ``path`` (/metrics, or /requests) in the format ``accept``."""

    __slots__ = ("path", "accept", "gzip", "head")

    def __init__(self, path: str, accept: str, gzipped: bool, head: bool) -> None:
        self.path = path
        self.accept = accept
        self.gzip = gzipped
        self.head = head


def _gzip_accepted(header: str) -> bool:
    """Whether an Accept-Encoding header accepts gzip (as prometheus_client reads it)."""
    return any(part.split(";")[0].strip().lower() == "gzip" for part in header.split(","))


class _Copies:
    """The front's :class:`~._http.Site`: bodies fetched from the upstream at most once per interval (the
    metrics in each format asked for, and the requests table), and the page's history."""

    def __init__(self, upstream: int, interval: float, capture_path: str,
                 page: Callable[[str, str, Mapping[str, str]], Any], history: _page.History | None = None) -> None:
        self._upstream = upstream
        self._interval = interval
        self._capture_path = capture_path
        self._page_route = page
        self.history = history  # the page's history, answered here
        self._lock = threading.Lock()
        self._copies: dict[tuple[str, str], Rendered] = {}  # by (path, Accept header)
        self.fetches = 0

    def route(self, method: str, target: str, headers: Mapping[str, str]) -> Any:
        page = self._page_route(method, target, headers)
        if page is not None:
            return page.head if method == "HEAD" else page.full
        wanted = _page.history_request(method, target, headers)
        if wanted is not None and self.history is not None:
            return wanted
        if method in ("GET", "HEAD") and target.split("?", 1)[0] == _page.REQUESTS_PATH:
            return _Scrape(_page.REQUESTS_PATH, "", _gzip_accepted(headers.get("accept-encoding", "")),
                           method == "HEAD")
        if not is_scrape(method, target, self._capture_path):
            return None
        return _Scrape("/metrics", headers.get("accept", ""), _gzip_accepted(headers.get("accept-encoding", "")),
                       method == "HEAD")

    def _fresh(self, copy: Rendered | None, now: float) -> bool:
        return copy is not None and now - copy.at < self._interval

    def ready(self, job: Any) -> bytes | None:
        if isinstance(job, bytes):
            return job
        if not isinstance(job, _Scrape):  # the history's
            return self.history.ready(job)  # type: ignore[no-any-return]
        copy = self._copies.get((job.path, job.accept))
        if not self._fresh(copy, time.monotonic()):
            return None
        return copy.responses.get((job.gzip, job.head))  # type: ignore[union-attr]

    def answer(self, job: Any) -> bytes:
        if isinstance(job, bytes):
            return job
        if not isinstance(job, _Scrape):
            return self.history.answer(job)  # type: ignore[no-any-return]
        with self._lock:
            copy = self._copy(job.path, job.accept, time.monotonic())
            if not isinstance(copy, Rendered):
                return copy
            return copy.get(job.gzip, job.head)

    def _copy(self, path: str, accept: str, now: float) -> Rendered | bytes:
        """The fresh copy of ``path`` in ``accept``'s format, fetched now if stale; the upstream's answer
        when it is not a 200 (the caller holds the lock)."""
        key = (path, accept)
        copy = self._copies.get(key)
        if not self._fresh(copy, now):
            status, content_type, body = self._fetch(path, accept)
            if status != 200:
                return response(f"{status} {http.client.responses.get(status, 'Error')}", body,
                                (("Content-Type", content_type),))
            copy = Rendered(now, content_type, body, () if path == "/metrics" else _page.JSON_HEADERS)
            # Scrapers send one or two Accept headers; /requests has one copy whatever the headers.
            if key in self._copies or len(self._copies) < 16 or path != "/metrics":
                self._copies[key] = copy
        assert copy is not None
        return copy

    def recent_body(self, max_age: float) -> bytes | None:
        """A /metrics body fetched at most ``max_age`` seconds ago: the newest copy if it is that recent, else
        one fetched now in the page's format (for the history; None if the program did not answer)."""
        now = time.monotonic()
        newest = max((c for (path, _), c in list(self._copies.items()) if path == "/metrics"),
                     key=lambda c: c.at, default=None)
        if newest is not None and now - newest.at < max_age:
            return newest.body
        with self._lock:
            copy = self._copy("/metrics", _page.PAGE_ACCEPT, now)
        return copy.body if isinstance(copy, Rendered) else None

    def _fetch(self, path: str, accept: str) -> tuple[int, str, bytes]:
        self.fetches += 1
        conn = http.client.HTTPConnection("127.0.0.1", self._upstream, timeout=_UPSTREAM_TIMEOUT)
        try:
            conn.request("GET", path, headers={"Accept": accept, "Accept-Encoding": "identity"})
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type", "text/plain"), resp.read()
        finally:
            conn.close()


class _Pace:
    """What the program may spend answering forwarded requests: the wall time each took, at most ``share``
    of the time (a credit that grows at ``share`` a second, up to ``burst`` seconds, and shrinks by each
    request's time). Wall time is an upper bound of the program's CPU for them, so the program's time stays
    within the share however many requests come."""

    def __init__(self, share: float, burst: float = 0.05) -> None:
        self._share = share
        self._burst = burst
        self._credit = burst
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self.refused = 0

    def wait(self) -> float:
        """0 when a request may go now, else the seconds until one may (and the request is refused)."""
        with self._lock:
            now = time.monotonic()
            self._credit = min(self._burst, self._credit + self._share * (now - self._last))
            self._last = now
            if self._credit >= 0:
                return 0.0
            self.refused += 1
            return -self._credit / self._share

    def spent(self, seconds: float) -> None:
        with self._lock:
            self._credit -= seconds


def _forwarder(upstream: int, pace: _Pace) -> Callable[..., Any]:
    """The front's WSGI application: the request to the upstream as it came, its answer back as it came
    (within ``pace``)."""
    from urllib.parse import quote

    def forward(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        wait = pace.wait()
        if wait > 0:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8"),
                                                       ("Retry-After", str(max(1, math.ceil(wait))))])
            return [b"gpuprobe: the program answers few such requests a second; retry later\n"]
        path = quote(environ.get("PATH_INFO", "/"), safe="/;=,:@!$&'()*+~", encoding="latin-1")
        if environ.get("QUERY_STRING"):
            path += "?" + environ["QUERY_STRING"]
        headers = {key[5:].replace("_", "-").title(): value for key, value in environ.items()
                   if key.startswith("HTTP_") and key[5:].replace("_", "-").lower() not in _HOP_BY_HOP}
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_FORWARDED_BODY:
            start_response("413 Content Too Large", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"gpuprobe: the request body is too large\n"]
        body = environ["wsgi.input"].read(length) if length else None
        conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=_UPSTREAM_TIMEOUT)
        started = time.monotonic()
        try:
            conn.request(environ.get("REQUEST_METHOD", "GET"), path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            start_response(f"{resp.status} {resp.reason}", [*kept, ("Content-Length", str(len(data)))])
            return [data]
        except (OSError, http.client.HTTPException):
            start_response("502 Bad Gateway", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"gpuprobe: the program did not answer\n"]
        finally:
            conn.close()
            pace.spent(time.monotonic() - started)

    return forward


def main(argv: list[str]) -> None:
    """The front: serve until stdin ends (run by :class:`Front`, not by hand)."""
    parser = argparse.ArgumentParser(prog="gpuprobe-metrics-front")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--capture-path", required=True)
    parser.add_argument("--limits", required=True)
    parser.add_argument("--access", default=None)
    parser.add_argument("--history-every", type=float, default=5.0)
    args = parser.parse_args(argv)
    listener = socket.socket(fileno=args.fd)
    history = _page.History(every=args.history_every)
    copies = _Copies(args.upstream, args.interval, args.capture_path, _page.route, history)
    errors: list[BaseException] = []
    access = None
    if args.access is not None:
        given = json.loads(args.access)
        access = Access(frozenset(given["hosts"]), any_address=given["any_address"], any_host=given["any_host"])
    limits = Limits(**json.loads(args.limits))
    pace = _Pace(limits.cpu_share)
    server = HttpServer(listener, copies, _forwarder(args.upstream, pace), limits,
                        lambda exc: errors.append(exc) if len(errors) < 100 else None, access)
    sampler = _page.HistorySampler(history, copies.recent_body)
    out = sys.stdout.buffer
    out.write(_READY)
    out.flush()
    for line in sys.stdin.buffer:  # until the program closes the pipe or ends
        if line.strip() == b"stats":
            out.write(json.dumps({"threads": server.threads(), "fetches": copies.fetches, "errors": len(errors),
                                  **server.counts, "paced": pace.refused, "history": len(history),
                                  "history_bytes": history.bytes}).encode() + b"\n")
            out.flush()
    sampler.close()
    server.close()


if __name__ == "__main__":  # pragma: no cover - started by Front
    main(sys.argv[1:])
