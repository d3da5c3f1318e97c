"""Prometheus names of gpuprobe's metrics: series, labels, and the label that names the model.

Everything is derived from :data:`gpuprobe._metrics.SPECS` and :func:`gpuprobe._metrics.prometheus_name`,
the rules the exporters apply, so a name built here is one gpuprobe really exports.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._metrics import SPECS, prometheus_label, prometheus_name
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
TOKEN_TYPE = label("gen_ai.token.type")
ERROR_TYPE = label("error.type")
LAYER_TYPE = label("layer.type")

# Which attribute names the model on each metric's series. gen_ai.* metrics follow the GenAI
# semantic conventions; gpuprobe's own per-model metrics carry a short ``model``. A test checks this
# table against a real exposition, so a change in the integration shows up there.
_MODEL_ATTR: dict[str, str] = {
    "gen_ai.server.time_to_first_token": "gen_ai.request.model",
    "gen_ai.server.time_per_output_token": "gen_ai.request.model",
    "gen_ai.server.request.duration": "gen_ai.request.model",
    "gen_ai.client.token.usage": "gen_ai.request.model",
    "gpuprobe.step.duration": "model",
    "gpuprobe.step.component.duration": "model",
    "gpuprobe.layer.duration": "model",
    "gpuprobe.step.batch_size": "model",
    "gpuprobe.generate.active": "model",
    "gpuprobe.kv_cache.memory": "model",
    "gpuprobe.kv_cache.sequence_length": "model",
    "gpuprobe.step.syncs": "model",
    "gpuprobe.step.audited": "model",
    "gpuprobe.step.memory_bandwidth.utilization": "model",
    "gpuprobe.step.flops.utilization": "model",
    "gpuprobe.inter_token.duration": "model",
    "gpuprobe.request.queue.duration": "model",
    "gpuprobe.requests.running": "model",
    "gpuprobe.requests.waiting": "model",
    "gpuprobe.requests.preempted": "model",
    "gpuprobe.requests.finished": "model",
    "gpuprobe.kv_cache.usage": "model",
    "gpuprobe.kv_cache.blocks": "model",
    "gpuprobe.batch.tokens": "model",
    "gpuprobe.batch.requests": "model",
    "gpuprobe.speculative.drafts": "model",
    "gpuprobe.speculative.draft_tokens": "model",
    "gpuprobe.speculative.accepted_tokens": "model",
    "gpuprobe.speculative.accepted_tokens_per_position": "model",
    "gpuprobe.speculative.emitted_tokens": "model",
}


def model_label(metric: str) -> str | None:
    """The Prometheus label naming the model on ``metric``'s series, or None if it has none.

    Example:
        >>> model_label("gpuprobe.step.duration"), model_label("gpuprobe.memory.peak")
        ('model', None)
    """
    attr = _MODEL_ATTR.get(metric)
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
