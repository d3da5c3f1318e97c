"""The one error a report raises for input it cannot read."""

from __future__ import annotations

import os
import stat

from gpuprobe.errors import GpuprobeError

__all__ = ["ReportInputError", "read_input", "check_file", "regular_file"]


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


_KINDS = (
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_file(path: str, what: str = "a trace file") -> None:
    """Nothing if ``path`` is a regular file; else the error naming what it is.

    Checked before the file is opened: opening a named pipe waits for a writer (forever, if none
    comes), and a pipe's bytes cannot be read twice (the format is sniffed from the first ones).

    Example:
        >>> check_file("/")
        Traceback (most recent call last):
        ...
        gpuprobe.report._errors.ReportInputError: /: is a directory, not a trace file
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ReportInputError(path, "no such file") from None
    except PermissionError:
        raise ReportInputError(path, "permission denied") from None
    except (OSError, ValueError) as exc:  # a name too long, a NUL in it
        raise ReportInputError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise ReportInputError(path, f"is a directory, not {what}")
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise ReportInputError(
        path, f"{kind}, not a file: {what} is read from a file (its format is sniffed first, then it is read); "
        "save it to a file and pass that"
    )


def regular_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (following links), without opening it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_input(path: str, size: int = -1, what: str = "a trace file") -> bytes:
    """The first ``size`` bytes of an input file (all with -1), not empty; else the error naming the problem.

    Example:
        >>> read_input("no/such/file")
        Traceback (most recent call last):
        ...
        gpuprobe.report._errors.ReportInputError: no/such/file: no such file
    """
    check_file(path, what)
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
