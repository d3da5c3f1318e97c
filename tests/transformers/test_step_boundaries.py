"""The steps (and timed layers) of one generate() call share their boundary events on a GPU.

On the simulated CUDA (``gpuprobe.testing.simcuda``; no GPU where these tests run), with every CPU
tensor taken as living on cuda:0. Each forward queues known GPU work (``sim.launch``), and the device
runs queued work back to back, so the expected device span of a step or layer is the work queued in it,
written out by hand. Event records are counted by the simulation.
"""

from __future__ import annotations

from typing import Any

import pytest
from _hfkit import prompt, torch

import gpuprobe
from gpuprobe.integrations.transformers import instrument
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter

STEP = "gpuprobe.step.duration"
LAYER = "gpuprobe.layer.duration"
TTFT = "gen_ai.server.time_to_first_token"
PREFILL, DECODE = 50_000, 1_000


def ns(values: list[float]) -> list[int]:
    return [round(v * 1e9) for v in values]


@pytest.fixture(autouse=True)
def _simcuda_installed_after_isolation(simcuda):  # type: ignore[no-untyped-def]
    yield  # tests call simcuda(...) themselves; this orders its teardown before the module's fixtures


def on_simulated_gpu(simcuda: Any, model: Any, fail_at: int | None = None) -> Any:
    """cuda:0 simulated; forward k (0: the prefill) queues PREFILL, then DECODE * k ns of GPU work;
    forward ``fail_at`` raises after queueing its work."""
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()
    seen = [0]

    def forward_kernels(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        k = seen[0]
        seen[0] += 1
        sim.launch(PREFILL if k == 0 else DECODE * k)
        if fail_at is not None and k == fail_at:
            raise RuntimeError("a failing forward")

    model.register_forward_hook(forward_kernels, with_kwargs=True)
    sim.forwards = seen
    return sim


def records(sim: Any) -> int:
    return sim.stats.calls["Event.record"]


def no_events_held() -> bool:
    gpuprobe.collect()
    clock = runtime().backends.device_clock
    return clock.in_flight == 0 and clock.shared == 0


def test_one_event_record_per_decode_step_and_each_step_times_its_own_work(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    sim = on_simulated_gpu(simcuda, model)
    instrument(model, model_name="m")
    tokens = 6
    with InMemoryExporter() as exp:
        before = records(sim)
        model.generate(prompt(), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        # The call's start; step 0's start; then one end event per step, each the next step's start and
        # step 0's also the end of the device TTFT.
        assert records(sim) - before == 2 + tokens
        sim.finish()
        gpuprobe.collect()
        assert ns(exp.values(STEP, phase="prefill", clock="device")) == [PREFILL]
        assert ns(exp.values(TTFT, clock="device")) == [PREFILL]
        assert ns(exp.values(STEP, phase="decode", clock="device")) == [DECODE * k for k in range(1, tokens)]
    assert no_events_held()


def test_other_gpu_work_between_two_calls_is_in_neither(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    sim = on_simulated_gpu(simcuda, model)
    instrument(model, model_name="m")
    with InMemoryExporter() as exp:
        model.generate(prompt(), max_new_tokens=3, min_new_tokens=3, do_sample=False)
        sim.launch(7_000_000, "other work")  # queued between the calls
        sim.forwards[0] = 0
        model.generate(prompt(), max_new_tokens=3, min_new_tokens=3, do_sample=False)
        sim.finish()
        gpuprobe.collect()
        assert ns(exp.values(STEP, phase="prefill", clock="device")) == [PREFILL, PREFILL]
        assert ns(exp.values(TTFT, clock="device")) == [PREFILL, PREFILL]
        assert ns(exp.values(STEP, phase="decode", clock="device")) == [DECODE, 2 * DECODE] * 2
    assert no_events_held()


def test_a_failed_step_gives_every_event_back_and_the_next_call_starts_fresh(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    sim = on_simulated_gpu(simcuda, model, fail_at=3)
    instrument(model, model_name="m")
    with InMemoryExporter() as exp:
        with pytest.raises(RuntimeError, match="a failing forward"):
            model.generate(prompt(), max_new_tokens=6, min_new_tokens=6, do_sample=False)
        sim.finish()
        assert no_events_held()
        assert ns(exp.values(STEP, phase="decode", clock="device")) == [DECODE, 2 * DECODE]  # step 3 failed
        sim.forwards[0] = 0
        sim.launch(5_000_000, "other work")
        model.generate(prompt(), max_new_tokens=3, min_new_tokens=3, do_sample=False)
        sim.finish()
        gpuprobe.collect()
        assert ns(exp.values(STEP, phase="prefill", clock="device")) == [PREFILL, PREFILL]
        assert ns(exp.values(STEP, phase="decode", clock="device"))[2:] == [DECODE, 2 * DECODE]
    assert no_events_held()


def test_back_to_back_layers_share_their_boundary_events(simcuda, make_model) -> None:  # type: ignore[no-untyped-def]
    model = make_model("llama")
    sim = simcuda(1, cpu_tensors_on=0)
    torch.cuda.current_device()
    blocks = list(model.model.layers)
    work = [3_000, 5_000]  # each block's own GPU work, queued in the block

    for block, w in zip(blocks, work):
        block.register_forward_hook(lambda module, args, output, w=w: sim.launch(w) and None)
    instrument(model, model_name="m", layers=True, layer_every=1, layer_index=True)
    tokens = 4
    with InMemoryExporter() as exp:
        before = records(sim)
        model.generate(prompt(), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        decode_steps = tokens - 1
        # Per call: its start, step 0's start and end; per decode step: its end, the first block's start
        # and one end per block (the second block starts at the first one's end).
        assert records(sim) - before == 3 + decode_steps * (1 + 1 + len(blocks))
        sim.finish()
        gpuprobe.collect()
        for i, w in enumerate(work):
            assert ns(exp.values(LAYER, **{"layer.index": str(i)})) == [w] * decode_steps
    assert no_events_held()
