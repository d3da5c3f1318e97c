"""What every trace format's reader is: a :class:`Trace` that streams :class:`Event` objects.

A timeline format is one module holding a subclass of :class:`Trace` (``_kineto.KinetoTrace``,
``_nsys.NsysTrace``) and one line of :data:`gpuprobe.report.loaders.FORMATS` saying how its files
begin. The report never asks which format it reads: it hands its pass to :meth:`Trace.feed`, which a
reader may override with a faster path to the same events (kineto reads raw elements, and a large
file in two processes).
Nsight Compute exports are measurements per kernel, not a timeline: ``_ncu`` reads them into rows
of their own, and :func:`gpuprobe.report.loaders.load` points them to ``--ncu``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from gpuprobe.report._errors import ReportInputError
from gpuprobe.report._events import Event, TraceInfo

__all__ = ["Trace", "Progress"]

#: Called now and then with ``(done, total)``: bytes of the file (rows for a database).
Progress = Callable[[int, int], None]


class Trace:
    """A trace file, opened lazily; iterate :meth:`events` once or more.

    Attributes:
        path: The file.
        format: Which of :data:`gpuprobe.report.loaders.FORMATS` it is (``"kineto-json"``, ...).
        info: What the trace says about itself; complete once :meth:`events` has run out.
        size: The file's size in bytes.

    Example:
        >>> from gpuprobe.report import load
        >>> trace = load("tests/data/kineto_min.json")  # doctest: +SKIP
        >>> sum(1 for e in trace.events() if e.kind == "kernel")  # doctest: +SKIP
        2
    """

    #: ``TraceInfo.source`` of this format's traces.
    source: ClassVar[str] = ""

    def __init__(self, path: str, fmt: str) -> None:
        self.path = path
        self.format = fmt
        self.info = TraceInfo(self.source)
        self.size = os.path.getsize(path)

    def events(self, progress: Progress | None = None) -> Iterator[Event]:
        """Stream the events of the trace.

        Args:
            progress: Called now and then with ``(done, total)``.

        Yields:
            Events in file order (not time order).

        Raises:
            ReportInputError: The file turns out truncated, invalid or not a trace.
        """
        raise NotImplementedError

    def feed(self, scan: Any, progress: Progress | None = None, processes: int = 1) -> None:
        """Pass every event to ``scan`` (a :class:`gpuprobe.report._scan.TraceScan`); :attr:`info` is
        complete afterwards. Readers with a faster path to the same events override it (they may hand the
        scan an event's fields as a tuple, :data:`~gpuprobe.report._events.EventFields`), and may read a
        large file with up to ``processes`` processes at once."""
        scan.consume(self.events(progress))

    def _fail(self, problem: str) -> ReportInputError:
        return ReportInputError(self.path, problem)
