"""Knowing when a CUDA graph capture is underway anywhere in the process.

While a thread captures in CUDA's default ("global") mode, an event query from *any* thread
invalidates the capture (the same hazard PyTorch's NCCL watchdog had). torch tells a thread only
whether its *own* current stream captures, so gpuprobe counts captures itself: it wraps
``torch.cuda.CUDAGraph.capture_begin`` / ``capture_end``, which every Python-level capture goes
through (``torch.cuda.graph``, ``make_graphed_callables``, inductor's CUDA-graph trees, transformers'
continuous batching). Device timings are read only under :attr:`CaptureGuard.lock` and only while no
capture is counted, and a capture cannot begin while they are being read, so a query never races a
capture's start.

Installed by the device clock when torch with CUDA is in use; :meth:`CaptureGuard.uninstall` puts the
original methods back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["CaptureGuard"]


class CaptureGuard:
    """Counts the CUDA graph captures underway; device timings are read only when there are none.

    Example:
        >>> guard = CaptureGuard()
        >>> guard.underway
        0
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.underway = 0  # read without the lock on the hot path: a plain int load
        self._graph_cls: Any = None
        self._originals: dict[str, tuple[Any, bool]] = {}  # name -> (original, defined on the class itself)
        self._before: tuple[Callable[[], None], ...] = ()

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
        begin = getattr(graph_cls, "capture_begin", None)
        end = getattr(graph_cls, "capture_end", None)
        if begin is None or end is None:
            return
        guard = self

        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            for before in guard._before:
                try:
                    before()
                except Exception:  # telemetry never breaks the program's capture
                    pass
            with guard.lock:  # waits for a reading of device timings to finish
                guard.underway += 1
            try:
                return begin(graph, *args, **kwargs)
            except BaseException:
                with guard.lock:
                    guard.underway -= 1
                raise

        def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return end(graph, *args, **kwargs)
            finally:
                with guard.lock:
                    guard.underway = max(0, guard.underway - 1)

        originals = {}
        for name, wrapper, original in (("capture_begin", capture_begin, begin), ("capture_end", capture_end, end)):
            originals[name] = (original, name in graph_cls.__dict__)
            wrapper.__name__ = name
            wrapper.__qualname__ = getattr(original, "__qualname__", name)
            wrapper.__doc__ = getattr(original, "__doc__", None)
            wrapper.__wrapped__ = original  # type: ignore[attr-defined]
            setattr(graph_cls, name, wrapper)
        self._originals = originals
        self._graph_cls = graph_cls

    def uninstall(self) -> None:
        """Put the original methods back (only where they are still gpuprobe's wrappers)."""
        cls, originals = self._graph_cls, self._originals
        self._graph_cls, self._originals = None, {}
        if cls is None:
            return
        for name, (original, own) in originals.items():
            current = cls.__dict__.get(name)
            if getattr(current, "__wrapped__", None) is original:
                if own:
                    setattr(cls, name, original)
                else:
                    delattr(cls, name)  # it was inherited: let inheritance show through again

    def reset_after_fork(self) -> None:
        """In a forked child: no capture of the parent runs here, and the lock may have been held."""
        self.lock = threading.Lock()
        self.underway = 0
