"""Who the /metrics port answers, through the real front process and the program's own server: a
``Host`` it is not known by (what a DNS-rebinding page sends), a cross-site request that acts, a capture
request without the header a page cannot send unasked, and the bound on capture files kept.

Every request is real HTTP from a real client (``http.client`` or a raw socket) to ``gpuprobe.serve()``.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

import gpuprobe
from gpuprobe.exporters._http import Access
from gpuprobe.exporters.prometheus import Server, serve as serve_metrics
from gpuprobe.testing import reset

CAPTURE = "/gpuprobe/profile"
CONFIRM = {"X-Gpuprobe-Capture": "1"}


def ask(server: Server, method: str, path: str, headers: dict[str, str] | None = None,
        body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one request; ``headers`` may replace ``Host``."""
    conn = http.client.HTTPConnection(server.addr, server.port, timeout=30)
    try:
        given = dict(headers or {})
        conn.putrequest(method, path, skip_host="Host" in given, skip_accept_encoding=True)
        for key, value in given.items():
            conn.putheader(key, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.fixture(params=["front", "in_process"])
def server(request: Any, tmp_path: Path) -> Any:
    reset(profile_dir=str(tmp_path), profile_signal="off")
    handle = serve_metrics(port=0, in_process=request.param == "in_process")
    assert (handle.front_pid is None) == (request.param == "in_process")
    yield handle
    handle.close()


# -- Host ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:9464", "127.0.0.1.nip.io:9464",
                                  "evil.localhost.example", "[::ffff:10.0.0.1]:80"])
def test_a_host_the_port_is_not_known_by_is_refused_for_scrapes_and_the_page(server: Server, host: str) -> None:
    for path in ("/metrics", "/", "/metrics?x=1"):
        status, _, body = ask(server, "GET", path, {"Host": host})
        assert status == 403, (path, body)
        assert b"GPUPROBE_ALLOWED_HOSTS" in body
    assert server.stats()["forbidden"] == 3


@pytest.mark.parametrize("host", [None, "localhost", "localhost:1234", "LOCALHOST.", "app.localhost", "127.0.0.1",
                                  "127.0.0.2:9", "[::1]:9464"])
def test_localhost_names_and_loopback_addresses_are_answered(server: Server, host: str | None) -> None:
    headers = {} if host is None else {"Host": host}
    if host is None:  # an HTTP/1.0 tool sends no Host at all
        with socket.create_connection((server.addr, server.port), timeout=30) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 ")
        return
    status, _, body = ask(server, "GET", "/metrics", headers)
    assert status == 200 and b"gpuprobe_build_info{" in body


def test_a_host_named_in_the_setting_is_answered_and_star_answers_any(tmp_path: Path) -> None:
    reset(allowed_hosts="metrics.internal, 10.0.0.5")
    handle = serve_metrics(port=0)
    try:
        assert ask(handle, "GET", "/metrics", {"Host": "metrics.internal:9464"})[0] == 200
        assert ask(handle, "GET", "/metrics", {"Host": "10.0.0.5"})[0] == 200
        assert ask(handle, "GET", "/metrics", {"Host": "other.internal"})[0] == 403
    finally:
        handle.close()
    reset(allowed_hosts="*")
    handle = serve_metrics(port=0)
    try:
        assert ask(handle, "GET", "/metrics", {"Host": "anything.example"})[0] == 200
    finally:
        handle.close()


def test_bound_to_every_address_any_ip_address_is_answered_but_not_another_name() -> None:
    access = Access.for_address("0.0.0.0")
    assert access.allows_host("10.1.2.3:9464") and access.allows_host("[2001:db8::1]:9464")
    assert access.allows_host(f"{socket.gethostname()}:9464")
    assert not access.allows_host("attacker.example:9464")
    bound = Access.for_address("10.0.0.5")
    assert bound.allows_host("10.0.0.5:9464") and not bound.allows_host("10.0.0.6:9464")


def test_a_bad_allowed_hosts_value_is_a_clear_error() -> None:
    with pytest.raises(gpuprobe.ConfigError, match="GPUPROBE_ALLOWED_HOSTS must be host names .*'a b' is not one"):
        gpuprobe.config.load({"GPUPROBE_ALLOWED_HOSTS": "a b"})


# -- cross-site requests and the capture header -----------------------------------------------------------

@pytest.mark.parametrize("headers", [{"Origin": "https://attacker.example"}, {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                                     {"Origin": "http://127.0.0.1:1"}])
def test_a_cross_site_post_is_refused_before_it_reaches_the_program(server: Server, headers: dict[str, str]) -> None:
    # What a page of another site sends: a "simple" POST (no preflight), even with the capture header
    # (a real browser would not send that one without a preflight: the refusal does not depend on it).
    status, _, body = ask(server, "POST", f"{CAPTURE}?steps=2", {**headers, **CONFIRM,
                                                                 "Content-Type": "text/plain"}, b"")
    assert status == 403 and b"another" in body
    assert gpuprobe.info()["profile"]["captures"] == []  # nothing was started
    assert not any(Path(gpuprobe.runtime.runtime().settings.profile_dir).iterdir())


def test_a_simple_post_without_the_capture_header_is_refused_and_says_how(server: Server) -> None:
    status, _, body = ask(server, "POST", f"{CAPTURE}?steps=100", {"Content-Type": "application/x-www-form-urlencoded"},
                          b"a=1")
    assert status == 403
    error = json.loads(body)["error"]
    assert "X-Gpuprobe-Capture" in error and "curl -X POST -H" in error
    assert gpuprobe.info()["profile"]["captures"] == []


def test_a_same_origin_post_with_the_header_starts_a_capture(server: Server) -> None:
    origin = f"http://127.0.0.1:{server.port}"
    status, _, body = ask(server, "POST", f"{CAPTURE}?steps=2", {**CONFIRM, "Origin": origin,
                                                                 "Sec-Fetch-Site": "same-origin"}, b"")
    assert status == 202, body
    answer = json.loads(body)
    assert answer["keep"] == 20 and answer["removes"] is None
    assert [c["reason"] for c in gpuprobe.info()["profile"]["captures"]] == ["request"]


def test_a_preflight_is_never_granted(server: Server) -> None:
    status, headers, _ = ask(server, "OPTIONS", CAPTURE, {"Origin": "https://attacker.example",
                                                          "Access-Control-Request-Method": "POST",
                                                          "Access-Control-Request-Headers": "x-gpuprobe-capture"})
    assert not any(k.startswith("access-control-allow") for k in headers)


def test_a_body_past_the_bound_is_413_and_a_chunked_one_411(server: Server) -> None:
    assert ask(server, "POST", f"{CAPTURE}?steps=2", CONFIRM, b"x" * 70_000)[0] == 413
    with socket.create_connection((server.addr, server.port), timeout=30) as s:
        s.sendall(b"POST /gpuprobe/profile HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 411 ")


# -- capture files kept -----------------------------------------------------------------------------------

def test_past_profile_keep_each_new_capture_removes_the_oldest_and_says_so(tmp_path: Path, capfd: Any) -> None:
    import torch

    reset(profile_dir=str(tmp_path), profile_keep=2, profile_signal="off")
    handle = serve_metrics(port=0)
    paths: list[str] = []
    removes: list[str | None] = []
    try:
        x = torch.ones(8)
        for _ in range(4):
            status, _, body = ask(handle, "POST", f"{CAPTURE}?steps=1", CONFIRM, b"")
            assert status == 202, body
            answer = json.loads(body)
            paths.append(answer["path"])
            removes.append(answer["removes"])
            deadline = time.monotonic() + 60
            while not Path(answer["path"]).exists():  # steps until the window has written its trace
                gpuprobe.step()
                x = x * 2
                assert time.monotonic() < deadline, "the capture was not written"
            gpuprobe.step()
    finally:
        handle.close()
    assert removes == [None, None, paths[0], paths[1]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(p).name for p in paths[2:])
    err = capfd.readouterr().err
    assert f"removed the oldest capture {paths[0]}: GPUPROBE_PROFILE_KEEP=2 keeps the last 2" in err
    assert os.path.basename(paths[1]) in err
