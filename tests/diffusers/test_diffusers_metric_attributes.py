"""Every series the diffusers integration emits is declared in gpuprobe._metrics.SPECS: its attributes are the
spec's, and an attribute whose values the spec lists takes only those."""

from __future__ import annotations

from typing import Any

from _pipes import BUILDERS, inputs, safety_checker, sd

import gpuprobe
from gpuprobe._metrics import SPECS
from gpuprobe.integrations.diffusers import instrument

ALWAYS = {"gpuprobe.rank", "gpuprobe.device"}


def _emitted() -> list[tuple[str, dict[str, str]]]:
    return [(md.spec.name, dict(p.labels)) for md in gpuprobe.collect() for p in md.points
            if md.spec.name.startswith("gpuprobe.diffusion.") or md.spec.name == "gpuprobe.layer.duration"]


def test_every_emitted_series_has_the_attributes_and_values_its_spec_declares() -> None:
    gpuprobe.configure(sync_audit=1)
    checker, extractor = safety_checker()
    pipes: list[tuple[Any, str]] = [(sd(safety_checker=checker, feature_extractor=extractor), "sd"),
                                    (BUILDERS["flux"](), "flux"), (BUILDERS["controlnet"](), "controlnet"),
                                    (BUILDERS["img2img"](), "img2img")]
    for pipe, kind in pipes:
        instrument(pipe, layers=True, layer_every=1, layer_index=True)
        pipe(**inputs(kind))
    emitted = _emitted()
    names = {name for name, _ in emitted}
    assert {"gpuprobe.diffusion.call.duration", "gpuprobe.diffusion.step.duration",
            "gpuprobe.diffusion.component.duration", "gpuprobe.diffusion.time_to_first_step",
            "gpuprobe.diffusion.images", "gpuprobe.diffusion.component.memory.peak",
            "gpuprobe.diffusion.steps.audited", "gpuprobe.diffusion.syncs", "gpuprobe.layer.duration"} <= names
    components = {labels["component"] for name, labels in emitted if name == "gpuprobe.diffusion.component.duration"}
    assert components == {"text_encoder", "denoiser", "controlnet", "scheduler", "other", "vae_encode",
                          "vae_decode", "safety_checker"}
    for name, labels in emitted:
        spec = SPECS[name]
        assert set(labels) - ALWAYS <= spec.attribute_names, (name, labels)
        for attribute in spec.attributes:
            if attribute.values is not None and attribute.name in labels:
                assert labels[attribute.name] in attribute.values, (name, attribute.name, labels[attribute.name])
