"""Live kernel sampling across torch releases: the CUDA path on each release's kineto events.

torch 2.13's ``_KinetoEvent`` tells device work apart with ``activity_type()``; torch 2.11's has no
such method (device type, the user-annotation flag and record names must do); torch 2.2's has neither
``activity_type()`` nor ``is_user_annotation()``, and sampling must then be off and say why. No GPU
runs here: the simulated CUDA (gpuprobe.testing.simcuda) records the device work, shaped as the
``_KinetoEvent`` class in force: the installed torch's, or a stand-in of another release's shape
(tests/kineto_shapes.py). Expected values come from the simulated timeline the test itself launches.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

import gpuprobe
from gpuprobe.profiling import KernelSampler, kernel_sampling_status
from gpuprobe.runtime import runtime
from gpuprobe.testing import InMemoryExporter

from kineto_shapes import kineto_shape, public_methods, use_shape  # noqa: F401 - kineto_shape is a fixture

torch = pytest.importorskip("torch")

GEMM = "ampere_sgemm_128x64_nn"
COPY = "Memcpy HtoD (Pageable -> Device)"
SET = "Memset (Device)"
# The category each launched name must land in (gpuprobe.report.categorize_kernel's rules).
CATEGORY = {GEMM: "gemm", COPY: "copy", SET: "other"}


def real_cpu_event():  # type: ignore[no-untyped-def]
    """One event of the installed torch's own kineto CPU trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(2) + 1
    return prof.profiler.kineto_results.events()[0]


def launch_step(sim, step: int) -> list:  # type: ignore[no-untyped-def]
    """A step's device work: step+1 GEMMs of different lengths, one copy, one set; their records."""
    records = [sim.launch(1_000 * (step + 1) + 7 * j, GEMM) for j in range(step + 1)]
    records.append(sim.launch(300 + step, COPY, kind="gpu_memcpy", nbytes=4096))
    records.append(sim.launch(50 + step, SET, kind="gpu_memset", nbytes=4096))
    return records


def test_the_sampler_exports_the_device_work_of_the_sampled_steps(kineto_shape, sim,  # noqa: F811
                                                                  exporter: InMemoryExporter) -> None:
    sampler = KernelSampler(every=2).attach()
    timeline = {}
    for step in range(6):  # steps 2 and 4 are sampled
        gpuprobe.step()
        with torch.profiler.record_function(f"step{step}"):  # no GPU user annotation: the session is CUDA only
            timeline[step] = launch_step(sim, step)
        torch.cuda.synchronize()
        sampler.wait()  # the previous sample is read before the next one ends (none is skipped as busy)
    runtime().steps_done()
    sampler.detach()

    expected_ns: dict[str, int] = defaultdict(int)
    expected_launches: dict[str, int] = defaultdict(int)
    for step in (2, 4):
        for rec in timeline[step]:
            expected_ns[CATEGORY[rec.name]] += rec.end_ns - rec.start_ns
            expected_launches[CATEGORY[rec.name]] += 1
    assert sampler.samples == 2 and sim.stats.profiler_sessions == 2
    launches = {o.attrs["category"]: 0 for o in exporter.observations("gpuprobe.kernel.launches")}
    for cat in launches:
        launches[cat] = sum(exporter.values("gpuprobe.kernel.launches", category=cat))
    assert launches == dict(expected_launches)
    for cat, ns in expected_ns.items():
        assert sum(exporter.values("gpuprobe.kernel.time", category=cat)) == pytest.approx(ns / 1e9)


def test_the_reader_keeps_kernels_copies_and_sets_only(kineto_shape, sim) -> None:  # noqa: F811
    from gpuprobe._kernel_sampler import _KinetoRecorder

    if not kineto_shape <= public_methods(type(real_cpu_event())):
        pytest.skip(f"torch {torch.__version__}'s own CPU events, traced here too, lack methods of this stand-in")
    act = torch.profiler.ProfilerActivity
    config = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    with torch.profiler.profile(activities=[act.CPU, act.CUDA], experimental_config=config) as prof:
        with torch.profiler.record_function("decode"):  # a GPU user annotation around the work
            records = launch_step(sim, 1)
    cuda = torch.autograd.DeviceType.CUDA
    gpu_side = [e.name() for e in prof.profiler.kineto_results.events() if e.device_type() == cuda]
    # What device type alone would count: the annotation and the profiler's own synchronize on exit too.
    assert "decode" in gpu_side and "Context Sync" in gpu_side
    events = _KinetoRecorder(torch, cuda=True).events(prof)
    assert sorted(events) == sorted((r.name, r.end_ns - r.start_ns) for r in records)


def test_status_says_how_device_work_is_told_apart(kineto_shape, sim) -> None:  # noqa: F811
    assert gpuprobe.info()["kernel_sampling"] == "off"
    KernelSampler(every=3).attach()
    how = "activity_type()" if "activity_type" in kineto_shape else "device_type(), is_user_annotation()"
    status = gpuprobe.info()["kernel_sampling"]
    assert status.startswith("every 3 steps: kernels, memcpy and memset (device work told apart by " + how)
    assert status == kernel_sampling_status()


def test_sampling_is_off_and_says_why_where_torch_cannot_tell_device_work_apart(monkeypatch, sim,
                                                                                 exporter: InMemoryExporter) -> None:
    use_shape(monkeypatch, "torch-2.2")  # no activity_type(), no is_user_annotation()
    sampler = KernelSampler(every=2).attach()
    with pytest.warns(RuntimeWarning, match="kernel sampling is not available on torch") as seen:
        for step in range(7):
            gpuprobe.step()
            launch_step(sim, step)
    status = gpuprobe.info()["kernel_sampling"]
    sampler.detach()
    assert len([w for w in seen if "kernel sampling" in str(w.message)]) == 1  # warned once, not per sampled step
    assert sampler.samples == 0 and sim.stats.profiler_sessions == 0  # no profiler was started
    assert exporter.observations("gpuprobe.kernel.launches") == []
    assert status.startswith(f"not available on torch {torch.__version__} (")
    assert "neither activity_type() nor is_user_annotation()" in status
