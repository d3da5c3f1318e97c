"""JSON-lines exporter: every aggregated observation as one line, for offline reports.

A line: ``{"ts": <unix ns when aggregated>, "metric": "<otel name>", "unit": "s", "attrs": {...},
"value": <float in unit>}``. Observations are queued (bounded; overflow is counted in
``gpuprobe.telemetry.dropped``) and written on the background thread, so a slow disk never delays
the program. Every line in the file is whole: a write the disk cannot take in full (disk full, file
size limit) is cut back to its last whole line, and the observations it could not keep are counted
as ``gpuprobe.telemetry.dropped{reason="jsonl_write_failed"}`` with one warning; the next batch tries
again. :meth:`JsonlExporter.close` (run at exit) writes what is left and fsyncs.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

from .._metrics import SPECS
from ..config import SETTINGS
from ..errors import ConfigError
from ..runtime import Runtime
from ._queued import Observation, PartlyWritten, QueuedSink

__all__ = ["JsonlExporter", "jsonl_path"]

# Lines are handed to the kernel in writes of about this many bytes, each a run of whole lines, so a
# batch of 200,000 observations is never one 40 MB bytes object plus its copy.
_CHUNK = 1 << 20


def jsonl_path(value: Any, what: str = "jsonl") -> str:
    """``value`` as a JSONL file path (a ``str`` or ``os.PathLike[str]``, not empty), read as the ``jsonl``
    setting reads it.

    Args:
        value: what was given for the file.
        what: the setting's name, for the error message.

    Raises:
        ConfigError: ``value`` is not a path; the message names ``what``, the value and what is expected.

    Example:
        >>> from pathlib import Path
        >>> jsonl_path(Path("/tmp") / "run.jsonl")
        '/tmp/run.jsonl'
    """
    return str(SETTINGS["jsonl"].parse(what, value))


class JsonlExporter(QueuedSink):
    """Write observations to ``path`` (appending), whole lines only.

    Args:
        path: the file (``str`` or ``os.PathLike[str]``); its folder must exist.
        max_queue: observations held before overflow is dropped and counted.

    Raises:
        ConfigError: ``path`` is not a path, or the file cannot be opened for appending; the message
            names it.

    Example:
        >>> exp = JsonlExporter("/tmp/gpuprobe.jsonl").attach()
        >>> exp.close()
    """

    name = "jsonl"

    def __init__(self, path: str | os.PathLike[str], *, max_queue: int = 200_000) -> None:
        super().__init__(max_queue=max_queue)
        self.path = jsonl_path(path)
        try:
            # A raw descriptor, not a buffered file: a failed write must leave no bytes of ours
            # in a buffer to be written later, after the cut (see _append).
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise ConfigError(f"gpuprobe cannot write the JSONL file {self.path!r} (jsonl / GPUPROBE_JSONL): "
                              f"{exc.strerror or exc}") from None
        self._fd_closed = False
        self.written = 0

    def write_batch(self, batch: list[Observation], rt: Runtime | None) -> None:
        const = rt.registry.const_labels if rt is not None else {}
        parts = []
        for ts, name, labels, value in batch:
            attrs = dict(const)
            attrs.update(labels)
            parts.append(json.dumps({"ts": ts, "metric": name, "unit": SPECS[name].unit, "attrs": attrs,
                                     "value": value}, separators=(",", ":")))
            parts.append("\n")
        data = "".join(parts).encode("utf-8")
        kept, error = self._append(data)
        lines = data.count(b"\n", 0, kept)
        self.written += lines
        if error is not None:
            raise PartlyWritten(lines, error)

    def _append(self, data: bytes) -> tuple[int, OSError | None]:
        """Append ``data`` (whole lines); returns the bytes kept, all whole lines, and the error if any.

        When the file system takes only part of it (disk full, ``RLIMIT_FSIZE``, quota), the partial
        line at the end of what was written is cut off again, so the file ends with a whole line.
        """
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                end = len(data) if len(data) - done <= _CHUNK else data.rfind(b"\n", done, done + _CHUNK) + 1
                if end <= done:  # one line longer than a chunk: written whole
                    end = data.index(b"\n", done) + 1
                n = os.write(self._fd, view[done:end])
                if n == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += n
        except OSError as exc:
            keep = data.rfind(b"\n", 0, done) + 1
            if keep < done:
                # O_APPEND leaves the offset at the end of our last write: the partial line is the
                # (done - keep) bytes before it.
                end_of_ours = os.lseek(self._fd, 0, os.SEEK_CUR)
                try:
                    os.ftruncate(self._fd, end_of_ours - (done - keep))
                except OSError:
                    pass  # pragma: no cover - shrinking a file the process can write does not fail
            return keep, exc
        return done, None

    def close(self) -> None:
        """Write what is left, fsync and close the file (once; later calls do nothing)."""
        if self._fd_closed:
            return
        super().close()
        self._fd_closed = True
        try:
            os.fsync(self._fd)
        except OSError:
            pass
        os.close(self._fd)

    def __repr__(self) -> str:
        return f"<gpuprobe JSONL exporter {self.path}>"
