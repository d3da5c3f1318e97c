"""Traces: one OpenTelemetry span per request, in the GenAI semantic conventions, made from the request's
record after it ended (never a span opened per token), with its queue, prefill and decode as child
spans, a few of its steps as events, and the caller's trace joined.

Where spans go (the ``traces`` setting, docs/tracing.md):

- to your ``TracerProvider`` when you set one (``gpuprobe.configure(tracer_provider=...)``, or the global one
  ``opentelemetry.trace.set_tracer_provider`` or ``opentelemetry-instrument`` sets);
- else over OTLP/HTTP (protobuf) to the endpoint the standard variables name,
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces`` (with
  ``traces=on``, ``http://localhost:4318/v1/traces`` when neither is set), sampled as
  ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` say.

How, so that the program pays little and is never stopped:

- When a request ends, its thread only gives the record ids (the caller's trace id, or a new one, and a
  span id) and appends it to a bounded queue (4,096 records: past it, records are dropped and counted
  in ``gpuprobe.telemetry.dropped{reason="span_queue_full"}``). The ids are known at once, so a server's
  response can name the trace (``traceresponse``).
- A thread of the exporter's own (``gpuprobe-traces``) turns records into spans once their last figures
  are in (a continuous-batching request's share of the steps, a GPU's device time: at most 2 s later),
  and sends them in batches of 512: to an SDK ``TracerProvider``'s own span processors as finished spans
  that keep gpuprobe's ids (its sampler decides, its resource applies); to any other provider through its
  tracer; or OTLP with a deadline of ``otlp_timeout`` for each batch (failures counted as
  ``span_export_failed`` and warned once), each request's spans written in protobuf's wire format straight
  from its record (:func:`request_wire`), without span objects.
- Exemplars: a span the sampler keeps becomes, on that thread, the exemplar of the buckets its request's
  TTFT, duration, queue time and longest token gap fell in (series the integration prepared: no label is
  looked up), and a lost batch's spans are forgotten again; a continuous-batching step that is a span is the
  exemplar of its step-duration bucket, from the drain that made it. Why not on the request's thread: the
  four offers cost a request 18 us there (median, a tiny Llama's ``generate()`` between them: cold caches),
  half of what ending it costs with traces on.
- At exit (or ``configure()``), what is queued is sent within one deadline; nothing raises into the program.

No prompt or completion text and no token ids are ever on a span.
"""

from __future__ import annotations

import atexit
import operator
import os
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .._lifecycle import Owner
from .._requests import RequestRecord
from .._version import __version__
from . import _otlp_spans as wire
from ._otlp_spans import SpanData, encode_request, encode_written
from ..errors import ConfigError, missing
from ..runtime import Runtime, runtime

try:
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace import sampling as otel_sampling
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
except ImportError as exc:  # pragma: no cover - the otel extra
    raise missing("opentelemetry-sdk", "otel") from exc

__all__ = ["TraceExporter", "span_plan", "PlannedSpan", "traces_endpoint", "OPERATION", "PROVIDER"]

OPERATION = "text_completion"  # gen_ai.operation.name of generation from token ids (as the metrics say)
PROVIDER = "transformers"
_QUEUE = 4096  # records waiting for their spans at most
_BATCH = 512  # spans a batch at most
_SPAN_BITS = (1 << 64) - 1
_forks = 0  # forks this process is the child of: an exporter made before one makes no spans after it
_INTERVAL = 1.0  # seconds between two rounds of the exporter's thread
_SETTLE_S = 2.0  # a record whose last figures are not in after this is sent without them
_EVENTS = 16  # step events on a decode span at most (sampled_gaps' bound)
_SCOPE = InstrumentationScope("gpuprobe", __version__)
_STEPS = 1024  # continuous-batching step spans waiting for their requests at most
_STEP_WAIT_S = 30.0  # a step whose requests have not all ended after this is sent with the links it has
_LINKS = 64  # links of a step span at most


def traces_endpoint(default: bool) -> str | None:
    """The OTLP/HTTP traces URL the standard variables name (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is,
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``), else OTLP's default when ``default``; None for none.
    ``OTEL_TRACES_EXPORTER=none`` and ``OTEL_SDK_DISABLED=true`` name none."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return None
    url = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if url:
        return url
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + "/v1/traces"
    return "http://localhost:4318/v1/traces" if default else None


# The default sampler, one object: the exporter knows its decision without asking it (a parent's sampled flag,
# else on), which saves the SDK's context and decision objects per request (7 % of the exporter thread's time
# in a profile of 2,000 one-token requests).
_PARENT_OR_ON = otel_sampling.ParentBased(otel_sampling.ALWAYS_ON)


def _sampler_from_environment(warn: Callable[[str, str], None]) -> Any:
    """The sampler ``OTEL_TRACES_SAMPLER`` / ``_ARG`` name (parentbased_always_on by default); a value that
    cannot be used is warned and defaulted."""
    name = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower() or "parentbased_always_on"
    arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    rate = 1.0
    if name.endswith("traceidratio"):
        try:
            rate = float(arg) if arg else 1.0
            if not 0.0 <= rate <= 1.0:
                raise ValueError
        except ValueError:
            warn("traces:sampler-arg", f"gpuprobe: OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio from 0 to 1; "
                                       "using 1.0 instead")
            rate = 1.0
    samplers: dict[str, Any] = {
        "always_on": otel_sampling.ALWAYS_ON, "always_off": otel_sampling.ALWAYS_OFF,
        "traceidratio": otel_sampling.TraceIdRatioBased(rate),
        "parentbased_always_on": _PARENT_OR_ON,
        "parentbased_always_off": otel_sampling.ParentBased(otel_sampling.ALWAYS_OFF),
        "parentbased_traceidratio": otel_sampling.ParentBasedTraceIdRatio(rate),
    }
    found = samplers.get(name)
    if found is None:
        warn("traces:sampler", f"gpuprobe: OTEL_TRACES_SAMPLER={name!r} is not one gpuprobe knows "
                               f"({', '.join(samplers)}); using parentbased_always_on instead")
        found = samplers["parentbased_always_on"]
    return found


# -- what a request's spans are ------------------------------------------------------------------------

class PlannedSpan:
    """One span of a request, as plain data: what either way of sending it (finished spans, a tracer) needs."""

    __slots__ = ("name", "span_id", "parent_id", "start_ns", "end_ns", "attributes", "events", "error", "links")

    def __init__(self, name: str, span_id: int, parent_id: int | None, start_ns: int, end_ns: int,
                 attributes: dict[str, Any], events: list[tuple[str, int, dict[str, Any]]] | None = None,
                 error: str | None = None, links: list[tuple[str, str]] | None = None) -> None:
        self.name = name
        self.span_id = span_id
        self.parent_id = parent_id  # None: the request span itself (its parent is the caller's, if any)
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.attributes = attributes
        self.events = events or []
        self.error = error
        self.links = links or []  # (trace id, span id) in hex: spans in other traces this one is linked to


_OPTIONAL = (  # record field -> span attribute, set where the record has the figure
    ("max_tokens", "gen_ai.request.max_tokens"), ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"), ("top_k", "gen_ai.request.top_k"),
    ("queue_s", "gen_ai.latency.time_in_queue"), ("ttft_s", "gen_ai.latency.time_to_first_token"),
    ("prefill_s", "gen_ai.latency.time_in_model_prefill"), ("decode_s", "gen_ai.latency.time_in_model_decode"),
    ("batch_size", "gpuprobe.batch_size"), ("tpot_s", "gpuprobe.tpot_s"), ("itl_p50_s", "gpuprobe.itl_p50_s"),
    ("itl_max_s", "gpuprobe.itl_max_s"), ("host_syncs", "gpuprobe.host_syncs"), ("device_s", "gpuprobe.device_s"),
    ("step_time_s", "gpuprobe.step_time_s"), ("kv_block_seconds", "gpuprobe.kv_block_seconds"),
    ("cached_tokens", "gpuprobe.cached_tokens"), ("preemptions", "gpuprobe.preemptions"),
    ("interference_s", "gpuprobe.interference_s"), ("capture", "gpuprobe.capture"),
)


def span_plan(record: RequestRecord, new_id: Callable[[], int]) -> list[PlannedSpan]:
    """The spans of one request: its own (``{operation} {model}``, the GenAI attributes, the latencies under
    vLLM's and SGLang's ``gen_ai.latency.*`` keys, gpuprobe's figures under ``gpuprobe.``), then its queue,
    prefill and decode with their real start and end times; a few of its token gaps as events of decode.

    Times come from the record: its start (``started_at``), then queue, prefill and decode in turn (ttft =
    queue + prefill), decode from the first token to the last.
    """
    start = int(record.started_at * 1e9)
    end = max(start, int(record.ended_at * 1e9))
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": OPERATION, "gen_ai.provider.name": PROVIDER, "gen_ai.request.model": record.model,
        "gen_ai.latency.e2e": record.duration_s, "gpuprobe.request_id": record.request_id,
        "gpuprobe.request.kind": record.kind,
    }
    if record.input_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = record.input_tokens
    if record.output_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = record.output_tokens * (record.batch_size or 1)
    if record.finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = [record.finish_reason]
    for field, key in _OPTIONAL:
        value = getattr(record, field)
        if value is not None:
            attributes[key] = value
    if record.error is not None:
        attributes["error.type"] = record.error
    own = int(record.span_id, 16) if record.span_id else new_id()
    spans = [PlannedSpan(f"{OPERATION} {record.model}", own, None, start, end, attributes, error=record.error,
                         links=list(record.step_links))]
    at = start
    if record.queue_s is not None:
        queued = min(end, at + int(record.queue_s * 1e9))
        spans.append(PlannedSpan("queue", new_id(), own, at, queued, {"gen_ai.latency.time_in_queue": record.queue_s}))
        at = queued
    if record.prefill_s is not None:
        prefilled = min(end, at + int(record.prefill_s * 1e9))
        spans.append(PlannedSpan("prefill", new_id(), own, at, prefilled,
                                 {"gen_ai.latency.time_in_model_prefill": record.prefill_s}))
        at = prefilled
    if record.decode_s is not None and record.ttft_s is not None:
        first = min(end, start + int(record.ttft_s * 1e9))
        last = min(end, first + int(record.decode_s * 1e9))
        # An event at the moment each sampled token reached the host: token k + 1 came gap k after token k.
        events = [("gpuprobe.step", min(last, first + int(at * 1e9)),
                   {"gpuprobe.step.token": index + 1, "gpuprobe.step.host_s": gap})
                  for index, gap, at in record.steps_sampled[:_EVENTS]]
        spans.append(PlannedSpan("decode", new_id(), own, first, last,
                                 {"gen_ai.latency.time_in_model_decode": record.decode_s}, events))
    return spans


# -- a request's spans written straight from its record (OTLP) ------------------------------------------

_PACK_Q = struct.Struct("<Q").pack
_PACK_D = struct.Struct("<d").pack
_KIND = b"\x30\x01"  # Span.kind: INTERNAL
_STATUS_UNSET = b"\x7a\x00"  # Span.status, empty
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # Span.flags: HAS_IS_REMOTE
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)  # and IS_REMOTE
_CHILD_HEADS = {  # a child span's name and kind, and its one attribute's bytes before its (float) value
    name: (wire.string_field(5, name) + _KIND, wire.attribute(9, key, 0.5)[:-8])
    for name, key in (("queue", "gen_ai.latency.time_in_queue"), ("prefill", "gen_ai.latency.time_in_model_prefill"),
                      ("decode", "gen_ai.latency.time_in_model_decode"))}
_EVENT_NAME = wire.string_field(2, "gpuprobe.step")
_E2E_HEAD = wire.attribute(9, "gen_ai.latency.e2e", 0.5)[:-8]


def _event_struct() -> tuple[struct.Struct, bytes, bytes, bytes]:
    """A decode step event of a token index below 128, as one ``struct``: its bytes are fixed but for its time,
    token index and gap (the ``Span.events`` field: tag, length, time, name, the two attributes)."""
    middle = _EVENT_NAME + wire.attribute(3, "gpuprobe.step.token", 1)[:-1]
    host = wire.attribute(3, "gpuprobe.step.host_s", 0.5)[:-8]
    length = 9 + len(middle) + 1 + len(host) + 8
    assert length < 0x80
    return struct.Struct(f"<3sQ{len(middle)}sB{len(host)}sd"), bytes((11 << 3 | 2, length, 0x09)), middle, host


_EVENT, _EVENT_HEAD, _EVENT_MIDDLE, _EVENT_HOST = _event_struct()
_OWN_HEADS: dict[tuple[str, str], tuple[bytes, bytes, bytes]] = {}  # (model, kind) -> see _own_heads
# The optional attributes: the record's values in one call, and per key its bytes before a float or a small
# integer value (every key is short enough for both).
_OPTIONAL_VALUES = operator.attrgetter(*(field for field, _ in _OPTIONAL))
_OPTIONAL_HEADS = tuple((key, wire.attribute(9, key, 0.5)[:-8], wire.attribute(9, key, 1)[:-1]) for _, key in _OPTIONAL)


def _own_heads(model: str, kind: str) -> tuple[bytes, bytes, bytes]:
    """The request span's bytes that only its model and kind decide: its name and kind; its first three
    attributes; its kind attribute. Made once per model (at most 256 kept)."""
    heads = _OWN_HEADS.get((model, kind))
    if heads is None:
        heads = (wire.string_field(5, f"{OPERATION} {model}") + _KIND,
                 wire.attribute(9, "gen_ai.operation.name", OPERATION) + wire.attribute(9, "gen_ai.provider.name", PROVIDER)
                 + wire.attribute(9, "gen_ai.request.model", model),
                 wire.attribute(9, "gpuprobe.request.kind", kind))
        if len(_OWN_HEADS) < 256:
            _OWN_HEADS[(model, kind)] = heads
    return heads


def request_wire(record: RequestRecord, trace_id: int, new_id: Callable[[], int]) -> bytes:
    """The spans :func:`span_plan` plans for ``record``, in the trace ``trace_id``, written as OTLP
    ``ScopeSpans.spans`` fields: the bytes ``encode_request`` writes for that plan (tested byte for byte),
    without the plan.

    Why: planning (a span object and an attribute dict each), then writing, took about 120 µs of the
    exporter thread per 16-token request, most of it its 15 step events; written from the record, each
    event is a few fixed bytes and its two values.
    """
    start = int(record.started_at * 1e9)
    end = max(start, int(record.ended_at * 1e9))
    parent = record.parent
    head = b"\x0a\x10" + trace_id.to_bytes(16, "big")
    state = b""
    if parent is not None and parent.trace_state:
        state = wire.string_field(3, ",".join(f"{k}={v}" for k, v in parent.trace_state.items()))
    own = int(record.span_id, 16) if record.span_id else new_id()
    own_id = own.to_bytes(8, "big")
    name, first_attributes, kind_attribute = _own_heads(record.model, record.kind)
    attribute = wire.attribute
    duration = record.duration_s
    parts = [first_attributes, _E2E_HEAD + _PACK_D(duration) if type(duration) is float
             else attribute(9, "gen_ai.latency.e2e", duration),
             attribute(9, "gpuprobe.request_id", record.request_id), kind_attribute]
    if record.input_tokens is not None:
        parts.append(attribute(9, "gen_ai.usage.input_tokens", record.input_tokens))
    if record.output_tokens is not None:
        parts.append(attribute(9, "gen_ai.usage.output_tokens", record.output_tokens * (record.batch_size or 1)))
    if record.finish_reason is not None:
        parts.append(attribute(9, "gen_ai.response.finish_reasons", [record.finish_reason]))
    for value, (key, float_head, int_head) in zip(_OPTIONAL_VALUES(record), _OPTIONAL_HEADS):
        if value is None:
            continue
        kind = type(value)
        if kind is float:
            parts.append(float_head + _PACK_D(value))
        elif kind is int and 0 <= value < 0x80:
            parts.append(int_head + bytes((value,)))
        else:
            parts.append(attribute(9, key, value))
    error = record.error
    if error is not None:
        parts.append(attribute(9, "error.type", error))
    for trace, span in record.step_links:
        parts.append(wire.delimited(13, b"\x0a\x10" + bytes.fromhex(trace) + b"\x12\x08" + bytes.fromhex(span)
                                    + b"\x35" + _FLAGS_LOCAL[2:]))
    parts.append(_STATUS_UNSET if error is None else
                 wire.delimited(15, wire.string_field(2, error) + b"\x18\x02"))
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    spans = [wire.delimited(2, b"".join((
        head, b"\x12\x08", own_id, state,
        b"\x22\x08" + parent.span_id.to_bytes(8, "big") if parent is not None else b"",
        name, b"\x39", _PACK_Q(start), b"\x41", _PACK_Q(end), *parts)))]
    child_head = head  # the children: same trace and state, the request span their parent
    child_parent = state + b"\x22\x08" + own_id
    tail = _STATUS_UNSET + _FLAGS_LOCAL

    def child(name: str, start_ns: int, end_ns: int, key: str, value: float, events: bytes = b"") -> bytes:
        named, float_head = _CHILD_HEADS[name]
        return wire.delimited(2, b"".join((child_head, b"\x12\x08", new_id().to_bytes(8, "big"), child_parent, named,
                                           b"\x39", _PACK_Q(start_ns), b"\x41", _PACK_Q(end_ns),
                                           float_head + _PACK_D(value) if type(value) is float
                                           else attribute(9, key, value), events, tail)))

    at = start
    if record.queue_s is not None:
        queued = min(end, at + int(record.queue_s * 1e9))
        spans.append(child("queue", at, queued, "gen_ai.latency.time_in_queue", record.queue_s))
        at = queued
    if record.prefill_s is not None:
        prefilled = min(end, at + int(record.prefill_s * 1e9))
        spans.append(child("prefill", at, prefilled, "gen_ai.latency.time_in_model_prefill", record.prefill_s))
        at = prefilled
    if record.decode_s is not None and record.ttft_s is not None:
        first = min(end, start + int(record.ttft_s * 1e9))
        last = min(end, first + int(record.decode_s * 1e9))
        events = []
        pack = _EVENT.pack
        for index, gap, since in record.steps_sampled[:_EVENTS]:
            at_ns = min(last, first + int(since * 1e9))
            if 0 <= index < 0x7F and type(gap) is float:
                events.append(pack(_EVENT_HEAD, at_ns, _EVENT_MIDDLE, index + 1, _EVENT_HOST, gap))
            else:
                events.append(wire.delimited(11, b"\x09" + _PACK_Q(at_ns) + _EVENT_NAME
                                             + attribute(3, "gpuprobe.step.token", index + 1)
                                             + attribute(3, "gpuprobe.step.host_s", gap)))
        spans.append(child("decode", first, last, "gen_ai.latency.time_in_model_decode", record.decode_s,
                           b"".join(events)))
    return b"".join(spans)


def _links(pairs: list[tuple[str, str]]) -> list[Any]:
    """OpenTelemetry links to spans named by their (trace id, span id) in hex."""
    flags = TraceFlags(TraceFlags.SAMPLED)
    return [Link(SpanContext(int(t, 16), int(s, 16), False, flags)) for t, s in pairs]


def step_plan(step: Any, links: list[tuple[str, str]]) -> PlannedSpan:
    """A continuous-batching scheduler step's span (``scheduler step``), linked to the requests it carried."""
    attributes: dict[str, Any] = {
        "gpuprobe.step.index": step.index, "gpuprobe.step.phase": step.phase, "gpuprobe.step.requests": len(step.requests),
        "gpuprobe.step.tokens": step.tokens, "gpuprobe.step.prefill_tokens": step.prefill_tokens,
        "gpuprobe.step.host_s": step.host_ns / 1e9,
    }
    if step.device_ns is not None:
        attributes["gpuprobe.step.device_s"] = step.device_ns / 1e9
    return PlannedSpan("scheduler step", int(step.span_id, 16), None, step.start_ns, step.start_ns + step.host_ns,
                       attributes, links=links[:_LINKS])


# -- exemplars -------------------------------------------------------------------------------------------

def _offer(record: RequestRecord) -> None:
    """The request's span becomes the exemplar of the buckets its values fell in, in the series it fed
    (``record.exemplar_series``: prepared by the integration, so no label is looked up). Never raises."""
    trace_id, span_id = record.trace_id, record.span_id
    if trace_id is None or span_id is None:
        return
    at = record.ended_at
    try:
        for series, field in record.exemplar_series:
            value = getattr(record, field)
            if value is not None:
                series.offer_exemplar(value, trace_id, span_id, at)
    except Exception:  # an exemplar less; never into the program
        pass


def _withdraw(records: list[RequestRecord]) -> None:
    """The spans of ``records`` are not sent (not sampled, or lost): the buckets that still name them forget
    them. Never raises."""
    try:
        for record in records:
            span_id = record.span_id
            if span_id is None:
                continue
            for series, field in record.exemplar_series:
                value = getattr(record, field)
                if value is not None:
                    series.withdraw_exemplar(value, span_id)
    except Exception:
        pass


def _withdraw_steps(steps: list[Any]) -> None:
    """The spans of these continuous-batching steps are lost: their step-duration buckets forget them."""
    try:
        for step in steps:
            if step.series is not None:
                step.series.withdraw_exemplar(step.host_ns / 1e9, step.span_id)
    except Exception:
        pass


# -- the exporter ----------------------------------------------------------------------------------------

def _sdk_processor(provider: Any) -> Any:
    """An SDK ``TracerProvider``'s span processor (what its own spans end into), else None.

    The SDK keeps it as ``_active_span_processor`` (every release from 1.0 to 1.45): read once per exporter,
    here only; a provider without it gets its spans through its tracer instead (the tracer's own ids).
    """
    processor = getattr(provider, "_active_span_processor", None)
    return processor if callable(getattr(processor, "on_end", None)) else None


class TraceExporter:
    """Spans of every request that ends, to ``provider`` or over OTLP (see the module docstring).

    Args:
        provider: a ``TracerProvider`` (None: OTLP to ``endpoint``).
        endpoint: the OTLP/HTTP traces URL (when no provider).
        timeout: seconds one OTLP batch may take, all of it (the ``otlp_timeout`` setting).
        resource_attributes: added to the resource of OTLP spans (``service.name`` defaults to ``gpuprobe``).

    Raises:
        ConfigError: neither a provider nor a valid http(s) endpoint.
    """

    def __init__(self, provider: Any = None, *, endpoint: str | None = None, timeout: float = 2.0,
                 resource_attributes: dict[str, str] | None = None) -> None:
        if provider is None and not endpoint:
            raise ConfigError("traces need a TracerProvider or an OTLP endpoint")
        self.provider = provider
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self._queue: deque[RequestRecord] = deque()
        self._steps: deque[Any] = deque()  # continuous-batching step spans waiting for their requests' ids
        # (trace id, span id, start, end) of the last request spans sent: what a capture's span links to.
        self._recent: deque[tuple[str, str, float, float]] = deque(maxlen=1024)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one batch at a time
        self._thread: threading.Thread | None = None
        self._rt: Runtime | None = None
        self._random = random.Random(int.from_bytes(os.urandom(16), "little"))
        self._post: Any = None
        self._processor: Any = None
        self._tracer: Any = None
        self._sampler: Any = None
        self._resource: Any = None
        self._closed = False
        self._forks = _forks  # the fork count it was made under (not getpid(): a system call per request)
        self.exported = 0
        self.dropped = 0
        if provider is None:
            from .otlp import _Endpoint

            self._post = _Endpoint(endpoint, None, signal="TRACES")  # type: ignore[arg-type]
            attrs = {"service.name": "gpuprobe", "telemetry.sdk.name": "gpuprobe"}
            attrs.update(resource_attributes or {})
            self._resource = Resource.create(attrs)  # once: the SDK's detectors run in a thread pool
        else:
            self._processor = _sdk_processor(provider)
            if self._processor is not None:
                self._sampler = getattr(provider, "sampler", None)
                self._resource = getattr(provider, "resource", None) or Resource.create({})
            else:
                self._tracer = provider.get_tracer("gpuprobe", __version__)

    def attach(self, rt: Runtime | None = None, *, owner: Owner = "settings") -> TraceExporter:
        """Make spans of ``rt``'s requests from now on (the process's runtime by default)."""
        rt = self._rt = rt or runtime()
        if self._post is not None:
            for problem in self._post.problems:
                rt.warn_once(f"traces:{problem}", problem, where="<environment>")
            self._sampler = _sampler_from_environment(lambda key, message: rt.warn_once(key, message,
                                                                                          where="<environment>"))
        rt.requests.want_parents(True)
        rt.requests.add_listener(self.ended)
        if self._tracer is None:  # step spans need gpuprobe's own ids (their requests link to them)
            rt.requests.add_step_listener(self.step_ended)
        if self.provider is not None:
            # Registered after the provider was made, so it runs before the provider's own exit handler shuts
            # its processors down (atexit runs last-in first-out): what is queued reaches them.
            atexit.register(self.flush)
        self._thread = threading.Thread(target=self._run, name="gpuprobe-traces", daemon=True)
        self._thread.start()
        rt.add_closeable(self, owner=owner)
        return self

    # -- on the request's thread ----------------------------------------------------------------------
    def ended(self, record: RequestRecord) -> None:
        """A request ended: its ids, then the queue (a few dict and deque operations; never raises)."""
        if self._closed or self._forks != _forks:
            return
        parent = record.parent
        bits = self._random.getrandbits(192)  # both ids from one draw
        trace_id = parent.trace_id if parent is not None else bits >> 64
        record.trace_id = f"{trace_id:032x}"
        record.span_id = f"{bits & _SPAN_BITS:016x}"
        queue = self._queue
        if len(queue) >= _QUEUE:
            self.dropped += 1
            if self._rt is not None:
                self._rt.drop("span_queue_full")
            return
        queue.append(record)
        if len(queue) >= _BATCH:
            self._wake.set()

    def step_ended(self, step: Any) -> None:
        """A continuous-batching step that is a span of its own (on the draining thread; never raises)."""
        if self._closed or self._forks != _forks:
            return
        if len(self._steps) >= _STEPS:
            self.dropped += 1
            if self._rt is not None:
                self._rt.drop("span_queue_full")
            return
        self._steps.append((time.time(), step))
        series = step.series
        if series is not None:
            try:
                series.offer_exemplar(step.host_ns / 1e9, step.trace_id, step.span_id,
                                      (step.start_ns + step.host_ns) / 1e9)
            except Exception:  # an exemplar less; the span is queued
                pass

    # -- on the exporter's thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(_INTERVAL)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._send(final=False)

    def _ready(self, final: bool) -> list[RequestRecord]:
        """The records whose spans can be made now (their last figures in, or waited for long enough)."""
        queue = self._queue
        now = time.time()
        out: list[RequestRecord] = []
        while queue and len(out) < _BATCH:
            record = queue[0]
            if not final and record.pending and now - record.ended_at < _SETTLE_S:
                break  # in end order: the ones after it wait too (their shares come in the same drain)
            out.append(queue.popleft())
        return out

    def _send(self, final: bool) -> None:
        with self._lock:
            self._send_steps(final)
            while True:
                records = self._ready(final)
                if not records:
                    return
                try:
                    self._deliver(records, final)
                except Exception as exc:  # never into the program; counted, warned once
                    _withdraw(records)
                    self._failed(len(records), repr(exc))
                if len(records) < _BATCH:
                    return

    def capture_reported(self, *, path: str, reason: str, first: int, last: int, started: float | None,
                         ended: float | None, finding: dict[str, Any] | None) -> None:
        """An on-demand capture's trace is written and read by ``gpuprobe report``: its span (``gpuprobe
        capture``, in a trace of its own), with the report's top finding, linked to the request spans sent in
        the time it recorded. Called on a thread of the capture's; never raises."""
        if self._closed or self._tracer is not None or started is None:
            return
        end = ended if ended is not None else time.time()
        with self._lock:
            links = [(t, s) for t, s, a, b in self._recent if a <= end and b >= started][:_LINKS]
        attributes: dict[str, Any] = {"gpuprobe.capture.path": path, "gpuprobe.capture.reason": reason,
                                      "gpuprobe.capture.first_step": first, "gpuprobe.capture.last_step": last}
        if finding:
            for key in ("id", "severity", "title"):
                if isinstance(finding.get(key), str):
                    attributes[f"gpuprobe.capture.finding.{key}"] = finding[key]
        rand = self._random.getrandbits
        context = SpanContext(rand(128), rand(64), False, TraceFlags(TraceFlags.SAMPLED))
        span = ReadableSpan("gpuprobe capture", context=context, parent=None, resource=self._resource,
                            attributes=attributes, links=_links(links), kind=SpanKind.INTERNAL,
                            start_time=int(started * 1e9), end_time=int(end * 1e9), instrumentation_scope=_SCOPE)
        try:
            with self._lock:
                if self._processor is not None:
                    self._processor.on_end(span)
                else:
                    why = self._post_batch(self._wire([span]))
                    if why is not None:
                        self._failed(1, why)
        except Exception as exc:
            self._failed(1, repr(exc))

    def _send_steps(self, final: bool) -> None:
        """The step spans whose requests have all ended (or that waited long enough), as finished spans."""
        steps = self._steps
        now = time.time()
        plans: list[tuple[Any, PlannedSpan]] = []
        kept: list[tuple[float, Any]] = []
        while steps:
            at, step = steps.popleft()
            links, done = step.links()
            if done or final or now - at >= _STEP_WAIT_S:
                plans.append((step, step_plan(step, links)))
                step.requests = []  # let the requests go
            else:
                kept.append((at, step))
        steps.extend(kept)
        if not plans:
            return
        spans = []
        for step, plan in plans:
            context = SpanContext(int(step.trace_id, 16), plan.span_id, False, TraceFlags(TraceFlags.SAMPLED))
            spans.append(ReadableSpan(plan.name, context=context, parent=None, resource=self._resource,
                                      attributes=plan.attributes, links=_links(plan.links), kind=SpanKind.INTERNAL,
                                      start_time=plan.start_ns, end_time=plan.end_ns, instrumentation_scope=_SCOPE))
        try:
            if self._processor is not None:
                for span in spans:
                    self._processor.on_end(span)
            else:
                why = self._post_batch(self._wire(spans))
                if why is not None:
                    _withdraw_steps([step for step, _ in plans])
                    self._failed(len(spans), why)
        except Exception as exc:
            _withdraw_steps([step for step, _ in plans])
            self._failed(len(spans), repr(exc))

    def _ids(self) -> int:
        return self._random.getrandbits(64)

    def _deliver(self, records: list[RequestRecord], final: bool) -> None:
        if self._tracer is not None:  # a provider that is not the SDK's: through its own tracer
            for record in records:
                self._through_tracer(record)
            self.exported += len(records)
            return
        find = self._rt.requests.find_capture if self._rt is not None else None
        spans: list[Any] = []  # to the SDK's processor: its spans
        written: list[bytes] = []  # over OTLP: their bytes
        for record in records:
            if find is not None and record.capture is None:
                record.capture = find(record.started_at, record.ended_at)
            if self._processor is None:
                trace_id = self._sampled(record)
                if trace_id is None:
                    continue
                written.append(request_wire(record, trace_id, self._ids))
            else:
                made = self._finished_spans(record, span_plan(record, self._ids))
                if not made:
                    continue
                spans.extend(made)
            _offer(record)  # sampled: its span is the exemplar of the buckets it fed (none names a span not sent)
        if not spans and not written:
            return
        for record in records:
            if record.trace_id and record.span_id:
                self._recent.append((record.trace_id, record.span_id, record.started_at, record.ended_at))
        if self._processor is not None:
            for span in spans:
                self._processor.on_end(span)
            self.exported += len(records)
            return
        why = self._post_batch(encode_written(self._resource.attributes, "gpuprobe", __version__, b"".join(written)))
        if why is None:
            self.exported += len(records)
        else:
            _withdraw(records)
            self._failed(len(records), why)

    def _wire(self, spans: list[Any]) -> bytes:
        """SDK spans (the few step and capture spans) in OTLP's wire format, by :mod:`._otlp_spans`."""
        data = []
        for span in spans:
            context, parent = span.context, span.parent
            data.append(SpanData(context.trace_id, context.span_id, parent.span_id if parent is not None else None,
                                 "", span.name, span.start_time, span.end_time, dict(span.attributes),
                                 [(e.name, e.timestamp, dict(e.attributes)) for e in span.events],
                                 [(f"{l.context.trace_id:032x}", f"{l.context.span_id:016x}") for l in span.links],
                                 span.status.description if span.status.status_code is StatusCode.ERROR else None))
        return encode_request(self._resource.attributes, "gpuprobe", __version__, data)

    def _sampled(self, record: RequestRecord, own: PlannedSpan | None = None) -> int | None:
        """The request's trace id when the sampler keeps its span, else None (``own``: its planned span, for a
        sampler that reads the span's name and attributes; planned here when not given)."""
        parent = record.parent
        trace_id = int(record.trace_id, 16) if record.trace_id else self._random.getrandbits(128)
        sampler = self._sampler
        if sampler is _PARENT_OR_ON or sampler is otel_sampling.ALWAYS_ON:
            if parent is not None and sampler is _PARENT_OR_ON and not parent.trace_flags.sampled:
                return None
        elif sampler is not None:
            if own is None:
                own = span_plan(record, self._ids)[0]
            parent_ctx = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(parent)) if parent else None
            decision = sampler.should_sample(parent_ctx, trace_id, own.name, SpanKind.INTERNAL, own.attributes)
            if not decision.decision.is_sampled():
                return None
        return trace_id

    def _finished_spans(self, record: RequestRecord, plan: list[PlannedSpan]) -> list[Any]:
        """The request's spans as the SDK's ``ReadableSpan`` its processors take (none: not sampled). Over OTLP
        they are written from the record instead (:func:`request_wire`)."""
        trace_id = self._sampled(record, plan[0])
        if trace_id is None:
            return []
        parent = record.parent
        flags = TraceFlags(TraceFlags.SAMPLED)
        state = parent.trace_state if parent is not None else None
        contexts = {p.span_id: SpanContext(trace_id, p.span_id, False, flags, state) for p in plan}
        spans = []
        for p in plan:
            parent_context = contexts[p.parent_id] if p.parent_id is not None else parent
            status = Status(StatusCode.ERROR, p.error) if p.error else Status(StatusCode.UNSET)
            spans.append(ReadableSpan(
                p.name, context=contexts[p.span_id], parent=parent_context, resource=self._resource,
                attributes=p.attributes, events=[Event(n, a, t) for n, t, a in p.events], kind=SpanKind.INTERNAL,
                links=_links(p.links),
                status=status, start_time=p.start_ns, end_time=p.end_ns, instrumentation_scope=_SCOPE))
        return spans

    def _through_tracer(self, record: RequestRecord) -> None:  # no step spans or links: the tracer picks the ids
        plan = span_plan(record, self._ids)
        parent = record.parent
        context = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(parent)) if parent is not None else None
        own = plan[0]
        span = self._tracer.start_span(own.name, context=context, kind=SpanKind.INTERNAL, attributes=own.attributes,
                                       start_time=own.start_ns)
        inside = otel_trace.set_span_in_context(span)
        for p in plan[1:]:
            child = self._tracer.start_span(p.name, context=inside, attributes=p.attributes, start_time=p.start_ns)
            for name, at, attrs in p.events:
                child.add_event(name, attrs, at)
            child.end(end_time=p.end_ns)
        if own.error:
            span.set_status(Status(StatusCode.ERROR, own.error))
        span.end(end_time=own.end_ns)
        made = span.get_span_context()
        if made.is_valid:  # the tracer's own ids: what the trace backend holds
            record.trace_id, record.span_id = f"{made.trace_id:032x}", f"{made.span_id:016x}"
            if made.trace_flags.sampled:
                _offer(record)

    def _post_batch(self, body: bytes) -> str | None:
        from .otlp import _RETRYABLE, _retry_after

        post = self._post
        deadline = time.monotonic() + self.timeout
        if post.compress is not None:
            body = post.compress(body)
        attempt = 0
        while True:
            try:
                status, retry_after = post.post(body, deadline)
            except TimeoutError:
                return f"no complete answer within {self.timeout:g} s (otlp_timeout)"
            except OSError as exc:
                return repr(exc)
            except Exception as exc:  # http.client's own errors
                return repr(exc)
            if 200 <= status < 300:
                return None
            if status not in _RETRYABLE:
                return f"HTTP {status}"
            delay = _retry_after(retry_after)
            delay = 0.1 * 2 ** attempt if delay is None else delay
            if time.monotonic() + delay >= deadline:
                return f"HTTP {status}, and no time left to try again within {self.timeout:g} s"
            time.sleep(delay)
            attempt += 1

    def _failed(self, n: int, why: str) -> None:
        self.dropped += n
        rt = self._rt or runtime()
        rt.drop("span_export_failed", n)
        rt.warn_once("traces:export", f"gpuprobe: spans of {n} request(s) could not be sent to "
                                      f"{self.endpoint or 'the TracerProvider'}: {why}; they are dropped and counted in "
                                      "gpuprobe.telemetry.dropped (this warning is shown once)")

    # -- the end --------------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Send every queued record now (within one deadline per batch)."""
        self._send(final=True)

    def close(self) -> None:
        """Stop taking records, send what is queued, stop the thread (once)."""
        if self._closed:
            return
        self._closed = True
        rt = self._rt
        if rt is not None:
            rt.requests.remove_listener(self.ended)
            rt.requests.remove_step_listener(self.step_ended)
            rt.requests.want_parents(False)
        if self.provider is not None:
            atexit.unregister(self.flush)
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.timeout + 1)
        if self._forks == _forks:
            self._send(final=True)

    def __repr__(self) -> str:
        where = self.endpoint if self.provider is None else type(self.provider).__name__
        return f"<gpuprobe traces to {where}: {self.exported} requests sent, {self.dropped} dropped>"


def _after_fork_in_child() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
