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
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources

from ._http import response

__all__ = ["PREFIX", "FILES", "Static", "route"]

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
