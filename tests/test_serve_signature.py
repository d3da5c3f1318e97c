"""``gpuprobe.serve()`` takes what the exporter's ``serve()`` takes, and passes it on: the same signature
(so the two cannot drift apart), every parameter documented, and an endpoint served from the program's
own threads when ``in_process=True`` asks for that, scraped over a real socket."""

from __future__ import annotations

import inspect
import re
import urllib.request

import pytest

import gpuprobe
from gpuprobe.exporters import prometheus
from gpuprobe.testing import reset


@pytest.fixture(autouse=True)
def _fresh() -> object:
    reset()
    yield
    reset()


def _documented_args(fn: object) -> list[str]:
    """The parameter names of a Google-style ``Args:`` section, in order."""
    doc = inspect.getdoc(fn) or ""
    section = doc.split("Args:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^    (\w+):", section, flags=re.MULTILINE)


def test_the_top_level_serve_has_the_exporters_signature() -> None:
    assert inspect.signature(gpuprobe.serve) == inspect.signature(prometheus.serve)


def test_the_top_level_serve_documents_every_parameter_the_exporter_documents() -> None:
    exporter_args = _documented_args(prometheus.serve)
    assert exporter_args == list(inspect.signature(prometheus.serve).parameters)  # the oracle is whole
    assert _documented_args(gpuprobe.serve) == exporter_args


def test_serve_in_process_answers_a_scrape_from_the_programs_own_threads() -> None:
    server = gpuprobe.serve(port=0, in_process=True)
    try:
        assert server.front_pid is None  # no front process: the program's threads answer the port
        with gpuprobe.probe("served-in-process"):
            pass
        gpuprobe.collect()
        with urllib.request.urlopen(server.url, timeout=30) as resp:
            status, ctype, body = resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    finally:
        server.close()
    assert status == 200 and ctype.startswith("text/plain")
    assert "gpuprobe_build_info{" in body
    assert 'probe="served-in-process"' in body


def test_serve_without_in_process_answers_from_a_front_process() -> None:
    server = gpuprobe.serve(port=0)
    try:
        with urllib.request.urlopen(server.url, timeout=30) as resp:
            body = resp.read().decode()
        front = server.front_pid
    finally:
        server.close()
    assert "gpuprobe_build_info{" in body
    assert isinstance(front, int) and front > 0


def test_serve_passes_limits_on() -> None:
    limits = prometheus.Limits(threads=1, read_timeout=2.0)
    server = gpuprobe.serve(port=0, in_process=True, limits=limits)
    try:
        with urllib.request.urlopen(server.url, timeout=30) as resp:
            assert resp.status == 200
        assert server.limits == limits
    finally:
        server.close()
