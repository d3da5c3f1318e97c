"""Profile windows and live kernel categories, on a real tiny model's forward steps."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import gpuprobe
from gpuprobe import ConfigError
from gpuprobe.profiling import KernelSampler, categorize_events, parse_steps
from gpuprobe.testing import InMemoryExporter

from helpers import run_python

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "kineto"
LOCAL = Path(__file__).resolve().parent / "data" / "kineto"


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    return transformers.LlamaForCausalLM(cfg).eval()


def run_steps(model, n: int) -> None:  # type: ignore[no-untyped-def]
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        for i in range(n):
            gpuprobe.step()
            with torch.profiler.record_function(f"mystep{i}"):
                model(ids)


def trace_names(path: Path) -> set[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return {e.get("name", "") for e in trace["traceEvents"]}


def test_window_captures_exactly_the_asked_steps(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "window.json.gz"
    window = gpuprobe.profile("2-3", output=str(out))
    run_steps(model, 6)
    assert window.state == "done" and window.path == out
    names = trace_names(out)
    assert {n for n in names if n.startswith("mystep")} == {"mystep2", "mystep3"}
    assert any(n.startswith("aten::") for n in names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["window.json.gz"]  # no temporary left


def test_window_still_open_at_exit_is_written(tmp_path: Path) -> None:
    out = tmp_path / "exit.json"
    proc = run_python(
        """
        import torch, gpuprobe
        for i in range(4):
            gpuprobe.step()
            with torch.profiler.record_function(f"mystep{i}"):
                torch.ones(4) @ torch.ones(4)
        """,
        env={"GPUPROBE_PROFILE_STEPS": "2-100", "GPUPROBE_PROFILE_OUTPUT": str(out)},
    )
    assert proc.returncode == 0, proc.stderr
    assert {n for n in trace_names(out) if n.startswith("mystep")} == {"mystep2", "mystep3"}


@pytest.mark.parametrize("bad", ["", "5-2", "a-b", "1-2-3", "-3"])
def test_bad_step_ranges_name_the_setting(bad: str) -> None:
    with pytest.raises(ConfigError, match="GPUPROBE_PROFILE_STEPS"):
        gpuprobe.config.load({"GPUPROBE_PROFILE_STEPS": bad} if bad else {"GPUPROBE_PROFILE_STEPS": " "})


def test_parse_steps() -> None:
    assert parse_steps("100-150") == (100, 150) and parse_steps(" 7 ") == (7, 7)


def test_profile_rejects_bad_output_and_nothing_to_capture() -> None:
    with pytest.raises(ConfigError, match=".json or .json.gz"):
        gpuprobe.profile("1-2", output="trace.txt")
    with pytest.raises(ConfigError, match="needs output="):
        gpuprobe.profile("1-2", output=None)


def sees_cuda() -> bool:
    """Whether gpuprobe sees a CUDA device here (a real one, or a simulated machine's): the sampler then
    records kernels, not CPU operators."""
    from gpuprobe._cuda import torch_with_cuda

    return torch_with_cuda() is not None


def test_kernel_sampler_exports_categories_of_one_step_in_n(model, exporter: InMemoryExporter) -> None:  # type: ignore[no-untyped-def]
    if sees_cuda():  # the CUDA path: test_kernel_sampler_on_cuda_counts_every_kernel_of_the_step, tests/cuda
        pytest.skip("with a CUDA device the sampler records kernels, and this model on the CPU launches none")
    sampler = KernelSampler(every=3).attach()
    for _ in range(10):  # steps 3, 6, 9 are profiled; 9 is finished by detach()
        run_steps(model, 1)
        sampler.wait()  # a sample still being read when the next one ends would be skipped as busy
    sampler.detach()
    assert sampler.samples == 3
    launches = exporter.observations("gpuprobe.kernel.launches")
    cats = {o.attrs["category"] for o in launches}
    assert "gemm" in cats  # the linear layers
    per_sample = sum(o.value for o in launches) / 3
    assert per_sample > 10
    times = exporter.values("gpuprobe.kernel.time")
    assert all(t >= 0 for t in times) and sum(times) > 0


def dropped(reason: str) -> float:
    data = {md.spec.name: md for md in gpuprobe.collect()}
    md = data.get("gpuprobe.telemetry.dropped")
    return sum(pt.value for pt in md.points if pt.labels["reason"] == reason) if md else 0


def test_cpu_recorders_see_the_same_operators(model) -> None:  # type: ignore[no-untyped-def]
    # The autograd profiler's CPU state (cheaper) and torch.profiler's kineto CPU trace must give the
    # same operators for the same forward: same count per category, and self times that add up to
    # less than the step.
    from gpuprobe._kernel_sampler import _CpuLegacyRecorder, _KinetoRecorder
    import time

    ids = torch.randint(0, 128, (1, 8))
    got = {}
    for rec in (_CpuLegacyRecorder(torch), _KinetoRecorder(torch, cuda=False)):
        with torch.no_grad():
            model(ids)  # warm
            t0 = time.perf_counter_ns()
            rec.start()
            model(ids)
            raw = rec.stop()
            wall = time.perf_counter_ns() - t0
        events = rec.events(raw)
        assert sum(ns for _, ns in events) < wall
        got[type(rec).__name__] = categorize_events(events, cpu_ops=True)
        linears = [n for n, _ in events if n == "aten::linear"]
        assert len(linears) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, then lm_head
    legacy, kineto = got["_CpuLegacyRecorder"], got["_KinetoRecorder"]
    assert {c: n for c, (_, n) in legacy.items()} == {c: n for c, (_, n) in kineto.items()}


def test_sampler_reuses_one_worker_and_ends_it(model) -> None:  # type: ignore[no-untyped-def]
    import threading

    sampler = KernelSampler(every=2).attach()
    for _ in range(7):  # samples at 2, 4, 6
        run_steps(model, 1)
        sampler.wait()  # the previous sample is read before the next one ends (none is skipped)
    workers = [t for t in threading.enumerate() if t.name == "gpuprobe-kernels"]
    sampler.detach()
    assert sampler.samples == 3
    assert len(workers) == 1
    workers[0].join(5)
    assert not workers[0].is_alive()


def test_sampler_leaves_a_profile_window_its_steps(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "w.json"
    sampler = KernelSampler(every=3).attach()
    window = gpuprobe.profile("3-4", output=str(out))  # step 3 would be sampled: the window wins
    before = dropped("kernel_sampling_busy")
    run_steps(model, 8)  # samples at 6; 3 skipped
    sampler.detach()
    assert window.state == "done", window.error
    assert {n for n in trace_names(out) if n.startswith("mystep")} == {"mystep3", "mystep4"}
    assert sampler.samples == 1
    assert dropped("kernel_sampling_busy") - before == 1


def test_sampler_leaves_a_running_torch_profiler_alone(model) -> None:  # type: ignore[no-untyped-def]
    sampler = KernelSampler(every=1).attach()
    before = dropped("kernel_sampling_busy")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run_steps(model, 4)  # steps 0-3; 1, 2 and 3 would be sampled
    sampler.detach()
    assert sampler.samples == 0
    assert dropped("kernel_sampling_busy") - before == 3
    assert any(e.name == "mystep3" for e in prof.events())  # the user's profile is whole


def test_categorize_events_on_real_gpu_kernels() -> None:
    src = LOCAL / "hta_sampled_rank-0.json.gz"
    if not src.exists():
        src = SHARED / "hta_sampled_rank-0.json.gz"
    with gzip.open(src, "rt") as f:
        trace = json.load(f)
    kernels = [(e["name"], round(float(e["dur"]) * 1000)) for e in trace["traceEvents"]
               if e.get("cat") == "kernel" and e.get("ph") == "X"]
    result = categorize_events(kernels)
    assert sum(c for _, c in result.values()) == len(kernels)
    assert sum(t for t, _ in result.values()) == sum(d for _, d in kernels)
    assert "gemm" in result


def test_cpu_self_time_subtracts_children() -> None:
    from gpuprobe._kernel_sampler import _cpu_self_times

    events = [
        ("aten::linear", 0, 100, 1),
        ("aten::t", 1, 4, 1),
        ("aten::matmul", 10, 80, 1),
        ("aten::mm", 12, 70, 1),
        ("aten::add", 200, 9, 1),
        ("aten::mul", 0, 50, 2),  # another thread: independent
    ]
    got = dict(_cpu_self_times(events))
    assert got == {"aten::linear": 16, "aten::matmul": 10, "aten::mm": 70, "aten::add": 9, "aten::mul": 50}


def test_window_over_instrumented_generate_gives_the_report_its_steps(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from gpuprobe.integrations.transformers import instrument, uninstrument
    from gpuprobe.report import analyze

    out = tmp_path / "generate.json.gz"
    window = gpuprobe.profile("2-5", output=str(out))
    instrument(model)
    try:
        ids = torch.randint(0, 128, (1, 6))
        model.generate(ids, max_new_tokens=10, do_sample=False, min_new_tokens=10)
    finally:
        uninstrument(model)
    assert window.state == "done"
    # independently: the step ranges in the raw trace are exactly steps 2-5
    marks = sorted(n for n in trace_names(out) if n.startswith("gpuprobe.step#"))
    assert marks == ["gpuprobe.step#2", "gpuprobe.step#3", "gpuprobe.step#4", "gpuprobe.step#5"]
    report = analyze(str(out)).to_dict()
    assert len(report["steps"]["rows"]) == 4


@pytest.mark.cuda
def test_kernel_sampler_on_cuda_counts_every_kernel_of_the_step(exporter: InMemoryExporter) -> None:
    # Expected values from an independent torch.profiler run of the same, deterministic step.
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.LlamaForCausalLM(cfg).eval().cuda()
    ids = torch.randint(0, 128, (1, 8), device="cuda")

    def step() -> None:
        with torch.no_grad():
            model(ids)
        torch.cuda.synchronize()

    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
    cuda = torch.autograd.DeviceType.CUDA
    expected = sum(1 for e in prof.profiler.kineto_results.events() if e.device_type() == cuda)

    sampler = KernelSampler(every=2).attach()
    for _ in range(4):  # steps 0-3: step 2 is sampled
        gpuprobe.step()
        step()
    sampler.detach()
    assert sampler.samples == 1
    launches = exporter.observations("gpuprobe.kernel.launches")
    assert sum(o.value for o in launches) == expected
    assert "gemm" in {o.attrs["category"] for o in launches}


def test_info_says_what_kernel_sampling_records() -> None:
    assert gpuprobe.info()["kernel_sampling"] == "off"
    sampler = KernelSampler(every=2).attach()
    records = "kernels, memcpy and memset" if sees_cuda() else "CPU operators with their self time"
    assert gpuprobe.info()["kernel_sampling"].startswith(f"every 2 steps: {records}")
    sampler.detach()
    assert gpuprobe.info()["kernel_sampling"] == "off"
