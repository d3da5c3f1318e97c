"""gpuprobe's own aggregates: fixed-bucket histograms, counters, up-down counters and gauges.

Nothing here imports an exporter library. Values arrive as records ``(child, value)`` drained from
per-thread buffers (see :mod:`gpuprobe._buffers`) and are applied under the runtime's lock, so a
child is only ever mutated by one thread at a time. Exporters read :meth:`Registry.snapshot`.

Durations are recorded in integer nanoseconds (what ``perf_counter_ns`` gives) and exposed in seconds:
a family's ``scale`` turns raw values into the unit, and its bucket bounds are pre-scaled to raw units
so the hot comparison is integer against integer.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import platform
import sys
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "Attribute",
    "Convention",
    "Exemplar",
    "MetricSpec",
    "SPECS",
    "Registry",
    "Family",
    "OTHER",
    "prometheus_name",
    "prometheus_label",
]

OTHER = "other"

# Bucket boundaries (seconds or tokens), from docs/metrics.md.
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
REQUEST_BUCKETS = tuple(round(0.01 * 2**i, 2) for i in range(16))  # 0.01 … 327.68, doubling
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
PROBE_BUCKETS = (0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005) + STEP_BUCKETS + (5.0, 10.0, 30.0, 60.0)
# Fractions of a peak: decode-step MFU at batch 1 sits near 0.001-0.01, decode MBU and prefill MFU in 0.1-0.9.
UTILIZATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
                       0.7, 0.8, 0.9, 1.0)
# Serving: a request may wait from well under a millisecond (an idle server) to minutes (an overloaded one).
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                 120.0, 300.0)
# Tokens of one continuous-batching step: 1 (a lone decode) to max_batch_tokens (often 256-16384).
BATCH_TOKEN_BUCKETS = tuple(2**i for i in range(16))  # 1 … 32768, doubling
# Tokens one speculative step emits: 1 (no draft token accepted) to the draft's length + 1 (often 3-20).
EMITTED_TOKEN_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64)

NS = 1e-9


@dataclasses.dataclass(frozen=True)
class Attribute:
    """One attribute of a metric's series.

    Attributes:
        name: the OpenTelemetry attribute name (``model``, ``gen_ai.request.model``, ``phase``).
        note: what the metrics reference says after the name, in parentheses; by default its ``values``
            joined by ``/``, and nothing when it has none (``""``: nothing either way).
        values: its only values, when they are known before anything is counted; None when they come
            from the program (model, class, probe and seam names, versions), bounded all the same by the
            ``max_label_values`` cap.
        names_model: the attribute names the model (what dashboards select and group models by).

    Example:
        >>> Attribute("clock", values=("host", "device")).described
        'clock (host/device)'
    """

    name: str
    note: str | None = None
    values: tuple[str, ...] | None = None
    names_model: bool = False

    def __post_init__(self) -> None:
        if self.values is not None and (not self.values or len(set(self.values)) != len(self.values)):
            raise ValueError(f"attribute {self.name!r}: values must be distinct and at least one, got {self.values!r}")

    @property
    def described(self) -> str:
        """The name, with its note in parentheses where it has one (the metrics reference's words)."""
        note = self.note if self.note is not None else "/".join(self.values or ())
        return f"{self.name} ({note})" if note else self.name


@dataclasses.dataclass(frozen=True)
class Convention:
    """The OpenTelemetry semantic convention a metric's name follows, and when gpuprobe emits it.

    Attributes:
        version: the conventions' version that defines the name as gpuprobe emits it.
        emitted: ``always``; ``default`` (unless ``OTEL_SEMCONV_STABILITY_OPT_IN`` holds
            ``gen_ai_latest_experimental``: the name the newest conventions replace); ``latest`` (only with
            that value).
        note: what the metrics reference adds (what replaced it, why it stays).

    Example:
        >>> SPECS["gen_ai.client.inference.usage.input_tokens"].convention.emitted
        'latest'
    """

    version: str
    emitted: str = "always"
    note: str = ""

    def __post_init__(self) -> None:
        if self.emitted not in ("always", "default", "latest"):
            raise ValueError(f"convention: emitted must be always, default or latest, got {self.emitted!r}")


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """What one metric is: its OpenTelemetry name, instrument, unit, buckets, raw-value scale and attributes.

    The one declaration of a metric: the exporters, the metrics reference (:mod:`gpuprobe._docs`) and the
    dashboards (:mod:`gpuprobe.dashboards`) read it from here.
    """

    name: str
    instrument: str  # histogram | counter | updown | gauge
    unit: str
    description: str
    buckets: tuple[float, ...] | None = None
    scale: float = 1.0  # raw value * scale = value in ``unit``
    # The attributes its series carry (every one at most; besides gpuprobe.rank and gpuprobe.device, which
    # every series gets from the registry).
    attributes: tuple[Attribute, ...] = ()
    # Its series also carry the attributes the user gives (``probe(attrs=...)``).
    user_attributes: bool = False
    # The OpenTelemetry semantic convention that defines its name (None: a name of gpuprobe's own).
    convention: Convention | None = None

    def __post_init__(self) -> None:
        names = [a.name for a in self.attributes]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: an attribute is declared twice in {names}")
        if sum(a.names_model for a in self.attributes) > 1:
            raise ValueError(f"{self.name}: more than one attribute names the model")

    @property
    def attribute_names(self) -> frozenset[str]:
        """The names of its declared attributes."""
        return frozenset(a.name for a in self.attributes)

    @property
    def model_attribute(self) -> str | None:
        """The attribute that names the model on its series, or None where none does.

        Example:
            >>> SPECS["gen_ai.server.request.duration"].model_attribute, SPECS["gpuprobe.memory.peak"].model_attribute
            ('gen_ai.request.model', None)
        """
        return next((a.name for a in self.attributes if a.names_model), None)

    @functools.cached_property
    def known(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The label sets known before anything is counted, ``((attribute, (value, ...)), ...)``: when every
        attribute's values are known (and it has attributes), every combination is a series of its own,
        prepared by :meth:`Registry.prepare_known` so an exposition can show it at 0; else empty. Worked
        out once per spec: every scrape reads it.

        Example:
            >>> SPECS["gpuprobe.telemetry.dropped"].known[0][1][0]
            'event_pool_exhausted'
        """
        if self.user_attributes or not self.attributes or any(a.values is None for a in self.attributes):
            return ()
        return tuple((a.name, a.values) for a in self.attributes if a.values is not None)


# ``reason`` of ``gpuprobe.telemetry.dropped`` (docs/metrics.md, "Dropped telemetry"): a count of each is
# exposed at 0 from the start, so a dashboard shows 0 rather than no data.
DROP_REASONS = ("event_pool_exhausted", "device_timing_failed", "otlp_export_failed", "jsonl_queue_full",
                "jsonl_write_failed", "meter_provider_queue_full", "meter_provider_write_failed",
                "kernel_sampling_busy", "span_queue_full", "span_export_failed")

# Attributes several metrics share. The model: gen_ai.* metrics name it as the OpenTelemetry GenAI semantic
# conventions do, gpuprobe's own per-model metrics with a short ``model`` (the same value).
GEN_AI_MODEL = Attribute("gen_ai.request.model", names_model=True)
GEN_AI = (GEN_AI_MODEL, Attribute("gen_ai.provider.name"), Attribute("gen_ai.operation.name"))
MODEL = Attribute("model", names_model=True)
CLOCK = Attribute("clock", values=("host", "device"))
PHASE = Attribute("phase", values=("prefill", "decode"))
TOKEN_TYPE = Attribute("gen_ai.token.type", values=("input", "output"))
ERROR_TYPE = Attribute("error.type")  # an exception's class name, or a status of the integration's
SPECULATIVE_METHOD = Attribute("method", values=("draft_model", "prompt_lookup", "early_exit", "mtp", "dflash", "other"))
_METHOD = dataclasses.replace(SPECULATIVE_METHOD, note="")  # the reference names its values once, on drafts
# Components of a generation step (one meaning on both metrics that carry it): generate()'s parts, a
# speculative step's draft and verification, continuous batching's scheduler step, and a probe's syncs.
_COMPONENTS = ("forward", "logits_processor", "stopping_criteria", "streamer", "other")
_SPECULATIVE_COMPONENTS = ("draft", "verify")
DEVICE = Attribute("device")  # the device a memory reading is of
# GPU health gauges carry the GPU's own gpuprobe.device in place of the process-wide one.
GPU = (Attribute("gpu.index"), Attribute("gpuprobe.device", note="per series"))
# NVML's clocks-event reasons, in gpuprobe's words (gpuprobe._nvml reads them).
THROTTLE_REASONS = ("gpu_idle", "applications_clocks", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
                    "hw_thermal", "hw_power_brake", "display_clocks")
MAX_DRAFT_POSITIONS = 32  # accepted draft tokens are counted per position up to here, then together
# The OpenTelemetry GenAI semantic conventions gpuprobe follows (docs/metrics.md, "Semantic-convention versions").
# v1.37.0 named the provider gen_ai.provider.name; v1.41.0, the last release of the GenAI conventions in the
# semantic-conventions repository, added the time to first chunk; the GenAI repository's newest (development)
# conventions replace the token-usage histogram and rename the client metrics (its migration guide from v1.41.0).
SEMCONV_1_37 = Convention("semantic-conventions v1.37.0")
_NEWEST = "semantic-conventions-genai, newest (development, unreleased)"
SEMCONV_LATEST = Convention(_NEWEST, "latest")
# What the newest conventions attribute a token count to: gpuprobe counts token ids, not what they encode.
TOKEN_MODALITY = Attribute("gen_ai.token.modality", note="unknown: token ids, whatever they encode",
                           values=("unknown",))


def _spec(*args: Any, **kwargs: Any) -> tuple[str, MetricSpec]:
    spec = MetricSpec(*args, **kwargs)
    return spec.name, spec


SPECS: dict[str, MetricSpec] = dict(
    [
        _spec("gen_ai.server.time_to_first_token", "histogram", "s",
              "Time from the request to its first output token: clock=host when the host holds the token "
              "(what a client sees), clock=device on the GPU's clock", TTFT_BUCKETS, NS, attributes=(*GEN_AI, CLOCK),
              convention=SEMCONV_1_37),
        _spec("gen_ai.server.time_per_output_token", "histogram", "s",
              "Per successful request of two tokens or more: (duration − TTFT) ÷ (output tokens − 1)",
              STEP_BUCKETS, NS, attributes=GEN_AI, convention=SEMCONV_1_37),
        _spec("gpuprobe.inter_token.duration", "histogram", "s",
              "Inter-token latency: time between two consecutive output tokens of a request, one sample per "
              "output token after its first (generate(): per decode step, the same for every sequence of the batch)",
              STEP_BUCKETS, NS, attributes=(MODEL, CLOCK)),
        _spec("gen_ai.server.request.duration", "histogram", "s",
              "Duration of a whole generate() call", REQUEST_BUCKETS, NS,
              attributes=(*GEN_AI, dataclasses.replace(ERROR_TYPE, note="on failure; continuous batching: "
                                                                         "cancelled/failed")),
              convention=SEMCONV_1_37),
        _spec("gen_ai.client.token.usage", "histogram", "{token}",
              "Input and output tokens per generate() call", TOKEN_BUCKETS, attributes=(*GEN_AI, TOKEN_TYPE),
              convention=Convention(
                  "semantic-conventions v1.37.0", note="the newest conventions replace it with the "
                  "`gen_ai.client.inference.usage.*` counters and `gen_ai.client.inference.operation.*` histograms; "
                  "gpuprobe emits it under the opt-in too, since its dashboards, live page, summary and "
                  "`gpuprobe try` read it")),
        _spec("gen_ai.client.inference.usage.input_tokens", "counter", "{token}",
              "Input (prompt) tokens of successful requests", attributes=(*GEN_AI, TOKEN_MODALITY),
              convention=SEMCONV_LATEST),
        _spec("gen_ai.client.inference.usage.output_tokens", "counter", "{token}",
              "Output (generated) tokens of successful requests, every sequence's", attributes=(*GEN_AI, TOKEN_MODALITY),
              convention=SEMCONV_LATEST),
        _spec("gen_ai.client.inference.operation.input_tokens", "histogram", "{token}",
              "Input tokens per successful request", TOKEN_BUCKETS, attributes=GEN_AI, convention=SEMCONV_LATEST),
        _spec("gen_ai.client.inference.operation.output_tokens", "histogram", "{token}",
              "Output tokens per successful request (every sequence's)", TOKEN_BUCKETS, attributes=GEN_AI,
              convention=SEMCONV_LATEST),
        _spec("gen_ai.client.operation.time_to_first_chunk", "histogram", "s",
              "Streaming generate() calls (a streamer): from the call to the first chunk of output its streamer "
              "is given (the first put() after the prompt's)", TTFT_BUCKETS, NS, attributes=GEN_AI,
              convention=Convention("semantic-conventions v1.41.0", "default",
                                    "the newest conventions rename it `gen_ai.client.inference.time_to_first_chunk`")),
        _spec("gen_ai.client.inference.time_to_first_chunk", "histogram", "s",
              "Streaming generate() calls (a streamer): from the call to the first chunk of output its streamer "
              "is given (the first put() after the prompt's)", TTFT_BUCKETS, NS, attributes=GEN_AI,
              convention=SEMCONV_LATEST),
        _spec("gpuprobe.step.duration", "histogram", "s",
              "Forward step time by phase (prefill/decode) and clock (host/device)", STEP_BUCKETS, NS,
              attributes=(MODEL, Attribute("phase", note="prefill/decode; continuous batching: also mixed",
                                           values=("prefill", "decode", "mixed")), CLOCK)),
        _spec("gpuprobe.step.component.duration", "histogram", "s",
              "Time of each part of a generation step", STEP_BUCKETS, NS,
              attributes=(MODEL, Attribute("component", note="forward/logits_processor/stopping_criteria/streamer/other; "
                                                        "speculative steps: also draft/verify; continuous batching: "
                                                        "schedule/forward/update",
                                           values=(*_COMPONENTS, *_SPECULATIVE_COMPONENTS, "schedule", "update")),
                          Attribute("processor", note="class name"))),
        _spec("gpuprobe.layer.duration", "histogram", "s",
              "Decoder layer forward time, sampled every N steps", STEP_BUCKETS, NS,
              attributes=(MODEL, Attribute("layer.type"), Attribute("layer.index", note="opt-in"))),
        _spec("gpuprobe.probe.duration", "histogram", "s",
              "Duration of a @probe / with probe() region", PROBE_BUCKETS, NS,
              attributes=(Attribute("probe"), Attribute("kind"), CLOCK), user_attributes=True),
        _spec("gpuprobe.probe.errors", "counter", "{error}", "Exceptions raised inside a probe",
              attributes=(Attribute("probe"), ERROR_TYPE)),
        _spec("gpuprobe.step.batch_size", "histogram", "{sequence}", "Sequences per generate() call", BATCH_BUCKETS,
              attributes=(MODEL,)),
        _spec("gpuprobe.generate.active", "updown", "{request}", "generate() calls in flight", attributes=(MODEL,)),
        _spec("gpuprobe.memory.allocated", "gauge", "By", "Memory allocated (CUDA allocator, or process RSS on CPU)",
              attributes=(DEVICE,)),
        _spec("gpuprobe.memory.reserved", "gauge", "By", "Memory reserved by the CUDA caching allocator",
              attributes=(dataclasses.replace(DEVICE, note="CUDA only"),)),
        _spec("gpuprobe.memory.peak", "gauge", "By", "High-water mark of allocated memory since the last reset",
              attributes=(DEVICE,)),
        _spec("gpuprobe.kv_cache.memory", "gauge", "By", "Bytes held by the KV cache object", attributes=(MODEL,)),
        _spec("gpuprobe.kv_cache.sequence_length", "gauge", "{token}", "Sequence length held by the KV cache",
              attributes=(MODEL,)),
        _spec("gpuprobe.kernel.time", "counter", "s", "GPU kernel time by category, from sampled profiling", None,
              attributes=(Attribute("category"),)),
        _spec("gpuprobe.kernel.launches", "counter", "{launch}", "Kernel launches by category, from sampled profiling",
              attributes=(Attribute("category"),)),
        _spec("gpuprobe.step.syncs", "counter", "{sync}",
              "Operations that force a device-to-host synchronisation, on audited steps (sync audit)",
              attributes=(MODEL, Attribute("component", values=(*_COMPONENTS, "probe", *_SPECULATIVE_COMPONENTS)),
                          Attribute("processor", note="class or probe name"),
                          Attribute("op", note="`aten::name`"))),
        _spec("gpuprobe.step.audited", "counter", "{step}",
              "Generation steps the sync audit counted (syncs per step = syncs ÷ audited steps)", attributes=(MODEL,)),
        _spec("gpuprobe.telemetry.dropped", "counter", "{record}", "Telemetry records dropped, by reason",
              attributes=(Attribute("reason", note="", values=DROP_REASONS),)),
        _spec("gpuprobe.seam.disabled", "counter", "{seam}",
              "A seam into another library turned itself off after gpuprobe's own work in it failed (fail open)",
              attributes=(Attribute("seam"),)),
        _spec("gpuprobe.build_info", "gauge", "{build}",
              "Always 1; the labels name the versions of gpuprobe, torch, transformers and Python, and the device",
              attributes=(Attribute("gpuprobe.version"), Attribute("torch.version"),
                          Attribute("transformers.version", note="empty when not installed"), Attribute("python.version"),
                          Attribute("device.name", note="the GPU's name once CUDA is initialized, else the "
                                                   "gpuprobe.device value"))),
        _spec("gpuprobe.step.memory_bandwidth.utilization", "histogram", "1",
              "Bytes a step must read (weights, KV cache) ÷ step time ÷ peak memory bandwidth", UTILIZATION_BUCKETS,
              attributes=(MODEL, PHASE)),
        _spec("gpuprobe.step.flops.utilization", "histogram", "1",
              "Model FLOPs of a step ÷ step time ÷ peak FLOP/s of the parameters' dtype", UTILIZATION_BUCKETS,
              attributes=(MODEL, PHASE)),
        _spec("gpuprobe.request.queue.duration", "histogram", "s",
              "Serving: time from a request's arrival to its first scheduled step", QUEUE_BUCKETS, NS,
              attributes=(MODEL,)),
        _spec("gpuprobe.requests.running", "gauge", "{request}",
              "Serving: requests the scheduler is running (prefilling or decoding)", attributes=(MODEL,)),
        _spec("gpuprobe.requests.waiting", "gauge", "{request}", "Serving: requests waiting to be scheduled",
              attributes=(MODEL,)),
        _spec("gpuprobe.requests.preempted", "counter", "{request}",
              "Serving: running requests evicted from the KV cache to make room (offloaded or restarted)",
              attributes=(MODEL,)),
        _spec("gpuprobe.requests.finished", "counter", "{request}", "Serving: requests that ended, by finish reason",
              attributes=(MODEL, Attribute("finish_reason", values=("stop", "length", "cancelled", "failed")))),
        _spec("gpuprobe.requests.slo", "counter", "{request}",
              "Finished requests by their service-level goals (settings slo_ttft, slo_tpot, slo_e2e): met, the "
              "first goal missed (ttft, tpot, e2e, in this order), or error (it failed); cancelled ones are not "
              "counted. Goodput = met ÷ all",
              attributes=(MODEL, Attribute("result", values=("met", "ttft", "tpot", "e2e", "error")))),
        _spec("gpuprobe.prefix_cache.queries", "counter", "{request}",
              "Serving: requests that ended while prefix sharing was on (each looked its prompt up among the "
              "cached blocks)", attributes=(MODEL,)),
        _spec("gpuprobe.prefix_cache.hits", "counter", "{request}",
              "Serving: of those, the requests whose prompt began with blocks already in the cache (hit rate = "
              "hits ÷ queries)", attributes=(MODEL,)),
        _spec("gpuprobe.prefix_cache.tokens", "counter", "{token}",
              "Serving: prompt tokens read from shared blocks instead of computed", attributes=(MODEL,)),
        _spec("gpuprobe.kv_cache.usage", "gauge", "1", "Serving: fraction of the paged KV cache's blocks in use",
              attributes=(MODEL,)),
        _spec("gpuprobe.kv_cache.blocks", "gauge", "{block}", "Serving: paged KV cache blocks in use, and in all",
              attributes=(MODEL, Attribute("state", values=("used", "total")))),
        _spec("gpuprobe.batch.tokens", "histogram", "{token}",
              "Serving: tokens scheduled per continuous-batching step, by phase", BATCH_TOKEN_BUCKETS,
              attributes=(MODEL, PHASE)),
        _spec("gpuprobe.batch.requests", "histogram", "{request}",
              "Serving: requests scheduled per continuous-batching step", BATCH_BUCKETS, attributes=(MODEL,)),
        # Speculative decoding (assisted decoding, prompt lookup): per verification step of the main model.
        _spec("gpuprobe.speculative.drafts", "counter", "{draft}",
              "Speculative decoding: verification steps that checked a draft of one token or more",
              attributes=(MODEL, SPECULATIVE_METHOD)),
        _spec("gpuprobe.speculative.draft_tokens", "counter", "{token}",
              "Speculative decoding: draft tokens proposed to the main model", attributes=(MODEL, _METHOD)),
        _spec("gpuprobe.speculative.accepted_tokens", "counter", "{token}",
              "Speculative decoding: draft tokens the main model accepted (acceptance rate = accepted ÷ draft tokens)",
              attributes=(MODEL, _METHOD)),
        _spec("gpuprobe.speculative.accepted_tokens_per_position", "counter", "{token}",
              "Speculative decoding: accepted draft tokens by their position in the draft (0 = the first)",
              attributes=(MODEL, _METHOD,
                          Attribute("position", note=f"0 … {MAX_DRAFT_POSITIONS - 1}, then {MAX_DRAFT_POSITIONS}+",
                                    values=(*map(str, range(MAX_DRAFT_POSITIONS)), f"{MAX_DRAFT_POSITIONS}+")))),
        _spec("gpuprobe.speculative.emitted_tokens", "histogram", "{token}",
              "Speculative decoding: tokens one verification step emitted (the accepted draft tokens and one "
              "of the main model's own)", EMITTED_TOKEN_BUCKETS, attributes=(MODEL, _METHOD)),
        # GPU health from NVML (setting `nvml`), per GPU: gpu.index and gpuprobe.device on each series.
        _spec("gpuprobe.gpu.utilization", "gauge", "1",
              "GPU health (NVML): fraction of the last sample period in which a kernel ran on the GPU", attributes=GPU),
        _spec("gpuprobe.gpu.memory.used", "gauge", "By", "GPU health (NVML): device memory in use, by every process",
              attributes=GPU),
        _spec("gpuprobe.gpu.memory.total", "gauge", "By", "GPU health (NVML): device memory in all", attributes=GPU),
        _spec("gpuprobe.gpu.clock.sm", "gauge", "Hz", "GPU health (NVML): SM clock", attributes=GPU),
        _spec("gpuprobe.gpu.power", "gauge", "W", "GPU health (NVML): power draw", attributes=GPU),
        _spec("gpuprobe.gpu.power.limit", "gauge", "W", "GPU health (NVML): enforced power limit", attributes=GPU),
        _spec("gpuprobe.gpu.temperature", "gauge", "Cel", "GPU health (NVML): GPU temperature", attributes=GPU),
        _spec("gpuprobe.gpu.throttle", "gauge", "1",
              "GPU health (NVML): 1 while the clocks are held down for this reason, else 0",
              attributes=(*GPU, Attribute("reason", values=THROTTLE_REASONS))),
        _spec("gpuprobe.gpu.sm.activity", "gauge", "1",
              "GPU health (NVML GPM, Hopper and later): fraction of SMs busy over the last sample period",
              attributes=GPU),
        _spec("gpuprobe.gpu.tensor.activity", "gauge", "1",
              "GPU health (NVML GPM, Hopper and later): tensor-core activity over the last sample period",
              attributes=GPU),
        # diffusers pipelines (gpuprobe.integrations.diffusers): per call, per denoising step, per component.
        # A denoising step is one iteration of a pipeline's loop over its timesteps; its components add up to it.
        _spec("gpuprobe.diffusion.call.duration", "histogram", "s",
              "Duration of a whole diffusers pipeline call", REQUEST_BUCKETS, NS,
              attributes=(MODEL, dataclasses.replace(ERROR_TYPE, note="on failure"))),
        _spec("gpuprobe.diffusion.time_to_first_step", "histogram", "s",
              "Diffusers: from a pipeline call's start to the end of its first denoising step (text encoding "
              "and the first step included)", TTFT_BUCKETS, NS, attributes=(MODEL,)),
        _spec("gpuprobe.diffusion.step.duration", "histogram", "s",
              "Diffusers: time of one denoising step (steps per second = count ÷ sum)", PROBE_BUCKETS, NS,
              attributes=(MODEL, CLOCK)),
        _spec("gpuprobe.diffusion.component.duration", "histogram", "s",
              "Diffusers: time of each component of a pipeline call; those of a denoising step (denoiser, "
              "controlnet, scheduler, other) add up to the step", PROBE_BUCKETS, NS,
              attributes=(MODEL, Attribute("component", values=("text_encoder", "denoiser", "controlnet", "scheduler",
                                                                "other", "vae_encode", "vae_decode",
                                                                "safety_checker")),
                          Attribute("module", note="the pipeline's name for it: unet, transformer, text_encoder_2"),
                          Attribute("branch", note="the denoiser's calls: cond/uncond where the pipeline runs them "
                                                   "apart, batched for both in one forward",
                                    values=("cond", "uncond", "batched", "other")), CLOCK)),
        _spec("gpuprobe.diffusion.images", "counter", "{image}",
              "Diffusers: images (videos, latents) returned by successful pipeline calls (images per second = rate)",
              attributes=(MODEL,)),
        _spec("gpuprobe.diffusion.component.memory.peak", "gauge", "By",
              "Diffusers: the memory high-water mark at the end of a component of the call (and of the denoising "
              "loop); with memory_peak_reset, the component's own peak", attributes=(
                  MODEL, Attribute("component", values=("text_encoder", "denoiser", "vae_encode", "vae_decode",
                                                        "safety_checker")),
                  Attribute("module"), DEVICE)),
        _spec("gpuprobe.diffusion.syncs", "counter", "{sync}",
              "Diffusers: operations that force a device-to-host synchronisation, on audited denoising steps",
              attributes=(MODEL, Attribute("component", values=("denoiser", "controlnet", "scheduler", "other")),
                          Attribute("op", note="`aten::name`"))),
        _spec("gpuprobe.diffusion.steps.audited", "counter", "{step}",
              "Diffusers: denoising steps the sync audit counted (syncs per step = syncs ÷ audited steps)",
              attributes=(MODEL,)),
    ]
)

_UNIT_SUFFIX = {"s": "seconds", "By": "bytes", "ms": "milliseconds", "1": "ratio", "Hz": "hertz", "W": "watts",
                "Cel": "celsius"}


def prometheus_name(spec: MetricSpec) -> str:
    """The Prometheus family name of a metric, following the OpenTelemetry-to-Prometheus rules.

    Dots become underscores, the unit becomes a suffix (``s`` → ``_seconds``, ``By`` → ``_bytes``,
    annotations in braces are dropped), and ``_total`` is added for counters by the exposition.

    Example:
        >>> prometheus_name(SPECS["gen_ai.server.time_to_first_token"])
        'gen_ai_server_time_to_first_token_seconds'
    """
    base = prometheus_label(spec.name)
    suffix = _UNIT_SUFFIX.get(spec.unit)
    if spec.unit == "1" and spec.instrument != "gauge":
        suffix = None
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base


def prometheus_label(name: str) -> str:
    """An attribute or metric name with every character Prometheus rejects turned into ``_``."""
    out = "".join(c if (c.isascii() and (c.isalnum() or c == "_")) else "_" for c in name)
    return "_" + out if out[:1].isdigit() else out


Labels = tuple[tuple[str, str], ...]
Sink = Callable[[str, Labels, float], None]


def label_key(labels: dict[str, Any]) -> Labels:
    """The key of a series: its label names and values as strings, sorted by name.

    Example:
        >>> label_key({"probe": "load", "clock": "host"})
        (('clock', 'host'), ('probe', 'load'))
    """
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


class Child:
    """One series: a family plus one set of label values."""

    __slots__ = ("family", "labels")

    def __init__(self, family: Family, labels: Labels) -> None:
        self.family = family
        self.labels = labels

    def apply(self, value: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class HistogramChild(Child):
    """A fixed-bucket histogram; ``counts[i]`` counts values in ``(bounds[i-1], bounds[i]]``."""

    __slots__ = ("bounds", "counts", "sum", "min", "max", "sinks", "exemplars")

    def __init__(self, family: Family, labels: Labels) -> None:
        super().__init__(family, labels)
        self.bounds = family.raw_bounds
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum: float = 0
        self.min: float = float("inf")
        self.max: float = float("-inf")
        self.sinks = family.sinks  # the registry's shared list, one attribute load away
        # Per bucket, the latest observation offered with its span, (value, trace id, span id, time) as
        # offer_exemplar takes them; None until the first offer.
        self.exemplars: list[tuple[float, str, str, float] | None] | None = None

    @property
    def count(self) -> int:
        """Values recorded (derived from the buckets: one store fewer per value when aggregating)."""
        return sum(self.counts)

    def apply_many(self, values: list[Any]) -> None:
        """Aggregate a batch (sorted in place).

        Why: sorting in C and bisecting once per bucket bound costs ~155 ns per value against ~400 ns
        for :meth:`apply` called per value (CPython 3.11, batches of 4096).
        """
        n = len(values)
        if not n:
            return
        sinks = self.sinks
        if sinks:
            scale = self.family.spec.scale
            name = self.family.spec.name
            for v in values:
                for sink in sinks:
                    sink(name, self.labels, v * scale)
        values.sort()
        counts = self.counts
        prev = 0
        for i, bound in enumerate(self.bounds):
            k = bisect_right(values, bound, prev)  # values <= bound: Prometheus `le` semantics
            counts[i] += k - prev
            prev = k
            if prev == n:
                break
        counts[-1] += n - prev
        self.sum += sum(values)
        if values[0] < self.min:
            self.min = values[0]
        if values[-1] > self.max:
            self.max = values[-1]

    def apply(self, value: Any) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        if value > self.max:
            self.max = value
        if value < self.min:
            self.min = value
        sinks = self.sinks
        if sinks:
            scaled = value * self.family.spec.scale
            for sink in sinks:
                sink(self.family.spec.name, self.labels, scaled)

    def offer_exemplar(self, value: float, trace_id: str, span_id: str, at: float) -> None:
        """Make an observation of ``value`` (in the metric's unit) the exemplar of its bucket: it belongs to
        the span ``span_id`` of the trace ``trace_id`` (hex), and was made at ``at`` (``time.time()``).

        The bucket keeps the latest one. Any thread may offer, without the runtime's lock: the per-bucket
        list is made once and each offer is one item store, which no reader sees half done (a list, not a
        dict, so a snapshot copying it never meets one changing size). Nothing of :meth:`apply` changes.

        Example:
            >>> reg = Registry()
            >>> child = reg.family("gen_ai.server.request.duration").child(**{"gen_ai.request.model": "m"})
            >>> child.apply(30_000_000)  # 30 ms, in nanoseconds
            >>> child.offer_exemplar(0.03, "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1.7e9)
            >>> reg.snapshot()[0].points[0].exemplars[2].span_id
            'b7ad6b7169203331'
        """
        slots = self.exemplars
        if slots is None:
            slots = self.exemplars = [None] * len(self.counts)
        # Why a plain tuple, the Exemplar made at snapshot time: a request's four offers (on its thread, by the
        # trace exporter) cost 1.8 us, 4.5 us with a frozen dataclass each (fastest of 15 rounds of 2,000
        # requests, CPython 3.11, test CPU).
        slots[self._bucket_of(value)] = (value, trace_id, span_id, at)

    def withdraw_exemplar(self, value: float, span_id: str) -> None:
        """Forget the exemplar of ``value``'s bucket if it is still the one of ``span_id`` (its span was
        not sent after all: not sampled, or lost)."""
        slots = self.exemplars
        if slots is None:
            return
        index = self._bucket_of(value)
        found = slots[index]
        if found is not None and found[2] == span_id:
            slots[index] = None

    def _bucket_of(self, value: float) -> int:
        """The bucket :meth:`apply` counts ``value`` (in the metric's unit) in."""
        scale = self.family.spec.scale
        raw = value / scale
        if scale == NS:
            raw = round(raw)  # the integer nanoseconds the bounds are kept in (see Family)
        return bisect_left(self.bounds, raw)


class CounterChild(Child):
    """A monotonic counter (also used for up-down counters, which may go down)."""

    __slots__ = ("value", "touched")

    def __init__(self, family: Family, labels: Labels) -> None:
        super().__init__(family, labels)
        self.value: float = 0
        self.touched = False  # series appear once something was recorded

    def apply(self, value: Any) -> None:
        self.value += value
        self.touched = True
        sinks = self.family.sinks
        if sinks:
            for sink in sinks:
                sink(self.family.spec.name, self.labels, value * self.family.spec.scale)


class GaugeChild(CounterChild):
    """A gauge: the last value set wins."""

    __slots__ = ()

    def forget(self) -> None:
        """Leave the exports until a value is set again (a reading that stopped; under the runtime's lock)."""
        self.touched = False

    def apply(self, value: Any) -> None:
        self.value = value
        self.touched = True
        sinks = self.family.sinks
        if sinks:
            for sink in sinks:
                sink(self.family.spec.name, self.labels, value * self.family.spec.scale)


_CHILD = {"histogram": HistogramChild, "counter": CounterChild, "updown": CounterChild, "gauge": GaugeChild}


class Family:
    """All series of one metric. :meth:`child` is called when a probe or step is prepared, never per call."""

    def __init__(self, spec: MetricSpec, registry: Registry) -> None:
        self.spec = spec
        self.registry = registry
        self.sinks = registry.sinks  # shared list: observers of every applied value
        self.raw_bounds: list[float] = [b / spec.scale for b in spec.buckets] if spec.buckets else []
        if spec.scale == NS:
            # Why: integer-vs-integer comparison in bisect is ~2x faster than mixed int/float.
            self.raw_bounds = [round(b / spec.scale) for b in spec.buckets or ()]
        self.children: dict[Labels, Child] = {}
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def child(self, **labels: Any) -> Child:
        """The series for these label values (created once; values past the cap fold into ``other``).

        A folded set of values keeps nothing of its own: it is looked up again, under the lock, at each
        call (a probe or an integration prepares its series once), so no program input grows the family.

        Example:
            >>> reg = Registry()
            >>> c = reg.family("gpuprobe.probe.errors").child(probe="load", **{"error.type": "KeyError"})
        """
        key = label_key(labels)
        found = self.children.get(key)
        if found is not None:
            return found
        with self._lock:
            cap = self.registry.max_label_values
            folded = []
            for k, v in key:
                seen = self._seen.setdefault(k, set())
                if v not in seen:
                    if len(seen) >= cap:
                        v = OTHER
                    seen.add(v)
                folded.append((k, v))
            key2 = tuple(folded)
            found = self.children.get(key2)
            if found is None:
                found = _CHILD[self.spec.instrument](self, key2)
                self.children[key2] = found
            return found

    def forget_values(self) -> None:
        """Forget which label values were seen: values not seen since get series of their own again.

        The series made so far stay (prepared children remain valid); the cap counts from zero again.
        """
        with self._lock:
            self._seen = {}

    def series(self) -> list[Child]:
        """Every series (each label set is one key: a folded one is never stored)."""
        return list(self.children.values())


@dataclasses.dataclass(frozen=True)
class Exemplar:
    """One observation a histogram bucket names: its value (in the metric's unit), the span it belongs to
    (trace and span id, hex) and when it was made (``time.time()``)."""

    value: float
    trace_id: str
    span_id: str
    time: float


@dataclasses.dataclass(frozen=True)
class Point:
    """One series at collection time, in the metric's unit."""

    labels: dict[str, str]
    value: float = 0.0  # counters, gauges
    count: int = 0  # histograms
    sum: float = 0.0
    bucket_counts: tuple[int, ...] = ()  # per bucket, not cumulative; last is +Inf
    min: float = 0.0
    max: float = 0.0
    # Per bucket (as bucket_counts), its exemplar or None; empty when no bucket has one.
    exemplars: tuple[Exemplar | None, ...] = ()


@dataclasses.dataclass(frozen=True)
class MetricData:
    """One metric at collection time."""

    spec: MetricSpec
    points: list[Point]


class Registry:
    """The families of one process; :meth:`snapshot` copies them for exporters."""

    def __init__(self, max_label_values: int = 100) -> None:
        self.max_label_values = max_label_values
        self.sinks: list[Sink] = []
        self.families: dict[str, Family] = {}
        self._lock = threading.Lock()
        self.const_labels: dict[str, str] = {}

    def family(self, name: str) -> Family:
        """The family for a metric in :data:`SPECS`."""
        fam = self.families.get(name)
        if fam is None:
            with self._lock:
                fam = self.families.get(name)
                if fam is None:
                    spec = SPECS.get(name)
                    if spec is None:
                        raise KeyError(f"gpuprobe has no metric named {name!r}")
                    fam = Family(spec, self)
                    self.families[name] = fam
        return fam

    def reset_after_fork(self) -> None:
        """In a forked child: locks held by the parent's threads would never be released here."""
        self._lock = threading.Lock()
        for fam in list(self.families.values()):
            fam._lock = threading.Lock()

    def zero(self) -> None:
        """Set every series back to zero in place (prepared children stay valid) and let each label take
        ``max_label_values`` new values again (a reset, and a forked child, start a fresh budget)."""
        for fam in list(self.families.values()):
            fam.forget_values()
            for child in fam.series():
                if isinstance(child, HistogramChild):
                    child.counts = [0] * len(child.counts)
                    child.sum = 0
                    child.min = float("inf")
                    child.max = float("-inf")
                    child.exemplars = None
                else:
                    child.value = 0  # type: ignore[attr-defined]
                    child.touched = False  # type: ignore[attr-defined]

    def prepare_known(self) -> None:
        """Prepare every series of a label set known in advance (:attr:`MetricSpec.known`)."""
        for name, spec in SPECS.items():
            if spec.known:
                fam = self.family(name)
                labels = [k for k, _ in spec.known]
                for values in itertools.product(*(v for _, v in spec.known)):
                    fam.child(**dict(zip(labels, values)))

    def snapshot(self, names: Iterable[str] | None = None, *, zeros: bool = False) -> list[MetricData]:
        """Copy every series (call under the runtime's lock for a consistent view).

        Args:
            names: the metrics to copy (all by default).
            zeros: also copy counters and up-down counters that nothing has counted yet, at 0: every
                series prepared (by an integration, or by :meth:`prepare_known`) is one whose labels are
                known, so a dashboard reads 0 rather than no data. Histograms and gauges appear once set.
        """
        out = []
        for name in list(self.families if names is None else names):
            fam = self.families.get(name)
            if fam is None:
                continue
            untouched = zeros and fam.spec.instrument in ("counter", "updown")
            scale = fam.spec.scale
            points = []
            for child in fam.series():
                labels = dict(self.const_labels)
                labels.update(child.labels)
                if isinstance(child, HistogramChild):
                    count = child.count
                    if count == 0:
                        continue
                    counts = tuple(child.counts)
                    points.append(Point(labels, count=count, sum=child.sum * scale, bucket_counts=counts,
                                        min=child.min * scale, max=child.max * scale,
                                        exemplars=_exemplars(child.exemplars, counts)))
                elif untouched or child.touched:  # type: ignore[attr-defined]
                    points.append(Point(labels, value=child.value * scale))  # type: ignore[attr-defined]
            if points:
                out.append(MetricData(fam.spec, points))
        return out


def _exemplars(slots: list[tuple[float, str, str, float] | None] | None,
               counts: tuple[int, ...]) -> tuple[Exemplar | None, ...]:
    """The exemplars a snapshot shows: each bucket's, once an observation is counted in it (an exemplar can
    be offered before the runtime has drained its value); empty when none."""
    if slots is None:
        return ()
    shown = tuple(Exemplar(*e) if e is not None and c else None for e, c in zip(tuple(slots), counts))
    return shown if any(e is not None for e in shown) else ()


def cumulative(counts: Sequence[int]) -> list[int]:
    """Per-bucket counts → cumulative counts (Prometheus ``le`` semantics)."""
    total, out = 0, []
    for c in counts:
        total += c
        out.append(total)
    return out


@functools.lru_cache(maxsize=None)
def _version_of(module: str) -> str:
    """The installed distribution's version of ``module`` (its metadata: the same whether or not it is
    imported yet), else its ``__version__`` where it is imported; empty when neither is there.

    Why the metadata first: a module's ``__version__`` may carry a local build tag its distribution's
    metadata does not (PyPI's CUDA builds of torch: ``2.15.0+cu132`` against ``2.15.0``), so reading it
    only when imported would change the label with import order.
    """
    from importlib import metadata

    try:
        return metadata.version(module)
    except Exception:  # not installed as a distribution, or broken metadata: what the module says, if imported
        pass
    found = sys.modules.get(module)
    version = getattr(found, "__version__", None) if found is not None else None
    return version if isinstance(version, str) else ""


def build_info_labels(device_name: str) -> dict[str, str]:
    """The labels of ``gpuprobe.build_info``: gpuprobe's, torch's, transformers' and Python's versions
    (empty for a package that is not installed) and the device's name. Imports nothing.

    Example:
        >>> build_info_labels("cpu")["device.name"]
        'cpu'
    """
    from ._version import __version__

    return {"gpuprobe.version": __version__, "torch.version": _version_of("torch"),
            "transformers.version": _version_of("transformers"), "python.version": platform.python_version(),
            "device.name": device_name}
