"""``gpuprobe.summary()`` of a pipeline's calls: its steps' components with their shares, denoising steps per
second and images per second, computed here from the observations an exporter received."""

from __future__ import annotations

import math

import pytest
from _pipes import BUILDERS, inputs

import gpuprobe
from gpuprobe.integrations.diffusers import instrument
from gpuprobe.testing import InMemoryExporter


def test_the_summary_has_the_steps_components_and_the_pipelines_rates() -> None:
    pipe = instrument(BUILDERS["sd"](), model_name="tiny-sd")
    with InMemoryExporter() as exp:
        for _ in range(2):
            pipe(**inputs("sd", steps=3))
        steps = exp.values("gpuprobe.diffusion.step.duration", model="tiny-sd", clock="host")
        calls = exp.values("gpuprobe.diffusion.call.duration", model="tiny-sd")
        images = sum(exp.values("gpuprobe.diffusion.images", model="tiny-sd"))
    found = gpuprobe.summary()
    rates = {r.title: r for r in found.values if r.labels.get("model") == "tiny-sd" and r.unit.endswith("/s")}
    assert len(steps) == 6 and len(calls) == 2 and images == 2
    assert math.isclose(rates["denoising steps per second"].value, len(steps) / sum(steps), rel_tol=1e-6)
    assert math.isclose(rates["images per second"].value, images / sum(calls), rel_tol=1e-6)
    shares = {c.component: c.share for c in found.components if c.model == "tiny-sd"}
    assert set(shares) == {"denoiser", "scheduler", "other"}  # the parts of a step, not the text encoder
    assert sum(shares.values()) == pytest.approx(1.0)
    text = str(found)
    line = next(x for x in text.splitlines() if x.startswith("denoising steps per second"))
    assert "." in line.split()[-1]  # a rate, shown with its decimals
