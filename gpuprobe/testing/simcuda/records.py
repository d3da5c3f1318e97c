"""What the simulated CUDA hands back to tests: its counters (:class:`SimStats`), the work it queued
(:class:`KernelRecord`), its device properties, and the kinds of GPU work (kineto's activity types)."""

from __future__ import annotations

import dataclasses
from collections import Counter

__all__ = ["CUDA_RUNTIME", "CUDA_SYNC", "GPU_MEMCPY", "GPU_MEMSET", "GPU_USER_ANNOTATION", "KERNEL", "KernelRecord",
           "SimDeviceProperties", "SimStats"]

# _KinetoEvent.activity_type() strings (kineto's ActivityType names, present in libtorch_cpu.so).
KERNEL = "kernel"
GPU_MEMCPY = "gpu_memcpy"
GPU_MEMSET = "gpu_memset"
GPU_USER_ANNOTATION = "gpu_user_annotation"
CUDA_SYNC = "cuda_sync"
CUDA_RUNTIME = "cuda_runtime"
_LAUNCH_KINDS = frozenset({KERNEL, GPU_MEMCPY, GPU_MEMSET})


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
        stream_captures: successful ``cudaStreamEndCapture`` calls of the runtime library
            (:attr:`SimulatedCuda.libcudart`), captures begun on a stream outside ``CUDAGraph``.
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
    stream_captures: int = 0
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
