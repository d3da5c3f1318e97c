"""The shared base of the exporters that receive each observation: a bounded queue, written in batches.

A sink (see :meth:`gpuprobe.runtime.Runtime.add_sink`) is called with every value as it is
aggregated; it only appends to a bounded queue (overflow is counted and reported as
``gpuprobe.telemetry.dropped{reason="<name>_queue_full"}``). :meth:`QueuedSink.tick`, on the runtime's
background thread, hands what was queued to :meth:`QueuedSink.write_batch` — a file, a
MeterProvider — so a slow consumer never delays the program's own threads.
"""

from __future__ import annotations

import threading
from collections import deque
from time import time_ns
from typing import Any

from ..runtime import Runtime, runtime
from .._lifecycle import Owner

__all__ = ["QueuedSink", "Observation", "PartlyWritten"]

Observation = tuple[int, str, Any, float]  # (unix ns when aggregated, metric, labels, value in unit)


class PartlyWritten(Exception):
    """Raised by :meth:`QueuedSink.write_batch` when only the first ``written`` observations were delivered.

    The rest of the batch is counted as dropped (``<name>_write_failed``); ``cause`` says why.
    """

    def __init__(self, written: int, cause: BaseException) -> None:
        super().__init__(written, cause)
        self.written = written
        self.cause = cause


class QueuedSink:
    """Receives every aggregated observation into a bounded queue and writes it in batches.

    Subclasses implement :meth:`write_batch` and may extend :meth:`close`.

    Args:
        name: used in drop reasons (``<name>_queue_full``) and warnings.
        max_queue: observations held before new ones are dropped and counted.
    """

    name = "sink"

    def __init__(self, *, max_queue: int) -> None:
        self._queue: deque[Observation] = deque()
        self._max = max_queue
        self._overflow = 0
        self._overflow_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._rt: Runtime | None = None
        self._closed = False

    def attach(self, rt: Runtime | None = None, *, owner: Owner = "user") -> QueuedSink:
        """Start receiving observations from ``rt`` (the process's runtime by default)."""
        self._rt = rt or runtime()
        self._rt.add_sink(self._receive)
        self._rt.add_exporter(self, owner=owner)
        return self

    def _receive(self, metric: str, labels: Any, value: float) -> None:
        if len(self._queue) >= self._max:
            with self._overflow_lock:  # rare: the queue is full
                self._overflow += 1
            return
        self._queue.append((time_ns(), metric, labels, value))

    def tick(self) -> None:
        """Write what was queued since the last tick (on the background thread)."""
        self.flush()

    def flush(self) -> int:
        """Write the queued observations now; returns how many :meth:`write_batch` delivered."""
        with self._write_lock:
            q = self._queue
            batch = [q.popleft() for _ in range(len(q))]
            with self._overflow_lock:
                overflow, self._overflow = self._overflow, 0
            rt = self._rt
            if overflow and rt is not None:
                rt.drop(f"{self.name}_queue_full", overflow)
            if not batch:
                return 0
            try:
                self.write_batch(batch, rt)
            except Exception as exc:
                written, cause = (exc.written, exc.cause) if isinstance(exc, PartlyWritten) else (0, exc)
                if rt is not None:
                    rt.drop(f"{self.name}_write_failed", len(batch) - written)
                    rt.warn_once(f"{self.name}:write", f"gpuprobe: {self!r} failed: {cause!r}; "
                                 f"{len(batch) - written} observations were dropped and counted in "
                                 f"gpuprobe.telemetry.dropped{{reason=\"{self.name}_write_failed\"}} "
                                 "(this warning is shown once)")
                return written
            return len(batch)

    def write_batch(self, batch: list[Observation], rt: Runtime | None) -> None:
        """Deliver ``batch``; raise to have it counted as dropped (:class:`PartlyWritten`: only its tail)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop receiving, write what is left (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        rt = self._rt
        if rt is not None:
            rt.drain()
            rt.remove_sink(self._receive)
        self.flush()
