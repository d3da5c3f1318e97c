"""The simulation: :class:`SimulatedCuda`, a set of simulated CUDA devices behind ``torch.cuda``, made of
the parts in this package, and :func:`simulated_cuda`, which installs one for a block."""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .allocator import MemoryMixin, _Block, _History
from .clock import ClockMixin
from .devices import DevicesMixin, SimCudart, SimDeviceContext, _Device, _ThreadState
from .events import EventsMixin, SimEvent
from .graphs import GraphsMixin, SimCUDAGraph, SimGraphContext, SimLibcudart, SimStreamCapture
from .install import InstallMixin
from .placement import PlacementMixin
from .profiler import ProfilerMixin, _Session
from .records import SimDeviceProperties, SimStats
from .streams import SimStream, SimStreamContext, StreamsMixin

__all__ = ["SimulatedCuda", "simulated_cuda"]


class SimulatedCuda(InstallMixin, DevicesMixin, StreamsMixin, ClockMixin, EventsMixin, GraphsMixin, MemoryMixin,
                    ProfilerMixin, PlacementMixin):
    """A simulated set of CUDA devices behind ``torch.cuda``; install it, or use :func:`simulated_cuda`.

    Its methods come from one part per concern, each a mixin in a module of its own (install.py,
    devices.py, streams.py, clock.py, events.py, graphs.py, allocator.py, profiler.py, placement.py);
    the state they share is made here, in ``__init__``, and guarded by one lock (``_lock``).

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
        # The runtime library's own calls, which torch does not bind: a capture begun on a stream
        # directly, a thread's capture interaction mode.
        self.libcudart = SimLibcudart(self)
        self._seeds = [67280421310721] * devices  # c10 default_rng_seed_val
        self._initialized = False
        self._fork_poisoned = False
        self._in_bad_fork = False
        self._sync_debug_mode = 0
        self._sync_warned = False
        self._captures: list[SimCUDAGraph | SimStreamCapture] = []
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
        self._prev_runtime_finder: Any = None
        self._installed = False

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

    def __repr__(self) -> str:
        state = "installed" if self._installed else "not installed"
        return f"<SimulatedCuda devices={self.devices} memory_per_device={self.memory_per_device} {state}>"


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
