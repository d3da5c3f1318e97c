"""What the settings start, in one place above the core: snapshot triggers, a profile window, on-demand
capture triggers (a signal, slow steps), kernel sampling, GPU health gauges (NVML), JSONL / OTLP / Prometheus exporters.

:func:`start_from_settings` is registered with the runtime when ``gpuprobe`` is imported and runs
whenever settings are applied (first use, ``configure()``, ``gpuprobe.testing.reset()``). Each
feature's module is imported only when its setting asks for it, so the root package imports no
optional dependency, and the core (:mod:`gpuprobe.runtime`) never imports an exporter.
"""

from __future__ import annotations

from . import memory
from .runtime import DISABLED_AT_IMPORT, Runtime, on_start

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


def start_from_settings(rt: Runtime) -> None:
    """Start what ``rt.settings`` asks for; everything started is owned by the settings."""
    cfg = rt.settings
    if cfg.snapshot_at_step is not None or cfg.snapshot_on_oom:
        triggers = memory.SnapshotTriggers(cfg.snapshot_dir, at_step=cfg.snapshot_at_step, on_oom=cfg.snapshot_on_oom,
                                           stacks=cfg.snapshot_stacks, warn=rt.warn_once)
        rt.snapshot_triggers = triggers
        rt.add_step_hook(triggers.step)
        rt.add_closeable(_TriggersHandle(rt, triggers), owner="settings")
    if cfg.profile_steps is not None:
        from .profiling import start_window_from_settings

        start_window_from_settings(rt)
    if (cfg.profile_signal != "off" or cfg.profile_slow_step) and not DISABLED_AT_IMPORT:
        from . import _on_demand

        _on_demand.start_from_settings(rt)  # on-demand captures: the signal, slow steps (docs/capture.md)
    if cfg.kernel_sampling:
        from .profiling import KernelSampler

        KernelSampler(cfg.kernel_sampling).attach(rt, owner="settings")
    if cfg.nvml:
        from . import _nvml

        _nvml.start_from_settings(rt)  # GPU health gauges, read on the background thread
    if cfg.jsonl:
        from .exporters.jsonl import JsonlExporter

        JsonlExporter(cfg.jsonl).attach(rt, owner="settings")
    if cfg.otlp_endpoint:
        from .exporters.otlp import OtlpExporter

        OtlpExporter(cfg.otlp_endpoint, interval=cfg.otlp_interval, timeout=cfg.otlp_timeout).attach(
            rt, owner="settings")
    if cfg.prometheus_port is not None:
        from .exporters.prometheus import serve

        serve(cfg.prometheus_port, cfg.prometheus_addr, runtime=rt, owner="settings")


on_start(start_from_settings)
