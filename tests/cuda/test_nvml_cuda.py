"""GPU health gauges against the real NVML of a GPU machine (skipped without CUDA).

Mirrors tests/test_nvml.py, which runs on a simulated NVML: here the driver's NVML answers, and the
device mapping is checked against torch's own device UUIDs.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import gpuprobe
from gpuprobe import _nvml
from gpuprobe.testing import reset

torch = pytest.importorskip("torch")
pynvml = pytest.importorskip("pynvml")

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _fresh() -> None:  # type: ignore[misc]
    reset()
    yield
    reset()


def _gauges() -> dict[tuple[str, str, str], float]:
    out = {}
    for md in gpuprobe.collect():
        if md.spec.name.startswith("gpuprobe.gpu."):
            for p in md.points:
                out[(md.spec.name, p.labels["gpu.index"], p.labels["gpuprobe.device"] + p.labels.get("reason", ""))] = (
                    p.value)
    return out


def _wait_for(metric: str, timeout: float = 10.0) -> dict[Any, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {k: v for k, v in _gauges().items() if k[0] == metric}
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {metric} within {timeout} s")


def test_describe_says_ok_with_the_driver_version() -> None:
    found = _nvml.describe()
    assert found["state"] == "ok", found
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlSystemGetDriverVersion() in found["detail"]
    finally:
        pynvml.nvmlShutdown()


def test_gauges_are_plausible_and_total_memory_is_nvml_s() -> None:
    reset(nvml=True, collect_interval=0.1)
    total = _wait_for("gpuprobe.gpu.memory.total")
    util = _wait_for("gpuprobe.gpu.utilization")
    temp = _wait_for("gpuprobe.gpu.temperature")
    pynvml.nvmlInit()
    try:
        for (_, index, _), value in total.items():
            assert value == pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(int(index))).total
    finally:
        pynvml.nvmlShutdown()
    assert all(0.0 <= v <= 1.0 for v in util.values())
    assert all(10 <= v <= 110 for v in temp.values())
    health = gpuprobe.info()["gpu_health"]
    assert health["on"] is True, health


def test_mapping_after_cuda_init_matches_torch_s_device_uuids() -> None:
    torch.zeros(1, device="cuda")  # the program initializes CUDA
    reset(nvml=True, collect_interval=0.1)
    _wait_for("gpuprobe.gpu.power.limit")
    health = gpuprobe.info()["gpu_health"]
    assert health["detail"].endswith("(torch)"), health
    for device in health["devices"]:
        n = int(device["gpuprobe.device"].split(":")[1])
        torch_uuid = str(torch.cuda.get_device_properties(n).uuid).lower().removeprefix("gpu-")
        assert device["uuid"].lower().removeprefix("gpu-") == torch_uuid or device.get("mig"), (device, torch_uuid)


def test_utilization_rises_under_a_busy_kernel_loop() -> None:
    reset(nvml=True, collect_interval=0.1)
    _wait_for("gpuprobe.gpu.utilization")
    a = torch.randn(4096, 4096, device="cuda")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        a = a @ a
        a = a / a.norm()
    torch.cuda.synchronize()
    util = _gauges()
    busy = [v for (m, _, dev), v in util.items() if m == "gpuprobe.gpu.utilization" and dev == "cuda:0"]
    assert busy and busy[0] > 0.5, util


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability(0)[0] < 9,
                    reason="GPM needs Hopper or later")
def test_gpm_sm_and_tensor_activity_rise_under_bf16_matmuls() -> None:
    reset(nvml=True, collect_interval=0.2)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        b = a @ a
        torch.cuda.synchronize()
    del b
    gauges = _gauges()
    sm = [v for (m, _, dev), v in gauges.items() if m == "gpuprobe.gpu.sm.activity" and dev == "cuda:0"]
    tensor = [v for (m, _, dev), v in gauges.items() if m == "gpuprobe.gpu.tensor.activity" and dev == "cuda:0"]
    assert sm and sm[0] > 0.3, gauges
    assert tensor and tensor[0] > 0.05, gauges
    assert not [o for o in gpuprobe.info()["gpu_health"]["off"] if o["reading"] == "gpm"]
