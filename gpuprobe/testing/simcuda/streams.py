"""Streams: ``torch.cuda.Stream``, ``torch.cuda.StreamContext``, and each thread's current stream.

As in c10/cuda/CUDAStream.h, each device has a default stream and, per priority, a pool of 32 streams
handed out round-robin; the current stream of a device is per thread.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from ._torch_compat import get_device_index, import_torch

__all__ = ["SimStream", "SimStreamContext", "StreamsMixin"]

# torch/include/c10/cuda/CUDAStream.h: "There are 32 of these streams per device";
# max_compile_time_stream_priorities = 4 (priorities 0, -1, -2, -3).
_STREAMS_PER_POOL = 32
_PRIORITY_LEVELS = 4

# Kineto writes the legacy default stream as stream 7 (tests/data/kineto_min.json, HTA traces).
_KINETO_DEFAULT_STREAM = 7


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

    _sim: ClassVar[Any]  # the SimulatedCuda that made this subclass (a class of simulation.py, which imports this one)
    device_type: ClassVar[int] = 1  # c10::DeviceType::CUDA

    device_index: int
    stream_id: int
    cuda_stream: int
    priority: int
    _kineto_id: int  # the stream number kineto writes in traces
    _busy_until: int  # when the stream's queued work ends, on the device clock (ns)
    _capture: Any  # the capture of this stream's work, if any: a SimCUDAGraph or SimStreamCapture (graphs.py)

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> SimStream:
        """torch/cuda/streams.py Stream.__new__: ``with torch.cuda.device(device)`` when a device is
        given, then a stream from the pool (c10 getStreamFromPool; priority clamped to the range)."""
        torch = import_torch()
        sim = cls._sim
        sim._count("Stream")
        if "stream_id" in kwargs and "device_index" in kwargs:
            return sim._stream_by_id(int(kwargs["stream_id"]), int(kwargs["device_index"]))
        if device is None:
            return sim._c_stream_from_pool(priority)
        with torch.cuda.device(device):
            return sim._c_stream_from_pool(priority)

    @classmethod
    def _make(cls, sim: Any, device: int, level: int, slot: int) -> SimStream:
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
        return import_torch().device("cuda", self.device_index)

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
            event = import_torch().cuda.Event()
        event.record(self)
        return event

    def __enter__(self) -> SimStream:
        """``with stream:`` as ``with torch.cuda.stream(stream):`` (the context is kept per thread)."""
        ctx = import_torch().cuda.StreamContext(self)
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


class SimStreamContext:
    """``torch.cuda.StreamContext``, as torch/cuda/__init__.py (per thread; a stream of another device
    makes that device current inside the context, as ``_cuda_setStream`` does)."""

    _sim: ClassVar[Any]  # the SimulatedCuda that made this subclass (a class of simulation.py, which imports this one)

    def __init__(self, stream: Any) -> None:
        torch = import_torch()
        self._sim._count("StreamContext")
        self.stream = stream
        self.idx = get_device_index(torch)(None, True)
        if self.idx is None:
            self.idx = -1
        self.src_prev_stream: Any = None
        self.dst_prev_stream: Any = None

    def __enter__(self) -> None:
        torch = import_torch()
        cur_stream = self.stream
        if cur_stream is None or self.idx == -1:
            return
        self.src_prev_stream = torch.cuda.current_stream(None)
        if self.src_prev_stream.device != cur_stream.device:
            with torch.cuda.device(cur_stream.device):
                self.dst_prev_stream = torch.cuda.current_stream(cur_stream.device)
        torch.cuda.set_stream(cur_stream)

    def __exit__(self, type: Any, value: Any, traceback: Any) -> None:
        torch = import_torch()
        cur_stream = self.stream
        if cur_stream is None or self.idx == -1:
            return
        if self.src_prev_stream.device != cur_stream.device:
            torch.cuda.set_stream(self.dst_prev_stream)
        torch.cuda.set_stream(self.src_prev_stream)


class StreamsMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` behind the streams: torch's C-level
    stream calls (``torch._C._cuda_getCurrentStream``, ``_cuda_setStream``, ...), simulated."""

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
