"""``probe``: NVTX range + host/device timing + optional memory reading around a region of code.

Usage forms::

    @probe
    def f(): ...

    @probe("decode", kind="step", attrs={"model": "llama"}, every=4, memory=True)
    async def g(): ...

    with probe("sampling"):
        ...

    async with probe("fetch"):
        ...

What a range spans:

- plain functions and methods: the call;
- ``async def`` functions: the awaited body, from its first instruction to its return (not the
  creation of the coroutine); the NVTX range is a start/end range, because coroutines that share a
  thread would interleave push/pop ranges;
- generator functions: from the first ``next()`` to the generator's end (exhausted, returned,
  raised or closed), consumer time in between included; also a start/end range;
- ``with probe(...)``: the block (push/pop range); ``async with``: the block, start/end range. Each
  thread has its own stack of open ``with`` blocks and each asyncio task its own stack of open
  ``async with`` blocks, so overlapping tasks never see each other's blocks.

Device time (a span between two CUDA events on the stream where the work runs, see
:mod:`gpuprobe.timing`) is taken by plain functions and ``with`` blocks only: async code and
generators interleave with other work on the same thread and stream, so a span would claim time that
is not theirs; they record host time only.

Device spans of hot probes are sampled (``device_every``; host time stays per call): ``device_every=N``
takes a span on one recorded call in N (calls N, 2N, ...). Without it the ``device_every`` setting
decides: ``auto`` (the default) takes a span on every call until a probe takes more than
:data:`DEVICE_SPAN_BUDGET` spans a second, then on one call in ``ceil(rate / budget)``, re-judged every
:data:`_RETUNE_EVERY` spans taken. Why a budget rather than a fixed N: a probe on a decoding step
(hundreds of calls a second) keeps a device span per call, while a probe called tens of thousands of
times a second no longer adds ~14 us of host time to each of its calls (23.2 us against 8.8 us bare,
measured on an H200); at the budget, device spans cost at most ~1.4% of one thread. The wrapper of a
sampled probe carries its counter inline; that of an unsampled one has none (regenerated when the
rate crosses the budget).

An exception inside propagates unchanged; the range is closed and ``gpuprobe.probe.errors`` counts
it with ``error.type``.

Cost model: all choices (backends, sampling, memory) are made when the probe is prepared; a call
checks one flag when gpuprobe is disabled at run time, and with ``GPUPROBE_DISABLE=1`` at import the
decorator hands back the function itself. A reconfiguration rebinds every prepared probe and
regenerates every wrapper in place (:func:`_rebind_all`), so no call checks for a stale binding.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
import sys
import threading
import types
import weakref
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from types import TracebackType
from typing import Any, TypeVar, overload

from . import _sync_audit
from ._metrics import label_key
from .errors import ConfigError
from .runtime import DISABLED_AT_IMPORT, Runtime, on_reconfigure, runtime

__all__ = ["probe", "Probe", "enable", "disable", "is_enabled"]

F = TypeVar("F", bound=Callable[..., Any])

# The run-time switch: one global read per call.
_on = not DISABLED_AT_IMPORT


def enable() -> None:
    """Turn probes back on after :func:`disable`.

    Raises:
        ConfigError: gpuprobe was imported with ``GPUPROBE_DISABLE=1``: nothing was installed.

    Example:
        >>> import gpuprobe
        >>> gpuprobe.disable(); gpuprobe.enable()
    """
    global _on
    if DISABLED_AT_IMPORT:
        raise ConfigError("gpuprobe was imported with GPUPROBE_DISABLE=1: probes were not installed and cannot be "
                          "enabled in this process; unset GPUPROBE_DISABLE and restart")
    _on = True


def disable() -> None:
    """Turn every probe off at run time; a probed call then costs one flag check."""
    global _on
    _on = False


def is_enabled() -> bool:
    """Whether probes record (False after :func:`disable` or with ``GPUPROBE_DISABLE=1``)."""
    return _on


def _is_compiling_lazy() -> bool:
    # torch may be imported after gpuprobe: bind the check the first time torch is there.
    global _is_compiling
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "compiler"):
        return False
    # Why is_dynamo_compiling: it is a bare `return False` in eager (~25 ns) where is_compiling()
    # makes two calls (~100 ns); Dynamo constant-folds both to True while tracing.
    _is_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)
    return _is_compiling()  # type: ignore[no-any-return]


# Inside a region Dynamo compiles, the check is folded to True, so a probe does nothing and adds no
# graph breaks.
_is_compiling: Callable[[], bool] = _is_compiling_lazy

_ATTR_TYPES = (str, int, float, bool)

DEVICE_SPAN_BUDGET = 1000
"""Device spans per second one probe takes under ``device_every="auto"`` before it samples them."""
_RETUNE_EVERY = 256  # device spans between two judgements of a probe's rate (auto)


def _check(name: Any, kind: Any, attrs: Any, every: Any, sync_audit: Any = False,
           device_every: Any = None) -> dict[str, str]:
    if device_every is not None and (isinstance(device_every, bool) or not isinstance(device_every, int)
                                     or device_every < 1):
        raise ConfigError(f"probe device_every= must be an integer >= 1 (or None: the device_every setting), "
                          f"got {device_every!r}")
    if not isinstance(sync_audit, bool):
        raise ConfigError(f"probe sync_audit= must be True or False, got {sync_audit!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"probe name must be a non-empty string, got {name!r}")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"probe kind must be a non-empty string, got {kind!r}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"probe every= must be an integer >= 1, got {every!r}")
    if attrs is None:
        return {}
    if not isinstance(attrs, Mapping):
        raise ConfigError(f"probe attrs= must be a mapping of str to str/int/float/bool, got {type(attrs).__name__}")
    out = {}
    for k, v in attrs.items():
        if not isinstance(k, str) or not isinstance(v, _ATTR_TYPES):
            raise ConfigError(f"probe attrs= must map str to str/int/float/bool; bad item {k!r}: {v!r}")
        if k in ("probe", "kind", "clock"):
            raise ConfigError(f"probe attrs= may not use the reserved key {k!r}")
        out[k] = str(v)
    return out


# The open `async with` blocks of each task, one variable per series (see Probe.__init__); as many as
# there are series, which max_label_values bounds.
_tasks_by_series: dict[Any, contextvars.ContextVar[tuple[Any, ...]]] = {}
_NO_TASKS: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar("gpuprobe:unnamed", default=())


def _task_stacks(series: Any) -> contextvars.ContextVar[tuple[Any, ...]]:
    """The context variable holding each task's open ``async with`` blocks of ``series``' probes."""
    found = _tasks_by_series.get(series)
    if found is None:
        with _sites_lock:
            found = _tasks_by_series.get(series)
            if found is None:
                name = dict(series.labels).get("probe")
                found = _tasks_by_series[series] = contextvars.ContextVar(f"gpuprobe:{name}", default=())
    return found


_NAMELESS = ("a block needs a name: write 'with probe(\"decode\"):' — probe() without a name only decorates "
             "a function, which names it")


class _NoDeviceClock:
    """Stands in for the device clock when there is none, so a wrapper's parts always have a target."""

    __slots__ = ()

    @staticmethod
    def start(device: int | None = None) -> None:
        return None

    @staticmethod
    def stop(token: Any) -> None:
        # Only reached by a call that started under a device clock and ends after a reconfiguration
        # removed it: give the start event back.
        if token is not None:
            token[0].release(token[1])


_NO_CLOCK = _NoDeviceClock()


class _Binding:
    """What one probe uses under one backends snapshot (replaced whole at a reconfiguration)."""

    __slots__ = ("generation", "nvtx", "push", "pop", "start_range", "end_range", "handle", "clock", "timed",
                 "device", "memory", "limit", "audit")

    def __init__(self, site: Probe, rt: Runtime) -> None:
        b = rt.backends
        self.generation = b.generation
        nv = b.nvtx
        self.nvtx = nv.enabled
        self.push, self.pop, self.start_range, self.end_range = nv.push, nv.pop, nv.start, nv.end
        name = site.name or "?"
        self.handle = nv.prepare(name, site.kind)
        clock = b.device_clock
        self.clock: Any = clock if clock is not None else _NO_CLOCK
        self.timed = clock is not None  # why a flag: a test of it is ~50 ns cheaper than a no-op call
        self.device = (rt.family("gpuprobe.probe.duration").child(probe=name, kind=site.kind, clock="device",
                                                                   **site.attrs) if clock is not None else None)
        self.memory = bool(rt.settings.memory if site.memory is None else site.memory)
        self.limit = rt.settings.buffer_size
        self.audit = site.sync_audit


class Probe:
    """A prepared probe: a decorator and a (sync or async) context manager.

    Made by :func:`probe`; prepared once (NVTX string registered, series bound), used many times.
    """

    __slots__ = (
        "name", "kind", "attrs", "every", "memory", "sync_audit", "device_every", "rt", "host", "_b", "_errors",
        "_mem", "_n", "_stack", "_tasks", "_local", "_wrappers", "_syncs", "_dev_n", "_dev_auto", "_dev_count",
        "_dev_taken", "_dev_t0", "_folded", "__weakref__",
    )

    def __init__(self, name: str | None, kind: str = "user", attrs: Mapping[str, Any] | None = None,
                 every: int = 1, memory: bool | None = None, sync_audit: bool = False,
                 device_every: int | None = None) -> None:
        self.attrs = _check(name, kind, attrs, every, sync_audit, device_every)
        self.name = name
        self.kind = kind
        self.every = every
        self.memory = memory
        self.sync_audit = sync_audit
        self.device_every = device_every
        # Device sampling now: one recorded call in _dev_n takes a span; _dev_count counts down to it.
        self._dev_n = device_every or 1
        self._dev_auto = False
        self._dev_count = self._dev_n
        self._dev_taken = 0  # spans taken since _dev_t0 (auto: the rate is judged every _RETUNE_EVERY)
        self._dev_t0 = 0
        self._syncs: dict[str, Any] = {}  # op name -> gpuprobe.step.syncs series (sync_audit=True)
        self._n = 0
        self._stack = threading.local()  # .frames: this thread's open `with` blocks
        self._wrappers: list[weakref.ref[Any]] = []
        self._b: _Binding | None = None
        self._mem: dict[str, tuple[Any, Any, Any]] = {}
        self._folded = False  # its name folded into `other` (past max_label_values): probe() does not keep it
        self._local: Any = None
        self._tasks: contextvars.ContextVar[tuple[Any, ...]] = _NO_TASKS
        if name is not None:
            rt = runtime()
            self.rt = rt
            labels = {"probe": name, "kind": kind, "clock": "host", **self.attrs}
            self.host = rt.family("gpuprobe.probe.duration").child(**labels)
            self._folded = self.host.labels != label_key(labels)
            # Per series, not per probe: a queue per thread (.queue, the host durations) and a stack per
            # task of open `async with` blocks, so a name folded into `other` adds neither (a context
            # keeps every variable ever set in it).
            self._local = rt.buffers.series_local(self.host)
            self._tasks = _task_stacks(self.host)
            self._errors = rt.family("gpuprobe.probe.errors")
            with _sites_lock:
                self._bind(rt)
                _sites.add(self)

    def _bind(self, rt: Runtime) -> None:
        """Take the runtime's current backends and sampling setting (under ``_sites_lock``)."""
        self._b = _Binding(self, rt)
        every = self.device_every if self.device_every is not None else rt.settings.device_every
        self._dev_auto = every == "auto"
        self._dev_n = 1 if self._dev_auto else every
        self._dev_count = self._dev_n
        self._dev_taken = 0
        self._dev_t0 = perf_counter_ns()

    # -- slow paths, shared by every form ----------------------------------------------------
    def _error(self, exc: BaseException) -> None:
        rt = self.rt
        rt.emit(self._errors.child(probe=self.name, **{"error.type": type(exc).__qualname__}), 1)
        rt.observe_exception(exc)

    def _read_memory(self) -> None:
        rt = self.rt
        try:
            reading = rt.backends.read_memory(None)
        except Exception as exc:
            rt.warn_once("memory", f"gpuprobe: memory reading failed: {exc!r}")
            return
        if reading is None:
            return
        series = self._mem.get(reading.device)
        if series is None:
            fam = rt.family
            dev = reading.device
            series = (fam("gpuprobe.memory.allocated").child(device=dev), fam("gpuprobe.memory.reserved").child(device=dev),
                      fam("gpuprobe.memory.peak").child(device=dev))
            self._mem[dev] = series
            if dev != "cpu":
                rt.note_device(dev)
        allocated, reserved, peak = series
        rt.emit(allocated, reading.allocated)
        if reading.reserved is not None:
            rt.emit(reserved, reading.reserved)
        rt.emit(peak, reading.peak)

    # What the generated wrappers' optional parts call (see _PARTS): they read the current binding.
    def _nvtx_push(self) -> None:
        b = self._b
        b.push(b.handle)  # type: ignore[union-attr]

    def _nvtx_pop(self) -> None:
        self._b.pop()  # type: ignore[union-attr]

    def _device_start(self) -> Any:
        """A device span's start token for this call, or None (no device clock, or a call sampling skips)."""
        if not self._b.timed:  # type: ignore[union-attr]
            return None
        if self._dev_n > 1:
            count = self._dev_count - 1
            self._dev_count = count
            if count > 0:
                return None
        return self._device_take()

    def _device_take(self) -> Any:
        """Start a device span now (the wrappers reach it directly, past their own sampling counter)."""
        self._dev_count = self._dev_n
        if self._dev_auto:
            self._dev_taken += 1
            if self._dev_taken >= _RETUNE_EVERY:
                self._retune()
        return self._b.clock.start()  # type: ignore[union-attr]

    def _retune(self) -> None:
        """``device_every="auto"``: one recorded call in N takes a span, N keeping spans near the budget."""
        now = perf_counter_ns()
        calls = self._dev_taken * self._dev_n
        elapsed = max(now - self._dev_t0, 1)
        self._dev_taken = 0
        self._dev_t0 = now
        n = max(1, math.ceil(calls * 1_000_000_000 / elapsed / DEVICE_SPAN_BUDGET))
        if n == self._dev_n:
            return
        regenerate = (n > 1) != (self._dev_n > 1)  # the wrapper gains or loses its counter
        self._dev_n = self._dev_count = n
        if regenerate:
            with _sites_lock:
                for ref in self._wrappers:
                    wrapper = ref()
                    if wrapper is not None:
                        _regenerate(wrapper, self)

    def _device_stop(self, token: Any) -> None:
        b = self._b
        self.rt.add_pending(b.device, b.clock.stop(token))  # type: ignore[union-attr]

    def _new_queue(self) -> Any:
        return self.rt.buffers.value_queue(self.host, self._local)

    def _audit_start(self) -> Any:
        """Enter a sync audit for this call (None while a CUDA graph capture is underway)."""
        rt = self.rt
        if rt.capture.underway:
            return None
        try:
            audit = _sync_audit.new_audit(rt.sync_sites)
            audit.where = ("probe", self.name)
            audit.__enter__()
        except Exception as exc:
            rt.warn_once("sync_audit", f"gpuprobe: the sync audit could not start: {exc!r}")
            return None
        return audit

    def _audit_stop(self, audit: Any) -> None:
        audit.__exit__(None, None, None)
        _sync_audit.flush(audit, self._sync_child, self.rt.thread_records())

    def _sync_child(self, where: Any, op: str) -> Any:
        found = self._syncs.get(op)
        if found is None:
            found = self.rt.family("gpuprobe.step.syncs").child(component="probe", processor=self.name, op=op).apply
            self._syncs[op] = found
        return found

    def _skip(self) -> bool:
        # Sampling: record one call in ``every`` (a racy count across threads is fine for sampling).
        self._n += 1
        return self._n % self.every != 0

    # -- decorator ---------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        """Wrap ``fn``, keeping its kind: a static or class method stays one, a property's getter is
        measured, a callable object (``functools.lru_cache``, ``partial``, an instance with
        ``__call__``) keeps its attributes and binding. What cannot be read hands ``fn`` back unchanged,
        with one warning."""
        if DISABLED_AT_IMPORT:
            return fn
        if isinstance(fn, (staticmethod, classmethod)):
            return type(fn)(self(fn.__func__))  # type: ignore[return-value]
        if isinstance(fn, property):
            if fn.fget is None:
                raise TypeError("probe() over a property needs its getter")
            return fn.getter(self(fn.fget))  # type: ignore[return-value]
        if not callable(fn):
            raise TypeError(f"probe() decorates callables, got {type(fn).__name__}")
        if isinstance(fn, type):
            _pass_through(fn, "it is a class (instances are not measured): decorate its methods instead")
            return fn
        try:
            name, kind = _callable_name(fn), _callable_kind(fn)
        except Exception as exc:  # a __getattr__ or __signature__ of its own that raises
            _pass_through(fn, f"reading it raised {type(exc).__name__}: {exc}")
            return fn
        if kind == "async_generator":
            raise TypeError(
                f"probe() cannot wrap the async generator {name}; use 'async with probe(...)' inside it"
            )
        if self.sync_audit and kind in ("coroutine", "generator"):
            raise ConfigError(f"probe(sync_audit=True) audits functions and with-blocks, not {name}: "
                              "coroutines and generators interleave with other work on their thread")
        site = self
        if self.name is None:
            site = Probe(name, self.kind, self.attrs, self.every, self.memory, self.sync_audit, self.device_every)
        try:
            if kind == "coroutine":
                return _wrap_async(fn, site)  # type: ignore[return-value]
            if kind == "generator":
                return _wrap_generator(fn, site)  # type: ignore[return-value]
            wrapper = _wrap_sync(fn, site)
            return (wrapper if inspect.isfunction(fn) else _proxy(fn, wrapper)) # type: ignore[return-value]
        except Exception as exc:
            _pass_through(fn, f"wrapping it raised {type(exc).__name__}: {exc}")
            return fn

    # -- context managers --------------------------------------------------------------------
    def _frames(self) -> list[Any]:
        try:
            return self._stack.frames  # type: ignore[no-any-return]
        except AttributeError:
            frames: list[Any] = []
            self._stack.frames = frames
            return frames

    def __enter__(self) -> Probe:
        b = self._b
        if b is None:
            raise ConfigError(_NAMELESS)
        frames = self._frames()
        if not _on or _is_compiling() or (self.every > 1 and self._skip()):
            frames.append(None)
            return self
        if b.nvtx:
            b.push(b.handle)
        token = self._device_start() if b.timed else None
        audit = self._audit_start() if b.audit else None
        frames.append((b, token, perf_counter_ns(), audit))
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        frame = self._frames().pop()
        if frame is None:
            return
        b, token, t0, audit = frame
        dt = perf_counter_ns() - t0
        if audit is not None:
            self._audit_stop(audit)
        if token is not None:
            self.rt.add_pending(b.device, b.clock.stop(token))
        if b.nvtx:
            b.pop()
        self._finish(b, dt, ev)

    async def __aenter__(self) -> Probe:
        b = self._b
        if b is None:
            raise ConfigError(_NAMELESS)
        if b.audit:
            raise ConfigError(f"probe({self.name!r}, sync_audit=True) audits functions and with-blocks, not "
                              "'async with': coroutines interleave with other work on their thread")
        stack = self._tasks.get()
        if not _on or _is_compiling() or (self.every > 1 and self._skip()):
            self._tasks.set((*stack, None))
            return self
        rid = b.start_range(b.handle) if b.nvtx else None
        self._tasks.set((*stack, (b, rid, perf_counter_ns())))
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        stack = self._tasks.get()
        frame = stack[-1]
        self._tasks.set(stack[:-1])
        if frame is None:
            return
        b, rid, t0 = frame
        dt = perf_counter_ns() - t0
        if rid is not None:
            b.end_range(rid)
        self._finish(b, dt, ev)

    def _finish(self, b: _Binding, dt: int, exc: BaseException | None) -> None:
        if exc is not None:
            self._error(exc)
        if b.memory:
            self._read_memory()
        try:
            queue = self._local.queue
        except AttributeError:
            queue = self._new_queue()
        queue.append(dt)
        if len(queue) >= b.limit:
            self.rt.drain()

    def __repr__(self) -> str:
        return f"probe({self.name!r}, kind={self.kind!r})"


def _callable_name(fn: Any) -> str:
    """The probe name of a callable: its qualified name, a partial's function's, an instance's class's."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if isinstance(name, str) and name:
        return name
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and inner is not fn:
        return _callable_name(inner)
    return type(fn).__qualname__


def _callable_kind(fn: Any) -> str:
    """``function`` (plain or any other callable), ``coroutine``, ``generator`` or ``async_generator``."""
    if inspect.isasyncgenfunction(fn):
        return "async_generator"
    if inspect.iscoroutinefunction(fn):
        return "coroutine"
    if inspect.isgeneratorfunction(fn):
        return "generator"
    return "function"


def _pass_through(fn: Any, why: str) -> None:
    try:
        shown = repr(fn)[:120]
    except Exception:
        shown = f"a {type(fn).__name__}"
    runtime().warn_once(f"pass-through:{id(fn)}", f"gpuprobe: probe() leaves {shown} unmeasured, as it is: {why}")


class _CallableProxy:
    """A measured stand-in for a callable object that is not a plain function (``functools.lru_cache``,
    ``partial``, an instance with ``__call__``): calls go through the probe's wrapper, every other
    attribute is the object's own (``cache_info()``, ``cache_clear()``, ``func``, its fields), read live.

    Why a proxy rather than copied attributes: a callable object's attributes may change after
    decoration, and only a lookup at the time of use gives what the object holds then.
    """

    __slots__ = ("_gp_call", "__wrapped__", "__dict__", "__weakref__")

    def __init__(self, fn: Any, call: Callable[..., Any]) -> None:
        object.__setattr__(self, "__wrapped__", fn)
        object.__setattr__(self, "_gp_call", call)
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                object.__setattr__(self, attr, getattr(fn, attr))
            except AttributeError:
                pass
        object.__setattr__(self, "__gpuprobe__", call.__gpuprobe__)  # type: ignore[attr-defined]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._gp_call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__wrapped__, name, value)

    def __repr__(self) -> str:
        return f"<probed {self.__wrapped__!r}>"


class _BindingProxy(_CallableProxy):
    """A :class:`_CallableProxy` for a callable that binds like a method (``lru_cache`` on a method):
    looked up on an instance, it binds the same way, the measured call included."""

    __slots__ = ()

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        wrapped = self.__wrapped__
        bound = wrapped.__get__(obj, objtype)
        return self if bound is wrapped else types.MethodType(self, obj)


def _proxy(fn: Any, call: Callable[..., Any]) -> _CallableProxy:
    return (_BindingProxy if hasattr(type(fn), "__get__") else _CallableProxy)(fn, call)


# Every named probe, so a reconfiguration can rebind them (weak: a dropped probe is not kept alive).
_sites: weakref.WeakSet[Probe] = weakref.WeakSet()
_sites_lock = threading.Lock()


def _rebind_all(rt: Runtime) -> None:
    """Give every prepared probe and generated wrapper the runtime's new backends (see :func:`_wrap_sync`)."""
    # A reset forgets the label values seen, so a folded name may get a series of its own now.
    _recent_folded.clear()
    with _sites_lock:
        for site in list(_sites):
            if site.rt is not rt:
                continue
            site._bind(rt)
            alive = []
            for ref in site._wrappers:
                wrapper = ref()
                if wrapper is not None:
                    try:
                        _regenerate(wrapper, site)
                    except Exception as exc:  # gpuprobe's own failure: that wrapper keeps its variant
                        site.rt.warn_once("rebind", f"gpuprobe: {site!r} keeps its previous settings "
                                                    f"(rebinding raised {type(exc).__name__}: {exc})")
                    alive.append(ref)
            site._wrappers = alive


_SYNC_BODY = """
def _gp_factory(_gp_fn, _gp_site, _gp_defaults, _gp_kwdefaults, _gp_local, _gp_limit):
    def wrapper({params}):
        if not _on or _is_compiling(){sampled_check}:
            return _gp_fn({call})
{nvtx_push}{timer_start}{timer_start_sampled}{audit_start}        _gp_t0 = perf_counter_ns()
        try:
            return _gp_fn({call})
        except BaseException as _gp_exc:
            _gp_site._error(_gp_exc)
            raise
        finally:
            _gp_dt = perf_counter_ns() - _gp_t0
{audit_stop}{timer_stop}{nvtx_pop}{memory}            try:
                # Why inline, and a bare value: a method call costs ~60 ns and a tuple per record
                # ~30 ns; the queue belongs to this probe and this thread.
                _gp_queue = _gp_local.queue
            except AttributeError:
                _gp_queue = _gp_site._new_queue()
            _gp_queue.append(_gp_dt)
            if len(_gp_queue) >= _gp_limit:
                _gp_site.rt.drain()
    return wrapper
"""

# Optional parts of the wrapper, included only when the probe needs them (decided when the probe
# wraps the function and at each reconfiguration, so a call never tests a switch that cannot change).
# Why the optional parts call methods of the site rather than bound methods held in cells: every cell
# of a closure is copied into the frame at each call (COPY_FREE_VARS, ~1.3 ns a cell on CPython 3.11,
# paid by the disabled path too); these parts cost microseconds anyway (an NVTX tool, a CUDA event),
# and going through the site reads its current binding, so a call that straddles a reconfiguration
# stays consistent. Four cells, the same in every variant, are what lets _regenerate swap the code.
_PARTS = {
    "sampled_check": " or _gp_site._skip()",
    "nvtx_push": "        _gp_site._nvtx_push()\n",
    "timer_start": "        _gp_tok = _gp_site._device_take()\n",
    # Sampled device spans: the counter inline (a method call costs ~60 ns on every skipped call); a
    # racing thread may push it below zero, which takes a span and restarts it.
    "timer_start_sampled": "        _gp_n = _gp_site._dev_count - 1\n"
                           "        _gp_site._dev_count = _gp_n\n"
                           "        _gp_tok = _gp_site._device_take() if _gp_n <= 0 else None\n",
    "timer_stop": "            if _gp_tok is not None:\n"
                  "                _gp_site._device_stop(_gp_tok)\n",
    "nvtx_pop": "            _gp_site._nvtx_pop()\n",
    "memory": "            _gp_site._read_memory()\n",
    "audit_start": "        _gp_audit = _gp_site._audit_start()\n",
    "audit_stop": "            if _gp_audit is not None:\n"
                  "                _gp_site._audit_stop(_gp_audit)\n",
}

_factories: dict[tuple[Any, ...], Callable[..., Any]] = {}


# The names the wrapper's body reads besides its own `_gp_` locals: a parameter of one of these names
# would hide it, so such a function gets the (*args, **kwargs) wrapper.
_BODY_NAMES = frozenset({"_on", "_is_compiling", "perf_counter_ns", "BaseException", "AttributeError", "len"})


def _code_signature(fn: types.FunctionType) -> inspect.Signature:
    """The parameters ``fn``'s code takes, with its defaults: what a call binds to, whatever its
    ``__signature__`` declares (a declared signature describes the function, it does not change how a
    call binds, so copying it would change the call).

    Raises:
        ValueError: the code's parameters cannot be written as a signature (defaults that do not fit).
    """
    code = fn.__code__
    names = code.co_varnames
    positional = code.co_argcount
    keyword_only = code.co_kwonlyargcount
    positional_only = code.co_posonlyargcount
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__ or {}
    if len(defaults) > positional:
        raise ValueError("more defaults than positional parameters")
    empty = inspect.Parameter.empty
    first_default = positional - len(defaults)
    params = []
    for i in range(positional):
        kind = inspect.Parameter.POSITIONAL_ONLY if i < positional_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = defaults[i - first_default] if i >= first_default else empty
        params.append(inspect.Parameter(names[i], kind, default=default))
    at = positional + keyword_only
    if code.co_flags & inspect.CO_VARARGS:
        params.append(inspect.Parameter(names[at], inspect.Parameter.VAR_POSITIONAL))
        at += 1
    for name in names[positional:positional + keyword_only]:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=kwdefaults.get(name, empty)))
    if code.co_flags & inspect.CO_VARKEYWORDS:
        params.append(inspect.Parameter(names[at], inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def _signature_source(fn: Callable[..., Any]) -> tuple[str, str, tuple[Any, ...], dict[str, Any]]:
    """The wrapper's parameter list and call expression, copying the parameters of ``fn``'s code.

    Why: a ``(*args, **kwargs)`` wrapper costs ~180 ns per call in packing and unpacking; one with
    the same parameters as ``fn`` costs ~45 ns (measured on CPython 3.11), which is what keeps a
    run-time-disabled probe within 100 ns of a bare call. The parameters are the code's, never a
    declared ``__signature__`` (see :func:`_code_signature`): the wrapper passes them on as ``fn``
    receives them, so a call binds as it would to ``fn`` itself.
    """
    generic: tuple[str, str, tuple[Any, ...], dict[str, Any]] = ("*_gp_args, **_gp_kwargs", "*_gp_args, **_gp_kwargs", (), {})
    if not isinstance(fn, types.FunctionType):
        return generic
    try:
        sig = _code_signature(fn)
    except (TypeError, ValueError, AttributeError, IndexError):
        return generic
    params: list[str] = []
    call: list[str] = []
    defaults: list[Any] = []
    kwdefaults: dict[str, Any] = {}
    saw_star = False
    positional_only = False
    for p in sig.parameters.values():
        name = p.name
        if name.startswith("_gp_") or not name.isidentifier() or name in _BODY_NAMES:
            return generic
        if p.kind is not p.POSITIONAL_ONLY and positional_only:
            params.append("/")
            positional_only = False
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional_only = p.kind is p.POSITIONAL_ONLY
            if p.default is not p.empty:
                params.append(f"{name}=_gp_defaults[{len(defaults)}]")
                defaults.append(p.default)
            else:
                params.append(name)
            call.append(name)
        elif p.kind is p.VAR_POSITIONAL:
            saw_star = True
            params.append(f"*{name}")
            call.append(f"*{name}")
        elif p.kind is p.KEYWORD_ONLY:
            if not saw_star:
                params.append("*")
                saw_star = True
            if p.default is not p.empty:
                params.append(f"{name}=_gp_kwdefaults[{name!r}]")
                kwdefaults[name] = p.default
            else:
                params.append(name)
            call.append(f"{name}={name}")
        else:  # VAR_KEYWORD
            params.append(f"**{name}")
            call.append(f"**{name}")
    if positional_only:
        params.append("/")
    return ", ".join(params), ", ".join(call), tuple(defaults), kwdefaults


def _build(fn: Callable[..., Any], site: Probe, params: str, call: str, defaults: tuple[Any, ...],
           kwdefaults: dict[str, Any]) -> Callable[..., Any]:
    """A new wrapper of ``fn`` with the parts ``site``'s current binding needs."""
    b = site._b
    assert b is not None
    timed = b.timed
    wanted = {
        "sampled_check": site.every > 1,
        "nvtx_push": b.nvtx,
        "nvtx_pop": b.nvtx,
        "timer_start": timed and site._dev_n == 1,
        "timer_start_sampled": timed and site._dev_n > 1,
        "timer_stop": timed,
        "memory": b.memory,
        "audit_start": b.audit,
        "audit_stop": b.audit,
    }
    key = (params, call, tuple(sorted(k for k, on in wanted.items() if on)))
    factory = _factories.get(key)
    if factory is None:
        parts = {k: (_PARTS[k] if on else "") for k, on in wanted.items()}
        source = _SYNC_BODY.format(params=params, call=call, **parts)
        namespace: dict[str, Any] = {}
        # The factory's globals are this module's, so `_on` and `_is_compiling` are read live.
        exec(compile(source, f"<gpuprobe wrapper {_callable_name(fn)}>", "exec"), globals(), namespace)
        factory = namespace["_gp_factory"]
        if len(_factories) < 1024:  # one per parameter list and parts: code's, but never without limit
            _factories[key] = factory
    return factory(fn, site, defaults, kwdefaults, site._local, b.limit)  # type: ignore[no-any-return]


def _wrap_sync(fn: Callable[..., Any], site: Probe) -> Callable[..., Any]:
    params, call, defaults, kwdefaults = _signature_source(fn)
    with _sites_lock:
        wrapper = _build(fn, site, params, call, defaults, kwdefaults)
        functools.update_wrapper(wrapper, fn)
        wrapper.__gpuprobe__ = site  # type: ignore[attr-defined]
        wrapper._gp_source = (fn, params, call, defaults, kwdefaults)  # type: ignore[attr-defined]
        site._wrappers.append(weakref.ref(wrapper))
    return wrapper


def _regenerate(wrapper: Any, site: Probe) -> None:
    """Turn ``wrapper`` into the variant the site's new binding needs, in place.

    Why in place: the user holds the wrapper (it replaced their function at decoration), so it must
    change itself. A function's code object can be replaced when the new code has the same free
    variables; every variant has the same four cells, so their contents are moved over. A call
    already running finishes through the site's current binding (a probe with no device clock gets a
    stand-in that gives a started event back, never None).
    """
    fn, params, call, defaults, kwdefaults = wrapper._gp_source
    fresh = _build(fn, site, params, call, defaults, kwdefaults)
    if fresh.__code__.co_freevars != wrapper.__code__.co_freevars:  # pragma: no cover - fixed by _SYNC_BODY
        site.rt.warn_once("rebind", f"gpuprobe: {site!r} keeps its previous settings (wrapper layout changed)")
        return
    for old_cell, new_cell in zip(wrapper.__closure__, fresh.__closure__ or ()):
        old_cell.cell_contents = new_cell.cell_contents
    wrapper.__code__ = fresh.__code__


def _wrap_async(fn: Callable[..., Any], site: Probe) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _on or _is_compiling() or (site.every > 1 and site._skip()):
            return await fn(*args, **kwargs)
        b = site._b
        assert b is not None
        rid = b.start_range(b.handle) if b.nvtx else None
        t0 = perf_counter_ns()
        exc: BaseException | None = None
        try:
            return await fn(*args, **kwargs)
        except BaseException as e:
            exc = e
            raise
        finally:
            dt = perf_counter_ns() - t0
            if rid is not None:
                b.end_range(rid)
            site._finish(b, dt, exc)

    wrapper.__gpuprobe__ = site  # type: ignore[attr-defined]
    return wrapper


def _wrap_generator(fn: Callable[..., Any], site: Probe) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # This body runs at the first next(): that is where the range starts.
        if not _on or _is_compiling() or (site.every > 1 and site._skip()):
            return (yield from fn(*args, **kwargs))
        b = site._b
        assert b is not None
        rid = b.start_range(b.handle) if b.nvtx else None
        t0 = perf_counter_ns()
        exc: BaseException | None = None
        try:
            return (yield from fn(*args, **kwargs))
        except GeneratorExit:
            raise  # closed early by its consumer: not an error
        except BaseException as e:
            exc = e
            raise
        finally:
            dt = perf_counter_ns() - t0
            if rid is not None:
                b.end_range(rid)
            site._finish(b, dt, exc)

    wrapper.__gpuprobe__ = site  # type: ignore[attr-defined]
    return wrapper


@overload
def probe(fn: F, /) -> F: ...


@overload
def probe(name: str | None = None, /, *, kind: str = "user", attrs: Mapping[str, Any] | None = None,
          every: int = 1, memory: bool | None = None, sync_audit: bool = False,
          device_every: int | None = None) -> Probe: ...


def probe(name: Any = None, /, *, kind: str = "user", attrs: Mapping[str, Any] | None = None,
          every: int = 1, memory: bool | None = None, sync_audit: bool = False,
          device_every: int | None = None) -> Any:
    """Measure a function or a block: NVTX range, host (and CUDA-event) time, optional memory.

    Args:
        name: the probe's name (a label value and the NVTX message). Defaults to the decorated
            function's ``__qualname__``; a ``with`` block must be named. Use names from code, never
            from data.
        kind: ``user`` (default), ``step``, ``layer``, ``logits_processor``, ...: the NVTX category
            and the ``kind`` label.
        attrs: extra labels, ``str`` to ``str/int/float/bool``; values past the per-label cap fold
            into ``other``.
        every: record one call in ``every`` (sampling); the others run unmeasured.
        memory: read memory at the end of each recorded call (default: the ``memory`` setting).
        sync_audit: count the operations that force a device-to-host synchronisation inside each
            recorded call (a function or a ``with`` block), in ``gpuprobe.step.syncs`` with
            ``component="probe"`` and ``processor=<name>`` (see ``docs/sync-audit.md``). An audited
            call costs about 1 us more per ATen operator: use ``every=`` on hot paths.
        device_every: take a device span (CUDA events) on one recorded call in N (calls N, 2N, ...);
            host time is still taken on every recorded call. Default: the ``device_every`` setting
            (``auto``: every call, sampled down once the probe takes more than
            :data:`DEVICE_SPAN_BUDGET` spans a second).

    Returns:
        The wrapped function (decorator forms) or a :class:`Probe` (``with`` forms).

    Raises:
        ConfigError: a bad argument, or a ``with`` block without a name; the message names it.

    Example:
        >>> from gpuprobe import probe
        >>> @probe
        ... def add(a, b):
        ...     return a + b
        >>> add(1, 2)
        3
        >>> with probe("block"):
        ...     _ = sum(range(10))
    """
    if (callable(name) or isinstance(name, (staticmethod, classmethod, property))) and not isinstance(name, str):
        if DISABLED_AT_IMPORT:
            return name
        return Probe(None, kind, attrs, every, memory, sync_audit, device_every)(name)
    if DISABLED_AT_IMPORT:
        _check(name, kind, attrs, every, sync_audit, device_every)
        return _DisabledProbe(name is not None)
    if name is None:
        return Probe(None, kind, attrs, every, memory, sync_audit, device_every)
    # Why a cache: `with probe("x"):` in a loop would otherwise register the NVTX string and look up
    # its series on every pass (~5 us); a dict hit is ~0.2 us.
    try:
        key = (name, kind, tuple(sorted(attrs.items())) if attrs else (), every, memory, sync_audit, device_every)
        found = _cache.get(key) or _recent_folded.get(key)
    except (TypeError, AttributeError):  # bad attrs: let _check name the problem
        key, found = None, None
    if found is None:
        found = Probe(name, kind, attrs, every, memory, sync_audit, device_every)
        if key is not None:
            if not found._folded:
                if len(_cache) < 10_000:
                    _cache[key] = found
            else:
                _keep_folded(key, found)
    return found


_cache: dict[Any, Probe] = {}
# Names folded into `other` are not kept in _cache (the names a program makes up would fill it): only the
# last _RECENT_FOLDED of them. Why any: a `with` block over a name prepared anew costs ~12 us against
# ~2 us over a kept one (measured on CPython 3.11), and a loop over one folded name would pay it every pass.
_recent_folded: dict[Any, Probe] = {}
_RECENT_FOLDED = 256


def _keep_folded(key: Any, site: Probe) -> None:
    """Keep ``site`` among the recent folded probes, forgetting the oldest when there are too many."""
    try:
        while len(_recent_folded) >= _RECENT_FOLDED:
            del _recent_folded[next(iter(_recent_folded))]
    except (KeyError, RuntimeError, StopIteration):  # another thread forgot it first
        pass
    _recent_folded[key] = site


class _DisabledProbe:
    """What :func:`probe` returns with ``GPUPROBE_DISABLE=1``: the identity decorator, a no-op block."""

    __slots__ = ("_named",)

    def __init__(self, named: bool) -> None:
        self._named = named

    def __call__(self, fn: F) -> F:
        return fn

    def __enter__(self) -> _DisabledProbe:
        if not self._named:
            raise ConfigError(_NAMELESS)
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    async def __aenter__(self) -> _DisabledProbe:
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        return None


on_reconfigure(_rebind_all)
