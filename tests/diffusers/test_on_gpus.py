"""The integration's CUDA paths on the simulated CUDA (gpuprobe.testing.simcuda), with real tiny pipelines.

A CPU build of torch cannot put a pipeline on a GPU, so the pipeline runs on the CPU and the simulation tells
gpuprobe that its tensors live on a device (``cpu_tensors_on``) and stands in for that device: forward hooks
queue simulated kernels of a known length on the device's stream, so each device span has a value known
before the run (a span on the wrong stream, or cut at the wrong place, reads something else).
"""

from __future__ import annotations

from typing import Any

import pytest
from _pipes import BUILDERS, inputs, torch

import gpuprobe
from gpuprobe.integrations.diffusers import instrument
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter

MS = 1_000_000
MIB = 2**20
STEP = "gpuprobe.diffusion.step.duration"
PART = "gpuprobe.diffusion.component.duration"


@pytest.fixture(autouse=True)
def _simcuda_installed_after_isolation(simcuda):  # type: ignore[no-untyped-def]
    yield  # the tests call simcuda(...) themselves; this orders its teardown before the module's


def queue_kernels(module: Any, sim: Any, ns: int, device: int = 0) -> None:
    """Each forward of ``module`` queues ``ns`` of GPU work on ``device``'s current stream (from a hook on
    its first submodule, so inside the module's own forward)."""
    inner = next(iter(module.children()))
    inner.register_forward_hook(lambda *args: sim.launch(ns, stream=torch.cuda.current_stream(device)) and None)


@pytest.fixture
def cuda_rng_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA generator states for Dynamo: it saves and restores them around each frame it compiles whenever
    CUDA is available (torch/_dynamo/convert_frame.py), and the simulation keeps none (a CPU build has none)."""
    states: dict[int, Any] = {}

    def get_rng_state(device: Any = "cuda") -> Any:
        return states.get(0, torch.zeros(16, dtype=torch.uint8)).clone()

    def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
        states[0] = new_state.clone()

    for target in (torch.cuda, torch.cuda.random):
        monkeypatch.setattr(target, "get_rng_state", get_rng_state)
        monkeypatch.setattr(target, "set_rng_state", set_rng_state)


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 6) for v in values]


def test_step_and_component_device_spans_are_the_kernels_they_queued(simcuda) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()  # the program has initialized CUDA
    pipe = BUILDERS["sd"]()
    queue_kernels(pipe.unet, sim, 4 * MS)
    queue_kernels(pipe.vae.decoder, sim, 3 * MS)
    queue_kernels(pipe.text_encoder, sim, 1 * MS)
    instrument(pipe, model_name="m")
    with InMemoryExporter() as exp:
        pipe(**inputs("sd", steps=3))
        assert exp.values(STEP, clock="device") == []  # nothing waits for the device
        sim.finish()
        steps = _rounded(exp.values(STEP, clock="device"))
        denoiser = _rounded(exp.values(PART, clock="device", component="denoiser"))
        scheduler = _rounded(exp.values(PART, clock="device", component="scheduler"))
        decode = _rounded(exp.values(PART, clock="device", component="vae_decode"))
        text = _rounded(exp.values(PART, clock="device", component="text_encoder"))
    assert steps == [0.004] * 3 and denoiser == [0.004] * 3 and scheduler == [0.0] * 3
    assert decode == [0.003] and text == [0.001] * 2
    assert runtime().backends.device_clock.in_flight == 0  # type: ignore[union-attr]


def test_no_synchronization_is_added(simcuda) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()
    pipe = BUILDERS["sd"]()
    queue_kernels(pipe.unet, sim, MS)
    sim.reset_stats()
    pipe(**inputs("sd", steps=3))
    plain = sim.stats.host_syncs
    instrument(pipe, layers=True, layer_every=1)
    gpuprobe.configure(sync_audit=1)
    sim.reset_stats()
    pipe(**inputs("sd", steps=3))
    gpuprobe.collect()
    assert sim.stats.host_syncs == plain == 0


def test_the_vae_decodes_peak_is_its_own_with_peak_reset(simcuda) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()
    held = sim.allocate(32 * MIB)  # the weights
    gpuprobe.configure(memory_peak_reset=True)
    pipe = BUILDERS["sd"]()

    def decode_needs_room(module: Any, args: Any) -> None:  # the decode's activations, freed before it returns
        sim.free(sim.allocate(256 * MIB))

    pipe.vae.decoder.register_forward_pre_hook(decode_needs_room)
    instrument(pipe, model_name="m")
    with InMemoryExporter() as exp:
        pipe(**inputs("sd"))
        peak = {ob.attrs["component"]: ob.value for ob in exp.observations("gpuprobe.diffusion.component.memory.peak")}
    assert peak["vae_decode"] == torch.cuda.memory_allocated(0) + 256 * MIB
    assert peak["text_encoder"] == peak["denoiser"] == torch.cuda.memory_allocated(0)
    sim.free(held)


def test_a_call_inside_a_capture_takes_no_device_time_and_breaks_no_capture(simcuda, cuda_rng_states) -> None:  # type: ignore[no-untyped-def]
    if torch.version.cuda is not None:
        pytest.skip("torch.compile under the simulated CUDA needs a CPU build of torch: a CUDA build without a "
                    "driver calls the driver while it compiles (it runs under .venv's CPU build)")
    pipe = BUILDERS["sd"]()
    pipe.unet = torch.compile(pipe.unet, backend="eager")  # a compiled denoiser (CUDA graphs are what it is for)
    # Compiled before any capture, as a CUDA-graph user warms up (torch 2.15 refuses to compile inside one),
    # and before the simulated CUDA is installed (a CUDA build of torch without a driver cannot compile under it).
    pipe(**inputs("sd", steps=2))
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()
    queue_kernels(pipe.unet, sim, MS)
    instrument(pipe, model_name="m", layers=True, layer_every=1)
    plain_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(plain_graph):
        sim.launch(MS, "warm-up")
    graph = torch.cuda.CUDAGraph()
    with InMemoryExporter() as exp:
        with torch.cuda.graph(graph):  # a CUDA-graph warm-up that runs the pipeline
            pipe(**inputs("sd", steps=2))
        sim.finish()
        assert exp.values(STEP, clock="device") == [] and exp.values(PART, clock="device") == []
        assert exp.values("gpuprobe.layer.duration") == []
        assert len(exp.values(STEP, clock="host")) == 2
        pipe(**inputs("sd", steps=2))  # after the capture: device time again
        sim.finish()
        assert len(exp.values(STEP, clock="device")) == 2
    assert sim.stats.invalidated_captures == 0
