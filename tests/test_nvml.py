"""GPU health gauges from NVML, on a simulated NVML (gpuprobe.testing.simnvml): no GPU or driver exists on the
machines these tests run on, so a stand-in with nvidia-ml-py's names (checked against the installed module
below) answers for NVML. The exporters, the background thread and the runtime are the real ones.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import gpuprobe
from gpuprobe import _nvml
from gpuprobe.testing import InMemoryExporter, reset
from gpuprobe.testing.simnvml import FUNCTIONS, REASON_BITS, SimGpu, SimulatedNvml

from helpers import ROOT, scrape

pynvml = pytest.importorskip("pynvml")  # the real nvidia-ml-py: what the stand-in must match

UUID_A = "GPU-1a2b3c4d-0000-1111-2222-333344445555"
UUID_B = "GPU-9f8e7d6c-0000-1111-2222-333344445555"
UUID_C = "GPU-9f00aaaa-0000-1111-2222-333344445555"
MIG_B = "MIG-5e5e5e5e-1111-2222-3333-444455556666"
GIB = 2**30


def _gpus() -> list[SimGpu]:
    return [
        SimGpu(uuid=UUID_A, pci_bus_id="00000000:19:00.0", utilization=37, memory_used=3 * GIB, memory_total=80 * GIB,
               sm_clock_mhz=1410, power_mw=123_456, power_limit_mw=700_000, temperature_c=61,
               clocks_event_reasons=REASON_BITS["SwPowerCap"] | REASON_BITS["HwThermalSlowdown"]),
        SimGpu(uuid=UUID_B, pci_bus_id="00000000:3b:00.0", utilization=90, memory_used=70 * GIB, memory_total=80 * GIB,
               sm_clock_mhz=1980, power_mw=650_000, power_limit_mw=700_000, temperature_c=75, mig=(MIG_B,)),
        SimGpu(uuid=UUID_C, pci_bus_id="00000000:5d:00.0"),
    ]


@pytest.fixture
def nvml() -> Iterator[SimulatedNvml]:
    """Three simulated GPUs; the sampler is closed while the stand-in is still installed."""
    sim = SimulatedNvml(_gpus())
    with sim.install():
        yield sim
        reset()


def _points(prefix: str = "gpuprobe.gpu.") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for md in gpuprobe.collect():
        if md.spec.name.startswith(prefix):
            for p in md.points:
                labels = tuple(sorted((k, v) for k, v in p.labels.items() if k != "gpuprobe.rank"))
                out[(md.spec.name, labels)] = p.value
    return out


def _key(metric: str, index: int, device: str, reason: str | None = None) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"gpu.index": str(index), "gpuprobe.device": device, **({"reason": reason} if reason else {})}
    return metric, tuple(sorted(labels.items()))


def _wait(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _start(**settings: Any) -> None:
    reset(collect_interval=0.05, nvml=True, **settings)


def _expected(gpu: SimGpu, index: int, device: str) -> dict[Any, float]:
    """The gauges of one simulated GPU, converted by hand from NVML's units (%, bytes, MHz, mW, °C)."""
    out = {
        _key("gpuprobe.gpu.utilization", index, device): gpu.utilization / 100,
        _key("gpuprobe.gpu.memory.used", index, device): gpu.memory_used,
        _key("gpuprobe.gpu.memory.total", index, device): gpu.memory_total,
        _key("gpuprobe.gpu.clock.sm", index, device): gpu.sm_clock_mhz * 1_000_000,
        _key("gpuprobe.gpu.power", index, device): gpu.power_mw / 1000,
        _key("gpuprobe.gpu.power.limit", index, device): gpu.power_limit_mw / 1000,
        _key("gpuprobe.gpu.temperature", index, device): gpu.temperature_c,
    }
    names = {"gpu_idle": "GpuIdle", "applications_clocks": "ApplicationsClocksSetting", "sw_power_cap": "SwPowerCap",
             "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost", "sw_thermal": "SwThermalSlowdown",
             "hw_thermal": "HwThermalSlowdown", "hw_power_brake": "HwPowerBrakeSlowdown",
             "display_clocks": "DisplayClockSetting"}
    for reason, suffix in names.items():
        bit = getattr(pynvml, "nvmlClocksEventReason" + suffix)
        out[_key("gpuprobe.gpu.throttle", index, device, reason)] = 1.0 if gpu.clocks_event_reasons & bit else 0.0
    return out


# -- the stand-in cannot drift from nvidia-ml-py ---------------------------------------------------

def test_stand_in_functions_have_nvidia_ml_py_names_and_parameters() -> None:
    sim = SimulatedNvml().module
    for name in FUNCTIONS:
        real = getattr(pynvml, name, None)
        assert real is not None, f"nvidia-ml-py has no {name}"
        assert list(inspect.signature(getattr(sim, name)).parameters) == list(inspect.signature(real).parameters), name


def test_stand_in_constants_and_error_classes_are_nvidia_ml_py_s() -> None:
    sim = SimulatedNvml().module
    constants = [n for n in vars(sim) if n.startswith(("NVML_", "nvmlClocks"))]
    assert len(constants) > 30
    assert {n: getattr(sim, n) for n in constants} == {n: getattr(pynvml, n) for n in constants}
    errors = [n for n in vars(sim) if n.startswith("NVMLError_")]
    assert "NVMLError_NotSupported" in errors and len(errors) >= 18
    for name in errors:
        real = getattr(pynvml, name)
        assert issubclass(real, pynvml.NVMLError)
        assert type(sim.NVMLError(real(0).value)).__name__ == name  # the same code maps to the same class
        assert str(sim.NVMLError(real(0).value)) == str(real(0))


def test_stand_in_gpm_structures_have_nvidia_ml_py_s_fields() -> None:
    sim = SimulatedNvml().module
    for name in ("c_nvmlGpmMetricsGet_t", "c_nvmlGpmMetric_t"):
        real_fields = [f[0] for f in getattr(pynvml, name)._fields_]
        assert list(vars(getattr(sim, name)()).keys()) == real_fields, name


def test_the_gpm_request_fits_nvidia_ml_py_s_ctypes_structure() -> None:
    earlier, later = pynvml.c_nvmlGpmSample_t(), pynvml.c_nvmlGpmSample_t()  # null samples: no GPU here
    request = _nvml.gpm_request(pynvml, earlier, later)
    assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION and request.numMetrics == 2
    assert [request.metrics[k].metricId for k in range(2)] == [pynvml.NVML_GPM_METRIC_SM_UTIL,
                                                              pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL]


# -- the gauges are what NVML answers --------------------------------------------------------------

def test_gauges_equal_what_nvml_answers_for_every_gpu(nvml: SimulatedNvml) -> None:
    _start()
    want = {}
    for i, gpu in enumerate(nvml.gpus):
        want.update(_expected(gpu, i, f"cuda:{i}"))
    _wait(lambda: len(_points()) >= len(want), "every gauge")
    assert _points() == pytest.approx(want)


def test_gauges_follow_new_readings(nvml: SimulatedNvml) -> None:
    _start()
    util = _key("gpuprobe.gpu.utilization", 0, "cuda:0")
    _wait(lambda: _points().get(util) == pytest.approx(0.37), "the first reading")
    nvml.gpus[0].utilization = 5
    nvml.gpus[0].clocks_event_reasons = REASON_BITS["GpuIdle"]
    _wait(lambda: _points().get(util) == pytest.approx(0.05), "the new reading")
    _wait(lambda: _points().get(_key("gpuprobe.gpu.throttle", 0, "cuda:0", "gpu_idle")) == 1.0, "the idle bit")
    assert _points()[_key("gpuprobe.gpu.throttle", 0, "cuda:0", "sw_power_cap")] == 0.0


def test_in_memory_exporter_sees_every_sample(nvml: SimulatedNvml) -> None:
    with InMemoryExporter() as exp:
        _start()
        _wait(lambda: len(exp.values("gpuprobe.gpu.power", gpu_index="1")) >= 2, "two samples")
        assert set(exp.values("gpuprobe.gpu.power", gpu_index="1")) == {650.0}
        (obs, *_) = exp.observations("gpuprobe.gpu.temperature", gpu_index="0")
        assert obs.attrs == {"gpu.index": "0", "gpuprobe.device": "cuda:0"} and obs.value == 61


def test_prometheus_endpoint_serves_the_gauges(nvml: SimulatedNvml) -> None:
    _start()
    server = gpuprobe.serve(port=0)
    try:
        def power() -> list[Any]:
            return [s for s in scrape(server.url).get("gpuprobe_gpu_power_watts", [])
                    if s.labels["gpu_index"] == "1"]
        (sample,) = _wait(power, "gpuprobe_gpu_power_watts on /metrics")
        assert sample.value == 650.0
        assert sample.labels == {"gpu_index": "1", "gpuprobe_device": "cuda:1", "gpuprobe_rank": "0"}
        samples = scrape(server.url)
        (temp,) = [s for s in samples["gpuprobe_gpu_temperature_celsius"] if s.labels["gpu_index"] == "0"]
        (clock,) = [s for s in samples["gpuprobe_gpu_clock_sm_hertz"] if s.labels["gpu_index"] == "0"]
        (used,) = [s for s in samples["gpuprobe_gpu_memory_used_bytes"] if s.labels["gpu_index"] == "1"]
        hot = {s.labels["reason"] for s in samples["gpuprobe_gpu_throttle_ratio"]
               if s.labels["gpu_index"] == "0" and s.value == 1}
        assert (temp.value, clock.value, used.value) == (61, 1.41e9, 70 * GIB)
        assert hot == {"sw_power_cap", "hw_thermal"}
    finally:
        server.close()


def test_otlp_push_carries_the_gauges(nvml: SimulatedNvml) -> None:
    from gpuprobe.exporters.otlp import OtlpExporter
    from test_otlp import Receiver, attrs

    receiver = Receiver()
    try:
        _start()
        _wait(lambda: _key("gpuprobe.gpu.power", 0, "cuda:0") in _points(), "a sample")
        exp = OtlpExporter(receiver.url, interval=60).attach()
        assert exp.push() is True
        metrics = receiver.metrics()
        power, _ = metrics["gpuprobe.gpu.power"]
        assert power.unit == "W"
        by_gpu = {attrs(p.attributes)["gpu.index"]: (p.as_double, attrs(p.attributes)) for p in power.gauge.data_points}
        assert by_gpu["0"][0] == 123.456 and by_gpu["2"][0] == 70.0
        assert by_gpu["0"][1] == {"gpu.index": "0", "gpuprobe.device": "cuda:0", "gpuprobe.rank": "0"}
        temp, _ = metrics["gpuprobe.gpu.temperature"]
        assert temp.unit == "Cel"
        exp.close()
    finally:
        receiver.close()


def test_gpm_sm_and_tensor_activity_where_the_gpu_has_gpm(nvml: SimulatedNvml) -> None:
    nvml.gpus[1].gpm, nvml.gpus[1].sm_activity, nvml.gpus[1].tensor_activity = True, 62.5, 40.0
    _start()
    sm, tensor = _key("gpuprobe.gpu.sm.activity", 1, "cuda:1"), _key("gpuprobe.gpu.tensor.activity", 1, "cuda:1")
    _wait(lambda: sm in _points(), "GPM activity (two samples)")
    assert (_points()[sm], _points()[tensor]) == (0.625, 0.4)
    nvml.gpus[1].sm_activity = 12.0
    _wait(lambda: _points().get(sm) == pytest.approx(0.12), "the next interval's activity")
    assert not [k for k in _points() if k[0] == "gpuprobe.gpu.sm.activity" and ("gpu.index", "1") not in k[1]]
    off = {(o["gpu.index"], o["reading"]): o["why"] for o in gpuprobe.info()["gpu_health"]["off"]}
    assert off == {(0, "gpm"): "not supported", (2, "gpm"): "not supported"}
    reset()
    assert nvml.gpm_samples and all(sample.freed for sample in nvml.gpm_samples)


# -- which device is which -----------------------------------------------------------------------------

@pytest.mark.parametrize(("visible", "want"), [
    ("2,0", [("cuda:0", 2), ("cuda:1", 0)]),
    (f"{UUID_B[:12]}", [("cuda:0", 1)]),
    ("GPU-1a2b3c4d,1", [("cuda:0", 0), ("cuda:1", 1)]),
    (f"{MIG_B}", [("cuda:0", 1)]),
    ("1,7,0", [("cuda:0", 1)]),          # an index past the GPUs ends the list, as in CUDA
    ("GPU-9f,0", []),                    # ambiguous prefix (two UUIDs start with 9f): CUDA stops there too
    ("0,0", [("cuda:0", 0)]),            # a repeated device ends the list
    ("", []),
    ("-1", []),
])
def test_cuda_visible_devices_maps_to_nvml_indices(nvml: SimulatedNvml, visible: str, want: list) -> None:
    nvml.module.nvmlInit()
    devices, source = _nvml.map_devices(nvml.module, {"CUDA_VISIBLE_DEVICES": visible})
    assert [(d.cuda, d.index) for d in devices] == want
    assert source == "CUDA_VISIBLE_DEVICES"


def test_without_cuda_visible_devices_every_gpu_in_nvml_order(nvml: SimulatedNvml) -> None:
    nvml.module.nvmlInit()
    devices, source = _nvml.map_devices(nvml.module, {})
    assert [(d.cuda, d.index, d.uuid) for d in devices] == [("cuda:0", 0, UUID_A), ("cuda:1", 1, UUID_B),
                                                            ("cuda:2", 2, UUID_C)]
    assert source == "all"


def test_torch_devices_match_by_uuid_then_pci_bus_id(nvml: SimulatedNvml) -> None:
    nvml.module.nvmlInit()
    torch_devices = [(UUID_C.removeprefix("GPU-"), None), ("", (0, 0x19, 0)), (MIG_B, None)]
    devices, source = _nvml.map_devices(nvml.module, {"CUDA_VISIBLE_DEVICES": "0"}, torch_devices)
    assert [(d.cuda, d.index, d.mig) for d in devices] == [("cuda:0", 2, None), ("cuda:1", 0, None),
                                                           ("cuda:2", 1, MIG_B)]
    assert source == "torch"


def test_gauges_carry_the_cuda_ordinal_under_cuda_visible_devices(nvml: SimulatedNvml,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUID_C},{UUID_A[:10]}")
    _start()
    power = lambda: {k: v for k, v in _points().items() if k[0] == "gpuprobe.gpu.power"}  # noqa: E731
    _wait(lambda: len(power()) == 2, "both devices")
    got = power()
    assert got == {_key("gpuprobe.gpu.power", 2, "cuda:0"): 70.0, _key("gpuprobe.gpu.power", 0, "cuda:1"): 123.456}
    assert [d["gpu.index"] for d in gpuprobe.info()["gpu_health"]["devices"]] == [2, 0]


def test_once_torch_initializes_cuda_its_device_uuids_decide(nvml: SimulatedNvml, simcuda: Any) -> None:
    import torch

    simcuda(2)  # simulated CUDA devices with UUIDs 00000000-0000-0000-0000-00000000000N, not initialized
    nvml.gpus[0].uuid = "GPU-00000000-0000-0000-0000-000000000001"
    nvml.gpus[2].uuid = "GPU-00000000-0000-0000-0000-000000000000"
    _start()
    _wait(lambda: gpuprobe.info()["gpu_health"]["devices"], "the devices")
    assert gpuprobe.info()["gpu_health"]["detail"].endswith("(all)")
    assert not torch.cuda.is_initialized()  # gpuprobe read NVML only
    torch.cuda.init()  # the program initializes CUDA
    _wait(lambda: gpuprobe.info()["gpu_health"]["detail"].endswith("(torch)"), "the mapping from torch")
    assert [(d["gpuprobe.device"], d["gpu.index"]) for d in gpuprobe.info()["gpu_health"]["devices"]] == [
        ("cuda:0", 2), ("cuda:1", 0)]
    _wait(lambda: _key("gpuprobe.gpu.power", 2, "cuda:0") in _points(), "the gauges under torch's ordinals")
    assert _key("gpuprobe.gpu.power", 1, "cuda:1") not in _points()  # the earlier series went away


def test_torch_devices_nvml_does_not_list_leave_the_variable_s_mapping(nvml: SimulatedNvml, simcuda: Any) -> None:
    import torch

    simcuda(2)  # its UUIDs and PCI bus ids match none of the simulated NVML's GPUs
    nvml.gpus[0].pci_bus_id = "00000000:77:00.0"
    torch.cuda.init()
    _start()
    _wait(lambda: "matched no NVML device" in gpuprobe.info()["gpu_health"]["detail"], "the failed match")
    assert [d["gpu.index"] for d in gpuprobe.info()["gpu_health"]["devices"]] == [0, 1, 2]
    _wait(lambda: _key("gpuprobe.gpu.power", 2, "cuda:2") in _points(), "gauges by the variable's mapping")


def test_sampling_never_initializes_cuda(nvml: SimulatedNvml, simcuda: Any) -> None:
    import torch

    simcuda(2)
    _start()
    _wait(lambda: len(_points()) > 10, "samples")
    gpuprobe.info()
    assert not torch.cuda.is_initialized()


# -- failures ---------------------------------------------------------------------------------------

def test_a_failing_reading_warns_once_and_the_others_go_on(nvml: SimulatedNvml) -> None:
    nvml.gpus[1].failing["nvmlDeviceGetPowerUsage"] = "NVML_ERROR_GPU_IS_LOST"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _start()
        util = _key("gpuprobe.gpu.utilization", 1, "cuda:1")
        _wait(lambda: util in _points(), "the first sample")
        nvml.gpus[1].utilization = 11
        _wait(lambda: _points().get(util) == pytest.approx(0.11), "a later sample")
    ours = [str(w.message) for w in caught if "GPU health" in str(w.message)]
    assert len(ours) == 1 and "nvmlDeviceGetPowerUsage" in ours[0] and "GPU 1" in ours[0]
    points = _points()
    assert _key("gpuprobe.gpu.power", 1, "cuda:1") not in points
    assert points[_key("gpuprobe.gpu.power", 0, "cuda:0")] == 123.456  # the same reading on another GPU
    assert points[_key("gpuprobe.gpu.temperature", 1, "cuda:1")] == 75  # another reading of the same GPU
    asked = [f for f, _ in nvml.calls if f == "nvmlDeviceGetPowerUsage"]
    (off,) = [o for o in gpuprobe.info()["gpu_health"]["off"] if o["why"] != "not supported"]
    assert off["gpu.index"] == 1 and off["reading"] == "power" and "GpuIsLost" in off["why"]
    time.sleep(0.2)
    assert len([f for f, _ in nvml.calls if f == "nvmlDeviceGetPowerUsage"]) > len(asked)  # still read on GPUs 0, 2
    assert gpuprobe.info()["gpu_health"]["on"] is True


def test_a_reading_that_fails_later_leaves_the_exports(nvml: SimulatedNvml) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _start()
        temp = _key("gpuprobe.gpu.temperature", 0, "cuda:0")
        _wait(lambda: temp in _points(), "the first sample")
        nvml.gpus[0].failing["nvmlDeviceGetTemperature"] = "NVML_ERROR_UNKNOWN"
        _wait(lambda: temp not in _points(), "the stale gauge to go")


def test_not_supported_readings_are_absent_without_a_warning(nvml: SimulatedNvml) -> None:
    nvml.gpus[2].not_supported |= {"nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetCurrentClocksEventReasons"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _start()
        _wait(lambda: _key("gpuprobe.gpu.power", 2, "cuda:2") in _points(), "a sample")
        time.sleep(0.15)
    assert not [w for w in caught if "gpuprobe" in str(w.message)]
    points = _points()
    assert _key("gpuprobe.gpu.power.limit", 2, "cuda:2") not in points
    assert not [k for k in points if k[0] == "gpuprobe.gpu.throttle" and ("gpu.index", "2") in k[1]]
    assert points[_key("gpuprobe.gpu.power.limit", 0, "cuda:0")] == 700.0
    off = {(o["gpu.index"], o["reading"]): o["why"] for o in gpuprobe.info()["gpu_health"]["off"]}
    gpm = {(i, "gpm"): "not supported" for i in range(3)}  # no simulated GPU here has GPM
    assert off == {(2, "power.limit"): "not supported", (2, "throttle"): "not supported", **gpm}


def test_nvml_that_cannot_start_turns_the_gauges_off_with_one_warning() -> None:
    sim = SimulatedNvml(_gpus(), init_error="NVML_ERROR_DRIVER_NOT_LOADED")
    with sim.install(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _start()
        _wait(lambda: gpuprobe.info()["gpu_health"]["state"] == "fail", "the failed start")
        time.sleep(0.15)
        health = gpuprobe.info()["gpu_health"]
        assert describe_state() == ("fail", "NVMLError_DriverNotLoaded")
        reset()
    assert health["on"] is False and "DriverNotLoaded" in health["detail"]
    assert len([w for w in caught if "GPU health gauges are off" in str(w.message)]) == 1
    assert [f for f, _ in sim.calls].count("nvmlInitWithFlags") == 2  # the sampler's once, describe()'s once


def describe_state() -> tuple[str, str]:
    found = _nvml.describe()
    return found["state"], found["detail"].split(":")[0].strip()


def test_missing_nvidia_ml_py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _start()
        _wait(lambda: gpuprobe.info()["gpu_health"]["state"] == "fail", "the failed start")
    assert any("gpuprobe[nvml]" in str(w.message) for w in caught)
    assert _nvml.describe() == {"state": "off",
                                "detail": "nvidia-ml-py not installed (pip install 'gpuprobe[nvml]')"}
    with pytest.raises(gpuprobe.MissingDependencyError, match=r"gpuprobe\[nvml\]"):
        _nvml.load()


def test_describe_reports_devices_driver_and_nvml_version(nvml: SimulatedNvml) -> None:
    assert _nvml.describe() == {"state": "ok", "detail": "3 devices, driver 580.65.06, NVML 13.580.65"}
    assert nvml.initialized == 0  # shut down again


def test_describe_on_this_machine_says_why_nvml_is_not_there() -> None:
    found = _nvml.describe()
    assert found["state"] in ("ok", "fail")
    assert found["detail"] and not found["detail"].startswith(found["state"])  # the state is not repeated


def test_older_bindings_read_the_clocks_throttle_reasons(nvml: SimulatedNvml,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(nvml.module, "nvmlDeviceGetCurrentClocksEventReasons")
    _start()
    _wait(lambda: _points().get(_key("gpuprobe.gpu.throttle", 0, "cuda:0", "hw_thermal")) == 1.0, "throttle")
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in {f for f, _ in nvml.calls}


# -- where and when it runs -------------------------------------------------------------------------

def test_off_by_default_and_nvml_never_imported() -> None:
    code = ("import sys, gpuprobe\n"
            "with gpuprobe.probe('x'): pass\n"
            "names = [m.spec.name for m in gpuprobe.collect()]\n"
            "info = gpuprobe.info()['gpu_health']\n"
            "print(__import__('json').dumps([('pynvml' in sys.modules), [n for n in names if '.gpu.' in n], info]))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    imported, gauges, info = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported is False and gauges == []
    assert info["on"] is False and info["state"] == "off"


def test_turning_it_off_removes_the_gauges_and_shuts_nvml_down(nvml: SimulatedNvml) -> None:
    _start()
    _wait(lambda: len(_points()) > 10, "samples")
    gpuprobe.configure(nvml=False)
    assert _points() == {}
    assert nvml.initialized == 0
    assert gpuprobe.info()["gpu_health"]["on"] is False


def test_a_hanging_nvml_call_never_holds_up_info_or_configure(nvml: SimulatedNvml) -> None:
    _start()
    _wait(lambda: len(_points()) > 10, "samples")
    nvml.gpus[2].slow["nvmlDeviceGetPowerUsage"] = 3.0
    def stuck() -> bool:  # a call is recorded as it starts: while it hangs, nothing follows it
        n = len(nvml.calls)
        time.sleep(0.3)
        return len(nvml.calls) == n and nvml.calls[-1] == ("nvmlDeviceGetPowerUsage", "gpuprobe-background")

    _wait(stuck, "a round stuck in NVML")
    t0 = time.monotonic()
    assert gpuprobe.info()["gpu_health"]["on"] is True
    info_s = time.monotonic() - t0
    gpuprobe.configure(nvml=False)
    configure_s = time.monotonic() - t0
    assert info_s < 0.5 and configure_s < 2.0, (info_s, configure_s)
    _wait(lambda: nvml.initialized == 0, "the stuck round to shut NVML down", timeout=10)
    assert _points() == {}


def test_the_environment_turns_it_on() -> None:
    assert gpuprobe.config.load({"GPUPROBE_NVML": "1"}).nvml is True
    assert gpuprobe.config.load({}).nvml is False
    with pytest.raises(gpuprobe.ConfigError, match="GPUPROBE_NVML"):
        gpuprobe.config.load({"GPUPROBE_NVML": "maybe"})


def test_nvml_is_only_called_from_the_background_thread(nvml: SimulatedNvml) -> None:
    _start()
    server = gpuprobe.serve(port=0)
    try:
        _wait(lambda: "gpuprobe_gpu_power_watts" in scrape(server.url), "the gauges on /metrics")
        gpuprobe.collect()
        gpuprobe.info()
        with gpuprobe.probe("user work"):
            pass
    finally:
        server.close()
    reset()  # closing shuts NVML down: from this thread, the only call allowed here
    assert {t for f, t in nvml.calls if f != "nvmlShutdown"} == {"gpuprobe-background"}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_without_the_parent_s_nvml_and_can_start_its_own(nvml: SimulatedNvml) -> None:
    _start()
    _wait(lambda: len(_points()) > 10, "samples in the parent")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        try:
            before = len(nvml.calls)
            state = gpuprobe.info()["gpu_health"]["state"]
            time.sleep(0.3)
            untouched = len(nvml.calls) == before  # nothing of the parent's sampler runs here
            empty = _points() == {}
            gpuprobe.configure(nvml=True)
            _wait(lambda: _key("gpuprobe.gpu.power", 1, "cuda:1") in _points(), "samples in the child", 5)
            inits = [f for f, _ in nvml.calls[before:]].count("nvmlInitWithFlags")
            result = {"state": state, "untouched": untouched, "empty": empty, "inits": inits,
                      "power": _points()[_key("gpuprobe.gpu.power", 1, "cuda:1")]}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result = {"error": repr(exc)}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        result = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    assert result == {"state": "off", "untouched": True, "empty": True, "inits": 1, "power": 650.0}
    _wait(lambda: len(_points()) > 10, "the parent still sampling")
