"""The diffusers integration's fail-open scenario, run by tests/test_fail_open.py for every seam of it.

Its registry row names the scenario (``Integration.scenarios``): ``run(instrumented, **keywords)`` returns
what the program would see of real calls of tiny pipelines built from configs (no download): Stable
Diffusion with a safety checker and its blocks timed, with a ControlNet, image-to-image (the VAE's encode),
Flux with its guidance run apart (``cache_context``), a DDPM pipeline whose UNet is compiled in place, and
the caller's ``callback_on_step_end`` changing the latents. :data:`KEYWORDS` names the seam reached only
under ``instrument_all`` (a pipeline class defined while it is in force); :data:`BREAKERS` the seam whose
guard is written out (the blocks' hooks).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _pipes  # noqa: E402
from _pipes import diffusers, inputs, torch  # noqa: E402

from gpuprobe.integrations import diffusers as gd  # noqa: E402
from gpuprobe.integrations._diffusers import blocks as gd_blocks  # noqa: E402


@functools.lru_cache(maxsize=1)
def _compiled_unet() -> Any:
    """A tiny DDPM UNet compiled in place (eager backend): compiled once per process, reused by every run."""
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(sample_size=8, block_out_channels=(4, 8), layers_per_block=1, norm_num_groups=2,
                                 down_block_types=("DownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "UpBlock2D"))
    unet.compile(backend="eager")
    return unet


def _halve(pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"latents": kwargs["latents"] * 0.5}


def _workload(everywhere: bool) -> list[Any]:
    checker, extractor = _pipes.safety_checker()
    out: list[Any] = []
    pipes: list[Any] = []

    def measured(pipe: Any, **options: Any) -> Any:
        if not everywhere:
            gd.instrument(pipe, **options)
        pipes.append(pipe)
        return pipe

    sd = measured(_pipes.sd(safety_checker=checker, feature_extractor=extractor), layers=True, layer_every=1)
    result = sd(**inputs("sd", steps=2), callback_on_step_end=_halve)
    out += [result.images.tolist(), result.nsfw_content_detected]
    out.append(measured(_pipes.controlnet())(**inputs("controlnet")).images.tolist())
    out.append(measured(_pipes.sd_img2img())(**inputs("img2img", strength=0.5, steps=4)).images.tolist())
    out.append(measured(_pipes.flux())(**inputs("flux")).images.tolist())
    ddpm = measured(diffusers.DDPMPipeline(unet=_compiled_unet(), scheduler=diffusers.DDPMScheduler(
        num_train_timesteps=10)))
    ddpm.set_progress_bar_config(disable=True)
    out.append(ddpm(num_inference_steps=2, generator=_pipes.generator(0), output_type="np").images.tolist())

    class Later(diffusers.StableDiffusionPipeline):  # a pipeline class defined now, with a __call__ of its own
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

    later = measured(Later(**_pipes.sd_components(), requires_safety_checker=False))
    later.set_progress_bar_config(disable=True)
    out.append(later(**inputs("sd")).images.tolist())
    if not everywhere:
        for pipe in pipes:
            gd.uninstrument(pipe)
    return out


def _run(instrumented: bool, everywhere: bool = False) -> list[Any]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors on a shared 2-core machine (tests/diffusers/conftest.py)
    try:
        if not instrumented:
            return _workload(everywhere=True)  # nothing instrumented: the plain pipelines
        if everywhere:
            gd.instrument_all(layers=True, layer_every=1)
            try:
                return _workload(everywhere=True)
            finally:
                gd.uninstrument_all()
        return _workload(everywhere=False)
    finally:
        torch.set_num_threads(before)


def _break_blocks(mp: pytest.MonkeyPatch) -> None:
    """The clock read inside a block's hook raises (and only there)."""
    real = gd_blocks.perf_counter_ns

    def perf_counter_ns() -> int:
        if sys._getframe(1).f_code.co_name in ("_start", "_stop"):
            raise RuntimeError("a fault injected into gpuprobe")
        return real()

    mp.setattr(gd_blocks, "perf_counter_ns", perf_counter_ns)


SCENARIOS: dict[str, Callable[..., list[Any]]] = {"diffusers": _run}
"""The scenario of every seam this integration declares."""

KEYWORDS: dict[str, dict[str, Any]] = {"diffusers.class.subclass": {"everywhere": True}}
"""Seams reached only under instrument_all: their scenario runs with these keywords."""

BREAKERS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {"diffusers.denoiser.blocks": _break_blocks}
"""Seams whose guard is written out: the fault goes where their guard calls."""
