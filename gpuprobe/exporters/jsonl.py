"""JSON-lines exporter: every aggregated observation as one line, for offline reports.

A line: ``{"ts": <unix ns when aggregated>, "metric": "<otel name>", "unit": "s", "attrs": {...},
"value": <float in unit>}``. Observations are queued (bounded; overflow is counted in
``gpuprobe.telemetry.dropped``) and written on the background thread, so a slow disk never delays
the program; each line is written whole, and :meth:`JsonlExporter.close` (run at exit) writes what
is left and fsyncs.
"""

from __future__ import annotations

import json
import os
from typing import TextIO

from .._metrics import SPECS
from ..errors import ConfigError
from ..runtime import Runtime
from ._queued import Observation, QueuedSink

__all__ = ["JsonlExporter"]


class JsonlExporter(QueuedSink):
    """Write observations to ``path`` (appending).

    Args:
        path: the file; its folder must exist.
        max_queue: observations held before overflow is dropped and counted.

    Raises:
        ConfigError: the file cannot be opened for appending; the message names it.

    Example:
        >>> exp = JsonlExporter("/tmp/gpuprobe.jsonl").attach()
        >>> exp.close()
    """

    name = "jsonl"

    def __init__(self, path: str | os.PathLike[str], *, max_queue: int = 200_000) -> None:
        super().__init__(max_queue=max_queue)
        self.path = os.fspath(path)
        try:
            self._file: TextIO = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"gpuprobe cannot write the JSONL file {self.path!r} (jsonl / GPUPROBE_JSONL): "
                              f"{exc.strerror or exc}") from None
        self.written = 0

    def write_batch(self, batch: list[Observation], rt: Runtime | None) -> None:
        const = rt.registry.const_labels if rt is not None else {}
        lines = []
        for ts, name, labels, value in batch:
            attrs = dict(const)
            attrs.update(labels)
            lines.append(json.dumps({"ts": ts, "metric": name, "unit": SPECS[name].unit, "attrs": attrs,
                                     "value": value}, separators=(",", ":")))
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()
        self.written += len(lines)

    def close(self) -> None:
        """Write what is left, fsync and close the file (once; later calls do nothing)."""
        if self._file.closed:
            return
        super().close()
        try:
            os.fsync(self._file.fileno())
        except (OSError, ValueError):
            pass
        self._file.close()

    def __repr__(self) -> str:
        return f"<gpuprobe JSONL exporter {self.path}>"
