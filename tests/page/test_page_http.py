"""The live page's files over HTTP from a real ``gpuprobe.serve()``: ``/`` answers a browser with the page and
everyone else with the metrics, the files are the package's own, answered from memory by the server's I/O
thread (no worker, no rendering), and nothing on the page comes from elsewhere. No browser here
(test_live_page.py loads the page in Chromium)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

import gpuprobe
from gpuprobe.exporters import _page
from gpuprobe.exporters.prometheus import Server
from test_metrics_server import get  # (status, headers with lower-case names, body) from a real HTTP client

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


def _file(name: str) -> bytes:
    return resources.files("gpuprobe.exporters").joinpath("page", name).read_bytes()


@pytest.fixture
def server() -> Iterator[Server]:
    s = gpuprobe.serve(port=0)
    try:
        yield s
    finally:
        s.close()


def test_a_browser_gets_the_page_at_the_root(server: Server) -> None:
    status, headers, body = get(server, "/", headers={"Accept": BROWSER_ACCEPT})
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert body == _file("index.html")
    assert "default-src 'self'" in headers["content-security-policy"]
    assert get(server, "/?from=bookmark", headers={"Accept": BROWSER_ACCEPT})[2] == body


@pytest.mark.parametrize("accept", [None, "*/*", "text/plain;version=0.0.4",
                                    "application/openmetrics-text;version=1.0.0"])
def test_scrapers_and_curl_still_get_the_metrics_at_the_root(server: Server, accept: str | None) -> None:
    status, headers, body = get(server, "/", headers={"Accept": accept} if accept else {})
    assert status == 200 and b"gpuprobe_build_info" in body
    assert not headers["content-type"].startswith("text/html")


@pytest.mark.parametrize("name", sorted(_page.FILES))
def test_every_file_of_the_page_is_served_as_packaged(server: Server, name: str) -> None:
    status, headers, body = get(server, _page.PREFIX + name)
    assert status == 200 and body == _file(name)
    assert headers["content-type"] == _page.FILES[name]
    assert headers["x-content-type-options"] == "nosniff"


def test_head_gets_the_headers_without_the_body(server: Server) -> None:
    full = get(server, _page.PREFIX + "page.js")
    status, headers, body = get(server, _page.PREFIX + "page.js", method="HEAD")
    assert status == 200 and body == b"" and headers["content-length"] == str(len(full[2]))


def test_an_unknown_file_is_404_and_the_metrics_are_not_served_there(server: Server) -> None:
    status, _, body = get(server, _page.PREFIX + "missing.js")
    assert status == 404 and b"no such file of the live page" in body


def test_the_page_is_answered_from_memory_by_the_io_thread(server: Server) -> None:
    for _ in range(20):
        for name in _page.FILES:
            assert get(server, _page.PREFIX + name)[0] == 200
        assert get(server, "/", headers={"Accept": BROWSER_ACCEPT})[0] == 200
    stats = server.stats()
    assert stats["threads"] == 1 and stats["renders"] == 0  # no worker started, no body rendered
    assert stats["answered"] == 20 * (len(_page.FILES) + 1)


def test_a_post_to_the_root_is_not_the_pages(server: Server) -> None:
    status, headers, body = get(server, "/", method="POST", headers={"Accept": BROWSER_ACCEPT}, body=b"")
    assert not headers.get("content-type", "").startswith("text/html") and b"<html" not in body


def test_the_page_loads_nothing_from_elsewhere() -> None:
    html = _file("index.html").decode()
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert linked, html
    for url in linked:
        assert url.startswith(_page.PREFIX) or url in ("/metrics", "data:,"), url
        if url.startswith(_page.PREFIX):
            assert url[len(_page.PREFIX):] in _page.FILES
    for name in ("index.html", "page.js", "page.css"):
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", _file(name).decode()), name
    assert b"https://" not in re.sub(rb"/\*!.*?\*/", b"", _file("uPlot.iife.min.js"))  # its banner aside


def test_uplot_comes_with_its_license() -> None:
    license_text = _file("uPlot.LICENSE").decode()
    assert license_text.startswith("The MIT License") and "Leon Sorokin" in license_text
    assert _file("uPlot.iife.min.js").startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


def test_the_server_names_the_page(server: Server) -> None:
    assert server.page_url == f"http://127.0.0.1:{server.port}/"
    assert server.url == server.page_url + "metrics"


def test_a_missing_file_in_the_installation_is_named_in_the_browser(monkeypatch: Any) -> None:
    monkeypatch.setattr(_page, "FILES", {**_page.FILES, "gone.js": "text/javascript"})
    monkeypatch.setattr(_page, "_responses", None)
    found = _page.route("GET", _page.PREFIX + "gone.js", {})
    assert found is not None and found.full.startswith(b"HTTP/1.1 500 ")
    assert b"the live page's file gone.js cannot be read from the installed package" in found.full
    assert _page.route("GET", _page.PREFIX + "page.js", {}).full.startswith(b"HTTP/1.1 200 OK")  # type: ignore[union-attr]
