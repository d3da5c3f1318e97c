"""Timing: the host clock always; device time from pooled CUDA events, resolved lazily.

The device side is one small interface, :class:`DeviceTimer`: ``start()`` and ``stop()`` record
events on the current stream and hand back an opaque token; ``poll()`` turns a finished token into
nanoseconds and returns ``None`` while the GPU has not reached it yet. ``poll`` never waits: it asks
``event.query()`` and only calls ``elapsed_time`` on events that are done. Nothing on the hot path
calls ``synchronize()``.

:class:`EventTimer` holds the logic for any event type with ``record()``, ``query()`` and
``elapsed_time(other)`` (milliseconds), so it runs on CPU in tests with a stand-in for
``torch.cuda.Event`` and on GPUs with the real one.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, Protocol

__all__ = ["DeviceTimer", "EventTimer", "pick_device_timer", "perf_counter_ns"]


class DeviceTimer(Protocol):
    """Measures device time between two points of the host program without blocking it."""

    name: str

    def start(self) -> Any | None:
        """Record a start marker; ``None`` when no marker could be had (the pool is exhausted)."""

    def stop(self, start: Any) -> Any:
        """Record the end marker for ``start``; returns a pending token for :meth:`poll`."""

    def poll(self, pending: Any) -> int | None:
        """Nanoseconds between the two markers, or ``None`` if the device has not finished them."""

    def discard(self, pending: Any) -> None:
        """Give the markers of a pending token back without reading them."""


class EventTimer:
    """A :class:`DeviceTimer` over a bounded pool of events.

    Args:
        make_event: creates one timing event (``torch.cuda.Event(enable_timing=True)`` on CUDA).
        max_events: the pool's bound. When every event is in flight, ``start`` returns ``None`` and
            counts a drop instead of blocking or growing.
        name: what :func:`gpuprobe.info` shows.

    Example:
        >>> import torch  # doctest: +SKIP
        >>> timer = EventTimer(lambda: torch.cuda.Event(enable_timing=True))  # doctest: +SKIP
    """

    def __init__(self, make_event: Callable[[], Any], max_events: int = 4096, name: str = "cuda-events") -> None:
        self.name = name
        self._make = make_event
        self._free: list[Any] = []
        self._created = 0
        self._max = max_events
        self._lock = threading.Lock()
        self.dropped = 0

    def _acquire(self) -> Any | None:
        try:
            return self._free.pop()  # list.pop is atomic under the GIL
        except IndexError:
            pass
        with self._lock:
            if self._created >= self._max:
                self.dropped += 1
                return None
            self._created += 1
        return self._make()

    def start(self) -> Any | None:
        ev = self._acquire()
        if ev is not None:
            ev.record()
        return ev

    def stop(self, start: Any) -> Any:
        if start is None:
            return None
        end = self._acquire()
        if end is None:
            self._free.append(start)
            return None
        end.record()
        return (start, end)

    def poll(self, pending: Any) -> int | None:
        start, end = pending
        # Events on one stream complete in order, so a finished end implies a finished start;
        # querying both keeps this right when the two were recorded on different streams.
        if not end.query() or not start.query():
            return None
        ns = round(start.elapsed_time(end) * 1e6)
        self._free.append(start)
        self._free.append(end)
        return ns

    def discard(self, pending: Any) -> None:
        if pending is not None:
            self._free.extend(pending)

    @property
    def in_flight(self) -> int:
        """Events handed out and not yet given back."""
        return self._created - len(self._free)


def pick_device_timer(mode: str) -> DeviceTimer | None:
    """Choose the device timer once: CUDA events when torch is loaded and CUDA is usable.

    Args:
        mode: ``auto`` (CUDA if torch is already imported and a GPU is present), ``cuda`` (the same,
            but torch is imported if needed) or ``off``.
    """
    if mode == "off":
        return None
    torch = sys.modules.get("torch")
    if torch is None and mode == "cuda":
        import torch  # noqa: F811 - asked for explicitly
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
    except Exception:  # a broken CUDA install must not break the user's program
        return None
    return EventTimer(lambda: torch.cuda.Event(enable_timing=True))
