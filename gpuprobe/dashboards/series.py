"""Prometheus names of gpuprobe's metrics: series, labels, and the label that names the model.

Everything is derived from :data:`gpuprobe._metrics.SPECS` and :func:`gpuprobe._metrics.prometheus_name`,
the rules the exporters apply, so a name built here is one gpuprobe really exports.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._metrics import ERROR_TYPE as _ERROR_TYPE
from .._metrics import SPECS, prometheus_label, prometheus_name
from .._metrics import TOKEN_TYPE as _TOKEN_TYPE
from ..errors import ConfigError

__all__ = [
    "label",
    "model_label",
    "series",
    "series_parts",
    "exported_series",
    "braces",
    "RANK",
    "TOKEN_TYPE",
    "ERROR_TYPE",
    "LAYER_TYPE",
]


def label(attribute: str) -> str:
    """The Prometheus label of an OpenTelemetry attribute.

    Example:
        >>> label("gen_ai.request.model")
        'gen_ai_request_model'
    """
    return prometheus_label(attribute)


RANK = label("gpuprobe.rank")
TOKEN_TYPE = label(_TOKEN_TYPE.name)
ERROR_TYPE = label(_ERROR_TYPE.name)
LAYER_TYPE = label("layer.type")


def model_label(metric: str) -> str | None:
    """The Prometheus label naming the model on ``metric``'s series, or None if it has none (the spec's
    :attr:`~gpuprobe._metrics.MetricSpec.model_attribute`: gen_ai.* metrics follow the GenAI semantic
    conventions, gpuprobe's own per-model metrics carry a short ``model``).

    Example:
        >>> model_label("gpuprobe.step.duration"), model_label("gpuprobe.memory.peak")
        ('model', None)
    """
    spec = SPECS.get(metric)
    attr = spec.model_attribute if spec is not None else None
    return label(attr) if attr else None


_PARTS = {"histogram": ("bucket", "count", "sum"), "counter": ("total",), "updown": ("",), "gauge": ("",)}


def series_parts(metric: str) -> tuple[str, ...]:
    """The parts one metric is exposed as: ``bucket``/``count``/``sum`` for a histogram, else one part.

    Example:
        >>> series_parts("gpuprobe.step.duration")
        ('bucket', 'count', 'sum')
    """
    return _PARTS[SPECS[metric].instrument]


def series(metric: str, part: str = "") -> str:
    """The Prometheus series name of one part of a gpuprobe metric.

    Args:
        metric: the OpenTelemetry name, a key of :data:`gpuprobe._metrics.SPECS`.
        part: ``bucket``/``count``/``sum`` for histograms; ignored for counters (``_total``) and gauges.

    Raises:
        ConfigError: gpuprobe has no such metric, or a histogram part is missing or wrong.

    Example:
        >>> series("gen_ai.server.time_to_first_token", "bucket")
        'gen_ai_server_time_to_first_token_seconds_bucket'
        >>> series("gpuprobe.telemetry.dropped")
        'gpuprobe_telemetry_dropped_total'
    """
    spec = SPECS.get(metric)
    if spec is None:
        raise ConfigError(f"gpuprobe has no metric named {metric!r}; known: {', '.join(SPECS)}")
    base = prometheus_name(spec)
    if spec.instrument == "histogram":
        if part not in _PARTS["histogram"]:
            raise ConfigError(f"{metric} is a histogram: part must be bucket, count or sum, got {part!r}")
        return f"{base}_{part}"
    if spec.instrument == "counter":
        return f"{base}_total"
    return base


def exported_series() -> dict[str, str]:
    """Every Prometheus series name gpuprobe exports → its OpenTelemetry metric name.

    Example:
        >>> exported_series()["gpuprobe_kernel_launches_total"]
        'gpuprobe.kernel.launches'
    """
    return {series(name, part): name for name in SPECS for part in series_parts(name)}


def braces(matchers: Sequence[str]) -> str:
    """Label matchers as PromQL writes them after a series name: ``{a="b", c=~"d"}``, or nothing.

    Example:
        >>> braces(['phase="decode"', 'clock="host"']), braces([])
        ('{phase="decode", clock="host"}', '')
    """
    return "{" + ", ".join(matchers) + "}" if matchers else ""
