"""Settings: one frozen :class:`Config`, read strictly from ``GPUPROBE_*`` variables and arguments.

Every setting has an environment variable and a keyword of :func:`gpuprobe.configure`. A bad value
raises :class:`~gpuprobe.errors.ConfigError` naming the variable (or keyword) and the value.

| variable | keyword | default | meaning |
|---|---|---|---|
| GPUPROBE_DISABLE | (none) | 0 | 1: ``@probe`` returns the function itself (read at import) |
| GPUPROBE_MEMORY | memory | 0 | memory readings at the end of every probe |
| GPUPROBE_DEVICE_TIMING | device_timing | auto | auto, cuda or off |
| GPUPROBE_PROMETHEUS_PORT | prometheus_port | (none) | serve /metrics on this port at first use |
| GPUPROBE_PROMETHEUS_ADDR | prometheus_addr | 127.0.0.1 | address the /metrics server binds |
| GPUPROBE_OTLP_ENDPOINT | otlp_endpoint | (none) | push OTLP/HTTP metrics to this URL |
| GPUPROBE_OTLP_INTERVAL | otlp_interval | 5 | seconds between pushes |
| GPUPROBE_OTLP_TIMEOUT | otlp_timeout | 2 | seconds one push may take |
| GPUPROBE_JSONL | jsonl | (none) | write every observation to this JSON-lines file |
| GPUPROBE_MAX_LABEL_VALUES | max_label_values | 100 | distinct values per label before folding into ``other`` |
| GPUPROBE_BUFFER_SIZE | buffer_size | 4096 | records a thread buffers before it aggregates them itself |
| GPUPROBE_COLLECT_INTERVAL | collect_interval | 0.5 | seconds between background collections |
| GPUPROBE_SNAPSHOT_AT_STEP | snapshot_at_step | (none) | dump a CUDA memory snapshot at this step |
| GPUPROBE_SNAPSHOT_ON_OOM | snapshot_on_oom | 0 | dump a snapshot on ``torch.cuda.OutOfMemoryError`` in a probe |
| GPUPROBE_SNAPSHOT_DIR | snapshot_dir | . | where triggered snapshots go |
| GPUPROBE_PORT_BY_LOCAL_RANK | port_by_local_rank | 1 | add LOCAL_RANK to the Prometheus port |
| GPUPROBE_PROFILE_STEPS | profile_steps | (none) | capture steps A-B with torch.profiler |
| GPUPROBE_PROFILE_OUTPUT | profile_output | auto | the trace file of that window (.json or .json.gz) |
| GPUPROBE_PROFILE_NSYS | profile_nsys | 0 | also bracket the window with cudaProfilerStart/Stop |
| GPUPROBE_KERNEL_SAMPLING | kernel_sampling | 0 | profile one step in N for live kernel categories (0: off) |
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

__all__ = ["Config", "load", "current", "replace"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclasses.dataclass(frozen=True)
class Config:
    """All gpuprobe settings, validated. Build with :func:`load` or :func:`gpuprobe.configure`."""

    disable: bool = False
    memory: bool = False
    device_timing: str = "auto"
    prometheus_port: int | None = None
    prometheus_addr: str = "127.0.0.1"
    port_by_local_rank: bool = True
    otlp_endpoint: str | None = None
    otlp_interval: float = 5.0
    otlp_timeout: float = 2.0
    jsonl: str | None = None
    max_label_values: int = 100
    buffer_size: int = 4096
    collect_interval: float = 0.5
    snapshot_at_step: int | None = None
    snapshot_on_oom: bool = False
    snapshot_dir: str = "."
    rank: int = 0
    local_rank: int = 0
    profile_steps: str | None = None
    profile_output: str = "auto"
    profile_nsys: bool = False
    kernel_sampling: int = 0


_ENV = {
    "disable": "GPUPROBE_DISABLE",
    "memory": "GPUPROBE_MEMORY",
    "device_timing": "GPUPROBE_DEVICE_TIMING",
    "prometheus_port": "GPUPROBE_PROMETHEUS_PORT",
    "prometheus_addr": "GPUPROBE_PROMETHEUS_ADDR",
    "port_by_local_rank": "GPUPROBE_PORT_BY_LOCAL_RANK",
    "otlp_endpoint": "GPUPROBE_OTLP_ENDPOINT",
    "otlp_interval": "GPUPROBE_OTLP_INTERVAL",
    "otlp_timeout": "GPUPROBE_OTLP_TIMEOUT",
    "jsonl": "GPUPROBE_JSONL",
    "max_label_values": "GPUPROBE_MAX_LABEL_VALUES",
    "buffer_size": "GPUPROBE_BUFFER_SIZE",
    "collect_interval": "GPUPROBE_COLLECT_INTERVAL",
    "snapshot_at_step": "GPUPROBE_SNAPSHOT_AT_STEP",
    "snapshot_on_oom": "GPUPROBE_SNAPSHOT_ON_OOM",
    "snapshot_dir": "GPUPROBE_SNAPSHOT_DIR",
    "profile_steps": "GPUPROBE_PROFILE_STEPS",
    "profile_output": "GPUPROBE_PROFILE_OUTPUT",
    "profile_nsys": "GPUPROBE_PROFILE_NSYS",
    "kernel_sampling": "GPUPROBE_KERNEL_SAMPLING",
    "rank": "RANK",
    "local_rank": "LOCAL_RANK",
}


def _bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def _int(name: str, raw: Any, *, low: int, high: int | None = None) -> int:
    if isinstance(raw, bool):
        raise ConfigError(f"{name} must be an integer, got {raw!r}")
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) else raw
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ConfigError(f"{name} must be {bound}, got {raw!r}")
    return value


def _float(name: str, raw: Any, *, low: float) -> float:
    try:
        value = float(str(raw).strip()) if not isinstance(raw, (int, float)) or isinstance(raw, bool) else float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not value > low or value != value or value == float("inf"):
        raise ConfigError(f"{name} must be a finite number > {low}, got {raw!r}")
    return value


def _url(name: str, raw: Any) -> str:
    text = str(raw).strip()
    if not (text.startswith("http://") or text.startswith("https://")) or len(text) < 10:
        raise ConfigError(f"{name} must be an http:// or https:// URL, got {raw!r}")
    return text


def _choice(name: str, raw: Any, choices: tuple[str, ...]) -> str:
    text = str(raw).strip().lower()
    if text not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return text


def _nonempty(name: str, raw: Any) -> str:
    text = str(raw)
    if not text.strip():
        raise ConfigError(f"{name} must not be empty")
    return text


def _parse(field: str, name: str, raw: Any) -> Any:
    if field == "profile_steps":
        if raw is None:
            return None
        from .profiling import parse_steps  # noqa: PLC0415 - the parser lives with its feature

        first, last = parse_steps(raw, name)
        return f"{first}-{last}"
    if field == "kernel_sampling":
        return _int(name, raw, low=0)
    if field == "profile_output":
        text = _nonempty(name, raw)
        if text not in ("auto", "none") and not (text.endswith(".json") or text.endswith(".json.gz")):
            raise ConfigError(f"{name} must be 'auto', 'none' or a path ending in .json or .json.gz, got {raw!r}")
        return text
    if field in ("disable", "memory", "snapshot_on_oom", "port_by_local_rank", "profile_nsys"):
        return _bool(name, raw)
    if field == "device_timing":
        return _choice(name, raw, ("auto", "cuda", "off"))
    if field == "prometheus_port":
        return None if raw is None else _int(name, raw, low=0, high=65535)
    if field in ("otlp_interval", "otlp_timeout", "collect_interval"):
        return _float(name, raw, low=0.0)
    if field == "otlp_endpoint":
        return None if raw is None else _url(name, raw)
    if field == "max_label_values":
        return _int(name, raw, low=1, high=100_000)
    if field == "buffer_size":
        return _int(name, raw, low=16, high=10_000_000)
    if field == "snapshot_at_step":
        return None if raw is None else _int(name, raw, low=0)
    if field in ("rank", "local_rank"):
        return _int(name, raw, low=0)
    if field in ("jsonl",):
        return None if raw is None else _nonempty(name, raw)
    if field in ("snapshot_dir", "prometheus_addr"):
        return _nonempty(name, raw)
    raise ConfigError(f"unknown gpuprobe setting {field!r}")  # pragma: no cover - guarded by callers


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Read a :class:`Config` from ``GPUPROBE_*`` variables (and RANK / LOCAL_RANK).

    Args:
        environ: the variables to read; ``os.environ`` when None.

    Returns:
        The validated settings.

    Raises:
        ConfigError: a variable has a bad value; the message names it.

    Example:
        >>> load({"GPUPROBE_MEMORY": "1"}).memory
        True
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field, var in _ENV.items():
        raw = env.get(var)
        if raw is None or (raw == "" and field not in ("disable", "memory", "snapshot_on_oom")):
            continue
        values[field] = _parse(field, var, raw)
    return Config(**values)


def replace(base: Config, **changes: Any) -> Config:
    """Return ``base`` with keyword ``changes`` validated and applied.

    Raises:
        ConfigError: an unknown keyword or a bad value; the message names the keyword.
    """
    fields = {f.name for f in dataclasses.fields(Config)}
    parsed: dict[str, Any] = {}
    for key, raw in changes.items():
        if key not in fields:
            raise ConfigError(f"unknown gpuprobe setting {key!r}; known: {', '.join(sorted(fields))}")
        parsed[key] = raw if raw is None and key in _OPTIONAL else _parse(key, key, raw)
    return dataclasses.replace(base, **parsed)


_OPTIONAL = {"prometheus_port", "otlp_endpoint", "jsonl", "snapshot_at_step", "profile_steps"}

_current: Config | None = None


def current() -> Config:
    """The settings in force (read from the environment the first time)."""
    global _current
    if _current is None:
        _current = load()
    return _current


def _set(cfg: Config) -> None:
    global _current
    _current = cfg
