"""Continuous batching with traces on (the SDK's own TracerProvider and in-memory exporter): a scheduler step
that carried a prompt is a span linked to the requests it carried, and each request's span is linked to
the steps that carried its prompt; a step's figures against gpuprobe's own step series."""

from __future__ import annotations

from typing import Any

import pytest
from _servekit import tiny_llama

import gpuprobe
from gpuprobe.integrations import transformers as hf
from gpuprobe.testing import reset

from helpers import cpu_continuous_batching_cannot_pin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


@pytest.fixture
def traced() -> Any:
    reason = cpu_continuous_batching_cannot_pin()
    if reason:
        pytest.skip(reason)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    gpuprobe.configure(tracer_provider=provider)
    model = hf.instrument(tiny_llama(), model_name="stepped")
    yield model, memory
    hf.uninstrument(model)
    gpuprobe.configure(tracer_provider=None)


def _run(model: Any, lengths: tuple[int, ...], new: int = 6, max_batch_tokens: int = 16) -> dict[str, Any]:
    prompts = [[3 + (i * 7 + j) % 120 for j in range(n)] for i, n in enumerate(lengths)]
    gen = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = transformers.ContinuousBatchingConfig(num_blocks=64, page_size=16, max_batch_tokens=max_batch_tokens)
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)
    gpuprobe.collect()  # the drain splits the steps (and makes their spans' figures)
    reset()  # closes the exporter: what waits is sent
    return out


def _ids(span: Any) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


def test_prompt_steps_and_requests_are_linked_both_ways(traced: Any) -> None:
    model, memory = traced
    out = _run(model, (5, 9, 12, 20, 7, 3))
    spans = memory.get_finished_spans()
    steps = [s for s in spans if s.name == "scheduler step"]
    requests = {s.attributes["gpuprobe.request_id"]: s for s in spans if s.name == "text_completion stepped"}
    assert set(requests) == set(out)
    step_ids = {_ids(s): s for s in steps}
    request_ids = {_ids(s) for s in requests.values()}
    for request in requests.values():
        assert request.links, "a request's prompt was carried by some step"
        for link in request.links:
            step = step_ids[(link.context.trace_id, link.context.span_id)]
            assert step.attributes["gpuprobe.step.prefill_tokens"] > 0  # it links to steps that carried a prompt
            assert _ids(request) in {(l.context.trace_id, l.context.span_id) for l in step.links}
    for step in steps:
        linked = {(l.context.trace_id, l.context.span_id) for l in step.links}
        assert linked <= request_ids and len(linked) == step.attributes["gpuprobe.step.requests"]
        assert step.parent is None and step.context.trace_id not in {t for t, _ in request_ids}  # a trace of its own
        assert (step.end_time - step.start_time) / 1e9 == pytest.approx(step.attributes["gpuprobe.step.host_s"])


def test_decode_only_steps_are_sampled_one_in_sixteen(traced: Any) -> None:
    from gpuprobe.integrations._transformers.continuous.requests import STEP_SPANS_EVERY

    model, memory = traced
    _run(model, (4,), new=40, max_batch_tokens=64)  # one request: one prompt step, then 39 decode steps
    steps = [s for s in memory.get_finished_spans() if s.name == "scheduler step"]
    prompt = [s for s in steps if s.attributes["gpuprobe.step.prefill_tokens"] > 0]
    decode = [s for s in steps if s.attributes["gpuprobe.step.prefill_tokens"] == 0]
    assert len(prompt) == 1
    assert all(s.attributes["gpuprobe.step.index"] % STEP_SPANS_EVERY == 0 for s in decode)
    assert 1 <= len(decode) <= 40 // STEP_SPANS_EVERY + 1


def test_with_traces_off_no_step_is_a_span_and_nothing_waits(traced: Any) -> None:
    model, memory = traced
    gpuprobe.configure(traces="off")
    _run(model, (5, 9))
    assert memory.get_finished_spans() == ()
