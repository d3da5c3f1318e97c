"""Real pipelines, plain against instrumented: the same images, and steps and components that add up.

Each kind (Stable Diffusion, Stable Diffusion XL, Stable Diffusion 3 and Flux with a transformer denoiser,
Stable Diffusion image-to-image) is a tiny pipeline built from a config (``_pipes.py``), called with the same
seed twice; the oracles are the pipelines' own inputs (``num_inference_steps``, ``strength``) and what the
caller's ``callback_on_step_end`` sees, never gpuprobe's own figures.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from _pipes import BUILDERS, inputs, torch

from gpuprobe.integrations.diffusers import instrument, uninstrument
from gpuprobe.testing import InMemoryExporter

STEP = "gpuprobe.diffusion.step.duration"
PART = "gpuprobe.diffusion.component.duration"
CALL = "gpuprobe.diffusion.call.duration"
STEP_PARTS = ("denoiser", "controlnet", "scheduler", "other")

KINDS = ["sd", "sdxl", "sd3", "flux", "img2img"]


def _images(pipe: Any, kind: str, **extra: Any) -> Any:
    return pipe(**inputs(kind, **extra)).images


def _host(exp: InMemoryExporter, name: str, **labels: str) -> list[float]:
    return exp.values(name, clock="host", **labels)


@pytest.mark.parametrize("kind", KINDS)
def test_an_instrumented_pipeline_makes_the_same_images_with_one_step_per_inference_step(kind: str) -> None:
    pipe = BUILDERS[kind]()
    plain = _images(pipe, kind, steps=3)
    instrument(pipe, model_name=kind)
    with InMemoryExporter() as exp:
        measured = _images(pipe, kind, steps=3)
    uninstrument(pipe)
    assert torch.equal(plain, measured)
    assert len(_host(exp, STEP, model=kind)) == 3
    assert len(exp.values(CALL, model=kind)) == 1
    assert exp.values("gpuprobe.diffusion.images", model=kind) == [1.0]


@pytest.mark.parametrize("kind", KINDS)
def test_each_steps_components_add_up_to_it_and_the_steps_fit_in_the_call(kind: str) -> None:
    pipe = instrument(BUILDERS[kind](), model_name=kind)
    with InMemoryExporter() as exp:
        _images(pipe, kind, steps=3)
    steps = _host(exp, STEP, model=kind)
    per_step = [0.0] * len(steps)
    # Components are recorded in the order they end inside each step; "other" closes each step.
    parts = [ob for ob in exp.observations(PART, model=kind, clock="host") if ob.attrs["component"] in STEP_PARTS]
    i = 0
    for ob in parts:
        per_step[i] += ob.value
        assert ob.value <= steps[i] + 1e-9, (ob.attrs, ob.value, steps[i])
        if ob.attrs["component"] == "other":
            i += 1
    assert i == len(steps) == 3
    assert per_step == pytest.approx(steps, abs=1e-8)
    (call,) = exp.values(CALL, model=kind)
    (first,) = exp.values("gpuprobe.diffusion.time_to_first_step", model=kind)
    assert sum(steps) < call
    assert steps[0] < first < call
    # Each component of the call (text encoders, the VAE) runs outside the steps: together they fit in the call.
    outside = [ob.value for ob in exp.observations(PART, model=kind, clock="host")
               if ob.attrs["component"] not in STEP_PARTS]
    assert outside and sum(outside) + sum(steps) < call


def test_the_callbacks_see_what_they_see_without_gpuprobe_and_their_time_is_the_steps_other() -> None:
    pipe = BUILDERS["sd"]()

    def run() -> tuple[Any, list[tuple[int, float, Any]], list[int]]:
        seen: list[tuple[int, float, Any]] = []
        spent: list[int] = []

        def on_step_end(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            t0 = time.perf_counter_ns()
            seen.append((i, float(t), kwargs["latents"].clone()))
            time.sleep(0.02)
            spent.append(time.perf_counter_ns() - t0)
            return {"latents": kwargs["latents"] * 0.5}  # the callback changes the latents: the loop uses them

        images = pipe(**inputs("sd", steps=3), callback_on_step_end=on_step_end,
                      callback_on_step_end_tensor_inputs=["latents"]).images
        return images, seen, spent

    plain, plain_seen, _ = run()
    instrument(pipe, model_name="sd")
    with InMemoryExporter() as exp:
        measured, seen, spent = run()
    assert torch.equal(plain, measured)
    assert [(i, t) for i, t, _ in seen] == [(i, t) for i, t, _ in plain_seen]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(seen, plain_seen))
    other = _host(exp, PART, model="sd", component="other")
    assert len(other) == len(spent) == 3
    assert all(o >= s / 1e9 for o, s in zip(other, spent))  # the callback ran inside its own step's "other"


def test_image_to_image_steps_follow_its_strength() -> None:
    pipe = instrument(BUILDERS["img2img"](), model_name="i2i")
    calls: list[int] = []
    with InMemoryExporter() as exp:
        pipe(**inputs("img2img", steps=4, strength=0.5),
             callback_on_step_end=lambda p, i, t, kw: calls.append(i) or {})
    assert len(calls) == 2  # diffusers runs the last half of the 4 timesteps
    assert len(_host(exp, STEP, model="i2i")) == len(calls)
    assert len(_host(exp, PART, model="i2i", component="vae_encode")) == 1


def test_guidance_run_apart_is_two_denoiser_calls_a_step_named_cond_and_uncond() -> None:
    pipe = instrument(BUILDERS["flux"](), model_name="flux")
    with InMemoryExporter() as exp:
        _images(pipe, "flux", steps=2)
        batched = _host(exp, PART, model="flux", component="denoiser", branch="batched")
    assert len(_host(exp, PART, model="flux", component="denoiser", branch="cond")) == 2
    assert len(_host(exp, PART, model="flux", component="denoiser", branch="uncond")) == 2
    assert batched == []


def test_guidance_in_one_batch_is_one_batched_call_and_no_guidance_a_cond_one() -> None:
    pipe = instrument(BUILDERS["sd"](), model_name="sd")
    with InMemoryExporter() as exp:
        _images(pipe, "sd", steps=2)
        _images(pipe, "sd", steps=2, guidance_scale=1.0)  # no classifier-free guidance
    assert len(_host(exp, PART, model="sd", component="denoiser", branch="batched")) == 2
    assert len(_host(exp, PART, model="sd", component="denoiser", branch="cond")) == 2


def test_a_failing_call_is_counted_with_its_error_and_leaves_no_step_open() -> None:
    pipe = instrument(BUILDERS["sd"](), model_name="sd")

    def boom(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if i == 1:
            raise KeyError("the caller's own")
        return {}

    with InMemoryExporter() as exp:
        with pytest.raises(KeyError, match="the caller's own"):
            pipe(**inputs("sd", steps=3), callback_on_step_end=boom)
        assert len(exp.values(CALL, model="sd", **{"error.type": "KeyError"})) == 1
        assert len(_host(exp, STEP, model="sd")) == 1  # step 0 closed; step 1 failed: no sample
        _images(pipe, "sd", steps=2)  # the next call is measured from a clean start
        assert len(_host(exp, STEP, model="sd")) == 3
