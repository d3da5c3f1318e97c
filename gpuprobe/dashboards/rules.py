"""Prometheus recording and alert rules over gpuprobe's metrics (``gpuprobe-rules.yml``, ``gpuprobe-alerts.yml``).

The recording rules compute p50/p95/p99 and the mean of the latency histograms over :data:`WINDOW`;
dashboards and alerts read them by :func:`recorded_name`. They also record, per model, the share of
finished requests that missed their service-level goals over each window of :data:`BURN_RATES`
(:func:`miss_ratio_name`), which the burn-rate alerts read: the error budget is ``1 −`` the objective
(:data:`SLO_OBJECTIVE`, the share of requests that must meet their goals), and a burn rate of 1 spends it
exactly over the objective's period (multiwindow, multi-burn-rate alerts, as the Google SRE workbook
sets them: both a long and a short window must burn fast, so an alert stops soon after the misses stop).
Every rule aggregates explicitly, so the labels an OpenTelemetry Collector adds never split a series.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .._metrics import SPECS, prometheus_name
from ..errors import ConfigError
from .series import ERROR_TYPE, LAYER_TYPE, RANK, braces, model_label, series

__all__ = [
    "WINDOW",
    "QUANTILES",
    "STATS",
    "TTFT_ALERT_SECONDS",
    "QUEUE_ALERT_SECONDS",
    "KV_CACHE_ALERT_USAGE",
    "SLO_OBJECTIVE",
    "BurnRate",
    "BURN_RATES",
    "miss_ratio_name",
    "RULES_FILE",
    "ALERTS_FILE",
    "Latency",
    "LATENCIES",
    "latency",
    "stat_expr",
    "recorded_name",
    "recorded_series",
    "recording_rules",
    "alert_rules",
]

WINDOW = "1m"
"""The rate window of the recording rules."""
QUANTILES = (0.5, 0.95, 0.99)
TTFT_ALERT_SECONDS = 2.0
"""The time-to-first-token p95 above which ``GpuprobeTimeToFirstTokenHigh`` fires."""
QUEUE_ALERT_SECONDS = 1.0
"""The queue-time p95 above which ``GpuprobeQueueTimeHigh`` fires (requests wait before any work)."""
KV_CACHE_ALERT_USAGE = 0.95
"""The paged KV cache usage above which ``GpuprobeKvCacheFull`` fires."""
SLO_OBJECTIVE = 0.99
"""The share of finished requests that must meet their service-level goals (``gpuprobe.requests.slo``); its
error budget, 1 %, is what the burn-rate alerts watch."""
RULES_FILE = "gpuprobe-rules.yml"
ALERTS_FILE = "gpuprobe-alerts.yml"


@dataclasses.dataclass(frozen=True)
class Latency:
    """A histogram whose quantiles and mean are recorded by ``gpuprobe-rules.yml``.

    Attributes:
        metric: the OpenTelemetry name.
        by: labels kept besides job, instance, rank and model (e.g. ``phase``, ``clock``).
        match: matchers applied before aggregating (e.g. successful requests only).

    Example:
        >>> Latency("gpuprobe.step.duration", by=("phase",)).keep
        ('job', 'instance', 'gpuprobe_rank', 'model', 'phase')
    """

    metric: str
    by: tuple[str, ...] = ()
    match: tuple[str, ...] = ()

    @property
    def keep(self) -> tuple[str, ...]:
        """The labels each recorded series keeps."""
        model = model_label(self.metric)
        return ("job", "instance", RANK, *((model,) if model else ()), *self.by)


LATENCIES: tuple[Latency, ...] = (
    Latency("gen_ai.server.time_to_first_token", by=("clock",)),
    Latency("gen_ai.server.time_per_output_token"),
    Latency("gpuprobe.inter_token.duration", by=("clock",)),
    Latency("gen_ai.server.request.duration", match=(f'{ERROR_TYPE}=""',)),
    Latency("gpuprobe.request.queue.duration"),
    Latency("gpuprobe.step.duration", by=("phase", "clock")),
    Latency("gpuprobe.layer.duration", by=(LAYER_TYPE,)),
    Latency("gpuprobe.probe.duration", by=("probe", "clock")),
)
_BY_METRIC = {lat.metric: lat for lat in LATENCIES}
STATS = (*(f"p{round(q * 100)}" for q in QUANTILES), "mean")
"""The statistics recorded for each latency histogram: ``p50``, ``p95``, ``p99`` and ``mean``."""


def latency(metric: str) -> Latency:
    """The recorded latency histogram ``metric``.

    Raises:
        ConfigError: no statistics are recorded for ``metric``.

    Example:
        >>> latency("gpuprobe.step.duration").by
        ('phase', 'clock')
    """
    try:
        return _BY_METRIC[metric]
    except KeyError:
        raise ConfigError(f"no statistics are recorded for {metric!r}; recorded: {', '.join(_BY_METRIC)}") from None


def recorded_name(metric: str, stat: str) -> str:
    """The recording rule's series name for one statistic of a latency histogram.

    Example:
        >>> recorded_name("gen_ai.server.time_to_first_token", "p95")
        'gpuprobe:gen_ai_server_time_to_first_token_seconds:p95_rate1m'
    """
    if metric not in _BY_METRIC or stat not in STATS:
        raise ConfigError(f"no recorded statistic {stat!r} for {metric!r}")
    return f"gpuprobe:{prometheus_name(SPECS[metric])}:{stat}_rate{WINDOW}"


def recorded_series() -> set[str]:
    """Every series name the recording rules produce.

    Example:
        >>> len(recorded_series()) == len(LATENCIES) * len(STATS) + 5  # and the miss ratio over five windows
        True
    """
    return {recorded_name(lat.metric, stat) for lat in LATENCIES for stat in STATS} | {
        miss_ratio_name(w) for w in _SLO_WINDOWS}


def stat_expr(lat: Latency, stat: str, window: str, matchers: Sequence[str] = ()) -> str:
    """The PromQL computing one statistic of ``lat`` over ``window``, aggregated to :attr:`Latency.keep`.

    Example:
        >>> stat_expr(latency("gpuprobe.probe.duration"), "p50", "5m")
        'histogram_quantile(0.5, sum by (le, job, instance, gpuprobe_rank, probe, clock) (rate(gpuprobe_probe_duration_seconds_bucket[5m])))'
    """
    sel = (*lat.match, *matchers)
    keep = ", ".join(lat.keep)
    if stat == "mean":
        parts = [f"sum by ({keep}) (rate({series(lat.metric, p)}{braces(sel)}[{window}]))" for p in ("sum", "count")]
        return f"{parts[0]} / {parts[1]}"
    q = int(stat[1:]) / 100
    buckets = f"rate({series(lat.metric, 'bucket')}{braces(sel)}[{window}])"
    return f"histogram_quantile({q:g}, sum by (le, {keep}) ({buckets}))"


def recording_rules() -> dict[str, Any]:
    """The recording rules the dashboards and alerts read (``gpuprobe-rules.yml``).

    Example:
        >>> recording_rules()["groups"][0]["rules"][0]["record"]
        'gpuprobe:gen_ai_server_time_to_first_token_seconds:p50_rate1m'
    """
    rules = [
        {"record": recorded_name(lat.metric, stat), "expr": stat_expr(lat, stat, WINDOW)}
        for lat in LATENCIES
        for stat in STATS
    ]
    slo = [{"record": miss_ratio_name(w), "expr": _miss_ratio_expr(w)} for w in _SLO_WINDOWS]
    return {"groups": [{"name": "gpuprobe-latency", "rules": rules}, {"name": "gpuprobe-slo", "rules": slo}]}


@dataclasses.dataclass(frozen=True)
class BurnRate:
    """A burn-rate alert: the miss ratio over both windows above ``rate`` × the error budget.

    Attributes:
        alert: its name.
        rate: how many times faster than the budget allows requests miss their goals.
        long, short: the windows (the short one ends the alert soon after the misses stop).
        severity: its ``severity`` label.
        budget: the share of a 30-day error budget spent by the time it fires (for its description).

    Example:
        >>> BURN_RATES[0].long, BURN_RATES[0].short
        ('1h', '5m')
    """

    alert: str
    rate: float
    long: str
    short: str
    severity: str
    budget: str


BURN_RATES: tuple[BurnRate, ...] = (
    BurnRate("GpuprobeErrorBudgetBurnFast", 14.4, "1h", "5m", "critical", "2 % in 1 hour"),
    BurnRate("GpuprobeErrorBudgetBurn", 6.0, "6h", "30m", "critical", "5 % in 6 hours"),
    BurnRate("GpuprobeErrorBudgetBurnSlow", 1.0, "3d", "6h", "warning", "10 % in 3 days"),
)
"""The burn-rate alerts, from the fastest: the Google SRE workbook's multiwindow, multi-burn-rate set."""
_SLO_WINDOWS = tuple(sorted({w for b in BURN_RATES for w in (b.long, b.short)},
                            key=lambda w: int(w[:-1]) * {"m": 1, "h": 60, "d": 1440}[w[-1]]))
_SLO_KEEP = "job, model"  # a service's goals: its model, over every instance and rank that serves it


def miss_ratio_name(window: str) -> str:
    """The recording rule's series of the share of requests that missed their goals over ``window``.

    Example:
        >>> miss_ratio_name("5m")
        'gpuprobe:gpuprobe_requests_slo:miss_ratio_rate5m'
    """
    if window not in _SLO_WINDOWS:
        raise ConfigError(f"no miss ratio is recorded over {window!r}; recorded: {', '.join(_SLO_WINDOWS)}")
    return f"gpuprobe:{prometheus_name(SPECS['gpuprobe.requests.slo'])}:miss_ratio_rate{window}"


def _miss_ratio_expr(window: str) -> str:
    slo = series("gpuprobe.requests.slo")
    return (f'sum by ({_SLO_KEEP}) (rate({slo}{{result!="met"}}[{window}])) '
            f"/ sum by ({_SLO_KEEP}) (rate({slo}[{window}]))")


def _new_or_increased(expr_by: str, sel: str) -> str:
    # increase() is 0 for a series that has just appeared; "x unless x offset 5m" catches its first value.
    return (f"sum by ({expr_by}) (increase({sel}[5m])) > 0 or "
            f"sum by ({expr_by}) ({sel} unless {sel} offset 5m) > 0")


def _burn_rate_rules(objective: float) -> list[dict[str, Any]]:
    """The burn-rate alerts of :data:`BURN_RATES` for ``objective`` (a share of requests, 0 < it < 1)."""
    if not 0 < objective < 1:
        raise ConfigError(f"the service-level objective must be a share of requests between 0 and 1, got {objective!r}")
    budget = 1 - objective
    out = []
    for burn in BURN_RATES:
        threshold = f"{round(burn.rate * budget, 9):g}"
        out.append({
            "alert": burn.alert,
            "expr": f"{miss_ratio_name(burn.long)} > {threshold} and {miss_ratio_name(burn.short)} > {threshold}",
            "labels": {"severity": burn.severity},
            "annotations": {
                "summary": f"Model {{{{ $labels.model }}}} spends its error budget at {burn.rate:g}× the rate it "
                           f"allows ({burn.long} and {burn.short})",
                "description": f"{{{{ $value | humanizePercentage }}}} of its finished requests missed their "
                               f"service-level goals over the last {burn.long}, and more than "
                               f"{burn.rate * budget * 100:.3g} % of them over the last {burn.short} too; with an "
                               f"objective of {objective * 100:.4g} % of requests meeting them, {burn.budget} of a "
                               "30-day error budget is spent when this fires. gpuprobe_requests_slo_total by result "
                               "says which goal was missed (ttft, tpot, e2e) or that requests failed (error)."}})
    return out


def alert_rules(ttft_seconds: float = TTFT_ALERT_SECONDS, queue_seconds: float = QUEUE_ALERT_SECONDS,
                kv_cache_usage: float = KV_CACHE_ALERT_USAGE, slo_objective: float = SLO_OBJECTIVE) -> dict[str, Any]:
    """A few alerts: slow first token, dropped telemetry, a seam switched off, failing generate() calls, a
    rank gone; for
    continuous batching, a KV cache that stays full and requests that queue too long; and requests missing
    their service-level goals faster than their error budget allows (burn rate, :data:`BURN_RATES`).

    Args:
        ttft_seconds: the time-to-first-token p95 above which ``GpuprobeTimeToFirstTokenHigh`` fires.
        queue_seconds: the queue-time p95 above which ``GpuprobeQueueTimeHigh`` fires.
        kv_cache_usage: the KV cache usage (a fraction) above which ``GpuprobeKvCacheFull`` fires.
        slo_objective: the share of finished requests that must meet their goals (the burn-rate alerts).

    Raises:
        ConfigError: ``slo_objective`` is not between 0 and 1.

    Example:
        >>> alert_rules(ttft_seconds=0.5)["groups"][0]["rules"][0]["expr"]
        'gpuprobe:gen_ai_server_time_to_first_token_seconds:p95_rate1m{clock!="device"} > 0.5'
    """
    # The time to first token a client sees: the host clock (`!=` also keeps series without a clock).
    ttft = recorded_name("gen_ai.server.time_to_first_token", "p95") + '{clock!="device"}'
    model = model_label("gen_ai.server.request.duration")
    # A cancelled request (its client went away) is no error of the server.
    errors = f'{series("gen_ai.server.request.duration", "count")}{{{ERROR_TYPE}!="", {ERROR_TYPE}!="cancelled"}}'
    queue = recorded_name("gpuprobe.request.queue.duration", "p95")
    kv, kv_model = series("gpuprobe.kv_cache.usage"), model_label("gpuprobe.kv_cache.usage")
    dropped = series("gpuprobe.telemetry.dropped")
    seam_off = series("gpuprobe.seam.disabled")
    where = "{{ $labels.instance }} rank {{ $labels." + RANK + " }}"
    return {"groups": [{"name": "gpuprobe-alerts", "rules": [
        {"alert": "GpuprobeTimeToFirstTokenHigh", "expr": f"{ttft} > {ttft_seconds:g}", "for": "5m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": f"Time to first token p95 above {ttft_seconds:g} s on {where}",
                         "description": "p95 over 1 m is {{ $value | humanizeDuration }} for model {{ $labels."
                                        + str(model) + " }}."}},
        {"alert": "GpuprobeTelemetryDropped",
         "expr": _new_or_increased(f"job, instance, {RANK}, reason", dropped),
         "labels": {"severity": "warning"},
         "annotations": {"summary": "gpuprobe dropped telemetry ({{ $labels.reason }}) on " + where,
                         "description": "Dashboards undercount while records are dropped; see "
                                        "docs/metrics.md, section Dropped telemetry."}},
        {"alert": "GpuprobeSeamDisabled",
         # A seam stays off until the process restarts: the alert lasts as long as its counter does.
         "expr": f"max by (job, instance, {RANK}, seam) ({seam_off}) > 0",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "gpuprobe switched its seam {{ $labels.seam }} off on " + where,
                         "description": "gpuprobe's own work in this seam failed, so it passes calls through "
                                        "unmeasured: the program runs as without gpuprobe, but the metrics that "
                                        "seam feeds stop. gpuprobe.info()[\"seams\"] and the process's warning "
                                        "name the failure and the versions (docs/architecture.md, Seams)."}},
        {"alert": "GpuprobeGenerationErrors",
         "expr": _new_or_increased(f"job, instance, {RANK}, {model}, {ERROR_TYPE}", errors),
         "labels": {"severity": "warning"},
         "annotations": {"summary": "generate() raised {{ $labels." + ERROR_TYPE + " }} on " + where,
                         "description": "generate() calls of model {{ $labels." + str(model) + " }} failed "
                                        "in the last 5 minutes."}},
        {"alert": "GpuprobeTargetDown", "expr": 'up{job=~"gpuprobe.*"} == 0', "for": "1m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "gpuprobe /metrics at {{ $labels.instance }} cannot be scraped",
                         "description": "The process (or one rank of it) stopped or its port changed."}},
        {"alert": "GpuprobeKvCacheFull",
         "expr": f"max by (job, instance, {RANK}, {kv_model}) ({kv}) > {kv_cache_usage:g}", "for": "5m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": f"Paged KV cache more than {kv_cache_usage:.0%} full on {where}",
                         "description": "{{ $value | humanizePercentage }} of the KV cache of model {{ $labels."
                                        + str(kv_model) + " }} is in use: the scheduler admits no new prompts "
                                        "and preempts running requests. Give the cache more blocks or take "
                                        "fewer requests at once."}},
        {"alert": "GpuprobeQueueTimeHigh", "expr": f"{queue} > {queue_seconds:g}", "for": "5m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": f"Queue time p95 above {queue_seconds:g} s on {where}",
                         "description": "p95 over 1 m is {{ $value | humanizeDuration }} for model {{ $labels."
                                        + str(kv_model) + " }}: requests wait for room in a batch or in the KV "
                                        "cache before any work is done for them."}},
        *_burn_rate_rules(slo_objective),
    ]}]}
