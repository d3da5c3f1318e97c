"""The seams table of a diffusers pipeline: every seam gpuprobe puts on an instrumented pipeline, and its hooks.

How a call is seen (every ``DiffusionPipeline.__call__`` of diffusers 0.35 to 0.42 has this shape)::

    pipe(prompt, ...)                        seam: the call (the pipeline's class), NVTX "pipeline <name>"
      text_encoder(ids), text_encoder_2(...) seam: forward of each text encoder (a component of the call)
      vae.encode(image)                      seam: image-to-image and inpainting (a component of the call)
      loop over the timesteps:
        controlnet(...)                      seam: forward (a ControlNet pipeline's); a step component
        denoiser(latents, t, ...)            seam: forward of the UNet or transformer: the first step
                                             component after the previous step's scheduler step opens
                                             the next denoising step
          with denoiser.cache_context(name)  seam: the pipelines that run the conditional and unconditional
                                             predictions apart name them here ("cond", "uncond")
        scheduler.step(noise_pred, t, ...)   seam: a step component; the step closes at the next step's
                                             first denoiser (or ControlNet) call, at a component of the
                                             call (the VAE decode) or at the call's end
        callback_on_step_end(...)            the caller's: untouched, inside its step ("other")
      vae.decode(latents)                    seam: a component of the call
      safety_checker(...)                    seam: forward (a component of the call)

A step's components add up to it: ``denoiser + controlnet + scheduler + other`` is the step's host time.

The call's seam is on the pipeline's class (Python looks ``__call__`` up on the type, so an instance
attribute would never run): it measures instrumented instances and lets the others through with one
dictionary lookup. The components' seams are on each component instance (its ``__dict__``, as
``torch.nn.Module.__call__`` looks ``forward`` up on the instance), shared by every instrumented pipeline
that holds the component (``StableDiffusionImg2ImgPipeline(**pipe.components)``): a component's hooks
measure the call running on their thread, whichever pipeline it is, and pass through outside one.

A denoiser compiled with ``torch.compile(denoiser)`` is an ``OptimizedModule`` whose own ``forward``
(an instance attribute) is the compiled call: its seam goes there, outside the compiled code. One compiled in
place (``denoiser.compile()``) runs its ``_compiled_call_impl``: the seam goes on that attribute instead.
Every hook steps aside while Dynamo traces, so a seam traced into a compiled region adds no graph break.

Groups: the call's seam alone (``diffusers.call``: per-call figures); the seams of the steps
(``diffusers.steps``: denoiser, ControlNet, scheduler, ``cache_context``, blocks) fail together; the
components of the call (``diffusers.components``) fail together. ``tests/test_fail_open.py`` iterates the
registry: each seam's ``scenario`` is in ``tests/diffusers/_fail_open.py``.

**Adding a seam here.** Declare it with :func:`_component_seam` and add a :class:`ComponentSeam` row to
:data:`COMPONENT_SEAMS` under the role it belongs to, with the kind of hooks it gets (:mod:`.state`,
``_HOOKS``; a new kind is a pair of hooks there); :meth:`~.state.PipelineState.install` shape-checks and
installs it on each component of that role. What a hook reads of diffusers' objects goes into
:mod:`.compat`; the seam's scenario must reach it (``tests/diffusers/_fail_open.py``).
"""

from __future__ import annotations

from typing import Any

from ... import _seams

__all__ = ["STATE_KEY", "GROUP_CALL", "GROUP_STEPS", "GROUP_COMPONENTS", "SEAM_CALL", "SEAM_SUBCLASS",
           "SEAM_BLOCKS", "ComponentSeam", "COMPONENT_SEAMS", "SCENARIO"]

STATE_KEY = "_gpuprobe_state"
"""Where a pipeline keeps its :class:`~.state.PipelineState`, and a component its :class:`~.state.ComponentState`."""

GROUP_CALL = "diffusers.call"
GROUP_STEPS = "diffusers.steps"
GROUP_COMPONENTS = "diffusers.components"
SCENARIO = "diffusers"
"""The fail-open scenario of every seam here (``tests/diffusers/_fail_open.py``)."""

SEAM_CALL = _seams.declare(
    "diffusers.call", library="diffusers", attribute="__call__", group=GROUP_CALL, scenario=SCENARIO,
    target="__call__ of an instrumented pipeline's class (instrument, instrument_all, gpuprobe run); other "
           "instances pass through")
SEAM_SUBCLASS = _seams.declare(
    "diffusers.class.subclass", library="diffusers", attribute="__init_subclass__", group=GROUP_CALL,
    scenario=SCENARIO, target="__init_subclass__ of DiffusionPipeline under instrument_all and gpuprobe run (a "
                              "pipeline class defined later gets the call's seam)")
SEAM_BLOCKS = _seams.declare(
    "diffusers.denoiser.blocks", library="torch", group=GROUP_STEPS, scenario=SCENARIO,
    target="forward hooks on the denoiser's blocks, for a sampled step (instrument(layers=True))")
"""Its guard is written out (torch calls the hooks; a hook's failure switches the steps' seams off)."""


def _component_seam(short: str, attribute: str, target: str, group: str, reads: tuple[str, ...] = ()) -> _seams.Seam:
    return _seams.declare(f"diffusers.{short}", library="diffusers", attribute=attribute, reads=reads, group=group,
                          scenario=SCENARIO, target=target)


class ComponentSeam:
    """A seam on one method of a component of a given role, and what its hooks do.

    Attributes:
        seam: the declaration.
        kind: which hooks of :mod:`.state` it gets: ``step`` (a part of a denoising step: the denoiser,
            a ControlNet), ``scheduler`` (the step's scheduler step), ``call`` (a part of the call outside
            the steps: a text encoder, the VAE, the safety checker), ``branch`` (``cache_context``: names
            the denoiser call that follows).
        component: the ``component`` attribute of its series (``denoiser``, ``vae_decode``, ...).
        optional: a component without the method is left as it is, silently (a UNet has no
            ``cache_context``; a decoder-only VAE no ``encode``); a required one is refused, said once.
        compiled: the seam for a module compiled in place (``_compiled_call_impl``) instead of ``forward``.
    """

    __slots__ = ("seam", "kind", "component", "optional", "compiled")

    def __init__(self, seam: _seams.Seam, kind: str, component: str, optional: bool = False,
                 compiled: bool = False) -> None:
        self.seam = seam
        self.kind = kind
        self.component = component
        self.optional = optional
        self.compiled = compiled

    @property
    def attribute(self) -> str:
        return self.seam.attribute  # type: ignore[return-value]


def _forward(component: str, kind: str, what: str, compiled: bool = False) -> tuple[ComponentSeam, ...]:
    """The seams of a module component: its ``forward``, and (``compiled``) its in-place compiled call."""
    group = GROUP_STEPS if kind == "step" else GROUP_COMPONENTS
    forward = ComponentSeam(_component_seam(f"{component}.forward", "forward", f"forward of {what}, on the instance",
                                            group), kind, component)
    if not compiled:
        return (forward,)
    return (forward, ComponentSeam(_component_seam(f"{component}.compiled_call", "_compiled_call_impl",
                                                   f"the in-place compiled call of {what} (nn.Module.compile())",
                                                   group), kind, component, optional=True, compiled=True))


COMPONENT_SEAMS: dict[str, tuple[ComponentSeam, ...]] = {
    "text_encoder": _forward("text_encoder", "call", "each text encoder of the pipeline"),
    "denoiser": (
        # Why only the denoiser's in-place compiled call has a seam: it is the component people compile (the
        # others compiled in place run unmeasured: their forward's seam is traced into the compiled code).
        *_forward("denoiser", "step", "the pipeline's denoiser (UNet or transformer)", compiled=True),
        ComponentSeam(_component_seam("denoiser.cache_context", "cache_context",
                                      "cache_context() of the denoiser (the name of a denoiser call: cond/uncond)",
                                      GROUP_STEPS, reads=("name",)), "branch", "denoiser", optional=True),
    ),
    "controlnet": _forward("controlnet", "step", "the pipeline's ControlNet"),
    "scheduler": (ComponentSeam(_component_seam("scheduler.step", "step", "step() of the pipeline's scheduler, on "
                                                                          "the instance", GROUP_STEPS),
                                "scheduler", "scheduler"),),
    "vae": (
        ComponentSeam(_component_seam("vae.decode", "decode", "decode() of the pipeline's VAE, on the instance",
                                      GROUP_COMPONENTS), "call", "vae_decode"),
        ComponentSeam(_component_seam("vae.encode", "encode", "encode() of the pipeline's VAE (image-to-image, "
                                                              "inpainting), on the instance", GROUP_COMPONENTS),
                      "call", "vae_encode", optional=True),
    ),
    "safety_checker": _forward("safety_checker", "call", "the pipeline's safety checker"),
}
"""The seams each role of component gets (roles: :func:`.compat.role`), in the order they are installed."""
