"""A simulated NVML for machines without a GPU: a stand-in for nvidia-ml-py's ``pynvml`` module.

:class:`SimulatedNvml` builds a module with the names of nvidia-ml-py that gpuprobe's GPU health gauges
use — functions with the real ones' signatures, the ``NVML_*`` constants, the clocks-event reason
bits and the ``NVMLError`` classes (one subclass per error code, built the way nvidia-ml-py builds
them, so ``NVMLError(NVML_ERROR_NOT_SUPPORTED)`` is an ``NVMLError_NotSupported``). While
:meth:`SimulatedNvml.install` is entered, ``import pynvml`` gives that module.

Each simulated GPU (:class:`SimGpu`) has a UUID, a PCI bus id, optional MIG devices and readings that
a test changes between samples. A reading can answer "not supported" (``not_supported``: names of
NVML functions) or fail with any NVML error (``failing``: function name → error code), per device.
Every call is recorded with the name of the thread that made it (:attr:`SimulatedNvml.calls`).

GPU performance monitoring (GPM) is simulated for SM and "any tensor" utilization: samples are
allocated, filled in order and freed, and ``nvmlGpmMetricsGet`` answers the values the GPU held when
the later sample was taken (a real GPU averages over the interval).

What it does not simulate: NVML's own reference counting across ``nvmlInit``/``nvmlShutdown`` beyond
a count, events, accounting, NVLink, other GPM metrics, MIG GPM samples, vGPU, and readings of MIG
device handles (they answer "not supported", as MIG instances do for utilization).

A test (tests/test_nvml.py) checks that every name here exists in the installed nvidia-ml-py with the
same parameters, so the stand-in cannot drift from the real module.

Example:
    >>> from gpuprobe.testing.simnvml import SimGpu, SimulatedNvml
    >>> sim = SimulatedNvml([SimGpu(utilization=37)])
    >>> with sim.install():
    ...     import pynvml
    ...     pynvml.nvmlInit()
    ...     handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ...     pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    37
"""

from __future__ import annotations

import contextlib
import dataclasses
import string
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["SimGpu", "SimulatedNvml", "ERROR_CODES", "REASON_BITS", "FUNCTIONS"]

# nvidia-ml-py's NVML_ERROR_* codes (nvml.h); the class names derive from them as nvidia-ml-py derives them.
ERROR_CODES: dict[str, int] = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_ALREADY_INITIALIZED": 5,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_OPERATING_SYSTEM": 17,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_UNKNOWN": 999,
}

# What str() of each error says (nvidia-ml-py's NVMLError._errcode_to_string).
_MESSAGES: dict[int, str] = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
    5: "Already Initialized", 6: "Not Found", 7: "Insufficient Size", 8: "Insufficient External Power",
    9: "Driver Not Loaded", 10: "Timeout", 11: "Interrupt Request Issue", 12: "NVML Shared Library Not Found",
    13: "Function Not Found", 14: "Corrupted infoROM", 15: "GPU is lost", 16: "GPU requires restart",
    17: "The operating system has blocked the request.", 18: "RM has detected an NVML/RM version mismatch.",
    999: "Unknown Error",
}

_CONSTANTS: dict[str, int] = {
    "NVML_SUCCESS": 0,
    "NVML_CLOCK_GRAPHICS": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_DEVICE_MIG_DISABLE": 0,
    "NVML_DEVICE_MIG_ENABLE": 1,
    # GPU performance monitoring (GPM, Hopper and later).
    "NVML_GPM_SUPPORT_VERSION": 1,
    "NVML_GPM_METRICS_GET_VERSION": 1,
    "NVML_GPM_METRIC_SM_UTIL": 2,
    "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
    "NVML_GPM_METRIC_MAX": 477,
}

# Clocks-event reasons (nvml.h; "clocks throttle reasons" before NVML 12.2): bits of
# nvmlDeviceGetCurrentClocksEventReasons. nvidia-ml-py offers each under both names.
REASON_BITS: dict[str, int] = {
    "None": 0x0,
    "GpuIdle": 0x1,
    "ApplicationsClocksSetting": 0x2,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SyncBoost": 0x10,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
    "DisplayClockSetting": 0x100,
}
for _suffix, _bit in REASON_BITS.items():
    _CONSTANTS["nvmlClocksEventReason" + _suffix] = _bit
    _CONSTANTS["nvmlClocksThrottleReason" + _suffix] = _bit

FUNCTIONS: tuple[str, ...] = (
    "nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
    "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetIndex",
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo", "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceIsMigDeviceHandle", "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree",
    "nvmlGpmSampleGet", "nvmlGpmMetricsGet",
)
"""The nvidia-ml-py functions the stand-in has (a test checks their parameters against the real module)."""


def _class_name(code_name: str) -> str:
    # nvidia-ml-py's rule (_extractNVMLErrorsAsClasses): NVML_ERROR_NOT_SUPPORTED → NVMLError_NotSupported.
    return "NVMLError_" + string.capwords(code_name.replace("NVML_ERROR_", ""), "_").replace("_", "")


@dataclasses.dataclass
class SimGpu:
    """One simulated GPU: identity and readings in NVML's own units (percent, bytes, MHz, mW, °C).

    Attributes:
        gpm: GPU performance monitoring is supported (``nvmlGpmQueryDeviceSupport``).
        sm_activity: GPM's SM utilization in percent between two samples (the value when the later one
            was taken).
        tensor_activity: GPM's "any tensor" utilization in percent, likewise.
        not_supported: NVML function names that answer ``NVMLError_NotSupported`` on this GPU.
        failing: NVML function name → error code (a key of :data:`ERROR_CODES` or a number) to raise.
        slow: NVML function name → seconds it takes on this GPU (a GPU falling off the bus can make
            NVML calls hang).
        mig: UUIDs of MIG devices on this GPU (MIG mode is enabled when there are any).
    """

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci_bus_id: str = "00000000:01:00.0"
    name: str = "NVIDIA H100 80GB HBM3"
    utilization: int = 0
    memory_used: int = 0
    memory_total: int = 80 * 2**30
    sm_clock_mhz: int = 1980
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    temperature_c: int = 35
    clocks_event_reasons: int = 0
    gpm: bool = False
    sm_activity: float = 0.0
    tensor_activity: float = 0.0
    mig: tuple[str, ...] = ()
    not_supported: set[str] = dataclasses.field(default_factory=set)
    failing: dict[str, Any] = dataclasses.field(default_factory=dict)
    slow: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None  # a MIG device's position on its GPU


class _Struct:
    """A reading with named fields, as nvidia-ml-py's ctypes structures offer them."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"


class _GpmSample:
    """A GPM sample buffer (``nvmlGpmSampleAlloc``); ``nvmlGpmSampleGet`` fills it."""

    def __init__(self) -> None:
        self.gpu: int | None = None
        self.serial = 0
        self.values: dict[int, float] = {}
        self.freed = False


class c_nvmlGpmMetric_t:  # noqa: N801 - nvidia-ml-py's name
    """One metric of a ``nvmlGpmMetricsGet`` request (the fields of nvidia-ml-py's structure)."""

    def __init__(self) -> None:
        self.metricId = 0  # noqa: N815
        self.nvmlReturn = 0  # noqa: N815
        self.value = 0.0
        self.metricInfo = None  # noqa: N815


class c_nvmlGpmMetricsGet_t:  # noqa: N801 - nvidia-ml-py's name
    """A ``nvmlGpmMetricsGet`` request: two samples and up to ``NVML_GPM_METRIC_MAX`` metrics."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0  # noqa: N815
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [c_nvmlGpmMetric_t() for _ in range(_CONSTANTS["NVML_GPM_METRIC_MAX"])]


class SimulatedNvml:
    """A stand-in for ``pynvml`` over simulated GPUs (see the module docstring).

    Args:
        gpus: the GPUs, in NVML's index order (PCI bus order on a real machine).
        driver: what ``nvmlSystemGetDriverVersion`` answers.
        nvml_version: what ``nvmlSystemGetNVMLVersion`` answers.
        init_error: an error code ``nvmlInit`` raises (e.g. ``"NVML_ERROR_DRIVER_NOT_LOADED"``), or None.
    """

    def __init__(self, gpus: Sequence[SimGpu] = (), *, driver: str = "580.65.06", nvml_version: str = "13.580.65",
                 init_error: str | int | None = None) -> None:
        self.gpus = list(gpus) if gpus else [SimGpu()]
        self.driver = driver
        self.nvml_version = nvml_version
        self.init_error = init_error
        self.initialized = 0
        self.calls: list[tuple[str, str]] = []  # (function, thread name)
        self._lock = threading.Lock()
        self.module = self._build()

    # -- the module ---------------------------------------------------------------------------
    def _build(self) -> types.ModuleType:
        mod = types.ModuleType("pynvml", "gpuprobe.testing.simnvml: a simulated NVML")
        for name, value in {**ERROR_CODES, **_CONSTANTS}.items():
            setattr(mod, name, value)
        mapping: dict[int, type] = {}

        class NVMLError(Exception):
            def __new__(cls, value: int) -> NVMLError:
                if cls is NVMLError:
                    cls = mapping.get(value, cls)
                obj = Exception.__new__(cls)
                obj.value = value  # type: ignore[attr-defined]
                return obj

            def __init__(self, value: int) -> None:
                super().__init__(value)

            def __str__(self) -> str:
                return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")  # type: ignore[attr-defined]

        NVMLError.__module__ = "pynvml"
        mod.NVMLError = NVMLError  # type: ignore[attr-defined]
        for code_name, code in ERROR_CODES.items():
            cls = type(_class_name(code_name), (NVMLError,),
                       {"__new__": (lambda v: lambda typ, *args: NVMLError.__new__(typ, v))(code)})
            cls.__module__ = "pynvml"
            mapping[code] = cls
            setattr(mod, cls.__name__, cls)
        for name in FUNCTIONS:
            setattr(mod, name, getattr(self, "_" + name))
        mod.c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t  # type: ignore[attr-defined]
        mod.c_nvmlGpmMetric_t = c_nvmlGpmMetric_t  # type: ignore[attr-defined]
        self.gpm_samples: list[_GpmSample] = []
        return mod

    @contextlib.contextmanager
    def install(self) -> Iterator[SimulatedNvml]:
        """While entered, ``import pynvml`` gives the simulated module; the real one (if any) comes back after."""
        saved = sys.modules.get("pynvml")
        sys.modules["pynvml"] = self.module
        try:
            yield self
        finally:
            if saved is None:
                sys.modules.pop("pynvml", None)
            else:
                sys.modules["pynvml"] = saved

    def error(self, code: str | int) -> Exception:
        """The ``NVMLError`` subclass instance for ``code`` (a name of :data:`ERROR_CODES` or a number)."""
        value = ERROR_CODES[code] if isinstance(code, str) else code
        return self.module.NVMLError(value)  # type: ignore[no-any-return]

    def threads(self) -> set[str]:
        """Names of the threads that called into the simulated NVML."""
        with self._lock:
            return {thread for _, thread in self.calls}

    # -- helpers --------------------------------------------------------------------------------
    def _enter(self, function: str, handle: Any = None, *, needs_init: bool = True) -> SimGpu | None:
        with self._lock:
            self.calls.append((function, threading.current_thread().name))
        if needs_init and not self.initialized:
            raise self.error("NVML_ERROR_UNINITIALIZED")
        if handle is None:
            return None
        if not isinstance(handle, _Handle) or not 0 <= handle.gpu < len(self.gpus):
            raise self.error("NVML_ERROR_INVALID_ARGUMENT")
        gpu = self.gpus[handle.gpu]
        if function in gpu.slow:
            time.sleep(gpu.slow[function])
        if function in gpu.failing:
            raise self.error(gpu.failing[function])
        if function in gpu.not_supported:
            raise self.error("NVML_ERROR_NOT_SUPPORTED")
        return gpu

    def _reading(self, function: str, handle: Any) -> SimGpu:
        gpu = self._enter(function, handle)
        assert gpu is not None
        if handle.mig is not None:
            raise self.error("NVML_ERROR_NOT_SUPPORTED")
        return gpu

    # -- nvidia-ml-py's functions (parameter names as nvidia-ml-py spells them) -------------------
    def _nvmlInit(self) -> None:
        self._nvmlInitWithFlags(0)

    def _nvmlInitWithFlags(self, flags: int) -> None:
        self._enter("nvmlInitWithFlags", needs_init=False)
        if self.init_error is not None:
            raise self.error(self.init_error)
        self.initialized += 1

    def _nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def _nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def _nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def _nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise self.error("NVML_ERROR_INVALID_ARGUMENT")
        return _Handle(index)

    def _nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        self._enter("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == text:
                return _Handle(i)
            if text in gpu.mig:
                return _Handle(i, gpu.mig.index(text))
        raise self.error("NVML_ERROR_NOT_FOUND")

    def _nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return int(handle.gpu)

    def _nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._enter("nvmlDeviceGetUUID", handle)
        assert gpu is not None
        return gpu.uuid if handle.mig is None else gpu.mig[handle.mig]

    def _nvmlDeviceGetName(self, handle: Any) -> str:
        gpu = self._enter("nvmlDeviceGetName", handle)
        assert gpu is not None
        return gpu.name

    def _nvmlDeviceGetPciInfo(self, handle: Any) -> _Struct:
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)
        assert gpu is not None
        domain, bus, rest = gpu.pci_bus_id.split(":")
        # busId is a char array in nvidia-ml-py's structure: bytes.
        return _Struct(busId=gpu.pci_bus_id.encode(), domain=int(domain, 16), bus=int(bus, 16),
                       device=int(rest.split(".")[0], 16))

    def _nvmlDeviceGetUtilizationRates(self, handle: Any) -> _Struct:
        gpu = self._reading("nvmlDeviceGetUtilizationRates", handle)
        return _Struct(gpu=gpu.utilization, memory=0)

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> _Struct:
        gpu = self._reading("nvmlDeviceGetMemoryInfo", handle)
        return _Struct(total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used)

    def _nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:  # noqa: A002 - nvidia-ml-py's name
        gpu = self._reading("nvmlDeviceGetClockInfo", handle)
        if type != _CONSTANTS["NVML_CLOCK_SM"]:
            raise self.error("NVML_ERROR_NOT_SUPPORTED")
        return gpu.sm_clock_mhz

    def _nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._reading("nvmlDeviceGetPowerUsage", handle).power_mw

    def _nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._reading("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def _nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._reading("nvmlDeviceGetTemperature", handle)
        if sensor != _CONSTANTS["NVML_TEMPERATURE_GPU"]:
            raise self.error("NVML_ERROR_INVALID_ARGUMENT")
        return gpu.temperature_c

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._reading("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_event_reasons

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._reading("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clocks_event_reasons

    def _nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._enter("nvmlDeviceGetMigMode", device)
        assert gpu is not None
        mode = int(bool(gpu.mig))
        return [mode, mode]  # [current, pending]

    def _nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._enter("nvmlDeviceGetMaxMigDeviceCount", device)
        assert gpu is not None
        return 7 if gpu.mig else 0

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> _Handle:
        gpu = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", device)
        assert gpu is not None
        if not 0 <= index < len(gpu.mig):
            raise self.error("NVML_ERROR_NOT_FOUND")
        return _Handle(device.gpu, index)

    def _nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> _Handle:  # noqa: N803
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        return _Handle(migDevice.gpu)

    def _nvmlDeviceIsMigDeviceHandle(self, device: Any) -> bool:
        self._enter("nvmlDeviceIsMigDeviceHandle", device)
        return device.mig is not None

    def _nvmlGpmQueryDeviceSupport(self, device: Any) -> _Struct:
        gpu = self._enter("nvmlGpmQueryDeviceSupport", device)
        assert gpu is not None
        return _Struct(version=_CONSTANTS["NVML_GPM_SUPPORT_VERSION"], isSupportedDevice=int(gpu.gpm))

    def _nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._enter("nvmlGpmSampleAlloc")
        sample = _GpmSample()
        self.gpm_samples.append(sample)
        return sample

    def _nvmlGpmSampleFree(self, gpmSample: Any) -> None:  # noqa: N803
        self._enter("nvmlGpmSampleFree")
        if not isinstance(gpmSample, _GpmSample) or gpmSample.freed:
            raise self.error("NVML_ERROR_INVALID_ARGUMENT")
        gpmSample.freed = True

    def _nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> _GpmSample:  # noqa: N803
        gpu = self._reading("nvmlGpmSampleGet", device)
        if not gpu.gpm:
            raise self.error("NVML_ERROR_NOT_SUPPORTED")
        if not isinstance(gpmSample, _GpmSample) or gpmSample.freed:
            raise self.error("NVML_ERROR_INVALID_ARGUMENT")
        with self._lock:
            self._serial = getattr(self, "_serial", 0) + 1
            gpmSample.serial = self._serial
        gpmSample.gpu = device.gpu
        gpmSample.values = {_CONSTANTS["NVML_GPM_METRIC_SM_UTIL"]: gpu.sm_activity,
                            _CONSTANTS["NVML_GPM_METRIC_ANY_TENSOR_UTIL"]: gpu.tensor_activity}
        return gpmSample

    def _nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:  # noqa: N803
        self._enter("nvmlGpmMetricsGet")
        one, two = metricsGet.sample1, metricsGet.sample2
        if (metricsGet.version != _CONSTANTS["NVML_GPM_METRICS_GET_VERSION"] or not isinstance(one, _GpmSample)
                or not isinstance(two, _GpmSample) or one.gpu is None or one.gpu != two.gpu
                or not one.serial < two.serial):
            raise self.error("NVML_ERROR_INVALID_ARGUMENT")
        gpu = self.gpus[two.gpu]
        if "nvmlGpmMetricsGet" in gpu.failing:
            raise self.error(gpu.failing["nvmlGpmMetricsGet"])
        for metric in metricsGet.metrics[:metricsGet.numMetrics]:
            if metric.metricId in two.values:
                metric.value, metric.nvmlReturn = two.values[metric.metricId], 0
            else:
                metric.value, metric.nvmlReturn = 0.0, ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"]
        return metricsGet
