"""A sample of scripts/diffusers_sweep.py, as CI runs it: pipeline classes built from configs by the script's
own recipes (not the tests' builders), called plain and instrumented in its worker process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Classes the other tests do not build, of the families the recipes cover: unconditional UNets, a
# consistency model, PixArt's transformer, inpainting and image-to-image of SD, SDXL and Flux, and a
# denoiser under another name (Versatile Diffusion's image_unet).
SAMPLE = ("DDIMPipeline", "ConsistencyModelPipeline", "PixArtSigmaPipeline", "StableDiffusionInpaintPipeline",
          "StableDiffusionXLImg2ImgPipeline", "FluxInpaintPipeline", "VersatileDiffusionTextToImagePipeline")

pytestmark = pytest.mark.subprocess_only


def test_a_sample_of_the_sweep_is_measured_step_for_step_with_the_same_output() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "diffusers_sweep.py"), "--json", "--timeout", "120",
                           "--only", ",".join(SAMPLE)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    states = {row["pipeline"]: (row["state"], row.get("why")) for row in found["rows"]}
    assert states == {name: ("measured", None) for name in SAMPLE}
    assert all(row["same_output"] and row["steps"] == 2 for row in found["rows"])
    assert found["counts"] == {"measured": len(SAMPLE), "differs": 0, "not built": 0, "not called": 0}


def test_a_name_that_is_not_a_pipeline_class_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("diffusers_sweep", ROOT / "scripts" / "diffusers_sweep.py")
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    assert sweep.main(["--only", "StableDiffusionPipeline,NoSuchPipeline"]) == 2
    assert capsys.readouterr().err.strip() == "diffusers_sweep: not a pipeline class of diffusers: NoSuchPipeline"
