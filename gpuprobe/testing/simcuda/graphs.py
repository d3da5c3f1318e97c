"""CUDA graphs: ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``, capture modes, captures invalidated
by calls that are unsafe while capturing, captured events, and replay; and the CUDA runtime's own
stream capture, which torch does not bind (:class:`SimLibcudart`): a capture begun on a stream
directly, and each thread's capture interaction mode."""

from __future__ import annotations

import enum
import threading
import time
from typing import Any, ClassVar

from ._torch_compat import import_torch
from .clock import _Op
from .messages import _cuda_error, _cuda_error_code
from .profiler import _GpuRecord
from .records import CUDA_RUNTIME
from .streams import SimStream

__all__ = ["GraphsMixin", "SimCUDAGraph", "SimGraphContext", "SimLibcudart", "SimStreamCapture"]

class _CaptureMode(enum.Enum):
    """cudaStreamCaptureMode, as named by ``CUDAGraph.capture_begin(capture_error_mode=...)``."""

    GLOBAL = "global"
    THREAD_LOCAL = "thread_local"
    RELAXED = "relaxed"


# cudaStreamCaptureMode's values (driver_types.h), as the runtime's C functions take and give them.
_MODE_OF_VALUE = {0: _CaptureMode.GLOBAL, 1: _CaptureMode.THREAD_LOCAL, 2: _CaptureMode.RELAXED}
_VALUE_OF_MODE = {mode: value for value, mode in _MODE_OF_VALUE.items()}
# cudaStreamCaptureStatus (driver_types.h), what cudaStreamIsCapturing writes.
_STATUS_NONE, _STATUS_ACTIVE, _STATUS_INVALIDATED = 0, 1, 2


class _GraphState(enum.Enum):
    EMPTY = "empty"
    CAPTURING = "capturing"
    INVALIDATED = "invalidated"
    CAPTURED = "captured"


class SimCUDAGraph:
    """``torch.cuda.CUDAGraph`` (torch/cuda/graphs.py over aten/src/ATen/cuda/CUDAGraph.cpp).

    Work launched on the capturing stream is kept, not run; ``replay()`` queues it on the current
    stream. Checks and messages are CUDAGraph.cpp's; capture error modes follow
    ``cudaStreamCaptureMode``.
    """

    _sim: ClassVar[Any]  # the SimulatedCuda that made this subclass (a class of simulation.py, which imports this one)

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
        torch = import_torch()
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
        torch = import_torch()
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


class SimStreamCapture:
    """A capture begun on a stream with ``cudaStreamBeginCapture`` (:class:`SimLibcudart`), not
    through ``torch.cuda.CUDAGraph``: code that calls the CUDA runtime itself (ctypes, cuda-bindings,
    a C++ extension). It forbids unsafe calls as a graph capture of its mode does; what it keeps is not
    replayed (``cudaGraphLaunch`` is not simulated)."""

    def __init__(self, stream: SimStream, mode: _CaptureMode) -> None:
        self._state = _GraphState.CAPTURING
        self._ops: list[_Op] = []  # the work queued on the stream while capturing
        self._stream: SimStream | None = stream
        self._device = stream.device_index
        self._mode = mode
        self._thread = threading.get_ident()  # the thread that began it


class SimLibcudart:
    """The CUDA runtime library's own stream-capture calls, which torch does not bind
    (``torch.cuda.cudart()`` has no capture call): what code reaching ``libcudart.so`` through ctypes,
    as gpuprobe does, calls. Each takes what the C function takes (a ``cudaStream_t`` as an int, output
    parameters as ctypes pointers) and returns its ``cudaError_t`` as an int: the codes CUDA's
    documentation lists for the call, and ``cudaErrorStreamCaptureInvalidated`` from the end of an
    invalidated capture (what ``CUDAGraph.capture_end`` meets then).

    While the simulation is installed, gpuprobe finds this library where it looks for the one torch
    loaded (``gpuprobe._capture.set_runtime_finder``).

    Example:
        >>> import ctypes, torch
        >>> from gpuprobe.testing.simcuda import simulated_cuda
        >>> with simulated_cuda() as sim:
        ...     mode = ctypes.c_int(2)  # cudaStreamCaptureModeRelaxed
        ...     error = sim.libcudart.cudaThreadExchangeStreamCaptureMode(ctypes.pointer(mode))
        ...     (error, mode.value)  # the thread's previous mode: global
        (0, 0)
    """

    def __init__(self, sim: Any) -> None:
        self._sim = sim

    def cudaStreamBeginCapture(self, stream: int, mode: int) -> int:
        """Begin capturing the work queued on ``stream`` (a ``cudaStream_t``) in capture mode ``mode``
        (0 global, 1 thread-local, 2 relaxed): ``cudaErrorInvalidValue`` for another mode, the legacy
        default stream, an unknown stream, or one already capturing."""
        return self._sim._c_stream_begin_capture(int(stream), int(mode))

    def cudaStreamEndCapture(self, stream: int, graph: Any) -> int:
        """End the capture on ``stream``; ``graph`` (a ctypes pointer to a ``cudaGraph_t``) gets the
        captured graph, or 0 for an invalidated capture, which returns
        ``cudaErrorStreamCaptureInvalidated``. A capture not begun in relaxed mode must end on the
        thread that began it (``cudaErrorStreamCaptureWrongThread``); a stream that is not capturing is
        ``cudaErrorInvalidValue``."""
        return self._sim._c_stream_end_capture(int(stream), graph)

    def cudaStreamIsCapturing(self, stream: int, status: Any) -> int:
        """Write ``stream``'s capture status to ``status`` (a ctypes pointer to a C int): 0 none, 1
        active, 2 invalidated."""
        return self._sim._c_stream_is_capturing(int(stream), status)

    def cudaThreadExchangeStreamCaptureMode(self, mode: Any) -> int:
        """Set the calling thread's capture interaction mode to ``*mode`` (a ctypes pointer to a C int)
        and write its previous mode there; every thread starts in global mode."""
        return self._sim._c_exchange_capture_mode(mode)


class GraphsMixin:
    """The part of :class:`~gpuprobe.testing.simcuda.SimulatedCuda` behind graph capture: what a capture
    forbids, and CUDAGraph's capture_begin, capture_end and replay, simulated."""

    def _check_capture_safe(self, stream: SimStream | None) -> None:
        """Refuse a call that is unsafe during stream capture (lock held).

        cudaThreadExchangeStreamCaptureMode: the calling thread's own interaction mode decides which
        captures forbid it unsafe calls. In "global" mode (every thread's default): a capture of its
        own not begun in "relaxed" mode, and another thread's capture begun in "global" mode; in
        "thread_local" mode: a capture of its own not begun in "relaxed" mode; in "relaxed" mode: none
        ("the local thread is not prohibited from potentially unsafe API calls"). Querying or
        synchronizing a capturing stream is never permitted. The offending call invalidates the
        captures concerned (their ``capture_end`` then fails), whichever API began them.
        """
        if not self._captures:
            return
        me = threading.get_ident()
        mine = self._tls.capture_mode
        hit = [g for g in self._captures
               if (stream is not None and g._stream is stream)
               or (mine is not _CaptureMode.RELAXED and g._thread == me and g._mode is not _CaptureMode.RELAXED)
               or (mine is _CaptureMode.GLOBAL and g._thread != me and g._mode is _CaptureMode.GLOBAL)]
        if hit:
            self.stats.unsafe_calls_during_capture += 1
            for g in hit:
                if g._state is _GraphState.CAPTURING:
                    g._state = _GraphState.INVALIDATED
                    self.stats.invalidated_captures += 1
            raise _cuda_error("cudaErrorStreamCaptureUnsupported")

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

    # ---- the runtime's own stream capture (SimLibcudart)

    def _handle_stream(self, handle: int) -> SimStream | None:
        """The stream of a ``cudaStream_t`` (lock held): 0 is the current device's default stream."""
        if handle == 0:
            return self._current_stream(self._tls.device)
        for dev in self._devices:
            for stream in dev.streams():
                if stream.cuda_stream == handle:
                    return stream
        return None

    def _c_stream_begin_capture(self, handle: int, mode: int) -> int:
        self._count("libcudart.cudaStreamBeginCapture")
        parsed = _MODE_OF_VALUE.get(mode)
        with self._lock:
            stream = self._handle_stream(handle)
            # "Capture may not be initiated if stream is cudaStreamLegacy", "it may only be initiated if
            # the stream is not already in capture mode".
            if parsed is None or stream is None or stream.stream_id == 0 or stream._capture is not None:
                return _cuda_error_code("cudaErrorInvalidValue")
            capture = SimStreamCapture(stream, parsed)
            stream._capture = capture
            self._captures.append(capture)
        return 0

    def _c_stream_end_capture(self, handle: int, graph: Any) -> int:
        self._count("libcudart.cudaStreamEndCapture")
        with self._lock:
            stream = self._handle_stream(handle)
            capture = None if stream is None else stream._capture
            if not isinstance(capture, SimStreamCapture) or graph is None:
                return _cuda_error_code("cudaErrorInvalidValue")
            if capture._mode is not _CaptureMode.RELAXED and capture._thread != threading.get_ident():
                return _cuda_error_code("cudaErrorStreamCaptureWrongThread")
            stream._capture = None
            self._captures.remove(capture)
            if capture._state is _GraphState.INVALIDATED:
                graph.contents.value = 0
                return _cuda_error_code("cudaErrorStreamCaptureInvalidated")
            capture._state = _GraphState.CAPTURED
            self.stats.stream_captures += 1
            graph.contents.value = next(self._handles) << 4
        return 0

    def _c_stream_is_capturing(self, handle: int, status: Any) -> int:
        self._count("libcudart.cudaStreamIsCapturing")
        with self._lock:
            stream = self._handle_stream(handle)
            if stream is None or status is None:
                return _cuda_error_code("cudaErrorInvalidValue")
            capture = stream._capture
            if capture is None:
                status.contents.value = _STATUS_NONE
            elif capture._state is _GraphState.INVALIDATED:
                status.contents.value = _STATUS_INVALIDATED
            else:
                status.contents.value = _STATUS_ACTIVE
        return 0

    def _c_exchange_capture_mode(self, mode: Any) -> int:
        self._count("libcudart.cudaThreadExchangeStreamCaptureMode")
        wanted = None if mode is None else _MODE_OF_VALUE.get(mode.contents.value)
        if wanted is None:
            return _cuda_error_code("cudaErrorInvalidValue")
        with self._lock:
            previous, self._tls.capture_mode = self._tls.capture_mode, wanted
        mode.contents.value = _VALUE_OF_MODE[previous]
        return 0
