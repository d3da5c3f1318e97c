"""A readable picture of the run so far: :func:`summary` (a table, shown as such in a notebook) and the
periodic one-line log of the ``log_interval`` setting (``GPUPROBE_LOG_INTERVAL``), in the manner of vLLM's
"Avg prompt throughput" line.

Both say where a generation step's time goes: each component's share of the step time (forward, each
logits processor, stopping criteria, ...), largest first, as the demo's table and the live page do. The
components of a step add up to it (``gpuprobe.step.component.duration`` sums to the host-clock
``gpuprobe.step.duration``), so a share is a component's time over all of them.

Both read the aggregates exporters read (:func:`gpuprobe.collect`); quantiles come from the histograms'
buckets as Prometheus' ``histogram_quantile`` computes them (linear within a bucket), bounded by the
smallest and largest value seen, so a quantile is never outside what was observed.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import time
from collections.abc import Sequence
from typing import Any

from ._metrics import MetricData, Point
from .runtime import Runtime, runtime

__all__ = ["Summary", "SummaryRow", "ComponentShare", "summary", "quantile", "LogLine"]

# What each row is called, in the order rows are shown; other histograms follow under their names.
_TITLES: dict[str, str] = {
    "gen_ai.server.time_to_first_token": "time to first token",
    "gen_ai.server.time_per_output_token": "time per output token",
    "gpuprobe.inter_token.duration": "inter-token latency",
    "gen_ai.server.request.duration": "request duration",
    "gen_ai.client.token.usage": "tokens per request",
    "gpuprobe.request.queue.duration": "queue time",
    "gpuprobe.step.duration": "step",
    "gpuprobe.step.component.duration": "step component",
    "gpuprobe.layer.duration": "layer",
    "gpuprobe.probe.duration": "probe",
    "gpuprobe.diffusion.call.duration": "pipeline call",
    "gpuprobe.diffusion.time_to_first_step": "time to first step",
    "gpuprobe.diffusion.step.duration": "denoising step",
    "gpuprobe.diffusion.component.duration": "pipeline component",
}
# A diffusers pipeline's components that make up its denoising steps (the others run once per call).
_DENOISING_PARTS = ("denoiser", "controlnet", "scheduler", "other")
# Labels every series has (rank, device) or that say nothing a row's title does not.
_QUIET_LABELS = {"gpuprobe.rank", "gpuprobe.device", "gen_ai.provider.name", "gen_ai.operation.name"}


def quantile(bounds: Sequence[float], counts: Sequence[int], q: float, low: float, high: float) -> float:
    """The ``q`` quantile of a histogram: per-bucket ``counts`` (the last one past the last bound),
    interpolated linearly within its bucket; ``low`` and ``high`` (the smallest and largest value seen)
    bound the first and the last bucket.

    Example:
        >>> quantile([1.0, 2.0], [2, 2, 0], 0.5, 0.5, 1.5)
        1.0
    """
    total = sum(counts)
    if total == 0:
        return float("nan")
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            lower = max(low, bounds[i - 1]) if i > 0 else low
            upper = min(high, bounds[i]) if i < len(bounds) else high
            upper = max(upper, lower)
            return lower + (upper - lower) * max(0.0, rank - seen) / count
        seen += count
    return high


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One series of a histogram (values in ``unit``), or of a counter or gauge (``value`` only)."""

    title: str
    metric: str
    labels: dict[str, str]
    unit: str
    count: int = 0
    mean: float = float("nan")
    p50: float = float("nan")
    p99: float = float("nan")
    max: float = float("nan")
    value: float = float("nan")  # counters and gauges


def _shown(value: float, unit: str) -> str:
    if value != value:
        return "-"
    if unit == "s":
        return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"
    if unit == "By":
        for size, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.3g} {name}"
        return f"{value:.0f} B"
    if unit == "1":
        return f"{value:.1%}" if 0 <= value <= 1 else f"{value:.3g}"
    if unit.endswith("/s"):  # a rate is a measurement: its digits kept (240.0, not 240, which reads as a count)
        return f"{value:#.4g}"
    return f"{value:.4g}"


@dataclasses.dataclass(frozen=True)
class ComponentShare:
    """One component of one model's generation steps: its time and its share of the step time.

    Attributes:
        model: the ``model`` label.
        component: ``forward``, ``logits_processor``, ``stopping_criteria``, ``streamer``, ``other``, ...
        processor: the class name of a logits processor (or the ``processor`` label), else None.
        seconds: its time over every step so far.
        per_step: its mean time per step (``seconds`` over the model's host-clock steps).
        share: its part of the step time (0 to 1): ``seconds`` over the time of every component.
    """

    model: str
    component: str
    processor: str | None
    seconds: float
    per_step: float
    share: float

    @property
    def name(self) -> str:
        """``forward``, ``logits_processor:BanTokens`` (as the demo's table names them)."""
        return component_name(self.component, self.processor)


def component_name(component: str, processor: str | None) -> str:
    """How a component is named in a table or a log line: ``forward``, ``logits_processor:BanTokens``.

    Example:
        >>> component_name("logits_processor", "BanTokens"), component_name("other", None)
        ('logits_processor:BanTokens', 'other')
    """
    return f"{component}:{processor}" if processor else component


def _by_share(times: dict[tuple[str, str | None], float]) -> list[tuple[tuple[str, str | None], float, float]]:
    """``(key, seconds, share)`` largest first (names break ties); empty when no time was spent."""
    total = sum(times.values())
    if total <= 0:
        return []
    return sorted(((k, v, v / total) for k, v in times.items()), key=lambda r: (-r[1], component_name(*r[0])))


def _label_text(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in _QUIET_LABELS)


@dataclasses.dataclass(frozen=True)
class Summary:
    """The run so far: where the step time goes (each component's share, largest first, per model), then
    histogram rows (count, mean, p50, p99, max), then counters and gauges.

    ``str()`` is a text table; in a notebook it shows as an HTML table. :meth:`to_dict` gives the rows.
    """

    histograms: tuple[SummaryRow, ...]
    values: tuple[SummaryRow, ...]
    components: tuple[ComponentShare, ...] = ()

    @property
    def dominant(self) -> ComponentShare | None:
        """The component with the largest share of the step time (of the model with the most step time)."""
        return self.components[0] if self.components else None

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        """The rows as plain data (for JSON)."""
        return {"components": [{**dataclasses.asdict(c), "name": c.name} for c in self.components],
                "histograms": [dataclasses.asdict(r) for r in self.histograms],
                "values": [dataclasses.asdict(r) for r in self.values]}

    def _tables(self) -> list[tuple[list[str], list[list[str]]]]:
        parts = [[c.name, c.model, _shown(c.per_step, "s"), f"{c.share:.1%}"] for c in self.components]
        hist = [[r.title, _label_text(r.labels), str(r.count), _shown(r.mean, r.unit), _shown(r.p50, r.unit),
                 _shown(r.p99, r.unit), _shown(r.max, r.unit)] for r in self.histograms]
        vals = [[r.title, _label_text(r.labels), _shown(r.value, r.unit)] for r in self.values]
        return [(["step time by component", "model", "per step", "share"], parts),
                (["what", "labels", "count", "mean", "p50", "p99", "max"], hist), (["what", "labels", "value"], vals)]

    def __str__(self) -> str:
        out: list[str] = []
        for header, rows in self._tables():
            if not rows:
                continue
            widths = [max(len(x) for x in col) for col in zip(header, *rows)]
            for row in (header, ["-" * w for w in widths], *rows):
                out.append("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                                     for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
            out.append("")
        return "\n".join(out).rstrip() or "nothing measured yet"

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        parts: list[str] = []
        for header, rows in self._tables():
            if not rows:
                continue
            head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        return "".join(parts) or "<p>nothing measured yet</p>"


def _histogram_row(md: MetricData, p: Point) -> SummaryRow:
    spec = md.spec
    bounds = spec.buckets or ()
    return SummaryRow(
        title=_TITLES.get(spec.name, spec.name), metric=spec.name, labels=dict(p.labels), unit=spec.unit,
        count=p.count, mean=p.sum / p.count, p50=quantile(bounds, p.bucket_counts, 0.5, p.min, p.max),
        p99=quantile(bounds, p.bucket_counts, 0.99, p.min, p.max), max=p.max)


def summary(rt: Runtime | None = None) -> Summary:
    """A readable table of what was measured so far (collects first, as an exporter would).

    Example:
        >>> import gpuprobe
        >>> with gpuprobe.probe("block"):
        ...     pass
        >>> print(gpuprobe.summary())  # doctest: +ELLIPSIS
        what   labels ...
    """
    data = (rt or runtime()).collect()
    histograms, values = _rows(data)
    return Summary(histograms, values + _diffusion_rates(data), components=_components(data))


def _rows(data: list[MetricData]) -> tuple[tuple[SummaryRow, ...], tuple[SummaryRow, ...]]:
    order = {name: i for i, name in enumerate(_TITLES)}
    hist: list[SummaryRow] = []
    vals: list[SummaryRow] = []
    for md in sorted(data, key=lambda m: (order.get(m.spec.name, len(order)), m.spec.name)):
        for p in md.points:
            if md.spec.instrument == "histogram":
                if p.count:
                    hist.append(_histogram_row(md, p))
            else:
                vals.append(SummaryRow(title=md.spec.name, metric=md.spec.name, labels=dict(p.labels),
                                       unit=md.spec.unit, value=p.value))
    return tuple(hist), tuple(vals)


def _components(data: list[MetricData]) -> tuple[ComponentShare, ...]:
    """Each model's components by share, largest first; the model with the most step time first."""
    times: dict[str, dict[tuple[str, str | None], float]] = {}
    steps: dict[str, int] = {}
    for md in data:
        if md.spec.name == "gpuprobe.step.component.duration":
            for p in md.points:
                if p.count:
                    key = (p.labels.get("component", "?"), p.labels.get("processor") or None)
                    per_model = times.setdefault(p.labels.get("model", ""), {})
                    per_model[key] = per_model.get(key, 0.0) + p.sum
        elif md.spec.name == "gpuprobe.diffusion.component.duration":  # a denoising step's parts, on the host
            for p in md.points:
                if p.count and p.labels.get("clock") == "host" and p.labels.get("component") in _DENOISING_PARTS:
                    key = (p.labels["component"], None)
                    per_model = times.setdefault(p.labels.get("model", ""), {})
                    per_model[key] = per_model.get(key, 0.0) + p.sum
        elif md.spec.name in ("gpuprobe.step.duration", "gpuprobe.diffusion.step.duration"):
            for p in md.points:
                if p.labels.get("clock") == "host":
                    model = p.labels.get("model", "")
                    steps[model] = steps.get(model, 0) + p.count
    out: list[ComponentShare] = []
    for model in sorted(times, key=lambda m: (-sum(times[m].values()), m)):
        n = steps.get(model, 0)
        for (component, processor), seconds, share in _by_share(times[model]):
            out.append(ComponentShare(model=model, component=component, processor=processor, seconds=seconds,
                                      per_step=seconds / n if n else float("nan"), share=share))
    return tuple(out)


def _diffusion_rates(data: list[MetricData]) -> tuple[SummaryRow, ...]:
    """Per pipeline: denoising steps per second (steps ÷ their host time) and images per second (images ÷ the
    time spent in its calls)."""
    step_n: dict[str, int] = {}
    step_s: dict[str, float] = {}
    call_s: dict[str, float] = {}
    images: dict[str, float] = {}
    for md in data:
        name = md.spec.name
        for p in md.points:
            model = p.labels.get("model", "")
            if name == "gpuprobe.diffusion.step.duration" and p.labels.get("clock") == "host" and p.count:
                step_n[model] = step_n.get(model, 0) + p.count
                step_s[model] = step_s.get(model, 0.0) + p.sum
            elif name == "gpuprobe.diffusion.call.duration" and p.count:
                call_s[model] = call_s.get(model, 0.0) + p.sum
            elif name == "gpuprobe.diffusion.images":
                images[model] = images.get(model, 0.0) + p.value
    rows = [SummaryRow(title="denoising steps per second", metric="gpuprobe.diffusion.step.duration",
                       labels={"model": m}, unit="{step}/s", value=step_n[m] / step_s[m])
            for m in sorted(step_n) if step_s[m] > 0]
    rows += [SummaryRow(title="images per second", metric="gpuprobe.diffusion.images", labels={"model": m},
                        unit="{image}/s", value=images[m] / call_s[m]) for m in sorted(images) if call_s.get(m)]
    return tuple(rows)


# -- the periodic line ------------------------------------------------------------------------------

_LOGGER = logging.getLogger("gpuprobe")
_COMPONENTS_KEY = "gpuprobe.step.component.duration"  # in _totals: (component, processor) -> seconds


def _totals(data: list[MetricData]) -> dict[str, Any]:
    """Per metric: histograms summed over their series (bucket counts, count, sum, min, max); gauges' values;
    the step components' seconds by ``(component, processor)``."""
    out: dict[str, Any] = {}
    for md in data:
        if md.spec.instrument == "histogram":
            for p in md.points:
                if md.spec.name == "gen_ai.client.token.usage":
                    key = f"{md.spec.name}:{p.labels.get('gen_ai.token.type', '')}"
                elif md.spec.name == "gpuprobe.step.duration":
                    if p.labels.get("clock") != "host":
                        continue
                    key = f"{md.spec.name}:{p.labels.get('phase', '')}"
                elif md.spec.name == "gpuprobe.step.component.duration":
                    # summed over models: the line says where the process's step time goes
                    parts = out.setdefault(_COMPONENTS_KEY, {})
                    part = (p.labels.get("component", "?"), p.labels.get("processor") or None)
                    parts[part] = parts.get(part, 0.0) + p.sum
                    continue
                else:
                    key = md.spec.name
                counts, n, total, low, high = out.get(key, ([0] * len(p.bucket_counts), 0, 0.0, p.min, p.max))
                out[key] = ([a + b for a, b in zip(counts, p.bucket_counts)], n + p.count, total + p.sum,
                            min(low, p.min), max(high, p.max))
        elif md.spec.instrument in ("gauge", "updown"):
            for p in md.points:
                out[md.spec.name] = out.get(md.spec.name, 0.0) + p.value
    return out


def _component_shares(before: dict[tuple[str, str | None], float], after: dict[tuple[str, str | None], float]
                      ) -> list[str]:
    """``forward 62 %``, ... for the component time between two totals, largest first; those under 0.5 % left out.

    Example:
        >>> _component_shares({}, {("forward", None): 0.3, ("logits_processor", "Ban"): 0.6, ("other", None): 0.1})
        ['logits_processor:Ban 60 %', 'forward 30 %', 'other 10 %']
    """
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return [f"{component_name(*key)} {share * 100:.0f} %" for key, _s, share in _by_share(spent) if share >= 0.005]


class LogLine:
    """Logs one line every ``interval`` seconds with what happened since the last one (on the background
    thread; ``GPUPROBE_LOG_INTERVAL`` / ``configure(log_interval=...)``). An interval in which nothing
    was measured is logged once, then skipped until something is.

    The line goes to the ``gpuprobe`` logger at INFO; when neither it nor the root logger has a handler,
    one writing to stderr is added to it, so the line is seen without any logging set-up.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._rt: Runtime | None = None
        self._last: dict[str, Any] = {}
        self._last_t = time.monotonic()
        self._idle_said = False
        self._handler: logging.Handler | None = None

    def attach(self, rt: Runtime | None = None, *, owner: Any = "settings") -> LogLine:
        """Start logging from ``rt`` (the process's runtime by default)."""
        self._rt = rt or runtime()
        self._last = _totals(self._rt.collect())
        self._last_t = time.monotonic()
        if not _LOGGER.handlers and not logging.getLogger().handlers:
            self._handler = logging.StreamHandler()
            self._handler.setFormatter(logging.Formatter("%(message)s"))
            _LOGGER.addHandler(self._handler)
            if _LOGGER.level == logging.NOTSET or _LOGGER.level > logging.INFO:
                _LOGGER.setLevel(logging.INFO)
        self._rt.add_exporter(self, owner=owner)
        return self

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_t < self.interval or self._rt is None:
            return
        totals = _totals(self._rt.collect())
        line = self.line(self._last, totals, now - self._last_t)
        self._last, self._last_t = totals, now
        if line is None:
            if self._idle_said:
                return
            self._idle_said = True
            line = f"gpuprobe: last {self.interval:g} s: nothing measured"
        else:
            self._idle_said = False
        _LOGGER.info(line)

    @staticmethod
    def line(before: dict[str, Any], after: dict[str, Any], seconds: float) -> str | None:
        """The line for what happened between two :func:`_totals`, or None when nothing did."""

        def delta(key: str) -> tuple[list[int], int, float, float, float] | None:
            new = after.get(key)
            if new is None:
                return None
            old = before.get(key)
            counts, n, total, low, high = new
            if old is not None:
                counts = [a - b for a, b in zip(counts, old[0])]
                n, total = n - old[1], total - old[2]
            return (counts, n, total, low, high) if n > 0 else None

        parts: list[str] = []
        requests = delta("gen_ai.server.request.duration")
        out = delta("gen_ai.client.token.usage:output")
        inp = delta("gen_ai.client.token.usage:input")
        if requests is not None:
            parts.append(f"{requests[1]} requests")
        if inp is not None:
            parts.append(f"prompt {inp[2] / seconds:.1f} tokens/s")
        if out is not None:
            parts.append(f"generation {out[2] / seconds:.1f} tokens/s")
        from ._metrics import SPECS

        for key, name in (("gen_ai.server.time_to_first_token", "TTFT"), ("gen_ai.server.time_per_output_token", "TPOT"),
                          ("gpuprobe.step.duration:decode", "decode step"), ("gpuprobe.probe.duration", "probes")):
            d = delta(key)
            if d is None:
                continue
            bounds = SPECS[key.split(":")[0]].buckets or ()
            p50 = quantile(bounds, d[0], 0.5, d[3], d[4])
            p99 = quantile(bounds, d[0], 0.99, d[3], d[4])
            parts.append(f"{name} p50 {_shown(p50, 's')} p99 {_shown(p99, 's')}" if key != "gpuprobe.probe.duration"
                         else f"{d[1]} probed calls")
        shares = _component_shares(before.get(_COMPONENTS_KEY, {}), after.get(_COMPONENTS_KEY, {}))
        if shares:
            parts.append("step time " + ", ".join(shares))
        if not parts:
            return None
        for key, name in (("gpuprobe.requests.running", "running"), ("gpuprobe.requests.waiting", "waiting")):
            if key in after:
                parts.append(f"{name} {after[key]:.0f}")
        if "gpuprobe.kv_cache.usage" in after:
            parts.append(f"KV cache {_shown(after['gpuprobe.kv_cache.usage'], '1')}")
        if "gpuprobe.memory.allocated" in after:
            parts.append(f"memory {_shown(after['gpuprobe.memory.allocated'], 'By')}")
        return f"gpuprobe: last {seconds:.0f} s: " + ", ".join(parts)

    def close(self) -> None:
        if self._handler is not None:
            _LOGGER.removeHandler(self._handler)
            self._handler = None

    def __repr__(self) -> str:
        return f"<gpuprobe log line every {self.interval:g} s>"
