"""gpuprobe's own writer of OTLP spans (gpuprobe/exporters/_otlp_spans.py) against the OpenTelemetry SDK's
encoder: the same spans, written both ways, decode with opentelemetry-proto to equal messages."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.common.trace_encoder")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import Event, ReadableSpan  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState  # noqa: E402

from gpuprobe.exporters._otlp_spans import SpanData, encode_request  # noqa: E402

SCOPE = InstrumentationScope("gpuprobe", "0.1.0")
RESOURCE = {"service.name": "gpuprobe", "telemetry.sdk.name": "gpuprobe", "rank": "0"}

values = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-2**63, 2**63 - 1),
                   st.booleans(), st.text(max_size=200), st.lists(st.text(max_size=20), max_size=4))
attributes = st.dictionaries(st.text(min_size=1, max_size=40), values, max_size=8)


def both(span: dict[str, Any]) -> tuple[ExportTraceServiceRequest, ExportTraceServiceRequest]:
    flags = TraceFlags(TraceFlags.SAMPLED)
    state = TraceState(span["state"]) if span["state"] else None
    parent = None
    if span["parent"] is not None:
        parent = SpanContext(span["trace"], span["parent"], span["remote"], flags, state)
    sdk = ReadableSpan(
        span["name"], context=SpanContext(span["trace"], span["id"], False, flags, state), parent=parent,
        resource=Resource(RESOURCE), attributes=span["attributes"],
        events=[Event(n, a, t) for n, t, a in span["events"]], kind=SpanKind.INTERNAL,
        links=[Link(SpanContext(int(t, 16), int(s, 16), False, flags)) for t, s in span["links"]],
        status=Status(StatusCode.ERROR, span["error"]) if span["error"] else Status(StatusCode.UNSET),
        start_time=span["start"], end_time=span["end"], instrumentation_scope=SCOPE)
    ours = SpanData(span["trace"], span["id"], span["parent"], ",".join(f"{k}={v}" for k, v in span["state"]),
                    span["name"], span["start"], span["end"], span["attributes"], span["events"], span["links"],
                    span["error"], parent_remote=span["remote"])
    a, b = ExportTraceServiceRequest(), ExportTraceServiceRequest()
    a.ParseFromString(encode_spans([sdk]).SerializeToString())
    b.ParseFromString(encode_request(RESOURCE, "gpuprobe", "0.1.0", [ours]))
    return a, b


def a_span(rng: random.Random, **over: Any) -> dict[str, Any]:
    span = {"trace": rng.getrandbits(128) or 1, "id": rng.getrandbits(64) or 1, "parent": None, "remote": False,
            "state": [], "name": "text_completion tiny", "start": 1_796_170_000_000_000_000,
            "end": 1_796_170_000_250_000_000, "attributes": {"gen_ai.request.model": "tiny", "gen_ai.latency.e2e": 0.25,
                                                             "gen_ai.usage.output_tokens": 12,
                                                             "gen_ai.response.finish_reasons": ["length"]},
            "events": [], "links": [], "error": None}
    span.update(over)
    return span


@pytest.mark.parametrize("case", ["plain", "child", "remote parent", "error", "events and links", "big"])
def test_a_request_s_spans_decode_as_the_sdk_s_encoding_of_them(case: str) -> None:
    rng = random.Random(case)
    over: dict[str, Any] = {
        "plain": {},
        "child": {"parent": rng.getrandbits(64) or 1, "name": "decode"},
        "remote parent": {"parent": 0x00F067AA0BA902B7, "remote": True, "state": [("vendor", "value"), ("a", "b")]},
        "error": {"error": "RuntimeError", "attributes": {"error.type": "RuntimeError"}},
        "events and links": {"events": [("gpuprobe.step", 1_796_170_000_100_000_000 + i,
                                         {"gpuprobe.step.token": i + 1, "gpuprobe.step.host_s": 0.004 * i})
                                        for i in range(16)],
                             "links": [(f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}")
                                       for _ in range(3)]},
        "big": {"attributes": {f"gpuprobe.k{i}": "é" * 300 + str(i) for i in range(40)} | {"n": 2**62, "neg": -5}},
    }[case]
    sdk, ours = both(a_span(rng, **over))
    assert ours == sdk


@settings(max_examples=200, deadline=None)
@given(attrs=attributes, name=st.text(max_size=80), error=st.one_of(st.none(), st.text(min_size=1, max_size=50)))
def test_any_attributes_decode_as_the_sdk_writes_them(attrs: dict[str, Any], name: str, error: str | None) -> None:
    sdk, ours = both(a_span(random.Random(0), attributes=attrs, name=name, error=error))
    assert ours == sdk
