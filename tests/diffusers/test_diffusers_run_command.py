"""``gpuprobe run -- python app.py``: a program that builds and calls a diffusers pipeline, with no line of
gpuprobe in it, gets its pipeline measured and served on /metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

# What this checks runs in a process of its own: a simulated CUDA in this one changes nothing.
pytestmark = pytest.mark.subprocess_only

ROOT = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)

APP = """
    import os, sys, urllib.request
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {pipes!r})
    import _pipes  # tiny pipelines built from configs, with tokenizers trained there
    pipe = _pipes.sd()
    pipe(**_pipes.inputs("sd", steps=3))
    port = os.environ["GPUPROBE_PROMETHEUS_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{{port}}/metrics", timeout=10) as resp:
        sys.stdout.write(resp.read().decode())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if not k.startswith("gpuprobe_")))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_a_program_gets_its_pipeline_measured_with_no_code_change(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP.format(pipes=str(ROOT / "tests" / "diffusers"))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    env["OMP_NUM_THREADS"] = "1"
    port = _free_port()
    done = subprocess.run([sys.executable, "-m", "gpuprobe", "run", "--port", str(port), "--layers", "1", "--",
                           sys.executable, str(app)], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    got = _samples(done.stdout.decode())
    model = ("model", "StableDiffusionPipeline")
    assert got[("gpuprobe_diffusion_step_duration_seconds_count", (("clock", "host"), model))] == 3
    assert got[("gpuprobe_diffusion_call_duration_seconds_count", (model,))] == 1
    assert got[("gpuprobe_diffusion_images_total", (model,))] == 1
    assert got[("gpuprobe_diffusion_component_duration_seconds_count",
                (("branch", "batched"), ("clock", "host"), ("component", "denoiser"), model, ("module", "unet")))] == 3
    layers = [v for (name, labels), v in got.items() if name == "gpuprobe_layer_duration_seconds_count"
              and model in labels]
    assert layers and all(v == 3 for v in layers)  # --layers 1: the blocks on every step
