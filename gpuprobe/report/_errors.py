"""The one error a report raises for input it cannot read."""

from __future__ import annotations

import os

from gpuprobe.errors import GpuprobeError

__all__ = ["ReportInputError"]


class ReportInputError(GpuprobeError, ValueError):
    """A trace file cannot be read: missing, empty, truncated, not JSON, not a trace, ...

    The message is one line that names the file and the problem.

    Attributes:
        path: The file.
        problem: What is wrong with it.

    Example:
        >>> str(ReportInputError("t.json", "empty file"))
        't.json: empty file'
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = " ".join(str(problem).split())  # one line, whatever the cause said
        super().__init__(f"{self.path}: {self.problem}")
