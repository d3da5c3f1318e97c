"""What the live page must show, computed here from /metrics bodies with prometheus_client's parsers and
Prometheus' histogram_quantile written out again (nothing shared with the page's JavaScript).

A chart's lines are named by the keys the page writes into its DOM (``data-line``); each line has the
window's value (``value``: the newer body against the older, per second of ``seconds``), the whole run's
(``run``: the newer body alone), and for the component breakdown its ``share``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

Samples = dict[str, list[tuple[dict[str, str], float]]]
Lines = dict[str, dict[str, float | None]]


def samples(body: str) -> Samples:
    """Sample name → [(labels, value)] of a text-format or OpenMetrics body."""
    families = openmetrics_families(body) if body.rstrip().endswith("# EOF") else text_families(body)
    out: Samples = {}
    for family in families:
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' bucketQuantile (promql/quantile.go) on cumulative ``(le, count)`` pairs."""
    buckets = sorted(buckets)
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return math.nan
    fixed = []
    for le, count in buckets:
        fixed.append((le, max(count, fixed[-1][1]) if fixed else count))
    total = fixed[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    b = next((i for i in range(len(fixed) - 1) if fixed[i][1] >= rank), len(fixed) - 1)
    if b == len(fixed) - 1:
        return fixed[-2][0]
    if b == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start, count = 0.0, fixed[b][1]
    if b > 0:
        start = fixed[b - 1][0]
        count -= fixed[b - 1][1]
        rank -= fixed[b - 1][1]
    return start + (fixed[b][0] - start) * (rank / count)


class Pair:
    """The window between two bodies (``older`` may be None: no window yet) and the whole run of ``newer``."""

    def __init__(self, newer: str, older: str | None, seconds: float | None) -> None:
        self.new = samples(newer)
        self.old = samples(older) if older is not None else None
        self.seconds = seconds

    def _old_value(self, name: str, labels: dict[str, str]) -> float:
        assert self.old is not None
        return next((v for lab, v in self.old.get(name, []) if lab == labels), 0.0)  # absent: created since

    def sums(self, name: str, keep: Callable[[dict[str, str]], bool], by: Iterable[str]
             ) -> dict[tuple[str, ...], tuple[float, float | None]]:
        """(newer, increase since older) of the series of ``name`` that ``keep``, summed by ``by``."""
        by = tuple(by)
        out: dict[tuple[str, ...], tuple[float, float | None]] = {}
        for labels, value in self.new.get(name, []):
            if not keep(labels):
                continue
            key = tuple(labels.get(k, "") for k in by)
            now, inc = out.get(key, (0.0, 0.0 if self.old is not None else None))
            if self.old is not None:
                inc = (inc or 0.0) + value - self._old_value(name, labels)
            out[key] = (now + value, inc)
        return out

    def gauge(self, name: str, by: Iterable[str], how: Callable[[Iterable[float]], float] = sum
              ) -> dict[tuple[str, ...], float]:
        by = tuple(by)
        groups: dict[tuple[str, ...], list[float]] = {}
        for labels, value in self.new.get(name, []):
            groups.setdefault(tuple(labels.get(k, "") for k in by), []).append(value)
        return {k: how(v) for k, v in groups.items()}

    def rate(self, increase: float | None) -> float | None:
        return None if increase is None or not self.seconds else increase / self.seconds

    def histogram(self, name: str, keep: Callable[[dict[str, str]], bool], by: Iterable[str]) -> dict[tuple[str, ...], Any]:
        """By ``by``: ``q(p)`` and ``q_run(p)`` quantiles, ``mean`` and ``mean_run``."""
        by = tuple(by)
        buckets = self.sums(f"{name}_bucket", keep, (*by, "le"))
        total = self.sums(f"{name}_sum", keep, by)
        count = self.sums(f"{name}_count", keep, by)
        out = {}
        for key in {k[:-1] for k in buckets}:
            rows = [(float(k[-1]), v) for k, v in buckets.items() if k[:-1] == key]
            run = [(le, now) for le, (now, _) in rows]
            window = [(le, inc) for le, (_, inc) in rows] if self.old is not None else None
            s_now, s_inc = total.get(key, (0.0, None))
            c_now, c_inc = count.get(key, (0.0, None))
            out[key] = {
                "q": lambda p, w=window: histogram_quantile(p, w) if w is not None else math.nan,
                "q_run": lambda p, r=run: histogram_quantile(p, r),
                "mean": s_inc / c_inc if s_inc is not None and c_inc else math.nan,
                "mean_run": s_now / c_now if c_now else math.nan,
                "count_run": c_now,
            }
        return out


STATS = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def _everything(labels: dict[str, str]) -> bool:
    return True


def _latency(pair: Pair, metric: str, keep: Callable[[dict[str, str]], bool], by: tuple[str, ...],
             prefix: Callable[[tuple[str, ...]], str], stats: tuple[tuple[str, float], ...] = STATS) -> Lines:
    lines: Lines = {}
    for key, h in pair.histogram(metric, keep, by).items():
        for name, p in stats:
            lines[prefix(key) + name] = {"value": h["q"](p), "run": h["q_run"](p)}
        lines[prefix(key) + "mean"] = {"value": h["mean"], "run": h["mean_run"]}
    return lines


def _clock(key: tuple[str, ...]) -> str:
    return "" if key[0] in ("", "host") else f"{key[0]} "


def charts(pair: Pair) -> dict[str, Lines]:
    """Chart id → line key → column → value, for every chart whose series the newer body holds."""
    out: dict[str, Lines] = {}
    tokens = pair.sums("gen_ai_client_token_usage_sum", _everything, ("gen_ai_token_type",))
    out["tokens"] = {k[0]: {"value": pair.rate(inc), "run": now} for k, (now, inc) in tokens.items()}
    out["ttft"] = _latency(pair, "gen_ai_server_time_to_first_token_seconds", _everything, ("clock",), _clock)
    out["tpot"] = _latency(pair, "gen_ai_server_time_per_output_token_seconds", _everything, (), lambda k: "")
    out["itl"] = _latency(pair, "gpuprobe_inter_token_duration_seconds", _everything, ("clock",), _clock)
    out["phases"] = _latency(pair, "gpuprobe_step_duration_seconds", lambda lab: lab.get("clock") == "host",
                             ("phase",), lambda k: f"{k[0]} ", (("p95", 0.95),))

    steps = pair.sums("gpuprobe_step_duration_seconds_count", lambda lab: lab.get("clock") == "host", ())
    steps_now, steps_inc = steps.get((), (0.0, None))
    parts = pair.sums("gpuprobe_step_component_duration_seconds_sum", _everything, ("component", "processor"))
    components: Lines = {}
    for (component, processor), (now, inc) in parts.items():
        components[f"{component}/{processor}"] = {
            "value": inc / steps_inc if inc is not None and steps_inc else None,
            "run": now / steps_now if steps_now else None,
        }
    total = sum(v["value"] or 0.0 for v in components.values())
    for v in components.values():
        v["share"] = v["value"] / total if total > 0 and v["value"] is not None else None
    out["components"] = components

    requests: Lines = {}
    active = in_flight(pair)
    if active is not None:
        requests["active"] = {"value": active, "run": None}
    for (error,), (now, inc) in pair.sums("gen_ai_server_request_duration_seconds_count", _everything,
                                          ("error_type",)).items():
        requests[f"failed {error}" if error else "completed"] = {"value": pair.rate(inc), "run": now}
    out["requests"] = requests

    memory: Lines = {}
    for metric in pair.new:  # every memory gauge: allocated, peak, reserved, and any other
        if metric.startswith("gpuprobe_memory_") and metric.endswith("_bytes"):
            what = metric[len("gpuprobe_memory_"):-len("_bytes")].replace("_", " ")
            for (device,), value in pair.gauge(metric, ("device",)).items():
                memory[f"{what} {device}"] = {"value": value}
    out["memory"] = memory
    if not made_generate_call(pair):  # the KV cache of generate() calls: shown once there was one
        return _optional(pair, out)
    kv: Lines = {f"bytes {m}": {"value": v} for (m,), v in pair.gauge("gpuprobe_kv_cache_memory_bytes", ("model",)).items()}
    kv.update({f"tokens {m}": {"value": v}
               for (m,), v in pair.gauge("gpuprobe_kv_cache_sequence_length", ("model",), max).items()})
    out["kv"] = kv
    return _optional(pair, out)


def _optional(pair: Pair, out: dict[str, Lines]) -> dict[str, Lines]:
    """The charts shown once their series exist."""
    if pair.new.get("gpuprobe_probe_duration_seconds_count"):
        out["probes"] = _latency(pair, "gpuprobe_probe_duration_seconds", _everything, ("probe", "clock"),
                                 lambda k: f"{k[0]} {_clock(k[1:])}", (("p95", 0.95),))
    if pair.new.get("gpuprobe_requests_running"):
        serving: Lines = {}
        for metric, key in (("gpuprobe_requests_running", "running"), ("gpuprobe_requests_waiting", "waiting")):
            if pair.new.get(metric):
                serving[key] = {"value": pair.gauge(metric, ())[()]}
        if pair.new.get("gpuprobe_kv_cache_usage_ratio"):
            serving["kv"] = {"value": pair.gauge("gpuprobe_kv_cache_usage_ratio", (), max)[()]}
        out["serving"] = serving
    if pair.new.get("gpuprobe_request_queue_duration_seconds_count"):
        out["queue"] = _latency(pair, "gpuprobe_request_queue_duration_seconds", _everything, (), lambda k: "")
    if pair.new.get("gpuprobe_speculative_draft_tokens_total"):
        accepted = pair.sums("gpuprobe_speculative_accepted_tokens_total", _everything, ("method",))
        speculative: Lines = {}
        for key, (now, inc) in pair.sums("gpuprobe_speculative_draft_tokens_total", _everything, ("method",)).items():
            a_now, a_inc = accepted.get(key, (None, None))
            speculative[key[0]] = {
                "value": a_inc / inc if a_inc is not None and inc else None,
                "run": a_now / now if a_now is not None and now else None,
            }
        out["speculative"] = speculative
    if ran_a_pipeline(pair):
        out.update(_diffusion(pair))
    if pair.new.get("gpuprobe_gpu_utilization_ratio"):
        gpu: Lines = {}
        for metric, what in (("gpuprobe_gpu_utilization_ratio", "utilization"),
                             ("gpuprobe_gpu_sm_activity_ratio", "SM activity"),
                             ("gpuprobe_gpu_tensor_activity_ratio", "tensor cores")):
            for (index,), value in pair.gauge(metric, ("gpu_index",), max).items():
                gpu[f"{what} {index}"] = {"value": value}
        out["gpu"] = gpu
        memory_gpu: Lines = {}
        for metric, what in (("gpuprobe_gpu_memory_used_bytes", "used"), ("gpuprobe_gpu_memory_total_bytes", "total")):
            for (index,), value in pair.gauge(metric, ("gpu_index",), max).items():
                memory_gpu[f"{what} {index}"] = {"value": value}
        out["gpu_memory"] = memory_gpu
        power: Lines = {}
        for metric, what in (("gpuprobe_gpu_power_watts", "power"), ("gpuprobe_gpu_power_limit_watts", "power limit"),
                             ("gpuprobe_gpu_temperature_celsius", "temperature"),
                             ("gpuprobe_gpu_clock_sm_hertz", "SM clock")):
            for (index,), value in pair.gauge(metric, ("gpu_index",), max).items():
                power[f"{what} {index}"] = {"value": value}
        for (index, reason), value in pair.gauge("gpuprobe_gpu_throttle_ratio", ("gpu_index", "reason"), max).items():
            if value > 0 and reason != "gpu_idle":
                power[f"throttle {index} {reason}"] = {"value": value}
        out["gpu_power"] = power
    return out


DENOISING_PARTS = ("denoiser", "controlnet", "scheduler", "other")
CALL_PARTS = ("text_encoder", "vae_encode", "vae_decode", "safety_checker")


def _host(labels: dict[str, str]) -> bool:
    return labels.get("clock") == "host"


def _diffusion(pair: Pair) -> dict[str, Lines]:
    """The charts of diffusers pipelines: the step, its parts per step, steps and images per second, the parts
    outside the steps per call of each, and the memory peaks."""
    out: dict[str, Lines] = {}
    out["denoise"] = _latency(pair, "gpuprobe_diffusion_step_duration_seconds", _everything, ("model", "clock"),
                              lambda k: f"{k[0]} {_clock(k[1:])}", (("p95", 0.95),))
    steps = pair.sums("gpuprobe_diffusion_step_duration_seconds_count", _host, ("model",))
    parts = pair.sums("gpuprobe_diffusion_component_duration_seconds_sum",
                      lambda lab: _host(lab) and lab.get("component") in DENOISING_PARTS,
                      ("model", "component", "branch"))
    components: Lines = {}
    models: dict[str, str] = {}
    for (model, component, branch), (now, inc) in parts.items():
        s_now, s_inc = steps.get((model,), (0.0, None))
        key = f"{model}/{component}/{branch}"
        components[key] = {"value": inc / s_inc if inc is not None and s_inc else None,
                           "run": now / s_now if s_now else None}
        models[key] = model
    for key, v in components.items():  # the share of its own pipeline's step
        total = sum(w["value"] or 0.0 for k, w in components.items() if models[k] == models[key])
        v["share"] = v["value"] / total if total > 0 and v["value"] is not None else None
    out["diffusion_components"] = components
    rates: Lines = {}
    for what, name, keep in (("steps", "gpuprobe_diffusion_step_duration_seconds_count", _host),
                             ("images", "gpuprobe_diffusion_images_total", _everything)):
        for (model,), (now, inc) in pair.sums(name, keep, ("model",)).items():
            rates[f"{what} {model}"] = {"value": pair.rate(inc), "run": now}
    out["diffusion_rates"] = rates
    by = ("model", "component", "module")
    outside = lambda lab: _host(lab) and lab.get("component") in CALL_PARTS  # noqa: E731
    counts = pair.sums("gpuprobe_diffusion_component_duration_seconds_count", outside, by)
    calls: Lines = {}
    for key, (now, inc) in pair.sums("gpuprobe_diffusion_component_duration_seconds_sum", outside, by).items():
        c_now, c_inc = counts.get(key, (0.0, None))
        calls["/".join(key)] = {"value": inc / c_inc if inc is not None and c_inc else None,
                                "run": now / c_now if c_now else None}
    out["diffusion_parts"] = calls
    out["diffusion_memory"] = {"/".join(key): {"value": v} for key, v in pair.gauge(
        "gpuprobe_diffusion_component_memory_peak_bytes", ("model", "component", "module", "device"), max).items()}
    return out


def ran_a_pipeline(pair: Pair) -> bool:
    """Whether a diffusers pipeline ran in the process (its denoising steps are counted)."""
    return any(v > 0 for _, v in pair.new.get("gpuprobe_diffusion_step_duration_seconds_count", []))


def made_generate_call(pair: Pair) -> bool:
    """Whether the process made a generate() call (its batch size is counted per call)."""
    return any(v > 0 for _, v in pair.new.get("gpuprobe_step_batch_size_count", []))


def in_flight(pair: Pair) -> float | None:
    """Requests in flight: generate() calls, and under continuous batching the requests running and waiting."""
    if not (pair.new.get("gpuprobe_generate_active") or pair.new.get("gpuprobe_requests_running")):
        return None
    return sum(sum(pair.gauge(name, ()).values()) for name in
               ("gpuprobe_generate_active", "gpuprobe_requests_running", "gpuprobe_requests_waiting"))


def same(shown: str, expected: float | None) -> bool:
    """Whether a ``data-value`` (empty for no value) is the expected number (to float rounding)."""
    if expected is None or (isinstance(expected, float) and not math.isfinite(expected)):
        return shown == ""
    return shown != "" and math.isclose(float(shown), expected, rel_tol=1e-9, abs_tol=1e-12)
