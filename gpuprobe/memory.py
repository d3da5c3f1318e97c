"""Memory readings (no device sync) and CUDA memory snapshots written atomically.

Readings: on CUDA, ``torch.cuda.memory_allocated / memory_reserved / max_memory_allocated`` (these
read allocator counters and never synchronize); on CPU, the process's resident set size.

Snapshots: :func:`record_history` starts the allocator's history, :func:`snapshot` dumps it (the
pickle that https://pytorch.org/memory_viz reads). Files are written to a temporary name in the same
folder and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from .errors import GpuprobeError

__all__ = ["read", "snapshot", "record_history", "device_name", "atomic_write"]

Reading = tuple[int, int | None, int]  # allocated, reserved (None on CPU), peak


def _cuda() -> object | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def device_name() -> str:
    """``cuda:N`` (the current device) when torch with CUDA is loaded, else ``cpu``."""
    torch = _cuda()
    if torch is None:
        return "cpu"
    return f"cuda:{torch.cuda.current_device()}"  # type: ignore[attr-defined]


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return _peak_rss()


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _cpu_reading() -> Reading:
    rss = _rss()
    # ru_maxrss is updated by the kernel lazily; the current RSS can be ahead of it by a few pages.
    return rss, None, max(rss, _peak_rss())


def pick_reader() -> Callable[[], Reading]:
    """Choose the memory reader once: CUDA allocator counters, or RSS on CPU."""
    torch = _cuda()
    if torch is None:
        return _cpu_reading
    cuda = torch.cuda  # type: ignore[attr-defined]
    alloc, reserved, peak = cuda.memory_allocated, cuda.memory_reserved, cuda.max_memory_allocated
    return lambda: (alloc(), reserved(), peak())


def read() -> Reading:
    """One reading: ``(allocated, reserved, peak)`` bytes; ``reserved`` is None on CPU.

    Example:
        >>> allocated, reserved, peak = read()
        >>> allocated > 0
        True
    """
    return pick_reader()()


def _require_cuda(what: str) -> object:
    torch = _cuda()
    if torch is None:
        raise GpuprobeError(
            f"{what} needs PyTorch with a CUDA device; this process has "
            + ("no torch imported" if "torch" not in sys.modules else "no CUDA device")
        )
    return torch


def record_history(enabled: bool = True, max_entries: int = 100_000) -> None:
    """Start (or stop) recording allocator history for :func:`snapshot`.

    Raises:
        GpuprobeError: no CUDA device (a clear message, not a crash).
    """
    torch = _require_cuda("memory.record_history()")
    torch.cuda.memory._record_memory_history(  # type: ignore[attr-defined]
        "all" if enabled else None, max_entries=max_entries
    )


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None], suffix: str = ".tmp",
                 *, make_parents: bool = True) -> Path:
    """Call ``write(tmp)`` then rename ``tmp`` onto ``path``; the temporary is removed on failure.

    Args:
        path: the final file.
        write: writes the whole content to the temporary path it is given.
        suffix: the temporary file's ending (some writers choose a format from it, e.g. ``.json.gz``).
        make_parents: create missing folders (otherwise a missing folder raises ``FileNotFoundError``).
    """
    target = Path(path)
    if make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def snapshot(path: str | os.PathLike[str]) -> Path:
    """Dump the CUDA allocator's memory snapshot to ``path`` atomically.

    Call :func:`record_history` first for allocation stacks; without it the snapshot still holds the
    segments. Open the file at https://pytorch.org/memory_viz.

    Raises:
        GpuprobeError: no CUDA device.

    Example:
        >>> snapshot("oom.pickle")  # doctest: +SKIP
    """
    torch = _require_cuda("memory.snapshot()")
    return atomic_write(path, torch.cuda.memory._dump_snapshot)  # type: ignore[attr-defined]


_warned: set[str] = set()


def triggered_snapshot(directory: str, reason: str) -> Path | None:
    """A snapshot taken by a trigger (a step index or an out-of-memory error): warns, never raises."""
    name = Path(directory) / f"gpuprobe-memory-{reason}-{os.getpid()}.pickle"
    try:
        return snapshot(name)
    except Exception as exc:
        if reason not in _warned:
            _warned.add(reason)
            warnings.warn(f"gpuprobe: memory snapshot ({reason}) not written: {exc}", RuntimeWarning, stacklevel=3)
        return None
