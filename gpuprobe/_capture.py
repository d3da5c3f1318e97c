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

from ._seams import Patch, declare, wrap

__all__ = ["CaptureGuard", "SEAM_BEGIN", "SEAM_END"]

# A failure of the guard's own counting switches both off together: a half-counted capture is worse
# than none (timings are then read as if no capture ran, which is what a process without gpuprobe does).
SEAM_BEGIN = declare("torch.cuda_graph.capture_begin", library="torch", attribute="capture_begin",
                     group="torch.cuda_graph", scenario="cuda_graph",
                     target="torch.cuda.CUDAGraph.capture_begin (the class)")
SEAM_END = declare("torch.cuda_graph.capture_end", library="torch", attribute="capture_end",
                   group="torch.cuda_graph", scenario="cuda_graph",
                   target="torch.cuda.CUDAGraph.capture_end (the class)")


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
        self.begun = 0  # captures begun so far: a device span never starts at an event from before one
        self._graph_cls: Any = None
        self._patches: list[Patch] = []
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
