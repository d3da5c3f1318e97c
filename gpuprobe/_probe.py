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
- ``with probe(...)``: the block (push/pop range); ``async with``: the block, start/end range.

An exception inside propagates unchanged; the range is closed and ``gpuprobe.probe.errors`` counts
it with ``error.type``. Each thread has its own stack of open ``with`` blocks.

Cost model: all choices (backends, sampling, memory) are made when the probe is prepared; a call
checks one flag when gpuprobe is disabled at run time, and with ``GPUPROBE_DISABLE=1`` at import the
decorator hands back the function itself.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from types import TracebackType
from typing import Any, TypeVar, overload

from . import config, memory
from .collector import Runtime, runtime
from .errors import ConfigError

__all__ = ["probe", "Probe", "enable", "disable", "is_enabled"]

F = TypeVar("F", bound=Callable[..., Any])

# Read once at import: with GPUPROBE_DISABLE=1, decoration returns the function itself.
_DISABLED_AT_IMPORT = config.current().disable
# The run-time switch: one global read per call.
_on = True


def enable() -> None:
    """Turn probes back on after :func:`disable`.

    Example:
        >>> import gpuprobe
        >>> gpuprobe.disable(); gpuprobe.enable()
    """
    global _on
    _on = True


def disable() -> None:
    """Turn every probe off at run time; a probed call then costs one flag check."""
    global _on
    _on = False


def is_enabled() -> bool:
    """Whether probes record (False after :func:`disable` or with ``GPUPROBE_DISABLE=1``)."""
    return _on and not _DISABLED_AT_IMPORT


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


def _check(name: Any, kind: Any, attrs: Any, every: Any) -> dict[str, str]:
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


class Probe:
    """A prepared probe: a decorator and a (sync or async) context manager.

    Made by :func:`probe`; prepared once (NVTX string registered, series bound), used many times.
    """

    __slots__ = (
        "name", "kind", "attrs", "every", "memory", "rt", "handle", "host", "device",
        "_errors", "_mem", "_n", "_stack", "_local",
    )

    def __init__(self, name: str | None, kind: str = "user", attrs: Mapping[str, Any] | None = None,
                 every: int = 1, memory: bool | None = None) -> None:
        self.attrs = _check(name, kind, attrs, every)
        self.name = name
        self.kind = kind
        self.every = every
        self.memory = memory
        self._n = 0
        self._stack = threading.local()
        self._local = threading.local()  # .queue: this thread's queue of host durations
        if name is not None:
            self._bind(runtime())

    def _bind(self, rt: Runtime) -> None:
        rt.backends()
        self.rt = rt
        if self.memory is None:
            self.memory = rt.cfg.memory
        name = self.name or "?"
        self.handle = rt.nvtx.prepare(name, self.kind)
        dur = rt.family("gpuprobe.probe.duration")
        self.host = dur.child(probe=name, kind=self.kind, clock="host", **self.attrs)
        self.device = dur.child(probe=name, kind=self.kind, clock="device", **self.attrs) if rt.timer else None
        self._errors = rt.family("gpuprobe.probe.errors")
        mem = rt.family
        dev = rt.device
        self._mem = (mem("gpuprobe.memory.allocated").child(device=dev),
                     mem("gpuprobe.memory.reserved").child(device=dev),
                     mem("gpuprobe.memory.peak").child(device=dev))

    # -- slow paths, shared by every form ----------------------------------------------------
    def _error(self, exc: BaseException) -> None:
        rt = self.rt
        rt.emit(self._errors.child(probe=self.name, **{"error.type": type(exc).__qualname__}), 1)
        if rt.cfg.snapshot_on_oom and type(exc).__name__ == "OutOfMemoryError":
            memory.triggered_snapshot(rt.cfg.snapshot_dir, "oom")

    def _read_memory(self) -> None:
        rt = self.rt
        try:
            alloc, reserved, peak = rt.read_memory()  # type: ignore[misc]
        except Exception as exc:
            rt.warn_once("memory", f"gpuprobe: memory reading failed: {exc!r}")
            return
        a, r, p = self._mem
        rt.emit(a, alloc)
        if reserved is not None:
            rt.emit(r, reserved)
        rt.emit(p, peak)

    def _skip(self) -> bool:
        # Sampling: record one call in ``every`` (a racy count across threads is fine for sampling).
        self._n += 1
        return self._n % self.every != 0

    # -- decorator ---------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        if _DISABLED_AT_IMPORT:
            return fn
        if not callable(fn):
            raise TypeError(f"probe() decorates callables, got {type(fn).__name__}")
        site = self
        if self.name is None:
            site = Probe(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "callable"),
                         self.kind, self.attrs, self.every, self.memory)
        if inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"probe() cannot wrap the async generator {fn.__qualname__}; use 'async with probe(...)' inside it"
            )
        if inspect.iscoroutinefunction(fn):
            return _wrap_async(fn, site)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            return _wrap_generator(fn, site)  # type: ignore[return-value]
        return _wrap_sync(fn, site)  # type: ignore[return-value]

    # -- context managers --------------------------------------------------------------------
    def _frames(self) -> list[Any]:
        try:
            return self._stack.frames  # type: ignore[no-any-return]
        except AttributeError:
            frames: list[Any] = []
            self._stack.frames = frames
            return frames

    def __enter__(self) -> Probe:
        frames = self._frames()
        if not _on or _DISABLED_AT_IMPORT or _is_compiling() or self.name is None or (self.every > 1 and self._skip()):
            frames.append(None)
            return self
        rt = self.rt
        nv = rt.nvtx
        if nv.enabled:
            nv.push(self.handle)
        timer = rt.timer
        frames.append((timer.start() if timer is not None else None, perf_counter_ns()))
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        frame = self._frames().pop()
        if frame is None:
            return
        self._finish(frame, ev, nvtx_pop=True)

    async def __aenter__(self) -> Probe:
        frames = self._frames()
        if not _on or _DISABLED_AT_IMPORT or _is_compiling() or self.name is None or (self.every > 1 and self._skip()):
            frames.append(None)
            return self
        rt = self.rt
        rid = rt.nvtx.start(self.handle) if rt.nvtx.enabled else None
        timer = rt.timer
        frames.append((timer.start() if timer is not None else None, perf_counter_ns(), rid))
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        frame = self._frames().pop()
        if frame is None:
            return
        self._finish(frame[:2], ev, nvtx_pop=False)
        if frame[2] is not None:
            self.rt.nvtx.end(frame[2])

    def _finish(self, frame: tuple[Any, int], exc: BaseException | None, *, nvtx_pop: bool) -> None:
        tok, t0 = frame
        dt = perf_counter_ns() - t0
        rt = self.rt
        if tok is not None:
            rt.emit(rt.pending_target, (self.device, rt.timer.stop(tok)))  # type: ignore[union-attr]
        if nvtx_pop and rt.nvtx.enabled:
            rt.nvtx.pop()
        if exc is not None:
            self._error(exc)
        if self.memory:
            self._read_memory()
        try:
            queue = self._local.queue
        except AttributeError:
            queue = rt.value_queue(self.host, self._local)
        queue.append(dt)
        if len(queue) >= rt.cfg.buffer_size:
            rt.drain()

    def __repr__(self) -> str:
        return f"probe({self.name!r}, kind={self.kind!r})"


_SYNC_BODY = """
def _gp_factory(_gp_fn, _gp_site, _gp_defaults, _gp_kwdefaults, _gp_push, _gp_pop, _gp_handle,
                _gp_timer, _gp_device, _gp_pending, _gp_local, _gp_host, _gp_new_queue, _gp_drain, _gp_limit):
    def wrapper({params}):
        if not _on or _is_compiling(){sampled_check}:
            return _gp_fn({call})
{nvtx_push}{timer_start}        _gp_t0 = perf_counter_ns()
        try:
            return _gp_fn({call})
        except BaseException as _gp_exc:
            _gp_site._error(_gp_exc)
            raise
        finally:
            _gp_dt = perf_counter_ns() - _gp_t0
{timer_stop}{nvtx_pop}{memory}            try:
                # Why inline, and a bare value: a method call costs ~60 ns and a tuple per record
                # ~30 ns; the queue belongs to this probe and this thread.
                _gp_queue = _gp_local.queue
            except AttributeError:
                _gp_queue = _gp_new_queue(_gp_host, _gp_local)
            _gp_queue.append(_gp_dt)
            if len(_gp_queue) >= _gp_limit:
                _gp_drain()
    return wrapper
"""

# Optional parts of the wrapper, included only when the probe needs them (decided once, when the
# probe wraps the function, so a call never tests a switch that cannot change).
_PARTS = {
    "sampled_check": " or _gp_site._skip()",
    "nvtx_push": "        _gp_push(_gp_handle)\n",
    "timer_start": "        _gp_tok = _gp_timer.start()\n",
    "timer_stop": "            if _gp_tok is not None:\n"
                  "                _gp_site.rt.emit(_gp_pending, (_gp_device, _gp_timer.stop(_gp_tok)))\n",
    "nvtx_pop": "            _gp_pop()\n",
    "memory": "            _gp_site._read_memory()\n",
}

_factories: dict[tuple[Any, ...], Callable[..., Any]] = {}


def _signature_source(fn: Callable[..., Any]) -> tuple[str, str, tuple[Any, ...], dict[str, Any]]:
    """The wrapper's parameter list and call expression, copying ``fn``'s own signature.

    Why: a ``(*args, **kwargs)`` wrapper costs ~180 ns per call in packing and unpacking; one with
    the same parameters as ``fn`` costs ~45 ns (measured on CPython 3.11), which is what keeps a
    run-time-disabled probe within 100 ns of a bare call.
    """
    generic: tuple[str, str, tuple[Any, ...], dict[str, Any]] = ("*_gp_args, **_gp_kwargs", "*_gp_args, **_gp_kwargs", (), {})
    if not inspect.isfunction(fn):
        return generic
    try:
        sig = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return generic
    params: list[str] = []
    call: list[str] = []
    defaults: list[Any] = []
    kwdefaults: dict[str, Any] = {}
    saw_star = False
    positional_only = False
    for p in sig.parameters.values():
        name = p.name
        if name.startswith("_gp_") or not name.isidentifier():
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


def _wrap_sync(fn: Callable[..., Any], site: Probe) -> Callable[..., Any]:
    rt = site.rt
    nv = rt.nvtx
    params, call, defaults, kwdefaults = _signature_source(fn)
    wanted = {
        "sampled_check": site.every > 1,
        "nvtx_push": nv.enabled,
        "nvtx_pop": nv.enabled,
        "timer_start": rt.timer is not None,
        "timer_stop": rt.timer is not None,
        "memory": bool(site.memory),
    }
    key = (params, call, tuple(sorted(k for k, on in wanted.items() if on)))
    factory = _factories.get(key)
    if factory is None:
        parts = {k: (_PARTS[k] if on else "") for k, on in wanted.items()}
        source = _SYNC_BODY.format(params=params, call=call, **parts)
        namespace: dict[str, Any] = {}
        # The factory's globals are this module's, so `_on` and `_is_compiling` are read live.
        exec(compile(source, f"<gpuprobe wrapper {fn.__qualname__}>", "exec"), globals(), namespace)
        factory = namespace["_gp_factory"]
        _factories[key] = factory
    wrapper = factory(
        fn, site, defaults, kwdefaults, nv.push, nv.pop, site.handle, rt.timer, site.device, rt.pending_target,
        site._local, site.host, rt.value_queue, rt.drain, rt.cfg.buffer_size,
    )
    functools.update_wrapper(wrapper, fn)
    wrapper.__gpuprobe__ = site  # type: ignore[attr-defined]
    return wrapper  # type: ignore[no-any-return]


def _wrap_async(fn: Callable[..., Any], site: Probe) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _on or _is_compiling() or (site.every > 1 and site._skip()):
            return await fn(*args, **kwargs)
        rt = site.rt
        rid = rt.nvtx.start(site.handle) if rt.nvtx.enabled else None
        timer = rt.timer
        frame = (timer.start() if timer is not None else None, perf_counter_ns())
        exc: BaseException | None = None
        try:
            return await fn(*args, **kwargs)
        except BaseException as e:
            exc = e
            raise
        finally:
            site._finish(frame, exc, nvtx_pop=False)
            if rid is not None:
                rt.nvtx.end(rid)

    wrapper.__gpuprobe__ = site  # type: ignore[attr-defined]
    return wrapper


def _wrap_generator(fn: Callable[..., Any], site: Probe) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # This body runs at the first next(): that is where the range starts.
        if not _on or _is_compiling() or (site.every > 1 and site._skip()):
            return (yield from fn(*args, **kwargs))
        rt = site.rt
        rid = rt.nvtx.start(site.handle) if rt.nvtx.enabled else None
        timer = rt.timer
        frame = (timer.start() if timer is not None else None, perf_counter_ns())
        exc: BaseException | None = None
        try:
            return (yield from fn(*args, **kwargs))
        except GeneratorExit:
            raise  # closed early by its consumer: not an error
        except BaseException as e:
            exc = e
            raise
        finally:
            site._finish(frame, exc, nvtx_pop=False)
            if rid is not None:
                rt.nvtx.end(rid)

    wrapper.__gpuprobe__ = site  # type: ignore[attr-defined]
    return wrapper


@overload
def probe(fn: F, /) -> F: ...


@overload
def probe(name: str | None = None, /, *, kind: str = "user", attrs: Mapping[str, Any] | None = None,
          every: int = 1, memory: bool | None = None) -> Probe: ...


def probe(name: Any = None, /, *, kind: str = "user", attrs: Mapping[str, Any] | None = None,
          every: int = 1, memory: bool | None = None) -> Any:
    """Measure a function or a block: NVTX range, host (and CUDA-event) time, optional memory.

    Args:
        name: the probe's name (a label value and the NVTX message). Defaults to the decorated
            function's ``__qualname__``. Use names from code, never from data.
        kind: ``user`` (default), ``step``, ``layer``, ``logits_processor``, ...: the NVTX category
            and the ``kind`` label.
        attrs: extra labels, ``str`` to ``str/int/float/bool``; values past the per-label cap fold
            into ``other``.
        every: record one call in ``every`` (sampling); the others run unmeasured.
        memory: read memory at the end of each recorded call (default: the ``memory`` setting).

    Returns:
        The wrapped function (decorator forms) or a :class:`Probe` (``with`` forms).

    Raises:
        ConfigError: a bad argument; the message names it.

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
    if callable(name) and not isinstance(name, str):
        if _DISABLED_AT_IMPORT:
            return name
        return Probe(None, kind, attrs, every, memory)(name)
    if _DISABLED_AT_IMPORT:
        _check(name, kind, attrs, every)
        return _DisabledProbe()
    if name is None:
        return Probe(None, kind, attrs, every, memory)
    # Why a cache: `with probe("x"):` in a loop would otherwise register the NVTX string and look up
    # its series on every pass (~5 us); a dict hit is ~0.2 us.
    try:
        key = (name, kind, tuple(sorted(attrs.items())) if attrs else (), every, memory)
        found = _cache.get(key)
    except (TypeError, AttributeError):  # bad attrs: let _check name the problem
        key, found = None, None
    if found is None:
        found = Probe(name, kind, attrs, every, memory)
        if key is not None and len(_cache) < 10_000:
            _cache[key] = found
    return found


_cache: dict[Any, Probe] = {}


class _DisabledProbe:
    """What :func:`probe` returns with ``GPUPROBE_DISABLE=1``: the identity decorator, a no-op block."""

    __slots__ = ()

    def __call__(self, fn: F) -> F:
        return fn

    def __enter__(self) -> _DisabledProbe:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    async def __aenter__(self) -> _DisabledProbe:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None
