"""Timing: the host clock always; device spans from pooled CUDA events, read lazily, never waited for.

:class:`DeviceClock` is the device side: ``start()`` records an event on the stream where the work
runs and hands back a token; ``stop(token)`` records the end event on the same device; ``poll()``
turns a finished pair into nanoseconds and returns ``None`` while the GPU has not reached it. Nothing
here calls ``synchronize()``; ``poll`` asks ``event.query()`` and calls ``elapsed_time`` only on
events that are done.

What a device span is: the time the device took from reaching the start event to reaching the end
event on that stream — the work queued on the stream between the two, plus any time the stream sat
idle or waited in between. It is not the GPU's busy time: work of other threads or streams running
at the same time is not subtracted (see ``docs/gpu.md``).

Rules the clock keeps (each from CUDA's semantics, see ``docs/gpu.md``):

- an event binds to the device of its first record, so there is one pool of events per device;
- the device is where the work runs: the caller names it (the transformers integration passes the
  device of the step's inputs or of a layer's parameters); a plain probe uses the current device of
  the calling thread at the time of the call;
- nothing initializes CUDA: until the program has initialized CUDA itself there is no GPU work to
  time, and ``start()`` returns ``None``;
- no device timing while a CUDA graph capture is underway (an event recorded into a capture can never
  be read), and events are read only when no capture is counted anywhere, by a thread in CUDA's
  relaxed capture mode, so that a capture begun outside ``torch.cuda.CUDAGraph`` is not invalidated
  either (:mod:`gpuprobe._capture`);
- ``start``/``stop`` never raise into user code: a failure is counted in
  ``gpuprobe.telemetry.dropped`` and warned about once.

Spans that follow each other at once share their boundary: :meth:`DeviceClock.split` records the end
event of one span and keeps it as the start of the next (:meth:`DeviceClock.resume`), so a run of
back-to-back spans (the decoding steps of one ``generate()`` call) costs one event record each, not
two. The next span takes the boundary only if nothing can have come in between on the device: the
same stream is current, no CUDA graph capture began since, none is underway; otherwise it records a
fresh start. Who decides that nothing ran in between on the host is the caller (it resumes at once, or
gives the boundary back with :meth:`DeviceClock.drop`).

Ownership of pooled events: an event goes back to its pool when the last span holding it gives it
back. A shared boundary is held twice (by the span it ends and by the one it starts, or by the
boundary token until one is started): :meth:`EventPool.share` counts the extra holder, and
:meth:`EventPool.release` gives an event back to the free list only when no holder is left, whichever
of the two spans is read or discarded first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from ._capture import CaptureGuard
from ._cuda import torch_with_cuda

__all__ = ["DeviceClock", "EventPool", "perf_counter_ns"]

Problem = Callable[[str, "BaseException | None"], None]


class EventPool:
    """A bounded pool of timing events of one device.

    Args:
        device: the device index every event of this pool is (or will be) bound to.
        make_event: creates one timing event (``torch.cuda.Event(enable_timing=True)``).
        max_events: the bound; when every event is in flight, :meth:`acquire` returns ``None``.

    Example:
        >>> class E:
        ...     def record(self, stream=None): pass
        >>> pool = EventPool(0, E, max_events=1)
        >>> first = pool.acquire(); pool.acquire() is None
        True
    """

    __slots__ = ("device", "_make", "_free", "_created", "_max", "_lock", "_holders")

    def __init__(self, device: int, make_event: Callable[[], Any], max_events: int = 4096) -> None:
        self.device = device
        self._make = make_event
        self._free: list[Any] = []
        self._created = 0
        self._max = max_events
        self._lock = threading.Lock()
        self._holders: dict[int, int] = {}  # id(event) -> holders besides the first (shared boundaries)

    def acquire(self) -> Any | None:
        """A free event, a new one while under the bound, else ``None``."""
        try:
            return self._free.pop()  # list.pop is atomic under the GIL
        except IndexError:
            pass
        with self._lock:
            if self._created >= self._max:
                return None
            self._created += 1
        return self._make()

    def share(self, event: Any) -> None:
        """``event`` (held, just recorded) gets one more holder: it is freed after one more release."""
        with self._lock:
            key = id(event)
            self._holders[key] = self._holders.get(key, 0) + 1

    def release(self, *events: Any) -> None:
        """Give events back: each is free again once every holder has released it (see :meth:`share`)."""
        # Why the test without the lock: an event is shared by the thread that just recorded it, before
        # any other thread can hold it, so an event released here without holders cannot gain one now.
        if not self._holders:
            self._free.extend(events)
            return
        with self._lock:
            holders = self._holders
            for event in events:
                key = id(event)
                n = holders.get(key)
                if n is None:
                    self._free.append(event)
                elif n > 1:
                    holders[key] = n - 1
                else:
                    del holders[key]

    @property
    def in_flight(self) -> int:
        """Events handed out and not yet given back."""
        return self._created - len(self._free)

    @property
    def shared(self) -> int:
        """Events held by more than one span now."""
        return len(self._holders)


class DeviceClock:
    """Device spans from CUDA events, one :class:`EventPool` per device (see the module docstring).

    Args:
        cuda: ``torch.cuda`` (or a simulation with the same attributes), read once here.
        capture: the process's :class:`~gpuprobe._capture.CaptureGuard`.
        on_problem: called with a reason (``event_pool_exhausted``, ``device_timing_failed``) and the
            exception if there was one; counts and warns, never raises.
        on_new_device: called with ``cuda:N`` the first time work is timed on device N.
        max_events: the bound of each device's pool.
    """

    name = "cuda-events"

    def __init__(self, cuda: Any, capture: CaptureGuard, on_problem: Problem,
                 on_new_device: Callable[[str], None] | None = None, max_events: int = 4096) -> None:
        self._capture = capture
        self._on_problem = on_problem
        self._on_new_device = on_new_device
        self._max = max_events
        self._pools: dict[int, EventPool] = {}
        self._pools_lock = threading.Lock()
        self._is_initialized = cuda.is_initialized
        self._current_device = cuda.current_device
        self._current_stream = cuda.current_stream
        self._capturing = cuda.is_current_stream_capturing
        event = cuda.Event
        self._make_event = lambda: event(enable_timing=True)
        # Why a flag: once CUDA is initialized it stays so (a forked child starts a new runtime), and
        # is_initialized() is a Python call with a C call inside (~0.15 us) on every start.
        self._cuda_ready = False
        capture.install(cuda.CUDAGraph)

    def _pool(self, device: int) -> EventPool:
        pool = self._pools.get(device)
        if pool is None:
            with self._pools_lock:
                pool = self._pools.get(device)
                if pool is None:
                    pool = self._pools[device] = EventPool(device, self._make_event, self._max)
                    if self._on_new_device is not None:
                        self._on_new_device(f"cuda:{device}")
        return pool

    def start(self, device: int | None = None) -> tuple[EventPool, Any] | None:
        """Record a start event on ``device`` (default: the calling thread's current device).

        Returns:
            A token for :meth:`stop`, or ``None`` (CUDA not initialized yet, a capture underway, the
            pool exhausted, or a failure; the last two are counted).
        """
        if not self._cuda_ready:
            if not self._is_initialized():
                return None
            self._cuda_ready = True
        if self._capture.underway:
            return None
        try:
            if self._capturing():
                return None
            if device is None:
                device = self._current_device()
            pool = self._pools.get(device) or self._pool(device)
            event = pool.acquire()
            if event is None:
                self._on_problem("event_pool_exhausted", None)
                return None
            try:
                event.record(self._current_stream(device))
            except BaseException:
                pool.release(event)
                raise
            return (pool, event)
        except Exception as exc:
            self._on_problem("device_timing_failed", exc)
            return None

    def stop(self, token: tuple[EventPool, Any]) -> tuple[EventPool, Any, Any] | None:
        """Record the end event on the start event's device; returns a pending token for :meth:`poll`."""
        ended = self._end(token)
        return None if ended is None else ended[0]

    def _end(self, token: tuple[EventPool, Any]) -> tuple[tuple[EventPool, Any, Any], Any] | None:
        """Record the end event of ``token``'s span: ``(pending token, stream recorded on)``, or None."""
        pool, start = token
        try:
            if self._capture.underway or self._capturing():
                pool.release(start)  # recorded before the capture, never read: safe to reuse
                return None
            end = pool.acquire()
            if end is None:
                pool.release(start)
                self._on_problem("event_pool_exhausted", None)
                return None
            try:
                stream = self._current_stream(pool.device)
                end.record(stream)
            except BaseException:
                pool.release(end)
                raise
            return (pool, start, end), stream
        except Exception as exc:
            pool.release(start)
            self._on_problem("device_timing_failed", exc)
            return None

    def split(self, token: tuple[EventPool, Any]) -> tuple[tuple[EventPool, Any, Any] | None, Any]:
        """End ``token``'s span and keep its end event as the start of the span that follows at once.

        Returns:
            ``(pending, boundary)``: the pending token for :meth:`poll` (None when the span could not
            be ended), and a boundary for :meth:`resume` or :meth:`drop` (None with it). The caller
            passes the boundary to exactly one of them.
        """
        ended = self._end(token)
        if ended is None:
            return None, None
        pending, stream = ended
        pool, end = pending[0], pending[2]
        pool.share(end)
        return pending, (pool, end, stream, self._capture.begun)

    def resume(self, boundary: Any, device: int) -> tuple[EventPool, Any] | None:
        """A start token on ``device`` for the span that follows the one :meth:`split` ended.

        The boundary event when it is a correct start: same device, the same stream current, no CUDA
        graph capture begun since the split and none underway. Otherwise the boundary is given back
        and a fresh start is recorded (:meth:`start`; None inside a capture).
        """
        pool, event, stream, begun = boundary
        try:
            if (pool.device == device and begun == self._capture.begun and not self._capture.underway
                    and not self._capturing() and self._current_stream(device) == stream):
                return (pool, event)
        except Exception as exc:
            pool.release(event)
            self._on_problem("device_timing_failed", exc)
            return None
        pool.release(event)
        return self.start(device)

    @staticmethod
    def drop(boundary: Any) -> None:
        """Give back a boundary no span will start at (the next span is not back to back, or none follows)."""
        if boundary is not None:
            boundary[0].release(boundary[1])

    @staticmethod
    def poll(pending: tuple[EventPool, Any, Any]) -> int | None:
        """Nanoseconds between the two events, or ``None`` if the device has not reached both.

        Call only under ``capture.lock`` with no capture underway, inside ``capture.relaxed`` (see
        :meth:`Runtime.drain`): the queries are then safe during a capture the guard cannot count.
        """
        pool, start, end = pending
        # Events on one stream complete in order, so a finished end implies a finished start;
        # querying both keeps this right if the stream changed between the two.
        if not end.query() or not start.query():
            return None
        ns = round(start.elapsed_time(end) * 1e6)
        pool.release(start, end)
        return ns

    @staticmethod
    def discard(pending: tuple[EventPool, Any, Any] | None) -> None:
        """Give the events of a pending token back without reading them."""
        if pending is not None:
            pending[0].release(*pending[1:])

    @property
    def in_flight(self) -> int:
        """Events handed out and not yet given back, over every device."""
        return sum(p.in_flight for p in list(self._pools.values()))

    @property
    def shared(self) -> int:
        """Events held by two spans now (shared boundaries), over every device."""
        return sum(p.shared for p in list(self._pools.values()))

    @property
    def devices(self) -> list[int]:
        """The devices this clock has recorded on."""
        return sorted(self._pools)


def pick_device_clock(mode: str, capture: CaptureGuard, on_problem: Problem,
                      on_new_device: Callable[[str], None] | None = None) -> DeviceClock | None:
    """Choose device timing once: CUDA events when torch is loaded and a CUDA device is present.

    Neither this nor anything the clock does before the program initializes CUDA initializes it.

    Args:
        mode: ``auto`` (CUDA if torch is already imported and a GPU is present), ``cuda`` (the same,
            but torch is imported if needed) or ``off``.
    """
    if mode == "off":
        return None
    torch = torch_with_cuda(import_torch=mode == "cuda")  # never initializes CUDA nor poisons fork
    if torch is None:
        return None
    try:
        return DeviceClock(torch.cuda, capture, on_problem, on_new_device)
    except Exception:  # a broken CUDA install must not break the user's program
        return None
