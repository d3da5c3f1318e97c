"""Devices: availability, lazy initialization, the fork poisoning of ``torch.cuda._lazy_init``, each
thread's current device (``torch.cuda.device``, ``set_device``), and ``torch.cuda.cudart()``."""

from __future__ import annotations

import collections
import threading
from typing import Any, ClassVar, Literal

from ._torch_compat import exchange_device, get_device_index, import_torch, lazy_init, maybe_exchange_device
from .allocator import _Allocator
from .graphs import _CaptureMode
from .messages import _CUDA_ERRORS, _FORK_MESSAGE, _cuda_error
from .profiler import _Annotation
from .streams import SimStream

__all__ = ["DevicesMixin", "SimCudart", "SimDeviceContext"]

class _ThreadState(threading.local):
    """Per-thread CUDA state: the current device, each device's current stream, and the thread's
    stream-capture interaction mode.

    A new thread starts at device 0 with the default streams current (the CUDA runtime's current
    device is per host thread; c10/cuda/CUDAStream.h: "the notion of 'current stream for device' is
    thread local"), in global capture mode (cudaThreadExchangeStreamCaptureMode: "the default mode").
    """

    def __init__(self) -> None:
        self.device = 0
        self.capture_mode = _CaptureMode.GLOBAL
        self.streams: dict[int, SimStream] = {}
        self.annotations: list[_Annotation] = []
        self.stream_contexts: list[Any] = []


class _Device:
    def __init__(self, sim: Any, index: int) -> None:
        self.index = index
        self.now_ns = 0
        self.default = sim._Stream._make(sim, index, level=-1, slot=0)
        self.pools: dict[int, list[SimStream]] = {}
        self.pool_next: dict[int, int] = collections.defaultdict(int)
        self.allocator = _Allocator(index, sim.memory_per_device)

    def streams(self) -> list[SimStream]:
        return [self.default] + [s for pool in self.pools.values() for s in pool]


class SimDeviceContext:
    """``torch.cuda.device``, as torch/cuda/__init__.py: ``_exchange_device`` on entry,
    ``_maybe_exchange_device`` on exit (no-op for a negative index or None)."""

    _sim: ClassVar[Any]  # the SimulatedCuda that made this subclass (a class of simulation.py, which imports this one)

    def __init__(self, device: Any) -> None:
        self._sim._count("device")
        self.idx = get_device_index(import_torch())(device, optional=True)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = exchange_device(import_torch(), self.idx)

    def __exit__(self, type: Any, value: Any, traceback: Any) -> Literal[False]:
        self.idx = maybe_exchange_device(import_torch(), self.prev_idx)
        return False


class _CudaError:
    """``torch.cuda.cudart().cudaError``: the values ``torch.cuda.check_error`` compares with."""

    success = 0
    not_ready = 34


class SimCudart:
    """``torch.cuda.cudart()``: the CUDA runtime calls torch exposes (torch/csrc/cuda/shared/cudart.cpp)."""

    cudaError = _CudaError

    def __init__(self, sim: Any) -> None:
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


class DevicesMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` behind the devices: CUDA's
    initialization and torch's C-level device calls (``_cuda_setDevice``, ``_cuda_exchangeDevice``, ...),
    simulated."""

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
        lazy_init(import_torch())  # THCPModule_setDevice_wrap: torch::utils::device_lazy_init
        with self._lock:
            self._tls.device = self._check_device(device)

    def _c_exchange_device(self, device: int) -> int:
        if device < 0:
            return -1
        lazy_init(import_torch())  # THCPModule_exchangeDevice: device_lazy_init first
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
