"""Open a trace file of any timeline format and stream its events.

``load(path)`` sniffs the format from the first bytes (:data:`FORMATS`: SQLite, gzip, else JSON
text), checks what can be checked cheaply, and returns that format's :class:`Trace`, whose
:meth:`Trace.events` streams :class:`~gpuprobe.report.Event` objects. Every problem with the input
surfaces as one :class:`~gpuprobe.report.ReportInputError` naming the file and the problem.

A format is a module with a :class:`Trace` subclass and one line of :data:`FORMATS`
(:mod:`gpuprobe.report._trace` says what a reader implements).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
from collections.abc import Callable

from gpuprobe.errors import ConfigError
from gpuprobe.report._errors import ReportInputError, read_input, regular_file
from gpuprobe.report._events import TraceInfo
from gpuprobe.report._kineto import ENGINES, KinetoTrace
from gpuprobe.report._ncu import SNIFF_BYTES, sniff as sniff_ncu
from gpuprobe.report._nsys import NsysFormatError, NsysTrace, kernel_processes, open_export
from gpuprobe.report._trace import Progress, Trace

__all__ = ["Trace", "TraceInfo", "load", "ncu_format", "ENGINES", "FORMATS", "Format", "Progress"]

_GZIP_MAGIC = b"\x1f\x8b"
_SQLITE_MAGIC = b"SQLite format 3\x00"
_HEAD = 16  # bytes read to tell the formats apart


@dataclasses.dataclass(frozen=True)
class Format:
    """A timeline format: its name, whether a file's first bytes are its, and how to open one.

    ``open(path, name, engine, process)`` returns the reader; it raises ``ConfigError`` for an option
    the format does not take.
    """

    name: str
    begins: Callable[[bytes], bool]
    open: Callable[[str, str, str, "int | None"], Trace]


def _kineto(path: str, name: str, engine: str, process: int | None) -> Trace:
    if process is not None:
        raise ConfigError(f"process={process} applies to Nsight Systems exports only, not to {path}")
    return KinetoTrace(path, name, engine)


def _nsys(path: str, name: str, engine: str, process: int | None) -> Trace:
    return NsysTrace(path, name, process)


def _json_trace(path: str, name: str, engine: str, process: int | None) -> Trace:
    if process is not None:
        return _kineto(path, name, engine, process)
    if ncu_format(path):
        raise ReportInputError(path, "an Nsight Compute export, not a timeline: pass it alone to 'gpuprobe report', "
                                     "or beside a trace with --ncu")
    if path.endswith((".nsys-rep", ".qdrep")):
        raise ReportInputError(path, "an Nsight Systems report: export it first with 'nsys export --type sqlite'")
    return KinetoTrace(path, name, engine)


#: The timeline formats, tried in this order on a file's first bytes; the last takes any text.
FORMATS: tuple[Format, ...] = (
    Format("nsys-sqlite", lambda head: head.startswith(_SQLITE_MAGIC), _nsys),
    Format("kineto-gzip", lambda head: head.startswith(_GZIP_MAGIC), _kineto),
    Format("kineto-json", lambda head: True, _json_trace),
)


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
    head = read_input(path, _HEAD)
    fmt = next(f for f in FORMATS if f.begins(head))
    return fmt.open(path, fmt.name, engine, process)


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
