"""One large trace read by two processes at once: this one reads the head of the file, a second one the
tail, and the tail's :class:`~gpuprobe.report._scan.TraceScan` is merged into the head's.

Why: the pass is bound by one core (the JSON decoding and the fold into columns), and a report is asked
for on machines with more. Measured on the two-core development machine (``benchmarks/report/RESULTS.md``),
see :data:`MIN_BYTES` for when it pays.

What it takes: a plain (not gzip) UTF-8 JSON file whose reader can read a :class:`Part` of it (kineto's,
``KinetoTrace.feed`` decides), of :data:`MIN_BYTES` or more, and a scan nothing was fed yet. The file is
cut at the first element of the event array that starts after its middle byte (:func:`element_start`);
the head then checks that the cut is where an element starts (:class:`BoundaryMissed` otherwise). The
tail runs on an :class:`~gpuprobe.report._executors.IsolatedProcessPool` of one worker (``python -I``,
as the ranks' workers). Anything that goes wrong with the split (no element found near the middle, a cut
inside an element, the second process failing or finding the file malformed) falls back to one pass over
the whole file, which then says what is wrong as it always does: the report is the same whichever way it
was read.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable, Iterator
from typing import IO, Any, Protocol

from gpuprobe.report._events import Event, EventFields, TraceInfo
from gpuprobe.report._executors import IsolatedProcessPool
from gpuprobe.report._scan import TraceScan

__all__ = ["MIN_BYTES", "Part", "BoundaryMissed", "open_part", "element_start", "worth_splitting", "feed_in_two",
           "read_tail", "PartReader"]

#: Files smaller than this are read by one process: starting the second one and merging cost about
#: 0.5 s, and a split pays from about 100 MB on the development machine.
MIN_BYTES = 256 << 20
_SEARCH = 4 << 20  # bytes after the middle searched for the start of an element
# The end of one element and the start of the next: "}" then "," then "{" (white space between).
_BETWEEN = re.compile(rb"\}\s*,\s*\{")
_BUFFER = 1 << 20  # bytes of a head's buffered reader


class BoundaryMissed(Exception):
    """The head of a split trace (:class:`Part`) does not end where an element of the event array starts."""


class Part:
    """A part of a plain JSON trace, for a pass split over processes at byte ``at``, the start of an
    element of its event array (kineto's ``traceEvents``; where the caller believes one starts).

    The head (``tail`` false) is the file up to ``at``: it must end where an element starts, else
    reading it raises :class:`BoundaryMissed`. The tail starts there, inside the event array, whose
    top-level value is ``top`` (``"{"`` or ``"["``, the bare array of events); it reads the rest of
    that array and of the top-level value. Positions in the errors of a tail count from ``at``.
    """

    __slots__ = ("tail", "at", "top")

    def __init__(self, tail: bool, at: int, top: str = "{") -> None:
        self.tail = tail
        self.at = at
        self.top = top


class _Head(io.RawIOBase):
    """The first ``size`` bytes of a binary file."""

    def __init__(self, raw: IO[bytes], size: int) -> None:
        self.raw = raw
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)[: self.left]
        n = self.raw.readinto(view)  # type: ignore[attr-defined]
        self.left -= n
        return n


def open_part(raw: IO[bytes], part: Part) -> IO[bytes]:
    """The bytes of ``part`` of the plain trace ``raw`` (a binary file at its start)."""
    if part.tail:
        raw.seek(part.at)
        return raw
    return io.BufferedReader(_Head(raw, part.at), _BUFFER)  # type: ignore[arg-type]


class PartReader(Protocol):
    """What a trace's reader offers to be read in two parts (``KinetoTrace`` does)."""

    path: str
    size: int
    source: str
    info: TraceInfo

    def field_batches(self, progress: Callable[[int, int], None] | None = None, part: Part | None = None,
                      meta: dict[str, Any] | None = None) -> Iterator[list[Event | EventFields]]:
        """The events of the file, or of ``part`` of it, in lists (the scan's input); ``meta`` filled with the
        top-level keys other than the event array."""

    def zeroed(self) -> dict[str, int]:
        """Events whose duration was read as 0 ns so far, by reason."""

    def finish(self, meta: dict[str, Any]) -> None:
        """Complete :attr:`info` once every part is read, from the top-level keys ``meta``."""


def element_start(path: str, after: int) -> int | None:
    """The byte offset of a ``{`` that follows ``}`` and a comma, at or after ``after`` (within a few MB),
    or None. It starts an element of the event array unless it is inside one (a list of objects in an
    event's ``args``), which the head of the split then finds out."""
    with open(path, "rb") as f:
        f.seek(after)
        window = f.read(_SEARCH)
    found = _BETWEEN.search(window)
    return None if found is None else after + found.end() - 1


def _top(path: str) -> str:
    """The first character of the file's JSON value (``{`` or ``[``)."""
    with open(path, "rb") as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf").lstrip()
    return head[:1].decode("latin-1")


def worth_splitting(trace: PartReader, scan: TraceScan) -> bool:
    """Whether a split pays for ``trace`` (:data:`MIN_BYTES` or more) and can be made (``scan`` is empty)."""
    return trace.size >= MIN_BYTES and not scan.event_counts


def feed_in_two(trace: PartReader, scan: TraceScan, progress: Callable[[int, int], None] | None = None) -> bool:
    """Feed ``scan`` the whole of ``trace``, its head read here and its tail in a second process; False (and
    ``scan`` to be fed afresh) if the split could not be made (the module docstring says when)."""
    at = element_start(trace.path, trace.size // 2)
    top = _top(trace.path)
    if at is None or top not in "{[":
        return False
    pool = IsolatedProcessPool(1)
    try:
        # the worker's working folder is not this one: it reads the file by its absolute path
        tail = pool.submit(read_tail, trace, os.path.abspath(trace.path), at, top, scan.keep_longest,
                           scan.correlation_by_process)
        head_meta: dict[str, Any] = {}
        trace.info = TraceInfo(trace.source)
        scale = trace.size / at
        head_progress = None if progress is None else (
            lambda done, total: progress(min(int(done * scale), total), total))
        try:
            scan.consume_batches(trace.field_batches(head_progress, part=Part(False, at, top), meta=head_meta))
        except BoundaryMissed:
            return False
        try:
            result = tail.result()
        except Exception:  # the second process ended without its scan
            return False
        if not isinstance(result, dict) or "scan" not in result:
            return False
        scan.merge(result["scan"])
        info = trace.info
        for reason, n in result["skipped"].items():
            info.skipped_events += n
            info.skipped_reasons[reason] = info.skipped_reasons.get(reason, 0) + n
        for phase, n in result["phases"].items():
            info.skipped_events += n
            info.skipped_phases[phase] = info.skipped_phases.get(phase, 0) + n
        zeroed = trace.zeroed()
        for reason, n in result["zeroed"].items():
            zeroed[reason] = zeroed.get(reason, 0) + n
        trace.finish({**head_meta, **result["meta"]})
        return True
    finally:
        pool.terminate()  # the tail is read, or no longer wanted


def read_tail(trace: PartReader, path: str, at: int, top: str, keep_longest: int, by_process: bool) -> dict[str, Any]:
    """The second process's part: the scan of the tail of the file (at ``path``) from ``at``, and what its
    reader counted; or ``{"error": ...}`` (the parent reads the whole file again, and says what is wrong)."""
    trace.path = path
    trace.info = TraceInfo(trace.source)
    scan = TraceScan(correlation_by_process=by_process, keep_longest=keep_longest)
    meta: dict[str, Any] = {}
    try:
        scan.consume_batches(trace.field_batches(part=Part(True, at, top), meta=meta))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"scan": scan, "skipped": trace.info.skipped_reasons, "phases": trace.info.skipped_phases,
            "zeroed": trace.zeroed(), "meta": meta}
