"""What gpuprobe knows of diffusers itself: the versions supported, checks of a pipeline, and every reading of
diffusers' own objects (a pipeline, its components, what a call returns), gathered here so a new release
is checked in one place.

The seams' own shape checks (a method's parameters) are :meth:`gpuprobe._seams.Seam.check`; what is here
reads the objects around them. Nothing here imports diffusers or torch at import time.

Names under which the integration holds diffusers' objects (``tests/diffusers/test_compat_readings.py`` fails
on an attribute read of one of them outside this module): those of its registry row's ``objects`` (``pipe``: a
``DiffusionPipeline``; ``denoiser``: its UNet or transformer; ``scheduler``; ``vae``), ``component`` (one of
a pipeline's components: a model, the scheduler) and ``result`` (what a call returned).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

from ..._placement import tensor_device
from ...errors import GpuprobeError, missing

__all__ = ["SUPPORTED_VERSIONS", "TESTED_VERSION", "FLOOR_VERSION", "UnsupportedVersionError",
           "UnsupportedPipelineError", "import_diffusers", "parse_version", "check_version", "check_pipeline",
           "pipeline_base", "pipeline_classes", "sample_classes", "pipeline_name", "components", "role", "guidance_batched",
           "compiled_call", "blocks", "images_made", "input_device", "STEP_ROLES", "CALL_ROLES", "ROLES"]

# -- versions and pipelines ------------------------------------------------------------------------

SUPPORTED_VERSIONS = ">=0.35,<1"
TESTED_VERSION = "0.42"
FLOOR_VERSION = "0.35"
_MIN, _MAX = (0, 35), (1, 0)


class UnsupportedVersionError(GpuprobeError):
    """The installed diffusers is outside the versions this integration supports."""

    __module__ = "gpuprobe.integrations.diffusers"  # its public name (tracebacks, pickles)


class UnsupportedPipelineError(GpuprobeError, TypeError):
    """The object given is not a diffusers pipeline."""

    __module__ = "gpuprobe.integrations.diffusers"  # its public name (tracebacks, pickles)


def import_diffusers() -> Any:
    """The diffusers module; a clear error naming the extra to install when it is missing."""
    try:
        import diffusers
    except ImportError as exc:
        raise missing("diffusers", "diffusers") from exc
    return diffusers


def parse_version(version: str) -> tuple[int, ...]:
    """``(major, minor)`` of a version string.

    Example:
        >>> parse_version("0.42.1"), parse_version("0.43.0.dev0")
        ((0, 42), (0, 43))
    """
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_version() -> str:
    """Check the installed diffusers version; returns it.

    Raises:
        UnsupportedVersionError: outside ``SUPPORTED_VERSIONS``; the message names both.
        MissingDependencyError: diffusers is not installed.
    """
    version = str(import_diffusers().__version__)
    if not (_MIN <= parse_version(version) < _MAX):
        raise UnsupportedVersionError(
            f"gpuprobe's diffusers integration supports diffusers {SUPPORTED_VERSIONS} (tested with "
            f"{FLOOR_VERSION} and {TESTED_VERSION}); the installed version is {version}. Install a supported "
            f"version, e.g. pip install 'diffusers{SUPPORTED_VERSIONS}'.")
    return version


def pipeline_base() -> type:
    """``diffusers.DiffusionPipeline`` (its module is the one whose import switches gpuprobe on under ``gpuprobe run``)."""
    from diffusers.pipelines.pipeline_utils import DiffusionPipeline

    return DiffusionPipeline


def sample_classes() -> dict[str, type]:
    """A class of diffusers' for each role whose seams ``gpuprobe doctor`` checks without building anything:
    a pipeline, a denoiser, a scheduler, a VAE, a text encoder's (transformers') class is not diffusers'."""
    from diffusers import AutoencoderKL, DDIMScheduler, DDPMPipeline, UNet2DConditionModel

    return {"pipeline": DDPMPipeline, "denoiser": UNet2DConditionModel, "scheduler": DDIMScheduler,
            "vae": AutoencoderKL}


def check_pipeline(pipe: Any) -> None:
    """Check that ``pipe`` is a diffusers pipeline instance (and diffusers a supported version)."""
    check_version()
    base = pipeline_base()
    if isinstance(pipe, type):
        raise UnsupportedPipelineError(
            f"instrument() takes a pipeline instance, got the class {pipe.__qualname__}; use instrument_all() "
            "for every pipeline of the process")
    if not isinstance(pipe, base) or not callable(pipe):
        raise UnsupportedPipelineError(
            "gpuprobe.integrations.diffusers.instrument() needs a diffusers pipeline (a DiffusionPipeline such "
            f"as StableDiffusionPipeline); got {type(pipe).__module__}.{type(pipe).__qualname__}")


def pipeline_classes() -> list[type]:
    """``DiffusionPipeline`` and every subclass defined so far (diffusers imports a pipeline's module when
    it is first used: classes defined later are met by the subclass hook)."""
    base = pipeline_base()
    found: list[type] = [base]
    todo = list(type.__subclasses__(base))
    while todo:
        sub = todo.pop()
        if sub not in found:
            found.append(sub)
            todo.extend(type.__subclasses__(sub))
    return found


def pipeline_name(pipe: Any) -> str:
    """The pipeline's name: the last folder of the path or the Hub name it was loaded from, else its class name."""
    name = ""
    try:
        name = str(pipe.name_or_path or "")
    except Exception:
        name = ""
    if name:
        name = re.split(r"[\\/]", name.rstrip("/\\"))[-1] if ("/" in name or "\\" in name) and not _hub_id(name) \
            else name
        return name[:128]
    return type(pipe).__name__


def _hub_id(name: str) -> bool:
    """``org/model``: a Hub id (kept whole), not a local path."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


# -- components --------------------------------------------------------------------------------------

# What each component does in a call, from the name diffusers gives it (its pipelines' __init__ keywords).
STEP_ROLES = ("denoiser", "controlnet", "scheduler")
"""Components that run in every denoising step."""
CALL_ROLES = ("text_encoder", "vae_encode", "vae_decode", "safety_checker")
"""Components that run once or a few times per call, before or after the steps."""
ROLES = (CALL_ROLES[0], *STEP_ROLES, "other", *CALL_ROLES[1:])
"""Every value of the ``component`` attribute, in the order a call runs them."""

_ROLE_NAMES = (
    (re.compile(r"text_encoder(_\d+)?$"), "text_encoder"),
    # The denoiser: UNet (``unet``; Versatile Diffusion's ``image_unet``), transformer (``transformer``; Wan 2.2's
    # second expert ``transformer_2``), Kandinsky's ``prior``, Stable Cascade's ``decoder`` and ``prior``.
    (re.compile(r"(unet|image_unet|transformer|prior|decoder)(_\d+)?$"), "denoiser"),
    (re.compile(r"controlnet$"), "controlnet"),
    (re.compile(r"scheduler$"), "scheduler"),
    # The autoencoder: ``vae`` (LTX-2's ``audio_vae`` too), a VQ model's ``vqvae`` (aMUSEd, VQ-Diffusion,
    # latent diffusion), Wuerstchen's ``vqgan``, Kandinsky's ``movq``.
    (re.compile(r"(vae|audio_vae|vqvae|vqgan|movq)$"), "vae"),
    (re.compile(r"safety_checker$"), "safety_checker"),
)


def role(name: str) -> str | None:
    """What the component called ``name`` does (``denoiser``, ``vae``, ...), or None for the others
    (tokenizers, feature extractors).

    Example:
        >>> role("text_encoder_2"), role("transformer"), role("tokenizer")
        ('text_encoder', 'denoiser', None)
    """
    for pattern, found in _ROLE_NAMES:
        if pattern.match(name):
            return found
    return None


def components(pipe: Any) -> Iterator[tuple[str, Any]]:
    """``(name, component)`` for each component the pipeline registered (``register_modules``: the keys
    of its config that do not start with ``_``), skipping those that are ``None``."""
    try:
        names = [k for k in pipe.config.keys() if not k.startswith("_")]
    except Exception:
        return
    for name in names:
        component = pipe.__dict__.get(name)
        if component is None:
            try:
                component = getattr(pipe, name, None)
            except Exception:
                component = None
        if component is not None and not isinstance(component, (str, int, float, bool, list, tuple, dict)):
            yield name, component


def guidance_batched(pipe: Any) -> bool:
    """Whether the running call computes classifier-free guidance (the pipeline's
    ``do_classifier_free_guidance``, read while the call runs, when it has one): the conditional and
    unconditional predictions are then one batched forward, unless the pipeline names them apart
    (``cache_context("cond")`` / ``("uncond")``)."""
    try:
        return bool(getattr(pipe, "do_classifier_free_guidance", False))
    except Exception:  # a property reading state the call has not set
        return False


def compiled_call(component: Any) -> Any:
    """The module's in-place compiled call (``nn.Module.compile()`` stores it in ``_compiled_call_impl``, and
    ``Module.__call__`` runs it instead of the module's own call), or None."""
    d = getattr(component, "__dict__", None)
    return d.get("_compiled_call_impl") if isinstance(d, dict) else None


def blocks(denoiser: Any) -> list[tuple[Any, str]]:
    """The denoiser's blocks as ``(module, path)``: a UNet's ``down_blocks``, ``mid_block`` and
    ``up_blocks``; a transformer's ``transformer_blocks`` (and Flux's ``single_transformer_blocks``); any
    child ``nn.ModuleList`` whose name ends in ``blocks``, and a child named ``mid_block``.

    Example:
        >>> import torch
        >>> class Tiny(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.transformer_blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
        >>> [path for _, path in blocks(Tiny())]
        ['transformer_blocks.0', 'transformer_blocks.1']
    """
    torch = sys.modules["torch"]
    inner = getattr(denoiser, "_orig_mod", None)  # a torch.compile()d module: its blocks are the original's
    if isinstance(inner, torch.nn.Module):
        denoiser = inner
    found: list[tuple[Any, str]] = []
    for name, child in denoiser.named_children():
        if isinstance(child, torch.nn.ModuleList) and name.endswith("blocks"):
            found += [(block, f"{name}.{i}") for i, block in enumerate(child)]
        elif name == "mid_block" and isinstance(child, torch.nn.Module):
            found.append((child, name))
    return found


def images_made(result: Any) -> int | None:
    """How many images (or videos, or latents) a call returned: the length of its output's ``images``
    (``frames``, ``audios``), or of the first element of a tuple (``return_dict=False``); None when unknown."""
    found = result
    if isinstance(result, tuple):
        found = result[0] if result else None
    else:
        for field in ("images", "frames", "audios"):
            value = getattr(result, field, None)
            if value is not None:
                found = value
                break
    if found is None:
        return None
    shape = getattr(found, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    try:
        return len(found)
    except TypeError:
        return None


def input_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The device of the first tensor among a component call's arguments (positional first), or None."""
    tensor = sys.modules["torch"].Tensor
    for value in args:
        if isinstance(value, tensor):
            return tensor_device(value)
    for value in kwargs.values():
        if isinstance(value, tensor):
            return tensor_device(value)
    return None
