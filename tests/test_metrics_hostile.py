"""The /metrics port against clients that try to hold it down, over real sockets, through the real front
process and the program's own server: bodies dripped a byte at a time, requests that wait too long for
a worker, a flood of requests that reach the program, and a forked child closing its copy of the
endpoint. (What these cost in figures is ``benchmarks/metrics_hostile.py``.)"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.exporters.prometheus import Limits, Server, serve as serve_metrics
from gpuprobe.runtime import runtime
from gpuprobe.testing import reset

from helpers import ROOT

DRIP_HEAD = (b"POST /gpuprobe/profile HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Gpuprobe-Capture: 1\r\n"
             b"Content-Length: 60000\r\n\r\n")


def get(server: Server, path: str = "/metrics", timeout: float = 30) -> int:
    conn = http.client.HTTPConnection(server.addr, server.port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def status_of(server: Server, path: str) -> tuple[int, str]:
    """The status of ``path``, and ``"pace"`` when it is the front's refusal past the program's share."""
    conn = http.client.HTTPConnection(server.addr, server.port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        paced = resp.status == 503 and resp.getheader("Retry-After") is not None and b"few such requests" in body
        return resp.status, "pace" if paced else ""
    finally:
        conn.close()


@pytest.fixture(params=["front", "in_process"])
def serve(request: Any) -> Any:
    started: list[Server] = []

    def start(**limits: Any) -> Server:
        server = serve_metrics(port=0, limits=Limits(**limits), in_process=request.param == "in_process")
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def test_clients_dripping_a_body_hold_no_worker_and_every_scrape_is_answered(serve) -> None:
    server = serve(threads=2, read_timeout=2.0)
    drippers = []
    for _ in range(6):  # three times the workers
        s = socket.create_connection((server.addr, server.port), timeout=30)
        s.sendall(DRIP_HEAD)
        drippers.append(s)
    stop = threading.Event()

    def drip() -> None:
        while not stop.is_set():
            for s in drippers:
                try:
                    s.sendall(b"x")
                except OSError:
                    pass
            time.sleep(0.2)

    dripping = threading.Thread(target=drip)
    dripping.start()
    try:
        scrapes, queries = [], []
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            queries.append(status_of(server, "/metrics?name[]=gpuprobe_build_info"))  # a worker's request, too
            scrapes.append(get(server))
            time.sleep(0.05)
    finally:
        stop.set()
        dripping.join(10)
    assert scrapes and set(scrapes) == {200}
    # A query is rendered by the program: through the front, within its share of the program's time, past
    # which the front answers 503 with Retry-After (as designed: on a loaded machine each takes longer). No
    # other answer, and the workers answered: none is held by a dripping client.
    refused = {(503, "pace")} if server.front_pid is not None else set()
    assert (200, "") in queries and set(queries) <= {(200, ""), *refused}, queries
    for s in drippers:  # each is cut once its one deadline for head and body has passed
        s.settimeout(30)
        answer = b""
        try:
            while chunk := s.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:40]
        s.close()
    assert server.stats()["timed_out"] >= 6


def test_a_request_that_waited_its_timeout_for_a_worker_is_answered_503_not_served_late(serve) -> None:
    reset(collect_interval=60.0)
    server = serve(threads=1, waiting=8, read_timeout=1.0)
    answers: list[int] = []
    clients = [threading.Thread(target=lambda: answers.append(get(server, "/metrics?name[]=x"))) for _ in range(4)]
    with runtime().lock:  # the one worker's request waits for the runtime's lock, as behind a long collection
        for c in clients:
            c.start()
            time.sleep(0.05)
        time.sleep(2.5)  # past every waiting request's timeout
    for c in clients:
        c.join(30)
    assert 200 in answers and 503 in answers  # the one in the worker is answered; those waiting behind it expired
    assert server.stats()["expired"] == answers.count(503)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.subprocess_only
def test_a_flood_of_requests_that_reach_the_program_keeps_it_within_its_cpu_share() -> None:
    """The program (a child that only serves) under eight clients asking, back to back, for queries
    the front process forwards: its own threads' CPU over the time stays near ``Limits.cpu_share``."""
    program = ("import sys; sys.path.insert(0, sys.argv[1]); import torch, gpuprobe; "
               "s = gpuprobe.serve(port=0); print(s.port, flush=True); sys.stdin.readline()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    proc = subprocess.Popen([sys.executable, "-I", "-c", program, ROOT], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())

        def cpu() -> float:
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        stop = threading.Event()
        statuses: list[int] = []

        def flood() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    conn.request("GET", f"/metrics?name[]=gpuprobe_build_info&n={n}")
                    resp = conn.getresponse()
                    resp.read()
                    statuses.append(resp.status)
                except OSError:
                    statuses.append(0)
                finally:
                    conn.close()

        time.sleep(0.5)
        flooders = [threading.Thread(target=flood) for _ in range(8)]
        cpu0, t0 = cpu(), time.monotonic()
        for f in flooders:
            f.start()
        time.sleep(4.0)
        share = (cpu() - cpu0) / (time.monotonic() - t0)
        stop.set()
        for f in flooders:
            f.join(30)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)
    assert statuses.count(200) > 0 and statuses.count(503) > 0  # some answered, the rest paced with 503
    assert set(statuses) <= {200, 503}
    assert share <= 0.1 * 1.5, f"the program spent {share:.3f} of a core"  # its share, and the clock's grain


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_closing_its_copy_neither_waits_for_nor_stops_the_parent_s_front() -> None:
    server = serve_metrics(port=0)
    try:
        pid = server.front_pid
        assert pid is not None and get(server) == 200
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child
            t0 = time.monotonic()
            try:
                server.close()
                reset()
                took = time.monotonic() - t0
                os.write(write, f"{took:.3f}".encode())
            finally:
                os._exit(0)
        os.close(write)
        took = float(os.read(read, 64) or b"nan")
        os.close(read)
        os.waitpid(child, 0)
        assert took < 1.0, f"the child's close() took {took:.1f} s"
        assert server.front_pid == pid
        os.kill(pid, 0)  # the parent's front still runs
        assert get(server) == 200  # and answers
    finally:
        server.close()


def test_every_child_interpreter_gpuprobe_starts_is_isolated() -> None:
    """Each place gpuprobe starts a Python of its own passes ``-I``: no current folder, PYTHONPATH or user
    site on its path, so a ``bisect.py`` in the folder a user runs gpuprobe from is never imported. The
    list is read from the source, so a new child interpreter cannot be added without it."""
    import ast

    found: list[str] = []
    missing: list[str] = []
    for path in sorted((Path(ROOT) / "gpuprobe").rglob("*.py")):
        if "testing" in path.relative_to(ROOT).parts:
            continue  # test helpers: they start the interpreter under test on purpose
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.List, ast.Tuple)) or not node.elts:
                continue
            first = node.elts[0]
            if ast.unparse(first) != "sys.executable":
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            found.append(where)
            if not any(isinstance(e, ast.Constant) and e.value == "-I" for e in node.elts[1:3]):
                missing.append(where)
    assert found, "no child interpreter found: the scan is broken"
    assert missing == [], f"child interpreters without -I: {missing}"
    for path in sorted((Path(ROOT) / "gpuprobe").rglob("*.py")):
        text = path.read_text()
        assert "os.execv(sys.executable" not in text and "spawn(sys.executable" not in text, path
