"""GPU health gauges from NVML (nvidia-ml-py): utilization, memory, SM clock, power, temperature, throttling,
and SM / tensor-core activity from GPM (GPU performance monitoring) where the GPU has it (Hopper and later).

The one module that imports ``pynvml``. Off unless the ``nvml`` setting is on (``GPUPROBE_NVML=1`` or
``configure(nvml=True)``); importing this module imports nothing of NVML.

- **Where it runs.** :class:`GpuHealth` is an exporter: NVML is initialized and read in its ``tick()``,
  on gpuprobe's background thread every ``collect_interval`` — never on the program's threads.
- **Which devices.** Every CUDA device this process can see, named by its CUDA ordinal
  (``gpuprobe.device="cuda:N"``, the label gpuprobe's step metrics carry) and by NVML's index
  (``gpu.index``). Until the program has initialized CUDA, the devices come from
  ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-<uuid>`` prefixes, ``MIG-<uuid>``) read against NVML; once
  torch has initialized CUDA, from torch's device properties (UUID, then PCI bus id) — gpuprobe never
  calls a ``torch.cuda`` function that would initialize CUDA. A MIG device is read through its GPU.
- **Per series ``gpuprobe.device``.** Every other series carries the process's device as a constant
  label; these gauges carry their own device instead (one process may see several GPUs).
- **Failures.** A reading that answers "not supported" is left out, silently. Any other error turns
  that reading off for that device, with one warning; the other readings go on. If NVML cannot start
  (no driver, no library), the gauges are off with one warning. ``gpuprobe.info()["gpu_health"]`` says
  which readings are off and why; :func:`describe` is what ``gpuprobe doctor`` prints.
- **Fork.** A forked child starts without the parent's exporters (see :mod:`gpuprobe._lifecycle`),
  this one included, and never touches the parent's NVML handles; ``configure()`` in the child starts
  a new sampler that initializes NVML for itself.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ._lifecycle import Owner
from .errors import missing
from .runtime import Runtime

__all__ = ["GpuHealth", "Device", "Slot", "READINGS", "GPM_METRICS", "THROTTLE_REASONS", "gpm_request", "describe",
           "status", "map_devices", "load", "start_from_settings"]

_INSTALL = "pip install 'gpuprobe[nvml]'"

THROTTLE_REASONS: tuple[tuple[str, str], ...] = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal", "SwThermalSlowdown"),
    ("hw_thermal", "HwThermalSlowdown"),
    ("hw_power_brake", "HwPowerBrakeSlowdown"),
    ("display_clocks", "DisplayClockSetting"),
)
"""``reason`` label value → the suffix of NVML's ``nvmlClocksEventReason*`` bit (a fixed set)."""


def load() -> Any:
    """The ``pynvml`` module (nvidia-ml-py), imported here and nowhere else.

    Raises:
        MissingDependencyError: nvidia-ml-py is not installed; the message names the extra.
    """
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise missing("nvidia-ml-py", "nvml") from exc


# -- readings -------------------------------------------------------------------------------------

Values = list[tuple[str, str | None, float]]  # (metric, throttle reason or None, value in the metric's unit)


@dataclasses.dataclass
class Slot:
    """What the readings of one GPU need: its handle, the reason bits, GPM samples kept between rounds."""

    handle: Any
    bits: tuple[tuple[str, int], ...] = ()
    gpm: list[Any] | None = None  # [the earlier sample, the one the next round fills]
    gpm_filled: bool = False

    def release(self, nv: Any) -> None:
        """Free the GPM samples (before NVML shuts down)."""
        for sample in self.gpm or ():
            try:
                nv.nvmlGpmSampleFree(sample)
            except Exception:
                pass
        self.gpm = None


@dataclasses.dataclass(frozen=True)
class Reading:
    """One NVML call per device per sample, and the gauges it sets.

    Attributes:
        name: what ``info()`` calls it (``power``, ``memory``, ...).
        function: the nvidia-ml-py function it calls (what the warning names).
        metrics: the gauges it sets.
        read: ``(pynvml, slot) -> [(metric, reason, value), ...]`` (the slot: the GPU's handle and state).
    """

    name: str
    function: str
    metrics: tuple[str, ...]
    read: Callable[[Any, Slot], Values]


def _utilization(nv: Any, slot: Slot) -> Values:
    return [("gpuprobe.gpu.utilization", None, nv.nvmlDeviceGetUtilizationRates(slot.handle).gpu / 100.0)]


def _memory(nv: Any, slot: Slot) -> Values:
    info = nv.nvmlDeviceGetMemoryInfo(slot.handle)
    return [("gpuprobe.gpu.memory.used", None, float(info.used)),
            ("gpuprobe.gpu.memory.total", None, float(info.total))]


def _sm_clock(nv: Any, slot: Slot) -> Values:
    mhz = nv.nvmlDeviceGetClockInfo(slot.handle, nv.NVML_CLOCK_SM)
    return [("gpuprobe.gpu.clock.sm", None, mhz * 1e6)]


def _power(nv: Any, slot: Slot) -> Values:
    return [("gpuprobe.gpu.power", None, nv.nvmlDeviceGetPowerUsage(slot.handle) / 1000.0)]  # mW → W


def _power_limit(nv: Any, slot: Slot) -> Values:
    return [("gpuprobe.gpu.power.limit", None, nv.nvmlDeviceGetEnforcedPowerLimit(slot.handle) / 1000.0)]  # mW → W


def _temperature(nv: Any, slot: Slot) -> Values:
    celsius = nv.nvmlDeviceGetTemperature(slot.handle, nv.NVML_TEMPERATURE_GPU)
    return [("gpuprobe.gpu.temperature", None, float(celsius))]


def _reasons_function(nv: Any) -> str:
    # NVML 12.2 renamed "clocks throttle reasons" to "clocks event reasons"; older bindings have the old name.
    if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons"):
        return "nvmlDeviceGetCurrentClocksEventReasons"
    return "nvmlDeviceGetCurrentClocksThrottleReasons"


def _throttle(nv: Any, slot: Slot) -> Values:
    mask = int(getattr(nv, _reasons_function(nv))(slot.handle))
    return [("gpuprobe.gpu.throttle", reason, 1.0 if mask & bit else 0.0) for reason, bit in slot.bits]


# GPM metric (nvml.h nvmlGpmMetricId_t) → gauge; GPM values are percentages.
GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("NVML_GPM_METRIC_SM_UTIL", "gpuprobe.gpu.sm.activity"),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "gpuprobe.gpu.tensor.activity"),
)


def _gpm(nv: Any, slot: Slot) -> Values:
    """SM and tensor-core activity between this round's GPM sample and the previous one's (Hopper and later)."""
    if slot.gpm is None:
        if not nv.nvmlGpmQueryDeviceSupport(slot.handle).isSupportedDevice:
            raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        slot.gpm = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
    earlier, later = slot.gpm
    nv.nvmlGpmSampleGet(slot.handle, later)
    slot.gpm.reverse()  # the sample just taken is the next round's earlier one
    if not slot.gpm_filled:
        slot.gpm_filled = True
        return []  # one sample: nothing to compare with yet
    request = nv.nvmlGpmMetricsGet(gpm_request(nv, earlier, later))
    return [(metric, None, request.metrics[k].value / 100.0) for k, (_, metric) in enumerate(GPM_METRICS)
            if request.metrics[k].nvmlReturn == nv.NVML_SUCCESS]


def gpm_request(nv: Any, earlier: Any, later: Any) -> Any:
    """The ``c_nvmlGpmMetricsGet_t`` asking for :data:`GPM_METRICS` between two samples."""
    request = nv.c_nvmlGpmMetricsGet_t()
    request.version = nv.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    request.sample1, request.sample2 = earlier, later
    for k, (metric_id, _) in enumerate(GPM_METRICS):
        request.metrics[k].metricId = getattr(nv, metric_id)
    return request


READINGS: tuple[Reading, ...] = (
    Reading("utilization", "nvmlDeviceGetUtilizationRates", ("gpuprobe.gpu.utilization",), _utilization),
    Reading("memory", "nvmlDeviceGetMemoryInfo", ("gpuprobe.gpu.memory.used", "gpuprobe.gpu.memory.total"), _memory),
    Reading("clock.sm", "nvmlDeviceGetClockInfo", ("gpuprobe.gpu.clock.sm",), _sm_clock),
    Reading("power", "nvmlDeviceGetPowerUsage", ("gpuprobe.gpu.power",), _power),
    Reading("power.limit", "nvmlDeviceGetEnforcedPowerLimit", ("gpuprobe.gpu.power.limit",), _power_limit),
    Reading("temperature", "nvmlDeviceGetTemperature", ("gpuprobe.gpu.temperature",), _temperature),
    Reading("throttle", "nvmlDeviceGetCurrentClocksEventReasons", ("gpuprobe.gpu.throttle",), _throttle),
    Reading("gpm", "nvmlGpmMetricsGet", tuple(metric for _, metric in GPM_METRICS), _gpm),
)
"""Every reading, in the order a sample takes them."""


def _reason_bits(nv: Any) -> tuple[tuple[str, int], ...]:
    out = []
    for reason, suffix in THROTTLE_REASONS:
        bit = getattr(nv, "nvmlClocksEventReason" + suffix, getattr(nv, "nvmlClocksThrottleReason" + suffix, None))
        if bit is not None:
            out.append((reason, int(bit)))
    return tuple(out)


# -- which device is which ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Device:
    """A CUDA device of this process and the NVML device it is read through.

    Attributes:
        cuda: the label of gpuprobe's series, ``cuda:N`` (N: the CUDA ordinal in this process).
        index: NVML's index of the GPU (of the MIG device's GPU for a MIG device).
        uuid: NVML's UUID of the GPU (``GPU-...``).
        mig: the MIG device's UUID when the CUDA device is a MIG device.
    """

    cuda: str
    index: int
    uuid: str
    mig: str | None = None


@dataclasses.dataclass(frozen=True)
class _Gpu:
    index: int
    handle: Any
    uuid: str
    pci: tuple[int, int, int] | None  # (domain, bus, device)
    mig: tuple[str, ...]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pci(bus_id: Any) -> tuple[int, int, int] | None:
    """``"00000000:65:00.0"`` → (0, 0x65, 0)."""
    try:
        domain, bus, rest = _text(bus_id).strip().split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None


def _inventory(nv: Any) -> list[_Gpu]:
    gpus = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(nv.nvmlDeviceGetUUID(h))
        try:
            pci = _pci(nv.nvmlDeviceGetPciInfo(h).busId)
        except nv.NVMLError:
            pci = None
        migs: list[str] = []
        try:
            if nv.nvmlDeviceGetMigMode(h)[0] == nv.NVML_DEVICE_MIG_ENABLE:
                for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        migs.append(_text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k))))
                    except nv.NVMLError:
                        continue  # an empty slot
        except nv.NVMLError:
            pass  # no MIG on this GPU
        gpus.append(_Gpu(i, h, uuid, pci, tuple(migs)))
    return gpus


def _bare(uuid: str) -> str:
    text = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def _by_prefix(prefix: str, gpus: list[_Gpu], mig: bool) -> tuple[_Gpu, str | None] | None:
    """The GPU (and MIG device) whose UUID starts with ``prefix``; None unless exactly one does."""
    want = _bare(prefix)
    found = [(g, m) for g in gpus for m in (g.mig if mig else (None,))
             if _bare(m if m is not None else g.uuid).startswith(want)]
    return found[0] if len(found) == 1 and want else None


def map_devices(nv: Any, environ: Mapping[str, str] | None = None, torch_devices: list[tuple[str, Any]] | None = None,
                ) -> tuple[list[Device], str]:
    """The CUDA devices of this process and their NVML devices, and what told them apart.

    Args:
        nv: the ``pynvml`` module (initialized).
        environ: where ``CUDA_VISIBLE_DEVICES`` is read (``os.environ`` when None).
        torch_devices: once torch has initialized CUDA, ``(uuid, pci)`` of each CUDA ordinal from torch's
            device properties (``pci``: ``(domain, bus, device)`` or None); these win over the variable.

    Returns:
        ``(devices, source)``: ``source`` is ``"torch"``, ``"CUDA_VISIBLE_DEVICES"`` or ``"all"`` (unset).

    CUDA's rules for the variable: entries are NVML indices, ``GPU-`` UUID prefixes or ``MIG-`` UUIDs;
    the first entry CUDA cannot use ends the list. Indices are taken in NVML's (PCI bus) order, which is
    CUDA's order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and on machines of one GPU model.
    """
    gpus = _inventory(nv)
    out: list[Device] = []
    if torch_devices is not None:
        for n, (uuid, pci) in enumerate(torch_devices):
            hit = _by_prefix(uuid, gpus, mig=False) or _by_prefix(uuid, gpus, mig=True) if uuid else None
            if hit is None and pci is not None:
                hit = next(((g, None) for g in gpus if g.pci == tuple(pci)), None)
            if hit is not None:
                out.append(Device(f"cuda:{n}", hit[0].index, hit[0].uuid, hit[1]))
        return out, "torch"
    env = os.environ if environ is None else environ
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return [Device(f"cuda:{g.index}", g.index, g.uuid) for g in gpus], "all"
    seen: set[tuple[int, str | None]] = set()
    for entry in raw.split(","):
        entry = entry.strip()
        hit: tuple[_Gpu, str | None] | None = None
        if entry.isdigit():
            hit = (gpus[int(entry)], None) if int(entry) < len(gpus) else None
        elif entry.upper().startswith("GPU-"):
            hit = _by_prefix(entry, gpus, mig=False)
        elif entry.upper().startswith("MIG-"):
            hit = _by_prefix(entry, gpus, mig=True)
        if hit is None or (hit[0].index, hit[1]) in seen:
            break  # CUDA ignores this entry and every one after it
        seen.add((hit[0].index, hit[1]))
        out.append(Device(f"cuda:{len(out)}", hit[0].index, hit[0].uuid, hit[1]))
    return out, "CUDA_VISIBLE_DEVICES"


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_initialized())  # never initializes CUDA (docs/gpu.md)
    except Exception:
        return False


def _torch_devices() -> list[tuple[str, Any]] | None:
    """``(uuid, pci)`` per CUDA ordinal from torch, only once torch itself has initialized CUDA."""
    if not _cuda_initialized():
        return None
    torch = sys.modules["torch"]
    try:
        out = []
        for n in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(n)
            uuid = str(getattr(props, "uuid", "") or "")
            bus = getattr(props, "pci_bus_id", None)
            pci = ((int(getattr(props, "pci_domain_id", 0)), int(bus), int(getattr(props, "pci_device_id", 0)))
                   if bus is not None else None)
            out.append((uuid, pci))
        return out
    except Exception:
        return None


# -- the sampler -----------------------------------------------------------------------------------

class GpuHealth:
    """Reads every visible GPU's health through NVML on the background thread (see the module docstring).

    Args:
        environ: where ``CUDA_VISIBLE_DEVICES`` is read (``os.environ`` when None).

    Example:
        >>> import gpuprobe
        >>> _ = gpuprobe.configure(nvml=True)   # doctest: +SKIP
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._rt: Runtime | None = None
        self._nv: Any = None
        self._bits: tuple[tuple[str, int], ...] = ()
        self._slots: dict[int, Slot] = {}  # by NVML index
        self.state = "starting"  # starting | ok | fail | closed
        self.detail = "waiting for the first background round"
        self.devices: list[Device] = []
        self.source = ""
        self._cuda_seen = False  # torch's devices decided the mapping
        self._closing = False
        self.off: dict[tuple[int, str], str] = {}  # (gpu.index, reading) → why it is off
        self._children: dict[tuple[str, str, str | None], Any] = {}

    def attach(self, rt: Runtime, *, owner: Owner = "user") -> GpuHealth:
        """Register with ``rt``: sampled on its background thread, closed at reset and exit."""
        self._rt = rt
        rt.add_exporter(self, owner=owner)
        return self

    # -- the background thread ------------------------------------------------------------------
    def tick(self) -> None:
        """One sample of every reading of every device (the background thread's round)."""
        if os.getpid() != self._pid:
            return  # a forked child never touches the parent's NVML
        with self._lock:
            if self.state == "starting" and not self._closing:
                self._start()
            if self.state == "ok" and not self._closing:
                if not self._cuda_seen and _cuda_initialized():
                    self._map()  # once: the CUDA devices are torch's from now on
                self._sample()
            if self._closing:
                self._finish()  # close() came while this round read NVML

    def _start(self) -> None:
        rt = self._rt
        try:
            nv = load()
        except ImportError as exc:
            self._fail(f"nvidia-ml-py not installed ({_INSTALL})", exc)
            return
        try:
            nv.nvmlInit()
        except Exception as exc:
            self._fail(f"NVML could not start: {type(exc).__name__}: {exc}", exc)
            return
        self._nv = nv
        self._bits = _reason_bits(nv)
        try:
            self._map()
        except Exception as exc:
            self._shutdown()
            self._fail(f"NVML could not list the devices: {type(exc).__name__}: {exc}", exc)
            return
        self.state = "ok"
        if rt is not None and not self.devices:
            rt.warn_once("nvml:devices", "gpuprobe: GPU health gauges: NVML sees no GPU this process can use "
                                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")

    def _map(self) -> None:
        """Which NVML device each CUDA ordinal is: torch's devices once CUDA is up, else the variable's."""
        nv, note = self._nv, ""
        found = _torch_devices()
        self._cuda_seen = found is not None or _cuda_initialized()  # torch failing to answer: not asked again
        devices: list[Device] = []
        if found is not None:
            devices, source = map_devices(nv, self._environ, found)
            if not devices:
                note = "; torch's device UUIDs matched no NVML device"
        if not devices:
            devices, source = map_devices(nv, self._environ)
        if devices != self.devices:
            for slot in self._slots.values():
                slot.release(nv)
            self._slots = {d.index: Slot(nv.nvmlDeviceGetHandleByIndex(d.index), self._bits) for d in devices}
            self._forget_series()
        self.devices, self.source = devices, source
        n = len(devices)
        self.detail = f"{n} device{'s' if n != 1 else ''} ({source}){note}"

    def _sample(self) -> None:
        rt, nv = self._rt, self._nv
        if rt is None:
            return
        for index, slot in self._slots.items():  # each GPU once, however many CUDA devices (MIG) it holds
            devices = [d for d in self.devices if d.index == index]
            for reading in READINGS:
                key = (index, reading.name)
                if key in self.off:
                    continue
                try:
                    values = reading.read(nv, slot)
                except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):  # not in this GPU or driver
                    self._turn_off(key, reading, "not supported")
                    continue
                except Exception as exc:
                    function = _reasons_function(nv) if reading.name == "throttle" else reading.function
                    self._turn_off(key, reading, f"{function} failed: {type(exc).__name__}: {exc}")
                    rt.warn_once(f"nvml:{key}", f"gpuprobe: GPU health gauge {reading.name!r} of GPU {index} "
                                                f"is off: {function} failed: {exc!r}")
                    continue
                for metric, reason, value in values:
                    for device in devices:
                        rt.emit(self._child(metric, device, reason), value)

    def _child(self, metric: str, device: Device, reason: str | None) -> Any:
        key = (metric, device.cuda, reason)
        found = self._children.get(key)
        if found is None:
            assert self._rt is not None
            labels = {"gpu.index": str(device.index), "gpuprobe.device": device.cuda}
            if reason is not None:
                labels["reason"] = reason
            found = self._children[key] = self._rt.family(metric).child(**labels)
        return found

    def _turn_off(self, key: tuple[int, str], reading: Reading, why: str) -> None:
        """Stop asking for ``reading`` on GPU ``key[0]``; a value it had already set leaves the exports."""
        self.off[key] = why
        cudas = {d.cuda for d in self.devices if d.index == key[0]}
        for (metric, cuda, _), child in list(self._children.items()):
            if metric in reading.metrics and cuda in cudas:
                self._forget(child)

    def _forget_series(self) -> None:
        for child in self._children.values():
            self._forget(child)
        self._children.clear()

    def _forget(self, child: Any) -> None:
        rt = self._rt
        if rt is not None:
            with rt.lock:
                rt.drain()  # values already queued for it land first, then it goes
                child.forget()

    def _fail(self, detail: str, exc: BaseException) -> None:
        self.state, self.detail = "fail", detail
        if self._rt is not None:
            self._rt.warn_once("nvml:start", f"gpuprobe: GPU health gauges are off: {detail}")

    def _shutdown(self) -> None:
        nv, self._nv = self._nv, None
        if nv is not None:
            for slot in self._slots.values():
                slot.release(nv)
            try:
                nv.nvmlShutdown()
            except Exception:
                pass

    def close(self) -> None:
        """Shut NVML down (in the process that started it); the gauges leave the exports.

        Waits at most a second for a round that is reading NVML (a lost GPU can make a call hang);
        past that, the round finishes the closing itself.
        """
        self._closing = True
        if self._lock.acquire(timeout=1.0):
            try:
                self._finish()
            finally:
                self._lock.release()

    def _finish(self) -> None:
        if self.state == "closed":
            return
        if os.getpid() == self._pid:
            self._shutdown()
            self._forget_series()
        self.state, self.detail = "closed", "closed"

    def status(self) -> dict[str, Any]:
        """What ``info()["gpu_health"]`` shows of this sampler (never waits for a round reading NVML)."""
        devices, off = list(self.devices), dict(self.off)  # copies made in C, atomic under the GIL
        return {
            "state": self.state,
            "detail": self.detail,
            "devices": [{"gpuprobe.device": d.cuda, "gpu.index": d.index, "uuid": d.uuid,
                         **({"mig": d.mig} if d.mig else {})} for d in devices],
            "off": [{"gpu.index": i, "reading": name, "why": why} for (i, name), why in sorted(off.items())],
        }

    def __repr__(self) -> str:
        return f"GpuHealth({self.state}: {self.detail})"


# -- settings, info(), doctor ------------------------------------------------------------------------

def start_from_settings(rt: Runtime) -> None:
    """Attach a :class:`GpuHealth` owned by the settings (``nvml`` is on)."""
    GpuHealth().attach(rt, owner="settings")


def status(rt: Runtime) -> dict[str, Any]:
    """``info()["gpu_health"]``: whether the gauges are on, their devices, and which readings are off and why.

    Imports nothing of NVML.
    """
    samplers = [item for item in rt.lifecycle.items() if isinstance(item, GpuHealth)]
    if samplers:
        return {"on": samplers[-1].state == "ok", **samplers[-1].status()}
    if rt.settings.nvml:
        return {"on": False, "state": "off", "detail": "not running in this process (a forked child starts without "
                "the parent's exporters; configure() starts them anew)", "devices": [], "off": []}
    return {"on": False, "state": "off", "detail": "GPUPROBE_NVML=1 or configure(nvml=True) turns them on",
            "devices": [], "off": []}


def describe() -> dict[str, str]:
    """Whether NVML answers here: ``{"state": "ok" | "off" | "fail", "detail": why}`` (``gpuprobe doctor``
    prints the state beside the detail).

    Initializes NVML on the calling thread and shuts it down again.

    Example:
        >>> describe()["state"] in ("ok", "off", "fail")
        True
    """
    try:
        nv = load()
    except ImportError:
        return {"state": "off", "detail": f"nvidia-ml-py not installed ({_INSTALL})"}
    try:
        nv.nvmlInit()
    except Exception as exc:
        return {"state": "fail", "detail": f"{type(exc).__name__}: {exc}"}
    try:
        count = nv.nvmlDeviceGetCount()
        driver = _text(nv.nvmlSystemGetDriverVersion())
        version = _text(nv.nvmlSystemGetNVMLVersion())
    except Exception as exc:
        return {"state": "fail", "detail": f"{type(exc).__name__}: {exc}"}
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return {"state": "ok", "detail": f"{count} device{'s' if count != 1 else ''}, driver {driver}, NVML {version}"}
