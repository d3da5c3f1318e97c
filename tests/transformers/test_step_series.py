"""The record target that generate() and continuous batching both give a decoding step's device span
(``gpuprobe.integrations._transformers.series``): the step's device series once, the device inter-token latency
once per output token its forward selected."""

from __future__ import annotations

from gpuprobe.integrations._transformers.series import DecodeSpan, StepSeries
from gpuprobe.runtime import runtime


def test_a_decode_span_records_the_step_once_and_one_inter_token_sample_per_token() -> None:
    steps = StepSeries(runtime(), "m", ("prefill", "decode", "mixed"))
    steps.device_span(2, 3).apply(5_000)  # a mixed step whose forward selected 3 requests' next tokens
    assert (steps.device[2].count, steps.device[2].sum) == (1, 5_000)
    assert (steps.itl_device.count, steps.itl_device.sum) == (3, 3 * 5_000)
    assert steps.device[1].count == 0


def test_one_token_gives_one_inter_token_sample() -> None:
    steps = StepSeries(runtime(), "m", ("prefill", "decode"))
    steps.device_span(1, 1).apply(4_000)
    steps.device_span(1, 1).apply(6_000)
    assert (steps.device[1].count, steps.itl_device.count, steps.itl_device.sum) == (2, 2, 10_000)


def test_a_token_that_is_no_output_token_leaves_no_inter_token_sample() -> None:
    steps = StepSeries(runtime(), "m", ("prefill", "decode"))
    span = DecodeSpan(steps.device[1], steps.itl_device)  # generate()'s own copy, when a token may be undone
    span.tokens = 0
    span.apply(7_000)
    assert (steps.device[1].count, steps.itl_device.count) == (1, 0)


def test_targets_are_shared_per_phase_and_token_count() -> None:
    steps = StepSeries(runtime(), "m", ("prefill", "decode"))
    assert steps.device_span(1, 2) is steps.device_span(1, 2)
    assert steps.device_span(1, 2) is not steps.device_span(1, 1)
    assert steps.device_span(0, 2) is not steps.device_span(1, 2)
