"""A request's spans written straight from its record (``request_wire``, what OTLP export sends) against the
same spans planned (``span_plan``) and written by the general writer: byte for byte, for records of every
shape, and the bytes decode (opentelemetry-proto) as the SDK's own encoder writes the planned spans."""

from __future__ import annotations

import itertools
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

from gpuprobe._requests import RequestRecord  # noqa: E402
from gpuprobe.exporters._otlp_spans import SpanData, encode_request, encode_written  # noqa: E402
from gpuprobe.exporters.traces import request_wire, span_plan  # noqa: E402

RESOURCE = {"service.name": "gpuprobe", "telemetry.sdk.name": "gpuprobe"}
TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
FLAGS = TraceFlags(TraceFlags.SAMPLED)


def _ids() -> Any:
    return itertools.count(0x1000).__next__  # the same ids, in the same order, for both writers


def planned(record: RequestRecord) -> list[SpanData]:
    """The plan of ``record`` as the general writer's spans: the caller's span the request span's parent,
    its trace state on every span, its remote flag on the request span alone."""
    parent = record.parent
    state = ",".join(f"{k}={v}" for k, v in parent.trace_state.items()) if parent is not None else ""
    out = []
    for p in span_plan(record, _ids()):
        own = p.parent_id is None
        out.append(SpanData(TRACE, p.span_id, (parent.span_id if parent is not None else None) if own else p.parent_id,
                            state, p.name, p.start_ns, p.end_ns, p.attributes, p.events, p.links, p.error,
                            parent_remote=bool(own and parent is not None and parent.is_remote)))
    return out


def sdk_encoding(record: RequestRecord) -> ExportTraceServiceRequest:
    parent = record.parent
    state = parent.trace_state if parent is not None else None
    plan = span_plan(record, _ids())
    contexts = {p.span_id: SpanContext(TRACE, p.span_id, False, FLAGS, state) for p in plan}
    spans = [ReadableSpan(
        p.name, context=contexts[p.span_id], parent=contexts[p.parent_id] if p.parent_id is not None else parent,
        resource=Resource(RESOURCE), attributes=p.attributes, events=[Event(n, a, t) for n, t, a in p.events],
        kind=SpanKind.INTERNAL, links=[Link(SpanContext(int(t, 16), int(s, 16), False, FLAGS)) for t, s in p.links],
        status=Status(StatusCode.ERROR, p.error) if p.error else Status(StatusCode.UNSET), start_time=p.start_ns,
        end_time=p.end_ns, instrumentation_scope=InstrumentationScope("gpuprobe", "0.1.0")) for p in plan]
    decoded = ExportTraceServiceRequest()
    decoded.ParseFromString(encode_spans(spans).SerializeToString())
    return decoded


def check(record: RequestRecord) -> None:
    direct = encode_written(RESOURCE, "gpuprobe", "0.1.0", request_wire(record, TRACE, _ids()))
    assert direct == encode_request(RESOURCE, "gpuprobe", "0.1.0", planned(record))
    decoded = ExportTraceServiceRequest()
    decoded.ParseFromString(direct)
    assert decoded == sdk_encoding(record)


T0 = 1_796_225_749.9908004
floats = st.floats(min_value=0, max_value=1e4, allow_nan=False)
counts = st.integers(min_value=0, max_value=10**7)
gaps = st.lists(st.tuples(st.integers(0, 5000), st.floats(0, 2, allow_nan=False), st.floats(0, 60, allow_nan=False)),
                max_size=20).map(tuple)
ids = st.one_of(st.text(min_size=1, max_size=80), st.just("1153-3"))
link = st.tuples(st.integers(1, 2**128 - 1).map(lambda n: f"{n:032x}"), st.integers(1, 2**64 - 1).map(lambda n: f"{n:016x}"))
parents = st.one_of(st.none(), st.builds(
    lambda span, remote, sampled, state: SpanContext(TRACE, span, remote, TraceFlags(1 if sampled else 0),
                                                     TraceState(state) if state else None),
    st.integers(1, 2**64 - 1), st.booleans(), st.booleans(),
    st.lists(st.tuples(st.sampled_from(["vendor", "a", "rojo"]), st.sampled_from(["v", "00f067aa0ba902b7"])),
             max_size=2, unique_by=lambda kv: kv[0])))


@st.composite
def records(draw: Any) -> RequestRecord:
    optional = st.one_of(st.none(), floats)
    started = T0 + draw(st.floats(0, 1000, allow_nan=False))
    return RequestRecord(
        request_id=draw(ids), model=draw(st.one_of(st.just("tiny"), st.text(max_size=60))),
        duration_s=draw(floats), kind=draw(st.sampled_from(["generate", "continuous_batching"])),
        batch_size=draw(st.one_of(st.none(), st.integers(1, 4096))), input_tokens=draw(st.one_of(st.none(), counts)),
        output_tokens=draw(st.one_of(st.none(), counts)),
        finish_reason=draw(st.one_of(st.none(), st.sampled_from(["length", "eos", "stop", "cancelled", "error"]))),
        error=draw(st.one_of(st.none(), st.sampled_from(["RuntimeError", "torch.OutOfMemoryError"]))),
        queue_s=draw(optional), prefill_s=draw(optional), ttft_s=draw(optional), decode_s=draw(optional),
        tpot_s=draw(optional), itl_p50_s=draw(optional), itl_max_s=draw(optional),
        host_syncs=draw(st.one_of(st.none(), counts)), device_s=draw(optional), step_time_s=draw(optional),
        kv_block_seconds=draw(optional), cached_tokens=draw(st.one_of(st.none(), counts)),
        preemptions=draw(st.one_of(st.none(), st.integers(0, 300))), interference_s=draw(optional),
        started_at=started, ended_at=started + draw(st.floats(-1, 100, allow_nan=False)),
        max_tokens=draw(st.one_of(st.none(), counts)), temperature=draw(optional), top_p=draw(optional),
        top_k=draw(st.one_of(st.none(), st.integers(0, 1000))), steps_sampled=draw(gaps),
        span_id=draw(st.one_of(st.none(), st.integers(1, 2**64 - 1).map(lambda n: f"{n:016x}"))),
        capture=draw(st.one_of(st.none(), st.text(max_size=100))),
        step_links=tuple(draw(st.lists(link, max_size=5))), parent=draw(parents))


@settings(max_examples=300, deadline=None)
@given(record=records())
def test_a_record_written_straight_is_its_plan_written_byte_for_byte(record: RequestRecord) -> None:
    check(record)


def test_the_shapes_a_request_takes() -> None:
    gaps16 = tuple((i, 0.004 + i * 1e-5, 0.004 * (i + 1)) for i in range(15))
    base = dict(request_id="r-1", model="tiny", duration_s=0.071, batch_size=1, input_tokens=8, output_tokens=16,
                finish_reason="length", started_at=T0, ended_at=T0 + 0.071, max_tokens=16, span_id="31ff25bc33ad0fb9")
    shapes = {
        "generate, 16 tokens": dict(prefill_s=0.0087, ttft_s=0.0087, decode_s=0.0623, tpot_s=0.0042,
                                    itl_p50_s=0.0041, itl_max_s=0.0047, steps_sampled=gaps16),
        "one token": dict(output_tokens=1, prefill_s=0.0087, ttft_s=0.0087, decode_s=0.0),
        "continuous batching": dict(kind="continuous_batching", queue_s=0.002, prefill_s=0.004, ttft_s=0.006,
                                    decode_s=0.05, step_time_s=0.03, kv_block_seconds=1.5, cached_tokens=128,
                                    preemptions=1, interference_s=0.004,
                                    step_links=(("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"),)),
        "error": dict(error="RuntimeError", finish_reason="error", prefill_s=None, ttft_s=None, decode_s=None),
        "a caller's remote span": dict(prefill_s=0.0087, ttft_s=0.0087, decode_s=0.0623,
                                       parent=SpanContext(TRACE, 0x00F067AA0BA902B7, True, FLAGS,
                                                          TraceState([("rojo", "00f067aa0ba902b7")]))),
        "long": dict(output_tokens=4000, prefill_s=0.2, ttft_s=0.2, decode_s=30.0, host_syncs=4001,
                     steps_sampled=tuple((i * 250, 0.0075, 0.0075 * i * 250) for i in range(16))),
        "a model of another script": dict(model="Qwen/Qwen2.5-0.5B-Instruct", request_id="é" * 200),
        "ended before it started (a clock step)": dict(ended_at=T0 - 1.0, prefill_s=0.5, ttft_s=0.5, decode_s=0.5),
    }
    for name, over in shapes.items():
        record = RequestRecord(**{**base, **over})
        check(record)
