"""What the settings start, in one place above the core: snapshot triggers, a profile window, on-demand
capture triggers (a signal, slow steps), kernel sampling, GPU health gauges (NVML), the count of requests
against their service-level goals, JSONL / OTLP / Prometheus exporters.

:func:`start_from_settings` is registered with the runtime when ``gpuprobe`` is imported and runs
whenever settings are applied (first use, ``configure()``, ``gpuprobe.testing.reset()``). Each
feature's module is imported only when its setting asks for it, so the root package imports no
optional dependency, and the core (:mod:`gpuprobe.runtime`) never imports an exporter. What cannot
start is warned once and left off when the environment asked for it, and raised when the caller's own
``configure(...)`` did (``gpuprobe run`` therefore never stops a program whose port another process holds).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from . import memory
from .config import Config
from .runtime import DISABLED_AT_IMPORT, Runtime, StartFailure, on_start

__all__ = ["start_from_settings"]


class _TriggersHandle:
    """Closing it stops the snapshot triggers and removes their step hook."""

    def __init__(self, rt: Runtime, triggers: memory.SnapshotTriggers) -> None:
        self._rt, self._triggers = rt, triggers

    def close(self) -> None:
        self._rt.remove_step_hook(self._triggers.step)
        self._triggers.close()
        if self._rt.snapshot_triggers is self._triggers:
            self._rt.snapshot_triggers = None


def _snapshot_triggers(rt: Runtime) -> None:
    cfg = rt.settings
    triggers = memory.SnapshotTriggers(cfg.snapshot_dir, at_step=cfg.snapshot_at_step, on_oom=cfg.snapshot_on_oom,
                                       stacks=cfg.snapshot_stacks, warn=rt.warn_once)
    rt.snapshot_triggers = triggers
    rt.add_step_hook(triggers.step)
    rt.add_closeable(_TriggersHandle(rt, triggers), owner="settings")


def _profile_window(rt: Runtime) -> None:
    from .profiling import start_window_from_settings

    start_window_from_settings(rt)


def _on_demand_triggers(rt: Runtime) -> None:
    from . import _on_demand

    _on_demand.start_from_settings(rt)  # on-demand captures: the signal, slow steps (docs/capture.md)


def _kernel_sampling(rt: Runtime) -> None:
    from .profiling import KernelSampler

    KernelSampler(rt.settings.kernel_sampling).attach(rt, owner="settings")


def _gpu_health(rt: Runtime) -> None:
    from . import _nvml

    _nvml.start_from_settings(rt)  # GPU health gauges, read on the background thread


def _service_level_goals(rt: Runtime) -> None:
    from . import _slo

    _slo.start_from_settings(rt)  # a request listener: gpuprobe.requests.slo


def _jsonl(rt: Runtime) -> None:
    from .exporters.jsonl import JsonlExporter

    JsonlExporter(rt.settings.jsonl).attach(rt, owner="settings")  # type: ignore[arg-type]


def _otlp(rt: Runtime) -> None:
    from .exporters.otlp import OtlpExporter

    cfg = rt.settings
    OtlpExporter(cfg.otlp_endpoint, interval=cfg.otlp_interval, timeout=cfg.otlp_timeout).attach(  # type: ignore[arg-type]
        rt, owner="settings")


def _otlp_traces_named() -> bool:
    """Whether the standard variables name an OTLP traces endpoint (read without importing OpenTelemetry)."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip() or env.get("OTEL_EXPORTER_OTLP_ENDPOINT",
                                                                                      "").strip())


def global_tracer_provider() -> Any:
    """The TracerProvider the program set globally, if OpenTelemetry is in use and one is set; else None."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        provider = trace.get_tracer_provider()
    except Exception:
        return None
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider


def _traces_wanted(cfg: Config) -> bool:
    return cfg.traces == "on" or (cfg.traces == "auto" and not DISABLED_AT_IMPORT)


def _traces(rt: Runtime) -> None:
    provider = rt.tracer_provider or global_tracer_provider()
    if provider is None and not (rt.settings.traces == "on" or _otlp_traces_named()):
        _TraceWatch(rt).attach()  # auto: a provider the program sets later starts them then
        return
    _start_traces(rt, provider)


def _start_traces(rt: Runtime, provider: Any) -> Any:
    from .exporters.traces import TraceExporter, traces_endpoint

    cfg = rt.settings
    endpoint = None if provider is not None else traces_endpoint(default=cfg.traces == "on")
    if provider is None and endpoint is None:
        return None
    return TraceExporter(provider, endpoint=endpoint, timeout=cfg.otlp_timeout).attach(rt, owner="settings")


class _TraceWatch:
    """traces=auto with no TracerProvider and no OTLP endpoint yet: each request's end looks (a module
    lookup) for a provider the program has set since, and starts the spans with it."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def attach(self) -> None:
        self._rt.requests.add_listener(self.ended)
        self._rt.add_closeable(self, owner="settings")

    def ended(self, record: Any) -> None:
        provider = global_tracer_provider()
        if provider is None:
            return
        rt = self._rt
        self.close()
        try:
            exporter = _start_traces(rt, provider)
        except Exception as exc:  # never into the program: warned once
            rt.warn_once("traces:start", f"gpuprobe: spans could not be sent to {type(provider).__name__}: {exc!r}")
            return
        if exporter is not None:
            exporter.ended(record)  # the request that found it

    def close(self) -> None:
        self._rt.requests.remove_listener(self.ended)


def _log_line(rt: Runtime) -> None:
    from ._summary import LogLine

    LogLine(rt.settings.log_interval).attach(rt, owner="settings")  # type: ignore[arg-type]


def _metrics_endpoint(rt: Runtime) -> None:
    from .exporters.prometheus import serve

    serve(runtime=rt, owner="settings")  # the port and address of the settings, named as such in errors


Wanted = Callable[[Config], bool]

# (the settings a feature follows, what it is, whether they ask for it, how it starts), in start order.
_FEATURES: tuple[tuple[frozenset[str], str, Wanted, Callable[[Runtime], None]], ...] = (
    (frozenset({"snapshot_at_step", "snapshot_on_oom", "snapshot_dir", "snapshot_stacks"}), "memory snapshot triggers",
     lambda cfg: cfg.snapshot_at_step is not None or cfg.snapshot_on_oom, _snapshot_triggers),
    (frozenset({"profile_steps", "profile_output", "profile_nsys"}), "the profile window",
     lambda cfg: cfg.profile_steps is not None, _profile_window),
    (frozenset({"profile_signal", "profile_slow_step", "profile_slow_step_interval", "profile_slow_step_steps"}),
     "on-demand captures", lambda cfg: (cfg.profile_signal != "off" or bool(cfg.profile_slow_step))
     and not DISABLED_AT_IMPORT, _on_demand_triggers),
    (frozenset({"kernel_sampling"}), "kernel sampling", lambda cfg: bool(cfg.kernel_sampling), _kernel_sampling),
    (frozenset({"nvml"}), "the GPU health gauges (NVML)", lambda cfg: cfg.nvml, _gpu_health),
    (frozenset({"slo_ttft", "slo_tpot", "slo_e2e"}), "the service-level goals",
     lambda cfg: cfg.slo_ttft is not None or cfg.slo_tpot is not None or cfg.slo_e2e is not None,
     _service_level_goals),
    (frozenset({"jsonl"}), "the JSONL exporter", lambda cfg: bool(cfg.jsonl), _jsonl),
    (frozenset({"otlp_endpoint", "otlp_interval", "otlp_timeout"}), "the OTLP exporter",
     lambda cfg: bool(cfg.otlp_endpoint), _otlp),
    (frozenset({"traces", "otlp_timeout"}), "traces", _traces_wanted, _traces),
    (frozenset({"log_interval"}), "the periodic log line", lambda cfg: cfg.log_interval is not None, _log_line),
    (frozenset({"prometheus_port", "prometheus_addr", "port_by_local_rank"}), "/metrics",
     lambda cfg: cfg.prometheus_port is not None, _metrics_endpoint),
)


def start_from_settings(rt: Runtime) -> list[StartFailure]:
    """Start what ``rt.settings`` asks for; everything started is owned by the settings.

    Never raises: what cannot start (a JSONL folder that does not exist, a port another process holds)
    is returned with the settings that asked for it, and the runtime warns or raises (see
    :meth:`gpuprobe.runtime.Runtime.start_from_settings`).
    """
    cfg = rt.settings
    failed: list[StartFailure] = []
    for keys, what, wanted, start in _FEATURES:
        if not wanted(cfg):
            continue
        try:
            start(rt)
        except Exception as exc:
            failed.append((keys, what, exc))
    return failed


on_start(start_from_settings)
