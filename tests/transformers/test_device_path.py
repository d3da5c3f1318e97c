"""The device-timing path of the integration, run on CPU with stand-in CUDA events.

GPU code paths run the same logic as CPU ones behind :class:`gpuprobe.timing.EventTimer`; here its
events are stand-ins whose completion the test controls, so the lazy resolution is visible.
"""

from __future__ import annotations

from time import perf_counter_ns

from _hfkit import prompt

import gpuprobe
from gpuprobe.collector import runtime
from gpuprobe.integrations.transformers import instrument
from gpuprobe.timing import EventTimer


class StandInEvent:
    """Records a host timestamp; completes only when the test says the device has finished."""

    device_done = False

    def __init__(self) -> None:
        self.t = 0

    def record(self) -> None:
        self.t = perf_counter_ns()

    def query(self) -> bool:
        return StandInEvent.device_done

    def elapsed_time(self, end: StandInEvent) -> float:
        assert StandInEvent.device_done, "elapsed_time on an unfinished event would block"
        return (end.t - self.t) / 1e6


def device_counts() -> tuple[int, int]:
    steps = layers = 0
    for md in gpuprobe.collect():
        if md.spec.name == "gpuprobe.step.duration":
            steps += sum(p.count for p in md.points if p.labels["clock"] == "device")
        if md.spec.name == "gpuprobe.layer.duration":
            layers += sum(p.count for p in md.points)
    return steps, layers


def test_device_step_and_layer_times_resolve_once_the_device_is_done(make_model):
    rt = runtime()
    rt.backends()
    rt.timer = EventTimer(StandInEvent)
    StandInEvent.device_done = False
    model = instrument(make_model("llama"), model_name="m", layers=True, layer_every=1)
    out = model.generate(prompt(), max_new_tokens=5, min_new_tokens=5)
    steps = out.shape[1] - prompt().shape[1]
    assert device_counts() == (0, 0)  # nothing waits for the device: samples stay pending
    StandInEvent.device_done = True
    assert device_counts() == (steps, 2 * (steps - 1))
    assert rt.timer.in_flight == 0  # every event went back to the pool
