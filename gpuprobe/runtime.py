"""The runtime: everything gpuprobe holds in one process, as parts a newcomer can name.

==================  =======================================================================
part                what it is
==================  =======================================================================
``settings``        the :class:`~gpuprobe.config.Config` in force
``backends``        an immutable :class:`Backends` snapshot: NVTX, device clock, memory reader
``registry``        the aggregates (:mod:`gpuprobe._metrics`): families, series, sinks
``buffers``         per-thread records and value queues (:mod:`gpuprobe._buffers`)
``pending``         device timings waiting for the device (:class:`~gpuprobe._buffers.PendingTimings`)
``steps``           the step clock and its hooks (:mod:`gpuprobe._steps`)
``lifecycle``       exporters, closeables, the background thread, exit and fork (:mod:`gpuprobe._lifecycle`)
``requests``        finished requests' records and the sources of running ones (:mod:`gpuprobe._requests`)
==================  =======================================================================

How a record flows: a probe or an integration appends to its thread's buffer (no lock) → a
:meth:`Runtime.drain` (a scrape, a push, the background thread every ``collect_interval``, or the
owning thread when its buffer is full) applies it to its series → sinks see each applied value
(JSON lines, a MeterProvider, tests) → exporters read :meth:`Runtime.collect`.

Public seams for exporters and integrations: :meth:`Runtime.add_exporter`,
:meth:`Runtime.add_closeable`, :meth:`Runtime.add_sink`, :meth:`Runtime.add_step_hook`,
:meth:`Runtime.advance_step`, :meth:`Runtime.steps_done`, :meth:`Runtime.thread_records`, :meth:`Runtime.emit`,
:meth:`Runtime.add_pending`, :meth:`Runtime.drop`, :meth:`Runtime.warn_once`.

Reconfiguring is one operation, :meth:`Runtime.reconfigure`: it swaps the settings and the backends
snapshot (a new ``generation``) and every prepared probe and generated wrapper is rebound to it
before it returns (see :mod:`gpuprobe._probe`), so none keeps a stale device clock.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from . import _nvtx, _seams, config, memory, timing
from ._buffers import PendingTimings, Record, RecordBuffers
from ._capture import CaptureGuard
from ._lifecycle import Closeable, Exporter, Lifecycle, Owner
from ._metrics import Family, MetricData, Registry, Sink
from ._requests import RequestLog
from ._steps import StepClock, StepHook
from ._sync_audit import SyncSites

__all__ = ["Backends", "Runtime", "runtime", "collect", "on_reconfigure", "on_start", "StartFailure",
           "DISABLED_AT_IMPORT"]


def _disabled_at_import() -> bool:
    # A value that is not a switch is warned when the runtime reads the environment, and means off.
    setting = config.SETTINGS["disable"]
    raw = os.environ.get(setting.env)
    try:
        return False if raw is None else bool(setting.parse(setting.env, raw))
    except config.ConfigError:
        return False


DISABLED_AT_IMPORT: bool = _disabled_at_import()
"""``GPUPROBE_DISABLE=1`` when gpuprobe was imported: decorators hand back the function itself and
integrations patch nothing, for the life of the process."""


@dataclasses.dataclass(frozen=True)
class Backends:
    """What the hot path calls, picked once per configuration (``generation`` counts the picks)."""

    generation: int
    nvtx: _nvtx.NvtxBackend
    device_clock: timing.DeviceClock | None
    read_memory: memory.MemoryReader
    cuda: bool  # torch with a CUDA device is there (CUDA itself may not be initialized yet)


class Runtime:
    """Everything gpuprobe holds in one process (see the module docstring)."""

    def __init__(self, settings: config.Config, problems: tuple[config.Problem, ...] = ()) -> None:
        self._settings = settings
        self.settings_problems: list[str] = []  # what could not be used or started, for info()
        self.buffer_size = settings.buffer_size  # read on hot paths: a plain attribute, not a property
        self.lock = threading.RLock()  # held while records are applied and aggregates read
        self.registry = Registry(settings.max_label_values)
        self.buffers = RecordBuffers()
        self.pending = PendingTimings()
        self.capture = CaptureGuard()
        self.steps = StepClock(self._hook_failed)
        self.lifecycle = Lifecycle(self.drain, self.warn_once)  # a background round: drain, then ticks
        self.lifecycle.interval = settings.collect_interval
        self.snapshot_triggers: memory.SnapshotTriggers | None = None
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        self.sync_sites = SyncSites(self.warn_once)  # where the sync audit first saw each sync (info())
        self.requests = RequestLog(settings.requests_kept)  # records of finished requests (gpuprobe.requests())
        self.tracer_provider: Any = None  # configure(tracer_provider=...): where request spans go (docs/tracing.md)
        self._backends: Backends | None = None
        self._generation = 0
        self._device_label: str | None = None
        self._dropped = self.registry.family("gpuprobe.telemetry.dropped")
        self._seam_disabled = self.registry.family("gpuprobe.seam.disabled")
        _seams.set_reporter(self._seam_failed, self.warn_once)
        self._set_const_labels()
        self.report_problems(problems)

    # -- settings and backends -------------------------------------------------------------------
    @property
    def settings(self) -> config.Config:
        """The settings in force."""
        return self._settings

    @property
    def backends(self) -> Backends:
        """The backends snapshot (picked at first use, then only by :meth:`reconfigure`)."""
        found = self._backends
        if found is None:
            with self.lock:
                found = self._backends
                if found is None:
                    found = self._pick()
        return found

    def _pick(self) -> Backends:
        cfg = self._settings
        self._generation += 1
        clock = timing.pick_device_clock(cfg.device_timing, self.capture, self._device_problem, self.note_device)
        backends = Backends(
            generation=self._generation,
            nvtx=_nvtx.pick(),
            device_clock=clock,
            read_memory=memory.pick_reader(cfg.memory_peak_reset),
            cuda=clock is not None or memory._cuda() is not None,
        )
        self._backends = backends
        self._set_const_labels()
        self.lifecycle.keep_running = clock is not None
        if clock is not None:
            # CUDA events come from bounded pools: read them regularly even if nothing scrapes.
            self.lifecycle.ensure_thread()
        return backends

    def reconfigure(self, settings: config.Config) -> None:
        """Apply ``settings``: swap the backends snapshot and rebind every prepared probe to it."""
        with self.lock:
            self._settings = settings
            self.buffer_size = settings.buffer_size
            self.registry.max_label_values = settings.max_label_values
            self.requests.resize(settings.requests_kept)
            self.lifecycle.set_interval(settings.collect_interval)
            self._backends = None
            self._pick()
            for rebind in list(_rebinders):
                rebind(self)

    # -- labels -------------------------------------------------------------------------------------
    def note_device(self, name: str) -> None:
        """The process's device label is the first device work was seen on (``cuda:N``)."""
        if self._device_label is None:
            with self.lock:
                if self._device_label is None:
                    self._device_label = name
                    self._set_const_labels()

    def _set_const_labels(self) -> None:
        backends = self._backends
        if self._device_label is not None:
            device = self._device_label
        else:
            device = "cuda" if backends is not None and backends.cuda else "cpu"
        self.registry.const_labels = {"gpuprobe.rank": str(self._settings.rank), "gpuprobe.device": device}

    # -- the hot path's seams -----------------------------------------------------------------
    def thread_records(self) -> deque[Record]:
        """This thread's record deque: append ``(series.apply, value)``; call :meth:`drain_if_full` now and then."""
        return self.buffers.for_this_thread()

    def emit(self, series: Any, value: Any) -> None:
        """Record ``value`` for ``series`` (anything with ``apply``) from any thread."""
        records = self.buffers.for_this_thread()
        records.append((series.apply, value))
        if len(records) >= self.buffer_size:
            self.drain()

    def add_pending(self, series: Any, token: Any) -> None:
        """Record a device timing (a token of the device clock's ``stop``) for ``series``."""
        self.buffers.for_this_thread().append((self.pending.apply, (series, token)))

    def drain_if_full(self, records: deque[Record]) -> None:
        """Drain when ``records`` (a thread's deque) has reached ``buffer_size``."""
        if len(records) >= self.buffer_size:
            self.drain()

    # -- collection -----------------------------------------------------------------------------
    def drain(self) -> int:
        """Apply every buffered record, then read the device timings that are done."""
        with self.lock:
            applied = self.buffers.drain(self._record_failed)
            if len(self.pending):
                self._read_device_timings()
        return applied

    def _read_device_timings(self) -> None:
        guard = self.capture
        # Never while a counted CUDA graph capture is underway (a query from any thread would break
        # it), and in relaxed capture mode, for the captures it cannot count (gpuprobe/_capture.py).
        if guard.underway:
            return
        with guard.lock:
            if guard.underway:
                return
            with guard.relaxed:
                self.pending.resolve(timing.DeviceClock.poll, timing.DeviceClock.discard, self._poll_failed)

    def collect(self) -> list[MetricData]:
        """Drain, then copy the aggregates (what exporters send)."""
        with self.lock:
            self.drain()
            return self.registry.snapshot()

    # -- problems: counted, warned once, never raised ----------------------------------------------
    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` records dropped for ``reason`` in ``gpuprobe.telemetry.dropped``."""
        self.emit(self._dropped.child(reason=reason), n)

    def warn_once(self, key: str, message: str, *, where: str | None = None) -> None:
        """Warn the first time ``key`` happens; telemetry problems never raise into user code.

        ``where``: shown as the warning's origin instead of gpuprobe's own line (for a setting, whose
        origin is the environment, not code). Under ``python -W error`` (warnings as errors) the
        message goes to stderr instead: a warning of gpuprobe's never becomes the program's exception.
        """
        with self._warn_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        try:
            if where is None:
                warnings.warn(message, RuntimeWarning, stacklevel=3)
            else:
                warnings.warn_explicit(message, RuntimeWarning, where, 0, module="gpuprobe")
        except Warning:
            _to_stderr(f"{where or 'gpuprobe'}: RuntimeWarning: {message}")

    def report_problems(self, problems: tuple[config.Problem, ...]) -> None:
        """Warn once about each variable of the environment that could not be used (its default is used)."""
        for problem in problems:
            message = problem.message()
            if message not in self.settings_problems:
                self.settings_problems.append(message)
            self.warn_once(f"setting:{problem.variable}={problem.value}", message, where="<environment>")

    def _start_failed(self, what: str, exc: BaseException) -> None:
        """Something the environment's settings ask for could not start: warned once, the program runs on."""
        text = str(exc).removeprefix("gpuprobe ").removeprefix("gpuprobe: ")
        message = f"gpuprobe: {text}; this process runs without {what}" if isinstance(exc, config.ConfigError) else \
            f"gpuprobe: {what} could not start ({type(exc).__name__}: {text}); this process runs without it"
        if message not in self.settings_problems:
            self.settings_problems.append(message)
        self.warn_once(f"start:{what}:{exc}", message, where="<environment>")

    def _seam_failed(self, seam: _seams.Seam, exc: BaseException) -> None:
        """A seam into another library switched itself off (see :mod:`gpuprobe._seams`)."""
        self.emit(self._seam_disabled.child(seam=seam.name), 1)
        self.warn_once(f"seam:{seam.name}", _seams.failure_message(seam, exc))

    def _record_failed(self, exc: BaseException) -> None:
        self.warn_once("apply", f"gpuprobe: a record could not be aggregated: {exc!r}")

    def _poll_failed(self, exc: BaseException) -> None:
        self.warn_once("poll", f"gpuprobe: a device timing could not be read: {exc!r}")

    def _hook_failed(self, hook: StepHook, exc: BaseException) -> None:
        self.warn_once(f"hook:{hook!r}", f"gpuprobe: step hook failed: {exc!r}")

    def _device_problem(self, reason: str, exc: BaseException | None) -> None:
        self.drop(reason)
        if exc is not None:
            self.warn_once(reason, f"gpuprobe: device timing skipped ({reason}): {exc!r}")

    # -- seams for exporters, integrations and features ----------------------------------------
    def family(self, name: str) -> Family:
        """The metric family ``name`` (one of :data:`gpuprobe._metrics.SPECS`)."""
        return self.registry.family(name)

    def add_exporter(self, exporter: Exporter, *, owner: Owner = "user") -> None:
        """Register an exporter: ``tick()`` on the background thread, ``close()`` at reset and exit."""
        self.lifecycle.add(exporter, owner)

    def add_closeable(self, item: Closeable, *, owner: Owner = "user") -> None:
        """Register something to close at reset and exit (an endpoint, a profile window)."""
        self.lifecycle.add(item, owner)

    def remove(self, item: Closeable) -> None:
        """Forget an exporter or closeable (it closed itself)."""
        self.lifecycle.remove(item)

    def add_sink(self, sink: Sink) -> None:
        """Call ``sink(metric, labels, value)`` with every value as it is aggregated (on the draining thread)."""
        with self.lock:
            self.registry.sinks.append(sink)

    def remove_sink(self, sink: Sink) -> None:
        """Stop calling ``sink`` (no error if it is not there)."""
        with self.lock:
            if sink in self.registry.sinks:
                self.registry.sinks.remove(sink)

    def add_step_hook(self, hook: StepHook, *, first: bool = False) -> None:
        """Run ``hook(index)`` at every step start."""
        self.steps.add_hook(hook, first=first)

    def remove_step_hook(self, hook: StepHook) -> None:
        """Stop running ``hook``."""
        self.steps.remove_hook(hook)

    def advance_step(self) -> int:
        """Count the start of a generation step and run the step hooks; returns its index."""
        return self.steps.advance()

    def steps_done(self) -> None:
        """The calling thread's steps are over for now (a ``generate()`` call ended)."""
        self.steps.done()

    def add_steps_done_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` on the thread whose steps are over (see :meth:`steps_done`)."""
        self.steps.add_done_hook(hook)

    def remove_steps_done_hook(self, hook: Callable[[], None]) -> None:
        """Stop running ``hook`` at :meth:`steps_done`."""
        self.steps.remove_done_hook(hook)

    def observe_exception(self, exc: BaseException) -> None:
        """An exception passed through a probe or an instrumented call (out-of-memory snapshots)."""
        triggers = self.snapshot_triggers
        if triggers is not None:
            triggers.observe_exception(exc)

    # -- starting and stopping ------------------------------------------------------------------
    def start_from_settings(self, explicit: frozenset[str] = frozenset()) -> None:
        """Start what the settings ask for (see :mod:`gpuprobe._autostart`): triggers, profile window,
        kernel sampling, exporters. Each is owned by the settings.

        What fails to start is warned once and left off, so a setting from the environment never stops
        the program; when the failing feature's settings include a keyword in ``explicit`` (the caller's
        own ``configure(...)``), the first such error is raised once everything else has started.
        """
        raised: BaseException | None = None
        for start in list(_starters):
            for keys, what, exc in start(self):
                if raised is None and keys & explicit:
                    raised = exc
                else:
                    self._start_failed(what, exc)
        if raised is not None:
            raise raised

    def stop_settings_owned(self) -> None:
        """Close what the settings started (the next :meth:`start_from_settings` starts it anew)."""
        self.lifecycle.close("settings")
        self.snapshot_triggers = None

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the background thread, drain, and close every exporter and closeable (at exit)."""
        self.lifecycle.stop_thread(timeout)
        try:
            self.drain()
        except Exception:
            pass
        self.lifecycle.close()
        self.snapshot_triggers = None
        self.capture.uninstall()  # torch.cuda.CUDAGraph gets its own methods back

    def reset(self, settings: config.Config, explicit: frozenset[str] = frozenset()) -> None:
        """Close everything, zero every aggregate, forget buffers and warnings, apply ``settings``.

        Prepared probes stay valid: their series are zeroed in place and they are rebound to the new
        backends.
        """
        self.shutdown()
        with self.lock:
            self.buffers.clear()
            self.pending.clear(timing.DeviceClock.discard)
            self.registry.zero()
            self.steps.restart()
            self.steps.clear_hooks()
            with self._warn_lock:
                self._warned.clear()
            self.sync_sites.clear()
            self.requests.clear()
            _seams.reset()  # every seam that switched itself off is on again
            self._device_label = None
            self.settings_problems.clear()
            self.reconfigure(settings)
        if self.lifecycle.needs_thread():
            self.lifecycle.ensure_thread()
        self.start_from_settings(explicit)

    def configure(self, settings: config.Config, explicit: frozenset[str] = frozenset()) -> None:
        """Change settings, keeping aggregates and what the user started; restart what settings start.

        ``explicit``: the keywords the caller set now; what they ask for raises if it cannot start.
        """
        self.stop_settings_owned()
        self.reconfigure(settings)
        if self.lifecycle.needs_thread():
            self.lifecycle.ensure_thread()
        self.start_from_settings(explicit)

    def after_fork_in_child(self) -> None:
        """In a forked child: start empty, with the same settings and no thread (see :mod:`gpuprobe._lifecycle`)."""
        self.lock = threading.RLock()
        self._warn_lock = threading.Lock()
        self.sync_sites.reset_after_fork()
        self.requests.clear()  # the parent's requests
        self.capture.reset_after_fork()
        self.buffers.reset_after_fork()
        self.pending.clear()  # the parent's events: CUDA cannot be used in a forked child anyway
        self.steps.reset_after_fork()
        self.lifecycle.reset_after_fork()
        self.registry.reset_after_fork()
        self.registry.zero()
        self.snapshot_triggers = None
        if self._backends is not None:
            # The device clock's pools hold the parent's events; pick anew at first use.
            self._backends = None


def _to_stderr(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
    except Exception:  # no usable stderr (a daemon): stay quiet
        pass


_rt: Runtime | None = None
_rt_lock = threading.Lock()
_rebinders: list[Callable[[Runtime], None]] = []
StartFailure = tuple[frozenset[str], str, BaseException]
"""What could not start: the settings that asked for it, what it is (for a warning), the error."""
_starters: list[Callable[[Runtime], list[StartFailure]]] = []


def on_start(start: Callable[[Runtime], list[StartFailure]]) -> None:
    """Call ``start(runtime)`` whenever the settings are (re)applied, to start what they ask for.

    ``start`` returns what it could not start (it never raises); the runtime warns or raises (see
    :meth:`Runtime.start_from_settings`). How features above the core (exporters, profile windows) are
    started from settings without the core importing them.
    """
    _starters.append(start)


def on_reconfigure(rebind: Callable[[Runtime], None]) -> None:
    """Call ``rebind(runtime)`` after every reconfiguration (how prepared probes follow new backends)."""
    _rebinders.append(rebind)


def runtime() -> Runtime:
    """The process's :class:`Runtime` (created from the environment on first use).

    Example:
        >>> runtime().settings.buffer_size > 0
        True
    """
    global _rt
    found = _rt
    if found is None:
        with _rt_lock:
            found = _rt
            if found is None:
                found = Runtime(*config.from_environment())
                _rt = found
                found.start_from_settings()
    return found


def collect() -> list[MetricData]:
    """Drain every buffer and return the aggregates (what exporters see).

    Example:
        >>> import gpuprobe
        >>> data = gpuprobe.collect()
    """
    return runtime().collect()


@atexit.register
def _at_exit() -> None:
    if _rt is not None:
        _rt.shutdown(timeout=2.0)


def _after_fork_in_child() -> None:
    global _rt_lock
    _rt_lock = threading.Lock()
    if _rt is not None:
        _rt.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
