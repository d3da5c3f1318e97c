"""Request spans as an OTLP ``ExportTraceServiceRequest``, written straight to protobuf's wire format.

Why not the SDK's ``encode_spans``: it builds a protobuf object per span, attribute and value in Python
(about 150 µs of the exporter thread per request of three spans on the development machine, most of a
request's cost), where appending the bytes of the few fields a request span has costs a tenth of that
(``benchmarks/request_cost.py``). The messages are those of ``opentelemetry/proto/trace/v1/trace.proto``
(v1, stable since 2021); tests decode what this writes with ``opentelemetry-proto`` and compare it with
what the SDK's encoder writes for the same spans.

Two ways in: :func:`encode_request` writes :class:`SpanData` (the few step and capture spans); a request's
spans come already written (``traces.request_wire``, from :func:`attribute`, :func:`delimited` and
:func:`string_field`) and :func:`encode_written` puts them under the resource and scope.

Only what gpuprobe's spans use is written: resource and scope attributes, and per span its ids, parent,
trace state, name, kind (INTERNAL), times, attributes (strings, booleans, integers, floats, lists of
strings), events, links and an error status.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["SpanData", "encode_request", "encode_written", "attribute", "delimited", "string_field"]

_PACK_Q = struct.Struct("<Q").pack
_PACK_D = struct.Struct("<d").pack
_KIND_INTERNAL = 1  # Span.SpanKind.SPAN_KIND_INTERNAL
_STATUS_ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(field: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 0x80 and field < 16:  # one byte of tag and one of length: most of a span's fields
        return bytes((field << 3 | 2, n)) + payload
    return _varint(field << 3 | 2) + _varint(n) + payload


def _string(field: int, text: str) -> bytes:
    return _delimited(field, text.encode("utf-8"))


def _value(value: Any) -> bytes:
    """An ``AnyValue``."""
    if isinstance(value, str):
        return _string(1, value)
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _PACK_D(value)
    if isinstance(value, (list, tuple)):
        return _delimited(5, b"".join(_delimited(1, _value(v)) for v in value))
    return _string(1, str(value))


_HEADS: dict[int, dict[str, tuple[bytes | None, bytes | None, bytes]]] = {}  # field -> key -> see attribute()


def _heads(field: int, key: str) -> tuple[bytes | None, bytes | None, bytes]:
    by_key = _HEADS.setdefault(field, {})
    heads = by_key.get(key)
    if heads is None:
        head = _string(1, key)
        tag = _varint(field << 3 | 2)
        float_kv = len(head) + 11
        int_kv = len(head) + 4
        heads = (tag + bytes((float_kv,)) + head + b"\x12\x09\x21" if float_kv < 0x80 else None,
                 tag + bytes((int_kv,)) + head + b"\x12\x02\x18" if int_kv < 0x80 else None, head)
        if len(by_key) < 4096:
            by_key[key] = heads
    return heads


def attribute(field: int, key: str, value: Any) -> bytes:
    """One ``KeyValue`` as field ``field`` (9: a span's attributes, 3: an event's), its tag included: the bytes
    :func:`encode_request` writes for that attribute.

    Why: a span made straight from a request's record writes its attributes one by one, without a dict;
    a float's and a small integer's bytes are then a prefix made once per key and the value's own.
    """
    heads = _heads(field, key)
    kind = type(value)
    if kind is float and heads[0] is not None:
        return heads[0] + _PACK_D(value)
    if kind is int and 0 <= value < 0x80 and heads[1] is not None:
        return heads[1] + bytes((value,))
    return _delimited(field, heads[2] + _delimited(2, _value(value)))


def delimited(field: int, payload: bytes) -> bytes:
    """A length-delimited field (a message, bytes or a string's bytes)."""
    return _delimited(field, payload)


def string_field(field: int, text: str) -> bytes:
    """A string field."""
    return _string(field, text)


def _attributes(field: int, attributes: Mapping[str, Any]) -> bytes:
    """``repeated KeyValue`` as field ``field``: each attribute as :func:`attribute` writes it."""
    return b"".join(attribute(field, key, value) for key, value in attributes.items())


class SpanData:
    """One span to write: ids as integers, times in ns since the epoch, links as (trace id, span id) hex pairs."""

    __slots__ = ("trace_id", "span_id", "parent_id", "parent_remote", "trace_state", "name", "start_ns", "end_ns",
                 "attributes", "events", "links", "error")

    def __init__(self, trace_id: int, span_id: int, parent_id: int | None, trace_state: str, name: str,
                 start_ns: int, end_ns: int, attributes: Mapping[str, Any],
                 events: Sequence[tuple[str, int, Mapping[str, Any]]] = (),
                 links: Sequence[tuple[str, str]] = (), error: str | None = None, parent_remote: bool = False) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.parent_remote = parent_remote  # the parent came from another process (a traceparent header)
        self.trace_state = trace_state
        self.name = name
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.attributes = attributes
        self.events = events
        self.links = links
        self.error = error


def _span(s: SpanData) -> bytes:
    parts = [b"\x0a\x10" + s.trace_id.to_bytes(16, "big"), b"\x12\x08" + s.span_id.to_bytes(8, "big")]
    if s.trace_state:
        parts.append(_string(3, s.trace_state))
    if s.parent_id is not None:
        parts.append(b"\x22\x08" + s.parent_id.to_bytes(8, "big"))
    parts.append(_string(5, s.name))
    parts.append(b"\x30" + _varint(_KIND_INTERNAL))
    parts.append(b"\x39" + _PACK_Q(s.start_ns))
    parts.append(b"\x41" + _PACK_Q(s.end_ns))
    parts.append(_attributes(9, s.attributes))
    for name, at, attributes in s.events:
        parts.append(_delimited(11, b"\x09" + _PACK_Q(at) + _string(2, name) + _attributes(3, attributes)))
    for trace_id, span_id in s.links:
        parts.append(_delimited(13, b"\x0a\x10" + bytes.fromhex(trace_id) + b"\x12\x08" + bytes.fromhex(span_id)
                                + b"\x35" + _FLAGS_LOCAL))
    # The status, always there as the SDK writes it: empty (unset) or an error with its message.
    parts.append(_delimited(15, b"" if s.error is None else _string(2, s.error) + b"\x18" + _varint(_STATUS_ERROR)))
    parts.append(b"\x85\x01" + (_FLAGS_REMOTE if s.parent_remote else _FLAGS_LOCAL))
    return b"".join(parts)


# Span.flags / Link.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE (0x100), with CONTEXT_IS_REMOTE (0x200) for a remote parent.
_FLAGS_LOCAL = struct.pack("<I", 0x100)
_FLAGS_REMOTE = struct.pack("<I", 0x300)


def encode_request(resource: Mapping[str, Any], scope_name: str, scope_version: str,
                   spans: Iterable[SpanData]) -> bytes:
    """The ``ExportTraceServiceRequest`` of ``spans``, all under one resource and instrumentation scope."""
    return encode_written(resource, scope_name, scope_version, b"".join(_delimited(2, _span(s)) for s in spans))


def encode_written(resource: Mapping[str, Any], scope_name: str, scope_version: str, spans: bytes) -> bytes:
    """The ``ExportTraceServiceRequest`` of spans already written as ``ScopeSpans.spans`` fields, one after
    another."""
    scope = _delimited(1, _string(1, scope_name) + _string(2, scope_version))
    resource_spans = _delimited(1, _attributes(1, resource)) + _delimited(2, scope + spans)
    return _delimited(1, resource_spans)
