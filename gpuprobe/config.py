"""Settings, declared once: each field of :class:`Config` names its environment variable, parser,
default and meaning, and everything else — reading ``GPUPROBE_*`` variables, validating the keywords
of :func:`gpuprobe.configure`, the settings table in ``docs/quickstart.md`` — is derived from it.

A bad keyword value raises :class:`~gpuprobe.errors.ConfigError` naming the keyword and the value (the
caller's own code asked for it). A variable of the environment that gpuprobe cannot use never stops the
program: :func:`from_environment` replaces it by its default and reports it as a :class:`Problem`, which
the runtime warns once; ``RANK`` / ``LOCAL_RANK`` of -1 (what launchers set for a single process) mean
"no rank" without a word. :func:`load` stays strict for the tools that judge settings (``gpuprobe doctor``).
The table of every setting: :func:`settings_table` (``python -m gpuprobe.config``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import string
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError

__all__ = ["Config", "Setting", "SETTINGS", "Problem", "load", "from_environment", "replace", "parse_steps",
           "parse_duration", "settings_table"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

Parser = Callable[[str, Any], Any]


# -- parsers: (the name to show in an error, the raw value) -> the value ---------------------------

def _bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def _int(low: int, high: int | None = None) -> Parser:
    def parse(name: str, raw: Any) -> int:
        if isinstance(raw, bool) or isinstance(raw, float):
            raise ConfigError(f"{name} must be an integer, got {raw!r}")
        try:
            value = raw if isinstance(raw, int) else int(str(raw).strip())
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise ConfigError(f"{name} must be {bound}, got {raw!r}")
        return value

    return parse


def _seconds(high: float) -> Parser:
    """A number of seconds > 0 and at most ``high`` (a thread waits on it: an unbounded one overflows)."""

    def parse(name: str, raw: Any) -> float:
        try:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw) if isinstance(raw, (int, float)) else float(str(raw).strip())
        except (ValueError, OverflowError):
            raise ConfigError(f"{name} must be a number, got {raw!r}") from None
        if not 0 < value <= high:
            raise ConfigError(f"{name} must be a number of seconds > 0 and at most {high:g}, got {raw!r}")
        return value

    return parse


def _every_or_auto(name: str, raw: Any) -> int | str:
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    try:
        return _int(1)(name, raw)
    except ConfigError:
        raise ConfigError(f"{name} must be 'auto' or an integer >= 1, got {raw!r}") from None


def _url(name: str, raw: Any) -> str:
    text = str(raw).strip()
    if not (text.startswith("http://") or text.startswith("https://")) or len(text) < 10:
        raise ConfigError(f"{name} must be an http:// or https:// URL, got {raw!r}")
    return text


def _choice(*choices: str) -> Parser:
    def parse(name: str, raw: Any) -> str:
        text = str(raw).strip().lower()
        if text not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return text

    return parse


def _nonempty(name: str, raw: Any) -> str:
    text = str(raw)
    if not text.strip():
        raise ConfigError(f"{name} must not be empty")
    return text


_HOST = re.compile(r"^(\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_]([A-Za-z0-9_.:-]{0,252}))$")


def _hosts(name: str, raw: Any) -> str:
    """Host names or addresses, comma-separated (``*``: every host), as one normalized string."""
    if isinstance(raw, (list, tuple)):
        raw = ",".join(map(str, raw))
    if not isinstance(raw, str):
        raise ConfigError(f"{name} must be host names separated by commas (such as 'metrics.internal,10.0.0.5'), "
                          f"got {raw!r}")
    names = [part.strip().lower() for part in raw.split(",") if part.strip()]
    bad = [n for n in names if not _HOST.match(n)]
    if bad:
        shown = repr(bad[0]) if len(bad[0]) <= 80 else repr(bad[0][:77] + "...")
        raise ConfigError(f"{name} must be host names or addresses separated by commas, or *; {shown} is not one")
    return ",".join(dict.fromkeys(names))


def _path(name: str, raw: Any) -> str:
    """A file or folder path: a ``str`` or ``os.PathLike[str]``, not blank (never ``str()`` of anything else,
    which would name a file ``<object object at ...>``)."""
    path = os.fspath(raw) if isinstance(raw, (str, os.PathLike)) else None
    if not isinstance(path, str):  # bytes from a PathLike, or not a path at all
        shown = repr(raw)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ConfigError(f"{name} must be a path (str or os.PathLike[str]), got {shown} ({type(raw).__name__})")
    if not path.strip():
        raise ConfigError(f"{name} must not be empty")
    return path


def _trace_output(name: str, raw: Any) -> str:
    text = _nonempty(name, raw)
    if text not in ("auto", "none") and not (text.endswith(".json") or text.endswith(".json.gz")):
        raise ConfigError(f"{name} must be 'auto', 'none' or a path ending in .json or .json.gz, got {raw!r}")
    return text


_NAME_FIELDS = {"first": 0, "last": 0, "rank": 0, "pid": 0, "reason": "request"}
# A field may be padded (`{first:05d}`, `{reason:>8}`) but not to a width that builds a huge name.
_NAME_SPEC = re.compile(r"^(?:.?[<>^=])?0?[0-9]{0,2}[ds]?$")


def _trace_name(name: str, raw: Any) -> str:
    text = _nonempty(name, raw).strip()
    if "/" in text or "\\" in text or text in (".", ".."):
        raise ConfigError(f"{name} must be a file name (the folder is GPUPROBE_PROFILE_DIR), got {raw!r}")
    if len(text) > 200:
        raise ConfigError(f"{name} must be at most 200 characters, got {len(text)}")
    try:
        specs = [spec for _, field, spec, _ in string.Formatter().parse(text) if field is not None and spec]
    except ValueError as exc:
        raise ConfigError(f"{name} may use the fields {{first}} {{last}} {{rank}} {{pid}} {{reason}} only, "
                          f"got {raw!r} ({exc})") from None
    bad = [spec for spec in specs if not _NAME_SPEC.match(spec)]
    if bad:
        raise ConfigError(f"{name} may pad a field to at most 99 characters (such as {{first:05d}}), "
                          f"got the format {bad[0]!r} in {raw!r}")
    try:
        shown = text.format(**_NAME_FIELDS)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"{name} may use the fields {{first}} {{last}} {{rank}} {{pid}} {{reason}} only, "
                          f"got {raw!r} ({exc!r})") from None
    if not (shown.endswith(".json") or shown.endswith(".json.gz")):
        raise ConfigError(f"{name} must end in .json or .json.gz, got {raw!r}")
    return text


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ns|us|ms|s|min|m|h)?\s*$")
_SECONDS = {None: 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: Any, setting: str = "duration") -> float:
    """``"250ms"`` → 0.25 seconds; a bare number is seconds; units ns us ms s m (minutes) min h.

    Raises:
        ConfigError: not a duration > 0; the message names ``setting``.

    Example:
        >>> parse_duration("10m"), parse_duration("250ms"), parse_duration(2)
        (600.0, 0.25, 2.0)
    """
    m = None if isinstance(text, bool) else _DURATION.match(str(text))
    value = float(m.group(1)) * _SECONDS[m.group(2)] if m else 0.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{setting} must be a time > 0 such as 250ms, 0.25 (seconds), 30s or 10m, got {text!r}")
    return value


def _duration(name: str, raw: Any) -> float:
    return parse_duration(raw, name)


_PERCENTILE = re.compile(r"^\s*p([0-9]+(?:\.[0-9]+)?)\s*$", re.IGNORECASE)


def _slow_step(name: str, raw: Any) -> str:
    """``"p99"`` (a percentile of recent steps, 0 < q < 100) or a time; kept as ``"p99"`` or ``"0.25s"``."""
    m = _PERCENTILE.match(str(raw))
    if m:
        q = float(m.group(1))
        if not 0 < q < 100:
            raise ConfigError(f"{name} must be a percentile between p0 and p100 (exclusive), such as p99, got {raw!r}")
        return f"p{q:g}"
    try:
        return f"{parse_duration(raw, name):g}s"
    except ConfigError:
        raise ConfigError(f"{name} must be a percentile of recent steps (p99, p99.9) or a time (250ms, 0.25), "
                          f"got {raw!r}") from None


_SIGNALS = ("SIGUSR1", "SIGUSR2")


def _signal_name(name: str, raw: Any) -> str:
    text = str(raw).strip().upper()
    if text.lower() in _FALSE or text == "NONE":
        return "off"
    if not text.startswith("SIG"):
        text = "SIG" + text
    if text not in _SIGNALS:
        raise ConfigError(f"{name} must be one of {', '.join(_SIGNALS)} or off, got {raw!r}")
    if not hasattr(signal, text):
        raise ConfigError(f"{name}: {text} does not exist on this platform; set it to off")
    return text


# Decimal multipliers, case-insensitive: "3.35T" = 3.35e12 (k, M, G, T, P).
_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtTpP]?)\s*$")


def _rate(what: str, example: str) -> Parser:
    def parse(name: str, raw: Any) -> float:
        if isinstance(raw, bool):
            raise ConfigError(f"{name} must be a number of {what} > 0 such as {example}, got {raw!r}")
        if isinstance(raw, (int, float)):
            value = float(raw)
        else:
            m = _RATE.match(str(raw))
            if not m:
                raise ConfigError(f"{name} must be a number of {what} > 0 such as {example}, got {raw!r}")
            value = float(m.group(1)) * _SI[m.group(2).lower()]
        if not value > 0 or value == float("inf"):
            raise ConfigError(f"{name} must be a number of {what} > 0 such as {example}, got {raw!r}")
        return value

    return parse


_STEPS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_steps(text: Any, setting: str = "steps") -> tuple[int, int]:
    """``"100-150"`` → ``(100, 150)``; ``"7"`` → ``(7, 7)``. Bounds are inclusive.

    Raises:
        ConfigError: not ``A`` or ``A-B`` with ``A <= B``; the message names ``setting``.

    Example:
        >>> parse_steps("100-150")
        (100, 150)
    """
    m = _STEPS.match(str(text))
    if not m:
        raise ConfigError(f"{setting} must look like 'A-B' (steps A to B, inclusive) or 'A', got {text!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        raise ConfigError(f"{setting} must have A <= B in 'A-B', got {text!r}")
    return first, last


def _steps(name: str, raw: Any) -> str:
    first, last = parse_steps(raw, name)
    return f"{first}-{last}"


_MAX_RANK = 2**31 - 1
_MAX_LOCAL_RANK = 65535  # it is added to a TCP port


# -- the declaration -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Setting:
    """How one setting is read: its variable, parser, meaning; ``optional`` settings accept None."""

    env: str
    parse: Parser
    doc: str
    optional: bool = False


def _setting(env: str, parse: Parser, default: Any, doc: str, *, optional: bool = False) -> Any:
    return dataclasses.field(default=default, metadata={"setting": Setting(env, parse, doc, optional)})


@dataclasses.dataclass(frozen=True)
class Config:
    """All gpuprobe settings, validated. Build with :func:`load` or :func:`gpuprobe.configure`.

    Example:
        >>> Config().memory
        False
    """

    disable: bool = _setting(
        "GPUPROBE_DISABLE", _bool, False,
        "1 at import: `@probe` hands back the function itself; `configure(disable=)` switches probes at run time")
    memory: bool = _setting("GPUPROBE_MEMORY", _bool, False, "memory readings at the end of every probe")
    memory_peak_reset: bool = _setting(
        "GPUPROBE_MEMORY_PEAK_RESET", _bool, False,
        "reset the CUDA allocator's peak after each reading, so `gpuprobe.memory.peak` is the peak since the "
        "previous reading (per step or call) instead of the process's lifetime peak; this also resets what "
        "`torch.cuda.max_memory_allocated` returns to your code")
    device_timing: str = _setting(
        "GPUPROBE_DEVICE_TIMING", _choice("auto", "cuda", "off"), "auto",
        "device spans from CUDA events: auto (when torch with CUDA is imported before the first probe), cuda, off")
    prometheus_port: int | None = _setting(
        "GPUPROBE_PROMETHEUS_PORT", _int(0, 65535), None, "serve /metrics on this port at first use",
        optional=True)
    prometheus_addr: str = _setting("GPUPROBE_PROMETHEUS_ADDR", _nonempty, "127.0.0.1",
                                    "address the /metrics server binds")
    allowed_hosts: str | None = _setting(
        "GPUPROBE_ALLOWED_HOSTS", _hosts, None,
        "more names the /metrics port answers for in a request's `Host` (comma-separated; `*`: any), besides "
        "localhost, loopback addresses, the bound address and, off loopback, the machine's name (docs/capture.md)",
        optional=True)
    port_by_local_rank: bool = _setting("GPUPROBE_PORT_BY_LOCAL_RANK", _bool, True,
                                        "add LOCAL_RANK to the Prometheus port (one port per local rank)")
    otlp_endpoint: str | None = _setting("GPUPROBE_OTLP_ENDPOINT", _url, None,
                                         "push OTLP/HTTP metrics to this URL", optional=True)
    otlp_interval: float = _setting("GPUPROBE_OTLP_INTERVAL", _seconds(86400), 5.0, "seconds between OTLP pushes")
    otlp_timeout: float = _setting("GPUPROBE_OTLP_TIMEOUT", _seconds(3600), 2.0, "seconds one OTLP push may take")
    jsonl: str | None = _setting("GPUPROBE_JSONL", _path, None,
                                 "write every observation to this JSON-lines file", optional=True)
    max_label_values: int = _setting("GPUPROBE_MAX_LABEL_VALUES", _int(1, 100_000), 100,
                                     "distinct values per label before new ones fold into `other`")
    buffer_size: int = _setting("GPUPROBE_BUFFER_SIZE", _int(16, 10_000_000), 4096,
                                "records a thread buffers before it aggregates them itself")
    collect_interval: float = _setting("GPUPROBE_COLLECT_INTERVAL", _seconds(3600), 0.5,
                                       "seconds between background collections")
    snapshot_at_step: int | None = _setting("GPUPROBE_SNAPSHOT_AT_STEP", _int(0), None,
                                            "dump a CUDA memory snapshot at this step", optional=True)
    snapshot_on_oom: bool = _setting("GPUPROBE_SNAPSHOT_ON_OOM", _bool, False,
                                     "dump a CUDA memory snapshot at every out-of-memory error")
    snapshot_dir: str = _setting("GPUPROBE_SNAPSHOT_DIR", _path, ".", "where triggered snapshots go")
    snapshot_stacks: str = _setting(
        "GPUPROBE_SNAPSHOT_STACKS", _choice("python", "all", "none"), "python",
        "allocation stacks in triggered snapshots: python (cheap), all (C++ too, slow), none")
    rank: int = _setting("RANK", _int(0, _MAX_RANK), 0,
                         "this process's rank (the `gpuprobe.rank` label); -1 in the environment: no rank (0)")
    local_rank: int = _setting("LOCAL_RANK", _int(0, _MAX_LOCAL_RANK), 0,
                               "this process's rank on its machine; -1 in the environment: no rank (0)")
    profile_steps: str | None = _setting("GPUPROBE_PROFILE_STEPS", _steps, None,
                                         "capture steps A-B (see `gpuprobe.profile`)", optional=True)
    profile_output: str = _setting(
        "GPUPROBE_PROFILE_OUTPUT", _trace_output, "auto",
        "the torch.profiler trace of that window (.json or .json.gz); auto: a file per rank, or none when "
        "`profile_nsys` is on; none: no torch.profiler trace")
    profile_nsys: bool = _setting("GPUPROBE_PROFILE_NSYS", _bool, False,
                                  "bracket the window with cudaProfilerStart/Stop for nsys")
    profile_endpoint: str = _setting(
        "GPUPROBE_PROFILE_ENDPOINT", _choice("auto", "on", "off"), "auto",
        "`POST /gpuprobe/profile?steps=N` on the /metrics port captures the next N steps (docs/capture.md); "
        "auto: only while that port binds a loopback address")
    profile_signal: str = _setting(
        "GPUPROBE_PROFILE_SIGNAL", _signal_name, "off",
        "this signal captures the next `profile_on_demand_steps` steps: SIGUSR1, SIGUSR2 or off (off unless asked: "
        "a library takes no signal of its program's; `gpuprobe run` sets SIGUSR2; installed from the main thread, "
        "never over a handler of the program's)")
    profile_on_demand_steps: int = _setting(
        "GPUPROBE_PROFILE_ON_DEMAND_STEPS", _int(1), 5,
        "steps a capture by signal, or by a POST without `steps=`, records")
    profile_max_steps: int = _setting("GPUPROBE_PROFILE_MAX_STEPS", _int(1), 100,
                                      "most steps a POST to the profile endpoint may ask for")
    profile_dir: str = _setting("GPUPROBE_PROFILE_DIR", _path, "gpuprobe-traces",
                                "where on-demand traces go (endpoint, signal, slow steps), made at the first "
                                "capture; a relative folder is under the current folder")
    profile_name: str = _setting(
        "GPUPROBE_PROFILE_NAME", _trace_name, "gpuprobe-steps-{first}-{last}-rank{rank}.json.gz",
        "file name of an on-demand trace (.json or .json.gz); fields {first} {last} {rank} {pid} {reason}")
    profile_keep: int = _setting(
        "GPUPROBE_PROFILE_KEEP", _int(0), 20,
        "on-demand traces of this process kept in `profile_dir`: past it, writing a new one removes the oldest "
        "(0: keep every one)")
    profile_slow_step: str | None = _setting(
        "GPUPROBE_PROFILE_SLOW_STEP", _slow_step, None,
        "capture the next `profile_slow_step_steps` steps when a decode step takes longer than this: a "
        "percentile of the last 1000 decode steps (p99) or a time (250ms, 0.25)", optional=True)
    profile_slow_step_interval: float = _setting(
        "GPUPROBE_PROFILE_SLOW_STEP_INTERVAL", _duration, 600.0,
        "at most one slow-step capture per this time (seconds, or 30s, 10m, 1h)")
    profile_slow_step_steps: int = _setting("GPUPROBE_PROFILE_SLOW_STEP_STEPS", _int(1), 3,
                                            "steps a slow-step capture records")
    kernel_sampling: int = _setting("GPUPROBE_KERNEL_SAMPLING", _int(0), 0,
                                    "profile one step in N for live kernel categories (0: off)")
    sync_audit: int = _setting(
        "GPUPROBE_SYNC_AUDIT", _int(0), 0,
        "count the operations that force a device-to-host sync on one generation step in N, by component "
        "(`gpuprobe.step.syncs`, see docs/sync-audit.md; 0: off)")
    peak_memory_bandwidth: float | None = _setting(
        "GPUPROBE_PEAK_MEMORY_BANDWIDTH", _rate("bytes per second", "3.35e12 or 3.35T"), None,
        "peak memory bandwidth (bytes/s; suffixes k M G T P) for `gpuprobe.step.memory_bandwidth.utilization`, "
        "on every device; none: the GPU's from the table in docs/utilization.md", optional=True)
    peak_flops: float | None = _setting(
        "GPUPROBE_PEAK_FLOPS", _rate("FLOP/s", "989.5e12 or 989.5T"), None,
        "peak FLOP/s (suffixes k M G T P) for `gpuprobe.step.flops.utilization`, on every device and for every "
        "dtype; none: the GPU's dense figure for the model's dtype from the table in docs/utilization.md",
        optional=True)
    nvml: bool = _setting(
        "GPUPROBE_NVML", _bool, False,
        "GPU health gauges from NVML (utilization, memory, SM clock, power, temperature, throttling; SM and "
        "tensor-core activity on GPUs with GPM) for every GPU the process can see, read on the background thread "
        "every `collect_interval`; needs `gpuprobe[nvml]` (docs/gpu.md)")
    traces: str = _setting(
        "GPUPROBE_TRACES", _choice("auto", "on", "off"), "auto",
        "a span per request (OpenTelemetry GenAI conventions, docs/tracing.md): auto: to your TracerProvider when "
        "you set one, else over OTLP when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set; "
        "on: also to http://localhost:4318/v1/traces when neither is; off: none")
    requests_kept: int = _setting(
        "GPUPROBE_REQUESTS_KEPT", _int(0, 1_000_000), 1000,
        "records of finished requests kept in memory, the newest (`gpuprobe.requests()`, `/requests`; "
        "docs/requests.md); 0: none")
    slo_ttft: float | None = _setting(
        "GPUPROBE_SLO_TTFT", _duration, None,
        "a request meets its service-level goal only if its time to first token is at most this (250ms, 0.25); "
        "counted in `gpuprobe.requests.slo` (docs/requests.md)", optional=True)
    slo_tpot: float | None = _setting(
        "GPUPROBE_SLO_TPOT", _duration, None,
        "... and its time per output token at most this (50ms)", optional=True)
    slo_e2e: float | None = _setting(
        "GPUPROBE_SLO_E2E", _duration, None,
        "... and its whole duration at most this (10s)", optional=True)
    log_interval: float | None = _setting(
        "GPUPROBE_LOG_INTERVAL", _seconds(86400), None,
        "log one line every this many seconds with what happened since the last one (requests, tokens/s, TTFT and "
        "TPOT p50/p99, decode step p50/p99, running/waiting requests, KV cache, memory), to the `gpuprobe` logger "
        "(stderr when logging is not set up); none: off", optional=True)
    device_every: int | str = _setting(
        "GPUPROBE_DEVICE_EVERY", _every_or_auto, "auto",
        "probes take a device span (CUDA events) on one recorded call in N, host time on every call; auto: every "
        "call until a probe takes over 1000 spans a second, then sampled to about that (see docs/gpu.md)")


def _settings() -> dict[str, Setting]:
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(Config)}


SETTINGS: dict[str, Setting] = _settings()
"""Every setting by keyword."""

# An empty variable means "not set", except for switches, where it means off.
_EMPTY_IS_VALUE = {name for name, s in SETTINGS.items() if s.parse is _bool}


def _parse(key: str, shown: str, raw: Any) -> Any:
    setting = SETTINGS[key]
    if raw is None and setting.optional:
        return None
    return setting.parse(shown, raw)


# Launchers and training scripts set these to -1 for a run of one process (transformers' own
# `local_rank` default): "no rank", not a mistake.
_NO_RANK = {"rank", "local_rank"}
_NO_RANK_VALUE = re.compile(r"^\s*-[0-9]+\s*$")


@dataclasses.dataclass(frozen=True)
class Problem:
    """A variable of the environment gpuprobe cannot use: what it says, why not, and what is used instead."""

    variable: str
    value: str
    reason: str
    used: str

    def message(self) -> str:
        """One line for a warning: the variable, the value, why, what is used instead."""
        return f"gpuprobe: {self.variable}={self.value!r} cannot be used ({self.reason}); using {self.used} instead"


def _shown_default(key: str) -> str:
    value = Config.__dataclass_fields__[key].default
    if value is None:
        return "none (off)"
    if isinstance(value, bool):
        return "the default (" + ("on" if value else "off") + ")"
    return f"the default {value}"


def _read(env: Mapping[str, str], problems: list[Problem] | None) -> Config:
    values: dict[str, Any] = {}
    for key, setting in SETTINGS.items():
        raw = env.get(setting.env)
        if raw is None or (raw == "" and key not in _EMPTY_IS_VALUE):
            continue
        if key in _NO_RANK and _NO_RANK_VALUE.match(raw):
            continue
        if problems is None:
            values[key] = _parse(key, setting.env, raw)
            continue
        try:
            values[key] = _parse(key, setting.env, raw)
        except ConfigError as exc:
            reason = str(exc).removeprefix(f"{setting.env} ")
            problems.append(Problem(setting.env, raw if len(raw) <= 200 else raw[:200] + "...", reason,
                                    "no rank (0)" if key in _NO_RANK else _shown_default(key)))
    return Config(**values)


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Read a :class:`Config` from ``GPUPROBE_*`` variables (and RANK / LOCAL_RANK), strictly.

    What a program uses is :func:`from_environment`, which never raises; this is for the tools that
    judge settings (``gpuprobe doctor``).

    Args:
        environ: the variables to read; ``os.environ`` when None.

    Raises:
        ConfigError: a variable has a bad value; the message names it.

    Example:
        >>> load({"GPUPROBE_MEMORY": "1"}).memory
        True
    """
    return _read(os.environ if environ is None else environ, None)


def from_environment(environ: Mapping[str, str] | None = None) -> tuple[Config, tuple[Problem, ...]]:
    """Read a :class:`Config` from the environment, never raising: a value gpuprobe cannot use is
    replaced by its default and reported; ``RANK`` / ``LOCAL_RANK`` below 0 mean no rank.

    Args:
        environ: the variables to read; ``os.environ`` when None.

    Returns:
        The settings, and one :class:`Problem` per variable that could not be used.

    Example:
        >>> cfg, problems = from_environment({"GPUPROBE_MEMORY": "1", "GPUPROBE_BUFFER_SIZE": "abc"})
        >>> cfg.memory, cfg.buffer_size, [p.variable for p in problems]
        (True, 4096, ['GPUPROBE_BUFFER_SIZE'])
    """
    problems: list[Problem] = []
    cfg = _read(os.environ if environ is None else environ, problems)
    return cfg, tuple(problems)


def replace(base: Config, **changes: Any) -> Config:
    """Return ``base`` with keyword ``changes`` validated and applied.

    Raises:
        ConfigError: an unknown keyword or a bad value; the message names the keyword.

    Example:
        >>> replace(Config(), buffer_size="64").buffer_size
        64
    """
    parsed: dict[str, Any] = {}
    for key, raw in changes.items():
        if key not in SETTINGS:
            raise ConfigError(f"unknown gpuprobe setting {key!r}; known: {', '.join(sorted(SETTINGS))}")
        parsed[key] = _parse(key, key, raw)
    return dataclasses.replace(base, **parsed)


def settings_table() -> str:
    """The Markdown table of every setting (``docs/quickstart.md`` holds a copy a test keeps current).

    Example:
        >>> settings_table().splitlines()[0]
        '| variable | keyword | default | meaning |'
    """
    lines = ["| variable | keyword | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Config):
        s: Setting = f.metadata["setting"]
        value: Any = f.default
        default = "none" if value is None else ("1" if value is True else "0" if value is False else str(value))
        lines.append(f"| `{s.env}` | `{f.name}` | {default} | {s.doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(settings_table())
