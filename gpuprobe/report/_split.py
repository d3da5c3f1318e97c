"""One large kineto trace read by two processes at once: this one reads the head of the file, a second one
the tail, and the tail's :class:`~gpuprobe.report._scan.TraceScan` is merged into the head's.

Why: the pass is bound by one core (the JSON decoding and the fold into columns), and a report is asked
for on machines with more. Measured on the two-core development machine (``benchmarks/report/RESULTS.md``),
see :data:`MIN_BYTES` for when it pays.

What it takes: a plain (not gzip) UTF-8 ``kineto-json`` file read by the ``msgspec`` or ``stdlib`` engine, of
:data:`MIN_BYTES` or more, and a scan nothing was fed yet. The file is cut at the first element of
``traceEvents`` that starts after its middle byte (:func:`element_start`); the head then checks that the
cut is where an element starts (:class:`~gpuprobe.report._kineto.BoundaryMissed` otherwise). Anything
that goes wrong with the split (no element found near the middle, a cut inside an element, the second
process failing or finding the file malformed) falls back to one pass over the whole file, which then
says what is wrong as it always does: the report is the same whichever way it was read.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from gpuprobe.report._events import TraceInfo
from gpuprobe.report._kineto import BoundaryMissed, KinetoTrace, Part
from gpuprobe.report._scan import TraceScan
from gpuprobe.report._trace import Trace

__all__ = ["MIN_BYTES", "element_start", "feed", "usable_cpus"]

#: Files smaller than this are read by one process: starting the second one and merging cost about
#: 0.5 s, and a split pays from about 100 MB on the development machine.
MIN_BYTES = 256 << 20
_SEARCH = 4 << 20  # bytes after the middle searched for the start of an element
# The end of one element and the start of the next: "}" then "," then "{" (white space between).
_BETWEEN = re.compile(rb"\}\s*,\s*\{")
_CHILD = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
          "from gpuprobe.report._split import tail_main; tail_main(sys.argv[1:])")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def element_start(path: str, after: int) -> int | None:
    """The byte offset of a ``{`` that follows ``}`` and a comma, at or after ``after`` (within a few MB),
    or None. It starts an element of ``traceEvents`` unless it is inside one (a list of objects in an
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


def feed(trace: Trace, scan: TraceScan, progress: Callable[[int, int], None] | None = None, *,
         processes: int = 1) -> None:
    """``trace.feed(scan, progress)``, with the pass split over two processes where that pays (the module
    docstring says when)."""
    if processes >= 2 and _splittable(trace, scan):
        assert isinstance(trace, KinetoTrace)
        if _feed_split(trace, scan, progress):
            return
        # A fresh start for the one pass (nothing was fed when the split began).
        scan.__init__(scan.correlation_by_process, scan.keep_longest)  # type: ignore[misc]
    trace.feed(scan, progress)


def _splittable(trace: Trace, scan: TraceScan) -> bool:
    return (isinstance(trace, KinetoTrace) and trace.format == "kineto-json" and trace.engine != "ijson"
            and trace.size >= MIN_BYTES and not scan.event_counts and trace.encoding() == "utf-8")


def _feed_split(trace: KinetoTrace, scan: TraceScan, progress: Callable[[int, int], None] | None) -> bool:
    at = element_start(trace.path, trace.size // 2)
    top = _top(trace.path)
    if at is None or top not in "{[":
        return False
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # -I: neither the current folder nor PYTHONPATH on the child's path (a zlib.py beside the trace is never
    # imported); it imports the gpuprobe of this process, and works in the folder that holds it.
    args = [sys.executable, "-I", "-c", _CHILD, root, os.path.abspath(trace.path), str(at), top, trace.engine,
            str(scan.keep_longest), str(int(scan.correlation_by_process))]
    try:
        child = subprocess.Popen(args, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 stdin=subprocess.DEVNULL)
    except OSError:
        return False
    try:
        head_meta: dict[str, Any] = {}
        trace.info = TraceInfo(trace.source)
        scale = trace.size / at
        head_progress = None if progress is None else (lambda done, total: progress(min(int(done * scale), total), total))
        try:
            scan.consume_raw(trace.raw_batches(head_progress, part=Part(False, at, top), meta=head_meta), trace.refused)
        except BoundaryMissed:
            return False
        assert child.stdout is not None
        try:
            result = pickle.load(child.stdout)
        except Exception:  # the second process ended without its scan
            return False
        if child.wait() != 0 or not isinstance(result, dict) or "scan" not in result:
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
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def tail_main(argv: list[str]) -> None:
    """The second process: read the tail of the file from ``at`` and write its scan (pickled) to stdout."""
    path, at, top, engine, keep_longest, by_process = argv
    trace = KinetoTrace(path, "kineto-json", engine)
    trace.info = TraceInfo(trace.source)
    scan = TraceScan(correlation_by_process=by_process == "1", keep_longest=int(keep_longest))
    meta: dict[str, Any] = {}
    try:
        scan.consume_raw(trace.raw_batches(part=Part(True, int(at), top), meta=meta), trace.refused)
        result: dict[str, Any] = {"scan": scan, "skipped": trace.info.skipped_reasons,
                                  "phases": trace.info.skipped_phases, "zeroed": trace.zeroed(), "meta": meta}
    except Exception as exc:  # the parent reads the whole file again, and says what is wrong
        result = {"error": f"{type(exc).__name__}: {exc}"}
    pickle.dump(result, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.flush()
