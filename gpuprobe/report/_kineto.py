"""Streaming reader of PyTorch profiler (kineto) Chrome-trace JSON, plain or gzip.

Three engines yield the same events:

- ``msgspec`` (the fast path): a top-level scanner over a sliding text buffer hands batches of whole
  elements of ``traceEvents`` to msgspec, which decodes them into records holding only the fields a
  report reads (:func:`typed_decoder`); a batch it cannot type (an element that is not an object, an
  ``args`` that is not an object, text json reads differently) goes to the ``stdlib`` path below.
- ``stdlib``: the same scanner handing the elements to :meth:`json.JSONDecoder.raw_decode`, in batches
  of whole elements where it can, else one by one.
- ``ijson``: the reference twin, built on ijson's event stream (C backend ``yajl2_c`` when
  present) with numbers as :class:`~decimal.Decimal`.

Float literals stay as their text (:class:`~gpuprobe.report._events.FloatText`) so times convert to
nanoseconds exactly. Every engine reads the top-level keys in any order (``traceEvents`` before or
after the metadata), skips a UTF-8 byte-order mark, and keeps one batch of events plus one buffer in
memory.

Limits no real trace comes near, so that a hostile file costs bounded memory and time (each engine
refuses past them with a :class:`TraceFormatError`): one element of ``traceEvents``, one top-level
value or key, or one run of white space, at most :data:`MAX_VALUE_CHARS` characters of text (every
string and key lies inside one; ijson counts bytes, and a run of white space is counted by whole
chunks read); nesting within Python's recursion limit for json and msgspec (1,000 by default, less
the caller's frames), at most :data:`MAX_DEPTH` levels for ijson; integers of at most Python's 4,300 digits
(``sys.get_int_max_str_digits()``; ijson refuses any run of more digits, even in a string).

:class:`KinetoTrace` is the format's reader (see :mod:`gpuprobe.report._trace`).
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import IO, Any

from gpuprobe._kernel_names import CONCAT_OPS, memcpy_direction
from gpuprobe.report._events import (
    CPU_OP,
    GPU_RANGE,
    GPU_SYNC,
    KERNEL,
    LIMIT,
    MEMCPY,
    MEMSET,
    PYTHON,
    RANGE,
    RUNTIME,
    Event,
    EventFields,
    FloatText,
    int_or,
    TraceInfo,
    us_to_ns,
)
import gpuprobe.report._split as _split
from gpuprobe.report._split import BoundaryMissed, Part, open_part
from gpuprobe.report._trace import Progress, Trace

__all__ = [
    "KinetoTrace",
    "ENGINES",
    "iter_raw_text",
    "iter_raw_ijson",
    "to_event",
    "fields_batches",
    "Refused",
    "cpu_op_counts",
    "COUNTED_OPS",
    "CAT_KIND",
    "NO_ARGS",
    "record_types",
    "typed_decoder",
    "TraceFormatError",
    "TruncatedTrace",
    "MalformedEventError",
    "UnreadPhase",
    "DurationReadAsZero",
    "MAX_VALUE_CHARS",
    "MAX_DEPTH",
    "SNIFF_BYTES",
    "EXPECTED",
    "json_encoding",
    "encoding_name",
    "not_json",
]

_CHUNK = 1 << 20  # why: 64 KiB to 4 MiB all scan 100 MB in 2.2-2.5 s here; 1 MiB bounds the buffer
_WS = re.compile(r"[ \t\n\r]*")
_TAIL = 8  # a decode error this close to the buffer end may be a cut, not a fault
_MARGIN = 1 << 16  # elements starting closer than this to the buffer end wait for the next chunk
_BATCH = 1 << 14  # characters of elements decoded in one call at most (msgspec: 16 to 64 KiB alike)
_MISSES = 4  # batches that failed to decode before a stream is read element by element only
#: Characters of one element of ``traceEvents`` (or one top-level value or key) at most: 16 MiB. The
#: largest element of the real traces in tests/data is 6.9 KB (a kernel's name and arguments), the
#: longest string 5.1 KB; a 1 MB gzip file can hold a 1 GiB name.
MAX_VALUE_CHARS = 16 << 20
#: Levels of nesting inside one value at most under ijson (real traces: 8, counting from the top-level
#: object); json and msgspec stop at Python's recursion limit (1,000 by default, less the caller's frames).
MAX_DEPTH = 1000
_BOM = "\ufeff"


class TraceFormatError(Exception):
    """The stream is not a readable kineto trace; the message says why."""


class TruncatedTrace(TraceFormatError):
    """The stream ends inside a value, or where one was expected."""


class _Utf8:
    """A binary stream of text in another encoding, read as UTF-8 bytes (for ijson, which reads UTF-8 only)."""

    def __init__(self, raw: IO[bytes], encoding: str) -> None:
        self.raw = raw
        self.decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
        self.pending = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.pending) < size:
            data = self.raw.read(_CHUNK if size < 0 else max(size, 4))
            self.pending += self.decoder.decode(data, final=not data).encode("utf-8")
            if not data:
                break
        if size < 0:
            out, self.pending = self.pending, b""
        else:
            out, self.pending = self.pending[:size], self.pending[size:]
        return out


#: Bytes of the start of a file read to tell its text encoding and whether it starts as JSON does.
SNIFF_BYTES = 4096
#: What ``gpuprobe report`` reads, said when a file is none of it.
EXPECTED = ("gpuprobe report reads PyTorch profiler traces (JSON text: .json, .json.gz), Nsight Systems SQLite "
            "exports (nsys export --type sqlite) and Nsight Compute exports (CSV, .ncu-rep)")
_ENCODING_NAMES = {"utf-8": "UTF-8", "utf-16": "UTF-16", "utf-16-le": "UTF-16 (little-endian)",
                   "utf-16-be": "UTF-16 (big-endian)", "utf-32": "UTF-32", "utf-32-le": "UTF-32 (little-endian)",
                   "utf-32-be": "UTF-32 (big-endian)"}
_JSON_WS = " \t\r\n"
# the start of a line of Python source: a shebang naming python, an import, a definition, the main guard
_PYTHON = re.compile(r"^(?:#!.*python|import \w|from [\w.]+ import |def \w+\s*\(|class \w+\s*[(:]|if __name__ ==)",
                     re.M)


def json_encoding(head: bytes) -> str:
    """The text encoding of a JSON file from its first bytes: UTF-8, or UTF-16 or UTF-32 where a byte-order
    mark says so or where the NUL bytes of its first characters fall (they are ASCII in JSON text: RFC 8259
    section 8.1, RFC 4627 section 3), if its first character is then one JSON text can start with.

    A UTF-8 byte-order mark is UTF-8 (the reader skips it); the ``utf-16`` and ``utf-32`` codecs read a
    byte-order mark of theirs.

    Example:
        >>> json_encoding('{"traceEvents": []}'.encode("utf-16-le")), json_encoding(b'{"a": 1}')
        ('utf-16-le', 'utf-8')
        >>> json_encoding("[]".encode("utf-16")), json_encoding(b"\\xff\\xfe\\x00\\x01binary")
        ('utf-16', 'utf-8')
    """
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        found = "utf-32"
    elif head.startswith((b"\xff\xfe", b"\xfe\xff")):
        found = "utf-16"
    elif len(head) >= 4 and head[:3] == b"\x00\x00\x00" and head[3]:
        found = "utf-32-be"
    elif len(head) >= 4 and head[0] and head[1:4] == b"\x00\x00\x00":
        found = "utf-32-le"
    elif len(head) >= 2 and not head[0] and head[1]:
        found = "utf-16-be"
    elif len(head) >= 2 and head[0] and not head[1]:
        found = "utf-16-le"
    else:
        return "utf-8"
    width = 4 if found.startswith("utf-32") else 2
    text = head[: len(head) - len(head) % width].decode(found, errors="replace").lstrip("\ufeff" + _JSON_WS)
    # NUL bytes where UTF-16 or UTF-32 puts them, but no JSON in that encoding: bytes of another kind
    return found if not text or (text[0].isascii() and text[0].isprintable()) else "utf-8"


def encoding_name(encoding: str) -> str:
    """How messages name a codec of :func:`json_encoding` (``UTF-16 (little-endian)``)."""
    return _ENCODING_NAMES.get(encoding, encoding)


def not_json(text: str, path: str = "") -> str | None:
    """Why a file that begins with ``text`` (its first characters, decoded) is not a trace, or None if it
    begins as a trace does (``{`` or ``[``), is empty, or cannot be told from ``text``.

    Example:
        >>> not_json("import os\\n")[:84]
        "not a trace: not JSON text (it begins with 'import os', and looks like Python source"
        >>> not_json('  {"traceEvents": []}') is None
        True
    """
    start = text.lstrip("\ufeff" + _JSON_WS)
    if not start or start[0] in "{[\ufffd":  # empty, a trace, or not text of this encoding: said when read
        return None
    python = path.endswith((".py", ".pyw", ".pyi")) or start.startswith(('"""', "'''")) or _PYTHON.search(start)
    if not python and (start[0] in '"-0123456789' or start.startswith(("true", "false", "null"))):
        return (f"not a trace: the top-level JSON value is not an object (a trace is an object with a "
                f"'traceEvents' list); {EXPECTED}")
    line = start.splitlines()[0].strip()
    begins = line[:40] + ("…" if len(line) > 40 else "")
    if python:
        looks = ", and looks like Python source"
    elif start[0] == "<":
        looks = ", and looks like HTML or XML"
    else:
        looks = ""
    return f"not a trace: not JSON text (it begins with {begins!r}{looks}); {EXPECTED}"


class MalformedEventError(Exception):
    """One event has a malformed time, name or thread, or is not an object; the loader leaves it out
    and counts it under its reason (the message: a fixed phrase, no value of the event)."""


class UnreadPhase(MalformedEventError):
    """An event of a kind the report reads, in a phase it does not: only complete events (``"ph": "X"``)
    are read, so kernels written as ``B``/``E`` pairs (or instants) are left out, refused as a malformed
    event is. The message names the kind and the phase (a fixed phrase, the loader counts by it)."""

    def __init__(self, kind: str, phase: Any) -> None:
        if type(phase) is str:
            said = f"of phase {phase!r}" if len(phase) <= 8 else f"of phase {phase[:8] + '…'!r}"
        else:
            said = "without a phase" if phase is None else "whose phase is not a string"
        super().__init__(f"{kind} events {said}")


class DurationReadAsZero(Exception):
    """One event's duration is negative, null or missing: ``to_event(raw, clamp=True)`` reads it as
    0 ns; the loader counts it under its reason (the message)."""


def _too_long(where: int) -> TraceFormatError:
    return TraceFormatError(
        f"more than {MAX_VALUE_CHARS >> 20} MiB of text without a complete value at character {where} (one element "
        "of traceEvents, one top-level key or value, or a run of white space): no real trace holds one; refused"
    )


def _int_digits() -> int:
    """Python's limit on the digits of an integer read from text (0: none; Python 3.10.7 and later have one)."""
    limit = getattr(sys, "get_int_max_str_digits", None)
    return int(limit()) if limit is not None else 0


def _value_error(exc: ValueError, where: int) -> TraceFormatError:
    """json's ValueError that is not a JSONDecodeError: an integer past Python's digit limit."""
    if "digits" in str(exc):
        return TraceFormatError(
            f"invalid JSON near character {where}: an integer of more than {_int_digits():,} "
            "digits (Python's limit)"
        )
    return TraceFormatError(f"invalid JSON near character {where}: {exc}")


def _too_deep() -> TraceFormatError:
    return TraceFormatError(
        f"invalid JSON: nested too deeply (past Python's recursion limit, or past {MAX_DEPTH} levels)"
    )


def _no_constant(name: str) -> Any:
    raise TraceFormatError(f"invalid JSON: {name} is not a JSON number")


class _Scanner:
    """A sliding text buffer over a stream, with positions in the whole stream for errors."""

    __slots__ = ("read", "buf", "pos", "eof", "dropped", "on_chunk", "decode", "chunk", "blank", "head", "stopped")

    def __init__(self, stream: IO[str], on_chunk: Callable[[], None] | None, chunk: int = _CHUNK) -> None:
        self.read = stream.read
        self.chunk = chunk
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.dropped = 0
        self.blank = 0  # characters of the chunks read in a row that were white space only
        self.on_chunk = on_chunk
        self.head = False  # reading the head of a Part: the stream ends where an element starts
        self.stopped = False  # ... and it did
        self.decode = json.JSONDecoder(parse_float=FloatText, parse_constant=_no_constant).raw_decode

    def more(self, at_least: int = 0) -> bool:
        """Append at least ``at_least`` characters (fewer at the end); False at the end."""
        if self.eof:
            return False
        data = self.read(max(self.chunk, at_least))
        if self.on_chunk is not None:
            self.on_chunk()
        if not data:
            self.eof = True
            return False
        # a run of white space is refused past the limit, as a value is (ijson cannot tell them apart)
        if data[0] in " \t\n\r" and data[-1] in " \t\n\r" and not data.strip(" \t\n\r"):
            self.blank += len(data)
            if self.blank > MAX_VALUE_CHARS:
                raise _too_long(self.dropped + len(self.buf))
        else:
            self.blank = 0
        if self.pos:
            self.dropped += self.pos
            self.buf = self.buf[self.pos :] + data
            self.pos = 0
        else:
            self.buf += data
        return True

    def peek(self) -> str:
        """Skip white space and return the next character, or "" at the end."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def expect(self, chars: str, what: str) -> str:
        ch = self.peek()
        if not ch:
            raise TruncatedTrace(f"truncated JSON: the file ends where {what} was expected")
        if ch not in chars:
            raise TraceFormatError(f"invalid JSON at character {self.dropped + self.pos}: expected {what}")
        self.pos += 1
        return ch

    def value(self) -> Any:
        """Decode one JSON value at the next position, reading more text as needed."""
        if not self.peek():
            raise TruncatedTrace("truncated JSON: the file ends where a value was expected")
        while True:
            buf = self.buf
            try:
                value, end = self.decode(buf, self.pos)
            except json.JSONDecodeError as exc:
                near_end = exc.pos >= len(buf) - _TAIL or exc.msg.startswith("Unterminated string")
                if near_end and len(buf) - self.pos > MAX_VALUE_CHARS:
                    raise _too_long(self.dropped + self.pos) from None
                # why: grow geometrically so a value larger than one chunk costs O(n), not O(n^2)
                if near_end and self.more(len(buf) - self.pos):
                    continue
                if near_end:
                    raise TruncatedTrace("truncated JSON: the file ends inside a value") from None
                where = self.dropped + exc.pos
                raise TraceFormatError(f"invalid JSON at character {where}: {exc.msg}") from None
            except ValueError as exc:  # not a JSONDecodeError: an integer past Python's digit limit
                raise _value_error(exc, self.dropped + self.pos) from None
            except RecursionError:
                raise _too_deep() from None
            if end - self.pos > MAX_VALUE_CHARS:  # whole after the last (doubling) read: refused all the same
                raise _too_long(self.dropped + self.pos)
            if (end == len(buf) or (len(buf) - end <= 2 and (type(value) is int or type(value) is FloatText)
                                    and not buf[end:].strip(".eE+-"))) and self.more():
                # a number cut at the buffer end would decode as a shorter number: "12" of "123", and "0" of
                # "0." or "1" of "1e" (the decoder stops before a dot or an exponent with no digit after it)
                continue
            self.pos = end
            return value


def iter_raw_text(
    stream: IO[str],
    meta: dict[str, Any],
    on_chunk: Callable[[], None] | None = None,
    chunk: int = _CHUNK,
    typed: bool = False,
    part: Part | None = None,
) -> Iterator[Any]:
    """Yield each element of ``traceEvents``; put the other top-level keys into ``meta``.

    The elements of :func:`iter_raw_batches`, one by one (arguments and errors as there).
    """
    for batch in iter_raw_batches(stream, meta, on_chunk, chunk, typed, part):
        yield from batch


def iter_raw_batches(
    stream: IO[str],
    meta: dict[str, Any],
    on_chunk: Callable[[], None] | None = None,
    chunk: int = _CHUNK,
    typed: bool = False,
    part: Part | None = None,
) -> Iterator[list[Any]]:
    """Yield the elements of ``traceEvents`` in lists, in order; put the other top-level keys into ``meta``.

    Why lists: a generator resumed per element costs ~0.15 s per 200 MB trace here, once per batch nothing.

    Args:
        stream: A text stream of the trace.
        meta: Filled with every top-level key except ``traceEvents``.
        on_chunk: Called after each chunk read (progress reporting).
        chunk: Characters read at a time.
        typed: Decode batches with msgspec (:func:`typed_decoder`, which must be available): their
            elements come as records of the fields a report reads; the elements of a batch msgspec
            cannot type come as json's values, as without ``typed``.
        part: Read a part of the trace only (``stream`` is that part): the elements of its head, or
            of its tail and the top-level keys after them.

    Raises:
        TraceFormatError: Not JSON, truncated, or not an object with a ``traceEvents`` list.
        BoundaryMissed: The head of a part does not end where an element of ``traceEvents`` starts.
    """
    sc = _Scanner(stream, on_chunk, chunk)
    if part is not None and part.tail:
        yield from _array_batches(sc, typed)
        if part.top == "{":
            yield from _object_rest(sc, meta, typed)
        _expect_end(sc)
        return
    if part is not None:
        sc.head = True
        try:
            yield from _whole(sc, meta, typed)
        except TruncatedTrace:
            raise BoundaryMissed() from None
        if not sc.stopped:  # the array ended before the head did
            raise BoundaryMissed()
        return
    yield from _whole(sc, meta, typed)


def _whole(sc: _Scanner, meta: dict[str, Any], typed: bool) -> Iterator[list[Any]]:
    """The top-level value from its start (a head stops inside ``traceEvents``)."""
    first = sc.peek()
    if first == _BOM and sc.pos == 0:  # a byte-order mark (Windows editors): not part of the JSON
        sc.pos = 1
        first = sc.peek()
    if not first:
        raise TraceFormatError("empty file")
    if first == "[":  # the JSON Array Format of the Trace Event Format: a bare list of events
        sc.pos += 1
        meta["traceEvents"] = True
        yield from _array_batches(sc, typed)
        if not sc.stopped:
            _expect_end(sc)
        return
    if first != "{":
        raise TraceFormatError("not a trace: the top-level JSON value is not an object")
    sc.pos += 1
    if sc.peek() == "}":
        sc.pos += 1
        _expect_end(sc)
        return
    yield from _object_rest(sc, meta, typed, first=True)
    if not sc.stopped:
        _expect_end(sc)


def _object_rest(sc: _Scanner, meta: dict[str, Any], typed: bool, first: bool = False) -> Iterator[list[Any]]:
    """The keys of the top-level object from its first (``first``) or after a value (a comma or its end next)."""
    while True:
        if not first and sc.expect(",}", "',' or '}'") == "}":
            return
        first = False
        if sc.peek() != '"':
            sc.expect('"', "a key")
        key = sc.value()
        sc.expect(":", "':'")
        if key == "traceEvents" and sc.peek() == "[":
            sc.pos += 1
            meta["traceEvents"] = True
            yield from _array_batches(sc, typed)
            if sc.stopped:
                return
        else:
            meta[key] = sc.value()


def _array_batches(sc: _Scanner, typed: bool) -> Iterator[list[Any]]:
    if sc.peek() == "]":
        sc.pos += 1
        return
    decode = sc.decode
    decode_typed, typing_errors = typed_decoder() if typed else (None, ())
    ws = _WS.match
    misses = 0
    batches = 0
    while True:
        buf = sc.buf
        pos = ws(buf, sc.pos).end()  # type: ignore[union-attr]
        n = len(buf)
        # Why a margin: an element cut by the buffer end fails to decode, and json builds its error
        # (counting the lines of the whole buffer) before the refill: 0.2 s per 200 MB. Elements that
        # start this far from the end are refilled first; longer ones still take the general path.
        safe = n if sc.eof else n - _MARGIN
        # Why batches: the elements up to the last "}," within _BATCH characters are decoded as one array,
        # in one call of json's C scanner instead of one call each: 22 % less CPU for the raw events of a
        # 40 MB synthetic trace (0.51 -> 0.40 s), 12 % on a real 26 MB one (0.31 -> 0.27 s). 16 KiB batches
        # keep the decoded elements young enough for the garbage collector: 1 MiB ones cost more than
        # they saved. A batch counts only if its text decodes to one array exactly — a "}," inside a
        # string or a nested object leaves a string or a bracket open — so a batch gives exactly what
        # one-by-one decoding gives (tests/report/test_loaders.py checks the two against each other).
        # Why the cut is a "}," followed by "{": real kernel names hold "}," ("{lambda(int)#1}, at::...",
        # in 0.3-1 % of the events of the real traces in tests/data), and a batch cut inside one fails.
        # When every failure counted against the stream, four such names sent a whole real trace
        # one element at a time through json: 2.1-2.7x the CPU of a synthetic trace of the same size.
        # A batch msgspec cannot type (a value it reads or rejects differently from json) is decoded
        # by json as a batch instead; only a batch neither can decode is a miss, and sends the rest of
        # the buffer one by one; past _MISSES misses, and one miss per 64 batches, the whole stream.
        while pos < safe and (misses < _MISSES or misses * 64 < batches):
            cut = _cut(buf, pos, min(safe, pos + _BATCH))
            if cut < 0:
                break
            text = "[" + buf[pos : cut + 1] + "]"
            batch = None
            if decode_typed is not None:
                try:
                    batch = decode_typed(text)
                except typing_errors:
                    pass
                except RecursionError:
                    raise _too_deep() from None
            if batch is None:
                try:
                    batch, end = decode(text)
                except ValueError:  # a JSONDecodeError, or an integer past the digit limit (said below)
                    end = -1
                except RecursionError:
                    raise _too_deep() from None
                if end != len(text):  # not whole elements, or a "}," past the end of the list
                    misses += 1
                    break
            batches += 1
            yield batch
            pos = ws(buf, cut + 2).end()  # type: ignore[union-attr]
        # why: elements that lie wholly inside the buffer skip the general (refilling) path;
        # 2.1x faster on a 100 MB trace. Anything unusual drops to the general path below.
        values: list[Any] = []
        while pos < safe:
            try:
                value, end = decode(buf, pos)
            except ValueError:  # the general path below says what is wrong, or reads more
                break
            except RecursionError:
                raise _too_deep() from None
            after = ws(buf, end).end()  # type: ignore[union-attr]
            if after >= n:
                break
            ch = buf[after]
            if ch == ",":
                values.append(value)
                pos = ws(buf, after + 1).end()  # type: ignore[union-attr]
                continue
            if ch == "]":
                values.append(value)
                yield values
                sc.pos = after + 1
                return
            sc.pos = after
            sc.expect(",]", "',' or ']'")
        else:
            if pos < n or not sc.eof:
                sc.pos = pos
                if values:
                    yield values
                    values = []
                if sc.more():  # the rest of the buffer joined by the next chunk: back to the fast path
                    continue
        if values:
            yield values
        sc.pos = pos
        if sc.head and not sc.peek():  # the end of a head, where an element starts
            sc.stopped = True
            return
        yield [sc.value()]
        if sc.expect(",]", "',' or ']'") == "]":
            return


def _cut(buf: str, pos: int, limit: int) -> int:
    """The position of the last "}," in ``buf[pos:limit]`` followed by white space and "{" (the end
    of an element another one follows), or -1."""
    cut = buf.rfind("},", pos, limit)
    while cut > pos:
        after = _WS.match(buf, cut + 2).end()  # type: ignore[union-attr]
        if after < len(buf) and buf[after] == "{":
            return cut
        cut = buf.rfind("},", pos, cut)
    return -1


def _expect_end(sc: _Scanner) -> None:
    if sc.peek():
        raise TraceFormatError(f"invalid JSON: extra data after the trace at character {sc.dropped + sc.pos}")


_DIGITS = b"0123456789"


class _CountingReader:
    """The binary stream ijson reads, counting its bytes: skips a leading byte-order mark, notes the
    first byte that is not white space, refuses a value that grows past the limit, and refuses a run
    of digits longer than Python's limit for integers.

    ijson's C parser holds a token (a string, a key) whole before it yields an event, so a 1 GiB name
    would be held before the loop saw it: the limit is enforced here, where the bytes come in.
    ``mark`` is where the value being built started (set by the loop between values). Its C backend
    (ijson 3.6) crashes the process (a segmentation fault) on an integer past the digit limit, so
    such a run never reaches it; a run inside a string is refused too (no real trace holds one).
    """

    __slots__ = ("raw", "total", "mark", "first", "run", "long_run", "limit")

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.total = 0
        self.mark = 0
        self.first = b""  # the first byte that is not white space, once read
        self.run = 0  # digits at the end of what was read so far
        self.limit = _int_digits()
        # why the look-behind: each run is tried from its start only, so the search is linear
        self.long_run = re.compile(b"(?<![0-9])[0-9]{%d}" % (self.limit + 1)) if self.limit else None

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        if not self.first and data:
            if self.total == 0 and data.startswith(b"\xef\xbb\xbf"):
                data = data[3:] or self.raw.read(size)  # b"" would read as the end of the file
            self.first = data.lstrip(b" \t\r\n")[:1]
        if self.long_run is not None and data:
            lead = len(data) - len(data.lstrip(_DIGITS))
            found = self.long_run.search(data) if self.run + lead <= self.limit else None
            if found is not None or self.run + lead > self.limit:
                at = self.total + found.start() if found is not None else self.total - self.run
                raise TraceFormatError(
                    f"invalid JSON at byte {at}: a run of more than {self.limit:,} digits (an integer past Python's "
                    "limit; the ijson engine refuses one even inside a string)"
                )
            self.run = self.run + lead if lead == len(data) else len(data) - len(data.rstrip(_DIGITS))
        self.total += len(data)
        if self.total - self.mark > MAX_VALUE_CHARS + len(data):
            raise _too_long(self.mark)
        return data


def iter_raw_ijson(
    stream: IO[bytes], meta: dict[str, Any], on_chunk: Callable[[], None] | None = None
) -> Iterator[Any]:
    """Reference twin of :func:`iter_raw_text` built on ijson events.

    Built on ijson's ``basic_parse`` (events without their path): ``parse`` keeps the path of every
    open container as a string, which costs memory quadratic in the depth (a 200 KB file of nested
    arrays took 23.7 GB), and its C backend crashes on an integer past Python's digit limit.

    Args:
        stream: A binary stream of the trace.
        meta: Filled with every top-level key except ``traceEvents``.
        on_chunk: Called every 64k parser events (progress reporting).

    Raises:
        TraceFormatError: As :func:`iter_raw_text`.
        gpuprobe.errors.MissingDependencyError: ijson is not installed.
    """
    ijson, common = _ijson()
    reader = _CountingReader(stream)
    builder: Any = None
    depth = 0
    target: str | None = None
    mode = ""  # "map" or "array" once the top-level value has started, "done" after it
    in_events = False
    key = ""
    seen = 0
    try:
        for event, val in ijson.basic_parse(reader, use_float=False):
            seen += 1
            if on_chunk is not None and not seen & 0xFFFF:
                on_chunk()
            if builder is None:
                reader.mark = reader.total
                if not mode:
                    if event == "start_map":
                        mode = "map"
                        continue
                    if event == "start_array":
                        mode = "array"
                        in_events = True
                        meta["traceEvents"] = True
                        continue
                    raise TraceFormatError("not a trace: the top-level JSON value is not an object")
                if in_events:
                    if event == "end_array":
                        in_events = False
                        continue
                    target = None
                elif event == "map_key":
                    key = val
                    continue
                elif event in ("end_map", "end_array"):
                    mode = "done"
                    continue
                elif key == "traceEvents" and event == "start_array":
                    in_events = True
                    meta["traceEvents"] = True
                    continue
                else:
                    target = key
                builder = common.ObjectBuilder()
                depth = 0
            builder.event(event, val)
            if event in ("start_map", "start_array"):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep()
            elif event in ("end_map", "end_array"):
                depth -= 1
            if depth == 0:
                if target is None:
                    yield builder.value
                else:
                    meta[target] = builder.value
                builder = None
    except common.IncompleteJSONError as exc:
        if seen == 0:
            raise _nothing_read(reader) from None
        text = str(exc).strip() or "incomplete JSON"
        if "premature EOF" in text or "incomplete" in text.lower():
            raise TraceFormatError("truncated JSON: the file ends inside a value") from None
        raise TraceFormatError(f"invalid JSON: {text.splitlines()[0]}") from None
    except common.JSONError as exc:
        raise TraceFormatError(f"invalid JSON: {str(exc).strip().splitlines()[0]}") from None
    except UnicodeDecodeError:  # text not of its encoding (UTF-16 read as UTF-8 for ijson): said by the caller
        raise
    except ValueError as exc:  # an integer past Python's digit limit
        raise _value_error(exc, reader.mark) from None
    except RecursionError:  # pragma: no cover - the builder is iterative; kept for other backends
        raise _too_deep() from None
    if seen == 0:
        raise _nothing_read(reader)


def _nothing_read(reader: _CountingReader) -> TraceFormatError:
    """Why ijson gave no event: the file is empty (or white space), or does not start as JSON does."""
    if not reader.first:
        return TraceFormatError("empty file")
    if reader.first in (b"{", b"["):
        return TraceFormatError("truncated JSON: the file ends inside a value")
    return TraceFormatError("not a trace: the top-level JSON value is not an object")


def _ijson() -> tuple[Any, Any]:
    """ijson's C backend when built, else its default backend; and ``ijson.common``."""
    try:
        import ijson
        import ijson.common
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from gpuprobe.errors import missing

        raise missing("ijson", "report") from exc
    try:
        return ijson.get_backend("yajl2_c"), ijson.common
    except ImportError:  # pragma: no cover - depends on the build
        return ijson, ijson.common


CAT_KIND = {
    "kernel": KERNEL,
    "Kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "Memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "Memset": MEMSET,
    "cuda_runtime": RUNTIME,
    "Runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "Driver": RUNTIME,
    "cpu_op": CPU_OP,
    "Operator": CPU_OP,
    "user_annotation": RANGE,
    "User Annotation": RANGE,
    "gpu_user_annotation": GPU_RANGE,
    "python_function": PYTHON,
    "cuda_sync": GPU_SYNC,
}


class RawFields:
    """The fields of one raw event a report reads, taken from json's (or ijson's) dict.

    The twin of the records :func:`typed_decoder` decodes: the same attribute names and defaults,
    so :func:`to_event` reads both alike.
    """

    __slots__ = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "args")

    def __init__(self, raw: dict[str, Any]) -> None:
        get = raw.get
        self.ph = get("ph")
        self.cat = get("cat")
        self.name = get("name")
        self.ts = get("ts")
        self.dur = get("dur")
        self.pid = get("pid", 0)
        self.tid = get("tid", 0)
        args = get("args")
        self.args = ArgFields(args) if type(args) is dict else None


class ArgFields:
    """The fields of an event's ``args`` a report reads; all None when absent."""

    __slots__ = ("correlation", "stream", "device", "nbytes", "flops", "dims")

    def __init__(self, args: dict[str, Any]) -> None:
        get = args.get
        self.correlation = get("correlation")
        self.stream = get("stream")
        self.device = get("device")
        self.nbytes = get("bytes")
        self.flops = get("flops")
        self.dims = get("Input Dims")


NO_ARGS = ArgFields({})
_TYPED: list[Any] = []  # [(decode, errors)] once msgspec is imported; [None] without it
_RECORD_TYPES: set[type] = set()  # types to_event reads as records


def record_types() -> frozenset[type]:
    """The types of the records :func:`typed_decoder` decodes (none before it is first called)."""
    return frozenset(_RECORD_TYPES)


def typed_decoder() -> tuple[Callable[[str], list[Any]], tuple[type[Exception], ...]] | tuple[None, tuple[()]]:
    """msgspec's decoder of a JSON array of events into records of :class:`RawFields`' fields, and
    the errors it raises for text it cannot type; ``(None, ())`` when msgspec is not installed.

    Unknown keys are skipped without building them, which is most of the saving: 0.46 s against
    json's 1.43 s for the elements of a 200 MB synthetic trace here (msgspec 0.22, Python 3.11).
    """
    if not _TYPED:
        try:
            import msgspec
        except ImportError:
            _TYPED.append(None)
        else:
            _TYPED.append(_build_typed(msgspec))
    found = _TYPED[0]
    if found is None:
        return None, ()
    return found[0], found[1]


def _build_typed(msgspec: Any) -> tuple[Callable[[str], list[Any]], tuple[type[Exception], ...]]:
    args = msgspec.defstruct(
        "Args", [(name, Any, None) for name in ArgFields.__slots__], rename={"nbytes": "bytes", "dims": "Input Dims"}
    )
    defaults = {"pid": 0, "tid": 0}  # a missing dur is None, as a null one: to_event counts both
    fields = [(name, args | None if name == "args" else Any, defaults.get(name)) for name in RawFields.__slots__]
    record = msgspec.defstruct("Record", fields)
    _RECORD_TYPES.add(record)
    decoder = msgspec.json.Decoder(list[record], float_hook=FloatText)
    return decoder.decode, (msgspec.DecodeError,)  # ValidationError is a DecodeError


def typed_available() -> bool:
    """Whether msgspec can be imported (the ``msgspec`` engine)."""
    return typed_decoder()[0] is not None


#: The reasons :func:`to_event` gives (MalformedEventError, DurationReadAsZero): fixed phrases, so that
#: the loader counts events by reason.
NOT_AN_OBJECT = "not a JSON object"  # the phrases follow a count: "3 not a JSON object"
NO_NAME = "without a name"
BAD_TIME = "with a time that is not a number in range"
BAD_THREAD = "with a pid or tid that is neither an integer nor a string"
NEGATIVE_DURATION = "a negative duration"
NO_DURATION = "no duration (dur missing or null)"


def _times(ts: Any, dur: Any, clamp: bool) -> tuple[int, int]:
    """Start and duration in nanoseconds by :func:`us_to_ns`, or the event is malformed, or (without
    ``clamp``) its duration is missing."""
    try:
        start = us_to_ns(ts)
        if dur is None:
            if not clamp:
                raise DurationReadAsZero(NO_DURATION)
            return start, 0
        return start, us_to_ns(dur)
    except ValueError:  # not a finite number, or out of range
        raise MalformedEventError(BAD_TIME) from None


def to_event(raw: Any, clamp: bool = False) -> Event | None:
    """Turn one raw kineto event into an :class:`Event`, or None for events a report does not use.

    Args:
        raw: One element of ``traceEvents``: json's or ijson's value, or a record of
            :func:`typed_decoder`.
        clamp: Read a negative, null or missing duration as 0 ns instead of raising
            :class:`DurationReadAsZero` (the caller counts it, then calls again with ``clamp``).

    Raises:
        MalformedEventError: An element that is not an object, or a used event with a malformed
            time, name or thread (the caller counts it as skipped); :class:`UnreadPhase`, one, for an
            event of a used kind in a phase other than ``X``.
        DurationReadAsZero: Without ``clamp``, a used event whose duration is negative, null or missing.
    """
    t = type(raw)
    if t is dict:
        if raw.get("ph") != "X":
            _unread(raw.get("cat"), raw.get("ph"))
            return None
        raw = RawFields(raw)
    elif t not in _RECORD_TYPES:
        raise MalformedEventError(NOT_AN_OBJECT)  # the Trace Event Format has objects only
    elif raw.ph != "X":
        _unread(raw.cat, raw.ph)
        return None
    cat = raw.cat
    if type(cat) is not str:
        return None
    kind = CAT_KIND.get(cat)
    if kind is None:
        return None
    name = raw.name
    if type(name) is not str:
        raise MalformedEventError(NO_NAME)
    # Why us_to_ns's common case inline: kineto writes both times with three decimals, and a call per
    # time costs ~0.3 s per 200 MB trace here. Dropping the one point of such a literal shifts its
    # digits exactly as us_to_ns does (0.18 µs against 0.40 µs for slicing around it); a literal with
    # an exponent in its last three characters fails int() and takes the general path.
    ts = raw.ts
    dur_raw = raw.dur
    try:
        start = int(ts.replace(".", "")) if type(ts) is FloatText and ts[-4:-3] == "." else us_to_ns(ts)
        if type(dur_raw) is FloatText and dur_raw[-4:-3] == ".":
            dur = int(dur_raw.replace(".", ""))
        else:
            dur = us_to_ns(dur_raw)  # None (no duration): a ValueError, said by _times
    except ValueError:
        start, dur = _times(ts, dur_raw, clamp)
    if not -LIMIT < start < LIMIT:
        raise MalformedEventError(BAD_TIME)
    if dur < 0:
        if not clamp:
            raise DurationReadAsZero(NEGATIVE_DURATION)
        dur = 0
    if start + dur >= LIMIT:
        raise MalformedEventError(BAD_TIME)
    pid = raw.pid
    tid = raw.tid
    if (type(pid) is not int and type(pid) is not str) or (type(tid) is not int and type(tid) is not str):
        raise MalformedEventError(BAD_THREAD)
    args = raw.args
    if args is None:
        args = NO_ARGS
    # why: Event is built from positional arguments (its field order: kind, name, start_ns, dur_ns,
    # pid, tid, correlation, nbytes, stream, device, direction), once per event: 0.22 µs against 0.68 µs
    # with keywords
    if kind is CPU_OP:
        if args.flops is None and name not in COUNTED_OPS:
            return Event(kind, name, start, dur, pid, tid)
        flops, elements = cpu_op_counts(name, args)
        return Event(kind, name, start, dur, pid, tid, -1, -1, -1, -1, "", flops, elements)
    if kind is RANGE or kind is PYTHON or kind is GPU_RANGE:
        return Event(kind, name, start, dur, pid, tid)
    corr = int_or(args.correlation)
    if kind is RUNTIME:
        return Event(kind, name, start, dur, pid, tid, corr)
    stream = int_or(args.stream, tid if type(tid) is int else -1)
    device = int_or(args.device, pid if type(pid) is int else -1)
    if kind is KERNEL or kind is GPU_SYNC:
        return Event(kind, name, start, dur, pid, tid, corr, -1, stream, device)  # nbytes -1: unknown
    nbytes = int_or(args.nbytes)
    direction = memcpy_direction(name) if kind is MEMCPY else ""
    return Event(kind, name, start, dur, pid, tid, corr, nbytes, stream, device, direction)


def _unread(cat: Any, phase: Any) -> None:
    """Nothing for an event of no kind the report reads (flows, metadata, counters); else the
    :class:`UnreadPhase` of an event of a phase other than ``X`` (kernels as ``B``/``E`` pairs)."""
    kind = CAT_KIND.get(cat) if type(cat) is str else None
    if kind is not None:
        raise UnreadPhase(kind, phase)


# matrix products: (position of the first factor among the inputs, batched)
_GEMM_FLOPS = {"aten::mm": (0, False), "aten::addmm": (1, False), "aten::bmm": (0, True), "aten::baddbmm": (1, True)}
# elementwise operators torch.profiler counts: one FLOP per element of the first input
_ELEMENTWISE_FLOPS = frozenset({"aten::add", "aten::mul"})
_FLOP_OPS = frozenset(_GEMM_FLOPS) | _ELEMENTWISE_FLOPS
#: CPU operators whose FLOPs or input elements are counted from their shapes when kineto gives no FLOPs.
COUNTED_OPS = _FLOP_OPS | CONCAT_OPS


def cpu_op_counts(name: str, args: Any) -> tuple[int, int]:
    """The FLOPs and input elements of a CPU operator (each -1 if unknown), from its ``args``
    (:class:`ArgFields` or a record's): kineto's ``flops``, else (torch 2.x exports shapes, not its
    FLOP counts) torch.profiler's formulas over ``Input Dims``; the elements a concatenation
    (``aten::cat``, recorded with shapes) gathers.
    """
    flops = args.flops
    if flops is None and name in _FLOP_OPS:
        count = _flops_from_shapes(name, args.dims)
        flops = count if count >= 0 else None
    elements = _input_elements(args.dims) if name in CONCAT_OPS else -1
    return (-1 if flops is None else _flops(flops)), elements


def _flops_from_shapes(name: str, dims: Any) -> int:
    """FLOPs of an operator from its ``Input Dims``, with torch.profiler's formulas
    (``with_flops=True``): 2·M·K·N (times the batch) for a matrix product, the elements of the first
    input for ``add`` and ``mul``; -1 if the shapes are missing or malformed.

    Example:
        >>> _flops_from_shapes("aten::addmm", [[64], [3, 64], [64, 32]]), _flops_from_shapes("aten::bmm", [[2, 3, 4], [2, 4, 5]])
        (12288, 240)
        >>> _flops_from_shapes("aten::mul", [[2, 3], []])
        6
    """
    if name in _ELEMENTWISE_FLOPS:
        if type(dims) is not list or not dims or type(dims[0]) is not list:
            return -1
        n = 1
        for d in dims[0]:
            if type(d) is not int or d < 0:
                return -1
            n *= d
        return n if n < LIMIT else -1
    first, batched = _GEMM_FLOPS[name]
    if type(dims) is not list or len(dims) < first + 2:
        return -1
    a, b = dims[first], dims[first + 1]
    rank = 3 if batched else 2
    if type(a) is not list or type(b) is not list or len(a) != rank or len(b) != rank:
        return -1
    if not all(type(d) is int and d >= 0 for d in a + b):
        return -1
    count = 2 * a[-2] * a[-1] * b[-1] * (a[0] if batched else 1)
    return count if count < LIMIT else -1


def _input_elements(dims: Any) -> int:
    """Elements of the tensor inputs of an operator from its ``Input Dims`` (nested for a tensor
    list, as ``aten::cat`` has); -1 if there are none or they are malformed."""
    if type(dims) is not list:
        return -1
    total = 0
    stack = list(dims)
    while stack:
        shape = stack.pop()
        if type(shape) is not list or not shape:
            continue
        if all(type(d) is int for d in shape):
            n = 1
            for d in shape:
                n *= d
            total += n
        else:
            stack.extend(shape)
    return total if 0 < total < LIMIT else -1


def _flops(value: Any) -> int:
    if type(value) is int:
        return value if 0 <= value < LIMIT else -1
    number = number_to_int(value)
    return number if number is not None and 0 <= number < LIMIT else -1


def number_to_int(value: Any) -> int | None:
    """An integer from a metadata number of either engine (int, number text or Decimal), within
    ±2**62 (:data:`~gpuprobe.report._events.LIMIT`); else None.

    Example:
        >>> number_to_int(FloatText("1.7e9")), number_to_int(FloatText("1e999999")), number_to_int(10**30)
        (1700000000, None, None)
    """
    if type(value) is int:
        return value if -LIMIT < value < LIMIT else None
    try:
        if type(value) is FloatText or type(value) is Decimal:
            d = Decimal(value)
            # why adjusted() first: int() of 1e999999 builds a million-digit integer
            if d.is_finite() and d.adjusted() < 19 and d == d.to_integral_value():
                number = int(d)
                return number if -LIMIT < number < LIMIT else None
    except (ArithmeticError, ValueError):
        return None
    return None


#: What a pass does with an element :func:`to_event` refuses: the event to fold instead, or None
#: (:meth:`KinetoTrace.refused`, which counts it).
Refused = Callable[[Any, Exception], "Event | None"]


def fields_batches(batches: Iterable[list[Any]], refused: Refused | None = None) -> Iterator[list[Event | EventFields]]:
    """The events of lists of elements of ``traceEvents`` (as :meth:`KinetoTrace.raw_batches` yields them), a
    list for each: the fast path of a report's pass (:meth:`gpuprobe.report._scan.TraceScan.consume_batches`).

    The twin of :func:`to_event` (tested against it): a record of the usual shape becomes its
    :data:`~gpuprobe.report._events.EventFields` here, without building an :class:`Event`; anything else
    goes through ``to_event``, and an element it refuses to ``refused`` (which returns the event instead, or
    None; raised without one). Elements of no kind the report reads are left out.
    """
    slow = _slow_path(refused)
    typed_decoder()  # defines the record types
    records = record_types()
    record = next(iter(records)) if len(records) == 1 else None
    cat_kind, float_text, no_args, counted_ops, limit = CAT_KIND, FloatText, NO_ARGS, COUNTED_OPS, LIMIT
    for batch in batches:
        out: list[Event | EventFields] = []
        add = out.append
        for ev in batch:
            # Why records here and not Event objects: building an Event and reading it back cost half of a
            # real trace's pass (measured in benchmarks/report/RESULTS.md). A record of the usual shape (an
            # "X" event of a known category with a name, times as integers or literals of up to three
            # decimals, in range, a duration of 0 or more, a pid and tid that are integers or strings) is
            # read here; every other element takes to_event.
            if type(ev) is record:
                cat = ev.cat
                if ev.ph != "X":
                    if type(cat) is str and cat in cat_kind:  # an event of a used kind: counted as left out
                        slow(ev)
                    continue
                kind = cat_kind.get(cat) if type(cat) is str else None
                if kind is None:
                    continue
                name, pid, tid, ts, d = ev.name, ev.pid, ev.tid, ev.ts, ev.dur
                # us_to_ns inline: an integer, or a literal of up to three decimals shifted as text. Why
                # the point dropped first: kineto writes three decimals, and int() of the literal without
                # its point takes 0.18 µs against 0.40 µs for slicing around it (as in to_event)
                start = dur = -1
                if type(ts) is int:
                    start = ts * 1000
                elif type(ts) is float_text and ts[-4:-3] == ".":
                    try:
                        start = int(ts.replace(".", ""))
                    except ValueError:  # an exponent
                        start = limit
                elif type(ts) is float_text:
                    dot = ts.find(".")
                    if dot > 0 and len(ts) - dot <= 4:
                        try:
                            start = int(ts[:dot] + ts[dot + 1 :] + "00"[: dot + 4 - len(ts)])
                        except ValueError:  # an exponent
                            start = limit
                    else:
                        start = limit
                else:
                    start = limit
                if type(d) is int:
                    dur = d * 1000
                elif type(d) is float_text and d[-4:-3] == ".":
                    try:
                        dur = int(d.replace(".", ""))
                    except ValueError:
                        dur = -1
                elif type(d) is float_text:
                    dot = d.find(".")
                    if dot > 0 and len(d) - dot <= 4:
                        try:
                            dur = int(d[:dot] + d[dot + 1 :] + "00"[: dot + 4 - len(d)])
                        except ValueError:
                            dur = -1
                if (type(name) is str and -limit < start < limit and 0 <= dur < limit and start + dur < limit
                        and (type(pid) is int or type(pid) is str) and (type(tid) is int or type(tid) is str)):
                    args = ev.args
                    if args is None:
                        args = no_args
                    if kind is CPU_OP:
                        if args.flops is None and name not in counted_ops:
                            add((kind, name, start, dur, pid, tid, -1, -1, -1, -1, "", -1, -1))
                        else:
                            flops, elements = cpu_op_counts(name, args)
                            add((kind, name, start, dur, pid, tid, -1, -1, -1, -1, "", flops, elements))
                        continue
                    if kind is RANGE or kind is PYTHON or kind is GPU_RANGE:
                        add((kind, name, start, dur, pid, tid, -1, -1, -1, -1, "", -1, -1))
                        continue
                    c = args.correlation
                    corr = c if type(c) is int and -limit < c < limit else -1
                    if kind is RUNTIME:
                        add((kind, name, start, dur, pid, tid, corr, -1, -1, -1, "", -1, -1))
                        continue
                    c = args.stream
                    stream = c if type(c) is int and -limit < c < limit else (tid if type(tid) is int else -1)
                    c = args.device
                    device = c if type(c) is int and -limit < c < limit else (pid if type(pid) is int else -1)
                    if kind is KERNEL or kind is GPU_SYNC:
                        add((kind, name, start, dur, pid, tid, corr, -1, stream, device, "", -1, -1))
                        continue
                    c = args.nbytes
                    nbytes = c if type(c) is int and -limit < c < limit else -1
                    direction = memcpy_direction(name) if kind is MEMCPY else ""
                    add((kind, name, start, dur, pid, tid, corr, nbytes, stream, device, direction, -1, -1))
                    continue
            event = slow(ev)
            if event is not None:
                add(event)
        yield out


def _slow_path(refused: Refused | None) -> Callable[[Any], Event | None]:
    """to_event, with the elements it refuses handed to ``refused`` (raised without one)."""
    if refused is None:
        return to_event
    errors = (MalformedEventError, DurationReadAsZero)

    def slow(raw: Any) -> Event | None:
        try:
            return to_event(raw)
        except errors as exc:
            return refused(raw, exc)

    return slow


#: JSON engines: ``auto`` (the default: ``msgspec`` when it is installed, else ``stdlib``), ``msgspec``
#: (the fastest), ``stdlib`` and ``ijson`` (the reference twin). All give the same events.
ENGINES: tuple[str, ...] = ("auto", "msgspec", "stdlib", "ijson")


class KinetoTrace(Trace):
    """A kineto trace, plain (``kineto-json``) or gzip (``kineto-gzip``), read by one of :data:`ENGINES`."""

    source = "kineto"

    def __init__(self, path: str, fmt: str, engine: str = "auto") -> None:
        super().__init__(path, fmt)
        self.engine = _resolve(engine)  # "msgspec", "stdlib" or "ijson"
        self._zeroed: dict[str, int] = {}
        self._encoding: str | None = None

    def encoding(self) -> str:
        """The codec of the file's text (of its decompressed bytes for gzip): ``utf-8``, or UTF-16 or UTF-32
        as its first bytes say (:func:`json_encoding`; Windows tools write UTF-16).

        Raises:
            ReportInputError: The file's first characters are not those of JSON text (:func:`not_json`).
        """
        if self._encoding is None:
            head = b""
            try:
                with open(self.path, "rb") as raw:
                    if self.format == "kineto-gzip":
                        with gzip.GzipFile(fileobj=raw, mode="rb") as unpacked:
                            head = unpacked.read(SNIFF_BYTES)
                    else:
                        head = raw.read(SNIFF_BYTES)
            except (OSError, EOFError, zlib.error):
                pass  # a corrupt or cut gzip stream: said when the file is read
            encoding = json_encoding(head)
            problem = not_json(head.decode(encoding, errors="replace"), self.path)
            if problem is not None:
                raise self._fail(problem)
            self._encoding = encoding
        return self._encoding

    def events(self, progress: Progress | None = None) -> Iterator[Event]:
        self.info = TraceInfo(self.source)
        refused = self.refused
        for batch in self.raw_batches(progress):
            for item in batch:
                try:
                    event = to_event(item)
                except (MalformedEventError, DurationReadAsZero) as exc:  # rare: counted, said
                    event = refused(item, exc)
                if event is not None:
                    yield event

    def feed(self, scan: Any, progress: Progress | None = None, processes: int = 1) -> None:
        """Pass every event to ``scan``, through the fast path (:meth:`field_batches`); with ``processes`` of
        2 or more, a large plain UTF-8 file read by msgspec or json in two processes at once
        (:mod:`gpuprobe.report._split`, which says when)."""
        if (processes >= 2 and self.format == "kineto-json" and self.engine != "ijson"
                and _split.worth_splitting(self, scan) and self.encoding() == "utf-8"):
            if _split.feed_in_two(self, scan, progress):
                return
            # A fresh start for the one pass (nothing was fed when the split began).
            scan.__init__(scan.correlation_by_process, scan.keep_longest)
        scan.consume_batches(self.field_batches(progress))

    def field_batches(
        self, progress: Progress | None = None, part: Part | None = None, meta: dict[str, Any] | None = None
    ) -> Iterator[list[Event | EventFields]]:
        """The events of :meth:`raw_batches` (arguments and errors as there), a list for each of its lists, as
        :func:`fields_batches` makes them: the fields of the usual records, the :class:`Event` of any other
        element, every refused element counted (:meth:`refused`).

        Why not :meth:`events`: building an Event per element and reading it back cost half of a real
        trace's pass (benchmarks/report/RESULTS.md).
        """
        return fields_batches(self.raw_batches(progress, part, meta), self.refused)

    def raw_batches(
        self, progress: Progress | None = None, part: Part | None = None, meta: dict[str, Any] | None = None
    ) -> Iterator[list[Any]]:
        """Stream the elements of ``traceEvents`` in lists, as :func:`to_event` reads them (the fast
        path of a report's pass; :meth:`events` is built on it).

        The caller turns each element into an event with :func:`to_event` and hands every element it
        refuses to :meth:`refused`; :attr:`info` is complete once the stream is exhausted.

        Args:
            progress: As for :meth:`events`.
            part: Read only this part of a plain (not gzip) trace, with the ``msgspec`` or ``stdlib``
                engine; the caller then completes :attr:`info` with :meth:`finish`.
            meta: Filled with the top-level keys other than ``traceEvents`` (a part's own).

        Raises:
            ReportInputError: As for :meth:`events`.
            BoundaryMissed: The head of ``part`` does not end where an element starts.
        """
        if part is None:
            self.info = TraceInfo(self.source)
        self._zeroed = {}
        meta = {} if meta is None else meta
        encoding = "utf-8" if part is not None and part.tail else self.encoding()
        if part is not None and encoding != "utf-8":
            raise ValueError("only a UTF-8 trace can be read in parts")
        with open(self.path, "rb") as raw:
            on_chunk = None
            if progress is not None:
                total = self.size

                def on_chunk() -> None:
                    progress(raw.tell(), total)

            binary: Any = gzip.GzipFile(fileobj=raw, mode="rb") if self.format == "kineto-gzip" else raw
            if part is not None:
                if self.format != "kineto-json" or self.engine == "ijson":
                    raise ValueError("only a plain kineto trace read by msgspec or json can be read in parts")
                binary = open_part(raw, part)
            try:
                if self.engine == "ijson":
                    if encoding != "utf-8":  # ijson reads UTF-8 bytes
                        binary = _Utf8(binary, encoding)
                    yield from ([item] for item in iter_raw_ijson(binary, meta, on_chunk))
                else:
                    text = io.TextIOWrapper(binary, encoding=encoding, errors="strict", newline="")
                    yield from iter_raw_batches(text, meta, on_chunk, typed=self.engine == "msgspec", part=part)
            except TraceFormatError as exc:
                raise self._fail(str(exc)) from None
            except EOFError:
                raise self._fail("truncated gzip stream: the file ends before the end-of-stream marker") from None
            except (gzip.BadGzipFile, zlib.error) as exc:
                raise self._fail(f"corrupt gzip data ({exc})") from None
            except UnicodeDecodeError as exc:
                raise self._fail(f"not {encoding_name(encoding)} text at byte {exc.start}: not a JSON trace") from None
            except OSError as exc:
                raise self._fail(f"cannot read: {exc.strerror or exc}") from None
        if part is None:
            self.finish(meta)

    def refused(self, item: Any, exc: MalformedEventError | DurationReadAsZero) -> Event | None:
        """The event of an element :func:`to_event` refused: None and a count of it as skipped, or (a
        duration read as 0 ns) the event and a count of that."""
        if isinstance(exc, UnreadPhase):
            self.info.skip_phase(str(exc))
            return None
        if isinstance(exc, DurationReadAsZero):
            try:
                event = to_event(item, clamp=True)
            except MalformedEventError as again:
                self.info.skip(str(again))
                return None
            reason = str(exc)
            self._zeroed[reason] = self._zeroed.get(reason, 0) + 1
            return event
        self.info.skip(str(exc))
        return None

    def zeroed(self) -> dict[str, int]:
        """Events whose duration was read as 0 ns so far, by reason (in order of first sighting)."""
        return self._zeroed

    def finish(self, meta: dict[str, Any]) -> None:
        """Complete :attr:`info` after :meth:`raw_batches`: the durations read as 0 ns, and what the
        top-level keys ``meta`` say (the notes in that order).

        Raises:
            ReportInputError: ``meta`` has no ``traceEvents`` list.
        """
        info = self.info
        info.notes.extend(
            f"{n:,} event{'s have' if n != 1 else ' has'} {reason}: read as 0 ns" for reason, n in self._zeroed.items()
        )
        if meta.get("traceEvents") is not True:
            if "traceEvents" in meta:
                raise self._fail("not a kineto trace: 'traceEvents' is not a list")
            raise self._fail("not a kineto trace: no 'traceEvents' list")
        info.base_time_ns = self._metadata_int(meta, "baseTimeNanoseconds")
        dist = meta.get("distributedInfo")
        if isinstance(dist, dict):
            info.rank = self._metadata_int(dist, "rank", "distributedInfo.")
            info.world_size = self._metadata_int(dist, "world_size", "distributedInfo.")
            if info.rank is not None:
                info.rank_source = "distributedInfo.rank"
        devices = meta.get("deviceProperties")
        if isinstance(devices, list):
            info.devices = [str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name")]

    def _metadata_int(self, meta: dict[str, Any], key: str, prefix: str = "") -> int | None:
        """An integer of the trace's metadata, or None; a note when it is there but is not one."""
        value = meta.get(key)
        number = number_to_int(value)
        if number is None and value is not None:
            self.info.notes.append(f"{prefix}{key} is not an integer within ±2**62: ignored")
        return number


def _resolve(engine: str) -> str:
    if engine == "auto":
        return "msgspec" if typed_available() else "stdlib"
    if engine == "msgspec" and not typed_available():
        from gpuprobe.errors import missing

        raise missing("msgspec", "report")
    return engine
