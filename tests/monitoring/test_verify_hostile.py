"""``--verify URL`` against servers that are not Prometheus, over real sockets: a real HTTP server (the
standard library's, on 127.0.0.1, in a thread) answers with 1 GB streamed, JSON nested 100 000 deep,
an HTML page, JSON of another shape. The real command runs as a child process: it exits with 2 and one
line naming the URL and what was wrong (not "unreachable", which is for a server that cannot be reached),
having read no more than its documented cap (its peak RSS stays far below the answer's size)."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.dashboards import DASHBOARD_DIR, verify
from gpuprobe.dashboards.prometheus_api import (
    MAX_ANSWER_BYTES,
    Prometheus,
    PrometheusAnswerError,
    PrometheusError,
    PrometheusUnreachableError,
)

ROOT = Path(__file__).resolve().parents[2]
BOARDS = str(ROOT / DASHBOARD_DIR)  # the shipped dashboards, whatever folder the child runs in
GIB = 1024 ** 3
PIECE = b"x" * (1024 * 1024)  # the one buffer every streamed answer is written from
PEAK_RSS_LIMIT = 200 * 1024 * 1024
"""A child that reads at most 8 MiB of an answer stays far under this (it starts at about 25 MB);
one that read the 1 GiB answer whole would need well over 1 GB."""

# Starts the command and reports its peak RSS. Why a launcher between: a child forked from this (large)
# test process and exec'ing counts the parent's resident set as its own peak (Linux keeps the old
# memory's high-water mark across exec); the launcher's own, about 10 MB, is what the command inherits.
LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
sys.stderr.write(f"\\npeak-rss-kb {usage.ru_maxrss}\\n")
sys.exit(child.returncode)
"""


class _Answer:
    """What the test server answers to every GET: ``write(handler)`` sends a whole response."""

    def __init__(self, write: Callable[[http.server.BaseHTTPRequestHandler], None]) -> None:
        self.write = write
        self.sent = 0  # bytes of body written before the client went away (or all of them)


def _whole(status: int, content_type: str, body: bytes) -> Callable[[Any], None]:
    def write(h: Any) -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return write


def _streamed(total: int, *, declared: bool) -> Callable[[Any], None]:
    """``total`` bytes of what begins as a Prometheus answer, written piece by piece (never held whole):
    chunked, or with its length declared up front."""
    head = b'{"status":"success","data":["'

    def write(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        if declared:
            h.send_header("Content-Length", str(total))
        else:
            h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def send(data: bytes) -> None:
            h.wfile.write(data if declared else b"%x\r\n%s\r\n" % (len(data), data))
            h.answer.sent += len(data)

        send(head)
        left = total - len(head)
        while left > 0:
            send(PIECE[:left] if left < len(PIECE) else PIECE)
            left -= len(PIECE)
        if not declared:
            h.wfile.write(b"0\r\n\r\n")
    return write


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answer: _Answer

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        try:
            self.answer.write(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading: what the cap is for
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's name
        pass


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[Any], None]], tuple[str, _Answer]]]:
    """``server(write)`` → (URL, answer) of a real HTTP server on 127.0.0.1 answering every GET with ``write``."""
    started: list[http.server.ThreadingHTTPServer] = []

    def start(write: Callable[[Any], None]) -> tuple[str, _Answer]:
        answer = _Answer(write)
        handler = type("Handler", (_Handler,), {"answer": answer})
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, name="hostile-server", daemon=True).start()
        started.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", answer

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def _run_verify(url: str, tmp_path: Path, timeout: float = 120) -> tuple[int, str, str, int]:
    """The real command as a child process: (exit status, stdout, stderr, the child's peak RSS in bytes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    proc = subprocess.Popen([sys.executable, "-I", "-c", LAUNCHER, sys.executable, "-I", "-m", "gpuprobe",
                             "dashboard", "--verify", url, "--out", BOARDS], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the command it started
        proc.communicate()
        raise
    stderr, _, peak = stderr.rpartition("\npeak-rss-kb ")
    assert peak.strip().isdigit(), stderr
    return proc.returncode, stdout, stderr, int(peak) * 1024  # ru_maxrss is in kB on Linux


def _assert_one_line_exit_2(result: tuple[int, str, str, int], url: str, what: str) -> None:
    code, stdout, stderr, _ = result
    assert code == 2, stderr
    assert stdout == ""
    assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr
    assert stderr.startswith(f"gpuprobe dashboard: --verify: {url}/api/v1/"), stderr
    assert what in stderr and "is unreachable" not in stderr and "Traceback" not in stderr, stderr


# -- the command, in a child process -------------------------------------------------------------------

def test_a_gigabyte_answer_is_cut_at_the_cap_and_the_command_stays_small(server: Any, tmp_path: Path) -> None:
    url, answer = server(_streamed(GIB, declared=False))
    result = _run_verify(url, tmp_path)
    _assert_one_line_exit_2(result, url, f"more than {MAX_ANSWER_BYTES} bytes")
    assert result[3] < PEAK_RSS_LIMIT, f"peak RSS {result[3] / 2**20:.0f} MiB"
    assert answer.sent < GIB // 4  # the child stopped reading: the server could not send it all


def test_an_answer_declared_larger_than_the_cap_is_refused_unread(server: Any, tmp_path: Path) -> None:
    url, answer = server(_streamed(GIB, declared=True))
    result = _run_verify(url, tmp_path)
    _assert_one_line_exit_2(result, url, f"an answer of {GIB} bytes, more than the {MAX_ANSWER_BYTES} read")
    assert result[3] < PEAK_RSS_LIMIT, f"peak RSS {result[3] / 2**20:.0f} MiB"


def test_json_nested_100k_deep_is_named_not_a_traceback(server: Any, tmp_path: Path) -> None:
    url, _ = server(_whole(200, "application/json", b"[" * 100_000 + b"]" * 100_000))
    result = _run_verify(url, tmp_path)
    _assert_one_line_exit_2(result, url, "JSON nested too deeply to read")
    assert result[3] < PEAK_RSS_LIMIT


def test_an_html_page_is_not_json_and_not_unreachable(server: Any, tmp_path: Path) -> None:
    page = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Sign in</body></html>\n"
    url, _ = server(_whole(200, "text/html; charset=utf-8", page))
    _assert_one_line_exit_2(_run_verify(url, tmp_path), url,
                            "not JSON (Content-Type text/html; charset=utf-8), beginning '<!DOCTYPE html>\\n<html>")


def test_json_of_another_shape_is_named(server: Any, tmp_path: Path) -> None:
    url, _ = server(_whole(200, "application/json", b'{"hello": "world"}'))
    _assert_one_line_exit_2(_run_verify(url, tmp_path), url, "JSON of another shape: an object, not an object "
                                                             "with a status")


def test_a_404_page_is_not_a_prometheus_answer(server: Any, tmp_path: Path) -> None:
    url, _ = server(_whole(404, "text/html", b"<html>Not Found</html>"))
    _assert_one_line_exit_2(_run_verify(url, tmp_path), url, "HTTP 404 Not Found, and not JSON")


def test_a_closed_port_is_still_unreachable_with_exit_1(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: connections are refused
        code, stdout, stderr, _ = _run_verify(url, tmp_path)
    assert code == 1 and stdout == "" and stderr.count("\n") == 1
    assert f"Prometheus at {url} is unreachable" in stderr


# -- the client, in this process ------------------------------------------------------------------------

def _success(data: Any) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def test_an_answer_of_exactly_the_cap_is_read_and_one_byte_more_is_not(server: Any) -> None:
    values = ["v" * 10, "w" * 20]
    body = _success(values)
    url, _ = server(_whole(200, "application/json", body))
    assert Prometheus(url, max_answer_bytes=len(body)).label_values("instance") == values
    with pytest.raises(PrometheusAnswerError, match=f"more than the {len(body) - 1} read"):
        Prometheus(url, max_answer_bytes=len(body) - 1).label_values("instance")


def test_a_chunked_answer_one_byte_over_the_cap_is_cut(server: Any) -> None:
    url, _ = server(_streamed(1001, declared=False))
    with pytest.raises(PrometheusAnswerError, match="an answer of more than 1000 bytes, the most read"):
        Prometheus(url, max_answer_bytes=1000).label_values("instance")


@pytest.mark.parametrize(("body", "call", "what"), [
    (_success({"resultType": "vector", "result": "no list"}), "query", "data is an object without a list 'result'"),
    (_success([1, 2]), "label_values", "data is a list, not a list of strings"),
    (_success({"result": []}), "alerts", "data is an object without a list 'alerts'"),
    (json.dumps({"status": "maybe", "data": []}).encode(), "query", "status 'maybe'"),
    (json.dumps({"status": "success"}).encode(), "query", "status 'success' and no data"),
    (b'"just a string"', "query", "a string, not an object with a status"),
    (b"", "query", "not JSON (Content-Type application/json): an empty answer"),
    (b"\xff\xfe{}", "query", "not UTF-8 text"),
])
def test_json_that_is_not_a_prometheus_answer_is_named(server: Any, body: bytes, call: str, what: str) -> None:
    url, _ = server(_whole(200, "application/json", body))
    client = Prometheus(url)
    with pytest.raises(PrometheusAnswerError) as caught:
        client.query("up") if call == "query" else client.alerts() if call == "alerts" else client.label_values("job")
    assert what in str(caught.value) and str(caught.value).startswith(url)
    assert "\n" not in str(caught.value)


def test_a_prometheus_error_answer_is_a_refused_query_not_a_bad_answer(server: Any) -> None:
    error = {"status": "error", "errorType": "bad_data", "error": "parse error at char 4: unexpected <EOF>"}
    url, _ = server(_whole(400, "application/json", json.dumps(error).encode()))
    with pytest.raises(PrometheusError) as caught:
        Prometheus(url).query("sum(")
    assert type(caught.value) is PrometheusError
    assert "refused /api/v1/query (400): 'parse error at char 4: unexpected <EOF>'" in str(caught.value)


def test_verify_stops_at_a_bad_answer_instead_of_counting_it_a_failed_query(server: Any) -> None:
    url, _ = server(_whole(200, "text/html", b"<html></html>"))
    board = {"uid": "d", "panels": [{"title": "p", "type": "timeseries", "targets": [{"refId": "A", "expr": "up"}]}]}
    with pytest.raises(PrometheusAnswerError, match="not JSON"):
        verify(url, [board])
    with pytest.raises(PrometheusUnreachableError):
        verify("http://127.0.0.1:1", [board])
