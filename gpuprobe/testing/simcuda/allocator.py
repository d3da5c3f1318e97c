"""Memory: the caching allocator's segments, blocks and counters (``memory_stats`` with torch's key names),
out-of-memory errors and their observers, memory history and snapshots in torch's layout.

Tests allocate and free with :meth:`MemoryMixin.allocate` and :meth:`MemoryMixin.free` (a CPU build cannot
hold tensors on a device).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from ._torch_compat import import_torch, lazy_init
from .messages import _c10_index, _format_size

__all__ = ["MemoryMixin"]

_PACKAGE_DIR = os.path.dirname(__file__)  # the simulation's frames are left out of stacks

# torch/include/c10/core/AllocatorConfig.h
_MIN_BLOCK_SIZE = 512  # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
_SMALL_SIZE = 1048576  # kSmallSize: "largest 'small' allocation is 1 MiB"
_SMALL_BUFFER = 2097152  # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
_MIN_LARGE_ALLOC = 10485760  # kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
_ROUND_LARGE = 2097152  # kRoundLarge: "round up large allocations to 2 MiB"
_LARGE_BUFFER = 20971520  # kLargeBuffer, CUDACachingAllocator.cpp (not shipped in the wheel)


class _Stat:
    """One allocator statistic (c10/core/CachingDeviceAllocator.h ``Stat``)."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def update(self, delta: int) -> None:
        self.current += delta
        if delta > 0:
            self.allocated += delta
        else:
            self.freed -= delta
        self.peak = max(self.peak, self.current)

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


# The StatArray fields of DeviceStats, in the order THCPModule_memoryStats puts them in the dict.
_STAT_ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
_POOLS = ("all", "small_pool", "large_pool")  # StatType names


class _Block:
    __slots__ = ("address", "offset", "size", "requested", "segment", "frames", "stream")

    def __init__(self, segment: _Segment, offset: int, size: int, requested: int, frames: list[dict[str, Any]],
                 stream: int) -> None:
        self.segment = segment
        self.offset = offset
        self.address = segment.address + offset
        self.size = size
        self.requested = requested
        self.frames = frames
        self.stream = stream


class _Segment:
    __slots__ = ("device", "address", "size", "is_large", "stream", "blocks", "frames")

    def __init__(self, device: int, address: int, size: int, is_large: bool, stream: int,
                 frames: list[dict[str, Any]]) -> None:
        self.device = device
        self.address = address
        self.size = size
        self.is_large = is_large
        self.stream = stream
        self.blocks: dict[int, _Block] = {}  # offset -> block
        self.frames = frames

    def gaps(self) -> list[tuple[int, int]]:
        """Free ranges (offset, size) between the allocated blocks."""
        out = []
        pos = 0
        for off in sorted(self.blocks):
            if off > pos:
                out.append((pos, off - pos))
            pos = off + self.blocks[off].size
        if pos < self.size:
            out.append((pos, self.size - pos))
        return out


class _Allocator:
    """One device's caching allocator: segments, blocks and the DeviceStats counters."""

    def __init__(self, device: int, total: int) -> None:
        self.device = device
        self.total = total
        self.segments: list[_Segment] = []
        self.next_address = 0x7F0000000000 + device * (1 << 40)
        self.stats = {name: {pool: _Stat() for pool in _POOLS} for name in _STAT_ARRAYS}
        self.oversize_allocations = _Stat()
        self.oversize_segments = _Stat()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_oom_rejections = 0

    def update(self, name: str, is_large: bool, delta: int) -> None:
        if delta:
            arr = self.stats[name]
            arr["all"].update(delta)
            arr["large_pool" if is_large else "small_pool"].update(delta)

    @property
    def reserved(self) -> int:
        return self.stats["reserved_bytes"]["all"].current

    @property
    def allocated(self) -> int:
        return self.stats["allocated_bytes"]["all"].current

    def refresh_inactive_split(self) -> None:
        """Inactive split blocks: free pieces of segments that hold at least one allocation."""
        for is_large in (False, True):
            count = size = 0
            for seg in self.segments:
                if seg.is_large == is_large and seg.blocks:
                    gaps = seg.gaps()
                    count += len(gaps)
                    size += sum(g[1] for g in gaps)
            pool = "large_pool" if is_large else "small_pool"
            self.update("inactive_split", is_large, count - self.stats["inactive_split"][pool].current)
            self.update("inactive_split_bytes", is_large, size - self.stats["inactive_split_bytes"][pool].current)

    def reset_peak(self) -> None:
        for arr in self.stats.values():
            for stat in arr.values():
                stat.peak = stat.current
        for stat in (self.oversize_allocations, self.oversize_segments):
            stat.peak = stat.current

    def reset_accumulated(self) -> None:
        for arr in self.stats.values():
            for stat in arr.values():
                stat.allocated = stat.freed = 0
        for stat in (self.oversize_allocations, self.oversize_segments):
            stat.allocated = stat.freed = 0
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = 0
        self.num_device_alloc = self.num_device_free = 0

    def nested(self) -> dict[str, Any]:
        """The dict ``torch._C._cuda_memoryStats`` returns (torch/csrc/cuda/Module.cpp)."""
        out: dict[str, Any] = {
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "max_split_size": -1,  # SIZE_MAX (no limit) cast to int64
            "num_sync_all_streams": self.num_sync_all_streams,
            "num_device_alloc": self.num_device_alloc,
            "num_device_free": self.num_device_free,
            "num_oom_rejections": self.num_oom_rejections,
        }
        for name in _STAT_ARRAYS:
            out[name] = {pool: self.stats[name][pool].as_dict() for pool in _POOLS}
        out["reserved_bytes_by_private_pools"] = {}
        out["oversize_allocations"] = self.oversize_allocations.as_dict()
        out["oversize_segments"] = self.oversize_segments.as_dict()
        return out


class _AllocationFailed(Exception):
    """The simulated allocator found no memory for a request (raised with the lock held).

    :meth:`SimulatedCuda.allocate` turns it into ``torch.OutOfMemoryError`` once it has released the
    lock and called the out-of-memory observers with these values.

    Attributes:
        device: the device index.
        alloc_size: the size of the segment that could not be allocated (``get_allocation_size`` of the
            rounded request: what the message says was tried).
        device_total: the device's total memory.
        device_free: the device's free memory after the cache was released (``cudaMemGetInfo``).
    """

    def __init__(self, message: str, device: int, alloc_size: int, device_total: int, device_free: int) -> None:
        super().__init__(message)
        self.device = device
        self.alloc_size = alloc_size
        self.device_total = device_total
        self.device_free = device_free


@dataclasses.dataclass
class _History:
    """``_record_memory_history`` settings (c10 RecordContext: NEVER/STATE/ALLOC/ALL)."""

    enabled: str | None = None  # None, "state" or "all"
    context: str | None = None  # None, "state", "alloc" or "all"
    stacks: str = "all"
    max_entries: int = sys.maxsize
    skip_actions: frozenset[str] = frozenset()


class MemoryMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` behind memory: the test drivers
    :meth:`allocate` and :meth:`free`, and the caching allocator's C-level calls, simulated."""

    def allocate(self, nbytes: int, device: int | None = None) -> int:
        """Allocate through the simulated caching allocator; returns a device address (0 for 0 bytes).

        Sizes round up to 512 bytes; reserved memory grows by segments of 2 MiB (small pool, up to
        1 MiB), 20 MiB (up to 10 MiB) or the size rounded up to 2 MiB. Like creating a CUDA tensor,
        it initializes CUDA.

        When the device's memory would be exceeded even after the cached segments are released, the
        observers attached with ``torch._C._cuda_attach_out_of_memory_observer`` are called first (see
        :meth:`_call_oom_observers`), then ``torch.OutOfMemoryError`` is raised.

        Raises:
            torch.OutOfMemoryError: the device's memory would be exceeded (after freeing the cache).
            Exception: whatever an out-of-memory observer raised, in place of the OutOfMemoryError.

        Example:
            >>> import torch
            >>> from gpuprobe.testing.simcuda import simulated_cuda
            >>> with simulated_cuda() as sim:
            ...     h = sim.allocate(3 * 2**20)
            ...     sim.free(h)
            ...     (torch.cuda.memory_allocated(), torch.cuda.memory_reserved() // 2**20)
            (0, 20)
        """
        torch = import_torch()
        if nbytes < 0:
            raise ValueError(f"simulated CUDA: cannot allocate {nbytes} bytes")
        lazy_init(torch)
        frames = self._frames() if self._history.enabled is not None and self._history.context else []
        with self._lock:
            d = self._tls.device if device is None else self._check_device(device)
            if nbytes == 0:
                return 0
            stream = self._current_stream(d).cuda_stream
            try:
                return self._alloc(self._devices[d].allocator, int(nbytes), frames, stream)
            except _AllocationFailed as exc:
                failed = exc
                observers = list(self._oom_observers)  # DeviceCachingAllocator::malloc: observers_local
        # Outside the lock, as the allocator unlocks before calling observers (they may need the GIL),
        # and outside the except block, so the OutOfMemoryError has no context.
        self._call_oom_observers(observers, failed)
        raise torch.OutOfMemoryError(str(failed))

    def free(self, handle: int) -> None:
        """Free an address returned by :meth:`allocate` (the memory stays reserved, as in the cache).

        Raises:
            RuntimeError: not an address the allocator handed out ("invalid device pointer").
        """
        if handle == 0:
            return
        frames = self._frames() if self._history.enabled == "all" and self._history.context == "all" else []
        with self._lock:
            block = self._blocks.pop(handle, None)
            if block is None:
                raise RuntimeError(f"invalid device pointer: {handle:#x}")
            seg = block.segment
            alloc = self._devices[seg.device].allocator
            del seg.blocks[block.offset]
            large = seg.is_large
            alloc.update("allocation", large, -1)
            alloc.update("active", large, -1)
            alloc.update("allocated_bytes", large, -block.size)
            alloc.update("active_bytes", large, -block.size)
            alloc.update("requested_bytes", large, -block.requested)
            alloc.refresh_inactive_split()
            for action in ("free_requested", "free_completed"):
                self._trace(alloc.device, action, block.address, block.size, block.stream, frames)

    def _c_mem_get_info(self, device: int) -> tuple[int, int]:
        with self._lock:
            alloc = self._dev(self._check_device(device)).allocator
            return alloc.total - alloc.reserved, alloc.total

    @staticmethod
    def _round_size(nbytes: int) -> int:
        """CUDACachingAllocator round_size: at least 512 bytes, then multiples of 512."""
        if nbytes < _MIN_BLOCK_SIZE:
            return _MIN_BLOCK_SIZE
        return _MIN_BLOCK_SIZE * ((nbytes + _MIN_BLOCK_SIZE - 1) // _MIN_BLOCK_SIZE)

    @staticmethod
    def _segment_size(size: int) -> int:
        """CUDACachingAllocator get_allocation_size."""
        if size <= _SMALL_SIZE:
            return _SMALL_BUFFER
        if size < _MIN_LARGE_ALLOC:
            return _LARGE_BUFFER
        return _ROUND_LARGE * ((size + _ROUND_LARGE - 1) // _ROUND_LARGE)

    def _alloc(self, alloc: _Allocator, nbytes: int, frames: list[dict[str, Any]], stream: int) -> int:
        size = self._round_size(nbytes)
        large = size > _SMALL_SIZE
        best: tuple[int, _Segment, int] | None = None
        for seg in alloc.segments:
            if seg.is_large != large:
                continue
            for off, gap in seg.gaps():
                if gap >= size and (best is None or gap < best[0]):
                    best = (gap, seg, off)
        if best is None:
            seg_size = self._segment_size(size)
            if alloc.reserved + seg_size > alloc.total:
                # alloc_block failed: release the cached (empty) segments and retry (isRetry counts).
                alloc.num_sync_all_streams += 1
                alloc.num_alloc_retries += 1
                self._release_cached(alloc)
                if alloc.reserved + seg_size > alloc.total:
                    self._oom(alloc, size, seg_size, stream, frames)
            seg = _Segment(alloc.device, alloc.next_address, seg_size, large, stream, frames)
            alloc.next_address += seg_size
            alloc.segments.append(seg)
            alloc.num_device_alloc += 1
            alloc.update("segment", large, 1)
            alloc.update("reserved_bytes", large, seg_size)
            self._trace(alloc.device, "segment_alloc", seg.address, seg_size, stream, frames)
            best = (seg_size, seg, 0)
        gap, seg, off = best
        # Large blocks are split only when more than kSmallSize would remain (should_split).
        block_size = gap if large and gap - size <= _SMALL_SIZE else size
        block = _Block(seg, off, block_size, nbytes, frames, stream)
        seg.blocks[off] = block
        self._blocks[block.address] = block
        alloc.update("allocation", large, 1)
        alloc.update("active", large, 1)
        alloc.update("allocated_bytes", large, block_size)
        alloc.update("active_bytes", large, block_size)
        alloc.update("requested_bytes", large, nbytes)
        alloc.refresh_inactive_split()
        self._trace(alloc.device, "alloc", block.address, block_size, stream, frames)
        if self._history.enabled is not None and self._history.stacks == "all":
            self.stats.memory_history_cpp_unwinds += 1
        return block.address

    def _release_cached(self, alloc: _Allocator) -> None:
        keep = []
        for seg in alloc.segments:
            if seg.blocks:
                keep.append(seg)
                continue
            alloc.num_device_free += 1
            alloc.update("segment", seg.is_large, -1)
            alloc.update("reserved_bytes", seg.is_large, -seg.size)
            self._trace(alloc.device, "segment_free", seg.address, seg.size, seg.stream, [])
        alloc.segments = keep
        alloc.refresh_inactive_split()

    def _oom(self, alloc: _Allocator, size: int, seg_size: int, stream: int,
             frames: list[dict[str, Any]]) -> NoReturn:
        """The allocation failed after the retry (lock held): count it, trace it, raise _AllocationFailed.

        CUDACachingAllocator.cpp DeviceCachingAllocator::malloc, once ``alloc_block`` has failed again
        after ``release_cached_blocks``: ``cudaMemGetInfo``, ``record_trace(OOM, device_free, size)``,
        ``num_ooms += 1``, then (lock released) the observers, then the OutOfMemoryError.
        """
        alloc.num_ooms += 1
        free = alloc.total - alloc.reserved
        entry_extra = {"device_free": free}
        self._trace(alloc.device, "oom", free, size, stream, frames, entry_extra)
        allocated = alloc.allocated
        raise _AllocationFailed(
            f"CUDA out of memory. Tried to allocate {_format_size(seg_size)}. GPU {alloc.device} has a total "
            f"capacity of {_format_size(alloc.total)} of which {_format_size(free)} is free. Including non-PyTorch "
            f"memory, this process has {_format_size(alloc.total - free)} memory in use. Of the allocated memory "
            f"{_format_size(allocated)} is allocated by PyTorch, and {_format_size(alloc.reserved - allocated)} is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
            alloc.device, seg_size, alloc.total, free)

    def _c_attach_oom_observer(self, observer: Callable[[int, int, int, int], object]) -> None:
        """CUDACachingAllocator attachOutOfMemoryObserver: the observer is kept for good (no detach).

        Kept by this simulation (torch keeps it for the process): it outlives an uninstall and is called
        again if the simulation is installed again. Nothing is checked here; torch's binding takes any
        object (``METH_O``), and a non-callable fails only when an OOM calls it.
        """
        with self._lock:
            self._oom_observers.append(observer)

    @staticmethod
    def _call_oom_observers(observers: list[Callable[[int, int, int, int], object]],
                            failed: _AllocationFailed) -> None:
        """Call the out-of-memory observers, in the order attached, on the allocating thread, lock released.

        Each gets ``(device, alloc_size, device_total, device_free)``: DeviceCachingAllocator::malloc
        passes ``set_fraction ? allowed_memory_maximum : device_total`` third (no memory fraction is
        simulated), although the Python binding names that parameter ``device_allocated``.

        torch/csrc/cuda/Module.cpp THCPModule_attachOutOfMemoryObserver wraps the observer in a function
        that takes the GIL and calls it with ``PyObject_CallFunction``; a Python exception there is thrown
        as ``py::error_already_set``, which leaves the allocator (the observers after it are not called,
        no OutOfMemoryError is raised) and is restored as the Python exception by the binding of the call
        that allocated (``HANDLE_TH_ERRORS``). So here it propagates unchanged from :meth:`allocate`. The
        return value is ignored.
        """
        for observer in observers:
            observer(failed.device, failed.alloc_size, failed.device_total, failed.device_free)

    def _allocator_for_stats(self, device: int) -> _Allocator:
        """CUDACachingAllocator assertValidDevice: the device must exist and the allocator be initialized."""
        if not self._initialized or not 0 <= device < self.devices:
            raise RuntimeError(f"Invalid device argument {_c10_index(device)}: did you call init?")
        return self._devices[device].allocator

    def _c_empty_cache(self) -> None:
        with self._lock:
            for dev in self._devices:
                self._release_cached(dev.allocator)

    def _frames(self) -> list[dict[str, Any]]:
        """Python frames of the caller, innermost first, without the simulation's own."""
        stack = [f for f in traceback.extract_stack() if os.path.dirname(f.filename) != _PACKAGE_DIR]
        return [{"filename": f.filename, "line": f.lineno or 0, "name": f.name} for f in reversed(stack)]

    def _trace(self, device: int, action: str, addr: int, size: int, stream: int, frames: list[dict[str, Any]],
               extra: dict[str, Any] | None = None) -> None:
        """Append an allocator history entry (lock held) when recording "all" history."""
        hist = self._history
        if hist.enabled != "all" or action in hist.skip_actions:
            return
        keep_frames = hist.context == "all" or (hist.context == "alloc" and action in ("alloc", "segment_alloc",
                                                                                      "oom"))
        entry: dict[str, Any] = {"action": action, "addr": addr, "size": size, "stream": stream,
                                 "time_us": time.time_ns() // 1000, "frames": list(frames) if keep_frames else [],
                                 "compile_context": "", "user_metadata": ""}
        if extra:
            entry.update(extra)
        trace = self._traces[device]
        trace.append(entry)
        while len(trace) > hist.max_entries:
            trace.popleft()

    def _c_record_history(self, enabled: str | None, context: str | None, stacks: str, max_entries: int,
                          clear_history: bool, skip_actions: list[str] | None) -> None:
        valid_actions = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                         "segment_map", "segment_unmap", "snapshot", "oom"}
        for action in skip_actions or []:
            if action not in valid_actions:
                raise RuntimeError(f"Unknown TraceEntry action: {action}")
        if enabled is not None:
            if enabled not in ("state", "all"):
                raise RuntimeError("expected state to be 'state', 'all', or None")
            if context not in (None, "state", "alloc", "all"):
                raise RuntimeError("expected context to be 'state', 'alloc', 'all', or None")
            if stacks not in ("python", "all"):
                raise RuntimeError("expected stacks to be 'python', or 'all'")
        with self._lock:
            self._history = _History(enabled, context if enabled is not None else None, stacks, int(max_entries),
                                     frozenset(skip_actions or ()))
            if enabled is None or clear_history:
                for trace in self._traces:
                    trace.clear()

    def _c_snapshot(self) -> dict[str, Any]:
        """The dict ``torch.cuda.memory._snapshot`` returns (layout of torch/cuda/memory.py's docstring)."""
        with self._lock:
            segments = []
            for dev in self._devices:
                alloc = dev.allocator
                for seg in sorted(alloc.segments, key=lambda s: s.address):
                    blocks = []
                    pos = 0
                    for off in sorted(seg.blocks):
                        b = seg.blocks[off]
                        if off > pos:
                            blocks.append({"address": seg.address + pos, "size": off - pos, "requested_size": 0,
                                           "state": "inactive", "frames": []})
                        frames = b.frames if self._history.context is not None else []
                        blocks.append({"address": b.address, "size": b.size, "requested_size": b.requested,
                                       "state": "active_allocated", "frames": list(frames)})
                        pos = off + b.size
                    if pos < seg.size:
                        blocks.append({"address": seg.address + pos, "size": seg.size - pos, "requested_size": 0,
                                       "state": "inactive", "frames": []})
                    used = sum(b.size for b in seg.blocks.values())
                    segments.append({
                        "device": dev.index, "address": seg.address, "total_size": seg.size,
                        "allocated_size": used, "active_size": used,
                        "requested_size": sum(b.requested for b in seg.blocks.values()),
                        "stream": seg.stream, "segment_type": "large" if seg.is_large else "small",
                        "segment_pool_id": (0, 0), "is_expandable": False,
                        "frames": list(seg.frames) if self._history.context is not None else [],
                        "blocks": blocks,
                    })
                if self._history.enabled == "all":
                    self._trace(dev.index, "snapshot", 0, alloc.stats["active_bytes"]["all"].current, 0, [])
            return {
                "segments": segments,
                "device_traces": [list(t) for t in self._traces],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                                       "max_split_size": -1, "garbage_collection_threshold": 0.0,
                                       "expandable_segments": False},
                "external_annotations": [],
            }
