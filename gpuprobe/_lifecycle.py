"""Lifecycle: what runs in the background, what is closed at reset and at exit, and what a fork does.

- :class:`Exporter` — the one protocol every exporter follows: ``tick()`` runs on the background
  thread every ``collect_interval`` seconds, ``close()`` at reset and at exit (like
  prometheus_client's ``Collector`` or OpenTelemetry's ``MetricExporter``: a small interface the
  runtime knows, not an object appended to someone's list).
- :class:`Closeable` — something with nothing periodic to do that must still be closed: a
  ``/metrics`` endpoint, a profile window (its trace is written at exit), a kernel sampler.
- Each is owned by the user (``add_exporter(..., owner="user")``: kept across ``configure()``) or by
  the settings (started by ``configure()``/the environment, stopped by the next ``configure()``).
- The background thread drains buffers, reads device timings and ticks exporters; it runs while
  there is an exporter or a device clock.
- At exit everything is closed once (a window still recording is written, files are flushed). In a
  forked child nothing of the parent's runs: the child starts with no exporters and no thread, and
  never closes or flushes what it inherited (the parent does that); it may serve and export anew.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["Exporter", "Closeable", "Lifecycle", "Owner"]

Owner = Literal["user", "settings"]


@runtime_checkable
class Closeable(Protocol):
    """Something to close at reset and at exit."""

    def close(self) -> None:
        """Release what it holds; flush what it was asked to write. Called once."""


@runtime_checkable
class Exporter(Closeable, Protocol):
    """Something that sends gpuprobe's data out: periodic work plus a close."""

    def tick(self) -> None:
        """Periodic work, on the background thread every ``collect_interval`` seconds; never blocks long."""


Warn = Callable[[str, str], None]


class Lifecycle:
    """The runtime's exporters, closeables and background thread.

    Args:
        round_: one background round (drain and read device timings), run before the exporters' ticks.
        warn: the runtime's warn-once, ``(key, message)``.
    """

    def __init__(self, round_: Callable[[], object], warn: Warn) -> None:
        self._round = round_
        self._warn = warn
        self._lock = threading.Lock()
        self._entries: list[tuple[Closeable, Owner]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.interval = 0.5
        self.keep_running = False  # True while a device clock needs its timings read
        self._inherited: list[Any] = []  # a forked child keeps the parent's objects alive, unclosed

    # -- registration -----------------------------------------------------------------------
    def add(self, item: Closeable, owner: Owner) -> None:
        """Register ``item``; an :class:`Exporter` also starts the background thread."""
        with self._lock:
            self._entries.append((item, owner))
        if isinstance(item, Exporter):
            self.ensure_thread()

    def remove(self, item: Closeable) -> None:
        """Forget ``item`` without closing it."""
        with self._lock:
            self._entries = [(i, o) for i, o in self._entries if i is not item]

    def items(self, owner: Owner | None = None) -> list[Closeable]:
        """What is registered (of one owner, or all)."""
        with self._lock:
            return [i for i, o in self._entries if owner is None or o == owner]

    # -- the background thread --------------------------------------------------------------
    def set_interval(self, seconds: float) -> None:
        """Run a round every ``seconds``; a running thread starts over with the new interval at once."""
        if seconds == self.interval:
            return
        self.interval = seconds
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
        if running:
            self.stop_thread()
            self.ensure_thread()

    def ensure_thread(self) -> None:
        """Start the background thread if it is not running."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,), name="gpuprobe-background",
                                            daemon=True)
            self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        """One background round: the runtime's round, then every exporter's ``tick``."""
        try:
            self._round()
        except Exception as exc:  # pragma: no cover - the round guards its records itself
            self._warn("round", f"gpuprobe: collection failed: {exc!r}")
        for item in self.items():
            if isinstance(item, Exporter):
                try:
                    item.tick()
                except Exception as exc:
                    name = type(item).__name__
                    self._warn(f"tick:{name}", f"gpuprobe: exporter {name} failed: {exc!r}")

    def stop_thread(self, timeout: float = 5.0) -> None:
        """Stop the background thread and wait for its round to end."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- closing ------------------------------------------------------------------------------
    def close(self, owner: Owner | None = None) -> None:
        """Close and forget what ``owner`` registered (everything when None), newest first."""
        with self._lock:
            chosen = [i for i, o in self._entries if owner is None or o == owner]
            self._entries = [(i, o) for i, o in self._entries if not (owner is None or o == owner)]
        for item in reversed(chosen):
            try:
                item.close()
            except Exception as exc:
                name = type(item).__name__
                self._warn(f"close:{name}", f"gpuprobe: closing {name} failed: {exc!r}")

    def needs_thread(self) -> bool:
        """Whether the background thread has work: an exporter, or device timings to read."""
        return self.keep_running or any(isinstance(i, Exporter) for i in self.items())

    def reset_after_fork(self) -> None:
        """In a forked child: no thread runs; the parent's exporters are the parent's to close."""
        self._lock = threading.Lock()
        self._inherited.extend(i for i, _ in self._entries)
        self._entries = []
        self._thread = None
        self._stop = threading.Event()
