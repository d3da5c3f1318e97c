"""The integration's CUDA paths on the simulated CUDA (gpuprobe.testing.simcuda), with a real tiny model.

A CPU build of torch cannot put the model on a GPU, so the model runs on the CPU and the simulation
tells gpuprobe where its tensors would live (``cpu_tensors_on``, ``sim.place``) and stands in for the
device: forward hooks queue simulated kernels on the stream of the device each module lives on, so a
device span measured on the wrong device reads ~0 instead of the kernels' time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _hfkit import prompt, torch

import gpuprobe
from gpuprobe.integrations.transformers import instrument
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter

MS = 1_000_000
STEP = "gpuprobe.step.duration"
LAYER = "gpuprobe.layer.duration"


@pytest.fixture(autouse=True)
def _simcuda_installed_after_isolation(simcuda):  # type: ignore[no-untyped-def]
    yield  # the tests call simcuda(...) themselves; this orders its teardown before the module's


def queue_kernels(module, sim, ns: int, device: int) -> None:  # type: ignore[no-untyped-def]
    """Each forward of ``module`` queues ``ns`` of GPU work on ``device``'s current stream."""
    module.register_forward_hook(lambda *args: sim.launch(ns, stream=torch.cuda.current_stream(device)) and None)


def values(exp: InMemoryExporter, name: str, **labels: str) -> list[float]:
    return [round(v, 6) for v in exp.values(name, **labels)]


def test_step_device_time_is_taken_on_the_device_the_model_runs_on(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(2, cpu_tensors_on=1)  # the model and its inputs on cuda:1
    torch.cuda.current_device()  # the current device stays 0
    model = instrument(make_model("llama"), model_name="m")
    queue_kernels(model, sim, 4 * MS, device=1)
    with InMemoryExporter() as exp:
        out = model.generate(prompt(), max_new_tokens=4, min_new_tokens=4)
        steps = out.shape[1] - prompt().shape[1]
        assert values(exp, STEP, clock="device") == []  # nothing waits for the device
        sim.finish()
        device = values(exp, STEP, clock="device")
    # Each step's span covers its forward's 4 ms on cuda:1 (on cuda:0, where nothing runs, it would be ~0).
    assert len(device) == steps and all(v == 0.004 for v in device)
    assert runtime().backends.device_clock.devices == [1]  # type: ignore[union-attr]
    assert runtime().backends.device_clock.in_flight == 0  # type: ignore[union-attr]


def test_layers_on_several_devices_are_timed_on_their_own_device(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(2, cpu_tensors_on=0)
    torch.cuda.current_device()
    model = make_model("llama")
    layers = model.model.layers
    sim.place(layers[1], 1)  # device_map="auto": the second layer on cuda:1
    queue_kernels(layers[0], sim, 2 * MS, device=0)
    queue_kernels(layers[1], sim, 5 * MS, device=1)
    instrument(model, model_name="m", layers=True, layer_every=1, layer_index=True)
    with InMemoryExporter() as exp:
        model.generate(prompt(), max_new_tokens=4, min_new_tokens=4)
        sim.finish()
        first, second = values(exp, LAYER, **{"layer.index": "0"}), values(exp, LAYER, **{"layer.index": "1"})
    assert first and all(v == 0.002 for v in first)
    assert second and all(v == 0.005 for v in second)  # on the current device it would read ~0
    assert runtime().backends.device_clock.devices == [0, 1]  # type: ignore[union-attr]


def test_memory_gauges_are_read_for_every_device_the_model_uses(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(2, cpu_tensors_on=0)
    torch.cuda.current_device()
    model = make_model("llama")
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": 1}
    handles = [sim.allocate(32 * 2**20, device=0), sim.allocate(96 * 2**20, device=1)]
    instrument(model, model_name="m", memory_every=1)
    with InMemoryExporter() as exp:
        model.generate(prompt(), max_new_tokens=3)
        for device in (0, 1):
            readings = exp.values("gpuprobe.memory.allocated", device=f"cuda:{device}")
            assert readings and readings[-1] == torch.cuda.memory_allocated(device)
    assert {md.points[0].labels["gpuprobe.device"] for md in gpuprobe.collect()} == {"cuda:0"}
    for h in handles:
        sim.free(h)


def test_instrumented_generation_never_initializes_cuda(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1, cpu_tensors_on=0)
    gpuprobe.configure(memory=True)
    model = instrument(make_model("llama"), model_name="m", layers=True, layer_every=1, memory_every=1)
    model.generate(prompt(), max_new_tokens=3)
    gpuprobe.collect()
    assert torch.cuda.is_initialized() is False and sim.stats.init_calls == 0


def test_no_synchronization_is_added_per_step(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()
    model = make_model("llama")
    queue_kernels(model, sim, MS, device=0)
    instrument(model, model_name="m", layers=True, layer_every=1, memory_every=1)
    sim.reset_stats()
    model.generate(prompt(), max_new_tokens=5, min_new_tokens=5)
    gpuprobe.collect()
    assert sim.stats.host_syncs == 0


def test_a_step_inside_a_capture_takes_no_device_time(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()
    model = instrument(make_model("llama"), model_name="m", layers=True, layer_every=1)
    graph = torch.cuda.CUDAGraph()
    with InMemoryExporter() as exp:
        with torch.cuda.graph(graph):  # e.g. a CUDA-graph warm-up that runs generation steps
            model.generate(prompt(), max_new_tokens=2, min_new_tokens=2)
        sim.finish()
        assert values(exp, STEP, clock="device") == [] and values(exp, LAYER) == []
        assert len(values(exp, STEP, clock="host")) == 2
    assert sim.stats.invalidated_captures == 0


def test_every_oom_inside_generate_is_dumped_once(simcuda, make_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import LogitsProcessor, LogitsProcessorList

    sim = simcuda(1, cpu_tensors_on=0, memory_per_device=256 * 2**20)
    torch.cuda.current_device()
    gpuprobe.configure(snapshot_on_oom=True, snapshot_dir=str(tmp_path))

    class Greedy(LogitsProcessor):  # a processor that asks for more memory than the device has
        def __call__(self, input_ids, scores):  # type: ignore[no-untyped-def]
            sim.allocate(2**30)
            return scores

    model = instrument(make_model("llama"), model_name="m")
    with pytest.raises(torch.OutOfMemoryError):  # no probe around it
        model.generate(prompt(), max_new_tokens=2, logits_processor=LogitsProcessorList([Greedy()]))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"gpuprobe-memory-oom-{os.getpid()}.pickle"]
    triggers = runtime().snapshot_triggers
    assert triggers is not None and len(triggers.dumps) == 1
    with pytest.raises(torch.OutOfMemoryError):  # through two probes and generate(): still one dump
        with gpuprobe.probe("outer"):
            with gpuprobe.probe("inner"):
                model.generate(prompt(), max_new_tokens=2, logits_processor=LogitsProcessorList([Greedy()]))
    assert len(triggers.dumps) == 2


def test_compiled_forward_with_layers_on_needs_no_graph_break(make_model) -> None:  # type: ignore[no-untyped-def]
    # On the CPU: Dynamo traces the forward with gpuprobe's layer hooks installed; fullgraph=True turns
    # any graph break into an error.
    model = make_model("llama")
    model.forward = torch.compile(model.forward, fullgraph=True, backend="eager")
    instrument(model, model_name="m", layers=True, layer_every=1)
    with InMemoryExporter() as exp:
        out = model.generate(prompt(), max_new_tokens=3, min_new_tokens=3)
    assert out.shape[1] == prompt().shape[1] + 3
    assert len(exp.values(STEP, clock="host")) == 3
