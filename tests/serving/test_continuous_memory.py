"""Memory gauges under continuous batching (``generate_batch`` of a tiny Llama, in process): allocated,
reserved and peak are read as generate() reads them, on one scheduler step in ``memory_every`` and at
the loop's end, through the same memory reader, on the devices of the model."""

from __future__ import annotations

import os
import resource
from typing import Any

import pytest
from _servekit import tiny_llama

import gpuprobe.runtime
from gpuprobe.integrations import transformers as hf
from gpuprobe.testing import InMemoryExporter

from helpers import cpu_continuous_batching_cannot_pin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODEL = "tiny-cb-memory"
MEMORY = ("gpuprobe.memory.allocated", "gpuprobe.memory.reserved", "gpuprobe.memory.peak")


@pytest.fixture(autouse=True)
def cpu_batching() -> None:
    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)


def _serve(model: Any, n: int = 6, new: int = 6) -> dict[str, Any]:
    prompts = [[3 + (i * 5 + j) % 120 for j in range(4 + i)] for i in range(n)]
    gen = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=32)
    return model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)


def _observed(exporter: InMemoryExporter, name: str) -> list[tuple[dict[str, str], float]]:
    return [(o.attrs, o.value) for o in exporter.observations(name)]


def _host_steps(exporter: InMemoryExporter) -> int:
    return len(exporter.observations("gpuprobe.step.duration", model=MODEL, clock="host"))


def _status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (the kernel's own figures, read apart from gpuprobe's reader)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


@pytest.mark.no_cuda
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the kernel's /proc/self/status")
def test_a_cpu_model_reads_the_process_memory_on_every_step_and_at_the_end() -> None:
    model = hf.instrument(tiny_llama(), model_name=MODEL, memory_every=1)
    try:
        with InMemoryExporter() as exporter:
            rss_before = _status_kib("VmRSS") * 1024
            out = _serve(model)
            hwm_after = _status_kib("VmHWM") * 1024
            allocated = _observed(exporter, "gpuprobe.memory.allocated")
            peak = _observed(exporter, "gpuprobe.memory.peak")
            steps = _host_steps(exporter)
    finally:
        hf.uninstrument(model)
    assert len(out) == 6 and steps > 0
    # One reading per step (memory_every=1) and one as the loop ends.
    assert len(allocated) == len(peak) == steps + 1
    assert {labels["device"] for labels, _ in allocated} == {"cpu"}
    assert _observed(exporter, "gpuprobe.memory.reserved") == []  # the CUDA allocator's only
    page = os.sysconf("SC_PAGE_SIZE")
    for (_, a), (_, p) in zip(allocated, peak, strict=True):
        # The resident set the kernel reports: at least what the process held before serving (less a
        # few pages the kernel may have reclaimed), at most its high-water mark afterwards.
        assert rss_before * 0.9 <= a <= hwm_after + 16 * page
        assert a <= p <= max(hwm_after, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) + 16 * page


@pytest.mark.no_cuda
def test_memory_every_n_reads_one_step_in_n_and_the_loop_end() -> None:
    model = hf.instrument(tiny_llama(), model_name=MODEL, memory_every=4)
    try:
        with InMemoryExporter() as exporter:
            gpuprobe.runtime.runtime().steps.restart()  # the steps of this loop are numbered from 0
            _serve(model, n=8, new=9)
            allocated = _observed(exporter, "gpuprobe.memory.allocated")
            steps = _host_steps(exporter)
    finally:
        hf.uninstrument(model)
    assert steps >= 8
    assert len(allocated) == len(range(0, steps, 4)) + 1


def test_memory_false_reads_no_memory_under_continuous_batching() -> None:
    model = hf.instrument(tiny_llama(), model_name=MODEL, memory=False)
    try:
        with InMemoryExporter() as exporter:
            _serve(model, n=3, new=3)
            seen = {name: _observed(exporter, name) for name in MEMORY}
            steps = _host_steps(exporter)
    finally:
        hf.uninstrument(model)
    assert steps > 0
    assert seen == {name: [] for name in MEMORY}


@pytest.mark.cuda
def test_a_gpu_model_reads_its_device_allocator() -> None:
    device = torch.device("cuda", 0)
    model = hf.instrument(tiny_llama().to(device), model_name=MODEL, memory_every=1)
    torch.cuda.reset_peak_memory_stats(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    try:
        with InMemoryExporter() as exporter:
            _serve(model)
            torch.cuda.synchronize(device)
            peak_seen = torch.cuda.max_memory_allocated(device)
            reserved_max = torch.cuda.memory_stats(device)["reserved_bytes.all.peak"]
            got = {name: _observed(exporter, name) for name in MEMORY}
            steps = _host_steps(exporter)
    finally:
        hf.uninstrument(model)
    assert steps > 0
    for name in MEMORY:
        assert len(got[name]) == steps + 1, name
        assert {labels["device"] for labels, _ in got[name]} == {"cuda:0"}, name
    for (_, a), (_, r), (_, p) in zip(*(got[name] for name in MEMORY), strict=True):
        # torch's own counters, asked apart: the weights are allocated throughout; nothing exceeds the peaks.
        assert weights <= a <= p <= peak_seen
        assert a <= r <= reserved_max
