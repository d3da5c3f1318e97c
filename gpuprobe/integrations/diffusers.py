"""Observe Hugging Face diffusers pipelines from the inside: per denoising step and per component, reversible.

Quickstart::

    from gpuprobe.integrations.diffusers import instrument
    instrument(pipe)                  # this pipeline (and the components it holds)
    image = pipe("a squirrel eating a burger", num_inference_steps=30).images[0]
    print(gpuprobe.summary())         # or gpuprobe.serve(), gpuprobe.configure(otlp_endpoint=...)

Per call: its duration (``error.type`` on failure), the time to the first denoising step's end, the
images it made, an NVTX range. Per denoising step: its host time (and device time on a GPU, from CUDA
events read later: no synchronisation), and its components, which add up to it: the denoiser's forward
by branch (``cond``, ``uncond``, ``batched`` where classifier-free guidance runs both in one forward), a
ControlNet's, the scheduler's step and ``other`` (guidance arithmetic, your ``callback_on_step_end``).
Per call outside the steps: the text encoders, the VAE's encode and decode, the safety checker, each with
its time and the memory high-water mark at its end (the VAE decode's is where a large image runs out of
memory). Opt-in: the denoiser's blocks timed on one step in N (``layers=True``). Steps per second and
images per second follow from these (``gpuprobe.summary()``, docs/diffusers.md). The sync audit
(``sync_audit=N``), kernel sampling and profile windows count the denoising steps as generation steps.

How: the pipeline's ``__call__`` gets a seam on its class (only instrumented instances are measured), and
each component a seam on its own method in its ``__dict__`` (``forward``, ``scheduler.step``,
``vae.decode``); nothing of your arguments or callbacks changes. :func:`uninstrument` puts everything back.

Supported: diffusers >= 0.35, < 1 (tested with 0.35 and 0.42): every ``DiffusionPipeline`` whose
components carry diffusers' names (``unet`` / ``transformer``, ``text_encoder*``, ``scheduler``, ``vae``);
compiled denoisers (``torch.compile(pipe.unet)`` and ``pipe.unet.compile()``). See ``docs/diffusers.md``.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, TypeVar

from .. import _seams
from ..errors import ConfigError, GpuprobeError
from ..runtime import DISABLED_AT_IMPORT, runtime
from ._diffusers import compat
from ._diffusers.blocks import find_blocks
from ._diffusers.compat import (
    SUPPORTED_VERSIONS,
    UnsupportedPipelineError,
    UnsupportedVersionError,
    check_version,
)
from ._diffusers.seams import COMPONENT_SEAMS, SEAM_CALL, SEAM_SUBCLASS, STATE_KEY
from ._diffusers.state import PipelineState, bind_torch, current

__all__ = ["instrument", "uninstrument", "is_instrumented", "instrument_all", "uninstrument_all", "describe",
           "find_blocks", "check_version", "SUPPORTED_VERSIONS", "UnsupportedVersionError",
           "UnsupportedPipelineError"]

P = TypeVar("P")

_OPTIONS = ("model_name", "layers", "layer_every", "layer_index", "memory")
_lock = threading.RLock()


def _check_options(model_name: Any, layers: Any, layer_every: Any) -> None:
    if model_name is not None and (not isinstance(model_name, str) or not model_name):
        raise ConfigError(f"instrument(model_name=) must be a non-empty string, got {model_name!r}")
    if isinstance(layer_every, bool) or not isinstance(layer_every, int) or layer_every < 1:
        raise ConfigError(f"instrument(layer_every=) must be an integer >= 1, got {layer_every!r}")
    if not isinstance(layers, bool):
        raise ConfigError(f"instrument(layers=) must be True or False, got {layers!r}")


def instrument(pipe: P, *, model_name: str | None = None, layers: bool = False, layer_every: int = 8,
               layer_index: bool = False, memory: bool = True) -> P:
    """Measure this pipeline's calls, denoising steps and components.

    Reversible (:func:`uninstrument`) and idempotent: a second call with the same options does nothing;
    with other options it instruments anew. Only this pipeline's calls are measured; its components get
    their seams (shared with the other instrumented pipelines that hold them).

    Args:
        pipe: a diffusers ``DiffusionPipeline``.
        model_name: the ``model`` label. Default: the last part of the path or Hub name the pipeline was
            loaded from, else its class name.
        layers: time the denoiser's blocks (down, mid and up blocks of a UNet; a transformer's blocks).
        layer_every: time them on one denoising step in this many.
        layer_index: add the ``layer.index`` label (the block's path, ``down_blocks.1``: one series per block).
        memory: the memory high-water mark at the end of each component of the call and of the denoising loop.

    Returns:
        The same pipeline.

    Raises:
        UnsupportedPipelineError: ``pipe`` is not a diffusers pipeline; the message names its type.
        UnsupportedVersionError: the installed diffusers is not supported; the message names it.
        ConfigError: a bad option.

    Example:
        >>> from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
        >>> from gpuprobe.integrations.diffusers import instrument, uninstrument
        >>> unet = UNet2DModel(sample_size=8, block_out_channels=(4, 8), layers_per_block=1, norm_num_groups=2,
        ...                    down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
        >>> pipe = instrument(DDPMPipeline(unet=unet, scheduler=DDPMScheduler()), model_name="tiny-ddpm")
        >>> _ = uninstrument(pipe)
    """
    compat.check_pipeline(pipe)
    _check_options(model_name, layers, layer_every)
    if DISABLED_AT_IMPORT:  # GPUPROBE_DISABLE=1: decided once, nothing is patched
        return pipe
    options = {"model_name": model_name, "layers": layers, "layer_every": layer_every, "layer_index": layer_index,
               "memory": memory}
    d = pipe.__dict__
    with _lock:
        st = d.get(STATE_KEY)
        if st is not None:
            if st.options == options:
                return pipe
            uninstrument(pipe)
        _opted_out.discard(pipe)
        bind_torch()
        if not _patch_class(type(pipe)):
            return pipe  # its class's __call__ does not fit: said once (info()["seams"])
        st = PipelineState(pipe, runtime(), name=model_name or compat.pipeline_name(pipe), layers=layers,
                           layer_every=layer_every, layer_index=layer_index, memory=memory, options=options)
        st.refresh(pipe)
        d[STATE_KEY] = st
        _instrumented.add(pipe)
    return pipe


def uninstrument(pipe: P) -> P:
    """Undo :func:`instrument`: the pipeline's components get their methods back (those that no other
    instrumented pipeline holds), and its class its ``__call__`` once no instance of it is instrumented.

    Idempotent; a pipeline never instrumented is returned unchanged. Under :func:`instrument_all`, this
    pipeline stays out of it until :func:`instrument` is called on it again.

    Example:
        >>> from gpuprobe.integrations.diffusers import uninstrument
        >>> uninstrument(object()) is not None
        True
    """
    d = getattr(pipe, "__dict__", None)
    if not isinstance(d, dict):
        return pipe
    with _lock:
        st = d.pop(STATE_KEY, None)
        if st is not None:
            st.release()
            _instrumented.discard(pipe)
            _unpatch_unused()
        if _everywhere is not None:
            try:
                _opted_out.add(pipe)
            except TypeError:
                pass
    return pipe


def is_instrumented(pipe: Any) -> bool:
    """Whether :func:`instrument` is in force on this pipeline.

    Example:
        >>> from gpuprobe.integrations.diffusers import is_instrumented
        >>> is_instrumented(object())
        False
    """
    d = getattr(pipe, "__dict__", None)
    return isinstance(d, dict) and d.get(STATE_KEY) is not None


# -- the call's seam, on the pipeline's class ---------------------------------------------------------

_class_patches: dict[type, _seams.Patch] = {}
_instrumented: weakref.WeakSet[Any] = weakref.WeakSet()
_opted_out: weakref.WeakSet[Any] = weakref.WeakSet()
_first_used: weakref.WeakSet[Any] = weakref.WeakSet()  # the pipelines instrument_all instrumented
_everywhere: dict[str, Any] | None = None  # instrument_all's options while it is in force
_subclass_patch: _seams.Patch | None = None


def _first_use(pipe: Any) -> Any:
    """The pipeline's state, instrumenting it at its first call under :func:`instrument_all`; None when it
    stays uninstrumented (opted out, instrument_all undone, or it cannot be instrumented)."""
    options = _everywhere
    if options is None or pipe in _opted_out:
        return None
    try:
        instrument(pipe, **options)
    except GpuprobeError as exc:  # a pipeline that cannot be measured: it runs as it is, said once
        runtime().warn_once(f"instrument:{type(pipe).__qualname__}",
                            f"gpuprobe: {type(pipe).__qualname__} is not instrumented: {exc}")
        _opted_out.add(pipe)
        return None
    _first_used.add(pipe)
    return pipe.__dict__.get(STATE_KEY)


def _call_before(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args:
        return None
    pipe = args[0]
    d = getattr(pipe, "__dict__", None)
    if not isinstance(d, dict):
        return None
    st = d.get(STATE_KEY)
    if st is None:
        st = _first_use(pipe)
        if st is None:
            return None
    running = current()
    if running is not None and running.state is st:  # super().__call__() inside the measured call: the same call
        return None
    ctx = st.begin_call(pipe)
    return None if ctx is None else (st, ctx)


def _call_after(token: Any, result: Any, error: BaseException | None) -> None:
    if token is not None:
        token[0].end_call(token[1], result, error)


def _nested(cls: type) -> bool:
    """Whether a class above ``cls`` already has the call's seam (a subclass that does not override
    ``__call__`` runs its parent's; one that does and calls ``super().__call__()`` is measured once, at its
    own: the call already running on the thread for the same pipeline lets the inner one through)."""
    return any(c in _class_patches for c in cls.__mro__[1:])


def _patch_class(cls: type) -> bool:
    """Put the call's seam on ``cls.__call__`` (once per class); False when its shape does not fit."""
    if cls in _class_patches:
        return True
    if "__call__" not in cls.__dict__ and _nested(cls):
        return True
    if SEAM_CALL.check(cls) is not None:
        return False
    original = _seams.unwrapped(cls, "__call__")
    fn = _seams.wrap(SEAM_CALL, original, _call_before, _call_after)
    fn._gpuprobe_class_wrapper = True  # type: ignore[attr-defined]
    _class_patches[cls] = SEAM_CALL.patch(cls, fn, on_class=True)
    return True


def _unpatch_unused() -> None:
    """Put ``__call__`` back on the classes no instrumented instance (and no instrument_all) needs."""
    if _everywhere is not None:
        return
    used = {type(p) for p in list(_instrumented)}
    for cls in list(_class_patches):
        if not any(issubclass(u, cls) for u in used):
            _class_patches.pop(cls).undo()


def _subclass_hook(base: type) -> Any:
    """``DiffusionPipeline.__init_subclass__`` under instrument_all: a pipeline class defined later (diffusers
    imports a pipeline's module at its first use) gets the call's seam. The class's own
    ``__init_subclass__`` (or the next one in its MRO) runs first, exactly once."""
    previous = base.__dict__.get("__init_subclass__")

    def original(sub: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__get__(None, sub)(**kwargs)
        else:
            super(base, sub).__init_subclass__(**kwargs)  # type: ignore[misc, arg-type]

    def after(token: Any, result: Any, error: BaseException | None) -> None:
        if error is None and token is not None and _everywhere is not None:
            with _lock:
                _patch_class(token)

    fn = _seams.wrap(SEAM_SUBCLASS, original, lambda args, kwargs: args[0] if args else None, after)
    return classmethod(fn)


def instrument_all(**options: Any) -> None:
    """Instrument every diffusers pipeline of the process at its first call (``gpuprobe run`` does this).

    Args:
        **options: keywords of :func:`instrument` (``layers=True``, ``layer_every=4``, ``memory=False``).

    Raises:
        ConfigError: an unknown or bad option.

    Example:
        >>> from gpuprobe.integrations.diffusers import instrument_all, uninstrument_all
        >>> instrument_all(layers=True)
        >>> uninstrument_all()
    """
    global _everywhere, _subclass_patch
    unknown = set(options) - set(_OPTIONS)
    if unknown:
        raise ConfigError(f"instrument_all() got unknown option(s): {', '.join(sorted(unknown))}")
    _check_options(options.get("model_name"), options.get("layers", False), options.get("layer_every", 8))
    check_version()
    if DISABLED_AT_IMPORT:
        return
    base = compat.pipeline_base()
    with _lock:
        _everywhere = dict(options)
        for cls in compat.pipeline_classes():
            if "__call__" in cls.__dict__:
                _patch_class(cls)
        if _subclass_patch is None and SEAM_SUBCLASS.check(base) is None:
            _subclass_patch = SEAM_SUBCLASS.patch(base, _subclass_hook(base), on_class=True)


def uninstrument_all() -> None:
    """Undo :func:`instrument_all`; the pipelines it instrumented are uninstrumented too (those you
    instrumented yourself stay so).

    Example:
        >>> from gpuprobe.integrations.diffusers import uninstrument_all
        >>> uninstrument_all()  # nothing to undo: no error
    """
    global _everywhere, _subclass_patch
    with _lock:
        if _everywhere is None:
            return
        _everywhere = None
        if _subclass_patch is not None:
            _subclass_patch.undo()
            _subclass_patch = None
        for pipe in list(_first_used):
            uninstrument(pipe)
        _first_used.clear()
        _opted_out.clear()
        _unpatch_unused()


# -- gpuprobe doctor ---------------------------------------------------------------------------------------

def describe() -> dict[str, Any]:
    """This integration for ``gpuprobe doctor`` (its registry row's ``doctor``): the installed diffusers against
    :data:`SUPPORTED_VERSIONS`, and whether the seams fit the installed version's classes (checked on the
    classes, nothing patched or built). Imports diffusers when it is installed.

    Returns:
        ``{"state", "reason", "details"}`` (``off``: not installed; ``fail``: outside the supported range, or a
        seam that does not fit), and with a supported version ``"seams"`` (seam name → why it does not fit, or
        None) and ``"checked_against"``.

    Example:
        >>> describe()["state"] in ("ok", "off", "fail")
        True
    """
    try:
        diffusers = compat.import_diffusers()
    except ImportError:
        return {"state": "off", "reason": "not installed (the diffusers integration needs it: "
                                          "pip install 'gpuprobe[diffusers]')", "details": {"installed": False}}
    version = str(diffusers.__version__)
    tested = f"{compat.FLOOR_VERSION} and {compat.TESTED_VERSION}"
    details: dict[str, Any] = {"installed": True, "version": version, "supported": SUPPORTED_VERSIONS,
                               "tested_with": tested}
    try:
        check_version()
    except UnsupportedVersionError:
        details["inside_tested_range"] = False
        return {"state": "fail", "reason": f"{version} is outside the supported range {SUPPORTED_VERSIONS}: "
                                           f"instrument() refuses it; install 'diffusers{SUPPORTED_VERSIONS}'",
                "details": details}
    details["inside_tested_range"] = True
    owners = compat.sample_classes()
    seams: dict[str, str | None] = {SEAM_CALL.name: SEAM_CALL.mismatch(owners["pipeline"]),
                                    SEAM_SUBCLASS.name: SEAM_SUBCLASS.mismatch(compat.pipeline_base())}
    for r, rows in COMPONENT_SEAMS.items():
        owner = owners.get(r)
        for row in rows:
            if owner is not None and (not row.optional or callable(getattr(owner, row.attribute, None))):
                seams[row.seam.name] = row.seam.mismatch(owner)
    bad = {k: v for k, v in seams.items() if v is not None}
    details["seams_checked"] = len(seams)
    against = f"diffusers {version}"
    if bad:
        return {"state": "fail", "reason": f"{version}: {len(bad)} seam(s) do not fit: "
                                           + "; ".join(f"{k}: {v}" for k, v in bad.items()),
                "details": details, "seams": seams, "checked_against": against}
    return {"state": "ok", "reason": f"{version}, inside the supported range {SUPPORTED_VERSIONS} (tested with "
                                     f"{tested}); pipelines are measured per denoising step and component",
            "details": details, "seams": seams, "checked_against": against}
