"""What gpuprobe's dashboards contain: the overview and the ranks dashboard, panel by panel.

Quantile and mean panels read the recording rules of :mod:`.rules`, or compute the same statistics
in the query when built with ``inline=True``. Every query aggregates explicitly (``sum by (...)``,
``max by (...)`` or a recording rule that does), so the labels an OpenTelemetry Collector adds
(``otel_scope_name``, ...) never split a line in two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .._metrics import SPECS, prometheus_name
from .model import (
    EXEMPLARS_NOTE,
    GPU_ONLY,
    KERNEL_SAMPLING_OFF,
    LAYER_TIMING_OFF,
    NO_CONTINUOUS_BATCHING,
    NO_DIFFUSION_PIPELINE,
    NO_PROBES,
    NO_SERVICE_LEVEL_GOALS,
    NO_SPECULATIVE_DECODING,
    PEAKS_UNKNOWN,
    SYNC_AUDIT_OFF,
    WAITS_FOR_DROPS,
    WAITS_FOR_ERRORS,
    Dashboard,
    NoData,
    Panel,
    Row,
    Target,
)
from .rules import BURN_RATES, RULES_FILE, SLO_OBJECTIVE, STATS, WINDOW, Latency, latency, recorded_name, stat_expr
from .series import ERROR_TYPE, LAYER_TYPE, RANK, TOKEN_TYPE, braces, label, model_label, series

__all__ = ["Queries", "overview", "ranks", "dashboards"]


class Queries:
    """Builds the PromQL of the panels: filters from the template variables, recorded or inline statistics.

    Args:
        inline: compute quantiles and means in the query instead of reading the recording rules.

    Example:
        >>> Queries(inline=False).sel("gpuprobe.memory.peak")
        'gpuprobe_memory_peak_bytes{gpuprobe_rank=~"$rank", instance=~"$instance"}'
    """

    def __init__(self, inline: bool) -> None:
        self.inline = inline

    @staticmethod
    def filters(metric: str, *extra: str) -> tuple[str, ...]:
        """``extra`` matchers, then the model (where the metric has one), rank and instance variables."""
        model = model_label(metric)
        return (*extra, *((f'{model}=~"$model"',) if model else ()), f'{RANK}=~"$rank"', 'instance=~"$instance"')

    def sel(self, metric: str, part: str = "", *extra: str) -> str:
        """A series selector of one part of ``metric``, filtered by the variables."""
        return series(metric, part) + braces(self.filters(metric, *extra))

    def rate(self, metric: str, part: str = "", *extra: str) -> str:
        """``rate()`` of :meth:`sel` over Grafana's ``$__rate_interval``."""
        return f"rate({self.sel(metric, part, *extra)}[$__rate_interval])"

    def stat(self, metric: str, stat: str, *extra: str) -> str:
        """One statistic (``p95``, ``mean``, ...) of a latency histogram: recorded, or computed inline."""
        if self.inline:
            return stat_expr(latency(metric), stat, "$__rate_interval", self.filters(metric, *extra))
        return recorded_name(metric, stat) + braces(self.filters(metric, *extra))

    def exemplar_stat(self, metric: str, stat: str, *extra: str) -> str:
        """A quantile of a latency histogram read from its ``_bucket`` series, so that Grafana finds their
        exemplars: inline, over the recording rules' window (the same line as the recorded statistic)."""
        if self.inline:
            return self.stat(metric, stat, *extra)
        return stat_expr(latency(metric), stat, WINDOW, self.filters(metric, *extra))

    def latency_targets(self, metric: str, *extra: str, stats: Sequence[str] = STATS, legend: str = "",
                        exemplars: str | None = None) -> tuple[Target, ...]:
        """One target per statistic, each line labelled with the statistic and the rank; the one named by
        ``exemplars`` reads the buckets themselves and shows their exemplars (:meth:`exemplar_stat`)."""
        out = []
        for s in stats:
            shown = f"{legend}{s} · rank {{{{{RANK}}}}}"
            if s == exemplars:
                out.append(Target(self.exemplar_stat(metric, s, *extra), shown, exemplar=True))
            else:
                out.append(Target(self.stat(metric, s, *extra), shown))
        return tuple(out)


def _latency_description(what: str, metric: str, exemplars: bool = False) -> str:
    text = (f"{what}: p50, p95 and p99 from the histogram's buckets over {WINDOW} (recording rules in "
            f"{RULES_FILE}), and the mean (rate of the sum ÷ rate of the count). Series: "
            f"{prometheus_name(SPECS[metric])}.")
    return f"{text} {EXEMPLARS_NOTE}" if exemplars else text


def _no_data(reason: NoData, panels: tuple[Panel, ...]) -> tuple[Panel, ...]:
    """The panels of a row that all wait for the same thing (continuous batching, speculative decoding)."""
    return tuple(dataclasses.replace(p, no_data=reason) for p in panels)


def _requests_row(q: Queries) -> Row:
    ttft, tpot, req = ("gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token",
                       "gen_ai.server.request.duration")
    itl = "gpuprobe.inter_token.duration"
    usage, active = "gen_ai.client.token.usage", "gpuprobe.generate.active"
    by_type = f"sum by ({TOKEN_TYPE}) ({q.rate(usage, 'sum')})"
    failed, succeeded = f'{ERROR_TYPE}!=""', f'{ERROR_TYPE}=""'
    errors = f"sum by ({ERROR_TYPE}) ({q.rate(req, 'count', failed)})"
    probe_errors = f"sum by (probe, {ERROR_TYPE}) ({q.rate('gpuprobe.probe.errors')})"
    return Row("Requests", (
        Panel("Time to first token", _latency_description(
            "From a request's arrival (the generate() call; add_request under continuous batching) to its "
            "first output token, by clock: host = when the host holds the token (what a client sees); device "
            "(GPUs only) = the GPU's own time for the request's work up to the step that selected the token "
            "(continuous batching adds the host-measured queue wait before its first step)", ttft, exemplars=True),
              q.latency_targets(ttft, legend="{{clock}} ", exemplars="p99"), "s"),
        Panel("Inter-token latency", _latency_description(
            "Time between two consecutive output tokens of a request, one sample per output token after its "
            "first, by clock (host: as the host receives them; device, GPUs only: the device span of the step "
            "that selected it)", itl, exemplars=True),
              q.latency_targets(itl, legend="{{clock}} ", exemplars="p99"), "s"),
        Panel("Time per output token", _latency_description(
            "Per successful request of two tokens or more: (duration − time to first token) ÷ (output "
            "tokens − 1), the OpenTelemetry GenAI convention's definition", tpot),
              q.latency_targets(tpot), "s"),
        Panel("Request duration", _latency_description("Whole generate() calls that returned (failed calls are "
                                                       "in Errors)", req, exemplars=True),
              q.latency_targets(req, exemplars="p99"), "s"),
        Panel("Tokens per second", "Input (prompt) and output (generated) tokens per second: the rate of the "
              "token-usage histogram's sum, which grows when each generate() call returns.",
              (Target(by_type, f"{{{{{TOKEN_TYPE}}}}}"),), "suffix: tok/s"),
        Panel("Requests in flight", "generate() calls running now (gpuprobe.generate.active) and calls "
              "completed per second (continuous batching's requests running and waiting are in the Serving row).",
              (Target(f"sum({q.sel(active)})", "in flight"),
               Target(f"sum({q.rate(req, 'count', succeeded)})", "completed/s")), "short", generate_only=True),
        Panel("Errors", "Failed generate() calls per second by exception type, and exceptions raised inside "
              "your own probes.",
              (Target(errors, f"generate(): {{{{{ERROR_TYPE}}}}}"),
               Target(probe_errors, f"probe {{{{probe}}}}: {{{{{ERROR_TYPE}}}}}")), "short",
              no_data=WAITS_FOR_ERRORS),
    ))


def _goals_row(q: Queries) -> Row:
    """Service-level goals (settings slo_ttft, slo_tpot, slo_e2e): goodput, what was missed, the burn rate."""
    slo = "gpuprobe.requests.slo"
    who = "{{model}}"
    met, not_met = 'result="met"', 'result!="met"'
    goodput = f"sum by (model) ({q.rate(slo, '', met)}) / sum by (model) ({q.rate(slo)})"
    missed = f"sum by (model, result) ({q.rate(slo, '', not_met)})"
    budget = f"{1 - SLO_OBJECTIVE:g}"

    def burn(window: str) -> str:
        missing, every = (f"rate({q.sel(slo, '', *extra)}[{window}])" for extra in ((not_met,), ()))
        return f"sum by (model) ({missing}) / sum by (model) ({every}) / {budget}"

    fast = BURN_RATES[0]
    return Row("Service-level goals", _no_data(NO_SERVICE_LEVEL_GOALS, (
        Panel("Goodput", "Share of finished requests that met every service-level goal (time to first token, "
              "time per output token and duration at most GPUPROBE_SLO_TTFT, GPUPROBE_SLO_TPOT, GPUPROBE_SLO_E2E), "
              f"by model: met ÷ all of {series(slo)} (cancelled requests are not counted).",
              (Target(goodput, who),), "percentunit"),
        Panel("Requests missing their goals", "Finished requests per second that missed a goal, by model and the "
              "first goal they missed (ttft, tpot, e2e, in this order), and those that failed (error).",
              (Target(missed, f"{who} {{{{result}}}}"),), "short", stack=True),
        Panel("Error-budget burn rate", f"How many times faster than the error budget allows requests miss their "
              f"goals: the share that missed ÷ {budget} (an objective of {SLO_OBJECTIVE:g} of requests meeting "
              f"them), over {fast.long} and {fast.short}. The alert {fast.alert} fires when both are above "
              f"{fast.rate:g} ({RULES_FILE} has the others).",
              (Target(burn(fast.long), f"{who} {fast.long}"), Target(burn(fast.short), f"{who} {fast.short}")),
              "short"),
    )))


def _serving_row(q: Queries) -> Row:
    """Continuous batching (``generate_batch``, ``transformers serve --continuous-batching``): the
    scheduler's queue, the paged KV cache, what each step batches, and the latencies a client sees."""
    queue = "gpuprobe.request.queue.duration"
    running, waiting = "gpuprobe.requests.running", "gpuprobe.requests.waiting"
    usage, tokens, per_step = "gpuprobe.kv_cache.usage", "gpuprobe.batch.tokens", "gpuprobe.batch.requests"
    preempted, finished = "gpuprobe.requests.preempted", "gpuprobe.requests.finished"
    ttft, tpot, req = ("gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token",
                       "gen_ai.server.request.duration")
    keep = f"instance, {RANK}, model"
    who = f"{{{{model}}}} · rank {{{{{RANK}}}}}"
    mean_tokens = f"sum by (phase) ({q.rate(tokens, 'sum')}) / sum by (phase) ({q.rate(tokens, 'count')})"
    mean_requests = f"sum({q.rate(per_step, 'sum')}) / sum({q.rate(per_step, 'count')})"
    host = ('clock!="device"',)  # what a client sees (on a GPU the device clock is recorded too)
    latency = tuple(Target(q.stat(metric, stat, *extra), f"{what} {stat} · rank {{{{{RANK}}}}}")
                    for metric, what, extra in ((ttft, "TTFT", host), (tpot, "TPOT", ()), (req, "end to end", ()))
                    for stat in ("p50", "p95"))
    return Row("Serving (continuous batching)", _no_data(NO_CONTINUOUS_BATCHING, (
        Panel("Queue time", _latency_description("From a request's arrival to the first step that schedules it",
                                                 queue, exemplars=True),
              q.latency_targets(queue, exemplars="p99"), "s"),
        Panel("Requests running and waiting", "Requests the continuous-batching scheduler is running "
              "(prefilling or decoding) and those waiting for room in a batch or in the KV cache, read at "
              "each step. Waiting that stays above zero means the server is at capacity.",
              (Target(f"sum by ({keep}) ({q.sel(running)})", f"running {who}"),
               Target(f"sum by ({keep}) ({q.sel(waiting)})", f"waiting {who}")), "short"),
        Panel("KV cache usage", "Fraction of the paged KV cache's blocks that running requests hold (blocks "
              "kept only for prefix reuse count as free). Near 1 the scheduler stops admitting prompts and "
              f"preempts requests. Series: {series(usage)}; blocks: {series('gpuprobe.kv_cache.blocks')}.",
              (Target(f"max by ({keep}) ({q.sel(usage)})", who),), "percentunit"),
        Panel("Tokens and requests per step", "Mean tokens one continuous-batching step schedules, by phase "
              "(prefill: prompt tokens; decode: one per decoding request), and mean requests per step.",
              (Target(mean_tokens, "{{phase}} tokens"), Target(mean_requests, "requests")), "short"),
        Panel("Serving latency: TTFT, TPOT, end to end", "p50 and p95 over 1 m of the time to first token "
              "(arrival to first token), the time per output token ((duration − TTFT) ÷ (output tokens − 1), "
              "one per request) and the request duration, as a client sees them. Successful requests only "
              "for the end to end time.", latency, "s"),
        Panel("Preemptions and finished requests", "Requests evicted from the KV cache per second (offloaded "
              "to the CPU or restarted later), and requests ending per second by finish reason (stop: "
              "end-of-sequence token; length: token limit; cancelled; failed).",
              (Target(f"sum({q.rate(preempted)})", "preempted/s"),
               Target(f"sum by (finish_reason) ({q.rate(finished)})", "{{finish_reason}}/s")), "short"),
    )))


def _steps_row(q: Queries) -> Row:
    step, comp, layer = "gpuprobe.step.duration", "gpuprobe.step.component.duration", "gpuprobe.layer.duration"
    batch = "gpuprobe.step.batch_size"
    host = 'clock="host"'
    per_step = f"sum({q.rate(step, 'count', host)})"
    step_time = f"sum({q.rate(step, 'sum', host)})"
    lp = 'component="logits_processor"'
    by_comp = f"sum by (component) ({q.rate(comp, 'sum')}) / ignoring(component) group_left {per_step}"
    lp_all = f"sum({q.rate(comp, 'sum', lp)}) / {step_time}"
    lp_each = f"sum by (processor) ({q.rate(comp, 'sum', lp)}) / ignoring(processor) group_left {step_time}"
    phase = "{{phase}} "
    return Row("Generation steps", (
        Panel("Step time by phase (host clock)", "Mean and p95 of one forward step, prefill and decode, on the "
              f"host clock (what the caller waits for). {EXEMPLARS_NOTE}",
              q.latency_targets(step, 'clock="host"', stats=("mean", "p95"), legend=phase, exemplars="p95"), "s"),
        Panel("Step time by phase (device clock)", f"{GPU_ONLY} Mean and p95 of one forward step as a device "
              "span: the time the GPU took between the step's two CUDA events (read without synchronizing).",
              q.latency_targets(step, 'clock="device"', stats=("mean", "p95"), legend=phase), "s",
              gpu_only=True),
        Panel("Step time by component", "Mean time per step spent in each part of the generation loop: the "
              "forward pass, logits processors, stopping criteria, streamer and the rest. Stacked, they add "
              "up to the mean step time.",
              (Target(by_comp, "{{component}}"),), "s", stack=True),
        Panel("Logits processors: share of step time", "Time in logits processors (repetition penalty, "
              "top-k, ...) as a share of host step time: all of them, and each by class.",
              (Target(lp_all, "all logits processors"), Target(lp_each, "{{processor}}")), "percentunit",
              generate_only=True),
        _syncs_panel(q),
        Panel("Decoder layer time", "Mean and p95 of one decoder layer's forward, by layer class (sampled "
              "on one decode step in N).",
              q.latency_targets(layer, stats=("mean", "p95"), legend=f"{{{{{LAYER_TYPE}}}}} "), "s",
              no_data=LAYER_TIMING_OFF),
        Panel("Batch size", "Mean sequences per generate() call.",
              (Target(f"sum({q.rate(batch, 'sum')}) / sum({q.rate(batch, 'count')})", "mean batch size"),),
              "short", generate_only=True),
        *_utilization_panels(q),
    ))


def _speculative_row(q: Queries) -> Row:
    """Assisted decoding and prompt lookup (``assistant_model=``, ``prompt_lookup_num_tokens=``): what the
    drafts propose, what the main model accepts, and where a speculative step's time goes."""
    drafts, proposed = "gpuprobe.speculative.drafts", "gpuprobe.speculative.draft_tokens"
    accepted, per_pos = "gpuprobe.speculative.accepted_tokens", "gpuprobe.speculative.accepted_tokens_per_position"
    emitted, comp = "gpuprobe.speculative.emitted_tokens", "gpuprobe.step.component.duration"
    keep = f"instance, {RANK}, model, method"
    who = f"{{{{model}}}} {{{{method}}}} · rank {{{{{RANK}}}}}"

    def by(metric: str, part: str = "", *extra: str, labels: str = keep) -> str:
        return f"sum by ({labels}) ({q.rate(metric, part, *extra)})"

    rate = f"{by(accepted)} / {by(proposed)}"
    length = f"1 + {by(accepted)} / {by(drafts)}"
    per_step = f"{by(emitted, 'sum')} / {by(emitted, 'count')}"
    position = f"{by(per_pos, labels=keep + ', position')} / ignoring(position) group_left {by(drafts)}"
    parts = 'component=~"draft|forward|verify"'
    spec_steps = by(emitted, "count", labels=f"instance, {RANK}, model")
    split = (f"sum by (instance, {RANK}, model, component) ({q.rate(comp, 'sum', parts)}) "
             f"/ ignoring(component) group_left {spec_steps}")
    return Row("Speculative decoding", _no_data(NO_SPECULATIVE_DECODING, (
        Panel("Draft acceptance rate", "Draft tokens the main model accepted ÷ draft tokens proposed (assisted "
              "decoding, prompt lookup), by model and method (draft_model, prompt_lookup, early_exit, ...): the "
              f"rate of {series(accepted)} over the rate of {series(proposed)}.",
              (Target(rate, who),), "percentunit"),
        Panel("Tokens per main-model forward", "Mean tokens one verification step emits (the accepted draft "
              "tokens and one of the main model's own), and the mean acceptance length (1 + accepted tokens ÷ "
              "drafts, the bonus token included, as vLLM reports it): how many tokens each forward of the main "
              "model buys.",
              (Target(per_step, f"emitted per step {who}"), Target(length, f"acceptance length {who}")), "short"),
        Panel("Acceptance rate by draft position", "Share of drafts whose token at position N (0 = the first "
              "draft token) was accepted: it falls with N; where it gets small, shorter drafts waste less.",
              (Target(position, f"position {{{{position}}}} {who}"),), "percentunit"),
        Panel("Draft, forward and verification time per speculative step", "Mean time per speculative step in "
              "the draft (the candidate generator: a draft model's generate(), or the prompt lookup), the main "
              "model's forward, and the verification (selecting and comparing tokens, cropping the cache; on a "
              "GPU the wait for the forward lands here). Per speculative step of each model: a model that "
              "also runs plain steps adds their forward time.",
              (Target(split, f"{{{{component}}}} {{{{model}}}} · rank {{{{{RANK}}}}}"),), "s", stack=True),
        Panel("Draft tokens proposed and accepted", "Draft tokens proposed to the main model and accepted by "
              "it, per second, by model and method.",
              (Target(by(proposed), f"proposed {who}"), Target(by(accepted), f"accepted {who}")), "short"),
    )))


def _diffusion_row(q: Queries) -> Row:
    """diffusers pipelines (:mod:`gpuprobe.integrations.diffusers`): denoising steps and their components, the
    components of a call outside the steps, steps and images per second, calls, memory and syncs by component.

    One line per pipeline (its ``model`` label) and rank: the ``model`` variable lists the models of
    generate() calls (``gen_ai_request_model``), never a pipeline's name, so this row filters by rank and
    instance only. Its statistics are computed in the query, as the utilization panels' (no recording rule).
    """
    step, comp = "gpuprobe.diffusion.step.duration", "gpuprobe.diffusion.component.duration"
    call, first = "gpuprobe.diffusion.call.duration", "gpuprobe.diffusion.time_to_first_step"
    images, peak = "gpuprobe.diffusion.images", "gpuprobe.diffusion.component.memory.peak"
    syncs, audited = "gpuprobe.diffusion.syncs", "gpuprobe.diffusion.steps.audited"
    host = 'clock="host"'
    in_step = 'component=~"denoiser|controlnet|scheduler|other"'  # a step's components add up to it
    outside = 'component=~"text_encoder|vae_encode|vae_decode|safety_checker"'
    keep = f"instance, {RANK}, model"
    who = f"{{{{model}}}} · rank {{{{{RANK}}}}}"

    def where(*extra: str) -> tuple[str, ...]:
        return (*extra, f'{RANK}=~"$rank"', 'instance=~"$instance"')

    def rate(metric: str, part: str = "", *extra: str) -> str:
        return f"rate({series(metric, part)}{braces(where(*extra))}[$__rate_interval])"

    def stats(lat: Latency, legend: str) -> tuple[Target, ...]:
        return tuple(Target(stat_expr(lat, s, "$__rate_interval", where()), f"{legend}{s} · rank {{{{{RANK}}}}}")
                     for s in ("mean", "p95"))

    steps = f"sum by ({keep}) ({rate(step, 'count', host)})"
    by_part = (f"sum by ({keep}, component, branch) ({rate(comp, 'sum', host, in_step)}) "
               f"/ ignoring(component, branch) group_left {steps}")
    part_mean = " / ".join(f"sum by ({keep}, component, module) ({rate(comp, part, host, outside)})"
                           for part in ("sum", "count"))
    per_audited = (f"sum by ({keep}, component) ({rate(syncs)}) "
                   f"/ ignoring(component) group_left sum by ({keep}) ({rate(audited)})")
    succeeded = Latency(call, match=(f'{ERROR_TYPE}=""',))
    pipelines = _no_data(NO_DIFFUSION_PIPELINE, (
        Panel("Denoising step time", "Mean and p95 of one denoising step (one iteration of a pipeline's loop over "
              "its timesteps: the denoiser's forward, a ControlNet's, the scheduler's step and the rest), by clock "
              "(host: what the caller waits for; device, GPUs only: the GPU's time between the step's CUDA events). "
              f"Series: {prometheus_name(SPECS[step])}.",
              stats(Latency(step, by=("clock",)), "{{model}} {{clock}} "), "s"),
        Panel("Denoising steps and images per second", "Denoising steps per second (host clock) and images "
              "(videos, latents) per second that successful pipeline calls returned, by pipeline.",
              (Target(steps, f"steps/s {who}"), Target(f"sum by ({keep}) ({rate(images)})", f"images/s {who}")),
              "short"),
        Panel("Denoising step time by component", "Mean time per denoising step in each of its components, on "
              "the host clock: the denoiser's forward by branch (cond and uncond where the pipeline runs them "
              "apart, batched where classifier-free guidance runs both in one forward), a ControlNet's, the "
              "scheduler's step, and other (guidance arithmetic, your callback_on_step_end). Stacked, they add up "
              "to the mean step time.",
              (Target(by_part, "{{component}} {{branch}} · {{model}}"),), "s", stack=True),
        Panel("Pipeline components outside the steps", "Mean time of one call of each component a pipeline "
              "call runs before or after its denoising steps, on the host clock: the text encoders (by module: "
              "text_encoder, text_encoder_2, ...), the VAE's encode (image-to-image, inpainting) and decode, a "
              "safety checker.",
              (Target(part_mean, "{{component}} {{module}} · {{model}}"),), "s"),
        Panel("Pipeline call and time to first step", "Mean and p95 of whole pipeline calls that returned, and "
              "of the time from a call's start to the end of its first denoising step (text encoding included).",
              (*stats(succeeded, "call {{model}} "), *stats(Latency(first), "first step {{model}} ")), "s"),
        Panel("Memory peak by pipeline component", "The memory high-water mark at the end of each component of a "
              "pipeline call (text encoders, VAE encode and decode, safety checker) and of its denoising loop "
              "(denoiser): the VAE decode's is where a large image runs out of memory. CUDA allocator on a GPU, "
              "process RSS on a CPU; with memory_peak_reset, each component's own peak.",
              (Target(f"max by ({keep}, component, module, device) ({series(peak)}{braces(where())})",
                      "{{component}} {{module}} {{device}} · {{model}}"),), "bytes"),
    ))
    # Empty without a pipeline too; its reason is the one a pipeline's user meets.
    audit = Panel("Host syncs per denoising step by component", "Operations that force a device-to-host "
                  "synchronisation per audited denoising step of a diffusers pipeline, by the step's component that "
                  "ran them (the sync audit, GPUPROBE_SYNC_AUDIT=N; on a CPU it counts what would synchronise on a "
                  f"GPU): the rate of {series(syncs)} over the rate of {series(audited)}.",
                  (Target(per_audited, "{{component}} · {{model}}"),), "short", stack=True, no_data=SYNC_AUDIT_OFF)
    return Row("Diffusion pipelines", (*pipelines, audit))


def _syncs_panel(q: Queries) -> Panel:
    """Host syncs per audited step by component and processor (the sync audit, docs/sync-audit.md)."""
    syncs, audited = "gpuprobe.step.syncs", "gpuprobe.step.audited"
    steps_only = 'component!="probe"'  # probes count their calls' syncs, not a step's
    per_component = (f"sum by (component, processor) ({q.rate(syncs, '', steps_only)}) "
                     f"/ ignoring(component, processor) group_left sum({q.rate(audited)})")
    return Panel("Host syncs per step by component", "Operations that force a device-to-host synchronisation "
                 "(.item(), bool(), nonzero, boolean-mask indexing, unique, copies to the host, ...) per "
                 "generation step, by component and logits-processor or stopping-criterion class: each is a "
                 "point where the host waits for the GPU. Counted by the sync audit on one step in N "
                 "(GPUPROBE_SYNC_AUDIT=N; on a CPU it counts what would synchronise on a GPU); the rate of "
                 f"{series(syncs)} over the rate of {series(audited)}. transformers' own stop check is one "
                 "per step in other; docs/sync-audit.md says where each one comes from.",
                 (Target(per_component, "{{component}} {{processor}}"),), "short", stack=True,
                 no_data=SYNC_AUDIT_OFF)


def _utilization_panels(q: Queries) -> tuple[Panel, ...]:
    """MBU and MFU by model and phase: p50 and p90 of the steps, computed in the query (no recording rule)."""
    out = []
    for metric, title, what in (
        ("gpuprobe.step.memory_bandwidth.utilization", "Memory-bandwidth utilization (MBU)",
         "Bytes each step must read (weights and the KV cache) ÷ its step time ÷ the device's peak memory "
         "bandwidth"),
        ("gpuprobe.step.flops.utilization", "Model FLOPs utilization (MFU)",
         "Model FLOPs of each step ÷ its step time ÷ the device's dense peak FLOP/s for the parameters' dtype"),
    ):
        lat = Latency(metric, by=("phase",))
        targets = tuple(
            Target(stat_expr(lat, stat, "$__rate_interval", q.filters(metric)),
                   f"{{{{model}}}} {{{{phase}}}} {stat} · rank {{{{{RANK}}}}}")
            for stat in ("p50", "p90"))
        out.append(Panel(title, f"{what}, p50 and p90 over the steps by model and phase (device step time on "
                         f"GPUs, host step time on CPUs). Series: {prometheus_name(SPECS[metric])}.",
                         targets, "percentunit", no_data=PEAKS_UNKNOWN))
    return tuple(out)


def _memory_row(q: Queries) -> Row:
    keep = f"instance, {RANK}, device"
    alloc, reserved, peak = "gpuprobe.memory.allocated", "gpuprobe.memory.reserved", "gpuprobe.memory.peak"
    who = f" · rank {{{{{RANK}}}}}"
    mem = f"{{{{device}}}}{who}"
    kv = model_label("gpuprobe.kv_cache.memory")
    return Row("Memory", (
        Panel("Memory allocated and peak", "Allocated bytes (CUDA allocator; process RSS on CPU) and the "
              "high-water mark since the last reset, read at step ends without synchronizing.",
              (Target(f"sum by ({keep}) ({q.sel(alloc)})", f"allocated {mem}"),
               Target(f"sum by ({keep}) ({q.sel(peak)})", f"peak {mem}")), "bytes"),
        Panel("Memory reserved (CUDA caching allocator)", f"{GPU_ONLY} Bytes the caching allocator holds, and "
              "how much of it is not allocated to tensors (cached, reusable, but unavailable to other "
              "processes).",
              (Target(f"sum by ({keep}) ({q.sel(reserved)})", f"reserved {mem}"),
               Target(f"sum by ({keep}) ({q.sel(reserved)}) - sum by ({keep}) ({q.sel(alloc)})",
                      f"reserved, not allocated {mem}")), "bytes", gpu_only=True),
        Panel("KV cache size", "Bytes held by the KV cache of the running generate() call (the paged cache of "
              "continuous batching is in the Serving row).",
              (Target(f"sum by (instance, {RANK}, {kv}) ({q.sel('gpuprobe.kv_cache.memory')})",
                      f"{{{{{kv}}}}}{who}"),), "bytes", generate_only=True),
        Panel("KV cache sequence length", "Tokens held by the KV cache (prompt + generated so far).",
              (Target(f"max by (instance, {RANK}, {kv}) ({q.sel('gpuprobe.kv_cache.sequence_length')})",
                      f"{{{{{kv}}}}}{who}"),), "short", generate_only=True),
    ))


def _kernels_row(q: Queries) -> Row:
    kt, kl, probe = "gpuprobe.kernel.time", "gpuprobe.kernel.launches", "gpuprobe.probe.duration"
    share = f"sum by (category) ({q.rate(kt)}) / ignoring(category) group_left sum({q.rate(kt)})"
    sampling = ("From sampled profiling: one step in N is profiled (GPUPROBE_KERNEL_SAMPLING=N); on a CPU "
                "the operators of the step are categorized instead of kernels. ")
    return Row("Kernels, probes and telemetry", (
        Panel("Kernel time by category", sampling + "Share of sampled kernel time by category (GEMM, "
              "attention, ...).", (Target(share, "{{category}}"),), "percentunit", stack=True,
              no_data=KERNEL_SAMPLING_OFF),
        Panel("Kernel launches by category", sampling + "Launches per second in sampled steps; multiply by N "
              "for the whole run.", (Target(f"sum by (category) ({q.rate(kl)})", "{{category}}"),), "short",
              no_data=KERNEL_SAMPLING_OFF),
        Panel("Your probes", "Mean and p95 of each @probe / with probe() region.",
              q.latency_targets(probe, stats=("mean", "p95"), legend="{{probe}} {{clock}} "), "s",
              no_data=NO_PROBES),
        Panel("Telemetry dropped", "Records gpuprobe could not keep, per second, by reason (full buffers, "
              "failed OTLP pushes, ...). Anything above zero means the other panels undercount.",
              (Target(f"sum by (reason) ({q.rate('gpuprobe.telemetry.dropped')})", "{{reason}}"),), "short",
              no_data=WAITS_FOR_DROPS),
    ))


def _gpu_health_row(q: Queries) -> Row:
    """The GPU's own health from NVML (setting ``nvml``): what dcgm-exporter would show, beside the steps."""
    gpu, dev = label("gpu.index"), label("gpuprobe.device")
    keep = f"instance, {gpu}, {dev}"
    who = f"GPU {{{{{gpu}}}}} ({{{{{dev}}}}})"
    src = (" Read from NVML on gpuprobe's background thread every collect_interval when GPUPROBE_NVML=1 "
           "(gpuprobe[nvml]); one line per GPU the process sees, by NVML index (as nvidia-smi numbers them) "
           "and the process's CUDA device.")

    def gauge(metric: str, how: str = "max") -> str:
        return f"{how} by ({keep}) ({q.sel(metric)})"

    used, total = "gpuprobe.gpu.memory.used", "gpuprobe.gpu.memory.total"
    throttle = f"max by ({keep}, reason) (avg_over_time({q.sel('gpuprobe.gpu.throttle')}[$__rate_interval]))"
    return Row("GPU health", (
        Panel("GPU utilization", f"{GPU_ONLY} Fraction of time a kernel ran on the GPU (NVML; dcgm-exporter's "
              "DCGM_FI_DEV_GPU_UTIL ÷ 100). A GPU busy with any kernel counts as fully used: compare with the "
              f"step times and MFU above.{src}",
              (Target(gauge("gpuprobe.gpu.utilization"), who),), "percentunit", gpu_only=True),
        Panel("GPU memory used", f"{GPU_ONLY} Device memory in use by every process on the GPU, and the GPU's "
              f"total (NVML; DCGM_FI_DEV_FB_USED). The CUDA allocator's own view is in the Memory row.{src}",
              (Target(gauge(used), f"used {who}"), Target(gauge(total), f"total {who}")), "bytes", gpu_only=True),
        Panel("SM clock", f"{GPU_ONLY} Streaming-multiprocessor clock (NVML; DCGM_FI_DEV_SM_CLOCK). A clock below "
              f"its usual value under load means throttling: see the throttle reasons.{src}",
              (Target(gauge("gpuprobe.gpu.clock.sm"), who),), "hertz", gpu_only=True),
        Panel("Power draw and limit", f"{GPU_ONLY} Power draw and the enforced power limit (NVML; "
              f"DCGM_FI_DEV_POWER_USAGE, DCGM_FI_DEV_ENFORCED_POWER_LIMIT).{src}",
              (Target(gauge("gpuprobe.gpu.power"), f"draw {who}"),
               Target(gauge("gpuprobe.gpu.power.limit"), f"limit {who}")), "watt", gpu_only=True),
        Panel("GPU temperature", f"{GPU_ONLY} GPU core temperature (NVML; DCGM_FI_DEV_GPU_TEMP).{src}",
              (Target(gauge("gpuprobe.gpu.temperature"), who),), "celsius", gpu_only=True),
        Panel("SM and tensor-core activity", f"{GPU_ONLY} Fraction of the SMs busy, and tensor-core activity, over "
              "each sample period (NVML's GPU performance monitoring, Hopper and later; DCGM_FI_PROF_SM_ACTIVE, "
              "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE). Unlike utilization, these fall when kernels leave SMs or "
              f"tensor cores idle.{src}",
              (Target(gauge("gpuprobe.gpu.sm.activity"), f"SMs {who}"),
               Target(gauge("gpuprobe.gpu.tensor.activity"), f"tensor cores {who}")), "percentunit", gpu_only=True),
        Panel("Clock throttle reasons", f"{GPU_ONLY} Share of the time each reason held the clocks down "
              "(NVML's clocks-event reasons; DCGM_FI_DEV_CLOCKS_EVENT_REASONS): gpu_idle is normal between "
              "steps; sw_power_cap, hw_slowdown, sw_thermal, hw_thermal and hw_power_brake during steps cost "
              f"speed.{src}",
              (Target(throttle, f"{{{{reason}}}} {who}"),), "percentunit", gpu_only=True),
    ))


def overview(inline: bool = False) -> Dashboard:
    """The generation overview: latency, throughput, steps, diffusion pipelines, memory, kernels, telemetry health
    and GPU health.

    Args:
        inline: compute quantiles in the queries instead of reading the recording rules.

    Example:
        >>> [row.title for row in overview().rows]
        ['Requests', 'Service-level goals', 'Serving (continuous batching)', 'Generation steps', 'Speculative decoding', 'Diffusion pipelines', 'Memory', 'Kernels, probes and telemetry', 'GPU health']
    """
    q = Queries(inline)
    return Dashboard(
        "gpuprobe-overview", "gpuprobe · generation overview",
        "Live metrics of generate() calls measured by gpuprobe: latency, throughput, step breakdown, memory.",
        (_requests_row(q), _goals_row(q), _serving_row(q), _steps_row(q), _speculative_row(q), _diffusion_row(q),
         _memory_row(q), _kernels_row(q), _gpu_health_row(q)),
    )


def ranks(inline: bool = False) -> Dashboard:
    """Ranks side by side (torchrun): find the slow or struggling rank.

    Args:
        inline: compute quantiles in the queries instead of reading the recording rules.

    Example:
        >>> ranks().panels[1].title
        'Slowest rank ÷ fastest rank'
    """
    q = Queries(inline)
    step, itl = "gpuprobe.step.duration", "gpuprobe.inter_token.duration"
    decode = ('phase="decode"', 'clock="host"')
    per_rank = f"rank {{{{{RANK}}}}}"
    usage = q.rate("gen_ai.client.token.usage", "sum", f'{TOKEN_TYPE}="output"')
    spread = f"max({q.stat(step, 'mean', *decode)}) / min({q.stat(step, 'mean', *decode)})"
    keep = f"instance, {RANK}"
    return Dashboard(
        "gpuprobe-ranks", "gpuprobe · ranks",
        "One line per rank: spot the rank that is slower, busier or fuller than the others.",
        (Row("Ranks", (
            Panel("Decode step time p95 by rank (host clock)", f"p95 of one decode step, per rank. {EXEMPLARS_NOTE}",
                  (Target(q.exemplar_stat(step, "p95", *decode), per_rank, exemplar=True),), "s"),
            Panel("Slowest rank ÷ fastest rank", "Mean decode step time of the slowest rank divided by the "
                  "fastest one's: 1 when ranks keep pace; a straggler pulls it up.",
                  (Target(spread, "slowest ÷ fastest"),), "none"),
            Panel("Inter-token latency p95 by rank", "p95 time between two consecutive output tokens as "
                  f"the host receives them, per rank. {EXEMPLARS_NOTE}",
                  (Target(q.exemplar_stat(itl, "p95", 'clock="host"'), per_rank, exemplar=True),), "s"),
            Panel("Output tokens per second by rank", "Generated tokens per second, per rank.",
                  (Target(f"sum by ({RANK}) ({usage})", per_rank),), "suffix: tok/s"),
            Panel("Memory allocated by rank", "Allocated bytes per rank (process RSS on CPU).",
                  (Target(f"sum by ({keep}) ({q.sel('gpuprobe.memory.allocated')})", per_rank),), "bytes"),
            Panel("Requests in flight by rank", "generate() calls running now, per rank.",
                  (Target(f"sum by ({keep}) ({q.sel('gpuprobe.generate.active')})", per_rank),), "short",
                  generate_only=True),
            Panel("Decode step time p95 by rank (device clock)", f"{GPU_ONLY} p95 of one decode step as a device "
                  "span (CUDA events), per rank.", (Target(q.stat(step, "p95", 'phase="decode"', 'clock="device"'), per_rank),),
                  "s", gpu_only=True),
            Panel("Telemetry dropped by rank", "Records dropped per second, per rank and reason.",
                  (Target(f"sum by ({RANK}, reason) ({q.rate('gpuprobe.telemetry.dropped')})",
                          f"{per_rank}: {{{{reason}}}}"),), "short", no_data=WAITS_FOR_DROPS),
        )),),
    )


def dashboards(inline: bool = False) -> list[Dashboard]:
    """Every dashboard gpuprobe ships.

    Example:
        >>> [d.uid for d in dashboards()]
        ['gpuprobe-overview', 'gpuprobe-ranks']
    """
    return [overview(inline), ranks(inline)]
