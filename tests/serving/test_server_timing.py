"""``Server-Timing`` and request ids under ``gpuprobe run -- transformers serve ./tiny --device cpu`` (one
``generate()`` per request, and ``--continuous-batching``), from the real OpenAI client and from raw HTTP
(``http.client``); then the app in this process, where a hostile id can reach it past any HTTP parser.

How the tests read the server's records: a folder holding a ``sitecustomize.py`` goes on the server's
``PYTHONPATH``. ``gpuprobe run``'s own ``sitecustomize`` imports the one it shadows after itself, and this
one adds a listener to the runtime's requests (``runtime().requests.add_listener``) that appends each
record's ``as_dict()`` to a JSON-lines file as the request ends, before its response goes out. The
figures of a response's header are checked against that record, and the record against what the client
received (its tokens).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("accelerate")

from _servekit import Served, child_env, free_port, http_get, wait_until  # noqa: E402

import gpuprobe  # noqa: E402
from gpuprobe.integrations import transformers as hf  # noqa: E402
from gpuprobe.integrations._transformers import serve_app  # noqa: E402

RECORDS_ENV = "SERVER_TIMING_TEST_RECORDS"
LISTENER = f'''
import json, os, threading

import gpuprobe.runtime

_path = os.environ["{RECORDS_ENV}"]
_lock = threading.Lock()


def _write(record):
    line = json.dumps(record.as_dict())
    with _lock, open(_path, "a", encoding="utf-8") as out:
        out.write(line + "\\n")


gpuprobe.runtime.runtime().requests.add_listener(_write)
'''
UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
NAMES = {"generate": ["prefill", "ttft", "decode", "total"],
         "continuous_batching": ["queue", "prefill", "ttft", "decode", "total"]}
FIELDS = {"queue": "queue_s", "prefill": "prefill_s", "ttft": "ttft_s", "decode": "decode_s", "total": "duration_s"}


class Server:
    """A served tiny model and the records its requests left."""

    def __init__(self, served: Served, records: Path, mode: str) -> None:
        self.served = served
        self.port = served.serve_port
        self.records_path = records
        self.mode = mode

    def records(self) -> list[dict[str, Any]]:
        if not self.records_path.exists():
            return []
        return [json.loads(line) for line in self.records_path.read_text(encoding="utf-8").splitlines() if line]

    def record(self, request_id: str) -> dict[str, Any]:
        """The one record with this id (waited for: a streamed request's ends after its last chunk)."""
        found = wait_until(f"the record of {request_id[:40]!r}",
                           lambda: [r for r in self.records() if r["request_id"] == request_id], 30)
        assert len(found) == 1, found
        return found[0]

    def post(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One chat completion over raw HTTP: status, headers (lower-case names), body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=180)
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"content-type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def body(self, stream: bool = False, tokens: int = 6) -> dict[str, Any]:
        return {"model": "./tiny", "messages": [{"role": "user", "content": "hello world"}], "max_tokens": tokens,
                "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}

    def openai(self) -> Any:
        import openai

        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, timeout=180)


def timings(header: str) -> dict[str, float]:
    """``name;dur=X, ...`` → {name: X} (milliseconds), read as RFC 8941 lists are: by commas and semicolons."""
    out = {}
    for metric in header.split(","):
        name, *params = [p.strip() for p in metric.split(";")]
        durs = [float(p[4:]) for p in params if p.startswith("dur=")]
        assert len(durs) == 1, header
        out[name] = durs[0]
    return out


def assert_equal_to_record(header: str, record: dict[str, Any], mode: str) -> None:
    """Each figure of the header is the record's, in milliseconds to the 0.1 ms the header gives."""
    got = timings(header)
    assert list(got) == NAMES[mode]
    for name, ms in got.items():
        assert abs(ms - record[FIELDS[name]] * 1e3) <= 0.05 + 1e-9, (name, ms, record)


@pytest.fixture(scope="module", params=["generate", pytest.param("continuous_batching",
                                                                   marks=pytest.mark.continuous_batching)])
def server(request: pytest.FixtureRequest, tiny_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    mode = request.param
    folder = tmp_path_factory.mktemp(f"server-timing-{mode}")
    (folder / "site").mkdir()
    (folder / "site" / "sitecustomize.py").write_text(LISTENER, encoding="utf-8")
    records = folder / "records.jsonl"
    serve_port, metrics_port = free_port(), free_port()
    args = ["transformers", "serve", "./tiny", "--device", "cpu", "--host", "127.0.0.1", "--port", str(serve_port)]
    if mode == "continuous_batching":  # a small paged cache: sizing it from free memory takes most of a minute
        args += ["--continuous-batching", "--cb-num-blocks", "64", "--cb-max-batch-tokens", "64"]
    served = Served(args, cwd=tiny_model.parent, metrics_port=metrics_port, log=folder / "serve.log",
                    env=child_env(PYTHONPATH=str(folder / "site"), **{RECORDS_ENV: str(records)}))
    served.serve_port = serve_port
    try:
        def up() -> bool:
            if served.proc.poll() is not None:
                pytest.fail(f"the server exited ({served.proc.returncode}):\n{served.tail()}")
            return http_get(f"http://127.0.0.1:{serve_port}/health") is not None

        wait_until("transformers serve", up, 180)
        yield Server(served, records, mode)
    finally:
        served.stop()


# -- over HTTP, from another process ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.subprocess_only
def test_a_whole_response_carries_server_timing_equal_to_its_record(server: Server) -> None:
    status, headers, body = server.post(server.body(), {"x-request-id": f"raw-{server.mode}-1"})
    assert status == 200
    assert headers["x-request-id"] == f"raw-{server.mode}-1"
    record = server.record(f"raw-{server.mode}-1")
    assert_equal_to_record(headers["server-timing"], record, server.mode)
    assert record["kind"] == server.mode
    assert record["output_tokens"] == json.loads(body)["usage"]["completion_tokens"]  # the same request


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_the_openai_client_sends_its_id_and_reads_the_timing(server: Server) -> None:
    rid = f"openai-{server.mode}-1"
    raw = server.openai().chat.completions.with_raw_response.create(
        model="./tiny", messages=[{"role": "user", "content": "the quick brown fox"}], max_tokens=5,
        extra_headers={"x-request-id": rid})
    completion = raw.parse()
    assert raw.headers["x-request-id"] == rid
    record = server.record(rid)
    assert_equal_to_record(raw.headers["server-timing"], record, server.mode)
    assert record["output_tokens"] == completion.usage.completion_tokens
    assert record["input_tokens"] == completion.usage.prompt_tokens


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_a_request_without_an_id_gets_a_uuid_that_is_its_records_id(server: Server) -> None:
    status, headers, body = server.post(server.body())
    rid = headers["x-request-id"]
    assert status == 200 and UUID4.match(rid), rid
    assert json.loads(body)["id"] == rid  # transformers uses the id it echoes
    assert_equal_to_record(headers["server-timing"], server.record(rid), server.mode)


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_a_streamed_response_carries_its_id_and_no_timing_and_its_body_is_transformers(server: Server) -> None:
    rid = f"stream-{server.mode}-1"
    status, headers, body = server.post(server.body(stream=True), {"x-request-id": rid})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["x-request-id"] == rid
    assert "server-timing" not in headers
    lines = [line for line in body.decode().split("\n") if line]
    assert lines and all(line.startswith("data: ") for line in lines), lines  # no comment, no event of gpuprobe's
    chunks = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
    usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    record = server.record(rid)
    assert record["output_tokens"] == usage[-1]["completion_tokens"]


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_the_openai_client_streams_with_its_id(server: Server) -> None:
    rid = f"openai-stream-{server.mode}"
    with server.openai().chat.completions.with_streaming_response.create(
            model="./tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True,
            stream_options={"include_usage": True}, extra_headers={"x-request-id": rid}) as response:
        assert response.headers["x-request-id"] == rid
        assert "server-timing" not in response.headers
        usage = [chunk.usage for chunk in response.parse() if chunk.usage is not None]
    assert server.record(rid)["output_tokens"] == usage[-1].completion_tokens


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_a_long_id_is_cut_to_128_characters_everywhere(server: Server) -> None:
    long_id = "L" + "0123456789" * 30
    status, headers, body = server.post(server.body(tokens=3), {"x-request-id": long_id})
    assert status == 200
    assert headers["x-request-id"] == long_id[:128]
    assert json.loads(body)["id"] == long_id[:128]
    assert_equal_to_record(headers["server-timing"], server.record(long_id[:128]), server.mode)


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_characters_outside_printable_ascii_are_never_echoed(server: Server) -> None:
    # uvicorn's HTTP parser (h11) lets a tab, other control characters but NUL, and bytes from 0x80 on through
    # in a header's value; each is replaced by "?" before transformers sees the id.
    status, headers, body = server.post(server.body(tokens=3), {"x-request-id": "tab\there\xe9\x01\x1b\x7fend"})
    assert status == 200
    assert headers["x-request-id"] == "tab?here????end"
    assert json.loads(body)["id"] == "tab?here????end"
    assert_equal_to_record(headers["server-timing"], server.record("tab?here????end"), server.mode)


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_a_megabyte_id_or_a_nul_is_refused_and_nothing_is_echoed(server: Server) -> None:
    huge = "M" * 1_000_000
    for hostile in (huge, "nul\x00id"):
        try:
            status, headers, body = server.post(server.body(tokens=2), {"x-request-id": hostile})
        except (ConnectionError, http.client.HTTPException):  # the HTTP parser closed the connection: refused
            continue
        assert status >= 400
        assert hostile not in body.decode("latin-1") and all(hostile not in v for v in headers.values())
    assert server.post(server.body(tokens=2))[0] == 200  # and the server serves on
    assert max(len(r["request_id"]) for r in server.records()) <= 128


# -- the app in this process ----------------------------------------------------------------------------

def _asgi_chat(app: Any, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[dict[str, bytes], bytes]:
    """One chat completion given straight to the ASGI app (no HTTP parser in between): the response's
    headers and body."""
    sent: list[dict[str, Any]] = []

    async def exchange() -> None:
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)  # no disconnect while the answer is made
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
                 "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                             *headers]}
        await asyncio.wait_for(app(scope, receive, send), 120)

    asyncio.run(exchange())
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 200, sent
    answer = {}
    for name, value in start["headers"]:
        assert name.lower() not in answer, f"{name!r} twice"
        answer[name.lower().decode()] = value
    return answer, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def in_process() -> Iterator[Any]:
    from _serve_app import serving

    hf.instrument_all()
    try:
        with serving() as server:
            yield server
    finally:
        hf.uninstrument_all()


def test_an_id_no_http_parser_would_pass_reaches_the_app_cleaned(in_process: Any) -> None:
    hostile = b"a\r\nset-cookie: x\x00" + b"y" * 1_000_000
    expected = "a??set-cookie: x?" + "y" * (128 - 17)
    headers, body = _asgi_chat(in_process.app, [(b"x-request-id", hostile)], in_process.chat_body())
    assert headers["x-request-id"] == expected.encode()
    assert json.loads(body)["id"] == expected
    record = gpuprobe.requests()[-1]
    assert record.request_id == expected
    assert_equal_to_record(headers["server-timing"].decode(), record.as_dict(), "generate")


def test_the_requests_generate_call_takes_its_id_on_the_inference_thread(in_process: Any) -> None:
    for i, stream in enumerate((False, True, False)):
        assert in_process.chat(stream=stream, request_id=f"in-process-{i}").status == 200
    assert [r.request_id for r in gpuprobe.requests()] == ["in-process-0", "in-process-1", "in-process-2"]
    assert all(r.kind == "generate" for r in gpuprobe.requests())


@pytest.mark.parametrize("where", ["arrival", "response start"])
def test_a_failure_inside_the_middleware_leaves_the_answer_and_turns_its_seams_off(
        in_process: Any, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    healthy = in_process.chat(request_id="before")
    assert healthy.header("server-timing") is not None

    def broken(*args: Any) -> Any:
        raise RuntimeError("a fault injected into gpuprobe")

    if where == "arrival":  # reading the request's id
        monkeypatch.setattr(serve_app, "clean_request_id", broken)
    else:
        monkeypatch.setattr(serve_app.Exchange, "started", broken)
    with pytest.warns(RuntimeWarning, match=r"seam transformers\.serving\.app .*failed"):
        faulted = in_process.chat(request_id="during")
    after = in_process.chat(request_id="after")
    for answer in (faulted, after):
        assert answer.status == 200 and answer.header("server-timing") is None
        assert answer.json()["choices"] == healthy.json()["choices"]  # the same greedy answer
        assert answer.json()["usage"] == healthy.json()["usage"]
    assert (faulted.header("x-request-id"), after.header("x-request-id")) == ("during", "after")
    states = {s["seam"]: s["state"] for s in gpuprobe.info()["seams"] if s["seam"].startswith("transformers.serving.")}
    assert states == {"transformers.serving.app": "off", "transformers.serving.submit": "off",
                      "transformers.serving.async_submit": "off"}


def test_an_app_built_while_instrumented_passes_requests_through_once_uninstrumented(in_process: Any) -> None:
    assert in_process.chat(request_id="timed").header("server-timing") is not None
    hf.uninstrument_all()
    answer = in_process.chat(request_id="passed through")
    assert answer.status == 200 and answer.header("server-timing") is None
    assert answer.header("x-request-id") == "passed through"  # transformers' own echo
    assert serve_app.SEAM_APP.installs == serve_app.SEAM_SUBMIT.installs == 0


def test_a_callable_submitted_while_serving_a_request_runs_in_its_context() -> None:
    from gpuprobe._requests import current_request_id, given_request_id

    def read() -> str | None:
        return current_request_id()

    assert serve_app.in_request_context(read) is read  # outside a request: untouched
    with given_request_id("ctx-1"):
        wrapped = serve_app.in_request_context(read)
    seen: list[str | None] = []
    worker = threading.Thread(target=lambda: seen.extend([read(), wrapped()]))
    worker.start()
    worker.join()
    assert seen == [None, "ctx-1"]  # a thread of its own has no id; the wrapped callable has the request's


def test_the_seams_go_on_when_the_server_module_is_imported_after_instrument_all(tmp_path: Path) -> None:
    code = "\n".join([
        "import sys",
        "from gpuprobe import _seams",
        "from gpuprobe.integrations import transformers as hf",
        "hf.instrument_all()",
        "print('transformers.cli.serving.server' in sys.modules)",
        "import transformers.cli.serving as package",
        "from transformers.cli.serving import server",
        "print(_seams.is_replacement(server.build_server), _seams.is_replacement(package.build_server))",
        "hf.uninstrument_all()",
        "print(_seams.is_replacement(server.build_server))",
    ])
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env=child_env())
    assert done.stdout.split() == ["False", "True", "True", "False"], done.stderr[-2000:]
