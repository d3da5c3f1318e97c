"""The collector: per-thread record buffers, device-time resolution and aggregation.

The record format is stable: ``(apply, value)``, where ``apply`` is the bound ``apply`` method of a
series prepared once (``family(name).child(**labels).apply``). Integrations call :meth:`Runtime.emit`
or append such pairs to :meth:`Runtime.buffer` themselves; probes append bare durations to a
per-thread queue of their own series (:meth:`Runtime.value_queue`).

The hot path appends a record to its own thread's buffer (a ``deque``: ``append`` and
``popleft`` are atomic, so a scrape on another thread never loses or doubles a record). Buffers are
drained into the aggregates

- when an exporter reads (a Prometheus scrape, an OTLP push, :func:`collect`),
- by a background thread every ``collect_interval`` seconds once an exporter is running,
- by the owning thread itself when its buffer reaches ``buffer_size`` (so memory stays bounded
  even if nothing reads).

Pending CUDA-event timings are polled at each collection with ``query()``; unfinished ones wait for
the next collection.
"""

from __future__ import annotations

import atexit
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from . import _nvtx, config, memory, timing
from ._metrics import Child, Family, MetricData, Registry

__all__ = ["Runtime", "runtime", "collect", "reset"]

Record = tuple[Callable[[Any], None], Any]


class _PendingTarget:
    """Receives ``(child, token)`` records for device timings and keeps them until resolved."""

    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def apply(self, value: tuple[Child, Any]) -> None:
        self.rt.pending.append(value)


class _Buffer:
    __slots__ = ("records", "thread", "__weakref__")

    def __init__(self) -> None:
        self.records: deque[Record] = deque()
        self.thread = weakref.ref(threading.current_thread())


class Runtime:
    """Everything gpuprobe holds in one process: settings, backends, buffers, aggregates, exporters."""

    def __init__(self, cfg: config.Config) -> None:
        self.cfg = cfg
        self.registry = Registry(cfg.max_label_values)
        self.lock = threading.RLock()
        self._tls = threading.local()
        self._buffers: list[_Buffer] = []
        # Per-thread queues of raw values for one histogram series each (probes' host durations):
        # (child, queue, owning thread).
        self._queues: list[tuple[Any, deque[Any], weakref.ref[threading.Thread]]] = []
        self._buffers_lock = threading.Lock()
        self.pending: list[tuple[Child, Any]] = []
        self.pending_target = _PendingTarget(self)
        self._backends_ready = False
        self.nvtx: _nvtx.NvtxBackend = _nvtx.NvtxBackend()
        self.timer: timing.DeviceTimer | None = None
        self.read_memory: Callable[[], memory.Reading] | None = None
        self.device = "cpu"
        self.exporters: list[Any] = []  # objects with .tick() called by the background thread
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._warned: set[str] = set()
        self.step_index = -1
        self.step_hooks: list[Callable[[int], None]] = []
        self._dropped = self.registry.family("gpuprobe.telemetry.dropped")
        self._set_const_labels()

    # -- backends, picked once -------------------------------------------------------------
    def backends(self) -> None:
        """Pick NVTX, device-timing and memory backends (once; :func:`gpuprobe.configure` re-picks)."""
        if self._backends_ready:
            return
        with self.lock:
            if self._backends_ready:
                return
            self.nvtx = _nvtx.pick()
            self.timer = timing.pick_device_timer(self.cfg.device_timing)
            self.read_memory = memory.pick_reader()
            self.device = memory.device_name()
            self._set_const_labels()
            self._backends_ready = True
            if self.timer is not None:
                # CUDA events come from a bounded pool: resolve them regularly even if nothing scrapes.
                self._ensure_thread()

    def _set_const_labels(self) -> None:
        self.registry.const_labels.clear()
        self.registry.const_labels.update({"gpuprobe.rank": str(self.cfg.rank), "gpuprobe.device": self.device})

    # -- the hot path's buffer -------------------------------------------------------------
    def buffer(self) -> deque[Record]:
        """This thread's record buffer (created on first use)."""
        try:
            return self._tls.buf.records  # type: ignore[no-any-return]
        except AttributeError:
            buf = _Buffer()
            self._tls.buf = buf
            with self._buffers_lock:
                self._buffers.append(buf)
            return buf.records

    def value_queue(self, child: Any, local: threading.local) -> deque[Any]:
        """A queue of raw values for ``child`` owned by this thread, stored on ``local.queue``.

        The hot path appends bare values to it (no tuple per record); :meth:`drain` aggregates each
        queue as a batch with :meth:`HistogramChild.apply_many`.
        """
        queue: deque[Any] = deque()
        local.queue = queue
        with self._buffers_lock:
            self._queues.append((child, queue, weakref.ref(threading.current_thread())))
        return queue

    def emit(self, target: Any, value: Any) -> None:
        """Append one record ``(target.apply, value)`` from any thread; aggregates locally if the buffer is full."""
        records = self.buffer()
        records.append((target.apply, value))
        if len(records) >= self.cfg.buffer_size:
            self.drain()

    # -- collection ------------------------------------------------------------------------
    def drain(self) -> int:
        """Move every buffered record into the aggregates and poll pending device timings."""
        applied = 0
        with self.lock:
            with self._buffers_lock:
                buffers = list(self._buffers)
            dead = []
            for buf in buffers:
                records = buf.records
                popleft = records.popleft
                for _ in range(len(records)):
                    # Records hold the bound apply method of their series: no attribute lookup here.
                    apply, value = popleft()
                    try:
                        apply(value)
                    except Exception as exc:  # a bad record must never stop collection
                        self.warn_once("apply", f"gpuprobe: a record could not be aggregated: {exc!r}")
                    applied += 1
                if not records and buf.thread() is None:
                    dead.append(buf)
            if dead:
                with self._buffers_lock:
                    self._buffers = [b for b in self._buffers if b not in dead]
            with self._buffers_lock:
                queues = list(self._queues)
            dead_queues = []
            for child, queue, thread in queues:
                n = len(queue)
                if n:
                    popleft = queue.popleft
                    values = [popleft() for _ in range(n)]  # popleft is atomic: appends race safely
                    try:
                        child.apply_many(values)
                    except Exception as exc:
                        self.warn_once("apply", f"gpuprobe: a record could not be aggregated: {exc!r}")
                    applied += n
                elif thread() is None:
                    dead_queues.append(queue)
            if dead_queues:
                with self._buffers_lock:
                    self._queues = [q for q in self._queues if not any(q[1] is d for d in dead_queues)]
            if self.pending:
                self._resolve()
        return applied

    def _resolve(self) -> None:
        timer = self.timer
        if timer is None:
            self.pending.clear()
            return
        still = []
        for child, token in self.pending:
            try:
                ns = timer.poll(token)
            except Exception as exc:
                self.warn_once("poll", f"gpuprobe: a device timing could not be read: {exc!r}")
                timer.discard(token)
                continue
            if ns is None:
                still.append((child, token))
            else:
                child.apply(ns)
        self.pending = still

    def collect(self) -> list[MetricData]:
        """Drain, then copy the aggregates (what exporters send)."""
        with self.lock:
            self.drain()
            timer = self.timer
            if timer is not None and int(getattr(timer, "dropped", 0) or 0):
                child = self._dropped.child(reason="event_pool_exhausted")
                child.value = timer.dropped  # type: ignore[attr-defined]
                child.touched = True  # type: ignore[attr-defined]
            return self.registry.snapshot()

    def drop(self, reason: str, n: int = 1) -> None:
        """Count records dropped for ``reason`` (buffers full, exporter failures)."""
        self.emit(self._dropped.child(reason=reason), n)

    def warn_once(self, key: str, message: str) -> None:
        """Warn the first time ``key`` happens; telemetry problems never raise into user code."""
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=2)

    def family(self, name: str) -> Family:
        """Shortcut to a metric family."""
        return self.registry.family(name)

    # -- background thread -----------------------------------------------------------------
    def add_exporter(self, exporter: Any) -> None:
        """Register an exporter whose ``tick()`` runs on the background thread."""
        with self.lock:
            self.exporters.append(exporter)
            self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuprobe-collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = self.cfg.collect_interval
        while not self._stop.wait(interval):
            self.tick()

    def tick(self) -> None:
        """One background round: drain, then let each exporter do its periodic work."""
        try:
            self.drain()
        except Exception as exc:  # pragma: no cover - drain already guards records
            self.warn_once("drain", f"gpuprobe: collection failed: {exc!r}")
        for exp in list(self.exporters):
            try:
                exp.tick()
            except Exception as exc:
                self.warn_once(f"tick:{type(exp).__name__}", f"gpuprobe: exporter {type(exp).__name__} failed: {exc!r}")

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the background thread, flush and close exporters (runs at interpreter exit)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        try:
            self.drain()
        except Exception:
            pass
        for exp in list(self.exporters):
            try:
                exp.close()
            except Exception as exc:
                self.warn_once(f"close:{type(exp).__name__}", f"gpuprobe: closing {type(exp).__name__} failed: {exc!r}")
        self.exporters.clear()

    # -- steps -----------------------------------------------------------------------------
    def step(self) -> int:
        """Advance the global step counter and run step hooks (profile windows, snapshot triggers)."""
        self.step_index += 1
        idx = self.step_index
        for hook in list(self.step_hooks):
            try:
                hook(idx)
            except Exception as exc:
                self.warn_once(f"hook:{hook!r}", f"gpuprobe: step hook failed: {exc!r}")
        return idx


_rt: Runtime | None = None
_rt_lock = threading.Lock()


def runtime() -> Runtime:
    """The process's :class:`Runtime` (created from the environment on first use)."""
    global _rt
    if _rt is None:
        with _rt_lock:
            if _rt is None:
                _rt = Runtime(config.current())
                _start_from_config(_rt)
    return _rt


def _start_from_config(rt: Runtime) -> None:
    cfg = rt.cfg
    if cfg.snapshot_at_step is not None:
        target = cfg.snapshot_at_step

        def _snap(idx: int) -> None:
            if idx == target:
                memory.triggered_snapshot(cfg.snapshot_dir, f"step{idx}")

        rt.step_hooks.append(_snap)
    if cfg.profile_steps is not None:
        from .profiling import profile

        profile(cfg.profile_steps, output=None if cfg.profile_output == "none" else cfg.profile_output,
                nsys=cfg.profile_nsys)
    if cfg.kernel_sampling:
        from .profiling import KernelSampler

        KernelSampler(cfg.kernel_sampling).attach(rt)
    if cfg.jsonl:
        from .exporters.jsonl import JsonlExporter

        JsonlExporter(cfg.jsonl).attach(rt)
    if cfg.otlp_endpoint:
        from .exporters.otlp import OtlpExporter

        OtlpExporter(cfg.otlp_endpoint, interval=cfg.otlp_interval, timeout=cfg.otlp_timeout).attach(rt)
    if cfg.prometheus_port is not None:
        from .exporters.prometheus import serve

        serve(cfg.prometheus_port, cfg.prometheus_addr, _rt=rt)


def collect() -> list[MetricData]:
    """Drain every buffer and return the aggregates (what exporters see).

    Example:
        >>> import gpuprobe
        >>> data = gpuprobe.collect()
    """
    return runtime().collect()


def reset(cfg: config.Config | None = None, *, zero: bool = True) -> Runtime:
    """Stop exporters, zero every aggregate (unless ``zero=False``) and apply ``cfg``.

    The runtime object stays the same, so probes prepared earlier keep working: their series are
    zeroed in place rather than replaced.
    """
    rt = runtime()
    rt.shutdown()
    with rt.lock:
        rt.drain()
        if zero:
            rt.pending.clear()
            rt.registry.zero()
        if cfg is not None:
            config._set(cfg)
            rt.cfg = cfg
            rt.registry.max_label_values = cfg.max_label_values
            rt._backends_ready = False
        rt.step_index = -1
        rt.step_hooks.clear()
        rt._warned.clear()
        rt._set_const_labels()
    _start_from_config(rt)
    return rt


@atexit.register
def _at_exit() -> None:
    if _rt is not None and os.getpid() == _pid:
        _rt.shutdown(timeout=2.0)


_pid = os.getpid()
