"""Generates docs/metrics.md from the metric specs, so the reference never drifts from the code.

Run ``python -m gpuprobe._docs > docs/metrics.md``; a test checks the file is current.
"""

from __future__ import annotations

from ._metrics import SPECS, prometheus_name

ATTRIBUTES = {
    "gen_ai.server.time_to_first_token": "gen_ai.request.model, gen_ai.provider.name, gen_ai.operation.name",
    "gen_ai.server.time_per_output_token": "gen_ai.request.model, gen_ai.provider.name, gen_ai.operation.name",
    "gen_ai.server.request.duration": "gen_ai.request.model, gen_ai.provider.name, gen_ai.operation.name, error.type (on failure)",
    "gen_ai.client.token.usage": "gen_ai.request.model, gen_ai.provider.name, gen_ai.operation.name, gen_ai.token.type (input/output)",
    "gpuprobe.step.duration": "model, phase (prefill/decode), clock (host/device)",
    "gpuprobe.step.component.duration": "model, component (forward/logits_processor/stopping_criteria/streamer/other), processor (class name)",
    "gpuprobe.layer.duration": "model, layer.type, layer.index (opt-in)",
    "gpuprobe.probe.duration": "probe, kind, clock (host/device), your attrs",
    "gpuprobe.probe.errors": "probe, error.type",
    "gpuprobe.step.batch_size": "model",
    "gpuprobe.generate.active": "model",
    "gpuprobe.memory.allocated": "device",
    "gpuprobe.memory.reserved": "device (CUDA only)",
    "gpuprobe.memory.peak": "device",
    "gpuprobe.kv_cache.memory": "model",
    "gpuprobe.kv_cache.sequence_length": "model",
    "gpuprobe.kernel.time": "category",
    "gpuprobe.kernel.launches": "category",
    "gpuprobe.telemetry.dropped": "reason",
}

_SUFFIX = {"histogram": "_bucket / _sum / _count", "counter": "_total", "updown": "", "gauge": ""}


def render() -> str:
    """The Markdown reference."""
    lines = [
        "# Metrics reference",
        "",
        "Generated from `gpuprobe/_metrics.py` by `python -m gpuprobe._docs`; do not edit by hand.",
        "",
        "Names are OpenTelemetry instrument names with UCUM units; where the OpenTelemetry GenAI semantic",
        "conventions define a metric, gpuprobe uses its name and attributes. On the Prometheus endpoint dots",
        "become underscores, the unit becomes a suffix (`s` → `_seconds`, `By` → `_bytes`; units in braces",
        "are dropped) and counters get `_total` — the same rules an OpenTelemetry Collector's Prometheus",
        "exporter applies, so dashboards work with either path. Attribute names change the same way",
        "(`gen_ai.request.model` → `gen_ai_request_model`).",
        "",
        "The `gen_ai.*` metrics carry the GenAI semantic-convention attributes; gpuprobe's own metrics name",
        "the model `model` (the same value as `gen_ai.request.model`). Memory gauges carry `device` (the",
        "device read) besides the process-wide `gpuprobe.device`.",
        "",
        "Every series also carries `gpuprobe.rank` (from `RANK`, default 0) and `gpuprobe.device`",
        "(`cuda:N` or `cpu`). Label values are bounded: past 100 distinct values per label (setting",
        "`max_label_values`) new values fold into `other`. No prompt text, token id or request id is ever",
        "a label.",
        "",
        "| name | instrument | unit | attributes | Prometheus name | description |",
        "|---|---|---|---|---|---|",
    ]
    for name, spec in SPECS.items():
        prom = prometheus_name(spec)
        suffix = _SUFFIX[spec.instrument]
        shown = f"`{prom}`" + (f" ({suffix})" if suffix else "")
        inst = {"updown": "up-down counter"}.get(spec.instrument, spec.instrument)
        lines.append(f"| `{name}` | {inst} | `{spec.unit}` | {ATTRIBUTES.get(name, '')} | {shown} | {spec.description} |")
    lines += ["", "## Histogram buckets", "", "| name | bucket bounds |", "|---|---|"]
    for name, spec in SPECS.items():
        if spec.buckets:
            lines.append(f"| `{name}` | {' '.join(f'{b:g}' for b in spec.buckets)} |")
    lines += [
        "",
        "Why these bounds: decode steps on an H100 are often under 10 ms, so step and component buckets",
        "reach down to 0.1 ms; probe buckets reach 1 µs for small regions; request-duration buckets double",
        "from 10 ms to 327.68 s. OpenTelemetry's default bounds (0, 5, 10, … 10000) would put every step",
        "into one bucket.",
        "",
        "## Dropped telemetry",
        "",
        "`gpuprobe.telemetry.dropped` counts what could not be kept, by `reason`: `event_pool_exhausted`",
        "(more CUDA timings in flight on a device than its event pool holds; host timing is never dropped),",
        "`device_timing_failed` (recording a CUDA event failed; the call's host time is kept),",
        "`otlp_export_failed` (data points of a failed push; the next push sends the cumulative values",
        "again, so nothing is lost once the endpoint recovers), `jsonl_queue_full`, `jsonl_write_failed`,",
        "`meter_provider_queue_full`, `meter_provider_write_failed`, `kernel_sampling_busy` (a step that",
        "another profiler owned, or whose predecessor's sample was still being read, was not sampled).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
