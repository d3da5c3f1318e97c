"""A caller's W3C ``traceparent`` under ``gpuprobe run -- transformers serve ./tiny --device cpu`` (plain and
``--continuous-batching``): the request's span, sent over OTLP/HTTP to a real receiver in this process that
decodes the protobuf, is a child of the caller's span in the caller's trace, and the response names it in
``traceresponse``; nothing of the prompt's text is in what was exported."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("accelerate")
pytest.importorskip("opentelemetry.sdk.trace")

from _servekit import Served, child_env, free_port, http_get, wait_until  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from otlp_receiver import Receiver  # noqa: E402

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
PROMPT = "a distinctive prompt about zebras"


@pytest.fixture(scope="module", params=["generate", pytest.param("continuous_batching",
                                                                   marks=pytest.mark.continuous_batching)])
def traced(request: pytest.FixtureRequest, tiny_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Receiver, str]]:
    mode = request.param
    folder = tmp_path_factory.mktemp(f"traceparent-{mode}")
    receiver = Receiver(signal="traces")
    serve_port, metrics_port = free_port(), free_port()
    args = ["transformers", "serve", "./tiny", "--device", "cpu", "--host", "127.0.0.1", "--port", str(serve_port)]
    if mode == "continuous_batching":
        args += ["--continuous-batching", "--cb-num-blocks", "64", "--cb-max-batch-tokens", "64"]
    served = Served(args, cwd=tiny_model.parent, metrics_port=metrics_port, log=folder / "serve.log",
                    env=child_env(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.url))
    try:
        def up() -> bool:
            if served.proc.poll() is not None:
                pytest.fail(f"the server exited ({served.proc.returncode}):\n{served.tail()}")
            return http_get(f"http://127.0.0.1:{serve_port}/health") is not None

        wait_until("transformers serve", up, 180)
        yield serve_port, receiver, mode
    finally:
        served.stop()
        receiver.close()


def post(port: int, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    body = {"model": "./tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5, "stream": False}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"content-type": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_the_request_span_joins_the_caller_s_trace_and_the_response_names_it(traced: Any) -> None:
    port, receiver, mode = traced
    status, headers, body = post(port, {"x-request-id": f"traced-{mode}",
                                        "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
                                        "tracestate": "vendor=value"})
    assert status == 200
    version, trace_id, span_id, flags = headers["traceresponse"].split("-")
    assert (version, trace_id, flags) == ("00", CALLER_TRACE, "01")

    def request_span() -> Any:
        return [s for s, _ in receiver.spans() if s.span_id.hex() == span_id]

    (span,) = wait_until("the request's span at the receiver", request_span, 30)
    attributes = {kv.key: kv.value for kv in span.attributes}
    assert span.name == "text_completion " + attributes["gen_ai.request.model"].string_value
    assert span.trace_id.hex() == CALLER_TRACE and span.parent_span_id.hex() == CALLER_SPAN
    assert span.trace_state == "vendor=value"
    assert attributes["gpuprobe.request_id"].string_value == f"traced-{mode}"
    assert attributes["gpuprobe.request.kind"].string_value == mode
    assert attributes["gen_ai.usage.output_tokens"].int_value == json.loads(body)["usage"]["completion_tokens"]
    children = [s for s, _ in receiver.spans() if s.parent_span_id.hex() == span_id]
    assert {c.name for c in children} >= {"prefill", "decode"}
    assert ("queue" in {c.name for c in children}) == (mode == "continuous_batching")
    wire = b"".join(req.SerializeToString() for req in receiver.requests)
    assert b"zebras" not in wire and PROMPT.encode() not in wire


@pytest.mark.slow
@pytest.mark.subprocess_only
def test_a_request_without_traceparent_starts_a_trace_of_its_own(traced: Any) -> None:
    port, receiver, mode = traced
    status, headers, _ = post(port, {"x-request-id": f"untraced-{mode}"})
    assert status == 200
    _, trace_id, span_id, _ = headers["traceresponse"].split("-")
    assert trace_id != CALLER_TRACE
    (span,) = wait_until("the request's span at the receiver",
                         lambda: [s for s, _ in receiver.spans() if s.span_id.hex() == span_id], 30)
    assert span.trace_id.hex() == trace_id and span.parent_span_id == b""
