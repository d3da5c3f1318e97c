"""The /metrics server under load, over real sockets and HTTP clients: half-sent requests are cut, the
threads stay bounded, the body is reused within its interval, excess requests wait or get 503, and the
capture endpoint still answers; each whether a front process answers the port (the default) or the
program's own threads do. Then the front process itself: it ends with the program, and the program takes
the port over when it ends or cannot start. (What load costs the program is measured by
``benchmarks/metrics_load.py``, not here.)"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from gpuprobe import ConfigError, probe
from gpuprobe.exporters.prometheus import Limits, Server, serve as serve_metrics
from gpuprobe.runtime import runtime
from gpuprobe.testing import reset

from helpers import wait_for

HALF = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # the blank line that ends the head never comes


def get(server: Server, path: str = "/metrics", method: str = "GET", headers: dict[str, str] | None = None,
        body: bytes | None = None, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one request from a real HTTP client."""
    conn = http.client.HTTPConnection(server.addr, server.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def half_sent(server: Server, n: int) -> list[socket.socket]:
    """``n`` connections that each sent part of a request head and then nothing more."""
    out = []
    for _ in range(n):
        s = socket.create_connection((server.addr, server.port), timeout=30)
        s.sendall(HALF)
        out.append(s)
    return out


def server_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gpuprobe-metrics")]


@pytest.fixture(params=["front", "in_process"])
def serve(request: Any) -> Any:
    """Start servers the given way: answered by a front process (the default) or by the program's threads."""
    started: list[Server] = []

    def start(**limits: Any) -> Server:
        server = serve_metrics(port=0, limits=Limits(**limits), in_process=request.param == "in_process")
        assert (server.front_pid is None) == (request.param == "in_process")
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def test_a_half_sent_request_is_cut_at_the_read_timeout_while_scrapes_go_on(serve) -> None:
    server = serve(read_timeout=0.5)
    (stalled,) = half_sent(server, 1)
    status, _, _ = get(server)  # answered while the other connection still holds its half request
    assert status == 200
    stalled.settimeout(30)
    answer = b""
    while chunk := stalled.recv(4096):  # until the server closes the connection
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert server.stats()["timed_out"] == 1
    stalled.close()


def test_half_sent_requests_hold_no_thread_and_the_thread_bound_holds(serve) -> None:
    server = serve(threads=2, connections=1000)
    stalled = half_sent(server, 300)
    results: list[int] = []

    def scrape() -> None:
        results.append(get(server)[0])

    clients = [threading.Thread(target=scrape) for _ in range(40)]
    seen = 0
    for c in clients:
        c.start()
    while any(c.is_alive() for c in clients):
        seen = max(seen, len(server_threads()))
        time.sleep(0.001)
    assert results == [200] * 40
    assert max(seen, len(server_threads())) <= 1 + 2  # the I/O thread and two workers, whatever the load
    assert server.stats()["threads"] <= 3
    for s in stalled:
        s.close()


def test_past_the_connection_bound_the_oldest_half_sent_request_is_cut(serve) -> None:
    server = serve(connections=4)
    stalled = half_sent(server, 10)
    wait_for(lambda: server.stats()["evicted"] >= 6, "six connections cut")
    assert get(server)[0] == 200
    first = stalled[0]
    first.settimeout(30)
    assert first.recv(4096).startswith(b"HTTP/1.1 408 ")  # the oldest went first
    for s in stalled:
        s.close()


def test_the_body_is_reused_within_the_collect_interval_and_a_new_observation_appears_after_it(serve) -> None:
    reset(collect_interval=2.0)
    server = serve()
    t0 = time.monotonic()
    before = get(server)[2].decode()
    assert server.stats()["renders"] == 1
    with probe("late"):
        pass
    again = get(server)[2].decode()
    if time.monotonic() - t0 < 2.0:  # still within the interval of the first rendering
        assert again == before and 'probe="late"' not in again
        assert server.stats()["renders"] == 1
    text = wait_for(lambda: (body := get(server)[2].decode()) and 'probe="late"' in body and body, "the new record")
    assert time.monotonic() - t0 >= 2.0  # not before the interval ran out
    assert server.stats()["renders"] == 2
    assert "gpuprobe_probe_duration_seconds_count" in text


def test_gzip_only_when_asked_and_of_the_same_rendering(serve) -> None:
    reset(collect_interval=60.0)
    server = serve()
    _, plain_headers, plain = get(server)
    _, gz_headers, gz = get(server, headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in plain_headers
    assert gz_headers["content-encoding"] == "gzip"
    assert gzip.decompress(gz) == plain
    assert server.stats()["renders"] == 1
    status, head_headers, empty = get(server, method="HEAD")
    assert status == 200 and empty == b"" and int(head_headers["content-length"]) == len(plain)


def test_openmetrics_is_served_to_a_scraper_that_asks_for_it(serve) -> None:
    server = serve()
    accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2"
    _, headers, body = get(server, headers={"Accept": accept})
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    _, headers, body = get(server)
    assert headers["content-type"].startswith("text/plain") and b"# EOF" not in body


def test_excess_requests_wait_for_a_worker_or_get_503_and_the_waiting_ones_are_answered(serve) -> None:
    server = serve(threads=1, waiting=1)
    rt = runtime()
    answers: list[tuple[int, dict[str, str]]] = []

    def scrape() -> None:
        status, headers, _ = get(server)
        answers.append((status, headers))

    clients = []
    with rt.lock:  # as a long collection would: the worker's rendering waits for the runtime's lock
        while not any(status == 503 for status, _ in answers):
            client = threading.Thread(target=scrape)
            client.start()
            clients.append(client)
            time.sleep(0.05)
            assert len(clients) < 50, "no request was refused"
        refused = [headers for status, headers in answers if status == 503]
        assert refused[0]["retry-after"] == "1"
        assert len(clients) - len(answers) <= 1 + 1  # held: one in the worker, one waiting
    for client in clients:
        client.join(30)
    statuses = sorted(status for status, _ in answers)
    assert set(statuses) == {200, 503} and statuses.count(200) == len(clients) - len(refused)
    assert server.stats()["refused"] == len(refused)


def test_past_the_rate_bound_connections_wait_in_the_listen_queue_and_are_all_answered(serve) -> None:
    server = serve(rate=10.0)  # a burst of 5 at once, then one every 0.1 s
    statuses: list[int] = []
    clients = [threading.Thread(target=lambda: statuses.append(get(server)[0])) for _ in range(25)]
    t0 = time.monotonic()
    for c in clients:
        c.start()
    for c in clients:
        c.join(60)
    assert statuses == [200] * 25
    assert time.monotonic() - t0 >= (25 - 5 - 1) / 10  # the bucket's refill, however fast the machine


def test_an_accept_header_prometheus_client_cannot_parse_gets_the_text_format(serve) -> None:
    server = serve()
    status, headers, body = get(server, headers={"Accept": "application/openmetrics-text;version=abc"})
    assert status == 200 and headers["content-type"].startswith("text/plain") and b"gpuprobe_build_info" in body
    assert get(server)[0] == 200  # and the server goes on


def test_malformed_and_oversized_requests_are_answered_400_and_431(serve) -> None:
    server = serve()
    with socket.create_connection((server.addr, server.port), timeout=30) as s:
        s.sendall(b"NONSENSE\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400 ")
    with socket.create_connection((server.addr, server.port), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 431 ")
    assert get(server)[0] == 200


def test_the_capture_endpoint_still_answers_post_with_and_without_a_body(serve, tmp_path) -> None:
    reset(profile_dir=str(tmp_path))
    server = serve()
    capture = {"X-Gpuprobe-Capture": "1"}
    status, headers, body = get(server, "/gpuprobe/profile?steps=2", method="POST", headers=capture)
    assert status == 202 and headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert answer["steps"] == 2 and answer["reason"] == "request"
    status, _, body = get(server, "/gpuprobe/profile?steps=2", method="POST", body=b"x" * 5000, headers=capture)
    assert status == 409 and "error" in json.loads(body)  # the first capture still waits for its steps
    status, headers, _ = get(server, "/gpuprobe/profile")
    assert status == 405 and headers["allow"] == "POST"


def test_a_query_of_some_series_is_answered_by_prometheus_client_s_own_application(serve) -> None:
    server = serve()
    status, headers, body = get(server, "/metrics?name[]=gpuprobe_build_info")
    assert status == 200 and headers["server"].startswith("WSGIServer/")  # wsgiref's handler answered
    assert b"gpuprobe_build_info{" in body and b"gpuprobe_step_duration" not in body  # that series alone
    assert server.stats()["renders"] == 0  # rendered for that request alone, not cached


def test_a_query_that_does_not_change_the_body_is_answered_from_the_cached_one(serve) -> None:
    reset(collect_interval=60.0)
    server = serve()
    bodies = {get(server, f"/metrics?cache-buster={i}&format=x")[2] for i in range(20)}
    assert len(bodies) == 1 and b"gpuprobe_build_info{" in bodies.pop()
    assert server.stats()["renders"] == 1  # twenty queries, one rendering


def test_closing_frees_the_port_and_stops_every_thread(serve) -> None:
    server = serve()
    stalled = half_sent(server, 5)
    assert get(server)[0] == 200
    server.close()
    assert server_threads() == []
    with pytest.raises(OSError):
        get(server, timeout=5)
    for s in stalled:
        s.close()


@pytest.mark.parametrize(("field", "value"), [("threads", 0), ("waiting", 1.5), ("read_timeout", 0), ("rate", -1),
                                              ("cpu_share", 2.0), ("backlog", True)])
def test_a_bad_limit_is_a_clear_error_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"Limits.{field} must be"):
        Limits(**{field: value})


# -- the front process -----------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped by its parent) has ended too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_scrapes_are_answered_by_a_process_of_their_own_that_asks_the_program_once_per_interval() -> None:
    reset(collect_interval=60.0)
    server = serve_metrics(port=0)
    try:
        pid = server.front_pid
        assert pid is not None and pid != os.getpid() and _alive(pid)
        with open(f"/proc/{pid}/status") as f:  # a process of its own, whose parent is the program
            assert f"PPid:\t{os.getpid()}" in f.read()
        bodies = {get(server)[2] for _ in range(30)}
        assert len(bodies) == 1 and b"gpuprobe_build_info{" in bodies.pop()
        stats = server.stats()
        assert stats["answered"] == 30 and stats["renders"] == 1  # thirty scrapes, one rendering in the program
    finally:
        server.close()
    wait_for(lambda: not _alive(pid), "the front to end with the endpoint")


def test_when_the_front_process_ends_the_program_answers_the_port_itself() -> None:
    server = serve_metrics(port=0)
    try:
        pid = server.front_pid
        assert pid is not None and get(server)[0] == 200
        with pytest.warns(RuntimeWarning, match=r"front process ended \(exit status -9\); the program answers"):
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: server.front_pid is None, "the program to take the port over")
        status, _, body = get(server)  # the same port, the same body
        assert status == 200 and b"gpuprobe_build_info{" in body
        assert server.stats()["answered"] >= 1
    finally:
        server.close()
    assert server_threads() == []


def test_a_front_process_that_cannot_start_leaves_the_program_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # what an embedded interpreter may report
    with pytest.warns(RuntimeWarning, match="front process could not start .*the program answers scrapes itself"):
        server = serve_metrics(port=0)
    try:
        assert server.front_pid is None
        assert get(server)[0] == 200
    finally:
        server.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_front_process_ends_with_the_program_even_when_the_program_is_killed(tmp_path: Any) -> None:
    program = ("import os, sys, time\n"
               "from gpuprobe.exporters.prometheus import serve\n"
               "server = serve(port=0)\n"
               "print(server.port, server.front_pid, flush=True)\n"
               "time.sleep(600)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        port, pid = (int(x) for x in proc.stdout.readline().split())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200
        conn.close()
        proc.kill()  # no exit handler runs
        proc.wait(30)
        wait_for(lambda: not _alive(pid), "the front to end after its program")
        with socket.socket() as s:  # and the port is free again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    finally:
        proc.kill()
        proc.wait(30)
