"""A span per request, with real parts: the OpenTelemetry SDK's own TracerProvider and in-memory exporter,
the OTLP/HTTP protobuf wire format received and decoded by a real HTTP server, tiny real models generating.
Each span's figures are checked against the request's record and the model's returned ids; faults (the
endpoint down, answering 500, slow; a fork) leave the program's outputs as they were."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "transformers"))  # the tiny models' kit
from _hfkit import prompt, torch, transformers  # noqa: E402
from _model_fixtures import isolated_models, make_model  # noqa: E402,F401 (fixtures)

import gpuprobe  # noqa: E402
from gpuprobe.integrations.transformers import instrument  # noqa: E402
from gpuprobe.runtime import runtime  # noqa: E402
from gpuprobe.testing import reset  # noqa: E402
from otlp_receiver import Receiver  # noqa: E402

from helpers import ROOT  # noqa: E402

pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402


def exporter() -> Any:
    """The trace exporter the settings started."""
    from gpuprobe.exporters.traces import TraceExporter

    found = [item for item in runtime().lifecycle.items() if isinstance(item, TraceExporter)]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def spans() -> Any:
    """An SDK TracerProvider of the test's own, given to gpuprobe; its finished spans."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    gpuprobe.configure(tracer_provider=provider)
    yield provider, memory
    gpuprobe.configure(tracer_provider=None)


def by_name(finished: list[Any]) -> dict[str, Any]:
    return {s.name: s for s in finished}


class Raises(transformers.LogitsProcessor):
    def __call__(self, input_ids: Any, scores: Any) -> Any:
        raise RuntimeError("nope")


def test_a_call_is_one_span_in_the_genai_conventions_with_its_phases_as_children(make_model: Any, spans: Any) -> None:
    provider, memory = spans
    model = instrument(make_model("llama"), model_name="traced")
    ids = prompt(2, 5)
    with gpuprobe.catch_requests() as caught:
        out = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=True, temperature=0.7, top_k=20,
                             pad_token_id=0)
    exporter().flush()
    record = caught.record
    found = by_name(memory.get_finished_spans())
    request = found["text_completion traced"]
    a = request.attributes
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.provider.name"] == "transformers"
    assert a["gen_ai.request.model"] == "traced"
    assert a["gen_ai.usage.input_tokens"] == ids.numel() == 10
    assert a["gen_ai.usage.output_tokens"] == (out.shape[1] - 5) * 2 == 12
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("length",)
    assert a["gen_ai.request.max_tokens"] == 6 and a["gen_ai.request.temperature"] == pytest.approx(0.7)
    assert a["gen_ai.request.top_k"] == 20
    assert a["gen_ai.latency.e2e"] == record.duration_s
    assert a["gen_ai.latency.time_to_first_token"] == record.ttft_s
    assert a["gen_ai.latency.time_in_model_decode"] == record.decode_s
    assert f"{request.context.trace_id:032x}" == record.trace_id and f"{request.context.span_id:016x}" == record.span_id
    assert request.parent is None  # no span of the caller's
    for child in ("prefill", "decode"):
        span = found[child]
        assert span.parent.span_id == request.context.span_id
        assert request.start_time <= span.start_time <= span.end_time <= request.end_time
    assert found["prefill"].end_time <= found["decode"].start_time
    assert (request.end_time - request.start_time) / 1e9 == pytest.approx(record.duration_s, abs=2e-6)
    events = found["decode"].events
    assert [e.attributes["gpuprobe.step.token"] for e in events] == [1, 2, 3, 4, 5]  # 5 gaps after the first token
    assert all(found["decode"].start_time <= e.timestamp <= found["decode"].end_time for e in events)
    assert "queue" not in found  # generate() has no queue


def test_inside_the_caller_s_span_the_request_span_is_its_child(make_model: Any, spans: Any) -> None:
    provider, memory = spans
    model = instrument(make_model("llama"), model_name="traced")
    with provider.get_tracer("app").start_as_current_span("handle request") as outer:
        model.generate(prompt(1, 4), max_new_tokens=2, pad_token_id=0)
    exporter().flush()
    found = by_name(memory.get_finished_spans())
    request = found["text_completion traced"]
    assert request.parent.span_id == outer.get_span_context().span_id
    assert request.context.trace_id == outer.get_span_context().trace_id


def test_a_failing_call_s_span_has_the_error(make_model: Any, spans: Any) -> None:
    provider, memory = spans
    model = instrument(make_model("llama"), model_name="traced")
    with pytest.raises(RuntimeError):
        model.generate(prompt(1, 4), max_new_tokens=3, pad_token_id=0,
                       logits_processor=transformers.LogitsProcessorList([Raises()]))
    exporter().flush()
    request = by_name(memory.get_finished_spans())["text_completion traced"]
    assert request.status.status_code is StatusCode.ERROR and request.attributes["error.type"] == "RuntimeError"
    assert tuple(request.attributes["gen_ai.response.finish_reasons"]) == ("error",)


def test_no_prompt_text_or_token_ids_are_on_a_span(make_model: Any, spans: Any) -> None:
    provider, memory = spans
    model = instrument(make_model("llama"), model_name="traced")
    ids = torch.tensor([[97, 88, 79, 61, 52]])
    out = model.generate(ids, max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
    exporter().flush()
    text = json.dumps([{"name": s.name, "attributes": dict(s.attributes),
                        "events": [dict(e.attributes) for e in s.events]} for s in memory.get_finished_spans()],
                      default=list)
    for token in out[0].tolist():
        assert f"[{token}," not in text and f" {token}]" not in text and f"[{token}]" not in text


def test_spans_go_over_otlp_http_to_the_endpoint_the_standard_variable_names(make_model: Any,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver(signal="traces")
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
        reset()
        model = instrument(make_model("llama"), model_name="wire")
        with gpuprobe.catch_requests(request_id="req-42") as caught:
            model.generate(prompt(1, 4), max_new_tokens=3, min_new_tokens=3, pad_token_id=0)
        exporter().flush()
        received = receiver.spans()
    finally:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        reset()
        receiver.close()
    names = sorted(span.name for span, _ in received)
    assert names == ["decode", "prefill", "text_completion wire"]
    (request,) = [span for span, _ in received if span.name == "text_completion wire"]
    assert request.trace_id.hex() == caught.record.trace_id and request.span_id.hex() == caught.record.span_id
    attributes = {kv.key: kv.value for kv in request.attributes}
    assert attributes["gpuprobe.request_id"].string_value == "req-42"
    assert attributes["gen_ai.usage.output_tokens"].int_value == 3
    resource = {kv.key: kv.value.string_value for kv in received[0][1].attributes}
    assert resource["service.name"] == "gpuprobe"


@pytest.mark.parametrize("mode", ["down", "error", "slow"])
def test_an_endpoint_that_fails_changes_no_output_and_the_losses_are_counted(make_model: Any, mode: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = None
    if mode == "down":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}/v1/traces"  # nothing listens there once closed
    else:
        receiver = Receiver("error" if mode == "error" else "slow", signal="traces")
        url = receiver.url
    plain = make_model("llama")
    ids = prompt(1, 5)
    expected = plain.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
        reset(otlp_timeout=1.0)
        model = instrument(plain, model_name="faulty")
        with pytest.warns(RuntimeWarning, match="spans of 1 request"):
            got = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
            t0 = time.monotonic()
            exporter().flush()
            took = time.monotonic() - t0
        dropped = {p.labels["reason"]: p.value for d in gpuprobe.collect() if d.spec.name == "gpuprobe.telemetry.dropped"
                   for p in d.points}
    finally:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        reset()
        if receiver is not None:
            receiver.close()
    assert torch.equal(got, expected)
    assert dropped.get("span_export_failed") == 1
    assert took < 1.0 + 1.5  # the deadline of one batch (otlp_timeout), and no more


def test_an_always_off_sampler_sends_nothing(make_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver(signal="traces")
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
        reset()
        model = instrument(make_model("llama"), model_name="unsampled")
        model.generate(prompt(1, 4), max_new_tokens=2, pad_token_id=0)
        exporter().flush()
    finally:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        monkeypatch.delenv("OTEL_TRACES_SAMPLER")
        reset()
        receiver.close()
    assert receiver.spans() == []


@pytest.mark.parametrize("sampled", [True, False])
def test_the_default_sampler_follows_the_callers_sampled_flag(make_model: Any, monkeypatch: pytest.MonkeyPatch,
                                                               sampled: bool) -> None:
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    receiver = Receiver(signal="traces")
    trace_id, span_id = 0x1234_5678_9ABC_DEF0_1122_3344_5566_7788, 0x0A0B_0C0D_0E0F_1011
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    caller = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags))
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
        monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)  # parentbased_always_on
        reset()
        model = instrument(make_model("llama"), model_name="parented")
        with otel_trace.use_span(caller, end_on_exit=False):
            model.generate(prompt(1, 4), max_new_tokens=2, pad_token_id=0)
        exporter().flush()
    finally:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        reset()
        receiver.close()
    received = [span for span, _ in receiver.spans()]
    if not sampled:
        assert received == []
        return
    assert sorted(span.name for span in received) == ["decode", "prefill", "text_completion parented"]
    assert {span.trace_id.hex() for span in received} == {f"{trace_id:032x}"}
    (own,) = [span for span in received if span.name == "text_completion parented"]
    assert own.parent_span_id.hex() == f"{span_id:016x}"


def test_traces_off_makes_no_span_and_gives_no_ids(make_model: Any, spans: Any) -> None:
    provider, memory = spans
    gpuprobe.configure(traces="off")
    model = instrument(make_model("llama"), model_name="quiet")
    with gpuprobe.catch_requests() as caught:
        model.generate(prompt(1, 4), max_new_tokens=2, pad_token_id=0)
    assert caught.record.trace_id is None and memory.get_finished_spans() == ()
    gpuprobe.configure(traces="auto")


def test_a_full_queue_drops_and_counts_instead_of_growing(spans: Any) -> None:
    from gpuprobe._requests import RequestRecord
    from gpuprobe.exporters import traces

    ex = exporter()
    ex._stop.set()  # hold the exporter's thread: the queue only fills
    ex._wake.set()
    time.sleep(0.05)
    log = runtime().requests
    for i in range(traces._QUEUE + 100):
        log.add(RequestRecord(request_id=str(i), model="m", duration_s=0.01, started_at=time.time() - 0.01,
                              ended_at=time.time()))
    dropped = {p.labels["reason"]: p.value for d in gpuprobe.collect() if d.spec.name == "gpuprobe.telemetry.dropped"
               for p in d.points}
    assert len(ex._queue) == traces._QUEUE and dropped["span_queue_full"] == 100


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_sends_no_span_of_its_own_and_exits_at_once(spans: Any) -> None:
    from gpuprobe._requests import RequestRecord

    provider, memory = spans
    exporter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        t0 = time.monotonic()
        runtime().requests.add(RequestRecord(request_id="child", model="m", duration_s=0.0))
        reset()
        os._exit(0 if time.monotonic() - t0 < 2 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    exporter().flush()
    assert memory.get_finished_spans() == ()


def test_a_provider_the_program_sets_after_gpuprobe_started_gets_the_spans(make_model: Any) -> None:
    """traces=auto, nothing set at first: the program sets the global provider later (in a fresh interpreter:
    the global provider can be set once per process)."""
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {ROOT + '/tests/transformers'!r})
import gpuprobe, gpuprobe.testing, torch
from _hfkit import build
from gpuprobe.integrations.transformers import instrument
model = instrument(build("llama").eval(), model_name="late")
model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, pad_token_id=0)  # gpuprobe runs: no provider yet
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
memory = InMemorySpanExporter(); provider = TracerProvider(); provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)
model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, pad_token_id=0)
gpuprobe.testing.reset()  # closes the exporter: what is queued is sent
print(sorted(s.name for s in memory.get_finished_spans()))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROBE_", "OTEL_"))}
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "['decode', 'prefill', 'text_completion late']"


class SlowOnce(transformers.LogitsProcessor):
    """Sleeps once, at the call's step ``at``: a slow step."""

    def __init__(self, at: int, seconds: float) -> None:
        self.at, self.seconds, self.step = at, seconds, 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.step == self.at:
            time.sleep(self.seconds)
        self.step += 1
        return scores


def test_a_slow_step_s_capture_is_named_on_the_request_s_span_and_has_a_span_with_its_top_finding(
        make_model: Any, tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    reset(profile_dir=str(tmp_path), profile_slow_step="150ms", profile_slow_step_interval="10m",
          profile_slow_step_steps=2)
    gpuprobe.configure(tracer_provider=provider)
    try:
        model = instrument(make_model("llama"), model_name="slowed")
        with gpuprobe.catch_requests() as caught:
            model.generate(prompt(1, 6), max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0,
                           logits_processor=transformers.LogitsProcessorList([SlowOnce(at=4, seconds=0.3)]))
        (capture,) = gpuprobe.info()["profile"]["captures"]
        deadline = time.monotonic() + 120
        found: list[Any] = []
        while not found:  # the report on the trace runs in a process of its own
            exporter().flush()
            found = [s for s in memory.get_finished_spans() if s.name == "gpuprobe capture"]
            assert time.monotonic() < deadline, "no span of the capture"
            time.sleep(0.2)
    finally:
        gpuprobe.configure(tracer_provider=None)
        reset()
    request = by_name(memory.get_finished_spans())["text_completion slowed"]
    assert request.attributes["gpuprobe.capture"] == capture["path"] == caught.record.capture
    (span,) = found
    assert span.attributes["gpuprobe.capture.path"] == capture["path"]
    assert span.attributes["gpuprobe.capture.reason"] == "slow_step"
    assert (span.attributes["gpuprobe.capture.first_step"], span.attributes["gpuprobe.capture.last_step"]) == (
        capture["first_step"], capture["last_step"])
    from gpuprobe.report import analyze

    top = analyze(capture["path"]).to_dict()["findings"][0]  # the same report, read here
    assert span.attributes["gpuprobe.capture.finding.id"] == top["id"]
    assert span.attributes["gpuprobe.capture.finding.title"] == top["title"]
    assert [(l.context.trace_id, l.context.span_id) for l in span.links] == [
        (request.context.trace_id, request.context.span_id)]
