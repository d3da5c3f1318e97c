"""gpuprobe's CUDA paths, run on the simulated CUDA (gpuprobe.testing.simcuda).

No GPU is available where these tests run, so ``torch.cuda`` is replaced by a simulation with CUDA's
semantics: events bound to a device at their first record, work that completes after the host has
moved on, per-thread current devices, per-device memory, graph capture that breaks on an event query
from any thread, a CUDA profiler. Each test pins a way the CUDA paths could crash or mislead on a
real GPU; the checks that need real hardware are in tests/cuda/ (marked, skipped here).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import warnings
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import probe
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter

torch = pytest.importorskip("torch")

DUR = "gpuprobe.probe.duration"
MS = 1_000_000


def device_values(exp: InMemoryExporter, name: str) -> list[float]:
    return sorted(round(v, 6) for v in exp.values(DUR, probe=name, clock="device"))


def dropped(reason: str) -> float:
    for md in gpuprobe.collect():
        if md.spec.name == "gpuprobe.telemetry.dropped":
            return sum(p.value for p in md.points if p.labels["reason"] == reason)
    return 0.0


# -- events: a pool per device, the device where the work runs, never an error into the program ----------

def test_device_spans_measure_the_work_queued_between_the_events(sim, exporter) -> None:  # type: ignore[no-untyped-def]
    @probe("gemm")
    def gemm() -> None:
        sim.launch(3 * MS, "gemm")

    gemm()
    gpuprobe.collect()
    assert device_values(exporter, "gemm") == []  # the host ran ahead: nothing read, nothing waited for
    sim.finish()
    assert device_values(exporter, "gemm") == [0.003]
    assert sim.stats.host_syncs == 0


def test_events_reused_across_devices_never_raise_into_the_program(sim, exporter) -> None:  # type: ignore[no-untyped-def]
    @probe("work")
    def work(ms: int) -> None:
        sim.launch(ms * MS)

    for _ in range(3):
        work(2)  # device 0 (the current device)
    sim.finish()
    gpuprobe.collect()  # the events go back to a pool
    with torch.cuda.device(1):
        for _ in range(3):
            work(3)  # a pool shared by both devices would hand out events bound to device 0 here
    sim.finish()
    assert device_values(exporter, "work") == [0.002] * 3 + [0.003] * 3
    assert runtime().backends.device_clock.devices == [0, 1]  # type: ignore[union-attr]


def test_one_thread_per_gpu_each_times_its_own_device(sim, exporter) -> None:  # type: ignore[no-untyped-def]
    # nn.DataParallel runs each replica in a thread of its own with its device current.
    @probe("replica")
    def replica(device: int) -> None:
        sim.launch((device + 1) * MS)

    def run(device: int) -> None:
        torch.cuda.set_device(device)
        for _ in range(20):
            replica(device)
            if _ % 5 == 0:
                sim.finish()
                gpuprobe.collect()

    threads = [threading.Thread(target=run, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sim.finish()
    values = device_values(exporter, "replica")
    assert values == [0.001] * 20 + [0.002] * 20


def test_a_failing_event_is_counted_and_warned_once_never_raised(sim, exporter, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def broken(self, stream=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda.Event, "record", broken)

    @probe("survives")
    def f() -> int:
        return 7

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [f() for _ in range(5)] == [7] * 5
        with probe("survives_block"):
            pass
    assert len(exporter.values(DUR, probe="survives", clock="host")) == 5
    assert dropped("device_timing_failed") == 6
    assert sum("device timing skipped" in str(w.message) for w in caught) == 1


def test_an_exhausted_pool_drops_and_counts_instead_of_blocking(simcuda, exporter) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1)
    torch.cuda.current_device()
    clock = runtime().backends.device_clock
    clock._max = 8  # type: ignore[union-attr]  # a small pool: 4 start/end pairs
    p = probe("burst")
    for _ in range(10):
        with p:
            sim.launch(MS)  # never finishes during the loop: every event stays in flight
    assert len(exporter.values(DUR, probe="burst", clock="host")) == 10  # host timing never drops
    assert dropped("event_pool_exhausted") == 6
    sim.finish()
    gpuprobe.collect()
    assert clock.in_flight == 0  # type: ignore[union-attr]


# -- CUDA initialization, devices and labels ------------------------------------------------------------

def test_nothing_initializes_cuda_before_the_program_does(simcuda, exporter) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(2)
    gpuprobe.configure(memory=True)

    @probe("early")
    def early() -> None:
        pass

    early()
    with probe("block"):
        pass
    gpuprobe.info()
    gpuprobe.collect()
    gpuprobe.memory.read()
    assert torch.cuda.is_initialized() is False
    assert sim.stats.init_calls == 0
    # Once the program has initialized CUDA, device timing starts on its own.
    torch.cuda.current_device()
    early()
    sim.finish()
    assert len(device_values(exporter, "early")) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_worker_can_still_use_cuda_after_probes_were_prepared(simcuda) -> None:  # type: ignore[no-untyped-def]
    simcuda(1)

    @probe("prepared_in_parent")
    def f() -> None:
        pass

    f()
    gpuprobe.collect()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            torch.cuda.current_device()  # "Cannot re-initialize CUDA in forked subprocess" if the parent had
            f()
            code = 0
        except RuntimeError:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_device_label_is_the_device_set_after_import(simcuda, exporter) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(2)
    gpuprobe.configure(memory=True)

    @probe("rank_work")  # prepared at import, before the rank picks its GPU
    def work() -> None:
        sim.launch(MS)

    torch.cuda.set_device(1)  # torchrun: set_device(local_rank)
    handle = sim.allocate(64 * 2**20, device=1)
    work()
    sim.finish()
    allocated = exporter.values("gpuprobe.memory.allocated", device="cuda:1")
    assert allocated == [torch.cuda.memory_allocated(1)] and allocated[0] >= 64 * 2**20
    assert exporter.values("gpuprobe.memory.allocated", device="cuda:0") == []
    (md,) = [m for m in gpuprobe.collect() if m.spec.name == DUR]
    assert {p.labels["gpuprobe.device"] for p in md.points} == {"cuda:1"}
    sim.free(handle)


# -- memory readings ---------------------------------------------------------------------------------

def test_one_allocator_read_per_memory_reading(sim, exporter) -> None:  # type: ignore[no-untyped-def]
    gpuprobe.configure(memory=True)

    @probe("reads")
    def f() -> None:
        pass

    f()  # the first call prepares the series
    sim.reset_stats()
    f()
    assert sim.calls["memory_stats_as_nested_dict"] == 1
    assert sim.calls["memory_stats"] == 0  # no flattening of ~130 statistics, three times
    assert len(exporter.values("gpuprobe.memory.peak", device="cuda:0")) == 2


@pytest.mark.parametrize("peak_reset", [False, True])
def test_peak_per_reading_when_asked(sim, exporter, peak_reset: bool) -> None:  # type: ignore[no-untyped-def]
    gpuprobe.configure(memory=True, memory_peak_reset=peak_reset)
    big, small = 256 * 2**20, 16 * 2**20

    def step(nbytes: int) -> None:
        with probe("step_mem"):
            handle = sim.allocate(nbytes)
            sim.free(handle)

    step(big)
    step(small)
    peaks = exporter.values("gpuprobe.memory.peak", device="cuda:0")
    assert peaks[0] >= big
    if peak_reset:
        assert small <= peaks[1] < big  # the second step's own peak
        assert torch.cuda.max_memory_allocated(0) < big  # and the allocator's peak was reset for the program too
    else:
        assert peaks[1] >= big  # the lifetime peak


# -- graph capture ----------------------------------------------------------------------------------

def test_no_event_is_read_while_another_thread_captures_a_graph(simcuda, exporter) -> None:  # type: ignore[no-untyped-def]
    sim = simcuda(1)
    torch.cuda.current_device()
    gpuprobe.configure(collect_interval=0.005)  # the background thread reads device timings every 5 ms

    @probe("before_capture")
    def work() -> None:
        sim.launch(50 * MS)  # still running on the device during the capture

    for _ in range(4):
        work()
    failures: list[BaseException] = []

    def capture() -> None:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):  # CUDA's default capture mode: "global"
                for _ in range(20):
                    sim.launch(MS, "captured")
                    time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    t = threading.Thread(target=capture)
    t.start()
    t.join()
    assert failures == []
    assert sim.stats.invalidated_captures == 0 and sim.stats.unsafe_calls_during_capture == 0
    sim.finish()
    assert device_values(exporter, "before_capture") == [0.05] * 4  # read once the capture was over


def test_a_probe_inside_a_capture_takes_no_device_time(sim, exporter) -> None:  # type: ignore[no-untyped-def]
    @probe("captured_call")
    def step() -> None:
        sim.launch(MS, "captured")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
        with probe("captured_block"):
            sim.launch(MS, "captured")
    graph.replay()
    sim.finish()
    for name in ("captured_call", "captured_block"):
        assert len(exporter.values(DUR, probe=name, clock="host")) == 1
        assert device_values(exporter, name) == []  # an event recorded into a capture can never be read
    assert sim.stats.invalidated_captures == 0
    gpuprobe.collect()  # nothing pending raises "operation not permitted on an event last recorded ..."
    assert runtime().backends.device_clock.in_flight == 0  # type: ignore[union-attr]


def test_captures_are_counted_only_while_underway(sim) -> None:  # type: ignore[no-untyped-def]
    guard = runtime().capture
    seen: list[int] = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen.append(guard.underway)
    seen.append(guard.underway)
    assert seen == [1, 0]


# -- async code and generators ---------------------------------------------------------------------

def test_async_and_generator_probes_take_no_device_time(sim, exporter) -> None:  # type: ignore[no-untyped-def]
    @probe("coro")
    async def coro() -> None:
        sim.launch(MS)
        await asyncio.sleep(0)

    @probe("gen")
    def gen():  # type: ignore[no-untyped-def]
        sim.launch(MS)
        yield 1

    @probe("sync")
    def sync() -> None:
        sim.launch(MS)

    asyncio.run(coro())
    list(gen())
    sync()
    sim.finish()
    assert device_values(exporter, "coro") == [] and device_values(exporter, "gen") == []
    assert device_values(exporter, "sync") == [0.001]
    assert len(exporter.values(DUR, probe="coro", clock="host")) == 1


# -- reconfiguration -------------------------------------------------------------------------------

def test_probes_prepared_before_a_reconfiguration_use_the_new_device_clock(sim, exporter) -> None:  # type: ignore[no-untyped-def]
    gpuprobe.configure(device_timing="off")

    @probe("rebound")
    def f() -> None:
        sim.launch(MS)

    block = probe("rebound_block")
    f()
    with block:
        sim.launch(MS)
    gpuprobe.configure(device_timing="auto")
    f()
    with block:
        sim.launch(MS)
    sim.finish()
    gpuprobe.collect()  # a stale binding used to make every collect() raise from here on
    assert device_values(exporter, "rebound") == [0.001]
    assert device_values(exporter, "rebound_block") == [0.001]
    gpuprobe.configure(device_timing="off")
    f()
    sim.finish()
    assert device_values(exporter, "rebound") == [0.001]
    assert len(exporter.values(DUR, probe="rebound", clock="host")) == 3


def test_device_timings_are_read_in_the_background_after_configure(sim) -> None:  # type: ignore[no-untyped-def]
    gpuprobe.configure(collect_interval=0.01)  # no exporter at all

    @probe("background")
    def f() -> None:
        sim.launch(MS)

    for _ in range(5):
        f()
    sim.finish()
    clock = runtime().backends.device_clock
    deadline = time.monotonic() + 5
    while clock.in_flight and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)
    assert clock.in_flight == 0  # type: ignore[union-attr]  # read and given back with nobody collecting


# -- profile windows and kernel sampling --------------------------------------------------------------

def test_an_nsys_window_starts_no_second_profiler(sim) -> None:  # type: ignore[no-untyped-def]
    window = gpuprobe.profile("1-2", nsys=True)
    for _ in range(5):
        gpuprobe.step()
        sim.launch(MS)
    assert window.state == "done" and window.output is None
    assert sim.stats.profiler_api_starts == 1 and sim.stats.profiler_api_stops == 1
    assert sim.stats.profiler_sessions == 0  # nsys and torch.profiler would be two CUPTI clients


def test_a_window_records_the_device_work_of_its_steps(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import gzip
    import json

    out = tmp_path / "window.json.gz"
    window = gpuprobe.profile("2-3", output=str(out))
    for i in range(6):
        gpuprobe.step()
        sim.launch(MS, f"kernel_of_step_{i}")
    assert window.state == "done"
    with gzip.open(out, "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {n for n in names if str(n).startswith("kernel_of_step_")} == {"kernel_of_step_2", "kernel_of_step_3"}


def test_kernel_sampling_counts_kernels_copies_and_sets_only(sim) -> None:  # type: ignore[no-untyped-def]
    from gpuprobe._kernel_sampler import _KinetoRecorder

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])
    with prof:
        with torch.profiler.record_function("a_range"):  # a GPU user annotation on the device
            sim.launch(MS, "ampere_sgemm_128x64_nn")
            sim.launch(MS // 2, "Memcpy HtoD", kind="gpu_memcpy", nbytes=1024)
            sim.launch(MS // 4, "Memset", kind="gpu_memset", nbytes=1024)
    cuda = torch.autograd.DeviceType.CUDA
    all_device = [e.name() for e in prof.profiler.kineto_results.events() if e.device_type() == cuda]
    assert "a_range" in all_device  # what a filter on device_type() alone would count as a kernel
    events = _KinetoRecorder(torch, cuda=True).events(prof)
    assert sorted(events) == sorted([("ampere_sgemm_128x64_nn", MS), ("Memcpy HtoD", MS // 2),
                                     ("Memset", MS // 4)])


def test_a_kernel_sample_is_started_and_stopped_on_one_thread(sim) -> None:  # type: ignore[no-untyped-def]
    from gpuprobe.profiling import KernelSampler

    sampler = KernelSampler(2).attach()
    barrier = threading.Barrier(2)

    def generate_loop() -> None:  # two threads generating at once share the step counter
        for _ in range(10):
            barrier.wait()
            gpuprobe.step()
            sim.launch(MS, "ampere_sgemm_128x64_nn")
        runtime().steps_done()

    threads = [threading.Thread(target=generate_loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sampler.detach()
    assert sim.stats.profiler_cross_thread_stops == 0
    assert sim.stats.profiler_sessions >= 2 and sampler.samples >= 1  # (a sample may be skipped while one is read)


@pytest.mark.parametrize("cuda_up_at_attach", [False, True])
def test_kernel_sampling_warms_the_profiler_up_before_graphs_are_captured(simcuda, exporter,  # type: ignore[no-untyped-def]
                                                                         cuda_up_at_attach: bool) -> None:
    from gpuprobe import _kernel_sampler, profiling

    sim = simcuda(1)
    _kernel_sampler._warmed_up = False  # a fresh process, as far as the warm-up is concerned
    if cuda_up_at_attach:
        torch.cuda.current_device()
    sampler = profiling.KernelSampler(2).attach()  # e.g. GPUPROBE_KERNEL_SAMPLING at start-up
    assert torch.cuda.is_initialized() is cuda_up_at_attach  # the warm-up never initializes CUDA
    torch.cuda.current_device()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a server's warm-up captures its decode step
        sim.launch(MS, "ampere_sgemm_128x64_nn")
    for _ in range(5):
        gpuprobe.step()
        graph.replay()
    sampler.detach()
    assert sim.stats.init_for_cuda_graphs_calls == 1
    assert sim.stats.graph_replays_without_profiler_warmup == 0
    assert sum(exporter.values("gpuprobe.kernel.launches", category="gemm")) == sampler.samples >= 1


def test_kernel_sampling_pauses_while_an_nsys_bracket_is_open(sim) -> None:  # type: ignore[no-untyped-def]
    from gpuprobe.profiling import KernelSampler

    sampler = KernelSampler(1).attach()
    gpuprobe.profile("2-3", nsys=True)
    for _ in range(6):
        gpuprobe.step()
        sim.launch(MS)
        sampler.wait()  # each sample is read before the next step, so none is skipped for that
    sampler.detach()
    assert sim.stats.profiler_api_starts == 1
    assert dropped("kernel_sampling_busy") == 2  # steps 2 and 3
    assert sampler.samples == 3  # steps 1, 4, 5


# -- memory snapshots ---------------------------------------------------------------------------------

def test_snapshot_triggers_start_history_once_cuda_is_up(simcuda, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import pickle

    sim = simcuda(1)
    gpuprobe.configure(snapshot_at_step=2, snapshot_dir=str(tmp_path))
    assert torch.cuda.is_initialized() is False  # the trigger did not initialize CUDA
    torch.cuda.current_device()  # the program starts using the GPU
    gpuprobe.step()  # step 0: history starts here
    handle = sim.allocate(8 * 2**20)
    gpuprobe.step()
    gpuprobe.step()  # step 2: the dump
    (path,) = tmp_path.iterdir()
    with open(path, "rb") as f:
        snap = pickle.load(f)
    allocs = [e for trace in snap["device_traces"] for e in trace if e["action"] == "alloc"]
    assert allocs and all(e["frames"] for e in allocs)  # Python stacks recorded
    assert any(f["name"] == "test_snapshot_triggers_start_history_once_cuda_is_up"
               for e in allocs for f in e["frames"])
    sim.free(handle)
