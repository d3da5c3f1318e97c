"""Asynchronous device time: work is queued on streams and ends on a simulated clock per device.

The host runs ahead. Work queued with :meth:`~ClockMixin.launch` starts at ``max(device clock, end of the
stream's earlier work)``; a device's clock moves only through :meth:`~ClockMixin.advance`,
:meth:`~ClockMixin.finish` and host synchronizations (:meth:`~ClockMixin.memcpy_and_sync`,
``torch.cuda.synchronize``, ``Event.synchronize``, ``Stream.synchronize``), each of them counted, and
checked by the sync debug mode where torch checks it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from typing import Any

from ._torch_compat import import_torch, lazy_init
from .messages import _SYNC_MESSAGE
from .profiler import _GpuRecord
from .records import _LAUNCH_KINDS, CUDA_RUNTIME, CUDA_SYNC, GPU_MEMCPY, GPU_MEMSET, KERNEL, KernelRecord
from .streams import SimStream

__all__ = ["ClockMixin"]

# The runtime call kineto records on the host for each kind of GPU work.
_RUNTIME_CALL = {KERNEL: "cudaLaunchKernel", GPU_MEMCPY: "cudaMemcpyAsync", GPU_MEMSET: "cudaMemsetAsync"}


@dataclasses.dataclass
class _Op:
    """GPU work as queued (a graph keeps these until replay)."""

    name: str
    kind: str
    ns: int
    nbytes: int


class ClockMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` that keeps device time: the test
    drivers that queue work and move the clocks, and the host synchronizations."""

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
        torch = import_torch()
        lazy_init(torch)
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
        torch = import_torch()
        lazy_init(torch)
        self._sync_debug_check(stacklevel=2)
        t0 = time.time_ns()
        with self._lock:
            target = self._resolve_stream(stream)
            self._check_capture_safe(target)
            self._enqueue(target, _Op("Memcpy DtoH (Device -> Pageable)", GPU_MEMCPY, int(ns), int(nbytes)), t0)
            self._host_wait(target.device_index, target._busy_until, "memcpy_and_sync", "Stream Sync",
                            target._kineto_id, "cudaStreamSynchronize", t0)

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
