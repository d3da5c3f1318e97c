"""Knowing when a CUDA graph capture is underway anywhere in the process, and reading device timings
without disturbing one.

While a thread captures in CUDA's default ("global") mode, an event query from *any* thread
invalidates the capture (the same hazard PyTorch's NCCL watchdog had). torch tells a thread only
whether its *own* current stream captures, so gpuprobe counts captures itself: it wraps
``torch.cuda.CUDAGraph.capture_begin`` / ``capture_end``, which every Python-level capture goes
through (``torch.cuda.graph``, ``make_graphed_callables``, inductor's CUDA-graph trees, transformers'
continuous batching). Device timings are read only under :attr:`CaptureGuard.lock` and only while no
capture is counted, and a capture cannot begin while they are being read, so a query never races a
capture's start.

A capture begun outside that class (``cudaStreamBeginCapture`` called through ctypes or
cuda-bindings, a C++ extension, another library) is not counted. For those the reading thread puts
itself in CUDA's *relaxed* stream-capture mode while it reads (:class:`RelaxedMode`, through
``cudaThreadExchangeStreamCaptureMode`` of the CUDA runtime library torch loaded): a relaxed thread's
event queries are not refused and invalidate no other thread's capture, whatever mode it began in.
It then puts its own mode back. torch does not bind that call (``torch.cuda.cudart()`` and
``torch._C`` of 2.13.0, 2.14.1 and 2.15.0 have no capture call, nor has the source behind
``cudart()``, torch/csrc/cuda/shared/cudart.cpp), so it is reached with ctypes, on a library already
mapped into the process (never loaded by gpuprobe); where none is (a CPU build, another platform) or
the call fails, reading goes on as without it.

Installed by the device clock when torch with CUDA is in use; :meth:`CaptureGuard.uninstall` puts the
original methods back.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from ._seams import Patch, declare, wrap

__all__ = ["CAPTURE_MODE_GLOBAL", "CAPTURE_MODE_RELAXED", "CAPTURE_MODE_THREAD_LOCAL", "CaptureGuard",
           "ModeExchange", "RelaxedMode", "SEAM_BEGIN", "SEAM_END", "find_loaded_runtime", "runtime_exchange",
           "set_runtime_finder"]

# A failure of the guard's own counting switches both off together: a half-counted capture is worse
# than none (timings are then read as if no capture ran, which is what a process without gpuprobe does).
SEAM_BEGIN = declare("torch.cuda_graph.capture_begin", library="torch", attribute="capture_begin",
                     group="torch.cuda_graph", scenario="cuda_graph",
                     target="torch.cuda.CUDAGraph.capture_begin (the class)")
SEAM_END = declare("torch.cuda_graph.capture_end", library="torch", attribute="capture_end",
                   group="torch.cuda_graph", scenario="cuda_graph",
                   target="torch.cuda.CUDAGraph.capture_end (the class)")


# cudaStreamCaptureMode (CUDA's driver_types.h): the values cudaThreadExchangeStreamCaptureMode swaps.
CAPTURE_MODE_GLOBAL = 0
CAPTURE_MODE_THREAD_LOCAL = 1
CAPTURE_MODE_RELAXED = 2

# A mapped CUDA runtime library: libcudart.so.13 (PyPI's nvidia packages), or a copy renamed by
# auditwheel (libcudart-1a2b3c4d.so.12) inside a wheel.
_RUNTIME_NAME = re.compile(r"libcudart(?:-[0-9a-f]+)?\.so(?:\.[0-9.]+)?$")
_SYMBOL = "cudaThreadExchangeStreamCaptureMode"


@dataclasses.dataclass(frozen=True)
class ModeExchange:
    """``cudaThreadExchangeStreamCaptureMode`` of the CUDA runtime this process uses.

    Attributes:
        swap: the C function: called with a ctypes pointer to a C int, it sets the calling thread's
            capture mode to that int and writes the thread's previous mode there; it returns a
            ``cudaError_t`` (0 on success).
        source: where it was found (the library's path).
    """

    swap: Callable[[Any], int]
    source: str


def find_loaded_runtime() -> ModeExchange | None:
    """The capture-mode exchange of a CUDA runtime library already mapped into this process, or None.

    Reads ``/proc/self/maps`` for a ``libcudart`` (torch's CUDA builds load it at ``import torch``)
    and opens it with ``RTLD_NOLOAD``: a library that is not loaded stays so, and neither this nor the
    lookup of the symbol initializes CUDA. None on a CPU build of torch, where ``/proc`` or
    ``RTLD_NOLOAD`` is missing, or where the library has no such symbol.

    Example:
        >>> exchange = find_loaded_runtime()  # None on a CPU build of torch
        >>> exchange is None or "libcudart" in exchange.source
        True
    """
    nolo = getattr(os, "RTLD_NOLOAD", None)
    if nolo is None:
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = dict.fromkeys(line.split(None, 5)[-1].strip() for line in maps if "libcudart" in line)
    except OSError:
        return None
    for path in paths:
        if not _RUNTIME_NAME.search(os.path.basename(path)):
            continue
        try:
            swap = getattr(ctypes.CDLL(path, mode=nolo), _SYMBOL)
        except (OSError, AttributeError):
            continue
        # Why no argtypes: the one caller passes a ctypes pointer, which ctypes passes as is; checking
        # it against argtypes made each call 0.88 us instead of 0.53 us (a stand-in libcudart, 2 cores).
        swap.restype = ctypes.c_int
        return ModeExchange(swap, path)
    return None


_finder: Callable[[], ModeExchange | None] = find_loaded_runtime
_UNSET: Any = object()
_found: Any = _UNSET  # the finder's answer, asked once (ModeExchange or None); _UNSET until then
_found_lock = threading.Lock()


def set_runtime_finder(finder: Callable[[], ModeExchange | None] | None) -> Callable[[], ModeExchange | None]:
    """Use ``finder`` in place of :func:`find_loaded_runtime`; returns the previous finder.

    For a simulated CUDA, whose runtime stands in for the library torch loads; ``None`` restores
    :func:`find_loaded_runtime`. The next reading asks the new finder.
    """
    global _finder, _found
    with _found_lock:
        previous, _finder = _finder, finder if finder is not None else find_loaded_runtime
        _found = _UNSET
    return previous


def runtime_exchange() -> ModeExchange | None:
    """The exchange :class:`RelaxedMode` uses: the finder's answer, asked at the first call; None where
    there is none, or after it failed once."""
    found = _found
    if found is _UNSET:
        found = _ask_finder()
    return found  # type: ignore[no-any-return]


def _ask_finder() -> ModeExchange | None:
    global _found
    with _found_lock:
        if _found is _UNSET:
            try:
                _found = _finder()
            except Exception:  # a broken lookup is a process without the exchange
                _found = None
        return _found  # type: ignore[no-any-return]


def _give_up(exchange: ModeExchange) -> None:
    """``exchange`` failed: no reading tries it again (until another finder is set)."""
    global _found
    with _found_lock:
        if _found is exchange:
            _found = None


class RelaxedMode:
    """A block in which the calling thread is in CUDA's relaxed stream-capture mode; its own mode
    is put back on leaving.

    ``cudaStreamCaptureModeRelaxed``: "the local thread is not prohibited from potentially unsafe
    API calls", so its ``cudaEventQuery`` neither fails nor invalidates a capture of another thread,
    even one begun in ``global`` mode outside ``CUDAGraph`` (which :class:`CaptureGuard` cannot
    count). Querying an event recorded inside a capture is still refused (and gpuprobe records none).

    ``with guard.relaxed as relaxed:``: ``relaxed`` says whether the mode was set. Where no CUDA
    runtime library is found, or the exchange fails, the block runs in the thread's own mode and the
    exchange is not tried again. One object per :class:`CaptureGuard`, entered only under its lock:
    not reentrant, not for two threads at once.

    Example:
        >>> mode = RelaxedMode()
        >>> with mode as relaxed:
        ...     pass
        >>> relaxed in (True, False)
        True
    """

    __slots__ = ("_cell", "_pointer", "_swapped")

    def __init__(self) -> None:
        # Why one cell, made once: the exchange writes the previous mode into it, so swapping twice
        # with the same cell puts that mode back, and a drain allocates nothing: the two swaps took
        # 1.0 us so, 2.7 us with a cell and pointer made per drain (a stand-in libcudart, 2 cores).
        self._cell = ctypes.c_int(CAPTURE_MODE_RELAXED)
        self._pointer = ctypes.pointer(self._cell)
        self._swapped: ModeExchange | None = None

    def __enter__(self) -> bool:
        exchange = _found if _found is not _UNSET else _ask_finder()
        if exchange is None:
            return False
        self._cell.value = CAPTURE_MODE_RELAXED
        try:
            error = exchange.swap(self._pointer)
        except Exception:  # the call itself failed: the thread's mode is as it was
            error = -1
        if error != 0:
            _give_up(exchange)
            return False
        self._swapped = exchange
        return True

    def __exit__(self, *exc: object) -> None:
        exchange = self._swapped
        if exchange is None:
            return
        self._swapped = None
        try:
            error = exchange.swap(self._pointer)  # the cell holds the thread's previous mode: swapped back
        except Exception:
            error = -1
        if error != 0:
            _give_up(exchange)


class CaptureGuard:
    """Counts the CUDA graph captures underway; device timings are read only when there are none,
    under :attr:`lock`, with the reading thread in relaxed capture mode (:attr:`relaxed`).

    Example:
        >>> guard = CaptureGuard()
        >>> guard.underway
        0
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.underway = 0  # read without the lock on the hot path: a plain int load
        self.begun = 0  # captures begun so far: a device span never starts at an event from before one
        self._graph_cls: Any = None
        self._patches: list[Patch] = []
        self._before: tuple[Callable[[], None], ...] = ()
        self.relaxed = RelaxedMode()  # entered under the lock while device timings are read

    def add_before_capture(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` before every capture begins (e.g. a profiler warm-up); it must not raise."""
        self._before = (*self._before, fn)

    def remove_before_capture(self, fn: Callable[[], None]) -> None:
        """Stop running ``fn`` before captures."""
        self._before = tuple(f for f in self._before if f != fn)

    def install(self, graph_cls: Any) -> None:
        """Wrap ``graph_cls.capture_begin`` / ``capture_end`` (``torch.cuda.CUDAGraph``); idempotent."""
        if self._graph_cls is graph_cls:
            return
        self.uninstall()
        if SEAM_BEGIN.check(graph_cls) is not None or SEAM_END.check(graph_cls) is not None:
            return
        guard = self

        def begin_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            for before in guard._before:
                try:
                    before()
                except Exception:  # a warm-up that fails leaves the capture as it is
                    pass
            with guard.lock:  # waits for a reading of device timings to finish
                guard.underway += 1
                guard.begun += 1

        def begin_after(token: None, result: Any, error: BaseException | None) -> None:
            if error is not None:  # the capture never began
                with guard.lock:
                    guard.underway -= 1

        def end_after(token: None, result: Any, error: BaseException | None) -> None:
            with guard.lock:
                guard.underway = max(0, guard.underway - 1)

        self._patches = [
            SEAM_BEGIN.patch(graph_cls, wrap(SEAM_BEGIN, graph_cls.capture_begin, begin_before, begin_after),
                             on_class=True),
            SEAM_END.patch(graph_cls, wrap(SEAM_END, graph_cls.capture_end, after=end_after), on_class=True),
        ]
        self._graph_cls = graph_cls
        when_off = SEAM_BEGIN.switch.when_off
        if self._forget not in when_off:
            when_off.append(self._forget)

    def _forget(self) -> None:
        """The guard's seams switched off: no capture is counted any more (as in a process without it)."""
        self.underway = 0

    def uninstall(self) -> None:
        """Put the original methods back (only where they are still gpuprobe's wrappers)."""
        patches, self._patches = self._patches, []
        self._graph_cls = None
        for patch in reversed(patches):
            patch.undo()

    def reset_after_fork(self) -> None:
        """In a forked child: no capture of the parent runs here, and the lock may have been held."""
        self.lock = threading.Lock()
        self.underway = 0
        self.relaxed = RelaxedMode()  # a reading in another thread may have been inside it
