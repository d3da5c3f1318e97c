"""The one error a report raises for input it cannot read."""

from __future__ import annotations

import os

from gpuprobe.errors import GpuprobeError

__all__ = ["ReportInputError", "read_input"]


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


def read_input(path: str, size: int = -1, what: str = "a trace file") -> bytes:
    """The first ``size`` bytes of an input file (all with -1), not empty; else the error naming the problem.

    Example:
        >>> read_input("no/such/file")
        Traceback (most recent call last):
        ...
        gpuprobe.report._errors.ReportInputError: no/such/file: no such file
    """
    try:
        with open(path, "rb") as f:
            data = f.read(size)
    except FileNotFoundError:
        raise ReportInputError(path, "no such file") from None
    except IsADirectoryError:
        raise ReportInputError(path, f"is a directory, not {what}") from None
    except PermissionError:
        raise ReportInputError(path, "permission denied") from None
    except OSError as exc:
        raise ReportInputError(path, f"cannot read: {exc.strerror or exc}") from None
    if not data:
        raise ReportInputError(path, "empty file")
    return data
