"""Memory readings (no device sync) and CUDA memory snapshots written atomically.

Readings: on CUDA, one read of the caching allocator's counters per reading
(``torch.cuda.memory_stats_as_nested_dict(device)``: allocated, reserved and peak bytes of that
device); on CPU, the process's resident set size. Nothing here initializes CUDA: before the program
has, there is no CUDA memory to read.

Snapshots: :func:`record_history` starts the allocator's history, :func:`snapshot` dumps it (the
pickle that https://pytorch.org/memory_viz reads). Files are written to a temporary name in the same
folder and renamed, so a reader never sees half a file. :class:`SnapshotTriggers` takes them at a
step or at every out-of-memory error (``snapshot_at_step`` / ``snapshot_on_oom``).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ._cuda import torch_with_cuda
from ._files import atomic_write
from ._torch_caps import memory_history_recorder, memory_snapshot_dumper, oom_observer_attacher
from .errors import GpuprobeError

__all__ = ["MemoryReading", "read", "process_reading", "snapshot", "record_history", "SnapshotTriggers"]


class MemoryReading(NamedTuple):
    """One reading of one device, in bytes; ``reserved`` is None on CPU."""

    device: str
    allocated: int
    reserved: int | None
    peak: int


MemoryReader = Callable[["int | None"], "MemoryReading | None"]


_cuda = torch_with_cuda


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


def process_reading(device: int | None = None) -> MemoryReading:
    """The process's resident set size (``device`` is ignored): the reading without CUDA."""
    rss = _rss()
    # ru_maxrss is updated by the kernel lazily; the current RSS can be ahead of it by a few pages.
    return MemoryReading("cpu", rss, None, max(rss, _peak_rss()))


def _cuda_reader(cuda: Any, peak_reset: bool) -> MemoryReader:
    is_initialized = cuda.is_initialized
    current_device = cuda.current_device
    nested = cuda.memory_stats_as_nested_dict
    reset_peak = cuda.reset_peak_memory_stats
    names: dict[int, str] = {}

    def read(device: int | None = None) -> MemoryReading | None:
        if not is_initialized():
            return None  # the program has not used CUDA yet: nothing to read, and no init from here
        if device is None:
            device = current_device()
        # Why the nested dict: memory_allocated/reserved/max_memory_allocated each build, flatten and
        # sort the allocator's ~120 statistics; one nested read gives all three.
        stats = nested(device)
        allocated = stats.get("allocated_bytes", {}).get("all", {})
        reserved = stats.get("reserved_bytes", {}).get("all", {})
        if not allocated:
            return None
        if peak_reset:
            reset_peak(device)
        name = names.get(device)
        if name is None:
            name = names.setdefault(device, f"cuda:{device}")
        return MemoryReading(name, int(allocated.get("current", 0)), int(reserved.get("current", 0)),
                             int(allocated.get("peak", 0)))

    return read


def pick_reader(peak_reset: bool = False) -> MemoryReader:
    """Choose the memory reader once: the CUDA allocator's counters per device, or RSS on CPU."""
    torch = _cuda()
    if torch is None:
        return process_reading
    return _cuda_reader(torch.cuda, peak_reset)


def read(device: int | None = None) -> MemoryReading | None:
    """One reading: allocated, reserved and peak bytes of ``device`` (default: the current device),
    or of the process (RSS) without CUDA; None when CUDA is there but not initialized yet.

    Example:
        >>> reading = read()
        >>> reading.allocated > 0
        True
    """
    return pick_reader()(device)


def _require_cuda(what: str) -> Any:
    torch = _cuda()
    if torch is None:
        raise GpuprobeError(
            f"{what} needs PyTorch with a CUDA device; this process has "
            + ("no torch imported" if "torch" not in sys.modules else "no CUDA device")
        )
    return torch


def record_history(enabled: bool = True, max_entries: int = 100_000, stacks: str = "python") -> None:
    """Start (or stop) recording allocator history for :func:`snapshot`.

    Args:
        enabled: start (True) or stop (False).
        max_entries: the allocator keeps the last this many allocations and frees.
        stacks: ``"python"`` (Python frames: about 2 µs per allocation) or ``"all"`` (C++ frames too:
            slower), as ``torch.cuda.memory._record_memory_history`` takes them.

    Raises:
        GpuprobeError: no CUDA device (a clear message, not a crash).
    """
    torch = _require_cuda("memory.record_history()")
    record = memory_history_recorder(torch)
    if enabled:
        record("all", context="all", stacks=stacks, max_entries=max_entries)
    else:
        record(None)


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
    return atomic_write(path, memory_snapshot_dumper(torch))


class SnapshotTriggers:
    """Snapshots taken by triggers: at step ``at_step``, and at every out-of-memory error.

    - Allocation history (with ``stacks``) starts as soon as the program has initialized CUDA — checked
      when the triggers are made and at every step — never earlier, so nothing here initializes CUDA.
    - Out-of-memory errors are seen where the allocator raises them (its out-of-memory observer, when
      torch has it), so an OOM caught by the program, or raised inside an instrumented ``generate()``
      with no probe around it, is dumped too. Where torch has no observer, OOM errors passing through a
      probe or an instrumented ``generate()`` are dumped. Either way, one exception gives one dump,
      however many probes it passes through.
    - Failures warn once (``warn``) and never raise into the program.

    Args:
        directory: where the files go (``gpuprobe-memory-<reason>-<pid>.pickle``).
        at_step: the step index to dump at, or None.
        on_oom: dump at out-of-memory errors.
        stacks: ``python``, ``all`` or ``none`` (no history).
        warn: ``(key, message)``, the runtime's warn-once.
    """

    def __init__(self, directory: str, *, at_step: int | None, on_oom: bool, stacks: str,
                 warn: Callable[[str, str], None]) -> None:
        self.directory = directory
        self.at_step = at_step
        self.on_oom = on_oom
        self.stacks = stacks
        self._warn = warn
        self._lock = threading.Lock()
        self._history = stacks == "none"  # True once started (or not wanted)
        self._has_observer = False
        self.dumps: list[Path] = []
        self.active = True
        self.start_history()
        if on_oom:
            self._attach_observer()

    def start_history(self) -> None:
        """Start allocation history if the program has initialized CUDA (once)."""
        if self._history:
            return
        torch = _cuda()
        if torch is None or not torch.cuda.is_initialized():
            return
        with self._lock:
            if self._history:
                return
            self._history = True
        try:
            record_history(True, stacks=self.stacks)
        except Exception as exc:
            self._warn("snapshot:history", f"gpuprobe: allocation history not started: {exc}")

    def _attach_observer(self) -> None:
        torch = _cuda()
        attach = oom_observer_attacher(torch)
        if attach is None:
            return
        # Observers cannot be detached: the callback checks that these triggers are still in force.
        attach(self._on_allocator_oom)
        self._has_observer = True

    def _on_allocator_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        if self.active and self.on_oom:
            self.dump("oom")

    def step(self, index: int) -> None:
        """Step hook: start history once CUDA is up, dump at ``at_step``."""
        self.start_history()
        if index == self.at_step:
            self.dump(f"step{index}")

    def observe_exception(self, exc: BaseException) -> None:
        """An exception passed through a probe or an instrumented call: dump if it is an unseen OOM.

        With the allocator's observer attached every OOM is dumped there already, so this does nothing.
        """
        if self._has_observer or not self.active or not self.on_oom or type(exc).__name__ != "OutOfMemoryError":
            return
        if getattr(exc, "_gpuprobe_seen", False):
            return  # dumped where it passed an inner probe
        try:
            exc._gpuprobe_seen = True  # type: ignore[attr-defined]
        except Exception:
            return  # cannot mark it: no dump rather than one per probe
        self.dump("oom")

    def dump(self, reason: str) -> Path | None:
        """Take one snapshot now; warns (once per reason) instead of raising."""
        self.start_history()
        name = Path(self.directory) / f"gpuprobe-memory-{reason}-{os.getpid()}.pickle"
        try:
            path = snapshot(name)
        except Exception as exc:
            self._warn(f"snapshot:{reason}", f"gpuprobe: memory snapshot ({reason}) not written: {exc}")
            return None
        self.dumps.append(path)
        return path

    def close(self) -> None:
        """Stop triggering (the allocator observer stays attached but does nothing)."""
        self.active = False
