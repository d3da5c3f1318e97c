"""torch.profiler with CUDA activity over the simulation (torch/profiler/profiler.py, kineto).

The simulated events take the shape of the ``torch._C._autograd._KinetoEvent`` class in force: the
installed torch's, or a stand-in of another release's (tests/kineto_shapes.py). Tests that tell records
apart by ``activity_type()`` run with torch 2.13's shape, which has it.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity

from gpuprobe.testing.simcuda import SimulatedCuda

from kineto_shapes import kineto_shape, public_methods, use_shape  # noqa: F401 - kineto_shape is a fixture

CUDA = [ProfilerActivity.CUDA]
CPU_CUDA = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def _gpu(prof: object) -> list[object]:
    cuda = torch.autograd.DeviceType.CUDA
    return [e for e in prof.profiler.kineto_results.events() if e.device_type() == cuda]  # type: ignore[attr-defined]


@pytest.fixture
def activity_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """Events shaped as torch 2.13's, whose ``activity_type()`` names each record's kind."""
    use_shape(monkeypatch, "torch-2.13")


def test_kernels_of_all_threads_and_devices_are_recorded(activity_types: None, sim: SimulatedCuda) -> None:
    """CUPTI activity tracing is process-wide: kernels of every thread and device."""
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(1_000, "gemm")
        t = threading.Thread(target=lambda: sim.launch(2_000, "softmax", torch.cuda.default_stream(1)))
        t.start()
        t.join()
    kernels = sorted((e.name(), e.device_index(), e.duration_ns()) for e in _gpu(prof)
                     if e.activity_type() == "kernel")
    assert kernels == [("gemm", 0, 1_000), ("softmax", 1, 2_000)]


def test_kernels_launched_before_the_session_are_not_recorded(sim: SimulatedCuda) -> None:
    """Only activity while the session records is collected."""
    sim.launch(1_000, "before")
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(1_000, "during")
    assert [e.name() for e in _gpu(prof)] == ["during"]


def test_gpu_side_records_that_are_not_kernels_have_device_type_cuda(activity_types: None, sim: SimulatedCuda) -> None:
    """_KinetoEvent.device_type() is CUDA for memcpy, memset, GPU user annotations and sync records;
    activity_type() tells them apart (kineto ActivityType names)."""
    config = _ExperimentalConfig(enable_cuda_sync_events=True)
    with torch.profiler.profile(activities=CPU_CUDA, experimental_config=config) as prof:
        with torch.profiler.record_function("decode_step"):
            sim.launch(1_000, "gemm")
            sim.launch(100, "Memcpy DtoH (Device -> Pinned)", kind="gpu_memcpy", nbytes=8)
            sim.launch(50, "Memset (Device)", kind="gpu_memset", nbytes=128)
    by_type = {}
    for e in _gpu(prof):
        by_type.setdefault(e.activity_type(), []).append(e.name())
    assert by_type["kernel"] == ["gemm"]
    assert by_type["gpu_memcpy"] == ["Memcpy DtoH (Device -> Pinned)"]
    assert by_type["gpu_memset"] == ["Memset (Device)"]
    assert by_type["gpu_user_annotation"] == ["decode_step"]
    assert by_type["cuda_sync"] == ["Context Sync"]  # the profiler's own synchronize on exit
    ann = next(e for e in _gpu(prof) if e.activity_type() == "gpu_user_annotation")
    assert ann.duration_ns() == 1_150  # from the first kernel's start to the last one's end


def test_gpu_user_annotations_need_cpu_activity(activity_types: None, sim: SimulatedCuda) -> None:
    """record_function: "Label will only appear if CPU activity tracing is enabled"."""
    with torch.profiler.profile(activities=CUDA) as prof:
        with torch.profiler.record_function("step"):
            sim.launch(1_000)
    assert {e.activity_type() for e in _gpu(prof)} == {"kernel"}


def test_sync_records_need_enable_cuda_sync_events(activity_types: None, sim: SimulatedCuda) -> None:
    """_ExperimentalConfig(enable_cuda_sync_events=...) (torch/_C/_profiler.pyi) turns cuda_sync on."""
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(1_000)
        torch.cuda.synchronize()
    assert "cuda_sync" not in {e.activity_type() for e in _gpu(prof)}


def test_runtime_calls_are_cpu_side_records(activity_types: None, sim: SimulatedCuda) -> None:
    """Kineto records CUDA runtime calls (cuda_runtime) on the host: DeviceType.CPU."""
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(1_000)
    runtime = [e for e in prof.profiler.kineto_results.events() if e.activity_type() == "cuda_runtime"]
    assert "cudaLaunchKernel" in [e.name() for e in runtime]
    assert {e.device_type() for e in runtime} == {torch.autograd.DeviceType.CPU}


def test_leaving_the_session_synchronizes_the_device(sim: SimulatedCuda) -> None:
    """torch/autograd/profiler.py profile.__exit__: ``device_module.synchronize()`` for use_device "cuda"."""
    with torch.profiler.profile(activities=CUDA):
        sim.launch(5_000)
    assert sim.stats.host_syncs_by_api["synchronize"] == 1
    assert sim.now_ns() == 5_000


def test_a_second_concurrent_cuda_session_is_refused(sim: SimulatedCuda) -> None:
    """kineto has one activity profiler per process ("GenericActivityProfiler already busy")."""
    with torch.profiler.profile(activities=CUDA):
        with pytest.raises(RuntimeError, match="already active in this process"):
            torch.profiler.profile(activities=CUDA).__enter__()
    with torch.profiler.profile(activities=CUDA):  # free again afterwards
        pass
    assert sim.stats.profiler_sessions == 2


def test_a_cuda_session_from_another_thread_is_refused_too(sim: SimulatedCuda) -> None:
    """The CUDA session is process-wide (CUPTI), not per thread."""
    with torch.profiler.profile(activities=CUDA):
        errors: list[BaseException] = []

        def other() -> None:
            try:
                torch.profiler.profile(activities=CUDA).__enter__()
            except RuntimeError as exc:
                errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert len(errors) == 1 and "already active in this process" in str(errors[0])


def test_a_session_stopped_on_another_thread_is_counted_and_comes_back_empty(sim: SimulatedCuda) -> None:
    """torch does not refuse it: disableProfiler finds no session on that thread, results are empty."""
    prof = torch.profiler.profile(activities=CUDA)
    prof.__enter__()
    sim.launch(1_000)
    t = threading.Thread(target=lambda: prof.__exit__(None, None, None))
    t.start()
    t.join()
    assert sim.stats.profiler_cross_thread_stops == 1
    assert _gpu(prof) == []


def test_profiles_without_cuda_are_torchs_own(sim: SimulatedCuda) -> None:
    """Without CUDA among the activities the real torch.profiler.profile runs unchanged."""
    real = torch.profiler.profiler.profile.__mro__[1]
    prof = torch.profiler.profile(activities=[ProfilerActivity.CPU])
    assert type(prof) is real
    assert sim.stats.profiler_sessions == 0


def test_export_chrome_trace_writes_kineto_style_gpu_events(sim: SimulatedCuda, tmp_path) -> None:
    """Kineto's trace layout: GPU events with pid=device, tid=stream, ts/dur in us (tests/data/kineto_min.json)."""
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(3_000, "gemm", torch.cuda.default_stream(1))
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    kernel = next(e for e in trace["traceEvents"] if e.get("cat") == "kernel")
    assert kernel["name"] == "gemm" and kernel["dur"] == 3.0
    assert kernel["args"]["device"] == 1 and kernel["args"]["stream"] == 7 and kernel["pid"] == 1
    assert trace["deviceProperties"][1]["name"] == "NVIDIA H100 80GB HBM3"


def test_key_averages_reports_device_time(sim: SimulatedCuda) -> None:
    """torch/autograd/profiler.py _parse_kineto_results over the GPU records."""
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(2_000, "gemm")
        sim.launch(2_000, "gemm")
    row = next(r for r in prof.key_averages() if r.key == "gemm")
    assert row.count == 2 and row.device_time_total == pytest.approx(4.0)


def test_cudart_profiler_start_and_stop_are_counted(sim: SimulatedCuda) -> None:
    """torch.cuda.profiler.start/stop: ``check_error(cudart().cudaProfilerStart())``."""
    torch.cuda.profiler.start()
    torch.cuda.cudart().cudaProfilerStop()
    assert (sim.stats.profiler_api_starts, sim.stats.profiler_api_stops) == (1, 1)


def test_replaying_a_graph_captured_before_profiler_warmup_is_flagged(sim: SimulatedCuda) -> None:
    """Graphs captured before the profiler's first use are a known hazard (PyTorch #75504)."""
    early = torch.cuda.CUDAGraph()
    with torch.cuda.graph(early):
        sim.launch(1_000)
    torch.profiler._utils._init_for_cuda_graphs()
    late = torch.cuda.CUDAGraph()
    with torch.cuda.graph(late):
        sim.launch(1_000)
    with torch.profiler.profile(activities=CUDA):
        late.replay()
        assert sim.stats.graph_replays_without_profiler_warmup == 0
        early.replay()
    assert sim.stats.graph_replays_without_profiler_warmup == 1
    assert sim.stats.init_for_cuda_graphs_calls == 1


def test_events_have_exactly_the_methods_of_torchs_kineto_event(kineto_shape: frozenset[str],  # noqa: F811
                                                                 sim: SimulatedCuda) -> None:
    """Code that asks what an event offers (``hasattr(e, "activity_type")``) gets torch's answer."""
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(1_000, "gemm")
    events = prof.profiler.kineto_results.events()
    assert events  # the kernel and its runtime call
    for e in events:
        assert public_methods(type(e)) == kineto_shape
        assert hasattr(e, "activity_type") == ("activity_type" in kineto_shape)


def test_torch_2_11s_shape_tells_annotations_by_flag_and_sync_records_by_name(monkeypatch: pytest.MonkeyPatch,
                                                                              sim: SimulatedCuda) -> None:
    """torch 2.11's events have no activity_type(): a GPU user annotation is the device-side record with
    is_user_annotation(); a sync record is named after its kind (kineto's syncTypeString)."""
    use_shape(monkeypatch, "torch-2.11")
    config = _ExperimentalConfig(enable_cuda_sync_events=True)
    with torch.profiler.profile(activities=CPU_CUDA, experimental_config=config) as prof:
        with torch.profiler.record_function("decode_step"):
            sim.launch(1_000, "gemm")
    records = {e.name(): e.is_user_annotation() for e in _gpu(prof)}
    assert records == {"gemm": False, "decode_step": True, "Context Sync": False}


def test_a_method_the_simulation_does_not_know_raises_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                                sim: SimulatedCuda) -> None:
    """A newer torch's _KinetoEvent method: present on the events (as on torch's), but not simulated."""
    newer = type("_KinetoEvent", (), {"name": None, "device_type": None, "gpu_clock_domain": None})
    monkeypatch.setattr(torch._C._autograd, "_KinetoEvent", newer)
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(1_000, "gemm")
    kernel = next(e for e in _gpu(prof) if e.name() == "gemm")
    with pytest.raises(NotImplementedError, match=r"_KinetoEvent\.gpu_clock_domain\(\) of torch .* is not simulated"):
        kernel.gpu_clock_domain()


def test_install_is_refused_where_torch_has_no_kineto_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused at install, with the releases the simulated profiler follows, and nothing left patched."""
    available = torch.cuda.is_available
    monkeypatch.delattr(torch._C._autograd, "_KinetoEvent")
    with pytest.raises(RuntimeError, match=r"no torch\._C\._autograd\._KinetoEvent.*torch 2\.11\.0, 2\.13\.0 and 2\.15\.0"):
        SimulatedCuda(devices=1).install()
    assert torch.cuda.is_available is available


def test_cuda_activity_filters_pick_the_kinds_recorded(activity_types: None, sim: SimulatedCuda) -> None:
    """torch 2.13's ``activities=[{ProfilerActivity.CUDA: [names]}]`` (profiler.py _parse_activities)."""
    try:
        prof = torch.profiler.profile(activities=[{ProfilerActivity.CUDA: ["GPU_MEMCPY"]}])
    except TypeError:
        pytest.skip(f"torch {torch.__version__}'s profile takes no activity filters (2.13 does)")
    with prof:
        sim.launch(1_000, "gemm")
        sim.launch(100, "Memcpy HtoD", kind="gpu_memcpy", nbytes=8)
    assert [(e.name(), e.activity_type()) for e in _gpu(prof)] == [("Memcpy HtoD", "gpu_memcpy")]
