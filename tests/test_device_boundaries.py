"""Shared boundary events between device spans, and sampled device spans of probes.

On the simulated CUDA (``gpuprobe.testing.simcuda``: no GPU exists where these tests run). Expected
durations are the work each test queues with ``sim.launch``: the simulated device runs it back to back
on its stream, so a span between two events is exactly the work queued between them. Event records are
counted by the simulation (``sim.stats.calls["Event.record"]``).
"""

from __future__ import annotations

from typing import Any

import pytest

import gpuprobe
from gpuprobe import _probe, probe
from gpuprobe.config import load
from gpuprobe.errors import ConfigError
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter

torch = pytest.importorskip("torch")

DURATION = "gpuprobe.probe.duration"


def ns(values: list[float]) -> list[int]:
    """Exported seconds back to the integer nanoseconds they were recorded in."""
    return [round(v * 1e9) for v in values]


def records(sim: Any) -> int:
    return sim.stats.calls["Event.record"]


def free_events_unique(clock: Any) -> bool:
    """No event sits twice in a pool's free list (each was given back exactly once)."""
    for pool in clock._pools.values():
        ids = [id(e) for e in pool._free]
        if len(ids) != len(set(ids)):
            return False
    return True


@pytest.fixture
def clock(sim: Any) -> Any:
    found = runtime().backends.device_clock
    assert found is not None
    return found


# -- boundaries --------------------------------------------------------------------------------------

def test_back_to_back_spans_share_one_event_and_time_their_own_work(sim: Any, clock: Any) -> None:
    before = records(sim)
    first = clock.start(0)
    sim.launch(1_000)
    pending_a, boundary = clock.split(first)
    sim.launch(2_500)
    second = clock.resume(boundary, 0)
    pending_b = clock.stop(second)
    assert records(sim) - before == 3  # start, the shared boundary, end: not four
    assert pending_a[2] is pending_b[1]
    sim.finish()
    assert clock.poll(pending_a) == 1_000
    assert clock.poll(pending_b) == 2_500
    assert clock.in_flight == 0 and clock.shared == 0 and free_events_unique(clock)


def test_a_shared_event_stays_out_of_the_pool_until_both_spans_gave_it_back(sim: Any, clock: Any) -> None:
    first = clock.start(0)
    sim.launch(700)
    pending_a, boundary = clock.split(first)
    second = clock.resume(boundary, 0)
    sim.launch(300)
    pending_b = clock.stop(second)
    clock.discard(pending_b)  # the later span is dropped first (e.g. a failed step)
    shared = pending_a[2]
    pool = pending_a[0]
    assert all(e is not shared for e in pool._free)
    reused = clock.start(0)  # the pool hands out another event: the shared one is still held
    assert reused[1] is not shared
    clock.discard(clock.stop(reused))
    sim.finish()
    assert clock.poll(pending_a) == 700
    assert clock.in_flight == 0 and free_events_unique(clock)


def test_a_stream_change_between_two_spans_starts_the_second_fresh(sim: Any, clock: Any) -> None:
    first = clock.start(0)
    sim.launch(1_000)
    pending_a, boundary = clock.split(first)
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        before = records(sim)
        second = clock.resume(boundary, 0)
        assert records(sim) - before == 1  # a fresh start on the stream now current
        assert second[1] is not pending_a[2]
        sim.launch(400)
        pending_b = clock.stop(second)
    sim.finish()
    assert clock.poll(pending_a) == 1_000
    assert clock.poll(pending_b) == 400  # the other stream's own work, not the first stream's
    assert clock.in_flight == 0 and clock.shared == 0 and free_events_unique(clock)


def test_a_graph_capture_between_two_spans_starts_the_second_fresh(sim: Any, clock: Any) -> None:
    first = clock.start(0)
    pending_a, boundary = clock.split(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sim.launch(100)
    graph.replay()  # work queued between the two spans
    before = records(sim)
    second = clock.resume(boundary, 0)
    assert records(sim) - before == 1 and second[1] is not pending_a[2]
    sim.launch(250)
    pending_b = clock.stop(second)
    sim.finish()
    assert clock.poll(pending_b) == 250
    clock.poll(pending_a)
    assert clock.in_flight == 0 and free_events_unique(clock)


def test_a_span_on_another_device_does_not_start_at_the_boundary(sim: Any, clock: Any) -> None:
    first = clock.start(0)
    pending_a, boundary = clock.split(first)
    with torch.cuda.device(1):
        second = clock.resume(boundary, 1)
        sim.launch(900)
        pending_b = clock.stop(second)
    assert second[0].device == 1
    sim.finish()
    assert clock.poll(pending_b) == 900
    clock.poll(pending_a)
    assert clock.in_flight == 0 and free_events_unique(clock)


def test_a_dropped_boundary_goes_back_to_the_pool_once(sim: Any, clock: Any) -> None:
    first = clock.start(0)
    pending_a, boundary = clock.split(first)
    clock.drop(boundary)
    sim.finish()
    clock.poll(pending_a)
    assert clock.in_flight == 0 and clock.shared == 0 and free_events_unique(clock)


# -- sampled device spans of probes --------------------------------------------------------------------

def test_device_every_takes_a_span_on_every_nth_call_and_host_time_on_each(sim: Any) -> None:
    calls = []

    @probe("sampled", device_every=3)
    def work(i: int) -> None:
        calls.append(i)
        sim.launch(1_000 * i)  # call i queues i us of device work

    with InMemoryExporter() as exp:
        before = records(sim)
        for i in range(1, 8):
            work(i)
        assert records(sim) - before == 2 * 2  # calls 3 and 6, a start and an end each
        sim.finish()
        gpuprobe.collect()
        assert ns(exp.values(DURATION, probe="sampled", clock="device")) == [3_000, 6_000]
        assert len(exp.values(DURATION, probe="sampled", clock="host")) == 7


def test_device_every_on_a_with_block(sim: Any) -> None:
    block = probe("block_sampled", device_every=2)
    with InMemoryExporter() as exp:
        for i in range(1, 6):
            with block:
                sim.launch(1_000 * i)
        sim.finish()
        gpuprobe.collect()
        assert ns(exp.values(DURATION, probe="block_sampled", clock="device")) == [2_000, 4_000]
        assert len(exp.values(DURATION, probe="block_sampled", clock="host")) == 5


def test_the_device_every_setting_applies_to_probes_without_their_own(sim: Any) -> None:
    gpuprobe.configure(device_every=4)

    @probe("from_setting")
    def work() -> None:
        sim.launch(10)

    @probe("own", device_every=1)
    def own() -> None:
        sim.launch(10)

    with InMemoryExporter() as exp:
        for _ in range(8):
            work()
            own()
        sim.finish()
        gpuprobe.collect()
        assert len(exp.values(DURATION, probe="from_setting", clock="device")) == 2
        assert len(exp.values(DURATION, probe="own", clock="device")) == 8


def test_a_sampled_wrapper_carries_a_counter_and_an_unsampled_one_none(sim: Any) -> None:
    @probe("plain_wrapper", device_every=1)
    def plain() -> None:
        return None

    @probe("counting_wrapper", device_every=5)
    def counting() -> None:
        return None

    assert "_dev_count" not in plain.__code__.co_names
    assert "_dev_count" in counting.__code__.co_names


def test_auto_samples_a_probe_over_the_budget_and_keeps_every_call_under_it(
        sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_probe, "DEVICE_SPAN_BUDGET", 10)  # spans per second: any tight loop is over it

    @probe("hot")
    def hot() -> None:
        return None

    n = _probe._RETUNE_EVERY
    with InMemoryExporter() as exp:
        for _ in range(n + 1000):
            hot()
        gpuprobe.collect()
        device = len(exp.values(DURATION, probe="hot", clock="device"))
        assert len(exp.values(DURATION, probe="hot", clock="host")) == n + 1000
        assert n <= device < n + 1000  # every call until the rate was judged, sampled afterwards
        assert "_dev_count" in hot.__code__.co_names  # the wrapper was regenerated with its counter

    monkeypatch.setattr(_probe, "DEVICE_SPAN_BUDGET", 10**12)

    @probe("cool")
    def cool() -> None:
        return None

    with InMemoryExporter() as exp:
        for _ in range(n + 10):
            cool()
        gpuprobe.collect()
        assert len(exp.values(DURATION, probe="cool", clock="device")) == n + 10


@pytest.mark.parametrize("raw, value", [("auto", "auto"), ("AUTO", "auto"), ("1", 1), (" 16 ", 16)])
def test_the_device_every_setting_parses(raw: str, value: Any) -> None:
    assert load({"GPUPROBE_DEVICE_EVERY": raw}).device_every == value


@pytest.mark.parametrize("raw", ["0", "-2", "often", "1.5"])
def test_a_bad_device_every_setting_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"GPUPROBE_DEVICE_EVERY must be 'auto' or an integer >= 1"):
        load({"GPUPROBE_DEVICE_EVERY": raw})


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "3"])
def test_a_bad_device_every_argument_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="device_every"):
        probe("bad_device_every", device_every=bad)
