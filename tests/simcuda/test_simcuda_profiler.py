"""torch.profiler with CUDA activity over the simulation (torch/profiler/profiler.py, kineto)."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity

from gpuprobe.testing.simcuda import SimulatedCuda

CUDA = [ProfilerActivity.CUDA]
CPU_CUDA = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def _gpu(prof: object) -> list[object]:
    cuda = torch.autograd.DeviceType.CUDA
    return [e for e in prof.profiler.kineto_results.events() if e.device_type() == cuda]  # type: ignore[attr-defined]


def test_kernels_of_all_threads_and_devices_are_recorded(sim: SimulatedCuda) -> None:
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


def test_gpu_side_records_that_are_not_kernels_have_device_type_cuda(sim: SimulatedCuda) -> None:
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


def test_gpu_user_annotations_need_cpu_activity(sim: SimulatedCuda) -> None:
    """record_function: "Label will only appear if CPU activity tracing is enabled"."""
    with torch.profiler.profile(activities=CUDA) as prof:
        with torch.profiler.record_function("step"):
            sim.launch(1_000)
    assert {e.activity_type() for e in _gpu(prof)} == {"kernel"}


def test_sync_records_need_enable_cuda_sync_events(sim: SimulatedCuda) -> None:
    """_ExperimentalConfig(enable_cuda_sync_events=...) (torch/_C/_profiler.pyi) turns cuda_sync on."""
    with torch.profiler.profile(activities=CUDA) as prof:
        sim.launch(1_000)
        torch.cuda.synchronize()
    assert "cuda_sync" not in {e.activity_type() for e in _gpu(prof)}


def test_runtime_calls_are_cpu_side_records(sim: SimulatedCuda) -> None:
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
