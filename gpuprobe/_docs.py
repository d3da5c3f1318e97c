"""Generates docs/metrics.md from the metric specs, so the reference never drifts from the code.

Run ``python -m gpuprobe._docs > docs/metrics.md``; a test checks the file is current.
"""

from __future__ import annotations

from ._metrics import SPECS, MetricSpec, prometheus_name

# GPU health gauges (NVML) → the dcgm-exporter field that carries the same reading, and how they differ.
DCGM = {
    "gpuprobe.gpu.utilization": ("DCGM_FI_DEV_GPU_UTIL", "dcgm: percent 0–100; here a fraction 0–1"),
    "gpuprobe.gpu.memory.used": ("DCGM_FI_DEV_FB_USED", "dcgm: MiB; here bytes"),
    "gpuprobe.gpu.memory.total": ("DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE (+ DCGM_FI_DEV_FB_RESERVED)",
                                  "dcgm: MiB; here bytes, NVML's total"),
    "gpuprobe.gpu.clock.sm": ("DCGM_FI_DEV_SM_CLOCK", "dcgm: MHz; here Hz"),
    "gpuprobe.gpu.power": ("DCGM_FI_DEV_POWER_USAGE", "both watts"),
    "gpuprobe.gpu.power.limit": ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "both watts"),
    "gpuprobe.gpu.temperature": ("DCGM_FI_DEV_GPU_TEMP", "both °C"),
    "gpuprobe.gpu.throttle": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS (formerly DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)",
                              "dcgm: the bitmask; here one 0/1 series per reason"),
    "gpuprobe.gpu.sm.activity": ("DCGM_FI_PROF_SM_ACTIVE", "both 0–1 (here from NVML's GPM: SM utilization ÷ 100)"),
    "gpuprobe.gpu.tensor.activity": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                                     "both 0–1 (here from NVML's GPM: any-tensor utilization ÷ 100)"),
}

# The histograms whose buckets carry exemplars while traces are on (docs/tracing.md, "Exemplars"): metric →
# (its series that carry them, the span each bucket names and the value it names it with). A test holds the
# metrics to those a real run's exposition shows exemplars on.
EXEMPLARS = {
    "gen_ai.server.time_to_first_token": ('`clock="host"`', "the request's span, with its time to first token"),
    "gen_ai.server.request.duration": ("every series (a failed request's, under its `error.type`, too)",
                                       "the request's span, with its duration"),
    "gpuprobe.inter_token.duration": ('`clock="host"`', "the request's span, with its longest gap between two "
                                                        "tokens"),
    "gpuprobe.request.queue.duration": ("every series (continuous batching)", "the request's span, with its time "
                                                                              "in the queue"),
    "gpuprobe.step.duration": ('`clock="host"`: `phase="decode"` of `generate()`; every phase of continuous '
                               "batching", "`generate()`: the request's span, with its longest token gap (its "
                               "slowest decode step, from token to token); continuous batching: the `scheduler "
                               "step` span of a step that is one, with its host time"),
}

_SUFFIX = {"histogram": "_bucket / _sum / _count", "counter": "_total", "updown": "", "gauge": ""}
_EMITTED = {"always": "always", "default": "unless opted in", "latest": "opted in (`gen_ai_latest_experimental`)"}


def attributes(spec: MetricSpec) -> str:
    """The attributes column of a metric's row: each attribute with its note, then the user's own where it
    takes them.

    Example:
        >>> from gpuprobe._metrics import SPECS
        >>> attributes(SPECS["gpuprobe.probe.duration"])
        'probe, kind, clock (host/device), your attrs'
    """
    return ", ".join([a.described for a in spec.attributes] + (["your attrs"] if spec.user_attributes else []))


def render() -> str:
    """The Markdown reference."""
    lines = [
        "# Metrics reference",
        "",
        "Generated from `gpuprobe/_metrics.py` by `python -m gpuprobe._docs`; do not edit by hand.",
        "",
        "Names are OpenTelemetry instrument names with UCUM units; where the OpenTelemetry GenAI semantic",
        "conventions define a metric, gpuprobe uses its name and attributes. On the Prometheus endpoint dots",
        "become underscores, the unit becomes a suffix (`s` → `_seconds`, `By` → `_bytes`, `W` → `_watts`,",
        "`Hz` → `_hertz`, `Cel` → `_celsius`, `1` → `_ratio` on gauges; units in braces",
        "are dropped) and counters get `_total` — the same rules an OpenTelemetry Collector's Prometheus",
        "exporter applies, so dashboards work with either path. Attribute names change the same way",
        "(`gen_ai.request.model` → `gen_ai_request_model`).",
        "",
        "The `gen_ai.*` metrics carry the GenAI semantic-convention attributes; gpuprobe's own metrics name",
        "the model `model` (the same value as `gen_ai.request.model`). Memory gauges carry `device` (the",
        "device read) besides the process-wide `gpuprobe.device`.",
        "",
        "Every series also carries `gpuprobe.rank` (from `RANK`, default 0) and `gpuprobe.device`",
        "(`cuda:N` or `cpu`; the GPU health gauges carry their own, see below). Label values are bounded:",
        "past 100 distinct values per label (setting `max_label_values`) new values fold into `other`. No",
        "prompt text, token id or request id is ever a label.",
        "",
        "| name | instrument | unit | attributes | Prometheus name | description |",
        "|---|---|---|---|---|---|",
    ]
    for name, spec in SPECS.items():
        prom = prometheus_name(spec)
        suffix = _SUFFIX[spec.instrument]
        shown = f"`{prom}`" + (f" ({suffix})" if suffix else "")
        inst = {"updown": "up-down counter"}.get(spec.instrument, spec.instrument)
        lines.append(f"| `{name}` | {inst} | `{spec.unit}` | {attributes(spec)} | {shown} | {spec.description} |")
    lines += ["", "## Histogram buckets", "", "| name | bucket bounds |", "|---|---|"]
    for name, spec in SPECS.items():
        if spec.buckets:
            lines.append(f"| `{name}` | {' '.join(f'{b:g}' for b in spec.buckets)} |")
    lines += [
        "",
        "Why these bounds: decode steps on an H100 are often under 10 ms, so step and component buckets",
        "reach down to 0.1 ms; probe buckets reach 1 µs for small regions; request-duration buckets double",
        "from 10 ms to 327.68 s. OpenTelemetry's default bounds (0, 5, 10, … 10000) would put every step",
        "into one bucket. Utilization buckets are fractions of a peak from 0.001 to 1: a decode step's MFU",
        "at small batches sits near 0.001–0.01, its MBU and a prefill's MFU between 0.1 and 0.9; how they",
        "are computed, and the peak table, are in [utilization.md](utilization.md). Queue-time buckets",
        "reach from 0.5 ms (an idle server) to 5 minutes (an overloaded one); batch-token buckets double",
        "from 1 (a lone decode) to 32768 (a large `max_batch_tokens`).",
        "",
        "## OpenTelemetry GenAI semantic conventions: which version each name follows",
        "",
        "The GenAI conventions are still in development: the token-usage histogram is being replaced by",
        "counters, and the client metrics are being renamed (the GenAI conventions moved from",
        "open-telemetry/semantic-conventions, whose last release of them is v1.41.0, to",
        "open-telemetry/semantic-conventions-genai). gpuprobe emits the names it has emitted so far unless",
        "the conventions' own switch asks for the newest: `OTEL_SEMCONV_STABILITY_OPT_IN` holding",
        "`gen_ai_latest_experimental` (a comma-separated list; other values are other instrumentations').",
        "The variable is read once, when a model is first instrumented; a GenAI value gpuprobe does not know",
        "(`gen_ai_latest`, `gen_ai/dup`) is warned about once and the default names are emitted.",
        "",
        "| name | convention version | emitted | note |",
        "|---|---|---|---|",
        *[f"| `{name}` | {spec.convention.version} | {_EMITTED[spec.convention.emitted]} | "
          f"{spec.convention.note or '—'} |" for name, spec in SPECS.items() if spec.convention is not None],
        "",
        "The newest token counters carry `gen_ai.token.modality=\"unknown\"`: gpuprobe counts token ids, not",
        "what they encode (text, image or audio), as the convention asks when the modality cannot be known.",
        "Every name not in this table is gpuprobe's own (`gpuprobe.*`).",
        "",
        "## Latencies: time to first token, inter-token latency, time per output token",
        "",
        "- `gen_ai.server.time_to_first_token`: one sample per request, from its start to its first output",
        "  token. `clock=\"host\"` is when the host holds the token (what a client, e.g. a streamer, sees);",
        "  `clock=\"device\"` (CUDA only) is the GPU's own time from reaching the call's start to finishing",
        "  the step that selected the token (continuous batching: the request's wait until its first forward",
        "  is launched, then the GPU's time from reaching that launch to finishing the forward that selected",
        "  the token). A query over both clocks mixes two measurements of one request: select",
        "  `clock!=\"device\"` for the GenAI convention's value.",
        "- `gpuprobe.inter_token.duration`: the time between two consecutive output tokens of a request, one",
        "  sample per output token after its first, on the same two clocks (host: since the host held that",
        "  request's previous token; device: the device span of the step that selected it). `generate()`",
        "  records one per decode step (every sequence of its batch gets its token at the same moment);",
        "  continuous batching one per request and token, so its quantiles are those its requests see and",
        "  a request's samples add up to its duration less its TTFT (vLLM counts it the same way).",
        "- `gen_ai.server.time_per_output_token`: one sample per successful request of two tokens or more,",
        "  `(request duration − TTFT) ÷ (output tokens − 1)` on the host clock, as the OpenTelemetry GenAI",
        "  convention defines it; none for a one-token or a failed request.",
        "",
        "What each clock measures, and when transformers defers its stop check, is in",
        "[transformers.md](transformers.md#latencies-and-their-clocks); for continuous batching, in",
        "[serving.md](serving.md#latencies-and-their-clocks).",
        "",
        "**Changed:** `gen_ai.server.time_per_output_token` used to hold one sample per decode step (the",
        "step's duration); that per-step series is now `gpuprobe.inter_token.duration{clock=\"host\"}`, and",
        "`gen_ai.server.time_to_first_token` gained the `clock` attribute. A PromQL query that used the",
        "per-step meaning, e.g.",
        "`histogram_quantile(0.95, sum by (le) (rate(gen_ai_server_time_per_output_token_seconds_bucket[5m])))`,",
        "becomes",
        "`histogram_quantile(0.95, sum by (le) (rate(gpuprobe_inter_token_duration_seconds_bucket{clock=\"host\"}[5m])))`",
        "(the label that names the model changes from `gen_ai_request_model` to `model`); a count of decode",
        "steps, `..._time_per_output_token_seconds_count`, becomes",
        "`gpuprobe_inter_token_duration_seconds_count{clock=\"host\"}`; and a TTFT query adds",
        "`clock!=\"device\"` so that a GPU's device samples do not double its count.",
        "",
        "**Changed:** under continuous batching `gpuprobe.inter_token.duration` used to hold one sample per",
        "step that decodes (the step's duration), whatever the number of requests it served; it now holds",
        "one per request and output token after its first, the time since that request's previous token",
        "(steps it sat out, e.g. after a preemption, included). Its quantiles weigh a step by the requests",
        "it served, and its `_count` is the output tokens less one per request, no longer the decoding",
        "steps: count steps with `gpuprobe_step_duration_seconds_count{phase=~\"decode|mixed\"}`.",
        "",
        "## Exemplars",
        "",
        "While traces are on ([tracing.md](tracing.md)), the buckets of five latency histograms carry",
        "exemplars: each bucket names the span of the latest request (or scheduler step) whose value fell in it,",
        "by `trace_id` and `span_id`, with that value and when it was measured. A slow bucket on a dashboard then",
        "leads to a slow request's span ([tracing.md](tracing.md#exemplars)). They are in the OpenMetrics",
        "exposition (what Prometheus asks `/metrics` for; the text format 0.0.4 has no exemplars) and on the",
        "OTLP histogram data points (with opentelemetry-sdk 1.28 and later). A span the sampler drops, or that",
        "could not be sent, is no bucket's exemplar; with traces off, no bucket has one.",
        "",
        "| metric | series | a bucket's exemplar |",
        "|---|---|---|",
        *[f"| `{name}` | {series} | {what} |" for name, (series, what) in EXEMPLARS.items()],
        "",
        "## Generation modes: what a step is, and what each mode records",
        "",
        "`generate()` is measured from inside its decoding loop; what a step is depends on the loop",
        "transformers runs ([transformers.md](transformers.md#generation-modes) has the details):",
        "",
        "| mode | a step is | per call | per step |",
        "|---|---|---|---|",
        "| greedy, sampling (`_sample`), static or dynamic cache, streamer, processors | one forward: step 0 the prompt (`phase=prefill`), then one token per sequence | all | all |",
        "| beam search, beam sampling (`_beam_search`) | one forward of every beam | all | all; one inter-token sample per step |",
        "| assisted decoding (`assistant_model=`, `assistant_early_exit=`), prompt lookup (`prompt_lookup_num_tokens=`) | one forward of the main model that verifies a draft (step 0 also reads the prompt) | all | all, components `draft` and `verify`, and the `gpuprobe.speculative.*` metrics |",
        "| `synced_gpus=True` (FSDP, DeepSpeed ZeRO-3) | as its loop; forwards a rank runs after its own sequences are done (waiting for the others) are no steps of its request | all | all |",
        "| a model's own `generate()` (Whisper, MusicGen) | the steps of the loops it runs (`super().generate()` or `self._sample`) | all | all |",
        "| contrastive search, DoLa, group and constrained beam search, `custom_generate=` | code from the Hub: its loop is not seen | duration, input tokens, output tokens from the returned shape (decoder-only) | none |",
        "| continuous batching (`generate_batch`, `transformers serve`) | a scheduler step ([serving.md](serving.md)) | per request | per scheduler step |",
        "",
        "Output tokens (`gen_ai.client.token.usage{gen_ai.token.type=\"output\"}`) are counted from what the",
        "decoding loop selected, step by step, never from the returned tensor's shape (a model's own",
        "`generate()` may strip its decoder prompt, as Whisper's does, or reshape the tokens, as MusicGen's",
        "does): sequences × tokens per sequence, where a sequence gets one token per step (beam search: per",
        "step of its loop, so a finished beam's padding counts), the accepted draft tokens too in a",
        "speculative step, and none in a step transformers' deferred stop check undid. The sequences are",
        "those the loop returns (beam search: `num_return_sequences` per prompt; MusicGen: one per codebook).",
        "",
        "## Speculative decoding",
        "",
        "Assisted decoding and prompt lookup run one forward of the main model per step that checks the",
        "tokens a draft proposed (a draft model's `generate()`, n-grams of the prompt, the model's own early",
        "layers) and keeps those it agrees with, plus one token of its own. The `method` attribute says where",
        "the draft came from: `draft_model` (`assistant_model=`, also with another tokenizer), `prompt_lookup`,",
        "`early_exit`, `mtp`, `dflash`, else `other`. As vLLM counts them:",
        "",
        "- `gpuprobe.speculative.drafts`: steps that checked a draft of one token or more (prompt lookup finds",
        "  none when no n-gram of the prompt matches: that step is a plain decode step);",
        "- `gpuprobe.speculative.draft_tokens` and `gpuprobe.speculative.accepted_tokens`: the draft tokens",
        "  proposed and accepted; `gpuprobe.speculative.accepted_tokens_per_position{position}`: the accepted",
        "  ones by their place in the draft;",
        "- `gpuprobe.speculative.emitted_tokens`: per step, the tokens it emitted (accepted draft tokens + 1).",
        "",
        "In PromQL (sum by model and method where you need):",
        "",
        "| what | query |",
        "|---|---|",
        "| acceptance rate | `rate(gpuprobe_speculative_accepted_tokens_total[5m]) / rate(gpuprobe_speculative_draft_tokens_total[5m])` |",
        "| mean acceptance length (the bonus token included) | `1 + rate(gpuprobe_speculative_accepted_tokens_total[5m]) / rate(gpuprobe_speculative_drafts_total[5m])` |",
        "| acceptance rate at draft position N | `rate(gpuprobe_speculative_accepted_tokens_per_position_total{position=\"N\"}[5m]) / rate(gpuprobe_speculative_drafts_total[5m])` |",
        "| tokens per main-model forward | `rate(gpuprobe_speculative_emitted_tokens_sum[5m]) / rate(gpuprobe_speculative_emitted_tokens_count[5m])` |",
        "| share of step time in the draft / the main forward / the verification | `rate(gpuprobe_step_component_duration_seconds_sum{component=\"draft\"}[5m]) / rate(gpuprobe_step_duration_seconds_sum{clock=\"host\"}[5m])` (`forward`, `verify`) |",
        "",
        "A speculative step's components add up to it like any step's: `draft` (the candidate generator's",
        "`get_candidates()`: a draft model's whole `generate()`), `forward` (the main model's inputs and",
        "forward), `verify` (from the forward's end to the candidate generator's update: selecting and",
        "comparing tokens, cropping the cache; on a GPU the wait for the forward lands here), and the logits",
        "processors (they run once per verified position), stopping criteria, streamer and `other` as usual.",
        "A draft model runs unmeasured inside the step, instrumented or not: its time is the step's `draft`,",
        "not requests of its own. MBU and MFU are not computed for speculative steps.",
        "",
        "**Latencies when several tokens land at once.** A speculative step emits its tokens together, when",
        "it ends. TTFT ends with step 0 (its first token); each later token gets one",
        "`gpuprobe.inter_token.duration` sample: the first token of a step the time since the previous token",
        "(host clock; the step's device span on the device clock), the others 0 (they arrive with it). So",
        "the count is still the output tokens less one per request and the sum the time from the first",
        "token to the last, as for continuous batching; the quantiles show the bursts a streaming client",
        "sees (with a high acceptance, the median is 0). The time per step is",
        "`gpuprobe.step.duration{phase=\"decode\"}`, and `gen_ai.server.time_per_output_token` stays",
        "`(duration − TTFT) ÷ (output tokens − 1)`.",
        "",
        "## GPU health (NVML)",
        "",
        "The `gpuprobe.gpu.*` gauges are read from NVML on gpuprobe's background thread every",
        "`collect_interval` when the `nvml` setting is on (`GPUPROBE_NVML=1`; needs `gpuprobe[nvml]`), for",
        "every GPU the process can see ([gpu.md](gpu.md#gpu-health-gauges-nvml)). Each series carries",
        "`gpu.index` (NVML's index, as `nvidia-smi` numbers the GPUs) and its own `gpuprobe.device`",
        "(`cuda:N`, the CUDA ordinal in this process, the label gpuprobe's step metrics carry), which takes",
        "the place of the process-wide `gpuprobe.device` on these series only. A reading NVML does not",
        "support on a GPU is absent; one that fails is turned off for that GPU with one warning.",
        "",
        "If you run dcgm-exporter too, these are the fields that carry the same readings:",
        "",
        "| gpuprobe | dcgm-exporter field | units |",
        "|---|---|---|",
        *[f"| `{SPECS[name].name}` | `{field}` | {note} |" for name, (field, note) in DCGM.items()],
        "",
        "## Serving",
        "",
        "The `Serving:` metrics, and the requests, steps and cache of continuous batching, are described in",
        "[serving.md](serving.md): what each one counts, when it is read, and why `finish_reason` is a",
        "counter of its own rather than an attribute of the request duration.",
        "",
        "## Service-level goals",
        "",
        "With a goal set (`GPUPROBE_SLO_TTFT`, `GPUPROBE_SLO_TPOT`, `GPUPROBE_SLO_E2E`, or `configure(slo_ttft=...)`),",
        "every finished request (a `generate()` call, a continuous-batching request) counts one in",
        "`gpuprobe.requests.slo`: `result=\"met\"` when its time to first token, time per output token and",
        "duration are each at most their goal; else the first goal it missed, in the order `ttft`, `tpot`,",
        "`e2e`; `error` when it failed. A cancelled request is not counted (its client went away), and a goal",
        "whose figure a request does not have (the time per output token of a one-token answer) does not",
        "apply to it. A model's five series appear, at 0, with its first counted request. Goodput is",
        "`sum(rate(gpuprobe_requests_slo_total{result=\"met\"}[5m])) / sum(rate(gpuprobe_requests_slo_total[5m]))`;",
        "the burn-rate alerts on it are in [grafana.md](grafana.md#alerts).",
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
        "## Series from the start",
        "",
        "`/metrics` (`gpuprobe.serve()`, `gpuprobe run`) shows from its first scrape `gpuprobe_build_info`",
        "(always 1; its labels name the versions and the device; the series changes once, when the program",
        "first runs work on a GPU and its name becomes known) and, at 0, every counter whose labels are known",
        "before anything is counted, so a dashboard reads 0 rather than no data and `increase()` counts the",
        "first event: `gpuprobe.telemetry.dropped` for each reason above, `gpuprobe.seam.disabled` for every",
        "seam declared so far, and the series an integration prepares when a model is instrumented or starts",
        "serving (`gpuprobe.requests.preempted`, `gpuprobe.requests.finished` by `finish_reason`,",
        "`gpuprobe.generate.active`, `gpuprobe.step.audited`). A failed `generate()` call is counted under",
        "its exception's class name in `error.type`, which is not known until it happens: no such series",
        "exists before the first failure (use `or vector(0)` in a query that must read 0).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
