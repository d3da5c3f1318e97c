"""Exemplars: with traces on, the buckets of the latency histograms name the span of a request (or of a
continuous-batching step) whose value fell in them. Checked with real parts: tiny real models generating, the
OpenTelemetry SDK's own TracerProvider and in-memory span exporter, the OpenMetrics exposition scraped over
HTTP and parsed back by prometheus_client's own parser, OTLP metrics decoded from the protobuf by a real HTTP
receiver. Expected buckets come from the parsed ``le`` bounds and the spans' own attributes, not from the
code that placed the exemplars."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "transformers"))  # the tiny models' kit
sys.path.insert(0, str(Path(__file__).resolve().parent / "serving"))  # the continuous-batching model
from _hfkit import prompt, torch, transformers  # noqa: E402
from _model_fixtures import isolated_models, make_model  # noqa: E402,F401 (fixtures)

import gpuprobe  # noqa: E402
from gpuprobe.integrations.transformers import instrument  # noqa: E402
from gpuprobe.runtime import runtime  # noqa: E402
from gpuprobe.testing import reset  # noqa: E402
from otlp_receiver import Receiver, attrs  # noqa: E402

from helpers import cpu_continuous_batching_cannot_pin  # noqa: E402

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("prometheus_client")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace import sampling  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics  # noqa: E402

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TTFT = "gen_ai_server_time_to_first_token_seconds"
DURATION = "gen_ai_server_request_duration_seconds"
ITL = "gpuprobe_inter_token_duration_seconds"
STEP = "gpuprobe_step_duration_seconds"
QUEUE = "gpuprobe_request_queue_duration_seconds"
# Which span attribute holds the value each family's exemplar names (the span, not the record, as the oracle).
REQUEST_VALUE = {TTFT: "gen_ai.latency.time_to_first_token", DURATION: "gen_ai.latency.e2e",
                 ITL: "gpuprobe.itl_max_s", QUEUE: "gen_ai.latency.time_in_queue"}


def exporter() -> Any:
    """The trace exporter the settings started."""
    from gpuprobe.exporters.traces import TraceExporter

    found = [item for item in runtime().lifecycle.items() if isinstance(item, TraceExporter)]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def spans() -> Any:
    """An SDK TracerProvider of the test's own, given to gpuprobe; its span exporter."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    gpuprobe.configure(tracer_provider=provider)
    yield memory
    gpuprobe.configure(tracer_provider=None)


def scrape(accept: str = OPENMETRICS) -> str:
    """One scrape of a /metrics endpoint served for it (a real HTTP server and client)."""
    server = gpuprobe.serve(port=0)
    try:
        request = urllib.request.Request(server.url, headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.read().decode()
    finally:
        server.close()


class Found:
    """One exemplar of a bucket, as prometheus_client's parser reads it back."""

    def __init__(self, family: str, labels: dict[str, str], lower: float, upper: float, exemplar: Any) -> None:
        self.family = family
        self.labels = labels  # the series' labels, le left out
        self.lower, self.upper = lower, upper  # the bucket: (lower, upper]
        self.trace_id = exemplar.labels["trace_id"]
        self.span_id = exemplar.labels["span_id"]
        self.value = exemplar.value
        self.timestamp = exemplar.timestamp


def exemplars(text: str) -> list[Found]:
    """Every bucket exemplar of an OpenMetrics body, with its bucket's bounds read from the ``le`` labels."""
    out = []
    for fam in parse_openmetrics(text):
        previous: dict[tuple[tuple[str, str], ...], float] = {}
        for s in fam.samples:
            if not s.name.endswith("_bucket"):
                continue
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            key = tuple(sorted(labels.items()))
            upper = float(s.labels["le"])
            lower = previous.get(key, float("-inf"))
            previous[key] = upper
            if s.exemplar is not None:
                out.append(Found(fam.name, labels, lower, upper, s.exemplar))
    return out


def buckets(text: str, family: str) -> list[tuple[float, float]]:
    """The buckets of a histogram family, ``(lower, upper]``, read from the ``le`` labels of its first series."""
    for fam in parse_openmetrics(text):
        if fam.name == family:
            first = next(s for s in fam.samples if s.name.endswith("_bucket"))
            key = {k: v for k, v in first.labels.items() if k != "le"}
            les = [float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")
                   and {k: v for k, v in s.labels.items() if k != "le"} == key]
            return list(zip([float("-inf"), *les[:-1]], les))
    raise AssertionError(f"no family {family}")


def _ids(span: Any) -> tuple[str, str]:
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def test_each_bucket_names_the_span_of_the_latest_request_whose_value_fell_in_it(make_model: Any,
                                                                                  spans: Any) -> None:
    model = instrument(make_model("llama"), model_name="ex")
    with gpuprobe.catch_requests() as caught:
        for new in (2, 9, 4):
            model.generate(prompt(1, 5), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    exporter().flush()
    text = scrape()
    found = exemplars(text)
    requests = {_ids(s): s for s in spans.get_finished_spans() if s.name == "text_completion ex"}
    assert len(requests) == 3 and [(r.trace_id, r.span_id) for r in caught] == [
        _ids(s) for s in sorted(requests.values(), key=lambda s: s.end_time)]
    ours = [f for f in found if f.labels.get("model") == "ex" or f.labels.get("gen_ai_request_model") == "ex"]
    assert {f.family for f in ours} == {TTFT, DURATION, ITL, STEP}
    for f in ours:
        span = requests[(f.trace_id, f.span_id)]  # a request span the provider got
        attribute = REQUEST_VALUE.get(f.family, "gpuprobe.itl_max_s")  # a decode step: its longest token gap
        assert f.value == pytest.approx(span.attributes[attribute], rel=1e-9)
        assert f.lower < f.value <= f.upper
        assert f.timestamp is not None and abs(float(f.timestamp) - span.end_time / 1e9) < 1.0
        assert f.labels.get("clock", "host") == "host"
        if f.family == STEP:
            assert f.labels["phase"] == "decode"
    # The latest request in each bucket: worked out from the spans' own figures, in the order they ended.
    for family in (TTFT, DURATION, ITL):
        bounds = buckets(text, family)
        expected = {}
        for span in sorted(requests.values(), key=lambda s: s.end_time):
            value = span.attributes.get(REQUEST_VALUE[family])
            if value is None:
                continue
            for lower, upper in bounds:
                if lower < value <= upper:
                    expected[(lower, upper)] = _ids(span)
        got = {(f.lower, f.upper): (f.trace_id, f.span_id) for f in ours if f.family == family}
        assert got == expected, family


def test_the_text_format_carries_no_exemplars(make_model: Any, spans: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    model = instrument(make_model("llama"), model_name="plain-text")
    model.generate(prompt(1, 4), max_new_tokens=3, min_new_tokens=3, pad_token_id=0)
    exporter().flush()
    text = scrape("text/plain; version=0.0.4")
    assert " # {" not in text
    assert any(f.name == TTFT for f in text_string_to_metric_families(text))
    assert exemplars(scrape())  # the same series in OpenMetrics have them


def test_the_renderer_writes_exemplars_as_prometheus_client_does(make_model: Any, spans: Any) -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from gpuprobe.exporters.prometheus import GpuprobeCollector, render

    model = instrument(make_model("llama"), model_name="twin")
    for new in (3, 5):
        model.generate(prompt(1, 4), max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    exporter().flush()
    collector = GpuprobeCollector(runtime())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    data = collector.data()
    ours = render(data, openmetrics=True).decode()
    theirs = generate_openmetrics(registry).decode()

    def lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if " # {" in line]

    assert lines(ours) and lines(ours) == lines(theirs)

    def families(text: str) -> list[Any]:
        return [(f.name, [(s.name, s.labels, s.value, s.exemplar) for s in f.samples]) for f in parse_openmetrics(text)]

    assert families(ours) == families(theirs)


def test_a_span_the_sampler_drops_is_no_bucket_s_exemplar(make_model: Any) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampling.ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    gpuprobe.configure(tracer_provider=provider)
    try:
        model = instrument(make_model("llama"), model_name="unsampled")
        with gpuprobe.catch_requests() as caught:
            model.generate(prompt(1, 4), max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
        assert caught.record.span_id is not None  # it had ids; its span was not sent
        exporter().flush()
        text = scrape()
    finally:
        gpuprobe.configure(tracer_provider=None)
    assert memory.get_finished_spans() == ()
    assert TTFT in text and exemplars(text) == []


def test_spans_that_could_not_be_sent_are_no_bucket_s_exemplars(make_model: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver("error", signal="traces")
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
        reset(otlp_timeout=1.0)
        model = instrument(make_model("llama"), model_name="lost")
        with pytest.warns(RuntimeWarning, match="spans of 1 request"):
            model.generate(prompt(1, 4), max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
            exporter().flush()
        text = scrape()
    finally:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        reset()
        receiver.close()
    assert TTFT in text and exemplars(text) == []
    assert 'reason="span_export_failed"} 1.0' in text


class TracerOnly:
    """A TracerProvider that is not the SDK's (only ``get_tracer``), over an SDK provider: gpuprobe sends
    through its tracer, which picks the ids."""

    def __init__(self, provider: Any) -> None:
        self._provider = provider

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return self._provider.get_tracer(*args, **kwargs)


def test_through_another_provider_s_tracer_the_exemplars_name_the_ids_it_picked(make_model: Any) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    gpuprobe.configure(tracer_provider=TracerOnly(provider))
    try:
        model = instrument(make_model("llama"), model_name="tracer")
        with gpuprobe.catch_requests() as caught:
            model.generate(prompt(1, 4), max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
        exporter().flush()
        found = exemplars(scrape())
    finally:
        gpuprobe.configure(tracer_provider=None)
    (request,) = [s for s in memory.get_finished_spans() if s.name == "text_completion tracer"]
    ours = [f for f in found if "tracer" in (f.labels.get("model"), f.labels.get("gen_ai_request_model"))]
    assert ours and {(f.trace_id, f.span_id) for f in ours} == {_ids(request)}
    assert _ids(request) == (caught.record.trace_id, caught.record.span_id)


def test_with_traces_off_no_bucket_has_an_exemplar(make_model: Any) -> None:
    model = instrument(make_model("llama"), model_name="untraced")
    with gpuprobe.catch_requests() as caught:
        model.generate(prompt(1, 4), max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
    text = scrape()
    assert caught.record.exemplar_series == () and caught.record.span_id is None
    assert TTFT in text and exemplars(text) == []


def test_otlp_histogram_points_carry_the_request_s_span_and_value(make_model: Any, spans: Any) -> None:
    from gpuprobe.exporters.otlp import EXEMPLARS, OtlpExporter

    if not EXEMPLARS:
        pytest.skip("this opentelemetry-sdk has no exemplars on data points (1.28 and later do)")
    model = instrument(make_model("llama"), model_name="pushed")
    with gpuprobe.catch_requests() as caught:
        model.generate(prompt(1, 5), max_new_tokens=5, min_new_tokens=5, pad_token_id=0)
    exporter().flush()
    (request,) = [s for s in spans.get_finished_spans() if s.name == "text_completion pushed"]
    receiver = Receiver()
    try:
        exp = OtlpExporter(receiver.url, interval=60).attach()
        assert exp.push() is True
        exp.close()
        metrics = receiver.metrics()
    finally:
        receiver.close()
    for name, attribute in (("gen_ai.server.time_to_first_token", "gen_ai.latency.time_to_first_token"),
                            ("gen_ai.server.request.duration", "gen_ai.latency.e2e"),
                            ("gpuprobe.inter_token.duration", "gpuprobe.itl_max_s")):
        metric, _ = metrics[name]
        (point,) = [p for p in metric.histogram.data_points if attrs(p.attributes).get("clock", "host") == "host"
                    and "pushed" in attrs(p.attributes).values()]
        (exemplar,) = point.exemplars  # one request: one bucket
        assert (exemplar.trace_id.hex(), exemplar.span_id.hex()) == _ids(request) == (
            caught.record.trace_id, caught.record.span_id)
        assert exemplar.as_double == pytest.approx(request.attributes[attribute], rel=1e-9)
        bounds = [float("-inf"), *point.explicit_bounds, float("inf")]
        (bucket,) = [i for i in range(len(bounds) - 1) if bounds[i] < exemplar.as_double <= bounds[i + 1]]
        assert point.bucket_counts[bucket] >= 1  # the bucket it names counted it
        if name != "gpuprobe.inter_token.duration":  # one value per request (the gaps: several, the longest named)
            assert sum(point.bucket_counts) == point.bucket_counts[bucket] == 1
        assert abs(exemplar.time_unix_nano - request.end_time) < 1e9


def test_continuous_batching_requests_and_steps_are_exemplars_and_the_reference_lists_them(
        make_model: Any, spans: Any) -> None:
    from _servekit import tiny_llama

    from gpuprobe import _docs
    from gpuprobe._metrics import SPECS, prometheus_name

    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)
    instrument(make_model("llama"), model_name="called").generate(prompt(1, 4), max_new_tokens=4, min_new_tokens=4,
                                                                 pad_token_id=0)
    model = instrument(tiny_llama(), model_name="batched")
    prompts = [[3 + (i * 7 + j) % 120 for j in range(n)] for i, n in enumerate((5, 9, 12, 20, 7, 3))]
    gen = transformers.GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=16)
    with torch.no_grad():
        model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)
    gpuprobe.collect()  # the drain splits the steps: the step spans are made
    exporter().flush()
    found = exemplars(scrape())
    finished = spans.get_finished_spans()
    requests = {_ids(s): s for s in finished if s.name == "text_completion batched"}
    steps = {_ids(s): s for s in finished if s.name == "scheduler step"}
    assert len(requests) == 6 and steps
    batched = [f for f in found if "batched" in (f.labels.get("model"), f.labels.get("gen_ai_request_model"))]
    assert {f.family for f in batched} == {TTFT, DURATION, ITL, STEP, QUEUE}
    for f in batched:
        assert f.lower < f.value <= f.upper
        if f.family == STEP:  # a scheduler step's span, with its host time
            step = steps[(f.trace_id, f.span_id)]
            assert f.value == pytest.approx(step.attributes["gpuprobe.step.host_s"], rel=1e-9)
            assert f.labels["phase"] == step.attributes["gpuprobe.step.phase"] and f.labels["clock"] == "host"
        else:
            request = requests[(f.trace_id, f.span_id)]
            assert f.value == pytest.approx(request.attributes[REQUEST_VALUE[f.family]], rel=1e-9)
    # The metrics reference lists exactly the metrics whose buckets carried exemplars in these two runs.
    names = {prometheus_name(SPECS[name]): name for name in SPECS}
    assert {names[f.family] for f in found} == set(_docs.EXEMPLARS)


def test_an_exemplar_shows_once_its_bucket_has_counted_a_value_and_a_reset_forgets_it() -> None:
    from gpuprobe._metrics import Registry

    registry = Registry()
    series = registry.family("gpuprobe.request.queue.duration").child(model="m")
    series.offer_exemplar(0.003, "1" * 32, "2" * 16, 1.0)  # before its value is drained: not shown yet
    series.apply(1_000_000)  # 1 ms: another bucket
    (point,) = registry.snapshot()[0].points
    assert point.exemplars == ()
    series.apply(3_000_000)  # 3 ms: (2.5 ms, 5 ms]
    (point,) = registry.snapshot()[0].points
    shown = [(i, e.span_id, e.value) for i, e in enumerate(point.exemplars) if e is not None]
    assert shown == [(3, "2" * 16, 0.003)] and point.bucket_counts[3] == 1
    series.withdraw_exemplar(0.003, "3" * 16)  # another span's: kept
    assert registry.snapshot()[0].points[0].exemplars[3] is not None
    registry.zero()
    series.apply(3_000_000)
    assert registry.snapshot()[0].points[0].exemplars == ()


def test_the_live_page_history_reads_the_series_of_bucket_lines_that_carry_exemplars() -> None:
    from gpuprobe.exporters._page import History

    plain = ('gen_ai_server_time_to_first_token_seconds_bucket{clock="host",gen_ai_request_model="a} # {b",le="0.25"} 3.0\n'
             'gen_ai_server_time_to_first_token_seconds_bucket{clock="host",gen_ai_request_model="a} # {b",le="+Inf"} 4.0\n')
    lines = plain.splitlines()
    carried = (f'{lines[0]} # {{span_id="b7ad6b7169203331",trace_id="0af7651916cd43dd8448eb211c80319c"}} 0.2 1.7e9\n'
               f"{lines[1]}\n")
    a, b = History(), History()
    a.add(1000.0, plain.encode())
    b.add(1000.0, carried.encode())
    assert b.body() == a.body()
    assert '"values":[3.0,4.0]' in a.body().decode().replace(" ", "")


@pytest.mark.slow
def test_the_live_page_shows_what_metrics_holds_while_buckets_carry_exemplars(make_model: Any, spans: Any) -> None:
    from tests.page._browser import browser
    from tests.page.test_live_page import Page, check_against_bodies, check_stays_home

    model = instrument(make_model("llama"), model_name="paged")
    for new in (3, 6, 9):
        model.generate(prompt(1, 5), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    exporter().flush()
    server = gpuprobe.serve(port=0)
    try:
        with browser() as b:
            page = Page(b, server.page_url)
            state = page.until("two scrapes of the page", lambda s: s["scrape"] >= 2, 90)
            body = page.body(state["scrape"])
            assert exemplars(body), "the body the page read has exemplars"
            check_against_bodies(page, state)
            check_stays_home(page, server.page_url.rstrip("/"))
    finally:
        server.close()
