"""What the settings start, in one place above the core: snapshot triggers, a profile window, on-demand
capture triggers (a signal, slow steps), kernel sampling, GPU health gauges (NVML), JSONL / OTLP / Prometheus exporters.

:func:`start_from_settings` is registered with the runtime when ``gpuprobe`` is imported and runs
whenever settings are applied (first use, ``configure()``, ``gpuprobe.testing.reset()``). Each
feature's module is imported only when its setting asks for it, so the root package imports no
optional dependency, and the core (:mod:`gpuprobe.runtime`) never imports an exporter. What cannot
start is warned once and left off when the environment asked for it, and raised when the caller's own
``configure(...)`` did (``gpuprobe run`` therefore never stops a program whose port another process holds).
"""

from __future__ import annotations

from collections.abc import Callable

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


def _jsonl(rt: Runtime) -> None:
    from .exporters.jsonl import JsonlExporter

    JsonlExporter(rt.settings.jsonl).attach(rt, owner="settings")  # type: ignore[arg-type]


def _otlp(rt: Runtime) -> None:
    from .exporters.otlp import OtlpExporter

    cfg = rt.settings
    OtlpExporter(cfg.otlp_endpoint, interval=cfg.otlp_interval, timeout=cfg.otlp_timeout).attach(  # type: ignore[arg-type]
        rt, owner="settings")


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
    (frozenset({"jsonl"}), "the JSONL exporter", lambda cfg: bool(cfg.jsonl), _jsonl),
    (frozenset({"otlp_endpoint", "otlp_interval", "otlp_timeout"}), "the OTLP exporter",
     lambda cfg: bool(cfg.otlp_endpoint), _otlp),
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
