"""Seams: every point where gpuprobe puts its own callable in place of another library's.

One mechanism for all of them (transformers' generation and continuous-batching methods, the CUDA
graph capture guard, the sync audit's dispatcher kernels, the logits-processor and streamer timers,
``gpuprobe run``'s start-up hook, the OpenTelemetry instrumentor). Each patched point is declared once
as a :class:`Seam` (module level, in the module that patches it), so the registry lists every seam the
code can install — the fail-open tests iterate it, ``gpuprobe.info()["seams"]`` shows it.

The promise a seam keeps::

    replacement(*args, **kwargs):
        before(...)                  guarded: gpuprobe's own work
        result = original(*args, **kwargs)      exactly once, arguments untouched
        after(..., result, error)    guarded
        return result                the original's own result (or its own exception, re-raised)

Any exception in ``before``/``after`` turns the seam's switch off for the process: from then on the
replacement only calls the original (one attribute test more than the original alone). The failure is
counted in ``gpuprobe.seam.disabled{seam}`` and warned once, naming the seam, the library versions and
what to report. Seams that only make sense together (the steps of one ``generate()`` call) share a
switch, so one of them failing turns the others off too.

Before anything is patched a seam's shape is checked (:meth:`Seam.check`): the attribute exists and
is callable, and every parameter gpuprobe reads is a parameter of it — read by name
(:class:`ArgReader`), never by position. On a mismatch the seam is not installed and ``info()`` says
why; the rest of the integration measures what it can.

This module is a leaf: it imports nothing of gpuprobe. The runtime gives it a reporter
(:func:`set_reporter`) that counts and warns; without one a failure is warned with :mod:`warnings`.
"""

from __future__ import annotations

import inspect
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from types import FunctionType, MethodType
from typing import Any

__all__ = [
    "Seam", "Switch", "Patch", "ArgReader", "declare", "registry", "seam", "set_reporter", "reset",
    "wrap", "wrap_method", "unwrapped", "is_replacement", "status", "inject_fault", "MISSING",
]

MISSING: Any = object()
"""Marks an attribute that was not in an object's own ``__dict__`` before it was patched."""

_Reporter = Callable[["Seam", BaseException], None]
_reporter: _Reporter | None = None
_warn_once: Callable[[str, str], None] | None = None
_lock = threading.RLock()


class Switch:
    """On/off for the seams of one group; read on every call (a plain attribute load)."""

    __slots__ = ("on", "group", "why", "when_off")

    def __init__(self, group: str) -> None:
        self.on = True
        self.group = group
        self.why: str | None = None  # why it is off: the seam and the exception
        # Called (without arguments) when the switch goes off: state kept by the seams' hooks that must
        # not outlive them (a capture counted as begun whose end will not be counted).
        self.when_off: list[Callable[[], None]] = []


_switches: dict[str, Switch] = {}
_registry: dict[str, Seam] = {}


class Seam:
    """One patched point: what is replaced, what gpuprobe reads of it, and whether it is on.

    Args:
        name: a stable dotted name, e.g. ``"transformers.generate.prefill"``: the ``seam`` label of
            ``gpuprobe.seam.disabled`` (a bounded set: one per declaration).
        target: what is replaced, in words (``"GenerationMixin._prefill, per model instance"``).
        library: whose function it is (``transformers``, ``torch``, ``python``, ``opentelemetry``).
        attribute: the attribute patched on its owner, if the seam patches one.
        reads: the parameters of the original that gpuprobe reads, by name.
        group: seams that fail together share their group's switch (default: the seam alone).
        scenario: how the fail-open tests exercise it (``generate``, ``generate_batch``, ...).
    """

    __slots__ = ("name", "target", "library", "attribute", "reads", "group", "scenario", "switch",
                 "refused", "installs", "replacements", "__weakref__")

    def __init__(self, name: str, *, target: str, library: str, attribute: str | None = None,
                 reads: tuple[str, ...] = (), group: str | None = None, scenario: str = "") -> None:
        self.name = name
        self.target = target
        self.library = library
        self.attribute = attribute
        self.reads = reads
        self.group = group or name
        self.scenario = scenario
        with _lock:
            switch = _switches.get(self.group)
            if switch is None:
                switch = _switches[self.group] = Switch(self.group)
        self.switch = switch
        self.refused: str | None = None  # the last shape mismatch: not installed, and why
        self.installs = 0  # patches in place now
        self.replacements: weakref.WeakSet[Any] = weakref.WeakSet()  # built by wrap()/wrap_method()

    @property
    def on(self) -> bool:
        """Whether gpuprobe's work around this seam runs (False once it failed)."""
        return self.switch.on

    # -- before patching ------------------------------------------------------------------------
    def check(self, owner: Any) -> str | None:
        """Whether ``owner`` has the shape this seam needs; ``None`` if it does, else why not.

        A mismatch is remembered (``info()`` shows it); call :meth:`refuse` yourself for a mismatch
        found another way.
        """
        why = self.mismatch(owner)
        if why is not None:
            self.refuse(why)
        return why

    def mismatch(self, owner: Any) -> str | None:
        """What :meth:`check` would say of ``owner``, remembering and warning nothing (``gpuprobe doctor``
        asks before anything is patched)."""
        if self.attribute is None:
            return None
        fn = getattr(owner, self.attribute, None)
        if not callable(fn):
            return f"{_describe(owner)} has no callable {self.attribute}"
        why = missing_parameters(fn, self.reads)
        return None if why is None else f"{_describe(owner)}.{self.attribute}: {why}"

    def refuse(self, why: str, *, quiet: bool = False) -> None:
        """Record that this seam was not installed, and why (a shape mismatch); warned once per seam
        unless ``quiet`` (a consequence of another seam's refusal, already said)."""
        first = self.refused is None
        self.refused = why
        if first and not quiet:
            message = (f"gpuprobe: its seam {self.name} ({self.target}) is not installed: {why}; the rest of "
                       f"gpuprobe measures what it can (gpuprobe.info()['seams'])")
            try:
                if _warn_once is not None:
                    _warn_once(f"refused:{self.name}", message)
                else:
                    warnings.warn(message, RuntimeWarning, stacklevel=3)
            except Exception:
                pass

    # -- while installed --------------------------------------------------------------------------
    def fail(self, exc: BaseException, *, report: bool = True) -> None:
        """gpuprobe's own work around this seam raised: the seam's switch goes off for the process.

        Never raises. Counted and warned once through the reporter the runtime set (``report=False``:
        the caller has said it already).
        """
        try:
            switch = self.switch
            if not switch.on:
                return
            switch.on = False
            switch.why = f"{self.name}: {type(exc).__name__}: {exc}"
            for forget in list(switch.when_off):
                try:
                    forget()
                except Exception:
                    pass
            reporter = _reporter
            if not report:
                return
            if reporter is not None:
                reporter(self, exc)
            else:
                warnings.warn(failure_message(self, exc), RuntimeWarning, stacklevel=3)
        except Exception:  # reporting must never reach the program either
            pass

    def patch(self, owner: Any, replacement: Any, *, on_class: bool = False) -> Patch:
        """Put ``replacement`` in place of ``owner.<attribute>``; undone by :meth:`Patch.undo`.

        On an instance it goes into the instance's ``__dict__``; ``on_class=True`` sets it on the class.
        Whatever was there (the owner's own attribute) is kept and put back by ``undo``.
        """
        name = self.attribute
        if name is None:
            raise ValueError(f"seam {self.name} patches no attribute")
        if on_class:
            previous = owner.__dict__.get(name, MISSING)
            type.__setattr__(owner, name, replacement)
        else:
            d = owner.__dict__
            previous = d.get(name, MISSING)
            d[name] = replacement
        with _lock:
            self.installs += 1
        self.refused = None
        return Patch(self, owner, replacement, previous, on_class)

    def __repr__(self) -> str:
        state = "on" if self.on else "off"
        return f"Seam({self.name!r}, {state}, installs={self.installs})"


class Patch:
    """One installed replacement; :meth:`undo` puts back what was there (only if it is still ours)."""

    __slots__ = ("seam", "owner", "replacement", "previous", "on_class")

    def __init__(self, seam: Seam, owner: Any, replacement: Any, previous: Any, on_class: bool) -> None:
        self.seam = seam
        # A weak reference where the owner allows one: a patch never keeps a manager or a model alive.
        try:
            self.owner: Any = weakref.ref(owner)
        except TypeError:
            self.owner = lambda: owner
        self.replacement = replacement
        self.previous = previous
        self.on_class = on_class

    def undo(self) -> bool:
        """Restore the attribute; returns False when it was replaced since (then it is left as it is)."""
        owner = self.owner()
        seam = self.seam
        with _lock:
            if self.replacement is None:
                return False
            replacement, self.replacement = self.replacement, None
            seam.installs = max(0, seam.installs - 1)
        if owner is None:
            return True
        name = seam.attribute
        d = owner.__dict__
        if d.get(name) is not replacement:
            return False
        if self.on_class:
            if self.previous is MISSING:
                type.__delattr__(owner, name)
            else:
                type.__setattr__(owner, name, self.previous)
        elif self.previous is MISSING:
            del d[name]
        else:
            d[name] = self.previous
        return True



def declare(name: str, **fields: Any) -> Seam:
    """Declare a seam (once, at module level); a second declaration of the same name returns the first.

    Example:
        >>> s = declare("example.seam", target="Example.method", library="python", attribute="method")
        >>> s.on
        True
    """
    with _lock:
        found = _registry.get(name)
        if found is None:
            found = _registry[name] = Seam(name, **fields)
        return found


def registry() -> Iterator[Seam]:
    """Every seam declared by the modules imported so far, in declaration order."""
    with _lock:
        return iter(list(_registry.values()))


def seam(name: str) -> Seam:
    """The declared seam ``name`` (KeyError names the known ones)."""
    try:
        return _registry[name]
    except KeyError:
        raise KeyError(f"no seam named {name!r}; declared: {', '.join(_registry)}") from None


def set_reporter(reporter: _Reporter | None, warn_once: Callable[[str, str], None] | None = None) -> None:
    """Who counts and warns when a seam fails, and who warns (once per key) when one is refused: the
    runtime sets itself."""
    global _reporter, _warn_once
    _reporter = reporter
    _warn_once = warn_once


def reset() -> None:
    """Every switch on again (a fresh process's state); for tests and :func:`gpuprobe.testing.reset`."""
    with _lock:
        for switch in _switches.values():
            switch.on = True
            switch.why = None
        for s in _registry.values():
            s.refused = None


def status() -> list[dict[str, Any]]:
    """One entry per declared seam: name, target, library, state, why, installs (for ``info()``).

    ``state``: ``on``; ``off`` (its own failure switched it off: ``why``); ``refused`` (the last shape
    check failed: ``why``).
    """
    out = []
    for s in registry():
        if not s.on:
            state, why = "off", s.switch.why
        elif s.refused is not None:
            state, why = "refused", s.refused
        else:
            state, why = "on", None
        out.append({"seam": s.name, "target": s.target, "library": s.library, "state": state, "why": why,
                    "installs": s.installs})
    return out


# -- the replacement ------------------------------------------------------------------------------

def _replacement_source(method: bool, before: bool, after: bool) -> str:
    """The source of a replacement of one shape (see :func:`wrap`); one template for every seam."""
    head = "self, *args, **kwargs" if method else "*args, **kwargs"
    pre = "st, " if method else ""
    lines = [f"def replacement({head}):"]
    if method:  # the state lives in the instance's __dict__; a copy of the instance (deepcopy) has none
        lines += ["    st = self.__dict__.get(key)",
                  "    if st is None:",
                  "        return unwrapped(type(self), name)(self, *args, **kwargs)",
                  "    original = st.originals[name]"]
    lines += ["    if not switch.on:",
              "        return original(*args, **kwargs)"]
    token = "None"
    if before:
        token = "token"
        lines += ["    try:",
                  f"        token = before({pre}args, kwargs)",
                  "    except Exception as exc:",
                  "        fail(exc)",
                  "        return original(*args, **kwargs)"]
    if not after:
        lines += ["    return original(*args, **kwargs)"]
        return "\n".join(lines) + "\n"
    lines += ["    try:",
              "        result = original(*args, **kwargs)",
              "    except BaseException as error:",
              "        try:",
              f"            after({pre}{token}, None, error)",
              "        except Exception as exc:",
              "            fail(exc)",
              "        raise",
              "    try:",
              f"        after({pre}{token}, result, None)",
              "    except Exception as exc:",
              "        fail(exc)",
              "    return result"]
    return "\n".join(lines) + "\n"


_compiled: dict[tuple[bool, bool, bool], Any] = {}


def _make(seam: Seam, method: bool, before: Any, after: Any, names: dict[str, Any]) -> Any:
    if before is None and after is None:
        raise ValueError(f"seam {seam.name}: a replacement needs a before or an after hook")
    shape = (method, before is not None, after is not None)
    code = _compiled.get(shape)
    if code is None:
        code = _compiled[shape] = compile(_replacement_source(*shape), "<gpuprobe seam>", "exec")
    scope = {"switch": seam.switch, "fail": seam.fail, "before": before, "after": after, **names}
    fault = _faults.get(seam.name)
    if fault is not None:
        _inject(scope, fault)
    exec(code, scope)  # noqa: S102 - gpuprobe's own template, no outside text
    fn = scope["replacement"]
    fn._gpuprobe_seam = seam
    seam.replacements.add(fn)
    return fn


# -- faults, for the fail-open tests (gpuprobe.testing.seam_fault) -------------------------------------

_faults: dict[str, BaseException] = {}


def _inject(scope: dict[str, Any], fault: BaseException) -> None:
    """Make the hooks of one replacement raise ``fault``: its before hook, else its after hook."""
    name = "before" if scope["before"] is not None else "after"
    hook = scope[name]
    scope.setdefault("_gp_healthy_" + name, hook)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise fault

    scope[name] = broken


def inject_fault(name: str, fault: BaseException | None) -> None:
    """Make gpuprobe's own work in seam ``name`` raise ``fault`` (None: heal it again), in the
    replacements built so far and those built later. For tests that prove a seam fails open."""
    s = seam(name)
    with _lock:
        if fault is None:
            _faults.pop(name, None)
        else:
            _faults[name] = fault
    for fn in list(s.replacements):
        scope = fn.__globals__
        if fault is None:
            for hook in ("before", "after"):
                healthy = scope.pop("_gp_healthy_" + hook, None)
                if healthy is not None:
                    scope[hook] = healthy
        else:
            _inject(scope, fault)


def wrap(seam: Seam, original: Callable[..., Any], before: Callable[..., Any] | None = None,
         after: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A replacement for ``original`` that keeps the seam's promise (see the module docstring).

    ``before(args, kwargs)`` returns a token (anything); ``after(token, result, error)`` sees the
    original's result, or its exception as ``error`` (``result`` is then None). Their return values
    are ignored: the caller always gets the original's own result or exception. A ``before`` that
    raises skips ``after`` for that call. A seam without one of the hooks pays no call for it.

    Example:
        >>> s = declare("example.wrap", target="a function", library="python")
        >>> seen = []
        >>> f = wrap(s, lambda x, **kw: x + 1, after=lambda tok, result, error: seen.append(result))
        >>> f(1, new_keyword=True), seen
        (2, [2])
    """
    fn = _make(seam, False, before, after, {"original": original})
    _dress(fn, original, seam.attribute)
    return fn


def wrap_method(seam: Seam, cls: type, state_key: str, before: Callable[..., Any] | None = None,
                after: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A replacement of ``cls.<seam.attribute>`` to bind to an instance (``types.MethodType(f, obj)``).

    The instance keeps its state object in ``obj.__dict__[state_key]``; the state's ``originals``
    maps the attribute to the callable that runs underneath (the class's method bound to ``obj``, or
    an instance attribute that was there before). Hooks get the state first: ``before(st, args,
    kwargs)``, ``after(st, token, result, error)`` (``args`` without ``self``). An instance without
    state (a deep copy: the state copies to None) runs the class's method as if unpatched.
    """
    name = seam.attribute
    original = unwrapped(cls, name)  # type: ignore[arg-type]
    fn = _make(seam, True, before, after, {"key": state_key, "name": name, "unwrapped": unwrapped})
    _dress(fn, original, name)
    return fn


def _dress(fn: Any, original: Any, name: str | None) -> None:
    """The replacement shows the original's name, docstring and (through ``__wrapped__``) signature."""
    fn.__name__ = getattr(original, "__name__", None) or name or "replacement"
    fn.__qualname__ = getattr(original, "__qualname__", fn.__name__)
    fn.__doc__ = getattr(original, "__doc__", None)
    fn.__wrapped__ = original


def unwrapped(cls: type, name: str) -> Any:
    """``cls.<name>`` looking through gpuprobe's class-wide replacements (marked ``_gpuprobe_class_wrapper``)."""
    fn = getattr(cls, name)
    while getattr(fn, "_gpuprobe_class_wrapper", False):
        fn = fn.__wrapped__
    return fn


def is_replacement(value: Any) -> bool:
    """Whether ``value`` (a function, or a method bound to one) is a replacement a seam made."""
    func = getattr(value, "__func__", value)
    return getattr(func, "_gpuprobe_seam", None) is not None


# -- reading the original's parameters by name ------------------------------------------------------

def missing_parameters(fn: Any, names: tuple[str, ...]) -> str | None:
    """Which of ``names`` ``fn`` does not take as a named parameter; None when it takes them all."""
    if not names:
        return None
    shape = _parameters(fn)
    if shape is None:
        return f"its signature cannot be read, and gpuprobe reads {', '.join(names)}"
    params = shape.names
    absent = [n for n in names if n not in params]
    if absent:
        return f"no parameter {', '.join(absent)} (it takes {', '.join(params) or 'nothing'})"
    return None


class _Shape:
    """What gpuprobe reads of a signature: every parameter's name, and those that can come by position."""

    __slots__ = ("names", "positional")

    def __init__(self, names: tuple[str, ...], positional: tuple[str, ...]) -> None:
        self.names = names
        self.positional = positional


# A plain function's parameter names come from its code object alone (not its defaults or annotations),
# so the shape read once stands for every function of that code, bound (``self`` left out) or not.
_shapes: dict[tuple[Any, bool], _Shape] = {}
_SHAPES_KEPT = 1024  # beyond it (code made at run time, again and again) a shape is read each time, not kept


def _plain_code(fn: Any) -> tuple[Any, bool] | None:
    """``(code, bound)`` whose parameters are ``fn``'s, for a plain function or a method bound to one, through
    ``functools.wraps`` chains; None for anything else (a ``__signature__``, a partial, a callable object)."""
    bound = type(fn) is MethodType
    func = fn.__func__ if bound else fn
    for _ in range(32):
        if type(func) is not FunctionType:
            return None
        d = func.__dict__
        if "__signature__" in d:
            return None
        inner = d.get("__wrapped__")
        if inner is None:
            return func.__code__, bound
        func = inner
    return None


def _parameters(fn: Any) -> _Shape | None:
    """The parameter names of ``fn``'s signature (the bound one for a bound method); None when unreadable."""
    key = _plain_code(fn)
    if key is not None:
        found = _shapes.get(key)
        if found is not None:
            return found
    # Why kept per code object: inspect.signature costs 45-85 us a method of a transformers model on the test
    # CPU, and instrumenting a model reads 13 (0.42 of the 1.2 ms instrument() takes; a budgeted block
    # instruments the model at its first generate() each time); a kept shape is two dict lookups.
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    shape = _Shape(tuple(p.name for p in params),
                   tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)))
    if key is not None and len(_shapes) < _SHAPES_KEPT:
        _shapes[key] = shape
    return shape


class ArgReader:
    """Reads the named parameters of calls to one callable from ``(args, kwargs)``, by name.

    The positions are read once from the callable's signature (the bound one: ``self`` excluded for
    a bound method), so a reordered or extended signature is read right.

    Example:
        >>> def f(a, b=None, *, c=None): ...
        >>> r = ArgReader(f, ("b", "c"))
        >>> r.get((1, 2), {}, "b"), r.get((1,), {"c": 3}, "c"), r.get((1,), {}, "b")
        (2, 3, None)
    """

    __slots__ = ("_positions",)

    def __init__(self, fn: Any, names: tuple[str, ...]) -> None:
        shape = _parameters(fn)
        positional = shape.positional if shape is not None else ()
        self._positions: dict[str, int | None] = {
            name: positional.index(name) if name in positional else None for name in names}

    def get(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, default: Any = None) -> Any:
        """The value passed for ``name`` (by position or keyword), else ``default``."""
        if name in kwargs:
            return kwargs[name]
        i = self._positions.get(name)
        if i is not None and i < len(args):
            return args[i]
        return default


# -- messages ---------------------------------------------------------------------------------------

def _describe(owner: Any) -> str:
    cls = owner if isinstance(owner, type) else type(owner)
    return cls.__qualname__


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        module = sys.modules.get(dist)
        return str(getattr(module, "__version__", "not installed"))


def failure_message(seam: Seam, exc: BaseException) -> str:
    """The warning of a failed seam: which, why, the versions, and what to report."""
    versions = ", ".join(f"{d} {_version(d)}" for d in ("gpuprobe", "torch", "transformers"))
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
    return (f"gpuprobe: its seam {seam.name} ({seam.target}) failed with {type(exc).__name__}: {exc}{where}; "
            f"it is off for this process and the program runs on unmeasured there. Versions: {versions}, "
            f"python {sys.version.split()[0]}. Please report this message to gpuprobe's issue tracker.")
