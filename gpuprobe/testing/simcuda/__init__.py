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
- CUDA graphs: capture modes, capture invalidation by unsafe calls, captured events, replay; and the
  CUDA runtime's own stream capture, which torch does not bind (:attr:`SimulatedCuda.libcudart`:
  ``cudaStreamBeginCapture`` / ``EndCapture`` / ``IsCapturing`` on a stream, each thread's capture
  interaction mode through ``cudaThreadExchangeStreamCaptureMode``), found by gpuprobe where it looks
  for the runtime library torch loaded;
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
``make_graphed_callables``; launching a graph captured through the runtime library (``cudaGraphLaunch``); ``torch.cuda.nvtx`` (a CPU build without NVTX raises, as torch does);
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


The parts, one module each (each module's docstring says what it simulates):

- :mod:`.simulation`: :class:`SimulatedCuda`, made of the parts below, and :func:`simulated_cuda`;
- :mod:`.devices`, :mod:`.streams`, :mod:`.clock` (device time, launches, host synchronizations),
  :mod:`.events`, :mod:`.graphs`, :mod:`.allocator` (memory), :mod:`.profiler`, :mod:`.placement`;
- :mod:`.functions`: the simulated ``torch.cuda`` functions; :mod:`.install`: what installing replaces;
- :mod:`.records` (what tests read back), :mod:`.messages` (torch's messages, verbatim);
- :mod:`._torch_compat`: every private torch name the simulation uses, and the torch releases it was
  checked against.

This package imports torch only when a simulation is created or installed.
"""

from __future__ import annotations

from .records import (
    CUDA_RUNTIME,
    CUDA_SYNC,
    GPU_MEMCPY,
    GPU_MEMSET,
    GPU_USER_ANNOTATION,
    KERNEL,
    KernelRecord,
    SimDeviceProperties,
    SimStats,
)
from .events import SimEvent
from .graphs import SimCUDAGraph
from .simulation import SimulatedCuda, simulated_cuda
from .streams import SimStream

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
# Also importable from here, as before the package was split: the activity types of KernelRecord.kind
# and of the simulated profiler's events (CUDA_RUNTIME, CUDA_SYNC, GPU_MEMCPY, ...).
