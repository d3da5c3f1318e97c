"""Open a trace file of either format and stream its events.

``load(path)`` sniffs the format from the first bytes (gzip, SQLite, else JSON text), checks what
can be checked cheaply, and returns a :class:`Trace` whose :meth:`Trace.events` streams
:class:`~gpuprobe.report.Event` objects. Every problem with the input surfaces as one
:class:`~gpuprobe.report.ReportInputError` naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from gpuprobe.errors import ConfigError
from gpuprobe.report._errors import ReportInputError, read_input, regular_file
from gpuprobe.report._events import Event, TraceInfo
from gpuprobe.report._kineto import (
    DurationReadAsZero,
    MalformedEventError,
    Part,
    TraceFormatError,
    iter_raw_ijson,
    iter_raw_batches,
    number_to_int,
    open_part,
    to_event,
    typed_available,
)
from gpuprobe.report._ncu import SNIFF_BYTES, sniff as sniff_ncu
from gpuprobe.report._nsys import NsysFormatError, iter_events as iter_nsys_events, kernel_processes, open_export

__all__ = ["Trace", "TraceInfo", "load", "ncu_format", "ENGINES"]

#: JSON engines: ``auto`` (the default: ``msgspec`` when it is installed, else ``stdlib``), ``msgspec``
#: (the fastest), ``stdlib`` and ``ijson`` (the reference twin). All give the same events.
ENGINES: tuple[str, ...] = ("auto", "msgspec", "stdlib", "ijson")
Progress = Callable[[int, int], None]

_GZIP_MAGIC = b"\x1f\x8b"
_SQLITE_MAGIC = b"SQLite format 3\x00"


class Trace:
    """A trace file, opened lazily; iterate :meth:`events` once or more.

    Example:
        >>> trace = load("tests/data/kineto_min.json")  # doctest: +SKIP
        >>> sum(1 for e in trace.events() if e.kind == "kernel")  # doctest: +SKIP
        2
    """

    def __init__(self, path: str, fmt: str, engine: str = "auto", process: int | None = None) -> None:
        self.path = path
        self.format = fmt  # "kineto-json", "kineto-gzip" or "nsys-sqlite"
        self.engine = _resolve(engine)  # "msgspec", "stdlib" or "ijson"
        self.process = process  # nsys: only this process's events (None: all)
        self.info = TraceInfo("nsys" if fmt == "nsys-sqlite" else "kineto")
        self.size = os.path.getsize(path)

    def events(self, progress: Progress | None = None) -> Iterator[Event]:
        """Stream the events of the trace.

        Args:
            progress: Called now and then with ``(bytes_done, bytes_total)`` (nsys: rows).

        Yields:
            Events in file order (not time order).

        Raises:
            ReportInputError: The file turns out truncated, invalid or not a trace.
        """
        self.info = TraceInfo(self.info.source)
        if self.format == "nsys-sqlite":
            yield from self._nsys_events(progress)
            return
        refused = self.refused
        for batch in self.raw_batches(progress):
            for item in batch:
                try:
                    event = to_event(item)
                except (MalformedEventError, DurationReadAsZero) as exc:  # rare: counted, said
                    event = refused(item, exc)
                if event is not None:
                    yield event

    def _fail(self, problem: str) -> ReportInputError:
        return ReportInputError(self.path, problem)

    def raw_batches(
        self, progress: Progress | None = None, part: Part | None = None, meta: dict[str, Any] | None = None
    ) -> Iterator[list[Any]]:
        """Stream the elements of a kineto trace's ``traceEvents`` in lists, as :func:`to_event` reads them
        (the fast path of a report's pass; :meth:`events` is built on it).

        The caller turns each element into an event with :func:`to_event` and hands every element it
        refuses to :meth:`refused`; :attr:`info` is complete once the stream is exhausted.

        Args:
            progress: As for :meth:`events`.
            part: Read only this part of a plain (not gzip) trace, with the ``msgspec`` or ``stdlib``
                engine; the caller then completes :attr:`info` with :meth:`finish`.
            meta: Filled with the top-level keys other than ``traceEvents`` (a part's own).

        Raises:
            ReportInputError: As for :meth:`events`.
            gpuprobe.report._kineto.BoundaryMissed: The head of ``part`` does not end where an element starts.
        """
        if part is None:
            self.info = TraceInfo(self.info.source)
        self._zeroed: dict[str, int] = {}
        meta = {} if meta is None else meta
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
                    yield from ([item] for item in iter_raw_ijson(binary, meta, on_chunk))
                else:
                    text = io.TextIOWrapper(binary, encoding="utf-8", errors="strict", newline="")
                    yield from iter_raw_batches(text, meta, on_chunk, typed=self.engine == "msgspec", part=part)
            except TraceFormatError as exc:
                raise self._fail(str(exc)) from None
            except EOFError:
                raise self._fail("truncated gzip stream: the file ends before the end-of-stream marker") from None
            except (gzip.BadGzipFile, zlib.error) as exc:
                raise self._fail(f"corrupt gzip data ({exc})") from None
            except UnicodeDecodeError as exc:
                raise self._fail(f"not UTF-8 text at byte {exc.start}: not a JSON trace") from None
            except OSError as exc:
                raise self._fail(f"cannot read: {exc.strerror or exc}") from None
        if part is None:
            self.finish(meta)

    def refused(self, item: Any, exc: MalformedEventError | DurationReadAsZero) -> Event | None:
        """The event of an element :func:`to_event` refused: None and a count of it as skipped, or (a
        duration read as 0 ns) the event and a count of that."""
        return _counted(item, exc, self.info, self._zeroed)

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

    def _nsys_events(self, progress: Progress | None) -> Iterator[Event]:
        try:
            con = open_export(self.path)
        except sqlite3.Error as exc:
            raise self._fail(f"cannot open as SQLite: {exc}") from None
        with contextlib.closing(con):
            try:
                yield from iter_nsys_events(con, self.info, progress, process=self.process)
            except NsysFormatError as exc:
                raise self._fail(str(exc)) from None
            except sqlite3.Error as exc:
                raise self._fail(f"SQLite error: {exc}") from None


def _counted(item: Any, exc: Exception, info: TraceInfo, zeroed: dict[str, int]) -> Event | None:
    """The event of an element :func:`to_event` refused: None and a count of it as skipped, or (a
    duration read as 0 ns) the event and a count of that."""
    if isinstance(exc, DurationReadAsZero):
        try:
            event = to_event(item, clamp=True)
        except MalformedEventError as again:
            info.skip(str(again))
            return None
        reason = str(exc)
        zeroed[reason] = zeroed.get(reason, 0) + 1
        return event
    info.skip(str(exc))
    return None


def _resolve(engine: str) -> str:
    if engine == "auto":
        return "msgspec" if typed_available() else "stdlib"
    if engine == "msgspec" and not typed_available():
        from gpuprobe.errors import missing

        raise missing("msgspec", "report")
    return engine


def load(path: str | os.PathLike[str], engine: str = "auto", process: int | None = None) -> Trace:
    """Open a kineto JSON / JSON.gz trace or an Nsight Systems SQLite export.

    The file is checked for existence, emptiness and format here; its contents are read only
    when :meth:`Trace.events` is iterated, in bounded memory.

    Args:
        path: The trace file.
        engine: JSON engine for kineto traces, one of :data:`ENGINES`.
        process: Nsight Systems exports: read only the events of this process id (see
            :func:`gpu_processes`).

    Returns:
        The opened :class:`Trace`.

    Raises:
        ReportInputError: Missing, unreadable, empty, or recognisably not a trace.
        ConfigError: An unknown engine.
        gpuprobe.errors.MissingDependencyError: The ``msgspec`` engine without msgspec installed.

    Example:
        >>> trace = load("tests/data/kineto_min.json")  # doctest: +SKIP
        >>> trace.format  # doctest: +SKIP
        'kineto-json'
    """
    path = os.fspath(path)
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    head = read_input(path, 16)
    if head.startswith(_SQLITE_MAGIC):
        return Trace(path, "nsys-sqlite", process=process)
    if process is not None:
        raise ConfigError(f"process={process} applies to Nsight Systems exports only, not to {path}")
    if head.startswith(_GZIP_MAGIC):
        return Trace(path, "kineto-gzip", engine)
    if ncu_format(path):
        raise ReportInputError(path, "an Nsight Compute export, not a timeline: pass it alone to 'gpuprobe report', "
                                     "or beside a trace with --ncu")
    if path.endswith((".nsys-rep", ".qdrep")):
        raise ReportInputError(path, "an Nsight Systems report: export it first with 'nsys export --type sqlite'")
    return Trace(path, "kineto-json", engine)


def ncu_format(path: str | os.PathLike[str]) -> str | None:
    """``ncu-rep`` or ``ncu-csv`` for an Nsight Compute export (sniffed from its content), else None.

    A CSV export may open with the program's output and ncu's ``==PROF==`` lines: the first MiB is
    searched for ncu's lines or the header of its table.
    """
    if not regular_file(path):
        return None  # never opened: a named pipe would wait for a writer (reported when the file is read)
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            json_start = head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith((b"{", b"["))
            if head.startswith((_GZIP_MAGIC, _SQLITE_MAGIC)) or json_start:
                return None  # a trace: the rest of the first MiB is not read
            return sniff_ncu(head + f.read(SNIFF_BYTES - len(head)))
    except OSError:
        return None  # reported when the file is read


def gpu_processes(path: str | os.PathLike[str]) -> list[int]:
    """The ids of the processes that ran kernels, for an Nsight Systems export (sorted); [] otherwise.

    One export of ``nsys profile torchrun ...`` holds every rank's process: each is a rank.
    """
    path = os.fspath(path)
    if not regular_file(path):
        return []  # reported when the trace is read
    try:
        with open(path, "rb") as f:
            if not f.read(16).startswith(_SQLITE_MAGIC):
                return []
        with contextlib.closing(open_export(path)) as con:
            return kernel_processes(con)
    except (OSError, sqlite3.Error, NsysFormatError):
        return []  # reported when the trace is read
