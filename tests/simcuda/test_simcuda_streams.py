"""Streams: pools, per-thread current streams, stream contexts (c10/cuda/CUDAStream.h, torch/cuda)."""

from __future__ import annotations

import threading

import torch

from gpuprobe.testing.simcuda import SimulatedCuda


def test_each_device_has_its_own_default_stream(sim: SimulatedCuda) -> None:
    """torch/cuda/__init__.py default_stream; c10 CUDAStream.h: one default stream per device."""
    s0, s1 = torch.cuda.default_stream(0), torch.cuda.default_stream(1)
    assert s0.device_index == 0 and s1.device == torch.device("cuda", 1)
    assert s0.stream_id == 0 and s0.cuda_stream == 0
    assert s0 != s1


def test_stream_pool_hands_out_32_streams_round_robin(sim: SimulatedCuda) -> None:
    """CUDAStream.h: "if 33 low priority streams are requested, the first and last ... are the same"."""
    streams = [torch.cuda.Stream() for _ in range(33)]
    assert len({id(s) for s in streams[:32]}) == 32
    assert streams[32] is streams[0]
    high = torch.cuda.Stream(priority=-1)
    assert high.priority == -1 and high not in streams


def test_stream_priority_out_of_range_maps_to_the_nearest(sim: SimulatedCuda) -> None:
    """torch/cuda/streams.py: out-of-range priorities map to the nearest valid one."""
    assert torch.cuda.Stream(priority=5).priority == 0
    assert torch.cuda.Stream(priority=-100).priority == -3


def test_stream_context_is_per_thread(sim: SimulatedCuda) -> None:
    """CUDAStream.h: "the notion of 'current stream for device' is thread local"."""
    s = torch.cuda.Stream()
    seen: list[object] = []
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream() == s
        t = threading.Thread(target=lambda: seen.append(torch.cuda.current_stream()))
        t.start()
        t.join()
    assert seen == [torch.cuda.default_stream()]
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


def test_stream_of_another_device_makes_that_device_current_inside_the_context(sim: SimulatedCuda) -> None:
    """torch._C._cuda_setStream sets the stream's device; StreamContext.__exit__ restores both."""
    s1 = torch.cuda.Stream(device=1)
    with torch.cuda.stream(s1):
        assert torch.cuda.current_device() == 1
        assert torch.cuda.current_stream() == s1
    assert torch.cuda.current_device() == 0
    assert torch.cuda.current_stream(1) == torch.cuda.default_stream(1)


def test_stream_synchronize_waits_for_that_stream_only(sim: SimulatedCuda) -> None:
    """CUDAStream::synchronize (cudaStreamSynchronize): a counted host synchronization."""
    side = torch.cuda.Stream()
    sim.launch(1_000, stream=side)
    sim.launch(50_000)  # default stream
    assert side.query() is False
    side.synchronize()
    assert side.query() is True
    assert torch.cuda.default_stream().query() is False
    assert sim.stats.host_syncs_by_api["Stream.synchronize"] == 1


def test_torch_cuda_synchronize_waits_for_every_stream_of_the_device(sim: SimulatedCuda) -> None:
    """torch/cuda/__init__.py synchronize: cudaDeviceSynchronize on one device."""
    side = torch.cuda.Stream()
    sim.launch(1_000, stream=side)
    sim.launch(7_000)
    sim.launch(9_000, stream=torch.cuda.default_stream(1))
    torch.cuda.synchronize()
    assert sim.now_ns(0) == 7_000
    assert sim.now_ns(1) == 0  # another device's clock is its own
    torch.cuda.synchronize(1)
    assert sim.now_ns(1) == 9_000
    assert sim.stats.host_syncs == 2


def test_work_on_one_stream_is_serialized(sim: SimulatedCuda) -> None:
    """CUDA streams execute their work in order."""
    a = sim.launch(100)
    b = sim.launch(200)
    assert a is not None and b is not None
    assert (a.start_ns, a.end_ns, b.start_ns, b.end_ns) == (0, 100, 100, 300)


def test_wait_stream_orders_work_across_streams(sim: SimulatedCuda) -> None:
    """torch/cuda/streams.py wait_stream: ``self.wait_event(stream.record_event())``."""
    side = torch.cuda.Stream()
    sim.launch(3_000)
    side.wait_stream(torch.cuda.current_stream())
    after = sim.launch(10, stream=side)
    assert after is not None and after.start_ns == 3_000
    assert sim.stats.events_created == 1  # record_event made one


def test_with_stream_is_a_stream_context(sim: SimulatedCuda) -> None:
    """torch.cuda.Stream "supports with statement as a context manager" (torch/cuda/streams.py)."""
    s = torch.cuda.Stream()
    with s:
        assert torch.cuda.current_stream() == s
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


def test_concurrent_launches_queries_and_reads_are_all_accounted(sim: SimulatedCuda) -> None:
    """The simulation's state is shared by threads (a collector reading memory, workers launching)."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(device: int) -> None:
        try:
            torch.cuda.set_device(device)
            for _ in range(200):
                sim.launch(10)
                ev = torch.cuda.Event()
                ev.record()
                ev.query()
                sim.free(sim.allocate(4096))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    def collector() -> None:
        while not stop.is_set():
            torch.cuda.memory_stats(0)
            torch.cuda.memory_allocated(1)

    torch.cuda.current_device()
    reader = threading.Thread(target=collector)
    reader.start()
    workers = [threading.Thread(target=worker, args=(i % 2,)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    reader.join()
    assert errors == []
    assert sim.stats.kernels_launched == 800 and sim.stats.events_created == 800
    assert torch.cuda.memory_allocated(0) == torch.cuda.memory_allocated(1) == 0
    assert torch.cuda.memory_stats(0)["allocation.all.allocated"] == 400
