"""Observe Hugging Face transformers ``generate()`` from the inside: reversible, per model instance.

Quickstart::

    from gpuprobe.integrations.transformers import instrument
    instrument(model)                 # this model only; other instances are untouched
    model.generate(input_ids, max_new_tokens=64)
    gpuprobe.serve()                  # or gpuprobe.collect(), gpuprobe.configure(otlp_endpoint=...)

Per ``generate()`` call: time to first token, request duration (``error.type`` on failure), input and
output token usage, batch size, calls in flight, and an NVTX range. Per step: prefill/decode step time
(host clock, and device clock from CUDA events on GPUs), one inter-token sample per output token after
the first, and the step's components — ``forward``, each logits processor by class (those transformers
builds from the generation config included), ``stopping_criteria``, ``streamer`` and ``other`` — that
add up to the step. Opt-in: decoder-layer times sampled every N decode steps. Memory and KV-cache
gauges every ``memory_every`` steps and at the end of each call. See ``docs/transformers.md``.

How: transformers looks the methods of its generation loop up on the instance
(``self._prefill(...)``, ``self._has_unfinished_sequences(...)``, ...), so gpuprobe places methods of
the same names on the instance (not on the class: an instance patch of ``_sample`` would be ignored,
since ``generate`` fetches it from ``type(self)``). :func:`uninstrument` removes them again.

Continuous batching (``generate_batch``, ``init_continuous_batching``, ``transformers serve
--continuous-batching``) is observed through the manager ``init_continuous_batching`` returns: per
request, per scheduler step and the paged KV cache (see :mod:`._transformers.continuous` and ``docs/serving.md``).

Supported: transformers >= 5.18, < 6 (tested with 5.18 and 5.24, docs/compatibility.md); greedy, sampling and beam search, static and
dynamic caches, streamers, user logits processors and stopping criteria; assisted decoding and prompt
lookup, step by step with their drafts and what the main model accepts (:mod:`._transformers.generate.speculative`);
models with a ``generate()`` of their own (Whisper, MusicGen). The modes transformers moved to the Hub and
``custom_generate`` functions get the per-call metrics only (the table in ``docs/transformers.md``).
"""

from __future__ import annotations

import os
import threading
import types
import warnings
import weakref
from collections.abc import Iterable
from typing import Any, TypeVar

from .. import _seams
from ..errors import ConfigError, GpuprobeError
from ..runtime import DISABLED_AT_IMPORT, runtime
from ._transformers import generate as _g
from ._transformers.compat import (
    SUPPORTED_VERSIONS,
    TESTED_VERSION,
    UnsupportedModelError,
    UnsupportedVersionError,
    check_model,
    check_version,
    model_names,
)
from ._transformers.compat import import_transformers as _import_transformers
from ._transformers.generate.layers import find_layers
from ._transformers.generate.seams import fit_method_seams
from ._transformers.serve_app import instrument_server, uninstrument_server

__all__ = [
    "instrument",
    "uninstrument",
    "is_instrumented",
    "instrument_class",
    "uninstrument_class",
    "instrument_all",
    "uninstrument_all",
    "find_layers",
    "check_version",
    "SUPPORTED_VERSIONS",
    "UnsupportedVersionError",
    "UnsupportedModelError",
    "describe",
]

M = TypeVar("M")
C = TypeVar("C", bound=type)


def _default_name(model: Any) -> str:
    name, model_type = model_names(model)
    if name:
        # A local path names a folder on someone's disk: keep its last part only.
        if os.path.isabs(name) or name.startswith(".") or os.path.isdir(name):
            name = os.path.basename(os.path.normpath(name)) or name
        return name[:128]
    return model_type or type(model).__name__


def _check_options(model_name: Any, layers: Any, layer_every: Any, memory_every: Any) -> None:
    if model_name is not None and (not isinstance(model_name, str) or not model_name):
        raise ConfigError(f"instrument(model_name=) must be a non-empty string, got {model_name!r}")
    for key, value in (("layer_every", layer_every), ("memory_every", memory_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"instrument({key}=) must be an integer >= 1, got {value!r}")
    if not isinstance(layers, bool) and not isinstance(layers, Iterable):
        raise ConfigError(f"instrument(layers=) must be True/False or a list of modules, got {layers!r}")


_lock = threading.RLock()
_opted_out: weakref.WeakSet[Any] = weakref.WeakSet()


def instrument(model: M, *, model_name: str | None = None, layers: bool | Iterable[Any] = False,
               layer_every: int = 8, layer_index: bool = False, memory: bool = True, kv_cache: bool = True,
               memory_every: int = 8) -> M:
    """Measure this model's ``generate()`` calls, steps and (optionally) decoder layers.

    Reversible (:func:`uninstrument`) and idempotent: a second call with the same options does
    nothing; with other options it re-instruments. Only this instance changes.

    Args:
        model: a transformers model that can generate (``GenerationMixin``).
        model_name: the ``model`` / ``gen_ai.request.model`` label. Default: ``config.name_or_path``
            (the last folder of a local path), else ``config.model_type``.
        layers: ``True`` to time decoder layers (found from ``_no_split_modules``, else the largest
            ``nn.ModuleList`` of identical blocks), or the list of modules to time.
        layer_every: time layers on one decode step in this many (forward hooks are added for that
            step only).
        layer_index: add the ``layer.index`` label (one series per layer instead of per layer type).
        memory: memory gauges (allocated/reserved/peak) at step end.
        kv_cache: KV-cache bytes and sequence-length gauges at step end.
        memory_every: read the gauges on one step in this many (and at the end of every call).

    Returns:
        The same model.

    Raises:
        UnsupportedModelError: ``model`` cannot generate; the message names its type.
        UnsupportedVersionError: the installed transformers is not supported; the message names it.
        ConfigError: a bad option.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from gpuprobe.integrations.transformers import instrument, uninstrument
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                          num_attention_heads=4, num_key_value_heads=2, vocab_size=128))
        >>> model = instrument(model, model_name="tiny-llama")
        >>> _ = uninstrument(model)
    """
    check_model(model)
    _check_options(model_name, layers, layer_every, memory_every)
    if DISABLED_AT_IMPORT:  # GPUPROBE_DISABLE=1: decided once, nothing is patched
        return model
    layer_list: list[tuple[Any, int]]
    if layers is True:
        layer_list = find_layers(model)
        if not layer_list:
            warnings.warn(f"gpuprobe: no decoder layers found in {type(model).__qualname__}; "
                          "pass layers=[...] to name them", RuntimeWarning, stacklevel=2)
    elif layers is False:
        layer_list = []
    else:
        layer_list = [(m, i) for i, m in enumerate(layers)]  # type: ignore[union-attr]
    options = {"model_name": model_name, "layers": layers if isinstance(layers, bool) else tuple(map(id, layer_list)),
               "layer_every": layer_every, "layer_index": layer_index, "memory": memory, "kv_cache": kv_cache,
               "memory_every": memory_every}
    d = model.__dict__
    with _lock:
        st = d.get(_g.STATE_KEY)
        if st is not None:
            if st.options == options:
                return model
            uninstrument(model)
        _opted_out.discard(model)
        st = _g.ModelState(model, runtime(), name=model_name or _default_name(model), layers=layer_list,
                           layer_every=layer_every, layer_index=layer_index, memory=memory, kv_cache=kv_cache,
                           memory_every=memory_every, options=options)
        _install(model, st)
        d[_g.STATE_KEY] = st
    return model


def _install(model: Any, st: Any) -> None:
    """Put the method seams on ``model`` after their shape check. A seam whose check fails is not
    installed (``info()["seams"]`` says why); when one of the loop's seams is refused none of them is,
    and the model gets its per-call metrics only."""
    cls = type(model)
    d = model.__dict__
    fitting, refused = fit_method_seams(cls)
    for seam, why, consequence in refused:
        seam.refuse(why, quiet=consequence)
    for ms in fitting:
        seam = ms.seam
        name = ms.attribute
        existing = d.get(name)
        if existing is not None and not _seams.is_replacement(existing):
            original = existing  # someone's instance attribute: it runs underneath and comes back at uninstrument
        else:
            original = _seams.unwrapped(cls, name).__get__(model, cls)
        st.originals[name] = original
        st.readers[name] = _seams.ArgReader(original, seam.reads + ms.optional_reads)
        st.patches.append(seam.patch(model, types.MethodType(ms.replacement(cls), model)))


def uninstrument(model: M) -> M:
    """Undo :func:`instrument`: the model's methods and hooks are what they were before.

    Idempotent; a model never instrumented is returned unchanged. While class-wide instrumentation
    is on, this model stays out of it until :func:`instrument` is called on it again.

    Example:
        >>> from gpuprobe.integrations.transformers import uninstrument
        >>> uninstrument(object()) is not None
        True
    """
    d = getattr(model, "__dict__", None)
    if d is None:
        return model
    with _lock:
        st = d.get(_g.STATE_KEY)
        if st is not None:
            for patch in reversed(st.patches):
                if not patch.undo():
                    warnings.warn(f"gpuprobe: {type(model).__qualname__}.{patch.seam.attribute} was replaced after "
                                  "instrument(); left in place", RuntimeWarning, stacklevel=2)
            st.patches.clear()
            st.remove_hooks()
            st.utilization.close()
            if st.serving is not None:
                st.serving.close()  # continuous-batching managers get their own methods back
        else:  # a copy of an instrumented model: its seams pass through; take them away
            for ms in _g.METHOD_SEAMS:
                if _seams.is_replacement(d.get(ms.attribute)):
                    del d[ms.attribute]
        d.pop(_g.STATE_KEY, None)
        if _class_patches:
            try:
                _opted_out.add(model)
            except TypeError:
                pass
    return model


def is_instrumented(model: Any) -> bool:
    """Whether :func:`instrument` is in force on this model.

    Example:
        >>> from gpuprobe.integrations.transformers import is_instrumented
        >>> is_instrumented(object())
        False
    """
    d = getattr(model, "__dict__", None)
    return isinstance(d, dict) and d.get(_g.STATE_KEY) is not None


# -- class-wide ---------------------------------------------------------------------------------

SEAM_CLASS_GENERATE = _seams.declare(
    "transformers.class.generate", library="transformers", attribute="generate", group=_g.GROUP_CALL,
    scenario="generate", target="generate() of a model class (instrument_class, instrument_all, gpuprobe run)")
SEAM_CLASS_OWN_GENERATE = _seams.declare(
    "transformers.class.own_generate", library="transformers", attribute="generate", group=_g.GROUP_CALL,
    scenario="generate", target="generate() of a subclass that overrides it (Whisper, MusicGen, Bark), under "
                                "instrument_class, instrument_all, gpuprobe run")
SEAM_CLASS_SUBCLASS = _seams.declare(
    "transformers.class.subclass", library="transformers", attribute="__init_subclass__", group=_g.GROUP_CALL,
    scenario="generate", target="__init_subclass__ of a class under instrument_class, instrument_all, gpuprobe run "
                                "(a model class defined later that overrides generate() is measured there)")
SEAM_CLASS_CONTINUOUS = _seams.declare(
    "transformers.class.init_continuous_batching", library="transformers", attribute="init_continuous_batching",
    group="transformers.continuous_batching", scenario="generate_batch",
    target="init_continuous_batching() of a model class (instrument_class, instrument_all, gpuprobe run)")


class _ClassPatch:
    """What instrument_class() did to one class: its patches, options and the instances it instrumented."""

    __slots__ = ("patches", "options", "instances")

    def __init__(self, options: dict[str, Any]) -> None:
        self.patches: list[_seams.Patch] = []
        self.options = options
        self.instances: weakref.WeakSet[Any] = weakref.WeakSet()


def _first_use(cls: type, patch: _ClassPatch, model: Any) -> Any:
    """The model's state, instrumenting it at its first use under class-wide instrumentation; None when it
    stays uninstrumented (opted out, the class patch is gone, or it cannot be instrumented)."""
    st = model.__dict__.get(_g.STATE_KEY)
    if st is not None:
        return st
    if model in _opted_out or _class_patches.get(cls) is not patch:
        return None
    try:
        instrument(model, **patch.options)
    except GpuprobeError as exc:  # a class that cannot be measured: it runs as it is, said once
        runtime().warn_once(f"instrument:{type(model).__qualname__}",
                            f"gpuprobe: {type(model).__qualname__} is not instrumented: {exc}")
        _opted_out.add(model)
        return None
    patch.instances.add(model)
    return model.__dict__.get(_g.STATE_KEY)


def _class_generate(cls: type, patch: _ClassPatch, original: Any, seam: _seams.Seam = SEAM_CLASS_GENERATE) -> Any:
    """``generate`` of ``cls`` (or of a subclass that overrides it) for class-wide instrumentation: the model
    is instrumented at its first call.

    The call runs ``original`` (the class's own ``generate``) exactly once, with the caller's arguments.
    Subclasses that override ``generate()`` (Whisper, MusicGen, Bark) get the same wrapper on their own
    method (:func:`_own_generate`), so each call is measured at the outermost ``generate()``, its first
    as its later ones; a call that arrives inside a measured call (``super().generate()``) is measured by
    the outer one.
    """
    reader = _seams.ArgReader(original, ("inputs", "streamer"))

    def before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        model = args[0]
        st = _first_use(cls, patch, model)
        if st is None or st.current() is not None:
            return None
        ctx = st.begin_call(args, kwargs, reader)
        return None if ctx is None else (st, ctx)

    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if token is not None:
            token[0].end_call(token[1], result, error)

    fn = _seams.wrap(seam, original, before, after)
    fn._gpuprobe_class_wrapper = True  # type: ignore[attr-defined]
    return fn


def _own_generate(root: type, patch: _ClassPatch, sub: type) -> None:
    """Measure ``generate()`` of ``sub``, a subclass of ``root`` that overrides it, at its own method."""
    if "generate" not in sub.__dict__ or getattr(sub.__dict__["generate"], "_gpuprobe_class_wrapper", False):
        return
    if SEAM_CLASS_OWN_GENERATE.check(sub) is not None:
        return
    original = sub.__dict__["generate"]
    patch.patches.append(SEAM_CLASS_OWN_GENERATE.patch(
        sub, _class_generate(root, patch, original, SEAM_CLASS_OWN_GENERATE), on_class=True))


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    todo: list[type] = list(type.__subclasses__(cls))
    while todo:
        sub = todo.pop()
        if sub not in found:
            found.append(sub)
            todo.extend(type.__subclasses__(sub))
    return found


def _subclass_hook(root: type, patch: _ClassPatch) -> Any:
    """``root.__init_subclass__`` for class-wide instrumentation: a model class defined later (transformers
    imports each model's module when it is first used) that overrides ``generate()`` is measured there.
    The class's own ``__init_subclass__`` (or the next one in its MRO) runs first, exactly once."""
    previous = root.__dict__.get("__init_subclass__")

    def original(sub: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__get__(None, sub)(**kwargs)
        else:
            super(root, sub).__init_subclass__(**kwargs)  # type: ignore[misc, arg-type]

    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if error is None and token is not None and _class_patches.get(root) is patch:
            with _lock:
                _own_generate(root, patch, token)

    fn = _seams.wrap(SEAM_CLASS_SUBCLASS, original, lambda args, kwargs: args[0] if args else None, after)
    return classmethod(fn)


def _class_continuous_batching(cls: type, patch: _ClassPatch, original: Any) -> Any:
    """``cls.init_continuous_batching`` that instruments the model first (continuous batching never
    calls ``generate()``, so a model served that way is instrumented here) and observes the manager."""

    def before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _first_use(cls, patch, args[0])

    def after(st: Any, manager: Any, error: BaseException | None) -> None:
        if st is not None and error is None:
            st.observe_manager(manager)

    fn = _seams.wrap(SEAM_CLASS_CONTINUOUS, original, before, after)
    fn._gpuprobe_class_wrapper = True  # type: ignore[attr-defined]
    return fn


_class_patches: dict[type, _ClassPatch] = {}


def instrument_class(cls: C | None = None, **options: Any) -> C:
    """Instrument every instance of ``cls`` (and its subclasses) at its first ``generate()`` call or
    continuous-batching start (``init_continuous_batching``, which ``generate_batch`` calls).

    For models created in code you do not own (a pipeline, a serving library). Each instance gets
    :func:`instrument` with ``options`` the first time it generates.

    Args:
        cls: a transformers model class; default ``GenerationMixin`` (every generating model).
        **options: keywords of :func:`instrument` (``layers=True``, ``memory_every=4``, ...).

    Returns:
        ``cls``.

    Raises:
        UnsupportedModelError: ``cls`` is not a generating transformers class.
        ConfigError: a bad option.

    Example:
        >>> from transformers import GPT2LMHeadModel
        >>> from gpuprobe.integrations.transformers import instrument_class, uninstrument_class
        >>> _ = instrument_class(GPT2LMHeadModel, layers=True)
        >>> _ = uninstrument_class(GPT2LMHeadModel)
    """
    tr = _import_transformers()
    check_version()
    mixin = tr.GenerationMixin
    cls = mixin if cls is None else cls
    if not isinstance(cls, type) or not issubclass(cls, mixin):
        raise UnsupportedModelError(
            f"instrument_class() needs a transformers model class that can generate (a GenerationMixin "
            f"subclass); got {cls!r}"
        )
    unknown = set(options) - {"model_name", "layers", "layer_every", "layer_index", "memory", "kv_cache",
                              "memory_every"}
    if unknown:
        raise ConfigError(f"instrument_class() got unknown option(s): {', '.join(sorted(unknown))}")
    _check_options(options.get("model_name"), options.get("layers", False), options.get("layer_every", 8),
                   options.get("memory_every", 8))
    if DISABLED_AT_IMPORT:
        return cls
    with _lock:
        patch = _class_patches.get(cls)
        if patch is not None:
            patch.options = dict(options)
            return cls
        patch = _ClassPatch(dict(options))
        for seam, make in ((SEAM_CLASS_GENERATE, _class_generate), (SEAM_CLASS_CONTINUOUS, _class_continuous_batching)):
            if seam.check(cls) is not None:
                continue
            original = _seams.unwrapped(cls, seam.attribute)  # type: ignore[arg-type]
            patch.patches.append(seam.patch(cls, make(cls, patch, original), on_class=True))
        _class_patches[cls] = patch
        # Subclasses with a generate() of their own: those defined now, and (through __init_subclass__) later.
        for sub in _subclasses(cls):
            _own_generate(cls, patch, sub)
        if SEAM_CLASS_SUBCLASS.check(cls) is None:
            patch.patches.append(SEAM_CLASS_SUBCLASS.patch(cls, _subclass_hook(cls, patch), on_class=True))
    return cls


def uninstrument_class(cls: C | None = None) -> C:
    """Undo :func:`instrument_class`; instances it instrumented are uninstrumented too.

    Example:
        >>> from gpuprobe.integrations.transformers import uninstrument_class
        >>> _ = uninstrument_class()  # nothing to undo: no error
    """
    tr = _import_transformers()
    cls = tr.GenerationMixin if cls is None else cls
    with _lock:
        patch = _class_patches.pop(cls, None)
        if patch is None:
            return cls
        for p in reversed(patch.patches):
            p.undo()
        for inst in list(patch.instances):
            uninstrument(inst)
        if not _class_patches:
            _opted_out.clear()
    return cls


def instrument_all(**options: Any) -> None:
    """Instrument every transformers model in the process at its first ``generate()`` call or
    continuous-batching start, and the app of ``transformers serve`` (``Server-Timing``, request ids:
    docs/serving.md).

    Same as ``instrument_class(GenerationMixin, **options)``, and the serving app's seams.

    Example:
        >>> from gpuprobe.integrations.transformers import instrument_all, uninstrument_all
        >>> instrument_all(layers=True)
        >>> uninstrument_all()
    """
    instrument_class(None, **options)
    if not DISABLED_AT_IMPORT:
        instrument_server()


def uninstrument_all() -> None:
    """Undo :func:`instrument_all` and every :func:`instrument_class`.

    Example:
        >>> from gpuprobe.integrations.transformers import uninstrument_all
        >>> uninstrument_all()
    """
    for cls in list(_class_patches):
        uninstrument_class(cls)
    uninstrument_server()


def describe() -> dict[str, Any]:
    """What ``gpuprobe doctor`` says of this integration (its row's ``doctor``): the installed transformers
    against :data:`SUPPORTED_VERSIONS`, and the shape checks of the seams whose owners exist before any
    model does (the generation methods and the class-wide seams on ``GenerationMixin``, the continuous
    batching classes). Imports transformers when it is installed; patches nothing.

    Returns:
        ``{"state", "reason", "details"}`` (``off``: not installed; ``fail``: outside the supported
        range), and with a supported version ``"seams"`` (seam name → why it does not fit, or None) and
        ``"checked_against"``.

    Example:
        >>> from gpuprobe.integrations.transformers import describe
        >>> describe()["state"] in ("ok", "off", "fail")
        True
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("transformers")
    except PackageNotFoundError:
        return {"state": "off", "reason": "not installed (the transformers integration needs it: "
                                          "pip install 'gpuprobe[transformers]')", "details": {"installed": False}}
    from ._transformers import continuous as _continuous  # declares the continuous-batching seams

    details: dict[str, Any] = {"installed": True, "version": installed, "supported": SUPPORTED_VERSIONS,
                               "tested_with": TESTED_VERSION}
    try:
        check_version()
    except UnsupportedVersionError:
        details["inside_tested_range"] = False
        return {"state": "fail", "reason": f"{installed} is outside the supported range {SUPPORTED_VERSIONS}: "
                                           "instrument() refuses it; install "
                                           f"'transformers{SUPPORTED_VERSIONS}'", "details": details}
    details["inside_tested_range"] = True
    tr = _import_transformers()
    mixin = tr.GenerationMixin
    seams: dict[str, str | None] = {}
    fitting, refused = fit_method_seams(mixin)
    seams.update({ms.seam.name: None for ms in fitting})
    seams.update({seam.name: why for seam, why, _ in refused})
    for seam in (SEAM_CLASS_GENERATE, SEAM_CLASS_CONTINUOUS):
        seams[seam.name] = seam.mismatch(mixin)
    for name, cls in _continuous.owner_classes().items():
        seams[name] = _seams.seam(name).mismatch(cls)
    return {"state": "ok", "reason": f"{installed}, inside the supported range {SUPPORTED_VERSIONS} "
                                     f"(tested with {TESTED_VERSION})", "details": details,
            "seams": seams, "checked_against": f"transformers {tr.__version__}"}
