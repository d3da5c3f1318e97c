"""A simulated CUDA for machines without a GPU: ``torch.cuda`` with the semantics of torch 2.13.

While installed, :class:`SimulatedCuda` replaces attributes of ``torch.cuda`` (and of
``torch.cuda.memory``, ``torch.cuda.graphs``, ``torch.cuda.streams``, ``torch.profiler``,
``torch.autograd.profiler``, ``torch.profiler._utils`` and ``torch._C``) with simulated ones, and puts
every one of them back on exit (an attribute the module did not have, such as
``torch._C._cuda_attach_out_of_memory_observer`` on a CPU build, is removed again). Code that looks up
``torch.cuda.X`` when it runs (gpuprobe does) sees the simulation; torch's own Python code in those
modules sees it too, since a module's attributes are its globals.

What is simulated, each behaviour checked against torch 2.13's sources (cited in the docstrings):

- devices: availability, count, lazy initialization (and which calls initialize), a per-thread current
  device, the fork poisoning of ``torch.cuda._lazy_init``;
- streams: a default stream and pools of 32 streams per priority per device, a per-thread current
  stream, ``torch.cuda.stream`` / ``StreamContext`` / ``set_stream``;
- asynchronous device time: the host runs ahead; work queued with :meth:`SimulatedCuda.launch` ends
  on a simulated clock per device that moves only through :meth:`SimulatedCuda.advance`,
  :meth:`SimulatedCuda.finish` and host synchronizations;
- events (``include/c10/cuda/CUDAEvent.h``): lazy creation, device binding, ``query``,
  ``elapsed_time`` preconditions, ``synchronize``, ``wait``;
- CUDA graphs: capture modes, capture invalidation by unsafe calls, captured events, replay;
- the caching allocator's counters (``memory_stats`` with torch's key names), OOM and its observers
  (``torch._C._cuda_attach_out_of_memory_observer``), memory history and snapshots in torch's layout;
- ``torch.profiler.profile`` with CUDA activity: GPU kernels, memcpy/memset, GPU user annotations,
  sync records, one session per process, the synchronization on exit;
- the sync debug mode, ``cudart()`` profiler start/stop, CUDA RNG seeds, ``torch.cuda._sleep`` (a spin
  kernel of so many clock cycles), and where tensors live for
  gpuprobe (:meth:`SimulatedCuda.place`).

Behaviours that follow torch where intuition might not:

- ``torch.cuda.is_available()`` poisons fork (it asks the CUDA runtime), ``device_count()`` does not;
- the sync debug mode flags ``Stream.synchronize`` and copies to the host
  (:meth:`SimulatedCuda.memcpy_and_sync`), not ``torch.cuda.synchronize`` nor ``Event.synchronize``;
- kineto records ``gpu_user_annotation`` only when CPU activity is traced too, and ``cuda_sync``
  records only with ``_ExperimentalConfig(enable_cuda_sync_events=True)``;
- a second concurrent CUDA profiling session raises here; torch does not refuse it (kineto logs
  "GenericActivityProfiler already busy" and the results are lost);
- when ``capture_end`` fails inside ``torch.cuda.graph``, the capture stream stays current;
- an out-of-memory observer's third argument is the device's total memory, although torch's binding
  names it ``device_allocated`` (and its docs ``device_alloc``); an exception raised by an observer
  propagates from the allocation in place of the ``OutOfMemoryError``.

Not simulated: tensors on devices (a CPU build cannot hold them: work is described with
:meth:`SimulatedCuda.launch`, memory with :meth:`SimulatedCuda.allocate`); contention between
streams; host-side launch cost; RNG generator states; ``ExternalStream``; IPC events;
``make_graphed_callables``; ``torch.cuda.nvtx`` (a CPU build without NVTX raises, as torch does);
``torch.accelerator`` and the device-generic ``torch.Stream``/``torch.Event``; memory pools
(graph-private pools, ``MemPool``), expandable segments, the pinned host allocator;
``CUDA_VISIBLE_DEVICES``. Profiler: no flow events or ``External id`` links between CPU ops and
kernels; GPU timestamps are the device clock offset to the session's start.

Example:
    >>> import torch
    >>> from gpuprobe.testing.simcuda import simulated_cuda
    >>> with simulated_cuda(devices=2) as sim:
    ...     start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ...     start.record()
    ...     _ = sim.launch(2_000_000, "gemm")
    ...     end.record()
    ...     done_before = end.query()           # the host ran ahead: the kernel is still running
    ...     sim.finish()                        # the GPU catches up (not a host synchronization)
    ...     (done_before, end.query(), start.elapsed_time(end), sim.stats.host_syncs)
    (False, True, 2.0, 0)

This module imports torch only when a simulation is created or installed.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import json
import os
import pickle
import struct
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Literal, NoReturn

__all__ = [
    "KernelRecord",
    "SimEvent",
    "SimCUDAGraph",
    "SimDeviceProperties",
    "SimStats",
    "SimStream",
    "SimulatedCuda",
    "simulated_cuda",
]


def _torch() -> Any:
    """The torch module, imported on first use only."""
    mod = sys.modules.get("torch")
    if mod is None:
        import torch as mod  # noqa: PLC0415 (kept out of import time on purpose)
    return mod


# ---------------------------------------------------------------------------------------------------
# Constants, each with where it comes from
# ---------------------------------------------------------------------------------------------------

# torch/include/c10/core/AllocatorConfig.h
_MIN_BLOCK_SIZE = 512  # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
_SMALL_SIZE = 1048576  # kSmallSize: "largest 'small' allocation is 1 MiB"
_SMALL_BUFFER = 2097152  # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
_MIN_LARGE_ALLOC = 10485760  # kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer"
_ROUND_LARGE = 2097152  # kRoundLarge: "round up large allocations to 2 MiB"
_LARGE_BUFFER = 20971520  # kLargeBuffer, CUDACachingAllocator.cpp (not shipped in the wheel)

# torch/include/c10/cuda/CUDAStream.h: "There are 32 of these streams per device";
# max_compile_time_stream_priorities = 4 (priorities 0, -1, -2, -3).
_STREAMS_PER_POOL = 32
_PRIORITY_LEVELS = 4

# Kineto writes the legacy default stream as stream 7 (tests/data/kineto_min.json, HTA traces).
_KINETO_DEFAULT_STREAM = 7

# Messages torch raises, verbatim.
# torch/cuda/__init__.py _lazy_init:
_FORK_MESSAGE = (
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
    "multiprocessing, you must use the 'spawn' start method"
)
# CUDA runtime error strings (cudaGetErrorString), with their cudaError_t codes.
_CUDA_ERRORS: dict[str, tuple[int, str]] = {
    "cudaErrorNotReady": (34, "device not ready"),
    "cudaErrorInvalidDevice": (101, "invalid device ordinal"),
    "cudaErrorInvalidResourceHandle": (400, "invalid resource handle"),
    "cudaErrorStreamCaptureUnsupported": (900, "operation not permitted when stream is capturing"),
    "cudaErrorStreamCaptureInvalidated": (901, "operation failed due to a previous error during capture"),
    "cudaErrorCapturedEvent": (907, "operation not permitted on an event last recorded in a capturing stream"),
    "cudaErrorStreamCaptureWrongThread": (
        908,
        "attempt to terminate a thread-local capture sequence from another thread",
    ),
}
_SYNC_MESSAGE = "called a synchronizing CUDA operation"  # c10/cuda/CUDAFunctions.cpp warn_or_error_on_sync
_SYNC_PROTOTYPE_WARNING = (  # torch/csrc/cuda/Module.cpp THCPModule_cudaSetSyncDebugMode (TORCH_WARN_ONCE)
    "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations"
)

# _KinetoEvent.activity_type() strings (kineto's ActivityType names, present in libtorch_cpu.so).
KERNEL = "kernel"
GPU_MEMCPY = "gpu_memcpy"
GPU_MEMSET = "gpu_memset"
GPU_USER_ANNOTATION = "gpu_user_annotation"
CUDA_SYNC = "cuda_sync"
CUDA_RUNTIME = "cuda_runtime"
_LAUNCH_KINDS = frozenset({KERNEL, GPU_MEMCPY, GPU_MEMSET})
# ProfilerActivity filter names (torch/profiler/profiler.py _parse_activities) per activity type.
_FILTER_NAMES = {
    KERNEL: "CONCURRENT_KERNEL",
    GPU_MEMCPY: "GPU_MEMCPY",
    GPU_MEMSET: "GPU_MEMSET",
    GPU_USER_ANNOTATION: "GPU_USER_ANNOTATION",
    CUDA_SYNC: "CUDA_SYNC",
    CUDA_RUNTIME: "CUDA_RUNTIME",
}
# The runtime call kineto records on the host for each kind of GPU work.
_RUNTIME_CALL = {KERNEL: "cudaLaunchKernel", GPU_MEMCPY: "cudaMemcpyAsync", GPU_MEMSET: "cudaMemsetAsync"}


def _check_suffix() -> str:
    """The tail c10_cuda_check_implementation appends (c10/cuda/CUDAMiscFunctions get_cuda_check_suffix)."""
    flag = os.environ.get("CUDA_LAUNCH_BLOCKING", "")
    blocking = flag not in ("", "0")
    tail = "" if blocking else (
        "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    )
    return tail + "\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"


def _cuda_error(name: str) -> Exception:
    """The exception ``C10_CUDA_CHECK`` raises for a CUDA error: ``torch.AcceleratorError`` (a RuntimeError)."""
    torch = _torch()
    code, text = _CUDA_ERRORS[name]
    exc_type: type[RuntimeError] = getattr(torch, "AcceleratorError", RuntimeError)
    exc = exc_type("CUDA error: " + text + _check_suffix())
    # torch sets error_code (the cudaError_t) on the AcceleratorError it raises (torch/csrc/Exceptions.cpp);
    # torch/_C/__init__.pyi declares the class without the attribute.
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


def _c10_index(index: int) -> str:
    """How ``c10::str`` prints a ``DeviceIndex``: it is an ``int8_t`` (c10/core/Device.h), which an
    ``std::ostream`` writes as a character (c10/util/StringUtil.h has no overload for it)."""
    return chr(index % 256)


def _format_size(size: int) -> str:
    """Bytes as the caching allocator's ``format_size`` writes them in OOM messages."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def _float32(value: float) -> float:
    """``cudaEventElapsedTime`` returns a C ``float``: round through 32 bits as torch's binding does."""
    return struct.unpack("f", struct.pack("f", value))[0]


# ---------------------------------------------------------------------------------------------------
# Public records
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SimStats:
    """Counters of what the code under test asked of the simulated CUDA.

    Attributes:
        host_syncs: host synchronizations that completed (``torch.cuda.synchronize``,
            ``Event.synchronize`` of a recorded event, ``Stream.synchronize``,
            :meth:`SimulatedCuda.memcpy_and_sync`).
        host_syncs_by_api: the same, by API (``"synchronize"``, ``"Event.synchronize"``, ...).
        init_calls: calls of ``torch.cuda._lazy_init`` (every initializing API calls it).
        first_init_call: the API whose call initialized CUDA (None until then).
        unsafe_calls_during_capture: calls refused because a graph capture forbids them.
        invalidated_captures: captures invalidated by such calls.
        events_created: ``torch.cuda.Event`` objects constructed.
        kernels_launched: GPU work items queued (graph replays included, captures excluded).
        graph_captures: successful ``CUDAGraph.capture_end`` calls.
        graph_replays: ``CUDAGraph.replay`` calls.
        profiler_sessions: CUDA profiling sessions started.
        profiler_cross_thread_stops: CUDA profiling sessions stopped on another thread than the one
            that started them (torch does not refuse it; the session's results come back empty).
        profiler_api_starts: ``torch.cuda.cudart().cudaProfilerStart()`` calls.
        profiler_api_stops: ``torch.cuda.cudart().cudaProfilerStop()`` calls.
        init_for_cuda_graphs_calls: ``torch.profiler._utils._init_for_cuda_graphs()`` calls.
        graph_replays_without_profiler_warmup: replays, inside a CUDA profiling session, of graphs
            captured before any profiler session and without ``_init_for_cuda_graphs()`` first.
        memory_history_cpp_unwinds: allocator events recorded with ``stacks="all"`` (each unwinds
            the C++ stack on a real GPU).
        calls: calls of each simulated ``torch.cuda`` API, keyed by its attribute name
            (``"memory_stats"``, ``"Event.record"``, ...).
    """

    host_syncs: int = 0
    host_syncs_by_api: Counter[str] = dataclasses.field(default_factory=Counter)
    init_calls: int = 0
    first_init_call: str | None = None
    unsafe_calls_during_capture: int = 0
    invalidated_captures: int = 0
    events_created: int = 0
    kernels_launched: int = 0
    graph_captures: int = 0
    graph_replays: int = 0
    profiler_sessions: int = 0
    profiler_cross_thread_stops: int = 0
    profiler_api_starts: int = 0
    profiler_api_stops: int = 0
    init_for_cuda_graphs_calls: int = 0
    graph_replays_without_profiler_warmup: int = 0
    memory_history_cpp_unwinds: int = 0
    calls: Counter[str] = dataclasses.field(default_factory=Counter)


@dataclasses.dataclass(frozen=True)
class KernelRecord:
    """One piece of GPU work queued by :meth:`SimulatedCuda.launch` (times on the device's clock).

    Attributes:
        name: the kernel's name.
        kind: ``"kernel"``, ``"gpu_memcpy"`` or ``"gpu_memset"`` (kineto's activity types).
        device: the device index.
        stream_id: torch's id of the stream it was queued on (0 for the default stream).
        start_ns: when it starts: after the device's clock and the stream's earlier work.
        end_ns: when it ends.
    """

    name: str
    kind: str
    device: int
    stream_id: int
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns


@dataclasses.dataclass(frozen=True)
class SimDeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns: an H100 SXM with the simulated memory size.

    Field names are those of ``torch._C._CudaDeviceProperties`` (torch/_C/__init__.pyi).
    """

    name: str = "NVIDIA H100 80GB HBM3"
    major: int = 9
    minor: int = 0
    multi_processor_count: int = 132
    total_memory: int = 80 * 2**30
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    max_threads_per_multi_processor: int = 2048
    gcnArchName: str = "NVIDIA H100 80GB HBM3"
    warp_size: int = 32
    uuid: str = "00000000-0000-0000-0000-000000000000"
    L2_cache_size: int = 50 * 2**20
    clock_rate: int = 1980000
    memory_clock_rate: int = 2619000
    memory_bus_width: int = 5120
    shared_memory_per_block: int = 49152
    shared_memory_per_multiprocessor: int = 233472
    regs_per_multiprocessor: int = 65536
    max_threads_per_block: int = 1024
    pci_bus_id: int = 0

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count}, "
            f"uuid={self.uuid}, pci_bus_id={self.pci_bus_id}, L2_cache_size={self.L2_cache_size // 2**20}MB)"
        )


# ---------------------------------------------------------------------------------------------------
# Process-wide registry: one installed simulation at a time (over an optional machine one); fork handling
# ---------------------------------------------------------------------------------------------------

_REGISTRY_LOCK = threading.Lock()
_ACTIVE: SimulatedCuda | None = None
# A simulation installed with install(as_machine=True): the process's CUDA, which _ACTIVE goes over.
_MACHINE: SimulatedCuda | None = None
_MISSING = object()


def _after_fork_in_child() -> None:
    """In a forked child, a simulation whose CUDA state poisoned fork marks the child as a bad fork.

    torch registers a ``pthread_atfork`` handler when CUDA initializes or when ``is_available()``
    asks the CUDA runtime for the device count (torch/csrc/utils/device_lazy_init.cpp,
    ``register_fork_handler_for_device_init``); after a fork, ``torch.cuda._is_in_bad_fork()`` is
    True and ``_lazy_init`` raises.
    """
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for sim in (_MACHINE, _ACTIVE):
        if sim is not None:
            sim._lock = threading.RLock()  # a lock held by another thread at fork time would never be released
            if sim._fork_poisoned:
                sim._in_bad_fork = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------------------------------------
# Internal state
# ---------------------------------------------------------------------------------------------------


class _CaptureMode(enum.Enum):
    """cudaStreamCaptureMode, as named by ``CUDAGraph.capture_begin(capture_error_mode=...)``."""

    GLOBAL = "global"
    THREAD_LOCAL = "thread_local"
    RELAXED = "relaxed"


class _GraphState(enum.Enum):
    EMPTY = "empty"
    CAPTURING = "capturing"
    INVALIDATED = "invalidated"
    CAPTURED = "captured"


class _ThreadState(threading.local):
    """Per-thread CUDA state: the current device and each device's current stream.

    A new thread starts at device 0 with the default streams current (the CUDA runtime's current
    device is per host thread; c10/cuda/CUDAStream.h: "the notion of 'current stream for device' is
    thread local").
    """

    def __init__(self) -> None:
        self.device = 0
        self.streams: dict[int, SimStream] = {}
        self.annotations: list[_Annotation] = []
        self.stream_contexts: list[Any] = []


@dataclasses.dataclass
class _Annotation:
    """An open ``record_function`` range of a thread (for GPU user annotations)."""

    name: str
    ident: int


@dataclasses.dataclass
class _Op:
    """GPU work as queued (a graph keeps these until replay)."""

    name: str
    kind: str
    ns: int
    nbytes: int


@dataclasses.dataclass
class _GpuRecord:
    """One record of a CUDA profiling session, times in the device clock (host records: wall clock)."""

    name: str
    activity: str
    device: int
    stream: int  # kineto's stream number; -1 for a context synchronization
    start_ns: int
    end_ns: int
    thread: int  # the simulation's sequential id of the launching thread
    correlation: int
    nbytes: int = 0
    annotation: _Annotation | None = None
    on_host: bool = False


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


class _Session:
    """The process's CUDA profiling session (kineto allows one)."""

    def __init__(self, owner: Any, cpu: bool, sync_events: bool, allowed: frozenset[str] | None) -> None:
        self.owner = owner
        self.cpu = cpu
        self.sync_events = sync_events
        self.allowed = allowed
        self.recording = False
        self.start_thread = 0
        self.anchor_wall_ns = 0
        self.anchor_dev_ns: list[int] = []
        self.records: list[_GpuRecord] = []

    def wants(self, activity: str) -> bool:
        if activity == CUDA_SYNC and not self.sync_events:
            return False
        if activity == GPU_USER_ANNOTATION and not self.cpu:
            return False
        return self.allowed is None or _FILTER_NAMES[activity] in self.allowed


class _Device:
    def __init__(self, sim: SimulatedCuda, index: int) -> None:
        self.index = index
        self.now_ns = 0
        self.default = sim._Stream._make(sim, index, level=-1, slot=0)
        self.pools: dict[int, list[SimStream]] = {}
        self.pool_next: dict[int, int] = collections.defaultdict(int)
        self.allocator = _Allocator(index, sim.memory_per_device)

    def streams(self) -> list[SimStream]:
        return [self.default] + [s for pool in self.pools.values() for s in pool]


# ---------------------------------------------------------------------------------------------------
# Simulated torch.cuda classes (each SimulatedCuda makes subclasses bound to itself)
# ---------------------------------------------------------------------------------------------------


class SimStream:
    """``torch.cuda.Stream`` (torch/cuda/streams.py) on a simulated device.

    Streams come from pools, as in c10/cuda/CUDAStream.h: each device has a default stream and, per
    priority, 32 streams handed out round-robin (the 33rd ``Stream()`` is the first one again).

    Example:
        >>> import torch
        >>> from gpuprobe.testing.simcuda import simulated_cuda
        >>> with simulated_cuda() as sim:
        ...     s = torch.cuda.Stream()
        ...     with torch.cuda.stream(s):
        ...         current = torch.cuda.current_stream()
        ...     (current == s, s.query())
        (True, True)
    """

    _sim: ClassVar[SimulatedCuda]
    device_type: ClassVar[int] = 1  # c10::DeviceType::CUDA

    device_index: int
    stream_id: int
    cuda_stream: int
    priority: int
    _kineto_id: int  # the stream number kineto writes in traces
    _busy_until: int  # when the stream's queued work ends, on the device clock (ns)
    _capture: SimCUDAGraph | None  # the graph capturing this stream's work, if any

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> SimStream:
        """torch/cuda/streams.py Stream.__new__: ``with torch.cuda.device(device)`` when a device is
        given, then a stream from the pool (c10 getStreamFromPool; priority clamped to the range)."""
        torch = _torch()
        sim = cls._sim
        sim._count("Stream")
        if "stream_id" in kwargs and "device_index" in kwargs:
            return sim._stream_by_id(int(kwargs["stream_id"]), int(kwargs["device_index"]))
        if device is None:
            return sim._c_stream_from_pool(priority)
        with torch.cuda.device(device):
            return sim._c_stream_from_pool(priority)

    @classmethod
    def _make(cls, sim: SimulatedCuda, device: int, level: int, slot: int) -> SimStream:
        self = object.__new__(cls)
        self.device_index = device
        if level < 0:  # the default stream
            self.stream_id, self.cuda_stream, self.priority, self._kineto_id = 0, 0, 0, _KINETO_DEFAULT_STREAM
        else:
            # Odd, nonzero ids like c10's makeStreamId (index << 5 | type << 1 | 1).
            self.stream_id = (slot << 5) | ((level + 1) << 1) | 1
            self.cuda_stream = 0x55000000 + (device << 16) + (level << 8) + (slot << 2) + 0x10
            self.priority = -level
            self._kineto_id = 13 + level * _STREAMS_PER_POOL + slot
        self._busy_until = 0
        self._capture = None
        return self

    @property
    def device(self) -> Any:
        """``torch.device("cuda", device_index)``."""
        return _torch().device("cuda", self.device_index)

    def query(self) -> bool:
        """Whether all work queued on the stream has completed (``cudaStreamQuery``; refused while a
        capture forbids it, and on a capturing stream)."""
        return self._sim._c_stream_query(self)

    def synchronize(self) -> None:
        """Wait for the stream's work (c10::cuda::stream_synchronize, CUDAFunctions.h: checks the sync
        debug mode first, then ``cudaStreamSynchronize``). A counted host synchronization."""
        self._sim._c_stream_synchronize(self)

    def wait_event(self, event: Any) -> None:
        """torch/cuda/streams.py: ``event.wait(self)``."""
        self._sim._count("Stream.wait_event")
        event.wait(self)

    def wait_stream(self, stream: Any) -> None:
        """torch/cuda/streams.py: ``self.wait_event(stream.record_event())``."""
        self._sim._count("Stream.wait_stream")
        self.wait_event(stream.record_event())

    def record_event(self, event: Any = None) -> Any:
        """torch/cuda/streams.py: a new ``Event()`` when none is given, recorded on this stream."""
        self._sim._count("Stream.record_event")
        if event is None:
            event = _torch().cuda.Event()
        event.record(self)
        return event

    def __enter__(self) -> SimStream:
        """``with stream:`` as ``with torch.cuda.stream(stream):`` (the context is kept per thread)."""
        ctx = _torch().cuda.StreamContext(self)
        ctx.__enter__()
        self._sim._tls.stream_contexts.append(ctx)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sim._tls.stream_contexts.pop().__exit__(*exc)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SimStream):
            return (self.stream_id, self.device_index) == (other.stream_id, other.device_index)
        return False

    def __hash__(self) -> int:
        return hash((self.cuda_stream, self.device_index))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.cuda_stream:#x}>"


class SimEvent:
    """``torch.cuda.Event`` (torch/cuda/streams.py over c10/cuda/CUDAEvent.h) on simulated devices.

    The CUDA event is created at the first ``record()`` on the recording stream's device and is bound
    to it from then on. Its timestamp is the moment its stream reaches it.

    Example:
        >>> import torch
        >>> from gpuprobe.testing.simcuda import simulated_cuda
        >>> with simulated_cuda() as sim:
        ...     ev = torch.cuda.Event(enable_timing=True)
        ...     never_recorded = ev.query()
        ...     _ = sim.launch(1000)
        ...     ev.record()
        ...     (never_recorded, ev.query())
        (True, False)
    """

    _sim: ClassVar[SimulatedCuda]

    enable_timing: bool
    blocking: bool
    interprocess: bool
    external: bool
    _device: int | None  # the device the event was created on (at its first record), else None
    _ts: int  # when its stream reaches it, on the device clock (ns)
    _captured_by: SimCUDAGraph | None  # the capture it was last recorded in, if any
    _handle: int  # the simulated cudaEvent_t (0 until the first record)

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                external: bool = False) -> SimEvent:
        """torch/cuda/streams.py Event.__new__: flags only; nothing is created on a device yet."""
        sim = cls._sim
        self = object.__new__(cls)
        self.enable_timing = bool(enable_timing)
        self.blocking = bool(blocking)
        self.interprocess = bool(interprocess)
        self.external = bool(external)
        self._device = None
        self._ts = 0
        self._captured_by = None
        self._handle = 0
        with sim._lock:
            sim.stats.calls["Event"] += 1
            sim.stats.events_created += 1
        return self

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: Any) -> SimEvent:
        """Not simulated (interprocess events)."""
        raise NotImplementedError("simulated CUDA: Event.from_ipc_handle is not simulated")

    @property
    def device(self) -> Any:
        """The event's device once created (CUDAEvent::device), else None."""
        if self._device is None:
            return None
        return _torch().device("cuda", self._device)

    @property
    def cuda_event(self) -> int:
        """The cudaEvent_t as an int (0 until the first record)."""
        return self._handle

    def record(self, stream: Any = None) -> None:
        """torch/cuda/streams.py: ``stream = torch.cuda.current_stream()`` when none is given (the
        current stream of the *current device*); CUDAEvent::record creates the event on the stream's
        device and refuses a stream of another device afterwards."""
        self._sim._count("Event.record")
        if stream is None:
            stream = _torch().cuda.current_stream()
        self._sim._c_event_record(self, stream)

    def wait(self, stream: Any = None) -> None:
        """torch/cuda/streams.py: current stream when none is given; CUDAEvent::block makes the
        stream's later work wait for the event (no-op for an event never recorded)."""
        self._sim._count("Event.wait")
        if stream is None:
            stream = _torch().cuda.current_stream()
        self._sim._c_event_block(self, stream)

    def query(self) -> bool:
        """CUDAEvent::query: True if never recorded; else whether the device has reached it."""
        return self._sim._c_event_query(self, "Event.query")

    def elapsed_time(self, end_event: SimEvent) -> float:
        """CUDAEvent::elapsed_time: milliseconds between the two events; never blocks.

        Raises:
            ValueError: an event was created without ``enable_timing=True``, or was never recorded.
            RuntimeError: an event has not completed.
            torch.AcceleratorError: the events are on different devices (``cudaEventElapsedTime``).
        """
        return self._sim._c_event_elapsed(self, end_event)

    def synchronize(self) -> None:
        """CUDAEvent::synchronize: blocks until the event completes (no-op if never recorded). A
        counted host synchronization; not checked by the sync debug mode (CUDAEvent.h calls no
        ``warn_or_error_on_sync``)."""
        self._sim._c_event_synchronize(self)

    def ipc_handle(self) -> Any:
        """Not simulated (interprocess events)."""
        raise NotImplementedError("simulated CUDA: Event.ipc_handle is not simulated")

    def __repr__(self) -> str:
        if self._handle:
            return f"<torch.cuda.Event {self._handle:#x}>"
        return "<torch.cuda.Event uninitialized>"


class SimCUDAGraph:
    """``torch.cuda.CUDAGraph`` (torch/cuda/graphs.py over aten/src/ATen/cuda/CUDAGraph.cpp).

    Work launched on the capturing stream is kept, not run; ``replay()`` queues it on the current
    stream. Checks and messages are CUDAGraph.cpp's; capture error modes follow
    ``cudaStreamCaptureMode``.
    """

    _sim: ClassVar[SimulatedCuda]

    _keep_graph: bool
    _state: _GraphState
    _ops: list[_Op]  # the captured work, queued again at each replay
    _stream: SimStream | None  # the stream the capture began on
    _device: int
    _mode: _CaptureMode
    _thread: int  # threading.get_ident() of the thread that began the capture
    _pool: tuple[int, int] | None  # the memory pool id (CUDAGraph::pool)
    _before_profiler_init: bool  # captured before CUPTI was initialized

    def __new__(cls, keep_graph: bool = False) -> SimCUDAGraph:
        self = object.__new__(cls)
        self._keep_graph = bool(keep_graph)
        self._state = _GraphState.EMPTY
        self._ops = []
        self._stream = None
        self._device = 0
        self._mode = _CaptureMode.GLOBAL
        self._thread = 0
        self._pool = None
        self._before_profiler_init = False
        cls._sim._count("CUDAGraph")
        return self

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        """Begin capturing on the current stream (CUDAGraph::capture_begin: not on the default
        stream, not twice on one instance; the mode string is parsed by torch/csrc/cuda/Graph.cpp)."""
        self._sim._c_capture_begin(self, pool, capture_error_mode)

    def capture_end(self) -> None:
        """End the capture (CUDAGraph::capture_end): on the stream it began on; an invalidated
        capture fails with ``cudaErrorStreamCaptureInvalidated``."""
        self._sim._c_capture_end(self)

    def instantiate(self) -> None:
        """Nothing to do: the simulated graph is always instantiated at ``capture_end``."""
        self._sim._count("CUDAGraph.instantiate")

    def replay(self) -> None:
        """Queue the captured work on the current stream of the capture device (CUDAGraph::replay)."""
        self._sim._c_graph_replay(self)

    def reset(self) -> None:
        """Drop the captured graph (CUDAGraph::reset)."""
        self._sim._count("CUDAGraph.reset")
        with self._sim._lock:
            if self._state is _GraphState.CAPTURED:
                self._state = _GraphState.EMPTY
                self._ops = []

    def pool(self) -> tuple[int, int]:
        """The graph's memory pool id (CUDAGraph::pool needs a successful capture)."""
        self._sim._count("CUDAGraph.pool")
        if self._state is not _GraphState.CAPTURED or self._pool is None:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool

    def enable_debug_mode(self) -> None:
        """Not simulated."""
        raise NotImplementedError("simulated CUDA: CUDAGraph.enable_debug_mode is not simulated")

    def debug_dump(self, debug_path: str) -> None:
        """Not simulated."""
        raise NotImplementedError("simulated CUDA: CUDAGraph.debug_dump is not simulated")

    def raw_cuda_graph(self) -> int:
        """Not simulated."""
        raise NotImplementedError("simulated CUDA: CUDAGraph.raw_cuda_graph is not simulated")


class SimGraphContext:
    """``torch.cuda.graph``: the capture context manager, step for step as torch/cuda/graphs.py.

    On entry: ``torch.cuda.synchronize()``, ``torch.cuda.empty_cache()``, the capture stream made
    current, then ``self.cuda_graph.capture_begin(...)`` through the instance (so a wrapper put on
    ``torch.cuda.CUDAGraph.capture_begin`` sees it). On exit: ``capture_end()``, stream restored.

    Example:
        >>> import torch
        >>> from gpuprobe.testing.simcuda import simulated_cuda
        >>> with simulated_cuda() as sim:
        ...     g = torch.cuda.CUDAGraph()
        ...     with torch.cuda.graph(g):
        ...         captured = sim.launch(1000, "step")
        ...     g.replay()
        ...     (captured, sim.stats.kernels_launched)
        (None, 1)
    """

    default_capture_stream: ClassVar[Any] = None

    def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global",
                 enable_annotations: bool = False, check_input_liveness: bool = False) -> None:
        torch = _torch()
        if stream is None and self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = torch.cuda.Stream()
        self.pool: tuple[Any, ...] = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = torch.cuda.stream(self.capture_stream)
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode
        self._enable_annotations = enable_annotations
        self.check_input_liveness = check_input_liveness

    def __enter__(self) -> None:
        torch = _torch()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        # torch._C._host_emptyCache() (the pinned host allocator) is not simulated.
        if self._enable_annotations:
            raise NotImplementedError("simulated CUDA: graph(enable_annotations=True) is not simulated")
        self.stream_ctx.__enter__()
        self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode,
                                      check_input_liveness=self.check_input_liveness)

    def __exit__(self, *args: object) -> None:
        self.cuda_graph.capture_end()
        self.stream_ctx.__exit__(*args)


class SimDeviceContext:
    """``torch.cuda.device``, as torch/cuda/__init__.py: ``_exchange_device`` on entry,
    ``_maybe_exchange_device`` on exit (no-op for a negative index or None)."""

    _sim: ClassVar[SimulatedCuda]

    def __init__(self, device: Any) -> None:
        self._sim._count("device")
        self.idx = _torch().cuda._utils._get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = _torch().cuda._exchange_device(self.idx)

    def __exit__(self, type: Any, value: Any, traceback: Any) -> Literal[False]:
        self.idx = _torch().cuda._maybe_exchange_device(self.prev_idx)
        return False


class SimStreamContext:
    """``torch.cuda.StreamContext``, as torch/cuda/__init__.py (per thread; a stream of another device
    makes that device current inside the context, as ``_cuda_setStream`` does)."""

    _sim: ClassVar[SimulatedCuda]

    def __init__(self, stream: Any) -> None:
        torch = _torch()
        self._sim._count("StreamContext")
        self.stream = stream
        self.idx = torch.cuda._utils._get_device_index(None, True)
        if self.idx is None:
            self.idx = -1
        self.src_prev_stream: Any = None
        self.dst_prev_stream: Any = None

    def __enter__(self) -> None:
        torch = _torch()
        cur_stream = self.stream
        if cur_stream is None or self.idx == -1:
            return
        self.src_prev_stream = torch.cuda.current_stream(None)
        if self.src_prev_stream.device != cur_stream.device:
            with torch.cuda.device(cur_stream.device):
                self.dst_prev_stream = torch.cuda.current_stream(cur_stream.device)
        torch.cuda.set_stream(cur_stream)

    def __exit__(self, type: Any, value: Any, traceback: Any) -> None:
        torch = _torch()
        cur_stream = self.stream
        if cur_stream is None or self.idx == -1:
            return
        if self.src_prev_stream.device != cur_stream.device:
            torch.cuda.set_stream(self.dst_prev_stream)
        torch.cuda.set_stream(self.src_prev_stream)


class _CudaError:
    """``torch.cuda.cudart().cudaError``: the values ``torch.cuda.check_error`` compares with."""

    success = 0
    not_ready = 34


class SimCudart:
    """``torch.cuda.cudart()``: the CUDA runtime calls torch exposes (torch/csrc/cuda/shared/cudart.cpp)."""

    cudaError = _CudaError

    def __init__(self, sim: SimulatedCuda) -> None:
        self._sim = sim

    def cudaProfilerStart(self) -> int:
        """Starts an attached profiler's collection (nsys); a no-op without one. Counted."""
        with self._sim._lock:
            self._sim.stats.calls["cudart.cudaProfilerStart"] += 1
            self._sim.stats.profiler_api_starts += 1
        return 0

    def cudaProfilerStop(self) -> int:
        """Stops an attached profiler's collection; a no-op without one. Counted."""
        with self._sim._lock:
            self._sim.stats.calls["cudart.cudaProfilerStop"] += 1
            self._sim.stats.profiler_api_stops += 1
        return 0

    def cudaMemGetInfo(self, device: int) -> tuple[int, int]:
        """(free, total) bytes of a device: total minus what the process has reserved."""
        return self._sim._c_mem_get_info(int(device))

    def cudaGetErrorString(self, error: int) -> str:
        for code, text in _CUDA_ERRORS.values():
            if code == int(error):
                return text
        return "no error" if int(error) == 0 else "unknown error"


# ---------------------------------------------------------------------------------------------------
# Profiler results
# ---------------------------------------------------------------------------------------------------


class _SimKinetoEvent:
    """A GPU-side (or CUDA runtime) record of a simulated profiling session: the data only.

    The events a session hands out are of a subclass made by :func:`_kineto_event_class` for the
    installed torch, with exactly the public methods of its ``torch._C._autograd._KinetoEvent``
    (torch 2.11's has no ``activity_type()``, 2.13's has), taken from :class:`_SimKinetoEventMethods`.
    """

    __slots__ = ("_name", "_activity", "_device_type", "_device", "_resource", "_start", "_end", "_tid",
                 "_corr", "_nbytes")

    def __init__(self, name: str, activity: str, device_type: Any, device: int, resource: int, start: int, end: int,
                 tid: int, corr: int, nbytes: int) -> None:
        self._name = name
        self._activity = activity
        self._device_type = device_type
        self._device = device
        self._resource = resource
        self._start = start
        self._end = end
        self._tid = tid
        self._corr = corr
        self._nbytes = nbytes

    def __repr__(self) -> str:
        return f"<simulated _KinetoEvent {self._activity} {self._name!r} {self._end - self._start} ns>"


class _SimKinetoEventMethods:
    """``_KinetoEvent``'s methods over :class:`_SimKinetoEvent`'s data, for every torch release the
    simulation follows (2.11 to 2.13); never instantiated: :func:`_kineto_event_class` copies those the
    installed torch's class has."""

    _name: str
    _activity: str
    _device_type: Any
    _device: int
    _resource: int
    _start: int
    _end: int
    _tid: int
    _corr: int
    _nbytes: int

    def name(self) -> str:
        return self._name

    def overload_name(self) -> str:
        return ""

    def device_type(self) -> Any:
        """``DeviceType.CUDA`` for every GPU-side record: kernels, memcpy, memset, GPU user
        annotations and sync records; ``DeviceType.CPU`` for CUDA runtime calls."""
        return self._device_type

    def activity_type(self) -> str:
        return self._activity

    def device_index(self) -> int:
        return self._device

    def device_resource_id(self) -> int:
        return self._resource

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._end

    def duration_ns(self) -> int:
        return self._end - self._start

    def start_thread_id(self) -> int:
        return self._tid

    def end_thread_id(self) -> int:
        return self._tid

    def fwd_thread_id(self) -> int:
        return 0

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        return 0

    def external_id(self) -> int:
        return 0

    def is_async(self) -> bool:
        return False

    def is_user_annotation(self) -> bool:
        return self._activity == GPU_USER_ANNOTATION

    def is_python_function(self) -> bool:
        return False

    def is_hidden_event(self) -> bool:
        return False

    def shapes(self) -> list[Any]:
        return []

    def dtypes(self) -> list[str]:
        return []

    def concrete_inputs(self) -> list[Any]:
        return []

    def kwinputs(self) -> dict[str, Any]:
        return {}

    def stack(self) -> list[str]:
        return []

    def scope(self) -> int:
        return 0

    def sequence_nr(self) -> int:
        return -1

    def flops(self) -> int:
        return 0

    def nbytes(self) -> int:
        return self._nbytes

    def cuda_elapsed_us(self) -> int:
        return -1

    def privateuse1_elapsed_us(self) -> int:
        return -1

    def metadata_json(self) -> str:
        return ""

    def typed_metadata(self) -> dict[str, Any]:  # torch 2.15: the metadata as a dict (none here)
        return {}

    def extra_meta(self) -> dict[str, str]:
        return {}

    def flow_id(self) -> int:
        return 0

    def flow_type(self) -> int:
        return 0

    def flow_start(self) -> bool:
        return False

    def structured_input_shapes(self) -> list[Any]:
        return []

    def structured_input_strides(self) -> list[Any]:
        return []

    def python_id(self) -> int:
        return 0

    def python_parent_id(self) -> int:
        return 0

    def python_module_id(self) -> int:
        return 0


# The torch releases whose profiler the simulated one was run against (tests/simcuda), and the oldest
# it installs on: torch 2.2's profiler computes its events on exit and gives kineto times in
# microseconds, and much else of the simulation (torch.AcceleratorError, ...) is newer than 2.2.
_PROFILER_CHECKED_ON = "2.11.0, 2.13.0 and 2.15.0"
_OLDEST_TORCH = (2, 11)
# The simulated event class made for each torch _KinetoEvent class (a stand-in of another release's
# shape included), so that events of one session share one class.
_EVENT_CLASSES: weakref.WeakKeyDictionary[type, type[_SimKinetoEvent]] = weakref.WeakKeyDictionary()


def _kineto_event_class(torch: Any) -> type[_SimKinetoEvent]:
    """A :class:`_SimKinetoEvent` class with exactly the public methods of ``torch._C._autograd._KinetoEvent``.

    Code that asks what the events offer (``hasattr(event, "activity_type")``) gets the answer the
    installed torch would give. A method the simulation does not know (a torch newer than it) raises
    ``NotImplementedError`` naming it when called.

    Raises:
        RuntimeError: torch has no ``_KinetoEvent`` (the simulated profiler cannot imitate its events).
    """
    real = getattr(getattr(torch._C, "_autograd", None), "_KinetoEvent", None)
    if not isinstance(real, type):
        raise RuntimeError(f"simulated CUDA: torch {torch.__version__} has no torch._C._autograd._KinetoEvent; "
                           f"the simulated profiler imitates the kineto events of torch {_PROFILER_CHECKED_ON}")
    cls = _EVENT_CLASSES.get(real)
    if cls is None:
        known = {n: f for n, f in vars(_SimKinetoEventMethods).items() if not n.startswith("_") and callable(f)}
        ns: dict[str, Any] = {"__slots__": (), "__module__": __package__, "__qualname__": "_KinetoEvent",
                              "__doc__": f"A simulated record shaped as torch {torch.__version__}'s _KinetoEvent."}
        for name in dir(real):
            if not name.startswith("_"):
                ns[name] = known.get(name) or _not_simulated(name, str(torch.__version__))
        cls = _EVENT_CLASSES[real] = type("_KinetoEvent", (_SimKinetoEvent,), ns)
    return cls


def _not_simulated(method: str, version: str) -> Callable[..., NoReturn]:
    def missing(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"simulated CUDA: _KinetoEvent.{method}() of torch {version} is not simulated "
                                  f"(the simulated profiler imitates torch {_PROFILER_CHECKED_ON})")
    missing.__name__ = method
    return missing


class _SimProfilerResult:
    """``prof.profiler.kineto_results``: the CPU session's results (if any) plus the GPU records."""

    def __init__(self, real: Any, gpu: list[_SimKinetoEvent], trace_start_ns: int, sim: SimulatedCuda) -> None:
        self._real = real
        self._gpu = gpu
        self._trace_start_ns = trace_start_ns
        self._sim = sim

    def events(self) -> list[Any]:
        cpu = list(self._real.events()) if self._real is not None else []
        return cpu + list(self._gpu)

    def trace_start_ns(self) -> int:
        return self._real.trace_start_ns() if self._real is not None else self._trace_start_ns

    def legacy_events(self) -> list[Any]:
        return self._real.legacy_events() if self._real is not None else []

    def experimental_event_tree(self) -> list[Any]:
        return self._real.experimental_event_tree() if self._real is not None else []

    def save(self, path: str) -> None:
        """Write a kineto-style chrome trace: the CPU trace (if any) with the GPU records added."""
        if self._real is not None:
            self._real.save(path)
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        else:
            data = {"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms",
                    "baseTimeNanoseconds": (self._trace_start_ns // 10**9) * 10**9, "traceEvents": []}
        base = int(data.get("baseTimeNanoseconds", 0))
        data["deviceProperties"] = self._sim._kineto_device_properties()
        events = data.setdefault("traceEvents", [])
        pid = os.getpid()
        seen: set[tuple[int, int]] = set()
        for ev in self._gpu:
            ts = round((ev._start - base) / 1000.0, 3)
            dur = round((ev._end - ev._start) / 1000.0, 3)
            if ev._device_type == _torch().autograd.DeviceType.CPU:
                events.append({"ph": "X", "cat": ev._activity, "name": ev._name, "pid": pid, "tid": ev._resource,
                               "ts": ts, "dur": dur, "args": {"correlation": ev._corr}})
                continue
            args: dict[str, Any] = {"device": ev._device, "context": 1, "stream": ev._resource,
                                    "correlation": ev._corr}
            if ev._activity == KERNEL:
                args.update({"External id": 0, "queued": 0, "registers per thread": 0, "shared memory": 0,
                             "blocks per SM": 0.0, "warps per SM": 0.0, "grid": [1, 1, 1], "block": [1, 1, 1],
                             "est. achieved occupancy %": 0})
            elif ev._activity in (GPU_MEMCPY, GPU_MEMSET):
                secs = max(ev._end - ev._start, 1) / 1e9
                args.update({"bytes": ev._nbytes, "memory bandwidth (GB/s)": ev._nbytes / secs / 1e9})
            elif ev._activity == GPU_USER_ANNOTATION:
                args = {"External id": ev._corr}
            events.append({"ph": "X", "cat": ev._activity, "name": ev._name, "pid": ev._device,
                           "tid": ev._resource, "ts": ts, "dur": dur, "args": args})
            seen.add((ev._device, ev._resource))
        for device in sorted({d for d, _ in seen}):
            events.append({"name": "process_name", "ph": "M", "ts": 0, "pid": device, "tid": 0,
                           "args": {"name": "python"}})
            events.append({"name": "process_labels", "ph": "M", "ts": 0, "pid": device, "tid": 0,
                           "args": {"labels": f"GPU {device}"}})
            events.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": device, "tid": 0,
                           "args": {"sort_index": 5000000 + device}})
        for device, stream in sorted(seen):
            events.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": device, "tid": stream,
                           "args": {"name": f"stream {stream} "}})
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f)

    def __getattr__(self, name: str) -> Any:
        real = self.__dict__.get("_real")
        if real is None:
            raise AttributeError(f"simulated kineto results have no attribute {name!r}")
        return getattr(real, name)


def _wants_cuda(torch: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``torch.profiler.profile(**kwargs)`` would trace CUDA (profiler.py ``profile.__init__``)."""
    act = torch.profiler.ProfilerActivity
    activities = kwargs.get("activities")
    if activities is None:
        wanted = {act.CPU, act.CUDA}  # supported_activities() on a machine with CUDA
    else:
        wanted = set()
        for item in activities:
            if isinstance(item, dict):
                wanted.update(item.keys())
            else:
                wanted.add(item)
    use_cuda = kwargs.get("use_cuda")
    if use_cuda is True:
        wanted.add(act.CUDA)
    elif use_cuda is False:
        wanted.discard(act.CUDA)
    return act.CUDA in wanted


def _torch_release(torch: Any) -> tuple[int, int]:
    """(major, minor) of ``torch.__version__``; (0, 0) when it does not start with them."""
    parts = str(torch.__version__).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def _sync_events_field(torch: Any) -> int | None:
    """Where ``enable_cuda_sync_events`` sits in ``_ExperimentalConfig.__getstate__()`` (4 in torch 2.11
    and 2.13; 3 in 2.2), found by setting it; None where this torch cannot set it."""
    config = torch._C._profiler._ExperimentalConfig
    try:
        off, on = config().__getstate__(), config(enable_cuda_sync_events=True).__getstate__()
    except Exception:
        return None
    changed = [i for i, (a, b) in enumerate(zip(off, on)) if a != b]
    return changed[0] if len(changed) == 1 else None


def _make_profiler_classes(sim: SimulatedCuda, real_profile: type, real_record_function: type) -> tuple[type, type]:
    """``torch.profiler.profile`` and ``record_function`` for this simulation (subclasses of torch's).

    What differs between torch releases is looked up here, once per install: the kineto event class
    (:func:`_kineto_event_class`), the position of ``enable_cuda_sync_events`` in an
    ``_ExperimentalConfig``, and whether profiles take ``activity_filters`` (torch 2.13, not 2.11).

    Raises:
        RuntimeError: torch is older than the simulated profiler follows, or its profiler lacks what the
            simulation drives (the message names it and the releases the simulated profiler was checked on).
    """
    import inspect  # noqa: PLC0415 (used at install only)

    torch = _torch()
    autograd_profiler = torch.autograd.profiler
    act = torch.profiler.ProfilerActivity
    if _torch_release(torch) < _OLDEST_TORCH:
        raise RuntimeError(f"simulated CUDA needs torch>={'.'.join(map(str, _OLDEST_TORCH))}: its profiler imitates "
                           f"torch {_PROFILER_CHECKED_ON}, and torch {torch.__version__} is installed")
    missing = [m for m in ("prepare_trace", "start_trace", "stop_trace")
               if not callable(getattr(real_profile, m, None))]
    if missing:
        raise RuntimeError(f"simulated CUDA: torch {torch.__version__}'s torch.profiler.profile has no "
                           f"{', '.join(missing)}; the simulated profiler imitates torch {_PROFILER_CHECKED_ON}")
    _kineto_event_class(torch)  # refuses, now, a torch without _KinetoEvent
    sync_field = _sync_events_field(torch)
    takes_filters = "activity_filters" in inspect.signature(autograd_profiler.profile.__init__).parameters

    class record_function(real_record_function):  # type: ignore[misc, valid-type]
        """torch.autograd.profiler.record_function, also telling the simulation which range is open
        (kineto turns the innermost one around GPU work into a ``gpu_user_annotation``)."""

        def __enter__(self) -> Any:
            out = super().__enter__()
            sim._annotation_enter(self)
            return out

        def __exit__(self, *exc: Any) -> Any:
            sim._annotation_exit(self)
            return super().__exit__(*exc)

    class profile(real_profile):  # type: ignore[misc, valid-type]
        """torch.profiler.profile; with CUDA among the activities, a simulated CUDA session.

        The schedule, ``step()``, ``on_trace_ready`` and CPU tracing are torch's own; the CUDA part
        (GPU records, the synchronization on exit, one session per process) is simulated.
        """

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if args or not _wants_cuda(torch, kwargs):
                return real_profile(*args, **kwargs)
            return object.__new__(cls)

        def __init__(self, *, activities: Any = None, **kwargs: Any) -> None:
            if activities is None:
                activities = [act.CPU, act.CUDA]
            super().__init__(activities=activities, **kwargs)
            if kwargs.get("use_cuda") is True:
                self.activities.add(act.CUDA)
            self._sim_cpu = bool(self.activities - {act.CUDA})
            cfg = self.experimental_config
            self._sim_sync_events = bool(cfg is not None and sync_field is not None and cfg.__getstate__()[sync_field])
            filters = getattr(self, "activity_filters", None)  # torch 2.13's {activity: [names]}
            if filters is None:  # torch 2.15: {activity: ProfilerActivityConfig(activity_types=[names])}
                configs = getattr(self, "activity_configs", None) or {}
                filters = {a: c.activity_types for a, c in configs.items()
                           if getattr(c, "activity_types", None) is not None}
            self._sim_filters = dict(filters or {})
            flt = self._sim_filters.get(act.CUDA)
            self._sim_allowed = None if flt is None else frozenset(flt)

        def prepare_trace(self) -> None:
            sim._profiler_prepare(self, self._sim_cpu, self._sim_sync_events, self._sim_allowed)
            try:
                extra = {}
                if takes_filters:
                    extra["activity_filters"] = {k: v for k, v in self._sim_filters.items() if k != act.CUDA} or None
                self.profiler = autograd_profiler.profile(
                    use_cpu=True, use_device=None, record_shapes=self.record_shapes, with_flops=self.with_flops,
                    profile_memory=self.profile_memory, with_stack=self.with_stack, with_modules=self.with_modules,
                    use_kineto=True, experimental_config=self.experimental_config, acc_events=self.acc_events,
                    custom_trace_id_callback=self.custom_trace_id_callback,
                    post_processing_timeout_s=self.post_processing_timeout_s, **extra)
                if self._sim_cpu:
                    self.profiler._prepare_trace()
            except BaseException:
                sim._profiler_release(self)
                raise

        def start_trace(self) -> None:
            if self._sim_cpu:
                super().start_trace()
            elif self.execution_trace_observer:
                self.execution_trace_observer.start()
            sim._profiler_start(self)

        def stop_trace(self) -> None:
            if self.execution_trace_observer:
                self.execution_trace_observer.stop()
            # torch/autograd/profiler.py profile.__exit__: use_device "cuda" -> torch.cuda.synchronize()
            # before the session is disabled.
            torch.cuda.synchronize()
            real = None
            if self._sim_cpu:
                self.profiler.__exit__(None, None, None)
                real = self.profiler.kineto_results
            gpu, trace_start = sim._profiler_stop(self)
            if not self._sim_cpu:
                self.profiler._function_events = None
                self.profiler._needs_processing = True
            # Set only now: an autograd profile created with use_device="cuda" would take torch's
            # legacy CUDA path on a CPU build. With it, key_averages() reports device time.
            self.profiler.use_device = "cuda"
            self.profiler.kineto_results = _SimProfilerResult(real, gpu, trace_start, sim)

    return profile, record_function


# ---------------------------------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------------------------------


class SimulatedCuda:
    """A simulated set of CUDA devices behind ``torch.cuda``; install it, or use :func:`simulated_cuda`.

    Args:
        devices: number of devices.
        memory_per_device: bytes of memory of each device.
        cpu_tensors_on: when set, gpuprobe sees every CPU tensor not placed with :meth:`place` as
            living on ``cuda:cpu_tensors_on``.

    Example:
        >>> import torch
        >>> from gpuprobe.testing.simcuda import SimulatedCuda
        >>> sim = SimulatedCuda(devices=1).install()
        >>> try:
        ...     handle = sim.allocate(1000)
        ...     used = torch.cuda.memory_allocated()
        ... finally:
        ...     sim.uninstall()
        >>> used
        1024
    """

    def __init__(self, devices: int = 2, *, memory_per_device: int = 80 * 2**30,
                 cpu_tensors_on: int | None = None) -> None:
        if not isinstance(devices, int) or devices < 1:
            raise ValueError(f"simulated CUDA: devices must be a positive int, got {devices!r}")
        if memory_per_device <= 0:
            raise ValueError(f"simulated CUDA: memory_per_device must be positive, got {memory_per_device!r}")
        if cpu_tensors_on is not None and not 0 <= cpu_tensors_on < devices:
            raise ValueError(f"simulated CUDA: cpu_tensors_on={cpu_tensors_on!r} is not a device of {devices}")
        self.devices = devices
        self.memory_per_device = int(memory_per_device)
        self.cpu_tensors_on = cpu_tensors_on
        self.stats = SimStats()
        self._lock = threading.RLock()
        self._tls = _ThreadState()
        ns = {"_sim": self, "__module__": __package__}
        self._Stream: type[SimStream] = type("Stream", (SimStream,), dict(ns, __qualname__="Stream"))
        self._Event: type[SimEvent] = type("Event", (SimEvent,), dict(ns, __qualname__="Event"))
        self._Graph: type[SimCUDAGraph] = type("CUDAGraph", (SimCUDAGraph,), dict(ns, __qualname__="CUDAGraph"))
        self._GraphCtx: type[SimGraphContext] = type(
            "graph", (SimGraphContext,), dict(ns, __qualname__="graph", default_capture_stream=None))
        self._DeviceCtx: type[SimDeviceContext] = type("device", (SimDeviceContext,), dict(ns, __qualname__="device"))
        self._StreamCtx: type[SimStreamContext] = type(
            "StreamContext", (SimStreamContext,), dict(ns, __qualname__="StreamContext"))
        self._devices = [_Device(self, i) for i in range(devices)]
        self._properties = [SimDeviceProperties(total_memory=self.memory_per_device,
                                                uuid=f"00000000-0000-0000-0000-{i:012d}", pci_bus_id=i)
                            for i in range(devices)]
        self._cudart = SimCudart(self)
        self._seeds = [67280421310721] * devices  # c10 default_rng_seed_val
        self._initialized = False
        self._fork_poisoned = False
        self._in_bad_fork = False
        self._sync_debug_mode = 0
        self._sync_warned = False
        self._captures: list[SimCUDAGraph] = []
        self._pool_ids = itertools.count(1)
        self._handles = itertools.count(0x10000)
        self._correlations = itertools.count(1)
        self._thread_ids: dict[int, int] = {}
        self._blocks: dict[int, _Block] = {}
        self._history = _History()
        self._traces: list[collections.deque[dict[str, Any]]] = [collections.deque() for _ in range(devices)]
        self._session: _Session | None = None
        self._cupti_initialized = False
        self._placed: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._placed_storage: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._oom_observers: list[Callable[[int, int, int, int], object]] = []
        self._saved: list[tuple[Any, str, Any]] = []
        self._prev_resolver: Any = None
        self._installed = False

    # ------------------------------------------------------------------ install / uninstall

    @property
    def installed(self) -> bool:
        """Whether this simulation is installed now."""
        return self._installed

    def install(self, *, as_machine: bool = False) -> SimulatedCuda:
        """Replace the ``torch.cuda`` attributes with the simulation's; returns ``self``.

        Args:
            as_machine: install it as the process's own CUDA, what a CUDA build of torch on a GPU
                machine offers, for a whole test run (``pytest --simulate-gpu``). Another simulation
                can then be installed over it, as over real CUDA: that one saves and puts back this
                one's attributes. At most one machine simulation, installed before any other.

        Raises:
            RuntimeError: a simulated CUDA (this one or another) is already installed; for
                ``as_machine``, any simulation is installed.
        """
        global _ACTIVE, _MACHINE
        torch = _torch()
        import torch.autograd.profiler  # noqa: F401, PLC0415
        import torch.cuda.graphs  # noqa: F401, PLC0415
        import torch.cuda.memory  # noqa: F401, PLC0415
        import torch.cuda.random  # noqa: F401, PLC0415
        import torch.cuda.streams  # noqa: F401, PLC0415
        import torch.profiler  # noqa: F401, PLC0415
        import torch.profiler._utils  # noqa: F401, PLC0415
        import torch.profiler.profiler  # noqa: F401, PLC0415

        from ... import _placement

        with _REGISTRY_LOCK:
            taken = _ACTIVE if _ACTIVE is not None else (_MACHINE if as_machine or _MACHINE is self else None)
            if taken is not None:
                who = "this simulation" if taken is self else "another SimulatedCuda"
                raise RuntimeError(f"simulated CUDA is already installed ({who}); uninstall it first: "
                                   "installs cannot be nested or overlap")
            self._GraphCtx.default_capture_stream = None
            patches = self._patches(torch)
            saved: list[tuple[Any, str, Any]] = []
            try:
                for target, name, value in patches:
                    saved.append((target, name, vars(target).get(name, _MISSING)))
                    setattr(target, name, value)
            except BaseException:
                self._restore(saved)
                raise
            self._saved = saved
            self._prev_resolver = _placement.set_device_resolver(self.device_of)
            self._installed = True
            if as_machine:
                _MACHINE = self
            else:
                _ACTIVE = self
        return self

    def uninstall(self) -> None:
        """Put every replaced attribute back (the original objects; an attribute that was absent is
        deleted) and the previous device resolver.

        Raises:
            RuntimeError: this simulation is not installed; or it is the machine simulation and
                another one is still installed over it.
        """
        global _ACTIVE, _MACHINE
        from ... import _placement

        with _REGISTRY_LOCK:
            if _ACTIVE is not self and _MACHINE is not self:
                raise RuntimeError("simulated CUDA: this simulation is not installed")
            if _MACHINE is self and _ACTIVE is not None:
                raise RuntimeError("simulated CUDA: another simulation is installed over this machine "
                                   "simulation; uninstall that one first")
            try:
                self._restore(self._saved)
            finally:
                self._saved = []
                _placement.set_device_resolver(self._prev_resolver)
                self._prev_resolver = None
                self._installed = False
                self._GraphCtx.default_capture_stream = None
                if _MACHINE is self:
                    _MACHINE = None
                else:
                    _ACTIVE = None

    @staticmethod
    def _restore(saved: list[tuple[Any, str, Any]]) -> None:
        for target, name, original in reversed(saved):
            if original is _MISSING:
                if name in vars(target):
                    delattr(target, name)
            else:
                setattr(target, name, original)

    def __enter__(self) -> SimulatedCuda:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def patched_attributes(self) -> list[tuple[Any, str]]:
        """(object, attribute name) of everything :meth:`install` replaced (empty when not installed)."""
        return [(target, name) for target, name, _ in self._saved]

    def _torch_own(self, target: Any, name: str) -> Any:
        """``target.name`` as torch defines it: under a machine simulation, what that one replaced."""
        machine = _MACHINE
        if machine is not None and machine is not self:
            for t, n, original in machine._saved:
                if t is target and n == name and original is not _MISSING:
                    return original
        return getattr(target, name)

    def _patches(self, torch: Any) -> list[tuple[Any, str, Any]]:
        api = _make_api(self, torch)
        # The profiler classes subclass torch's, not a machine simulation's.
        profile_cls, record_function_cls = _make_profiler_classes(
            self, self._torch_own(torch.profiler.profiler, "profile"),
            self._torch_own(torch.autograd.profiler, "record_function"))
        cuda, memory, graphs, streams = torch.cuda, torch.cuda.memory, torch.cuda.graphs, torch.cuda.streams
        cuda_names = [
            "is_available", "device_count", "is_initialized", "init", "_lazy_init", "_is_in_bad_fork",
            "current_device", "set_device", "_exchange_device", "_maybe_exchange_device", "get_device_name",
            "get_device_capability", "get_device_properties", "synchronize", "current_stream", "default_stream",
            "set_stream", "_set_stream_by_id", "stream", "graph_pool_handle", "is_current_stream_capturing",
            "set_sync_debug_mode", "get_sync_debug_mode", "cudart", "empty_cache", "memory_stats",
            "memory_stats_as_nested_dict", "memory_allocated", "memory_reserved", "max_memory_allocated",
            "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
            "reset_accumulated_memory_stats", "mem_get_info", "memory_snapshot", "_sleep",
        ]
        memory_names = [
            "_lazy_init", "is_initialized", "empty_cache", "memory_stats", "memory_stats_as_nested_dict",
            "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
            "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats",
            "mem_get_info", "memory_snapshot", "_record_memory_history", "_snapshot", "_dump_snapshot",
        ]
        out: list[tuple[Any, str, Any]] = [(cuda, n, api[n]) for n in cuda_names]
        out += [
            (cuda, "_cudart", self._cudart),
            (cuda, "device", self._DeviceCtx),
            (cuda, "StreamContext", self._StreamCtx),
            (cuda, "Stream", self._Stream),
            (cuda, "Event", self._Event),
            (cuda, "CUDAGraph", self._Graph),
            (cuda, "graph", self._GraphCtx),
            (streams, "Stream", self._Stream),
            (streams, "Event", self._Event),
            (graphs, "CUDAGraph", self._Graph),
            (graphs, "graph", self._GraphCtx),
            (graphs, "graph_pool_handle", api["graph_pool_handle"]),
            (graphs, "is_current_stream_capturing", api["is_current_stream_capturing"]),
        ]
        out += [(memory, n, api[n]) for n in memory_names]
        rng_names = ["manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]
        out += [(cuda, n, api[n]) for n in rng_names] + [(torch.cuda.random, n, api[n]) for n in rng_names]
        out += [
            (torch.profiler, "profile", profile_cls),
            (torch.profiler.profiler, "profile", profile_cls),
            (torch.profiler, "record_function", record_function_cls),
            (torch.autograd.profiler, "record_function", record_function_cls),
            (torch.profiler._utils, "_init_for_cuda_graphs", api["_init_for_cuda_graphs"]),
            (torch._C, "_cuda_attach_out_of_memory_observer", api["_cuda_attach_out_of_memory_observer"]),
        ]
        autograd = torch._C._autograd
        real_enabled = getattr(autograd, "_profiler_enabled", None)
        if real_enabled is not None:
            sim = self

            # torch sets the profiler state of the thread that starts a session, whatever its activities:
            # a CUDA-only session (simulated here, without torch's own profiler) is enabled on that thread.
            def _profiler_enabled() -> bool:
                session = sim._session
                if session is not None and session.recording and session.start_thread == threading.get_ident():
                    return True
                return bool(real_enabled())

            out.append((autograd, "_profiler_enabled", _profiler_enabled))
        return out

    # ------------------------------------------------------------------ statistics

    @property
    def calls(self) -> Counter[str]:
        """Calls of each simulated API by attribute name (the same Counter as ``stats.calls``)."""
        return self.stats.calls

    def reset_stats(self) -> None:
        """Zero every counter of :attr:`stats` (the simulated devices keep their state)."""
        with self._lock:
            self.stats = SimStats()

    def _count(self, name: str) -> None:
        with self._lock:
            self.stats.calls[name] += 1

    # ------------------------------------------------------------------ test drivers

    def now_ns(self, device: int | None = None) -> int:
        """The simulated clock of ``device`` (default: the calling thread's current device), in ns."""
        with self._lock:
            return self._dev(self._tls.device if device is None else device).now_ns

    def advance(self, ns: int) -> None:
        """Let ``ns`` nanoseconds pass on every device (work that ends by then completes)."""
        if ns < 0:
            raise ValueError(f"simulated CUDA: cannot advance by a negative time ({ns} ns)")
        with self._lock:
            for dev in self._devices:
                dev.now_ns += int(ns)

    def finish(self, device: int | None = None) -> None:
        """Let ``device`` (default: all) run all queued work, without a host synchronization."""
        with self._lock:
            devs = self._devices if device is None else [self._dev(device)]
            for dev in devs:
                dev.now_ns = max([dev.now_ns] + [s._busy_until for s in dev.streams()])

    def launch(self, ns: int, name: str = "kernel", stream: Any = None, *, kind: str = KERNEL,
               nbytes: int = 0) -> KernelRecord | None:
        """Queue GPU work of ``ns`` nanoseconds; the host returns at once.

        It starts at ``max(device clock, end of the stream's earlier work)``. Like creating a CUDA
        tensor, a launch initializes CUDA. On a capturing stream the work goes into the graph.

        Args:
            ns: duration on the device.
            name: the kernel's name (as the profiler shows it).
            stream: a simulated stream; default: the current stream of the current device.
            kind: ``"kernel"``, ``"gpu_memcpy"`` or ``"gpu_memset"``.
            nbytes: bytes moved (memcpy/memset), for the profiler.

        Returns:
            The queued work's times, or None when it was captured into a graph.

        Example:
            >>> from gpuprobe.testing.simcuda import simulated_cuda
            >>> with simulated_cuda() as sim:
            ...     a = sim.launch(1_000, "a")
            ...     b = sim.launch(500, "b")          # same stream: after a
            ...     (a.end_ns, b.start_ns, b.end_ns, sim.now_ns())
            (1000, 1000, 1500, 0)
        """
        if kind not in _LAUNCH_KINDS:
            raise ValueError(f"simulated CUDA: kind must be one of {sorted(_LAUNCH_KINDS)}, got {kind!r}")
        if ns < 0:
            raise ValueError(f"simulated CUDA: a launch cannot last {ns} ns")
        torch = _torch()
        torch.cuda._lazy_init()
        t0 = time.time_ns()
        with self._lock:
            target = self._resolve_stream(stream)
            return self._enqueue(target, _Op(name, kind, int(ns), int(nbytes)), t0)

    def memcpy_and_sync(self, ns: int = 2000, nbytes: int = 8, stream: Any = None) -> None:
        """A device-to-host copy the host waits for, as ``tensor.item()`` or ``bool(cuda_tensor)`` do
        (c10::cuda::memcpy_and_sync, CUDAFunctions.h: sync debug mode check, then
        ``cudaMemcpyAsync`` and ``cudaStreamSynchronize``). A counted host synchronization.

        Example:
            >>> from gpuprobe.testing.simcuda import simulated_cuda
            >>> with simulated_cuda() as sim:
            ...     _ = sim.launch(10_000)
            ...     sim.memcpy_and_sync(ns=2_000)
            ...     (sim.now_ns(), sim.stats.host_syncs)
            (12000, 1)
        """
        torch = _torch()
        torch.cuda._lazy_init()
        self._sync_debug_check(stacklevel=2)
        t0 = time.time_ns()
        with self._lock:
            target = self._resolve_stream(stream)
            self._check_capture_safe(target)
            self._enqueue(target, _Op("Memcpy DtoH (Device -> Pageable)", GPU_MEMCPY, int(ns), int(nbytes)), t0)
            self._host_wait(target.device_index, target._busy_until, "memcpy_and_sync", "Stream Sync",
                            target._kineto_id, "cudaStreamSynchronize", t0)

    # ------------------------------------------------------------------ memory drivers

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
        torch = _torch()
        if nbytes < 0:
            raise ValueError(f"simulated CUDA: cannot allocate {nbytes} bytes")
        torch.cuda._lazy_init()
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

    # ------------------------------------------------------------------ placement

    def place(self, obj: Any, device: Any) -> Any:
        """Mark a tensor, or every parameter and buffer of an ``nn.Module``, as living on ``cuda:device``.

        Only for gpuprobe's view (``gpuprobe._placement.tensor_device``); the tensors stay on the CPU.
        References are weak. Views, ``.data`` and ``detach()`` of a placed tensor share its storage
        and are placed too. Returns ``obj``.

        Example:
            >>> import torch
            >>> from gpuprobe._placement import tensor_device
            >>> from gpuprobe.testing.simcuda import simulated_cuda
            >>> with simulated_cuda() as sim:
            ...     layer = sim.place(torch.nn.Linear(2, 2), 1)
            ...     tensor_device(layer.weight)
            device(type='cuda', index=1)
        """
        torch = _torch()
        index = self._device_index_arg(device)
        if isinstance(obj, torch.nn.Module):
            tensors = list(obj.parameters()) + list(obj.buffers())
        elif isinstance(obj, torch.Tensor):
            tensors = [obj]
        else:
            raise TypeError(f"simulated CUDA: place() takes a tensor or an nn.Module, got {type(obj).__name__}")
        with self._lock:
            for t in tensors:
                self._place_one(t, index)
        return obj

    def device_of(self, x: Any) -> Any:
        """Where gpuprobe sees ``x``: ``cuda:k`` if placed, ``cuda:cpu_tensors_on`` for other CPU tensors
        when set, else ``x.device``. Installed as gpuprobe's device resolver."""
        torch = _torch()
        if isinstance(x, torch.Tensor):
            index = self._placed_index(x)
            if index is not None:
                return torch.device("cuda", index)
            if self.cpu_tensors_on is not None and x.device.type == "cpu":
                return torch.device("cuda", self.cpu_tensors_on)
        return x.device

    def _device_index_arg(self, device: Any) -> int:
        torch = _torch()
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"simulated CUDA: expected a cuda device, got {device}")
            device = 0 if device.index is None else device.index
        return self._check_device(int(device))

    def _place_one(self, t: Any, index: int) -> None:
        key, ptr = id(t), self._storage_ptr(t)

        def forget(ref: weakref.ref[Any]) -> None:
            with self._lock:
                if self._placed.get(key, (None,))[0] is ref:
                    del self._placed[key]
                if ptr and self._placed_storage.get(ptr, (None,))[0] is ref:
                    del self._placed_storage[ptr]

        ref = weakref.ref(t, forget)
        self._placed[key] = (ref, index)
        if ptr:
            self._placed_storage[ptr] = (ref, index)

    @staticmethod
    def _storage_ptr(t: Any) -> int:
        try:
            return int(t.untyped_storage().data_ptr())
        except Exception:  # meta tensors, tensor subclasses without storage
            return 0

    def _placed_index(self, t: Any) -> int | None:
        with self._lock:
            entry = self._placed.get(id(t))
            if entry is not None and entry[0]() is t:
                return entry[1]
            if not self._placed_storage:
                return None
        ptr = self._storage_ptr(t)
        if not ptr:
            return None
        with self._lock:
            entry = self._placed_storage.get(ptr)
        if entry is None:
            return None
        owner = entry[0]()
        if owner is None or self._storage_ptr(owner) != ptr:
            return None
        return entry[1]

    # ------------------------------------------------------------------ C-level seams: devices

    def _dev(self, device: int) -> _Device:
        if not 0 <= device < self.devices:
            raise ValueError(f"simulated CUDA: no device {device} (there are {self.devices})")
        return self._devices[device]

    def _check_device(self, device: int) -> int:
        if not 0 <= device < self.devices:
            raise _cuda_error("cudaErrorInvalidDevice")
        return device

    def _init(self, caller: str) -> None:
        """torch/cuda/__init__.py _lazy_init, with torch._C._cuda_init simulated."""
        with self._lock:
            self.stats.init_calls += 1
            if self._initialized and not self._in_bad_fork:
                return
            if self._in_bad_fork:
                raise RuntimeError(_FORK_MESSAGE)
            self._initialized = True
            self._fork_poisoned = True
            self.stats.first_init_call = caller

    def _c_set_device(self, device: int) -> None:
        _torch().cuda._lazy_init()  # THCPModule_setDevice_wrap: torch::utils::device_lazy_init
        with self._lock:
            self._tls.device = self._check_device(device)

    def _c_exchange_device(self, device: int) -> int:
        if device < 0:
            return -1
        _torch().cuda._lazy_init()  # THCPModule_exchangeDevice: device_lazy_init first
        with self._lock:
            self._check_device(device)
            prev, self._tls.device = self._tls.device, device
        return prev

    def _c_maybe_exchange_device(self, device: int) -> int:
        if device < 0:
            return -1
        with self._lock:
            self._check_device(device)
            prev, self._tls.device = self._tls.device, device
        return prev

    def _c_mem_get_info(self, device: int) -> tuple[int, int]:
        with self._lock:
            alloc = self._dev(self._check_device(device)).allocator
            return alloc.total - alloc.reserved, alloc.total

    # ------------------------------------------------------------------ C-level seams: streams

    def _stream_index(self, device: int) -> int:
        if not 0 <= device < self.devices:
            raise RuntimeError(f"Device index value {device} is out of index range [0, {self.devices})")
        return device

    def _current_stream(self, device: int) -> SimStream:
        stream = self._tls.streams.get(device)
        return stream if stream is not None else self._devices[device].default

    def _c_current_stream(self, device: int) -> SimStream:
        with self._lock:
            d = self._tls.device if device < 0 else self._stream_index(device)
            return self._current_stream(d)

    def _c_default_stream(self, device: int) -> SimStream:
        with self._lock:
            d = self._tls.device if device < 0 else self._stream_index(device)
            return self._devices[d].default

    def _c_stream_from_pool(self, priority: int) -> SimStream:
        """c10 getStreamFromPool: round-robin over 32 streams of the priority's pool, on the current device."""
        level = min(max(-int(priority), 0), _PRIORITY_LEVELS - 1)
        with self._lock:
            dev = self._devices[self._tls.device]
            pool = dev.pools.setdefault(level, [])
            slot = dev.pool_next[level] % _STREAMS_PER_POOL
            dev.pool_next[level] += 1
            while len(pool) <= slot:
                pool.append(self._Stream._make(self, dev.index, level, len(pool)))
            return pool[slot]

    def _stream_by_id(self, stream_id: int, device: int) -> SimStream:
        with self._lock:
            for s in self._dev(self._stream_index(device)).streams():
                if s.stream_id == stream_id:
                    return s
        raise RuntimeError(f"simulated CUDA: no stream {stream_id} on device {device}")

    def _c_set_stream(self, stream_id: int, device: int) -> None:
        """THCPModule_setStream_wrap: makes the stream's device current, then the stream current on it."""
        stream = self._stream_by_id(stream_id, device)
        with self._lock:
            self._tls.device = stream.device_index
            self._tls.streams[stream.device_index] = stream

    def _resolve_stream(self, stream: Any) -> SimStream:
        if stream is None:
            return self._current_stream(self._tls.device)
        if not isinstance(stream, SimStream) or stream._sim is not self:
            raise TypeError(f"simulated CUDA: expected a stream of this simulation, got {stream!r}")
        return stream

    def _c_stream_query(self, stream: SimStream) -> bool:
        self._count("Stream.query")
        with self._lock:
            self._check_capture_safe(stream)
            return stream._busy_until <= self._devices[stream.device_index].now_ns

    def _c_stream_synchronize(self, stream: SimStream) -> None:
        self._count("Stream.synchronize")
        self._sync_debug_check(stacklevel=3)
        t0 = time.time_ns()
        with self._lock:
            self._check_capture_safe(stream)
            self._host_wait(stream.device_index, stream._busy_until, "Stream.synchronize", "Stream Sync",
                            stream._kineto_id, "cudaStreamSynchronize", t0)

    def _c_device_synchronize(self) -> None:
        """c10::cuda::device_synchronize (cudaDeviceSynchronize): waits for every stream of the current
        device; not checked by the sync debug mode."""
        t0 = time.time_ns()
        with self._lock:
            self._check_capture_safe(None)
            dev = self._devices[self._tls.device]
            until = max(s._busy_until for s in dev.streams())
            self._host_wait(dev.index, until, "synchronize", "Context Sync", -1, "cudaDeviceSynchronize", t0)

    # ------------------------------------------------------------------ time, work and syncs

    def _thread_seq(self) -> int:
        ident = threading.get_ident()
        seq = self._thread_ids.get(ident)
        if seq is None:
            seq = self._thread_ids[ident] = len(self._thread_ids) + 1
        return seq

    def _enqueue(self, stream: SimStream, op: _Op, t0: int) -> KernelRecord | None:
        """Queue one op on a stream (lock held); a capturing stream keeps it for the graph."""
        if stream._capture is not None:
            stream._capture._ops.append(op)
            return None
        dev = self._devices[stream.device_index]
        start = max(dev.now_ns, stream._busy_until)
        end = start + op.ns
        stream._busy_until = end
        self.stats.kernels_launched += 1
        session = self._session
        if session is not None and session.recording:
            corr = next(self._correlations)
            tls = self._tls
            annotation = tls.annotations[-1] if tls.annotations else None
            if session.wants(op.kind):
                session.records.append(_GpuRecord(op.name, op.kind, dev.index, stream._kineto_id, start, end,
                                                  self._thread_seq(), corr, op.nbytes, annotation))
            if session.wants(CUDA_RUNTIME):
                session.records.append(_GpuRecord(_RUNTIME_CALL[op.kind], CUDA_RUNTIME, dev.index,
                                                  threading.get_native_id(), t0, time.time_ns(),
                                                  self._thread_seq(), corr, on_host=True))
        return KernelRecord(op.name, op.kind, dev.index, stream.stream_id, start, end)

    def _host_wait(self, device: int, until: int, api: str, sync_name: str, kineto_stream: int, runtime: str,
                   t0: int) -> None:
        """A host synchronization (lock held): the device's clock reaches ``until``; counted."""
        dev = self._devices[device]
        before = dev.now_ns
        dev.now_ns = max(dev.now_ns, until)
        self.stats.host_syncs += 1
        self.stats.host_syncs_by_api[api] += 1
        session = self._session
        if session is not None and session.recording:
            corr = next(self._correlations)
            if session.wants(CUDA_SYNC):
                session.records.append(_GpuRecord(sync_name, CUDA_SYNC, device, kineto_stream, before, dev.now_ns,
                                                  self._thread_seq(), corr))
            if session.wants(CUDA_RUNTIME):
                session.records.append(_GpuRecord(runtime, CUDA_RUNTIME, device, threading.get_native_id(), t0,
                                                  time.time_ns(), self._thread_seq(), corr, on_host=True))

    def _sync_debug_check(self, stacklevel: int) -> None:
        """c10::cuda::warn_or_error_on_sync: "warn" -> UserWarning, "error" -> RuntimeError."""
        mode = self._sync_debug_mode
        if mode == 2:
            raise RuntimeError(_SYNC_MESSAGE)
        if mode == 1:
            warnings.warn(_SYNC_MESSAGE, UserWarning, stacklevel=stacklevel + 1)

    def _check_capture_safe(self, stream: SimStream | None) -> None:
        """Refuse a call that is unsafe during stream capture (lock held).

        cudaStreamCaptureMode: a thread may not make unsafe calls while it has a capture of its own
        not begun in "relaxed" mode, or while another thread has a capture begun in "global" mode;
        querying or synchronizing a capturing stream is never permitted. The offending call
        invalidates the captures concerned (their ``capture_end`` then fails).
        """
        if not self._captures:
            return
        me = threading.get_ident()
        hit = [g for g in self._captures
               if (g._thread == me and g._mode is not _CaptureMode.RELAXED)
               or (g._thread != me and g._mode is _CaptureMode.GLOBAL)
               or (stream is not None and g._stream is stream)]
        if hit:
            self.stats.unsafe_calls_during_capture += 1
            for g in hit:
                if g._state is _GraphState.CAPTURING:
                    g._state = _GraphState.INVALIDATED
                    self.stats.invalidated_captures += 1
            raise _cuda_error("cudaErrorStreamCaptureUnsupported")

    # ------------------------------------------------------------------ events

    def _c_event_record(self, event: SimEvent, stream: Any) -> None:
        t0 = time.time_ns()
        with self._lock:
            stream = self._resolve_stream(stream)
            if event._device is None:
                event._device = stream.device_index
                event._handle = next(self._handles) << 4
            if event._device != stream.device_index:
                raise RuntimeError(
                    f"Event device {_c10_index(event._device)} does not match recording stream's device "
                    f"{_c10_index(stream.device_index)}.")
            if stream._capture is not None:
                event._captured_by = stream._capture
                return
            event._captured_by = None
            dev = self._devices[stream.device_index]
            event._ts = max(dev.now_ns, stream._busy_until)
            session = self._session
            if session is not None and session.recording and session.wants(CUDA_RUNTIME):
                session.records.append(_GpuRecord("cudaEventRecord", CUDA_RUNTIME, dev.index,
                                                  threading.get_native_id(), t0, time.time_ns(),
                                                  self._thread_seq(), next(self._correlations), on_host=True))

    def _c_event_block(self, event: SimEvent, stream: Any) -> None:
        with self._lock:
            stream = self._resolve_stream(stream)
            if event._device is None or event._captured_by is not None:
                return
            if stream._capture is None:
                stream._busy_until = max(stream._busy_until, event._ts)

    def _event_ready(self, event: SimEvent) -> bool:
        """cudaEventQuery on a created event (lock held)."""
        self._check_capture_safe(None)
        if event._captured_by is not None:
            raise _cuda_error("cudaErrorCapturedEvent")
        assert event._device is not None
        return event._ts <= self._devices[event._device].now_ns

    def _c_event_query(self, event: SimEvent, api: str) -> bool:
        self._count(api)
        with self._lock:
            if event._device is None:
                return True
            return self._event_ready(event)

    def _c_event_elapsed(self, start: SimEvent, end: SimEvent) -> float:
        self._count("Event.elapsed_time")
        if not (start.enable_timing and end.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if start._device is None or end._device is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        with self._lock:
            if not (self._event_ready(start) and self._event_ready(end)):
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
            if start._device != end._device:
                raise _cuda_error("cudaErrorInvalidResourceHandle")
            return _float32((end._ts - start._ts) / 1e6)

    def _c_event_synchronize(self, event: SimEvent) -> None:
        self._count("Event.synchronize")
        t0 = time.time_ns()
        with self._lock:
            if event._device is None:
                return
            self._check_capture_safe(None)
            if event._captured_by is not None:
                raise _cuda_error("cudaErrorCapturedEvent")
            self._host_wait(event._device, event._ts, "Event.synchronize", "Event Sync", _KINETO_DEFAULT_STREAM,
                            "cudaEventSynchronize", t0)

    # ------------------------------------------------------------------ graphs

    def _c_capture_begin(self, graph: SimCUDAGraph, pool: Any, mode: str) -> None:
        self._count("CUDAGraph.capture_begin")
        try:
            parsed = _CaptureMode(mode)
        except ValueError:
            raise RuntimeError("Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got "
                               + str(mode)) from None
        with self._lock:
            if graph._state is _GraphState.CAPTURED:
                raise RuntimeError("This CUDAGraph instance already owns a captured graph. To capture a new "
                                   "graph, create a new instance.")
            stream = self._current_stream(self._tls.device)
            if stream.stream_id == 0:
                raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after "
                                   "capture, it's ok to replay them on the default stream.)")
            if stream._capture is not None:
                raise _cuda_error("cudaErrorStreamCaptureUnsupported")
            graph._state = _GraphState.CAPTURING
            graph._ops = []
            graph._stream = stream
            graph._device = stream.device_index
            graph._mode = parsed
            graph._thread = threading.get_ident()
            graph._pool = tuple(pool) if pool is not None else (next(self._pool_ids), 0)
            graph._before_profiler_init = not self._cupti_initialized
            stream._capture = graph
            self._captures.append(graph)

    def _c_capture_end(self, graph: SimCUDAGraph) -> None:
        self._count("CUDAGraph.capture_end")
        with self._lock:
            stream = self._current_stream(self._tls.device)
            capturing = graph._state in (_GraphState.CAPTURING, _GraphState.INVALIDATED)
            if not capturing or stream is not graph._stream:
                raise RuntimeError("Capture must end on the same stream it began on.")
            if graph._mode is _CaptureMode.THREAD_LOCAL and graph._thread != threading.get_ident():
                raise _cuda_error("cudaErrorStreamCaptureWrongThread")
            stream._capture = None
            self._captures.remove(graph)
            if graph._state is _GraphState.INVALIDATED:
                graph._state = _GraphState.EMPTY
                graph._ops = []
                raise _cuda_error("cudaErrorStreamCaptureInvalidated")
            graph._state = _GraphState.CAPTURED
            self.stats.graph_captures += 1

    def _c_graph_replay(self, graph: SimCUDAGraph) -> None:
        self._count("CUDAGraph.replay")
        t0 = time.time_ns()
        with self._lock:
            if graph._state is not _GraphState.CAPTURED:
                raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
            self.stats.graph_replays += 1
            session = self._session
            if session is not None and session.recording and graph._before_profiler_init:
                self.stats.graph_replays_without_profiler_warmup += 1
            stream = self._current_stream(graph._device)
            if session is not None and session.recording and session.wants(CUDA_RUNTIME):
                session.records.append(_GpuRecord("cudaGraphLaunch", CUDA_RUNTIME, graph._device,
                                                  threading.get_native_id(), t0, time.time_ns(),
                                                  self._thread_seq(), next(self._correlations), on_host=True))
            for op in graph._ops:
                self._enqueue(stream, op, t0)

    # ------------------------------------------------------------------ memory

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
        """Python frames of the caller, innermost first, without this module's."""
        here = __file__
        stack = [f for f in traceback.extract_stack() if f.filename != here]
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

    # ------------------------------------------------------------------ profiler

    def _profiler_prepare(self, owner: Any, cpu: bool, sync_events: bool, allowed: frozenset[str] | None) -> None:
        """Claim the process's CUDA profiling session (kineto: one GenericActivityProfiler).

        torch does not refuse a second session: kineto logs "GenericActivityProfiler already busy,
        terminating" and the sessions' results are lost (two overlapping sessions stopping can crash
        torch 2.13 with a segmentation fault). The simulation refuses it so the overlap cannot pass
        unnoticed.
        """
        with self._lock:
            if self._session is not None and self._session.owner is not owner:
                raise RuntimeError(
                    "simulated CUDA: a CUDA profiling session is already active in this process; kineto "
                    "supports one (it logs 'GenericActivityProfiler already busy, terminating' and the "
                    "results of both are lost)")
            self._session = _Session(owner, cpu, sync_events, allowed)

    def _profiler_release(self, owner: Any) -> None:
        with self._lock:
            if self._session is not None and self._session.owner is owner:
                self._session = None

    def _profiler_start(self, owner: Any) -> None:
        with self._lock:
            session = self._session
            if session is None or session.owner is not owner:
                raise RuntimeError("simulated CUDA: profiler session was not prepared")
            session.recording = True
            session.start_thread = threading.get_ident()
            session.anchor_wall_ns = time.time_ns()
            session.anchor_dev_ns = [d.now_ns for d in self._devices]
            self.stats.profiler_sessions += 1
            self._cupti_initialized = True

    def _profiler_stop(self, owner: Any) -> tuple[list[_SimKinetoEvent], int]:
        torch = _torch()
        cuda_type, cpu_type = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
        event_cls = _kineto_event_class(torch)  # shaped as this torch's _KinetoEvent
        with self._lock:
            session = self._session
            if session is None or session.owner is not owner:
                return [], time.time_ns()
            self._session = None
            session.recording = False
            if session.start_thread != threading.get_ident():
                # disableProfiler on a thread without the session: torch warns "disableProfiler called
                # but no active profiling session found" and returns empty results (torch 2.13).
                self.stats.profiler_cross_thread_stops += 1
                return [], session.anchor_wall_ns
            stopper = self._thread_seq()
            records = list(session.records)
            if session.wants(GPU_USER_ANNOTATION):
                spans: dict[tuple[int, int, int], list[Any]] = {}
                for r in records:
                    if r.annotation is not None and not r.on_host and r.activity != CUDA_SYNC:
                        key = (r.annotation.ident, r.device, r.stream)
                        span = spans.get(key)
                        if span is None:
                            spans[key] = [r.annotation.name, r.start_ns, r.end_ns, r.thread]
                        else:
                            span[1], span[2] = min(span[1], r.start_ns), max(span[2], r.end_ns)
                for (ident, device, stream), (name, start, end, tid) in spans.items():
                    records.append(_GpuRecord(name, GPU_USER_ANNOTATION, device, stream, start, end, tid, ident))
            events = []
            for r in records:
                if r.on_host:
                    events.append(event_cls(r.name, r.activity, cpu_type, os.getpid(), r.stream, r.start_ns,
                                            r.end_ns, r.thread, r.correlation, 0))
                    continue
                offset = session.anchor_wall_ns - session.anchor_dev_ns[r.device]
                tid = r.thread if session.cpu else stopper
                events.append(event_cls(r.name, r.activity, cuda_type, r.device, r.stream, r.start_ns + offset,
                                        r.end_ns + offset, tid, r.correlation, r.nbytes))
            events.sort(key=lambda e: e._start)
            return events, session.anchor_wall_ns

    def _annotation_enter(self, rf: Any) -> None:
        ann = _Annotation(str(getattr(rf, "name", "")), next(self._correlations))
        rf._simcuda_annotation = ann
        self._tls.annotations.append(ann)

    def _annotation_exit(self, rf: Any) -> None:
        ann = getattr(rf, "_simcuda_annotation", None)
        stack = self._tls.annotations
        if ann is not None and ann in stack:
            del stack[len(stack) - 1 - stack[::-1].index(ann)]

    def _kineto_device_properties(self) -> list[dict[str, Any]]:
        return [{"id": i, "name": p.name, "totalGlobalMem": p.total_memory, "computeMajor": p.major,
                 "computeMinor": p.minor, "maxThreadsPerBlock": p.max_threads_per_block,
                 "maxThreadsPerMultiprocessor": p.max_threads_per_multi_processor,
                 "regsPerBlock": p.regs_per_multiprocessor, "warpSize": p.warp_size,
                 "sharedMemPerBlock": p.shared_memory_per_block, "numSms": p.multi_processor_count,
                 "regsPerMultiprocessor": p.regs_per_multiprocessor,
                 "sharedMemPerMultiprocessor": p.shared_memory_per_multiprocessor}
                for i, p in enumerate(self._properties)]

    def __repr__(self) -> str:
        state = "installed" if self._installed else "not installed"
        return f"<SimulatedCuda devices={self.devices} memory_per_device={self.memory_per_device} {state}>"


# ---------------------------------------------------------------------------------------------------
# The simulated torch.cuda functions (twins of torch's Python code over simulated C-level calls)
# ---------------------------------------------------------------------------------------------------


_QUALNAME_ALIASES = (
    ("_make_api.<locals>.", ""),
    ("SimEvent.", "Event."),
    ("SimStream.", "Stream."),
    ("SimCUDAGraph.", "CUDAGraph."),
    ("SimGraphContext.", "graph."),
    ("SimDeviceContext.", "device."),
    ("SimStreamContext.", "StreamContext."),
)


def _caller_name() -> str:
    """The API that led to a ``_lazy_init`` call: the first caller not named with a leading underscore
    (dunder methods count), with the simulation's class names spelled as torch's."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if not code.co_name.startswith("_") or (code.co_name.startswith("__") and code.co_name.endswith("__")):
            name = getattr(code, "co_qualname", code.co_name)
            for prefix, alias in _QUALNAME_ALIASES:
                if name.startswith(prefix):
                    name = alias + name[len(prefix):]
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return "_lazy_init"


def _make_api(sim: SimulatedCuda, torch: Any) -> dict[str, Callable[..., Any]]:
    """Functions with torch's names and signatures, bound to ``sim``."""
    _get_device_index = torch.cuda._utils._get_device_index

    def count(name: str) -> None:
        with sim._lock:
            sim.stats.calls[name] += 1

    def is_available() -> bool:
        """torch/cuda/__init__.py is_available: ``torch._C._cuda_getDeviceCount() > 0``, which registers
        the fork handler (poisons fork) unless PYTORCH_NVML_BASED_CUDA_CHECK=1 asks NVML instead."""
        count("is_available")
        if os.getenv("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
            return torch.cuda.device_count() > 0
        with sim._lock:
            sim._fork_poisoned = True
        return sim.devices > 0

    def device_count() -> int:
        """torch/cuda/__init__.py device_count: NVML before initialization (fork stays usable), the
        CUDA runtime after. Does not initialize."""
        count("device_count")
        return sim.devices

    def is_initialized() -> bool:
        """torch/cuda/__init__.py is_initialized: ``_initialized and not _is_in_bad_fork()``."""
        count("is_initialized")
        return sim._initialized and not sim._in_bad_fork

    def _is_in_bad_fork() -> bool:
        """torch._C._cuda_isInBadFork: a forked child of a process whose CUDA state poisoned fork."""
        return sim._in_bad_fork

    def _lazy_init() -> None:
        """torch/cuda/__init__.py _lazy_init: initializes once; in a bad fork raises torch's message."""
        caller = "_lazy_init"
        if not sim._initialized:
            caller = _caller_name()
        sim._init(caller)

    def init() -> None:
        """torch/cuda/__init__.py init: ``_lazy_init()``."""
        count("init")
        torch.cuda._lazy_init()

    def current_device() -> int:
        """torch/cuda/__init__.py current_device: ``_lazy_init()``, then the thread's current device."""
        count("current_device")
        torch.cuda._lazy_init()
        return sim._tls.device

    def set_device(device: Any) -> None:
        """torch/cuda/__init__.py set_device: no-op for a negative index; ``_cuda_setDevice``
        initializes and sets the calling thread's device."""
        count("set_device")
        device = _get_device_index(device)
        if device >= 0:
            sim._c_set_device(device)

    def _exchange_device(device: int) -> int:
        """torch._C._cuda_exchangeDevice: -1 for a negative index; else initializes and swaps."""
        return sim._c_exchange_device(int(device))

    def _maybe_exchange_device(device: int) -> int:
        """torch._C._cuda_maybeExchangeDevice: swaps without initializing."""
        return sim._c_maybe_exchange_device(int(device))

    def get_device_properties(device: Any = None) -> SimDeviceProperties:
        """torch/cuda/__init__.py get_device_properties: ``_lazy_init()``; "Invalid device id"."""
        count("get_device_properties")
        torch.cuda._lazy_init()
        device = _get_device_index(device, optional=True)
        if device < 0 or device >= torch.cuda.device_count():
            raise AssertionError("Invalid device id")
        return sim._properties[device]

    def get_device_name(device: Any = None) -> str:
        """torch/cuda/__init__.py get_device_name: ``get_device_properties(device).name``."""
        count("get_device_name")
        return torch.cuda.get_device_properties(device).name

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        """torch/cuda/__init__.py get_device_capability: (major, minor) of the properties."""
        count("get_device_capability")
        prop = torch.cuda.get_device_properties(device)
        return prop.major, prop.minor

    def _sleep(cycles: int) -> None:
        """torch/cuda/__init__.py _sleep → torch._C._cuda_sleep → at::cuda::sleep: one kernel
        (``spin_kernel``) on the current stream of the current device that spins for ``cycles``
        clock cycles, here ``cycles / clock_rate``. It creates the device's context (fork is
        poisoned) without torch's Python-level initialization: ``is_initialized()`` stays False
        (seen on a real H200, design/CUDA.md)."""
        count("_sleep")
        t0 = time.time_ns()
        with sim._lock:
            sim._fork_poisoned = True
            stream = sim._current_stream(sim._tls.device)
            khz = sim._properties[stream.device_index].clock_rate
            sim._enqueue(stream, _Op("spin_kernel", KERNEL, int(cycles) * 1_000_000 // khz, 0), t0)

    def synchronize(device: Any = None) -> None:
        """torch/cuda/__init__.py synchronize: ``_lazy_init()``, then within ``torch.cuda.device(device)``
        cudaDeviceSynchronize. A counted host synchronization; refused during a capture that forbids it."""
        count("synchronize")
        torch.cuda._lazy_init()
        with torch.cuda.device(device):
            return sim._c_device_synchronize()

    def current_stream(device: Any = None) -> SimStream:
        """torch/cuda/__init__.py current_stream: ``_lazy_init()``, then the calling thread's current
        stream of the device (default: the current device)."""
        count("current_stream")
        torch.cuda._lazy_init()
        return sim._c_current_stream(_get_device_index(device, optional=True))

    def default_stream(device: Any = None) -> SimStream:
        """torch/cuda/__init__.py default_stream: ``_lazy_init()``, then the device's default stream."""
        count("default_stream")
        torch.cuda._lazy_init()
        return sim._c_default_stream(_get_device_index(device, optional=True))

    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        """torch._C._cuda_setStream: the stream's device becomes current, then the stream."""
        sim._c_set_stream(int(stream_id), int(device_index))

    def set_stream(stream: Any) -> None:
        """torch/cuda/__init__.py set_stream: no-op for None; else ``_set_stream_by_id``."""
        count("set_stream")
        if stream is None:
            return
        torch.cuda._set_stream_by_id(stream_id=stream.stream_id, device_index=stream.device_index,
                                     device_type=stream.device_type)

    def stream(stream: Any) -> SimStreamContext:
        """torch/cuda/__init__.py stream: ``StreamContext(stream)``."""
        count("stream")
        return torch.cuda.StreamContext(stream)

    def graph_pool_handle() -> tuple[int, int]:
        """torch/cuda/graphs.py graph_pool_handle: an opaque memory pool id."""
        count("graph_pool_handle")
        return (0, next(sim._pool_ids))

    def is_current_stream_capturing() -> bool:
        """torch/cuda/graphs.py is_current_stream_capturing: whether the calling thread's current stream
        is capturing (an invalidated capture still is); False, without initializing, before init."""
        count("is_current_stream_capturing")
        with sim._lock:
            if not sim._initialized:
                return False
            return sim._current_stream(sim._tls.device)._capture is not None

    def set_sync_debug_mode(debug_mode: int | str) -> None:
        """torch/cuda/__init__.py set_sync_debug_mode: ``_lazy_init()``; names map to 0/1/2."""
        count("set_sync_debug_mode")
        torch.cuda._lazy_init()
        if isinstance(debug_mode, str):
            if debug_mode == "default":
                debug_mode = 0
            elif debug_mode == "warn":
                debug_mode = 1
            elif debug_mode == "error":
                debug_mode = 2
            else:
                raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        if not sim._sync_warned:
            sim._sync_warned = True
            warnings.warn(_SYNC_PROTOTYPE_WARNING, UserWarning, stacklevel=2)
        if isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
            raise RuntimeError("invalid argument to set_sync_debug_mode")
        if not 0 <= debug_mode <= 2:
            raise RuntimeError("invalid value of debug_mode, expected one of 0,1, 2")
        sim._sync_debug_mode = debug_mode

    def get_sync_debug_mode() -> int:
        """torch/cuda/__init__.py get_sync_debug_mode: ``_lazy_init()``, then the mode (0, 1 or 2)."""
        count("get_sync_debug_mode")
        torch.cuda._lazy_init()
        return sim._sync_debug_mode

    def cudart() -> SimCudart:
        """torch/cuda/__init__.py cudart: ``_lazy_init()``, then the runtime module."""
        count("cudart")
        torch.cuda._lazy_init()
        return sim._cudart

    # ---- memory (torch/cuda/memory.py)

    def empty_cache() -> None:
        """torch/cuda/memory.py empty_cache: only if initialized; frees cached, unused segments."""
        count("empty_cache")
        if torch.cuda.memory.is_initialized():
            sim._c_empty_cache()

    def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
        """torch/cuda/memory.py memory_stats_as_nested_dict: {} when not initialized (does not
        initialize); else the allocator's DeviceStats as torch/csrc/cuda/Module.cpp builds them."""
        count("memory_stats_as_nested_dict")
        if not torch.cuda.memory.is_initialized():
            return {}
        device = _get_device_index(device, optional=True)
        with sim._lock:
            return sim._allocator_for_stats(device).nested()

    def memory_stats(device: Any = None) -> dict[str, Any]:
        """torch/cuda/memory.py memory_stats: the nested dict flattened with dotted keys, sorted."""
        count("memory_stats")
        result = []

        def _format_key(key: Any) -> str:
            if isinstance(key, str):
                return key
            if isinstance(key, tuple):
                return "_".join(str(part) for part in key)
            return str(key)

        def _recurse_add_to_result(prefix: str, obj: Any) -> None:
            if isinstance(obj, dict):
                if len(prefix) > 0:
                    prefix += "."
                for k, v in obj.items():
                    _recurse_add_to_result(prefix + _format_key(k), v)
            else:
                result.append((prefix, obj))

        stats = torch.cuda.memory.memory_stats_as_nested_dict(device=device)
        _recurse_add_to_result("", stats)
        result.sort()
        return collections.OrderedDict(result)

    def memory_allocated(device: Any = None) -> int:
        """torch/cuda/memory.py: ``memory_stats(device)["allocated_bytes.all.current"]`` (0 if absent)."""
        count("memory_allocated")
        return torch.cuda.memory.memory_stats(device=device).get("allocated_bytes.all.current", 0)

    def max_memory_allocated(device: Any = None) -> int:
        """torch/cuda/memory.py: ``memory_stats(device)["allocated_bytes.all.peak"]``."""
        count("max_memory_allocated")
        return torch.cuda.memory.memory_stats(device=device).get("allocated_bytes.all.peak", 0)

    def memory_reserved(device: Any = None) -> int:
        """torch/cuda/memory.py: ``memory_stats(device)["reserved_bytes.all.current"]``."""
        count("memory_reserved")
        return torch.cuda.memory.memory_stats(device=device).get("reserved_bytes.all.current", 0)

    def max_memory_reserved(device: Any = None) -> int:
        """torch/cuda/memory.py: ``memory_stats(device)["reserved_bytes.all.peak"]``."""
        count("max_memory_reserved")
        return torch.cuda.memory.memory_stats(device=device).get("reserved_bytes.all.peak", 0)

    def reset_peak_memory_stats(device: Any = None) -> None:
        """torch/cuda/memory.py reset_peak_memory_stats: every "peak" becomes "current"; before CUDA
        initialization the allocator refuses ("Invalid device argument ...: did you call init?")."""
        count("reset_peak_memory_stats")
        device = _get_device_index(device, optional=True)
        with sim._lock:
            sim._allocator_for_stats(device).reset_peak()

    def reset_accumulated_memory_stats(device: Any = None) -> None:
        """torch/cuda/memory.py reset_accumulated_memory_stats: zero "allocated"/"freed" and counters."""
        count("reset_accumulated_memory_stats")
        device = _get_device_index(device, optional=True)
        with sim._lock:
            sim._allocator_for_stats(device).reset_accumulated()

    def reset_max_memory_allocated(device: Any = None) -> None:
        """torch/cuda/memory.py reset_max_memory_allocated: FutureWarning, then reset_peak_memory_stats."""
        count("reset_max_memory_allocated")
        warnings.warn(
            "torch.cuda.reset_max_memory_allocated now calls torch.cuda.reset_peak_memory_stats, "
            "which resets /all/ peak memory stats.",
            FutureWarning,
            stacklevel=2,
        )
        return torch.cuda.memory.reset_peak_memory_stats(device=device)

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        """torch/cuda/memory.py mem_get_info: ``torch.cuda.cudart().cudaMemGetInfo(device)`` (initializes)."""
        count("mem_get_info")
        if device is None:
            device = torch.cuda.current_device()
        device = _get_device_index(device, optional=True)
        return torch.cuda.cudart().cudaMemGetInfo(device)

    def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
        """torch/cuda/memory.py memory_snapshot: the snapshot's "segments"."""
        count("memory_snapshot")
        return sim._c_snapshot()["segments"]

    def _record_memory_history(enabled: Any = "all", context: str | None = "all", stacks: str = "all",
                               max_entries: int = sys.maxsize, device: Any = None, clear_history: bool = False,
                               compile_context: bool = False, global_record_annotations: bool = False,
                               skip_actions: list[str] | None = None, **legacy: Any) -> None:
        """torch/cuda/memory.py _record_memory_history: "state" keeps stacks of live allocations, "all"
        also a history of alloc/free events (up to ``max_entries``); None stops and drops the history.
        A bool ``enabled`` is the legacy form (``record_context``, ``trace_alloc_max_entries``)."""
        count("_record_memory_history")
        if isinstance(enabled, bool):
            record_context = legacy.get("record_context", context not in (None, False))
            max_entries = legacy.get("trace_alloc_max_entries", 1)
            sim._c_record_history("all" if enabled else None, "all" if record_context else None, "python",
                                  max_entries, bool(legacy.get("clear_history", clear_history)), None)
            return
        if legacy:
            raise TypeError(f"_record_memory_history() got unexpected keyword arguments {sorted(legacy)}")
        sim._c_record_history(enabled, context, stacks, max_entries, clear_history, skip_actions)

    def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
        """torch/cuda/memory.py _snapshot: {"segments", "device_traces", ...} for all devices."""
        count("_snapshot")
        return sim._c_snapshot()

    def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
        """torch/cuda/memory.py _dump_snapshot: pickle ``_snapshot()`` to ``filename``."""
        count("_dump_snapshot")
        s = torch.cuda.memory._snapshot(augment_with_fx_traces=augment_with_fx_traces)
        with open(filename, "wb") as f:
            pickle.dump(s, f)

    # ---- RNG seeds (torch/cuda/random.py); the generators themselves are not simulated

    def manual_seed(seed: int) -> None:
        """torch/cuda/random.py manual_seed: the seed of the current device's generator (queued by
        ``_lazy_call`` in torch; does not initialize)."""
        count("manual_seed")
        with sim._lock:
            sim._seeds[sim._tls.device] = int(seed) & 0xFFFFFFFFFFFFFFFF

    def manual_seed_all(seed: int) -> None:
        """torch/cuda/random.py manual_seed_all: the seed of every device's generator."""
        count("manual_seed_all")
        with sim._lock:
            sim._seeds = [int(seed) & 0xFFFFFFFFFFFFFFFF] * sim.devices

    def seed() -> None:
        """torch/cuda/random.py seed: a random seed for the current device."""
        count("seed")
        with sim._lock:
            sim._seeds[sim._tls.device] = int.from_bytes(os.urandom(8), "little")

    def seed_all() -> None:
        """torch/cuda/random.py seed_all: one random seed for every device."""
        count("seed_all")
        with sim._lock:
            sim._seeds = [int.from_bytes(os.urandom(8), "little")] * sim.devices

    def initial_seed() -> int:
        """torch/cuda/random.py initial_seed: ``_lazy_init()``, then the current device's seed."""
        count("initial_seed")
        torch.cuda._lazy_init()
        with sim._lock:
            return sim._seeds[sim._tls.device]

    def _cuda_attach_out_of_memory_observer(observer: Callable[[int, int, int, int], object]) -> None:
        """torch._C._cuda_attach_out_of_memory_observer (CUDA builds only): the caching allocator calls
        ``observer(device, alloc, device_total, device_free)`` right before raising OutOfMemoryError. The
        binding's C++ device initialization is not simulated: ``torch.cuda.is_initialized()`` does not
        change (it is not ``torch.cuda._lazy_init``)."""
        count("_cuda_attach_out_of_memory_observer")
        sim._c_attach_oom_observer(observer)

    def _init_for_cuda_graphs() -> None:
        """torch/profiler/_utils.py _init_for_cuda_graphs: a short profiler session that initializes
        CUPTI, so graphs captured afterwards can be profiled. Counted; no session is run."""
        with sim._lock:
            sim.stats.calls["_init_for_cuda_graphs"] += 1
            sim.stats.init_for_cuda_graphs_calls += 1
            sim._cupti_initialized = True

    return {f.__name__: f for f in (
        is_available, device_count, is_initialized, _is_in_bad_fork, _lazy_init, init, current_device, set_device,
        _exchange_device, _maybe_exchange_device, get_device_properties, get_device_name, get_device_capability,
        _sleep, synchronize, current_stream, default_stream, _set_stream_by_id, set_stream, stream, graph_pool_handle,
        is_current_stream_capturing, set_sync_debug_mode, get_sync_debug_mode, cudart, empty_cache,
        memory_stats_as_nested_dict, memory_stats, memory_allocated, max_memory_allocated, memory_reserved,
        max_memory_reserved, reset_peak_memory_stats, reset_accumulated_memory_stats, reset_max_memory_allocated,
        mem_get_info, memory_snapshot, _record_memory_history, _snapshot, _dump_snapshot, _init_for_cuda_graphs,
        manual_seed, manual_seed_all, seed, seed_all, initial_seed, _cuda_attach_out_of_memory_observer,
    )}


@contextmanager
def simulated_cuda(devices: int = 2, *, memory_per_device: int = 80 * 2**30,
                   cpu_tensors_on: int | None = None) -> Iterator[SimulatedCuda]:
    """Install a :class:`SimulatedCuda` for the duration of the block; everything is restored on exit,
    exceptions included.

    Args:
        devices: number of simulated devices.
        memory_per_device: bytes of memory of each device.
        cpu_tensors_on: see :class:`SimulatedCuda`.

    Example:
        >>> import torch
        >>> from gpuprobe.testing.simcuda import simulated_cuda
        >>> with simulated_cuda(devices=2) as sim:
        ...     (torch.cuda.is_available(), torch.cuda.device_count())
        (True, 2)
        >>> torch.cuda.is_available()
        False
    """
    sim = SimulatedCuda(devices, memory_per_device=memory_per_device, cpu_tensors_on=cpu_tensors_on)
    sim.install()
    try:
        yield sim
    finally:
        sim.uninstall()
