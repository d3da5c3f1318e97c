"""gpuprobe: see inside GPU generation — NVTX ranges, non-blocking timings, memory and live metrics.

The public API is small:

- :func:`probe` — decorator / context manager around a region of code;
- :func:`serve` — the Prometheus /metrics endpoint; :func:`configure` — settings and exporters;
- :func:`enable` / :func:`disable` — the run-time switch; :func:`info` — which backends are active;
- :func:`step` — count a generation step (profile windows, snapshot triggers); :func:`collect`;
- :func:`summary` — a readable table of the run so far;
- :func:`requests` — the records of the last requests; :func:`catch_requests` — the records of a block's;
- :mod:`gpuprobe.memory` — readings and snapshots; :mod:`gpuprobe.testing` — helpers for tests.

The root package imports no optional dependency: ``nvtx``, ``prometheus_client``, OpenTelemetry and
transformers are each imported by one module, when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _autostart, memory
from .config import Config
from .errors import ConfigError, GpuprobeError, MissingDependencyError
from ._probe import Probe, disable, enable, is_enabled, probe
from ._requests import RequestRecord, catch_requests
from ._version import __version__
from .runtime import collect

if TYPE_CHECKING:  # the exporter imports prometheus_client, an optional dependency: named for types only
    from ._lifecycle import Owner
    from .exporters.prometheus import Limits, Server
    from .runtime import Runtime

__all__ = [
    "probe", "Probe", "serve", "configure", "profile", "enable", "disable", "is_enabled", "info", "summary", "step",
    "collect", "requests", "catch_requests", "RequestRecord",
    "memory", "Config", "GpuprobeError", "ConfigError", "MissingDependencyError", "__version__",
]


def serve(port: int | None = None, addr: str | None = None, *, runtime: Runtime | None = None,
          owner: Owner = "user", limits: Limits | None = None, in_process: bool = False) -> Server:
    """Serve gpuprobe's metrics for Prometheus at ``http://addr:port/metrics`` (127.0.0.1:9464 by
    default), and the live page at ``http://addr:port/``; needs ``gpuprobe[prometheus]``.

    Every argument is passed to :func:`gpuprobe.exporters.prometheus.serve`, which takes the same ones.

    Args:
        port: TCP port; default the ``prometheus_port`` setting (``GPUPROBE_PROMETHEUS_PORT``) or 9464.
            Under torchrun, ``LOCAL_RANK`` is added (one port per local rank) unless
            ``port_by_local_rank`` (``GPUPROBE_PORT_BY_LOCAL_RANK``) is off. Port 0 picks a free port.
        addr: address to bind; default ``127.0.0.1`` (``GPUPROBE_PROMETHEUS_ADDR``).
        runtime: the runtime to serve (the process's by default).
        owner: ``"user"`` (kept across ``configure()``) or ``"settings"`` (started by the settings).
        limits: how much the server may take from the program
            (:class:`gpuprobe.exporters.prometheus.Limits`: threads, requests waiting, connections, read
            timeout, listen backlog, CPU share); the defaults suit a Prometheus scraping every few seconds.
        in_process: answer the port from the program's own threads. By default a front process of its
            own answers it, and the program answers it only where that process cannot start (it warns
            once then). The endpoint works the same either way.

    Returns:
        A handle on the running endpoint (``.url``, ``.page_url``, ``.close()``); a new handle on the
        same endpoint if this process already serves there. Every handle is closed by
        ``gpuprobe.testing.reset()`` and at exit.

    Raises:
        ConfigError: the port is in use or the address cannot be bound; the message names both and
            the setting.

    Example:
        >>> import gpuprobe
        >>> server = gpuprobe.serve(port=0, in_process=True)
        >>> server.url.startswith("http://127.0.0.1:")
        True
        >>> server.close()
    """
    from .exporters.prometheus import serve as _serve

    return _serve(port, addr, runtime=runtime, owner=owner, limits=limits, in_process=in_process)


class _Unchanged:
    """The default of ``configure(meter_provider=...)``: the provider in use stays."""

    def __repr__(self) -> str:
        return "unchanged"


_UNCHANGED: Any = _Unchanged()
_meter_bridge: Any = None  # the MeterProviderBridge of configure(meter_provider=...), while attached


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__} object>"
    return (text if len(text) <= 80 else text[:77] + "...") + f" ({type(value).__name__})"


def _bridge_for(provider: Any) -> Any:
    """A bridge to ``provider``, not attached yet; a ConfigError names a provider that is not one."""
    try:
        get_meter = getattr(provider, "get_meter", None)
    except Exception:
        get_meter = None
    if not callable(get_meter):
        raise ConfigError("meter_provider must be an OpenTelemetry MeterProvider (an object with a get_meter() "
                          f"method), got {_shown(provider)}")
    from .exporters.otlp import MeterProviderBridge

    try:
        return MeterProviderBridge(provider)
    except Exception as exc:
        raise ConfigError(f"meter_provider: get_meter() of {_shown(provider)} failed: {exc!r}") from exc


def configure(*, meter_provider: Any = _UNCHANGED, tracer_provider: Any = _UNCHANGED, **settings: Any) -> Config:
    """Change settings (the keywords of :class:`Config`) and (re)start the exporters they name.

    Each call adds to what is configured: it changes what its keywords name and keeps the rest, so
    ``configure(otlp_endpoint=...)`` then ``configure(jsonl=...)`` exports to both, and a
    ``meter_provider`` stays fed through later calls. A keyword set to None turns its exporter off.
    Aggregates are kept, and so is what you started yourself (``serve()``, exporters you attached,
    profile windows). What an earlier ``configure`` (or the environment) started from settings is
    stopped first and started again from the new settings. Every prepared probe follows the new
    settings at once. ``disable=True``/``False`` switches probes off/on at run time, as
    :func:`disable`/:func:`enable`.

    Args:
        meter_provider: an OpenTelemetry ``MeterProvider`` of yours to feed gpuprobe's metrics into; it
            replaces the one an earlier call gave, and None stops feeding it (what is queued is
            recorded first). Left out: the provider in use stays.
        tracer_provider: an OpenTelemetry ``TracerProvider`` of yours for the spans of requests
            (docs/tracing.md); None goes back to the global one or OTLP. Left out: the one given stays.
        **settings: e.g. ``otlp_endpoint="http://127.0.0.1:4318/v1/metrics"``, ``jsonl="run.jsonl"``,
            ``memory=True``, ``prometheus_port=9464``.

    Returns:
        The settings now in force.

    Raises:
        ConfigError: an unknown keyword or a bad value, or an exporter a keyword asks for cannot start
            (a port in use, a file that cannot be opened); the message names it. Also ``disable=False``
            in a process imported with ``GPUPROBE_DISABLE=1``. What the environment asks for and cannot
            be started is warned once instead, never raised.

    Example:
        >>> import gpuprobe
        >>> gpuprobe.configure(memory=True).memory
        True
        >>> _ = gpuprobe.configure(memory=False)
    """
    from . import config
    from .runtime import runtime

    global _meter_bridge
    rt = runtime()
    # The exporters' own arguments are checked before anything changes: a bad one leaves all as it was.
    current = _meter_bridge if _meter_bridge is not None and _meter_bridge in rt.lifecycle.items() else None
    bridge = None
    provider_changes = meter_provider is not _UNCHANGED and (
        meter_provider is None or current is None or current.meter_provider is not meter_provider)
    if provider_changes and meter_provider is not None:
        bridge = _bridge_for(meter_provider)
    if tracer_provider is not _UNCHANGED and tracer_provider is not None and not callable(
            getattr(tracer_provider, "get_tracer", None)):
        raise ConfigError("tracer_provider must be an OpenTelemetry TracerProvider (an object with a get_tracer() "
                          f"method), got {_shown(tracer_provider)}")
    cfg = config.replace(rt.settings, **settings)
    if "disable" in settings:
        if cfg.disable:
            disable()
        else:
            enable()
    if tracer_provider is not _UNCHANGED:
        rt.tracer_provider = tracer_provider
    rt.configure(cfg, frozenset(settings))
    if provider_changes:
        if current is not None:
            current.close()  # records what is queued, then stops receiving
            rt.remove(current)
        # Owned as what you start yourself: the restart of what settings started leaves it attached.
        _meter_bridge = bridge.attach(rt, owner="user") if bridge is not None else None
    return cfg


def info() -> dict[str, Any]:
    """Which backends are active: timing, NVTX, memory, exporters; the switches; under
    ``utilization``, for each instrumented model and device whether its MBU and MFU are exported, and why;
    under ``profile``, the on-demand capture triggers and the last captures; under ``gpu_health``, whether
    the NVML gauges are on, for which devices, and which readings are off and why.

    Example:
        >>> import gpuprobe
        >>> sorted(gpuprobe.info())[:3]
        ['device', 'disabled_by_env', 'enabled']
    """
    from . import _nvml, _on_demand, _seams, _utilization, profiling
    from .runtime import DISABLED_AT_IMPORT, runtime

    rt = runtime()
    b = rt.backends
    return {
        "version": __version__,
        "enabled": is_enabled(),
        "disabled_by_env": DISABLED_AT_IMPORT,
        "timing": "host" + (f"+{b.device_clock.name}" if b.device_clock is not None else ""),
        "nvtx": b.nvtx.name,
        "memory": "cuda-allocator" if b.cuda else "process-rss",
        "device": rt.registry.const_labels["gpuprobe.device"],
        "rank": rt.settings.rank,
        # Variables of the environment that could not be used (their defaults are), and what they asked
        # for that could not start (a port in use, a folder that does not exist): each warned once.
        "settings_problems": list(rt.settings_problems),
        "exporters": [repr(e) for e in rt.lifecycle.items()],
        # The sync audit (docs/sync-audit.md): its setting, and the last places it first saw a host sync.
        "sync_audit": rt.settings.sync_audit,
        "sync_sites": [dict(site) for site in rt.sync_sites.recent],
        "utilization": _utilization.status(),
        # On-demand captures (docs/capture.md): the endpoint, the signal, the slow-step trigger, the last captures.
        "profile": _on_demand.status(rt),
        # Live kernel sampling: its period and how device work is told apart on this torch, or why it is off.
        "kernel_sampling": profiling.kernel_sampling_status(rt),
        # Seams into other libraries (docs/architecture.md): each one on, off after its own failure, or refused.
        "seams": _seams.status(),
        # GPU health gauges from NVML (docs/gpu.md): on or not, the devices, readings turned off and why.
        "gpu_health": _nvml.status(rt),
    }


def profile(steps: str | tuple[int, int], **options: Any) -> Any:
    """Capture generation steps A–B with torch.profiler and/or for nsys; see :func:`gpuprobe.profiling.profile`.

    Example:
        >>> import gpuprobe
        >>> window = gpuprobe.profile("100-150", output="decode.json.gz")  # doctest: +SKIP
    """
    from .profiling import profile as _profile

    return _profile(steps, **options)


def summary() -> Any:
    """A readable table of what was measured so far: per series count, mean, p50, p99 and max (time to
    first token, time per output token, steps, components, probes, ...), then counters and gauges. In a
    notebook it shows as an HTML table; ``str()`` is text; ``.to_dict()`` the rows. See
    :func:`gpuprobe._summary.summary`.

    Example:
        >>> import gpuprobe
        >>> table = gpuprobe.summary()
    """
    from ._summary import summary as _summary

    return _summary()


def requests() -> list[RequestRecord]:
    """The records of the most recent finished requests, oldest first: one per ``generate()`` call and one
    per continuous-batching request (at most the ``requests_kept`` setting, 1,000 by default). Each is a
    :class:`RequestRecord` (``.as_dict()``): TTFT, queue, prefill, decode, tokens, syncs, device time and,
    under continuous batching, its share of the GPU; never prompt text or token ids (docs/requests.md).

    Example:
        >>> import gpuprobe
        >>> [r.request_id for r in gpuprobe.requests()] == [r.request_id for r in gpuprobe.requests()]
        True
    """
    from .runtime import runtime

    return runtime().requests.finished()


def step() -> int:
    """Count one generation step (the transformers integration does this for you); returns its index.

    Example:
        >>> import gpuprobe
        >>> i = gpuprobe.step()
    """
    from .runtime import runtime

    return runtime().advance_step()
