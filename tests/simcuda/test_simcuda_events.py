"""Events, as torch/include/c10/cuda/CUDAEvent.h defines them, on simulated device time."""

from __future__ import annotations

import threading

import pytest
import torch

from gpuprobe.testing.simcuda import SimulatedCuda


def test_event_is_bound_to_the_device_of_its_first_recording_stream(sim: SimulatedCuda) -> None:
    """CUDAEvent::record: created on the stream's device; TORCH_CHECK(device_index_ == stream.device_index())."""
    ev = torch.cuda.Event()
    assert ev.device is None
    ev.record(torch.cuda.default_stream(1))
    assert ev.device == torch.device("cuda", 1)
    with pytest.raises(RuntimeError) as info:
        ev.record()  # the current stream of the *current* device, 0
    # DeviceIndex is int8_t: c10::str writes it as a character.
    assert str(info.value) == "Event device \x01 does not match recording stream's device \x00."


def test_record_without_a_stream_uses_the_current_device_not_the_events(sim: SimulatedCuda) -> None:
    """torch/cuda/streams.py Event.record: ``stream = torch.cuda.current_stream()``."""
    ev = torch.cuda.Event()
    with torch.cuda.device(1):
        ev.record()
    assert ev.device == torch.device("cuda", 1)
    with pytest.raises(RuntimeError, match="does not match recording stream's device"):
        ev.record()


def test_a_never_recorded_event_is_complete(sim: SimulatedCuda) -> None:
    """CUDAEvent::query: ``if (!is_created_) return true``."""
    assert torch.cuda.Event().query() is True


def test_host_runs_ahead_event_completes_when_the_device_clock_passes_the_work(sim: SimulatedCuda) -> None:
    """The event's timestamp is when its stream reaches it: after the work queued before it."""
    ev = torch.cuda.Event()
    sim.launch(5_000, "a")
    sim.launch(3_000, "b")
    ev.record()
    assert ev.query() is False
    sim.advance(7_999)
    assert ev.query() is False
    sim.advance(1)
    assert ev.query() is True
    assert sim.stats.host_syncs == 0


def test_finish_completes_work_without_a_host_sync(sim: SimulatedCuda) -> None:
    """A simulation driver: the device catches up; no host synchronization is counted."""
    ev = torch.cuda.Event()
    sim.launch(1_000)
    ev.record()
    sim.finish()
    assert ev.query() is True
    assert sim.stats.host_syncs == 0


def test_elapsed_time_needs_enable_timing_on_both_events(sim: SimulatedCuda) -> None:
    """CUDAEvent::elapsed_time: TORCH_CHECK_VALUE (a ValueError), checked before anything else."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event()
    with pytest.raises(ValueError, match=r"^Both events must be created with argument 'enable_timing=True'\.$"):
        a.elapsed_time(b)


def test_elapsed_time_needs_both_events_recorded(sim: SimulatedCuda) -> None:
    """CUDAEvent::elapsed_time: TORCH_CHECK_VALUE(is_created_ && other.isCreated(), ...)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    with pytest.raises(ValueError, match=r"^Both events must be recorded before calculating elapsed time\.$"):
        a.elapsed_time(b)


def test_elapsed_time_raises_instead_of_blocking_on_incomplete_events(sim: SimulatedCuda) -> None:
    """TORCH_CHECK(query() && other.query(), ...): a RuntimeError; the clock does not move."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    sim.launch(1_000_000)
    b.record()
    with pytest.raises(RuntimeError, match=r"^Both events must be completed before calculating elapsed time\.$"):
        a.elapsed_time(b)
    assert sim.now_ns() == 0 and sim.stats.host_syncs == 0
    sim.finish()
    assert a.elapsed_time(b) == 1.0


def test_elapsed_time_is_a_float32_of_milliseconds(sim: SimulatedCuda) -> None:
    """cudaEventElapsedTime writes a C float."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    sim.launch(1_234_567)
    b.record()
    sim.finish()
    ms = a.elapsed_time(b)
    assert ms != 1.234567 and ms == pytest.approx(1.234567, rel=1e-7)


def test_elapsed_time_of_events_on_two_devices_fails_in_cuda(sim: SimulatedCuda) -> None:
    """After the torch checks pass, cudaEventElapsedTime refuses events of different devices."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(torch.cuda.default_stream(0))
    b.record(torch.cuda.default_stream(1))
    with pytest.raises(torch.AcceleratorError, match="CUDA error: invalid resource handle"):
        a.elapsed_time(b)


def test_event_synchronize_blocks_and_counts_a_host_sync(sim: SimulatedCuda) -> None:
    """CUDAEvent::synchronize (cudaEventSynchronize): the host waits for the event."""
    ev = torch.cuda.Event()
    sim.launch(9_000)
    ev.record()
    ev.synchronize()
    assert ev.query() is True
    assert sim.now_ns() == 9_000
    assert sim.stats.host_syncs_by_api["Event.synchronize"] == 1


def test_synchronize_of_a_never_recorded_event_is_not_a_sync(sim: SimulatedCuda) -> None:
    """CUDAEvent::synchronize: ``if (is_created_)``."""
    torch.cuda.Event().synchronize()
    assert sim.stats.host_syncs == 0


def test_event_wait_orders_later_work_on_another_stream(sim: SimulatedCuda) -> None:
    """CUDAEvent::block (cudaStreamWaitEvent): the stream's later work starts after the event."""
    side = torch.cuda.Stream()
    sim.launch(4_000)
    ev = torch.cuda.Event()
    ev.record()
    ev.wait(side)
    later = sim.launch(1_000, stream=side)
    assert later is not None and later.start_ns == 4_000


def test_events_created_counts_constructions(sim: SimulatedCuda) -> None:
    """torch/cuda/streams.py Event.__new__: one object per call (no CUDA event until record)."""
    for _ in range(3):
        torch.cuda.Event(enable_timing=True)
    assert sim.stats.events_created == 3


def test_queries_from_many_threads_are_consistent(sim: SimulatedCuda) -> None:
    """CUDAEvent.h: "cudaEventQuery can be safely called from any device" (and thread)."""
    ev = torch.cuda.Event()
    sim.launch(10)
    ev.record()
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(ev.query())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [False] * 8
