"""``gpuprobe doctor [--json]``: what works on this machine and why not, one line each.

Each line is a check with a state and a short reason:

- ``ok``: it works (or is present and fits);
- ``off``: not asked for by the settings, or not present, and that is fine (no CUDA device on a CPU
  machine, no NVTX tool attached, no Prometheus port set);
- ``fail``: asked for by the settings and not working, or broken (a Prometheus port that cannot be
  bound, an OTLP endpoint that does not answer, CUDA events that cannot be read on a device that is
  there, a seam refused by the installed version of an integrated library).

The exit status is 1 when any line fails, else 0. The rules of every line are in ``docs/doctor.md``.

doctor is a diagnostic command, not the program gpuprobe observes: it imports torch and the other
optional libraries, initializes CUDA and launches one tiny kernel per device, loads the NVTX runtime,
binds the Prometheus port for a moment and sends one empty request to the OTLP endpoint. It starts no
exporter and patches nothing. This module imports no optional dependency when it is imported; each
check imports what it needs, and a check that raises becomes a ``fail`` line naming the exception.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from . import config
from ._version import __version__
from .errors import ConfigError
from .integrations import registry

__all__ = ["Line", "STATES", "diagnose", "render_text", "render_json", "main", "thread_advice", "usable_cores"]

STATES = ("ok", "off", "fail")
"""The state of a line: works; not asked for or not present (fine); asked for and not working, or broken."""

SCHEMA = 1
"""The version of ``--json``'s layout (docs/doctor.md); raised when a field changes meaning or goes."""

USAGE = f"""\
usage: gpuprobe doctor [--json]

What works on this machine and why not, one line each: Python, torch (and whether its threads fit the
free cores), each integration ({", ".join(registry.names())}: its library against the versions
supported), CUDA devices (and whether their peaks are known for MBU/MFU), device timing, NVTX, kernel
sampling, NVML, the Prometheus port, the OTLP endpoint, the folders files are written to, and the
seams of the integrations.

Each line is ok, off (not asked for or not present: fine) or fail (asked for by the settings and
not working, or broken). Exit status: 0 when no line fails, 1 otherwise (docs/doctor.md).

doctor initializes CUDA and launches one tiny kernel per device to read CUDA events back; it binds
the Prometheus port for a moment and sends one empty request to the OTLP endpoint. It starts no
exporter and patches nothing.

options:
  --json      one JSON object instead of text (docs/doctor.md: the schema)
  -h, --help  show this help"""

# How long a kernel doctor times on each device spins: long enough to be seen, short enough to ignore.
_SPIN_SECONDS = 1e-4
# The clock (kHz) assumed for a device whose properties give none (recent NVIDIA GPUs boost near it).
_FALLBACK_CLOCK_KHZ = 1_400_000
# The longest doctor waits for the OTLP endpoint, whatever GPUPROBE_OTLP_TIMEOUT says.
_OTLP_WAIT_MAX = 5.0


@dataclasses.dataclass(frozen=True)
class Line:
    """One check's outcome.

    Attributes:
        check: what was checked (``python``, ``torch``, ``cuda:0``, ``prometheus``, ...).
        state: ``ok``, ``off`` or ``fail`` (:data:`STATES`).
        reason: one short sentence: what was found, or why not.
        details: the facts behind the reason, for ``--json`` (names, versions, numbers).
        notes: further lines shown under it (a refused seam each).
    """

    check: str
    state: str
    reason: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"a doctor line's state is one of {', '.join(STATES)}, got {self.state!r}")


@dataclasses.dataclass
class _Context:
    """What the checks share: the settings in force (or why they could not be read) and what was found."""

    settings: Any
    settings_error: str | None = None
    torch: Any = None  # the torch module, once the torch check imported it
    devices: int = 0  # CUDA devices torch sees
    # What the integrations' descriptions shape-checked: seam -> why it does not fit (None: it fits).
    seam_checks: dict[str, str | None] = dataclasses.field(default_factory=dict)
    checked_against: list[str] = dataclasses.field(default_factory=list)  # "<library> <version>" of each


# -- the checks, in the order they are shown ---------------------------------------------------------

def _python(ctx: _Context) -> Line:
    version = platform.python_version()
    where = f"{platform.python_implementation()} {version} on {platform.system()} {platform.machine()}"
    return Line("python", "ok", f"{where} ({sys.executable})",
                {"version": version, "implementation": platform.python_implementation(),
                 "executable": sys.executable, "platform": platform.platform()})


def _settings(ctx: _Context) -> Line:
    from .runtime import DISABLED_AT_IMPORT

    names = {s.env for s in config.SETTINGS.values()}
    present = sorted(n for n in names if os.environ.get(n) not in (None, "") and n.startswith("GPUPROBE_"))
    details: dict[str, Any] = {"variables": present, "disabled": DISABLED_AT_IMPORT}
    if ctx.settings_error is not None:
        return Line("settings", "fail", f"{ctx.settings_error}; the other lines use the defaults", details)
    reason = f"{len(present)} GPUPROBE_* setting(s) set: {', '.join(present)}" if present else \
        "the defaults (no GPUPROBE_* setting set)"
    # A variable one typo away from a setting does nothing: say so.
    unknown = sorted(n for n in os.environ if n.startswith("GPUPROBE_") and n not in names)
    near = {n: difflib.get_close_matches(n, sorted(names), n=1, cutoff=0.8) for n in unknown}
    typos = [f"{n} is not a setting (did you mean {m[0]}?)" for n, m in near.items() if m]
    if typos:
        details["not_settings"] = [n for n, m in near.items() if m]
        reason += "; " + "; ".join(typos)
    if DISABLED_AT_IMPORT:
        reason += "; GPUPROBE_DISABLE=1: probes are switched off in programs started with it"
    return Line("settings", "ok", reason, details)


def _torch(ctx: _Context) -> Line:
    try:
        import torch
    except ImportError as exc:
        extras = " or ".join(f"'gpuprobe[{name}]'" for name in registry.names())
        return Line("torch", "off", f"not installed ({exc}); install it for device timing, memory readings and "
                                    f"the integrations: pip install {extras}", {"installed": False})
    ctx.torch = torch
    version = str(torch.__version__)
    build = ("CUDA " + str(torch.version.cuda)) if getattr(torch.version, "cuda", None) else \
        ("ROCm " + str(torch.version.hip)) if getattr(torch.version, "hip", None) else None
    details = {"installed": True, "version": version, "build": build or "cpu"}
    reason = f"{version}, built for {build}" if build else f"{version}, a CPU-only build"
    floor = _declared_floor("torch")
    if floor is not None:
        details["tested_floor"] = floor
        inside = _release(version) >= _release(floor)
        details["inside_tested_range"] = inside
        reason += f", inside the tested range >={floor}" if inside else \
            f"; below the tested range >={floor} (gpuprobe runs on it untested)"
    return Line("torch", "ok", reason, details)


def usable_cores() -> float:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (a container's
    ``--cpus``); ``os.cpu_count()`` where there is no affinity."""
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = float(os.cpu_count() or 1)
    quota = _cgroup_quota()
    return min(cores, quota) if quota is not None else cores


def _cgroup_quota() -> float | None:
    """The cgroup's CPU quota in cores (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cfs_period_us``), or None."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, _, period = f.read().partition(" ")
        if quota.strip() != "max" and float(period) > 0:
            return float(quota) / float(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = float(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = float(f.read())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def thread_advice(threads: int, usable: float, load: float, machine: float) -> tuple[float, int | None]:
    """The cores free for torch, and the thread count to set when ``threads`` exceed them (None: they fit).

    Args:
        threads: torch's intra-op threads.
        usable: the cores this process may run on (:func:`usable_cores`).
        load: the machine's 1-minute load average (runnable processes, over every core).
        machine: the machine's cores (``os.cpu_count()``); the load is taken as spread evenly over them, so
            a process held to some of them meets its part of it.

    Example:
        >>> thread_advice(2, 2.0, 2.6, 2.0)   # a busy 2-core machine: no core free, 2 threads wait for each other
        (0.0, 1)
        >>> thread_advice(4, 8.0, 1.0, 8.0)
        (7.0, None)
    """
    share = load * usable / machine if machine > usable else load
    free = round(max(0.0, usable - share), 1)
    fits = max(1, round(free))
    return free, (fits if threads > fits else None)


def _threads(ctx: _Context) -> Line:
    torch = ctx.torch
    if torch is None:
        return Line("threads", "off", "torch is not installed", {})
    threads = int(torch.get_num_threads())
    usable = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system: only the usable cores count
        load = 0.0
    machine = float(os.cpu_count() or usable)
    free, advice = thread_advice(threads, usable, load, machine)
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not given:
        origin = " (torch's default)"
    elif given == str(threads):
        origin = f" (OMP_NUM_THREADS={given})"
    else:  # torch keeps to its own bound (the machine's cores) or another setting won
        origin = f" (OMP_NUM_THREADS={given} asks for {given})"
    details: dict[str, Any] = {"intra_op_threads": threads, "usable_cores": usable, "load_average_1m": load,
                               "machine_cores": machine, "free_cores": free, "suggested_threads": advice}
    plural = "s" if threads != 1 else ""
    where = f"{free:.1f} of {usable:.1f} usable cores free (1-minute load average {load:.2f})"
    if advice is None:
        return Line("threads", "ok", f"torch runs {threads} intra-op thread{plural}{origin}; {where}", details)
    return Line("threads", "ok", f"torch runs {threads} intra-op thread{plural}{origin}, more than the cores free: "
                                 f"{free:.1f} of {usable:.1f} usable (1-minute load average {load:.2f}); "
                                 "an operator's threads then wait for cores other programs hold, which can make a "
                                 f"forward many times slower; set OMP_NUM_THREADS={advice} in the program's "
                                 f"environment (or call torch.set_num_threads({advice}) in it)", details)


def _integrations(ctx: _Context) -> list[Line]:
    """A line per integration (:data:`gpuprobe.integrations.registry.INTEGRATIONS`), from its own description."""
    return [_integration(ctx, row) for row in registry.INTEGRATIONS]


def _integration(ctx: _Context, row: registry.Integration) -> Line:
    try:
        describe = registry.describer(row)
    except ImportError as exc:
        if not registry.installed(row):
            return Line(row.name, "off", f"not installed ({row.distribution}; pip install 'gpuprobe[{row.name}]')",
                        {"installed": False})
        return Line(row.name, "fail", f"its module cannot be imported ({type(exc).__name__}: {exc})")
    try:
        found = describe()
        state, reason = found["state"], str(found["reason"])
        details = dict(found.get("details") or {})
        seams = dict(found.get("seams") or {})
        against = found.get("checked_against")
    except Exception as exc:  # its description's own failure is its line, not the others'
        return Line(row.name, "fail", f"its description ({row.doctor}) raised {type(exc).__name__}: {exc}")
    if state not in STATES:
        return Line(row.name, "fail", f"its description ({row.doctor}) has the state {state!r}: {reason}", details)
    ctx.seam_checks.update(seams)
    if against:
        ctx.checked_against.append(str(against))
    return Line(row.name, state, reason, details)


def _cuda(ctx: _Context) -> list[Line]:
    torch = ctx.torch
    if torch is None:
        return [Line("cuda", "off", "no CUDA device (torch is not installed)", {"devices": 0})]
    count = torch.cuda.device_count()
    ctx.devices = count
    if count == 0:
        why = "torch is a CPU-only build" if not (torch.version.cuda or torch.version.hip) else "torch sees none"
        return [Line("cuda", "off", f"no CUDA device ({why})", {"devices": 0})]
    from ._utilization import BANDWIDTH_ENV, FLOPS_ENV, G, T, match_device

    s = ctx.settings
    lines = [Line("cuda", "ok", f"{count} CUDA device(s)", {"devices": count})]
    for i in range(count):
        name = str(torch.cuda.get_device_name(i))
        peak = match_device(name)
        details: dict[str, Any] = {"name": name, "peaks": peak.name if peak is not None else None}
        if s.peak_memory_bandwidth is not None or s.peak_flops is not None:
            given = [env for env, v in ((BANDWIDTH_ENV, s.peak_memory_bandwidth), (FLOPS_ENV, s.peak_flops))
                     if v is not None]
            details["peaks_from"] = given
        if peak is not None:
            bf16 = peak.flops.get("bfloat16")
            figures = f"{peak.memory_bandwidth / G:g} GB/s" + (f", bf16 {bf16 / T:g} TFLOP/s" if bf16 else "")
            where = f"MBU/MFU peaks known: {peak.name} ({figures})"
            details["memory_bandwidth"] = peak.memory_bandwidth
            details["flops"] = dict(peak.flops)
        else:
            where = f"no peak known for MBU/MFU: set {BANDWIDTH_ENV} and {FLOPS_ENV} (docs/utilization.md)"
        if details.get("peaks_from"):
            where += f"; {' and '.join(details['peaks_from'])} set, used on every device"
        lines.append(Line(f"cuda:{i}", "ok", f"{name}; {where}", details))
    return lines


def _device_timing(ctx: _Context) -> Line:
    mode = ctx.settings.device_timing
    torch = ctx.torch
    details: dict[str, Any] = {"setting": mode}
    if mode == "off":
        return Line("device timing", "off", "not asked for (GPUPROBE_DEVICE_TIMING=off)", details)
    if torch is None or ctx.devices == 0:
        if mode == "cuda":
            return Line("device timing", "fail", "GPUPROBE_DEVICE_TIMING=cuda asks for CUDA events, but there is "
                                                 "no CUDA device", details)
        return Line("device timing", "off", "no CUDA device: spans are timed on the host clock only", details)
    from ._torch_caps import cuda_sleep

    spin = cuda_sleep(torch)
    results, problems = [], []
    for i in range(ctx.devices):
        try:
            ms = _time_one_kernel(torch, i, spin)
        except Exception as exc:
            problems.append(f"cuda:{i}: {type(exc).__name__}: {exc}")
            continue
        if not (math.isfinite(ms) and ms > 0):
            problems.append(f"cuda:{i}: the events read {ms!r} ms around a kernel")
            continue
        results.append(f"cuda:{i} {ms:.3f} ms")
        details[f"cuda:{i}"] = {"elapsed_ms": ms}
    if problems:
        details["problems"] = problems
        return Line("device timing", "fail", "CUDA events around a kernel cannot be read back: " + "; ".join(problems),
                    details)
    return Line("device timing", "ok", "CUDA events recorded around a kernel read back: " + ", ".join(results), details)


def _time_one_kernel(torch: Any, device: int, spin: Callable[[int], object] | None) -> float:
    """Milliseconds between two timing events around one tiny kernel on ``device`` (this waits for it)."""
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        if spin is not None:
            khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) or _FALLBACK_CLOCK_KHZ
            spin(int(khz * 1000 * _SPIN_SECONDS))
        else:  # a torch without _sleep: any small kernel does
            torch.ones(1024, device=f"cuda:{device}").mul_(2)
        end.record(stream)
        end.synchronize()
        if not (end.query() and start.query()):
            raise RuntimeError("the events are not complete after end.synchronize()")
        return float(start.elapsed_time(end))


def _nvtx(ctx: _Context) -> Line:
    from . import _nvtx

    injection = os.environ.get("NVTX_INJECTION64_PATH")
    details: dict[str, Any] = {"injection": injection}
    package = importlib.util.find_spec("nvtx") is not None  # gpuprobe[nvtx]; imported by _nvtx.pick() only
    details["nvtx_package"] = package
    if os.environ.get("NVTX_DISABLE"):
        details["backend"] = "off"
        return Line("nvtx", "off", "NVTX_DISABLE is set: ranges are no-ops", details)
    if injection and not os.path.exists(injection):
        details["backend"] = "off"
        return Line("nvtx", "fail", f"NVTX_INJECTION64_PATH names {injection}, which does not exist: no tool "
                                    "records the ranges", details)
    backend = _nvtx.pick()
    details["backend"] = backend.name
    if injection is None:
        hint = "" if package else "; install gpuprobe[nvtx] for categories and payloads"
        return Line("nvtx", "off", f"no NVTX tool attached (NVTX_INJECTION64_PATH is unset): ranges are no-ops; "
                                   f"run under nsys or ncu to record them{hint}", details)
    if backend.enabled:
        return Line("nvtx", "ok", f"a tool is attached ({os.path.basename(injection)}): ranges go through "
                                  f"{backend.name} to the {_nvtx.DOMAIN!r} domain", details)
    why = ("the nvtx package is not installed and torch sees no CUDA device" if not package else
           "the nvtx package handed back a dummy domain (the tool did not attach)")
    return Line("nvtx", "fail", f"a tool is named ({os.path.basename(injection)}) but ranges stay no-ops: {why}",
                details)


def _kernel_sampling(ctx: _Context) -> Line:
    every = ctx.settings.kernel_sampling
    details: dict[str, Any] = {"every": every}
    if ctx.torch is None:
        if every:
            return Line("kernel sampling", "fail", f"GPUPROBE_KERNEL_SAMPLING={every} needs torch, which is not "
                                                   "installed", details)
        return Line("kernel sampling", "off", "not asked for (and torch is not installed)", details)
    from . import _kernel_sampler

    try:
        what, works = _kernel_sampler._recorder().describe(), True
    except _kernel_sampler._SamplingUnavailable as exc:
        what, works = str(exc), False
    details["records"] = what if works else None
    if not every:
        would = f"on this torch it would record {what}" if works else f"on this torch: {what}"
        return Line("kernel sampling", "off", f"not asked for (GPUPROBE_KERNEL_SAMPLING=0); {would}", details)
    if not works:
        return Line("kernel sampling", "fail", f"GPUPROBE_KERNEL_SAMPLING={every}, but sampling is {what}", details)
    return Line("kernel sampling", "ok", f"one step in {every}: {what}", details)


def _nvml(ctx: _Context) -> Line:
    from . import _nvml

    wanted = ctx.settings.nvml
    found = _nvml.describe()
    state, detail = str(found["state"]), str(found["detail"])
    details = {"asked": wanted, "describe": {"state": state, "detail": detail}}
    if state not in STATES:
        return Line("nvml", "fail", f"its description has the state {state!r}: {detail}", details)
    if state == "fail" and not wanted:
        return Line("nvml", "off", f"not asked for (GPUPROBE_NVML unset); {detail}", details)
    return Line("nvml", state, detail, details)


def _prometheus(ctx: _Context) -> Line:
    s = ctx.settings
    if s.prometheus_port is None:
        return Line("prometheus", "off", "not asked for (GPUPROBE_PROMETHEUS_PORT is unset)", {"port": None})
    port = s.prometheus_port + (s.local_rank if s.prometheus_port and s.port_by_local_rank else 0)
    addr = s.prometheus_addr
    details: dict[str, Any] = {"port": port, "addr": addr}
    rank = f" (GPUPROBE_PROMETHEUS_PORT {s.prometheus_port} + LOCAL_RANK {s.local_rank})" \
        if port != s.prometheus_port else ""
    if importlib.util.find_spec("prometheus_client") is None:
        return Line("prometheus", "fail", "GPUPROBE_PROMETHEUS_PORT is set, but prometheus-client is not installed: "
                                          "pip install 'gpuprobe[prometheus]'", details)
    try:
        # As the /metrics server binds: the first address getaddrinfo gives, SO_REUSEADDR (http.server's).
        family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return Line("prometheus", "fail", f"port {port}{rank} on {addr} is already in use: gpuprobe cannot serve "
                                              "/metrics there; choose another GPUPROBE_PROMETHEUS_PORT", details)
        return Line("prometheus", "fail", f"cannot bind {addr}:{port}{rank}: {exc.strerror or exc}; check "
                                          "GPUPROBE_PROMETHEUS_PORT and GPUPROBE_PROMETHEUS_ADDR", details)
    if port == 0:
        return Line("prometheus", "ok", f"port 0 on {addr}: a free port is picked when gpuprobe serves", details)
    return Line("prometheus", "ok", f"port {port}{rank} on {addr} is free: gpuprobe can serve "
                                    f"http://{addr}:{port}/metrics", details)


def _otlp(ctx: _Context) -> Line:
    s = ctx.settings
    url = s.otlp_endpoint
    if url is None:
        return Line("otlp", "off", "not asked for (GPUPROBE_OTLP_ENDPOINT is unset)", {"endpoint": None})
    wait = min(s.otlp_timeout, _OTLP_WAIT_MAX)
    details: dict[str, Any] = {"endpoint": url, "timeout_s": wait}
    try:
        exporter = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http")
    except ImportError:
        exporter = None
    if exporter is None:
        return Line("otlp", "fail", "GPUPROBE_OTLP_ENDPOINT is set, but the OTLP/HTTP exporter is not installed: "
                                    "pip install 'gpuprobe[otel]'", details)
    # An empty ExportMetricsServiceRequest (zero bytes of protobuf): a collector accepts it and stores nothing.
    request = urllib.request.Request(url, data=b"", method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
    answer: dict[str, Any] = {}

    def push() -> None:
        try:
            with urllib.request.urlopen(request, timeout=wait) as response:  # noqa: S310 - http(s) (config)
                answer["status"] = response.status
        except Exception as exc:
            answer["error"] = exc

    # urlopen's timeout covers connecting and each read, not resolving the host name: a thread bounds it all.
    t0 = time.perf_counter()
    worker = threading.Thread(target=push, name="gpuprobe-doctor-otlp", daemon=True)
    worker.start()
    worker.join(wait + 0.5)
    no_answer = f"{url}: no answer within {wait:g} s (GPUPROBE_OTLP_TIMEOUT)"
    if worker.is_alive():
        return Line("otlp", "fail", no_answer, details)
    exc = answer.get("error")
    if isinstance(exc, urllib.error.HTTPError):
        details["status"] = exc.code
        return Line("otlp", "fail", f"{url} answered HTTP {exc.code} {exc.reason} to an empty metrics push; "
                                    "is it the full metrics URL (…/v1/metrics)?", details)
    if exc is not None:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return Line("otlp", "fail", no_answer, details)
        return Line("otlp", "fail", f"{url}: unreachable ({reason})", details)
    status = answer["status"]
    ms = (time.perf_counter() - t0) * 1e3
    details.update(status=status, elapsed_ms=round(ms, 1))
    return Line("otlp", "ok", f"{url} answered HTTP {status} in {ms:.0f} ms", details)


def _files(ctx: _Context) -> Line:
    s = ctx.settings
    # (setting, directory, whether gpuprobe creates it when missing): what the settings ask to be written.
    asked: list[tuple[str, str, bool]] = []
    if s.jsonl:
        asked.append(("GPUPROBE_JSONL", os.path.dirname(os.path.abspath(s.jsonl)), False))  # opened as it is
    if s.snapshot_at_step is not None or s.snapshot_on_oom:
        asked.append(("GPUPROBE_SNAPSHOT_DIR", s.snapshot_dir, True))
    if s.profile_steps is not None and s.profile_output != "none":
        where = "." if s.profile_output == "auto" else os.path.dirname(os.path.abspath(s.profile_output))
        asked.append(("GPUPROBE_PROFILE_OUTPUT", where, True))
    if s.profile_signal != "off" or s.profile_slow_step or (s.prometheus_port is not None and
                                                             s.profile_endpoint != "off"):
        asked.append(("GPUPROBE_PROFILE_DIR", s.profile_dir, True))
    if not asked:
        return Line("files", "off", "no setting asks for a file (JSONL, snapshots, traces)", {"directories": {}})
    problems, shown = [], {}
    for setting, directory, created in asked:
        path = os.path.abspath(directory)
        shown[setting] = path
        why = _not_writable(path, created)
        if why is not None:
            problems.append(f"{setting}: {why}")
    details = {"directories": shown}
    if problems:
        return Line("files", "fail", "; ".join(problems), details)
    return Line("files", "ok", "writable: " + ", ".join(f"{k} {v}" for k, v in shown.items()), details)


def _not_writable(path: str, created: bool) -> str | None:
    """Why files cannot be written into directory ``path``, or None (``created``: missing folders are made)."""
    if not os.path.exists(path):
        if not created:
            return f"the folder {path} does not exist"
        parent = path
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            return f"{parent} is not a folder, so {path} cannot be made"
        return None if os.access(parent, os.W_OK | os.X_OK) else f"{path} cannot be made: {parent} is not writable"
    if not os.path.isdir(path):
        return f"{path} is not a folder"
    return None if os.access(path, os.W_OK | os.X_OK) else f"the folder {path} is not writable"


# The modules of the core that declare seams (each declares its own at import); imported so the registry
# is whole. The integrations' modules are imported by their lines (their descriptions).
_SEAM_MODULES = ("gpuprobe._capture", "gpuprobe._sync_audit", "gpuprobe._bootstrap",
                 "gpuprobe.integrations.opentelemetry")


def _seams(ctx: _Context) -> Line:
    from . import _seams

    for name in _SEAM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # its library is not installed: its seams are not declared either
            pass
    checked: dict[str, str | None] = {}  # seam -> why it is refused (None: it fits)
    against = []
    if ctx.torch is not None:
        from ._capture import SEAM_BEGIN, SEAM_END

        graph = getattr(ctx.torch.cuda, "CUDAGraph", None)
        if graph is not None:  # a torch without it captures no graphs: nothing to guard
            for seam in (SEAM_BEGIN, SEAM_END):
                checked[seam.name] = seam.mismatch(graph)
            against.append(f"torch {ctx.torch.__version__}")
    checked.update(ctx.seam_checks)
    against += ctx.checked_against
    rows = []
    for st in _seams.status():
        state, why = st["state"], st["why"]
        if state == "on" and checked.get(st["seam"]) is not None:
            state, why = "refused", checked[st["seam"]]
        rows.append({"seam": st["seam"], "library": st["library"], "state": state, "why": why,
                     "checked": st["seam"] in checked})
    details = {"seams": rows, "checked_against": against}
    bad = [r for r in rows if r["state"] != "on"]
    n_checked = sum(r["checked"] for r in rows)
    later = len(rows) - n_checked
    base = (f"{n_checked} of {len(rows)} seams shape-checked against {' and '.join(against)}" if against else
            f"none of {len(rows)} seams could be shape-checked (neither torch nor a supported version of an "
            "integrated library)")
    base += f"; {later} are checked on the objects they patch, when installed"
    notes = tuple(f"{r['seam']}: {r['state']}: {r['why']}" for r in bad)
    if bad:
        return Line("seams", "fail", f"{len(bad)} refused or off: the integration measures less there; {base}",
                    details, notes)
    if not against:
        return Line("seams", "off", base, details)
    return Line("seams", "ok", f"all fit: {base}", details)


_CHECKS: tuple[tuple[str, Callable[[_Context], Line | list[Line]]], ...] = (
    ("python", _python),
    ("settings", _settings),
    ("torch", _torch),
    ("threads", _threads),
    ("integrations", _integrations),
    ("cuda", _cuda),
    ("device timing", _device_timing),
    ("nvtx", _nvtx),
    ("kernel sampling", _kernel_sampling),
    ("nvml", _nvml),
    ("prometheus", _prometheus),
    ("otlp", _otlp),
    ("files", _files),
    ("seams", _seams),
)


# -- running and showing -----------------------------------------------------------------------------------

def diagnose(settings: Any = None) -> list[Line]:
    """Run every check; never raises.

    Args:
        settings: the settings to judge by; default: read from the ``GPUPROBE_*`` variables (a bad
            value is the ``settings`` line's failure, and the other lines use the defaults).

    Returns:
        One :class:`Line` per check (one per CUDA device too), in the order shown.
    """
    error = None
    if settings is None:
        try:
            settings = config.load()
        except ConfigError as exc:
            settings, error = config.Config(), str(exc)
    ctx = _Context(settings, error)
    lines: list[Line] = []
    for name, check in _CHECKS:
        try:
            found = check(ctx)
        except Exception as exc:  # a check's own failure is a line, never a traceback
            found = Line(name, "fail", f"the check raised {type(exc).__name__}: {exc}")
        lines.extend(found if isinstance(found, list) else [found])
    return lines


def exit_status(lines: list[Line]) -> int:
    """1 when any line fails, else 0."""
    return 1 if any(line.state == "fail" for line in lines) else 0


def render_text(lines: list[Line]) -> str:
    """The lines as a table: state, check, reason; refused seams under theirs; a summary of failures."""
    width = max(len(line.check) for line in lines)
    out = [f"gpuprobe doctor: gpuprobe {__version__} ({os.path.dirname(os.path.abspath(__file__))})"]
    for line in lines:
        out.append(f"{line.state:<4}  {line.check:<{width}}  {line.reason}")
        out += [f"{'':<4}  {'':<{width}}    {note}" for note in line.notes]
    failed = [line.check for line in lines if line.state == "fail"]
    out.append(f"{len(failed)} failed: {', '.join(failed)}" if failed else "nothing failed")
    return "\n".join(out)


def render_json(lines: list[Line]) -> str:
    """``{"schema", "gpuprobe", "exit_status", "checks": [{"check", "state", "reason", "details", "notes"}]}``."""
    return json.dumps({
        "schema": SCHEMA,
        "gpuprobe": __version__,
        "exit_status": exit_status(lines),
        "checks": [{"check": line.check, "state": line.state, "reason": line.reason, "details": line.details,
                    "notes": list(line.notes)} for line in lines],
    }, indent=2, default=str)


def main(argv: list[str] | None = None) -> int:
    """``gpuprobe doctor [--json]``; returns 0 when no line fails, 1 otherwise, 2 for bad usage."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    unknown = [a for a in args if a != "--json"]
    if unknown:
        print(f"gpuprobe doctor: unknown argument(s) {' '.join(unknown)}\n\n{USAGE}", file=sys.stderr)
        return 2
    import warnings

    with warnings.catch_warnings():  # what the checks find is on their lines, not in warnings
        warnings.simplefilter("ignore")
        lines = diagnose()
    print(render_json(lines) if "--json" in args else render_text(lines))
    return exit_status(lines)


def _release(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` → ``(2, 13, 0)``: the leading numbers of a version."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for c in piece:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def _declared_floor(package: str) -> str | None:
    """The ``>=`` bound gpuprobe's installed metadata declares for ``package`` (pyproject.toml's extras)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("gpuprobe") or []
    except PackageNotFoundError:
        return None
    for req in reqs:
        m = _REQUIREMENT.match(req)
        if m and m.group(1).lower() == package:
            for part in m.group(2).split(","):
                part = part.strip()
                if part.startswith(">="):
                    return part[2:].strip()
    return None
