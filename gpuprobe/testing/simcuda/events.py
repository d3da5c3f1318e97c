"""``torch.cuda.Event`` (torch/cuda/streams.py over c10/cuda/CUDAEvent.h) on simulated devices: lazy
creation on the recording stream's device, device binding, ``query``, the preconditions of
``elapsed_time``, ``synchronize`` and ``wait``."""

from __future__ import annotations

import struct
import threading
import time
from typing import Any, ClassVar

from ._torch_compat import import_torch
from .graphs import SimCUDAGraph, SimStreamCapture
from .messages import _c10_index, _cuda_error
from .profiler import _GpuRecord
from .records import CUDA_RUNTIME
from .streams import _KINETO_DEFAULT_STREAM

__all__ = ["EventsMixin", "SimEvent"]

def _float32(value: float) -> float:
    """``cudaEventElapsedTime`` returns a C ``float``: round through 32 bits as torch's binding does."""
    return struct.unpack("f", struct.pack("f", value))[0]


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

    _sim: ClassVar[Any]  # the SimulatedCuda that made this subclass (a class of simulation.py, which imports this one)

    enable_timing: bool
    blocking: bool
    interprocess: bool
    external: bool
    _device: int | None  # the device the event was created on (at its first record), else None
    _ts: int  # when its stream reaches it, on the device clock (ns)
    _captured_by: SimCUDAGraph | SimStreamCapture | None  # the capture it was last recorded in, if any
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
        return import_torch().device("cuda", self._device)

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
            stream = import_torch().cuda.current_stream()
        self._sim._c_event_record(self, stream)

    def wait(self, stream: Any = None) -> None:
        """torch/cuda/streams.py: current stream when none is given; CUDAEvent::block makes the
        stream's later work wait for the event (no-op for an event never recorded)."""
        self._sim._count("Event.wait")
        if stream is None:
            stream = import_torch().cuda.current_stream()
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


class EventsMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` behind the events: CUDAEvent's
    record, block, query, elapsed time and synchronize, simulated."""

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
