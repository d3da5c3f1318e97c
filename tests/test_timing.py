"""Device-time resolution logic, run on CPU against a stand-in for torch.cuda.Event.

There is no CUDA device on CPU-only machines, so these tests use ``FakeCudaEvent`` (tests/helpers.py):
a test double whose ``elapsed_time`` raises on unfinished events and which has no ``synchronize``.
The real-event path is checked by the ``cuda``-marked test at the end, skipped without a GPU.
"""

from __future__ import annotations

import pytest

from gpuprobe import probe
from gpuprobe.collector import runtime
from gpuprobe.testing import InMemoryExporter
from gpuprobe.timing import EventTimer

from helpers import FakeCudaEvent

DUR = "gpuprobe.probe.duration"


@pytest.fixture
def fake_timer() -> EventTimer:
    rt = runtime()
    rt.backends()
    timer = EventTimer(FakeCudaEvent, max_events=8, name="fake-cuda-events")
    previous = rt.timer
    rt.timer = timer
    FakeCudaEvent.clock_ns = 0
    yield timer
    rt.timer = previous


def test_pending_timings_wait_for_query_and_never_read_unfinished_events(
    fake_timer: EventTimer, exporter: InMemoryExporter
) -> None:
    p = probe("kernel_work")
    with p:
        FakeCudaEvent.clock_ns += 3_000_000  # the "GPU" spends 3 ms between the two events
    rt = runtime()
    rt.drain()
    assert exporter.values(DUR, probe="kernel_work", clock="device") == []  # not finished: not read
    assert len(rt.pending) == 1
    (start, end) = rt.pending[0][1]
    start.done = end.done = True  # the GPU reaches both events
    rt.drain()
    assert exporter.values(DUR, probe="kernel_work", clock="device") == [pytest.approx(0.003)]
    assert rt.pending == []
    assert fake_timer.in_flight == 0  # both events went back to the pool


def test_unfinished_events_are_resolved_at_a_later_collection(fake_timer: EventTimer, exporter: InMemoryExporter) -> None:
    @probe("step")
    def step() -> None:
        FakeCudaEvent.clock_ns += 1_000_000

    for _ in range(3):
        step()
    rt = runtime()
    rt.drain()
    first_start, first_end = rt.pending[0][1]
    first_start.done = first_end.done = True
    rt.drain()
    assert len(exporter.values(DUR, probe="step", clock="device")) == 1
    for _, (s, e) in rt.pending:
        s.done = e.done = True
    rt.drain()
    assert exporter.values(DUR, probe="step", clock="device") == [pytest.approx(0.001)] * 3


def test_exhausted_pool_drops_and_counts_instead_of_blocking(fake_timer: EventTimer, exporter: InMemoryExporter) -> None:
    p = probe("burst")
    for _ in range(10):  # 8 events = 4 pairs; the other 6 calls get no device timing
        with p:
            pass
    assert len(exporter.values(DUR, probe="burst", clock="host")) == 10  # host timing never drops
    assert fake_timer.dropped == 6
    assert FakeCudaEvent.made <= 8 + 100  # bounded (other tests share the class counter)
    data = {md.spec.name: md for md in runtime().collect()}
    (point,) = [pt for pt in data["gpuprobe.telemetry.dropped"].points if pt.labels["reason"] == "event_pool_exhausted"]
    assert point.value == 6


def test_event_timer_logic_directly() -> None:
    timer = EventTimer(FakeCudaEvent, max_events=2)
    FakeCudaEvent.clock_ns = 1_000
    tok = timer.start()
    FakeCudaEvent.clock_ns = 6_000
    pending = timer.stop(tok)
    assert timer.poll(pending) is None
    pending[1].done = True
    assert timer.poll(pending) is None  # the start event must be done too
    pending[0].done = True
    assert timer.poll(pending) == 5_000
    assert timer.in_flight == 0


@pytest.mark.cuda
def test_real_cuda_events_resolve_without_synchronize(exporter: InMemoryExporter) -> None:
    import torch

    from gpuprobe.timing import pick_device_timer

    rt = runtime()
    rt.backends()
    rt.timer = pick_device_timer("cuda")
    assert rt.timer is not None
    x = torch.randn(2048, 2048, device="cuda")
    p = probe("matmul")
    for _ in range(5):
        with p:
            x = x @ x
            x = x / x.norm()
    torch.cuda.synchronize()  # the test waits; gpuprobe itself never does
    rt.drain()
    values = exporter.values(DUR, probe="matmul", clock="device")
    assert len(values) == 5 and all(v > 0 for v in values)
