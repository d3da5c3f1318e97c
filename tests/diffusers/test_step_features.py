"""What counts denoising steps as generation steps: the sync audit, kernel sampling, a profiler's trace, the
denoiser's blocks sampled; and the NVTX ranges of a call, recorded for real by an NVTX injection library."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from _pipes import BUILDERS, inputs, torch

import gpuprobe
from gpuprobe.integrations.diffusers import instrument
from gpuprobe.testing import InMemoryExporter


def _points(name: str) -> list[Any]:
    return [p for md in gpuprobe.collect() if md.spec.name == name for p in md.points]


def test_the_sync_audit_finds_a_callbacks_sync_in_its_steps_other() -> None:
    pipe = instrument(BUILDERS["sd"](), model_name="sd")
    gpuprobe.configure(sync_audit=1)

    def reads_a_number(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs["latents"].sum().item()  # one device-to-host sync a step, in the caller's code
        return {}

    pipe(**inputs("sd", steps=3), callback_on_step_end=reads_a_number, callback_on_step_end_tensor_inputs=["latents"])
    (audited,) = _points("gpuprobe.diffusion.steps.audited")
    syncs = {(p.labels["component"], p.labels["op"]): p.value for p in _points("gpuprobe.diffusion.syncs")}
    assert audited.value == 3
    assert syncs[("other", "aten::_local_scalar_dense")] == 3
    assert not any(component == "denoiser" for component, _ in syncs)  # the UNet's forward reads no number


def test_kernel_sampling_counts_a_denoising_steps_operators_by_category() -> None:
    if torch.cuda.is_available():
        pytest.skip("with a CUDA device kernel sampling counts CUDA kernels, and the simulated CUDA launches none")
    pipe = instrument(BUILDERS["sd"]())
    gpuprobe.configure(kernel_sampling=1)
    pipe(**inputs("sd", steps=3))
    categories = {p.labels["category"] for p in _points("gpuprobe.kernel.launches") if p.value}
    assert {"conv", "attention"} <= categories  # a UNet step: convolutions and cross-attention


def test_a_programs_own_profiler_sees_each_step_with_its_components() -> None:
    pipe = instrument(BUILDERS["flux"]())
    with torch.profiler.profile() as prof:
        pipe(**inputs("flux", steps=2))
    names = [e.name for e in prof.events() if e.name.startswith(("gpuprobe.step#", "denoiser", "scheduler"))]
    assert len(names) == 8
    assert [n.split("#")[0] for n in names] == ["gpuprobe.step", "denoiser", "denoiser", "scheduler"] * 2


def test_blocks_are_timed_on_one_step_in_layer_every() -> None:
    pipe = instrument(BUILDERS["sd3"](), model_name="sd3", layers=True, layer_every=2, layer_index=True)
    with InMemoryExporter() as exp:
        pipe(**inputs("sd3", steps=4))
    index = {ob.attrs["layer.index"] for ob in exp.observations("gpuprobe.layer.duration", model="sd3")}
    assert index == {"transformer_blocks.0"}  # the tiny SD3 transformer has one block
    assert len(exp.values("gpuprobe.layer.duration", model="sd3")) == 2


def test_memory_false_reads_no_memory() -> None:
    pipe = instrument(BUILDERS["sd"](), memory=False)
    pipe(**inputs("sd"))
    assert _points("gpuprobe.diffusion.component.memory.peak") == []


SCRIPT = """
import json, sys, torch
sys.path.insert(0, "tests/diffusers")
torch.set_num_threads(1)
import _pipes
from gpuprobe.integrations.diffusers import instrument
pipe = instrument(_pipes.flux(), model_name="flux", layers=True, layer_every=2)
pipe(**_pipes.inputs("flux", steps=3))
print("REPORT" + json.dumps({"steps": 3}))
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    nvtx_capture = pytest.importorskip("gpuprobe.testing.nvtx_capture")
    pytest.importorskip("nvtx")
    if shutil.which(os.environ.get("CC") or "gcc") is None:
        pytest.skip("no C compiler (gcc) to build the NVTX injection library")
    lib = nvtx_capture.build_injection_library(tmp_path_factory.mktemp("nvtx-inject"))
    return nvtx_capture.run_captured(SCRIPT, library=lib, timeout=300, cwd=str(Path(__file__).resolve().parents[2]))


def test_nvtx_ranges_nest_call_steps_and_components(captured: Any) -> None:
    cap = captured
    assert cap.is_balanced("gpuprobe"), cap.problems("gpuprobe")
    ranges = cap.ranges("gpuprobe")
    (call,) = [r for r in ranges if r.depth == 0]
    assert (call.message, call.category_name) == ("pipeline flux", "generate")

    def children(parent: Any) -> list[Any]:
        return [r for r in ranges if r.parent == parent.index]

    outside = [r.message for r in children(call) if r.category_name == "component"]
    assert outside == ["text_encoder", "text_encoder_2", "text_encoder", "text_encoder_2", "vae_decode"]
    steps = [r for r in children(call) if r.category_name == "step"]
    assert [(s.message, s.payload) for s in steps] == [("denoise", 0), ("denoise", 1), ("denoise", 2)]
    for step in steps:
        parts = children(step)
        assert [p.message for p in parts] == ["denoiser cond", "denoiser uncond", "scheduler"]
        assert {p.payload for p in parts} == {step.payload}
    sampled = [s.payload for s in steps if any(children(p) for p in children(s))]
    blocks = [b for p in children(steps[1]) for b in children(p)]
    assert blocks and {b.category_name for b in blocks} == {"layer"}
    assert sampled == [1]
    assert json.loads(next(x for x in captured.stdout.splitlines() if x.startswith("REPORT"))[6:]) == {"steps": 3}
