"""JSON-lines exporter: every aggregated observation as one line, for offline reports.

A line: ``{"ts": <unix ns when collected>, "metric": "<otel name>", "unit": "s", "attrs": {...},
"value": <float in unit>}``. Lines are queued (bounded; overflow is counted in
``gpuprobe.telemetry.dropped``) and written by a thread of the exporter's own, so a slow disk never
delays the program; each line is written whole, and :meth:`JsonlExporter.close` (run at exit) writes
what is left and fsyncs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from typing import Any, TextIO

from .._metrics import SPECS
from ..collector import Runtime, runtime
from ..errors import ConfigError

__all__ = ["JsonlExporter"]


class JsonlExporter:
    """Write observations to ``path`` (appending).

    Args:
        path: the file; its folder must exist.
        max_queue: observations held before overflow is dropped and counted.
        flush_interval: seconds between writes.

    Raises:
        ConfigError: the file cannot be opened for appending; the message names it.

    Example:
        >>> exp = JsonlExporter("/tmp/gpuprobe.jsonl").attach()
        >>> exp.close()
    """

    def __init__(self, path: str | os.PathLike[str], *, max_queue: int = 200_000, flush_interval: float = 0.5) -> None:
        self.path = os.fspath(path)
        try:
            self._file: TextIO = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"gpuprobe cannot write the JSONL file {self.path!r} (jsonl / GPUPROBE_JSONL): "
                              f"{exc.strerror or exc}") from None
        self._queue: deque[tuple[int, str, Any, float]] = deque()
        self._max = max_queue
        self._overflow = 0
        self._interval = flush_interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rt: Runtime | None = None
        self._thread: threading.Thread | None = None
        self.written = 0

    def attach(self, rt: Runtime | None = None) -> JsonlExporter:
        """Start receiving observations from ``rt`` (the process's runtime by default)."""
        self._rt = rt or runtime()
        self._rt.registry.sinks.append(self._sink)
        self._rt.add_exporter(self)
        self._thread = threading.Thread(target=self._run, name="gpuprobe-jsonl", daemon=True)
        self._thread.start()
        return self

    def _sink(self, name: str, labels: Any, value: float) -> None:
        if len(self._queue) >= self._max:
            self._overflow += 1
            return
        self._queue.append((time.time_ns(), name, labels, value))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.write()

    def write(self) -> int:
        """Write the queued lines now; returns how many."""
        with self._lock:
            rt = self._rt
            const = rt.registry.const_labels if rt is not None else {}
            q = self._queue
            lines = []
            for _ in range(len(q)):
                ts, name, labels, value = q.popleft()
                attrs = dict(const)
                attrs.update(labels)
                lines.append(json.dumps({"ts": ts, "metric": name, "unit": SPECS[name].unit, "attrs": attrs,
                                         "value": value}, separators=(",", ":")))
            if lines:
                try:
                    self._file.write("\n".join(lines) + "\n")
                    self._file.flush()
                except (OSError, ValueError) as exc:
                    if rt is not None:
                        rt.drop("jsonl_write_failed", len(lines))
                        rt.warn_once("jsonl", f"gpuprobe: writing {self.path} failed: {exc!r}")
                    return 0
                self.written += len(lines)
            if self._overflow and rt is not None:
                n, self._overflow = self._overflow, 0
                rt.drop("jsonl_queue_full", n)
            return len(lines)

    def tick(self) -> None:
        """Writes run on the exporter's own thread."""

    def close(self) -> None:
        """Write what is left, fsync and close the file (once; later calls do nothing)."""
        if self._file.closed:
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2)
        rt = self._rt
        if rt is not None:
            rt.drain()
            if self._sink in rt.registry.sinks:
                rt.registry.sinks.remove(self._sink)
        self.write()
        try:
            os.fsync(self._file.fileno())
        except (OSError, ValueError):
            pass
        self._file.close()
