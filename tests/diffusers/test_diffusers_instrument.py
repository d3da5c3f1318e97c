"""instrument() / uninstrument() / instrument_all(): what they change on a pipeline and its components, and
what they put back; components shared, replaced, compiled and copied."""

from __future__ import annotations

import copy
import inspect
import pickle
import warnings
from typing import Any

import pytest
from _pipes import BUILDERS, diffusers, inputs, torch

import gpuprobe
from gpuprobe import _seams
from gpuprobe.errors import ConfigError
from gpuprobe.integrations import diffusers as gd
from gpuprobe.testing import InMemoryExporter

STEP = "gpuprobe.diffusion.step.duration"


def _steps(exp: InMemoryExporter, model: str) -> int:
    return len(exp.values(STEP, clock="host", model=model))


def test_uninstrument_puts_back_the_class_call_and_every_component_method() -> None:
    pipe = BUILDERS["sd"]()
    cls = type(pipe)
    call = cls.__dict__["__call__"]
    dicts = {name: dict(vars(getattr(pipe, name))) for name in ("unet", "vae", "text_encoder", "scheduler")}
    gd.instrument(pipe)
    assert cls.__dict__["__call__"] is not call
    assert _seams.is_replacement(pipe.unet.forward) and _seams.is_replacement(pipe.scheduler.step)
    assert _seams.is_replacement(pipe.vae.decode) and _seams.is_replacement(pipe.text_encoder.forward)
    assert inspect.signature(cls.__call__) == inspect.signature(call)
    assert inspect.signature(pipe.scheduler.step) == inspect.signature(type(pipe.scheduler).step.__get__(pipe.scheduler))
    gd.uninstrument(pipe)
    assert cls.__dict__["__call__"] is call
    assert {name: dict(vars(getattr(pipe, name))) for name in dicts} == dicts
    assert not gd.is_instrumented(pipe)


def test_instrument_twice_installs_once_and_other_options_instrument_anew() -> None:
    pipe = BUILDERS["sd"]()
    gd.instrument(pipe, model_name="a")
    installs = _seams.seam("diffusers.denoiser.forward").installs
    gd.instrument(pipe, model_name="a")
    assert _seams.seam("diffusers.denoiser.forward").installs == installs
    gd.instrument(pipe, model_name="b")
    with InMemoryExporter() as exp:
        pipe(**inputs("sd"))
    assert _steps(exp, "b") == 2 and _steps(exp, "a") == 0


@pytest.mark.parametrize("bad, message", [
    ({"model_name": ""}, "model_name"), ({"layer_every": 0}, "layer_every"), ({"layers": "yes"}, "layers")])
def test_a_bad_option_is_a_config_error_naming_it(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        gd.instrument(BUILDERS["sd"](), **bad)


def test_something_that_is_not_a_pipeline_is_refused_naming_its_type() -> None:
    with pytest.raises(gd.UnsupportedPipelineError, match="torch.nn.modules.linear.Linear"):
        gd.instrument(torch.nn.Linear(2, 2))
    with pytest.raises(gd.UnsupportedPipelineError, match="instance"):
        gd.instrument(diffusers.StableDiffusionPipeline)


def test_an_uninstrumented_instance_of_an_instrumented_class_is_not_measured() -> None:
    measured, plain = BUILDERS["sd"](), BUILDERS["sd"]()
    gd.instrument(measured, model_name="measured")
    with InMemoryExporter() as exp:
        a = plain(**inputs("sd")).images
        b = measured(**inputs("sd")).images
    assert torch.equal(a, b)
    assert _steps(exp, "measured") == 2
    assert {ob.attrs["model"] for ob in exp.observations(STEP)} == {"measured"}


def test_two_pipelines_sharing_components_are_each_measured_as_themselves() -> None:
    text = BUILDERS["sd"]()
    image = diffusers.StableDiffusionImg2ImgPipeline(**text.components)
    image.set_progress_bar_config(disable=True)
    gd.instrument(text, model_name="t2i")
    gd.instrument(image, model_name="i2i")
    with InMemoryExporter() as exp:
        text(**inputs("sd"))
        image(**inputs("img2img", steps=3))
    assert (_steps(exp, "t2i"), _steps(exp, "i2i")) == (2, 3)
    gd.uninstrument(text)  # the unet is still image's: its seam stays
    assert _seams.is_replacement(image.unet.forward)
    with InMemoryExporter() as exp:
        image(**inputs("img2img", steps=2))
    assert _steps(exp, "i2i") == 2
    gd.uninstrument(image)
    assert "forward" not in vars(image.unet) and "step" not in vars(image.scheduler)


def test_a_component_replaced_between_calls_is_measured_from_the_next_call() -> None:
    pipe = gd.instrument(BUILDERS["sd"](), model_name="sd")
    old = pipe.scheduler
    pipe.scheduler = diffusers.EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    with InMemoryExporter() as exp:
        pipe(**inputs("sd", steps=3))
    assert len(exp.values("gpuprobe.diffusion.component.duration", clock="host", model="sd",
                          component="scheduler")) == 3
    assert _seams.is_replacement(pipe.scheduler.step)
    gd.uninstrument(pipe)
    assert "step" not in vars(pipe.scheduler) and "step" not in vars(old)


def test_copies_and_pickles_of_instrumented_components_compute_as_the_originals() -> None:
    pipe = gd.instrument(BUILDERS["sd"]())
    pipe(**inputs("sd"))
    x, t, text = torch.randn(1, 4, 8, 8), torch.tensor(10), torch.randn(1, 4, 32)
    want = pipe.unet(x, t, encoder_hidden_states=text).sample
    for other in (copy.deepcopy(pipe.unet), pickle.loads(pickle.dumps(pipe.unet))):
        other.load_state_dict(pipe.unet.state_dict())
        assert torch.equal(other(x, t, encoder_hidden_states=text).sample, want)
    sched = pickle.loads(pickle.dumps(pipe.scheduler))
    sched.set_timesteps(2)
    assert sched.step(x, sched.timesteps[0], x).prev_sample.shape == x.shape
    twin = copy.deepcopy(pipe)  # a copy of the pipeline is a plain one
    assert not gd.is_instrumented(twin)
    assert torch.equal(twin(**inputs("sd")).images, pipe(**inputs("sd")).images)


def test_a_compiled_denoiser_is_measured_outside_its_compiled_code() -> None:
    pipe = BUILDERS["sd"]()
    plain = pipe(**inputs("sd")).images
    pipe.unet = torch.compile(pipe.unet, backend="eager", fullgraph=True)
    gd.instrument(pipe, model_name="compiled", layers=True, layer_every=1)
    with InMemoryExporter() as exp:
        got = pipe(**inputs("sd")).images
    assert torch.equal(plain, got)
    assert _steps(exp, "compiled") == 2
    assert len(exp.values("gpuprobe.diffusion.component.duration", clock="host", model="compiled",
                          component="denoiser")) == 2


def test_a_denoiser_compiled_in_place_is_measured_at_its_compiled_call() -> None:
    pipe = BUILDERS["sd"]()
    plain = pipe(**inputs("sd")).images
    gd.instrument(pipe, model_name="inplace")
    pipe.unet.compile(backend="eager", fullgraph=True)  # after instrument(): the seam moves at the next call
    with InMemoryExporter() as exp:
        got = pipe(**inputs("sd")).images
    assert torch.equal(plain, got)
    assert len(exp.values("gpuprobe.diffusion.component.duration", clock="host", model="inplace",
                          component="denoiser")) == 2
    gd.uninstrument(pipe)
    assert not _seams.is_replacement(vars(pipe.unet).get("_compiled_call_impl"))


def test_instrument_all_measures_every_pipeline_at_its_first_call_and_respects_an_opt_out() -> None:
    first, second = BUILDERS["sd"](), BUILDERS["sdxl"]()
    gd.instrument_all(layers=True, layer_every=1)
    try:
        gd.uninstrument(second)  # opted out while instrument_all is in force
        with InMemoryExporter() as exp:
            first(**inputs("sd"))
            second(**inputs("sdxl"))
        assert _steps(exp, "StableDiffusionPipeline") == 2
        assert _steps(exp, "StableDiffusionXLPipeline") == 0
        assert exp.values("gpuprobe.layer.duration", model="StableDiffusionPipeline")
    finally:
        gd.uninstrument_all()
    assert not gd.is_instrumented(first)
    assert "__call__" in vars(type(first)) and not _seams.is_replacement(type(first).__call__)


def test_instrument_all_reaches_a_pipeline_class_defined_later() -> None:
    gd.instrument_all()
    try:
        class Later(diffusers.StableDiffusionPipeline):
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return super().__call__(*args, **kwargs)

        built = BUILDERS["sd"]()
        pipe = Later(**built.components, requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        with InMemoryExporter() as exp:
            pipe(**inputs("sd"))
        assert _steps(exp, "Later") == 2  # once: the inner super().__call__() is the same call
        assert len(exp.values("gpuprobe.diffusion.call.duration", model="Later")) == 1
    finally:
        gd.uninstrument_all()


def test_disabled_gpuprobe_measures_nothing_and_changes_nothing() -> None:
    pipe = gd.instrument(BUILDERS["sd"]())
    want = pipe(**inputs("sd")).images
    gpuprobe.collect()  # that call's records are aggregated now, before the exporter listens
    gpuprobe.disable()
    try:
        with InMemoryExporter() as exp:
            assert torch.equal(pipe(**inputs("sd")).images, want)
        assert exp.values(STEP) == []
    finally:
        gpuprobe.enable()


def test_describe_says_the_installed_version_fits() -> None:
    found = gd.describe()
    assert found["state"] == "ok", found
    assert found["checked_against"] == f"diffusers {diffusers.__version__}"
    assert all(why is None for why in found["seams"].values())


def test_uninstrument_all_leaves_the_pipelines_you_instrumented_yourself() -> None:
    mine = gd.instrument(BUILDERS["sd"](), model_name="mine")
    gd.instrument_all()
    met = BUILDERS["sd"]()
    met(**inputs("sd"))
    assert gd.is_instrumented(met)
    gd.uninstrument_all()
    assert gd.is_instrumented(mine) and not gd.is_instrumented(met)
    gpuprobe.collect()  # the first call's records aggregated before the exporter listens
    with InMemoryExporter() as exp:
        mine(**inputs("sd"))
        met(**inputs("sd"))
    assert _steps(exp, "mine") == 2 and _steps(exp, "StableDiffusionPipeline") == 0


def test_a_method_of_another_shape_is_refused_once_and_the_rest_still_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shape check: a denoiser whose cache_context takes no ``name`` keeps its own (info() says why,
    one warning); the steps are measured, the denoiser's calls no longer named."""
    pipe = BUILDERS["flux"]()
    want = pipe(**inputs("flux")).images
    original = type(pipe.transformer).cache_context

    def renamed(self: Any, label: str, **kwargs: Any) -> Any:
        return original(self, label, **kwargs)

    monkeypatch.setattr(type(pipe.transformer), "cache_context", renamed)
    with pytest.warns(RuntimeWarning, match=r"seam diffusers\.denoiser\.cache_context .* is not installed: .*name"):
        gd.instrument(pipe, model_name="flux")
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        gd.instrument(BUILDERS["flux"](), model_name="again")
    assert [w for w in again if "cache_context" in str(w.message)] == []  # said once
    gpuprobe.collect()
    with InMemoryExporter() as exp:
        assert torch.equal(pipe(**inputs("flux")).images, want)
    states = {s["seam"]: s for s in gpuprobe.info()["seams"]}
    assert states["diffusers.denoiser.cache_context"]["state"] == "refused"
    assert states["diffusers.denoiser.forward"]["state"] == "on"
    branches = [ob.attrs["branch"] for ob in exp.observations("gpuprobe.diffusion.component.duration", clock="host",
                                                               model="flux", component="denoiser")]
    assert branches == ["cond", "other"] * 2


@pytest.mark.parametrize("loaded_from, name", [("/models/checkpoints/sd-turbo", "sd-turbo"),
                                               ("stabilityai/sd-turbo", "stabilityai/sd-turbo"), ("", "StableDiffusionPipeline")])
def test_the_default_model_label_is_where_the_pipeline_was_loaded_from(loaded_from: str, name: str) -> None:
    pipe = BUILDERS["sd"]()
    pipe.register_to_config(_name_or_path=loaded_from)  # what from_pretrained records
    gd.instrument(pipe)
    with InMemoryExporter() as exp:
        pipe(**inputs("sd"))
    assert _steps(exp, name) == 2
