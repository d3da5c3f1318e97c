"""Atomic file writes: the one helper every writer in gpuprobe uses (snapshots, traces, reports,
dashboards). A reader never sees half a file, and a failed write leaves the old file in place.

A leaf module: standard library only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "write_file_atomic"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None], suffix: str = ".tmp",
                 *, make_parents: bool = True) -> Path:
    """Call ``write(tmp)`` then rename ``tmp`` onto ``path``; the temporary is removed on failure.

    Args:
        path: the final file.
        write: writes the whole content to the temporary path it is given.
        suffix: the temporary file's ending (some writers choose a format from it, e.g. ``.json.gz``).
        make_parents: create missing folders (otherwise a missing folder raises ``FileNotFoundError``).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "a.txt")
        >>> _ = atomic_write(p, lambda tmp: open(tmp, "w").write("ok"))
        >>> open(p).read()
        'ok'
    """
    target = Path(path)
    if make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes the file 0600; give it the mode a plain open() would (or the old file's).
        try:
            mode = os.stat(target).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


_UMASK: int | None = None


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``/proc/self/status``)."""
    global _UMASK
    if _UMASK is None:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                line = next(line for line in f if line.startswith("Umask:"))
            _UMASK = int(line.split()[1], 8)
        except (OSError, StopIteration, ValueError):
            old = os.umask(0o022)  # elsewhere: read it by setting it (and set it straight back)
            os.umask(old)
            _UMASK = old
    return _UMASK


def write_file_atomic(path: str | os.PathLike[str], data: str | bytes, *, make_parents: bool = False) -> Path:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` atomically.

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "r.txt")
        >>> _ = write_file_atomic(p, "ok"); open(p).read()
        'ok'
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data

    def _write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(payload)

    return atomic_write(path, _write, make_parents=make_parents)
