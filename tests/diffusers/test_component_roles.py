"""What each component of a pipeline does, from the name diffusers' pipelines give it (their ``__init__``
keywords): the names below are those diffusers 0.35 to 0.42 use, read from its pipelines' signatures."""

from __future__ import annotations

import pytest

from gpuprobe.integrations._diffusers import compat


@pytest.mark.parametrize(("name", "expected"), [
    ("unet", "denoiser"),
    ("image_unet", "denoiser"),  # Versatile Diffusion (its text_unet only lends blocks to it)
    ("transformer", "denoiser"),
    ("transformer_2", "denoiser"),  # Wan 2.2's second expert
    ("prior", "denoiser"),
    ("decoder", "denoiser"),  # Stable Cascade's decoder
    ("text_encoder", "text_encoder"),
    ("text_encoder_3", "text_encoder"),
    ("controlnet", "controlnet"),
    ("scheduler", "scheduler"),
    ("vae", "vae"),
    ("audio_vae", "vae"),  # LTX-2
    ("vqvae", "vae"),  # aMUSEd, VQ-Diffusion, latent diffusion
    ("vqgan", "vae"),
    ("movq", "vae"),
    ("safety_checker", "safety_checker"),
    ("tokenizer_2", None),
    ("feature_extractor", None),
    ("text_unet", None),
    ("image_encoder", None),
])
def test_a_components_name_gives_its_role(name: str, expected: str | None) -> None:
    assert compat.role(name) == expected
