"""The live page that the /metrics server also serves: ``/`` for a browser, its files under
:data:`PREFIX`.

The page (``gpuprobe/exporters/page/``: HTML, CSS, a script and uPlot, MIT, with its license) polls
``/metrics`` once a second and draws what the Grafana overview shows, computing rates and quantiles
in the browser from the counters and histogram buckets of the last N seconds of scrapes. So it costs
the program what a scrape costs (one rendering per ``collect_interval`` at most, shared with every other
scraper), and its files cost nothing more: they are read once and answered by the server's I/O thread
from bytes made beforehand, like a cached /metrics body. Nothing on the page comes from elsewhere; its
Content-Security-Policy says so to the browser too.

A request for ``/`` gets the page only when it accepts ``text/html`` (a browser); a scraper or ``curl``
gets the metrics there, as before the page existed.

Besides /metrics the page reads two answers of the same server, both JSON, both bounded:

- :data:`REQUESTS_PATH` (``/requests``): the requests running now and the most recent finished ones
  (rendered by the program at most once per ``collect_interval``, see
  :mod:`gpuprobe.exporters.prometheus`);
- :data:`HISTORY_PATH`: the page's history (:class:`History`), read once when the page opens, so that a
  page opened after the requests ran still charts them. Whoever answers the port keeps it: the front
  process (:mod:`._front`), else the program. Every :data:`HISTORY_EVERY_S` seconds it keeps the
  charted series (:data:`CHARTED`) of the newest body, one already rendered for a scraper when there is
  one that recent, else one rendered for it, for :data:`HISTORY_KEPT_S` seconds and at most
  :data:`HISTORY_BYTES` bytes.
"""

from __future__ import annotations

import gzip
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from importlib import resources

from ._http import response

__all__ = ["PREFIX", "FILES", "Static", "route", "REQUESTS_PATH", "HISTORY_PATH", "PAGE_ACCEPT", "CHARTED",
           "History", "HistoryRequest", "HistorySampler", "JSON_HEADERS", "HISTORY_EVERY_S", "HISTORY_KEPT_S",
           "HISTORY_BYTES"]

PREFIX = "/gpuprobe/page/"
"""Where the page's files are served."""

FILES = {
    "index.html": "text/html; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}
"""The page's files (package data in ``gpuprobe/exporters/page/``) and their content types."""

_HEADERS = (
    ("Cache-Control", "no-cache"),
    ("X-Content-Type-Options", "nosniff"),
    # Everything from this server, nothing from anywhere else (uPlot sets element styles: style-src).
    ("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                "connect-src 'self'; frame-ancestors 'none'"),
)


class Static:
    """A prepared answer: the whole response, and the response to a HEAD request."""

    __slots__ = ("full", "head")

    def __init__(self, full: bytes, head: bytes) -> None:
        self.full = full
        self.head = head


def _plain(status: str, text: str) -> Static:
    body = text.encode()
    full = response(status, body, (("Content-Type", "text/plain; charset=utf-8"),))
    return Static(full, full[: len(full) - len(body)])


_responses: dict[str, Static] | None = None  # by file name, made at the first request for the page
_NOT_FOUND = _plain("404 Not Found", "gpuprobe: no such file of the live page\n")


def _load() -> dict[str, Static]:
    """Every file of the page as a prepared response; a 500 naming the file for each one missing."""
    out = {}
    folder = resources.files(__package__).joinpath("page")
    for name, content_type in FILES.items():
        try:
            body = folder.joinpath(name).read_bytes()
        except OSError as exc:  # an installation without the package data: say so in the browser
            out[name] = _plain("500 Internal Server Error", f"gpuprobe: the live page's file {name} cannot be "
                               f"read from the installed package ({exc.strerror or exc}); reinstall gpuprobe\n")
            continue
        full = response("200 OK", body, (("Content-Type", content_type), *_HEADERS))
        out[name] = Static(full, full[: len(full) - len(body)])
    return out


def route(method: str, target: str, headers: Mapping[str, str]) -> Static | None:
    """The page's answer to a request, or None when the request is not the page's (a scrape, a capture).

    ``target`` is the request target (path and query); ``headers`` have lower-case names.

    Example:
        >>> route("GET", "/", {"accept": "text/html,*/*;q=0.8"}).full.startswith(b"HTTP/1.1 200 OK")
        True
        >>> route("GET", "/", {"accept": "*/*"}) is None  # curl, a scraper: the metrics
        True
    """
    global _responses
    if method not in ("GET", "HEAD"):
        return None
    path = target.split("?", 1)[0]
    if path in ("/", "/index.html"):
        if "text/html" not in headers.get("accept", ""):
            return None
        name = "index.html"
    elif path.startswith(PREFIX):
        name = path[len(PREFIX):]
    else:
        return None
    if _responses is None:
        _responses = _load()  # once: a few reads of package data, on the first visit only
    return _responses.get(name, _NOT_FOUND)


# -- what the page reads besides its files -------------------------------------------------------------

REQUESTS_PATH = "/requests"
"""The live requests table (JSON): running requests and the most recent finished ones."""

HISTORY_PATH = "/gpuprobe/history"
"""The page's history (JSON, :meth:`History.body`): recent scrapes of the series it charts."""

PAGE_ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
"""The ``Accept`` header of the page's scrapes (``ACCEPT`` in page.js): Prometheus' own, so that the page and
the history share the body a Prometheus scrape caused."""

JSON_HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'"))
"""Headers of the JSON answers besides their content type: never cached, never read as anything but JSON."""

HISTORY_EVERY_S = 5.0
"""Seconds between two scrapes the history keeps."""

HISTORY_KEPT_S = 600.0
"""Seconds of history kept (the oldest scrapes go first)."""

HISTORY_BYTES = 4 << 20
"""Bytes the history holds at most: the kept scrapes' values as JSON text and the series' names."""

_HISTORY_SERIES = 8192  # distinct series kept; a new one past it is left out of the history (charted live still)
_HISTORY_KEY = 512  # characters of a series' name and labels; a longer one is left out

CHARTED = (
    "gen_ai_client_token_usage", "gen_ai_server_request_duration_seconds",
    "gen_ai_server_time_per_output_token_seconds", "gen_ai_server_time_to_first_token_seconds",
    "gpuprobe_diffusion_", "gpuprobe_generate_active", "gpuprobe_inter_token_duration_seconds",
    "gpuprobe_kv_cache_memory_bytes", "gpuprobe_kv_cache_sequence_length", "gpuprobe_kv_cache_usage_ratio",
    "gpuprobe_memory_", "gpuprobe_gpu_", "gpuprobe_probe_duration_seconds", "gpuprobe_request_queue_duration_seconds",
    "gpuprobe_requests_running", "gpuprobe_requests_waiting", "gpuprobe_speculative_accepted_tokens",
    "gpuprobe_speculative_draft_tokens", "gpuprobe_step_component_duration_seconds", "gpuprobe_step_duration_seconds",
    "gpuprobe_step_batch_size_count",
)
"""Beginnings of the sample names the page charts (a test keeps this in step with page.js): the history
keeps these series only."""


class HistoryRequest:
    """A request for the history: gzip or not, HEAD or GET."""

    __slots__ = ("gzip", "head")

    def __init__(self, gzipped: bool, head: bool) -> None:
        self.gzip = gzipped
        self.head = head


def history_request(method: str, target: str, headers: Mapping[str, str]) -> HistoryRequest | None:
    """A :class:`HistoryRequest` when the request asks for the history (GET or HEAD of :data:`HISTORY_PATH`)."""
    if method not in ("GET", "HEAD") or target.split("?", 1)[0] != HISTORY_PATH:
        return None
    encodings = headers.get("accept-encoding", "")
    return HistoryRequest(any(part.split(";")[0].strip().lower() == "gzip" for part in encodings.split(",")),
                          method == "HEAD")


def _key_end(line: str) -> int:
    """Where a sample line's series key (its name and labels) ends, -1 if it is not one: the labels are read
    quote by quote, so neither a ``}`` inside a value nor an OpenMetrics exemplar after the value
    (`` # {...} v t``) ends it (page.js's ``keyEnd``, the same reading).

    Example:
        >>> line = 'a_bucket{le="1",m="x} y"} 2.0 # {span_id="b7",trace_id="0a"} 0.5 1.7e9'
        >>> line[:_key_end(line)]
        'a_bucket{le="1",m="x} y"}'
    """
    space = line.find(" ")
    brace = line.find("{")
    if brace < 0 or 0 <= space < brace:
        return space
    quoted = False
    i = brace + 1
    while i < len(line):
        c = line[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "}":
            return i + 1 if line[i + 1:i + 2] == " " else -1
        i += 1
    return -1


def _number(value: float) -> str:
    return repr(value) if math.isfinite(value) else "null"


class History:
    """Recent scrapes of the series the page charts, kept for a page opened later (bounded in bytes).

    Each scrape kept is its time and the values of the charted series (:data:`CHARTED`) as one JSON array,
    in the order the series were first seen (``null`` where a series is absent), so that the answer is
    joined from pieces made once. The names of the series are kept once. Bounded: at most ``seconds`` of
    scrapes, ``budget`` bytes of arrays and names together (the oldest scrapes go first), 8,192 series
    of at most 512 characters each (others are left out of the history).

    Args:
        every: seconds between two scrapes kept (the sampler's period, said in the answer).
        seconds: how long a scrape is kept.
        budget: bytes kept at most.

    Example:
        >>> h = History()
        >>> h.add(1000.0, b'gpuprobe_requests_running{model="m"} 2.0\\ngpuprobe_build_info 1.0\\n')
        >>> import json
        >>> got = json.loads(h.body())
        >>> got["series"], got["scrapes"]
        (['gpuprobe_requests_running{model="m"}'], [{'t': 1000.0, 'values': [2.0]}])
    """

    def __init__(self, every: float = HISTORY_EVERY_S, seconds: float = HISTORY_KEPT_S,
                 budget: int = HISTORY_BYTES) -> None:
        self.every = every
        self.seconds = seconds
        self.budget = budget
        self._index: dict[str, int] = {}
        self._names: list[str] = []
        self._names_bytes = 0
        self._names_json: str | None = None
        self._scrapes: deque[tuple[float, str]] = deque()
        self._bytes = 0
        self._charted: dict[str, bool] = {}  # sample name -> charted (a few hundred names at most)
        self._lock = threading.Lock()
        self._gzipped: bytes | None = None  # the compressed answer of the scrapes kept now, once asked for
        self.left_out = 0  # series left out (past the bounds)

    def _is_charted(self, name: str) -> bool:
        found = self._charted.get(name)
        if found is None:
            found = name.startswith(CHARTED)
            if len(self._charted) < 4096:
                self._charted[name] = found
        return found

    def add(self, t: float, body: bytes) -> None:
        """Keep the charted series of ``body`` (the text or OpenMetrics format) as the scrape of time ``t``
        (``time.time()``)."""
        samples: list[tuple[str, float]] = []
        for raw in body.decode("utf-8", "replace").split("\n"):
            if not raw or raw[0] == "#":
                continue
            if " # {" in raw:  # an exemplar after the value (OpenMetrics): read the labels quote by quote
                space = _key_end(raw)
            else:  # why not always: read a character at a time, a 200-character line costs 20 us, 0.4 us here
                close = raw.rfind("}")
                space = raw.find(" ", close if close >= 0 else 0)
            if space < 0:
                continue
            key = raw[:space]
            brace = key.find("{")
            if not self._is_charted(key if brace < 0 else key[:brace]):
                continue
            try:
                samples.append((key, float(raw[space + 1:].split(" ", 1)[0])))
            except ValueError:
                continue
        with self._lock:
            values: dict[int, float] = {}
            for key, value in samples:
                index = self._index.get(key)
                if index is None:
                    if len(self._names) >= _HISTORY_SERIES or len(key) > _HISTORY_KEY:
                        self.left_out += 1
                        continue
                    index = self._index[key] = len(self._names)
                    self._names.append(key)
                    self._names_bytes += len(key) + 4
                    self._names_json = None
                values[index] = value
            row = "[" + ",".join(_number(values[i]) if i in values else "null"
                                 for i in range(max(values) + 1 if values else 0)) + "]"
            self._scrapes.append((t, row))
            self._bytes += len(row)
            while self._scrapes and (self._scrapes[0][0] < t - self.seconds
                                     or self._bytes + self._names_bytes > self.budget):
                self._bytes -= len(self._scrapes.popleft()[1])
            self._gzipped = None

    def __len__(self) -> int:
        return len(self._scrapes)

    @property
    def bytes(self) -> int:
        """Bytes held now: the arrays and names (the compressed answer, once made, adds about a tenth)."""
        return self._bytes + self._names_bytes

    def body(self) -> bytes:
        """The history as JSON: ``every_s``, ``kept_s``, ``series`` (names as the exposition writes them) and
        ``scrapes`` (oldest first: ``t``, wall-clock seconds, and ``values``, one per series, ``null`` where
        absent; a scrape taken before a series appeared has fewer)."""
        with self._lock:
            if self._names_json is None:
                self._names_json = json.dumps(self._names)
            scrapes = ",".join(f'{{"t":{t!r},"values":{row}}}' for t, row in self._scrapes)
            return (f'{{"every_s":{self.every!r},"kept_s":{self.seconds!r},"series":{self._names_json},'
                    f'"scrapes":[{scrapes}]}}').encode()

    def _compressed(self) -> bytes:
        gzipped = self._gzipped
        if gzipped is None:
            # Level 6, as the exposition's gzip; kept until the next scrape (browsers ask for gzip; the answer is
            # mostly repeated numbers, about a tenth of the plain one). The plain one is made for each request.
            gzipped = self._gzipped = gzip.compress(self.body(), compresslevel=6)
        return gzipped

    def ready(self, request: HistoryRequest) -> bytes | None:
        """The answer, when it is made already (on the I/O thread: no JSON, no compression)."""
        gzipped = self._gzipped
        if gzipped is None or not request.gzip:
            return None
        return self._response(gzipped, request)

    def answer(self, request: HistoryRequest) -> bytes:
        """The answer (made now if a scrape came since the last one was made)."""
        return self._response(self._compressed() if request.gzip else self.body(), request)

    def _response(self, body: bytes, request: HistoryRequest) -> bytes:
        # The server's clock now, for the page to place the scrapes on its own clock.
        headers = (("Content-Type", "application/json"), *JSON_HEADERS, ("X-Gpuprobe-Now", repr(time.time())),
                   *((("Content-Encoding", "gzip"),) if request.gzip else ()))
        whole = response("200 OK", body, headers)
        return whole[: len(whole) - len(body)] if request.head else whole


class HistorySampler:
    """Adds a scrape to ``history`` every ``history.every`` seconds, on a thread of its own
    (``gpuprobe-page-history``), from ``take(max_age)``: a body rendered at most ``max_age`` seconds ago
    (one a scraper caused, or one rendered for it), or None. Its own failure only skips a scrape."""

    def __init__(self, history: History, take: Callable[[float], bytes | None]) -> None:
        self.history = history
        self._take = take
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuprobe-page-history", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        every = self.history.every
        # The first scrape after one period, not at once: a server asked once costs one rendering, not two.
        while not self._stop.wait(every):
            try:
                body = self._take(every)
                if body is not None:
                    self.history.add(time.time(), body)
            except Exception:  # fail open: a scrape missing from the history
                continue

    def close(self) -> None:
        """Stop the thread (the history stays readable)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(2.0)
